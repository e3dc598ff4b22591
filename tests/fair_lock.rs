//! The fair lock against a real redis-server: waiters granted in arrival order across clients,
//! a waiter that gives up or is cancelled leaving the queue at once, one cut off leaving within its
//! lease (the queue never sticks), `try_acquire` never queueing, reentrancy ahead of the queue, and
//! mutual exclusion under load. Redisson's `RedissonFairLockTest` scenarios (timeout drift,
//! abandoned waiters, `tryLock` with waiters) are among them.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use relock::{Error, LockClient};
use support::proxy::Proxy;
use support::{unique_name, RedisServer};
use tokio::time::Instant;

async fn client(url: &str) -> LockClient {
    LockClient::connect_with(url, support::fast_config())
        .await
        .expect("connect")
}

fn queue_key(name: &str) -> String {
    format!("relock:{{{name}}}:fair:queue")
}

fn queued(server: &RedisServer, name: &str) -> i64 {
    server.cmd(&["ZCARD", &queue_key(name)]).as_int().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_arrival_order() {
    let server = RedisServer::start();
    let clients = [
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    ];
    let name = unique_name("fifo");
    let holder = clients[0].fair_lock(&name).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let lock = clients[i % 3].fair_lock(&name);
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            order.lock().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.unwrap();
        }));
        // The next one arrives only once this one is queued.
        let want = i as i64 + 1;
        assert!(
            support::eventually(Duration::from_secs(5), || queued(&server, &name) == want).await,
            "waiter {i} queued"
        );
    }
    // A barger polls without queueing: it must not get in while anyone waits.
    let barger = {
        let lock = clients[1].fair_lock(&name);
        let order = order.clone();
        tokio::spawn(async move {
            loop {
                if let Some(guard) = lock.try_acquire().await.unwrap() {
                    order.lock().push(99);
                    guard.release().await.unwrap();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let start = Instant::now();
    holder.release().await.unwrap();
    let all = tokio::time::timeout(Duration::from_secs(20), futures::future::join_all(tasks)).await;
    assert!(all.is_ok(), "stuck: {:?}", order.lock());
    tokio::time::timeout(Duration::from_secs(5), barger)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*order.lock(), vec![0, 1, 2, 3, 4, 5, 99]);
    // Each handoff wakes the next waiter by name: far from a lease per waiter.
    assert!(start.elapsed() < Duration::from_secs(4), "{:?}", start.elapsed());
    assert_eq!(queued(&server, &name), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_stops_waiting_leaves_the_queue_at_once() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("leave");
    let holder = a.fair_lock(&name).acquire().await.unwrap();
    // Redisson's timeout drift: waiters that give up one after another leave nothing behind.
    for _ in 0..4 {
        assert!(b
            .fair_lock(&name)
            .try_acquire_for(Duration::from_millis(250))
            .await
            .unwrap()
            .is_none());
    }
    let cancelled = tokio::time::timeout(Duration::from_millis(300), b.fair_lock(&name).acquire()).await;
    assert!(cancelled.is_err());
    assert!(support::eventually(Duration::from_secs(2), || queued(&server, &name) == 0).await);
    // Behind the ones that left, a new waiter is first: it gets the lock as soon as it is released.
    let lock = b.fair_lock(&name);
    let next = tokio::spawn(async move { (lock.acquire().await.unwrap(), Instant::now()) });
    assert!(support::eventually(Duration::from_secs(5), || queued(&server, &name) == 1).await);
    let released = Instant::now();
    holder.release().await.unwrap();
    let (guard, at) = next.await.unwrap();
    assert!(at - released < Duration::from_millis(700), "{:?}", at - released);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_waiter_leaves_within_its_lease_and_the_queue_goes_on() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let cut_off = client(&proxy.url()).await;
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("abandoned");
    let holder = a.fair_lock(&name).acquire().await.unwrap();
    let first = cut_off.fair_lock(&name);
    let first = tokio::spawn(async move { first.acquire().await });
    assert!(support::eventually(Duration::from_secs(5), || queued(&server, &name) == 1).await);
    let second = b.fair_lock(&name);
    let second = tokio::spawn(async move { (second.acquire().await.unwrap(), Instant::now()) });
    assert!(support::eventually(Duration::from_secs(5), || queued(&server, &name) == 2).await);
    // The first waiter is cut off: its heartbeat stops, and its place ends with its lease.
    proxy.partition(true);
    let cut = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder.release().await.unwrap();
    let (guard, at) = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the queue stuck")
        .unwrap();
    assert!(at - cut < Duration::from_millis(1500 + 1500), "{:?}", at - cut);
    guard.release().await.unwrap();
    first.abort();
    proxy.partition(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_never_queues_and_a_holder_reenters_ahead_of_the_queue() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("try");
    let lock = a.fair_lock(&name);
    let outer = lock.acquire().await.unwrap();
    let waiter = b.fair_lock(&name);
    let waiting = tokio::spawn(async move { waiter.acquire().await.unwrap() });
    assert!(support::eventually(Duration::from_secs(5), || queued(&server, &name) == 1).await);
    // Not the waiter's turn-stealer: a try is refused and not queued.
    assert!(b.fair_lock(&name).try_acquire().await.unwrap().is_none());
    assert_eq!(queued(&server, &name), 1);
    // The holder re-enters at once, whoever waits.
    let inner = tokio::time::timeout(Duration::from_secs(1), lock.acquire())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(inner.hold_count(), 2);
    let token = inner.fencing_token();
    drop(inner);
    outer.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
    // Nobody waits: a try gets it.
    assert!(b.fair_lock(&name).try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_contenders_take_turns_without_overlap() {
    let server = RedisServer::start();
    let name = unique_name("hot");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let c = client(&server.url()).await;
        for _ in 0..5 {
            let lock = c.fair_lock(&name);
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..6 {
                    let guard = lock.acquire().await.unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                }
            }));
        }
    }
    let all = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks)).await;
    assert!(all.is_ok(), "stuck");
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(support::eventually(Duration::from_secs(3), || queued(&server, &name) == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_a_queue_of_another_type_change_nothing() {
    let server = RedisServer::start();
    let c = client(&server.url()).await;
    for bad in ["", "a{b"] {
        assert!(matches!(
            c.fair_lock(bad).acquire().await,
            Err(Error::InvalidName(_))
        ));
    }
    assert!(server.keys("relock:*").is_empty());
    let name = unique_name("typed");
    server.cmd(&["SET", &queue_key(&name), "not a queue"]);
    let result = c
        .fair_lock(&name)
        .try_acquire_for(Duration::from_millis(300))
        .await;
    assert!(matches!(result, Err(Error::WrongType(_))), "{result:?}");
    assert_eq!(
        server.keys(&format!("relock:{{{name}}}*")),
        vec![queue_key(&name)]
    );
}
