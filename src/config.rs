//! Configuration builders. All validation happens here, before any I/O.

use std::time::Duration;

use crate::Error;

/// The shortest lease accepted: a chosen floor. The drift allowance (`lease × clock_drift_factor +
/// 2 ms`) leaves a lease of 2 ms or less no validity at all, so it could never be granted, and a few
/// ms more would leave less than a round trip on a loaded network.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// The shortest command or node timeout accepted.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// The shortest renew interval accepted: a third of [`MIN_LEASE`]. Shorter would renew nearly
/// in a loop.
pub const MIN_RENEW_INTERVAL: Duration = Duration::from_nanos(3_333_333);
/// The shortest retry delay accepted (after a split vote): below it, clients would retry nearly in a
/// loop.
pub const MIN_RETRY_DELAY: Duration = Duration::from_millis(1);
/// The longest lease accepted (one day). Longer work keeps a short lease alive with the watchdog.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;

/// Settings of a [`LockClient`](crate::LockClient): the watchdog, key names and Redis timeouts.
///
/// The builder methods never fail; the values are checked when a client is built from them
/// ([`LockClient::connect_with`](crate::LockClient::connect_with)), which returns
/// [`Error::InvalidConfig`] or [`Error::InvalidDuration`] before any I/O.
///
/// ```
/// use std::time::Duration;
/// use relock::LockConfig;
///
/// let config = LockConfig::default()
///     .watchdog_timeout(Duration::from_secs(15))
///     .key_prefix("shop");
/// assert_eq!(config.get_renew_interval(), Duration::from_secs(5)); // watchdog_timeout / 3
/// assert!(config.validate().is_ok());
/// assert!(LockConfig::default().renew_interval(Duration::from_secs(60)).validate().is_err());
/// ```
#[derive(Debug, Clone)]
pub struct LockConfig {
    watchdog_timeout: Duration,
    renew_interval: Option<Duration>,
    key_prefix: String,
    command_timeout: Duration,
    strict_eviction: bool,
    sync_replicas: usize,
    sync_timeout: Duration,
    metrics_lock_names: bool,
    handoff_limit: u32,
    handoff_window: Duration,
    unrecorded_handoffs: u32,
    functions: bool,
    reentrant: bool,
    client_name: Option<String>,
}

impl Default for LockConfig {
    fn default() -> Self {
        LockConfig {
            watchdog_timeout: Duration::from_secs(30),
            renew_interval: None,
            key_prefix: "relock".to_string(),
            command_timeout: Duration::from_secs(5),
            strict_eviction: false,
            sync_replicas: 0,
            sync_timeout: Duration::from_secs(1),
            metrics_lock_names: false,
            handoff_limit: 256,
            handoff_window: Duration::from_millis(20),
            unrecorded_handoffs: 7,
            functions: true,
            reentrant: true,
            client_name: None,
        }
    }
}

impl LockConfig {
    /// The lease of a lock in watchdog mode (the default mode): how long the lock outlives a holder
    /// that stops renewing it, e.g. a crashed process. Default 30 s.
    pub fn watchdog_timeout(mut self, lease: Duration) -> Self {
        self.watchdog_timeout = lease;
        self
    }

    /// How often the watchdog renews the held locks (and checks that fixed-lease holds are still
    /// there). Default `watchdog_timeout / 3`; at least [`MIN_RENEW_INTERVAL`] and shorter than
    /// `watchdog_timeout`.
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// The prefix of every Redis key and channel of this client's locks. Default `"relock"`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// How long one request to Redis may take before it fails with [`Error::Timeout`]. Default 5 s.
    /// It bounds connecting, and every attempt of a [`LockClient`](crate::LockClient). For a
    /// [`MultiLock`](crate::MultiLock), [`QuorumConfig::node_timeout`] bounds its requests instead,
    /// and this only its connecting.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Refuse to connect to a server whose `maxmemory-policy` is not `noeviction`. Lock keys carry a
    /// TTL, so `volatile-*` policies evict them first (and `allkeys-*` as any key): an evicted lock is
    /// a lock granted twice. By default such a server only draws a warning, when it has a
    /// `maxmemory`. Default false.
    pub fn strict_eviction(mut self, strict: bool) -> Self {
        self.strict_eviction = strict;
        self
    }

    /// How many replicas must confirm an acquisition (`WAIT`) before it counts as taken. Default 0
    /// (no waiting). With n > 0, an acquisition whose write fewer than n replicas acknowledged within
    /// [`sync_timeout`](LockConfig::sync_timeout) is undone and fails with [`Error::ReplicaSync`],
    /// and a renewal so unconfirmed counts as a failed renewal (not yet as a loss). Connecting fails
    /// where the server refuses `WAIT`.
    ///
    /// `WAIT` is not consensus: it makes a failover that promotes an acknowledging replica keep the
    /// lock. That is sound with one replica per primary, or with `sync_replicas` equal to the number
    /// of replicas; with more replicas than acknowledged, the one promoted may lack the lock, and the
    /// fencing token stays the backstop.
    pub fn sync_replicas(mut self, replicas: usize) -> Self {
        self.sync_replicas = replicas;
        self
    }

    /// How long an acquisition or renewal waits for [`sync_replicas`](LockConfig::sync_replicas)
    /// replicas to acknowledge it. Default 1 s; at least 1 ms, whole milliseconds.
    pub fn sync_timeout(mut self, timeout: Duration) -> Self {
        self.sync_timeout = timeout;
        self
    }

    /// How many times in a row a lock may pass straight from one owner of this client to another
    /// that waits for it (one script call, the lock never free in between, no release message)
    /// before a release frees it and wakes the waiters of every client. Default 256; 0 turns the
    /// handoff off, so every release frees the lock. A streak also ends once it has lasted
    /// [`handoff_window`](LockConfig::handoff_window), whichever comes first.
    ///
    /// A handoff saves the waiter a round trip, and Redis the release message and the refused
    /// attempts of the other clients' waiters; the limit bounds how long those wait behind this
    /// client. Only plain locks of a [`LockClient`](crate::LockClient) without
    /// [`sync_replicas`](LockConfig::sync_replicas) are handed over: a fair lock keeps its queue, a
    /// read-write lock its sides, and a [`MultiLock`](crate::MultiLock) its majority.
    pub fn handoff_limit(mut self, limit: u32) -> Self {
        self.handoff_limit = limit;
        self
    }

    /// How many handoffs in a row a lock may make (see
    /// [`handoff_limit`](LockConfig::handoff_limit)).
    pub fn get_handoff_limit(&self) -> u32 {
        self.handoff_limit
    }

    /// How long a streak of handoffs between owners of this client may last (from its first
    /// handoff) before a release frees the lock for every client. Default 20 ms.
    ///
    /// The waiters of other clients wait behind a streak about this long (plus the section under
    /// way when it ends). Passing the lock to another client takes a few round trips in which
    /// nobody holds it, so a streak much shorter than that leaves the lock idle more often: with
    /// 1 ms critical sections the default costs about 2 % of the lock's time on a machine whose
    /// round trip is 100 µs.
    pub fn handoff_window(mut self, window: Duration) -> Self {
        self.handoff_window = window;
        self
    }

    /// How long a streak of handoffs may last (see [`handoff_window`](LockConfig::handoff_window)).
    pub fn get_handoff_window(&self) -> Duration {
        self.handoff_window
    }

    /// How many handoffs in a row (see [`handoff_limit`](LockConfig::handoff_limit)) may go
    /// unrecorded in Redis before one records where the lock is. Default 7; 0 records every
    /// handoff.
    ///
    /// A handoff costs Redis one script call, which is most of a hot lock's cost to the server
    /// (each call wakes the server, about 50 µs of its CPU on an otherwise idle one). Unrecorded, the
    /// lock passes from one owner of this client to the next without a call: Redis goes on holding
    /// it for the owner it last recorded, with that owner's lease, and the next call records the
    /// latest owner. Fencing tokens stay strictly increasing: each record raises the fence by this
    /// many tokens ahead, which the unrecorded handoffs use, so that an acquisition elsewhere (after
    /// this client crashed, say) draws above every token handed out here.
    ///
    /// What it costs: for up to 10 ms (or until the owner re-enters the lock, when the record is
    /// made first, or releases it), [`LockClient::inspect`](crate::LockClient::inspect) shows the
    /// owner Redis last recorded, and a release that hands the lock on returns before
    /// Redis confirmed it: a lock lost meanwhile (taken by force, or gone with a server that lost
    /// its data) is reported only to the owner that holds it when the record is made.
    pub fn unrecorded_handoffs(mut self, handoffs: u32) -> Self {
        self.unrecorded_handoffs = handoffs;
        self
    }

    /// How many handoffs in a row may go unrecorded (see
    /// [`unrecorded_handoffs`](LockConfig::unrecorded_handoffs)).
    pub fn get_unrecorded_handoffs(&self) -> u32 {
        self.unrecorded_handoffs
    }

    /// Whether a lock's acquisition by the owner that holds it already joins its hold (true, the
    /// default: Redisson's model, so a call chain can take the lock again deeper down), or fails at
    /// once with [`Error::AlreadyHeld`] and sends nothing (false). A
    /// lock can say otherwise for itself ([`Lock::reentrant`](crate::Lock::reentrant)).
    ///
    /// Owners are tasks by default, so futures joined or selected inside one task (`join!`,
    /// `select!`, `FuturesUnordered`) are one owner: reentrant, they all hold the lock at once;
    /// not reentrant, all but the first fail, loudly. Give each its own [`Owner`](crate::Owner)
    /// to make them exclude each other.
    pub fn reentrant(mut self, on: bool) -> Self {
        self.reentrant = on;
        self
    }

    /// Whether acquisitions are reentrant (see [`reentrant`](LockConfig::reentrant)).
    pub fn get_reentrant(&self) -> bool {
        self.reentrant
    }

    /// Run the locks' common calls as a function of relock's own Redis Functions library where the
    /// server has functions (Redis 7.0 and later). Default true. The library is loaded by
    /// `FUNCTION LOAD` when a client connects and stays on the server (named `relock_` and a hash of
    /// its code: `FUNCTION DELETE` removes one that no client uses any more). It saves the server a
    /// few microseconds of CPU per call: a script defines its Lua functions anew on every call, a
    /// library once. Where the server has no functions, or the user may not load or call them,
    /// relock runs its scripts by `EVALSHA`, as it always does with false.
    pub fn redis_functions(mut self, on: bool) -> Self {
        self.functions = on;
        self
    }

    /// Whether relock may load and call its function library (see
    /// [`redis_functions`](LockConfig::redis_functions)).
    pub fn get_redis_functions(&self) -> bool {
        self.functions
    }

    /// Label the figures of the feature `metrics` with the lock's name (`lock="..."`). Default
    /// false: names can be unbounded (one per SKU, say), and every distinct name is a new series
    /// in the metrics recorder. Turn it on where the names are few. No effect without the feature.
    pub fn metrics_lock_names(mut self, on: bool) -> Self {
        self.metrics_lock_names = on;
        self
    }

    /// Whether figures are labelled with the lock's name (see
    /// [`metrics_lock_names`](LockConfig::metrics_lock_names)).
    pub fn get_metrics_lock_names(&self) -> bool {
        self.metrics_lock_names
    }

    /// The name this client gives its connections (`CLIENT SETNAME`, seen in `CLIENT LIST`) and
    /// records beside its holds for operators (see [`ClientInfo`](crate::ClientInfo)). Default
    /// the program's name and process id, as `inventory-4242`. At most [`MAX_CLIENT_NAME_LEN`]
    /// bytes of printable ASCII without spaces, as Redis takes it.
    ///
    /// A client made from your own fred client
    /// ([`LockClient::from_fred`](crate::LockClient::from_fred)) leaves that client's
    /// connections as you named them, and records this name all the same.
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = Some(name.into());
        self
    }

    /// The client's name in force (see [`client_name`](LockConfig::client_name)): the configured
    /// one, or the program's name and process id.
    pub fn get_client_name(&self) -> String {
        match &self.client_name {
            Some(name) => name.clone(),
            None => default_client_name(),
        }
    }

    /// The configured number of replicas an acquisition waits for.
    pub fn get_sync_replicas(&self) -> usize {
        self.sync_replicas
    }

    /// The configured replica wait.
    pub fn get_sync_timeout(&self) -> Duration {
        self.sync_timeout
    }

    /// Whether [`strict_eviction`](LockConfig::strict_eviction) is on.
    pub fn get_strict_eviction(&self) -> bool {
        self.strict_eviction
    }

    /// The configured watchdog lease.
    pub fn get_watchdog_timeout(&self) -> Duration {
        self.watchdog_timeout
    }

    /// The renew interval in force (explicit, or `watchdog_timeout / 3`).
    pub fn get_renew_interval(&self) -> Duration {
        self.renew_interval.unwrap_or(self.watchdog_timeout / 3)
    }

    /// The configured key prefix.
    pub fn get_key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The configured command timeout.
    pub fn get_command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Checks every value; the error names the first that is wrong.
    pub fn validate(&self) -> Result<(), Error> {
        check_lease("watchdog_timeout", self.watchdog_timeout)?;
        let interval = self.get_renew_interval();
        if interval < MIN_RENEW_INTERVAL {
            return Err(Error::InvalidDuration(format!(
                "renew_interval must be at least {MIN_RENEW_INTERVAL:?}, got {interval:?}"
            )));
        }
        if interval >= self.watchdog_timeout {
            return Err(Error::InvalidConfig(format!(
                "renew_interval ({interval:?}) must be shorter than watchdog_timeout ({:?})",
                self.watchdog_timeout
            )));
        }
        check_timeout("command_timeout", self.command_timeout)?;
        check_timeout("sync_timeout", self.sync_timeout)?;
        if self.sync_timeout.subsec_nanos() % 1_000_000 != 0 {
            return Err(Error::InvalidDuration(format!(
                "sync_timeout must be whole milliseconds, got {:?}",
                self.sync_timeout
            )));
        }
        check_prefix(&self.key_prefix)?;
        match &self.client_name {
            Some(name) => check_client_name(name),
            None => Ok(()),
        }
    }
}

/// The longest client name accepted, in bytes.
pub const MAX_CLIENT_NAME_LEN: usize = 128;

/// Refuses a client name that Redis would refuse (`CLIENT SETNAME` takes printable ASCII without
/// spaces) or that is empty or longer than [`MAX_CLIENT_NAME_LEN`].
fn check_client_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_CLIENT_NAME_LEN {
        return Err(Error::InvalidConfig(format!(
            "client_name must be 1 to {MAX_CLIENT_NAME_LEN} bytes long, got {} bytes",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(Error::InvalidConfig(format!(
            "client_name {name:?} has {c:?}: Redis takes printable ASCII without spaces"
        )));
    }
    Ok(())
}

/// The program's name (its executable's, kept to what a client name may hold) and process id.
fn default_client_name() -> String {
    let program = std::env::current_exe()
        .ok()
        .and_then(|path| path.file_stem().map(|stem| stem.to_string_lossy().into_owned()))
        .map(|stem| {
            stem.chars()
                .filter(char::is_ascii_graphic)
                .take(64)
                .collect::<String>()
        })
        .filter(|stem| !stem.is_empty())
        .unwrap_or_else(|| "relock".to_string());
    format!("{program}-{}", std::process::id())
}

/// Settings of the quorum algorithm of a [`MultiLock`](crate::MultiLock) (Redlock).
///
/// ```
/// use std::time::Duration;
/// use relock::QuorumConfig;
///
/// let config = QuorumConfig::default()
///     .node_timeout(Duration::from_millis(50))
///     .clock_drift_factor(0.01)
///     .retry_delay(Duration::from_millis(200));
/// assert!(config.validate().is_ok());
/// assert!(QuorumConfig::default().clock_drift_factor(2.0).validate().is_err());
/// ```
#[derive(Debug, Clone)]
pub struct QuorumConfig {
    pub(crate) node_timeout: Duration,
    pub(crate) clock_drift_factor: f64,
    pub(crate) retry_delay: Duration,
    pub(crate) restart_quarantine: bool,
    pub(crate) lock: Option<LockConfig>,
}

impl Default for QuorumConfig {
    fn default() -> Self {
        QuorumConfig {
            node_timeout: Duration::from_millis(200),
            clock_drift_factor: 0.01,
            retry_delay: Duration::from_millis(200),
            restart_quarantine: true,
            lock: None,
        }
    }
}

impl QuorumConfig {
    /// The bound of one request to one master; keep it small against the lease. Default 200 ms.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The share of the lease allowed for clock drift between the masters; the drift subtracted from
    /// a lease is `lease * factor + 2 ms`. Default 0.01.
    pub fn clock_drift_factor(mut self, factor: f64) -> Self {
        self.clock_drift_factor = factor;
        self
    }

    /// The base of the random delay before retrying after a split vote: the delay is drawn from
    /// `[retry_delay / 2, retry_delay * 3 / 2)`. Default 200 ms; at least [`MIN_RETRY_DELAY`].
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// The delayed restart of the Redlock page: a master that restarted (so it may have lost the locks
    /// it granted, unless it persists with `appendfsync always`) sits out of every quorum until it has
    /// been up for the longest lease (`watchdog_timeout`, or the longest fixed lease this MultiLock
    /// granted). That is judged by its `uptime_in_seconds` when first seen, so a master that
    /// restarted just before this MultiLock connected (or first reached it) sits out too, and by a new
    /// `run_id` later; a master whose connection dropped sits out until it is seen again. So masters
    /// started moments ago do not vote at first. This assumes no client uses longer leases than that.
    /// Default true.
    pub fn restart_quarantine(mut self, on: bool) -> Self {
        self.restart_quarantine = on;
        self
    }

    /// The watchdog and key settings of the locks. Default: those of the first client given to
    /// [`MultiLock::with_config`](crate::MultiLock::with_config). (Its `command_timeout` does not apply:
    /// `node_timeout` bounds each request.)
    pub fn lock_config(mut self, config: LockConfig) -> Self {
        self.lock = Some(config);
        self
    }

    /// Checks every value; the error names the first that is wrong.
    pub fn validate(&self) -> Result<(), Error> {
        check_timeout("node_timeout", self.node_timeout)?;
        if !(0.0..0.5).contains(&self.clock_drift_factor) {
            return Err(Error::InvalidConfig(format!(
                "clock_drift_factor must be in [0, 0.5), got {}",
                self.clock_drift_factor
            )));
        }
        if self.retry_delay < MIN_RETRY_DELAY || self.retry_delay > MAX_LEASE {
            return Err(Error::InvalidDuration(format!(
                "retry_delay must be between {MIN_RETRY_DELAY:?} and {MAX_LEASE:?}, got {:?}",
                self.retry_delay
            )));
        }
        let Some(lock) = &self.lock else { return Ok(()) };
        lock.validate()?;
        if self.node_timeout >= lock.watchdog_timeout {
            return Err(Error::InvalidConfig(
                "node_timeout must be shorter than watchdog_timeout".into(),
            ));
        }
        Ok(())
    }

    /// The configuration of a [`LockClient`](crate::LockClient), which is the quorum algorithm over one
    /// master: its requests are bounded by `timeout` (the command timeout), and a restart is not
    /// quarantined (one server that restarted lost its locks whatever a quorum does).
    pub(crate) fn for_one_master(timeout: Duration) -> QuorumConfig {
        QuorumConfig::default()
            .node_timeout(timeout)
            .restart_quarantine(false)
    }

    /// The drift allowed for a lease.
    pub(crate) fn drift(&self, lease: Duration) -> Duration {
        lease.mul_f64(self.clock_drift_factor) + Duration::from_millis(2)
    }
}

pub(crate) fn check_lease(what: &str, lease: Duration) -> Result<(), Error> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(Error::InvalidDuration(format!(
            "{what} must be between {MIN_LEASE:?} and {MAX_LEASE:?}, got {lease:?}"
        )));
    }
    if lease.subsec_nanos() % 1_000_000 != 0 {
        return Err(Error::InvalidDuration(format!(
            "{what} must be a whole number of milliseconds, got {lease:?}"
        )));
    }
    Ok(())
}

fn check_timeout(what: &str, timeout: Duration) -> Result<(), Error> {
    if timeout < MIN_TIMEOUT || timeout > MAX_LEASE {
        return Err(Error::InvalidDuration(format!(
            "{what} must be between {MIN_TIMEOUT:?} and {MAX_LEASE:?}, got {timeout:?}"
        )));
    }
    Ok(())
}

fn check_prefix(prefix: &str) -> Result<(), Error> {
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN {
        return Err(Error::InvalidConfig(format!(
            "key_prefix must have 1 to {MAX_PREFIX_LEN} bytes, got {}",
            prefix.len()
        )));
    }
    if prefix.contains(['{', '}']) || prefix.chars().any(char::is_control) {
        return Err(Error::InvalidConfig(format!(
            "key_prefix must not contain braces or control characters: {prefix:?}"
        )));
    }
    Ok(())
}

/// Checks a lock name. Braces would break the hash tag that keeps a lock's keys in one cluster slot.
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::InvalidName("the name is empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidName(format!(
            "the name has {} bytes, at most {MAX_NAME_LEN} are allowed",
            name.len()
        )));
    }
    if name.contains(['{', '}']) || name.chars().any(char::is_control) {
        return Err(Error::InvalidName(format!(
            "the name must not contain braces or control characters: {name:?}"
        )));
    }
    Ok(())
}
