//! A node's acquisitions, releases and transfers: operations of the batch script, sent through
//! the node's batcher, and made again while they did not run.

use fred::bytes_utils::Str;
use std::time::Duration;

use tokio::time::Instant;

use super::{unexpected, Handed, Node, Released, Vote};
use crate::redis::batch::{Announce, Granted, Ints, Op};
use crate::redis::keys::{Kind, LockKeys};
use crate::redis::link::RetryPause;
use crate::redis::scripts::not_run;
use crate::Error;

impl Node {
    /// One acquisition (through the node's batcher): see `scripts/acquire.lua`.
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        owner: &Str,
        lease: Duration,
        target: u32,
        in_step: bool,
    ) -> Result<Vote, Error> {
        let op = || Op::Acquire {
            lock: keys.lock.clone(),
            fence: keys.fence.clone(),
            channel: keys.channel.clone(),
            owner: owner.clone(),
            lease_ms: lease.as_millis().min(i64::MAX as u128) as i64,
            target: i64::from(target),
            in_step,
            kind: keys.kind.clone(),
        };
        let reply = self.run_batched(op).await?;
        match reply.as_slice() {
            [1, prev, token] => Ok(Vote::Granted {
                prev: *prev.max(&0) as u64,
                token: *token.max(&0) as u64,
            }),
            [0, ttl] => Ok(Vote::Busy {
                ttl: (*ttl > 0).then(|| Duration::from_millis(*ttl as u64)),
            }),
            [-2] => Err(Error::Upgrade(keys.name.to_string())),
            other => Err(unexpected("acquire", other)),
        }
    }

    /// Sets the owner's count to `target` (through the node's batcher): see `scripts/release.lua`.
    pub(crate) async fn release(&self, keys: &LockKeys, owner: &Str, target: u32) -> Result<Released, Error> {
        // Waiters of this client may wait without a mark (held back while another owner of this
        // client holds the lock, see `Handoffs::hold_back`): for them, a plain lock's release is
        // announced (the other kinds' always are).
        let always =
            target == 0 && matches!(keys.kind, Kind::Plain) && self.waiters.waited_on(keys.wait_channel());
        let announce = if always {
            Announce::Always
        } else {
            Announce::IfMarked
        };
        self.release_with(keys, owner, target, announce).await
    }

    /// [`release`](Node::release) of a grant that a refused round of a quorum made on this master
    /// (see `quorum::acquire`): announced only where a waiter marked it, as an undo. It never was a
    /// hold, so no waiter of this client was held back behind it; announced to them, it woke a
    /// waiter whose own attempt then made such a grant and its undo woke the next, for as long as
    /// the lock was held on a bare majority. A waiter woken by an undo waits out a rate limit
    /// before it tries (see `lock::acquire`); one woken by a holder's release tries at once.
    pub(crate) async fn undo_grant(
        &self,
        keys: &LockKeys,
        owner: &Str,
        target: u32,
    ) -> Result<Released, Error> {
        self.release_with(keys, owner, target, Announce::Undo).await
    }

    async fn release_with(
        &self,
        keys: &LockKeys,
        owner: &Str,
        target: u32,
        announce: Announce,
    ) -> Result<Released, Error> {
        let op = || Op::release(keys, owner, i64::from(target), announce);
        match self.run_batched(op).await?.as_slice() {
            [0] => Ok(Released::NotHeld),
            [1] => Ok(Released::StillHeld),
            [2] => Ok(Released::Freed { heard: None }),
            [2, heard] => Ok(Released::Freed {
                heard: Some((*heard).clamp(0, i64::from(u32::MAX)) as u32),
            }),
            other => Err(unexpected("release", other)),
        }
    }

    /// Hands a plain lock from the hold `from` to a new hold `to` with `lease` (through the node's
    /// batcher): with a token drawn by the call (`scripts/transfer.lua`), or with the token
    /// `granted` that the client gave `to` already (`scripts/transfer_granted.lua`).
    pub(crate) async fn transfer(
        &self,
        keys: &LockKeys,
        from: &Str,
        to: &Str,
        lease: Duration,
        granted: Option<Granted>,
    ) -> Result<Handed, Error> {
        let op = || Op::Transfer {
            lock: keys.lock.clone(),
            fence: keys.fence.clone(),
            channel: keys.channel.clone(),
            from: from.clone(),
            to: to.clone(),
            lease_ms: lease.as_millis().min(i64::MAX as u128) as i64,
            granted,
        };
        match (granted, self.run_batched(op).await?.as_slice()) {
            (Some(granted), [released @ (0 | 1), handed @ (0 | 1)]) => Ok(Handed {
                released: *released == 1,
                token: (*handed == 1).then_some(granted.token),
            }),
            (None, [released @ (0 | 1), 1, _, token]) => Ok(Handed {
                released: *released == 1,
                token: Some(*token.max(&0) as u64),
            }),
            (None, [released @ (0 | 1), 0, _]) => Ok(Handed {
                released: *released == 1,
                token: None,
            }),
            (_, other) => Err(unexpected("transfer", other)),
        }
    }

    /// Runs one operation through the batcher. A call that did not run (the script cache was empty,
    /// and the script is loaded again by then; or a cluster redirected it, and fred knows the new
    /// owner by then) is made again, as a new operation queued behind whatever was queued
    /// meanwhile, while the caller still waits for it (so it never lands after the caller's next
    /// operation on the same hold). Within the same bound as the first try.
    async fn run_batched(&self, op: impl Fn() -> Op) -> Result<Ints, Error> {
        let run = async {
            let mut pause = RetryPause::new();
            loop {
                match self.batcher.run(op()).await {
                    Err(Error::Redis(err)) if not_run(&err) => pause.wait().await,
                    other => return other,
                }
            }
        };
        // Bounded as a whole, the wait for a free call slot included; an operation whose caller
        // left is never sent (see the batcher).
        let bound = self.link.bound();
        match self.link.deadlines.within(Instant::now() + bound, run).await {
            Some(Err(Error::Redis(err))) => Err(self.link.redis_error(err)),
            Some(outcome) => outcome,
            None => Err(Error::Timeout(bound)),
        }
    }
}
