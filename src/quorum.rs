//! The one acquisition algorithm, over N nodes (N = 1 for a plain [`LockClient`](crate::LockClient)):
//! the Redlock rounds of the distlock page.
//!
//! 1. Note the start on the monotonic clock and send the request to every node at once, each bounded
//!    by the node timeout.
//! 2. Granted as soon as a majority (`N / 2 + 1`) granted and the lease still has validity left:
//!    `validity = lease - elapsed - drift`. Slower nodes are not waited for; a grant that reaches them
//!    later is removed by the release, which goes to every node.
//! 3. Otherwise undo on every node that did not refuse (also those that did not answer).
//!
//! Fencing over several nodes: each granting node draws its own next token; the largest of the
//! majority is the token, and it is written back to a majority before the guard is handed out. Any
//! later majority overlaps that one, so it draws a larger token.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::core::Core;
use crate::keys::LockKeys;
use crate::node::{Released, Vote};
use crate::Error;

/// The outcome of one acquisition round.
pub(crate) enum Round {
    /// Held on a majority until `deadline`. `continuing` tells, for a reentrant acquisition, that a
    /// majority still had the owner's earlier hold.
    Granted {
        token: u64,
        continuing: bool,
        deadline: Instant,
    },
    /// Held by someone else (`ttl`: the shortest time it is still held for), or a split vote.
    /// `stragglers`: some masters did not answer, and may still grant; they need an undo.
    Refused {
        ttl: Option<Duration>,
        split: bool,
        stragglers: bool,
    },
}

/// One round: asks every node to set `owner`'s count on `keys` to `target` with `lease`.
pub(crate) async fn acquire(
    core: &Core,
    keys: &LockKeys,
    owner: &Arc<str>,
    lease: Duration,
    target: u32,
) -> Result<Round, Error> {
    let nodes = core.nodes.len();
    let needed = core.needed();
    let timeout = core.quorum.node_timeout;
    let start = Instant::now();

    // Masters that may have forgotten locks they granted (restarted) do not vote.
    let quarantine = core.quarantine();
    let voters: Vec<bool> = core
        .nodes
        .iter()
        .map(|node| quarantine.is_none_or(|q| node.may_vote(q)))
        .collect();
    let mut pending: FuturesUnordered<_> = core
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| voters[*i])
        .map(|(i, node)| async move {
            let vote = tokio::time::timeout(timeout, node.acquire(keys, owner, lease, target)).await;
            (i, vote.unwrap_or(Err(Error::Timeout(timeout))))
        })
        .collect();
    if voters.iter().any(|v| !v) {
        tracing::debug!(lock = %keys.name, voters = voters.iter().filter(|v| **v).count(), "restarted masters sit out");
    }
    let mut refused = vec![false; nodes];
    let mut granted: Vec<(usize, u64, u64)> = Vec::new();
    let mut answered = 0;
    let mut ttl: Option<Duration> = None;
    let mut error: Option<Error> = None;
    while let Some((i, vote)) = pending.next().await {
        match vote {
            Ok(Vote::Granted { prev, token }) => {
                answered += 1;
                granted.push((i, prev, token));
                if granted.len() >= needed {
                    break;
                }
            }
            Ok(Vote::Busy { ttl: left }) => {
                answered += 1;
                refused[i] = true;
                ttl = match (ttl, left) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                if refused.iter().filter(|r| **r).count() > nodes - needed {
                    break;
                }
            }
            Err(err) => {
                if matches!(err, Error::WrongType(_)) {
                    answered += 1;
                    refused[i] = true;
                }
                tracing::debug!(lock = %keys.name, node = %core.nodes[i].server, %err, "acquire request failed");
                if error.is_none() || matches!(err, Error::WrongType(_)) {
                    error = Some(err);
                }
            }
        }
    }
    // The rest have been sent; dropping them stops only the waiting.
    drop(pending);

    if granted.len() >= needed {
        let mut token = granted.iter().map(|g| g.2).max().unwrap_or(0);
        let fenced = target > 1 || nodes == 1 || raise_fence(core, keys, &granted, token).await >= needed;
        if !fenced {
            token = 0;
        }
        let deadline = start + lease.saturating_sub(core.quorum.drift(lease));
        if fenced && deadline > Instant::now() {
            let continuing = granted.iter().filter(|g| g.1 > 0).count() >= needed;
            return Ok(Round::Granted {
                token,
                continuing,
                deadline,
            });
        }
        tracing::debug!(lock = %keys.name, "granted too late or not fenced on a majority; undoing");
    }

    // Undo at once where it was granted. Where the outcome is unknown (no answer in time), the undo
    // is the caller's, in the background (`stragglers`), so that a slow master does not hold up
    // the caller a second time.
    let undo = granted.iter().map(|(i, _, _)| {
        let node = &core.nodes[*i];
        async move { tokio::time::timeout(timeout, node.release(keys, owner, target - 1)).await }
    });
    futures::future::join_all(undo).await;
    let decided = granted.len() + refused.iter().filter(|r| **r).count();
    let stragglers = decided < voters.iter().filter(|v| **v).count();

    if let Some(err @ Error::WrongType(_)) = error {
        return Err(err);
    }
    if answered < needed {
        return Err(match error {
            Some(err) if nodes == 1 => err,
            _ => Error::Quorum {
                granted: granted.len(),
                answered,
                needed,
                nodes,
            },
        });
    }
    Ok(Round::Refused {
        ttl,
        split: !granted.is_empty(),
        stragglers,
    })
}

/// Writes `token` back to the granting nodes; returns on how many it landed.
async fn raise_fence(core: &Core, keys: &LockKeys, granted: &[(usize, u64, u64)], token: u64) -> usize {
    let timeout = core.quorum.node_timeout;
    let raises = granted.iter().map(|(i, _, _)| {
        let node = &core.nodes[*i];
        async move {
            matches!(
                tokio::time::timeout(timeout, node.raise_fence(keys, token)).await,
                Ok(Ok(()))
            )
        }
    });
    futures::future::join_all(raises)
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count()
}

/// Sets `owner`'s count on `keys` to `target` on every node (0 releases). `Ok(false)` when a majority
/// said the owner did not hold it; an error only when no node answered.
pub(crate) async fn release(
    core: &Core,
    keys: &LockKeys,
    owner: &Arc<str>,
    target: u32,
) -> Result<bool, Error> {
    let timeout = core.quorum.node_timeout;
    let requests = core.nodes.iter().map(|node| async move {
        tokio::time::timeout(timeout, node.release(keys, owner, target))
            .await
            .unwrap_or(Err(Error::Timeout(timeout)))
    });
    let mut held = 0;
    let mut not_held = 0;
    let mut error = None;
    for outcome in futures::future::join_all(requests).await {
        match outcome {
            Ok(Released::NotHeld) => not_held += 1,
            Ok(Released::StillHeld | Released::Freed) => held += 1,
            Err(err) => error = Some(err),
        }
    }
    if not_held >= core.needed() {
        return Ok(false);
    }
    match error {
        Some(err) if held + not_held == 0 => Err(err),
        _ => Ok(true),
    }
}

/// How many of `nodes` masters make a majority.
pub(crate) fn majority(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// A random delay in `[base / 2, base * 3 / 2)`, so that clients that split a vote do not meet again.
pub(crate) fn jitter(base: Duration) -> Duration {
    // The low 62 bits of a v4 uuid are random (the variant takes the two above them).
    let bits = uuid::Uuid::new_v4().as_u128() as u64 & ((1 << 62) - 1);
    let random = bits as f64 / (1u64 << 62) as f64;
    base / 2 + base.mul_f64(random)
}
