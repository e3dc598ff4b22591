//! The engine: one algorithm for a lock on one Redis, a quorum of masters or a cluster. It makes
//! attempts, keeps the state of holds, hands a lock on within a client, releases, renews leases in
//! the watchdog, and waits without polling. It returns grants; the primitives build guards.
//!
//! May use: `redis`, `util` and the shared vocabulary.

pub(crate) mod core;
pub(crate) mod guarded;
pub(crate) mod handoffs;
pub(crate) mod hold;
pub(crate) mod marks;
pub(crate) mod permits;
pub(crate) mod quorum;
pub(crate) mod releaser;
pub(crate) mod set_attempt;
pub(crate) mod wait;
pub(crate) mod watchdog;
