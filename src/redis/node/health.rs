//! A master's health as a quorum needs it: the restart watch (a new `run_id` starts a quarantine
//! from votes), and the naming of its connections, renewed at every reconnection.

use fred::bytes_utils::Str;
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Value};
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::Node;
use crate::redis::link::NodeClient;
use crate::redis::topology::ServerInfo;

/// What a quorum needs to know of a master's past: a master that restarted without persistence
/// forgot the locks it granted, so it must not vote again before those leases have run out.
#[derive(Default)]
pub(super) struct Health {
    /// The connection dropped and the server was not seen since: it may have restarted.
    suspect: bool,
    /// The server's `run_id` when last seen.
    run_id: Option<Str>,
    /// When the server last started, as far as this client knows: on first sight and on a new
    /// `run_id`, now minus its `uptime_in_seconds`. A server first seen a moment after it restarted
    /// is thus treated like one seen restarting. A later new `run_id` (a restart, or a failover
    /// to a replica whose uptime is older than its promotion) dates it now.
    started_at: Option<Instant>,
}

impl Health {
    /// Records a sighting of the server; a new `run_id` (also the first) dates its start.
    pub(super) fn observe(&mut self, info: &ServerInfo, server: &str) {
        if self.run_id.as_deref() != Some(info.run_id.as_str()) {
            let now = Instant::now();
            self.started_at = if self.run_id.is_some() {
                // Another process serves now: restarted, or a replica promoted by a failover,
                // whose uptime says nothing of when it became the primary. Either way from now.
                tracing::warn!(node = %server, "master restarted or failed over (new run_id): it sits out of quorums for the longest lease");
                Some(now)
            } else {
                Some(now.checked_sub(info.uptime).unwrap_or(now))
            };
            self.run_id = Some(info.run_id.as_str().into());
        }
        self.suspect = false;
    }
}

impl Node {
    /// Whether the master may vote in a quorum: it is not suspected of having restarted unseen, and
    /// it has been up for at least `quarantine` (the longest lease) since it last started.
    pub(crate) fn may_vote(&self, quarantine: Duration) -> bool {
        let health = self.health.lock();
        !health.suspect && health.started_at.is_some_and(|at| at.elapsed() >= quarantine)
    }

    /// When the master may vote again, if it sits out a quarantine of `quarantine` now and this
    /// client knows when it started (not while it is suspected of a restart nobody saw yet).
    pub(crate) fn votes_from(&self, quarantine: Duration) -> Option<Instant> {
        let health = self.health.lock();
        if health.suspect {
            return None;
        }
        health.started_at.map(|at| at + quarantine)
    }

    /// The server's `run_id`, once seen.
    pub(crate) fn run_id(&self) -> Option<Str> {
        self.health.lock().run_id.clone()
    }
}

/// Follows the command connection: an error makes the master suspect until its `run_id` is read
/// again, which tells whether it restarted meanwhile (and so starts its quarantine).
pub(super) async fn watch_restarts(
    link: Arc<NodeClient>,
    server: String,
    health: Weak<Mutex<Health>>,
    name: Option<Str>,
) {
    let mut errors = link.client.error_rx();
    let mut reconnects = link.client.reconnect_rx();
    let options = Options {
        timeout: Some(Duration::from_secs(2)),
        max_attempts: Some(1),
        ..Options::default()
    };
    loop {
        // A master not seen yet (down or slow at connect) is read at once: until then it cannot vote.
        let seen = health.upgrade().is_some_and(|h| h.lock().run_id.is_some());
        if seen {
            tokio::select! {
                error = errors.recv() => {
                    if matches!(error, Err(RecvError::Closed)) {
                        return;
                    }
                    let Some(health) = health.upgrade() else { return };
                    health.lock().suspect = true;
                }
                reconnect = reconnects.recv() => {
                    if matches!(reconnect, Err(RecvError::Closed)) {
                        return;
                    }
                }
            }
        }
        // Read the run_id again; while the server is away the request waits in fred's buffer (and
        // is dropped from it after its timeout), so this sends about one request per timeout.
        let info = loop {
            match link.topology.server_info(&link.client, &options).await {
                Ok(info) => break info,
                _ if health.strong_count() == 0 => return,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let Some(health) = health.upgrade() else { return };
        health.lock().observe(&info, &server);
        drop(health);
        if let Some(name) = &name {
            name_connections(&link, name, &options).await;
        }
    }
}

/// Names the command connections of `link` (one per primary on a cluster) `name`, for `CLIENT
/// LIST`; the synced connection too. Best effort: a failure is logged, and the next reconnection
/// tries again.
async fn name_connections(link: &NodeClient, name: &Str, options: &Options) {
    let mut connections = link.topology.primaries(&link.client, options);
    if let Some((sync, _)) = &link.sync {
        connections.extend(link.topology.primaries(sync, options));
    }
    let setname = CustomCommand::new_static("CLIENT", ClusterHash::Random, false);
    let named = connections.iter().map(|connection| {
        let args = vec![Value::from_static_str("SETNAME"), Value::from(name.clone())];
        connection.custom::<Value, _>(setname.clone(), args)
    });
    for result in futures::future::join_all(named).await {
        if let Err(err) = result {
            tracing::debug!(%err, "CLIENT SETNAME failed");
        }
    }
}
