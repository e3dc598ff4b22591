//! Shared test support, over `relock::testing` (throwaway servers, clusters, a faulty proxy): the
//! reads and helpers that know relock's keys and scripts, and the tests' own configurations.
// Each test uses some of it.
#![allow(dead_code, unused_imports)]

pub mod delay;
pub mod proxy;
pub mod tls;
pub mod topologies;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Short leases, so that a few seconds see several watchdog renewals and a lost lease is noticed
/// within seconds: a 1.5 s watchdog lease renewed every 300 ms, requests bounded at 2 s.
pub fn fast_config() -> relock::LockConfig {
    relock::LockConfig::default()
        .watchdog_timeout(Duration::from_millis(1500))
        .renew_interval(Duration::from_millis(300))
        .command_timeout(Duration::from_secs(2))
}

pub use relock::testing::{
    command_at, encode, free_port, spawn_redis, spawn_tied, Reply, Server as RedisServer,
};

/// Reads of a test server that know relock's keys and commands.
pub trait ServerExt {
    /// How many times the server ran `command` (lower case, e.g. "evalsha"), from `INFO commandstats`.
    fn command_calls(&self, command: &str) -> u64;
    /// How many script calls the server ran: `EVALSHA` and `FCALL` (the batch runs as a function of
    /// relock's library where the server has them).
    fn script_calls(&self) -> u64;
    /// The field of the hold in the lock hash `key` (the first one; a waiter's mark, `field~`, is
    /// no hold).
    fn hold_field(&self, key: &str) -> String;
}

impl ServerExt for RedisServer {
    fn command_calls(&self, command: &str) -> u64 {
        let info = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.as_str()
            .unwrap_or("")
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    fn script_calls(&self) -> u64 {
        self.command_calls("evalsha") + self.command_calls("fcall")
    }

    fn hold_field(&self, key: &str) -> String {
        match self.cmd(&["HKEYS", key]) {
            Reply::Array(fields) => fields
                .iter()
                .filter_map(Reply::as_str)
                .find(|f| !f.ends_with('~'))
                .expect("a hold")
                .to_string(),
            other => panic!("HKEYS {key}: {other:?}"),
        }
    }
}

/// A lock client of either kind, for code that runs the same over one Redis and a MultiLock.
pub enum Locks {
    One(relock::LockClient),
    Quorum(relock::MultiLock),
}

impl Locks {
    pub fn lock(&self, name: &str) -> relock::Lock {
        match self {
            Locks::One(client) => client.lock(name),
            Locks::Quorum(multi) => multi.lock(name),
        }
    }

    pub async fn shutdown(&self) {
        match self {
            Locks::One(client) => client.shutdown().await,
            Locks::Quorum(multi) => multi.shutdown().await,
        }
    }
}

/// A runtime for a synchronous test (a property test drives its cases from plain code): two
/// workers, as the async tests have.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The functions of relock's batch script as the library composes them (`BATCH_FUNCTIONS` in
/// `src/scripts.rs`): the helpers and the functions of every operation.
pub const BATCH_FUNCTIONS: &str = concat!(
    include_str!("../../scripts/prelude.lua"),
    include_str!("../../scripts/acquire.lua"),
    include_str!("../../scripts/release.lua"),
    include_str!("../../scripts/rw_read.lua"),
    include_str!("../../scripts/rw_write.lua"),
    include_str!("../../scripts/rw_write_release.lua"),
    include_str!("../../scripts/rw_unmark.lua"),
    include_str!("../../scripts/fair_acquire.lua"),
    include_str!("../../scripts/fair_release.lua"),
    include_str!("../../scripts/fair_leave.lua"),
    include_str!("../../scripts/transfer.lua"),
    include_str!("../../scripts/transfer_granted.lua"),
);

/// relock's function library as the library composes it (`Library` in `src/scripts.rs`): its
/// name, the name of its batch function, and its code (for `FUNCTION LOAD`).
pub fn batch_library() -> (String, String, String) {
    let template = format!(
        "#!lua name=relock_#\n{BATCH_FUNCTIONS}\nredis.register_function('relock_batch_#', function(KEYS, ARGV)\n{}\nend)\n",
        include_str!("../../scripts/batch.lua")
    );
    let hash = &fred::util::sha1_hash(&template)[..16];
    let (name, function) = (format!("relock_{hash}"), format!("relock_batch_{hash}"));
    let code = template
        .replacen("name=relock_#", &format!("name={name}"), 1)
        .replacen("'relock_batch_#'", &format!("'{function}'"), 1);
    (name, function, code)
}

/// [`batch_library`] loaded on `server` (or found there, loaded already): the name of its batch
/// function, to `FCALL` as relock does. Any other reply of `FUNCTION LOAD` panics.
pub fn load_batch_function(server: &RedisServer) -> String {
    let (_, function, code) = batch_library();
    match server.cmd(&["FUNCTION", "LOAD", &code]) {
        Reply::Str(_) => {}
        Reply::Err(err) if err.contains("already exists") => {}
        other => panic!("FUNCTION LOAD: {other:?}"),
    }
    function
}

/// The names of the function libraries on `server` (`FUNCTION LIST`).
pub fn function_libraries(server: &RedisServer) -> Vec<String> {
    function_list(server, &["FUNCTION", "LIST"], "library_name")
}

/// The code of the function library `name` on `server`, if it has it (`FUNCTION LIST WITHCODE`).
pub fn function_library_code(server: &RedisServer, name: &str) -> Option<String> {
    let list = ["FUNCTION", "LIST", "LIBRARYNAME", name, "WITHCODE"];
    function_list(server, &list, "library_code").into_iter().next()
}

/// The field `field` of each library that the `FUNCTION LIST` command `list` lists.
fn function_list(server: &RedisServer, list: &[&str], field: &str) -> Vec<String> {
    let Reply::Array(libraries) = server.cmd(list) else {
        panic!("FUNCTION LIST");
    };
    libraries
        .iter()
        .filter_map(|library| match library {
            // Each library: a flat list of field names and values.
            Reply::Array(fields) => fields
                .chunks(2)
                .find(|pair| pair[0].as_str() == Some(field))
                .and_then(|pair| pair[1].as_str().map(str::to_string)),
            _ => None,
        })
        .collect()
}

/// The Redis key of the lock `name` under the default prefix.
pub fn lock_key(name: &str) -> String {
    format!("relock:{{{name}}}")
}

/// Waits (without asserting a tight time) until `check` holds; false after `limit`.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// A name no other test (in this process or another) uses.
pub fn unique_name(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Acquires the locks `{base}:0` .. `{base}:{n-1}` of `client`, 500 at a time.
pub async fn acquire_many(client: &relock::LockClient, base: &str, n: usize) -> Vec<relock::LockGuard> {
    let mut guards = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let acquires = chunk.iter().map(|i| {
            let lock = client.lock(&format!("{base}:{i}"));
            async move { lock.acquire().await.expect("acquire") }
        });
        guards.extend(futures::future::join_all(acquires).await);
    }
    guards
}

/// The keys matching `pattern` on `servers`, fence counters and clients' records left out (a fence
/// outlives every lock, and a client's record its holds by up to a lease).
pub fn keys_besides_fences(servers: &[&RedisServer], pattern: &str) -> Vec<String> {
    servers
        .iter()
        .flat_map(|server| server.keys(pattern))
        .filter(|key| !key.ends_with(":fence") && !is_client_record(key))
        .collect()
}

/// Whether `key` is a client's record (`{prefix}:client:{id}`), which a client keeps while it
/// holds anything and which outlives its holds by up to a lease.
pub fn is_client_record(key: &str) -> bool {
    key.split_once(":client:{")
        .is_some_and(|(_, id)| id.len() == 33 && id.ends_with('}'))
}

/// A plain fred client, for reads and writes that do not go through relock.
pub async fn fred_client(url: &str) -> fred::clients::Client {
    use fred::interfaces::ClientLike;
    let config = fred::prelude::Config::from_url(url).expect("url");
    let client = fred::clients::Client::new(config, None, None, None);
    client.init().await.expect("connect");
    client
}

/// `times` non-atomic read-modify-write increments of `counter`, each under `lock`: only mutual
/// exclusion makes the total exact.
pub async fn guarded_increments(
    lock: &relock::Lock,
    admin: &fred::clients::Client,
    counter: &str,
    times: usize,
) {
    use fred::interfaces::KeysInterface;
    for _ in 0..times {
        let guard = lock.acquire().await.expect("acquire");
        let value: Option<i64> = admin.get(counter).await.expect("GET");
        let _: () = admin
            .set(counter, value.unwrap_or(0) + 1, None, None, false)
            .await
            .expect("SET");
        drop(guard);
    }
}

/// The lock keys (of the default prefix) on every live primary of `cluster`.
pub fn cluster_lock_keys(cluster: &topologies::RedisCluster) -> Vec<String> {
    keys_besides_fences(&cluster.primaries(), "relock:*")
}
