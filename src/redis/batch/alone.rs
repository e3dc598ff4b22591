//! One operation sent by itself, where writes are not synced: a plain lock's lone release as an
//! `HDEL`, anything else as a call of the batch script without the lists of a round of many.

use fred::bytes_utils::Str;
use std::future::Future;

use fred::types::{Key, Value};
use futures::future::Either;

use super::decode::{cut, decode, malformed};
use super::encode::{batch_script, encode_alone};
use super::{Ints, Op, Slot};
use crate::redis::link::NodeClient;
use crate::Error;

/// One operation sent by itself where writes are not synced (a direct round, or a queued round
/// of one): a plain lock's lone release as an `HDEL` ([`release_alone`]), anything else as one
/// call of the batch script, without the lists of a round of many. A direct round's `slot` is
/// held to the end (a queued round's is held by its sender). The slot goes in, not around: a
/// block around this future would keep it twice.
pub(super) fn alone(
    link: &NodeClient,
    op: Op,
    slot: Option<Slot>,
) -> impl Future<Output = Result<Ints, Error>> + Send + '_ {
    crate::util::telemetry::batch(1);
    match op.into_lone_release() {
        Ok((lock, owner, channel)) => Either::Left(async move {
            let _slot = slot;
            // Boxed: fred's command future (about 7 KB) held inline would make every round's
            // future, and every batched operation's above it, that much larger, acquisitions
            // included. At 256 tasks that cost 2-3 µs of client CPU per cycle (the
            // bench's `--quick --only uncontended` alternated twice: 12.4-13.3 µs against
            // 15.3-15.8).
            Box::pin(release_alone(link, lock, owner, channel)).await
        }),
        Err(op) => Either::Right(call_alone(link, op, slot)),
    }
}

/// [`alone`]'s call of the batch script (see [`encode_alone`]).
async fn call_alone(link: &NodeClient, op: Op, slot: Option<Slot>) -> Result<Ints, Error> {
    let _slot = slot;
    let call = encode_alone(&op, link.topology.publish());
    // Boxed, as in `alone`.
    let reply = Box::pin(link.call_one::<Value>(batch_script(call.plain), call.keys, call.args)).await;
    match reply {
        Ok(Value::Array(flat)) => {
            let mut rest = flat.as_slice();
            let reply = cut(&mut rest, &op).ok_or_else(|| malformed(1))?;
            if !rest.is_empty() {
                return Err(malformed(1));
            }
            reply
        }
        // A fresh grant's token alone, not in a list (see `scripts/batch.lua`).
        Ok(token) => decode(&op, std::slice::from_ref(&token)),
        // A lone operation runs without a pcall: its error is the call's (see `round::answer`).
        Err(err) => Err(Error::from_redis(err, op.lock())),
    }
}

/// A plain lock's release to count 0 that goes alone (a round of one, not synced): `HDEL` of the
/// hold's field and its mark (see `scripts/release.lua`), no script. An `FCALL` with its Lua costs
/// the server more than the command it runs: an idle server spent 35 µs on the release's `FCALL`
/// against 22 on this `HDEL` (one request a millisecond). The same reply as the
/// script's. Two fields removed means a waiter marked the hold: the release message follows, a
/// request of its own (so a marked hold's waiters hear it a round trip later than from the script,
/// and its subscribers' count is unknown if the message fails).
pub(super) async fn release_alone(
    link: &NodeClient,
    lock: Str,
    owner: Str,
    channel: Str,
) -> Result<Ints, Error> {
    use fred::interfaces::{HashesInterface, PubsubInterface};
    let mark = crate::redis::keys::joined(&[&owner, "~"]);
    crate::util::telemetry::redis_call("release");
    let removed: i64 = link
        .batch
        .hdel(Key::from(&lock), vec![Key::from(owner), Key::from(mark)])
        .await
        .map_err(|err| Error::from_redis(err, &lock))?;
    match removed {
        0 => return Ok([0].into_iter().collect()),
        1 => return Ok([2, 0].into_iter().collect()),
        _ => {}
    }
    crate::util::telemetry::redis_call("release");
    let heard: Result<i64, _> = if link.topology.sharded() {
        link.batch.spublish(channel, "1").await
    } else {
        link.batch.publish(channel, "1").await
    };
    Ok(match heard {
        Ok(heard) => [2, heard].into_iter().collect(),
        Err(err) => {
            tracing::debug!(lock = %lock, %err, "a release's message failed");
            [2].into_iter().collect()
        }
    })
}
