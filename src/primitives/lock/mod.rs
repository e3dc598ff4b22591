//! `Lock`: the user's handle on one named lock; its waiting loop is in `acquire`.
//!
//! May use: `engine`, `redis`, `util`, the shared vocabulary, and the guard and owner beside it.

use fred::bytes_utils::Str;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

use crate::config::{check_lease, check_name};
use crate::engine::core::Core;
use crate::engine::hold::LeaseMode;
use crate::engine::wait::Wait;
use crate::primitives::guard::LockGuard;
use crate::primitives::owner::Owner;
use crate::redis::keys::{FairKeys, LockKeys};
use crate::util::telemetry::{self, AcquireReport, Outcome};
use crate::Error;

mod acquire;

use acquire::Acquisition;

/// A named lock: cheap to create and to clone, no I/O until it is used.
///
/// Made by [`LockClient::lock`](crate::LockClient::lock) (one Redis) or
/// [`MultiLock::lock`](crate::MultiLock::lock) (a quorum of masters); both behave the same.
///
/// By default an acquisition is in *watchdog mode*: the lease is `watchdog_timeout` and the client
/// renews it every `renew_interval` for as long as the guard lives. [`lease`](Lock::lease) asks for a
/// fixed lease instead, which is never renewed.
///
/// Acquisitions are reentrant per [`Owner`]: by default the current tokio task. **Futures joined or
/// selected inside one task share its identity and re-enter each other's hold**; see [`Owner::scope`].
///
/// ```no_run
/// use std::time::Duration;
/// # async fn demo() -> Result<(), relock::Error> {
/// let client = relock::LockClient::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.lock("inventory:sku-42");
///
/// let guard = lock.acquire().await?;              // waits; the watchdog keeps the lease
/// let again = lock.acquire().await?;              // same task: re-entered, no deadlock
/// assert_eq!(again.hold_count(), 2);
/// drop(again);
/// drop(guard);                                    // released in the background
///
/// if let Some(guard) = lock.try_acquire_for(Duration::from_millis(500)).await? {
///     // held; released when `guard` goes out of scope
/// #   drop(guard);
/// }
/// let short = lock.clone().lease(Duration::from_secs(5)).acquire().await?; // fixed lease
/// # drop(short);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    core: Arc<Core>,
    name: Str,
    keys: Arc<LockKeys>,
    lease: Option<Duration>,
    owner: Option<Owner>,
    /// `None`: as the client's configuration says.
    reentrant: Option<bool>,
}

impl Lock {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Lock {
        let keys = Arc::new(LockKeys::new(core.config.get_key_prefix(), name));
        Lock::with_keys(core, name, keys)
    }

    /// A fair lock (see [`LockClient::fair_lock`](crate::LockClient::fair_lock)).
    pub(crate) fn fair(core: Arc<Core>, name: &str) -> Lock {
        let fair = Arc::new(FairKeys::new(core.config.get_key_prefix(), name));
        let keys = Arc::new(fair.lock(None));
        Lock::with_keys(core, name, keys)
    }

    /// A lock over `keys`: one side of a read-write lock (see `primitives/rw_lock.rs`).
    pub(crate) fn with_keys(core: Arc<Core>, name: &str, keys: Arc<LockKeys>) -> Lock {
        Lock {
            core,
            name: name.into(),
            keys,
            lease: None,
            owner: None,
            reentrant: None,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Redis key of the lock's hash, `prefix:{name}` (for ACL rules, and tools that read it).
    /// Its fence counter is this key followed by `:fence`. For the write lock of a
    /// [`RwLock`](crate::RwLock), `prefix:{name}:rw`; for its read lock, the set of the reader keys,
    /// `prefix:{name}:rw:readers` (each reader's key is that followed by `:` and its owner id). For a
    /// fair lock, `prefix:{name}:fair` (its queue is that followed by `:queue`).
    pub fn redis_key(&self) -> &str {
        &self.keys.lock
    }

    /// The channel its release messages are published on (`SPUBLISH` on a cluster).
    pub fn release_channel(&self) -> &str {
        &self.keys.channel
    }

    /// Acquires with a fixed lease that the watchdog does not renew: the lock is freed after `lease`
    /// even if the guard still lives (its [`lost`](LockGuard::lost) then completes). Checked when
    /// acquiring: [`MIN_LEASE`](crate::MIN_LEASE) (10 ms) to [`MAX_LEASE`](crate::MAX_LEASE), whole milliseconds.
    pub fn lease(mut self, lease: Duration) -> Lock {
        self.lease = Some(lease);
        self
    }

    /// Acquires on behalf of `owner` instead of the current task: every acquisition with the same owner
    /// (through this client) joins one reentrant hold, whichever task makes it.
    pub fn owner(mut self, owner: Owner) -> Lock {
        self.owner = Some(owner);
        self
    }

    /// Whether an acquisition by the owner that holds this lock already joins its hold (true) or
    /// fails at once with [`Error::AlreadyHeld`] (false); by default as
    /// [`LockConfig::reentrant`](crate::LockConfig::reentrant) says (true).
    ///
    /// ```no_run
    /// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
    /// let lock = client.lock("report").reentrant(false);
    /// // One task, so one owner: the second fails instead of sharing the first one's hold.
    /// let (a, b) = tokio::join!(lock.acquire(), lock.acquire());
    /// assert!(a.is_ok() != b.is_ok());
    /// // Each its own owner: they exclude each other, one after the other.
    /// let first = relock::Owner::new().scope(async { lock.acquire().await.map(drop) });
    /// let second = relock::Owner::new().scope(async { lock.acquire().await.map(drop) });
    /// let (a, b) = tokio::join!(first, second);
    /// a?;
    /// b?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn reentrant(mut self, on: bool) -> Lock {
        self.reentrant = Some(on);
        self
    }

    /// Waits until the lock is held. Waiting costs no polling: the waiter is woken by the release
    /// message of the holder, or when the holder's lease would have run out, whichever comes first.
    ///
    /// An attempt that fails with a transient error (see [`Error::is_transient`]: Redis down or
    /// silent, a failover, too few masters) is made again after a growing pause (50 ms up to 1 s),
    /// for up to one lease of errors in a row (`watchdog_timeout`, or the fixed lease): then the
    /// last error is returned. A restart quarantine of a [`MultiLock`](crate::MultiLock)'s masters
    /// is waited out. Any other error is returned at once.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point leaves no lock held and no subscription behind, and a
    /// release message it was woken by is passed on to the next waiter.
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        match self.acquire_with(Wait::Forever).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::Shutdown), // not reached: an unbounded wait ends with a guard or an error
        }
    }

    /// One attempt, no waiting: `None` if another owner holds the lock. Returns within one attempt's
    /// bound (see [`acquire`](Lock::acquire)), whatever the servers do.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Lock::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        self.acquire_with(Wait::Once).await
    }

    /// Waits at most `wait` for the lock: `None` if it is still held by another owner then. Returns
    /// within `wait` (plus scheduling delays), whatever the servers do: an attempt still in flight
    /// then is abandoned and undone in the background, and if no attempt was ever answered, the
    /// result is an error ([`Error::Timeout`], or that of the attempt), not `None`. So a wait
    /// shorter than a round trip to Redis is a timeout: for one attempt, whatever it takes within
    /// its own bound, use [`try_acquire`](Lock::try_acquire). An attempt that fails with a transient
    /// error (see [`Error::is_transient`]) is made again after a pause until `wait` ends, and the
    /// last error is returned then; any other error is returned at once.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Lock::acquire).
    pub async fn try_acquire_for(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        self.acquire_with(Wait::up_to(wait)?).await
    }

    /// Whether anyone holds the lock (on a majority of the masters). Within one node timeout.
    pub async fn is_locked(&self) -> Result<bool, Error> {
        check_name(&self.name)?;
        let checks = self
            .core
            .masters
            .nodes
            .iter()
            .map(|node| node.is_locked(&self.keys));
        let mut locked = 0;
        let mut answered = 0;
        let mut error = None;
        for result in futures::future::join_all(checks).await {
            match result {
                Ok(found) => {
                    answered += 1;
                    locked += usize::from(found);
                }
                Err(err) => error = Some(err),
            }
        }
        match error {
            Some(err) if answered < self.core.masters.needed() => Err(err),
            _ => Ok(locked >= self.core.masters.needed()),
        }
    }

    /// Removes the lock whoever holds it, on every master that answers (an administrative
    /// override). The fencing counter is kept. `true` if a lock was removed on at least one master.
    /// Within one node timeout.
    ///
    /// The holder learns it at its watchdog's next round (within `renew_interval`, whatever its
    /// lease mode): its guard then reports [`is_held`](LockGuard::is_held) false and
    /// [`lost`](LockGuard::lost) completes. Until then it may still act on the lock, which is what
    /// the fencing token is for.
    pub async fn force_unlock(&self) -> Result<bool, Error> {
        check_name(&self.name)?;
        remove(&self.core, &self.keys).await
    }

    /// The engine this lock runs on.
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The lock's keys.
    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        &self.keys
    }

    /// The lease mode an acquisition asks for (after [`check_input`](Lock::check_input)).
    pub(crate) fn mode(&self) -> LeaseMode {
        self.lease.map_or(LeaseMode::Watchdog, LeaseMode::Fixed)
    }

    /// The owner id an acquisition made now, from this task, holds under.
    pub(crate) fn owner_id(&self) -> Str {
        match &self.owner {
            Some(owner) => owner.id_for(&self.core.id),
            None => Owner::current_id_for(&self.core.id),
        }
    }

    /// The checks an acquisition makes before any I/O: the name, and a fixed lease's range.
    pub(crate) fn check_input(&self) -> Result<(), Error> {
        check_name(&self.name)?;
        if let Some(lease) = self.lease {
            check_lease("lease", lease)?;
        }
        Ok(())
    }

    /// An acquire call in its `acquire` span, with its figures (see `util/telemetry.rs`). The span's
    /// fields: `lock`, `owner`, `mode` (`wait`, `try`, `try_for`), and at the end `waited_us`,
    /// `token` (when granted with one drawn: see [`LockGuard::fencing_token`]) and `outcome`; the
    /// attempt's own events nest inside it.
    async fn acquire_with(&self, wait: Wait) -> Result<Option<LockGuard>, Error> {
        let span = tracing::info_span!(
            "acquire",
            lock = %self.name,
            owner = Empty,
            mode = wait.mode(),
            waited_us = Empty,
            token = Empty,
            outcome = Empty,
        );
        let kind = self.keys.kind.prim();
        let label = telemetry::label(kind, &self.name, self.core.config.get_metrics_lock_names());
        let report = AcquireReport::start(label, span.clone());
        let attempts = async { Acquisition::new(self, wait, &report)?.run().await };
        let result = attempts.instrument(span).await;
        let token = result
            .as_ref()
            .ok()
            .and_then(Option::as_ref)
            .and_then(LockGuard::drawn_token);
        report.finish(Outcome::of(&result), token);
        result
    }
}

/// Removes the lock of `keys` on every master, whoever holds it (see [`Lock::force_unlock`]):
/// whether any had it. A master's error counts only where none removed it; a key of another type
/// fails at once.
pub(crate) async fn remove(core: &Core, keys: &LockKeys) -> Result<bool, Error> {
    let removals = core.masters.nodes.iter().map(|node| node.force_unlock(keys));
    let mut removed = false;
    let mut error = None;
    for result in futures::future::join_all(removals).await {
        match result {
            Ok(r) => removed |= r,
            Err(err @ Error::WrongType(_)) => return Err(err),
            Err(err) => error = Some(err),
        }
    }
    match error {
        Some(err) if !removed => Err(err),
        _ => {
            tracing::info!(lock = %keys.name, removed, "lock force-unlocked");
            Ok(removed)
        }
    }
}

/// Completes when `signal` turns `true` (a hold's loss; a streak-ending release's outcome known);
/// never without one.
async fn ended(signal: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    if let Some(signal) = signal {
        if signal.wait_for(|ended| *ended).await.is_ok() {
            return;
        }
        // A hold started another generation since (its loss channel replaced): that one was
        // released, which the release message or a handoff tells. Waking every waiter here would
        // only send them to the back of the queue.
    }
    std::future::pending().await
}

impl Lock {
    /// The guard of a waiter's mark of `place` (see `engine/marks.rs`), within the caller's bound.
    async fn adopt_mark(
        &self,
        place: &LockKeys,
        owner: &Str,
        until: Option<Instant>,
    ) -> Result<LockGuard, Error> {
        let adopt = self.core.adopt_mark(place.clone(), owner);
        let grant = self
            .core
            .within(until, adopt)
            .await
            .unwrap_or(Err(Error::Timeout(Duration::ZERO)))?;
        Ok(LockGuard::new(self.core.clone(), grant))
    }
}

/// A release message that woke a waiter, passed on to the next waiter if this one does not use it
/// (its future is dropped, or fails, before an attempt decides): otherwise one cancelled waiter
/// would leave the others asleep until the lease ran out.
pub(crate) struct WakeUp(pub(crate) Option<Arc<tokio::sync::Notify>>);

impl Drop for WakeUp {
    fn drop(&mut self) {
        if let Some(notify) = self.0.take() {
            notify.notify_one();
        }
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .finish()
    }
}
