//! This client's waiters for each lock, that a release may hand the lock to, first come first
//! served, and the handoffs Redis has not recorded yet: the queue and its bookkeeping. How a release
//! hands a lock on, and when Redis records it, is the core's (`core/handoff.rs`).

use fred::bytes_utils::Str;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;

use crate::engine::hold::{Grant, Hold, LeaseMode};
use crate::redis::keys::LockKeys;

/// How many round trips of the release that ended a streak this client's attempts hold back (see
/// [`Handoffs::hold_back`]), within [`YIELD_MIN`] and [`YIELD_MAX`]: a release message reaches the
/// other clients and their attempts come back in about two.
pub(in crate::engine) const YIELD_RTTS: u32 = 4;
pub(in crate::engine) const YIELD_MIN: Duration = Duration::from_millis(1);
pub(in crate::engine) const YIELD_MAX: Duration = Duration::from_millis(20);

/// How long handoffs may go unrecorded in Redis (see [`LockConfig::unrecorded_handoffs`]): the
/// first of them schedules the record ([`Job::Record`](crate::engine::hold::Job::Record)).
///
/// [`LockConfig::unrecorded_handoffs`]: crate::LockConfig::unrecorded_handoffs
pub(in crate::engine) const UNRECORDED_MAX: Duration = Duration::from_millis(10);

/// The waiters of this client that a release may hand a lock to, by lock key.
pub(crate) struct Handoffs {
    pub(in crate::engine) queues: Mutex<HashMap<Str, Queue>>,
    pub(in crate::engine) limit: u32,
    pub(in crate::engine) window: Duration,
    /// How many tokens a record reserves ahead for unrecorded handoffs.
    pub(in crate::engine) reserve: u32,
    /// How many locks are held by handoffs not recorded yet (see [`Queue::owed`]): an attempt
    /// looks for them only while there are any.
    pub(in crate::engine) owing: AtomicUsize,
    /// Notified when handoffs not recorded were recorded, or the call failed (see
    /// [`Core::settle_handoffs`](crate::engine::core::Core::settle_handoffs)).
    pub(in crate::engine) recorded: Notify,
    pub(in crate::engine) ids: AtomicU64,
    /// How long the last handoff's call took, in µs (see [`Core::early_grant`](crate::engine::core::Core)).
    pub(in crate::engine) call_us: AtomicU64,
}

#[derive(Default)]
pub(in crate::engine) struct Queue {
    pub(in crate::engine) waiting: VecDeque<Candidate>,
    /// Handoffs of this lock since it was last freed by a release of this client.
    pub(in crate::engine) streak: u32,
    /// When the first of them was made.
    pub(in crate::engine) streak_start: Option<Instant>,
    /// The streak has reached the limit or the window: the next release of this client frees the
    /// lock. Kept once seen, so that the release's start and end agree (see [`Queue::full`]).
    pub(in crate::engine) full: bool,
    /// The hold and generation the last handoff went to, until a release of this client frees
    /// the lock.
    pub(in crate::engine) holder: Option<(Arc<Hold>, u64)>,
    /// After a release that ended a streak, this client's attempts that no release message woke
    /// wait until then (see [`Handoffs::hold_back`]);
    pub(in crate::engine) yield_until: Option<Instant>,
    /// If other clients' subscribers heard that release: the waiter of this client that its message
    /// woke waits too, and so the first attempt that any message wakes (then this is cleared: a
    /// later message tells of another client's release, which any waiter may take).
    pub(in crate::engine) yield_woken: bool,
    /// A release of this client that ends a streak is on its way: set to `true` once its outcome
    /// is known (see [`Ending`]).
    pub(in crate::engine) ending: Option<watch::Sender<bool>>,
    /// The hold Redis holds the lock by, as this client's last handoff call recorded it, while
    /// that stands.
    pub(in crate::engine) recorded: Option<Recorded>,
    /// The hold that holds the lock by handoffs Redis has not recorded yet, if one does.
    pub(in crate::engine) owed: Option<Owed>,
    /// Calls that record or release such handoffs, taken from [`Queue::owed`], on their way: until
    /// they land, Redis still holds the lock by an earlier hold's field, which that hold's owner's
    /// next attempt would replace (see [`Handoffs::owes`]).
    pub(in crate::engine) settling: u32,
}

/// The hold Redis holds a lock by (see [`Queue::recorded`]).
#[derive(Clone)]
pub(in crate::engine) struct Recorded {
    pub(in crate::engine) hold: Arc<Hold>,
    pub(in crate::engine) gen: u64,
    pub(in crate::engine) field: Str,
    /// The fence's value in Redis: the tokens up to it are this client's to hand out without a
    /// call. `None`: at the hold's own token.
    pub(in crate::engine) ceiling: Option<u64>,
}

/// A hold granted by handoffs that Redis has not recorded (see [`Queue::owed`]).
pub(in crate::engine) struct Owed {
    pub(in crate::engine) hold: Arc<Hold>,
    pub(in crate::engine) gen: u64,
    /// When the first of them was made.
    pub(in crate::engine) since: Instant,
}

/// How Redis holds a lock for the hold that is about to hand it on (see [`Handoffs::via`]).
pub(in crate::engine) struct Via {
    pub(in crate::engine) recorded: Recorded,
    /// The hold holds it by unrecorded handoffs since then; `None`: Redis recorded the hold itself.
    pub(in crate::engine) owed_since: Option<Instant>,
}

impl Queue {
    /// Whether the streak has reached `limit` handoffs or lasted `window`; once it has, it stays
    /// so until a release of this client frees the lock.
    pub(in crate::engine) fn full(&mut self, limit: u32, window: Duration) -> bool {
        if !self.full {
            self.full = self.streak >= limit || self.streak_start.is_some_and(|at| at.elapsed() >= window);
        }
        self.full
    }

    /// Nothing to remember: the entry can go.
    pub(in crate::engine) fn idle(&self) -> bool {
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
/// [`Core::taker`](crate::engine::core::Core)).
pub(crate) struct Taker {
    pub(in crate::engine) candidate: Candidate,
    pub(in crate::engine) hold: Arc<Hold>,
    pub(in crate::engine) ops: tokio::sync::OwnedMutexGuard<()>,
}

/// A waiter that a release may hand the lock to.
pub(in crate::engine) struct Candidate {
    pub(in crate::engine) id: u64,
    pub(in crate::engine) owner: Str,
    pub(in crate::engine) mode: LeaseMode,
    pub(in crate::engine) grant: oneshot::Sender<Grant>,
}

/// A release of this client that ends a streak of handoffs, on its way (see [`Handoffs::ending`]).
/// Dropping it (the release answered, failed or cancelled) wakes the waiters that wait to learn
/// whether other clients heard it.
pub(crate) struct Ending<'a> {
    pub(in crate::engine) handoffs: &'a Handoffs,
    pub(in crate::engine) lock: Str,
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
    pub(in crate::engine) fn next(&self, lock: &str, owner: &str) -> Option<Candidate> {
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
    pub(in crate::engine) fn handed(&self, lock: &str, hold: &Arc<Hold>, gen: u64) {
        if let Some(queue) = self.queues.lock().get_mut(lock) {
            queue.streak += 1;
            queue.streak_start.get_or_insert_with(Instant::now);
            queue.holder = Some((hold.clone(), gen));
        }
    }

    /// Generation `gen` of `hold` was granted `lock` by an attempt: if waiters of this client are
    /// queued for it, they need not try while it is held (see [`hold_back`](Handoffs::hold_back)).
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
    pub(in crate::engine) fn via(&self, lock: &str, hold: &Arc<Hold>, gen: u64) -> Option<Via> {
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
    pub(in crate::engine) fn owe(&self, lock: &Str, hold: &Arc<Hold>, gen: u64, since: Instant) -> bool {
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
    pub(in crate::engine) fn take_owed(
        &self,
        lock: &str,
        hold: &Arc<Hold>,
        gen: u64,
    ) -> Option<(Recorded, Settling<'_>)> {
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
    pub(in crate::engine) fn owed(&self, lock: &str) -> Option<(Arc<Hold>, Instant)> {
        let queues = self.queues.lock();
        let owed = queues.get(lock)?.owed.as_ref()?;
        Some((owed.hold.clone(), owed.since))
    }

    /// What a handoff call of `lock` left in Redis: `recorded` holds it (`None`: no record of this
    /// client's stands).
    pub(in crate::engine) fn set_recorded(&self, lock: &Str, recorded: Option<Recorded>) {
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

/// A call that records or releases handoffs not recorded yet, on its way (see
/// [`Handoffs::take_owed`]). Dropping it (the call answered, failed or was cancelled, its undos
/// queued) lets this client's attempts at the lock go.
pub(crate) struct Settling<'a> {
    pub(in crate::engine) handoffs: &'a Handoffs,
    pub(in crate::engine) lock: Str,
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
