//! The engine's attempt for semaphore permits: one script call that grants a holder its permits
//! with a lease of its own, returned as a [`Grant`] like a lock's, so that the watchdog renews it and
//! the releaser gives it back the same way (see `keys::LockKeys::of_permit_holder`).

use fred::bytes_utils::Str;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;

use crate::engine::core::{Core, UndoOnDrop};
use crate::engine::hold::{next_generation, Grant, Hold, Resync};
use crate::engine::quorum;
use crate::redis::keys::{LockKeys, SemaphoreKeys};
use crate::redis::scripts::scripts;
use crate::Error;

/// The outcome of one attempt at permits.
pub(crate) enum PermitAttempt {
    /// Granted, with this many permits still free.
    Granted { grant: Grant, free: u64 },
    /// Too few free (`free` are); the soonest a holder's lease runs out, if any has one.
    Refused { free: u64, soonest: Option<Duration> },
}

impl Core {
    /// One attempt at `n` of the `permits` of the semaphore `sem`, for the holder `holder` (unique
    /// to this acquisition), bounded by the node's bound and `until`. A call cut short is undone in
    /// the background (its grant, if it landed, is removed).
    pub(crate) async fn attempt_permits(
        self: &Arc<Self>,
        sem: &SemaphoreKeys,
        holder: &Str,
        permits: u64,
        n: u64,
        until: Option<Instant>,
    ) -> Result<PermitAttempt, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        let keys = Arc::new(LockKeys::of_permit_holder(sem, holder));
        let (hold, _ops) = self.open_hold(&keys, holder).await?;
        let gen = next_generation();
        let field: Str = format!("{holder}:{gen}").into();
        let lease = self.config.get_watchdog_timeout();
        let start = Instant::now();
        let args = vec![
            Value::from(permits as i64),
            Value::from(n as i64),
            Value::from(field.clone()),
            Value::from(lease.as_millis().min(i64::MAX as u128) as i64),
        ];
        let resync = hold.resync(&field, gen);
        let reply = self.call_permits(sem, &keys, &hold, resync, args, until).await?;
        let free = match reply.as_slice() {
            [1, free] => (*free).max(0) as u64,
            [0, free, soonest] => {
                self.holds.retire_if_idle(&hold);
                return Ok(PermitAttempt::Refused {
                    free: (*free).max(0) as u64,
                    soonest: (*soonest >= 0).then(|| Duration::from_millis(*soonest as u64)),
                });
            }
            [-1, stored] => {
                self.holds.retire_if_idle(&hold);
                return Err(Error::InvalidConfig(format!(
                    "semaphore {} has {stored} permits while some are held, not {permits}",
                    sem.name
                )));
            }
            other => {
                return Err(Error::Redis(fred::error::Error::new(
                    fred::error::ErrorKind::Parse,
                    format!("unexpected reply to a semaphore acquisition: {other:?}"),
                )))
            }
        };
        let deadline = start + lease.saturating_sub(self.masters.config.drift(lease));
        let granted = {
            let mut st = hold.state.lock();
            if self.is_closed() {
                None
            } else {
                hold.start(&mut st, gen, field.clone());
                st.lease = lease;
                st.watchdog = true;
                st.deadline = deadline;
                Some(Grant::of(&hold, &st))
            }
        };
        let Some(grant) = granted else {
            // Shut down meanwhile: given back.
            let _ = quorum::release(&self.masters, &keys, &field, 0).await;
            self.holds.retire_if_idle(&hold);
            return Err(Error::Shutdown);
        };
        self.watchdog.wake_for(deadline);
        tracing::debug!(semaphore = %sem.name, holder = %holder, n, "permits acquired");
        Ok(PermitAttempt::Granted { grant, free })
    }

    /// The acquisition's script call (`args`), bounded by `until`. An error leaves the outcome unknown: the
    /// undo (on drop) removes a grant that landed. Not a refusal error (a key of another type):
    /// the script failed before it wrote anything.
    async fn call_permits(
        self: &Arc<Self>,
        sem: &SemaphoreKeys,
        keys: &LockKeys,
        hold: &Arc<Hold>,
        resync: Resync,
        args: Vec<Value>,
        until: Option<Instant>,
    ) -> Result<Vec<i64>, Error> {
        let start = Instant::now();
        let mut undo = UndoOnDrop {
            core: self,
            resync: Some(resync),
        };
        let node = &self.masters.nodes[0];
        let both: [&str; 2] = [&sem.index, &keys.lock];
        // On the undo's connection: an undo must not overtake the call it undoes.
        let call = node.run_list_undoable(&scripts().semaphore_acquire, &both, args);
        let reply = match until {
            Some(until) => tokio::time::timeout_at(until, call)
                .await
                .unwrap_or(Err(Error::Timeout(until.saturating_duration_since(start)))),
            None => call.await,
        };
        match reply {
            Err(err) if err.is_refusal() => {
                undo.resync = None;
                self.holds.retire_if_idle(hold);
                Err(err)
            }
            Err(err) => Err(err),
            Ok(reply) => {
                undo.resync = None;
                Ok(reply)
            }
        }
    }
}
