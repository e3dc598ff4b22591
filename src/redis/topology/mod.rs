//! What differs between the deployments one node (one vote) can be: a single server, a Redis
//! Cluster, or a primary managed by Sentinel. Everything above runs one algorithm over nodes; a node
//! asks its topology how to route a batch, a renewal and a `WAIT`, how release messages travel, and
//! how to check and prepare the servers behind it. One file per kind, as fred's
//! `router/{centralized,clustered,sentinel}.rs`.
//!
//! May use: the shared vocabulary only: it is the bottom of the transport.

mod cluster;
mod sentinel;
mod standalone;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::interfaces::ClientLike;
use fred::types::config::{Options, ServerConfig};
use fred::types::ClusterHash;

use crate::Error;

pub(crate) use sentinel::follow_switches;

/// What relock reads of a server's `INFO` (of every primary of a cluster, combined).
#[derive(Debug, Default)]
pub(crate) struct ServerInfo {
    pub(crate) run_id: String,
    pub(crate) uptime: Duration,
    pub(crate) version: String,
    pub(crate) cluster_enabled: bool,
    pub(crate) maxmemory: u64,
    pub(crate) maxmemory_policy: String,
}

impl ServerInfo {
    pub(crate) fn parse(info: &str) -> ServerInfo {
        let mut out = ServerInfo::default();
        for line in info.lines() {
            let Some((field, value)) = line.trim().split_once(':') else {
                continue;
            };
            match field {
                "run_id" => out.run_id = value.to_string(),
                "uptime_in_seconds" => out.uptime = Duration::from_secs(value.parse().unwrap_or(0)),
                "redis_version" => out.version = value.to_string(),
                "cluster_enabled" => out.cluster_enabled = value == "1",
                "maxmemory" => out.maxmemory = value.parse().unwrap_or(0),
                "maxmemory_policy" => out.maxmemory_policy = value.to_string(),
                _ => {}
            }
        }
        out
    }

    /// The major version, 0 if unknown.
    pub(crate) fn major(&self) -> u32 {
        self.version
            .split('.')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// The facts of several servers (a cluster's primaries) as one: a `run_id` that changes when
    /// any of them restarts or fails over, the shortest uptime, the oldest version, and the loosest
    /// eviction policy.
    pub(crate) fn combine(mut infos: Vec<ServerInfo>) -> ServerInfo {
        infos.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        let mut out = ServerInfo {
            run_id: infos
                .iter()
                .map(|i| i.run_id.as_str())
                .collect::<Vec<_>>()
                .join(","),
            cluster_enabled: infos.iter().all(|i| i.cluster_enabled),
            ..ServerInfo::default()
        };
        out.uptime = infos.iter().map(|i| i.uptime).min().unwrap_or_default();
        if let Some(oldest) = infos.iter().min_by_key(|i| i.major()) {
            out.version = oldest.version.clone();
        }
        out.maxmemory = infos.iter().map(|i| i.maxmemory).max().unwrap_or(0);
        out.maxmemory_policy = infos
            .iter()
            .map(|i| i.maxmemory_policy.clone())
            .find(|p| !p.is_empty() && p != "noeviction")
            .unwrap_or_else(|| "noeviction".into());
        out
    }
}

/// The kind of deployment behind one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One server (`redis://`): everything on one connection.
    Standalone,
    /// A Redis Cluster (`redis-cluster://`): requests go to the primary of their slot.
    Cluster,
    /// A Sentinel-managed primary (`redis-sentinel://`): fred follows failovers.
    Sentinel,
}

/// One node's topology.
pub(crate) struct Topology {
    kind: Kind,
    /// Release messages travel by sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`, Redis ≥ 7 on a cluster).
    sharded: AtomicBool,
}

impl Topology {
    /// The topology of a fred server configuration, and the node's name for logs and errors.
    pub(crate) fn of(server: &ServerConfig) -> (Topology, String) {
        let (kind, name) = match server {
            ServerConfig::Centralized { server } => (Kind::Standalone, standalone::name(server)),
            ServerConfig::Clustered { hosts, .. } => (Kind::Cluster, cluster::name(hosts)),
            ServerConfig::Sentinel { service_name, .. } => (Kind::Sentinel, sentinel::name(service_name)),
            #[allow(unreachable_patterns)]
            other => (Kind::Standalone, format!("{other:?}")),
        };
        let topology = Topology {
            kind,
            sharded: AtomicBool::new(false),
        };
        (topology, name)
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// The group a key's requests go in: its cluster slot, or 0 where everything goes to one server.
    /// One script call only ever touches keys of one group.
    pub(crate) fn slot(&self, key: &str) -> u16 {
        match self.kind {
            Kind::Cluster => cluster::slot(key),
            Kind::Standalone | Kind::Sentinel => 0,
        }
    }

    /// `items` grouped by the slot of their key, groups in the order their first item came and
    /// items in their order: one group in all off a cluster. Script calls, renewals and sharded
    /// subscriptions are made per group, since one call touches one slot.
    pub(crate) fn by_slot<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        key: impl Fn(&T) -> &str,
    ) -> Vec<Vec<T>> {
        if self.kind != Kind::Cluster {
            // One group: a list's own allocation is reused, and no map is built (this runs on
            // every script call).
            let all: Vec<T> = items.into_iter().collect();
            return if all.is_empty() { Vec::new() } else { vec![all] };
        }
        let mut index: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
        let mut groups: Vec<Vec<T>> = Vec::new();
        for item in items {
            let slot = self.slot(key(&item));
            let at = *index.entry(slot).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[at].push(item);
        }
        groups
    }

    /// Options that send a keyless command (`WAIT`, `SCRIPT LOAD`) where the keys of `slot` live.
    pub(crate) fn route(&self, options: &Options, slot: u16) -> Options {
        let mut options = options.clone();
        if self.kind == Kind::Cluster {
            options.cluster_hash = Some(ClusterHash::Custom(slot));
        }
        options
    }

    /// Whether release messages use sharded pub/sub.
    pub(crate) fn sharded(&self) -> bool {
        self.sharded.load(Ordering::Relaxed)
    }

    /// The command the scripts announce a release with.
    pub(crate) fn publish(&self) -> &'static str {
        if self.sharded() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Reads `INFO` of the servers behind the node: the one server, or every primary of a cluster
    /// (their facts combined: see [`ServerInfo::combine`]).
    pub(crate) async fn server_info(&self, client: &Client, options: &Options) -> Result<ServerInfo, Error> {
        match self.kind {
            Kind::Cluster => cluster::server_info(client, options).await,
            Kind::Standalone | Kind::Sentinel => standalone::server_info(&client.with_options(options)).await,
        }
    }

    /// Refuses a server of another kind than the URL said, and settles how releases are announced.
    pub(crate) fn check(&self, info: &ServerInfo, name: &str) -> Result<(), Error> {
        match self.kind {
            Kind::Cluster => {
                cluster::check(info, name)?;
                self.sharded.store(info.major() >= 7, Ordering::Relaxed);
                Ok(())
            }
            Kind::Standalone | Kind::Sentinel => standalone::check(info, name),
        }
    }

    /// Runs `each` once per server that takes writes: the one server, or every cluster primary, with
    /// options routed to it.
    pub(crate) fn primaries(&self, client: &Client, options: &Options) -> Vec<WithOptions<Client>> {
        match self.kind {
            Kind::Cluster => cluster::primaries(client, options),
            Kind::Standalone | Kind::Sentinel => vec![client.with_options(options)],
        }
    }
}

/// Waits until `client` is connected (or its connection failed: fred's error).
///
/// fred's `wait_for_connect` looks at the client's state, then subscribes to the connect
/// notification: a connection made in between is missed, and the wait lasts until the caller's
/// bound, or for ever without one. (`tests/cli.rs` met it about once in 25 runs: the subscriber
/// connection was up, and `LockClient::connect` timed out waiting for it.) A `PING` sent beside it
/// waits in fred's queue until the connection is up and is answered then, so either ends the
/// wait; a `PING` that fails leaves the error to `wait_for_connect`.
pub(crate) async fn connected(client: &Client) -> Result<(), fred::error::Error> {
    if client.is_connected() {
        return Ok(());
    }
    tokio::select! {
        done = client.wait_for_connect() => done,
        Ok(()) = client.ping::<()>(None) => Ok(()),
    }
}

/// The primary that owns `slot`, as `client` knows it now (`None` off a cluster).
pub(crate) fn slot_owner(client: &Client, slot: u16) -> Option<fred::types::config::Server> {
    cluster::owner(client, slot)
}

/// `WAIT n timeout`, routed where the writes of `slot` went: how many replicas acknowledged every
/// earlier write of the connection.
pub(crate) fn wait_command() -> fred::types::CustomCommand {
    // Blocking, as fred's own WAIT: the server answers nothing else on the connection meanwhile.
    fred::types::CustomCommand::new_static("WAIT", ClusterHash::Random, true)
}

/// Checks that the servers accept `WAIT` (some managed services refuse it): `WAIT 0 0` on each.
pub(crate) async fn check_wait(connections: &[WithOptions<Client>]) -> Result<(), Error> {
    for connection in connections {
        let reply: Result<i64, _> = connection.custom(wait_command(), vec![0i64, 0]).await;
        if let Err(err) = reply {
            if *err.kind() == fred::error::ErrorKind::Timeout {
                return Err(Error::Redis(err));
            }
            return Err(Error::InvalidConfig(format!(
                "sync_replicas needs WAIT, which the server refused: {}",
                err.details()
            )));
        }
    }
    Ok(())
}
