//! The RAII proof of holding a lock.

use fred::bytes_utils::Str;
use fred::types::Value;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, OwnedMutexGuard};
use tokio::time::Instant;

use crate::engine::core::{Core, UndoOnDrop};
use crate::engine::guarded::Guarded;
use crate::engine::hold::{Grant, Hold, Job};
use crate::engine::releaser::release_now;
use crate::primitives::guarded::Tx;
use crate::Error;

/// Proof that a lock is held: returned by [`Lock::acquire`](crate::Lock::acquire) and its siblings.
///
/// # Dropping
///
/// Dropping the guard releases its hold (one level of reentrancy) **in the background**: the drop
/// never blocks and never panics, even on `?`, a panic or an aborted task. The release runs on the
/// client's releaser task shortly after; if the tokio runtime is gone, nothing can be sent and the lease
/// simply expires (a warning is logged). Call [`release`](LockGuard::release) instead to wait for the
/// release and learn whether the lease was still held.
///
/// # Losing the lease
///
/// A lease can be lost while the guard is alive: the watchdog could not renew it in time (Redis
/// unreachable), the key was removed behind its back, or a fixed lease ran out. The guard then
/// reports [`is_held`](LockGuard::is_held) false and [`lost`](LockGuard::lost) completes, at once;
/// [`until_lost`](LockGuard::until_lost) stops work the moment that happens. Writes to storage that
/// must never take a stale write should carry the [`fencing_token`](LockGuard::fencing_token).
///
/// ```no_run
/// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
/// let lock = client.lock("inventory:sku-42");
/// let guard = lock.acquire().await?;
/// let token = guard.fencing_token().await?;
/// let stock = guard.until_lost(async { /* read, compute and write with `token` */ 41 }).await?;
/// guard.release().await?;
/// # let _ = (token, stock);
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    core: Arc<Core>,
    hold: Arc<Hold>,
    gen: u64,
    /// The Redis field of the hold's generation.
    field: Str,
    hold_count: u32,
    lost: watch::Sender<bool>,
    done: bool,
}

impl LockGuard {
    /// The engine's client and hold under this guard (for `testing::lose`).
    #[cfg(feature = "testing")]
    pub(crate) fn engine_parts(&self) -> (&Arc<Core>, &Arc<Hold>) {
        (&self.core, &self.hold)
    }

    /// The guard of `grant`, which the engine returned.
    pub(crate) fn new(core: Arc<Core>, grant: Grant) -> LockGuard {
        LockGuard {
            core,
            hold: grant.hold,
            gen: grant.gen,
            field: grant.field,
            hold_count: grant.count,
            lost: grant.lost,
            done: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.keys.name
    }

    /// The fencing token of this hold: strictly larger than the token of every earlier holder of the
    /// name that read one, and smaller than every later holder's. A reentrant acquisition returns
    /// the token of the hold it joined.
    ///
    /// A plain lock draws its token on the first read, not at acquisition (a holder that never
    /// reads it costs Redis nothing for it): one round trip, while the hold holds the lock in
    /// Redis. Later reads of the same hold, by any of its guards, return it at once. A fair lock,
    /// the write side of a read-write lock and a [`LockSet`](crate::LockSet)'s locks drew theirs
    /// when granted.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost (known here, or found so in Redis, which ends the
    /// hold as lost): a lost holder gets no token. An error reaching Redis leaves the hold as it
    /// is; the read may be tried again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a token drawn by a cancelled read is simply not used; the next read draws
    /// another (larger) one.
    pub async fn fencing_token(&self) -> Result<u64, Error> {
        self.core.fencing_token(&self.hold, self.gen).await
    }

    /// Applies the checks and commands that `build` adds to a [`Tx`] atomically, and only while
    /// this hold is current in Redis: same owner, same generation, lease not run out. One script
    /// call on the lock's own server and slot checks the hold and writes, with nothing in between,
    /// so a holder that lost its lock (paused past its lease, cut off) cannot write after the next
    /// holder took it: the guarded write is fencing that needs no token.
    ///
    /// `Ok(Some(replies))`: applied, each command's reply in order. `Ok(None)`: a check (`when_*`)
    /// did not hold, and nothing was applied.
    ///
    /// ```no_run
    /// # async fn demo(guard: relock::LockGuard) -> Result<(), relock::Error> {
    /// // The lock is "sku-42": its key is `relock:{sku-42}`, and the data shares the tag.
    /// let sold = guard
    ///     .atomically(|tx| {
    ///         tx.when_at_least("stock:{sku-42}", 1)
    ///             .decr_by("stock:{sku-42}", 1)
    ///             .rpush("orders:{sku-42}", "order-7");
    ///     })
    ///     .await?;
    /// if sold.is_none() {
    ///     println!("sold out");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`] with nothing applied if the hold is not current (known here, or found
    ///   so in Redis, which ends the hold as lost).
    /// - [`Error::InvalidConfig`] before anything is sent if a key is not in the lock's slot (the
    ///   message names the hash tag to give it), or if the lock is a [`MultiLock`](crate::MultiLock)'s:
    ///   no atomic write spans several masters.
    /// - A command's own error (say, `WRONGTYPE`) ends the write; the commands before it stay
    ///   applied, as in `MULTI`/`EXEC`.
    /// - A timeout leaves it unknown whether the write was applied, as for any write to Redis; it
    ///   is not sent again.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a write already sent may still be applied (while the hold
    /// is current: the check is Redis's, not this future's).
    pub async fn atomically(&self, build: impl FnOnce(&mut Tx)) -> Result<Option<Vec<Value>>, Error> {
        if !self.core.masters.single() {
            return Err(Error::InvalidConfig(format!(
                "a guarded write of lock {:?} would span the masters of a MultiLock, and no atomic \
                 write can: guard the data with a lock of one Redis, or check the fencing token",
                self.name()
            )));
        }
        let mut tx = Tx::default();
        build(&mut tx);
        let keys = tx.keys_in_slot_of(&self.hold.keys.lock, self.name())?;
        match self.core.guarded(&self.hold, self.gen, keys, tx.args()).await? {
            Guarded::Applied(replies) => Ok(Some(replies)),
            Guarded::Declined => Ok(None),
        }
    }

    /// The Redis field of this hold's generation (owner and generation).
    pub(crate) fn field(&self) -> &Str {
        &self.field
    }

    /// The token already drawn for this hold, if any (see [`fencing_token`](Self::fencing_token)).
    pub(crate) fn drawn_token(&self) -> Option<u64> {
        let st = self.hold.state.lock();
        (st.gen == self.gen && st.token > 0).then_some(st.token)
    }

    /// The reentrancy depth of this owner right after this acquisition (1 for a first acquisition).
    pub fn hold_count(&self) -> u32 {
        self.hold_count
    }

    /// Whether the lease is still held: false once it is known lost or has no validity left.
    pub fn is_held(&self) -> bool {
        !*self.lost.borrow() && !self.validity().is_zero()
    }

    /// How long the lease is still safe for, on the monotonic clock: the lease left since the last
    /// successful acquisition or renewal, minus the allowance for clock drift. Zero once lost.
    pub fn validity(&self) -> Duration {
        if *self.lost.borrow() {
            return Duration::ZERO;
        }
        let st = self.hold.state.lock();
        if st.gen != self.gen {
            return Duration::ZERO;
        }
        st.deadline.saturating_duration_since(Instant::now())
    }

    /// The instant the lease stops being safe, on the monotonic clock, as [`validity`](Self::validity)
    /// counts it: each renewal moves it on, and while renewals fail it stays put, so work raced
    /// against it (`tokio::time::timeout_at(guard.valid_until(), work)`) stops before the lease
    /// ends, not when the loss is noticed. Now (or earlier) once lost.
    pub fn valid_until(&self) -> Instant {
        Instant::now() + self.validity()
    }

    /// Completes when the lease is lost (renewal failed or found the lock gone, or the lease ran out),
    /// at once if it is lost already. Never completes while the lease is held.
    pub async fn lost(&self) {
        let mut rx = self.lost.subscribe();
        // Err only if the sender is gone, which the guard itself prevents.
        let _ = rx.wait_for(|lost| *lost).await;
    }

    /// Runs `work` while the lease is held: if the lease is lost first, `work` is dropped (so it does
    /// not run on past its lock) and `Err(Error::LeaseLost)` is returned.
    pub async fn until_lost<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        until_lost(self.is_held(), self.lost(), work).await
    }

    /// Releases this hold (one level of reentrancy) and waits for Redis to confirm.
    ///
    /// `Err(Error::Lost)` at once, without asking Redis, if this client knew the lease was lost
    /// (what Redis may still have of it is removed in the background); `Err(Error::NotHeld)` if
    /// Redis answered that this owner no longer held the lock (nothing is changed in Redis then);
    /// a timeout or connection error if Redis did not answer (the release is retried in the
    /// background). Cancelling this future does not cancel the release.
    pub async fn release(mut self) -> Result<(), Error> {
        if *self.lost.borrow() && !self.core.is_closed() {
            let ago = self.hold.lost_ago(self.gen);
            // Dropped as it is: the release goes to the background (see `Drop`).
            return Err(Error::Lost { ago });
        }
        self.done = true;
        let Some((was_lost, ops)) = self.take_level() else {
            return Err(Error::NotHeld);
        };
        // Dropped part way, the release's outcome is unknown: the releaser brings Redis in line.
        let mut undo = UndoOnDrop {
            core: &self.core,
            resync: Some(self.hold.resync(&self.field, self.gen)),
        };
        let result = release_now(&self.core, &self.hold, self.gen, &self.field, was_lost, ops).await;
        undo.resync = None;
        result
    }
}

impl LockGuard {
    /// Records that Redis no longer has this hold, removed by another script call (a waiter's
    /// mark, which the grant it waited for removes): its release then sends nothing. Only for a
    /// hold of one level; a deeper one is released as usual.
    pub(crate) fn removed_in_redis(&self) {
        let mut st = self.hold.state.lock();
        if st.gen == self.gen && st.count == 1 {
            st.confirmed = Some(0);
        }
    }

    /// Takes this guard's level off the hold at once; `None` if it was already gone (lost and
    /// ended, or the client shut down). Also the hold's operations lock, if it could be taken at
    /// once: taken before the level goes, so that no acquisition of the same owner slips in
    /// before the release.
    fn take_level(&self) -> Option<(bool, Option<OwnedMutexGuard<()>>)> {
        let ops = self.hold.ops.clone().try_lock_owned().ok();
        let was_lost = self.hold.drop_level(self.gen)?;
        Some((was_lost, ops))
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let Some((was_lost, ops)) = self.take_level() else {
            return;
        };
        let job = Job::Release {
            hold: self.hold.clone(),
            gen: self.gen,
            field: self.field.clone(),
            was_lost,
            ops,
        };
        if !self.core.enqueue(job) {
            tracing::warn!(lock = %self.hold.keys.name, "runtime gone: the lock will be freed when its lease expires");
        }
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name())
            .field("fencing_token", &self.drawn_token())
            .field("hold_count", &self.hold_count)
            .field("held", &self.is_held())
            .finish()
    }
}

/// Runs `work` unless the lease is lost first (`lost` completes), or already (`held` false): the
/// rule of every guard's `until_lost`.
pub(crate) async fn until_lost<F: Future>(
    held: bool,
    lost: impl Future<Output = ()>,
    work: F,
) -> Result<F::Output, Error> {
    if !held {
        return Err(Error::LeaseLost);
    }
    tokio::select! {
        biased;
        () = lost => Err(Error::LeaseLost),
        output = work => Ok(output),
    }
}
