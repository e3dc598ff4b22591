//! A node's clients built: from a URL, or on a command client the user hands in; the restart
//! watcher (and a sentinel group's follower) started with them.

use fred::bytes_utils::Str;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::prelude::{Builder, Config, ReconnectPolicy};
use fred::types::config::Options;
use parking_lot::Mutex;

use super::health::{watch_restarts, Health};
use super::Node;
use crate::redis::batch::Batcher;
use crate::redis::link::{NodeClient, SyncReplicas};
use crate::redis::topology::{self, Topology};
use crate::redis::waiters::Waiters;
use crate::util::deadline::Deadlines;
use crate::Error;

/// The most commands fred buffers for a connection that is down; more fail at once. Each also
/// fails after the node timeout and is then never sent, but fred frees it only at reconnect.
const MAX_BUFFERED: usize = 4096;

impl Node {
    /// Builds the clients of a node from a URL (a server, a cluster or a sentinel group) and starts
    /// connecting; `Err` only for a bad URL. `timeout` bounds every request to the node.
    /// `name`: the name its connections carry (`CLIENT SETNAME`, sent whenever one comes up).
    pub(crate) fn build(
        url: &str,
        timeout: Duration,
        sync: Option<SyncReplicas>,
        name: Option<Str>,
    ) -> Result<Node, Error> {
        check_scheme(url)?;
        check_tls(url)?;
        let mut config =
            Config::from_url(url).map_err(|err| Error::InvalidConfig(format!("redis url {url:?}: {err}")))?;
        // A server down at start is retried like one that went away later (a MultiLock master may
        // join late); the caller bounds the wait.
        config.fail_fast = false;
        let client = Builder::from_config(config)
            .with_connection_config(|conn| {
                // Never resend a script whose reply was lost: every caller decides itself, and the
                // scripts are idempotent anyway.
                conn.max_command_attempts = 1;
                // A redirection then comes back as an error that says the request did not run
                // (see `scripts::is_redirect`), and relock makes it again: fred would follow it
                // only by spending a second write attempt. (A per-command option cannot say this:
                // fred replaces a zero there by the client's setting.)
                conn.max_redirections = 0;
                conn.connection_timeout = timeout;
                conn.internal_command_timeout = timeout;
                conn.max_command_buffer_len = MAX_BUFFERED;
            })
            .with_performance_config(|perf| perf.broadcast_channel_capacity = 4096)
            // Unlimited attempts, 50 ms growing to 2 s apart.
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
            .build()
            .map_err(|err| Error::InvalidConfig(format!("redis url {url:?}: {err}")))?;
        let mut node = Node::from_client(client, timeout, sync, name);
        node.owned = true;
        Ok(node)
    }

    /// A node on an existing command client; the subscriber connection is a new client of the same
    /// configuration. Every request relock makes is bounded by `timeout` and made once, whatever
    /// the client's own settings. `name`: see [`build`](Node::build); `None` leaves the names alone.
    pub(crate) fn from_client(
        client: Client,
        timeout: Duration,
        sync: Option<SyncReplicas>,
        name: Option<Str>,
    ) -> Node {
        let subscriber = client.clone_new();
        let (topology, server) = Topology::of(&client.client_config().server);
        let health = Arc::new(Mutex::new(Health::default()));
        let options = Options {
            timeout: Some(timeout),
            max_attempts: Some(1),
            ..Options::default()
        };
        let sync = sync
            .filter(|s| s.replicas > 0)
            .map(|s| (client.clone_new().with_options(&options), s));
        let untimed = Options {
            timeout: Some(Duration::ZERO),
            ..options.clone()
        };
        let link = Arc::new(NodeClient {
            cmd: client.with_options(&options),
            batch: client.with_options(&untimed),
            deadlines: Deadlines::start(),
            client,
            options,
            timeout,
            topology,
            sync,
            functions: AtomicBool::new(false),
        });
        let mut watchers = vec![tokio::spawn(watch_restarts(
            link.clone(),
            server.clone(),
            Arc::downgrade(&health),
            name,
        ))];
        if link.topology.kind() == topology::Kind::Sentinel {
            let sync = link.sync.as_ref().map(|(sync, _)| Client::clone(sync));
            let clients = [link.client.clone(), subscriber.clone()]
                .into_iter()
                .chain(sync)
                .collect();
            watchers.push(tokio::spawn(topology::follow_switches(
                link.client.client_config(),
                clients,
            )));
        }
        Node {
            batcher: Batcher::start(link.clone()),
            waiters: Waiters::start(subscriber, link.clone()),
            link,
            server,
            health,
            watchers,
            owned: false,
            connections: Mutex::new(Vec::new()),
            lagging: AtomicBool::new(false),
            settling: AtomicUsize::new(0),
        }
    }
}

/// The URL schemes fred understands, for a server, a cluster and a sentinel group, each also over
/// TLS (`rediss`), and Valkey's names for the same.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
    "valkey",
    "valkeys",
    "valkey-cluster",
    "valkeys-cluster",
    "valkey-sentinel",
    "valkeys-sentinel",
];

/// Refuses a URL whose scheme is none of [`SCHEMES`] before any I/O: fred would take `http://` for
/// a plain server.
fn check_scheme(url: &str) -> Result<(), Error> {
    match url
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
    {
        Some(scheme) if SCHEMES.contains(&scheme.as_str()) => Ok(()),
        Some(scheme) => Err(Error::InvalidConfig(format!(
            "redis url {url:?}: unknown scheme {scheme}://; use redis://, rediss:// (TLS), \
             redis-cluster:// or redis-sentinel:// (or their rediss- forms)"
        ))),
        None => Err(Error::InvalidConfig(format!(
            "redis url {url:?} has no scheme; use redis://host:port, rediss://host:port (TLS), \
             redis-cluster://host:port or redis-sentinel://host:port"
        ))),
    }
}

/// Refuses a TLS URL (`rediss://`, `valkeys://` and their cluster and sentinel forms) when the crate
/// was built without a TLS feature, since fred would then only log a warning and connect in plaintext.
/// With `tls-rustls`, makes sure rustls has a process-wide crypto provider (ring) before fred builds
/// its TLS configuration from the URL, which would panic without one.
fn check_tls(url: &str) -> Result<(), Error> {
    let scheme = url
        .split_once("://")
        .map_or("", |(scheme, _)| scheme)
        .to_ascii_lowercase();
    if !(scheme.starts_with("rediss") || scheme.starts_with("valkeys")) {
        return Ok(());
    }
    if cfg!(not(any(feature = "tls-rustls", feature = "tls-native"))) {
        return Err(Error::InvalidConfig(format!(
            "a {scheme}:// URL asks for TLS, but relock was built without TLS \
             (enable its `tls-rustls` or `tls-native` feature)"
        )));
    }
    #[cfg(feature = "tls-rustls")]
    if fred::rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which serves as well.
        let _ = fred::rustls::crypto::ring::default_provider().install_default();
    }
    Ok(())
}
