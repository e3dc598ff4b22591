//! Local handoff: a plain lock that one owner of a client releases while another owner of the same
//! client waits for it goes straight to that waiter, in one script call: the releasing hold goes
//! and the waiter's starts, with a new fencing token, in the same step. The lock is never free in
//! between, so nothing is published: the waiter skips the release message and its own attempt (a
//! round trip), and the other clients' waiters are not woken to be refused.
//!
//! The waiter does not wait for that call either, when it can be given the lock safely before
//! Redis answers ([`Core::early_grant`]): its token is the releasing hold's plus one and its lease
//! the releasing hold's, which Redis keeps holding until the call lands. The call
//! (`scripts/transfer_granted.lua`) moves the hold, raises the fence to that token (so later
//! acquisitions draw above it) and sets the waiter's own lease; its answer extends the waiter's
//! lease, or ends the grant as lost when the lock was gone meanwhile. Otherwise the call draws the
//! token (`scripts/transfer.lua`) and the waiter is granted when it answers. Not early, so that Redis
//! surely holds the releasing hold's field: a hold retired meanwhile, one whose lease ends within two
//! calls' bounds, or a lock with an undo of this client on its way (an attempt of the same owner
//! whose outcome is unknown may have replaced that field); nor after a hold shorter than the last
//! handoff's call, where it gains nothing.
//!
//! Waiters of this client enter a queue per lock while they sleep ([`Handoffs::enter`]), first come
//! first served. A release of a hold at count 0 ([`Core::hand_over`]) takes the first of them. At
//! most [`handoff_limit`](crate::LockConfig::handoff_limit) handoffs of a lock follow each other,
//! over at most [`handoff_window`](crate::LockConfig::handoff_window); then a release frees the
//! lock and publishes, so that other clients' waiters get their turn.
//!
//! Only where one script call decides: plain locks on one master without synced writes.

use fred::bytes_utils::Str;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::core::{Core, UndoOnDrop};
use crate::hold::{Grant, Hold, Job, LeaseMode};
use crate::keys::{Kind, LockKeys};
use crate::Error;

/// How many round trips of the release that ended a streak this client's attempts hold back (see
/// [`Handoffs::hold_back`]), within [`YIELD_MIN`] and [`YIELD_MAX`]: a release message reaches the
/// other clients and their attempts come back in about two.
const YIELD_RTTS: u32 = 4;
const YIELD_MIN: Duration = Duration::from_millis(1);
const YIELD_MAX: Duration = Duration::from_millis(20);

/// The waiters of this client that a release may hand a lock to, by lock key.
pub(crate) struct Handoffs {
    queues: Mutex<HashMap<Str, Queue>>,
    limit: u32,
    window: Duration,
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
    pub(crate) fn new(limit: u32, window: Duration) -> Handoffs {
        Handoffs {
            queues: Mutex::new(HashMap::new()),
            limit,
            window,
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
        }
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

    /// A release of this client left `lock` free (and told every client), its call taking `rtt`;
    /// `others`: whether subscribers of other clients heard its message (`None`: unknown). The
    /// streak starts again. If it ended a streak, this client's attempts hold back for a few such
    /// round trips (see [`hold_back`](Handoffs::hold_back)).
    pub(crate) fn freed(&self, lock: &str, rtt: Duration, others: Option<bool>) {
        let mut queues = self.queues.lock();
        if let Some(queue) = queues.get_mut(lock) {
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
    /// When this hold's lease outlasts the call ([`early_grant`](Core::early_grant)), the waiter
    /// is granted the lock before the call, with the next token and this hold's lease end, and the
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
        let mut undo_from = UndoOnDrop {
            core: self,
            resync: Some(hold.resync(field, gen)),
        };
        let mut undo_to = UndoOnDrop {
            core: self,
            resync: Some(to.resync(&ask.field, ask.gen)),
        };
        // Declared after the undos, so dropped before them: a pending grant is ended first, and
        // its hold's undo then removes what may have reached Redis of it.
        let mut pending = None;
        let mut granted = None;
        let mut candidate = Some(candidate);
        if let Some((token, until)) = self.early_grant(hold, gen, start) {
            if let Some(grant) = self.record_grant(&to, &ask, token, until.min(lease_end), mode, true) {
                pending = Some(Pending {
                    hold: &to,
                    gen: ask.gen,
                    settled: false,
                });
                granted = Some(token);
                // If the call's outcome stays unknown, the fence goes up to the waiter's token
                // before the undo can free the lock (the call may never have run).
                if let Some(resync) = undo_from.resync.as_mut() {
                    resync.fence_floor = Some(token);
                }
                if let Some(candidate) = candidate.take() {
                    self.deliver(hold, &to, candidate, grant);
                }
                // The waiter runs first, on this worker, before the call is sent: otherwise the
                // call's sending takes its place (tokio runs the task woken last next), and it
                // waits for it or for the other worker to wake. Idle gap p50 in the hot-lock
                // bench 11-21 against 24-46 µs.
                tokio::task::yield_now().await;
            }
        }
        let handed = self.masters.nodes[0]
            .transfer(keys, field, &ask.field, ask.lease, granted)
            .await;
        let took = start.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
        self.handoffs.call_us.store(took, Ordering::Relaxed);
        let handed = match handed {
            Ok(handed) => handed,
            Err(err) => {
                // Unknown: both are brought in line once the server answers (the undos); the
                // waiter tries itself (its sender dropped), or loses its early grant.
                drop(pending);
                self.holds.retire_if_idle(&to);
                return Some(Err(err));
            }
        };
        undo_from.resync = None;
        undo_to.resync = None;
        {
            let mut st = hold.state.lock();
            if st.gen == gen {
                st.confirmed = handed.released.then_some(0);
            }
        }
        if let Some(mut pending) = pending {
            if pending.settle(handed.token.is_some(), lease_end) {
                // Lost meanwhile (its lease ran out first): what Redis recorded of it goes.
                self.enqueue(Job::Resync {
                    resync: to.resync(&ask.field, ask.gen),
                    on: vec![0],
                });
            }
            if handed.token.is_some() {
                return Some(Ok(()));
            }
            // Not handed: the waiter lost its grant, and the caller releases this hold as usual.
            self.holds.retire_if_idle(&to);
            return None;
        }
        match handed
            .token
            .map(|token| self.record_grant(&to, &ask, token, lease_end, mode, false))
        {
            Some(Some(grant)) => {
                // The waiter's hold stays taken until the grant reached the waiter or was given
                // back: a waiter that left (woken otherwise) and tries itself must not find the
                // grant's count and re-enter a hold that is about to be given back.
                if let Some(candidate) = candidate.take() {
                    self.deliver(hold, &to, candidate, grant);
                }
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

    /// The token and lease end that a waiter may be handed the lock with before Redis records it:
    /// the next token after generation `gen` of `hold`, and that generation's own lease end, if it
    /// is still the hold's, not lost, and safe for twice as long as a call to the node may take
    /// (its answer then comes, or its bound runs out, well before the waiter's lease ends). Redis
    /// holds the lock for one hold or the other throughout, for as long as the waiter's lease.
    ///
    /// Nor when this hold was held for less time than the last handoff's call took: a waiter
    /// granted early that releases before the call's answer waits for it all the same (its
    /// operations queue behind the call), and its early start only cost it a wake-up more. Locks
    /// held longer than a round trip gain it.
    fn early_grant(&self, hold: &Hold, gen: u64, now: Instant) -> Option<(u64, Instant)> {
        let st = hold.state.lock();
        let call = Duration::from_micros(self.handoffs.call_us.load(Ordering::Relaxed));
        if now.saturating_duration_since(st.since) < call {
            return None;
        }
        let bound = self.masters.nodes[0].link.bound();
        let usable = st.gen == gen && !st.retired && !*st.lost.borrow() && !st.pending && st.token > 0;
        // An undo on its way may concern an attempt of this owner that replaced this generation in
        // Redis (see acquire.lua), which only the call would find out.
        (usable && st.deadline > now + 2 * bound && !self.undo_pending(&hold.keys.lock))
            .then(|| (st.token.saturating_add(1), st.deadline))
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
