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
//! Waiters of this client enter a queue per lock while they sleep ([`Core::enter_handoff`]), first come
//! first served. A release of a hold at count 0 ([`Core::hand_over`]) takes the first of them. At
//! most [`handoff_limit`](crate::LockConfig::handoff_limit) handoffs of a lock follow each other,
//! over at most [`handoff_window`](crate::LockConfig::handoff_window); then a release frees the
//! lock and publishes, so that other clients' waiters get their turn.
//!
//! Only where one script call decides: plain locks on one master without synced writes.
//!
//! [`LockConfig::unrecorded_handoffs`]: crate::LockConfig::unrecorded_handoffs

use fred::bytes_utils::Str;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Ask, Core, UndoOnDrop};
use crate::engine::handoffs::{Candidate, Recorded, Taker, Via, UNRECORDED_MAX};
use crate::engine::hold::{Grant, Hold, Job, LeaseMode};
use crate::redis::keys::{Kind, LockKeys};
use crate::Error;

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
        let Taker {
            candidate,
            hold: to,
            ops: to_ops,
        } = taker;
        let mode = candidate.mode;
        let ask = self.ask(&to, &candidate.owner, mode);
        let start = Instant::now();
        let lease_end = start + ask.lease.saturating_sub(self.masters.config.drift(ask.lease));
        let handing = Handing {
            from: hold,
            gen,
            field,
            to,
            candidate,
            to_ops,
            mode,
            ask,
            start,
            lease_end,
        };
        let lock = &hold.keys.lock;
        let mut via = self.handoffs.via(lock, hold, gen);
        if let Some(grant) = via
            .as_ref()
            .and_then(|via| self.unrecorded_grant(hold, gen, via, start))
        {
            return self.hand_over_unrecorded(handing, via, grant).await;
        }
        let mut owed = via.as_ref().is_some_and(|via| via.owed_since.is_some());
        let mut early = self.early_grant(hold, gen, start, owed);
        if owed && early.is_none() {
            // Recorded first, then handed over from its own field.
            self.record_owed(hold).await;
            via = self.handoffs.via(lock, hold, gen);
            owed = false;
            early = self.early_grant(hold, gen, start, false);
        }
        match early {
            Some(grant) => self.hand_over_early(handing, via, owed, grant).await,
            None => self.hand_over_by_call(handing).await,
        }
    }

    /// Hands the lock on with a token of the last record's reserve, and no call: Redis goes on
    /// holding it for the recorded hold (see the module doc).
    async fn hand_over_unrecorded(
        self: &Arc<Self>,
        h: Handing<'_>,
        via: Option<Via>,
        (token, until): (u64, Instant),
    ) -> Option<Result<(), Error>> {
        let keys = &h.from.keys;
        let Some(grant) = self.record_grant(&h.to, &h.ask, token, until.min(h.lease_end), h.mode, true)
        else {
            // Shut down meanwhile.
            self.holds.retire_if_idle(&h.to);
            return None;
        };
        let since = via.and_then(|via| via.owed_since);
        if self
            .handoffs
            .owe(&keys.lock, &h.to, h.ask.gen, since.unwrap_or(h.start))
        {
            let at = h.start + UNRECORDED_MAX;
            self.enqueue(Job::Record {
                keys: keys.clone(),
                at: Some(at),
            });
        }
        if since.is_some() {
            // Never recorded in Redis: nothing of it is left there.
            settle_released(h.from, h.gen);
        }
        self.deliver(h.from, &h.to, h.candidate, grant);
        // The waiter runs first, on this worker (see `record`).
        tokio::task::yield_now().await;
        drop(h.to_ops);
        Some(Ok(()))
    }

    /// Grants the waiter before Redis answers, then records the handoff (see
    /// [`early_grant`](Core::early_grant)).
    async fn hand_over_early(
        self: &Arc<Self>,
        h: Handing<'_>,
        via: Option<Via>,
        owed: bool,
        (token, until): (u64, Instant),
    ) -> Option<Result<(), Error>> {
        let (hold, gen) = (h.from, h.gen);
        let Some(grant) = self.record_grant(&h.to, &h.ask, token, until.min(h.lease_end), h.mode, true)
        else {
            // Shut down meanwhile.
            self.holds.retire_if_idle(&h.to);
            return None;
        };
        // Kept until the call is done.
        let (from, _settling) = match owed.then(|| self.handoffs.take_owed(&hold.keys.lock, hold, gen)) {
            Some(Some((recorded, settling))) => (Some(recorded), Some(settling)),
            Some(None) => (None, None),
            None => (via.map(|via| via.recorded), None),
        };
        let from = from.unwrap_or_else(|| Recorded {
            hold: hold.clone(),
            gen,
            field: h.field.clone(),
            ceiling: None,
        });
        self.deliver(hold, &h.to, h.candidate, grant);
        let recorded = self.record(from, &h.to, true).await;
        self.note_call(h.start);
        // The waiter's operations wait for the call's answer (see `early_grant`).
        drop(h.to_ops);
        match recorded {
            Ok(true) => {
                settle_released(hold, gen);
                Some(Ok(()))
            }
            // Not handed: the waiter lost its grant, and the caller releases this hold as usual.
            Ok(false) => {
                self.holds.retire_if_idle(&h.to);
                None
            }
            Err(err) => {
                self.holds.retire_if_idle(&h.to);
                Some(Err(err))
            }
        }
    }

    /// Moves the hold in one call (`scripts/transfer.lua`), and grants the waiter once it answers.
    async fn hand_over_by_call(self: &Arc<Self>, h: Handing<'_>) -> Option<Result<(), Error>> {
        let (hold, gen, keys, to, ask) = (h.from, h.gen, &h.from.keys, &h.to, &h.ask);
        let mut undo_from = UndoOnDrop {
            core: self,
            resync: Some(hold.resync(h.field, gen)),
        };
        let mut undo_to = UndoOnDrop {
            core: self,
            resync: Some(to.resync(&ask.field, ask.gen)),
        };
        let handed = self.masters.nodes[0]
            .transfer(keys, h.field, &ask.field, ask.lease, None)
            .await;
        self.note_call(h.start);
        let handed = match handed {
            Ok(handed) => handed,
            Err(err) => {
                // Unknown: both are brought in line once the server answers (the undos); the
                // waiter tries itself (its sender dropped).
                self.holds.retire_if_idle(to);
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
            .map(|token| self.record_grant(to, ask, token, h.lease_end, h.mode, false))
        {
            Some(Some(grant)) => {
                // The waiter's hold stays taken until the grant reached the waiter or was given
                // back: a waiter that left (woken otherwise) and tries itself must not find the
                // grant's count and re-enter a hold that is about to be given back.
                self.deliver(hold, to, h.candidate, grant);
                drop(h.to_ops);
            }
            Some(None) => {
                // Shut down meanwhile: the new hold is removed in the background.
                self.enqueue(Job::Resync {
                    resync: to.resync(&ask.field, ask.gen),
                    on: vec![0],
                });
                drop(h.to_ops);
            }
            None => {
                self.holds.retire_if_idle(to);
                drop(h.to_ops);
            }
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
        self.watchdog.wake_for(to.state.lock().deadline);
        tracing::debug!(lock = %keys.name, from = %from.owner, to = %candidate.owner, token = grant.token, "lock handed over");
        if let Err(grant) = candidate.grant.send(grant) {
            // The waiter left meanwhile.
            self.give_back(grant);
        }
    }
}

/// A handoff on its way: the releasing hold's generation and field, and the waiter it goes to.
struct Handing<'a> {
    from: &'a Arc<Hold>,
    gen: u64,
    field: &'a Str,
    to: Arc<Hold>,
    candidate: Candidate,
    /// The waiter's hold's operations, taken until the handoff is settled for it.
    to_ops: tokio::sync::OwnedMutexGuard<()>,
    mode: LeaseMode,
    ask: Ask,
    start: Instant,
    /// When the waiter's lease ends at the latest, on this client's clock.
    lease_end: Instant,
}

/// Generation `gen` of `hold` released the lock by a handoff that Redis recorded, or that it will
/// record from an earlier hold's field: nothing of it is left in Redis.
pub(super) fn settle_released(hold: &Hold, gen: u64) {
    let mut st = hold.state.lock();
    if st.gen == gen {
        st.pending = false;
        st.confirmed = Some(0);
    }
}
