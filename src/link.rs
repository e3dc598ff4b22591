//! How requests reach one node: its command client, relock's per-command options, the topology
//! that routes them, and the dedicated connection of synced writes. Every script call relock makes
//! goes through [`NodeClient::call_many`] (or `call_unwaited`), and every bound of a request is decided here.

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
/// routes them. Every script call relock makes goes through [`NodeClient::call_many`] (or `call_unwaited`).
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
    /// Runs `script` once per call, all at once (see [`Script::run`]; each call's keys are in one
    /// slot). With synced writes the calls go on the synced connection, followed there by one
    /// `WAIT` per primary they reached: a `WAIT` covers every earlier write of its connection, so a
    /// round over many slots waits once per primary, not once per slot.
    pub(crate) async fn call_many<R: fred::types::FromValue>(
        &self,
        script: &Script,
        calls: Vec<(Vec<Key>, Vec<Value>)>,
    ) -> Vec<Result<Reply<R>, fred::error::Error>> {
        let Some((sync, replicas)) = &self.sync else {
            let runs = calls.into_iter().map(|(keys, args)| async move {
                let value = script.run(&self.cmd, keys, args).await?;
                Ok(Reply { value, acked: None })
            });
            return futures::future::join_all(runs).await;
        };
        // Which WAIT covers each call: one per primary (one in all off a cluster).
        let mut waits: Vec<(String, u16)> = Vec::new();
        let mut wait_of = Vec::with_capacity(calls.len());
        for (keys, _) in &calls {
            let slot = keys.first().map_or(0, |key| {
                self.topology.slot(&String::from_utf8_lossy(key.as_bytes()))
            });
            let primary = match topology::slot_owner(&self.client, slot) {
                Some(server) => format!("{}:{}", server.host, server.port),
                None if self.topology.kind() == topology::Kind::Cluster => format!("slot {slot}"),
                None => String::new(),
            };
            let index = match waits.iter().position(|(p, _)| *p == primary) {
                Some(index) => index,
                None => {
                    waits.push((primary, slot));
                    waits.len() - 1
                }
            };
            wait_of.push(index);
        }
        let wait_ms = replicas.timeout.as_millis().min(i64::MAX as u128) as i64;
        let options = self.sync_options(replicas);
        let runs = futures::future::join_all(
            calls
                .into_iter()
                .map(|(keys, args)| script.run::<R, _>(sync, keys, args)),
        );
        let waits = futures::future::join_all(waits.iter().map(|(_, slot)| {
            let waiter = sync.with_options(&self.topology.route(&options, *slot));
            async move {
                waiter
                    .custom::<i64, i64>(topology::wait_command(), vec![replicas.replicas as i64, wait_ms])
                    .await
            }
        }));
        // Polled in this order, so every script is written to its connection before the WAITs.
        let (values, acks) = futures::join!(runs, waits);
        values
            .into_iter()
            .zip(wait_of)
            .map(|(value, wait)| {
                let acked = acks[wait].clone()?;
                Ok(Reply {
                    value: value?,
                    acked: Some(acked.max(0) as usize),
                })
            })
            .collect()
    }

    /// Runs `script` once, without waiting for replicas: on the synced connection when writes are
    /// synced, so that it runs after the synced calls made before it (an undo of their grants).
    pub(crate) async fn call_unwaited<R: fred::types::FromValue>(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, fred::error::Error> {
        match &self.sync {
            Some((sync, _)) => script.run(sync, keys, args).await,
            None => script.run(&self.cmd, keys, args).await,
        }
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
