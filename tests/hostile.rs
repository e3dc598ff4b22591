//! Bad input and hostile servers: every input either works or gets a typed error with nothing written
//! to Redis (property tests against a model of the rules), and a key of another type, a server out
//! of memory, a server that wants a password, and a connection cut mid-script each give a clear
//! error and leave the other locks intact.

mod support;

use std::time::Duration;

use proptest::prelude::*;
use relock::{
    Error, LockClient, LockConfig, MultiLock, QuorumConfig, MAX_LEASE, MAX_NAME_LEN, MAX_PREFIX_LEN,
    MIN_LEASE, MIN_RENEW_INTERVAL, MIN_RETRY_DELAY, MIN_TIMEOUT,
};
use support::proxy::Proxy;
use support::{eventually, lock_key, unique_name, RedisServer};
use tokio::time::Instant;

/// Connections the server has accepted so far (each `cmd` of the test support opens one).
fn connections(server: &RedisServer) -> i64 {
    let Some(info) = server.cmd(&["INFO", "stats"]).as_str().map(str::to_string) else {
        panic!("INFO answered nothing");
    };
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received")
}

fn dbsize(server: &RedisServer) -> i64 {
    server.cmd(&["DBSIZE"]).as_int().expect("DBSIZE")
}

/// The rules, written out once more independently of the library: the model the tests hold it to.
fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.contains(['{', '}'])
        && !name.chars().any(char::is_control)
}

fn lease_ok(lease: Duration) -> bool {
    (MIN_LEASE..=MAX_LEASE).contains(&lease) && lease.subsec_nanos() % 1_000_000 == 0
}

fn timeout_ok(timeout: Duration) -> bool {
    (MIN_TIMEOUT..=MAX_LEASE).contains(&timeout)
}

/// A valid timeout this short may run out while connecting: a typed error too, not bad input.
fn may_time_out(timeout: Duration) -> bool {
    timeout < Duration::from_millis(100)
}

fn prefix_ok(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX_LEN
        && !prefix.contains(['{', '}'])
        && !prefix.chars().any(char::is_control)
}

/// Durations around the edges: zero, sub-millisecond parts, the bounds, and far beyond them.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(MIN_LEASE),
        Just(MAX_LEASE),
        Just(MAX_LEASE + Duration::from_millis(1)),
        Just(Duration::MAX),
        (0u64..5_000).prop_map(Duration::from_micros),
        (1u64..120_000).prop_map(Duration::from_millis),
        (0u64..u64::MAX / 2).prop_map(Duration::from_nanos),
    ]
}

/// Names: plain, unicode, with braces or control characters, empty, and too long.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9:._-]{1,40}",
        "\\PC{1,20}",
        ".{0,12}[{}\\x00\\n\\t\\x7f].{0,12}",
        Just(String::new()),
        (MAX_NAME_LEN - 2..MAX_NAME_LEN + 3).prop_map(|n| "n".repeat(n)),
        (MAX_NAME_LEN / 3 - 1..MAX_NAME_LEN / 3 + 2).prop_map(|n| "é€".repeat(n / 2)),
    ]
}

#[test]
fn any_name_and_lease_works_or_is_a_typed_error_that_writes_nothing() {
    let rt = support::runtime();
    let server = RedisServer::start();
    let client = rt.block_on(LockClient::connect(&server.url())).expect("connect");
    let config = ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let cases = std::sync::atomic::AtomicU64::new(0);
    proptest!(config, |(name in name(), lease in proptest::option::of(duration()), wait in duration())| {
        // A fresh name each case (shrinking replays cases): the counter is part of the checked name.
        let name = format!("{}{name}", cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        rt.block_on(async {
            // Earlier cases' short leases may expire meanwhile: a refused input must add no key.
            let before: std::collections::HashSet<String> = server.keys("*").into_iter().collect();
            let mut lock = client.lock(&name);
            if let Some(lease) = lease {
                lock = lock.lease(lease);
            }
            let valid = name_ok(&name) && lease.is_none_or(lease_ok);
            // A lease too short to outlast the round trip and the drift allowance is refused by
            // the algorithm itself (granted too late, undone): only then may a free lock stay unheld.
            let roomy = lease.is_none_or(|l| l >= Duration::from_millis(100));
            // The wait bounds the attempts too, so it must allow a round trip on a loaded machine;
            // the lock is free, so a long one costs nothing.
            let outcome = lock.try_acquire_for(Duration::from_millis(500)).await;
            match outcome {
                Ok(Some(guard)) => {
                    prop_assert!(valid, "{name:?} {lease:?} was accepted");
                    if lease.is_none_or(|l| l >= Duration::from_secs(1)) {
                        let key = lock_key(&name);
                        prop_assert!(server.exists(&key), "no key {}", key);
                        guard.release().await.expect("release");
                        prop_assert!(!server.exists(&key), "{} left after release", key);
                    }
                }
                Ok(None) => prop_assert!(valid && !roomy, "nobody else holds {name:?} ({lease:?})"),
                Err(err) => {
                    prop_assert!(!valid, "{name:?} {lease:?} refused: {err:?}");
                    prop_assert!(err.is_bad_input(), "{err:?}");
                    let added: Vec<String> = server
                        .keys("*")
                        .into_iter()
                        .filter(|k| !before.contains(k) && !support::is_client_record(k))
                        .collect();
                    prop_assert!(added.is_empty(), "a refused input wrote {:?}", added);
                }
            }
            // A wait too long to add to the clock is bad input too, and touches nothing.
            if Instant::now().checked_add(wait).is_none() {
                let err = client.lock("fine").try_acquire_for(wait).await.unwrap_err();
                prop_assert!(matches!(err, Error::InvalidDuration(_)), "{err:?}");
            }
            Ok(())
        })?;
    });
    rt.block_on(client.shutdown());
}

#[test]
fn any_config_works_or_is_a_typed_error_before_any_io() {
    let rt = support::runtime();
    let server = RedisServer::start();
    let config = ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let prefix = prop_oneof![
        "[a-z:]{1,20}",
        ".{0,4}[{}\\n].{0,4}",
        Just(String::new()),
        Just("p".repeat(MAX_PREFIX_LEN + 1))
    ];
    let strategy = (
        duration(),
        proptest::option::of(duration()),
        prefix,
        duration(),
        duration(),
        -1.0f64..1.0,
        duration(),
    );
    proptest!(config, |((watchdog, renew, prefix, command_timeout, node_timeout, drift, retry) in strategy)| {
        let mut lock_config = LockConfig::default()
            .watchdog_timeout(watchdog)
            .key_prefix(prefix.clone())
            .command_timeout(command_timeout);
        if let Some(renew) = renew {
            lock_config = lock_config.renew_interval(renew);
        }
        let interval = renew.unwrap_or(watchdog / 3);
        let lock_valid = lease_ok(watchdog)
            && interval >= MIN_RENEW_INTERVAL
            && interval < watchdog
            && timeout_ok(command_timeout)
            && prefix_ok(&prefix);
        let quorum = QuorumConfig::default()
            .node_timeout(node_timeout)
            .clock_drift_factor(drift)
            .retry_delay(retry)
            .lock_config(lock_config.clone());
        let quorum_valid = lock_valid
            && timeout_ok(node_timeout)
            && (0.0..0.5).contains(&drift)
            && (MIN_RETRY_DELAY..=MAX_LEASE).contains(&retry)
            && node_timeout < watchdog;
        rt.block_on(async {
            let seen = connections(&server);
            match LockClient::connect_with(&server.url(), lock_config).await {
                Ok(client) => {
                    prop_assert!(lock_valid, "accepted");
                    client.shutdown().await;
                }
                Err(Error::Timeout(_)) if lock_valid && may_time_out(command_timeout) => {}
                Err(err) => {
                    prop_assert!(!lock_valid, "refused: {err:?}");
                    prop_assert!(err.is_bad_input(), "{err:?}");
                    // The only connection since is the one that asks.
                    prop_assert_eq!(connections(&server), seen + 1, "a refused config connected");
                }
            }
            let seen = connections(&server);
            match MultiLock::connect_with(&[&server.url()], quorum).await {
                Ok(multi) => {
                    prop_assert!(quorum_valid, "accepted");
                    multi.shutdown().await;
                }
                // Connecting takes the longer timeout; each request there the node timeout.
                Err(Error::Quorum { .. })
                    if quorum_valid && (may_time_out(command_timeout.max(node_timeout)) || may_time_out(node_timeout)) => {}
                Err(err) => {
                    prop_assert!(!quorum_valid, "refused: {err:?}");
                    prop_assert!(err.is_bad_input(), "{err:?}");
                    prop_assert_eq!(connections(&server), seen + 1, "a refused config connected");
                }
            }
            prop_assert_eq!(dbsize(&server), 0);
            Ok(())
        })?;
    });
}

fn config() -> LockConfig {
    LockConfig::default()
        .watchdog_timeout(Duration::from_secs(2))
        .command_timeout(Duration::from_secs(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_fails_alone_in_a_shared_batch() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = LockClient::connect_with(&proxy.url(), config().command_timeout(Duration::from_secs(10)))
        .await
        .unwrap();
    let (good, bad) = (unique_name("good"), unique_name("bad"));
    server.cmd(&["LPUSH", &lock_key(&bad), "not a lock"]);
    // While requests wait in the proxy, 16 acquisitions made one at a time fill the node's rounds
    // in flight (16 at most, `batch::MAX_IN_FLIGHT`). The good and the bad acquisition then queue
    // with no round to lead, and the batcher sends them together, in one batch script call, when
    // the first round ends: the batch loop runs both, and the bad one's error is its own.
    server.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    server.cmd(&["CONFIG", "SET", "slowlog-max-len", "1000"]);
    server.cmd(&["SLOWLOG", "RESET"]);
    proxy.stall_requests();
    let mut fillers = Vec::new();
    for i in 0..16 {
        let lock = client.lock(&format!("{good}:{i}"));
        fillers.push(tokio::spawn(
            relock::Owner::new().scope(async move { lock.acquire().await }),
        ));
        // Each is a round of its own: the one before it is in flight by now.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (good_lock, bad_lock) = (client.lock(&good), client.lock(&bad));
    let both = tokio::spawn(async move {
        tokio::join!(
            relock::Owner::new().scope(good_lock.acquire()),
            relock::Owner::new().scope(bad_lock.acquire()),
        )
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.heal();
    let (ok, err) = both.await.unwrap();
    let mut filled = Vec::new();
    for filler in fillers {
        filled.push(filler.await.unwrap().expect("a filler is granted"));
    }
    // The server's log of every command (threshold 0) names the call: one `FCALL` with both keys.
    let (good_key, bad_key) = (lock_key(&good), lock_key(&bad));
    let shared = match server.cmd(&["SLOWLOG", "GET", "1000"]) {
        support::Reply::Array(entries) => entries.iter().any(|entry| {
            let support::Reply::Array(fields) = entry else {
                return false;
            };
            let Some(support::Reply::Array(args)) = fields.get(3) else {
                return false;
            };
            let args: Vec<&str> = args.iter().filter_map(support::Reply::as_str).collect();
            args.first() == Some(&"FCALL")
                && args.contains(&good_key.as_str())
                && args.contains(&bad_key.as_str())
        }),
        other => panic!("SLOWLOG GET: {other:?}"),
    };
    assert!(shared, "the good and the bad acquisition went in one batch call");
    for guard in filled {
        guard.release().await.unwrap();
    }
    let guard = ok.expect("the good lock is granted");
    let err = err.unwrap_err();
    assert!(
        matches!(&err, Error::WrongType(key) if key.contains(&bad)),
        "{err:?}"
    );
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    assert_eq!(
        server.cmd(&["LRANGE", &lock_key(&bad), "0", "-1"]),
        support::Reply::Array(vec![support::Reply::Str("not a lock".into())])
    );
    // The good lock lives on through renewals.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert!(!server.exists(&lock_key(&good)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_memory_refuses_new_locks_and_keeps_the_held_ones() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let client = LockClient::connect_with(&server.url(), config()).await.unwrap();
    let held = client.lock(&unique_name("held")).acquire().await.unwrap();
    server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);

    let name = unique_name("new");
    let start = Instant::now();
    let err = client.lock(&name).acquire().await.unwrap_err();
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    assert!(err.to_string().contains("OOM"), "not a clear error: {err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "an OOM is not worth waiting for"
    );
    assert!(!server.exists(&lock_key(&name)), "a refused lock was written");

    // Renewals and releases write nothing that needs memory: the held lock stays and goes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(held.is_held(), "the held lock was lost under OOM");
    let held_name = held.name().to_string();
    held.release().await.unwrap();
    assert!(!server.exists(&lock_key(&held_name)));

    server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    let guard = client.lock(&name).acquire().await.unwrap();
    assert!(guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_wanting_a_password_is_a_clear_error_without_it() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let port = server.port();
    for (url, what) in [
        (format!("redis://127.0.0.1:{port}"), "no password"),
        (format!("redis://:wrong@127.0.0.1:{port}"), "a wrong password"),
    ] {
        let start = Instant::now();
        let err = LockClient::connect_with(&url, config()).await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, Error::Redis(e) if *e.kind() == fred::error::ErrorKind::Auth),
            "{what}: not an authentication error: {err:?}"
        );
        assert!(
            text.contains("NOAUTH") || text.contains("WRONGPASS") || text.contains("auth"),
            "{what}: {text}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{what}: took {:?}",
            start.elapsed()
        );
    }
    let client = LockClient::connect_with(&format!("redis://:s3cret@127.0.0.1:{port}"), config())
        .await
        .expect("with the password");
    let name = unique_name("auth");
    let guard = client.lock(&name).acquire().await.unwrap();
    assert!(server.exists(&lock_key(&name)));
    guard.release().await.unwrap();
    assert!(!server.exists(&lock_key(&name)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_script_is_an_error_and_the_grant_is_undone() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let lease = Duration::from_secs(20);
    let cut_config = LockConfig::default()
        .watchdog_timeout(lease)
        .command_timeout(Duration::from_secs(1));
    let direct = LockClient::connect_with(&server.url(), config()).await.unwrap();
    let other = direct.lock(&unique_name("other")).acquire().await.unwrap();
    let through = LockClient::connect_with(&proxy.url(), cut_config).await.unwrap();

    let name = unique_name("cut");
    proxy.drop_replies();
    let start = Instant::now();
    // One attempt (`acquire` would try again through the cut for a lease).
    let err = through.lock(&name).try_acquire().await.unwrap_err();
    assert!(matches!(err, Error::Redis(_) | Error::Timeout(_)), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    // The script ran: the server granted the lock whose reply was lost.
    assert!(
        server.exists(&lock_key(&name)),
        "the request never reached the server"
    );

    // While every reply is cut, the client cannot even finish reconnecting: the undo of the unknown
    // outcome fails, and must be tried again rather than leave the grant for its whole lease.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.heal();
    eventually(Duration::from_secs(10), || !server.exists(&lock_key(&name))).await;
    assert!(
        !server.exists(&lock_key(&name)),
        "the orphaned grant was left for its lease"
    );
    assert!(other.is_held(), "another lock was disturbed");
    let guard = direct
        .lock(&name)
        .try_acquire_for(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(guard.is_some(), "the lock is free again");
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_undo_keeps_trying_the_masters_that_did_not_answer() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies = support::proxy::in_front_of(&servers).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let lock_config = LockConfig::default().watchdog_timeout(Duration::from_secs(20));
    // Restarts are not what this is about; keep every master voting.
    let quorum = QuorumConfig::default()
        .node_timeout(Duration::from_millis(300))
        .restart_quarantine(false)
        .lock_config(lock_config);
    let multi = MultiLock::connect_with(&urls, quorum).await.unwrap();

    let name = unique_name("undo");
    for proxy in &proxies {
        proxy.drop_replies();
    }
    // One attempt (`acquire` would try again through the cut for a lease).
    assert!(
        multi.lock(&name).try_acquire().await.is_err(),
        "granted without a reply"
    );
    assert!(
        servers.iter().all(|s| s.exists(&lock_key(&name))),
        "the grants did not land"
    );
    // One master answers the undo at once; the other two, a majority, stay silent for a while.
    proxies[0].heal();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxies[1].heal();
    proxies[2].heal();

    eventually(Duration::from_secs(10), || {
        servers.iter().all(|s| !s.exists(&lock_key(&name)))
    })
    .await;
    let left: Vec<usize> = (0..3).filter(|&i| servers[i].exists(&lock_key(&name))).collect();
    assert!(
        left.is_empty(),
        "masters {left:?} kept the lost grant for its lease"
    );
    let guard = multi
        .lock(&name)
        .try_acquire_for(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(guard.is_some(), "the lock is free again");
}

/// A connect that cannot work says so at once, as a sentence naming the address: a refused
/// connection and a name that does not resolve within a second (not at the end of the command
/// timeout), and a URL of another scheme before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_are_prompt_sentences_naming_the_address() {
    let config = LockConfig::default().command_timeout(Duration::from_secs(5));
    let port = support::free_port();
    for (url, addr, says) in [
        (
            format!("redis://127.0.0.1:{port}"),
            format!("127.0.0.1:{port}"),
            "connection refused",
        ),
        (
            "redis://no-such-host.invalid:6379".to_string(),
            "no-such-host.invalid:6379".to_string(),
            "could not be resolved",
        ),
    ] {
        let start = Instant::now();
        let err = LockClient::connect_with(&url, config.clone()).await.unwrap_err();
        let took = start.elapsed();
        assert!(took < Duration::from_secs(1), "{url}: {err} after {took:?}");
        let text = err.to_string();
        assert!(matches!(err, Error::Connect { .. }), "{url}: {err:?}");
        assert!(text.contains(&addr) && text.contains(says), "{url}: {text}");
        assert!(!text.contains("Os {"), "a Debug dump: {text}");
        assert!(err.is_transient());
    }
    for url in ["http://127.0.0.1:6379", "ftp://127.0.0.1:6379", "127.0.0.1:6379"] {
        let start = Instant::now();
        let err = LockClient::connect_with(url, config.clone()).await.unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{url}: {err:?}");
        assert!(err.to_string().contains("redis://"), "{err}");
        assert!(start.elapsed() < Duration::from_millis(100));
    }
}
