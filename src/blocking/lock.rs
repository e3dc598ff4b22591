//! The blocking [`Lock`] (also a fair lock's, and each side of a read-write lock) and its
//! [`LockGuard`].

use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::primitives::owner::Owner;
use crate::Error;

/// A named lock, whose acquisitions block the calling thread: the blocking
/// [`Lock`](crate::Lock). Cheap to create and to clone, no I/O until it is used.
///
/// Acquisitions are reentrant per [`Owner`]: by default the calling OS thread.
///
/// ```no_run
/// use std::time::Duration;
/// # fn demo(client: relock::blocking::LockClient) -> Result<(), relock::Error> {
/// let lock = client.lock("inventory:sku-42");
/// let guard = lock.acquire()?;                    // blocks; the watchdog keeps the lease
/// let again = lock.acquire()?;                    // same thread: re-entered, no deadlock
/// assert_eq!(again.hold_count(), 2);
/// drop(again);
/// drop(guard);                                    // released in the background
///
/// if let Some(guard) = lock.try_acquire_for(Duration::from_millis(500))? {
///     // held; released when `guard` goes out of scope
/// #   drop(guard);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    pub(super) inner: crate::Lock,
    pub(super) shared: Arc<Shared>,
}

impl Lock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Acquires with a fixed lease that the watchdog does not renew, as
    /// [`Lock::lease`](crate::Lock::lease).
    pub fn lease(self, lease: Duration) -> Lock {
        Lock {
            inner: self.inner.lease(lease),
            shared: self.shared,
        }
    }

    /// Whether an acquisition by the owner that holds this lock already joins its hold, as
    /// [`Lock::reentrant`](crate::Lock::reentrant).
    pub fn reentrant(self, on: bool) -> Lock {
        Lock {
            inner: self.inner.reentrant(on),
            shared: self.shared,
        }
    }

    /// Acquires on behalf of `owner` instead of the calling thread: every acquisition with the same
    /// owner (through this client) joins one reentrant hold, whichever thread makes it.
    pub fn owner(self, owner: Owner) -> Lock {
        Lock {
            inner: self.inner.owner(owner),
            shared: self.shared,
        }
    }

    /// Blocks until the lock is held, as [`Lock::acquire`](crate::Lock::acquire) waits.
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn acquire(&self) -> Result<LockGuard, Error> {
        let guard = self.shared.block_on(self.inner.acquire())??;
        Ok(self.guard(guard))
    }

    /// One attempt, no waiting: `None` if another owner holds the lock, as
    /// [`Lock::try_acquire`](crate::Lock::try_acquire). [`Error::InsideRuntime`] inside an async
    /// runtime.
    pub fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    /// Blocks at most `wait` for the lock: `None` if another owner still holds it then, as
    /// [`Lock::try_acquire_for`](crate::Lock::try_acquire_for). [`Error::InsideRuntime`] inside an
    /// async runtime.
    pub fn try_acquire_for(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire_for(wait))??;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    /// Whether anyone holds the lock, as [`Lock::is_locked`](crate::Lock::is_locked).
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn is_locked(&self) -> Result<bool, Error> {
        self.shared.block_on(self.inner.is_locked())?
    }

    /// Removes the lock whoever holds it (an administrative override), as
    /// [`Lock::force_unlock`](crate::Lock::force_unlock). [`Error::InsideRuntime`] inside an async
    /// runtime.
    pub fn force_unlock(&self) -> Result<bool, Error> {
        self.shared.block_on(self.inner.force_unlock())?
    }

    fn guard(&self, inner: crate::LockGuard) -> LockGuard {
        LockGuard {
            inner,
            shared: self.shared.clone(),
        }
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Lock").field(&self.inner).finish()
    }
}

/// Proof that a lock is held: the blocking [`LockGuard`](crate::LockGuard), returned by
/// [`Lock::acquire`] and its siblings.
///
/// Dropping it releases its hold (one level of reentrancy) in the background, without blocking,
/// from any thread, inside an async runtime or not. [`release`](LockGuard::release) waits for the
/// release instead. The lease can be lost while the guard lives (see the async guard): check
/// [`is_held`](LockGuard::is_held), or wait for the loss with
/// [`wait_lost_for`](LockGuard::wait_lost_for); writes to storage that must never take a stale write
/// should carry the [`fencing_token`](LockGuard::fencing_token).
///
/// ```no_run
/// # fn demo(client: relock::blocking::LockClient) -> Result<(), relock::Error> {
/// let guard = client.lock("inventory:sku-42").acquire()?;
/// let token = guard.fencing_token()?;
/// // ... read, compute and write with `token` ...
/// if !guard.is_held() {
///     return Err(relock::Error::LeaseLost);
/// }
/// guard.release()?;
/// # let _ = token;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    // Dropped before `shared`: its release is queued before the client may finish.
    inner: crate::LockGuard,
    shared: Arc<Shared>,
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The fencing token of this hold, as [`LockGuard::fencing_token`](crate::LockGuard::fencing_token):
    /// a plain lock's is drawn on the first read (one round trip), while the hold holds the lock.
    /// [`Error::LeaseLost`] if the lease was lost; [`Error::InsideRuntime`] inside an async runtime.
    pub fn fencing_token(&self) -> Result<u64, Error> {
        self.shared.block_on(self.inner.fencing_token())?
    }

    /// Applies the checks and commands `build` adds to a [`Tx`](crate::Tx) only while this hold
    /// is current in Redis, in one script call, as
    /// [`LockGuard::atomically`](crate::LockGuard::atomically): `Ok(None)` if a check declined,
    /// [`Error::LeaseLost`] with nothing applied if the lock was lost; [`Error::InsideRuntime`]
    /// inside an async runtime.
    pub fn atomically(
        &self,
        build: impl FnOnce(&mut crate::Tx),
    ) -> Result<Option<Vec<fred::types::Value>>, Error> {
        self.shared.block_on(self.inner.atomically(build))?
    }

    /// The reentrancy depth of this owner right after this acquisition (1 for a first acquisition).
    pub fn hold_count(&self) -> u32 {
        self.inner.hold_count()
    }

    /// Whether the lease is still held: false once it is known lost or has no validity left.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// How long the lease is still safe for, on the monotonic clock (zero once lost), as
    /// [`LockGuard::validity`](crate::LockGuard::validity).
    pub fn validity(&self) -> Duration {
        self.inner.validity()
    }

    /// Blocks until the lease is lost, for at most `timeout`: `true` if it was lost (at once if it
    /// is lost already), `false` if it was still held when `timeout` ran out. The blocking
    /// counterpart of [`LockGuard::lost`](crate::LockGuard::lost). [`Error::InsideRuntime`] inside
    /// an async runtime.
    pub fn wait_lost_for(&self, timeout: Duration) -> Result<bool, Error> {
        self.shared
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await.is_ok() })
    }

    /// Releases this hold (one level of reentrancy) and blocks until Redis confirms, as
    /// [`LockGuard::release`](crate::LockGuard::release): `Err(Error::Lost)` if the lease was
    /// known lost, `Err(Error::NotHeld)` if Redis found it gone. Inside an async runtime, the guard is dropped (released in the background) and the
    /// result is [`Error::InsideRuntime`].
    pub fn release(self) -> Result<(), Error> {
        let LockGuard { inner, shared } = self;
        shared.block_on(inner.release())?
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockGuard").field(&self.inner).finish()
    }
}
