//! `Semaphore`: N permits shared through Redis, each holder with a lease of its own (Redisson's
//! `RPermitExpirableSemaphore`, with the watchdog keeping the leases), and its `Permit` guard.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::config::check_name;
use crate::engine::core::Core;
use crate::engine::permits::PermitAttempt;
use crate::engine::wait::{Retries, Wait};
use crate::primitives::guard::LockGuard;
use crate::primitives::lock::WakeUp;
use crate::primitives::owner::Owner;
use crate::redis::keys::SemaphoreKeys;
use crate::redis::scripts::scripts;
use crate::redis::waiters::{Armed, Subscription};
use crate::Error;

/// A semaphore of `permits` permits shared through Redis: made by
/// [`LockClient::semaphore`](crate::LockClient::semaphore); cheap to clone, no I/O until used.
///
/// - **Every holder has a lease**, renewed by the client's watchdog like a lock's (in the same
///   batched rounds): a holder that crashes gives its permits back within its lease
///   (`watchdog_timeout`), where Redisson's plain `RSemaphore` loses them for good. A holder cut off
///   longer than its lease loses its permits: its [`Permit`] reports it, as a lock guard does.
/// - **Waiting costs no polling**: a waiter sleeps until a release message or until the soonest
///   holder's lease would run out. A release wakes one waiter per client, which passes the wake-up
///   on while permits are left, so a release of several permits serves several waiters without a
///   stampede; a waiter short of permits makes no attempt until a release or a lease's end.
/// - **The number of permits** is stored with the semaphore while permits are held; a caller
///   giving another number then gets [`Error::InvalidConfig`] and changes nothing. Once no permit
///   is held, the next acquisition's number is the one in force.
/// - Not reentrant: every acquisition is a holder of its own. Not on a
///   [`MultiLock`](crate::MultiLock): a count of permits split over independent masters has no
///   majority to agree on. Grants do not wait for replicas (`sync_replicas` applies to locks).
///
/// ```no_run
/// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
/// // At most 10 calls in flight to a rate-limited API, across every instance of the service.
/// let api = client.semaphore("partner-api", 10);
/// let permit = api.acquire(1).await?;
/// // ... call the API; the permit comes back when `permit` is dropped (or within its lease if
/// // this process dies) ...
/// drop(permit);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    core: Arc<Core>,
    keys: Arc<SemaphoreKeys>,
    permits: u64,
}

impl Semaphore {
    pub(crate) fn new(core: Arc<Core>, name: &str, permits: u64) -> Semaphore {
        let keys = Arc::new(SemaphoreKeys::new(core.config.get_key_prefix(), name));
        Semaphore { core, keys, permits }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// The number of permits this handle gives the semaphore.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// Waits until `n` permits are free, and takes them. A transient error is tried again for up
    /// to one lease of errors in a row, as [`Lock::acquire`](crate::Lock::acquire) does.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no permit taken (one granted meanwhile is given back in the
    /// background).
    pub async fn acquire(&self, n: u64) -> Result<Permit, Error> {
        match self.acquire_with(n, Wait::Forever).await? {
            Some(permit) => Ok(permit),
            None => Err(Error::Shutdown), // not reached: an unbounded wait ends with permits or an error
        }
    }

    /// One attempt, no waiting: `None` if fewer than `n` permits are free.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Semaphore::acquire).
    pub async fn try_acquire(&self, n: u64) -> Result<Option<Permit>, Error> {
        self.acquire_with(n, Wait::Once).await
    }

    /// Waits at most `wait` for `n` permits: `None` if they were not free by then. Returns within
    /// `wait`, whatever the server does; if no attempt was answered by then, the result is
    /// [`Error::Timeout`]. A transient error is tried again until `wait` ends, as
    /// [`Lock::try_acquire_for`](crate::Lock::try_acquire_for) does.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Semaphore::acquire).
    pub async fn try_acquire_for(&self, n: u64, wait: Duration) -> Result<Option<Permit>, Error> {
        self.acquire_with(n, Wait::up_to(wait)?).await
    }

    /// The permits free now (holders whose lease ran out count as free). Within the command timeout.
    pub async fn available(&self) -> Result<u64, Error> {
        self.check(1)?;
        let node = &self.core.masters.nodes[0];
        let reply = node
            .run_list(
                &scripts().semaphore_available,
                &[&self.keys.index],
                vec![Value::from(self.permits as i64)],
            )
            .await?;
        match reply.as_slice() {
            [free, _] => Ok((*free).max(0) as u64),
            other => Err(Error::unexpected_reply("a semaphore read", &other)),
        }
    }

    fn check(&self, n: u64) -> Result<(), Error> {
        check_name(&self.keys.name)?;
        if self.permits == 0 || self.permits > i64::MAX as u64 {
            return Err(Error::InvalidConfig(format!(
                "a semaphore has 1 to {} permits, not {}",
                i64::MAX,
                self.permits
            )));
        }
        if n == 0 || n > self.permits {
            return Err(Error::InvalidConfig(format!(
                "{n} permits asked of a semaphore of {}",
                self.permits
            )));
        }
        Ok(())
    }

    /// An acquisition, counted in the figures (`kind="semaphore"`, see `util/telemetry.rs`).
    async fn acquire_with(&self, n: u64, wait: Wait) -> Result<Option<Permit>, Error> {
        use crate::util::telemetry::{self, AcquireReport, Outcome, Prim};
        let label = telemetry::label(
            Prim::Semaphore,
            &self.keys.name,
            self.core.config.get_metrics_lock_names(),
        );
        let report = AcquireReport::start(label, tracing::Span::none());
        let result = self.attempts(n, wait, &report).await;
        report.finish(Outcome::of(&result), None);
        result
    }

    async fn attempts(
        &self,
        n: u64,
        wait: Wait,
        report: &crate::util::telemetry::AcquireReport,
    ) -> Result<Option<Permit>, Error> {
        self.check(n)?;
        // A holder of its own per acquisition: permits are not reentrant.
        let holder = Owner::new().id_for(&self.core.id);
        let until = wait.until();
        let node = &self.core.masters.nodes[0];
        let mut subscription: Option<Subscription> = None;
        // A release message that woke this waiter, passed on if no attempt answers before the
        // wait ends (timed out, failed or dropped): the next waiter may use what it freed.
        let mut wake_up = WakeUp(None);
        let mut armed = None;
        let mut answered = false;
        let mut retries = Retries::new();
        let patience = self.core.config.get_watchdog_timeout();
        // Counted in `relock_waiters` from the first refusal on.
        let mut waiting = None;
        loop {
            if let Some(subscription) = &subscription {
                armed = Some(subscription.armed());
            }
            let attempt = self
                .core
                .attempt_permits(&self.keys, &holder, self.permits, n, until)
                .await;
            if attempt.is_ok() {
                wake_up.0 = None;
            }
            let soonest = match attempt {
                Ok(PermitAttempt::Granted { grant, free }) => {
                    relay(subscription.as_ref(), &mut armed, free, true);
                    let guard = LockGuard::new(self.core.clone(), grant);
                    return Ok(Some(Permit { guard, permits: n }));
                }
                Ok(PermitAttempt::Refused { free, soonest }) => {
                    answered = true;
                    retries.answered();
                    relay(subscription.as_ref(), &mut armed, free, false);
                    soonest
                }
                Err(Error::Timeout(_)) if wait.ran_out() => return retries.ran_out_result(&wait, answered),
                // Tried again after a pause if the error may go away, within the bound.
                Err(err) => {
                    retries.pause(&wait, err, patience, &self.core).await?;
                    continue;
                }
            };
            if wait.over() {
                return Ok(None);
            }
            if waiting.is_none() {
                waiting = Some(crate::util::telemetry::Waiting::start(report.label()));
            }
            if subscription.is_none() {
                let (sub, wake, confirmed) = node.waiters.subscribe(&self.keys.channel, None);
                subscription = Some(sub);
                armed = Some(wake);
                if confirmed {
                    // A release may have come between the attempt and the subscription.
                    continue;
                }
            }
            if self.sleep(armed.take(), &wait, soonest).await {
                wake_up.0 = subscription.as_ref().map(|subscription| subscription.waker());
            }
            if self.core.is_closed() {
                return Err(Error::Shutdown);
            }
        }
    }

    /// Sleeps until woken by a release, or when the soonest holder's lease would run out (a
    /// crashed holder's permits come back then), never later than the caller's bound; whether a
    /// release woke it.
    async fn sleep(&self, armed: Option<Armed>, wait: &Wait, soonest: Option<Duration>) -> bool {
        let wake_at = wait.wake_at(soonest.unwrap_or(self.core.masters.config.retry_delay));
        match armed {
            Some(armed) => tokio::select! {
                () = armed => true,
                () = tokio::time::sleep_until(wake_at) => false,
            },
            None => false,
        }
    }
}

/// Passes a release's wake-up on after an answered attempt that left `free` permits free. A
/// release message wakes one waiter per client. One `granted` with permits left over passes the
/// wake-up on to the next waiter, so that a release of several permits serves several waiters
/// without waking every one of them. One refused while permits are free (it asked for more) passes
/// it on to every other waiter, once per message (`Subscription::pass_on`): never to itself, and
/// refused waiters do not wake each other for ever.
fn relay(subscription: Option<&Subscription>, armed: &mut Option<Armed>, free: u64, granted: bool) {
    let Some(subscription) = subscription.filter(|_| free > 0) else {
        return;
    };
    drop(armed.take());
    if granted {
        subscription.waker().notify_one();
    } else {
        subscription.pass_on();
        // A message that came meanwhile is stored for this arming: not lost.
        *armed = Some(subscription.armed());
    }
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.keys.name)
            .field("permits", &self.permits)
            .finish()
    }
}

/// Permits of a [`Semaphore`], held until the guard goes: dropping it gives them back at once,
/// without blocking (as a [`LockGuard`] releases its lock). The watchdog renews its lease.
#[must_use = "dropping the permit gives it back at once"]
#[derive(Debug)]
pub struct Permit {
    guard: LockGuard,
    permits: u64,
}

impl Permit {
    /// How many permits it holds.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// Whether its lease is still held.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// How long its lease is still known to be valid.
    pub fn validity(&self) -> Duration {
        self.guard.validity()
    }

    /// The instant its lease stops being safe (see [`LockGuard::valid_until`]).
    pub fn valid_until(&self) -> tokio::time::Instant {
        self.guard.valid_until()
    }

    /// Completes when its lease is lost (renewal failed or found it gone, or the lease ran out).
    pub async fn lost(&self) {
        self.guard.lost().await;
    }

    /// Runs `work` while the lease is held: if it is lost first, `work` is dropped and
    /// `Err(Error::LeaseLost)` is returned.
    pub async fn until_lost<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        self.guard.until_lost(work).await
    }

    /// Gives the permits back and waits for Redis to confirm; `Err(Error::Lost)` if the lease was
    /// known lost, `Err(Error::NotHeld)` if Redis found it gone (as
    /// [`LockGuard::release`](crate::LockGuard::release)).
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await
    }
}
