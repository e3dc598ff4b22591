//! One Redis master: a command connection, a subscriber connection and the scripts run on it.

use fred::bytes_utils::Str;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use fred::clients::{Client, WithOptions};
use fred::error::ErrorKind;
use fred::interfaces::{ClientLike, EventInterface, KeysInterface};
use fred::prelude::{Builder, Config, ReconnectPolicy};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Key, Value};

use crate::redis::batch::{Batcher, Granted, Ints, Op};
use crate::redis::keys::{Kind, LockKeys, SemaphoreKeys};
use crate::redis::link::{NodeClient, Reply, RetryPause, SyncReplicas};
use crate::redis::scripts::{library, not_run, scripts, Script};
use crate::redis::topology::{self, ServerInfo, Topology};
use crate::redis::waiters::Waiters;
use crate::util::deadline::Deadlines;
use crate::Error;

/// The most locks renewed by one script call: bounds the time one call blocks the server.
pub(crate) const RENEW_BATCH: usize = 512;

/// The most renewal calls of one node in flight at once (one per slot on a cluster): well under
/// fred's command buffer (`MAX_BUFFERED`).
const RENEW_WAVE: usize = 1024;

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
    /// Released: with how many subscribers heard its message, where the script tells (a plain
    /// lock's release; 0 when none was published, as no waiter had marked the hold).
    Freed {
        heard: Option<u32>,
    },
}

/// What one node said to a transfer (see [`Node::transfer`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handed {
    /// The releasing hold was there, and is gone.
    pub(crate) released: bool,
    /// The receiving hold's fencing token, if it got the lock.
    pub(crate) token: Option<u64>,
}

/// The most commands fred buffers for a connection that is down; more fail at once. Each also
/// fails after the node timeout and is then never sent, but fred frees it only at reconnect.
const MAX_BUFFERED: usize = 4096;

/// A Redis master as relock uses it.
pub(crate) struct Node {
    pub(crate) link: Arc<NodeClient>,
    pub(crate) waiters: Waiters,
    batcher: Batcher,
    /// `host:port` (or the cluster's seeds, or the sentinel service), to tell masters apart.
    pub(crate) server: String,
    health: Arc<Mutex<Health>>,
    /// The restart watcher, and for a sentinel group the follower of its switches.
    watchers: Vec<tokio::task::JoinHandle<()>>,
    /// The command client was made here (not handed in by the user), so it is ours to close.
    owned: bool,
    /// The tasks that drive the connections that are ours to close: the command client's when
    /// relock built it, and the synced connection's.
    connections: Mutex<Vec<fred::types::ConnectHandle>>,
    /// Its last release went unanswered (see [`Node::note_release`]).
    lagging: AtomicBool,
    /// Releases whose answer from this master is awaited in the background (see
    /// `quorum::release_settled`).
    pub(crate) settling: AtomicUsize,
}

/// What a quorum needs to know of a master's past: a master that restarted without persistence
/// forgot the locks it granted, so it must not vote again before those leases have run out.
#[derive(Default)]
struct Health {
    /// The connection dropped and the server was not seen since: it may have restarted.
    suspect: bool,
    /// The server's `run_id` when last seen.
    run_id: Option<Str>,
    /// When the server last started, as far as this client knows: on first sight and on a new
    /// `run_id`, now minus its `uptime_in_seconds`. A server first seen a moment after it restarted
    /// is thus treated like one seen restarting. A later new `run_id` (a restart, or a failover
    /// to a replica whose uptime is older than its promotion) dates it now.
    started_at: Option<Instant>,
}

impl Health {
    /// Records a sighting of the server; a new `run_id` (also the first) dates its start.
    fn observe(&mut self, info: &ServerInfo, server: &str) {
        if self.run_id.as_deref() != Some(info.run_id.as_str()) {
            let now = Instant::now();
            self.started_at = if self.run_id.is_some() {
                // Another process serves now: restarted, or a replica promoted by a failover,
                // whose uptime says nothing of when it became the primary. Either way from now.
                tracing::warn!(node = %server, "master restarted or failed over (new run_id): it sits out of quorums for the longest lease");
                Some(now)
            } else {
                Some(now.checked_sub(info.uptime).unwrap_or(now))
            };
            self.run_id = Some(info.run_id.as_str().into());
        }
        self.suspect = false;
    }
}

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

impl Drop for Node {
    fn drop(&mut self) {
        for watcher in &self.watchers {
            watcher.abort();
        }
        // Without this, fred's connection tasks would go on reconnecting to a server nobody uses.
        let connections = std::mem::take(&mut *self.connections.lock());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close(self.link.clone(), connections, self.owned));
        }
    }
}

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

    /// Records how this master answered a release: a release of a quorum waits for a master only
    /// while it answers (see `quorum::release_settled`).
    pub(crate) fn note_release(&self, outcome: &Result<Released, Error>) {
        let answered = !matches!(outcome, Err(err) if !matches!(err, Error::WrongType(_)));
        self.lagging.store(!answered, Ordering::Relaxed);
    }

    /// Whether this master's last release went unanswered (it failed or timed out).
    pub(crate) fn lagging(&self) -> bool {
        self.lagging.load(Ordering::Relaxed)
    }

    /// Sets the string `key` to `value` with a TTL of `lease` (a client's record, see
    /// `identity.rs`): one `SET … PX`, bounded by the node's timeout.
    pub(crate) async fn write_record(&self, key: &Str, value: &Str, lease: Duration) -> Result<(), Error> {
        let ms = lease.as_millis().clamp(1, i64::MAX as u128) as i64;
        self.link
            .cmd
            .set::<(), _, _>(
                Key::from(key),
                value.clone(),
                Some(fred::types::Expiration::PX(ms)),
                None,
                false,
            )
            .await
            .map_err(|err| self.link.redis_error(err))
    }

    /// Removes the key `key` (a client's record, as its client shuts down). Best effort.
    pub(crate) async fn remove_record(&self, key: &Str) {
        if let Err(err) = self.link.cmd.del::<i64, _>(Key::from(key)).await {
            tracing::debug!(%err, "the client's record was not removed");
        }
    }

    /// The string at `key` (a client's record), if it is one: `None` if there is none or it
    /// holds another type.
    pub(crate) async fn read_record(&self, key: &str) -> Result<Option<String>, Error> {
        match self.link.cmd.get::<Option<String>, _>(key).await {
            Ok(value) => Ok(value),
            Err(err) if err.details().starts_with("WRONGTYPE") => Ok(None),
            Err(err) => Err(self.link.redis_error(err)),
        }
    }

    /// Closes the connections that are ours (see [`close`]).
    pub(crate) async fn close(&self) {
        let connections = std::mem::take(&mut *self.connections.lock());
        close(self.link.clone(), connections, self.owned).await;
    }

    /// Whether the master may vote in a quorum: it is not suspected of having restarted unseen, and
    /// it has been up for at least `quarantine` (the longest lease) since it last started.
    pub(crate) fn may_vote(&self, quarantine: Duration) -> bool {
        let health = self.health.lock();
        !health.suspect && health.started_at.is_some_and(|at| at.elapsed() >= quarantine)
    }

    /// When the master may vote again, if it sits out a quarantine of `quarantine` now and this
    /// client knows when it started (not while it is suspected of a restart nobody saw yet).
    pub(crate) fn votes_from(&self, quarantine: Duration) -> Option<Instant> {
        let health = self.health.lock();
        if health.suspect {
            return None;
        }
        health.started_at.map(|at| at + quarantine)
    }

    /// The server's `run_id`, once seen.
    pub(crate) fn run_id(&self) -> Option<Str> {
        self.health.lock().run_id.clone()
    }

    /// Connects the command client (if not connected yet), checks the server (its eviction policy
    /// as `config` asks), loads the scripts (and, unless `config` says otherwise, relock's function
    /// library where the server takes it) and checks that the user may run them on keys and
    /// channels under the key prefix (see
    /// [`check_access`]), within `timeout`. If the connection never came up, the timeout reports
    /// fred's last connection error (a TLS handshake that failed, a connection reset) rather than a
    /// bare [`Error::Timeout`].
    pub(crate) async fn init(&self, config: &crate::LockConfig, timeout: Duration) -> Result<(), Error> {
        let (eviction, prefix) = (EvictionCheck::of(config), config.get_key_prefix());
        // fred retries a refused login like a lost connection; say so at once instead of timing out.
        let link = &self.link;
        let mut errors = link.client.error_rx();
        let last_error = Mutex::new(None);
        let refused = async {
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
        };
        let work = async {
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
            let info = link.topology.server_info(&link.client, &link.options).await?;
            self.check(&info, eviction).await?;
            let primaries = link.topology.primaries(&link.client, &link.options);
            let mut functions = config.get_redis_functions();
            for primary in &primaries {
                scripts().load_all(primary).await?;
                if functions {
                    functions = install_library(primary).await?;
                }
            }
            link.functions.store(functions, Ordering::Relaxed);
            if let Some((sync, _)) = &link.sync {
                topology::check_wait(&link.topology.primaries(sync, &link.options)).await?;
            }
            check_access(&link.cmd, &self.waiters, prefix).await?;
            self.health.lock().observe(&info, &self.server);
            Ok::<_, Error>(())
        };
        let work = async {
            tokio::select! {
                done = work => done,
                err = refused => Err(err),
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(done) => done,
            Err(_) => match last_error.lock().take() {
                Some(err) if !link.client.is_connected() => Err(Error::Redis(err)),
                // A plaintext server reads a TLS hello as the start of a command and waits for
                // its end: the handshake neither completes nor fails.
                None if !link.client.is_connected() && uses_tls(&link.client) => Err(Error::Connect {
                    addr: self.server.to_string(),
                    reason: format!(
                        "the TLS handshake did not complete within {timeout:?}; a rediss:// URL needs a \
                         server that speaks TLS on that port"
                    ),
                }),
                _ => Err(Error::Timeout(timeout)),
            },
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

    /// One acquisition (through the node's batcher): see `scripts/acquire.lua`.
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        owner: &Str,
        lease: Duration,
        target: u32,
        in_step: bool,
    ) -> Result<Vote, Error> {
        let op = || Op::Acquire {
            lock: keys.lock.clone(),
            fence: keys.fence.clone(),
            channel: keys.channel.clone(),
            owner: owner.clone(),
            lease_ms: lease.as_millis().min(i64::MAX as u128) as i64,
            target: i64::from(target),
            in_step,
            kind: keys.kind.clone(),
        };
        let reply = self.run_batched(op).await?;
        match reply.as_slice() {
            [1, prev, token] => Ok(Vote::Granted {
                prev: *prev.max(&0) as u64,
                token: *token.max(&0) as u64,
            }),
            [0, ttl] => Ok(Vote::Busy {
                ttl: (*ttl > 0).then(|| Duration::from_millis(*ttl as u64)),
            }),
            [-2] => Err(Error::Upgrade(keys.name.to_string())),
            other => Err(unexpected("acquire", other)),
        }
    }

    /// Sets the owner's count to `target` (through the node's batcher): see `scripts/release.lua`.
    pub(crate) async fn release(&self, keys: &LockKeys, owner: &Str, target: u32) -> Result<Released, Error> {
        // Waiters of this client may wait without a mark (held back while another owner of this
        // client holds the lock, see `Handoffs::hold_back`): for them, a plain lock's release is
        // announced (the other kinds' always are).
        let announce =
            target == 0 && matches!(keys.kind, Kind::Plain) && self.waiters.waited_on(keys.wait_channel());
        self.release_with(keys, owner, target, announce).await
    }

    /// [`release`](Node::release) of a grant that a refused round of a quorum made on this master
    /// (see `quorum::acquire`): announced only where a waiter marked it. It never was a hold, so no
    /// waiter of this client was held back behind it; announced to them, it woke a waiter whose
    /// own attempt then made such a grant and its undo woke the next, for as long as the lock was
    /// held on a bare majority.
    pub(crate) async fn undo_grant(
        &self,
        keys: &LockKeys,
        owner: &Str,
        target: u32,
    ) -> Result<Released, Error> {
        self.release_with(keys, owner, target, false).await
    }

    async fn release_with(
        &self,
        keys: &LockKeys,
        owner: &Str,
        target: u32,
        announce: bool,
    ) -> Result<Released, Error> {
        let op = || Op::release(keys, owner, i64::from(target), announce);
        match self.run_batched(op).await?.as_slice() {
            [0] => Ok(Released::NotHeld),
            [1] => Ok(Released::StillHeld),
            [2] => Ok(Released::Freed { heard: None }),
            [2, heard] => Ok(Released::Freed {
                heard: Some((*heard).clamp(0, i64::from(u32::MAX)) as u32),
            }),
            other => Err(unexpected("release", other)),
        }
    }

    /// Hands a plain lock from the hold `from` to a new hold `to` with `lease` (through the node's
    /// batcher): with a token drawn by the call (`scripts/transfer.lua`), or with the token
    /// `granted` that the client gave `to` already (`scripts/transfer_granted.lua`).
    pub(crate) async fn transfer(
        &self,
        keys: &LockKeys,
        from: &Str,
        to: &Str,
        lease: Duration,
        granted: Option<Granted>,
    ) -> Result<Handed, Error> {
        let op = || Op::Transfer {
            lock: keys.lock.clone(),
            fence: keys.fence.clone(),
            channel: keys.channel.clone(),
            from: from.clone(),
            to: to.clone(),
            lease_ms: lease.as_millis().min(i64::MAX as u128) as i64,
            granted,
        };
        match (granted, self.run_batched(op).await?.as_slice()) {
            (Some(granted), [released @ (0 | 1), handed @ (0 | 1)]) => Ok(Handed {
                released: *released == 1,
                token: (*handed == 1).then_some(granted.token),
            }),
            (None, [released @ (0 | 1), 1, _, token]) => Ok(Handed {
                released: *released == 1,
                token: Some(*token.max(&0) as u64),
            }),
            (None, [released @ (0 | 1), 0, _]) => Ok(Handed {
                released: *released == 1,
                token: None,
            }),
            (_, other) => Err(unexpected("transfer", other)),
        }
    }

    /// Runs one operation through the batcher. A call that did not run (the script cache was empty,
    /// and the script is loaded again by then; or a cluster redirected it, and fred knows the new
    /// owner by then) is made again, as a new operation queued behind whatever was queued
    /// meanwhile, while the caller still waits for it (so it never lands after the caller's next
    /// operation on the same hold). Within the same bound as the first try.
    async fn run_batched(&self, op: impl Fn() -> Op) -> Result<Ints, Error> {
        let run = async {
            let mut pause = RetryPause::new();
            loop {
                match self.batcher.run(op()).await {
                    Err(Error::Redis(err)) if not_run(&err) => pause.wait().await,
                    other => return other,
                }
            }
        };
        // Bounded as a whole, the wait for a free call slot included; an operation whose caller
        // left is never sent (see the batcher).
        let bound = self.link.bound();
        match self.link.deadlines.within(Instant::now() + bound, run).await {
            Some(Err(Error::Redis(err))) => Err(self.link.redis_error(err)),
            Some(outcome) => outcome,
            None => Err(Error::Timeout(bound)),
        }
    }

    /// Renews (lease > 0) or checks (lease 0) holds, given as lock keys, the hold's field and the
    /// lease; one flag per hold, true if still held. One script call per slot and lease (and per
    /// [`RENEW_BATCH`] holds), all sent at once: the lease goes once per call, and a call answers
    /// only the holds that are gone. With synced writes, a call that too few replicas
    /// acknowledged fails for its holds: a failed renewal, not a loss.
    pub(crate) async fn renew(&self, locks: &[(&LockKeys, &Str, Duration)]) -> Vec<Result<bool, Error>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for slot in self
            .link
            .topology
            .by_slot(locks.iter().enumerate(), |(_, lock)| &lock.0.lock)
        {
            // Every watchdog hold has the same lease: most slots make one group.
            let mut by_lease: Vec<(Duration, Vec<usize>)> = Vec::new();
            for (i, lock) in slot {
                match by_lease.iter_mut().find(|(lease, _)| *lease == lock.2) {
                    Some((_, group)) => group.push(i),
                    None => by_lease.push((lock.2, vec![i])),
                }
            }
            groups.extend(by_lease.into_iter().map(|(_, group)| group));
        }
        let chunks: Vec<&[usize]> = groups
            .iter()
            .flat_map(|group| group.chunks(RENEW_BATCH))
            .collect();
        let calls: Vec<(Vec<Key>, Vec<Value>)> = chunks
            .iter()
            .map(|chunk| {
                let keys = chunk.iter().map(|&i| Key::from(&locks[i].0.lock)).collect();
                let mut args = Vec::with_capacity(chunk.len() + 1);
                args.push(millis(locks[chunk[0]].2));
                // The hold's own bytes, shared: no copy per renewal.
                args.extend(chunk.iter().map(|&i| Value::String(locks[i].1.clone())));
                (keys, args)
            })
            .collect();
        // In waves: fred fails at once what does not fit its command buffer, and on a cluster a
        // round may hold thousands of slots. Each wave is bounded as one request.
        let mut replies: Vec<Result<Reply<Vec<i64>>, Error>> = Vec::with_capacity(calls.len());
        let mut calls = calls.into_iter().peekable();
        while calls.peek().is_some() {
            let wave: Vec<_> = calls.by_ref().take(RENEW_WAVE).collect();
            let size = wave.len();
            match self.bounded(self.scripts_synced(&scripts().renew, wave)).await {
                Ok(wave) => replies.extend(
                    wave.into_iter()
                        .map(|reply| reply.map_err(|err| self.link.redis_error(err))),
                ),
                Err(err) => replies.extend((0..size).map(|_| Err(err.clone()))),
            }
        }
        let mut out: Vec<Result<bool, Error>> = (0..locks.len()).map(|_| Ok(true)).collect();
        for (chunk, reply) in chunks.into_iter().zip(replies) {
            let gone = reply.and_then(|reply: Reply<Vec<i64>>| {
                self.link.check_acked(reply.acked)?;
                if reply.value.iter().any(|&at| at < 1 || at as usize > chunk.len()) {
                    return Err(unexpected("renew", &reply.value));
                }
                Ok(reply.value)
            });
            match gone {
                Ok(gone) => {
                    for at in gone {
                        out[chunk[at as usize - 1]] = Ok(false);
                    }
                }
                Err(err) => {
                    for &i in chunk {
                        out[i] = Err(err.clone());
                    }
                }
            }
        }
        out
    }

    pub(crate) async fn raise_fence(&self, keys: &LockKeys, token: u64) -> Result<(), Error> {
        let raise = self.script_synced::<i64>(
            &scripts().raise_fence,
            vec![Key::from(&keys.fence)],
            vec![Value::from(token.to_string())],
        );
        let reply = self.bounded_on(raise, &keys.fence).await?;
        // A fence that no replica has would fall back in a failover: not raised, for the quorum.
        self.link.check_acked(reply.acked)
    }

    /// Draws the fencing token of the hold `field` of a plain lock while it holds the lock here
    /// (`scripts/draw_token.lua`): `None` if the hold is not there. `in_step`: this node is one
    /// master of a quorum (see acquire.lua). A token that no replica has would fall back in a
    /// failover: not drawn, when writes are synced.
    pub(crate) async fn draw_token(
        &self,
        keys: &LockKeys,
        field: &Str,
        in_step: bool,
    ) -> Result<Option<u64>, Error> {
        let draw = self.script_synced::<Value>(
            &scripts().draw_token,
            vec![Key::from(&keys.lock), Key::from(&keys.fence)],
            vec![
                Value::String(field.clone()),
                Value::from_static_str(if in_step { "1" } else { "0" }),
            ],
        );
        let reply = self.bounded_on(draw, &keys.lock).await?;
        self.link.check_acked(reply.acked)?;
        // A number, or its digits (the clock's as read, see prelude.lua).
        let token = match &reply.value {
            Value::Integer(n) => u64::try_from(*n).ok(),
            other => other.as_str().and_then(|digits| digits.parse::<u64>().ok()),
        };
        match token {
            Some(0) => Ok(None),
            Some(token) => Ok(Some(token)),
            None => Err(Error::unexpected_reply("draw_token", &reply.value)),
        }
    }

    /// Publishes a plain lock's release message, for a release whose reply was lost: a lone
    /// release's `PUBLISH` follows its `HDEL`'s reply (see `batch::release_alone`), so an `HDEL`
    /// that ran unanswered freed the lock without a word, and its resend finds nothing to remove.
    /// Without this, a waiter of another client would sleep until the lease it saw ran out. A
    /// message too many is one harmless wake-up.
    pub(crate) async fn announce_release(&self, keys: &LockKeys) -> Result<(), Error> {
        use fred::interfaces::PubsubInterface;
        let channel = keys.channel.clone();
        crate::util::telemetry::redis_call("release");
        let _heard: i64 = if self.link.topology.sharded() {
            self.bounded(self.link.batch.spublish(channel, "1")).await?
        } else {
            self.bounded(self.link.batch.publish(channel, "1")).await?
        };
        Ok(())
    }

    pub(crate) async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, Error> {
        let args = vec![
            Value::from(keys.channel.clone()),
            Value::from(self.link.topology.publish()),
        ];
        let unlock = match &keys.kind {
            // Either side of a read-write lock frees the whole of it.
            Kind::Write { rw, .. } | Kind::Read(rw) => self.script(
                &scripts().rw_force_unlock,
                [&rw.write, &rw.readers, &rw.waiting].map(Key::from).to_vec(),
                args,
            ),
            Kind::Plain | Kind::Permit | Kind::Mark(_) | Kind::Fair { .. } | Kind::Waiter(_) => {
                // A fair lock's waiters are woken by name, only the head: here, all of them.
                let message = if matches!(keys.kind, Kind::Plain | Kind::Permit) {
                    "1"
                } else {
                    "*"
                };
                let mut args = args;
                args.push(Value::from(message));
                self.script(&scripts().force_unlock, vec![Key::from(&keys.lock)], args)
            }
        };
        let removed: i64 = self.bounded_on(unlock, &keys.lock).await?;
        Ok(removed == 1)
    }

    /// Whether the lock is held: for a read-write lock's write side, by a writer; for its read side,
    /// by a live reader.
    pub(crate) async fn is_locked(&self, keys: &LockKeys) -> Result<bool, Error> {
        let (rw, read) = match &keys.kind {
            Kind::Write { rw, .. } => (rw, false),
            Kind::Read(rw) => (rw, true),
            Kind::Plain | Kind::Permit | Kind::Mark(_) | Kind::Fair { .. } | Kind::Waiter(_) => {
                let found: i64 = self.bounded(self.link.cmd.exists(&*keys.lock)).await?;
                return Ok(found == 1);
            }
        };
        let state = self.script(
            &scripts().rw_state,
            vec![Key::from(&rw.write), Key::from(&rw.readers)],
            Vec::new(),
        );
        let state: Vec<i64> = self.bounded_on(state, &keys.lock).await?;
        match state.as_slice() {
            [writer, readers] => Ok(if read { *readers > 0 } else { *writer > 0 }),
            other => Err(unexpected("rw_state", other)),
        }
    }

    /// One lock as `scripts/inspect.lua` reads it (for `inspect.rs`): `keys` and `which` (its
    /// `ARGV[1]`) as that script takes them, within the node's bound.
    pub(crate) async fn read_lock(&self, keys: &[&Str], which: &'static str) -> Result<Value, Error> {
        let keys = keys.iter().map(|key| Key::from(*key)).collect();
        let call = self.script(&scripts().inspect, keys, vec![Value::from(which)]);
        self.bounded(call).await
    }

    /// One semaphore as `scripts/inspect_semaphore.lua` reads it (for `inspect.rs`), within the
    /// node's bound; an index of another type is [`Error::WrongType`].
    pub(crate) async fn read_semaphore(&self, keys: &SemaphoreKeys) -> Result<Value, Error> {
        let call = self.script(
            &scripts().inspect_semaphore,
            vec![Key::from(&keys.index)],
            Vec::new(),
        );
        self.bounded_on(call, &keys.index).await
    }

    /// Runs a script whose one key is `key` and whose reply is an integer (the latch's), within the
    /// node's bound; a key of another type is [`Error::WrongType`]. For scripts that are
    /// idempotent and keep no order with other calls (see [`script`](Node::script)).
    pub(crate) async fn run_on(&self, script: &Script, key: &str, args: Vec<Value>) -> Result<i64, Error> {
        let call = self.script(script, vec![Key::from(key)], args);
        self.bounded_on(call, key).await
    }

    /// Runs a script over `keys` (all in one slot) whose reply is a list of integers (the
    /// semaphore's), within the node's bound; a key of another type is [`Error::WrongType`].
    pub(crate) async fn run_list(
        &self,
        script: &Script,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Vec<i64>, Error> {
        let call = self.script(script, keys.iter().map(|k| Key::from(*k)).collect(), args);
        self.bounded_on(call, keys.first().copied().unwrap_or_default())
            .await
    }

    /// [`run_list`](Node::run_list) of a write that the batcher may undo: on the connection the
    /// batcher's calls take (the synced one, when writes are synced), so that an undo sent after a
    /// call whose reply was lost runs after that call, never before it (which would leave what
    /// the call wrote in place for a lease). It does not wait for replicas.
    pub(crate) async fn run_list_undoable(
        &self,
        script: &Script,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Vec<i64>, Error> {
        let call = async {
            let keys: Vec<Key> = keys.iter().map(|k| Key::from(*k)).collect();
            until_run(|| self.link.call_unwaited(script, keys.clone(), args.clone())).await
        };
        self.bounded_on(call, keys.first().copied().unwrap_or_default())
            .await
    }

    /// The publish command of this node's release messages (`PUBLISH`, or `SPUBLISH` on a cluster).
    pub(crate) fn publish(&self) -> &'static str {
        self.link.topology.publish()
    }

    /// One page of `SCAN cursor MATCH pattern COUNT count` on `server` (the server, or one cluster
    /// primary), within the node's bound.
    pub(crate) async fn scan_page(
        &self,
        server: &WithOptions<Client>,
        cursor: &str,
        pattern: &str,
        count: i64,
    ) -> Result<Value, Error> {
        let command = CustomCommand::new_static("SCAN", ClusterHash::Random, false);
        let args: Vec<Value> = vec![
            cursor.into(),
            "MATCH".into(),
            pattern.into(),
            "COUNT".into(),
            count.into(),
        ];
        self.bounded(server.custom(command, args)).await
    }

    /// Runs a script directly (not batched), again while it did not run (see
    /// [`run_batched`](Node::run_batched)); the caller bounds it. These calls (renew, raise the
    /// fence, force-unlock) are idempotent, and none must stay in order with another of the same
    /// hold (a renewal names its hold's generation).
    async fn script<R: fred::types::FromValue>(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, fred::error::Error> {
        until_run(|| script.run(&self.link.cmd, keys.clone(), args.clone())).await
    }

    /// [`script`](Node::script) as a write that replicas confirm, when writes are synced.
    async fn script_synced<R: fred::types::FromValue>(
        &self,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<Reply<R>, fred::error::Error> {
        let mut replies = self.scripts_synced(script, vec![(keys, args)]).await?;
        replies.pop().unwrap_or_else(|| {
            Err(fred::error::Error::new(
                fred::error::ErrorKind::Unknown,
                "no reply",
            ))
        })
    }

    /// Several calls of a script at once as writes that replicas confirm (see
    /// [`NodeClient::call_many`]), each made again while it did not run (see
    /// [`run_batched`](Node::run_batched)); the caller bounds them. One reply per call.
    async fn scripts_synced<R: fred::types::FromValue>(
        &self,
        script: &Script,
        calls: Vec<(Vec<Key>, Vec<Value>)>,
    ) -> Result<Vec<Result<Reply<R>, fred::error::Error>>, fred::error::Error> {
        let mut out: Vec<Option<Result<Reply<R>, fred::error::Error>>> = calls.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        let mut pause = RetryPause::new();
        loop {
            let batch = pending.iter().map(|&i| calls[i].clone()).collect();
            let replies = self.link.call_many(script, batch).await;
            let mut again = Vec::new();
            for (i, reply) in pending.into_iter().zip(replies) {
                match reply {
                    Err(err) if not_run(&err) => again.push(i),
                    other => out[i] = Some(other),
                }
            }
            if again.is_empty() {
                return Ok(out.into_iter().flatten().collect());
            }
            pending = again;
            pause.wait().await;
        }
    }

    /// The one place that bounds a direct request: fred's per-command timeout (see `cmd`), and a
    /// backstop a little later in case fred's timer is late.
    async fn bounded<R>(
        &self,
        request: impl std::future::Future<Output = Result<R, fred::error::Error>>,
    ) -> Result<R, Error> {
        let bound = self.link.bound();
        match tokio::time::timeout(bound + BACKSTOP, request).await {
            Ok(outcome) => outcome.map_err(|err| self.link.redis_error(err)),
            Err(_) => Err(Error::Timeout(bound)),
        }
    }

    /// [`bounded`](Node::bounded) for a request about `key`, telling a key of another type apart.
    async fn bounded_on<R>(
        &self,
        request: impl std::future::Future<Output = Result<R, fred::error::Error>>,
        key: &str,
    ) -> Result<R, Error> {
        match self.bounded(request).await {
            Err(Error::Redis(err)) => Err(Error::from_redis(err, key)),
            other => other,
        }
    }
}

/// Closes a node's command clients: `QUIT` if the servers answer soon, and in any case stops the
/// tasks that drive the connections, which would otherwise keep reconnecting to servers that are gone
/// (a `QUIT` to such a server would wait for the reconnection forever).
async fn close(link: Arc<NodeClient>, connections: Vec<fred::types::ConnectHandle>, owned: bool) {
    // The synced connection is always relock's own; the command client only when it built it.
    let sync = link.sync.as_ref().map(|(sync, _)| Client::clone(sync));
    let clients: Vec<Client> = owned
        .then(|| link.client.clone())
        .into_iter()
        .chain(sync)
        .collect();
    futures::future::join_all(clients.iter().map(crate::redis::link::quit)).await;
    for connection in connections {
        connection.abort();
    }
}

/// How much later than fred's own timeout a request is abandoned by relock's backstop.
const BACKSTOP: Duration = Duration::from_millis(20);

/// Refuses a TLS URL (`rediss://`, `valkeys://` and their cluster and sentinel forms) when the crate
/// was built without a TLS feature, since fred would then only log a warning and connect in plaintext.
/// With `tls-rustls`, makes sure rustls has a process-wide crypto provider (ring) before fred builds
/// its TLS configuration from the URL, which would panic without one.
/// A request made again, after a pause, while it answers that it did not run (see `not_run`).
/// Boxed: fred's command future (about 7 KB) held inline would be held again by every future above
/// this one that takes it as an argument (`bounded_on`'s callers held 22 KB for one semaphore
/// attempt, and moved it at every level). The semaphore row of `--quick --only family`,
/// alternated twice: 174-187 µs of client CPU per section against 236-250.
async fn until_run<R, F>(mut request: impl FnMut() -> F) -> Result<R, fred::error::Error>
where
    F: std::future::Future<Output = Result<R, fred::error::Error>>,
{
    let mut pause = RetryPause::new();
    loop {
        match Box::pin(request()).await {
            Err(err) if not_run(&err) => pause.wait().await,
            other => return other,
        }
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

/// Follows the command connection: an error makes the master suspect until its `run_id` is read
/// again, which tells whether it restarted meanwhile (and so starts its quarantine).
async fn watch_restarts(
    link: Arc<NodeClient>,
    server: String,
    health: Weak<Mutex<Health>>,
    name: Option<Str>,
) {
    let mut errors = link.client.error_rx();
    let mut reconnects = link.client.reconnect_rx();
    let options = Options {
        timeout: Some(Duration::from_secs(2)),
        max_attempts: Some(1),
        ..Options::default()
    };
    loop {
        // A master not seen yet (down or slow at connect) is read at once: until then it cannot vote.
        let seen = health.upgrade().is_some_and(|h| h.lock().run_id.is_some());
        if seen {
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
        }
        // Read the run_id again; while the server is away the request waits in fred's buffer (and
        // is dropped from it after its timeout), so this sends about one request per timeout.
        let info = loop {
            match link.topology.server_info(&link.client, &options).await {
                Ok(info) => break info,
                _ if health.strong_count() == 0 => return,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let Some(health) = health.upgrade() else { return };
        health.lock().observe(&info, &server);
        drop(health);
        if let Some(name) = &name {
            name_connections(&link, name, &options).await;
        }
    }
}

/// Names the command connections of `link` (one per primary on a cluster) `name`, for `CLIENT
/// LIST`; the synced connection too. Best effort: a failure is logged, and the next reconnection
/// tries again.
async fn name_connections(link: &NodeClient, name: &Str, options: &Options) {
    let mut connections = link.topology.primaries(&link.client, options);
    if let Some((sync, _)) = &link.sync {
        connections.extend(link.topology.primaries(sync, options));
    }
    let setname = CustomCommand::new_static("CLIENT", ClusterHash::Random, false);
    let named = connections.iter().map(|connection| {
        let args = vec![Value::from_static_str("SETNAME"), Value::from(name.clone())];
        connection.custom::<Value, _>(setname.clone(), args)
    });
    for result in futures::future::join_all(named).await {
        if let Err(err) = result {
            tracing::debug!(%err, "CLIENT SETNAME failed");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every batched operation's future is boxed once per acquisition and release (and a lock
    /// handle's caller holds its own inline), so a future of fred's held inline somewhere below
    /// costs every operation its size in copies: a 7 KB one cost 2-3 µs of client CPU per cycle at
    /// 256 tasks (see `batch::round`), and 22 KB per semaphore attempt (see `Node::script`). And
    /// a batched operation's box above 1 KB costs an allocation outside glibc's thread cache (see
    /// `batch::direct`).
    #[tokio::test]
    async fn a_requests_future_holds_no_command_future_inline() {
        // Nothing listens on port 1: the futures are measured, never polled.
        let node =
            Node::build("redis://127.0.0.1:1", Duration::from_secs(1), None, None).expect("a valid url");
        let keys = LockKeys::new("relock", "size");
        let owner = Str::from("owner:1");
        let sizes = [
            (
                "acquire",
                std::mem::size_of_val(&node.acquire(&keys, &owner, Duration::from_secs(30), 1, false)),
            ),
            ("release", std::mem::size_of_val(&node.release(&keys, &owner, 0))),
            (
                "run_list",
                std::mem::size_of_val(&node.run_list(
                    &scripts().semaphore_acquire,
                    &[&keys.lock],
                    Vec::new(),
                )),
            ),
            (
                "run_on",
                std::mem::size_of_val(&node.run_on(&scripts().latch_count, &keys.lock, Vec::new())),
            ),
        ];
        for (what, size) in sizes {
            assert!(size < 3 * 1024, "{what}'s future is {size} bytes");
            // A batched operation's box (a one-master quorum boxes this future with a few bytes
            // more) within glibc's thread cache (chunks up to 1,032 bytes): above it, each cost
            // about 500 instructions more (callgrind). 856 and 800 bytes now.
            if matches!(what, "acquire" | "release") {
                assert!(size <= 960, "{what}'s future is {size} bytes");
            }
        }
    }
}
