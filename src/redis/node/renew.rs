//! Renewals: a node's holds renewed (or checked) in few script calls, one per slot and lease.

use fred::bytes::Bytes;
use std::ops::Range;
use std::time::Duration;

use fred::types::{Key, Value};

use super::{millis, unexpected, Node, RENEW_BATCH};
use crate::redis::link::Reply;
use crate::redis::scripts::scripts;
use crate::Error;

/// The most renewal calls of one node in flight at once (one per slot on a cluster): well under
/// fred's command buffer (`MAX_BUFFERED`).
const RENEW_WAVE: usize = 1024;

impl Node {
    /// Renews (lease > 0) or checks (lease 0) holds, given as where the lock key and the hold's
    /// field are in `bytes`, and the lease; one flag per hold, true if still held. One script call
    /// per slot and lease (and per [`RENEW_BATCH`] holds), all sent at once: the lease goes once per
    /// call, and a call answers only the holds that are gone. With synced writes, a call that too
    /// few replicas acknowledged fails for its holds: a failed renewal, not a loss.
    pub(crate) async fn renew(
        &self,
        bytes: &Bytes,
        locks: &[(Range<usize>, Range<usize>, Duration)],
    ) -> Vec<Result<bool, Error>> {
        let groups = self.renew_groups(bytes, locks);
        let chunks: Vec<&[usize]> = groups
            .iter()
            .flat_map(|group| group.chunks(RENEW_BATCH))
            .collect();
        let calls: Vec<(Vec<Key>, Vec<Value>)> = chunks
            .iter()
            .map(|chunk| {
                let keys = chunk
                    .iter()
                    .map(|&i| Key::from(bytes.slice(locks[i].0.clone())))
                    .collect();
                let mut args = Vec::with_capacity(chunk.len() + 1);
                args.push(millis(locks[chunk[0]].2));
                // Slices of the round's one buffer: no copy, and no reference to the hold's own.
                args.extend(
                    chunk
                        .iter()
                        .map(|&i| Value::Bytes(bytes.slice(locks[i].1.clone()))),
                );
                (keys, args)
            })
            .collect();
        // In waves: fred fails at once what does not fit its command buffer, and on a cluster a
        // round may hold thousands of slots. Each wave is bounded as one request.
        let mut replies: Vec<Result<Reply<Vec<i64>>, Error>> = Vec::with_capacity(calls.len());
        let mut calls = calls.into_iter().peekable();
        while calls.peek().is_some() {
            let wave: Vec<_> = calls.by_ref().take(RENEW_WAVE).collect();
            let size = wave.len();
            match self.bounded(self.scripts_synced(&scripts().renew, wave)).await {
                Ok(wave) => replies.extend(
                    wave.into_iter()
                        .map(|reply| reply.map_err(|err| self.link.redis_error(err))),
                ),
                Err(err) => replies.extend((0..size).map(|_| Err(err.clone()))),
            }
        }
        let mut out: Vec<Result<bool, Error>> = (0..locks.len()).map(|_| Ok(true)).collect();
        for (chunk, reply) in chunks.into_iter().zip(replies) {
            let gone = reply.and_then(|reply: Reply<Vec<i64>>| {
                self.link.check_acked(reply.acked)?;
                if reply.value.iter().any(|&at| at < 1 || at as usize > chunk.len()) {
                    return Err(unexpected("renew", &reply.value));
                }
                Ok(reply.value)
            });
            match gone {
                Ok(gone) => {
                    for at in gone {
                        out[chunk[at as usize - 1]] = Ok(false);
                    }
                }
                Err(err) => {
                    for &i in chunk {
                        out[i] = Err(err.clone());
                    }
                }
            }
        }
        out
    }

    /// The holds of [`renew`](Self::renew) (their positions) grouped by slot, then by lease.
    fn renew_groups(
        &self,
        bytes: &Bytes,
        locks: &[(Range<usize>, Range<usize>, Duration)],
    ) -> Vec<Vec<usize>> {
        // Keys are copied from `Str`s, so they are UTF-8 (a key that were not would only be
        // grouped in slot 0, and its call refused by the server).
        let keyed = locks.iter().enumerate().map(|(i, lock)| {
            let key = std::str::from_utf8(&bytes[lock.0.clone()]).unwrap_or_default();
            (i, lock, key)
        });
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for slot in self.link.topology.by_slot(keyed, |(_, _, key)| key) {
            // Every watchdog hold has the same lease: most slots make one group.
            let mut by_lease: Vec<(Duration, Vec<usize>)> = Vec::new();
            for (i, lock, _) in slot {
                match by_lease.iter_mut().find(|(lease, _)| *lease == lock.2) {
                    Some((_, group)) => group.push(i),
                    None => by_lease.push((lock.2, vec![i])),
                }
            }
            groups.extend(by_lease.into_iter().map(|(_, group)| group));
        }
        groups
    }
}
