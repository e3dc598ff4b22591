//! `MultiLock`: the same locks over a quorum of independent Redis masters (Redlock).

use fred::bytes_utils::Str;
use std::collections::HashSet;
use std::sync::Arc;

use crate::config::{LockConfig, QuorumConfig};
use crate::engine::core::Core;
use crate::engine::quorum::Masters;
use crate::primitives::client::LockClient;
use crate::primitives::lock::Lock;
use crate::primitives::lock_set::LockSet;
use crate::redis::link::SyncReplicas;
use crate::redis::node::Node;
use crate::Error;

/// Locks held on a majority of N independent Redis masters, with the Redlock algorithm.
///
/// It hands out the same [`Lock`] and [`LockGuard`](crate::LockGuard) types as a [`LockClient`], so
/// code written against one Redis moves to N by changing one line. A lock is granted when
/// `N / 2 + 1` masters granted it within the lease's validity, renewed while a majority renews it,
/// and released on every master (a master whose last release went unanswered is not waited for
/// once a majority confirmed the release). Fencing tokens stay strictly increasing across holders.
/// Cheap to clone; `Send + Sync`.
///
/// **For Redisson users**: this is Redisson's `RedissonRedLock` (one name over several masters).
/// Redisson's `RedissonMultiLock` (several names, all or none) is relock's
/// [`lock_all`](MultiLock::lock_all) / [`LockClient::lock_all`](crate::LockClient::lock_all).
/// Countdown latches are not offered here: a count split over independent masters has no majority
/// to agree on.
///
/// ```no_run
/// # async fn demo() -> Result<(), relock::Error> {
/// use relock::{LockConfig, MultiLock};
///
/// let urls = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
/// let multi = MultiLock::connect(&urls, LockConfig::default()).await?;
/// let guard = multi.lock("orders:42").acquire().await?;
/// println!("token {} valid for {:?}", guard.fencing_token().await?, guard.validity());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    pub(crate) core: Arc<Core>,
}

impl MultiLock {
    /// A quorum over the masters of `clients`, with the default [`QuorumConfig`] and the lock
    /// settings of the first client. [`Error::InvalidConfig`] for an empty list, a repeated server, or
    /// a call outside a tokio runtime.
    pub fn new(clients: Vec<LockClient>) -> Result<MultiLock, Error> {
        MultiLock::with_config(clients, QuorumConfig::default())
    }

    /// A quorum over the masters of `clients` with `config`.
    pub fn with_config(clients: Vec<LockClient>, config: QuorumConfig) -> Result<MultiLock, Error> {
        let Some(first) = clients.first() else {
            return Err(Error::InvalidConfig(
                "a MultiLock needs at least one master".into(),
            ));
        };
        let lock_config = config.lock.clone().unwrap_or_else(|| first.core.config.clone());
        let nodes: Vec<Arc<Node>> = clients
            .iter()
            .map(|client| client.core.masters.nodes[0].clone())
            .collect();
        MultiLock::start(nodes, lock_config, config, false)
    }

    /// Connects to every master at once, with the default [`QuorumConfig`] and `config` for the
    /// locks. Works while a minority is unreachable (those keep being retried in the background and
    /// count again once they answer); fails with [`Error::Quorum`] when a majority cannot be reached
    /// within the lock config's `command_timeout`, and with [`Error::InvalidConfig`] for a bad or
    /// repeated URL.
    pub async fn connect(urls: &[&str], config: LockConfig) -> Result<MultiLock, Error> {
        MultiLock::connect_with(urls, QuorumConfig::default().lock_config(config)).await
    }

    /// [`connect`](MultiLock::connect) with a full [`QuorumConfig`].
    pub async fn connect_with(urls: &[&str], config: QuorumConfig) -> Result<MultiLock, Error> {
        config.validate()?;
        let lock_config = config.lock.clone().unwrap_or_default();
        let name: Str = lock_config.get_client_name().into();
        let nodes = urls
            .iter()
            .map(|url| {
                let sync = SyncReplicas::of(&lock_config);
                Node::build(url, config.node_timeout, sync, Some(name.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        check_distinct(&nodes)?;
        // Connecting may take longer than one request: it is bounded by the command timeout.
        let timeout = lock_config.get_command_timeout().max(config.node_timeout);
        let inits = nodes.iter().map(|node| node.init(&lock_config, timeout));
        let results = futures::future::join_all(inits).await;
        if let Some(Err(err)) = results.iter().find(|r| matches!(r, Err(e) if e.is_bad_input())) {
            return Err(err.clone());
        }
        let answered = results.iter().filter(|r| r.is_ok()).count();
        let needed = crate::engine::quorum::majority(nodes.len());
        if answered < needed {
            return Err(Error::Quorum {
                granted: 0,
                answered,
                needed,
                nodes: nodes.len(),
            });
        }
        for (node, result) in nodes.iter().zip(&results) {
            if let Err(err) = result {
                tracing::warn!(node = %node.server, %err, "master unreachable; retrying in the background");
            }
        }
        MultiLock::start(
            nodes.into_iter().map(Arc::new).collect(),
            lock_config,
            config,
            true,
        )
    }

    fn start(
        nodes: Vec<Arc<Node>>,
        lock_config: LockConfig,
        config: QuorumConfig,
        owns_clients: bool,
    ) -> Result<MultiLock, Error> {
        let config = QuorumConfig {
            lock: Some(lock_config.clone()),
            ..config
        };
        config.validate()?;
        check_distinct(&nodes)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::InvalidConfig(
                "a MultiLock must be created inside a tokio runtime".into(),
            ));
        }
        Ok(MultiLock {
            core: crate::primitives::client::start_core(Masters { nodes, config }, lock_config, owns_clients),
        })
    }

    /// The lock called `name` over every master. No I/O.
    pub fn lock(&self, name: &str) -> Lock {
        Lock::new(self.core.clone(), name)
    }

    /// The read-write lock called `name` (see [`RwLock`](crate::RwLock)). No I/O; the name is
    /// checked when a side is used.
    pub fn rw_lock(&self, name: &str) -> crate::RwLock {
        crate::RwLock::new(self.core.clone(), name)
    }

    /// The locks called `names`, taken together, all or none, each by this quorum (see
    /// [`LockSet`]). No I/O; the names are checked when the set is used.
    pub fn lock_all(&self, names: &[&str]) -> LockSet {
        LockSet::new(names.iter().map(|name| self.lock(name)).collect())
    }

    /// The number of masters.
    pub fn masters(&self) -> usize {
        self.core.masters.nodes.len()
    }

    /// Releases every lock this MultiLock holds and stops its background tasks (the connections of
    /// clients given to [`new`](MultiLock::new) stay open; those it opened itself are closed).
    pub async fn shutdown(&self) {
        self.core.shutdown().await;
    }
}

/// Refuses a master given twice: by the same address, or (once reached) by its `run_id`, which
/// tells `127.0.0.1:P` and `localhost:P` apart from two servers. A master reached only later is
/// checked then, and does not vote if it repeats another (see `Masters::voters`).
fn check_distinct<N: std::borrow::Borrow<Node>>(nodes: &[N]) -> Result<(), Error> {
    let mut seen = HashSet::new();
    let mut run_ids = HashSet::new();
    for node in nodes {
        let node = node.borrow();
        let server = &node.server;
        if !seen.insert(server.clone()) {
            return Err(Error::InvalidConfig(format!(
                "the master {server} is given twice"
            )));
        }
        if let Some(run_id) = node.run_id() {
            if !run_ids.insert(run_id) {
                return Err(Error::InvalidConfig(format!(
                    "the master {server} is another listed master under another name (same run_id)"
                )));
            }
        }
    }
    Ok(())
}

impl std::fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let servers: Vec<&str> = self
            .core
            .masters
            .nodes
            .iter()
            .map(|n| n.server.as_str())
            .collect();
        f.debug_struct("MultiLock").field("masters", &servers).finish()
    }
}
