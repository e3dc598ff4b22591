//! The one acquisition algorithm, over N nodes (N = 1 for a plain [`LockClient`](crate::LockClient)):
//! the Redlock rounds of the distlock page.
//!
//! May use: `redis` (nodes, keys), `util` and the shared vocabulary; nothing else of the engine.
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
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::QuorumConfig;
use crate::redis::node::Node;
use crate::util::few::Few;
use crate::Error;

mod release;
mod round;

pub(crate) use release::{release, release_on, release_settled, silent_among, Release};
pub(crate) use round::{acquire, draw_token, Round};

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
