//! The blocking [`CountDownLatch`].

use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use super::LockClient;
use super::Shared;
use crate::Error;

/// A countdown latch, blocking: the blocking [`CountDownLatch`](crate::CountDownLatch). Made by
/// [`LockClient::latch`]; cheap to clone.
#[derive(Clone)]
pub struct CountDownLatch {
    pub(super) inner: crate::CountDownLatch,
    pub(super) shared: Arc<Shared>,
}

impl CountDownLatch {
    /// The latch's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Arms an open latch with `count`: `false` if it is still counting (see
    /// [`CountDownLatch::set_count`](crate::CountDownLatch::set_count)).
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn set_count(&self, count: u64) -> Result<bool, Error> {
        self.shared.block_on(self.inner.set_count(count))?
    }

    /// Counts one arrival; returns the count left. [`Error::InsideRuntime`] inside an async runtime.
    pub fn count_down(&self) -> Result<u64, Error> {
        self.shared.block_on(self.inner.count_down())?
    }

    /// The count left (0: open). [`Error::InsideRuntime`] inside an async runtime.
    pub fn count(&self) -> Result<u64, Error> {
        self.shared.block_on(self.inner.count())?
    }

    /// Blocks at most `wait` for the latch to open: `true` if it did (see
    /// [`CountDownLatch::wait_for`](crate::CountDownLatch::wait_for)). [`Error::InsideRuntime`]
    /// inside an async runtime.
    pub fn wait_for(&self, wait: Duration) -> Result<bool, Error> {
        self.shared.block_on(self.inner.wait_for(wait))?
    }
}

impl std::fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::CountDownLatch")
            .field(&self.inner)
            .finish()
    }
}
