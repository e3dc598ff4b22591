//! Recording handoffs in Redis: a record of the latest holder of a lock held by handoffs that Redis
//! has not recorded, and the release of such a lock (see `engine/core/handoff.rs` for when they are made).

use fred::bytes_utils::Str;
use std::sync::Arc;

use super::handoff::settle_released;
use super::{Core, UndoOnDrop};
use crate::engine::handoffs::{Recorded, Settling, UNRECORDED_MAX};
use crate::engine::hold::{Hold, Job};
use crate::redis::batch::Granted;
use crate::redis::keys::LockKeys;
use crate::Error;
use tokio::time::Instant;

impl Core {
    /// Returns once `keys` is held by no handoffs that Redis has not recorded, which the
    /// releaser records now ([`Job::Record`]). Cancel safe: the record goes on without it.
    pub(crate) async fn settle_handoffs(self: &Arc<Self>, keys: &Arc<LockKeys>) {
        loop {
            let recorded = self.handoffs.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            if !self.handoffs.owes(&keys.lock) {
                return;
            }
            // Asked again after each record: the holder may have handed the lock on meanwhile.
            let asked = self.enqueue(Job::Record {
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
}

impl Core {
    /// Takes `hold`'s operations (in order with its releases), after recording in Redis any
    /// handoffs of its lock that Redis has not recorded yet, so that Redis names this hold: what a
    /// call that checks the hold's field in Redis needs first.
    pub(crate) async fn named_in_redis(
        self: &Arc<Self>,
        hold: &Arc<Hold>,
    ) -> tokio::sync::OwnedMutexGuard<()> {
        let ops = hold.ops.clone().lock_owned().await;
        if self.hands_over(&hold.keys) {
            self.record_owed(hold).await;
        }
        ops
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
    pub(super) async fn record(
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
    /// attempts that wait for the record (see [`Core::settle_handoffs`]): after the release, then.
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
    pub(super) async fn record_taken(self: &Arc<Self>, hold: &Arc<Hold>) {
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
