//! How requests reach one node: its command client, relock's per-command options, the topology
//! that routes them, and the dedicated connection of synced writes. Every script call relock makes
//! goes through [`NodeClient::call_many`] (or `call_unwaited`), and every bound of a request is decided here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::interfaces::ClientLike;
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, Key, Value};

use crate::redis::scripts::{self, library, Script};
use crate::redis::topology::{self, Topology};
use crate::util::deadline::Deadlines;
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
    /// The command client with relock's per-command options: every direct request (not the batch
    /// script's) to this node is bounded here, by fred's own timeout (so that a timed-out command
    /// is also never sent late), and made
    /// once (never resent by fred).
    pub(crate) cmd: WithOptions<Client>,
    /// The command client without fred's per-command timer, for the batch script's calls: those
    /// are bounded by [`deadlines`](NodeClient::deadlines) instead (see `util/deadline.rs` for why).
    pub(crate) batch: WithOptions<Client>,
    /// The bounds of batched operations and of the batcher's rounds.
    pub(crate) deadlines: Deadlines,
    pub(crate) options: Options,
    /// The bound of one request.
    pub(crate) timeout: Duration,
    pub(crate) topology: Topology,
    /// Synced writes: their own connection (a `WAIT` blocks the connection it runs on), with a
    /// timeout that leaves room for the wait.
    pub(crate) sync: Option<(WithOptions<Client>, SyncReplicas)>,
    /// The batch scripts run as relock's library's function (`FCALL`, see
    /// [`Library`](crate::redis::scripts::Library)): set when the node connects and every primary took the
    /// library; cleared for good when a server refuses the function or a reload of the library, or
    /// refuses the function out of memory.
    pub(crate) functions: AtomicBool,
}

/// A script call's reply, and for a synced call how many replicas acknowledged it.
pub(crate) struct Reply<R> {
    pub(crate) value: R,
    pub(crate) acked: Option<usize>,
}

impl NodeClient {
    /// Runs `script` once per call, all at once and sent in order (see [`Script::run`]; each call's
    /// keys are in one slot). The caller bounds it (the calls carry no timer of their own, but for
    /// synced writes). With synced writes the calls go on the synced connection, followed
    /// there by one `WAIT` per primary they reached, sent after every call: a `WAIT` covers every
    /// earlier write of its connection, so a round over many slots waits once per primary, not once
    /// per slot. On a cluster each call and its `WAIT` are pinned to the primary the synced
    /// client's slot map names: a call that finds its slot moved answers `MOVED`, did not run, and
    /// is made again by the caller, so no `WAIT` vouches for a write on another server.
    pub(crate) async fn call_many<R: fred::types::FromValue>(
        &self,
        script: &Script,
        calls: Vec<(Vec<Key>, Vec<Value>)>,
    ) -> Vec<Result<Reply<R>, fred::error::Error>> {
        let Some((sync, replicas)) = &self.sync else {
            let runs = calls.into_iter().map(|(keys, args)| async move {
                let value = self.run(script, &self.batch, keys, args).await?;
                Ok(Reply { value, acked: None })
            });
            return Sent::start(runs).await.finish().await;
        };
        // Boxed: a synced round's state held inline would make every batched operation's future
        // (boxed once per acquisition and release) 400 bytes larger.
        Box::pin(self.call_many_synced(script, calls, sync, replicas)).await
    }

    /// One call of `script`, where writes are not synced: [`call_many`](Self::call_many) of one
    /// call without its lists (a round of one operation, the common case under light load).
    pub(crate) async fn call_one<R: fred::types::FromValue>(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, fred::error::Error> {
        debug_assert!(self.sync.is_none(), "a synced call needs its WAIT: call_many");
        self.run(script, &self.batch, keys, args).await
    }

    /// [`call_many`](Self::call_many) with synced writes.
    async fn call_many_synced<R: fred::types::FromValue>(
        &self,
        script: &Script,
        calls: Vec<(Vec<Key>, Vec<Value>)>,
        sync: &Client,
        replicas: &SyncReplicas,
    ) -> Vec<Result<Reply<R>, fred::error::Error>> {
        let sync_client = Client::clone(sync);
        // Which WAIT covers each call: one per primary (one in all off a cluster).
        let mut waits: Vec<(Option<Server>, u16)> = Vec::new();
        let mut wait_of = Vec::with_capacity(calls.len());
        for (keys, _) in &calls {
            let slot = keys.first().map_or(0, |key| {
                self.topology.slot(&String::from_utf8_lossy(key.as_bytes()))
            });
            let primary = topology::slot_owner(&sync_client, slot);
            // A slot whose owner is not known yet gets a WAIT of its own, routed by the slot.
            let shared = primary.is_some() || self.topology.kind() != topology::Kind::Cluster;
            let index = match waits.iter().position(|w| shared && w.0 == primary) {
                Some(index) => index,
                None => {
                    waits.push((primary, slot));
                    waits.len() - 1
                }
            };
            wait_of.push(index);
        }
        let pinned = |options: &Options, wait: usize| {
            let (primary, slot) = &waits[wait];
            let mut options = self.topology.route(options, *slot);
            if primary.is_some() {
                options.cluster_node = primary.clone();
            }
            sync_client.with_options(&options)
        };
        let mut runs = Vec::with_capacity(calls.len());
        for ((keys, args), wait) in calls.into_iter().zip(wait_of.iter().copied()) {
            let connection = pinned(&self.options, wait);
            runs.push(async move { self.run::<R, _>(script, &connection, keys, args).await });
        }
        let runs = Sent::start(runs).await;
        let wait_ms = replicas.timeout.as_millis().min(i64::MAX as u128) as i64;
        let wait_options = self.sync_options(replicas);
        let mut acks = Vec::with_capacity(waits.len());
        for wait in 0..waits.len() {
            let connection = pinned(&wait_options, wait);
            let args = vec![replicas.replicas as i64, wait_ms];
            acks.push(async move {
                connection
                    .custom::<i64, i64>(topology::wait_command(), args)
                    .await
            });
        }
        // Only now, after every call was handed to its connection.
        let acks = Sent::start(acks).await.finish().await;
        let values = runs.finish().await;
        values
            .into_iter()
            .zip(wait_of)
            .map(|(value, wait)| {
                // The call's own error first: a call that found its slot moved (`MOVED`: it did
                // not run, and is made again) must not read as its `WAIT`'s error, which a node
                // that turned replica gives.
                let value = value?;
                let acked = acks[wait].clone()?;
                Ok(Reply {
                    value,
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
            Some((sync, _)) => self.run(script, sync, keys, args).await,
            None => self.run(script, &self.cmd, keys, args).await,
        }
    }

    /// Runs `script` once on `client`: a batch script as the library's function where this node
    /// runs those (see [`functions`](NodeClient::functions)), else by `EVALSHA`.
    async fn run<R: fred::types::FromValue, C: ClientLike>(
        &self,
        script: &Script,
        client: &C,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, fred::error::Error> {
        if !(script.batch && self.functions.load(Ordering::Relaxed)) {
            return script.run(client, keys, args).await;
        }
        // Off a cluster nothing routes by slot: its hash is not worked out.
        let slot = if self.topology.kind() == topology::Kind::Cluster {
            scripts::slot_of(&keys)
        } else {
            0
        };
        let err = match library().call(client, slot, keys, args).await {
            Err(err) => err,
            done => return done,
        };
        // Each case below is an `FCALL` the server refused before it ran: its caller makes it again
        // (`scripts::not_run`), by script where this node turned to scripts.
        if scripts::is_function_missing(&err) {
            // The server lost the library (a restart without persistence, `FUNCTION FLUSH`): loaded
            // again for later calls, unless the server refuses that too.
            tracing::debug!("function library missing, loading it again");
            if let Err(load) = library().load(client, ClusterHash::Custom(slot)).await {
                if scripts::is_function_refused(&load) {
                    self.turn_to_scripts(&load);
                }
            }
            return Err(err);
        }
        // Refused for good (the user's rights changed, an older server in its place), or out of
        // memory: a function is refused whole there, where a script runs until its first write
        // that needs memory (so its releases still run).
        if scripts::is_function_refused(&err) || err.details().starts_with("OOM") {
            self.turn_to_scripts(&err);
            return Err(scripts::not_run_by_function(&err));
        }
        Err(err)
    }

    /// From now on this node runs the batch scripts, not the library's function.
    fn turn_to_scripts(&self, why: &fred::error::Error) {
        if self.functions.swap(false, Ordering::Relaxed) {
            tracing::warn!(error = %why, "relock's function library is refused here: the scripts run instead");
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

/// Requests polled once each, in order, before any is awaited: fred hands a request to its
/// connection on the first poll, so they are sent in this order. (`join_all` gives no such promise:
/// over a long list it may stop a pass part way, when its children use up the task's budget.)
struct Sent<F: Future> {
    requests: Vec<Started<F>>,
}

/// A request polled once, with its output if that poll finished it.
type Started<F> = (Pin<Box<F>>, Option<<F as Future>::Output>);

impl<F: Future> Sent<F> {
    async fn start(requests: impl IntoIterator<Item = F>) -> Sent<F> {
        // Boxed before the loop: a request held by value across the poll below would keep a slot
        // of its size in this future's state (and in every future that awaits this one). Each is
        // boxed as it is made, not gathered in a list first: a script call's request is about 7 KB
        // (fred's command future), and a list of them costs one more allocation of that size and
        // one more copy per request.
        let boxed: Vec<Pin<Box<F>>> = requests.into_iter().map(Box::pin).collect();
        let mut out = Vec::with_capacity(boxed.len());
        for mut request in boxed {
            let early = match futures::poll!(request.as_mut()) {
                Poll::Ready(output) => Some(output),
                Poll::Pending => None,
            };
            out.push((request, early));
        }
        Sent { requests: out }
    }

    async fn finish(self) -> Vec<F::Output> {
        let mut out = Vec::with_capacity(self.requests.len());
        for (request, early) in self.requests {
            out.push(match early {
                Some(output) => output,
                None => request.await,
            });
        }
        out
    }
}

/// `QUIT`, if the server answers soon. A client relock closes also has the task that drives its
/// connection aborted after this: it would otherwise keep reconnecting to a server that is gone (and
/// a `QUIT` to such a server would wait for the reconnection forever).
pub(crate) async fn quit(client: &Client) {
    let _ = tokio::time::timeout(Duration::from_millis(500), client.quit()).await;
}

/// The pause between tries of a request that did not run (`NOSCRIPT`, `MOVED`, `ASK`): a slot being
/// migrated answers `ASK` until it is done, so the tries must not spin. 2 ms, doubling to 50 ms.
pub(crate) struct RetryPause(Duration);

impl RetryPause {
    pub(crate) fn new() -> RetryPause {
        RetryPause(Duration::from_millis(2))
    }

    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_millis(50));
    }
}
