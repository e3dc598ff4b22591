//! Leader election against real servers: one leader at a time across clients with terms that
//! rise, a killed leader replaced within its lease, observers that see every term in order, and a
//! leader cut off from Redis that learns it lost before the next one takes office.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use relock::testing::Proxy;
use relock::{LockClient, LockConfig};
use support::{unique_name, RedisServer};
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(2);

fn config() -> LockConfig {
    LockConfig::default().watchdog_timeout(LEASE)
}

async fn client(url: &str) -> LockClient {
    LockClient::connect_with(url, config()).await.expect("connect")
}

/// Three clients campaign over and over: never two leaders at once, every term larger than the
/// one before, and each leader's value readable by everyone while it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_across_three_clients() {
    let server = RedisServer::start();
    let name = unique_name("election");
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut campaigners = Vec::new();
    for c in 0..3 {
        let client = client(&server.url()).await;
        let (leading, terms, name) = (leading.clone(), terms.clone(), name.clone());
        campaigners.push(tokio::spawn(async move {
            let election = client.election(&name);
            for _ in 0..4 {
                let leadership = election.campaign(&format!("client-{c}")).await.unwrap();
                assert_eq!(leading.fetch_add(1, Ordering::SeqCst), 0, "two leaders at once");
                terms.lock().push(leadership.term());
                let leader = election.leader().await.unwrap().expect("a leader");
                assert_eq!(
                    (leader.term, leader.value.as_str()),
                    (leadership.term(), &*format!("client-{c}"))
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                leadership.resign().await.unwrap();
            }
            client.shutdown().await;
        }));
    }
    for campaigner in campaigners {
        campaigner.await.unwrap();
    }
    let terms = terms.lock().clone();
    assert_eq!(terms.len(), 12);
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms rise: {terms:?}");
}

/// Child mode: lead the election and say so, until killed.
#[tokio::test]
#[ignore = "run by a_killed_leader_is_replaced_within_its_lease in a child process"]
async fn leader_child() {
    let (Ok(url), Ok(name)) = (
        std::env::var("RELOCK_LEADER_URL"),
        std::env::var("RELOCK_LEADER_NAME"),
    ) else {
        return;
    };
    let client = client(&url).await;
    let leadership = client.election(&name).campaign("child").await.unwrap();
    println!("LEADING {}", leadership.term());
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// A leader process killed with SIGKILL: the next campaign wins within the lease (plus a second),
/// with a larger term, and nobody reads the dead leader as leading after its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_its_lease() {
    let server = RedisServer::start();
    let name = unique_name("killed");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "leader_child", "--nocapture"])
        .env("RELOCK_LEADER_URL", server.url())
        .env("RELOCK_LEADER_NAME", &name)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("leader process");
    let stdout = child.stdout.take().unwrap();
    let term = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|line| {
                line.strip_prefix("LEADING ")
                    .and_then(|t| t.trim().parse::<u64>().ok())
            })
    })
    .await
    .unwrap()
    .expect("the child leads");
    let client = client(&server.url()).await;
    let election = client.election(&name);
    assert_eq!(election.leader().await.unwrap().map(|l| l.term), Some(term));
    child.kill().unwrap();
    let killed = Instant::now();
    let _ = child.wait();
    let leadership = election.campaign("successor").await.unwrap();
    assert!(
        killed.elapsed() < LEASE + Duration::from_secs(1),
        "took {:?}",
        killed.elapsed()
    );
    assert!(leadership.term() > term);
    leadership.resign().await.unwrap();
    assert_eq!(
        election.leader().await.unwrap(),
        None,
        "nobody leads after a resignation"
    );
    client.shutdown().await;
}

/// An observer sees every term in order as leaders come and go, and the gaps between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_see_every_term_in_order() {
    let server = RedisServer::start();
    let name = unique_name("observed");
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let election = b.election(&name);
    let mut changes = Box::pin(election.observe());
    assert_eq!(
        changes.next().await.unwrap().unwrap(),
        None,
        "nobody leads at first"
    );
    let mut terms = Vec::new();
    for round in 0..4 {
        let campaigner = if round % 2 == 0 { &a } else { &b };
        let leadership = campaigner
            .election(&name)
            .campaign(&format!("round-{round}"))
            .await
            .unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("a change within 5 s")
            .unwrap()
            .unwrap()
            .expect("a leader");
        assert_eq!(
            (seen.term, seen.value),
            (leadership.term(), format!("round-{round}"))
        );
        terms.push(seen.term);
        leadership.resign().await.unwrap();
        let gap = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("a change");
        assert_eq!(gap.unwrap().unwrap(), None, "the resignation is seen");
    }
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
    a.shutdown().await;
    b.shutdown().await;
}

/// A leader cut off from Redis (a partition) cannot renew: it learns it lost the leadership when
/// its lease runs out on its own clock, before the next leader takes office.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_learns_it_lost_before_the_next_takes_office() {
    let server = RedisServer::start();
    let name = unique_name("partitioned");
    let proxy = Proxy::start(server.port()).await;
    let (cut, other) = (client(&proxy.url()).await, client(&server.url()).await);
    let leadership = cut.election(&name).campaign("cut-off").await.unwrap();
    proxy.partition();
    let lost_at = async {
        leadership.lost().await;
        Instant::now()
    };
    let next = async {
        let next = other.election(&name).campaign("next").await.unwrap();
        (Instant::now(), next)
    };
    let (lost_at, (took_office, next)) = tokio::join!(lost_at, next);
    assert!(
        lost_at < took_office,
        "lost {:?} before the next took office",
        took_office - lost_at
    );
    assert!(next.term() > leadership.term());
    next.resign().await.unwrap();
    proxy.heal();
    drop(leadership);
    other.shutdown().await;
    cut.shutdown().await;
}

/// On a cluster the election's keys share one slot, and its announcements travel by sharded
/// pub/sub: an observer sees the leader and its resignation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(|| support::topologies::RedisCluster::start(3, 0))
        .await
        .unwrap();
    let name = unique_name("cluster");
    let (a, b) = (client(&cluster.url()).await, client(&cluster.url()).await);
    let mut changes = Box::pin(b.election(&name).observe());
    assert_eq!(changes.next().await.unwrap().unwrap(), None);
    let leadership = a.election(&name).campaign("on-a-cluster").await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("seen");
    assert_eq!(seen.unwrap().unwrap().map(|l| l.term), Some(leadership.term()));
    leadership.resign().await.unwrap();
    let gap = tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("seen");
    assert_eq!(gap.unwrap().unwrap(), None);
    a.shutdown().await;
    b.shutdown().await;
}
