//! Renewals: a node's holds renewed (or checked) in few script calls, one per slot and lease.

use fred::bytes::Bytes;
use std::ops::Range;
use std::time::Duration;

use fred::types::{Key, Value};

use super::{millis, unexpected, Node, RENEW_BATCH};
use crate::redis::link::Reply;
use crate::redis::scripts::scripts;
use crate::redis::topology::Kind;
use crate::Error;

/// The most renewal calls of one node in flight at once (one per slot on a cluster): well under
/// fred's command buffer (`MAX_BUFFERED`).
const RENEW_WAVE: usize = 1024;

/// One hold to renew: where its lock key and its Redis field are in the round's bytes, and the
/// lease to set (zero: only check that it is held).
pub(crate) struct RenewItem {
    pub(crate) key: Range<usize>,
    pub(crate) field: Range<usize>,
    pub(crate) lease: Duration,
}

/// What one node said of one hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Still held (and renewed, if it had a lease to set).
    Held,
    /// No longer held: nothing changed.
    Gone,
    /// Its call failed: unknown.
    Failed,
}

/// A node's answer to a round: one [`Renewed`] per hold, a byte each (with 100,000 holds an
/// error per hold made megabytes to allocate every round), and the error of a failed call.
pub(crate) struct RenewReply {
    pub(crate) flags: Vec<Renewed>,
    pub(crate) error: Option<Error>,
}

impl Node {
    /// Renews (lease > 0) or checks (lease 0) `locks`, whose keys and fields are in `bytes`; one
    /// flag per hold. One script call per slot and lease (and per [`RENEW_BATCH`] holds), all sent
    /// at once: the lease goes once per call, and a call answers only the holds that are gone. With
    /// synced writes, a call that too few replicas acknowledged fails for its holds: a failed
    /// renewal, not a loss.
    pub(crate) async fn renew(&self, bytes: &Bytes, locks: &[RenewItem]) -> RenewReply {
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
                    .map(|&i| Key::from(bytes.slice(locks[i].key.clone())))
                    .collect();
                let mut args = Vec::with_capacity(chunk.len() + 1);
                args.push(millis(locks[chunk[0]].lease));
                // Slices of the round's one buffer: no copy, and no reference to the hold's own.
                args.extend(
                    chunk
                        .iter()
                        .map(|&i| Value::Bytes(bytes.slice(locks[i].field.clone()))),
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
        let mut out = RenewReply {
            flags: vec![Renewed::Held; locks.len()],
            error: None,
        };
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
                        out.flags[chunk[at as usize - 1]] = Renewed::Gone;
                    }
                }
                Err(err) => {
                    for &i in chunk {
                        out.flags[i] = Renewed::Failed;
                    }
                    out.error = Some(err);
                }
            }
        }
        out
    }

    /// The holds of [`renew`](Self::renew) (their positions) grouped by slot, then by lease.
    fn renew_groups(&self, bytes: &Bytes, locks: &[RenewItem]) -> Vec<Vec<usize>> {
        if self.link.topology.kind() != Kind::Cluster {
            // One slot: no key is looked at.
            return by_lease(0..locks.len(), locks);
        }
        // Keys are copied from `Str`s, so they are UTF-8 (a key that were not would only be
        // grouped in slot 0, and its call refused by the server).
        let keyed = (0..locks.len()).map(|i| {
            let key = std::str::from_utf8(&bytes[locks[i].key.clone()]).unwrap_or_default();
            (i, key)
        });
        let slots = self.link.topology.by_slot(keyed, |(_, key)| key);
        slots
            .into_iter()
            .flat_map(|slot| by_lease(slot.into_iter().map(|(i, _)| i), locks))
            .collect()
    }
}

/// `positions` (of `locks`) grouped by lease: every watchdog hold has the same lease, so most
/// make one group.
fn by_lease(positions: impl Iterator<Item = usize>, locks: &[RenewItem]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Duration, Vec<usize>)> = Vec::new();
    for i in positions {
        let lease = locks[i].lease;
        match groups.iter_mut().find(|(of, _)| *of == lease) {
            Some((_, group)) => group.push(i),
            None => groups.push((lease, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}
