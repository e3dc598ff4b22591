//! A Redis Cluster (`redis-cluster://host:port?node=host2:port2`). fred routes each request to the
//! primary of its slot. `MOVED`/`ASK` during resharding come back to relock as errors (fred is
//! allowed no redirections, see `scripts::is_redirect`): such a request did not run, and relock
//! makes it again where fred's refreshed slot map says; a reply lost with its connection is never
//! resent, since fred makes each request once. Every script call touches one slot: batches and
//! renewals are grouped by slot. Scripts and the function library are loaded on every primary, and
//! again where one answers `NOSCRIPT` or `Function not found`.
//! Release messages use sharded pub/sub on Redis ≥ 7 (see `waiters`).

use fred::clients::{Client, WithOptions};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::cluster::ClusterRouting;
use fred::types::config::{Options, Server};

use super::ServerInfo;
use crate::Error;

pub(super) fn name(hosts: &[Server]) -> String {
    let hosts: Vec<String> = hosts.iter().map(|s| format!("{}:{}", s.host, s.port)).collect();
    format!("cluster {}", hosts.join(","))
}

/// A key's hash slot.
pub(super) fn slot(key: &str) -> u16 {
    ClusterRouting::hash_key(key.as_bytes())
}

/// A connection (options) to each primary the client knows of.
pub(super) fn primaries(client: &Client, options: &Options) -> Vec<WithOptions<Client>> {
    let servers = client
        .cached_cluster_state()
        .map(|state| state.unique_primary_nodes())
        .unwrap_or_default();
    servers
        .into_iter()
        .map(|server| {
            client.with_options(&Options {
                cluster_node: Some(server),
                ..options.clone()
            })
        })
        .collect()
}

/// `INFO` of every primary, combined.
pub(super) async fn server_info(client: &Client, options: &Options) -> Result<ServerInfo, Error> {
    let primaries = primaries(client, options);
    if primaries.is_empty() {
        return Err(Error::Redis(fred::error::Error::new(
            fred::error::ErrorKind::Cluster,
            "the cluster's slots are not known yet",
        )));
    }
    let infos = futures::future::try_join_all(primaries.iter().map(super::standalone::server_info)).await?;
    Ok(ServerInfo::combine(infos))
}

pub(super) fn check(info: &ServerInfo, name: &str) -> Result<(), Error> {
    if !info.cluster_enabled {
        return Err(Error::InvalidConfig(format!(
            "{name}: a redis-cluster:// URL names a server that is not in cluster mode"
        )));
    }
    Ok(())
}

/// The primary that owns `slot`, as the client knows it now.
pub(super) fn owner(client: &Client, slot: u16) -> Option<Server> {
    client.cached_cluster_state()?.get_server(slot).cloned()
}
