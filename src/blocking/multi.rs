//! The blocking [`MultiLock`]: a Redlock client that owns the runtime its async client runs on.

use std::sync::Arc;

use super::{Background, Lock, LockSet, RwLock, Shared};
#[cfg(doc)]
use super::{LockClient, LockGuard};
use crate::config::{LockConfig, QuorumConfig};
use crate::Error;

/// Locks held on a majority of N independent Redis masters (Redlock), blocking: the blocking
/// [`MultiLock`](crate::MultiLock). It hands out the same blocking [`Lock`] and [`LockGuard`] as a
/// [`LockClient`]. Cheap to clone.
///
/// ```no_run
/// # fn demo() -> Result<(), relock::Error> {
/// use relock::{blocking::MultiLock, LockConfig};
///
/// let urls = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
/// let multi = MultiLock::connect(&urls, LockConfig::default())?;
/// let guard = multi.lock("orders:42").acquire()?;
/// println!("token {} valid for {:?}", guard.fencing_token()?, guard.validity());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    inner: crate::MultiLock,
    shared: Arc<Shared>,
}

impl MultiLock {
    /// Starts the runtime and connects to every master at once, with the default [`QuorumConfig`]
    /// and `config` for the locks, as [`MultiLock::connect`](crate::MultiLock::connect).
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn connect(urls: &[&str], config: LockConfig) -> Result<MultiLock, Error> {
        MultiLock::connect_with(urls, QuorumConfig::default().lock_config(config))
    }

    /// [`connect`](MultiLock::connect) with a full [`QuorumConfig`].
    pub fn connect_with(urls: &[&str], config: QuorumConfig) -> Result<MultiLock, Error> {
        let runtime = Background::start()?;
        let inner = runtime.block_on(crate::MultiLock::connect_with(urls, config))??;
        let shared = runtime.share(inner.core.clone())?;
        Ok(MultiLock { inner, shared })
    }

    /// The lock called `name` over every master. No I/O.
    pub fn lock(&self, name: &str) -> Lock {
        Lock {
            inner: self.inner.lock(name),
            shared: self.shared.clone(),
        }
    }

    /// The read-write lock called `name` over every master, blocking: see
    /// [`RwLock`](crate::RwLock). No I/O.
    pub fn rw_lock(&self, name: &str) -> RwLock {
        RwLock {
            inner: self.inner.rw_lock(name),
            shared: self.shared.clone(),
        }
    }

    /// Several names locked together over every master, all or none, blocking: see
    /// [`MultiLock::lock_all`](crate::MultiLock::lock_all). No I/O.
    pub fn lock_all(&self, names: &[&str]) -> LockSet {
        LockSet {
            inner: self.inner.lock_all(names),
            shared: self.shared.clone(),
        }
    }

    /// The number of masters.
    pub fn masters(&self) -> usize {
        self.inner.masters()
    }

    /// Releases every lock this MultiLock holds, stops its background tasks and closes its
    /// connections, and waits for that. [`Error::InsideRuntime`] inside an async runtime.
    pub fn shutdown(&self) -> Result<(), Error> {
        self.shared.block_on(self.inner.shutdown())
    }
}

impl std::fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::MultiLock").field(&self.inner).finish()
    }
}
