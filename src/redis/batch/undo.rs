//! The undo path of synced writes: grants that too few replicas acknowledged are set back before
//! their callers hear [`Error::ReplicaSync`].

use fred::types::Value;

use super::encode::{batch_script, encode};
use super::{Announce, Ints, Op, Reply};
use crate::redis::link::NodeClient;
use crate::Error;

/// Too few replicas acknowledged a synced call: its grants are set back to the count they had
/// (`prev`), on the same connection and so after them, and their callers get `short`.
pub(super) async fn undo_unsynced(
    link: &NodeClient,
    batch: &[(Op, Reply)],
    replies: &mut [Result<Ints, Error>],
    short: Error,
) {
    let mut undos = Vec::new();
    for ((op, _), reply) in batch.iter().zip(replies.iter_mut()) {
        let Op::Acquire {
            lock,
            owner,
            channel,
            kind,
            ..
        } = op
        else {
            continue;
        };
        // Only grants: a refusal changed nothing, and says what it says.
        if let Ok([1, prev, _]) = reply.as_deref() {
            undos.push(Op::Release {
                lock: lock.clone(),
                owner: owner.clone(),
                target: (*prev).max(0),
                channel: channel.clone(),
                kind: kind.clone(),
                // A waiter may have been refused in between, and marked nothing it could see.
                announce: Announce::Always,
            });
            *reply = Err(short.clone());
        }
    }
    if undos.is_empty() {
        return;
    }
    let call = encode(undos.iter(), link.topology.publish());
    if let Err(err) = link
        .call_unwaited::<Vec<Value>>(batch_script(call.plain), call.keys, call.args)
        .await
    {
        // The caller's background undo (it got an error) sets these holds right once it can.
        tracing::warn!(%err, "undoing grants that replicas did not acknowledge failed");
    }
}
