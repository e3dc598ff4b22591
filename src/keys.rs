//! The Redis names of one lock. All share the hash tag `{name}`, so they live in one cluster slot.

use std::sync::Arc;

/// The key of the lock hash, of its fence counter and the release channel.
#[derive(Debug)]
pub(crate) struct LockKeys {
    pub(crate) name: Arc<str>,
    pub(crate) lock: Arc<str>,
    pub(crate) fence: Arc<str>,
    pub(crate) channel: Arc<str>,
}

impl LockKeys {
    /// The keys of one permit holder of the semaphore `sem` (see [`SemaphoreKeys`]): its holder key
    /// stands where a lock hash would (renewed and released the same way), the index where the
    /// fence would (in the same slot; a release does not touch it), and the semaphore's channel.
    pub(crate) fn of_permit_holder(sem: &SemaphoreKeys, holder: &str) -> LockKeys {
        LockKeys {
            name: sem.name.clone(),
            lock: format!("{}:h:{holder}", sem.index).into(),
            fence: sem.index.clone(),
            channel: sem.channel.clone(),
        }
    }

    pub(crate) fn new(prefix: &str, name: &str) -> LockKeys {
        let lock = format!("{prefix}:{{{name}}}");
        LockKeys {
            name: name.into(),
            fence: format!("{lock}:fence").into(),
            channel: format!("{lock}:released").into(),
            lock: lock.into(),
        }
    }
}

/// The Redis names of one countdown latch: its hash and the channel that announces it opened. They
/// share the hash tag `{name}` (with a lock of the same name, whose keys they do not touch).
#[derive(Debug)]
pub(crate) struct LatchKeys {
    pub(crate) name: Arc<str>,
    pub(crate) latch: Arc<str>,
    pub(crate) channel: Arc<str>,
}

impl LatchKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> LatchKeys {
        let latch = format!("{prefix}:{{{name}}}:latch");
        LatchKeys {
            name: name.into(),
            channel: format!("{latch}:zero").into(),
            latch: latch.into(),
        }
    }
}

/// The Redis names of one semaphore: its index (the permits, and who holds how many), the prefix of
/// its holder keys (one per holder, with that holder's lease), and its release channel. All share
/// the hash tag `{name}`.
#[derive(Debug)]
pub(crate) struct SemaphoreKeys {
    pub(crate) name: Arc<str>,
    pub(crate) index: Arc<str>,
    pub(crate) channel: Arc<str>,
}

impl SemaphoreKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> SemaphoreKeys {
        let index = format!("{prefix}:{{{name}}}:sem");
        SemaphoreKeys {
            name: name.into(),
            channel: format!("{index}:released").into(),
            index: index.into(),
        }
    }
}
