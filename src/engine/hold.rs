//! Holds and their registry, and the grant an acquisition hands to the API layer.
//!
//! A *hold* is one owner's possession of one lock on this client. Its count is the reentrancy depth;
//! every acquisition and release of it is serialised by the hold's `ops` mutex and sets the count in
//! Redis to the local value (never increments it), so Redis follows the local state even when a reply
//! is lost. A *generation* is one uninterrupted possession: a fresh grant starts one, a loss ends it,
//! and guards of an ended generation release nothing.
//!
//! In Redis, a hold is the field `owner:generation` of the lock hash. Naming the generation means
//! that a late request of an ended generation (a renewal, a release or an undo still in flight)
//! finds nothing of its own and changes nothing: it can never extend, free or shorten a later hold
//! of the same owner.

use fred::bytes_utils::Str;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{watch, OwnedMutexGuard};
use tokio::time::Instant;

use crate::redis::keys::{Kind, LockKeys};
use crate::util::telemetry::{self, End, Label};

/// How a hold keeps its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseMode {
    /// `watchdog_timeout`, renewed by the watchdog.
    Watchdog,
    /// A fixed lease, never renewed.
    Fixed(Duration),
}

/// In C order, the fields every watchdog round reads and writes first: with the hold's lock and
/// reference count (see [`Hold`]) they share the allocation's first two cache lines, which a round
/// over 100,000 holds finds cold.
#[repr(C)]
pub(crate) struct HoldState {
    pub(crate) count: u32,
    pub(crate) watchdog: bool,
    /// Granted by a handoff that Redis has not recorded yet (see `engine/core/handoff.rs`): the handoff's call
    /// confirms it (and extends its deadline) or ends it, and the watchdog leaves it alone until then.
    pub(crate) pending: bool,
    /// Removed from the registry; whoever still has it must look the hold up again.
    pub(crate) retired: bool,
    pub(crate) gen: u64,
    /// When the lease stops being safe, on the monotonic clock (lease start + lease - drift).
    pub(crate) deadline: Instant,
    /// When this generation's lease was found lost (for [`Error::Lost`](crate::Error::Lost)).
    pub(crate) lost_at: Option<Instant>,
    /// Where the watchdog's last round copied this hold's key and field, if it did.
    pub(crate) copied: Option<Copied>,
    /// The Redis field of this generation (owner id and generation).
    pub(crate) field: Str,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    /// Completed (true) when the generation's lease is lost or given up.
    pub(crate) lost: watch::Sender<bool>,
    /// When this generation was granted (for `relock_hold_seconds`).
    pub(crate) since: Instant,
    /// The count Redis was last known to hold for this generation, from this client's own answered
    /// operations; `None` when unknown. A release whose target Redis already has is not sent: a
    /// guard's background release that ran after a later level went too has released both.
    pub(crate) confirmed: Option<u32>,
}

/// Where a watchdog round copied a hold's key and field into its bytes (see `engine/watchdog.rs`):
/// the next round copies them from there, without touching the hold's own strings (two cold cache
/// lines per hold, with 100,000 held locks).
#[derive(Clone, Copy)]
pub(crate) struct Copied {
    /// The round's number (the watchdog counts its rounds from 1).
    pub(crate) round: u64,
    /// The generation whose field was copied.
    pub(crate) gen: u64,
    /// Where the key starts; the field follows it.
    pub(crate) at: u32,
    pub(crate) key_len: u32,
    pub(crate) field_len: u32,
}

impl HoldState {
    /// Held and not lost. While the count is above zero, only [`Hold::mark_lost`] ends a
    /// generation as lost, and it sets `lost_at` with the signal: the watchdog reads this for every
    /// hold in every pass, and the signal's lock is one more cold cache line per hold.
    pub(crate) fn active(&self) -> bool {
        self.count > 0 && self.lost_at.is_none()
    }

    /// The count Redis should hold for `field` of generation `gen`: the local count while it is
    /// the active one, else nothing. A waiter's mark has the same field (the owner id) in every
    /// generation (see `engine/marks.rs`): a late release or resync of an ended one must set the active
    /// one's count, not remove the mark that the owner's next wait left there.
    pub(crate) fn redis_count(&self, gen: u64, field: &str) -> u32 {
        if self.holds(gen, field) {
            self.count
        } else {
            0
        }
    }

    /// Whether `field` in Redis is the active generation's: generation `gen`'s, or the same field.
    pub(crate) fn holds(&self, gen: u64, field: &str) -> bool {
        self.active() && (self.gen == gen || *self.field == *field)
    }
}

/// In C order, its state first: right after the reference count that the watchdog's snapshot
/// touches (see [`HoldState`]).
#[repr(C)]
pub(crate) struct Hold {
    pub(crate) state: Mutex<HoldState>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Str,
    pub(crate) ops: Arc<tokio::sync::Mutex<()>>,
    /// The `lock` label of its figures (see `util/telemetry.rs`).
    pub(crate) label: Label,
    /// Whether its possessions count in the figures: not a waiter's mark (see `engine/marks.rs`), which
    /// holds nothing.
    pub(crate) counted: bool,
}

impl Hold {
    /// Ends generation `gen` as lost, once, with a warning naming the lock. What is left of it in
    /// Redis is not removed here: it runs out with its lease, as it would had this client crashed,
    /// so a holder that does not watch `lost()` is not overtaken sooner than that. Its guards remove
    /// it when they go, and the owner's next acquisition replaces it.
    pub(crate) fn mark_lost(&self, gen: u64, reason: &str) {
        let mut st = self.state.lock();
        if st.gen == gen && st.count > 0 && !*st.lost.borrow() {
            st.lost_at = Some(Instant::now());
            st.lost.send_replace(true);
            if self.counted {
                telemetry::hold_ended(&self.label, End::Lost, st.since.elapsed());
                tracing::warn!(lock = %self.keys.name, owner = %self.owner, reason, "lock lost");
            } else {
                // A mark is advisory: new readers go ahead of the writer until its next attempt.
                tracing::debug!(lock = %self.keys.name, owner = %self.owner, reason, "waiting writer's mark lost");
            }
        }
    }

    /// Starts generation `gen` (a fresh grant) in `st`, this hold's state.
    pub(crate) fn start(&self, st: &mut HoldState, gen: u64, field: Str) {
        st.gen = gen;
        st.field = field;
        st.count = 1;
        st.confirmed = Some(1);
        st.pending = false;
        st.lost_at = None;
        st.since = Instant::now();
        st.lost = watch::channel(false).0;
        if self.counted {
            telemetry::hold_started(&self.label);
        }
    }

    /// Ends the active generation in `st`, this hold's state, as given back (the client shuts down).
    pub(crate) fn give_back(&self, st: &mut HoldState) {
        if st.active() && self.counted {
            telemetry::hold_ended(&self.label, End::Released, st.since.elapsed());
        }
        st.count = 0;
        st.lost.send_replace(true);
    }

    /// What brings generation `gen` (Redis field `field`) of this hold back in line.
    pub(crate) fn resync(&self, field: &Str, gen: u64) -> Resync {
        Resync {
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            field: field.clone(),
            gen,
            fence_floor: None,
            after_attempt: false,
        }
    }

    /// How long ago generation `gen`'s lease was found lost, if this client knows.
    pub(crate) fn lost_ago(&self, gen: u64) -> Option<Duration> {
        let st = self.state.lock();
        (st.gen == gen)
            .then_some(st.lost_at)
            .flatten()
            .map(|at| at.elapsed())
    }

    /// Takes one level off generation `gen`, synchronously, as a guard goes: the same owner's next
    /// acquisition sees the lower count at once, as after a synchronous unlock. `None` if the
    /// guard's generation is over; else whether its lease was lost. Redis follows in
    /// [`Job::Release`].
    pub(crate) fn drop_level(&self, gen: u64) -> Option<bool> {
        let mut st = self.state.lock();
        if st.gen != gen || st.count == 0 || st.retired {
            return None;
        }
        st.count -= 1;
        let lost = *st.lost.borrow();
        if st.count == 0 && !lost && self.counted {
            telemetry::hold_ended(&self.label, End::Released, st.since.elapsed());
        }
        Some(lost)
    }
}

/// What an acquisition hands to the API layer, which builds the guard from it.
pub(crate) struct Grant {
    pub(crate) hold: Arc<Hold>,
    pub(crate) gen: u64,
    pub(crate) field: Str,
    pub(crate) token: u64,
    /// The reentrancy depth right after this acquisition.
    pub(crate) count: u32,
    pub(crate) lost: watch::Sender<bool>,
}

impl Grant {
    /// The grant of the hold's current generation. Called under the hold's state lock.
    pub(crate) fn of(hold: &Arc<Hold>, st: &HoldState) -> Grant {
        Grant {
            hold: hold.clone(),
            gen: st.gen,
            field: st.field.clone(),
            token: st.token,
            count: st.count,
            lost: st.lost.clone(),
        }
    }
}

/// Work for the background releaser (see `engine/releaser.rs`).
pub(crate) enum Job {
    /// Bring Redis in line after a guard of generation `gen` was dropped (its level is already
    /// taken off locally). An awaited release runs in its caller's task instead (see
    /// `releaser::release_now`).
    Release {
        hold: Arc<Hold>,
        gen: u64,
        field: Str,
        was_lost: bool,
        /// The hold's operations lock, when it could be taken at once as the guard went: the same
        /// owner's next acquisition then queues behind this release instead of racing it.
        ops: Option<OwnedMutexGuard<()>>,
    },
    /// Bring Redis back in line with the local count of generation `gen` (`field`) of a hold on
    /// the masters `on` (their indexes) after an operation whose outcome there is unknown
    /// (cancelled, timed out, not answered).
    Resync { resync: Resync, on: Vec<usize> },
    /// A release that a majority answered (see `quorum::release_settled`): `answers` gives, once
    /// the other masters answered, those that did not; they and the masters `on` are then brought
    /// in line as by [`Job::Resync`].
    Settle {
        resync: Resync,
        on: Vec<usize>,
        answers: Pin<Box<dyn Future<Output = Vec<usize>> + Send>>,
    },
    /// Record in Redis, at `at`, the handoffs of lock `keys` that went unrecorded since then (see
    /// `engine/core/handoff.rs`), if they still are; `None`: now, all of them.
    Record {
        keys: Arc<LockKeys>,
        at: Option<Instant>,
    },
}

/// One hold generation to bring in line, on some nodes.
pub(crate) struct Resync {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Str,
    pub(crate) field: Str,
    pub(crate) gen: u64,
    /// A token handed out before Redis recorded it (an early handoff whose call's outcome is
    /// unknown, see `engine/core/handoff.rs`): the fence is raised to it before anything is released, so that
    /// the lock is never free here while the fence is below a token in use.
    pub(crate) fence_floor: Option<u64>,
    /// It follows an acquisition round cut short (not a release): a grant it takes back was never
    /// a hold anyone used, and is given back as an undo (see `Node::undo_grant`).
    pub(crate) after_attempt: bool,
}

/// A hold is found by its lock key and owner id.
type HoldKey = (Str, Str);

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// A new generation number, unique in the process.
pub(crate) fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

/// The holds of one client, by lock and owner.
pub(crate) struct Holds {
    holds: Mutex<HashMap<HoldKey, Arc<Hold>>>,
    /// Whether figures carry the lock's name (`LockConfig::metrics_lock_names`).
    names_in_metrics: bool,
    /// The `lost` of a hold that has not started a generation: one channel, already ended, for all
    /// (a hold is made per possession, and `start` gives each generation its own).
    ended: watch::Sender<bool>,
}

impl Holds {
    pub(crate) fn new(names_in_metrics: bool) -> Holds {
        Holds {
            holds: Mutex::new(HashMap::new()),
            names_in_metrics,
            ended: watch::channel(true).0,
        }
    }

    /// A snapshot of every hold (the watchdog's round, shutdown).
    pub(crate) fn snapshot(&self) -> Vec<Arc<Hold>> {
        self.holds.lock().values().cloned().collect()
    }

    fn hold_for(&self, keys: &Arc<LockKeys>, owner: &Str) -> Arc<Hold> {
        let mut holds = self.holds.lock();
        holds
            .entry((keys.lock.clone(), owner.clone()))
            .or_insert_with(|| {
                Arc::new(Hold {
                    keys: keys.clone(),
                    owner: owner.clone(),
                    ops: Arc::new(tokio::sync::Mutex::new(())),
                    state: Mutex::new(HoldState {
                        gen: 0,
                        count: 0,
                        token: 0,
                        lease: Duration::ZERO,
                        watchdog: false,
                        deadline: Instant::now(),
                        lost: self.ended.clone(),
                        retired: false,
                        field: owner.clone(),
                        since: Instant::now(),
                        confirmed: None,
                        lost_at: None,
                        pending: false,
                        copied: None,
                    }),
                    label: telemetry::label(keys.kind.prim(), &keys.name, self.names_in_metrics),
                    counted: !matches!(keys.kind, Kind::Mark(_) | Kind::Waiter(_)),
                })
            })
            .clone()
    }

    /// Removes a hold that no longer holds anything. Called with its `ops` mutex held.
    pub(crate) fn retire_if_idle(&self, hold: &Arc<Hold>) {
        let mut holds = self.holds.lock();
        let mut st = hold.state.lock();
        if st.count == 0 && !st.retired {
            st.retired = true;
            let key = (hold.keys.lock.clone(), hold.owner.clone());
            // One lookup (a hash of both keys) where a `get` then `remove` made two: a hold found
            // in its place is nearly always this one, and another is put back.
            if let Some((key, other)) = holds.remove_entry(&key) {
                if !Arc::ptr_eq(&other, hold) {
                    holds.insert(key, other);
                }
            }
        }
    }

    /// Whether `owner` holds `keys` here once the operations queued on that hold are done (a
    /// dropped guard's release, say).
    pub(crate) async fn settled_active(&self, keys: &Arc<LockKeys>, owner: &Str) -> bool {
        let (hold, _ops) = self.lock_hold(keys, owner).await;
        let active = hold.state.lock().active();
        self.retire_if_idle(&hold);
        active
    }

    /// The hold of `owner` on `keys` with its operations serialised, if none is in progress.
    pub(crate) fn try_lock_hold(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Str,
    ) -> Option<(Arc<Hold>, OwnedMutexGuard<()>)> {
        let hold = self.hold_for(keys, owner);
        let ops = hold.ops.clone().try_lock_owned().ok()?;
        if hold.state.lock().retired {
            return None;
        }
        Some((hold, ops))
    }

    /// Takes the hold of `owner` on `keys` with its operations serialised, looking it up again if it
    /// was retired while we waited.
    pub(crate) async fn lock_hold(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Str,
    ) -> (Arc<Hold>, OwnedMutexGuard<()>) {
        loop {
            let hold = self.hold_for(keys, owner);
            let ops = hold.ops.clone().lock_owned().await;
            if !hold.state.lock().retired {
                return (hold, ops);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter's mark has the same field (the owner id) in every generation. A release or resync
    /// of an ended generation that is sent late (its first try went unanswered) finds the owner
    /// waiting again, with the next generation's mark in that field: it must set that mark's count,
    /// not remove it. A plain lock's fields differ by generation: an ended one's target stays 0.
    #[tokio::test]
    async fn a_late_release_of_an_ended_mark_keeps_the_active_one() {
        let holds = Holds::new(false);
        let rw = Arc::new(crate::redis::keys::RwKeys::new("relock", "marks"));
        let owner = Str::from("owner-id");
        let (mark, _ops) = holds.lock_hold(&Arc::new(rw.mark()), &owner).await;
        let plain = Arc::new(LockKeys::new("relock", "plain"));
        let (hold, _ops) = holds.lock_hold(&plain, &owner).await;

        let mut st = mark.state.lock();
        mark.start(&mut st, 1, owner.clone());
        st.count = 0;
        assert_eq!(st.redis_count(1, &owner), 0, "an ended mark goes");
        mark.start(&mut st, 2, owner.clone());
        assert_eq!(st.redis_count(1, &owner), 1, "the next wait's mark stays");
        assert_eq!(st.redis_count(2, &owner), 1);
        drop(st);

        let mut st = hold.state.lock();
        hold.start(&mut st, 3, Str::from("owner-id:3"));
        assert_eq!(st.redis_count(2, "owner-id:2"), 0, "an ended hold's field goes");
        assert_eq!(st.redis_count(3, "owner-id:3"), 1);
    }
}
