//! One Redis master: a command connection, a subscriber connection and the scripts run on it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use fred::clients::Client;
use fred::interfaces::{ClientLike, EventInterface, KeysInterface};
use fred::prelude::{Builder, Config, ReconnectPolicy, ServerConfig};
use fred::types::{Key, Value};

use crate::batch::{Batcher, Op};
use crate::keys::LockKeys;
use crate::scripts::scripts;
use crate::waiters::Waiters;
use crate::Error;

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
    Freed,
}

/// A Redis master as relock uses it.
pub(crate) struct Node {
    pub(crate) client: Client,
    pub(crate) waiters: Waiters,
    batcher: Batcher,
    /// `host:port`, to tell masters apart.
    pub(crate) server: String,
    health: Arc<Mutex<Health>>,
    watcher: tokio::task::JoinHandle<()>,
    /// The command client was made here (not handed in by the user), so it is ours to close.
    owned: bool,
    /// The task that drives the command connection, when we started it.
    connection: Mutex<Option<fred::types::ConnectHandle>>,
}

/// What a quorum needs to know of a master's past: a master that restarted without persistence
/// forgot the locks it granted, so it must not vote again before those leases have run out.
#[derive(Default)]
struct Health {
    /// The connection dropped and the server was not seen since: it may have restarted.
    suspect: bool,
    /// The server's `run_id` when last seen.
    run_id: Option<String>,
    /// When the server was seen to have restarted (a new `run_id`).
    restarted_at: Option<Instant>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.watcher.abort();
        // Without this, fred's connection task would go on reconnecting to a server nobody uses.
        if self.owned {
            let connection = self.connection.lock().take();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(close(self.client.clone(), connection));
            }
        }
    }
}

impl Node {
    /// Builds the clients of a node from a URL and starts connecting; `Err` only for a bad URL.
    pub(crate) fn build(url: &str, timeout: Duration) -> Result<Node, Error> {
        let mut config =
            Config::from_url(url).map_err(|err| Error::InvalidConfig(format!("redis url {url:?}: {err}")))?;
        // A server down at start is retried like one that went away later (a MultiLock master may
        // join late); the caller bounds the wait.
        config.fail_fast = false;
        if !matches!(config.server, ServerConfig::Centralized { .. }) {
            return Err(Error::InvalidConfig(format!(
                "redis url {url:?}: only a single server (centralized) URL is supported"
            )));
        }
        let client = Builder::from_config(config)
            .with_connection_config(|conn| {
                // Never resend a script whose reply was lost: every caller decides itself, and the
                // scripts are idempotent anyway.
                conn.max_command_attempts = 1;
                conn.connection_timeout = timeout;
                conn.internal_command_timeout = timeout;
            })
            .with_performance_config(|perf| perf.broadcast_channel_capacity = 4096)
            // Unlimited attempts, 50 ms growing to 2 s apart.
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
            .build()
            .map_err(|err| Error::InvalidConfig(format!("redis url {url:?}: {err}")))?;
        let mut node = Node::from_client(client);
        node.owned = true;
        Ok(node)
    }

    /// A node on an existing command client; the subscriber connection is a new client of the same
    /// configuration.
    pub(crate) fn from_client(client: Client) -> Node {
        let subscriber = client.clone_new();
        let server = match &client.client_config().server {
            ServerConfig::Centralized { server } => format!("{}:{}", server.host, server.port),
            other => format!("{other:?}"),
        };
        let health = Arc::new(Mutex::new(Health::default()));
        let watcher = tokio::spawn(watch_restarts(
            client.clone(),
            server.clone(),
            Arc::downgrade(&health),
        ));
        Node {
            batcher: Batcher::start(client.clone()),
            client,
            waiters: Waiters::start(subscriber),
            server,
            health,
            watcher,
            owned: false,
            connection: Mutex::new(None),
        }
    }

    /// Closes the command connection if it is ours (see [`close`]).
    pub(crate) async fn close(&self) {
        if self.owned {
            let connection = self.connection.lock().take();
            close(self.client.clone(), connection).await;
        }
    }

    /// Whether the master may vote in a quorum: it is not suspected of having restarted unseen, and
    /// if it was seen restarted, at least `quarantine` (the longest lease) has passed since.
    pub(crate) fn may_vote(&self, quarantine: Duration) -> bool {
        let health = self.health.lock();
        !health.suspect && health.restarted_at.is_none_or(|at| at.elapsed() >= quarantine)
    }

    /// Connects the command client (if not connected yet) and loads the scripts, within `timeout`.
    pub(crate) async fn init(&self, timeout: Duration) -> Result<(), Error> {
        // fred retries a refused login like a lost connection; say so at once instead of timing out.
        let mut errors = self.client.error_rx();
        let refused = async {
            loop {
                match errors.recv().await {
                    Ok((err, _)) if *err.kind() == fred::error::ErrorKind::Auth => return Error::Redis(err),
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        };
        let work = async {
            if !self.client.is_connected() {
                // A handle of a client that is already connecting is harmless to drop.
                if self.client.state() == fred::types::ClientState::Disconnected {
                    *self.connection.lock() = Some(self.client.connect());
                }
                self.client.wait_for_connect().await?;
            }
            scripts().load_all(&self.client).await?;
            let run_id = run_id(&self.client).await?;
            let mut health = self.health.lock();
            health.run_id.get_or_insert(run_id);
            health.suspect = false;
            Ok::<_, Error>(())
        };
        let work = async {
            tokio::select! {
                done = work => done,
                err = refused => Err(err),
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| Error::Timeout(timeout))?
    }

    /// One acquisition (through the node's batcher): see `scripts/acquire.lua`.
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        owner: &Arc<str>,
        lease: Duration,
        target: u32,
    ) -> Result<Vote, Error> {
        let op = Op::Acquire {
            lock: keys.lock.clone(),
            fence: keys.fence.clone(),
            owner: owner.clone(),
            lease_ms: lease.as_millis().min(i64::MAX as u128) as i64,
            target: i64::from(target),
        };
        let reply = self.batcher.run(op).await?;
        match reply.as_slice() {
            [1, prev, token] => Ok(Vote::Granted {
                prev: *prev.max(&0) as u64,
                token: *token.max(&0) as u64,
            }),
            [0, ttl] => Ok(Vote::Busy {
                ttl: (*ttl > 0).then(|| Duration::from_millis(*ttl as u64)),
            }),
            other => Err(unexpected("acquire", other)),
        }
    }

    /// Sets the owner's count to `target` (through the node's batcher): see `scripts/release.lua`.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &Arc<str>,
        target: u32,
    ) -> Result<Released, Error> {
        let op = Op::Release {
            lock: keys.lock.clone(),
            owner: owner.clone(),
            target: i64::from(target),
            channel: keys.channel.clone(),
        };
        match self.batcher.run(op).await?.as_slice() {
            [0] => Ok(Released::NotHeld),
            [1] => Ok(Released::StillHeld),
            [2] => Ok(Released::Freed),
            other => Err(unexpected("release", other)),
        }
    }

    /// Renews a batch of at most [`RENEW_BATCH`] locks; one flag per lock, true if renewed.
    pub(crate) async fn renew(
        &self,
        locks: &[(&LockKeys, &str)],
        lease: Duration,
    ) -> Result<Vec<bool>, Error> {
        let keys: Vec<Key> = locks.iter().map(|(keys, _)| Key::from(&*keys.lock)).collect();
        let mut args = Vec::with_capacity(locks.len() + 1);
        args.push(millis(lease));
        args.extend(locks.iter().map(|(_, owner)| Value::from(*owner)));
        let reply: Vec<i64> = scripts()
            .renew
            .run(&self.client, keys, args)
            .await
            .map_err(Error::Redis)?;
        if reply.len() != locks.len() {
            return Err(unexpected("renew", &reply));
        }
        Ok(reply.into_iter().map(|flag| flag == 1).collect())
    }

    pub(crate) async fn raise_fence(&self, keys: &LockKeys, token: u64) -> Result<(), Error> {
        let _: i64 = scripts()
            .raise_fence
            .run(
                &self.client,
                vec![Key::from(&*keys.fence)],
                vec![Value::from(token.to_string())],
            )
            .await
            .map_err(|err| Error::from_redis(err, &keys.fence))?;
        Ok(())
    }

    pub(crate) async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, Error> {
        let removed: i64 = scripts()
            .force_unlock
            .run(
                &self.client,
                vec![Key::from(&*keys.lock)],
                vec![Value::from(&*keys.channel)],
            )
            .await
            .map_err(|err| Error::from_redis(err, &keys.lock))?;
        Ok(removed == 1)
    }

    pub(crate) async fn is_locked(&self, keys: &LockKeys) -> Result<bool, Error> {
        let found: i64 = self.client.exists(&*keys.lock).await.map_err(Error::Redis)?;
        Ok(found == 1)
    }
}

/// Closes a client: `QUIT` if the server answers soon, and in any case stops the task that drives
/// the connection, which would otherwise keep reconnecting to a server that is gone (a `QUIT` to such
/// a server would wait for the reconnection forever).
pub(crate) async fn close(client: Client, connection: Option<fred::types::ConnectHandle>) {
    let _ = tokio::time::timeout(Duration::from_millis(500), client.quit()).await;
    if let Some(connection) = connection {
        connection.abort();
    }
}

async fn run_id(client: &Client) -> Result<String, Error> {
    let info: String = client.info(Some(fred::types::InfoKind::Server)).await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// Follows the command connection: an error makes the master suspect until its `run_id` is read
/// again, which tells whether it restarted meanwhile (and so starts its quarantine).
async fn watch_restarts(client: Client, server: String, health: Weak<Mutex<Health>>) {
    let mut errors = client.error_rx();
    let mut reconnects = client.reconnect_rx();
    loop {
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
        // Read the run_id again; while the server is away the request waits in fred's buffer, so this
        // sends about one request per timeout, not a busy loop.
        let current = loop {
            match tokio::time::timeout(Duration::from_secs(2), run_id(&client)).await {
                Ok(Ok(id)) => break id,
                _ if health.strong_count() == 0 => return,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let Some(health) = health.upgrade() else { return };
        let mut health = health.lock();
        if health.run_id.as_ref().is_some_and(|known| *known != current) {
            tracing::warn!(node = %server, "master restarted (new run_id): it sits out of quorums for the longest lease");
            health.restarted_at = Some(Instant::now());
        }
        health.run_id = Some(current);
        health.suspect = false;
    }
}

fn millis(duration: Duration) -> Value {
    Value::from(duration.as_millis().min(i64::MAX as u128) as i64)
}

fn unexpected(script: &str, reply: &[i64]) -> Error {
    Error::Redis(fred::error::Error::new(
        fred::error::ErrorKind::Parse,
        format!("unexpected reply of the {script} script: {reply:?}"),
    ))
}
