//! Beyond one server: locks on a Redis Cluster (spread over every primary, woken by sharded
//! release messages, surviving a resharding move and a failover, released right after a manual
//! failover by a client that had not seen it), writes synced to replicas
//! (`sync_replicas`), and a Sentinel-managed primary. Real servers, faulted for real.

mod support;

use std::time::Duration;

use relock::{Error, LockClient, LockConfig, MultiLock, QuorumConfig};
use support::topologies::{RedisCluster, Replicated, SentinelGroup};
use support::{lock_key, unique_name, RedisServer};
use tokio::time::Instant;

/// A cluster of `primaries` primaries with `replicas` replicas each, started off the runtime.
async fn start_cluster(primaries: usize, replicas: usize) -> RedisCluster {
    tokio::task::spawn_blocking(move || RedisCluster::start(primaries, replicas))
        .await
        .expect("cluster")
}

fn config(lease: Duration) -> LockConfig {
    LockConfig::default()
        .watchdog_timeout(lease)
        .command_timeout(Duration::from_secs(2))
}

/// Two clients of `url` with leases of `lease`: a holder and a waiter.
async fn two_clients(url: &str, lease: Duration) -> (LockClient, LockClient) {
    let a = LockClient::connect_with(url, config(lease)).await.unwrap();
    let b = LockClient::connect_with(url, config(lease)).await.unwrap();
    (a, b)
}

/// `client` is granted the lock `name` at once (it is free after a release), and gives it back.
async fn free_to(client: &LockClient, name: &str) {
    let guard = client
        .lock(name)
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the release");
    guard.release().await.unwrap();
}

/// 120 locks whose names land on all three primaries: one client holds them all, the other is
/// excluded from each, the watchdog keeps them past two leases, and the releases leave nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_locks_on_every_primary_exclude_renew_and_release() {
    let cluster = start_cluster(3, 0).await;
    let lease = Duration::from_secs(1);
    let (a, b) = two_clients(&cluster.url(), lease).await;
    assert!(a.server().starts_with("cluster "), "{}", a.server());

    let names: Vec<String> = (0..120).map(|i| unique_name(&format!("spread{i}"))).collect();
    let mut owners = std::collections::BTreeSet::new();
    for name in &names {
        owners.insert(cluster.primary_of(&lock_key(name)).port());
    }
    assert_eq!(owners.len(), 3, "the names must cover every primary");

    let a_ref = &a;
    let guards =
        futures::future::try_join_all(names.iter().map(|n| async move { a_ref.lock(n).acquire().await }))
            .await
            .expect("a acquires all");
    for name in &names {
        assert!(
            b.lock(name).try_acquire().await.expect("try").is_none(),
            "{name} granted twice"
        );
    }
    // Past two leases: only the watchdog keeps them.
    tokio::time::sleep(lease * 5 / 2).await;
    assert!(
        guards.iter().all(|g| g.is_held()),
        "a lease ran out under the watchdog"
    );
    for name in names.iter().step_by(7) {
        assert!(
            b.lock(name).try_acquire().await.expect("try").is_none(),
            "{name} expired"
        );
    }
    for guard in guards {
        guard.release().await.expect("release");
    }
    assert!(
        support::cluster_lock_keys(&cluster).is_empty(),
        "left behind: {:?}",
        support::cluster_lock_keys(&cluster)
    );
    for name in names.iter().step_by(11) {
        let guard = b
            .lock(name)
            .try_acquire()
            .await
            .expect("try")
            .expect("free after release");
        guard.release().await.unwrap();
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A waiter on a cluster is woken by the holder's release (sharded pub/sub), not by its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waiter_is_woken_by_the_release() {
    let cluster = start_cluster(3, 0).await;
    let (a, b) = two_clients(&cluster.url(), Duration::from_secs(30)).await;
    for round in 0..5 {
        let name = unique_name(&format!("handoff{round}"));
        let held = a.lock(&name).acquire().await.unwrap();
        let lock = b.lock(&name);
        let waiter = tokio::spawn(async move {
            let guard = lock.acquire().await.expect("waiter");
            (Instant::now(), guard)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "granted while held");
        let released = Instant::now();
        held.release().await.unwrap();
        let (granted, guard) = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter was not woken by the release")
            .unwrap();
        assert!(
            granted - released < Duration::from_secs(3),
            "round {round}: handoff took {:?}",
            granted - released
        );
        drop(guard);
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A task of `client` that waits for the lock `name`: when it was granted, and its guard.
fn waiter_for(client: &LockClient, name: &str) -> tokio::task::JoinHandle<(Instant, relock::LockGuard)> {
    let lock = client.lock(name);
    tokio::spawn(async move {
        let guard = lock.acquire().await.expect("waiter");
        (Instant::now(), guard)
    })
}

/// Checks that `waiter` still waits on the lock `held` holds, releases it, and that the release
/// message woke the waiter (within 1.5 s: the lease it saw is longer), then releases its guard.
async fn woken_by_the_release(
    held: relock::LockGuard,
    waiter: tokio::task::JoinHandle<(Instant, relock::LockGuard)>,
    when: &str,
) {
    assert!(
        held.is_held() && !waiter.is_finished(),
        "{when}: not held, or granted while held"
    );
    let released = Instant::now();
    held.release().await.unwrap();
    let (granted, guard) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap_or_else(|_| panic!("{when}: the waiter was never granted"))
        .unwrap();
    let woken = granted - released;
    assert!(
        woken < Duration::from_millis(1500),
        "{when}: woken only after {woken:?}"
    );
    guard.release().await.unwrap();
}

/// Resharding a held lock: its slot moves to another primary. The lock stays held and renewed, the
/// waiter stays excluded and is woken by the release after the move (its subscription follows the
/// slot), and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_a_held_lock_keeps_it_and_its_waiter() {
    let cluster = start_cluster(3, 0).await;
    let lease = Duration::from_secs(4);
    let (a, b) = two_clients(&cluster.url(), lease).await;
    let name = unique_name("moved");
    let key = lock_key(&name);
    let held = a.lock(&name).acquire().await.unwrap();
    let waiter = waiter_for(&b, &name);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let slot = cluster.slot(&key);
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.move_slot_away(slot);
        cluster
    })
    .await
    .unwrap();
    assert!(
        cluster.primary_of_slot(slot).exists(&key),
        "the lock did not move with its slot"
    );

    // More than a lease later: renewed where the slot lives now, and still excluding the waiter.
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    assert!(held.is_held(), "the lock was lost in the move");
    assert!(!waiter.is_finished(), "the waiter was granted a held lock");
    assert!(cluster.primary_of_slot(slot).exists(&key));

    // The lease left at the release is at least two thirds of it (renewed every third): waking
    // well before that is the release message at work.
    woken_by_the_release(held, waiter, "after a move").await;
    assert!(
        support::cluster_lock_keys(&cluster).is_empty(),
        "left behind: {:?}",
        support::cluster_lock_keys(&cluster)
    );

    // Moved away and back between two of the waiter's scans of the slot map: the slot's primary is
    // the one it subscribed on, but the server dropped the subscription when the slot left. The
    // waiter subscribes again all the same, and the release still wakes it. A fixed lease of 20 s:
    // a waiter that missed the release would sleep until it ends.
    let held = a
        .lock(&name)
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let waiter = waiter_for(&b, &name);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let home = cluster.primary_of_slot(slot).port();
    let cluster = tokio::task::spawn_blocking(move || {
        let (home, away) = (cluster.primary_of_slot(slot), cluster.primary_other_than(&[home]));
        // Each move takes milliseconds, as a resharding tool's do.
        cluster.move_slot_from(home, slot, away);
        cluster.move_slot(slot, home);
        cluster
    })
    .await
    .unwrap();
    assert_eq!(cluster.primary_of_slot(slot).port(), home, "moved back");
    // Two scans of the slot map: then the release.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    woken_by_the_release(held, waiter, "after a move away and back").await;

    // A move whose nodes take the new owner one after another, seconds apart, onto the primary
    // with the cluster's largest config epoch (so no epoch rises): the node the waiter subscribed
    // on drops the subscription when it takes the new owner, and only the slot map tells.
    let seed = cluster.nodes[0].port();
    let home = cluster.primary_of_slot(slot).port();
    let cluster = tokio::task::spawn_blocking(move || {
        if home == seed {
            cluster.move_slot(slot, cluster.primary_other_than(&[seed]));
        }
        let to = cluster.primary_other_than(&[seed, cluster.primary_of_slot(slot).port()]);
        to.cmd(&["CLUSTER", "BUMPEPOCH"]);
        let to = to.port();
        cluster.wait_until(Duration::from_secs(20), "settled", |c| c.settled());
        (cluster, to)
    })
    .await
    .unwrap();
    let (cluster, to) = cluster;
    // The waiter's scans have seen the epoch rise (and the scan after it) by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let held = a
        .lock(&name)
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let waiter = waiter_for(&b, &name);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let from = cluster.primary_of_slot(slot).port();
    let node = |port: u16| cluster.nodes.iter().find(|n| n.port() == port).unwrap();
    let id = |port: u16| node(port).cmd(&["CLUSTER", "MYID"]).as_str().unwrap().to_string();
    let (from_id, to_id, slot_arg) = (id(from), id(to), slot.to_string());
    node(to).cmd(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id]);
    node(from).cmd(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id]);
    let to_port = to.to_string();
    if let support::Reply::Array(keys) = node(from).cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]) {
        let keys: Vec<&str> = keys.iter().filter_map(support::Reply::as_str).collect();
        if !keys.is_empty() {
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            migrate.extend(keys);
            node(from).cmd(&migrate);
        }
    }
    node(seed).cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    node(from).cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
    node(to).cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_until(Duration::from_secs(20), "settled", |c| c.settled());
        cluster
    })
    .await
    .unwrap();
    assert_eq!(cluster.primary_of_slot(slot).port(), to, "moved");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    woken_by_the_release(held, waiter, "after a move taken node by node").await;
    a.shutdown().await;
    b.shutdown().await;
}

/// The slot map is read again on its schedule however busy the subscriber is: a client whose other
/// channel carries a message every 50 ms still follows a waited lock's slot to its new primary,
/// and its waiter is woken by the release there (not by the lease it saw at its refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_subscriber_still_follows_a_moved_slot() {
    let cluster = std::sync::Arc::new(start_cluster(3, 0).await);
    let lease = Duration::from_secs(6);
    let (a, b) = two_clients(&cluster.url(), lease).await;
    let (name, busy) = (unique_name("followed"), unique_name("busy"));
    let slot = cluster.slot(&lock_key(&name));
    assert_ne!(slot, cluster.slot(&lock_key(&busy)), "two slots");
    let (held, held_busy) = (
        a.lock(&name).acquire().await.unwrap(),
        a.lock(&busy).acquire().await.unwrap(),
    );
    let (waiter, busy_waiter) = (waiter_for(&b, &name), waiter_for(&b, &busy));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Messages on the busy lock's channel: each wakes its waiter, who is refused and waits again.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (cluster, stop) = (cluster.clone(), stop.clone());
        let channel = format!("{}:released", lock_key(&busy));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let primary = cluster.primary_of(&channel);
                let _ = primary.try_cmd(&["SPUBLISH", &channel, "x"]);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let moved = cluster.clone();
    tokio::task::spawn_blocking(move || {
        moved.move_slot_away(slot);
    })
    .await
    .unwrap();
    // Two scans of the slot map, then the release on the new primary.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    woken_by_the_release(held, waiter, "with a busy subscriber").await;

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    publisher.join().unwrap();
    held_busy.release().await.unwrap();
    busy_waiter.await.unwrap().1.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// Failover with `sync_replicas(1)`: the primary of a held lock's slot is killed and its replica
/// promoted. The replica had the lock (WAIT), so nobody else is granted it while the first client
/// holds it, and the watchdog goes on renewing on the new primary once the killed node is back as
/// its replica (renewals that no replica confirms fail, without ending the hold before its lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_with_synced_replicas_keeps_the_lock() {
    let cluster = start_cluster(3, 1).await;
    let lease = Duration::from_secs(10);
    let synced = |lease| {
        config(lease)
            .sync_replicas(1)
            .sync_timeout(Duration::from_secs(1))
    };
    let a = LockClient::connect_with(&cluster.url(), synced(lease))
        .await
        .unwrap();
    let b = LockClient::connect_with(&cluster.url(), synced(lease))
        .await
        .unwrap();
    let name = unique_name("failover");
    let key = lock_key(&name);
    let held = a.lock(&name).acquire().await.unwrap();
    let slot = {
        let slot = cluster.slot(&key);
        let primary = cluster.primary_of_slot(slot);
        let replica = cluster.replicas_of(primary);
        assert_eq!(replica.len(), 1);
        // A cluster replica answers key commands with MOVED; KEYS reads its own data.
        assert_eq!(
            replica[0].keys(&key),
            std::slice::from_ref(&key),
            "WAIT returned before the replica had the lock"
        );
        slot
    };

    let mut cluster = cluster;
    let old = cluster.primary_of_slot(slot).port();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.failover_and_rejoin(slot);
        cluster
    })
    .await
    .unwrap();
    assert_ne!(cluster.primary_of_slot(slot).port(), old);

    // After the switch the other client is refused, answered by the new primary (errors while its
    // clients learn of the switch are allowed, grants are not), for more than a renew interval.
    let until = Instant::now() + lease / 2;
    let (mut refused, mut failed) = (0, 0);
    while Instant::now() < until || refused < 5 {
        match b.lock(&name).try_acquire().await {
            Ok(Some(_)) => panic!("granted to a second client while the first held it"),
            Ok(None) => refused += 1,
            Err(_) => failed += 1,
        }
        assert!(
            Instant::now() < until + lease,
            "only {refused} refusals, {failed} errors"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held.is_held(), "the holder lost the lock in the failover");
    // Renewed on the new primary: its TTL was set again after the switch.
    let ttl = cluster
        .primary_of_slot(slot)
        .cmd(&["PTTL", &key])
        .as_int()
        .unwrap();
    assert!(ttl > 0, "pttl {ttl}");
    held.release().await.unwrap();
    free_to(&b, &name).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// With synced writes, a semaphore's acquisition goes on the connection its undo takes (the
/// synced one, which runs the `WAIT`s): an undo sent after an acquisition whose reply was lost can
/// then never run before it and leave the permit taken for a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synced_semaphore_acquisition_shares_its_undos_connection() {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let group = tokio::task::spawn_blocking(|| Replicated::start(1))
        .await
        .unwrap();
    let client = LockClient::connect_with(
        &group.primary.url(),
        config(Duration::from_secs(30)).sync_replicas(1),
    )
    .await
    .unwrap();
    // Every command the primary runs, with the address of the connection that sent it.
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (port, stop) = (group.primary.port(), stop.clone());
        std::thread::spawn(move || {
            let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            (&stream).write_all(&support::encode(&["MONITOR"])).unwrap();
            let mut lines = Vec::new();
            let mut reader = BufReader::new(stream);
            while !stop.load(Ordering::SeqCst) {
                let mut line = String::new();
                if reader.read_line(&mut line).is_ok() && !line.is_empty() {
                    lines.push(line);
                }
            }
            lines
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let name = unique_name("synced-sem");
    client
        .lock(&name)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    client
        .semaphore(&name, 2)
        .acquire(1)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let lines = tokio::task::spawn_blocking(move || monitor.join().unwrap())
        .await
        .unwrap();
    let from = |line: &str| {
        line.split(['[', ']'])
            .nth(1)
            .and_then(|s| s.split(' ').nth(1))
            .map(str::to_string)
    };
    let waits: Vec<String> = lines
        .iter()
        .filter(|l| l.contains("\"WAIT\""))
        .filter_map(|l| from(l))
        .collect();
    let sem_index = format!("relock:{{{name}}}:sem\"");
    let acquisitions: Vec<String> = lines
        .iter()
        .filter(|l| {
            l.contains(&sem_index)
                && (l.contains("\"EVALSHA\"") || l.contains("\"FCALL\"") || l.contains("\"evalsha\""))
        })
        .filter_map(|l| from(l))
        .collect();
    assert!(!waits.is_empty(), "no WAIT seen: {lines:#?}");
    assert!(
        !acquisitions.is_empty(),
        "no semaphore acquisition seen: {lines:#?}"
    );
    for addr in &acquisitions {
        assert!(
            waits.contains(addr),
            "the acquisition came from {addr}, the WAITs from {waits:?}"
        );
    }
}

/// A shortfall: with the only replica paused, an acquisition that asks for one replica fails
/// within `sync_timeout` (plus margin) and leaves no key; asking for two replicas with one attached
/// fails the same way. Unpaused, it is granted, and the replica has the lock by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_shortfall_fails_and_leaves_nothing() {
    let group = tokio::task::spawn_blocking(|| Replicated::start(1))
        .await
        .unwrap();
    let url = group.primary.url();
    let wait = Duration::from_millis(500);
    let one = LockClient::connect_with(
        &url,
        config(Duration::from_secs(30))
            .sync_replicas(1)
            .sync_timeout(wait),
    )
    .await
    .unwrap();
    let two = LockClient::connect_with(
        &url,
        config(Duration::from_secs(30))
            .sync_replicas(2)
            .sync_timeout(wait),
    )
    .await
    .unwrap();

    let name = unique_name("synced");
    let guard = one.lock(&name).acquire().await.expect("synced acquire");
    assert!(
        group.replicas[0].exists(&lock_key(&name)),
        "granted before the replica had it"
    );
    guard.release().await.unwrap();

    let name = unique_name("two");
    let start = Instant::now();
    match two.lock(&name).try_acquire().await {
        Err(Error::ReplicaSync { acked: 1, needed: 2 }) => {}
        other => panic!("expected a shortfall of one replica, got {other:?}"),
    }
    assert!(
        start.elapsed() < wait + Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        !group.primary.exists(&lock_key(&name)),
        "the shortfall left the lock behind"
    );

    group.replicas[0].pause();
    let name = unique_name("paused");
    let start = Instant::now();
    let outcome = one.lock(&name).try_acquire().await;
    let took = start.elapsed();
    group.replicas[0].resume();
    match outcome {
        Err(Error::ReplicaSync { acked: 0, needed: 1 }) => {}
        other => panic!("expected a shortfall, got {other:?}"),
    }
    assert!(took < wait + Duration::from_secs(2), "took {took:?}");
    assert!(
        !group.primary.exists(&lock_key(&name)),
        "the shortfall left the lock behind"
    );
    one.shutdown().await;
    two.shutdown().await;
}

/// `sync_replicas` needs `WAIT`: a user whose ACL refuses it cannot connect with it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_replicas_without_wait_is_refused_at_connect() {
    let group = tokio::task::spawn_blocking(|| Replicated::start(1))
        .await
        .unwrap();
    group.primary.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">pw",
        "~relock:*",
        "&relock:*",
        "+evalsha",
        "+script|load",
        "+info",
        "+subscribe",
        "+unsubscribe",
        "+ping",
        "+exists",
        "+hkeys",
        "+hget",
        "+hset",
        "+hdel",
        "+hexists",
        "+pexpire",
        "+pttl",
        "+get",
        "+set",
        "+time",
        "+publish",
        "+config|get",
    ]);
    let url = format!("redis://locker:pw@{}", group.primary.addr());
    let plain = LockClient::connect_with(&url, config(Duration::from_secs(30))).await;
    assert!(plain.is_ok(), "without sync: {plain:?}");
    match LockClient::connect_with(&url, config(Duration::from_secs(30)).sync_replicas(1)).await {
        Err(Error::InvalidConfig(msg)) => assert!(msg.contains("WAIT"), "{msg}"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

/// A Sentinel-managed primary with two replicas and sync on: `SENTINEL FAILOVER` while a lock is
/// held. The lock survives (the promoted replica had it), new acquisitions work after the switch
/// (relock follows the sentinels' `+switch-master` at once), and the holder's watchdog renews on the
/// new primary, confirmed by the other replica. (With one replica, nothing could confirm a write
/// until the sentinels turn the old primary into a replica, some 10 s later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_keeps_a_synced_lock() {
    let group = tokio::task::spawn_blocking(|| SentinelGroup::start(2))
        .await
        .unwrap();
    // Renewals fail until the other replica has synced from the new primary: a lease with room.
    let lease = Duration::from_secs(10);
    let synced = config(lease).sync_replicas(1);
    let a = LockClient::connect_with(&group.url(), synced.clone())
        .await
        .expect("connect");
    let b = LockClient::connect_with(&group.url(), synced)
        .await
        .expect("connect");
    assert!(a.server().contains("relock"), "{}", a.server());
    let name = unique_name("sentinel");
    let held = a.lock(&name).acquire().await.unwrap();
    let before = group.primary_port();
    let group = tokio::task::spawn_blocking(move || {
        group.failover();
        group
    })
    .await
    .unwrap();
    let after = group.primary_port();
    assert_ne!(before, after);
    let promoted = [&group.data.primary]
        .into_iter()
        .chain(&group.data.replicas)
        .find(|s| s.port() == after)
        .unwrap();
    assert!(
        promoted.exists(&lock_key(&name)),
        "the promoted replica lacks the lock"
    );

    // New acquisitions work after the switch, on the new primary (relock follows the sentinels'
    // announcement; one made in the moment before it may land on the old primary, and its release
    // may meet the reconnection).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let other = unique_name("after");
        match b.lock(&other).try_acquire().await {
            Ok(Some(guard)) if promoted.exists(&lock_key(&other)) => {
                guard.release().await.unwrap();
                break;
            }
            Ok(Some(guard)) => drop(guard),
            _ => {}
        }
        assert!(Instant::now() < deadline, "no acquisition on the new primary");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        b.lock(&name).try_acquire().await.unwrap().is_none(),
        "granted twice"
    );
    tokio::time::sleep(lease).await;
    assert!(held.is_held(), "not renewed on the new primary");
    assert!(promoted.exists(&lock_key(&name)));
    held.release().await.unwrap();
    assert!(!promoted.exists(&lock_key(&name)));
    a.shutdown().await;
    b.shutdown().await;
}

/// A `MultiLock` whose masters are a Sentinel group and two single servers: a failover of the
/// group is a restart to the quorum (the promoted replica may lack locks), so the group sits out
/// of quorums for the longest lease, then votes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilock_quarantines_a_sentinel_group_that_failed_over() {
    let group = tokio::task::spawn_blocking(|| SentinelGroup::start(1))
        .await
        .unwrap();
    let singles = [RedisServer::start(), RedisServer::start()];
    let lease = Duration::from_secs(3);
    let url = group.url();
    let urls = [url.as_str(), &singles[0].url(), &singles[1].url()];
    let quorum = QuorumConfig::default()
        .node_timeout(Duration::from_millis(500))
        .lock_config(config(lease));
    let multi = MultiLock::connect_with(&urls, quorum).await.expect("connect");
    // Servers only just started do not vote at first (restart quarantine judges their uptime).
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    // Whether the group granted `name` (on whichever server it reached; replicas copy it), and
    // on how many singles. A quorum returns at a majority: the last grant may land a moment later.
    let votes = |name: &str, group: &SentinelGroup| {
        let key = lock_key(name);
        std::thread::sleep(Duration::from_millis(300));
        let on_group = [&group.data.primary]
            .into_iter()
            .chain(&group.data.replicas)
            .any(|s| s.exists(&key));
        (on_group, singles.iter().filter(|s| s.exists(&key)).count())
    };
    let name = unique_name("before");
    let guard = multi.lock(&name).acquire().await.unwrap();
    assert_eq!(
        votes(&name, &group),
        (true, 2),
        "every master votes before the failover"
    );
    guard.release().await.unwrap();

    let group = tokio::task::spawn_blocking(move || {
        group.failover();
        group
    })
    .await
    .unwrap();
    // Once the client has followed the switch (it reads the new run_id), the group sits out.
    let deadline = Instant::now() + Duration::from_secs(5);
    let sat_out = loop {
        let name = unique_name("after");
        let guard = multi.lock(&name).acquire().await.unwrap();
        let seen = votes(&name, &group);
        guard.release().await.unwrap();
        if !seen.0 || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(sat_out, (false, 2), "the failed-over group voted at once");
    // A lease later it votes again.
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    let name = unique_name("later");
    let guard = multi.lock(&name).acquire().await.unwrap();
    assert_eq!(votes(&name, &group), (true, 2), "the group never came back");
    guard.release().await.unwrap();
    multi.shutdown().await;
}

/// The watchdog on a cluster makes one call per slot held: 6,000 locks over more than 4,096 slots
/// (more calls than fred buffers at once) are all kept past two leases. The lease leaves room for a
/// debug build on a loaded machine, where a round of 4,096 calls took longer than a 2 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_watchdog_keeps_locks_on_thousands_of_slots() {
    let cluster = start_cluster(3, 0).await;
    let lease = Duration::from_secs(6);
    let client = LockClient::connect_with(&cluster.url(), config(lease))
        .await
        .unwrap();
    let base = unique_name("many");
    let guards = support::acquire_many(&client, &base, 6_000).await;
    let slots: std::collections::HashSet<u16> = (0..6_000)
        .map(|i| cluster.slot(&lock_key(&format!("{base}:{i}"))))
        .collect();
    assert!(slots.len() > 4096, "only {} slots", slots.len());
    tokio::time::sleep(lease * 5 / 2).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    assert_eq!(held, guards.len(), "leases ran out under the watchdog");
    drop(guards);
    client.shutdown().await;
}

/// A release right after a manual failover of its slot (`CLUSTER FAILOVER`: the replica takes over,
/// the old primary turns replica, no connection drops), by a client whose slot map still names the
/// old primary: the release call answers `MOVED` there and is made again on the new primary; the
/// `WAIT` sent to the old node fails (a replica refuses `WAIT`), and that must not be read as the
/// release's outcome (it once was: the release failed and the lock stayed its lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_release_right_after_a_manual_failover_is_made_on_the_new_primary() {
    let cluster = start_cluster(3, 1).await;
    let lease = Duration::from_secs(30);
    let synced = config(lease)
        .sync_replicas(1)
        .sync_timeout(Duration::from_secs(1));
    let a = LockClient::connect_with(&cluster.url(), synced.clone())
        .await
        .unwrap();
    let name = unique_name("manual-failover");
    let key = lock_key(&name);
    let held = a.lock(&name).acquire().await.unwrap();
    let slot = cluster.slot(&key);
    let cluster = tokio::task::spawn_blocking(move || {
        let old = cluster.primary_of_slot(slot).port();
        let replica = cluster.replicas_of(cluster.primary_of_slot(slot))[0];
        replica.cmd(&["CLUSTER", "FAILOVER"]);
        cluster.wait_until(Duration::from_secs(30), "switched", |c| {
            c.settled() && c.primary_of_slot(slot).port() != old
        });
        cluster
    })
    .await
    .unwrap();
    held.release().await.expect("released on the new primary");
    let primary = cluster.primary_of_slot(slot);
    assert!(!primary.exists(&key), "the lock is still on the new primary");
    let b = LockClient::connect_with(&cluster.url(), synced).await.unwrap();
    free_to(&b, &name).await;
    a.shutdown().await;
    b.shutdown().await;
}
