//! The rounds: a batch's operations sent as one call of the batch script per slot, and each
//! caller answered; a round of one goes by itself (see `alone`).

use std::future::Future;
use std::sync::Arc;

use fred::types::Value;
use futures::future::Either;
use tokio::sync::oneshot;

use super::alone::alone;
use super::decode::split;
use super::encode::{batch_script, encode, Call};
use super::runs::encode_runs;
use super::undo::undo_unsynced;
use super::{Ints, Op, Reply, Slot};
use crate::redis::link::NodeClient;
use crate::Error;

/// A round of one operation, in its caller's task, its `slot` taken: no list of calls, no channel
/// for the reply. With synced writes, a round as any other (its `WAIT` and undo are there).
///
/// Which future is decided here, and each holds only what it needs: one async fn over them would
/// keep the operation twice and a synced round's state inline, and a batched operation's future
/// above 1,024 bytes misses glibc's thread cache, which took about 500 instructions more per box
/// (callgrind).
pub(super) fn direct(
    link: &Arc<NodeClient>,
    op: Op,
    slot: Slot,
) -> impl Future<Output = Result<Ints, Error>> + Send + '_ {
    if link.sync.is_some() {
        return Either::Left(async move {
            let _slot = slot;
            let (reply, rx) = oneshot::channel();
            Box::pin(round(link.clone(), vec![(op, reply)])).await;
            rx.await.unwrap_or(Err(Error::Shutdown))
        });
    }
    Either::Right(alone(link, op, Some(slot)))
}

/// One round: the batch split by slot, one call per slot, all at once (in queue order).
pub(super) async fn round(link: Arc<NodeClient>, mut batch: Vec<(Op, Reply)>) {
    if let ([_], None) = (batch.as_slice(), &link.sync) {
        if let Some((op, tx)) = batch.pop() {
            let _ = tx.send(alone(&link, op, None).await);
            return;
        }
    }
    let mut groups = link.topology.by_slot(batch, |(op, _)| op.lock());
    for group in &groups {
        crate::util::telemetry::batch(group.len());
    }
    let publish = link.topology.publish();
    let calls: Vec<Call> = groups
        .iter_mut()
        .map(|group| {
            encode_runs(group, publish).unwrap_or_else(|| encode(group.iter().map(|(op, _)| op), publish))
        })
        .collect();
    // One script for the round: the plain one only if every call can take it.
    let script = batch_script(calls.iter().all(|call| call.plain));
    let calls = calls.into_iter().map(|call| (call.keys, call.args)).collect();
    let results = link.call_many::<Vec<Value>>(script, calls).await;
    for (group, result) in groups.into_iter().zip(results) {
        answer(&link, group, result).await;
    }
}

/// Hands each operation of one call its reply.
async fn answer(
    link: &NodeClient,
    mut batch: Vec<(Op, Reply)>,
    result: Result<crate::redis::link::Reply<Vec<Value>>, fred::error::Error>,
) {
    let result = result.map(|reply| (split(&reply.value, &batch), reply.acked));
    match result {
        Ok((Ok(mut replies), acked)) => {
            if let Err(short) = link.check_acked(acked) {
                // Boxed: only synced writes come here, and a script call held inline would make
                // every batched operation's future as large as fred's request (about 7 KB).
                Box::pin(undo_unsynced(link, &batch, &mut replies, short)).await;
            }
            for ((_, tx), reply) in batch.drain(..).zip(replies) {
                let _ = tx.send(reply);
            }
        }
        Ok((Err(err), _)) => {
            for (_, reply) in batch.drain(..) {
                let _ = reply.send(Err(err.clone()));
            }
        }
        Err(err) => {
            // A lone operation runs without a pcall: its error (a key of another type) is the
            // call's (see `scripts/batch.lua`).
            for (op, reply) in batch.drain(..) {
                let _ = reply.send(Err(Error::from_redis(err.clone(), op.lock())));
            }
        }
    }
}
