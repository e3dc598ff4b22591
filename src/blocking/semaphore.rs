//! The blocking [`Semaphore`] and its [`Permit`].

use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use super::LockClient;
use super::Shared;
use crate::Error;

/// A semaphore of N permits shared through Redis, whose acquisitions block the calling thread: the
/// blocking [`Semaphore`](crate::Semaphore), made by [`LockClient::semaphore`]. Cheap to clone, no
/// I/O until it is used.
///
/// Every acquisition is a holder of its own (permits are not reentrant, and not tied to the thread:
/// a [`Permit`] may be given back from any thread), with a lease the client's watchdog renews, so
/// the permits of a process that dies come back within its lease.
///
/// ```no_run
/// use std::time::Duration;
/// # fn demo(client: relock::blocking::LockClient) -> Result<(), relock::Error> {
/// // At most 10 calls in flight to a rate-limited API, across every process.
/// let api = client.semaphore("partner-api", 10);
/// let permit = api.acquire(1)?;               // blocks until a permit is free
/// // ... call the API ...
/// drop(permit);                               // given back in the background, without blocking
///
/// if let Some(permits) = api.try_acquire_for(3, Duration::from_millis(500))? {
///     assert_eq!(permits.permits(), 3);
///     permits.release()?;                     // given back, and confirmed
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    pub(super) inner: crate::Semaphore,
    pub(super) shared: Arc<Shared>,
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The number of permits this handle gives the semaphore.
    pub fn permits(&self) -> u64 {
        self.inner.permits()
    }

    /// Blocks until `n` permits are free, and takes them: the blocking
    /// [`Semaphore::acquire`](crate::Semaphore::acquire). Waiting costs no polling (a release
    /// message, or the soonest holder's lease running out, wakes it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for `n` of 0 or above the permits, or for permits that disagree
    /// with those stored while some are held; [`Error::InvalidName`] for a bad name (both before
    /// any I/O); [`Error::Timeout`] or [`Error::Redis`] when Redis fails; [`Error::Shutdown`];
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn acquire(&self, n: u64) -> Result<Permit, Error> {
        let permit = self.shared.block_on(self.inner.acquire(n))??;
        Ok(self.permit(permit))
    }

    /// One attempt, no waiting: `None` if fewer than `n` permits are free, as
    /// [`Semaphore::try_acquire`](crate::Semaphore::try_acquire).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Semaphore::acquire).
    pub fn try_acquire(&self, n: u64) -> Result<Option<Permit>, Error> {
        let permit = self.shared.block_on(self.inner.try_acquire(n))??;
        Ok(permit.map(|permit| self.permit(permit)))
    }

    /// Blocks at most `wait` for `n` permits: `None` if they were not free by then, as
    /// [`Semaphore::try_acquire_for`](crate::Semaphore::try_acquire_for). Returns within `wait`,
    /// whatever the server does.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Semaphore::acquire); [`Error::InvalidDuration`] for a `wait` out of range;
    /// [`Error::Timeout`] if no attempt was answered within `wait`.
    pub fn try_acquire_for(&self, n: u64, wait: Duration) -> Result<Option<Permit>, Error> {
        let permit = self.shared.block_on(self.inner.try_acquire_for(n, wait))??;
        Ok(permit.map(|permit| self.permit(permit)))
    }

    /// The permits free now (holders whose lease ran out count as free), as
    /// [`Semaphore::available`](crate::Semaphore::available).
    ///
    /// # Errors
    ///
    /// Bad input as [`acquire`](Semaphore::acquire); [`Error::Timeout`] or [`Error::Redis`] within
    /// the command timeout; [`Error::InsideRuntime`] inside an async runtime.
    pub fn available(&self) -> Result<u64, Error> {
        self.shared.block_on(self.inner.available())?
    }

    fn permit(&self, inner: crate::Permit) -> Permit {
        Permit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Semaphore").field(&self.inner).finish()
    }
}

/// Permits of a [`Semaphore`], held until the guard goes: the blocking
/// [`Permit`](crate::Permit). Dropping it gives the permits back in the background, without
/// blocking, from any thread, inside an async runtime or not; [`release`](Permit::release) waits
/// for Redis to confirm instead. The watchdog renews its lease; should it be lost (the process cut
/// off from Redis longer than the lease), [`is_held`](Permit::is_held) turns false and
/// [`wait_lost_for`](Permit::wait_lost_for) returns `true`.
#[must_use = "dropping the permit gives it back at once"]
pub struct Permit {
    // Dropped before `shared`: its release is queued before the client may finish.
    inner: crate::Permit,
    shared: Arc<Shared>,
}

impl Permit {
    /// How many permits it holds.
    pub fn permits(&self) -> u64 {
        self.inner.permits()
    }

    /// Whether its lease is still held: false once it is known lost or has no validity left.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// How long its lease is still known to be valid, on the monotonic clock (zero once lost).
    pub fn validity(&self) -> Duration {
        self.inner.validity()
    }

    /// Blocks until the lease is lost, for at most `timeout`: `true` if it was lost (at once if it
    /// is lost already), `false` if it was still held when `timeout` ran out. The blocking
    /// counterpart of [`Permit::lost`](crate::Permit::lost).
    ///
    /// # Errors
    ///
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn wait_lost_for(&self, timeout: Duration) -> Result<bool, Error> {
        self.shared
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await.is_ok() })
    }

    /// Gives the permits back and blocks until Redis confirms, as
    /// [`Permit::release`](crate::Permit::release).
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the lease was known lost, [`Error::NotHeld`] if Redis found it gone;
    /// [`Error::Timeout`] or [`Error::Redis`] when Redis fails. Inside an async runtime, the permit is dropped (given back in the background) and the
    /// result is [`Error::InsideRuntime`].
    pub fn release(self) -> Result<(), Error> {
        let Permit { inner, shared } = self;
        shared.block_on(inner.release())?
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Permit").field(&self.inner).finish()
    }
}
