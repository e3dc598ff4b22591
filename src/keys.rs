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
