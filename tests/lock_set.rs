//! `lock_all`: several names, all or none, against real servers: exclusion with single locks,
//! all-or-none refusal leaving nothing held, callers with overlapping sets in opposite orders never
//! deadlocking (Redisson's `RedissonMultiLockTest` scenarios), reentrancy, bad input, a set over
//! a cluster's slots and over a quorum of masters, and a model of the rules driven by random steps.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{Error, LockClient, LockConfig, MultiLock, Owner, QuorumConfig};
use support::topologies::RedisCluster;
use support::ServerExt;
use support::{lock_key, unique_name, RedisServer};
use tokio::time::Instant;

async fn client(url: &str) -> LockClient {
    LockClient::connect_with(url, support::fast_config())
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_none_and_nothing_left_when_one_name_is_taken() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let names = [unique_name("x"), unique_name("y"), unique_name("z")];
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();

    // The last name (in the set's order) is held elsewhere: refused, and the first two given back.
    let sorted = {
        let mut sorted = names.clone();
        sorted.sort();
        sorted
    };
    let blocker = b.lock(&sorted[2]).acquire().await.unwrap();
    assert!(a.lock_all(&refs).try_acquire().await.unwrap().is_none());
    assert!(a
        .lock_all(&refs)
        .try_acquire_for(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    // Given back: free for another owner at once (awaited or not, the release is queued first).
    assert!(support::eventually(Duration::from_secs(3), || !server.exists(&lock_key(&sorted[0]))).await);
    assert!(!server.exists(&lock_key(&sorted[1])));
    drop(blocker);

    let guard = a
        .lock_all(&refs)
        .try_acquire_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("every name free");
    assert!(guard.is_held());
    assert_eq!(guard.guards().len(), 3);
    for name in &names {
        assert!(server.exists(&lock_key(name)));
        let token = guard.fencing_token(name).await.unwrap();
        assert!(token.is_some_and(|t| t > 0), "{name}: {token:?}");
        assert!(
            b.lock(name).try_acquire().await.unwrap().is_none(),
            "{name} is held by the set"
        );
    }
    assert_eq!(guard.fencing_token("not in the set").await.unwrap(), None);
    guard.release().await.unwrap();
    for name in &names {
        assert!(!server.exists(&lock_key(name)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_in_opposite_orders_never_deadlock() {
    let server = RedisServer::start();
    let (p, q) = (unique_name("p"), unique_name("q"));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(client(&server.url()).await);
    }
    // All at once, so that sets asked in opposite orders meet half taken.
    let start = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (p, q) = (p.clone(), q.clone());
        let (inside, overlaps, start) = (inside.clone(), overlaps.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            // Half ask for [p, q], half for [q, p]: taken in one order, whatever was asked.
            let names: [&str; 2] = if i % 2 == 0 { [&p, &q] } else { [&q, &p] };
            start.wait().await;
            for _ in 0..15 {
                let guard = client.lock_all(&names).acquire().await.expect("acquire");
                if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                drop(guard);
            }
        }));
    }
    let all = futures::future::join_all(tasks);
    let done = tokio::time::timeout(Duration::from_secs(60), all).await;
    assert!(done.is_ok(), "deadlocked");
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_reentrant_and_excludes_single_locks() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let (x, y) = (unique_name("x"), unique_name("y"));
    let single = a.lock(&x).acquire().await.unwrap();
    // The same task holds `x` already: the set re-enters it instead of waiting for itself.
    let set = a
        .lock_all(&[&x, &y])
        .try_acquire_for(Duration::from_secs(2))
        .await
        .unwrap()
        .expect("re-entered");
    assert_eq!(set.guards().iter().map(|g| g.hold_count()).max(), Some(2));
    assert!(b.lock(&y).try_acquire().await.unwrap().is_none());
    set.release().await.unwrap();
    assert!(b.lock(&y).try_acquire().await.unwrap().is_some(), "y given back");
    assert!(
        b.lock(&x).try_acquire().await.unwrap().is_none(),
        "x still held once"
    );
    drop(single);
    // An explicit owner shares one set between tasks.
    let owner = Owner::new();
    let set = a.lock_all(&[&x, &y]).owner(owner.clone());
    let first = tokio::time::timeout(Duration::from_secs(5), set.acquire())
        .await
        .unwrap()
        .unwrap();
    let again = tokio::spawn({
        let set = a.lock_all(&[&y, &x]).owner(owner);
        async move { set.try_acquire().await }
    });
    let again = again.await.unwrap().unwrap().expect("same owner");
    assert!(again.guards().iter().all(|g| g.hold_count() == 2));
    drop(again);
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_writes_nothing() {
    let server = RedisServer::start();
    let a = client(&server.url()).await;
    let good = unique_name("good");
    assert!(matches!(
        a.lock_all(&[]).acquire().await,
        Err(Error::InvalidName(_))
    ));
    // A bad name anywhere in the set refuses the whole set before the good names are taken.
    let bad = a.lock_all(&[&good, "bad{name}"]);
    assert!(matches!(bad.try_acquire().await, Err(Error::InvalidName(_))));
    let short = a.lock_all(&[&good]).lease(Duration::from_millis(1));
    assert!(matches!(
        short.try_acquire().await,
        Err(Error::InvalidDuration(_))
    ));
    assert!(server.keys("*").is_empty(), "{:?}", server.keys("*"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_spans_cluster_slots_and_quorum_masters() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .expect("cluster");
    let c = client(&cluster.url()).await;
    let base = unique_name("spread");
    let names: Vec<String> = (0..6).map(|i| format!("{base}:{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let guard = c.lock_all(&refs).acquire().await.expect("across slots");
    let primaries: std::collections::BTreeSet<u16> = names
        .iter()
        .map(|n| cluster.primary_of(&lock_key(n)).port())
        .collect();
    assert!(primaries.len() > 1, "the names should span primaries");
    for name in &names {
        assert!(cluster.primary_of(&lock_key(name)).exists(&lock_key(name)));
    }
    drop(guard);
    c.shutdown().await;

    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    // Seconds-old servers would sit out the restart quarantine at first.
    let quorum = QuorumConfig::default()
        .restart_quarantine(false)
        .lock_config(support::fast_config());
    let multi = MultiLock::connect_with(&urls, quorum).await.expect("masters");
    let guard = multi.lock_all(&refs).acquire().await.expect("quorum");
    // Each name is held on a majority of the masters (the last one's request may never be sent
    // once a majority granted).
    for name in &names {
        let on = servers.iter().filter(|s| s.exists(&lock_key(name))).count();
        assert!(on >= 2, "{name} on {on} of 3 masters");
    }
    guard.release().await.unwrap();
    multi.shutdown().await;
}

/// One step of the model run.
#[derive(Debug, Clone)]
enum Step {
    /// An actor tries (no waiting) the names picked by the bits of the mask (1..16 over 4 names).
    Try(usize, u8),
    /// An actor releases its set acquired `n`-th from last (if it holds any).
    Release(usize, usize),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        (0..3usize, 1..16u8).prop_map(|(a, m)| Step::Try(a, m)),
        (0..3usize, 0..3usize).prop_map(|(a, n)| Step::Release(a, n)),
    ]
}

/// The rules against a model, over random steps of three owners on four names: a set is granted
/// iff every name in it is free or the owner's own (reentrant), and then held by that owner once
/// more per name; a refusal leaves nothing held; a release gives one level of each name back.
#[test]
fn sets_follow_their_model_under_random_steps() {
    use proptest::prelude::*;
    let rt = support::runtime();
    let server = RedisServer::start();
    let client = rt.block_on(client(&server.url()));
    let config = ProptestConfig {
        cases: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let cases = AtomicUsize::new(0);
    proptest!(config, |(steps in proptest::collection::vec(step(), 1..30))| {
        let case = cases.fetch_add(1, Ordering::Relaxed);
        let names: Vec<String> = (0..4).map(|i| format!("model-{}-{case}-{i}", std::process::id())).collect();
        let owners: Vec<Owner> = (0..3).map(|_| Owner::new()).collect();
        // The model: per name, its owner and hold count.
        let mut held: Vec<Option<(usize, u32)>> = vec![None; 4];
        let mut guards: Vec<Vec<(u8, relock::LockSetGuard)>> = vec![Vec::new(), Vec::new(), Vec::new()];
        rt.block_on(async {
            for step in &steps {
                match *step {
                    Step::Try(actor, mask) => {
                        let picked: Vec<usize> = (0..4).filter(|i| mask & (1 << i) != 0).collect();
                        let set: Vec<&str> = picked.iter().map(|&i| names[i].as_str()).collect();
                        let expect = picked.iter().all(|&i| held[i].is_none_or(|(o, _)| o == actor));
                        let got = client.lock_all(&set).owner(owners[actor].clone()).try_acquire().await.expect("try");
                        prop_assert_eq!(got.is_some(), expect, "{:?} with {:?}", step, held);
                        match got {
                            Some(guard) => {
                                for &i in &picked {
                                    let count = held[i].map_or(0, |(_, c)| c);
                                    held[i] = Some((actor, count + 1));
                                }
                                guards[actor].push((mask, guard));
                            }
                            None => {
                                // What the refused set took is given back in the background: the
                                // names free in the model become free in Redis.
                                for &i in &picked {
                                    if held[i].is_none() {
                                        let key = lock_key(&names[i]);
                                        prop_assert!(
                                            support::eventually(Duration::from_secs(5), || !server.exists(&key)).await,
                                            "{} still held after a refused set", key
                                        );
                                    }
                                }
                            }
                        }
                    }
                    Step::Release(actor, n) => {
                        let mine = &mut guards[actor];
                        if mine.is_empty() {
                            continue;
                        }
                        let (mask, guard) = mine.remove(mine.len() - 1 - n.min(mine.len() - 1));
                        guard.release().await.expect("release");
                        for i in (0..4).filter(|i| mask & (1 << i) != 0) {
                            held[i] = match held[i] {
                                Some((o, c)) if c > 1 => Some((o, c - 1)),
                                _ => None,
                            };
                        }
                    }
                }
                for (i, name) in names.iter().enumerate() {
                    prop_assert_eq!(server.exists(&lock_key(name)), held[i].is_some(), "{} after {:?}", name, step);
                }
            }
            for mine in &mut guards {
                for (_, guard) in mine.drain(..) {
                    guard.release().await.expect("release");
                }
            }
            Ok(())
        })?;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_server_a_set_is_taken_by_one_script_call() {
    let server = RedisServer::start();
    // Default renewals (every 10 s) stay out of the count.
    let c = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    let base = unique_name("atomic");
    let names: Vec<String> = (0..5).map(|i| format!("{base}:{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let before = server.command_calls("evalsha");
    let guard = c.lock_all(&refs).try_acquire().await.unwrap().expect("free");
    assert_eq!(
        server.command_calls("evalsha") - before,
        1,
        "one script call for five names"
    );
    // Drawn by that call (a set taken in one script draws its tokens at grant): reading them costs
    // no call.
    let mut tokens = Vec::new();
    for name in &names {
        tokens.push(guard.fencing_token(name).await.unwrap().expect("in the set"));
    }
    assert!(tokens.iter().all(|t| *t > 0));
    assert_eq!(
        server.command_calls("evalsha") - before,
        1,
        "the tokens were drawn with the set"
    );
    drop(guard);
    // A refusal is one call too, and writes nothing: the free names stay free.
    let blocker = other.lock(&names[3]).acquire().await.unwrap();
    assert!(
        support::eventually(Duration::from_secs(3), || {
            names.iter().filter(|n| server.exists(&lock_key(n))).count() == 1
        })
        .await
    );
    let before = server.command_calls("evalsha");
    assert!(c.lock_all(&refs).try_acquire().await.unwrap().is_none());
    assert_eq!(server.command_calls("evalsha") - before, 1);
    for (i, name) in names.iter().enumerate() {
        assert_eq!(server.exists(&lock_key(name)), i == 3, "{name}");
    }
    blocker.release().await.unwrap();
    // A name whose key is of another type fails the set in its one call, which writes nothing, and
    // nothing follows it (no undo: nothing was written).
    server.cmd(&["SET", &lock_key(&names[2]), "not a lock"]);
    let before = server.script_calls();
    let err = c.lock_all(&refs).try_acquire().await.unwrap_err();
    assert!(matches!(err, Error::WrongType(_)), "{err:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.script_calls() - before, 1, "the set's call, and no undo");
    for (i, name) in names.iter().enumerate() {
        assert_eq!(server.exists(&lock_key(name)), i == 2, "{name}");
    }
    assert_eq!(
        server.cmd(&["GET", &lock_key(&names[2])]).as_str(),
        Some("not a lock")
    );
}

/// Two clients whose leases last 30 s: only release messages wake their waiters in a test's time.
async fn long_lease_clients(server: &RedisServer) -> (LockClient, LockClient) {
    let long = LockConfig::default().watchdog_timeout(Duration::from_secs(30));
    let a = LockClient::connect_with(&server.url(), long.clone())
        .await
        .unwrap();
    let b = LockClient::connect_with(&server.url(), long).await.unwrap();
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_wakes_on_the_release_that_refused_it_and_passes_others_on() {
    let server = RedisServer::start();
    // Long leases: only release messages can wake the waiters in time.
    let (a, b) = long_lease_clients(&server).await;
    let base = unique_name("wake");
    let (x, y) = (format!("{base}:x"), format!("{base}:y"));
    let hold_x = b.lock(&x).acquire().await.unwrap();
    let hold_y = b.lock(&y).acquire().await.unwrap();
    // The set waits on x, the first name that refuses it; then a lone waiter of x on the same client.
    let set = a.lock_all(&[&x, &y]);
    let set_wait = tokio::spawn(async move { set.acquire().await.map(|g| (g, Instant::now())) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lone = a.lock(&x);
    let lone_wait = tokio::spawn(async move { lone.acquire().await.map(|g| (g, Instant::now())) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // x is released while y is still held: the set, if woken first, is refused by y and must pass
    // the release on to the lone waiter.
    let released = Instant::now();
    hold_x.release().await.unwrap();
    let (lone_guard, at) = tokio::time::timeout(Duration::from_secs(3), lone_wait)
        .await
        .expect("the lone waiter of x was left asleep")
        .unwrap()
        .unwrap();
    assert!(at - released < Duration::from_millis(1500), "{:?}", at - released);
    assert!(!set_wait.is_finished());
    drop(lone_guard);
    drop(hold_y);
    let (set_guard, _) = tokio::time::timeout(Duration::from_secs(3), set_wait)
        .await
        .expect("the set was not woken by the releases")
        .unwrap()
        .unwrap();
    assert!(set_guard.is_held());
}

/// A set refused on one server marks the hold that refused it, so that hold's release (from
/// another client, which has no waiters of its own) announces itself and the set is taken at once,
/// not when the 30 s lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_set_marks_the_hold_and_its_release_wakes_the_set() {
    let server = RedisServer::start();
    let (a, b) = long_lease_clients(&server).await;
    let base = unique_name("setmark");
    let (x, y) = (format!("{base}:x"), format!("{base}:y"));
    let hold_y = b.lock(&y).acquire().await.unwrap();
    let set = a.lock_all(&[&x, &y]);
    let set_wait = tokio::spawn(async move { set.acquire().await.map(|g| (g, Instant::now())) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        b.inspect(&y).await.unwrap().unwrap().contended,
        "the refusal left no mark"
    );
    assert!(
        b.inspect(&x).await.unwrap().is_none(),
        "x was taken before y was free"
    );
    let released = Instant::now();
    hold_y.release().await.unwrap();
    let (guard, at) = tokio::time::timeout(Duration::from_secs(5), set_wait)
        .await
        .expect("the set slept through the release")
        .unwrap()
        .unwrap();
    assert!(at - released < Duration::from_millis(1500), "{:?}", at - released);
    assert!(guard.is_held());
    assert_eq!(server.command_calls("publish"), 1);
}
