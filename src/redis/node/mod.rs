//! One Redis master: a command connection, a subscriber connection and the scripts run on it.
//! Here the node and what it answers; in `build` and `init` its clients built and connected, in
//! `health` the restart watch and the naming of its connections, in `batched` the operations it
//! sends through its batcher, in `renew` renewals, in `requests` and `calls` its direct requests,
//! in `record` the client's record.
//!
//! May use: `crate::util`, `crate::config` (`LockConfig`), `crate::Error`, and the transport's
//! other modules; never the engine, the primitives, `inspect` or `blocking`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::types::Value;
use parking_lot::Mutex;

use crate::redis::batch::Batcher;
use crate::redis::link::NodeClient;
use crate::redis::waiters::Waiters;
use crate::Error;
use health::Health;

mod batched;
mod build;
mod calls;
mod health;
mod init;
mod record;
mod renew;
pub(crate) use renew::{RenewItem, Renewed};
mod requests;

/// The most locks renewed by one script call: bounds the time one call blocks the server.
pub(crate) const RENEW_BATCH: usize = 512;

/// What one node said to an acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Vote {
    /// Granted; the owner's count before it and the node's fencing token.
    Granted { prev: u64, token: u64 },
    /// Held by another owner for this long still (`None`: no expiry known).
    Busy { ttl: Option<Duration> },
}

/// What one node said to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    NotHeld,
    StillHeld,
    /// Released: with how many subscribers heard its message, where the script tells (a plain
    /// lock's release; 0 when none was published, as no waiter had marked the hold).
    Freed {
        heard: Option<u32>,
    },
}

/// What one node said to a transfer (see [`Node::transfer`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handed {
    /// The releasing hold was there, and is gone.
    pub(crate) released: bool,
    /// The receiving hold's fencing token, if it got the lock.
    pub(crate) token: Option<u64>,
}

/// A Redis master as relock uses it.
pub(crate) struct Node {
    pub(crate) link: Arc<NodeClient>,
    pub(crate) waiters: Waiters,
    batcher: Batcher,
    /// `host:port` (or the cluster's seeds, or the sentinel service), to tell masters apart.
    pub(crate) server: String,
    health: Arc<Mutex<Health>>,
    /// The restart watcher, and for a sentinel group the follower of its switches.
    watchers: Vec<tokio::task::JoinHandle<()>>,
    /// The command client was made here (not handed in by the user), so it is ours to close.
    owned: bool,
    /// The tasks that drive the connections that are ours to close: the command client's when
    /// relock built it, and the synced connection's.
    connections: Mutex<Vec<fred::types::ConnectHandle>>,
    /// Its last release went unanswered (see [`Node::note_release`]).
    lagging: AtomicBool,
    /// Releases whose answer from this master is awaited in the background (see
    /// `quorum::release_settled`).
    pub(crate) settling: AtomicUsize,
}

impl Drop for Node {
    fn drop(&mut self) {
        for watcher in &self.watchers {
            watcher.abort();
        }
        // Without this, fred's connection tasks would go on reconnecting to a server nobody uses.
        let connections = std::mem::take(&mut *self.connections.lock());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close(self.link.clone(), connections, self.owned));
        }
    }
}

impl Node {
    /// Records how this master answered a release: a release of a quorum waits for a master only
    /// while it answers (see `quorum::release_settled`).
    pub(crate) fn note_release(&self, outcome: &Result<Released, Error>) {
        let answered = !matches!(outcome, Err(err) if !matches!(err, Error::WrongType(_)));
        self.lagging.store(!answered, Ordering::Relaxed);
    }

    /// Whether this master's last release went unanswered (it failed or timed out).
    pub(crate) fn lagging(&self) -> bool {
        self.lagging.load(Ordering::Relaxed)
    }

    /// Closes the connections that are ours (see [`close`]).
    pub(crate) async fn close(&self) {
        let connections = std::mem::take(&mut *self.connections.lock());
        close(self.link.clone(), connections, self.owned).await;
    }

    /// The publish command of this node's release messages (`PUBLISH`, or `SPUBLISH` on a cluster).
    pub(crate) fn publish(&self) -> &'static str {
        self.link.topology.publish()
    }
}

/// Closes a node's command clients: `QUIT` if the servers answer soon, and in any case stops the
/// tasks that drive the connections, which would otherwise keep reconnecting to servers that are gone
/// (a `QUIT` to such a server would wait for the reconnection forever).
async fn close(link: Arc<NodeClient>, connections: Vec<fred::types::ConnectHandle>, owned: bool) {
    // The synced connection is always relock's own; the command client only when it built it.
    let sync = link.sync.as_ref().map(|(sync, _)| Client::clone(sync));
    let clients: Vec<Client> = owned
        .then(|| link.client.clone())
        .into_iter()
        .chain(sync)
        .collect();
    futures::future::join_all(clients.iter().map(crate::redis::link::quit)).await;
    for connection in connections {
        connection.abort();
    }
}

/// A duration in whole milliseconds, as the scripts take it.
fn millis(duration: Duration) -> Value {
    Value::from(duration.as_millis().min(i64::MAX as u128) as i64)
}

/// A script's reply that is none of those it gives.
fn unexpected(script: &str, reply: &[i64]) -> Error {
    Error::Redis(fred::error::Error::new(
        fred::error::ErrorKind::Parse,
        format!("unexpected reply of the {script} script: {reply:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use fred::bytes_utils::Str;

    use super::*;
    use crate::redis::keys::LockKeys;
    use crate::redis::scripts::scripts;

    /// Every batched operation's future is boxed once per acquisition and release (and a lock
    /// handle's caller holds its own inline), so a future of fred's held inline somewhere below
    /// costs every operation its size in copies: a 7 KB one cost 2-3 µs of client CPU per cycle at
    /// 256 tasks (see `batch::alone`), and 22 KB per semaphore attempt (see `Node::script`). And
    /// a batched operation's box above 1 KB costs an allocation outside glibc's thread cache (see
    /// `batch::round::direct`).
    #[tokio::test]
    async fn a_requests_future_holds_no_command_future_inline() {
        // Nothing listens on port 1: the futures are measured, never polled.
        let node =
            Node::build("redis://127.0.0.1:1", Duration::from_secs(1), None, None).expect("a valid url");
        let keys = LockKeys::new("relock", "size");
        let owner = Str::from("owner:1");
        let sizes = [
            (
                "acquire",
                std::mem::size_of_val(&node.acquire(&keys, &owner, Duration::from_secs(30), 1, false)),
            ),
            ("release", std::mem::size_of_val(&node.release(&keys, &owner, 0))),
            (
                "run_list",
                std::mem::size_of_val(&node.run_list(
                    &scripts().semaphore_acquire,
                    &[&keys.lock],
                    Vec::new(),
                )),
            ),
            (
                "run_on",
                std::mem::size_of_val(&node.run_on(&scripts().latch_count, &keys.lock, Vec::new())),
            ),
        ];
        for (what, size) in sizes {
            assert!(size < 3 * 1024, "{what}'s future is {size} bytes");
            // A batched operation's box (a one-master quorum boxes this future with a few bytes
            // more) within glibc's thread cache (chunks up to 1,032 bytes): above it, each cost
            // about 500 instructions more (callgrind). 856 and 800 bytes now.
            if matches!(what, "acquire" | "release") {
                assert!(size <= 960, "{what}'s future is {size} bytes");
            }
        }
    }
}
