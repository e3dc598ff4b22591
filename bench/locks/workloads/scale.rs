//! Many locks at once: the watchdog renewing 10,000 held locks (one server, and a Redis Cluster of
//! three primaries with the names spread over the slots) and, in a full run, 100,000 with the
//! default settings; 10,000 tasks waiting on 10,000 held locks; and the uncontended cycle on the
//! cluster.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{LockClient, LockConfig};
use tokio::time::Instant;

use super::uncontended::relock_cycles;
use crate::host::{
    client_connections, evalsha_calls, process_cpu_seconds, redis_cpu_seconds, redis_used_memory, rss_bytes,
    RoundLog,
};
use crate::rows::{Library, Metric, Params, Row, Workload};
use crate::support::topologies::RedisCluster;
use crate::support::{self, RedisServer};
use crate::Mode;

const LOCKS: usize = 10_000;

/// The locks of the scale row (a full run only): one client holding them with default settings.
const MANY_LOCKS: usize = 100_000;

/// Whole renew intervals watched.
const WINDOW_ROUNDS: u32 = 3;

/// What the watchdog did over a window of whole renew intervals.
struct Window {
    /// `EVALSHA` calls on the servers per round actually seen.
    commands_per_round: f64,
    rounds_seen: usize,
    mean_round: Duration,
    /// This process's CPU over the window, as a share of one core.
    client_cpu_share: f64,
    /// The servers' CPU over the window, as a share of one core.
    redis_cpu_share: f64,
}

/// Watches the watchdog of `servers` for [`WINDOW_ROUNDS`] intervals, after skipping to a round
/// boundary. The script calls are divided by the rounds the watchdog reported in the window, however
/// many that was.
async fn watch_rounds(servers: &[&RedisServer], interval: Duration, rounds: &RoundLog) -> Window {
    let calls = || servers.iter().map(|s| evalsha_calls(s)).sum::<u64>();
    tokio::time::sleep(interval + Duration::from_millis(200)).await;
    let redis_cpu = || servers.iter().map(|s| redis_cpu_seconds(s)).sum::<f64>();
    let calls_before = calls();
    let cpu_before = process_cpu_seconds();
    let redis_before = redis_cpu();
    rounds.clear();
    let start = Instant::now();
    tokio::time::sleep(interval * WINDOW_ROUNDS).await;
    let (rounds_seen, mean_round) = rounds.summary();
    let client_cpu_share = (process_cpu_seconds() - cpu_before) / start.elapsed().as_secs_f64();
    let redis_cpu_share = (redis_cpu() - redis_before) / start.elapsed().as_secs_f64();
    let delta = calls().saturating_sub(calls_before) as f64;
    Window {
        commands_per_round: if rounds_seen > 0 {
            delta / rounds_seen as f64
        } else {
            delta
        },
        rounds_seen,
        mean_round,
        client_cpu_share,
        redis_cpu_share,
    }
}

fn watchdog_config(interval: Duration) -> LockConfig {
    LockConfig::default()
        .watchdog_timeout(interval * 3)
        .renew_interval(interval)
}

fn interval(mode: &Mode) -> Duration {
    if mode.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    }
}

impl Window {
    fn add_to(&self, row: Row) -> Row {
        let row = row
            .metric(Metric::CommandsPerRound, self.commands_per_round)
            .metric(Metric::RoundMs, self.mean_round.as_secs_f64() * 1000.0)
            .metric(Metric::RoundsSeen, self.rounds_seen as f64)
            .metric(Metric::RedisCpuPctOfCore, self.redis_cpu_share * 100.0);
        match self.rounds_seen {
            0 => row.note("no round seen in the window: commands_per_round is the window's total"),
            _ => row,
        }
    }
}

/// 10,000 held watchdog-mode locks over several renew intervals.
pub async fn watchdog_scale(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>, rounds: &RoundLog) {
    let interval = interval(mode);
    rows.push(held(server, watchdog_config(interval), LOCKS, rounds).await);
    for library in [Library::Rslock, Library::Redlock] {
        rows.push(
            Row::new(Workload::Watchdog, library, Params::Locks(LOCKS)).note("not supported: no watchdog"),
        );
    }
    rows.push(
        Row::new(Workload::Watchdog, Library::AsyncRedisLock, Params::Locks(LOCKS))
            .note("not measured: one extension task per lock"),
    );
    if !mode.quick {
        // The default settings: renewed every 10 s.
        rows.push(held(server, LockConfig::default(), MANY_LOCKS, rounds).await);
    }
}

/// `locks` held watchdog-mode locks on one client of `config`, over several renew intervals: the
/// watchdog's share of a core in the client and in Redis, and the bytes per held lock in each.
async fn held(server: &RedisServer, config: LockConfig, locks: usize, rounds: &RoundLog) -> Row {
    let interval = config.get_renew_interval();
    let client = LockClient::connect_with(&server.url(), config)
        .await
        .expect("connect");
    let base = support::unique_name("w");
    let (rss_before, redis_before) = (rss_bytes(), redis_used_memory(server));
    let guards = support::acquire_many(&client, &base, locks).await;
    let (rss_held, redis_held) = (rss_bytes(), redis_used_memory(server));
    let window = watch_rounds(&[server], interval, rounds).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    let params = Params::Watchdog {
        locks,
        interval_s: interval.as_secs(),
    };
    let row = window
        .add_to(Row::new(Workload::Watchdog, Library::Relock, params))
        .metric(Metric::ClientCpuPctOfCore, window.client_cpu_share * 100.0)
        .metric(
            Metric::BytesPerHeldLock,
            rss_held.saturating_sub(rss_before) as f64 / locks as f64,
        )
        .metric(
            Metric::RedisBytesPerHeldLock,
            redis_held.saturating_sub(redis_before) as f64 / locks as f64,
        )
        .metric(Metric::HeldAfter, held as f64);
    drop(guards);
    client.shutdown().await;
    row
}

/// 10,000 tasks waiting on 10,000 distinct held locks.
pub async fn waiters_scale(server: &RedisServer, rows: &mut Vec<Row>) {
    let holder = LockClient::connect(&server.url()).await.expect("connect");
    let base = support::unique_name("wt");
    let guards = support::acquire_many(&holder, &base, LOCKS).await;
    let connections_before = client_connections(server);
    let rss_before = rss_bytes();
    let waiter = LockClient::connect(&server.url()).await.expect("connect");
    let granted = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..LOCKS)
        .map(|i| {
            let lock = waiter.lock(&format!("{base}:{i}"));
            let granted = granted.clone();
            tokio::spawn(async move {
                let guard = lock.acquire().await.expect("acquire");
                granted.fetch_add(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            })
        })
        .collect();
    // Wait until every waiter is subscribed (bounded).
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if let support::Reply::Array(list) =
            server.cmd(&["PUBSUB", "CHANNELS", &format!("relock:{{{base}:*")])
        {
            if list.len() >= LOCKS {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connections = client_connections(server) - connections_before;
    let rss = rss_bytes().saturating_sub(rss_before);
    let start = Instant::now();
    drop(guards);
    for task in tasks {
        task.await.expect("waiter");
    }
    let all_granted = start.elapsed();
    let params = Params::Waiters(LOCKS);
    rows.push(
        Row::new(Workload::Waiters, Library::Relock, params)
            .metric(Metric::ConnectionsOpened, connections as f64)
            .metric(Metric::BytesPerWaiter, rss as f64 / LOCKS as f64)
            .metric(Metric::AllGrantedMs, all_granted.as_secs_f64() * 1000.0)
            .metric(Metric::Granted, granted.load(Ordering::SeqCst) as f64),
    );
    for library in Library::PEERS {
        rows.push(Row::new(Workload::Waiters, library, params).note("not measured: waiters poll"));
    }
    waiter.shutdown().await;
    holder.shutdown().await;
}

/// A Redis Cluster of three primaries on this machine: uncontended cycles at 16 and 256 tasks
/// (names spread over every slot range), and the watchdog with 10,000 locks across slots.
pub async fn cluster_rows(mode: &Mode, rows: &mut Vec<Row>, rounds: &RoundLog) {
    const PRIMARIES: usize = 3;
    let cluster = RedisCluster::start(PRIMARIES, 0);
    let primaries = cluster.primaries();
    let url = cluster.url();
    for tasks in [16usize, 256] {
        let params = Params::ClusterTasks {
            primaries: PRIMARIES,
            tasks,
        };
        let client = LockClient::connect(&url).await.expect("connect cluster");
        let workload = Workload::ClusterUncontended;
        rows.push(relock_cycles(mode, &primaries, &client, workload, params, tasks).await);
        client.shutdown().await;
        rows.push(
            Row::new(workload, Library::Rslock, params).note(
                "not run: rslock's cluster support is behind its `cluster-async` feature, not built here",
            ),
        );
    }

    let interval = interval(mode);
    let client = LockClient::connect_with(&url, watchdog_config(interval))
        .await
        .expect("connect cluster");
    let base = support::unique_name("cw");
    let guards = support::acquire_many(&client, &base, LOCKS).await;
    let slots: HashSet<u16> = (0..LOCKS)
        .map(|i| cluster.slot(&format!("relock:{{{base}:{i}}}")))
        .collect();
    let window = watch_rounds(&primaries, interval, rounds).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    let params = Params::ClusterWatchdog {
        primaries: PRIMARIES,
        locks: LOCKS,
        interval_s: interval.as_secs(),
    };
    rows.push(
        window
            .add_to(Row::new(Workload::ClusterWatchdog, Library::Relock, params))
            .metric(Metric::DistinctSlots, slots.len() as f64)
            .metric(Metric::HeldAfter, held as f64),
    );
    drop(guards);
    client.shutdown().await;
}
