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
//! majority is the token, and a majority must have it as its counter before the guard is handed out.
//! Any later majority overlaps that one, so it draws a larger token. The masters keep their counters
//! in step (`scripts/acquire.lua`, `in_step`), so in the steady state every granting master drew the
//! same token and nothing is written back: one round trip. Only masters that drew less (a counter
//! missing or behind) get the token written back, in a second round trip.

use fred::bytes_utils::Str;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::config::QuorumConfig;
use crate::redis::keys::LockKeys;
use crate::redis::node::{Node, Released, Vote};
use crate::util::few::Few;
use crate::Error;

/// The masters a client votes over: one for a [`LockClient`](crate::LockClient) (a server, a
/// cluster or a sentinel group is one master), N for a [`MultiLock`](crate::MultiLock).
///
/// # One master
///
/// A `LockClient` runs this same algorithm over one master. That case differs in four ways, and
/// this is where they are decided:
/// - the only master draws the fencing token, so there is no fence write-back (see
///   [`acquire`]);
/// - a failed request is reported as its own error, not as [`Error::Quorum`]
///   ([`Masters::report`]);
/// - its [`QuorumConfig`] is made by the client, not by the user: the node timeout is the
///   command timeout, and restart quarantine is off ([`QuorumConfig::for_one_master`]);
/// - so a restart is never quarantined: one server that restarted lost its locks whatever a
///   quorum does. The node's restart watcher still runs (it feeds nothing else), since the same
///   node may also serve in a `MultiLock` built from this client.
pub(crate) struct Masters {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) config: QuorumConfig,
}

impl Masters {
    /// Whether this is one master (see the type's doc).
    pub(crate) fn single(&self) -> bool {
        self.nodes.len() == 1
    }

    /// How many masters make a majority.
    pub(crate) fn needed(&self) -> usize {
        majority(self.nodes.len())
    }

    /// The error of a round that did not reach a quorum: one master's own error as it is.
    fn report(&self, error: Option<Error>, quorum: Error) -> Error {
        match error {
            Some(err) if self.single() => err,
            _ => quorum,
        }
    }

    /// The bound of one attempt: a round, plus for several masters the writing of the fence (an
    /// undo after a failed round is left to the background past it). A little above the node
    /// timeout (and the replica wait of synced writes), so that the requests' own timeouts, which
    /// say more, come first.
    pub(crate) fn attempt_bound(&self) -> Duration {
        let phases = if self.single() { 1 } else { 2 };
        let sync = self
            .nodes
            .iter()
            .map(|n| n.link.bound() - n.link.timeout)
            .max()
            .unwrap_or_default();
        (self.config.node_timeout + sync) * phases + Duration::from_millis(10)
    }

    /// Which masters may vote now: not in restart quarantine (`quarantine`: how long a restarted
    /// master sits out, if that rule is on), and not the same server as an earlier one (one server
    /// under two names would be two votes).
    pub(crate) fn voters(&self, quarantine: Option<Duration>) -> Voters {
        let mut voters = Voters::default();
        if let [node] = &self.nodes[..] {
            // One server cannot repeat another: no run_id to compare on every acquisition.
            voters.push(quarantine.is_none_or(|q| node.may_vote(q)));
            return voters;
        }
        let mut seen: Vec<Str> = Vec::new();
        for node in &self.nodes {
            let votes = quarantine.is_none_or(|q| node.may_vote(q))
                && match node.run_id() {
                    // Not reached yet: it may be another master under another name.
                    None => false,
                    Some(run_id) if seen.contains(&run_id) => {
                        tracing::error!(node = %node.server, "this master is another listed one under another name: it does not vote");
                        false
                    }
                    Some(run_id) => {
                        seen.push(run_id);
                        true
                    }
                };
            voters.push(votes);
        }
        voters
    }
}

impl Masters {
    /// [`Error::Quarantine`] if fewer `voters` than a majority may vote because masters sit out
    /// the restart quarantine (`quarantine`: how long), with how long until enough may. `None` if
    /// a majority votes, or if masters sit out for other reasons too (not reached yet, the same
    /// server under two names): the round then tells what went wrong.
    pub(crate) fn too_few_voters(&self, voters: &[bool], quarantine: Option<Duration>) -> Option<Error> {
        let voting = voters.iter().filter(|v| **v).count();
        let needed = self.needed();
        if voting >= needed {
            return None;
        }
        let now = Instant::now();
        let mut ends: Vec<Instant> = (0..self.nodes.len())
            .filter(|i| !voters[*i])
            .filter_map(|i| quarantine.and_then(|q| self.nodes[i].votes_from(q)))
            .filter(|at| *at > now)
            .collect();
        if voting + ends.len() < needed {
            return None;
        }
        ends.sort();
        Some(Error::Quarantine {
            voting,
            needed,
            nodes: self.nodes.len(),
            ends_in: ends[needed - voting - 1].saturating_duration_since(now),
        })
    }
}

/// One flag per master, in order: whether it may vote now (see [`Masters::voters`]).
pub(crate) type Voters = Few<bool>;

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
    let nodes = masters.nodes.len();
    let needed = masters.needed();
    let reentry = target > 1;
    // Several masters keep their fence counters in step, so that a round needs no write-back.
    let in_step = !masters.single();
    let start = Instant::now();

    // Masters that may have forgotten locks they granted (restarted), or that repeat another one,
    // do not vote (`voters`).
    if voters.iter().any(|v| !v) {
        tracing::debug!(lock = %keys.name, voters = voters.iter().filter(|v| **v).count(), "restarted or repeated masters sit out");
    }
    let mut tally = Tally {
        reentry,
        nodes,
        refused: 0,
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
    let Tally {
        reentry: _,
        nodes: _,
        refused,
        granted,
        backing,
        denied,
        answered,
        ttl,
        error,
    } = tally;

    let deadline = start + lease.saturating_sub(masters.config.drift(lease));
    if reentry && backing >= needed && deadline > Instant::now() {
        return Ok(Round::Granted { token: 0, deadline });
    }
    if !reentry && granted.len() >= needed {
        let mut token = granted.iter().map(|g| g.2).max().unwrap_or(0);
        // One master drew the token itself: nothing to write back. Of several, only those that
        // drew less (their counter was behind) need it; masters in step all drew the token.
        let fenced = masters.single() || raise_fence(masters, keys, &granted, token).await >= needed;
        if !fenced {
            token = 0;
        }
        if fenced && deadline > Instant::now() {
            return Ok(Round::Granted { token, deadline });
        }
        tracing::debug!(lock = %keys.name, "granted too late or not fenced on a majority; undoing");
    }

    // Undo at once where it was granted (a re-entry goes back to the level it had). Where the
    // outcome is unknown (no answer in time), the undo is the caller's, in the background
    // (`stragglers`), so that a slow master does not hold up the caller a second time.
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

/// What the masters said to a release.
#[derive(Default)]
pub(crate) struct Release {
    /// Masters where the hold was (and is now at the target).
    pub(crate) held: usize,
    /// Masters where the hold was not.
    pub(crate) not_held: usize,
    /// Masters that did not answer (or failed): the release may or may not have landed there.
    pub(crate) silent: Vec<usize>,
    /// The last error of a silent master.
    pub(crate) error: Option<Error>,
    /// A master that told how many subscribers heard the release message, and that number (the
    /// most of those that told).
    pub(crate) heard: Option<(usize, u32)>,
}

impl Release {
    /// `Ok(true)` when a majority answered, `Ok(false)` when a majority said the hold was not
    /// there, else the error (the silent masters are retried in the background by the caller).
    pub(crate) fn outcome(&self, masters: &Masters) -> Result<bool, Error> {
        let needed = masters.needed();
        if self.not_held >= needed {
            return Ok(false);
        }
        if self.held + self.not_held >= needed {
            return Ok(true);
        }
        let quorum = Error::Quorum {
            granted: self.held,
            answered: self.held + self.not_held,
            needed,
            nodes: masters.nodes.len(),
        };
        Err(masters.report(self.error.clone(), quorum))
    }
}

/// Sets the count of hold `field` on `keys` to `target` on the given nodes (0 releases).
pub(crate) async fn release_on(
    masters: &Masters,
    keys: &LockKeys,
    field: &Str,
    target: u32,
    nodes: &[usize],
) -> Release {
    let ask = |i: usize| async move { (i, masters.nodes[i].release(keys, field, target).await) };
    let mut out = Release::default();
    match nodes {
        // One node (a `LockClient`'s master): boxed by itself, as in `acquire`, and no list.
        [only] => {
            let (i, outcome) = Box::pin(ask(*only)).await;
            out.count(i, outcome);
        }
        _ => {
            for (i, outcome) in futures::future::join_all(nodes.iter().map(|&i| ask(i))).await {
                out.count(i, outcome);
            }
        }
    }
    out
}

impl Release {
    /// Counts master `i`'s answer.
    fn count(&mut self, i: usize, outcome: Result<Released, Error>) {
        match outcome {
            Ok(Released::NotHeld) => self.not_held += 1,
            Ok(Released::StillHeld) => self.held += 1,
            Ok(Released::Freed { heard }) => {
                self.held += 1;
                if let Some(heard) = heard.filter(|&h| self.heard.is_none_or(|(_, most)| h > most)) {
                    self.heard = Some((i, heard));
                }
            }
            // A key of another type will not change by waiting: only silence is worth a retry.
            Err(Error::WrongType(_)) => self.not_held += 1,
            Err(err) => {
                self.silent.push(i);
                self.error = Some(err);
            }
        }
    }
}

/// The answers still to come from masters that a release was sent to (see [`release_settled`]):
/// each master's index and its outcome.
type Answers = FuturesUnordered<Pin<Box<dyn Future<Output = (usize, Result<Released, Error>)> + Send>>>;

/// The answers of a release that [`release_settled`] did not wait for, counted against each of
/// those masters' [`SETTLING_MAX`] until they come.
///
/// `answers` is `None` where nothing is left to await (every release on one master): an empty
/// `FuturesUnordered` costs two allocations.
#[derive(Default)]
pub(crate) struct Stragglers {
    answers: Option<Answers>,
    settling: Vec<Settling>,
}

impl Stragglers {
    /// No answer is left to await.
    pub(crate) fn is_empty(&self) -> bool {
        self.settling.is_empty()
    }
}

/// How many releases' answers from one master may be awaited in the background at once: past
/// that, a release waits for the master's answer itself, as for one that answers, so that a master
/// that is down slows the releases down to its timeout again instead of letting the background
/// work grow with their rate.
const SETTLING_MAX: usize = 16;

/// One release's answer awaited in the background from master `.0`, counted while it lives.
struct Settling(Arc<Node>);

impl Settling {
    fn new(node: &Arc<Node>) -> Settling {
        node.settling.fetch_add(1, Ordering::Relaxed);
        Settling(node.clone())
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        self.0.settling.fetch_sub(1, Ordering::Relaxed);
    }
}

/// [`release`] on every node, without waiting for masters whose last release went unanswered
/// ([`Node::lagging`]) once the answers so far settle the outcome: a majority had the hold and no
/// majority can say otherwise, or a majority said it was not there. The requests to those masters
/// have been sent, and are ordered before anything sent after this returns (one connection per
/// master); their answers are in `Stragglers`, for the caller to await (the masters that fail there
/// need bringing in line like silent ones). Every other master's answer is in the `Release`.
///
/// So a master that is down or stalled delays one release by the node timeout, not every one
/// (Redlock waits for no minority), up to [`SETTLING_MAX`] releases at a time, while a healthy
/// master's answer is awaited here, in the caller's task. Handing every answer after the settled
/// outcome to the releaser instead cost more than the wait: a hop to that task per release
/// (the bench's `--quick --only redlock`, three runs each: N = 3, 3,650-3,844 cycles/s
/// against 3,956-3,982 waiting here; N = 5 the same within noise).
pub(crate) async fn release_settled(
    masters: &Masters,
    keys: &Arc<LockKeys>,
    field: &Str,
    target: u32,
) -> (Release, Stragglers) {
    if masters.single() {
        return (release(masters, keys, field, target).await, Stragglers::default());
    }
    let (nodes, needed) = (masters.nodes.len(), masters.needed());
    let mut pending = Answers::new();
    for (i, node) in masters.nodes.iter().enumerate() {
        let (node, keys, field) = (node.clone(), keys.clone(), field.clone());
        pending.push(Box::pin(async move {
            let outcome = node.release(&keys, &field, target).await;
            node.note_release(&outcome);
            (i, outcome)
        }));
    }
    let mut out = Release::default();
    let mut answered = vec![false; nodes];
    let left_to = |i: usize| {
        let node = &masters.nodes[i];
        node.lagging() && node.settling.load(Ordering::Relaxed) < SETTLING_MAX
    };
    while let Some((i, outcome)) = pending.next().await {
        answered[i] = true;
        out.count(i, outcome);
        let settled =
            out.not_held >= needed || (out.held + out.not_held >= needed && nodes - out.held < needed);
        if settled && (0..nodes).all(|i| answered[i] || left_to(i)) {
            let settling = (0..nodes)
                .filter(|i| !answered[*i])
                .map(|i| Settling::new(&masters.nodes[i]))
                .collect();
            return (
                out,
                Stragglers {
                    answers: Some(pending),
                    settling,
                },
            );
        }
    }
    (out, Stragglers::default())
}

/// The masters among `stragglers` (see [`release_settled`]) whose answer did not come: the release
/// may or may not have landed there.
pub(crate) async fn silent_among(stragglers: Stragglers) -> Vec<usize> {
    let mut rest = Release::default();
    if let Some(mut answers) = stragglers.answers {
        while let Some((i, outcome)) = answers.next().await {
            rest.count(i, outcome);
        }
    }
    rest.silent
}

/// [`release_on`] every node.
pub(crate) async fn release(masters: &Masters, keys: &LockKeys, field: &Str, target: u32) -> Release {
    let all: Few<usize> = (0..masters.nodes.len()).collect();
    release_on(masters, keys, field, target, &all).await
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
