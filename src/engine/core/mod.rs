//! The engine of one client: its masters, its holds, and acquisition and shutdown over them. It
//! returns grants (see [`Grant`]); the primitives (`primitives/lock/`, `primitives/guard.rs`) build
//! guards from them. Releases and undos run on the releaser (`engine/releaser.rs`), renewals on the
//! watchdog (`engine/watchdog.rs`); both are started beside the core (see `client::start_core`).
//! Here the core, attempts and fencing tokens; in `handoff` a release's handing on to a waiter of
//! this client, in `record` the recording of such handoffs in Redis.
//!
//! May use: the rest of `engine`, `redis`, `util` and the shared vocabulary.

use fred::bytes_utils::Str;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::LockConfig;
use crate::engine::handoffs::Handoffs;
use crate::engine::hold::{next_generation, Grant, Hold, Holds, Job, LeaseMode, Resync};
use crate::engine::quorum::{self, Masters, Round};
use crate::redis::identity::Identity;
use crate::redis::keys::{Kind, LockKeys};
use crate::util::deadline::Deadlines;
use crate::Error;

mod handoff;
mod record;
mod signals;

pub(crate) use signals::Signals;

/// The outcome of one attempt.
pub(crate) enum Attempt {
    Granted(Grant),
    Refused { ttl: Option<Duration>, split: bool },
}

pub(crate) struct Core {
    pub(crate) id: Uuid,
    /// Its name and record (see `redis/identity.rs`).
    pub(crate) identity: Identity,
    pub(crate) masters: Masters,
    pub(crate) config: LockConfig,
    pub(crate) holds: Holds,
    /// This client's waiters that a release may hand its lock to (see `engine/core/handoff.rs`).
    pub(crate) handoffs: Handoffs,
    jobs: mpsc::UnboundedSender<(Arc<Core>, Job)>,
    /// How the watchdog is woken, and what it is told (see `engine/watchdog.rs`).
    pub(crate) watchdog: Signals,
    /// The bounds of attempts (see `util/deadline.rs`).
    deadlines: Deadlines,
    closed: AtomicBool,
    /// The longest fixed lease granted, in ms: restarted masters sit out at least this long.
    longest_lease_ms: AtomicU64,
    /// Whether the command clients are ours to quit on shutdown.
    owns_clients: bool,
    /// Undos of unknown outcomes still being retried, by lock and field (with how many are in
    /// flight): shutdown finishes them.
    pub(crate) undos: Mutex<HashMap<UndoKey, (Arc<LockKeys>, usize)>>,
    /// Closed when the core is dropped: its receivers learn that the last job holding it is done
    /// (the blocking client waits for that before stopping its runtime).
    pub(crate) alive: watch::Sender<()>,
}

/// What an acquisition of one hold asks Redis for (see [`Core::ask`]).
pub(crate) struct Ask {
    /// The hold's count after it: 1 starts a generation.
    pub(crate) target: u32,
    pub(crate) gen: u64,
    /// The hold's field in Redis (owner and generation).
    pub(crate) field: Str,
    pub(crate) lease: Duration,
}

/// An undo is found by its lock key and the hold's field.
pub(crate) type UndoKey = (Str, Str);

impl Drop for Core {
    fn drop(&mut self) {
        // Lets the watchdog see that the client is gone.
        self.watchdog.kick.notify_one();
    }
}

impl Core {
    /// Builds the core; `jobs` is the releaser's queue (see `client::start_core`).
    pub(crate) fn new(
        masters: Masters,
        config: LockConfig,
        owns_clients: bool,
        jobs: mpsc::UnboundedSender<(Arc<Core>, Job)>,
    ) -> Core {
        let holds = Holds::new(config.get_metrics_lock_names());
        let handoffs = Handoffs::new(
            config.get_handoff_limit(),
            config.get_handoff_window(),
            config.get_unrecorded_handoffs(),
        );
        let id = Uuid::new_v4();
        let identity = Identity::new(
            config.get_key_prefix(),
            &id.simple().to_string(),
            config.get_client_name(),
        );
        Core {
            id,
            identity,
            masters,
            config,
            holds,
            handoffs,
            jobs,
            watchdog: Signals::default(),
            deadlines: Deadlines::start(),
            closed: AtomicBool::new(false),
            longest_lease_ms: AtomicU64::new(0),
            owns_clients,
            undos: Mutex::new(HashMap::new()),
            alive: watch::channel(()).0,
        }
    }

    /// How long a master seen restarted is kept out of quorums; `None` when that rule is off.
    pub(crate) fn quarantine(&self) -> Option<Duration> {
        self.masters
            .config
            .restart_quarantine
            .then(|| self.longest_lease())
    }

    /// The masters that may vote now, or the error that too few may (see [`Masters::voters`]).
    fn voting(&self) -> Result<quorum::Voters, Error> {
        let quarantine = self.quarantine();
        let voters = self.masters.voters(quarantine);
        match self.masters.too_few_voters(&voters, quarantine) {
            Some(err) => Err(err),
            None => Ok(voters),
        }
    }

    /// The longest lease this client may have left in Redis: `watchdog_timeout`, or longer fixed ones.
    pub(crate) fn longest_lease(&self) -> Duration {
        let fixed = Duration::from_millis(self.longest_lease_ms.load(Ordering::Relaxed));
        fixed.max(self.config.get_watchdog_timeout())
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The hold of `owner` on `keys` with its operations serialised ([`Holds::lock_hold`]), or
    /// [`Error::Shutdown`] once the client is closed. Closed is checked after the hold is in the
    /// registry: `shutdown` closes, then takes its snapshot of the registry, so either the snapshot
    /// has this hold (and shutdown waits for its operations, which undo what they get) or this sees
    /// the close and sends nothing. (Checked only before, an attempt that registered its hold just
    /// after the snapshot could send a grant that nothing released: its undo found the connections
    /// closed.)
    ///
    /// Handoffs of the lock that Redis has not recorded yet are recorded first (see `engine/core/handoff.rs`),
    /// by the releaser: cancelling this leaves them to it.
    pub(crate) async fn open_hold(
        self: &Arc<Self>,
        keys: &Arc<LockKeys>,
        owner: &Str,
    ) -> Result<(Arc<Hold>, tokio::sync::OwnedMutexGuard<()>), Error> {
        loop {
            let (hold, ops) = self.holds.lock_hold(keys, owner).await;
            if self.is_closed() {
                self.holds.retire_if_idle(&hold);
                return Err(Error::Shutdown);
            }
            // Held here by handoffs that Redis has not recorded (by this hold or another): they are
            // recorded first. Redis holds the lock for the hold it recorded last, which may be an
            // ended generation of this owner, which an attempt replaces (see acquire.lua).
            if !self.hands_over(keys) || !self.handoffs.owes(&keys.lock) {
                return Ok((hold, ops));
            }
            drop(ops);
            self.settle_handoffs(keys).await;
        }
    }

    /// One acquisition attempt: a single round over the masters (two when a reentrant acquisition
    /// finds its hold lost, the second a fresh one).
    ///
    /// Bounded: the wait for the same owner's operation in flight on this hold by `until` (the
    /// caller's bound, if any; that operation has its own bound), and each round by
    /// [`attempt_bound`](Masters::attempt_bound) and `until`, whichever comes first (one master's
    /// round, with no `until`, by its node's bound on the request, which is the same length). A
    /// round cut short is undone in the background.
    pub(crate) async fn attempt(
        self: &Arc<Self>,
        keys: &Arc<LockKeys>,
        owner: &Str,
        mode: LeaseMode,
        reentrant: bool,
        until: Option<Instant>,
    ) -> Result<Attempt, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        loop {
            let (hold, _ops) = self
                .within(until, self.open_hold(keys, owner))
                .await
                .ok_or(Error::Timeout(Duration::ZERO))??;
            // Looked at with the hold's operations held: of two acquisitions of one owner at once
            // (futures joined in one task), the second sees the first one's grant.
            if !reentrant && hold.state.lock().active() {
                return Err(Error::AlreadyHeld(keys.name.to_string()));
            }
            let ask = self.ask(&hold, owner, mode);
            let (gen, field, reentry) = (ask.gen, ask.field.clone(), ask.target > 1);
            let round = self.round(&hold, keys, &ask, until).await;
            let (token, deadline) = match round? {
                Round::Refused { ttl, split, .. } => {
                    self.holds.retire_if_idle(&hold);
                    return Ok(Attempt::Refused { ttl, split });
                }
                Round::Lost => {
                    // The hold ran out unnoticed: end it, remove what is left, start afresh.
                    hold.mark_lost(gen, "the lock was found released or taken when re-entering it");
                    let _ = quorum::release(&self.masters, keys, &field, 0).await;
                    continue;
                }
                Round::Granted { token, deadline } => (token, deadline),
            };
            let Some(grant) = self.record_grant(&hold, &ask, token, deadline, mode, false) else {
                if reentry {
                    continue;
                }
                // Given back: the client was shut down.
                let _ = quorum::release(&self.masters, keys, &field, 0).await;
                self.holds.retire_if_idle(&hold);
                return Err(Error::Shutdown);
            };
            if !reentry {
                // The watchdog may have to wake earlier for this lease.
                self.watchdog.wake_for(deadline);
                tracing::debug!(lock = %keys.name, owner = %owner, token, "lock acquired");
            }
            return Ok(Attempt::Granted(grant));
        }
    }

    /// One round for `ask` over the masters that may vote, bounded as [`attempt`](Core::attempt)
    /// says. If this future is dropped mid-round, or the round's outcome is unknown, a grant may
    /// still land: the undo runs in the background, after this round's commands on every
    /// connection.
    async fn round(
        self: &Arc<Self>,
        hold: &Arc<Hold>,
        keys: &Arc<LockKeys>,
        ask: &Ask,
        until: Option<Instant>,
    ) -> Result<Round, Error> {
        let start = Instant::now();
        let own_bound = start + self.masters.attempt_bound();
        let bound = until.map_or(own_bound, |until| until.min(own_bound));
        let mut undo = UndoOnDrop {
            core: self,
            resync: Some(Resync {
                after_attempt: true,
                ..hold.resync(&ask.field, ask.gen)
            }),
        };
        let voters = match self.voting() {
            Ok(voters) => voters,
            Err(err) => {
                // Nothing sent: nothing to undo.
                undo.resync = None;
                drop(undo);
                self.holds.retire_if_idle(hold);
                return Err(err);
            }
        };
        let round = quorum::acquire(&self.masters, &voters, keys, &ask.field, ask.lease, ask.target);
        // One master's round is one request, which its node bounds already (by the same length);
        // several masters', or a shorter wait of the caller's, are bounded here.
        let round = if until.is_none() && self.masters.single() {
            round.await
        } else {
            self.deadlines
                .within(bound, round)
                .await
                .unwrap_or_else(|| Err(Error::Timeout(bound - start)))
        };
        // Nothing to undo where every master answered. One master's refusal error (a key of
        // another type) is its whole answer, and the script failed before it wrote anything;
        // of several masters', others may not have answered.
        let definite = match &round {
            Ok(Round::Refused { stragglers, .. }) => !stragglers,
            Ok(_) => true,
            Err(err) => err.is_refusal() && self.masters.single(),
        };
        if definite {
            undo.resync = None;
        }
        drop(undo);
        if definite && round.is_err() {
            self.holds.retire_if_idle(hold);
        }
        round
    }

    /// The fencing token of generation `gen` of `hold`: the one it has, or for a plain lock, one
    /// drawn now while the hold holds the lock in Redis (`scripts/draw_token.lua`), kept for the
    /// generation's later reads and guards. A plain lock's acquisition draws none: most holders
    /// never read it. Drawn only where the hold's field is in the lock hash, from the counter
    /// every acquisition draws from, so every later holder's token is larger; see
    /// `docs/guarantees.md`. Handoffs not recorded in Redis yet are recorded first (Redis then
    /// names this hold).
    ///
    /// `Err(LeaseLost)` if the generation is over, or Redis no longer has it (then it ends as
    /// lost). Bounded as an attempt is.
    pub(crate) async fn fencing_token(self: &Arc<Self>, hold: &Arc<Hold>, gen: u64) -> Result<u64, Error> {
        let drawn = |hold: &Hold| {
            let st = hold.state.lock();
            if st.gen != gen || !st.active() {
                return Some(Err(Error::LeaseLost));
            }
            (st.token > 0 || !matches!(hold.keys.kind, Kind::Plain)).then_some(Ok(st.token))
        };
        if let Some(known) = drawn(hold) {
            return known;
        }
        let _ops = self.named_in_redis(hold).await;
        if let Some(known) = drawn(hold) {
            return known;
        }
        let field = hold.state.lock().field.clone();
        let voters = self.voting()?;
        let start = Instant::now();
        let bound = start + self.masters.attempt_bound();
        let drawn = self
            .deadlines
            .within(
                bound,
                quorum::draw_token(&self.masters, &voters, &hold.keys, &field),
            )
            .await
            .unwrap_or_else(|| Err(Error::Timeout(bound - start)))?;
        let Some(token) = drawn else {
            hold.mark_lost(
                gen,
                "the lock was found released or taken when drawing its fencing token",
            );
            return Err(Error::LeaseLost);
        };
        let mut st = hold.state.lock();
        if st.gen != gen || !st.active() {
            return Err(Error::LeaseLost);
        }
        st.token = token;
        tracing::debug!(lock = %hold.keys.name, owner = %hold.owner, token, "fencing token drawn");
        Ok(token)
    }

    /// `future`, bounded by the caller's `until` if there is one: `None` if that passed first. Not
    /// an `async fn`, which would hold `future` twice (see [`Deadlines::within`]).
    pub(crate) fn within<F: std::future::Future>(
        &self,
        until: Option<Instant>,
        future: F,
    ) -> impl std::future::Future<Output = Option<F::Output>> {
        use futures::future::{Either, FutureExt};
        match until {
            Some(until) => Either::Left(self.deadlines.within(until, future)),
            None => Either::Right(future.map(Some)),
        }
    }

    /// What an acquisition of `hold` asks Redis for. A reentrant acquisition joins the hold as it
    /// is, lease mode included; a fresh one starts a generation.
    pub(crate) fn ask(&self, hold: &Hold, owner: &str, mode: LeaseMode) -> Ask {
        let st = hold.state.lock();
        if st.active() {
            return Ask {
                target: st.count + 1,
                gen: st.gen,
                field: st.field.clone(),
                lease: st.lease,
            };
        }
        let lease = match mode {
            LeaseMode::Watchdog => self.config.get_watchdog_timeout(),
            LeaseMode::Fixed(lease) => {
                let ms = lease.as_millis().min(u64::MAX as u128) as u64;
                self.longest_lease_ms.fetch_max(ms, Ordering::Relaxed);
                lease
            }
        };
        let gen = next_generation();
        Ask {
            target: 1,
            gen,
            field: crate::redis::keys::joined(&[owner, ":", crate::redis::keys::decimal(gen, &mut [0; 20])]),
            lease,
        }
    }

    /// Records in `hold` what Redis granted to `ask` (with `token`, safe until `deadline`) and
    /// returns the grant; `None` if a reentered hold was lost while the round ran (its cleanup
    /// takes this level too), or the client was shut down meanwhile (the caller gives a fresh grant
    /// back). Decided under the hold's lock. `pending`: a fresh grant that Redis has not recorded
    /// yet (see `engine/core/handoff.rs`), marked so in the same step, so that no watchdog round renews it.
    pub(crate) fn record_grant(
        &self,
        hold: &Arc<Hold>,
        ask: &Ask,
        token: u64,
        deadline: Instant,
        mode: LeaseMode,
        pending: bool,
    ) -> Option<Grant> {
        let mut st = hold.state.lock();
        if ask.target > 1 {
            if st.gen == ask.gen && st.active() {
                st.count += 1;
                st.confirmed = Some(ask.target);
                st.deadline = st.deadline.max(deadline);
                return Some(Grant::of(hold, &st));
            }
            return None;
        }
        if self.is_closed() {
            // Shut down during the round, perhaps after its snapshot of the holds.
            return None;
        }
        hold.start(&mut st, ask.gen, ask.field.clone());
        if pending {
            st.pending = true;
            st.confirmed = None;
        }
        st.token = token;
        st.lease = ask.lease;
        st.watchdog = mode == LeaseMode::Watchdog;
        st.deadline = deadline;
        Some(Grant::of(hold, &st))
    }

    /// Queues background work; false if the releaser is gone (its runtime shut down). An undo
    /// counts from here, not from when the releaser starts it: a lock with one pending is not
    /// handed over early (see [`Core::early_grant`]).
    pub(crate) fn enqueue(self: &Arc<Self>, job: Job) -> bool {
        let undo = match &job {
            Job::Resync { resync, .. } | Job::Settle { resync, .. } => {
                Some((resync.keys.clone(), resync.field.clone()))
            }
            Job::Release { .. } | Job::Record { .. } => None,
        };
        if let Some((keys, field)) = &undo {
            self.track_undo(keys, field, 1);
        }
        let sent = self.jobs.send((self.clone(), job)).is_ok();
        if let (false, Some((keys, field))) = (sent, &undo) {
            self.track_undo(keys, field, -1);
        }
        sent
    }

    /// Counts an undo of hold `field` of `keys` queued or in flight, so that shutdown can finish it
    /// (`+1`), or forgets it (`-1`).
    pub(crate) fn track_undo(&self, keys: &Arc<LockKeys>, field: &Str, delta: isize) {
        let mut undos = self.undos.lock();
        let key = (keys.lock.clone(), field.clone());
        let entry = undos.entry(key.clone()).or_insert_with(|| (keys.clone(), 0));
        entry.1 = entry.1.saturating_add_signed(delta);
        if entry.1 == 0 {
            undos.remove(&key);
        }
    }

    /// Whether an undo of any hold of lock `lock` is queued or in flight here: what an operation
    /// of unknown outcome left in Redis may differ from what the holds say.
    pub(crate) fn undo_pending(&self, lock: &str) -> bool {
        self.undos.lock().keys().any(|(key, _)| &**key == lock)
    }

    /// Gives back a grant no guard was made of (a handoff's waiter that left, a set given back
    /// whole): the hold goes as a dropped guard's would.
    pub(crate) fn give_back(self: &Arc<Self>, grant: Grant) {
        if let Some(was_lost) = grant.hold.drop_level(grant.gen) {
            self.enqueue(Job::Release {
                hold: grant.hold,
                gen: grant.gen,
                field: grant.field,
                was_lost,
                ops: None,
            });
        }
    }

    /// Releases everything this client holds and stops its background work. Bounded: the releases
    /// get two node timeouts (what they do not finish expires with its lease), closing the
    /// connections half a second more.
    pub(crate) async fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let holds = self.holds.snapshot();
        // What Redis holds for handoffs not recorded yet goes too.
        let unrecorded = self.handoffs.unrecorded();
        let unrecorded = unrecorded
            .iter()
            .map(|(keys, field)| quorum::release(&self.masters, keys, field, 0));
        let releases = holds.iter().map(|hold| async move {
            let _ops = hold.ops.clone().lock_owned().await;
            let field = {
                let mut st = hold.state.lock();
                let active = st.active();
                hold.give_back(&mut st);
                active.then(|| st.field.clone())
            };
            if let Some(field) = field {
                let _ = quorum::release(&self.masters, &hold.keys, &field, 0).await;
            }
            self.holds.retire_if_idle(hold);
        });
        // The client's record goes with it (see `redis/identity.rs`).
        let record = self
            .masters
            .nodes
            .iter()
            .map(|node| node.remove_record(&self.identity.key));
        let releases = async {
            futures::future::join3(
                futures::future::join_all(releases),
                futures::future::join_all(unrecorded),
                futures::future::join_all(record),
            )
            .await;
            // Undos still retrying in the background stop at shutdown: finish them here.
            let undos: Vec<_> = self
                .undos
                .lock()
                .iter()
                .map(|((_, field), (keys, _))| (keys.clone(), field.clone()))
                .collect();
            let undos = undos
                .iter()
                .map(|(keys, field)| quorum::release(&self.masters, keys, field, 0));
            futures::future::join_all(undos).await;
        };
        if tokio::time::timeout(self.masters.config.node_timeout * 2, releases)
            .await
            .is_err()
        {
            tracing::warn!(client = %self.id, "shutdown: some releases did not finish; they expire with their leases");
        }
        self.watchdog.kick.notify_one();
        for node in &self.masters.nodes {
            node.waiters.wake_all();
        }
        if self.owns_clients {
            futures::future::join_all(self.masters.nodes.iter().map(|node| node.close())).await;
        }
        tracing::debug!(client = %self.id, released = holds.len(), "lock client shut down");
    }
}

/// Brings a hold generation in line on every master, in the background, unless disarmed
/// (`resync` taken): for an operation dropped part way, or whose outcome is unknown.
pub(crate) struct UndoOnDrop<'a> {
    pub(crate) core: &'a Arc<Core>,
    pub(crate) resync: Option<Resync>,
}

impl Drop for UndoOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(resync) = self.resync.take() {
            let name = resync.keys.name.clone();
            let on = (0..self.core.masters.nodes.len()).collect();
            if !self.core.enqueue(Job::Resync { resync, on }) {
                tracing::warn!(lock = %name, "runtime gone: an interrupted operation will expire with its lease");
            }
        }
    }
}
