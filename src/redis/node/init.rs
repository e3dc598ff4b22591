//! A node's connect: its connections brought up, the server checked, the scripts (and the function
//! library) loaded, and the user's access to relock's keys and channels tried.

use std::sync::atomic::Ordering;
use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::error::ErrorKind;
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::Server;
use fred::types::{Key, Value};
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::broadcast::Receiver;

use super::{millis, Node};
use crate::redis::keys::LockKeys;
use crate::redis::scripts::{library, scripts};
use crate::redis::topology::{self, ServerInfo};
use crate::redis::waiters::Waiters;
use crate::Error;

/// How `Node::init` treats a server whose eviction policy may remove lock keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EvictionCheck {
    Warn,
    Refuse,
}

impl EvictionCheck {
    fn of(config: &crate::LockConfig) -> EvictionCheck {
        if config.get_strict_eviction() {
            EvictionCheck::Refuse
        } else {
            EvictionCheck::Warn
        }
    }
}

impl Node {
    /// Connects the command client (if not connected yet), checks the server (its eviction policy
    /// as `config` asks), loads the scripts (and, unless `config` says otherwise, relock's function
    /// library where the server takes it) and checks that the user may run them on keys and
    /// channels under the key prefix (see
    /// [`check_access`]), within `timeout`. If the connection never came up, the timeout reports
    /// fred's last connection error (a TLS handshake that failed, a connection reset) rather than a
    /// bare [`Error::Timeout`].
    pub(crate) async fn init(&self, config: &crate::LockConfig, timeout: Duration) -> Result<(), Error> {
        // fred retries a refused login like a lost connection; say so at once instead of timing out.
        let mut errors = self.link.client.error_rx();
        let last_error = Mutex::new(None);
        let work = async {
            tokio::select! {
                done = self.connect_and_check(config) => done,
                err = self.refusal(&mut errors, &last_error) => Err(err),
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(done) => done,
            Err(_) => Err(self.timed_out(timeout, last_error.lock().take())),
        }
    }

    /// What fails a connect at once: a refused login, or a connection error that waiting will not
    /// cure (see [`connect_failure`]). Any other error of the connection is kept in `last_error`,
    /// for the report of a connect that times out.
    async fn refusal(
        &self,
        errors: &mut Receiver<(fred::error::Error, Option<Server>)>,
        last_error: &Mutex<Option<fred::error::Error>>,
    ) -> Error {
        loop {
            match errors.recv().await {
                Ok((err, _)) if *err.kind() == fred::error::ErrorKind::Auth => return Error::Redis(err),
                // Nobody listens there, no such host, no TLS there: no reason to wait.
                Ok((err, _)) => match connect_failure(&err) {
                    Some(reason) => {
                        return Error::Connect {
                            addr: self.server.to_string(),
                            reason,
                        }
                    }
                    None => *last_error.lock() = Some(err),
                },
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    }

    /// [`init`](Node::init)'s work, unbounded: the connections up, the server checked, the scripts
    /// loaded, the user's access tried, and the server's start recorded.
    async fn connect_and_check(&self, config: &crate::LockConfig) -> Result<(), Error> {
        let (eviction, prefix) = (EvictionCheck::of(config), config.get_key_prefix());
        let link = &self.link;
        self.connect().await?;
        let info = link.topology.server_info(&link.client, &link.options).await?;
        self.check(&info, eviction).await?;
        self.load_scripts(config.get_redis_functions()).await?;
        if let Some((sync, _)) = &link.sync {
            topology::check_wait(&link.topology.primaries(sync, &link.options)).await?;
        }
        check_access(&link.cmd, &self.waiters, prefix).await?;
        self.health.lock().observe(&info, &self.server);
        Ok(())
    }

    /// Connects the command client and the synced connection, those not connected yet, and waits
    /// until they are; keeps the handles of those that are ours to close.
    async fn connect(&self) -> Result<(), Error> {
        let link = &self.link;
        let sync = link.sync.as_ref().map(|(sync, _)| Client::clone(sync));
        for (client, ours) in [(Some(&link.client), self.owned), (sync.as_ref(), true)] {
            let Some(client) = client else { continue };
            if !client.is_connected() {
                // A handle of a client that is already connecting is harmless to drop.
                if client.state() == fred::types::ClientState::Disconnected {
                    let handle = client.connect();
                    if ours {
                        self.connections.lock().push(handle);
                    }
                }
                topology::connected(client).await?;
            }
        }
        Ok(())
    }

    /// Loads the scripts on every primary, and relock's function library too if `functions` asks
    /// for it, until a primary does not take it; records whether the library serves.
    async fn load_scripts(&self, mut functions: bool) -> Result<(), Error> {
        let link = &self.link;
        let primaries = link.topology.primaries(&link.client, &link.options);
        for primary in &primaries {
            scripts().load_all(primary).await?;
            if functions {
                functions = install_library(primary).await?;
            }
        }
        link.functions.store(functions, Ordering::Relaxed);
        Ok(())
    }

    /// The error of a connect that did not finish within `timeout`: fred's `last_error` if the
    /// connection never came up, or a TLS handshake that never completed, else a bare timeout.
    fn timed_out(&self, timeout: Duration, last_error: Option<fred::error::Error>) -> Error {
        let link = &self.link;
        match last_error {
            Some(err) if !link.client.is_connected() => Error::Redis(err),
            // A plaintext server reads a TLS hello as the start of a command and waits for
            // its end: the handshake neither completes nor fails.
            None if !link.client.is_connected() && uses_tls(&link.client) => Error::Connect {
                addr: self.server.to_string(),
                reason: format!(
                    "the TLS handshake did not complete within {timeout:?}; a rediss:// URL needs a \
                     server that speaks TLS on that port"
                ),
            },
            _ => Error::Timeout(timeout),
        }
    }

    /// Refuses a server relock cannot run on safely, before anything is written.
    async fn check(&self, info: &ServerInfo, eviction: EvictionCheck) -> Result<(), Error> {
        let server = &self.server;
        self.link.topology.check(info, server)?;
        // Lock hashes carry a TTL, so `volatile-*` policies evict them first, `allkeys-*` as any.
        let policy = &info.maxmemory_policy;
        if !policy.is_empty() && policy != "noeviction" {
            if eviction == EvictionCheck::Refuse {
                return Err(Error::InvalidConfig(format!(
                    "{server} has maxmemory-policy {policy}, which may evict held locks; strict_eviction wants noeviction"
                )));
            }
            if info.maxmemory > 0 {
                tracing::warn!(node = %server, %policy, "maxmemory-policy may evict held locks; use noeviction");
            }
        }
        // Before Redis 7, a script that calls TIME cannot write unless it replicates effects.
        if (1..7).contains(&info.major()) {
            let get =
                fred::types::CustomCommand::new_static("CONFIG", fred::types::ClusterHash::Random, false);
            let reply: Result<Vec<String>, _> = self
                .link
                .cmd
                .custom(get, vec!["GET", "lua-replicate-commands"])
                .await;
            if let Ok(reply) = reply {
                if reply.get(1).is_some_and(|v| v == "no") {
                    return Err(Error::InvalidConfig(format!(
                        "{server} runs Redis {} with lua-replicate-commands no; relock's scripts need it on",
                        info.version
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Whether the client connects over TLS.
fn uses_tls(client: &Client) -> bool {
    #[cfg(any(feature = "tls-rustls", feature = "tls-native"))]
    {
        client.client_config().tls.is_some()
    }
    #[cfg(not(any(feature = "tls-rustls", feature = "tls-native")))]
    {
        let _ = client;
        false
    }
}

/// What a failed connection says as a sentence, if it is one that waiting will not cure soon: a
/// refused connection, a host name that does not resolve, a TLS handshake that failed.
fn connect_failure(err: &fred::error::Error) -> Option<String> {
    let details = err.details();
    let lower = details.to_ascii_lowercase();
    if lower.contains("connectionrefused") || lower.contains("connection refused") {
        return Some("connection refused (is a redis-server listening there?)".into());
    }
    if lower.contains("failed to lookup address")
        || lower.contains("name or service not known")
        || lower.contains("no address associated")
        || lower.contains("nodename nor servname")
    {
        return Some("the host name could not be resolved".into());
    }
    let tls = format!("{:?}", err.kind()) == "Tls";
    if tls
        || lower.contains("invalidcontenttype")
        || lower.contains("corruptmessage")
        || lower.contains("handshake")
        || lower.contains("wrong version number")
    {
        return Some(format!(
            "the TLS handshake failed ({details}); a rediss:// URL needs a server that speaks TLS on that port"
        ));
    }
    None
}

/// Checks at connect what a restricted ACL user would otherwise only meet later: one `EVALSHA` of the
/// renew script on a key no lock can have (`prefix:{}`: names are never empty), which changes nothing,
/// and at the same time, on the subscriber connection, a `SUBSCRIBE`, `PING` and `UNSUBSCRIBE` of that
/// key's release channel (see [`Waiters::check`]). A `NOPERM` (the command, the key pattern or the
/// channel pattern) fails the connect. Commands that the scripts run are not all checked: the renew
/// script only reads (`HEXISTS`, under `pcall`) on this key.
async fn check_access(client: &WithOptions<Client>, waiters: &Waiters, prefix: &str) -> Result<(), Error> {
    let probe = LockKeys::new(prefix, "");
    let script = async {
        let keys = vec![Key::from(&probe.lock)];
        let args = vec![millis(Duration::ZERO), Value::from("")];
        let _: Vec<i64> = scripts().renew.run(client, keys, args).await.map_err(|err| {
            denied(
                err,
                &format!("EVALSHA of a relock script on the key {}", probe.lock),
            )
        })?;
        Ok::<_, Error>(())
    };
    let channel = async {
        waiters
            .check(&probe.channel)
            .await
            .map_err(|err| denied(err, &format!("SUBSCRIBE to the channel {}", probe.channel)))
    };
    futures::future::try_join(script, channel).await?;
    Ok(())
}

/// Loads relock's function library on `primary` and checks that it runs (see
/// [`Library`](crate::redis::scripts::Library)): false where the server has no functions (before Redis
/// 7.0), the user may not load or call them, or the server refuses them for now (out of memory,
/// say: the scripts serve then).
async fn install_library(primary: &impl ClientLike) -> Result<bool, Error> {
    match library().install(primary).await {
        Ok(()) => Ok(true),
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled
            ) =>
        {
            Err(Error::Redis(err))
        }
        Err(err) => {
            tracing::debug!(error = %err, "no function library: the batch scripts run by EVALSHA");
            Ok(false)
        }
    }
}

/// A failed connect check, saying what was checked.
fn denied(err: fred::error::Error, what: &str) -> Error {
    Error::Redis(fred::error::Error::new(
        err.kind().clone(),
        format!("{what} failed at connect: {}", err.details()),
    ))
}
