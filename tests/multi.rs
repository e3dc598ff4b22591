//! MultiLock (Redlock) against several real redis-server masters, with masters killed, paused and
//! brought back.

mod support;

use std::time::Duration;

use relock::{Error, LockClient, LockConfig, MultiLock, QuorumConfig};
use support::ServerExt;
use support::{eventually, lock_key, unique_name, RedisServer};
use tokio::time::Instant;

fn lock_config() -> LockConfig {
    LockConfig::default()
        .watchdog_timeout(Duration::from_millis(2000))
        .renew_interval(Duration::from_millis(400))
        .command_timeout(Duration::from_secs(2))
}

fn quorum_config() -> QuorumConfig {
    // Generous against a loaded 2-core machine, still small against the lease. The servers here are
    // seconds old, so the restart quarantine would keep them all out at first: the tests about
    // restarts turn it on (`with_quarantine`) and let the servers age first.
    QuorumConfig::default()
        .node_timeout(Duration::from_millis(300))
        .retry_delay(Duration::from_millis(100))
        .restart_quarantine(false)
        .lock_config(lock_config())
}

/// Waits until servers started now have been up longer than `lease` (INFO's uptime counts whole
/// seconds), so that the restart quarantine lets them vote.
async fn age(lease: Duration) {
    tokio::time::sleep(lease + Duration::from_millis(1100)).await;
}

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

async fn multi(servers: &[RedisServer]) -> MultiLock {
    multi_with(servers, quorum_config()).await
}

async fn multi_with(servers: &[RedisServer], quorum: QuorumConfig) -> MultiLock {
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    MultiLock::connect_with(&urls, quorum).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_reentrancy_and_fencing_on_one_three_and_five() {
    for n in [1, 3, 5] {
        let servers = servers(n);
        let a = multi(&servers).await;
        let b = multi(&servers).await;
        let name = unique_name("basic");
        let guard = a.lock(&name).acquire().await.unwrap();
        assert!(guard.is_held());
        assert!(guard.validity() > Duration::ZERO && guard.validity() <= Duration::from_millis(2000));
        let held_on = servers.iter().filter(|s| s.exists(&lock_key(&name))).count();
        assert!(held_on > n / 2, "held on {held_on} of {n}");
        assert!(
            b.lock(&name).try_acquire().await.unwrap().is_none(),
            "N={n}: another client got it"
        );

        let inner = a.lock(&name).acquire().await.unwrap();
        assert_eq!(inner.hold_count(), 2);
        // Drawn (on a majority) by the inner guard's read; the outer guard reads the same.
        let token = inner.fencing_token().await.unwrap();
        assert_eq!(guard.fencing_token().await.unwrap(), token);
        inner.release().await.unwrap();
        assert!(b.lock(&name).try_acquire().await.unwrap().is_none());
        assert_eq!(guard.fencing_token().await.unwrap(), token);
        guard.release().await.unwrap();
        // The release answers once a majority has: the rest land right after.
        assert!(
            eventually(Duration::from_secs(2), || servers
                .iter()
                .all(|s| !s.exists(&lock_key(&name))))
            .await,
            "N={n}: release left keys"
        );

        let next = b
            .lock(&name)
            .try_acquire()
            .await
            .unwrap()
            .expect("free after release");
        assert!(next.fencing_token().await.unwrap() > token);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_is_tolerated_and_a_majority_down_is_a_bounded_quorum_error() {
    let mut servers = servers(5);
    let multi = multi(&servers).await;
    servers[0].kill();
    servers[1].kill();
    let name = unique_name("minority");
    let guard = multi.lock(&name).acquire().await.unwrap();
    // Renewals keep it through several leases with two masters gone.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert!(guard.is_held(), "lost with a majority still up");
    guard.release().await.unwrap();

    servers[2].kill();
    let start = Instant::now();
    let err = multi
        .lock(&name)
        .try_acquire_for(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Quorum {
                answered: 2,
                needed: 3,
                nodes: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    let err = multi.lock(&name).acquire().await.unwrap_err();
    assert!(matches!(err, Error::Quorum { .. }), "{err:?}");

    for server in &mut servers[..3] {
        server.restart();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match multi.lock(&name).try_acquire().await {
            Ok(Some(_)) => break,
            Ok(None) => panic!("nobody holds it"),
            Err(err) => {
                assert!(Instant::now() < deadline, "masters back, still {err}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_does_not_stall_acquisition() {
    let servers = servers(5);
    let multi = multi(&servers).await;
    servers[4].pause();
    let name = unique_name("paused");
    let start = Instant::now();
    let guard = multi.lock(&name).acquire().await.unwrap();
    let took = start.elapsed();
    servers[4].resume();
    // A majority answers without the paused master: no wait for it beyond node_timeout.
    assert!(
        took < Duration::from_millis(300) + Duration::from_millis(700),
        "took {took:?}"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_left_a_release_unanswered_is_not_waited_for_again() {
    let servers = servers(5);
    // A node timeout far above a release's round trip: waiting for the paused master would show.
    let timeout = Duration::from_millis(1500);
    let multi = multi_with(&servers, quorum_config().node_timeout(timeout)).await;
    let (first, second) = (unique_name("lagging"), unique_name("lagging"));
    let first_guard = multi.lock(&first).acquire().await.unwrap();
    let second_guard = multi.lock(&second).acquire().await.unwrap();
    servers[4].pause();
    // The paused master answered its last release: this one waits for it, up to the timeout.
    let start = Instant::now();
    first_guard.release().await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= timeout, "took {waited:?}");
    // Now it is known not to answer: a majority's answers are enough.
    let start = Instant::now();
    second_guard.release().await.unwrap();
    let took = start.elapsed();
    assert!(took < timeout / 2, "waited for the paused master again: {took:?}");
    println!("with a master paused: the first release took {waited:?}, the next {took:?}");
    multi
        .lock(&second)
        .try_acquire()
        .await
        .unwrap()
        .expect("not free on the majority after the release")
        .release()
        .await
        .unwrap();
    // The paused master's releases were sent, or are retried: they land once it runs again.
    servers[4].resume();
    assert!(
        eventually(Duration::from_secs(5), || servers
            .iter()
            .all(|s| !s.exists(&lock_key(&first)) && !s.exists(&lock_key(&second))))
        .await,
        "a master kept a lock after it resumed"
    );
    multi.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_survives_a_minority_and_is_lost_with_the_majority() {
    let mut servers = servers(3);
    let multi = multi(&servers).await;
    let name = unique_name("survive");
    let guard = multi.lock(&name).acquire().await.unwrap();
    servers[0].kill();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(guard.is_held(), "lost with 2 of 3 masters up");
    servers[1].kill();
    let lost_by = Instant::now() + Duration::from_secs(5);
    tokio::time::timeout_at(lost_by, guard.lost())
        .await
        .expect("lost() never fired with the majority gone");
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_under_rotating_majorities() {
    let servers = servers(5);
    let multi = multi(&servers).await;
    let name = unique_name("rotate");
    let mut last = 0;
    // Each round pauses a different pair of masters, so successive majorities differ while every
    // master keeps its counter. Masters 3 and 4 first count in round 1, from a later clock than 0..2:
    // round 2's majority {0, 1, 2} only draws a larger token because round 1 wrote its token back to
    // master 2.
    let rounds = [[3, 4], [0, 1], [3, 4], [1, 2], [0, 4], [2, 3], [0, 1]];
    for (round, down) in rounds.iter().enumerate() {
        for &i in down {
            servers[i].pause();
        }
        let guard = multi.lock(&name).acquire().await.unwrap();
        // Drawn on the round's majority, while the pair is paused.
        let token = guard.fencing_token().await.unwrap();
        assert!(token > last, "round {round}: {token} after {last}");
        last = token;
        guard.release().await.unwrap();
        for &i in down {
            servers[i].resume();
        }
    }
}

/// Masters keep their fence counters in step: once they are, an acquisition is one script call per
/// master, the token's draw (on its first read, see `LockGuard::fencing_token`) one more (no fence
/// write-back), and a release one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_acquisitions_need_no_fence_write_back() {
    let servers = servers(5);
    let multi = multi(&servers).await;
    let lock = multi.lock(&unique_name("steady"));
    // The first acquisition draws each master's own clock (no counter yet) and writes the largest back.
    let mut last = 0;
    for _ in 0..3 {
        let guard = lock.acquire().await.unwrap();
        let token = guard.fencing_token().await.unwrap();
        assert!(token > last);
        last = token;
        guard.release().await.unwrap();
    }
    let calls = || servers.iter().map(|s| s.script_calls()).sum::<u64>();
    let before = calls();
    const CYCLES: u64 = 20;
    for _ in 0..CYCLES {
        let guard = lock.acquire().await.unwrap();
        let token = guard.fencing_token().await.unwrap();
        assert!(token > last);
        last = token;
        guard.release().await.unwrap();
    }
    // Acquire, draw and release on each of the 5 masters per cycle; a write-back would add up to 5
    // more. Slack for a second boundary crossed between two masters' clock reads (they then differ
    // once).
    let made = calls() - before;
    assert!(
        made <= CYCLES * 3 * 5 + 10,
        "{made} script calls for {CYCLES} cycles on 5 masters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_on_five_masters_exclude_each_other() {
    let servers = servers(5);
    let counter = unique_name("count");
    let name = unique_name("exclusive");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let multi = multi(&servers).await;
        for _ in 0..2 {
            let lock = multi.lock(&name);
            let url = servers[0].url();
            let counter = counter.clone();
            tasks.push(tokio::spawn(async move {
                let admin = support::fred_client(&url).await;
                support::guarded_increments(&lock, &admin, &counter, 25).await;
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(servers[0].cmd(&["GET", &counter]).as_str(), Some("200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_quorum_configs_are_rejected() {
    assert!(matches!(MultiLock::new(Vec::new()), Err(Error::InvalidConfig(_))));
    let server = RedisServer::start();
    let a = LockClient::connect(&server.url()).await.unwrap();
    let b = LockClient::connect(&server.url()).await.unwrap();
    assert!(matches!(
        MultiLock::new(vec![a.clone(), b]),
        Err(Error::InvalidConfig(_))
    ));
    let config = QuorumConfig::default().clock_drift_factor(0.9);
    assert!(matches!(
        MultiLock::with_config(vec![a.clone()], config),
        Err(Error::InvalidConfig(_))
    ));
    let config = QuorumConfig::default().node_timeout(Duration::ZERO);
    assert!(MultiLock::with_config(vec![a.clone()], config)
        .unwrap_err()
        .is_bad_input());
    // A server started a moment ago would sit out (restart quarantine): not the point here.
    let multi = MultiLock::with_config(vec![a], QuorumConfig::default().restart_quarantine(false)).unwrap();
    assert_eq!(multi.masters(), 1);
    let guard = multi.lock(&unique_name("one")).acquire().await.unwrap();
    assert!(guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_restarted_empty_sit_out_for_the_longest_lease() {
    let mut servers = servers(3);
    let lease = Duration::from_secs(4);
    let config = |quarantine: bool| {
        QuorumConfig::default()
            .node_timeout(Duration::from_millis(300))
            .retry_delay(Duration::from_millis(100))
            .restart_quarantine(quarantine)
            .lock_config(
                lock_config()
                    .watchdog_timeout(lease)
                    .renew_interval(Duration::from_secs(1)),
            )
    };
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    age(lease).await;
    // The holder's watchdog checks its fixed-lease hold only after the window below, so it goes on
    // believing it holds the lock, as a holder may until its lease ends.
    let holder_config = config(true).lock_config(
        lock_config()
            .watchdog_timeout(lease)
            .renew_interval(lease - Duration::from_millis(100)),
    );
    let holder = MultiLock::connect_with(&urls, holder_config).await.unwrap();
    let careful = MultiLock::connect_with(&urls, config(true)).await.unwrap();
    let careless = MultiLock::connect_with(&urls, config(false)).await.unwrap();
    let name = unique_name("restarted");

    // Held on all three; then two of them restart without persistence and forget it.
    let guard = holder.lock(&name).lease(lease).acquire().await.unwrap();
    servers[0].restart();
    servers[2].restart();
    // Give every client time to notice the restarts (reconnect, read the new run_id).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        guard.is_held(),
        "the holder's lease is still valid on its own clock"
    );

    // The careful client keeps the restarted masters out: no majority, no second holder.
    let refused = careful
        .lock(&name)
        .try_acquire_for(Duration::from_millis(500))
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::Quorum { .. } | Error::Quarantine { .. }) | Ok(None)
        ),
        "{refused:?}"
    );
    // Without the rule, the two empty masters make a majority: two holders at once.
    let stolen = careless.lock(&name).try_acquire().await.unwrap();
    assert!(
        stolen.is_some() && guard.is_held(),
        "the control case should show the hazard"
    );
    drop(stolen);

    // Once the longest lease has passed, the restarted masters vote again.
    tokio::time::sleep(lease).await;
    let later = careful
        .lock(&name)
        .try_acquire_for(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(later.is_some(), "restarted masters never rejoined");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_holds_while_a_minority_of_masters_is_killed_and_restarted() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let servers = Arc::new(parking_lot::Mutex::new(servers(5)));
    let store = RedisServer::start(); // the guarded counter lives outside the faulted masters
    let urls: Vec<String> = servers.lock().iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let counter = unique_name("count");
    let name = unique_name("chaos");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicUsize::new(0));
    age(lock_config().get_watchdog_timeout()).await;

    // The nemesis: every ~0.7 s, one master (picked by a seeded generator) is killed and restarted
    // empty; restarted masters then sit out for the lease, so at times no majority can be had.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("nemesis seed {seed}");
    let nemesis = {
        let servers = servers.clone();
        let done = done.clone();
        tokio::task::spawn_blocking(move || {
            let mut state = seed | 1;
            let mut faults = 0;
            while !done.load(Ordering::SeqCst) && faults < 8 {
                std::thread::sleep(Duration::from_millis(700));
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let victim = (state % 5) as usize;
                let mut servers = servers.lock();
                servers[victim].kill();
                std::thread::sleep(Duration::from_millis(150));
                servers[victim].restart();
                faults += 1;
            }
            faults
        })
    };

    let mut tasks = Vec::new();
    for _ in 0..3 {
        let multi = MultiLock::connect_with(&urls, quorum_config().restart_quarantine(true))
            .await
            .unwrap();
        for _ in 0..2 {
            let lock = multi.lock(&name);
            let admin = support::fred_client(&store.url()).await;
            let (counter, inside, overlaps) = (counter.clone(), inside.clone(), overlaps.clone());
            let interrupted = interrupted.clone();
            tasks.push(tokio::spawn(async move {
                use fred::interfaces::KeysInterface;
                let mut increments = 0;
                let deadline = Instant::now() + Duration::from_secs(40);
                while increments < 30 && Instant::now() < deadline {
                    let guard = match lock.try_acquire_for(Duration::from_secs(2)).await {
                        Ok(Some(guard)) => guard,
                        // No majority now: too few answered, or too few may vote (restarted
                        // masters sit out the quarantine), as the nemesis intends at times.
                        Ok(None) | Err(Error::Quorum { .. } | Error::Quarantine { .. }) => continue,
                        Err(err) => panic!("unexpected error: {err}"),
                    };
                    let work = async {
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        let value: Option<i64> = admin.get(&counter).await.unwrap();
                        tokio::time::sleep(Duration::from_millis(15)).await;
                        let _: () = admin
                            .set(&counter, value.unwrap_or(0) + 1, None, None, false)
                            .await
                            .unwrap();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    };
                    match guard.until_lost(work).await {
                        Ok(()) => increments += 1,
                        // Stopped mid-way: the write may or may not have landed.
                        Err(_) => {
                            interrupted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    drop(guard);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                increments
            }));
        }
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let faults = nemesis.await.unwrap();
    println!("{total} guarded increments across {faults} master restarts");
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "overlapping critical sections (seed {seed})"
    );
    let stored = store.cmd(&["GET", &counter]).as_int().unwrap_or(0) as usize;
    let interrupted = interrupted.load(Ordering::SeqCst);
    assert!(
        (total..=total + interrupted).contains(&stored),
        "lost update: {stored} stored, {total} completed, {interrupted} interrupted (seed {seed})"
    );
    assert!(
        total >= 60,
        "too little progress under faults: {total} (seed {seed})"
    );
    assert!(faults >= 1, "the nemesis injected nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_stays_bounded_with_a_master_paused() {
    let servers = servers(3);
    let holder = multi(&servers).await;
    let waiter = multi(&servers).await;
    let name = unique_name("bounded");
    let guard = holder.lock(&name).acquire().await.unwrap();
    servers[2].pause();
    let wait = Duration::from_millis(500);
    let start = Instant::now();
    let result = waiter.lock(&name).try_acquire_for(wait).await;
    let took = start.elapsed();
    servers[2].resume();
    assert!(matches!(result, Ok(None)), "{result:?}");
    // w + one node_timeout (300 ms) + a margin for this shared machine.
    assert!(
        took < wait + Duration::from_millis(300) + Duration::from_millis(700),
        "took {took:?}"
    );
    assert!(guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_works_with_a_minority_unreachable_and_it_joins_later() {
    let mut servers = servers(3);
    servers[2].kill();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let multi = MultiLock::connect_with(&urls, quorum_config())
        .await
        .expect("2 of 3 reachable");
    let name = unique_name("late");
    multi
        .lock(&name)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // The third master comes up: it is used from then on.
    servers[2].restart();
    let joined = async {
        loop {
            let guard = multi.lock(&name).acquire().await.unwrap();
            let on_third = servers[2].exists(&lock_key(&name));
            guard.release().await.unwrap();
            if on_third {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(15), joined)
        .await
        .expect("the late master never joined");

    // A majority unreachable at connect time is an error.
    servers[0].kill();
    servers[1].kill();
    let err = MultiLock::connect_with(&urls, quorum_config()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Quorum {
                answered: 1,
                needed: 2,
                nodes: 3,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_promptly_with_masters_gone() {
    let mut servers = servers(3);
    let multi = multi(&servers).await;
    let guard = multi.lock(&unique_name("gone")).acquire().await.unwrap();
    servers[0].kill();
    servers[1].kill();
    let start = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), multi.shutdown())
        .await
        .expect("shutdown hung on dead masters");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert!(!guard.is_held());
}

/// A master that restarted empty just before a client first saw it sits out too: its uptime tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_before_a_client_connects_sits_out_on_first_sight() {
    use support::proxy::Proxy;

    let mut servers = servers(5);
    let lease = Duration::from_secs(2);
    let config = |quarantine: bool| {
        QuorumConfig::default()
            .node_timeout(Duration::from_millis(300))
            .restart_quarantine(quarantine)
            .lock_config(
                lock_config()
                    .watchdog_timeout(lease)
                    .command_timeout(Duration::from_millis(500)),
            )
    };
    // Old enough to vote for a client that keeps the rule.
    age(lease).await;
    // The holder reaches only masters 0, 1 and 2: it holds the lock on exactly a bare majority.
    let proxies = support::proxy::in_front_of(&servers).await;
    proxies[3].partition();
    proxies[4].partition();
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let holder = MultiLock::connect_with(&urls, config(false)).await.unwrap();
    let name = unique_name("first-sight");
    let guard = holder.lock(&name).acquire().await.unwrap();
    // One of the three restarts empty, and then new clients connect for the first time.
    servers[2].restart();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let careful = MultiLock::connect_with(&urls, config(true)).await.unwrap();
    let careless = MultiLock::connect_with(&urls, config(false)).await.unwrap();

    let refused = careful.lock(&name).try_acquire().await;
    assert!(guard.is_held(), "the holder's lease should still be valid");
    assert!(
        matches!(refused, Ok(None) | Err(Error::Quorum { .. })),
        "{refused:?}"
    );
    // The control: without the rule, the empty master makes the majority, and two hold the lock.
    let stolen = careless.lock(&name).try_acquire().await.unwrap();
    assert!(
        stolen.is_some() && guard.is_held(),
        "the control case should show the hazard"
    );
}

/// Masters started a moment ago sit out the restart quarantine (about a lease): an acquisition
/// waits it out instead of failing at once, a bounded wait too short for it names the quarantine
/// and its end, and an attempt sends nothing meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_deployment_waits_out_the_quarantine() {
    let servers = servers(3);
    let lease = Duration::from_secs(3);
    let config = quorum_config()
        .restart_quarantine(true)
        .lock_config(lock_config().watchdog_timeout(lease));
    let multi = multi_with(&servers, config).await;
    let name = unique_name("fresh");
    let err = multi
        .lock(&name)
        .try_acquire_for(Duration::from_millis(300))
        .await
        .unwrap_err();
    let Error::Quarantine {
        voting,
        needed: 2,
        nodes: 3,
        ends_in,
    } = err
    else {
        panic!("{err:?}");
    };
    assert!(voting < 2 && ends_in <= lease, "{err:?}");
    assert!(err.is_transient());
    let text = err.to_string();
    assert!(text.contains("quarantine") && text.contains("ends in"), "{text}");
    assert!(
        servers.iter().all(|s| !s.exists(&lock_key(&name))),
        "an attempt wrote"
    );

    let start = Instant::now();
    let guard = tokio::time::timeout(lease + Duration::from_secs(5), multi.lock(&name).acquire())
        .await
        .expect("the quarantine was waited out")
        .expect("granted once the masters may vote");
    assert!(guard.is_held());
    assert!(
        start.elapsed() <= lease + Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
}

/// Waiters of a lock held on a bare majority (two masters were away when it was granted) do not
/// poll: each attempt grants itself the masters left free and gives them back, and that release
/// used to wake the next waiter at once, thousands of calls a second. Now each waiter tries at most
/// once per random split-vote delay: a few calls per master a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_a_lock_held_on_a_bare_majority_do_not_poll() {
    let mut servers = servers(5);
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let config = || {
        quorum_config()
            .retry_delay(Duration::from_millis(200))
            .lock_config(lock_config().watchdog_timeout(Duration::from_secs(10)))
    };
    let holder = MultiLock::connect_with(&urls, config()).await.unwrap();
    let name = unique_name("bare");
    servers[3].kill();
    servers[4].kill();
    let guard = holder.lock(&name).acquire().await.unwrap();
    // Back, empty (restarts are not what this is about: no quarantine here).
    servers[3].restart();
    servers[4].restart();
    let held_on = servers.iter().filter(|s| s.exists(&lock_key(&name))).count();
    assert_eq!(held_on, 3, "held on a bare majority");
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(MultiLock::connect_with(&urls, config()).await.unwrap());
    }
    let before: u64 = servers.iter().map(RedisServer::script_calls).sum();
    let wait = Duration::from_secs(3);
    let mut waiters = Vec::new();
    for client in &clients {
        for _ in 0..2 {
            let lock = client.lock(&name);
            waiters.push(tokio::spawn(async move { lock.try_acquire_for(wait).await }));
        }
    }
    for waiter in waiters {
        assert!(waiter.await.unwrap().unwrap().is_none(), "granted while held");
    }
    let made = servers.iter().map(RedisServer::script_calls).sum::<u64>() - before;
    let per_master_second = made as f64 / 5.0 / 6.0 / wait.as_secs_f64();
    assert!(
        per_master_second <= 20.0,
        "6 waiters made {made} calls in {wait:?}: {per_master_second:.1} per waiter, master and second"
    );
    assert!(guard.is_held());
}

/// A waiter woken by the holder's release tries at once: only a wake-up by another waiter's undone
/// grant waits out the rate limit of the test above. With a rate limit of seconds, a waiter
/// whose release came just after it began to wait used to sleep it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_woken_by_the_release_tries_at_once() {
    let servers = servers(3);
    // The rate limit: 2 to 6 s after each attempt.
    let config = quorum_config().retry_delay(Duration::from_secs(4));
    let holder = multi_with(&servers, config.clone()).await;
    let waiter = multi_with(&servers, config).await;
    let name = unique_name("woken");
    let guard = holder.lock(&name).acquire().await.unwrap();
    let lock = waiter.lock(&name);
    let waiting = tokio::spawn(async move {
        let guard = lock.try_acquire_for(Duration::from_secs(20)).await;
        (guard, Instant::now())
    });
    // Refused by now, and asleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let (granted, at) = waiting.await.unwrap();
    assert!(granted.unwrap().is_some(), "not granted");
    let after = at - released;
    assert!(
        after <= Duration::from_secs(1),
        "granted {after:?} after the release"
    );
}
