//! Every wait the caller bounded is bounded in fact, whatever the servers do: killed, paused
//! (SIGSTOP) or cut off behind a proxy; one Redis, or a MultiLock of three with two of them faulted.

mod support;

use std::future::Future;
use std::time::Duration;

use relock::{Error, LockClient, LockConfig, LockGuard, MultiLock, QuorumConfig};
use support::proxy::Proxy;
use support::{unique_name, Locks, RedisServer};
use tokio::time::Instant;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
const NODE_TIMEOUT: Duration = Duration::from_millis(300);
/// The watchdog's lease: `acquire` rides through errors for that long.
const LEASE: Duration = Duration::from_secs(3);
/// Room for a loaded 2-core machine; far below what an unbounded wait would take.
const MARGIN: Duration = Duration::from_millis(400);

#[derive(Debug, Clone, Copy)]
enum Fault {
    Killed,
    Paused,
    Partitioned,
}

#[derive(Debug, Clone, Copy)]
enum Topology {
    /// One Redis behind a proxy, `LockClient` with a 500 ms command timeout.
    Single,
    /// A `MultiLock` over three masters behind proxies (300 ms node timeout); two get the fault.
    Multi,
}

impl Locks {
    /// The documented bound of one attempt: the request timeout, and for a quorum the fence too.
    fn attempt_bound(&self) -> Duration {
        match self {
            Locks::One(_) => COMMAND_TIMEOUT,
            Locks::Quorum(_) => NODE_TIMEOUT * 2,
        }
    }

    /// The bound of one request (is_locked, force_unlock, release).
    fn request_bound(&self) -> Duration {
        match self {
            Locks::One(_) => COMMAND_TIMEOUT,
            Locks::Quorum(_) => NODE_TIMEOUT,
        }
    }
}

/// Runs `op`, asserts it ends within `bound` + [`MARGIN`], and returns its output.
async fn within<T>(what: &str, bound: Duration, op: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(20), op)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting after 20 s"));
    let took = start.elapsed();
    println!("{what}: {took:?} (bound {bound:?})");
    assert!(took <= bound + MARGIN, "{what} took {took:?}, bound {bound:?}");
    out
}

fn failed<T: std::fmt::Debug>(what: &str, outcome: Result<T, Error>) {
    match outcome {
        Err(Error::Timeout(_) | Error::Redis(_) | Error::Quorum { .. }) => {}
        other => panic!("{what}: expected a timeout, a Redis or a quorum error, got {other:?}"),
    }
}

async fn check(topology: Topology, fault: Fault) {
    let count = match topology {
        Topology::Single => 1,
        Topology::Multi => 3,
    };
    let mut servers: Vec<RedisServer> = (0..count).map(|_| RedisServer::start()).collect();
    let proxies = support::proxy::in_front_of(&servers).await;
    let config = LockConfig::default()
        .watchdog_timeout(LEASE)
        .command_timeout(COMMAND_TIMEOUT);
    let locks = match topology {
        Topology::Single => Locks::One(LockClient::connect_with(&proxies[0].url(), config).await.unwrap()),
        Topology::Multi => {
            let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            let quorum = QuorumConfig::default()
                .node_timeout(NODE_TIMEOUT)
                .restart_quarantine(false)
                .lock_config(config);
            Locks::Quorum(MultiLock::connect_with(&urls, quorum).await.unwrap())
        }
    };
    let held_name = unique_name("held");
    let held: LockGuard = locks.lock(&held_name).acquire().await.unwrap();

    let faulted = match topology {
        Topology::Single => 0..1,
        Topology::Multi => 1..3,
    };
    for i in faulted {
        match fault {
            Fault::Killed => servers[i].kill(),
            Fault::Paused => servers[i].pause(),
            Fault::Partitioned => proxies[i].partition(),
        }
    }
    let label = format!("{topology:?}/{fault:?}");
    let lock = locks.lock(&unique_name("free"));

    let outcome = within(
        &format!("{label} try_acquire"),
        locks.attempt_bound(),
        lock.try_acquire(),
    )
    .await;
    failed("try_acquire", outcome);
    let wait = Duration::from_millis(300);
    let outcome = within(
        &format!("{label} try_acquire_for(300ms)"),
        wait,
        lock.try_acquire_for(wait),
    )
    .await;
    failed("try_acquire_for", outcome);
    // Transient errors are tried again for a lease of them in a row, the last try at its end.
    let acquire_bound = LEASE + locks.attempt_bound() * 2;
    let outcome = within(&format!("{label} acquire"), acquire_bound, lock.acquire()).await;
    failed("acquire", outcome);
    let outcome = within(
        &format!("{label} is_locked"),
        locks.request_bound(),
        lock.is_locked(),
    )
    .await;
    failed("is_locked", outcome);
    let outcome = within(
        &format!("{label} force_unlock"),
        locks.request_bound(),
        lock.force_unlock(),
    )
    .await;
    failed("force_unlock", outcome);
    let outcome = within(&format!("{label} release"), locks.request_bound(), held.release()).await;
    assert!(outcome.is_err(), "a release nobody confirmed: {outcome:?}");
    // Releases get two request bounds, closing the connections half a second.
    let shutdown_bound = locks.request_bound() * 2 + Duration::from_millis(500);
    within(&format!("{label} shutdown"), shutdown_bound, locks.shutdown()).await;
    for server in &servers {
        server.resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_killed() {
    check(Topology::Single, Fault::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_paused() {
    check(Topology::Single, Fault::Paused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_partitioned() {
    check(Topology::Single, Fault::Partitioned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_masters_killed() {
    check(Topology::Multi, Fault::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_masters_paused() {
    check(Topology::Multi, Fault::Paused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_masters_partitioned() {
    check(Topology::Multi, Fault::Partitioned).await;
}
