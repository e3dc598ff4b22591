//! The engine's attempt at a whole set of locks in one script call (`scripts/lock_all.lua`): all or
//! none, atomically, where every name lives on one server. Each name stays a hold of its own (its
//! guard, renewal and release are a single lock's); only the acquisition is shared.

use fred::bytes_utils::Str;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;

use crate::engine::core::{Ask, Core, UndoOnDrop};
use crate::engine::hold::{Grant, Hold, LeaseMode};
use crate::engine::quorum;
use crate::redis::keys::LockKeys;
use crate::redis::scripts::scripts;
use crate::redis::topology::Kind;
use crate::Error;

/// A hold of the set, with its operations taken.
type Opened = (Arc<Hold>, tokio::sync::OwnedMutexGuard<()>);

/// The outcome of one attempt at a set.
pub(crate) enum SetAttempt {
    /// Every name granted, in the order asked.
    Granted(Vec<Grant>),
    /// The name at index `at` is held by another owner (for about `ttl` more).
    Refused { ttl: Option<Duration>, at: usize },
}

impl Core {
    /// Whether a set can be taken in one script call: one master that is not a cluster (whose names
    /// may live in different slots) and whose writes are not synced to replicas (acknowledging and
    /// undoing those is the batcher's work).
    pub(crate) fn atomic_sets(&self) -> bool {
        let node = &self.masters.nodes[0];
        self.masters.single()
            && node.link.topology.kind() != Kind::Cluster
            && node.link.sync_replicas().is_none()
    }

    /// One attempt at every lock of `keys` (sorted, without duplicates) for `owner`, all or none, in
    /// one script call; for a client where [`atomic_sets`](Core::atomic_sets) holds. Bounded as
    /// [`attempt`](Core::attempt) is: a call cut short is undone in the background.
    pub(crate) async fn attempt_all(
        self: &Arc<Self>,
        keys: &[Arc<LockKeys>],
        owner: &Str,
        mode: LeaseMode,
        until: Option<Instant>,
    ) -> Result<SetAttempt, Error> {
        loop {
            if self.is_closed() {
                return Err(Error::Shutdown);
            }
            let holds = self.open_holds(keys, owner, until).await?;
            let start = Instant::now();
            let asks: Vec<Ask> = holds
                .iter()
                .map(|(hold, _)| self.ask(hold, owner, mode))
                .collect();
            let reply = self.call_lock_all(keys, &holds, &asks, start, until).await?;
            match reply.as_slice() {
                [0, ttl, at] => {
                    self.retire_all(&holds);
                    return Ok(SetAttempt::Refused {
                        ttl: (*ttl > 0).then(|| Duration::from_millis(*ttl as u64)),
                        at: (*at as usize).saturating_sub(1).min(keys.len() - 1),
                    });
                }
                [-3, i] => {
                    // A reentered name's hold ran out unnoticed: end it and try the set afresh.
                    let i = (*i as usize).saturating_sub(1).min(keys.len() - 1);
                    holds[i].0.mark_lost(
                        asks[i].gen,
                        "the lock was found released or taken when re-entering it",
                    );
                    let _ = quorum::release(&self.masters, &keys[i], &asks[i].field, 0).await;
                    self.retire_all(&holds);
                }
                [1, rest @ ..] if rest.len() == 2 * keys.len() => {
                    if let Some(grants) = self.grant_all(keys, &holds, &asks, rest, start, mode).await {
                        if let Some(soonest) = grants.iter().map(|g| g.hold.state.lock().deadline).min() {
                            self.watchdog.wake_for(soonest);
                        }
                        tracing::debug!(locks = keys.len(), owner = %owner, "lock set acquired");
                        return Ok(SetAttempt::Granted(grants));
                    }
                    if self.is_closed() {
                        return Err(Error::Shutdown);
                    }
                }
                other => {
                    return Err(Error::Redis(fred::error::Error::new(
                        fred::error::ErrorKind::Parse,
                        format!("unexpected reply to lock_all: {other:?}"),
                    )))
                }
            }
        }
    }

    /// Every hold's operations, in the set's order: another set waits in the same order.
    async fn open_holds(
        self: &Arc<Self>,
        keys: &[Arc<LockKeys>],
        owner: &Str,
        until: Option<Instant>,
    ) -> Result<Vec<Opened>, Error> {
        let mut holds = Vec::with_capacity(keys.len());
        for lock in keys {
            let held = self
                .within(until, self.open_hold(lock, owner))
                .await
                .ok_or(Error::Timeout(Duration::ZERO))??;
            holds.push(held);
        }
        Ok(holds)
    }

    /// The script call for the set, within the attempt's bound. An error leaves the outcome
    /// unknown: the undos (on drop) bring every hold in line. Not a refusal error (a key of another
    /// type): the script failed before it wrote anything.
    async fn call_lock_all(
        self: &Arc<Self>,
        keys: &[Arc<LockKeys>],
        holds: &[Opened],
        asks: &[Ask],
        start: Instant,
        until: Option<Instant>,
    ) -> Result<Vec<i64>, Error> {
        let bound = until.map_or(start + self.masters.attempt_bound(), |until| {
            until.min(start + self.masters.attempt_bound())
        });
        let mut undos: Vec<UndoOnDrop> = holds
            .iter()
            .zip(asks)
            .map(|((hold, _), ask)| UndoOnDrop {
                core: self,
                resync: Some(hold.resync(&ask.field, ask.gen)),
            })
            .collect();
        let names: Vec<&str> = keys.iter().flat_map(|k| [&*k.lock, &*k.fence]).collect();
        let mut args = Vec::with_capacity(asks.len() * 3);
        for ask in asks {
            args.extend([
                Value::from(ask.field.clone()),
                Value::from(i64::from(ask.target)),
                Value::from(ask.lease.as_millis().min(i64::MAX as u128) as i64),
            ]);
        }
        let call = self.masters.nodes[0].run_list(&scripts().lock_all, &names, args);
        let reply = self
            .within(Some(bound), call)
            .await
            .unwrap_or_else(|| Err(Error::Timeout(bound - start)));
        if reply.is_ok() || reply.as_ref().is_err_and(Error::is_refusal) {
            undos.iter_mut().for_each(|undo| undo.resync = None);
        }
        if reply.as_ref().is_err_and(Error::is_refusal) {
            self.retire_all(holds);
        }
        reply
    }

    /// Records a granted set's holds from the script's reply (`rest`: each name's count and
    /// token); `None` if one could not be recorded, after giving back what was (all or none).
    async fn grant_all(
        self: &Arc<Self>,
        keys: &[Arc<LockKeys>],
        holds: &[Opened],
        asks: &[Ask],
        rest: &[i64],
        start: Instant,
        mode: LeaseMode,
    ) -> Option<Vec<Grant>> {
        let mut grants = Vec::with_capacity(keys.len());
        let mut complete = true;
        for (i, ((hold, _), ask)) in holds.iter().zip(asks).enumerate() {
            let token = rest[2 * i + 1].max(0) as u64;
            let deadline = start + ask.lease.saturating_sub(self.masters.config.drift(ask.lease));
            match self.record_grant(hold, ask, token, deadline, mode, false) {
                Some(grant) => grants.push(grant),
                None => {
                    // A reentered hold lost while the call ran (its cleanup takes this level too),
                    // or the client shut down: a fresh grant goes back.
                    complete = false;
                    if ask.target == 1 {
                        let _ = quorum::release(&self.masters, &keys[i], &ask.field, 0).await;
                        self.holds.retire_if_idle(hold);
                    }
                }
            }
        }
        if complete {
            return Some(grants);
        }
        // All or none: what was granted goes back, as a dropped guard's level does.
        for grant in grants {
            self.give_back(grant);
        }
        None
    }

    /// Lets go of the holds of an attempt that granted nothing.
    fn retire_all(&self, holds: &[Opened]) {
        for (hold, _) in holds {
            self.holds.retire_if_idle(hold);
        }
    }
}
