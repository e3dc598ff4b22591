//! The state one client shares between its locks, guards and background tasks: the nodes, the
//! registry of holds, and the serialised operations on each hold.
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedMutexGuard};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::{LockConfig, QuorumConfig};
use crate::guard::LockGuard;
use crate::keys::LockKeys;
use crate::node::Node;
use crate::quorum::{self, Round};
use crate::Error;

/// How a hold keeps its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseMode {
    /// `watchdog_timeout`, renewed by the watchdog.
    Watchdog,
    /// A fixed lease, never renewed.
    Fixed(Duration),
}

pub(crate) struct HoldState {
    pub(crate) gen: u64,
    pub(crate) count: u32,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    pub(crate) watchdog: bool,
    /// When the lease stops being safe, on the monotonic clock (lease start + lease - drift).
    pub(crate) deadline: Instant,
    /// Completed (true) when the generation's lease is lost or given up.
    pub(crate) lost: Arc<watch::Sender<bool>>,
    /// Removed from the registry; whoever still has it must look the hold up again.
    pub(crate) retired: bool,
    /// The Redis field of this generation (owner id and generation).
    pub(crate) field: Arc<str>,
}

impl HoldState {
    pub(crate) fn active(&self) -> bool {
        self.count > 0 && !*self.lost.borrow()
    }

    /// The count Redis should hold for generation `gen`: the local count while it is the active
    /// one, else nothing.
    fn redis_count(&self, gen: u64) -> u32 {
        if self.gen == gen && self.active() {
            self.count
        } else {
            0
        }
    }
}

pub(crate) struct Hold {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) ops: Arc<tokio::sync::Mutex<()>>,
    pub(crate) state: Mutex<HoldState>,
}

/// Work for the background releaser.
pub(crate) enum Job {
    /// Bring Redis in line after a guard of generation `gen` went (its level is already taken off
    /// locally); the result goes to `reply` if anyone waits for it.
    Release {
        hold: Arc<Hold>,
        gen: u64,
        field: Arc<str>,
        was_lost: bool,
        /// The hold's operations lock, when it could be taken at once as the guard went: the same
        /// owner's next acquisition then queues behind this release instead of racing it.
        ops: Option<OwnedMutexGuard<()>>,
        reply: Option<oneshot::Sender<Result<(), Error>>>,
    },
    /// Bring Redis back in line with the local count of generation `gen` (`field`) of a hold after
    /// an operation whose outcome is unknown (cancelled, timed out).
    Resync(Resync),
}

/// One hold generation to bring in line, on some nodes.
pub(crate) struct Resync {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) field: Arc<str>,
    pub(crate) gen: u64,
}

/// The outcome of one attempt.
pub(crate) enum Attempt {
    Granted(LockGuard),
    Refused { ttl: Option<Duration>, split: bool },
}

pub(crate) struct Core {
    pub(crate) id: Uuid,
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) config: LockConfig,
    pub(crate) quorum: QuorumConfig,
    holds: Mutex<HashMap<HoldKey, Arc<Hold>>>,
    jobs: mpsc::UnboundedSender<(Arc<Core>, Job)>,
    pub(crate) watchdog_kick: Arc<Notify>,
    pub(crate) closed: AtomicBool,
    /// The longest fixed lease granted, in ms: restarted masters sit out at least this long.
    longest_lease_ms: AtomicU64,
    /// Whether the command clients are ours to quit on shutdown.
    owns_clients: bool,
    /// Undos of unknown outcomes still being retried, by lock and field (with how many are in
    /// flight).
    undos: Mutex<HashMap<HoldKey, (Arc<LockKeys>, usize)>>,
}

/// A hold is found by its lock key and owner id (an undo by its lock key and field).
type HoldKey = (Arc<str>, Arc<str>);

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

impl Drop for Core {
    fn drop(&mut self) {
        // Lets the watchdog see that the client is gone.
        self.watchdog_kick.notify_one();
    }
}

impl Core {
    /// Builds the core and starts its background tasks (the watchdog and the releaser). Must run
    /// inside a tokio runtime.
    pub(crate) fn start(
        nodes: Vec<Arc<Node>>,
        config: LockConfig,
        quorum: QuorumConfig,
        owns_clients: bool,
    ) -> Arc<Core> {
        let (jobs, rx) = mpsc::unbounded_channel();
        let core = Arc::new(Core {
            id: Uuid::new_v4(),
            nodes,
            config,
            quorum,
            holds: Mutex::new(HashMap::new()),
            jobs,
            watchdog_kick: Arc::new(Notify::new()),
            closed: AtomicBool::new(false),
            longest_lease_ms: AtomicU64::new(0),
            owns_clients,
            undos: Mutex::new(HashMap::new()),
        });
        tokio::spawn(crate::watchdog::run(Arc::downgrade(&core)));
        tokio::spawn(run_jobs(rx));
        core
    }

    /// The bound of one attempt: a round, plus for several masters the writing of the fence (an
    /// undo after a failed round is left to the background past it). A little above the node
    /// timeout, so that the requests' own timeouts, which say more, come first.
    pub(crate) fn attempt_bound(&self) -> Duration {
        let phases = if self.nodes.len() == 1 { 1 } else { 2 };
        // Synced writes also wait for their replicas.
        let sync = self
            .nodes
            .iter()
            .map(|n| n.link.bound() - n.link.timeout)
            .max()
            .unwrap_or_default();
        (self.quorum.node_timeout + sync) * phases + Duration::from_millis(10)
    }

    pub(crate) fn needed(&self) -> usize {
        quorum::majority(self.nodes.len())
    }

    /// How long a master seen restarted is kept out of quorums; `None` when that rule is off.
    pub(crate) fn quarantine(&self) -> Option<Duration> {
        self.quorum.restart_quarantine.then(|| self.longest_lease())
    }

    /// Which nodes may vote now: not in restart quarantine, and not the same server as an earlier
    /// node (one server under two names would be two votes).
    pub(crate) fn voters(&self) -> Vec<bool> {
        let quarantine = self.quarantine();
        if let [node] = &self.nodes[..] {
            // One server cannot repeat another: no run_id to compare on every acquisition.
            return vec![quarantine.is_none_or(|q| node.may_vote(q))];
        }
        let mut seen: Vec<String> = Vec::new();
        self.nodes
            .iter()
            .map(|node| {
                if quarantine.is_some_and(|q| !node.may_vote(q)) {
                    return false;
                }
                let Some(run_id) = node.run_id() else {
                    return false; // not reached yet: it may be another master under another name
                };
                if seen.contains(&run_id) {
                    tracing::error!(node = %node.server, "this master is another listed one under another name: it does not vote");
                    return false;
                }
                seen.push(run_id);
                true
            })
            .collect()
    }

    /// Ends generation `gen` of `hold` as lost, once, with a warning naming the lock. What is left of
    /// it in Redis is not removed here: it runs out with its lease, as it would had this client
    /// crashed, so a holder that does not watch `lost()` is not overtaken sooner than that. Its
    /// guards remove it when they go, and the owner's next acquisition replaces it.
    pub(crate) fn mark_lost(&self, hold: &Hold, gen: u64, reason: &str) {
        let st = hold.state.lock();
        if st.gen == gen && st.count > 0 && !*st.lost.borrow() {
            st.lost.send_replace(true);
            tracing::warn!(lock = %hold.keys.name, owner = %hold.owner, reason, "lock lost");
        }
    }

    /// The longest lease this client may have left in Redis: `watchdog_timeout`, or longer fixed ones.
    fn longest_lease(&self) -> Duration {
        let fixed = Duration::from_millis(self.longest_lease_ms.load(Ordering::Relaxed));
        fixed.max(self.config.get_watchdog_timeout())
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// A snapshot of every hold, for the watchdog.
    pub(crate) fn holds(&self) -> Vec<Arc<Hold>> {
        self.holds.lock().values().cloned().collect()
    }

    fn hold_for(&self, keys: &Arc<LockKeys>, owner: &Arc<str>) -> Arc<Hold> {
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
                        lost: Arc::new(watch::channel(true).0),
                        retired: false,
                        field: owner.clone(),
                    }),
                })
            })
            .clone()
    }

    /// Removes a hold that no longer holds anything. Called with its `ops` mutex held.
    fn retire_if_idle(&self, hold: &Arc<Hold>) {
        let mut holds = self.holds.lock();
        let mut st = hold.state.lock();
        if st.count == 0 && !st.retired {
            st.retired = true;
            let key = (hold.keys.lock.clone(), hold.owner.clone());
            if holds.get(&key).is_some_and(|h| Arc::ptr_eq(h, hold)) {
                holds.remove(&key);
            }
        }
    }

    /// Takes the hold of `owner` on `keys` with its operations serialised, looking it up again if it
    /// was retired while we waited.
    async fn lock_hold(&self, keys: &Arc<LockKeys>, owner: &Arc<str>) -> (Arc<Hold>, OwnedMutexGuard<()>) {
        loop {
            let hold = self.hold_for(keys, owner);
            let ops = hold.ops.clone().lock_owned().await;
            if !hold.state.lock().retired {
                return (hold, ops);
            }
        }
    }

    /// One acquisition attempt: a single round over the nodes (two when a reentrant acquisition
    /// finds its hold lost, the second a fresh one).
    ///
    /// Bounded: the wait for the same owner's operation in flight on this hold by `until` (the
    /// caller's bound, if any; that operation has its own bound), and each round by
    /// [`attempt_bound`](Core::attempt_bound) and `until`, whichever comes first. A round cut short
    /// is undone in the background.
    pub(crate) async fn attempt(
        self: &Arc<Self>,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        mode: LeaseMode,
        until: Option<Instant>,
    ) -> Result<Attempt, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        loop {
            let (hold, _ops) = match until {
                Some(until) => tokio::time::timeout_at(until, self.lock_hold(keys, owner))
                    .await
                    .map_err(|_| Error::Timeout(Duration::ZERO))?,
                None => self.lock_hold(keys, owner).await,
            };
            let start = Instant::now();
            let own_bound = start + self.attempt_bound();
            let bound = until.map_or(own_bound, |until| until.min(own_bound));
            // A reentrant acquisition joins the hold as it is, lease mode included.
            let (target, gen, field, lease) = {
                let st = hold.state.lock();
                if st.active() {
                    (st.count + 1, st.gen, st.field.clone(), st.lease)
                } else {
                    let lease = match mode {
                        LeaseMode::Watchdog => self.config.get_watchdog_timeout(),
                        LeaseMode::Fixed(lease) => {
                            let ms = lease.as_millis().min(u64::MAX as u128) as u64;
                            self.longest_lease_ms.fetch_max(ms, Ordering::Relaxed);
                            lease
                        }
                    };
                    let gen = GENERATIONS.fetch_add(1, Ordering::Relaxed);
                    (1, gen, format!("{owner}:{gen}").into(), lease)
                }
            };
            let reentry = target > 1;
            // If this future is dropped mid-round, a grant may still land: the undo runs in the
            // background, after this round's commands on every connection.
            let mut undo = UndoOnDrop {
                core: self,
                resync: Some(Resync {
                    keys: keys.clone(),
                    owner: owner.clone(),
                    field: field.clone(),
                    gen,
                }),
            };
            let round = tokio::time::timeout_at(bound, quorum::acquire(self, keys, &field, lease, target))
                .await
                .unwrap_or_else(|_| Err(Error::Timeout(bound - start)));
            if !matches!(round, Err(_) | Ok(Round::Refused { stragglers: true, .. })) {
                undo.resync = None;
            }
            drop(undo);
            let (token, deadline) = match round? {
                Round::Refused { ttl, split, .. } => {
                    self.retire_if_idle(&hold);
                    return Ok(Attempt::Refused { ttl, split });
                }
                Round::Lost => {
                    // The hold ran out unnoticed: end it, remove what is left, start afresh.
                    self.mark_lost(
                        &hold,
                        gen,
                        "the lock was found released or taken when re-entering it",
                    );
                    let _ = quorum::release(self, keys, &field, 0).await;
                    continue;
                }
                Round::Granted { token, deadline } => (token, deadline),
            };
            // Decided under the hold's lock; the guard of that lock must not live across an await.
            let granted = {
                let mut st = hold.state.lock();
                if reentry {
                    if st.gen == gen && st.active() {
                        st.count += 1;
                        st.deadline = st.deadline.max(deadline);
                        Some(LockGuard::new(self.clone(), hold.clone(), &st))
                    } else {
                        None // lost while the round ran; its cleanup takes our level too
                    }
                } else {
                    st.gen = gen;
                    st.field = field.clone();
                    st.count = 1;
                    st.token = token;
                    st.lease = lease;
                    st.watchdog = mode == LeaseMode::Watchdog;
                    st.deadline = deadline;
                    st.lost = Arc::new(watch::channel(false).0);
                    if self.is_closed() {
                        // Shut down during the round, perhaps after its snapshot of the holds.
                        st.count = 0;
                        st.lost.send_replace(true);
                        None
                    } else {
                        Some(LockGuard::new(self.clone(), hold.clone(), &st))
                    }
                }
            };
            let Some(guard) = granted else {
                if reentry {
                    continue;
                }
                // Given back: the client was shut down.
                let _ = quorum::release(self, keys, &field, 0).await;
                self.retire_if_idle(&hold);
                return Err(Error::Shutdown);
            };
            if !reentry {
                // The watchdog may have to wake earlier for this lease.
                self.watchdog_kick.notify_one();
                tracing::debug!(lock = %keys.name, owner = %owner, token, "lock acquired");
            }
            return Ok(Attempt::Granted(guard));
        }
    }

    /// Queues background work; false if the releaser is gone (its runtime shut down).
    pub(crate) fn enqueue(self: &Arc<Self>, job: Job) -> bool {
        self.jobs.send((self.clone(), job)).is_ok()
    }

    /// Takes one level off generation `gen` of `hold`, synchronously, as a guard goes: the same
    /// owner's next acquisition sees the lower count at once, as after a synchronous unlock. `None`
    /// if the guard's generation is over; else whether its lease was lost. Redis follows in
    /// [`Job::Release`].
    pub(crate) fn drop_level(&self, hold: &Hold, gen: u64) -> Option<bool> {
        let mut st = hold.state.lock();
        if st.gen != gen || st.count == 0 || st.retired {
            return None;
        }
        st.count -= 1;
        let lost = *st.lost.borrow();
        Some(lost)
    }

    /// Brings Redis to the hold's count after a guard of generation `gen` went (see `drop_level`);
    /// also returns the nodes that did not answer, for a retry in the background.
    async fn release(
        self: &Arc<Self>,
        hold: &Arc<Hold>,
        gen: u64,
        field: &Arc<str>,
        was_lost: bool,
        ops: Option<OwnedMutexGuard<()>>,
    ) -> (Result<(), Error>, Vec<usize>) {
        let _ops = match ops {
            Some(ops) => ops,
            None => hold.ops.clone().lock_owned().await,
        };
        // Sent even if the hold was retired meanwhile (say, by a refused attempt of the same owner
        // that saw this generation's field still there): a repeat is harmless, a skip is not.
        let target = hold.state.lock().redis_count(gen);
        // After a loss this is best effort: whatever is left of the hold in Redis is ours to remove.
        let outcome = quorum::release(self, &hold.keys, field, target).await;
        if target == 0 {
            // Only now: until the release is sent, the same owner's next acquisition must queue
            // behind it on this hold rather than race it from a new one.
            self.retire_if_idle(hold);
        }
        let silent = outcome.silent.clone();
        if was_lost {
            return (Err(Error::NotHeld), silent);
        }
        let result = match outcome.outcome(self.needed(), self.nodes.len()) {
            Ok(true) => {
                tracing::debug!(lock = %hold.keys.name, owner = %hold.owner, left = target, "lock released");
                Ok(())
            }
            Ok(false) => {
                if target > 0 {
                    self.mark_lost(hold, gen, "the lock was gone when releasing a nested hold");
                }
                Err(Error::NotHeld)
            }
            Err(err) => {
                tracing::warn!(lock = %hold.keys.name, %err, "release not confirmed; retrying in the background");
                Err(err)
            }
        };
        (result, silent)
    }

    /// One try at setting generation `resync.gen` of a hold to its local count (0 if it is not the
    /// active one) on the nodes in `pending`; returns the nodes that did not answer. The target is
    /// read under the hold's lock, so a try at any moment is correct, even after the same owner
    /// acquired again.
    async fn resync_once(&self, resync: &Resync, pending: &[usize]) -> Vec<usize> {
        let (hold, ops) = self.lock_hold(&resync.keys, &resync.owner).await;
        let (target, current) = {
            let st = hold.state.lock();
            (st.redis_count(resync.gen), st.gen == resync.gen && st.active())
        };
        // Only the active generation's operations must stay in order with this one; an ended one's
        // field is nobody's, so the owner's next acquisition need not wait for silent masters.
        let _ops = if current {
            Some(ops)
        } else {
            self.retire_if_idle(&hold);
            drop(ops);
            None
        };
        quorum::release_on(self, &resync.keys, &resync.field, target, pending)
            .await
            .silent
    }

    /// Counts an undo in flight, so that `shutdown` can finish it (`+1`) or forgets it (`-1`).
    fn track_undo(&self, resync: &Resync, delta: isize) {
        let mut undos = self.undos.lock();
        let key = (resync.keys.lock.clone(), resync.field.clone());
        let entry = undos
            .entry(key.clone())
            .or_insert_with(|| (resync.keys.clone(), 0));
        entry.1 = entry.1.saturating_add_signed(delta);
        if entry.1 == 0 {
            undos.remove(&key);
        }
    }

    /// Releases everything this client holds and stops its background work. Bounded: the releases
    /// get two node timeouts (what they do not finish expires with its lease), closing the
    /// connections half a second more.
    pub(crate) async fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let holds = self.holds();
        let releases = holds.iter().map(|hold| async move {
            let _ops = hold.ops.clone().lock_owned().await;
            let field = {
                let mut st = hold.state.lock();
                let active = st.active();
                st.count = 0;
                st.lost.send_replace(true);
                active.then(|| st.field.clone())
            };
            if let Some(field) = field {
                let _ = quorum::release(self, &hold.keys, &field, 0).await;
            }
            self.retire_if_idle(hold);
        });
        let releases = async {
            futures::future::join_all(releases).await;
            // Undos still retrying in the background stop at shutdown: finish them here.
            let undos: Vec<_> = self
                .undos
                .lock()
                .iter()
                .map(|((_, field), (keys, _))| (keys.clone(), field.clone()))
                .collect();
            let undos = undos
                .iter()
                .map(|(keys, field)| quorum::release(self, keys, field, 0));
            futures::future::join_all(undos).await;
        };
        if tokio::time::timeout(self.quorum.node_timeout * 2, releases)
            .await
            .is_err()
        {
            tracing::warn!(client = %self.id, "shutdown: some releases did not finish; they expire with their leases");
        }
        self.watchdog_kick.notify_one();
        for node in &self.nodes {
            node.waiters.wake_all();
        }
        if self.owns_clients {
            futures::future::join_all(self.nodes.iter().map(|node| node.close())).await;
        }
        tracing::debug!(client = %self.id, released = holds.len(), "lock client shut down");
    }
}

/// Undoes an attempt dropped mid-round (or whose outcome is unknown), in the background.
struct UndoOnDrop<'a> {
    core: &'a Arc<Core>,
    resync: Option<Resync>,
}

impl Drop for UndoOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(resync) = self.resync.take() {
            let name = resync.keys.name.clone();
            if !self.core.enqueue(Job::Resync(resync)) {
                tracing::warn!(lock = %name, "runtime gone: an interrupted grant will expire with its lease");
            }
        }
    }
}

/// The releaser: runs queued releases concurrently (their commands pipeline on each connection)
/// until every sender is gone. It keeps no core alive but the ones its jobs carry.
async fn run_jobs(mut rx: mpsc::UnboundedReceiver<(Arc<Core>, Job)>) {
    let mut running = FuturesUnordered::new();
    loop {
        tokio::select! {
            job = rx.recv() => match job {
                Some((core, job)) => running.push(run_job(core, job)),
                None => break,
            },
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
    while running.next().await.is_some() {}
}

async fn run_job(core: Arc<Core>, job: Job) {
    let (resync, pending) = match job {
        Job::Release {
            hold,
            gen,
            field,
            was_lost,
            ops,
            reply,
        } => {
            let (result, silent) = core.release(&hold, gen, &field, was_lost, ops).await;
            match reply {
                Some(reply) => {
                    let _ = reply.send(result);
                }
                None => {
                    if let Err(err) = result {
                        if !matches!(err, Error::NotHeld) {
                            tracing::warn!(lock = %hold.keys.name, %err, "release from drop failed");
                        }
                    }
                }
            }
            if silent.is_empty() {
                return;
            }
            // The release may or may not have landed there: bring them in line once they answer.
            let resync = Resync {
                keys: hold.keys.clone(),
                owner: hold.owner.clone(),
                field,
                gen,
            };
            (resync, silent)
        }
        Job::Resync(resync) => (resync, (0..core.nodes.len()).collect()),
    };
    resync_until_answered(Arc::downgrade(&core), resync, pending).await;
}

/// Brings the nodes in `pending` in line with the local count of a hold generation after an
/// operation whose outcome is unknown (a grant whose reply was lost, a release that failed).
/// Nodes that do not answer are tried again, with backoff, until whatever the operation may have
/// left there has run out by itself: otherwise a lost reply would block everyone for a whole
/// lease. Between tries it keeps no client alive, and a shutdown finishes what is left.
async fn resync_until_answered(core: Weak<Core>, resync: Resync, mut pending: Vec<usize>) {
    let Some(strong) = core.upgrade() else { return };
    let give_up = Instant::now() + strong.longest_lease();
    strong.track_undo(&resync, 1);
    drop(strong);
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(core) = core.upgrade() else { return };
        if core.is_closed() {
            return; // shutdown releases what is tracked
        }
        pending = core.resync_once(&resync, &pending).await;
        let done = pending.is_empty();
        if done || Instant::now() + backoff >= give_up {
            if !done {
                tracing::warn!(lock = %resync.keys.name, silent = pending.len(), "could not undo an interrupted acquisition or release; its lease will run out");
            }
            core.track_undo(&resync, -1);
            return;
        }
        tracing::debug!(lock = %resync.keys.name, silent = pending.len(), ?backoff, "undo not answered; retrying");
        drop(core);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
