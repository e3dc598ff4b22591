//! The waiting loop of one acquisition: attempt, and when refused, sleep until a release message,
//! the holder's lease end, a handoff from another owner of this client, or the caller's bound.
//!
//! Its state lives in one [`Acquisition`] for the life of the call's future; dropping the future
//! drops it, which unsubscribes, passes an unused wake-up on, and removes the waiter's mark.

use fred::bytes_utils::Str;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{ended, Lock, WakeUp};
use crate::config::{check_lease, check_name};
use crate::engine::core::Attempt;
use crate::engine::hold::LeaseMode;
use crate::engine::quorum::jitter;
use crate::engine::wait::{Retries, Wait};
use crate::primitives::guard::LockGuard;
use crate::redis::keys::{Kind, LockKeys};
use crate::redis::waiters::{Armed, Subscription};
use crate::util::telemetry::{AcquireReport, Waiting};
use crate::Error;

/// What one attempt (or a wait held back without one) came to.
enum Step {
    /// The call ends with this.
    Done(Result<Option<LockGuard>, Error>),
    /// Try again at once.
    Again,
    /// Refused: the holder's lease left, if known, and whether the vote was split.
    Refused {
        ttl: Option<std::time::Duration>,
        split: bool,
    },
}

/// One acquisition's state while it waits. Its fields drop in the order the loop's locals did:
/// the wake-up first (passed on), the subscriptions, the waiters' gauge, then the mark.
pub(super) struct Acquisition<'a> {
    /// The release message this waiter was woken by, until an attempt used it.
    wake_up: WakeUp,
    armed: Vec<Armed>,
    /// Subscribed lazily, on the first refusal, or at the start if others wait already (then a
    /// refusal needs no second attempt: no release is missed); dropped (unsubscribed) with this.
    subscriptions: Vec<Subscription>,
    /// Counted in `relock_waiters` from the first refusal on.
    waiting: Option<Waiting>,
    /// The guard of the waiter's mark (a waiting writer's record, a fair waiter's place).
    mark: Option<LockGuard>,
    /// Where the mark lives, if this acquisition leaves one.
    place: Option<LockKeys>,
    lock: &'a Lock,
    wait: Wait,
    report: &'a AcquireReport,
    mode: LeaseMode,
    owner: Str,
    keys: Arc<LockKeys>,
    /// A fair lock's waiter is woken by name, when it is its turn.
    named: bool,
    /// Whether a release of this client may hand the lock to this waiter (see `engine/core/handoff.rs`).
    handoff: bool,
    /// An `Upgrade` refusal is checked once against this client's own read hold.
    upgrade_checked: bool,
    refused: bool,
    until: Option<Instant>,
    retries: Retries,
    /// How long `acquire` rides through errors in a row: a lease.
    patience: std::time::Duration,
}

impl<'a> Acquisition<'a> {
    /// The checks before any I/O, and the keys this acquisition works on.
    pub(super) fn new(lock: &'a Lock, wait: Wait, report: &'a AcquireReport) -> Result<Self, Error> {
        check_name(&lock.name)?;
        let mode = match lock.lease {
            Some(lease) => {
                check_lease("lease", lease)?;
                LeaseMode::Fixed(lease)
            }
            None => LeaseMode::Watchdog,
        };
        let owner = lock.owner_id();
        tracing::Span::current().record("owner", &*owner);
        let keys = Self::keys(lock, &wait, &owner);
        // Taken before the first attempt, so that a future dropped while a refusal is on its way
        // still removes what that refusal left.
        let place = match &keys.kind {
            Kind::Write { rw, mark: Some(_) } => Some(rw.mark()),
            Kind::Fair {
                fair,
                enqueue: Some(_),
            } => Some(fair.waiter(&owner)),
            _ => None,
        };
        Ok(Acquisition {
            wake_up: WakeUp(None),
            armed: Vec::new(),
            subscriptions: Vec::new(),
            waiting: None,
            mark: None,
            named: matches!(keys.kind, Kind::Fair { .. }),
            handoff: lock.core.hands_over(&keys),
            place,
            until: wait.until(),
            patience: lock.lease.unwrap_or(lock.core.config.get_watchdog_timeout()),
            lock,
            wait,
            report,
            mode,
            owner,
            keys,
            upgrade_checked: false,
            refused: false,
            retries: Retries::new(),
        })
    }

    /// The keys an attempt works on: a reader's own, a waiting writer's or fair waiter's with its
    /// mark, or the lock's.
    fn keys(lock: &Lock, wait: &Wait, owner: &Str) -> Arc<LockKeys> {
        // A waiter's mark lives by the watchdog's heartbeat (see `engine/marks.rs`), whatever the lease.
        let mark_lease = lock.core.config.get_watchdog_timeout();
        match &lock.keys.kind {
            // Every reader's hold has a key (and a lease) of its own.
            Kind::Read(rw) => Arc::new(rw.reader(owner)),
            // A writer that will wait holds back new readers from its first refusal on; a fair lock's
            // waiter takes its place in the queue.
            Kind::Write { rw, .. } if !matches!(wait, Wait::Once) => Arc::new(rw.write(Some(mark_lease))),
            Kind::Fair { fair, .. } if !matches!(wait, Wait::Once) => Arc::new(fair.lock(Some(mark_lease))),
            _ => lock.keys.clone(),
        }
    }

    /// Attempts until granted, refused for good or out of time.
    pub(super) async fn run(mut self) -> Result<Option<LockGuard>, Error> {
        if let Err(done) = self.adopt_mark().await {
            return done;
        }
        self.join_early();
        loop {
            if !self.subscriptions.is_empty() {
                self.armed = self.subscriptions.iter().map(Subscription::armed).collect();
            }
            let (hold_back, mut hold_back_ends) = self.held_back();
            let (ttl, split) = match self.attempt(hold_back).await {
                Step::Done(result) => return result,
                Step::Again => continue,
                Step::Refused { ttl, split } => (ttl, split),
            };
            if self.wait.over() {
                return Ok(None);
            }
            // The watchdog may have found the mark missing before this refusal set it: taken anew
            // (a new generation; the old guard's drop then changes nothing).
            if !self.mark.as_ref().is_some_and(LockGuard::is_held) {
                if let Err(done) = self.adopt_mark().await {
                    return done;
                }
            }
            if self.waiting.is_none() {
                self.waiting = Some(Waiting::start(self.report.label()));
            }
            if self.subscribe() {
                // A release may have come between the attempt and the subscription.
                continue;
            }
            if let Some(grant) = self.sleep(ttl, split, &mut hold_back_ends).await {
                return Ok(Some(grant));
            }
        }
    }

    /// Takes (or takes anew) the guard of the waiter's mark, if this acquisition leaves one; `Err`
    /// holds the call's end.
    async fn adopt_mark(&mut self) -> Result<(), Result<Option<LockGuard>, Error>> {
        let Some(place) = &self.place else { return Ok(()) };
        match self.lock.adopt_mark(place, &self.owner, self.wait.until()).await {
            Ok(guard) => {
                self.mark = Some(guard);
                Ok(())
            }
            Err(Error::Timeout(_)) if self.wait.ran_out() => {
                Err(self.retries.ran_out_result(&self.wait, self.refused))
            }
            Err(err) => Err(Err(err)),
        }
    }

    /// Joins the lock's channel at once where others already wait on it, so that the first
    /// refusal needs no second attempt.
    fn join_early(&mut self) {
        if matches!(self.wait, Wait::Once) {
            return;
        }
        let name = self.named.then_some(&self.owner);
        let nodes = &self.lock.core.masters.nodes;
        let joined: Vec<Subscription> = nodes
            .iter()
            .map_while(|node| node.waiters.join_if_live(self.keys.wait_channel(), name))
            .collect();
        if joined.len() == nodes.len() {
            self.subscriptions = joined;
        }
    }

    /// Another owner of this client holds the lock (an attempt would be refused), or this client
    /// just ended a streak of handoffs (other clients' waiters go first): this waiter waits without
    /// an attempt, for its turn, a release, that lease's end or a signal that ends the wait (the
    /// holder's loss: the lock may be free long before its lease ran out, removed behind its back,
    /// and no release message says so). See `Handoffs::hold_back`.
    fn held_back(&self) -> (Option<Instant>, Option<watch::Receiver<bool>>) {
        if !self.handoff || self.subscriptions.is_empty() {
            return (None, None);
        }
        let woken = self.wake_up.0.is_some();
        match self
            .lock
            .core
            .handoffs
            .hold_back(&self.keys.lock, &self.owner, woken)
        {
            Some((deadline, ends)) => (Some(deadline), ends),
            None => (None, None),
        }
    }

    /// One attempt, or a refusal without one where this waiter is held back until `hold_back`.
    async fn attempt(&mut self, hold_back: Option<Instant>) -> Step {
        let attempt = match hold_back {
            Some(deadline) => Ok(Attempt::Refused {
                ttl: Some(deadline.saturating_duration_since(Instant::now())),
                split: false,
            }),
            None => {
                let core = &self.lock.core;
                let reentrant = self.lock.reentrant.unwrap_or(core.config.get_reentrant());
                let attempt = core
                    .attempt(&self.keys, &self.owner, self.mode, reentrant, self.until)
                    .await;
                if attempt.is_ok() {
                    // The release message that woke this waiter, if one did, is used.
                    self.wake_up.0 = None;
                }
                attempt
            }
        };
        match attempt {
            Ok(Attempt::Granted(grant)) => {
                let core = &self.lock.core;
                if self.handoff {
                    core.handoffs.granted(&self.keys.lock, &grant.hold, grant.gen);
                }
                // The grant's script call removed the mark: its release has nothing to send. (On
                // a quorum, masters that refused keep theirs until that release.)
                if let Some(mark) = self.mark.take().filter(|_| core.masters.single()) {
                    mark.removed_in_redis();
                }
                Step::Done(Ok(Some(LockGuard::new(core.clone(), grant))))
            }
            Ok(Attempt::Refused { ttl, split }) => {
                self.refused = true;
                self.retries.answered();
                Step::Refused { ttl, split }
            }
            // The caller's wait ran out during an attempt (abandoned, undone in the background).
            Err(Error::Timeout(_)) if self.wait.ran_out() => {
                Step::Done(self.retries.ran_out_result(&self.wait, self.refused))
            }
            Err(Error::Upgrade(name)) if !self.upgrade_checked => self.check_upgrade(name).await,
            // Tried again after a pause if the error may go away, within the bound.
            Err(err) => match self
                .retries
                .pause(&self.wait, err, self.patience, &self.lock.core)
                .await
            {
                Ok(()) => Step::Again,
                Err(err) => Step::Done(Err(err)),
            },
        }
    }

    /// The owner's reader key was there: a read guard dropped just before may still have its
    /// release on the way. Once that is done, the refusal is tried again; only a read hold that is
    /// still active makes it an upgrade.
    async fn check_upgrade(&mut self, name: String) -> Step {
        let Kind::Write { rw, .. } = &self.keys.kind else {
            return Step::Done(Err(Error::Upgrade(name)));
        };
        self.upgrade_checked = true;
        let reader = Arc::new(rw.reader(&self.owner));
        let core = &self.lock.core;
        let settled = core.holds.settled_active(&reader, &self.owner);
        match core.within(self.until, settled).await {
            Some(false) => Step::Again,
            Some(true) => Step::Done(Err(Error::Upgrade(name))),
            None => Step::Done(self.retries.ran_out_result(&self.wait, self.refused)),
        }
    }

    /// Subscribes to the lock's channel on every master after the first refusal; whether all
    /// confirmed at once (then the attempt is made again: a release may have come in between).
    fn subscribe(&mut self) -> bool {
        if !self.subscriptions.is_empty() {
            return false;
        }
        let name = self.named.then_some(&self.owner);
        let mut confirmed = true;
        for node in &self.lock.core.masters.nodes {
            let (subscription, wake, ok) = node.waiters.subscribe(self.keys.wait_channel(), name);
            self.subscriptions.push(subscription);
            self.armed.push(wake);
            confirmed &= ok;
        }
        confirmed
    }

    /// Sleeps until a release, the holder's lease would have run out, or (split vote) a random
    /// delay; never later than the caller's bound. A grant handed over by another owner of this
    /// client comes back.
    async fn sleep(
        &mut self,
        ttl: Option<std::time::Duration>,
        split: bool,
        hold_back_ends: &mut Option<watch::Receiver<bool>>,
    ) -> Option<LockGuard> {
        let core = &self.lock.core;
        let mut delay = ttl.unwrap_or(core.masters.config.retry_delay);
        if split {
            delay = delay.min(jitter(core.masters.config.retry_delay));
        }
        // On a quorum of masters, a waiter woken by another waiter's undone grant tries at most once
        // per random delay: a waiter refused by a majority grants itself the masters left free and
        // gives them back, and that undo wakes the next waiter, so woken by each at once, the
        // waiters of a lock held on a bare majority would keep waking each other until it is
        // released. Such a message that comes sooner is taken, and acted on at the delay's end. A
        // holder's release is acted on at once.
        let not_before =
            (!core.masters.single()).then(|| Instant::now() + jitter(core.masters.config.retry_delay));
        let wake_at = self.wait.wake_at(delay);
        tracing::trace!(lock = %self.lock.name, ?delay, "waiting for a release");
        let released = futures::future::select_all(self.armed.drain(..));
        // A release of another owner of this client may hand the lock over (see `engine/core/handoff.rs`).
        let mut ticket = self
            .handoff
            .then(|| core.enter_handoff(&self.keys, &self.owner, self.mode));
        let handed = std::future::poll_fn(|cx| match &mut ticket {
            Some(ticket) => std::pin::Pin::new(&mut ticket.grant).poll(cx).map(Result::ok),
            None => std::task::Poll::Pending,
        });
        tokio::select! {
            (_, node, _) = released => {
                self.wake_up.0 = Some(self.subscriptions[node].waker());
                if let Some(not_before) = not_before.filter(|_| self.subscriptions[node].by_undo()) {
                    tokio::time::sleep_until(self.wait.wake_at_instant(not_before)).await;
                }
            }
            () = tokio::time::sleep_until(wake_at) => {}
            () = ended(hold_back_ends) => {}
            grant = handed => {
                if let Some(grant) = grant {
                    // Not passed on: this waiter got the lock.
                    self.wake_up.0 = None;
                    return Some(LockGuard::new(core.clone(), grant));
                }
                // Taken, but not handed the lock: try at once.
            }
        }
        None
    }
}
