//! How requests reach one node: its command client, relock's per-command options, the topology
//! that routes them, and the dedicated connection of synced writes. Every script call relock makes
//! goes through [`NodeClient::call`], and every bound of a request is decided here.

use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::interfaces::ClientLike;
use fred::types::config::Options;
use fred::types::{Key, Value};

use crate::scripts::Script;
use crate::topology::{self, Topology};
use crate::Error;

/// What replicas must confirm before a write counts (`LockConfig::sync_replicas`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyncReplicas {
    pub(crate) replicas: usize,
    pub(crate) timeout: Duration,
}

impl SyncReplicas {
    /// The replica sync a configuration asks for, if any.
    pub(crate) fn of(config: &crate::LockConfig) -> Option<SyncReplicas> {
        (config.get_sync_replicas() > 0).then(|| SyncReplicas {
            replicas: config.get_sync_replicas(),
            timeout: config.get_sync_timeout(),
        })
    }
}

/// How requests reach one node: the clients, relock's per-command options, and the topology that
/// routes them. Every script call relock makes goes through [`NodeClient::call`].
pub(crate) struct NodeClient {
    pub(crate) client: Client,
    /// The command client with relock's per-command options: every request to this node is bounded
    /// here, by fred's own timeout (so that a timed-out command is also never sent late), and made
    /// once (never resent by fred).
    pub(crate) cmd: WithOptions<Client>,
    pub(crate) options: Options,
    /// The bound of one request.
    pub(crate) timeout: Duration,
    pub(crate) topology: Topology,
    /// Synced writes: their own connection (a `WAIT` blocks the connection it runs on), with a
    /// timeout that leaves room for the wait.
    pub(crate) sync: Option<(WithOptions<Client>, SyncReplicas)>,
}

/// A script call's reply, and for a synced call how many replicas acknowledged it.
pub(crate) struct Reply<R> {
    pub(crate) value: R,
    pub(crate) acked: Option<usize>,
}

impl NodeClient {
    /// Runs `script` once on the keys' slot (see [`Script::run`]). With synced writes the call goes
    /// on the synced connection, followed there by `WAIT` (which covers every write of the call)
    /// unless `wait` is false.
    pub(crate) async fn call<R: fred::types::FromValue>(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
        wait: bool,
    ) -> Result<Reply<R>, fred::error::Error> {
        let Some((sync, replicas)) = &self.sync else {
            let value = script.run(&self.cmd, keys, args).await?;
            return Ok(Reply { value, acked: None });
        };
        if !wait {
            let value = script.run(sync, keys, args).await?;
            return Ok(Reply { value, acked: None });
        }
        let slot = keys.first().map_or(0, |key| {
            self.topology.slot(&String::from_utf8_lossy(key.as_bytes()))
        });
        let waiter = sync.with_options(&self.topology.route(&self.sync_options(replicas), slot));
        let wait_ms = replicas.timeout.as_millis().min(i64::MAX as u128) as i64;
        // Polled in this order, so the script is written to the connection before the WAIT.
        let (value, acked) = futures::join!(
            script.run::<R, _>(sync, keys, args),
            waiter.custom::<i64, i64>(topology::wait_command(), vec![replicas.replicas as i64, wait_ms]),
        );
        Ok(Reply {
            value: value?,
            acked: Some(acked?.max(0) as usize),
        })
    }

    fn sync_options(&self, replicas: &SyncReplicas) -> Options {
        Options {
            timeout: Some(self.timeout + replicas.timeout),
            ..self.options.clone()
        }
    }

    /// The replicas a synced write needs, if writes are synced.
    pub(crate) fn sync_replicas(&self) -> Option<usize> {
        self.sync.as_ref().map(|(_, s)| s.replicas)
    }
}

impl NodeClient {
    /// The bound of one request: the node timeout, plus the replica wait when writes are synced.
    pub(crate) fn bound(&self) -> Duration {
        match &self.sync {
            Some((_, sync)) => self.timeout + sync.timeout,
            None => self.timeout,
        }
    }

    /// A fred error of a request to this node: its own timeout is relock's [`Error::Timeout`].
    pub(crate) fn redis_error(&self, err: fred::error::Error) -> Error {
        if *err.kind() == fred::error::ErrorKind::Timeout {
            Error::Timeout(self.bound())
        } else {
            Error::Redis(err)
        }
    }

    /// `Err(ReplicaSync)` when a synced write was acknowledged by too few replicas.
    pub(crate) fn check_acked(&self, acked: Option<usize>) -> Result<(), Error> {
        match (acked, self.sync_replicas()) {
            (Some(acked), Some(needed)) if acked < needed => Err(Error::ReplicaSync { acked, needed }),
            _ => Ok(()),
        }
    }
}

/// Closes a client of its own (a subscriber): `QUIT` if the server answers soon, and in any case
/// stops the task that drives the connection, which would otherwise keep reconnecting to a server
/// that is gone.
pub(crate) async fn close_client(client: Client, connection: fred::types::ConnectHandle) {
    let _ = tokio::time::timeout(Duration::from_millis(500), client.quit()).await;
    connection.abort();
}
