//! The primitives users hold: the client that makes them, locks and their guards, read-write locks,
//! semaphores and permits, latches, lock sets and `MultiLock`, and owners.
//!
//! May use: `engine`, `redis`, `util` and the shared vocabulary.

pub(crate) mod client;
pub(crate) mod election;
pub(crate) mod guard;
pub(crate) mod guarded;
pub(crate) mod latch;
pub(crate) mod lock;
pub(crate) mod lock_set;
pub(crate) mod multi;
pub(crate) mod owner;
pub(crate) mod rw_lock;
pub(crate) mod semaphore;
