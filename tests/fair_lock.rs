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

/// `n` clients of the default settings: 30 s heartbeats, the bound a waiter sleeps on.
async fn default_clients(server: &RedisServer, n: usize) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(LockClient::connect(&server.url()).await.expect("connect"));
    }
    clients
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
    proxy.partition();
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
    proxy.heal();
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
    let token = inner.fencing_token().await.unwrap();
    drop(inner);
    outer.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token().await.unwrap() > token);
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

#[derive(Debug, Clone)]
enum Step {
    /// Owner `o` (of four, over two clients) tries once, without queueing.
    Try(usize),
    /// Owner `o`, neither holding nor waiting, starts an `acquire` in a task of its own: granted at
    /// once if the lock is free and nobody waits, else queued at the back.
    Wait(usize),
    /// Owner `o`, neither holding nor waiting, waits a short bound and gives up.
    GiveUp(usize),
    /// The holder (if any) acquires again (with `acquire`): at once, whoever waits.
    Reenter,
    /// The holder releases one level; when that frees the lock, the head of the queue gets it.
    Release,
    /// The holder drops every guard (released in the background), as a crashed task would.
    Crash,
    /// The task of the `k`-th waiter (modulo their number) is dropped: it leaves the queue at once.
    Cancel(usize),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        2 => (0..4usize).prop_map(Step::Try),
        5 => (0..4usize).prop_map(Step::Wait),
        1 => (0..4usize).prop_map(Step::GiveUp),
        1 => Just(Step::Reenter),
        3 => Just(Step::Release),
        1 => Just(Step::Crash),
        1 => (0..3usize).prop_map(Step::Cancel),
    ]
}

/// The id of `owner` as it appears inside the ids stored in Redis (`client:owner`).
fn owner_id(owner: &relock::Owner) -> String {
    let debug = format!("{owner:?}");
    debug
        .trim_start_matches("Owner(\"")
        .trim_end_matches("\")")
        .to_string()
}

/// The queue in Redis, in order, as indices of `ids` (`usize::MAX` for a stranger).
fn redis_queue(server: &RedisServer, name: &str, ids: &[String]) -> Vec<usize> {
    let members = match server.cmd(&["ZRANGE", &queue_key(name), "0", "-1"]) {
        support::Reply::Array(items) => items,
        other => panic!("ZRANGE: {other:?}"),
    };
    members
        .iter()
        .map(|m| {
            let m = m.as_str().expect("member");
            ids.iter()
                .position(|id| m.ends_with(&format!(":{id}")))
                .unwrap_or(usize::MAX)
        })
        .collect()
}

/// The holders in Redis (the fields of the lock hash) as indices of `ids`, with their counts.
fn redis_holders(server: &RedisServer, name: &str, ids: &[String]) -> Vec<(usize, i64)> {
    let fields = match server.cmd(&["HGETALL", &format!("relock:{{{name}}}:fair")]) {
        support::Reply::Array(items) => items,
        other => panic!("HGETALL: {other:?}"),
    };
    fields
        .chunks(2)
        .map(|pair| {
            let field = pair[0].as_str().expect("field");
            let who = ids
                .iter()
                .position(|id| field.contains(&format!(":{id}:")))
                .unwrap_or(usize::MAX);
            (who, pair[1].as_int().unwrap_or(-1))
        })
        .collect()
}

type Waiting = tokio::task::JoinHandle<Result<relock::LockGuard, Error>>;

/// The rules against a model, over random steps of four owners on two clients. The model: a holder
/// (owner and count) and a FIFO queue of waiting owners. A `try_acquire` is granted iff the owner
/// holds already, or the lock is free and nobody waits; it never queues. An `acquire` is granted at
/// once on the same terms (or to the holder, ahead of the queue), else its owner joins the back of
/// the queue. A release that frees the lock hands it to the head of the queue, and only to it; a
/// waiter dropped or out of time leaves the queue at once. Tokens rise with every new holder, and
/// Redis's queue and holder match the model's after every step.
#[test]
fn the_fair_lock_follows_its_model_under_random_steps() {
    use proptest::prelude::*;
    use std::collections::VecDeque;
    let rt = support::runtime();
    let server = RedisServer::start();
    let clients = rt.block_on(async { vec![client(&server.url()).await, client(&server.url()).await] });
    let owners: Vec<relock::Owner> = (0..4).map(|_| relock::Owner::new()).collect();
    let ids: Vec<String> = owners.iter().map(owner_id).collect();
    let config = ProptestConfig {
        cases: 12,
        // A failing case may wait seconds for a grant that never comes: shrink only so far.
        max_shrink_iters: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let cases = AtomicUsize::new(0);
    proptest!(config, |(steps in proptest::collection::vec(step(), 10..30))| {
        let name = format!("fair-model-{}-{}", std::process::id(), cases.fetch_add(1, Ordering::Relaxed));
        let lock = |o: usize| clients[o % 2].fair_lock(&name).owner(owners[o].clone());
        // The model.
        let mut holder: Option<(usize, u32)> = None;
        let mut queue: VecDeque<usize> = VecDeque::new();
        let mut last_token = 0u64;
        // The real side: each owner's guards, and the task of each waiting owner.
        let mut guards: Vec<Vec<relock::LockGuard>> = (0..4).map(|_| Vec::new()).collect();
        let mut tasks: Vec<Option<Waiting>> = (0..4).map(|_| None).collect();
        let result: Result<(), TestCaseError> = rt.block_on(async {
            for (i, step) in steps.iter().enumerate() {
                let at = format!("step {i} {step:?} of {steps:?}");
                // Whether the lock was freed by this step (the head of the queue is then next).
                let mut freed = false;
                match *step {
                    Step::Try(o) => {
                        let expect = match holder {
                            Some((h, _)) => h == o,
                            None => queue.is_empty(),
                        };
                        let got = lock(o).try_acquire().await.expect("try");
                        prop_assert_eq!(got.is_some(), expect, "{}", at);
                        if let Some(guard) = got {
                            match &mut holder {
                                Some((_, count)) => {
                                    *count += 1;
                                    prop_assert_eq!(guard.fencing_token().await.expect("token"), last_token, "{}", at);
                                }
                                None => {
                                    holder = Some((o, 1));
                                    let token = guard.fencing_token().await.expect("token");
                                    prop_assert!(token > last_token, "{}", at);
                                    last_token = token;
                                }
                            }
                            prop_assert_eq!(guard.hold_count(), holder.unwrap().1, "{}", at);
                            guards[o].push(guard);
                        }
                    }
                    Step::Wait(o) => {
                        if holder.map(|(h, _)| h) == Some(o) || tasks[o].is_some() {
                            continue;
                        }
                        let waiter = lock(o);
                        let task = tokio::spawn(async move { waiter.acquire().await });
                        if holder.is_none() && queue.is_empty() {
                            let granted = tokio::time::timeout(Duration::from_secs(5), task).await;
                            prop_assert!(granted.is_ok(), "not granted at once: {}", at);
                            let guard = granted.unwrap().expect("join").expect("acquire");
                            let token = guard.fencing_token().await.expect("token");
                            prop_assert!(token > last_token, "{}", at);
                            prop_assert_eq!(guard.hold_count(), 1, "{}", at);
                            last_token = token;
                            holder = Some((o, 1));
                            guards[o].push(guard);
                        } else {
                            queue.push_back(o);
                            let want: Vec<usize> = queue.iter().copied().collect();
                            // Queued before the next step, so that arrival order is defined.
                            let joined = support::eventually(Duration::from_secs(5), || {
                                task.is_finished() || redis_queue(&server, &name, &ids) == want
                            })
                            .await;
                            prop_assert!(joined && !task.is_finished(), "not queued: {}", at);
                            tasks[o] = Some(task);
                        }
                    }
                    Step::GiveUp(o) => {
                        if holder.map(|(h, _)| h) == Some(o) || tasks[o].is_some() {
                            continue;
                        }
                        let expect = holder.is_none() && queue.is_empty();
                        let got = lock(o)
                            .try_acquire_for(Duration::from_millis(60))
                            .await
                            .expect("try_acquire_for");
                        prop_assert_eq!(got.is_some(), expect, "{}", at);
                        if let Some(guard) = got {
                            let token = guard.fencing_token().await.expect("token");
                            prop_assert!(token > last_token, "{}", at);
                            last_token = token;
                            holder = Some((o, 1));
                            guards[o].push(guard);
                        }
                    }
                    Step::Reenter => {
                        let Some((o, count)) = holder else { continue };
                        let entered = tokio::time::timeout(Duration::from_secs(2), lock(o).acquire()).await;
                        prop_assert!(entered.is_ok(), "the holder waited behind {:?}: {}", queue, at);
                        let guard = entered.unwrap().expect("reenter");
                        prop_assert_eq!(guard.hold_count(), count + 1, "{}", at);
                        prop_assert_eq!(guard.fencing_token().await.expect("token"), last_token, "{}", at);
                        holder = Some((o, count + 1));
                        guards[o].push(guard);
                    }
                    Step::Release => {
                        let Some((o, _)) = holder else { continue };
                        let guard = guards[o].pop().expect("the holder's guard");
                        guard.release().await.expect("release");
                        let (_, count) = holder.as_mut().expect("a holder");
                        *count -= 1;
                        if *count == 0 {
                            holder = None;
                            freed = true;
                            if !queue.is_empty() {
                                // Right after its release, whether or not the head has it yet,
                                // the former holder cannot barge ahead of the queue.
                                let barged = lock(o).try_acquire().await.expect("try");
                                prop_assert!(barged.is_none(), "barged ahead of {:?}: {}", queue, at);
                            }
                        }
                    }
                    Step::Crash => {
                        let Some((o, _)) = holder else { continue };
                        guards[o].clear();
                        holder = None;
                        freed = true;
                    }
                    Step::Cancel(k) => {
                        if queue.is_empty() {
                            continue;
                        }
                        let o = queue[k % queue.len()];
                        let task = tasks[o].take().expect("the waiter's task");
                        task.abort();
                        match task.await {
                            Err(e) => prop_assert!(e.is_cancelled(), "{}: {:?}", at, e),
                            Ok(got) => prop_assert!(false, "a waiter got {:?} out of turn: {}", got.map(|g| g.hold_count()), at),
                        }
                        queue.retain(|&w| w != o);
                        // The holder is still there: nobody waits while the lock is free.
                        prop_assert!(holder.is_some(), "{}", at);
                    }
                }
                if freed {
                    if let Some(next) = queue.pop_front() {
                        // The head's turn, and only the head's.
                        let task = tasks[next].take().expect("the head's task");
                        let settled = support::eventually(Duration::from_secs(5), || {
                            task.is_finished() || tasks.iter().flatten().any(|t| t.is_finished())
                        })
                        .await;
                        let early: Vec<usize> = (0..4)
                            .filter(|&w| tasks[w].as_ref().is_some_and(|t| t.is_finished()))
                            .collect();
                        prop_assert!(early.is_empty(), "owners {:?} granted before the head {}: {}", early, next, at);
                        prop_assert!(settled, "the head (owner {}) was not granted: {}", next, at);
                        let guard = task.await.expect("join").expect("acquire");
                        let token = guard.fencing_token().await.expect("token");
                        prop_assert!(token > last_token, "{}", at);
                        prop_assert_eq!(guard.hold_count(), 1, "{}", at);
                        last_token = token;
                        holder = Some((next, 1));
                        guards[next].push(guard);
                    }
                    for (w, task) in tasks.iter().enumerate() {
                        if let Some(task) = task {
                            prop_assert!(!task.is_finished(), "owner {} was granted out of turn: {}", w, at);
                        }
                    }
                }
                // Redis agrees with the model (a background release or leave may take a moment).
                let want_queue: Vec<usize> = queue.iter().copied().collect();
                let want_holders: Vec<(usize, i64)> = holder.iter().map(|&(h, c)| (h, c as i64)).collect();
                let agree = support::eventually(Duration::from_secs(3), || {
                    redis_queue(&server, &name, &ids) == want_queue
                        && redis_holders(&server, &name, &ids) == want_holders
                })
                .await;
                prop_assert!(
                    agree,
                    "Redis has queue {:?} and holders {:?}, the model {:?} and {:?}: {}",
                    redis_queue(&server, &name, &ids),
                    redis_holders(&server, &name, &ids),
                    want_queue,
                    want_holders,
                    at
                );
            }
            Ok(())
        });
        // Clean up whatever the case left, failed or not: waiters first, then the holds.
        rt.block_on(async {
            for task in tasks.iter_mut().filter_map(Option::take) {
                task.abort();
                let _ = task.await;
            }
            for guard in guards.iter_mut().flat_map(|g| g.drain(..)) {
                let _ = guard.release().await;
            }
        });
        result?;
    });
}

/// Found by the model test above: a waiter dropped after its attempt queued it in Redis but before
/// the reply reached it (one round trip) left its place behind, with a waiter key of a whole lease,
/// which at the head of the queue held back every acquirer of the free lock until that lease ran
/// out (`watchdog_timeout`, 30 s by default). Its mark is now taken before the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_right_after_joining_leaves_the_queue_at_once() {
    let server = RedisServer::start();
    let (a, b, c) = (
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    );
    let name = unique_name("cancel-early");
    let holder = a.fair_lock(&name).acquire().await.unwrap();
    for _ in 0..20 {
        let lock = b.fair_lock(&name).owner(relock::Owner::new());
        let task = tokio::spawn(async move { lock.acquire().await });
        // Cancelled as soon as Redis has queued it, likely before the reply has reached it.
        while queued(&server, &name) == 0 {
            tokio::task::yield_now().await;
        }
        task.abort();
        let _ = task.await;
        assert!(
            support::eventually(Duration::from_millis(500), || queued(&server, &name) == 0).await,
            "a cancelled waiter is still queued: {:?}",
            server.cmd(&["ZRANGE", &queue_key(&name), "0", "-1"])
        );
    }
    // Nobody waits: the lock is the next acquirer's as soon as it is released.
    let lock = c.fair_lock(&name);
    let released = Instant::now();
    holder.release().await.unwrap();
    let guard = lock.acquire().await.unwrap();
    assert!(
        released.elapsed() < Duration::from_millis(300),
        "{:?}",
        released.elapsed()
    );
    guard.release().await.unwrap();
}

/// A waiter with a fixed lease shorter than the watchdog's renewal interval keeps its place: the
/// place lives by the watchdog's heartbeat, not by the acquisition's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_fixed_lease_waiter_keeps_its_place() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("short-lease");
    let holder = a.fair_lock(&name).acquire().await.unwrap();
    let lock = b.fair_lock(&name).lease(Duration::from_millis(100));
    let waiter = tokio::spawn(async move { lock.acquire().await });
    assert!(support::eventually(Duration::from_secs(5), || queued(&server, &name) == 1).await);
    // Longer than the 100 ms lease, and than a renewal interval.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(queued(&server, &name), 1, "the waiter lost its place");
    holder.release().await.unwrap();
    // The newcomer does not go ahead of it.
    assert!(a
        .fair_lock(&name)
        .owner(relock::Owner::new())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let guard = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(guard.is_held());
}

/// Holders with a fixed lease shorter than the heartbeat, none releasing: each lease's end is the
/// next waiter's turn, at once. Nobody announces a lease that runs out, and the waiter behind a
/// granted one slept on that one's heartbeat (about a `watchdog_timeout`: 30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_moves_at_the_end_of_each_fixed_lease() {
    let server = RedisServer::start();
    let clients = default_clients(&server, 4).await;
    let name = unique_name("fixed-leases");
    let lease = Duration::from_secs(1);
    let start = Instant::now();
    let _holder = clients[0].fair_lock(&name).lease(lease).acquire().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, client) in clients.iter().enumerate().skip(1) {
        let (lock, tx) = (client.fair_lock(&name).lease(lease), tx.clone());
        tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            let _ = tx.send((i, start.elapsed()));
            // Never released: the lease runs out.
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(guard);
        });
        assert!(
            support::eventually(Duration::from_secs(5), || queued(&server, &name) == i as i64).await,
            "waiter {i} queued"
        );
    }
    let mut granted = Vec::new();
    while granted.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
            Ok(Some(grant)) => granted.push(grant),
            _ => panic!("the queue stuck: granted {granted:?}"),
        }
    }
    assert_eq!(
        granted.iter().map(|g| g.0).collect::<Vec<_>>(),
        [1, 2, 3],
        "out of order: {granted:?}"
    );
    // About one lease apart (1, 2 and 3 s); the last one slept 30 s before.
    let last = granted[2].1;
    assert!(last < Duration::from_secs(7), "granted at {granted:?}");
}

/// The waiter named at a fixed-lease grant gives up before that lease ends: its place goes to the
/// waiter behind, who must learn the holder's lease then. Nobody announces a lease that runs out,
/// and that waiter slept on the heartbeat of the place ahead of it (30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_waiter_that_gives_up_passes_the_fixed_lease_on() {
    let server = RedisServer::start();
    let clients = default_clients(&server, 4).await;
    let name = unique_name("gives-up");
    let holder = clients[0].fair_lock(&name).acquire().await.unwrap();
    // First in line, granted with a fixed lease of 6 s once the holder releases.
    let fixed = clients[1].fair_lock(&name).lease(Duration::from_secs(6));
    let fixed = tokio::spawn(async move {
        let guard = fixed.acquire().await.unwrap();
        // Never released: the lease runs out.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(guard);
    });
    assert!(support::eventually(Duration::from_secs(5), || queued(&server, &name) == 1).await);
    // Second in line: named at that grant, but gives up 4 s from now, during the fixed lease (the
    // release below comes well before that, even on a loaded machine).
    let quitter = clients[2].fair_lock(&name);
    let quits_at = Instant::now() + Duration::from_secs(4);
    let quitter = tokio::spawn(async move { quitter.try_acquire_for(Duration::from_secs(4)).await });
    assert!(support::eventually(Duration::from_secs(5), || queued(&server, &name) == 2).await);
    // Third in line: waits on.
    let last = clients[3].fair_lock(&name);
    let last = tokio::spawn(async move { (last.acquire().await.unwrap(), Instant::now()) });
    assert!(support::eventually(Duration::from_secs(5), || queued(&server, &name) == 3).await);
    holder.release().await.unwrap();
    let released = Instant::now();
    assert!(released < quits_at, "released after the quitter gave up");
    assert!(quitter.await.unwrap().unwrap().is_none(), "the quitter got it");
    let (_guard, granted) = tokio::time::timeout(Duration::from_secs(40), last)
        .await
        .unwrap()
        .unwrap();
    // The fixed lease ends about 6 s after the release; before, the last waiter slept 30 s.
    let after = granted - released;
    assert!(
        after < Duration::from_secs(14),
        "granted {after:?} after the release"
    );
    fixed.abort();
}
