//! Releases over the masters: one round, the masters whose last release went unanswered
//! (stragglers), and the answers awaited in the background.

use fred::bytes_utils::Str;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};

use crate::redis::keys::LockKeys;
use crate::redis::node::{Node, Released};
use crate::util::few::Few;
use crate::Error;

use super::Masters;

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

/// Sets the count of hold `field` on `keys` to `target` on the given nodes (0 releases); `undo`:
/// as the undo of grants that never were a hold (see `Node::undo_grant`).
pub(crate) async fn release_on(
    masters: &Masters,
    keys: &LockKeys,
    field: &Str,
    target: u32,
    nodes: &[usize],
    undo: bool,
) -> Release {
    let ask = |i: usize| async move {
        let node = &masters.nodes[i];
        let outcome = if undo {
            node.undo_grant(keys, field, target).await
        } else {
            node.release(keys, field, target).await
        };
        (i, outcome)
    };
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
    release_on(masters, keys, field, target, &all, false).await
}
