//! The blocking [`RwLock`]: two blocking [`Lock`]s, its read and write sides.

use std::sync::Arc;

use super::{Lock, Shared};

/// A read-write lock, blocking: [`RwLock`](crate::RwLock) (many readers or one writer; writers do
/// not starve; every reader's lease is its own). Each side is a blocking [`Lock`].
#[derive(Clone)]
pub struct RwLock {
    pub(super) inner: crate::RwLock,
    pub(super) shared: Arc<Shared>,
}

impl RwLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The read side (see [`RwLock::read`](crate::RwLock::read)).
    pub fn read(&self) -> Lock {
        Lock {
            inner: self.inner.read(),
            shared: self.shared.clone(),
        }
    }

    /// The write side (see [`RwLock::write`](crate::RwLock::write)).
    pub fn write(&self) -> Lock {
        Lock {
            inner: self.inner.write(),
            shared: self.shared.clone(),
        }
    }
}

impl std::fmt::Debug for RwLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock").field("name", &self.name()).finish()
    }
}
