//! The defects of the outside safety review, each held to its fix against real redis-servers:
//! re-entry against a master that lost the hold, NOSCRIPT resends, late loss news, releases that
//! reach a minority, cancelled waiters, a master listed twice, and the smaller findings.

mod support;

use std::time::Duration;

use relock::{Error, LockClient, LockConfig, MultiLock, Owner, QuorumConfig};
use support::proxy::Proxy;
use support::ServerExt;
use support::{eventually, lock_key, unique_name, RedisServer, Reply};
use tokio::time::Instant;

/// Three masters, each behind a proxy, and a MultiLock over the proxies.
struct Masters {
    servers: Vec<RedisServer>,
    proxies: Vec<Proxy>,
    multi: MultiLock,
}

async fn masters(lease: Duration) -> Masters {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies = support::proxy::in_front_of(&servers).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    // Restarts are not what these are about (and the servers are new): keep every master voting.
    let quorum = QuorumConfig::default()
        .node_timeout(Duration::from_millis(300))
        .retry_delay(Duration::from_millis(50))
        .restart_quarantine(false)
        .lock_config(LockConfig::default().watchdog_timeout(lease));
    let multi = MultiLock::connect_with(&urls, quorum).await.expect("connect");
    Masters {
        servers,
        proxies,
        multi,
    }
}

/// 1. A re-entry must never drop a hold that a majority still backs, even when a master that lost
/// it answers first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_keeps_a_hold_that_a_majority_backs() {
    let m = masters(Duration::from_secs(20)).await;
    let name = unique_name("reenter");
    let lock = m.multi.lock(&name);
    let outer = lock.acquire().await.unwrap();
    // A and B answer late, so C, which lost the hold, answers first every time.
    m.proxies[0].latency(Duration::from_millis(15));
    m.proxies[1].latency(Duration::from_millis(15));
    for cycle in 0..50 {
        m.servers[2].cmd(&["DEL", &lock_key(&name)]);
        let inner = lock.acquire().await.unwrap();
        assert_eq!(inner.hold_count(), 2, "cycle {cycle}");
        assert!(outer.is_held(), "cycle {cycle}: the outer hold was dropped");
        assert!(inner.is_held(), "cycle {cycle}");
        drop(inner);
    }
    assert!(m.servers[0].exists(&lock_key(&name)) && m.servers[1].exists(&lock_key(&name)));
    outer.release().await.unwrap();
}

/// 2. A call that met an empty script cache is not resent behind later calls: a release that was
/// given up must never land after the same owner's next acquisition. Both ways relock runs its
/// batch: by `EVALSHA` (`SCRIPT FLUSH`; the reload answers a 40-byte SHA) and as a function of its
/// library (`FUNCTION FLUSH`; the reload answers the library's name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noscript_release_never_lands_after_the_next_grant() {
    noscript_release(false, &["SCRIPT", "FLUSH"], b"$40\r\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_found_no_function_never_lands_after_the_next_grant() {
    let (library, _, _) = support::batch_library();
    noscript_release(true, &["FUNCTION", "FLUSH"], library.as_bytes()).await;
}

async fn noscript_release(functions: bool, flush: &[&str], reload_reply: &[u8]) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let config = LockConfig::default()
        .watchdog_timeout(Duration::from_secs(20))
        .command_timeout(Duration::from_millis(200))
        .redis_functions(functions);
    let client = LockClient::connect_with(&proxy.url(), config.clone())
        .await
        .unwrap();
    let other = LockClient::connect_with(&server.url(), config).await.unwrap();
    let name = unique_name("noscript");
    let lock = client.lock(&name);

    let guard = lock.acquire().await.unwrap();
    server.cmd(flush);
    // The reply to the reload that follows the release's NOSCRIPT comes late, after the release
    // has timed out and the next acquisition was sent.
    proxy.delay_reply_once(reload_reply, Duration::from_millis(400));
    let reloads = (
        server.command_calls("script|load"),
        server.command_calls("function|load"),
    );
    drop(guard);
    // Replies queue behind the late one, so an attempt may time out: try again, as a caller would.
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        match lock.acquire().await {
            Ok(guard) => break guard,
            Err(Error::Timeout(_)) if Instant::now() < deadline => continue,
            Err(err) => panic!("{err:?}"),
        }
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        server.exists(&lock_key(&name)),
        "the new hold was freed by the old release"
    );
    assert!(again.is_held());
    let stolen = other.lock(&name).try_acquire().await.unwrap();
    assert!(stolen.is_none(), "a second client was granted the lock");
    again.release().await.unwrap();
    // The flushed cache was loaded again: the case this test is about happened.
    let after = (
        server.command_calls("script|load"),
        server.command_calls("function|load"),
    );
    assert!(
        if functions {
            after.1 > reloads.1
        } else {
            after.0 > reloads.0
        },
        "no reload: {reloads:?} then {after:?}"
    );
}

/// 3. The news of a lost lease comes when the lease runs out, not when a hung renewal gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_at_the_deadline_while_a_renewal_hangs() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let lease = Duration::from_millis(1000);
    let config = LockConfig::default()
        .watchdog_timeout(lease)
        .command_timeout(Duration::from_secs(3));
    let client = LockClient::connect_with(&proxy.url(), config).await.unwrap();
    let guard = client.lock(&unique_name("hang")).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let cut = Instant::now();
    proxy.partition();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() never fired");
    let took = cut.elapsed();
    // The last renewal was at most a renew interval before the cut: the deadline is within a lease.
    assert!(
        took <= lease + Duration::from_millis(250),
        "lost() fired {took:?} after the cut, the lease is {lease:?}"
    );
    assert!(!guard.is_held());
    proxy.heal();
}

/// 4. A release that reached only a minority is retried on the others until they have it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_reached_a_minority_is_retried() {
    let m = masters(Duration::from_secs(20)).await;
    let name = unique_name("minority");
    let guard = m.multi.lock(&name).acquire().await.unwrap();
    m.proxies[1].partition();
    m.proxies[2].partition();
    let result = guard.release().await;
    assert!(
        result.is_err(),
        "a release on one of three is not confirmed: {result:?}"
    );
    assert!(!m.servers[0].exists(&lock_key(&name)));
    m.proxies[1].heal();
    m.proxies[2].heal();
    let healed = Instant::now();
    let gone = eventually(Duration::from_secs(2), || {
        m.servers.iter().all(|s| !s.exists(&lock_key(&name)))
    })
    .await;
    assert!(gone, "the majority kept the lock after the heal");
    println!("released everywhere {:?} after the heal", healed.elapsed());
}

/// 5. A waiter woken by a release and then dropped passes the wake-up on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_woken_waiter_passes_the_wake_up_on() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let config = LockConfig::default()
        .watchdog_timeout(Duration::from_secs(20))
        .command_timeout(Duration::from_secs(3));
    let holder = LockClient::connect_with(&server.url(), config.clone())
        .await
        .unwrap();
    let waiting = LockClient::connect_with(&proxy.url(), config).await.unwrap();
    let name = unique_name("baton");
    let guard = holder.lock(&name).acquire().await.unwrap();

    let first = {
        let lock = waiting.lock(&name);
        tokio::spawn(Owner::new().scope(async move { lock.acquire().await.map(drop) }))
    };
    let second = {
        let lock = waiting.lock(&name);
        tokio::spawn(Owner::new().scope(async move { lock.acquire().await }))
    };
    // Both have been refused and subscribed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Requests of the waiting client now stall in the proxy (the release message still comes):
    // the woken waiter's attempt stalls behind the fillers' calls, and is dropped before any answer
    // to it comes back.
    proxy.stall_requests();
    let mut fillers = Vec::new();
    for i in 0..4 {
        let lock = waiting.lock(&format!("{name}-filler-{i}"));
        fillers.push(tokio::spawn(async move { lock.try_acquire().await.map(drop) }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let released = Instant::now();
    drop(guard);
    // Whichever waiter the message woke is the one to drop; the other must be handed the lock.
    tokio::time::sleep(Duration::from_millis(150)).await;
    first.abort();
    proxy.heal();
    let outcome = tokio::time::timeout(Duration::from_secs(3), second)
        .await
        .map(|joined| joined.unwrap());
    match outcome {
        Ok(Ok(guard)) => {
            println!(
                "the second waiter got the lock {:?} after the release",
                released.elapsed()
            );
            assert!(released.elapsed() < Duration::from_secs(2));
            drop(guard);
        }
        other => panic!("the second waiter slept on: {other:?}"),
    }
    for filler in fillers {
        let _ = filler.await;
    }
}

/// 6. One server under two names is one voter, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_listed_twice_is_refused_or_kept_from_voting() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    let urls = [a.url(), format!("redis://localhost:{}", a.port()), b.url()];
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let quorum = QuorumConfig::default().restart_quarantine(false);
    let err = MultiLock::connect_with(&urls, quorum.clone()).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig(ref m) if m.contains("run_id")),
        "{err:?}"
    );

    // Reached only later: a proxy to `a`, cut off at connect. Once reached it must not vote, so
    // with `b` gone, `a` alone is no majority.
    let proxy = Proxy::start(a.port()).await;
    proxy.partition();
    let urls = [a.url(), proxy.url(), b.url()];
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let multi = MultiLock::connect_with(
        &urls,
        quorum
            .node_timeout(Duration::from_millis(300))
            .lock_config(LockConfig::default().command_timeout(Duration::from_millis(500))),
    )
    .await
    .unwrap();
    proxy.heal();
    drop(b);
    tokio::time::sleep(Duration::from_secs(3)).await; // the watcher reads the proxy's run_id
    let outcome = multi.lock(&unique_name("twice")).try_acquire().await;
    assert!(matches!(outcome, Err(Error::Quorum { .. })), "{outcome:?}");
}

/// Shutdown racing acquisitions: nothing is granted after it, and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_racing_acquisitions_leaves_nothing_held() {
    let server = RedisServer::start();
    for round in 0..5 {
        let client = LockClient::connect(&server.url()).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..40 {
            let lock = client.lock(&format!("race-{round}-{i}"));
            tasks.push(tokio::spawn(async move { lock.try_acquire().await }));
        }
        tokio::task::yield_now().await;
        client.shutdown().await;
        for task in tasks {
            if let Ok(Ok(Some(guard))) = task.await {
                assert!(!guard.is_held(), "a guard outlived the shutdown");
                tokio::time::timeout(Duration::from_secs(1), guard.lost())
                    .await
                    .expect("lost() of a guard after shutdown");
            }
        }
        let held = || -> Vec<String> {
            let keys = server.keys(&format!("relock:{{race-{round}-*"));
            keys.into_iter().filter(|k| !k.ends_with(":fence")).collect()
        };
        let none = eventually(Duration::from_secs(2), || held().is_empty()).await;
        assert!(none, "locks left after shutdown: {:?}", held());
    }
}

/// A renewal that arrives after its hold was released never extends the owner's next hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_never_extends_a_later_hold() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let name = unique_name("stale");
    let key = lock_key(&name);
    let lock = client.lock(&name);
    let first = lock.acquire().await.unwrap();
    let old_field = server.hold_field(&key);
    first.release().await.unwrap();
    let second = lock
        .clone()
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    // The watchdog's renewal of the first hold, sent late: the renew script with its field.
    let renew = include_str!("../scripts/renew.lua");
    let reply = server.cmd(&["EVAL", renew, "1", &key, "30000", &old_field]);
    assert_eq!(
        reply,
        Reply::Array(vec![Reply::Int(1)]),
        "the old hold was renewed (its position is not among the gone)"
    );
    let ttl = server.cmd(&["PTTL", &key]).as_int().unwrap();
    assert!(ttl <= 1000, "the fixed lease was stretched to {ttl} ms");
    drop(second);
}

/// `force_unlock` reaches a fixed-lease holder too, within a renew interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_holder_learns_of_a_force_unlock() {
    let server = RedisServer::start();
    let config = LockConfig::default()
        .watchdog_timeout(Duration::from_millis(1500))
        .renew_interval(Duration::from_millis(300));
    let client = LockClient::connect_with(&server.url(), config).await.unwrap();
    let lock = client.lock(&unique_name("forced")).lease(Duration::from_secs(20));
    let guard = lock.acquire().await.unwrap();
    assert!(lock.force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the fixed-lease holder never learned");
    assert!(!guard.is_held());
}

/// Eviction policies that may remove lock keys: refused in strict mode, accepted otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_refused_in_strict_mode() {
    let server = RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"]);
    let strict = LockConfig::default().strict_eviction(true);
    let err = LockClient::connect_with(&server.url(), strict).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig(ref m) if m.contains("volatile-lru")),
        "{err:?}"
    );
    let client = LockClient::connect(&server.url()).await.unwrap();
    drop(client.lock("fine").acquire().await.unwrap());
    let safe = RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"]);
    let strict = LockConfig::default().strict_eviction(true);
    LockClient::connect_with(&safe.url(), strict).await.unwrap();
}

/// Attempts made while the server is away are not replayed when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_during_an_outage_are_not_replayed() {
    let mut server = RedisServer::start();
    let config = LockConfig::default().command_timeout(Duration::from_millis(200));
    let client = LockClient::connect_with(&server.url(), config).await.unwrap();
    server.kill();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let lock = client.lock(&format!("outage-{i}"));
        tasks.push(tokio::spawn(async move { lock.try_acquire().await }));
    }
    for task in tasks {
        assert!(task.await.unwrap().is_err(), "granted with the server down");
    }
    server.restart();
    // Let the client reconnect and flush whatever it kept.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A replayed acquisition would have written its lock (a plain lock draws no token, so no
    // fence), which stays for the lease.
    let written = server.keys("*outage-*");
    assert!(
        written.is_empty(),
        "{} attempts were replayed at reconnect: {written:?}",
        written.len()
    );
}

/// A plain URL to a Redis Cluster node is a clear error at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_needs_a_cluster_url() {
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let err = LockClient::connect(&server.url()).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig(ref m) if m.contains("redis-cluster://")),
        "{err:?}"
    );
}

/// A fence key of another type fails the draw of a token before anything is written; a plain
/// lock's acquisition does not touch the fence, and a fair lock's (which draws at the grant) fails
/// before it writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_fence_fails_before_any_write() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let name = unique_name("fence");
    let fence = format!("{}:fence", lock_key(&name));
    server.cmd(&["LPUSH", &fence, "x"]);
    let guard = client
        .lock(&name)
        .try_acquire()
        .await
        .unwrap()
        .expect("a free lock");
    let err = guard.fencing_token().await.unwrap_err();
    assert!(matches!(err, Error::WrongType(_)), "{err:?}");
    assert_eq!(
        server.cmd(&["LRANGE", &fence, "0", "-1"]),
        Reply::Array(vec![Reply::Str("x".into())])
    );
    assert!(guard.is_held(), "a failed draw leaves the hold alone");
    guard.release().await.unwrap();

    let fair = unique_name("fence-fair");
    let fair_key = format!("{}:fair", lock_key(&fair));
    server.cmd(&["LPUSH", &format!("{fair_key}:fence"), "x"]);
    let err = client.fair_lock(&fair).try_acquire().await.unwrap_err();
    assert!(matches!(err, Error::WrongType(_)), "{err:?}");
    assert!(!server.exists(&fair_key), "the lock was written");
}

/// The owner's next acquisition replaces an ended generation of its own hold that is still in
/// Redis (a release on its way, a hold lost), and only that: another owner's field refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_replaces_its_own_ended_generation_only() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let name = unique_name("ended");
    let key = lock_key(&name);
    let owner = Owner::new();
    let lock = client.lock(&name).owner(owner.clone());
    let first = lock.acquire().await.unwrap();
    let ended = server.hold_field(&key);
    first.release().await.unwrap();
    // The first generation's field, as if its release had not landed yet.
    server.cmd(&["HSET", &key, &ended, "1"]);
    server.cmd(&["PEXPIRE", &key, "20000"]);
    let next = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("refused by its own ended hold");
    match server.cmd(&["HKEYS", &key]) {
        Reply::Array(fields) => {
            assert_eq!(fields.len(), 1, "{fields:?}");
            assert_ne!(fields[0].as_str(), Some(ended.as_str()), "the ended field stayed");
        }
        other => panic!("{other:?}"),
    }
    next.release().await.unwrap();

    // Another owner's field, even of the same client: refused, and nothing written but the
    // waiter's mark beside it (`field~`: its release will be announced).
    let other_owner = client.lock(&name).owner(Owner::new());
    let held = other_owner.acquire().await.unwrap();
    let holder = server.hold_field(&key);
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "granted over another owner"
    );
    assert_eq!(server.cmd(&["HLEN", &key]).as_int(), Some(2));
    assert_eq!(server.cmd(&["HGET", &key, &holder]).as_int(), Some(1));
    assert_eq!(
        server.cmd(&["HGET", &key, &format!("{holder}~")]).as_int(),
        Some(1)
    );
    held.release().await.unwrap();
    assert_eq!(
        server.cmd(&["EXISTS", &key]).as_int(),
        Some(0),
        "the mark outlived its hold"
    );
}
