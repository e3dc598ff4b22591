//! One acquisition round over the masters that may vote: the votes, their tally, the fence's
//! write-back, and the undo of a round that granted no majority.

use fred::bytes_utils::Str;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::redis::keys::LockKeys;
use crate::redis::node::Vote;
use crate::util::few::Few;
use crate::Error;

use super::Masters;

/// The outcome of one acquisition round.
pub(crate) enum Round {
    /// Held on a majority until `deadline`. For a reentrant acquisition, a majority still had the
    /// hold (`token` is then meaningless: the hold keeps its own).
    Granted { token: u64, deadline: Instant },
    /// Held by someone else (`ttl`: the shortest time it is still held for), or a split vote.
    /// `stragglers`: some masters did not answer, and may still grant; they need an undo.
    Refused {
        ttl: Option<Duration>,
        split: bool,
        stragglers: bool,
    },
    /// Reentrant acquisitions only: so many masters said the hold is not there (another owner holds
    /// the lock, or this hold is gone) that no majority can still back it. The hold is lost.
    Lost,
}

/// One round: asks every node to set the count of hold `field` on `keys` to `target` with `lease`.
///
/// A reentrant acquisition (`target > 1`) counts only the masters that still had the hold: a master
/// that lost it (restarted, or a key removed behind its back) grants it anew, but its vote shows
/// nothing about the hold. Such a round waits for a majority of those that had it, or until so many
/// said otherwise that none can come; anything in between is an error that leaves the hold alone.
pub(crate) async fn acquire(
    masters: &Masters,
    voters: &[bool],
    keys: &LockKeys,
    field: &Str,
    lease: Duration,
    target: u32,
) -> Result<Round, Error> {
    let needed = masters.needed();
    let reentry = target > 1;
    let start = Instant::now();
    let tally = vote(masters, voters, keys, field, lease, target).await;
    let deadline = start + lease.saturating_sub(masters.config.drift(lease));
    if reentry && tally.backing >= needed && deadline > Instant::now() {
        return Ok(Round::Granted { token: 0, deadline });
    }
    if !reentry && tally.granted.len() >= needed {
        let mut token = tally.granted.iter().map(|g| g.2).max().unwrap_or(0);
        // One master drew the token itself: nothing to write back. Of several, only those that
        // drew less (their counter was behind) need it; masters in step all drew the token.
        let fenced = masters.single() || raise_fence(masters, keys, &tally.granted, token).await >= needed;
        if !fenced {
            token = 0;
        }
        if fenced && deadline > Instant::now() {
            return Ok(Round::Granted { token, deadline });
        }
        tracing::debug!(lock = %keys.name, "granted too late or not fenced on a majority; undoing");
    }
    refuse(masters, voters, keys, field, target, tally).await
}

/// Asks every master that may vote, and tallies the answers until the round is decided.
async fn vote(
    masters: &Masters,
    voters: &[bool],
    keys: &LockKeys,
    field: &Str,
    lease: Duration,
    target: u32,
) -> Tally {
    let nodes = masters.nodes.len();
    let needed = masters.needed();
    // Several masters keep their fence counters in step, so that a round needs no write-back.
    let in_step = !masters.single();
    // Masters that may have forgotten locks they granted (restarted), or that repeat another one,
    // do not vote (`voters`).
    if voters.iter().any(|v| !v) {
        tracing::debug!(lock = %keys.name, voters = voters.iter().filter(|v| **v).count(), "restarted or repeated masters sit out");
    }
    let mut tally = Tally {
        reentry: target > 1,
        nodes,
        refused: 0,
        busy: Few::default(),
        granted: Few::default(),
        backing: 0,
        denied: 0,
        answered: 0,
        ttl: None,
        error: None,
    };
    let ask = |i: usize| {
        let node = &masters.nodes[i];
        async move { (i, node.acquire(keys, field, lease, target, in_step).await) }
    };
    let mut voting = (0..nodes).filter(|i| voters[*i]);
    match (voting.next(), voting.next()) {
        // One voter (a `LockClient`'s master): its request is awaited by itself, not through a
        // `FuturesUnordered` (two allocations more, and the request moved). Boxed, as there: the
        // node's future inline would nest every caller's future as deep as the whole request
        // (callers that await an acquisition a few levels down reached rustc's default limit).
        (Some(only), None) => {
            let (i, vote) = Box::pin(ask(only)).await;
            tally.add(masters, keys, i, vote);
        }
        (first, second) => {
            let mut pending: FuturesUnordered<_> =
                first.into_iter().chain(second).chain(voting).map(ask).collect();
            while let Some((i, vote)) = pending.next().await {
                tally.add(masters, keys, i, vote);
                if tally.decided(needed) {
                    break;
                }
            }
            // The rest have been sent; dropping them stops only the waiting.
        }
    }
    tally
}

/// A round that granted no majority: undone at once where it was granted (a re-entry goes back to
/// the level it had), and told as a refusal, a loss or an error. Where the outcome is unknown (no
/// answer in time), the undo is the caller's, in the background (`stragglers`), so that a slow
/// master does not hold up the caller a second time.
async fn refuse(
    masters: &Masters,
    voters: &[bool],
    keys: &LockKeys,
    field: &Str,
    target: u32,
    tally: Tally,
) -> Result<Round, Error> {
    let Tally {
        reentry,
        nodes,
        refused,
        busy,
        granted,
        backing,
        denied,
        answered,
        ttl,
        error,
    } = tally;
    let needed = masters.needed();
    if !masters.single() && tracing::enabled!(tracing::Level::DEBUG) {
        // Which masters said what: a waiter that stays refused while the lock looks free is
        // explained by this event alone.
        let names = |at: &[usize]| -> Vec<String> {
            at.iter().map(|i| masters.nodes[*i].server.to_string()).collect()
        };
        let granted_by: Vec<usize> = granted.iter().map(|g| g.0).collect();
        tracing::debug!(
            lock = %keys.name,
            granted = ?names(&granted_by),
            busy = ?names(&busy),
            answered,
            needed,
            ?ttl,
            error = ?error.as_ref().map(ToString::to_string),
            "quorum round refused; undoing its grants"
        );
    }
    let undo = granted
        .iter()
        .map(|(i, _, _)| masters.nodes[*i].undo_grant(keys, field, target - 1));
    futures::future::join_all(undo).await;
    let decided = granted.len() + refused;
    let stragglers = decided < voters.iter().filter(|v| **v).count();

    if reentry && denied > nodes - needed {
        return Ok(Round::Lost);
    }
    if let Some(err) = error.as_ref().filter(|err| err.is_refusal()) {
        return Err(err.clone());
    }
    if reentry && answered >= needed {
        return Err(Error::Timeout(masters.config.node_timeout));
    }
    if answered < needed || reentry {
        let quorum = Error::Quorum {
            granted: if reentry { backing } else { granted.len() },
            answered,
            needed,
            nodes,
        };
        return Err(masters.report(error, quorum));
    }
    Ok(Round::Refused {
        ttl,
        split: !granted.is_empty(),
        stragglers,
    })
}

/// The answers of one round so far.
struct Tally {
    /// The round is a re-entry (see [`acquire`]).
    reentry: bool,
    /// How many masters there are.
    nodes: usize,
    /// How many refused (another owner holds the lock, or a refusal error); each answers once.
    refused: usize,
    /// Masters that answered that another owner holds the lock (several masters only).
    busy: Few<usize>,
    /// Masters that granted: index, previous count, token.
    granted: Few<(usize, u64, u64)>,
    /// Re-entry: grants from masters that had the hold, and masters that said it is not there.
    backing: usize,
    denied: usize,
    answered: usize,
    /// The shortest time left of the lock where refused.
    ttl: Option<Duration>,
    error: Option<Error>,
}

impl Tally {
    /// Whether the answers so far decide the round: a majority backs it, or so many said otherwise
    /// that no majority can come.
    fn decided(&self, needed: usize) -> bool {
        let nodes = self.nodes;
        if self.reentry {
            self.backing >= needed || self.denied > nodes - needed
        } else {
            self.granted.len() >= needed || self.refused > nodes - needed
        }
    }

    fn add(&mut self, masters: &Masters, keys: &LockKeys, i: usize, vote: Result<Vote, Error>) {
        match vote {
            Ok(Vote::Granted { prev, token }) => {
                self.answered += 1;
                self.granted.push((i, prev, token));
                if self.reentry && prev > 0 {
                    self.backing += 1;
                } else if self.reentry {
                    self.denied += 1;
                }
            }
            Ok(Vote::Busy { ttl: left }) => {
                if !masters.single() {
                    self.busy.push(i);
                }
                self.answered += 1;
                self.refused += 1;
                self.denied += 1;
                self.ttl = match (self.ttl, left) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            Err(err) => {
                if err.is_refusal() {
                    self.answered += 1;
                    self.refused += 1;
                    self.denied += 1;
                }
                tracing::debug!(lock = %keys.name, node = %masters.nodes[i].server, %err, "acquire request failed");
                if self.error.is_none() || err.is_refusal() {
                    self.error = Some(err);
                }
            }
        }
    }
}

/// Draws the fencing token of the hold `field` of a plain lock (see `scripts/draw_token.lua`) on
/// every voting master at once: the largest token of a majority that has the hold, written back
/// where a master drew less, as an acquisition's is ([`raise_fence`]). `None`: so many masters
/// said the hold is not there that no majority can back it (lost).
pub(crate) async fn draw_token(
    masters: &Masters,
    voters: &[bool],
    keys: &LockKeys,
    field: &Str,
) -> Result<Option<u64>, Error> {
    let nodes = masters.nodes.len();
    let needed = masters.needed();
    let in_step = !masters.single();
    let mut pending: FuturesUnordered<_> = (0..nodes)
        .filter(|i| voters[*i])
        .map(|i| {
            let node = &masters.nodes[i];
            async move { (i, node.draw_token(keys, field, in_step).await) }
        })
        .collect();
    let mut drawn: Few<(usize, u64, u64)> = Few::default();
    let mut absent = 0;
    let mut error = None;
    while let Some((i, reply)) = pending.next().await {
        match reply {
            Ok(Some(token)) => drawn.push((i, 0, token)),
            Ok(None) => absent += 1,
            Err(err) => {
                tracing::debug!(lock = %keys.name, node = %masters.nodes[i].server, %err, "token request failed");
                error = Some(err);
            }
        }
        if drawn.len() >= needed || absent > nodes - needed {
            break;
        }
    }
    if drawn.len() >= needed {
        let token = drawn.iter().map(|d| d.2).max().unwrap_or(0);
        if masters.single() || raise_fence(masters, keys, &drawn, token).await >= needed {
            return Ok(Some(token));
        }
    }
    if absent > nodes - needed {
        return Ok(None);
    }
    let quorum = Error::Quorum {
        granted: drawn.len(),
        answered: drawn.len() + absent,
        needed,
        nodes,
    };
    Err(masters.report(error, quorum))
}

/// Writes `token` back to the granting nodes that drew less; returns how many granting nodes
/// have it now (no request at all when every one drew it).
async fn raise_fence(masters: &Masters, keys: &LockKeys, granted: &[(usize, u64, u64)], token: u64) -> usize {
    let drawn = granted.iter().filter(|g| g.2 == token).count();
    let raises = granted
        .iter()
        .filter(|g| g.2 < token)
        .map(|(i, _, _)| async move { masters.nodes[*i].raise_fence(keys, token).await.is_ok() });
    let raised = futures::future::join_all(raises)
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    drawn + raised
}
