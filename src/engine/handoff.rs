//! Local handoff: a plain lock that one owner of a client releases while another owner of the same
//! client waits for it goes straight to that waiter, in one script call: the releasing hold goes
//! and the waiter's starts in the same step. The lock is never free in
//! between, so nothing is published: the waiter skips the release message and its own attempt (a
//! round trip), and the other clients' waiters are not woken to be refused.
//!
//! The waiter does not wait for that call either, when it can be given the lock safely before
//! Redis answers ([`Core::early_grant`]): its lease is the releasing hold's, which Redis keeps
//! holding until the call lands. A plain lock draws its fencing token only when its holder reads it
//! ([`Core::fencing_token`]): a releasing hold that drew none hands on none (the waiter draws its
//! own if it reads one); one that drew hands on its token plus one, at no cost. The call
//! (`scripts/transfer_granted.lua`) moves the hold, raises the fence to the token handed on, if
//! any (so later draws are above it), and sets the waiter's own lease; its answer extends the
//! waiter's lease, or ends the grant as lost when the lock was gone meanwhile. Otherwise the call
//! moves the hold first (`scripts/transfer.lua`, no token) and the waiter is granted when it
//! answers. Not early, so that Redis
//! surely holds the releasing hold's field: a hold retired meanwhile, one whose lease ends within two
//! calls' bounds, or a lock with an undo of this client on its way (an attempt of the same owner
//! whose outcome is unknown may have replaced that field); nor after a hold shorter than the last
//! handoff's call, where it gains nothing.
//!
//! Most handoffs make no call at all ([`LockConfig::unrecorded_handoffs`]): a call that records a
//! handoff with a token raises the fence that many tokens past it (a reserve; handoffs without a
//! token need none), and the next
//! handoffs hand out those tokens without asking Redis ([`Core::unrecorded_grant`]). Redis goes on
//! holding the lock for the hold it recorded, with that hold's lease, which the new holders inherit
//! (pending, as after an early grant); an acquisition elsewhere draws above the reserve. The next
//! call records the latest holder from the recorded hold's field, with the fence compared with
//! the reserve's end that this client left there: the next handoff past the reserve, or
//! [`UNRECORDED_MAX`] after the first unrecorded one ([`Job::Record`]), or the holder's re-entry
//! ([`Core::record_owed`]), or any other attempt of this client at the lock ([`Core::open_hold`]):
//! Redis names the recorded owner, whose next attempt would replace that ended hold of its own
//! (see acquire.lua). A release with nobody to hand on to removes the recorded hold instead
//! ([`Core::release_unrecorded`]): one call, as any release.
//!
//! Waiters of this client enter a queue per lock while they sleep ([`Handoffs::enter`]), first come
//! first served. A release of a hold at count 0 ([`Core::hand_over`]) takes the first of them. At
//! most [`handoff_limit`](crate::LockConfig::handoff_limit) handoffs of a lock follow each other,
//! over at most [`handoff_window`](crate::LockConfig::handoff_window); then a release frees the
//! lock and publishes, so that other clients' waiters get their turn.
//!
//! Only where one script call decides: plain locks on one master without synced writes.
//!
//! [`LockConfig::unrecorded_handoffs`]: crate::LockConfig::unrecorded_handoffs

use fred::bytes_utils::Str;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;

use crate::engine::core::{Core, UndoOnDrop};
use crate::engine::hold::{Grant, Hold, Job, LeaseMode};
use crate::redis::batch::Granted;
use crate::redis::keys::{Kind, LockKeys};
use crate::Error;

/// How many round trips of the release that ended a streak this client's attempts hold back (see
/// [`Handoffs::hold_back`]), within [`YIELD_MIN`] and [`YIELD_MAX`]: a release message reaches the
/// other clients and their attempts come back in about two.
const YIELD_RTTS: u32 = 4;
const YIELD_MIN: Duration = Duration::from_millis(1);
const YIELD_MAX: Duration = Duration::from_millis(20);

/// How long handoffs may go unrecorded in Redis (see [`LockConfig::unrecorded_handoffs`]): the
/// first of them schedules the record ([`Job::Record`]).
///
/// [`LockConfig::unrecorded_handoffs`]: crate::LockConfig::unrecorded_handoffs
const UNRECORDED_MAX: Duration = Duration::from_millis(10);

/// The waiters of this client that a release may hand a lock to, by lock key.
pub(crate) struct Handoffs {
    queues: Mutex<HashMap<Str, Queue>>,
    limit: u32,
    window: Duration,
    /// How many tokens a record reserves ahead for unrecorded handoffs.
    reserve: u32,
    /// How many locks are held by handoffs not recorded yet (see [`Queue::owed`]): an attempt
    /// looks for them only while there are any.
    owing: AtomicUsize,
    /// Notified when handoffs not recorded were recorded, or the call failed (see
    /// [`Handoffs::settle`]).
    recorded: Notify,
    ids: AtomicU64,
    /// How long the last handoff's call took, in µs (see [`Core::early_grant`]).
    call_us: AtomicU64,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Candidate>,
    /// Handoffs of this lock since it was last freed by a release of this client.
    streak: u32,
    /// When the first of them was made.
    streak_start: Option<Instant>,
    /// The streak has reached the limit or the window: the next release of this client frees the
    /// lock. Kept once seen, so that the release's start and end agree (see [`Queue::full`]).
    full: bool,
    /// The hold and generation the last handoff went to, until a release of this client frees
    /// the lock.
    holder: Option<(Arc<Hold>, u64)>,
    /// After a release that ended a streak, this client's attempts that no release message woke
    /// wait until then (see [`Handoffs::hold_back`]);
    yield_until: Option<Instant>,
    /// If other clients' subscribers heard that release: the waiter of this client that its message
    /// woke waits too, and so the first attempt that any message wakes (then this is cleared: a
    /// later message tells of another client's release, which any waiter may take).
    yield_woken: bool,
    /// A release of this client that ends a streak is on its way: set to `true` once its outcome
    /// is known (see [`Ending`]).
    ending: Option<watch::Sender<bool>>,
    /// The hold Redis holds the lock by, as this client's last handoff call recorded it, while
    /// that stands.
    recorded: Option<Recorded>,
    /// The hold that holds the lock by handoffs Redis has not recorded yet, if one does.
    owed: Option<Owed>,
    /// Calls that record or release such handoffs, taken from [`Queue::owed`], on their way: until
    /// they land, Redis still holds the lock by an earlier hold's field, which that hold's owner's
    /// next attempt would replace (see [`Handoffs::owes`]).
    settling: u32,
}

/// The hold Redis holds a lock by (see [`Queue::recorded`]).
#[derive(Clone)]
struct Recorded {
    hold: Arc<Hold>,
    gen: u64,
    field: Str,
    /// The fence's value in Redis: the tokens up to it are this client's to hand out without a
    /// call. `None`: at the hold's own token.
    ceiling: Option<u64>,
}

/// A hold granted by handoffs that Redis has not recorded (see [`Queue::owed`]).
struct Owed {
    hold: Arc<Hold>,
    gen: u64,
    /// When the first of them was made.
    since: Instant,
}

/// How Redis holds a lock for the hold that is about to hand it on (see [`Handoffs::via`]).
struct Via {
    recorded: Recorded,
    /// The hold holds it by unrecorded handoffs since then; `None`: Redis recorded the hold itself.
    owed_since: Option<Instant>,
}

impl Queue {
    /// Whether the streak has reached `limit` handoffs or lasted `window`; once it has, it stays
    /// so until a release of this client frees the lock.
    fn full(&mut self, limit: u32, window: Duration) -> bool {
        if !self.full {
            self.full = self.streak >= limit || self.streak_start.is_some_and(|at| at.elapsed() >= window);
        }
        self.full
    }

    /// Nothing to remember: the entry can go.
    fn idle(&self) -> bool {
        self.waiting.is_empty()
            && self.streak == 0
            && self.ending.is_none()
            && self.recorded.is_none()
            && self.owed.is_none()
            && self.settling == 0
            && self.yield_until.is_none_or(|until| until <= Instant::now())
    }
}

/// A waiter that a release will hand the lock to, with its hold's operations taken (see
/// [`Core::taker`]).
pub(crate) struct Taker {
    candidate: Candidate,
    hold: Arc<Hold>,
    ops: tokio::sync::OwnedMutexGuard<()>,
}

/// A waiter that a release may hand the lock to.
struct Candidate {
    id: u64,
    owner: Str,
    mode: LeaseMode,
    grant: oneshot::Sender<Grant>,
}

/// A waiter's place in the queue of its lock, while it sleeps. Dropping it leaves the queue; a
/// grant that reached it but was never taken is given back (see [`Core::give_back`]).
pub(crate) struct Ticket<'a> {
    core: &'a Arc<Core>,
    lock: Str,
    id: u64,
    /// The grant, if a release hands the lock over; closed if the release took this waiter but could
    /// not hand it the lock (the waiter should try itself at once).
    pub(crate) grant: oneshot::Receiver<Grant>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        // Closed first: a release that has not sent yet gives the grant back itself.
        self.grant.close();
        if let Ok(grant) = self.grant.try_recv() {
            self.core.give_back(grant);
        }
        let mut queues = self.core.handoffs.queues.lock();
        if let Some(queue) = queues.get_mut(&self.lock) {
            queue.waiting.retain(|c| c.id != self.id);
            if queue.idle() {
                queues.remove(&self.lock);
            }
        }
    }
}

/// A release of this client that ends a streak of handoffs, on its way (see [`Handoffs::ending`]).
/// Dropping it (the release answered, failed or cancelled) wakes the waiters that wait to learn
/// whether other clients heard it.
pub(crate) struct Ending<'a> {
    handoffs: &'a Handoffs,
    lock: Str,
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let mut queues = self.handoffs.queues.lock();
        if let Some(queue) = queues.get_mut(&self.lock) {
            if let Some(settled) = queue.ending.take() {
                settled.send_replace(true);
            }
            if queue.idle() {
                queues.remove(&self.lock);
            }
        }
    }
}

impl Handoffs {
    pub(crate) fn new(limit: u32, window: Duration, reserve: u32) -> Handoffs {
        Handoffs {
            queues: Mutex::new(HashMap::new()),
            limit,
            window,
            reserve,
            owing: AtomicUsize::new(0),
            recorded: Notify::new(),
            ids: AtomicU64::new(0),
            call_us: AtomicU64::new(0),
        }
    }

    /// The first waiter for `lock` still there, other than `owner`; `None` when there is none or
    /// the streak of handoffs is full (see [`Queue::full`]).
    fn next(&self, lock: &str, owner: &str) -> Option<Candidate> {
        let mut queues = self.queues.lock();
        let queue = queues.get_mut(lock)?;
        if queue.full(self.limit, self.window) {
            return None;
        }
        let at = queue
            .waiting
            .iter()
            .position(|c| !c.grant.is_closed() && *c.owner != *owner)?;
        queue.waiting.remove(at)
    }

    /// `lock` was handed over once more, to generation `gen` of `hold`.
    fn handed(&self, lock: &str, hold: &Arc<Hold>, gen: u64) {
        if let Some(queue) = self.queues.lock().get_mut(lock) {
            queue.streak += 1;
            queue.streak_start.get_or_insert_with(Instant::now);
            queue.holder = Some((hold.clone(), gen));
        }
    }

    /// Generation `gen` of `hold` was granted `lock` by an attempt: if waiters of this client are
    /// queued for it, they need not try while it is held (see [`held_here`](Handoffs::held_here)).
    pub(crate) fn granted(&self, lock: &str, hold: &Arc<Hold>, gen: u64) {
        if let Some(queue) = self.queues.lock().get_mut(lock) {
            queue.holder = Some((hold.clone(), gen));
            // Redis granted it: whatever this client recorded of the lock is past.
            if queue
                .recorded
                .as_ref()
                .is_some_and(|r| !Arc::ptr_eq(&r.hold, hold) || r.gen != gen)
            {
                queue.recorded = None;
            }
        }
    }

    /// How Redis holds `lock` for generation `gen` of `hold`, if by a handoff this client recorded
    /// or by one it has not recorded yet.
    fn via(&self, lock: &str, hold: &Arc<Hold>, gen: u64) -> Option<Via> {
        let queues = self.queues.lock();
        let queue = queues.get(lock)?;
        let recorded = queue.recorded.clone()?;
        match &queue.owed {
            Some(owed) => (Arc::ptr_eq(&owed.hold, hold) && owed.gen == gen).then_some(Via {
                recorded,
                owed_since: Some(owed.since),
            }),
            None => (Arc::ptr_eq(&recorded.hold, hold) && recorded.gen == gen).then_some(Via {
                recorded,
                owed_since: None,
            }),
        }
    }

    /// Generation `gen` of `hold` holds `lock` now by handoffs that Redis has not recorded, the
    /// first of them made at `since`; true if this is the first.
    fn owe(&self, lock: &Str, hold: &Arc<Hold>, gen: u64, since: Instant) -> bool {
        let owed = Owed {
            hold: hold.clone(),
            gen,
            since,
        };
        let mut queues = self.queues.lock();
        let first = queues
            .entry(lock.clone())
            .or_default()
            .owed
            .replace(owed)
            .is_none();
        if first {
            self.owing.fetch_add(1, Ordering::SeqCst);
        }
        first
    }

    /// Returns once `keys` is held by no handoffs that Redis has not recorded, which the
    /// releaser records now ([`Job::Record`]). Cancel safe: the record goes on without it.
    pub(crate) async fn settle(&self, core: &Arc<Core>, keys: &Arc<LockKeys>) {
        loop {
            let recorded = self.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            if !self.owes(&keys.lock) {
                return;
            }
            // Asked again after each record: the holder may have handed the lock on meanwhile.
            let asked = core.enqueue(Job::Record {
                keys: keys.clone(),
                at: None,
            });
            if !asked {
                // The releaser is gone (its runtime shut down): nothing will record them.
                return;
            }
            recorded.await;
        }
    }

    /// Whether `lock` may be held by handoffs not recorded yet, or by ones whose record or
    /// release is on its way.
    pub(crate) fn owes(&self, lock: &str) -> bool {
        if self.owing.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let queues = self.queues.lock();
        queues
            .get(lock)
            .is_some_and(|queue| queue.owed.is_some() || queue.settling > 0)
    }

    /// Takes the unrecorded handoffs that generation `gen` of `hold` holds `lock` by, if it does:
    /// the caller records them or releases the lock (the hold's operations held), and the hold
    /// Redis holds the lock by is returned, with a guard to keep until that call is done (this
    /// client's attempts at the lock wait for it: see [`owes`](Handoffs::owes)). Handoffs to an
    /// ended generation of the hold are stale, and so are handoffs with no record of this client's
    /// standing (Redis granted the lock since): they go all the same.
    fn take_owed(&self, lock: &str, hold: &Arc<Hold>, gen: u64) -> Option<(Recorded, Settling<'_>)> {
        let mut queues = self.queues.lock();
        let queue = queues.get_mut(lock)?;
        let owed = queue.owed.as_ref().filter(|owed| Arc::ptr_eq(&owed.hold, hold))?;
        let current = hold.state.lock().gen;
        if owed.gen != gen && owed.gen == current {
            return None;
        }
        let owed = queue.owed.take()?;
        match queue.recorded.clone().filter(|_| owed.gen == gen) {
            Some(recorded) => {
                // Still owing until the call lands (the guard counts it off).
                queue.settling += 1;
                let settling = Settling {
                    handoffs: self,
                    lock: Str::from(lock),
                };
                Some((recorded, settling))
            }
            None => {
                // Nothing to record (stale, or no record stands): attempts that wait for it go now.
                self.owing.fetch_sub(1, Ordering::SeqCst);
                self.recorded.notify_waiters();
                None
            }
        }
    }

    /// The hold that holds `lock` by unrecorded handoffs, and since when.
    fn owed(&self, lock: &str) -> Option<(Arc<Hold>, Instant)> {
        let queues = self.queues.lock();
        let owed = queues.get(lock)?.owed.as_ref()?;
        Some((owed.hold.clone(), owed.since))
    }

    /// What a handoff call of `lock` left in Redis: `recorded` holds it (`None`: no record of this
    /// client's stands).
    fn set_recorded(&self, lock: &Str, recorded: Option<Recorded>) {
        let mut queues = self.queues.lock();
        if recorded.is_some() {
            queues.entry(lock.clone()).or_default().recorded = recorded;
        } else if let Some(queue) = queues.get_mut(lock) {
            queue.recorded = None;
            if queue.idle() {
                queues.remove(lock);
            }
        }
    }

    /// The holds Redis holds locks by for handoffs not recorded yet (shutdown removes them).
    pub(crate) fn unrecorded(&self) -> Vec<(Arc<LockKeys>, Str)> {
        self.queues
            .lock()
            .values()
            .filter(|queue| queue.owed.is_some())
            .filter_map(|queue| queue.recorded.as_ref())
            .map(|recorded| (recorded.hold.keys.clone(), recorded.field.clone()))
            .collect()
    }

    /// Why an attempt of `owner` at `lock` would be wasted or unfair now, if it would: until when
    /// to hold it back, and a signal (a watch that turns `true`) that ends the wait early. `woken`:
    /// a release message woke the attempt.
    ///
    /// - Another owner of this client holds the lock (by a handoff, or an attempt while others of
    ///   this client were queued) and its hold is active: the attempt would be refused. Until its
    ///   lease runs out, or its loss.
    /// - A release of this client that ends a streak is on its way: until its outcome is known
    ///   (see [`freed`](Handoffs::freed)), at most [`YIELD_MAX`].
    /// - Right after a release that ended a streak: the waiters its message woke on other clients
    ///   get the lock first. Otherwise the owner that released, or another of this client, trying
    ///   again at once would take it back before their attempts arrive (its own come a round trip
    ///   sooner, and its woken waiter hears the message as soon as they do), and the limit would
    ///   let no other client in. Attempts that a release message woke go ahead only if no other
    ///   client heard that message.
    pub(crate) fn hold_back(
        &self,
        lock: &str,
        owner: &str,
        woken: bool,
    ) -> Option<(Instant, Option<watch::Receiver<bool>>)> {
        let mut queues = self.queues.lock();
        let queue = queues.get_mut(lock)?;
        let now = Instant::now();
        if let Some((hold, gen)) = &queue.holder {
            if *hold.owner != *owner {
                let st = hold.state.lock();
                if st.gen == *gen && st.active() && st.deadline > now {
                    return Some((st.deadline, Some(st.lost.subscribe())));
                }
            }
        }
        if let Some(settled) = &queue.ending {
            return Some((now + YIELD_MAX, Some(settled.subscribe())));
        }
        let until = queue.yield_until.filter(|until| *until > now)?;
        if woken {
            // The first woken attempt holds back; once it ends its wait (at `until`, or woken
            // by another release), it is let through with the rest.
            if !std::mem::take(&mut queue.yield_woken) {
                return None;
            }
        }
        Some((until, None))
    }

    /// A release of this client is about to free `lock`: if it ends a streak of handoffs, its
    /// waiters learn of it (see [`hold_back`](Handoffs::hold_back)) until the returned token goes.
    pub(crate) fn ending(&self, lock: &Str) -> Option<Ending<'_>> {
        let mut queues = self.queues.lock();
        let queue = queues.get_mut(lock)?;
        if self.limit == 0 || !queue.full(self.limit, self.window) || queue.ending.is_some() {
            return None;
        }
        queue.ending = Some(watch::channel(false).0);
        Some(Ending {
            handoffs: self,
            lock: lock.clone(),
        })
    }

    /// A release of `hold` left its lock free (and told every client), its call taking `rtt`;
    /// `others`: whether subscribers of other clients heard its message (`None`: unknown). The
    /// streak starts again. If it ended a streak, this client's attempts hold back for a few such
    /// round trips (see [`hold_back`](Handoffs::hold_back)).
    pub(crate) fn freed(&self, hold: &Arc<Hold>, rtt: Duration, others: Option<bool>) {
        let lock = &*hold.keys.lock;
        let mut queues = self.queues.lock();
        if let Some(queue) = queues.get_mut(lock) {
            if queue
                .recorded
                .as_ref()
                .is_some_and(|r| Arc::ptr_eq(&r.hold, hold))
            {
                queue.recorded = None;
            }
            if queue.full || queue.streak >= self.limit {
                queue.yield_until = Some(Instant::now() + (rtt * YIELD_RTTS).clamp(YIELD_MIN, YIELD_MAX));
                queue.yield_woken = others == Some(true);
            }
            queue.streak = 0;
            queue.streak_start = None;
            queue.full = false;
            queue.holder = None;
            if queue.idle() {
                queues.remove(lock);
            }
        }
    }
}

impl Core {
    /// Queues `owner`, who waits for `keys` with lease `mode`, for a handoff.
    pub(crate) fn enter_handoff(
        self: &Arc<Self>,
        keys: &LockKeys,
        owner: &Str,
        mode: LeaseMode,
    ) -> Ticket<'_> {
        let (tx, rx) = oneshot::channel();
        let id = self.handoffs.ids.fetch_add(1, Ordering::Relaxed);
        self.handoffs
            .queues
            .lock()
            .entry(keys.lock.clone())
            .or_default()
            .waiting
            .push_back(Candidate {
                id,
                owner: owner.clone(),
                mode,
                grant: tx,
            });
        Ticket {
            core: self,
            lock: keys.lock.clone(),
            id,
            grant: rx,
        }
    }

    /// Whether waiters for `keys` may be handed the lock by a release (see the module doc).
    pub(crate) fn hands_over(&self, keys: &LockKeys) -> bool {
        matches!(keys.kind, Kind::Plain)
            && self.handoffs.limit > 0
            && self.masters.single()
            && self.config.get_sync_replicas() == 0
    }

    /// The waiter of this client that a release of `hold` at count 0 may hand the lock to, with
    /// its hold and that hold's operations taken: the first queued one whose operations are not
    /// busy (one that is busy, with a release of an earlier guard say, is left to try itself
    /// rather than the release waiting for it). `None`: release as usual. No I/O.
    pub(crate) fn taker(&self, hold: &Hold) -> Option<Taker> {
        if !self.hands_over(&hold.keys) || self.is_closed() {
            return None;
        }
        let keys = &hold.keys;
        loop {
            let candidate = self.handoffs.next(&keys.lock, &hold.owner)?;
            if !self.masters.voters(self.quarantine())[0] {
                return None;
            }
            if let Some((to, ops)) = self.holds.try_lock_hold(keys, &candidate.owner) {
                if !to.state.lock().active() {
                    return Some(Taker {
                        candidate,
                        hold: to,
                        ops,
                    });
                }
                self.holds.retire_if_idle(&to);
            }
        }
    }

    /// Releases generation `gen` (field `field`) of `hold`, whose count is 0 here, by handing the
    /// lock to `taker` (see the module doc and [`taker`](Core::taker)); returns the release's
    /// outcome, or `None` when Redis refused a grant made early (the lock was no longer this hold's,
    /// or a later token was drawn): the caller then releases this hold as usual, announcing it.
    /// Called with the hold's `ops` lock held.
    ///
    /// Where the reserve of the last record allows it ([`unrecorded_grant`](Core::unrecorded_grant)),
    /// the waiter is granted the lock with no call at all: the next call records it. Else, when
    /// this hold's lease outlasts the call ([`early_grant`](Core::early_grant)), the waiter is
    /// granted the lock before the call, with the next token and this hold's lease end, and the
    /// call records that in Redis (`scripts/transfer_granted.lua`): its answer extends the waiter's
    /// lease, or ends the grant as lost. Otherwise the call draws the token and the waiter is
    /// granted once it answers. If the call's outcome is unknown, both holds are brought in line
    /// in the background, and the waiter tries itself (or, granted already, loses the lock).
    ///
    /// # Cancel safety
    ///
    /// Dropping it mid-call leaves the outcome unknown: handled as above.
    pub(crate) async fn hand_over(
        self: &Arc<Self>,
        hold: &Arc<Hold>,
        gen: u64,
        field: &Str,
        taker: Taker,
    ) -> Option<Result<(), Error>> {
        let keys = &hold.keys;
        let Taker {
            candidate,
            hold: to,
            ops: to_ops,
        } = taker;
        let mode = candidate.mode;
        let ask = self.ask(&to, &candidate.owner, mode);
        let start = Instant::now();
        let lease_end = start + ask.lease.saturating_sub(self.masters.config.drift(ask.lease));
        let mut via = self.handoffs.via(&keys.lock, hold, gen);
        if let Some((token, until)) = via
            .as_ref()
            .and_then(|via| self.unrecorded_grant(hold, gen, via, start))
        {
            let Some(grant) = self.record_grant(&to, &ask, token, until.min(lease_end), mode, true) else {
                // Shut down meanwhile.
                self.holds.retire_if_idle(&to);
                return None;
            };
            let since = via.and_then(|via| via.owed_since);
            if self
                .handoffs
                .owe(&keys.lock, &to, ask.gen, since.unwrap_or(start))
            {
                let at = start + UNRECORDED_MAX;
                self.enqueue(Job::Record {
                    keys: keys.clone(),
                    at: Some(at),
                });
            }
            if since.is_some() {
                // Never recorded in Redis: nothing of it is left there.
                settle_released(hold, gen);
            }
            self.deliver(hold, &to, candidate, grant);
            // The waiter runs first, on this worker (see `record`).
            tokio::task::yield_now().await;
            return Some(Ok(()));
        }
        let mut owed = via.as_ref().is_some_and(|via| via.owed_since.is_some());
        let mut early = self.early_grant(hold, gen, start, owed);
        if owed && early.is_none() {
            // Recorded first, then handed over from its own field.
            self.record_owed(hold).await;
            via = self.handoffs.via(&keys.lock, hold, gen);
            owed = false;
            early = self.early_grant(hold, gen, start, false);
        }
        if let Some((token, until)) = early {
            let Some(grant) = self.record_grant(&to, &ask, token, until.min(lease_end), mode, true) else {
                // Shut down meanwhile.
                self.holds.retire_if_idle(&to);
                return None;
            };
            // Kept until the call is done.
            let (from, _settling) = match owed.then(|| self.handoffs.take_owed(&keys.lock, hold, gen)) {
                Some(Some((recorded, settling))) => (Some(recorded), Some(settling)),
                Some(None) => (None, None),
                None => (via.map(|via| via.recorded), None),
            };
            let from = from.unwrap_or_else(|| Recorded {
                hold: hold.clone(),
                gen,
                field: field.clone(),
                ceiling: None,
            });
            self.deliver(hold, &to, candidate, grant);
            let recorded = self.record(from, &to, true).await;
            self.note_call(start);
            // The waiter's operations wait for the call's answer (see `early_grant`).
            drop(to_ops);
            return match recorded {
                Ok(true) => {
                    settle_released(hold, gen);
                    Some(Ok(()))
                }
                // Not handed: the waiter lost its grant, and the caller releases this hold as
                // usual.
                Ok(false) => {
                    self.holds.retire_if_idle(&to);
                    None
                }
                Err(err) => {
                    self.holds.retire_if_idle(&to);
                    Some(Err(err))
                }
            };
        }
        let mut undo_from = UndoOnDrop {
            core: self,
            resync: Some(hold.resync(field, gen)),
        };
        let mut undo_to = UndoOnDrop {
            core: self,
            resync: Some(to.resync(&ask.field, ask.gen)),
        };
        let handed = self.masters.nodes[0]
            .transfer(keys, field, &ask.field, ask.lease, None)
            .await;
        self.note_call(start);
        let handed = match handed {
            Ok(handed) => handed,
            Err(err) => {
                // Unknown: both are brought in line once the server answers (the undos); the
                // waiter tries itself (its sender dropped).
                self.holds.retire_if_idle(&to);
                return Some(Err(err));
            }
        };
        undo_from.resync = None;
        undo_to.resync = None;
        // The call drew a token from the fence: no reserve of this client's stands.
        self.handoffs.set_recorded(&keys.lock, None);
        {
            let mut st = hold.state.lock();
            if st.gen == gen {
                st.confirmed = handed.released.then_some(0);
            }
        }
        match handed
            .token
            .map(|token| self.record_grant(&to, &ask, token, lease_end, mode, false))
        {
            Some(Some(grant)) => {
                // The waiter's hold stays taken until the grant reached the waiter or was given
                // back: a waiter that left (woken otherwise) and tries itself must not find the
                // grant's count and re-enter a hold that is about to be given back.
                self.deliver(hold, &to, candidate, grant);
                drop(to_ops);
            }
            Some(None) => {
                // Shut down meanwhile: the new hold is removed in the background.
                self.enqueue(Job::Resync {
                    resync: to.resync(&ask.field, ask.gen),
                    on: vec![0],
                });
                drop(to_ops);
            }
            None => self.holds.retire_if_idle(&to),
        }
        Some(if handed.released {
            Ok(())
        } else {
            Err(Error::NotHeld)
        })
    }

    /// How long the handoff call that started at `start` took (see [`Core::early_grant`]).
    fn note_call(&self, start: Instant) {
        let took = start.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
        self.handoffs.call_us.store(took, Ordering::Relaxed);
    }

    /// Records in Redis that `to` (its generation, field, token and lease as its state says) holds the lock that Redis holds for `from` (`scripts/transfer_granted.lua`), raising
    /// the fence by the reserve for the next unrecorded handoffs. `to` was granted already
    /// (pending): Redis's answer extends its lease, or ends it as lost (`Ok(false)`: refused). If
    /// the outcome is unknown, both holds are brought in line in the background and `to` loses
    /// the lock. Called with `to`'s operations held (by the caller or by the handoff that granted
    /// it). `yield_first`: `to` was granted just now, and its waiter runs before the call is sent.
    ///
    /// # Cancel safety
    ///
    /// Dropping it mid-call leaves the outcome unknown: handled as above.
    async fn record(
        self: &Arc<Self>,
        from: Recorded,
        to: &Arc<Hold>,
        yield_first: bool,
    ) -> Result<bool, Error> {
        // Attempts that wait for the record go once it is done (or dropped: its undos are queued),
        // when the caller's `Settling` goes.
        let keys = &to.keys;
        let (gen, field, lease, token) = {
            let st = to.state.lock();
            (st.gen, st.field.clone(), st.lease, st.token)
        };
        let start = Instant::now();
        let lease_end = start + lease.saturating_sub(self.masters.config.drift(lease));
        // If the call's outcome stays unknown, the fence goes up to the waiter's token before the
        // undo can free the lock (the call may never have run).
        let mut from_resync = from.hold.resync(&from.field, from.gen);
        from_resync.fence_floor = (token > 0).then_some(token);
        let mut undo_from = UndoOnDrop {
            core: self,
            resync: Some(from_resync),
        };
        let mut undo_to = UndoOnDrop {
            core: self,
            resync: Some(to.resync(&field, gen)),
        };
        // Declared after the undos, so dropped before them: a pending grant is ended first, and
        // its hold's undo then removes what may have reached Redis of it.
        let mut pending = Pending {
            hold: to,
            gen,
            settled: false,
        };
        if yield_first {
            // The waiter runs first, on this worker, before the call is sent: otherwise the call's
            // sending takes its place (tokio runs the task woken last next), and it waits for it
            // or for the other worker to wake. Idle gap p50 in the hot-lock bench 11-21 against
            // 24-46 µs.
            tokio::task::yield_now().await;
        }
        let fence_to = token.saturating_add(u64::from(self.handoffs.reserve));
        let granted = Granted {
            token,
            expect: from.ceiling,
            fence_to,
        };
        let handed = self.masters.nodes[0]
            .transfer(keys, &from.field, &field, lease, Some(granted))
            .await;
        let handed = match handed {
            Ok(handed) => handed,
            Err(err) => {
                drop(pending);
                return Err(err);
            }
        };
        undo_from.resync = None;
        undo_to.resync = None;
        let granted = handed.token.is_some();
        if pending.settle(granted, lease_end) {
            // Lost meanwhile (its lease ran out first): what Redis recorded of it goes.
            self.enqueue(Job::Resync {
                resync: to.resync(&field, gen),
                on: vec![0],
            });
        }
        let recorded = granted.then(|| Recorded {
            hold: to.clone(),
            gen,
            field,
            ceiling: (token > 0).then_some(fence_to),
        });
        self.handoffs.set_recorded(&keys.lock, recorded);
        Ok(granted)
    }

    /// Takes the handoffs not recorded yet that generation `gen` of `hold`, whose count is 0,
    /// holds its lock by, if it does: its release then removes the hold that Redis recorded
    /// instead of its own (returned: that hold, its generation and field). The fence is past this
    /// hold's token already, by the record's reserve. Dropping the returned guard wakes the
    /// attempts that wait for the record (see [`Handoffs::settle`]): after the release, then.
    pub(crate) fn release_unrecorded(
        &self,
        hold: &Arc<Hold>,
        gen: u64,
    ) -> Option<(Arc<Hold>, u64, Str, Settling<'_>)> {
        if !hold.state.lock().pending {
            return None;
        }
        let (recorded, settling) = self.handoffs.take_owed(&hold.keys.lock, hold, gen)?;
        settle_released(hold, gen);
        Some((recorded.hold, recorded.gen, recorded.field, settling))
    }

    /// Records in Redis the handoffs that `hold` holds its lock by, if it holds it by handoffs
    /// not recorded yet (see [`record`](Core::record)). Called with the hold's operations held.
    pub(crate) async fn record_owed(self: &Arc<Self>, hold: &Arc<Hold>) {
        if hold.state.lock().pending {
            self.record_taken(hold).await;
        }
    }

    /// Records the handoffs that `hold` holds its lock by, if it does, pending or not (see
    /// [`record_owed`](Core::record_owed)).
    async fn record_taken(self: &Arc<Self>, hold: &Arc<Hold>) {
        let gen = hold.state.lock().gen;
        if let Some((from, _settling)) = self.handoffs.take_owed(&hold.keys.lock, hold, gen) {
            if let Err(err) = self.record(from, hold, false).await {
                tracing::warn!(lock = %hold.keys.name, %err, "handoffs not recorded: the lock is lost");
            }
        }
    }

    /// Records the handoffs of `keys` that went unrecorded, if any did: those made since `at` less
    /// [`UNRECORDED_MAX`] or before (the releaser's [`Job::Record`]), or all (`at` `None`).
    /// Runs on the releaser, with no hold's operations held (an attempt that waits for it, in
    /// [`open_hold`](Core::open_hold), let go of its own).
    pub(crate) async fn record_late(self: &Arc<Self>, keys: &Arc<LockKeys>, at: Option<Instant>) {
        // The holder may hand the lock on while this waits for its operations.
        while let Some((hold, since)) = self.handoffs.owed(&keys.lock) {
            if at.is_some_and(|at| since + UNRECORDED_MAX > at) {
                // A later streak, with its own record on its way.
                return;
            }
            let _ops = hold.ops.clone().lock_owned().await;
            // Takes the record whether or not the hold is still pending: it ends the loop.
            self.record_taken(&hold).await;
        }
    }

    /// The token and lease end that a waiter may be handed the lock with and no call at all: the
    /// next token after generation `gen` of `hold`, and that generation's own lease end, if Redis
    /// holds the lock for it (`via`), the fence's reserve covers the token, the handoffs left
    /// unrecorded began less than [`UNRECORDED_MAX`] ago, and the same safety as for
    /// [`early_grant`](Core::early_grant) holds.
    fn unrecorded_grant(&self, hold: &Hold, gen: u64, via: &Via, now: Instant) -> Option<(u64, Instant)> {
        if via
            .owed_since
            .is_some_and(|since| now.saturating_duration_since(since) >= UNRECORDED_MAX)
        {
            return None;
        }
        let (token, deadline) = self.safe_to_hand(hold, gen, now, via.owed_since.is_some())?;
        // No token to give (this hold drew none): no reserve is needed.
        (token == 0 || via.recorded.ceiling.is_some_and(|ceiling| token <= ceiling))
            .then_some((token, deadline))
    }

    /// The token and lease end that a waiter may be handed the lock with before Redis records it:
    /// the next token after generation `gen` of `hold`, and that generation's own lease end, if
    /// [`safe_to_hand`](Core::safe_to_hand). `owed`: the hold holds the lock by handoffs not
    /// recorded yet.
    ///
    /// Nor when this hold was held for less time than the last handoff's call took: a waiter
    /// granted early that releases before the call's answer waits for it all the same (its
    /// operations queue behind the call), and its early start only cost it a wake-up more. Locks
    /// held longer than a round trip gain it.
    fn early_grant(&self, hold: &Hold, gen: u64, now: Instant, owed: bool) -> Option<(u64, Instant)> {
        let call = Duration::from_micros(self.handoffs.call_us.load(Ordering::Relaxed));
        if now.saturating_duration_since(hold.state.lock().since) < call {
            return None;
        }
        self.safe_to_hand(hold, gen, now, owed)
    }

    /// The next token after generation `gen` of `hold` and that generation's lease end, if it is
    /// still the hold's, not lost, and safe for twice as long as a call to the node may take (its
    /// answer then comes, or its bound runs out, well before the waiter's lease ends). Redis holds
    /// the lock for one hold or the other throughout, for as long as the waiter's lease. `owed`:
    /// the hold holds the lock by handoffs not recorded yet (it is pending until they are).
    fn safe_to_hand(&self, hold: &Hold, gen: u64, now: Instant, owed: bool) -> Option<(u64, Instant)> {
        let st = hold.state.lock();
        let bound = self.masters.nodes[0].link.bound();
        let usable = st.gen == gen && !st.retired && !*st.lost.borrow() && st.pending == owed;
        // An undo on its way may concern an attempt of this owner that replaced this generation in
        // Redis (see acquire.lua), which only the call would find out.
        // A hold that drew no token (see `Core::fencing_token`) hands on none: the waiter draws its
        // own if it asks. One that drew hands on the next, at no cost: the call raises the fence.
        let token = if st.token > 0 {
            st.token.saturating_add(1)
        } else {
            0
        };
        (usable && st.deadline > now + 2 * bound && !self.undo_pending(&hold.keys.lock))
            .then_some((token, st.deadline))
    }

    /// Hands `grant` (of hold `to`) to the waiter `candidate`, or gives it back if the waiter left.
    fn deliver(self: &Arc<Self>, from: &Hold, to: &Arc<Hold>, candidate: Candidate, grant: Grant) {
        let keys = &from.keys;
        self.handoffs.handed(&keys.lock, to, grant.gen);
        self.wake_watchdog_for(to.state.lock().deadline);
        tracing::debug!(lock = %keys.name, from = %from.owner, to = %candidate.owner, token = grant.token, "lock handed over");
        if let Err(grant) = candidate.grant.send(grant) {
            // The waiter left meanwhile.
            self.give_back(grant);
        }
    }
}

/// A call that records or releases handoffs not recorded yet, on its way (see
/// [`Handoffs::take_owed`]). Dropping it (the call answered, failed or was cancelled, its undos
/// queued) lets this client's attempts at the lock go.
pub(crate) struct Settling<'a> {
    handoffs: &'a Handoffs,
    lock: Str,
}

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        let mut queues = self.handoffs.queues.lock();
        if let Some(queue) = queues.get_mut(&self.lock) {
            queue.settling = queue.settling.saturating_sub(1);
            if queue.idle() {
                queues.remove(&self.lock);
            }
        }
        drop(queues);
        self.handoffs.owing.fetch_sub(1, Ordering::SeqCst);
        self.handoffs.recorded.notify_waiters();
    }
}

/// Generation `gen` of `hold` released the lock by a handoff that Redis recorded, or that it will
/// record from an earlier hold's field: nothing of it is left in Redis.
fn settle_released(hold: &Hold, gen: u64) {
    let mut st = hold.state.lock();
    if st.gen == gen {
        st.pending = false;
        st.confirmed = Some(0);
    }
}

/// A grant handed to a waiter before Redis recorded it (see [`Core::hand_over`]). Dropped unsettled
/// (the call failed or was cancelled), the grant ends as lost.
struct Pending<'a> {
    hold: &'a Arc<Hold>,
    gen: u64,
    settled: bool,
}

impl Pending<'_> {
    /// Redis recorded the grant (`granted`: its lease now runs to `deadline`) or refused it. True
    /// if Redis recorded a grant that ended meanwhile (its lease ran out first), which must go.
    fn settle(&mut self, granted: bool, deadline: Instant) -> bool {
        self.settled = true;
        if !granted {
            self.end("the lock was no longer held when it was handed over", true);
            return false;
        }
        let mut st = self.hold.state.lock();
        if st.gen != self.gen {
            return false;
        }
        st.pending = false;
        st.confirmed = Some(1);
        st.deadline = st.deadline.max(deadline);
        let lost = *st.lost.borrow();
        lost
    }

    /// Ends the grant as lost, even if its guard went already: its release then reports the lock
    /// not held (its section may have run while another client held the lock). `refused`: Redis
    /// answered that it did not record the grant (else its outcome is unknown, and the undo of the
    /// waiter's hold removes whatever landed).
    fn end(&self, reason: &str, refused: bool) {
        let count = {
            let mut st = self.hold.state.lock();
            if st.gen != self.gen {
                return;
            }
            st.pending = false;
            st.confirmed = refused.then_some(0);
            if st.count == 0 {
                st.lost.send_replace(true);
            }
            st.count
        };
        if count > 0 {
            self.hold.mark_lost(self.gen, reason);
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.end("the handoff's outcome is unknown", false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::hold::Holds;

    /// A release or record of handoffs not recorded yet takes them from the queue before its call
    /// is sent. Until that call is done, Redis still holds the lock by the recorded hold's field,
    /// which its owner's next attempt would replace (and the release would then find nothing and
    /// report the lock not held): this client's attempts see the lock as owed until then.
    #[tokio::test]
    async fn handoffs_taken_for_a_call_stay_owed_until_the_call_is_done() {
        let holds = Holds::new(false);
        let keys = Arc::new(LockKeys::new("relock", "owed"));
        let (recorded, _ops) = holds.lock_hold(&keys, &Str::from("first")).await;
        let (holder, _ops) = holds.lock_hold(&keys, &Str::from("second")).await;
        let handoffs = Handoffs::new(8, Duration::from_secs(1), 8);
        let record = Recorded {
            hold: recorded.clone(),
            gen: 1,
            field: Str::from("first:1"),
            ceiling: None,
        };
        handoffs.set_recorded(&keys.lock, Some(record));
        assert!(handoffs.owe(&keys.lock, &holder, 0, Instant::now()));
        assert!(handoffs.owes(&keys.lock));

        let (taken, settling) = handoffs.take_owed(&keys.lock, &holder, 0).expect("owed");
        assert!(Arc::ptr_eq(&taken.hold, &recorded));
        assert!(handoffs.owes(&keys.lock), "owed while the call is on its way");
        assert!(
            handoffs.owed(&keys.lock).is_none(),
            "and no other call takes them"
        );
        drop(settling);
        assert!(!handoffs.owes(&keys.lock), "settled once the call is done");
        assert_eq!(handoffs.owing.load(Ordering::SeqCst), 0);
    }

    /// Handoffs that went stale (no record of this client's stands) are dropped at once.
    #[tokio::test]
    async fn stale_handoffs_are_settled_at_once() {
        let holds = Holds::new(false);
        let keys = Arc::new(LockKeys::new("relock", "stale"));
        let (holder, _ops) = holds.lock_hold(&keys, &Str::from("second")).await;
        let handoffs = Handoffs::new(8, Duration::from_secs(1), 8);
        handoffs.owe(&keys.lock, &holder, 0, Instant::now());
        assert!(handoffs.take_owed(&keys.lock, &holder, 0).is_none());
        assert!(!handoffs.owes(&keys.lock));
        assert_eq!(handoffs.owing.load(Ordering::SeqCst), 0);
    }
}
