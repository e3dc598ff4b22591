//! The state one client shares between its locks, guards and background tasks: the nodes, the
//! registry of holds, and the serialised operations on each hold.
//!
//! A *hold* is one owner's possession of one lock on this client. Its count is the reentrancy depth;
//! every acquisition and release of it is serialised by the hold's `ops` mutex and sets the count in
//! Redis to the local value (never increments it), so Redis follows the local state even when a reply
//! is lost. A *generation* is one uninterrupted possession: a fresh grant starts one, a loss ends it,
//! and guards of an ended generation release nothing.

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
}

impl HoldState {
    pub(crate) fn active(&self) -> bool {
        self.count > 0 && !*self.lost.borrow()
    }

    /// The count Redis should hold for this owner: the local count while active, else nothing.
    fn redis_count(&self) -> u32 {
        if self.active() {
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

impl Hold {
    /// Ends generation `gen` as lost, once, with a warning naming the lock.
    pub(crate) fn mark_lost(&self, gen: u64, reason: &str) {
        let st = self.state.lock();
        if st.gen == gen && st.count > 0 && !*st.lost.borrow() {
            st.lost.send_replace(true);
            tracing::warn!(lock = %self.keys.name, owner = %self.owner, reason, "lock lost");
        }
    }
}

/// Work for the background releaser.
pub(crate) enum Job {
    /// Bring Redis in line after a guard of generation `gen` went (its level is already taken off
    /// locally); the result goes to `reply` if anyone waits for it.
    Release {
        hold: Arc<Hold>,
        gen: u64,
        was_lost: bool,
        reply: Option<oneshot::Sender<Result<(), Error>>>,
    },
    /// Bring Redis back in line with the local count of a hold after an acquisition whose outcome is
    /// unknown (cancelled, timed out).
    Resync { keys: Arc<LockKeys>, owner: Arc<str> },
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
    /// Undos of unknown outcomes still being retried, by hold (with how many are in flight).
    undos: Mutex<HashMap<HoldKey, (Arc<LockKeys>, usize)>>,
}

/// A hold is found by its lock key and owner id.
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

    pub(crate) fn needed(&self) -> usize {
        quorum::majority(self.nodes.len())
    }

    /// How long a master seen restarted is kept out of quorums; `None` when that rule is off.
    pub(crate) fn quarantine(&self) -> Option<Duration> {
        self.quorum.restart_quarantine.then(|| self.longest_lease())
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

    /// One acquisition attempt: a single round over the nodes.
    pub(crate) async fn attempt(
        self: &Arc<Self>,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        mode: LeaseMode,
    ) -> Result<Attempt, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        loop {
            let (hold, _ops) = self.lock_hold(keys, owner).await;
            let (target, reentry, lease) = {
                let st = hold.state.lock();
                if st.active() {
                    (st.count + 1, Some(st.gen), st.lease)
                } else {
                    let lease = match mode {
                        LeaseMode::Watchdog => self.config.get_watchdog_timeout(),
                        LeaseMode::Fixed(lease) => {
                            let ms = lease.as_millis().min(u64::MAX as u128) as u64;
                            self.longest_lease_ms.fetch_max(ms, Ordering::Relaxed);
                            lease
                        }
                    };
                    (1, None, lease)
                }
            };
            // If this future is dropped mid-round, a grant may still land: the undo runs in the
            // background, after this round's commands on every connection.
            let mut undo = UndoOnDrop {
                core: self,
                keys,
                owner,
                armed: true,
            };
            let round = quorum::acquire(self, keys, owner, lease, target).await;
            undo.armed = matches!(round, Err(_) | Ok(Round::Refused { stragglers: true, .. }));
            drop(undo);
            let (token, continuing, deadline) = match round? {
                Round::Refused { ttl, split, .. } => {
                    match reentry {
                        // Someone else holds it: our hold ran out unnoticed.
                        Some(gen) => hold.mark_lost(gen, "the lock was taken by another owner"),
                        None => self.retire_if_idle(&hold),
                    }
                    return Ok(Attempt::Refused { ttl, split });
                }
                Round::Granted {
                    token,
                    continuing,
                    deadline,
                } => (token, continuing, deadline),
            };
            let stale = {
                let mut st = hold.state.lock();
                match reentry {
                    Some(gen) if st.gen == gen && st.active() && continuing => {
                        st.count += 1;
                        st.deadline = st.deadline.max(deadline);
                        return Ok(Attempt::Granted(LockGuard::new(self.clone(), hold.clone(), &st)));
                    }
                    Some(gen) => gen,
                    None => {
                        st.gen = GENERATIONS.fetch_add(1, Ordering::Relaxed);
                        st.count = 1;
                        st.token = token;
                        st.lease = lease;
                        st.watchdog = mode == LeaseMode::Watchdog;
                        st.deadline = deadline;
                        st.lost = Arc::new(watch::channel(false).0);
                        let guard = LockGuard::new(self.clone(), hold.clone(), &st);
                        // The watchdog may have to wake earlier for this lease.
                        self.watchdog_kick.notify_one();
                        tracing::debug!(lock = %keys.name, owner = %owner, token, "lock acquired");
                        return Ok(Attempt::Granted(guard));
                    }
                }
            };
            // The hold had run out without our noticing: this grant is not a continuation. End the
            // old generation, undo the grant, and start afresh.
            hold.mark_lost(stale, "the lock was found released when re-entering it");
            let _ = quorum::release(self, keys, owner, 0).await;
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

    /// Brings Redis to the hold's count after a guard of generation `gen` went (see `drop_level`).
    async fn release(&self, hold: &Arc<Hold>, gen: u64, was_lost: bool) -> Result<(), Error> {
        let _ops = hold.ops.clone().lock_owned().await;
        let target = {
            let st = hold.state.lock();
            if st.retired {
                // An earlier release already brought Redis to zero.
                return if was_lost { Err(Error::NotHeld) } else { Ok(()) };
            }
            st.redis_count()
        };
        // After a loss this is best effort: whatever is left of the hold in Redis is ours to remove.
        let outcome = quorum::release(self, &hold.keys, &hold.owner, target).await;
        if target == 0 {
            // Only now: until the release is sent, the same owner's next acquisition must queue
            // behind it on this hold rather than race it from a new one.
            self.retire_if_idle(hold);
        }
        if was_lost {
            return Err(Error::NotHeld);
        }
        match outcome {
            Ok(true) => {
                tracing::debug!(lock = %hold.keys.name, owner = %hold.owner, left = target, "lock released");
                Ok(())
            }
            Ok(false) => {
                if target > 0 {
                    hold.mark_lost(gen, "the lock was gone when releasing a nested hold");
                }
                Err(Error::NotHeld)
            }
            Err(err) => {
                tracing::warn!(lock = %hold.keys.name, %err, "release failed; retrying in the background");
                Err(err)
            }
        }
    }

    /// One try at setting the nodes in `pending` to the hold's local count (0 if it holds nothing);
    /// returns the nodes that did not answer. The target is read under the hold's lock, so a try at
    /// any moment is correct, even after the same owner acquired again.
    async fn resync_once(&self, keys: &Arc<LockKeys>, owner: &Arc<str>, pending: &[usize]) -> Vec<usize> {
        let (hold, _ops) = self.lock_hold(keys, owner).await;
        let target = hold.state.lock().redis_count();
        let timeout = self.quorum.node_timeout;
        let tries = pending.iter().map(|&i| async move {
            let outcome = tokio::time::timeout(timeout, self.nodes[i].release(keys, owner, target)).await;
            // A key of another type will not change by waiting: only silence is worth a retry.
            let answered = matches!(outcome, Ok(Ok(_) | Err(Error::WrongType(_))));
            (!answered).then_some(i)
        });
        let silent = futures::future::join_all(tries)
            .await
            .into_iter()
            .flatten()
            .collect();
        if target == 0 {
            self.retire_if_idle(&hold);
        }
        silent
    }

    /// Counts an undo in flight, so that `shutdown` can finish it (`+1`) or forgets it (`-1`).
    fn track_undo(&self, keys: &Arc<LockKeys>, owner: &Arc<str>, delta: isize) {
        let mut undos = self.undos.lock();
        let key = (keys.lock.clone(), owner.clone());
        let entry = undos.entry(key.clone()).or_insert_with(|| (keys.clone(), 0));
        entry.1 = entry.1.saturating_add_signed(delta);
        if entry.1 == 0 {
            undos.remove(&key);
        }
    }

    /// Releases everything this client holds and stops its background work.
    pub(crate) async fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let holds = self.holds();
        let releases = holds.iter().map(|hold| async move {
            let _ops = hold.ops.clone().lock_owned().await;
            let active = {
                let mut st = hold.state.lock();
                let active = st.active();
                st.count = 0;
                st.lost.send_replace(true);
                active
            };
            if active {
                let _ = quorum::release(self, &hold.keys, &hold.owner, 0).await;
            }
            self.retire_if_idle(hold);
        });
        futures::future::join_all(releases).await;
        // Undos still retrying in the background stop at shutdown: finish them here.
        let undos: Vec<_> = self
            .undos
            .lock()
            .iter()
            .map(|((_, owner), (keys, _))| (keys.clone(), owner.clone()))
            .collect();
        let undos = undos
            .iter()
            .map(|(keys, owner)| quorum::release(self, keys, owner, 0));
        futures::future::join_all(undos).await;
        self.watchdog_kick.notify_one();
        for node in &self.nodes {
            node.waiters.wake_all();
            if self.owns_clients {
                node.close().await;
            }
        }
        tracing::debug!(client = %self.id, released = holds.len(), "lock client shut down");
    }
}

struct UndoOnDrop<'a> {
    core: &'a Arc<Core>,
    keys: &'a Arc<LockKeys>,
    owner: &'a Arc<str>,
    armed: bool,
}

impl Drop for UndoOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let job = Job::Resync {
                keys: self.keys.clone(),
                owner: self.owner.clone(),
            };
            if !self.core.enqueue(job) {
                tracing::warn!(lock = %self.keys.name, "runtime gone: an interrupted grant will expire with its lease");
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
    let undo = match job {
        Job::Release {
            hold,
            gen,
            was_lost,
            reply,
        } => {
            let result = core.release(&hold, gen, was_lost).await;
            // The release may or may not have landed: bring Redis in line once it answers again.
            let unknown = matches!(result, Err(Error::Redis(_) | Error::Timeout(_)));
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
            unknown.then(|| (hold.keys.clone(), hold.owner.clone()))
        }
        Job::Resync { keys, owner } => Some((keys, owner)),
    };
    if let Some((keys, owner)) = undo {
        resync(Arc::downgrade(&core), keys, owner).await;
    }
}

/// Brings Redis back to the local count of a hold after an operation whose outcome is unknown (a
/// grant whose reply was lost, a release that failed). Nodes that do not answer are tried again,
/// with backoff, until whatever the operation may have left there has run out by itself: otherwise
/// a lost reply would block everyone for a whole lease. Between tries it keeps no client alive, and
/// a shutdown finishes what is left.
async fn resync(core: Weak<Core>, keys: Arc<LockKeys>, owner: Arc<str>) {
    let Some(strong) = core.upgrade() else { return };
    let give_up = Instant::now() + strong.longest_lease();
    let mut pending: Vec<usize> = (0..strong.nodes.len()).collect();
    strong.track_undo(&keys, &owner, 1);
    drop(strong);
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(core) = core.upgrade() else { return };
        if core.is_closed() {
            return; // shutdown releases what is tracked
        }
        pending = core.resync_once(&keys, &owner, &pending).await;
        let done = pending.is_empty();
        if done || Instant::now() + backoff >= give_up {
            if !done {
                tracing::warn!(lock = %keys.name, silent = pending.len(), "could not undo an interrupted acquisition or release; its lease will run out");
            }
            core.track_undo(&keys, &owner, -1);
            return;
        }
        tracing::debug!(lock = %keys.name, silent = pending.len(), ?backoff, "undo not answered; retrying");
        drop(core);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
