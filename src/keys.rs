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
