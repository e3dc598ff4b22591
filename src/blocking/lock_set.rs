//! The blocking [`LockSet`] (several names locked together, all or none) and its
//! [`LockSetGuard`].

use std::sync::Arc;
use std::time::Duration;

use super::Shared;
#[cfg(doc)]
use super::{Lock, LockClient, MultiLock};
use crate::primitives::owner::Owner;
use crate::Error;

/// Several named locks taken together, all or none, blocking: the blocking
/// [`LockSet`](crate::LockSet), made by [`LockClient::lock_all`] or [`MultiLock::lock_all`]. Cheap
/// to clone, no I/O until it is used.
///
/// The names are sorted and deduplicated and taken in that order, each as its own lock, and what
/// was taken is given back if a later one cannot be: two threads (or processes) whose sets overlap
/// cannot deadlock. Each name is reentrant per owner (by default the calling thread), as a single
/// [`Lock`] is, and excludes `client.lock(name)` of the same name. Not atomic: between the first
/// name and the last, another client may see some of them taken. (relock's [`MultiLock`] is
/// Redisson's `RedLock`; this set is Redisson's `MultiLock`.)
///
/// ```no_run
/// # fn demo(client: relock::blocking::LockClient) -> Result<(), relock::Error> {
/// // Move stock between two SKUs: both locked, or neither.
/// let both = client.lock_all(&["sku-42", "sku-7"]);
/// let guard = both.acquire()?;
/// let token = guard.fencing_token("sku-42")?;
/// # let _ = token;
/// drop(guard);                                // both released, without blocking
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockSet {
    pub(super) inner: crate::LockSet,
    pub(super) shared: Arc<Shared>,
}

impl LockSet {
    /// The names, in the order they are taken (sorted, without duplicates).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.names()
    }

    /// Every name with a fixed lease that the watchdog does not renew (see [`Lock::lease`]).
    pub fn lease(self, lease: Duration) -> LockSet {
        LockSet {
            inner: self.inner.lease(lease),
            shared: self.shared,
        }
    }

    /// Every name on behalf of `owner` instead of the calling thread (see [`Lock::owner`]).
    pub fn owner(self, owner: Owner) -> LockSet {
        LockSet {
            inner: self.inner.owner(owner),
            shared: self.shared,
        }
    }

    /// Blocks until every name is held, as [`LockSet::acquire`](crate::LockSet::acquire).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty set or a bad name, and bad leases, before any I/O; else
    /// the first name's error (as [`Lock::acquire`]), with the names taken so far given back;
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn acquire(&self) -> Result<LockSetGuard, Error> {
        let guard = self.shared.block_on(self.inner.acquire())??;
        Ok(self.guard(guard))
    }

    /// One attempt per name, no waiting: `None`, with nothing held, if another owner holds any of
    /// them, as [`LockSet::try_acquire`](crate::LockSet::try_acquire).
    ///
    /// # Errors
    ///
    /// As [`acquire`](LockSet::acquire).
    pub fn try_acquire(&self) -> Result<Option<LockSetGuard>, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    /// Blocks at most `wait`, in all, for every name: `None`, with nothing held, if one is still
    /// held by another owner then, as [`LockSet::try_acquire_for`](crate::LockSet::try_acquire_for).
    ///
    /// # Errors
    ///
    /// As [`acquire`](LockSet::acquire); [`Error::InvalidDuration`] for a `wait` out of range.
    pub fn try_acquire_for(&self, wait: Duration) -> Result<Option<LockSetGuard>, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire_for(wait))??;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    fn guard(&self, inner: crate::LockSetGuard) -> LockSetGuard {
        LockSetGuard {
            inner,
            shared: self.shared.clone(),
        }
    }
}

impl std::fmt::Debug for LockSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockSet").field(&self.inner).finish()
    }
}

/// The guard of a [`LockSet`]: every name held, the blocking
/// [`LockSetGuard`](crate::LockSetGuard). Dropping it releases them all in the background, without
/// blocking, from any thread; [`release`](LockSetGuard::release) waits for Redis to confirm instead.
#[must_use = "dropping the guard releases the locks at once"]
pub struct LockSetGuard {
    // Dropped before `shared`: its releases are queued before the client may finish.
    inner: crate::LockSetGuard,
    shared: Arc<Shared>,
}

impl LockSetGuard {
    /// The names held, in the set's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.guards().iter().map(crate::LockGuard::name)
    }

    /// The fencing token of `name` (each name has its own counter), as
    /// [`LockSetGuard::fencing_token`](crate::LockSetGuard::fencing_token); `Ok(None)` if it is
    /// not in the set. [`Error::InsideRuntime`] inside an async runtime.
    pub fn fencing_token(&self, name: &str) -> Result<Option<u64>, Error> {
        self.shared.block_on(self.inner.fencing_token(name))?
    }

    /// Whether every name's lease is still held.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// How long every lease is still known to be valid: the shortest (zero once one is lost).
    pub fn validity(&self) -> Duration {
        self.inner.validity()
    }

    /// Blocks until any name's lease is lost, for at most `timeout`: `true` if one was lost (at once
    /// if one is lost already), `false` if all were still held when `timeout` ran out. The blocking
    /// counterpart of [`LockSetGuard::lost`](crate::LockSetGuard::lost).
    ///
    /// # Errors
    ///
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn wait_lost_for(&self, timeout: Duration) -> Result<bool, Error> {
        self.shared
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await.is_ok() })
    }

    /// Releases every name (one level of reentrancy each) and blocks until Redis confirms, as
    /// [`LockSetGuard::release`](crate::LockSetGuard::release): every release is made, and the
    /// first error is returned.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] or [`Error::NotHeld`] for a name whose lease was lost (as
    /// [`LockGuard::release`](crate::LockGuard::release)); [`Error::Timeout`] or [`Error::Redis`]
    /// when Redis fails. Inside an async runtime, the guard is dropped (released in the background)
    /// and the result is [`Error::InsideRuntime`].
    pub fn release(self) -> Result<(), Error> {
        let LockSetGuard { inner, shared } = self;
        shared.block_on(inner.release())?
    }
}

impl std::fmt::Debug for LockSetGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockSetGuard")
            .field(&self.inner)
            .finish()
    }
}
