//! One server (`redis://host:port`), reached on one connection.

use fred::interfaces::ClientLike;
use fred::types::config::Server;

use super::ServerInfo;
use crate::Error;

pub(super) fn name(server: &Server) -> String {
    format!("{}:{}", server.host, server.port)
}

/// One `INFO` (all default sections: server, memory, cluster among them).
pub(super) async fn server_info<C: ClientLike>(client: &C) -> Result<ServerInfo, Error> {
    let info: String = client.info(None).await?;
    Ok(ServerInfo::parse(&info))
}

/// A cluster node reached by a plain URL would answer `MOVED` for most keys: say what to use.
pub(super) fn check(info: &ServerInfo, name: &str) -> Result<(), Error> {
    if info.cluster_enabled {
        return Err(Error::InvalidConfig(format!(
            "{name} is a Redis Cluster node: connect with a redis-cluster:// URL"
        )));
    }
    Ok(())
}
