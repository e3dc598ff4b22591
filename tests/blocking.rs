//! The blocking API against a real redis-server, from plain threads: exclusion between threads,
//! reentrancy of one thread, releases on drop, the watchdog, a MultiLock, the semaphore and lock_all
//! (all or none), inspection, and the refusal to block inside an async runtime.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use relock::blocking::{LockClient, MultiLock};
use relock::{Error, LockConfig, Owner, QuorumConfig};
use support::{lock_key, unique_name, RedisServer};

fn client(server: &RedisServer) -> LockClient {
    LockClient::connect_with(&server.url(), support::fast_config()).expect("connect")
}

/// `threads` threads, each acquiring `rounds` times a lock made by `lock`, counting the moments
/// two of them were inside at once.
fn contend(lock: impl Fn() -> relock::blocking::Lock, threads: usize, rounds: usize) -> (usize, usize) {
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let lock = lock();
            let (inside, overlaps, done, start) =
                (inside.clone(), overlaps.clone(), done.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                for _ in 0..rounds {
                    let guard = lock.acquire().expect("acquire");
                    assert_eq!(guard.hold_count(), 1, "another thread's hold was re-entered");
                    if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_millis(1));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    drop(guard);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    (overlaps.load(Ordering::SeqCst), done.load(Ordering::SeqCst))
}

#[test]
fn threads_of_one_client_exclude_each_other() {
    let server = RedisServer::start();
    let client = client(&server);
    let name = unique_name("threads");
    let (overlaps, done) = contend(|| client.lock(&name), 4, 25);
    assert_eq!(overlaps, 0, "two threads held the lock at once");
    assert_eq!(done, 100);
    // The last drop's release runs in the background: free soon after.
    let free_by = std::time::Instant::now() + Duration::from_secs(5);
    while client.lock(&name).is_locked().unwrap() {
        assert!(
            std::time::Instant::now() < free_by,
            "still locked 5 s after the last drop"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn threads_of_two_clients_exclude_each_other() {
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let name = unique_name("clients");
    let turn = AtomicUsize::new(0);
    let (overlaps, done) = contend(
        || {
            let client = if turn.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
                &a
            } else {
                &b
            };
            client.lock(&name)
        },
        2,
        40,
    );
    assert_eq!(overlaps, 0, "two threads held the lock at once");
    assert_eq!(done, 80);
}

#[test]
fn a_thread_reenters_its_own_hold() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = client.lock(&unique_name("reentrant"));
    let first = lock.acquire().unwrap();
    let second = lock.acquire().unwrap();
    assert_eq!((first.hold_count(), second.hold_count()), (1, 2));
    // Drawn by the first read, shared by the hold's other guard.
    let token = second.fencing_token().unwrap();
    assert!(token > 0);
    assert_eq!(first.fencing_token().unwrap(), token);
    let other = lock.clone();
    let try_other = move || {
        thread::spawn(move || other.try_acquire().unwrap().is_none())
            .join()
            .unwrap()
    };
    drop(second);
    assert!(try_other(), "released after the first of two drops");
    assert!(lock.is_locked().unwrap());
    drop(first);
    let other = lock.clone();
    let got = thread::spawn(move || other.try_acquire_for(Duration::from_secs(10)).unwrap().is_some())
        .join()
        .unwrap();
    assert!(got, "not released after the second drop");
}

#[test]
fn an_explicit_owner_is_shared_between_threads() {
    let server = RedisServer::start();
    let client = client(&server);
    let owner = Owner::new();
    let lock = client.lock(&unique_name("owner")).owner(owner);
    let first = lock.acquire().unwrap();
    let other = lock.clone();
    let second = thread::spawn(move || other.try_acquire().unwrap())
        .join()
        .unwrap();
    let second = second.expect("the same owner on another thread re-enters");
    assert_eq!(second.hold_count(), 2);
    second.release().unwrap();
    first.release().unwrap();
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn try_acquire_from_another_thread_is_refused_while_held() {
    let server = RedisServer::start();
    let client = client(&server);
    let name = unique_name("try");
    let guard = client.lock(&name).acquire().unwrap();
    let other = client.clone();
    let name2 = name.clone();
    let (now, waited) = thread::spawn(move || {
        let lock = other.lock(&name2);
        let now = lock.try_acquire().unwrap().is_none();
        let started = Instant::now();
        let waited = lock
            .try_acquire_for(Duration::from_millis(300))
            .unwrap()
            .is_none();
        assert!(started.elapsed() >= Duration::from_millis(250));
        (now, waited)
    })
    .join()
    .unwrap();
    assert!(now && waited, "another thread got a held lock");
    assert!(guard.is_held());
    guard.release().unwrap();
    assert!(!server.exists(&lock_key(&name)));
}

#[test]
fn a_dropped_guard_is_released_promptly() {
    // The lease is 30 s: only the release on drop lets the waiter in within its 10 s.
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).unwrap();
    let name = unique_name("drop");
    let guard = client.lock(&name).acquire().unwrap();
    let lock = client.lock(&name);
    let waiter = thread::spawn(move || {
        let started = Instant::now();
        let got = lock.try_acquire_for(Duration::from_secs(10)).unwrap();
        (got.map(|guard| guard.fencing_token().unwrap()), started.elapsed())
    });
    thread::sleep(Duration::from_millis(200));
    let token = guard.fencing_token().unwrap();
    drop(guard);
    let (got, waited) = waiter.join().unwrap();
    let next = got.expect("the waiter did not get the lock after the drop");
    assert!(next > token);
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
}

#[test]
fn the_last_drop_of_a_client_finishes_queued_releases() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).unwrap();
    let name = unique_name("last");
    let guard = client.lock(&name).acquire().unwrap();
    assert!(server.exists(&lock_key(&name)));
    // The server answers the release only after the drops: the last one must wait for it (the
    // lease is 30 s, so a release lost with the runtime would leave the key).
    server.pause();
    let started = Instant::now();
    thread::scope(|scope| {
        scope.spawn(|| {
            thread::sleep(Duration::from_millis(500));
            server.resume();
        });
        drop(guard);
        drop(client);
    });
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(
        !server.exists(&lock_key(&name)),
        "the release was lost with the runtime"
    );
}

#[test]
fn the_watchdog_keeps_a_lease_held_by_a_blocked_thread() {
    let server = RedisServer::start();
    let config = LockConfig::default()
        .watchdog_timeout(Duration::from_millis(1500))
        .renew_interval(Duration::from_millis(300));
    let client = LockClient::connect_with(&server.url(), config).unwrap();
    let name = unique_name("watchdog");
    let guard = client.lock(&name).acquire().unwrap();
    // The thread does its own (blocking) work, well past two leases.
    thread::sleep(Duration::from_millis(3500));
    assert!(guard.is_held());
    assert!(!guard.validity().is_zero());
    assert!(!guard.wait_lost_for(Duration::from_millis(500)).unwrap());
    let pttl = server.cmd(&["PTTL", &lock_key(&name)]).as_int().unwrap();
    assert!(pttl > 0, "PTTL {pttl}");
    let lock = client.lock(&name);
    assert!(thread::spawn(move || lock.try_acquire().unwrap().is_none())
        .join()
        .unwrap());
    guard.release().unwrap();

    // A fixed lease is not renewed: the guard learns of its loss.
    let short = client
        .lock(&name)
        .lease(Duration::from_millis(300))
        .acquire()
        .unwrap();
    assert!(short.wait_lost_for(Duration::from_secs(10)).unwrap());
    assert!(!short.is_held());
    assert!(matches!(short.release(), Err(Error::Lost { .. })));
}

#[test]
fn a_multilock_over_three_servers() {
    let servers = [RedisServer::start(), RedisServer::start(), RedisServer::start()];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    // The servers are seconds old: the restart quarantine would keep them all out at first.
    let config = QuorumConfig::default()
        .node_timeout(Duration::from_millis(300))
        .restart_quarantine(false)
        .lock_config(support::fast_config());
    let multi = MultiLock::connect_with(&urls, config).unwrap();
    assert_eq!(multi.masters(), 3);
    let name = unique_name("multi");
    let guard = multi.lock(&name).acquire().unwrap();
    // An acquisition returns at a majority; the last master's grant may land just after, or (on a
    // loaded machine, past the node timeout) be undone: a majority is what a grant promises.
    let on_a_majority = |names: &[&str]| {
        let until = Instant::now() + Duration::from_secs(5);
        let holding = || {
            servers
                .iter()
                .filter(|s| names.iter().all(|n| s.exists(&lock_key(n))))
                .count()
        };
        while holding() < 2 {
            if Instant::now() > until {
                return false;
            }
            thread::sleep(Duration::from_millis(10));
        }
        true
    };
    assert!(on_a_majority(&[&name]));
    let lock = multi.lock(&name);
    assert!(thread::spawn(move || lock.try_acquire().unwrap().is_none())
        .join()
        .unwrap());
    drop(guard);
    // lock_all over the masters: every name on a majority of them, all given back by one release.
    let second = format!("{name}:2");
    let set = multi.lock_all(&[second.as_str(), name.as_str()]);
    let both = set
        .try_acquire_for(Duration::from_secs(5))
        .unwrap()
        .expect("the set");
    assert!(on_a_majority(&[&name, &second]));
    both.release().unwrap();
    for server in &servers {
        assert!(!server.exists(&lock_key(&name)) && !server.exists(&lock_key(&second)));
    }
    let (overlaps, done) = contend(|| multi.lock(&name), 3, 10);
    assert_eq!((overlaps, done), (0, 30));
    multi.shutdown().unwrap();
    assert!(matches!(multi.lock(&name).acquire(), Err(Error::Shutdown)));
}

#[test]
fn shutdown_ends_the_holds() {
    let server = RedisServer::start();
    let client = client(&server);
    let name = unique_name("shutdown");
    let guard = client.lock(&name).acquire().unwrap();
    client.shutdown().unwrap();
    assert!(!guard.is_held());
    assert!(!server.exists(&lock_key(&name)));
    assert!(matches!(client.lock(&name).try_acquire(), Err(Error::Shutdown)));
}

#[tokio::test]
async fn refused_inside_an_async_runtime() {
    let server = RedisServer::start();
    let url = server.url();
    assert!(matches!(LockClient::connect(&url), Err(Error::InsideRuntime)));
    assert!(matches!(
        MultiLock::connect(&[url.as_str()], LockConfig::default()),
        Err(Error::InsideRuntime)
    ));
    // Made on a plain thread, then used here.
    let name = unique_name("inside");
    let (client, guard) = {
        let (url, name) = (url.clone(), name.clone());
        thread::spawn(move || {
            let client = LockClient::connect(&url).unwrap();
            let guard = client.lock(&name).acquire().unwrap();
            (client, guard)
        })
        .join()
        .unwrap()
    };
    let lock = client.lock(&name);
    assert_eq!(lock.name(), name);
    assert!(matches!(lock.acquire(), Err(Error::InsideRuntime)));
    assert!(matches!(lock.try_acquire(), Err(Error::InsideRuntime)));
    assert!(matches!(
        lock.try_acquire_for(Duration::from_millis(1)),
        Err(Error::InsideRuntime)
    ));
    assert!(matches!(lock.is_locked(), Err(Error::InsideRuntime)));
    assert!(matches!(lock.force_unlock(), Err(Error::InsideRuntime)));
    assert!(matches!(
        guard.wait_lost_for(Duration::ZERO),
        Err(Error::InsideRuntime)
    ));
    let latch = client.latch(&name);
    assert!(matches!(latch.set_count(1), Err(Error::InsideRuntime)));
    assert!(matches!(latch.count_down(), Err(Error::InsideRuntime)));
    assert!(matches!(
        latch.wait_for(Duration::ZERO),
        Err(Error::InsideRuntime)
    ));
    drop(latch);
    assert!(matches!(client.shutdown(), Err(Error::InsideRuntime)));
    assert!(guard.is_held());
    // Released in the background, and every handle dropped here, inside the runtime: no panic,
    // and the last drop still finishes the release (on a thread of its own).
    assert!(matches!(guard.release(), Err(Error::InsideRuntime)));
    drop(lock);
    drop(client);
    let key = lock_key(&name);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.exists(&key) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !server.exists(&key),
        "the release from a drop inside a runtime was lost"
    );
}

#[test]
fn refused_inside_runtime_block_on() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = client.lock(&unique_name("block-on"));
    for runtime in [
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
    ] {
        runtime.block_on(async {
            assert!(matches!(
                LockClient::connect(&server.url()),
                Err(Error::InsideRuntime)
            ));
            assert!(matches!(lock.acquire(), Err(Error::InsideRuntime)));
            assert!(matches!(lock.is_locked(), Err(Error::InsideRuntime)));
        });
        let spawned = runtime.block_on({
            let lock = lock.clone();
            async move { tokio::spawn(async move { lock.try_acquire().map(|_| ()) }).await }
        });
        assert!(matches!(spawned, Ok(Err(Error::InsideRuntime))));
        // A `spawn_blocking` thread is inside the runtime too (its handle is current there).
        let on_pool = runtime.block_on({
            let lock = lock.clone();
            async move { tokio::task::spawn_blocking(move || lock.is_locked()).await }
        });
        assert!(matches!(on_pool, Ok(Err(Error::InsideRuntime))));
    }
    // Outside again, the same handles work.
    let guard = lock.acquire().unwrap();
    assert_eq!(guard.hold_count(), 1);
    assert!(lock.is_locked().unwrap());
}

#[test]
fn a_latch_wakes_a_blocked_thread_when_workers_count_down() {
    let server = RedisServer::start();
    let job = client(&server);
    let name = unique_name("latch");
    let latch = job.latch(&name);
    assert!(latch.set_count(3).unwrap());
    assert!(!latch.set_count(3).unwrap(), "still counting");
    let started = Instant::now();
    let workers: Vec<_> = (0..3u64)
        .map(|i| {
            let (url, name) = (server.url(), name.clone());
            thread::spawn(move || {
                let client = LockClient::connect(&url).unwrap();
                thread::sleep(Duration::from_millis(100 * (i + 1)));
                client.latch(&name).count_down().unwrap()
            })
        })
        .collect();
    assert!(latch.wait_for(Duration::from_secs(10)).unwrap(), "opened");
    let waited = started.elapsed();
    let mut left: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    left.sort();
    assert_eq!(left, vec![0, 1, 2]);
    // Not before the last count-down (at 300 ms), and woken by its message, not a timeout.
    assert!(waited >= Duration::from_millis(290), "opened after {waited:?}");
    assert!(waited < Duration::from_secs(5), "opened after {waited:?}");
    assert_eq!(latch.count().unwrap(), 0);
    let closed = job.latch(&unique_name("closed"));
    assert!(closed.set_count(1).unwrap());
    assert!(
        !closed.wait_for(Duration::from_millis(200)).unwrap(),
        "nobody counts it down"
    );
}

/// The Redis key of the semaphore `name`'s index under the default prefix.
fn semaphore_key(name: &str) -> String {
    format!("relock:{{{name}}}:sem")
}

#[test]
fn a_blocking_semaphore_never_grants_more_than_its_permits_across_threads() {
    let server = RedisServer::start();
    let clients = [client(&server), client(&server)];
    let name = unique_name("sem-threads");
    const PERMITS: usize = 2;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(6));
    let workers: Vec<_> = (0..6)
        .map(|i| {
            let semaphore = clients[i % 2].semaphore(&name, PERMITS as u64);
            let (inside, most, start) = (inside.clone(), most.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                for _ in 0..10 {
                    let permit = semaphore.acquire(1).expect("acquire");
                    assert_eq!(permit.permits(), 1);
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(5));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= PERMITS, "{most} permits held at once of {PERMITS}");
    assert!(most >= 1);
    // Several permits at once, and the count of the free ones.
    let semaphore = clients[0].semaphore(&name, PERMITS as u64);
    assert_eq!(semaphore.name(), name);
    assert_eq!(semaphore.permits(), PERMITS as u64);
    let free_by = Instant::now() + Duration::from_secs(5);
    while semaphore.available().unwrap() != 2 {
        assert!(Instant::now() < free_by, "the permits did not come back");
        thread::sleep(Duration::from_millis(20));
    }
    let both = semaphore.acquire(2).unwrap();
    assert_eq!(semaphore.available().unwrap(), 0);
    let other = clients[1].semaphore(&name, PERMITS as u64);
    let refused = thread::spawn(move || {
        let now = other.try_acquire(1).unwrap().is_none();
        let started = Instant::now();
        let waited = other
            .try_acquire_for(1, Duration::from_millis(300))
            .unwrap()
            .is_none();
        assert!(started.elapsed() >= Duration::from_millis(250));
        now && waited
    })
    .join()
    .unwrap();
    assert!(refused, "a third permit was granted");
    // Bad input is refused before any I/O.
    assert!(matches!(semaphore.acquire(3), Err(Error::InvalidConfig(_))));
    assert!(matches!(semaphore.try_acquire(0), Err(Error::InvalidConfig(_))));
    // Callers that disagree on the permits while some are held.
    assert!(matches!(
        clients[1].semaphore(&name, 5).try_acquire(1),
        Err(Error::InvalidConfig(_))
    ));
    both.release().unwrap();
    assert_eq!(semaphore.available().unwrap(), 2);
}

#[test]
fn a_dropped_permit_is_given_back_promptly_and_the_holders_can_be_read() {
    // The lease is 30 s: only the release on drop lets the waiter in within its 10 s.
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).unwrap();
    let name = unique_name("sem-drop");
    let semaphore = client.semaphore(&name, 1);
    let permit = semaphore.acquire(1).unwrap();
    assert!(permit.is_held());
    assert!(permit.validity() > Duration::from_secs(20));
    assert!(!permit.wait_lost_for(Duration::from_millis(100)).unwrap());
    // The holder as an operator sees it: one holder of 1 of 1 permit, with its lease.
    let info = client
        .inspect_semaphore(&name)
        .unwrap()
        .expect("a semaphore with a holder");
    assert_eq!((info.permits, info.held(), info.available()), (1, 1, 0));
    assert_eq!(info.key, semaphore_key(&name));
    assert_eq!(info.holders.len(), 1);
    assert!(info.holders[0].owner.starts_with('o'), "{info:?}");
    assert!(info.holders[0]
        .ttl
        .is_some_and(|ttl| ttl > Duration::from_secs(20)));
    let holder_key = info.holders[0].key.clone();
    assert!(server.exists(&holder_key));
    let waiter = {
        let semaphore = semaphore.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let got = semaphore.try_acquire_for(1, Duration::from_secs(10)).unwrap();
            (got.is_some(), started.elapsed())
        })
    };
    thread::sleep(Duration::from_millis(200));
    drop(permit);
    let (got, waited) = waiter.join().unwrap();
    assert!(got, "the waiter did not get the permit after the drop");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    // The waiter's permit was dropped in its thread: free again soon, and its holder key gone.
    let free_by = Instant::now() + Duration::from_secs(5);
    while semaphore.available().unwrap() != 1 {
        assert!(Instant::now() < free_by, "the waiter's permit did not come back");
        thread::sleep(Duration::from_millis(20));
    }
    let info = client.inspect_semaphore(&name).unwrap().expect("its index stays");
    assert!(info.holders.is_empty(), "{info:?}");
    assert!(
        !server.exists(&holder_key),
        "the dropped permit's holder key stayed"
    );
    assert_eq!(client.inspect_semaphore(&unique_name("none")).unwrap(), None);
    // A lock can be read from a plain thread too.
    let lock = client.lock(&name);
    let guard = lock.acquire().unwrap();
    // The fence moves when the holder draws its token (its first read), not at the acquisition.
    let token = guard.fencing_token().unwrap();
    let held = client.inspect(&name).unwrap().expect("held");
    assert!(held.holders[0].owner.starts_with("th"), "{held:?}");
    assert_eq!(held.fence, Some(token));
    let listed = client.held_locks(Some(&name)).unwrap();
    assert_eq!(listed.len(), 1);
    guard.release().unwrap();
    assert_eq!(client.inspect(&name).unwrap(), None);
}

#[test]
fn a_lock_set_holds_all_or_none() {
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let base = unique_name("set");
    let names = [format!("{base}:c"), format!("{base}:a"), format!("{base}:b")];
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let set = a.lock_all(&refs);
    let sorted: Vec<&str> = set.names().collect();
    assert_eq!(
        sorted,
        [format!("{base}:a"), format!("{base}:b"), format!("{base}:c")]
    );
    // Another client's thread holds the middle name: the set gets none of them.
    let middle = format!("{base}:b");
    let blocker = {
        let (b, middle) = (b.clone(), middle.clone());
        thread::spawn(move || b.lock(&middle).acquire().unwrap())
            .join()
            .unwrap()
    };
    assert!(set.try_acquire().unwrap().is_none(), "a name held elsewhere");
    let started = Instant::now();
    assert!(set.try_acquire_for(Duration::from_millis(300)).unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(250));
    // Nothing of the set is kept: the first and last names are free for another client (their
    // release runs in the background, so within a short wait, well under their 1.5 s lease that
    // the watchdog would keep renewing).
    for name in [format!("{base}:a"), format!("{base}:c")] {
        let lock = b.lock(&name);
        let got = thread::spawn(move || {
            lock.try_acquire_for(Duration::from_millis(1000))
                .unwrap()
                .map(|guard| guard.release())
        })
        .join()
        .unwrap();
        assert!(matches!(got, Some(Ok(()))), "{name} kept by a refused set");
    }
    assert!(!server.exists(&lock_key(&format!("{base}:a"))));
    // Once the middle name is free, the set gets every name.
    let waiting = {
        let set = set.clone();
        thread::spawn(move || {
            let guard = set.try_acquire_for(Duration::from_secs(10)).unwrap();
            guard.map(|guard| {
                let tokens: Vec<Option<u64>> = guard
                    .names()
                    .map(|name| guard.fencing_token(name).unwrap())
                    .collect();
                (tokens, guard.is_held(), guard.release())
            })
        })
    };
    thread::sleep(Duration::from_millis(200));
    drop(blocker);
    let (tokens, held, released) = waiting.join().unwrap().expect("the set after the drop");
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(Option::is_some), "{tokens:?}");
    assert!(held);
    released.unwrap();
    for name in &names {
        assert!(!server.exists(&lock_key(name)), "{name} left behind");
    }
    // Held by this thread: re-entered by a lock of one of its names, excluded for other threads.
    let guard = set.acquire().unwrap();
    assert!(guard.validity() > Duration::ZERO);
    assert!(!guard.wait_lost_for(Duration::from_millis(50)).unwrap());
    assert_eq!(a.lock(&middle).acquire().unwrap().hold_count(), 2);
    let other = set.clone();
    assert!(thread::spawn(move || other.try_acquire().unwrap().is_none())
        .join()
        .unwrap());
    assert_eq!(guard.fencing_token("not in the set").unwrap(), None);
    drop(guard);
    assert!(matches!(
        a.lock_all(&[]).try_acquire(),
        Err(Error::InvalidName(_))
    ));
    assert!(matches!(
        a.lock_all(&["ok", "bad{"]).acquire(),
        Err(Error::InvalidName(_))
    ));
    assert!(!server.exists(&lock_key("ok")), "bad input changed something");
}

#[tokio::test]
async fn the_family_is_refused_inside_an_async_runtime() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("family-inside");
    // Made on a plain thread, then used here.
    let (client, permit, set_guard) = {
        let (url, name) = (url.clone(), name.clone());
        thread::spawn(move || {
            let client = LockClient::connect(&url).unwrap();
            let permit = client.semaphore(&name, 2).acquire(1).unwrap();
            let set_guard = client.lock_all(&[name.as_str(), "x"]).acquire().unwrap();
            (client, permit, set_guard)
        })
        .join()
        .unwrap()
    };
    let semaphore = client.semaphore(&name, 2);
    assert!(matches!(semaphore.acquire(1), Err(Error::InsideRuntime)));
    assert!(matches!(semaphore.try_acquire(1), Err(Error::InsideRuntime)));
    assert!(matches!(
        semaphore.try_acquire_for(1, Duration::from_millis(1)),
        Err(Error::InsideRuntime)
    ));
    assert!(matches!(semaphore.available(), Err(Error::InsideRuntime)));
    assert!(matches!(
        permit.wait_lost_for(Duration::ZERO),
        Err(Error::InsideRuntime)
    ));
    let set = client.lock_all(&[name.as_str(), "y"]);
    assert!(matches!(set.acquire(), Err(Error::InsideRuntime)));
    assert!(matches!(set.try_acquire(), Err(Error::InsideRuntime)));
    assert!(matches!(
        set.try_acquire_for(Duration::from_millis(1)),
        Err(Error::InsideRuntime)
    ));
    assert!(matches!(
        set_guard.wait_lost_for(Duration::ZERO),
        Err(Error::InsideRuntime)
    ));
    assert!(matches!(client.inspect(&name), Err(Error::InsideRuntime)));
    assert!(matches!(client.held_locks(None), Err(Error::InsideRuntime)));
    assert!(matches!(
        client.inspect_semaphore(&name),
        Err(Error::InsideRuntime)
    ));
    // The guards still hold, and are given back in the background when released here.
    assert!(permit.is_held() && set_guard.is_held());
    assert!(matches!(permit.release(), Err(Error::InsideRuntime)));
    assert!(matches!(set_guard.release(), Err(Error::InsideRuntime)));
    drop((semaphore, set, client));
    let gone = support::eventually(Duration::from_secs(5), || {
        !server.exists(&lock_key(&name))
            && !server.exists(&lock_key("x"))
            && server.keys(&format!("{}:h:*", semaphore_key(&name))).is_empty()
    })
    .await;
    assert!(gone, "a release from inside the runtime was lost");
}

#[test]
fn a_blocking_fair_lock_and_rw_lock_from_threads() {
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let name = unique_name("fair-blocking");
    let (overlaps, done) = contend(|| a.fair_lock(&name), 3, 10);
    assert_eq!((overlaps, done), (0, 30));

    let name = unique_name("rw-blocking");
    let read = a.rw_lock(&name).read().acquire().unwrap();
    let again = b.rw_lock(&name).read().acquire().unwrap();
    assert_eq!(read.fencing_token().unwrap(), 0);
    // A writer of another thread waits for both readers.
    let writer = {
        let rw = b.rw_lock(&name);
        thread::spawn(move || {
            let guard = rw.write().acquire().unwrap();
            let token = guard.fencing_token().unwrap();
            guard.release().unwrap();
            token
        })
    };
    thread::sleep(Duration::from_millis(300));
    assert!(!writer.is_finished());
    drop(read);
    again.release().unwrap();
    assert!(writer.join().unwrap() > 0);
    // The reader asking for the write lock: refused at once.
    let read = a.rw_lock(&name).read().acquire().unwrap();
    assert!(matches!(
        a.rw_lock(&name).write().try_acquire(),
        Err(relock::Error::Upgrade(_))
    ));
    read.release().unwrap();
}

/// A blocking guard's guarded write: applied while held, declined by its check with nothing
/// applied.
#[test]
fn a_blocking_guard_writes_atomically_while_held() {
    let server = RedisServer::start();
    let client = client(&server);
    let name = unique_name("guarded");
    let stock = format!("stock:{{{name}}}");
    server.cmd(&["SET", &stock, "1"]);
    let guard = client.lock(&name).acquire().expect("acquire");
    let sell = |guard: &relock::blocking::LockGuard| {
        guard.atomically(|tx| {
            tx.when_at_least(&stock, 1).decr_by(&stock, 1);
        })
    };
    assert_eq!(sell(&guard).unwrap(), Some(vec![fred::types::Value::Integer(0)]));
    assert_eq!(sell(&guard).unwrap(), None, "sold out");
    assert_eq!(server.cmd(&["GET", &stock]).as_int(), Some(0));
    guard.release().expect("release");
    client.shutdown().expect("shutdown");
}
