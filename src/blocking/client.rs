//! The blocking [`LockClient`]: a client that owns the runtime its async client runs on.

use std::sync::Arc;

use super::{Background, CountDownLatch, Lock, LockSet, RwLock, Semaphore, Shared};
use crate::config::LockConfig;
use crate::inspect::{LockInfo, SemaphoreInfo};
use crate::Error;

/// A blocking client of one Redis deployment (a server, a cluster, or a Sentinel-managed primary)
/// that hands out [`Lock`]s: the blocking [`LockClient`](crate::LockClient).
///
/// It owns a small runtime on which the async client and its background tasks run (see the
/// [module docs](super)). Cheap to clone; every clone, lock and guard shares it.
///
/// ```no_run
/// use std::time::Duration;
/// use relock::{blocking::LockClient, LockConfig};
///
/// # fn demo() -> Result<(), relock::Error> {
/// let config = LockConfig::default().watchdog_timeout(Duration::from_secs(30)).key_prefix("shop");
/// let client = LockClient::connect_with("redis://127.0.0.1:6379", config)?;
/// let guard = client.lock("inventory:sku-42").acquire()?;
/// // ... deduct the stock ...
/// guard.release()?;
/// client.shutdown()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient {
    // Dropped before `shared`, whose drop finishes the client.
    inner: crate::LockClient,
    shared: Arc<Shared>,
}

impl LockClient {
    /// Connects with the default [`LockConfig`]. As [`connect_with`](LockClient::connect_with).
    pub fn connect(url: &str) -> Result<LockClient, Error> {
        LockClient::connect_with(url, LockConfig::default())
    }

    /// Starts the client's runtime and connects to the server, cluster or sentinel group at `url`:
    /// the blocking [`LockClient::connect_with`](crate::LockClient::connect_with), which tells the
    /// URL formats and the errors. [`Error::InsideRuntime`] inside an async runtime.
    pub fn connect_with(url: &str, config: LockConfig) -> Result<LockClient, Error> {
        let runtime = Background::start()?;
        let inner = runtime.block_on(crate::LockClient::connect_with(url, config))??;
        let shared = runtime.share(inner.core.clone())?;
        Ok(LockClient { inner, shared })
    }

    /// The lock called `name`. No I/O; the name is checked when the lock is used.
    pub fn lock(&self, name: &str) -> Lock {
        Lock {
            inner: self.inner.lock(name),
            shared: self.shared.clone(),
        }
    }

    /// The fair lock called `name`, blocking: see
    /// [`LockClient::fair_lock`](crate::LockClient::fair_lock) (waiters granted in arrival order).
    /// No I/O.
    pub fn fair_lock(&self, name: &str) -> Lock {
        Lock {
            inner: self.inner.fair_lock(name),
            shared: self.shared.clone(),
        }
    }

    /// The read-write lock called `name`, blocking: see [`RwLock`](crate::RwLock). No I/O.
    pub fn rw_lock(&self, name: &str) -> RwLock {
        RwLock {
            inner: self.inner.rw_lock(name),
            shared: self.shared.clone(),
        }
    }

    /// The countdown latch called `name` (see [`CountDownLatch`](crate::CountDownLatch)), blocking.
    /// No I/O.
    pub fn latch(&self, name: &str) -> CountDownLatch {
        CountDownLatch {
            inner: self.inner.latch(name),
            shared: self.shared.clone(),
        }
    }

    /// The semaphore called `name`, of `permits` permits, blocking: see
    /// [`Semaphore`](crate::Semaphore) for its rules (every holder has a lease the watchdog renews;
    /// callers that disagree on `permits`). No I/O; the name and numbers are checked when it is used.
    pub fn semaphore(&self, name: &str, permits: u64) -> Semaphore {
        Semaphore {
            inner: self.inner.semaphore(name, permits),
            shared: self.shared.clone(),
        }
    }

    /// Several names locked together, all or none, blocking: see [`LockSet`](crate::LockSet)
    /// (sorted, deduplicated, taken in that order with rollback). No I/O; the names are checked when
    /// the set is used.
    pub fn lock_all(&self, names: &[&str]) -> LockSet {
        LockSet {
            inner: self.inner.lock_all(names),
            shared: self.shared.clone(),
        }
    }

    /// The state of the lock `name` (holders, lease left, fence), read in one script call:
    /// `Ok(None)` if nobody holds it. Reads only. The blocking
    /// [`LockClient::inspect`](crate::LockClient::inspect).
    ///
    /// # Errors
    ///
    /// As the async call ([`Error::InvalidName`] before any I/O, [`Error::WrongType`],
    /// [`Error::Timeout`], [`Error::Redis`]); [`Error::InsideRuntime`] inside an async runtime.
    pub fn inspect(&self, name: &str) -> Result<Option<LockInfo>, Error> {
        self.shared.block_on(self.inner.inspect(name))?
    }

    /// Every lock held under the client's key prefix whose name matches `pattern` (a Redis glob;
    /// every lock if `None`), found by `SCAN`: the blocking
    /// [`LockClient::held_locks`](crate::LockClient::held_locks).
    ///
    /// # Errors
    ///
    /// As the async call; [`Error::InsideRuntime`] inside an async runtime.
    pub fn held_locks(&self, pattern: Option<&str>) -> Result<Vec<LockInfo>, Error> {
        self.shared.block_on(self.inner.held_locks(pattern))?
    }

    /// The state of the semaphore `name` (its permits, and each live holder's permits and lease
    /// left), read in one script call: `Ok(None)` if there is none. Reads only. The blocking
    /// [`LockClient::inspect_semaphore`](crate::LockClient::inspect_semaphore).
    ///
    /// # Errors
    ///
    /// As the async call; [`Error::InsideRuntime`] inside an async runtime.
    pub fn inspect_semaphore(&self, name: &str) -> Result<Option<SemaphoreInfo>, Error> {
        self.shared.block_on(self.inner.inspect_semaphore(name))?
    }

    /// The configuration in force.
    pub fn config(&self) -> &LockConfig {
        self.inner.config()
    }

    /// The deployment this client talks to: `host:port`, `cluster host:port,...` or
    /// `sentinel service NAME`.
    pub fn server(&self) -> &str {
        self.inner.server()
    }

    /// Releases every lock this client holds (their guards become lost), stops the background tasks
    /// and closes the connections, and waits for that. Later acquisitions fail with
    /// [`Error::Shutdown`]. [`Error::InsideRuntime`] inside an async runtime.
    pub fn shutdown(&self) -> Result<(), Error> {
        self.shared.block_on(self.inner.shutdown())
    }
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockClient").field(&self.inner).finish()
    }
}
