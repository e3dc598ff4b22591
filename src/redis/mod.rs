//! The Redis transport: connections to one Redis and its topology (standalone, Sentinel, Cluster),
//! the batches and pipelines that carry operations, the Lua scripts and functions, the keys of a
//! lock, the wake-up channels waiters sleep on, and the client's record in Redis.
//!
//! May use: `util` and the shared vocabulary. Knows nothing of holds, guards or owners' waits.

pub(crate) mod batch;
pub(crate) mod identity;
pub(crate) mod keys;
pub(crate) mod link;
pub(crate) mod node;
pub(crate) mod scripts;
pub(crate) mod topology;
pub(crate) mod waiters;
