//! `LockClient`: locks on one Redis server.

use std::sync::Arc;

use crate::config::{LockConfig, QuorumConfig};
use crate::engine::core::Core;
use crate::engine::quorum::Masters;
use crate::primitives::latch::CountDownLatch;
use crate::primitives::lock::Lock;
use crate::primitives::lock_set::LockSet;
use crate::primitives::semaphore::Semaphore;
use crate::redis::link::SyncReplicas;
use crate::redis::node::Node;
use crate::Error;

/// Builds a client's core and starts its two background tasks, the watchdog and the releaser
/// (see the crate's architecture notes). Must run inside a tokio runtime.
pub(crate) fn start_core(masters: Masters, config: LockConfig, owns_clients: bool) -> Arc<Core> {
    let (jobs, rx) = tokio::sync::mpsc::unbounded_channel();
    crate::util::telemetry::register();
    let core = Arc::new(Core::new(masters, config, owns_clients, jobs));
    tokio::spawn(crate::engine::watchdog::run(Arc::downgrade(&core)));
    tokio::spawn(crate::engine::releaser::run(rx));
    core
}

/// A connection to one Redis deployment (a server, a cluster, or a Sentinel-managed primary) that
/// hands out [`Lock`]s.
///
/// It owns its connections (commands, a subscriber for release messages, and with
/// [`sync_replicas`](LockConfig::sync_replicas) one for synced writes; per primary on a cluster) and
/// a few background tasks (see the crate's architecture notes), whatever the number of locks, guards
/// and waiters. Cheap to
/// clone; every clone shares them. Must be created inside a tokio runtime.
///
/// ```no_run
/// use std::time::Duration;
/// use relock::{LockClient, LockConfig};
///
/// # async fn demo() -> Result<(), relock::Error> {
/// let config = LockConfig::default()
///     .watchdog_timeout(Duration::from_secs(30))
///     .key_prefix("shop");
/// let client = LockClient::connect_with("redis://127.0.0.1:6379", config).await?;
/// let guard = client.lock("inventory:sku-42").acquire().await?;
/// // ... deduct the stock ...
/// drop(guard);
/// client.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) core: Arc<Core>,
}

impl LockClient {
    /// Connects with the default [`LockConfig`].
    pub async fn connect(url: &str) -> Result<LockClient, Error> {
        LockClient::connect_with(url, LockConfig::default()).await
    }

    /// Connects to the server, cluster or sentinel group at `url`, in fred's URL formats:
    /// `redis://[user:password@]host:port[/db]` for one server,
    /// `redis-cluster://host:port?node=host2:port2&...` for a Redis Cluster,
    /// `redis-sentinel://host:port/db?sentinelServiceName=NAME&node=host2:port2` for a primary managed
    /// by Sentinel, and the `rediss`, `rediss-cluster` and `rediss-sentinel` forms for TLS. Loads the
    /// scripts (on every cluster primary) and checks that the user may run them and subscribe to the release
    /// channels (ACL). Fails with [`Error::InvalidConfig`] for a bad URL or configuration (before any
    /// I/O; also `rediss://` when relock was built without a TLS feature), and with
    /// [`Error::Timeout`] or [`Error::Redis`] (a refused login or TLS handshake, a `NOPERM`) when the
    /// server cannot be used within the command timeout. Lost connections are re-established in the
    /// background.
    pub async fn connect_with(url: &str, config: LockConfig) -> Result<LockClient, Error> {
        config.validate()?;
        let name = Some(config.get_client_name().into());
        let node = Node::build(url, config.get_command_timeout(), SyncReplicas::of(&config), name)?;
        LockClient::start(node, config, true).await
    }

    /// Builds a client on an existing fred client of any kind (centralized, clustered or sentinel),
    /// which it connects if needed, e.g. one with a TLS configuration that trusts a private CA. A
    /// clustered client must have `max_redirections = 0` in its connection config (relock follows
    /// redirections itself), or this fails with [`Error::InvalidConfig`]. A second connection, for release messages, is made from
    /// the same configuration. Whatever the fred client's own settings, relock sends each of its
    /// requests once (per-command `max_attempts = 1`) and bounds it by `command_timeout`. Give the
    /// client a reconnect policy; its `max_command_buffer_len` bounds what it buffers while the server
    /// is away (requests that timed out are dropped from that buffer only when it reconnects).
    /// Checked at connect as [`connect_with`](LockClient::connect_with) is.
    pub async fn from_fred(client: fred::clients::Client, config: LockConfig) -> Result<LockClient, Error> {
        config.validate()?;
        use fred::interfaces::ClientLike;
        if client.is_clustered() && client.connection_config().max_redirections != 0 {
            return Err(Error::InvalidConfig(
                "a cluster client for relock needs max_redirections = 0 in its connection config: \
                 relock follows MOVED and ASK itself, since fred would spend a write attempt on them"
                    .into(),
            ));
        }
        // Your client's connections keep the names you gave them.
        let node = Node::from_client(
            client,
            config.get_command_timeout(),
            SyncReplicas::of(&config),
            None,
        );
        LockClient::start(node, config, false).await
    }

    async fn start(node: Node, config: LockConfig, owns_client: bool) -> Result<LockClient, Error> {
        let timeout = config.get_command_timeout();
        node.init(&config, timeout).await?;
        let masters = Masters {
            nodes: vec![Arc::new(node)],
            config: QuorumConfig::for_one_master(timeout),
        };
        let core = start_core(masters, config, owns_client);
        Ok(LockClient { core })
    }

    /// The lock called `name`. No I/O; the name is checked when the lock is used.
    pub fn lock(&self, name: &str) -> Lock {
        Lock::new(self.core.clone(), name)
    }

    /// The fair lock called `name`: the same [`Lock`] and guards, but waiters are granted in the
    /// order they arrived. No I/O; the name is checked when it is used.
    ///
    /// A waiter (any `acquire` or `try_acquire_for` that is refused once) takes its place in the
    /// lock's queue, kept by a heartbeat that the watchdog renews while it waits: a waiter that
    /// stops waiting (granted, timed out, cancelled) leaves at once, one that crashed or was cut
    /// off leaves within one `watchdog_timeout`, so the queue never sticks behind it. A release
    /// wakes only the waiter whose turn it is (its owner id is the message). A `try_acquire`
    /// never queues, and is refused while anyone waits. Reentrant per owner, as every lock; a
    /// holder re-entering goes ahead of the queue. Fencing tokens as for every lock.
    ///
    /// Its keys (`prefix:{name}:fair...`) are not those of the plain lock of the same name. Not on
    /// a [`MultiLock`](crate::MultiLock): arrival order is each server's own, and masters that
    /// disagree on who is first would split every vote.
    pub fn fair_lock(&self, name: &str) -> Lock {
        Lock::fair(self.core.clone(), name)
    }

    /// The read-write lock called `name` (see [`RwLock`](crate::RwLock)). No I/O; the name is
    /// checked when a side is used.
    pub fn rw_lock(&self, name: &str) -> crate::RwLock {
        crate::RwLock::new(self.core.clone(), name)
    }

    /// The locks called `names`, taken together, all or none (see [`LockSet`]; Redisson's
    /// `RedissonMultiLock`, not relock's [`MultiLock`](crate::MultiLock), which is Redlock). No I/O;
    /// the names are checked when the set is used.
    pub fn lock_all(&self, names: &[&str]) -> LockSet {
        LockSet::new(names.iter().map(|name| self.lock(name)).collect())
    }

    /// The semaphore called `name`, of `permits` permits (see [`Semaphore`]: every holder's lease is
    /// renewed by the watchdog, so a crashed holder's permits come back). No I/O; the name and
    /// numbers are checked when it is used.
    pub fn semaphore(&self, name: &str, permits: u64) -> Semaphore {
        Semaphore::new(self.core.clone(), name, permits)
    }

    /// The leader election called `name` (see [`Election`](crate::Election)): one leader at a
    /// time, each with a term larger than the last, renewed by the watchdog while it leads. Its
    /// lock is the plain lock `election:NAME`, and its keys share that tag. No I/O; the name is
    /// checked when it is used.
    pub fn election(&self, name: &str) -> crate::Election {
        let lock = self.lock(&format!("{}{name}", crate::primitives::election::ELECTION_PREFIX));
        crate::Election::new(self.core.clone(), lock)
    }

    /// The countdown latch called `name` (see [`CountDownLatch`]). No I/O; the name is checked
    /// when the latch is used.
    pub fn latch(&self, name: &str) -> CountDownLatch {
        CountDownLatch::new(self.core.clone(), name)
    }

    /// The configuration in force.
    pub fn config(&self) -> &LockConfig {
        &self.core.config
    }

    /// The deployment this client talks to: `host:port`, `cluster host:port,...` or
    /// `sentinel service NAME`.
    pub fn server(&self) -> &str {
        &self.core.masters.nodes[0].server
    }

    /// Releases every lock this client holds (their guards become lost), stops the background tasks
    /// and closes the connections it opened. Later acquisitions fail with [`Error::Shutdown`].
    pub async fn shutdown(&self) {
        self.core.shutdown().await;
    }
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("server", &self.server())
            .field("id", &self.core.id)
            .finish()
    }
}
