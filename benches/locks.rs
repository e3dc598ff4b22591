//! relock against its peers and against Redis's own ceiling, side by side in one run, on throwaway
//! redis-servers this program starts itself.
//!
//! `cargo bench --bench locks -- --quick` (under 2 minutes) or `cargo bench --bench locks` (full).
//! Prints a Markdown table; writes `target/bench/locks.json` and `target/bench/locks.svg`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use relock::{LockClient, LockConfig, MultiLock, QuorumConfig};
use support::RedisServer;
use tokio::time::Instant;

/// One measured row.
#[derive(Clone, Debug)]
struct Row {
    workload: String,
    library: String,
    params: String,
    /// Named figures, in the unit their name says.
    metrics: Vec<(String, f64)>,
    note: String,
}

impl Row {
    fn new(workload: &str, library: &str, params: String) -> Row {
        Row {
            workload: workload.into(),
            library: library.into(),
            params,
            metrics: Vec::new(),
            note: String::new(),
        }
    }

    fn metric(mut self, name: &str, value: f64) -> Row {
        self.metrics.push((name.into(), value));
        self
    }

    fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }

    fn get(&self, name: &str) -> Option<f64> {
        self.metrics.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

struct Mode {
    quick: bool,
    run: Duration,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// Figures of a throughput/latency run: cycles per second and latency percentiles in µs.
struct Stats {
    cycles: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
}

impl Stats {
    fn row(&self, workload: &str, library: &str, params: String, rate_name: &str, lat_name: &str) -> Row {
        Row::new(workload, library, params)
            .metric(rate_name, self.cycles as f64 / self.elapsed.as_secs_f64())
            .metric(
                &format!("{lat_name}_p50_us"),
                self.latency.value_at_quantile(0.50) as f64,
            )
            .metric(
                &format!("{lat_name}_p99_us"),
                self.latency.value_at_quantile(0.99) as f64,
            )
    }
}

/// Runs `tasks` copies of `body` for `run`; each returns its cycle count and latency histogram.
async fn run_tasks<F, Fut>(tasks: usize, run: Duration, body: F) -> Stats
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = (u64, Histogram<u64>)> + Send + 'static,
{
    let start = Instant::now();
    let deadline = start + run;
    let handles: Vec<_> = (0..tasks).map(|i| tokio::spawn(body(i, deadline))).collect();
    let mut latency = histogram();
    let mut cycles = 0;
    for handle in handles {
        let (n, h) = handle.await.expect("bench task");
        cycles += n;
        latency.add(h).expect("merge histograms");
    }
    Stats {
        cycles,
        elapsed: start.elapsed(),
        latency,
    }
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

// ---------------------------------------------------------------------------------------------
// The libraries, each as one acquire + release cycle.

async fn relock_uncontended(lock: relock::Lock, deadline: Instant) -> (u64, Histogram<u64>) {
    let mut h = histogram();
    let mut n = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        let guard = lock.acquire().await.expect("relock acquire");
        h.record(micros(t.elapsed())).ok();
        guard.release().await.expect("relock release");
        n += 1;
    }
    (n, h)
}

async fn rslock_uncontended(
    rl: Arc<rslock::LockManager>,
    key: String,
    deadline: Instant,
) -> (u64, Histogram<u64>) {
    let mut h = histogram();
    let mut n = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        let lock = rl
            .acquire_no_guard(key.as_str(), Duration::from_secs(30))
            .await
            .expect("rslock acquire");
        h.record(micros(t.elapsed())).ok();
        rl.unlock(&lock).await;
        n += 1;
    }
    (n, h)
}

async fn arl_uncontended(
    locker: async_redis_lock::Locker,
    key: String,
    deadline: Instant,
) -> (u64, Histogram<u64>) {
    let options = async_redis_lock::Options::new().timeout(None);
    let mut h = histogram();
    let mut n = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        let lock = locker
            .acquire_with_options(&options, &key)
            .await
            .expect("async-redis-lock acquire");
        h.record(micros(t.elapsed())).ok();
        lock.release().await.expect("async-redis-lock release");
        n += 1;
    }
    (n, h)
}

fn redlock_uncontended(rl: Arc<redlock::RedLock>, key: String, deadline: Instant) -> (u64, Histogram<u64>) {
    let mut h = histogram();
    let mut n = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        let lock = loop {
            if let Ok(Some(lock)) = rl.lock(key.as_bytes(), 30_000) {
                break lock;
            }
        };
        h.record(micros(t.elapsed())).ok();
        rl.unlock(&lock);
        n += 1;
    }
    (n, h)
}

/// The synchronous redlock loop on a blocking thread, as an async bench task.
async fn redlock_task(rl: Arc<redlock::RedLock>, key: String, deadline: Instant) -> (u64, Histogram<u64>) {
    tokio::task::spawn_blocking(move || redlock_uncontended(rl, key, deadline))
        .await
        .expect("redlock task")
}

// ---------------------------------------------------------------------------------------------
// Workloads.

async fn uncontended(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    let url = server.url();
    for tasks in [1usize, 16, 256] {
        let params = format!("tasks={tasks}");
        let client = LockClient::connect(&url).await.expect("connect");
        let base = support::unique_name("u");
        let stats = run_tasks(tasks, mode.run, |i, d| {
            relock_uncontended(client.lock(&format!("{base}:{i}")), d)
        })
        .await;
        rows.push(stats.row("uncontended", "relock", params.clone(), "cycles_per_s", "acquire"));
        client.shutdown().await;

        let rl = Arc::new(rslock::LockManager::new(vec![url.clone()]));
        let stats = run_tasks(tasks, mode.run, |i, d| {
            rslock_uncontended(rl.clone(), format!("{base}:r{i}"), d)
        })
        .await;
        rows.push(stats.row("uncontended", "rslock", params.clone(), "cycles_per_s", "acquire"));

        let locker = async_redis_lock::Locker::from_redis_url(&url)
            .await
            .expect("async-redis-lock");
        let stats = run_tasks(tasks, mode.run, |i, d| {
            arl_uncontended(locker.clone(), format!("{base}:a{i}"), d)
        })
        .await;
        rows.push(stats.row(
            "uncontended",
            "async-redis-lock",
            params.clone(),
            "cycles_per_s",
            "acquire",
        ));

        if tasks <= 16 {
            let rl = Arc::new(redlock::RedLock::new(vec![url.clone()]));
            let stats = run_tasks(tasks, mode.run, |i, d| {
                redlock_task(rl.clone(), format!("{base}:s{i}"), d)
            })
            .await;
            rows.push(stats.row(
                "uncontended",
                "redlock",
                params.clone(),
                "cycles_per_s",
                "acquire",
            ));
        } else {
            rows.push(
                Row::new("uncontended", "redlock", params.clone())
                    .note("not run: synchronous, opens a TCP connection per call; 256 threads exhaust ports"),
            );
        }
    }
}

/// Handoff latency: from the start of a release to the next holder's grant.
#[derive(Clone)]
struct Handoff {
    clock: Instant,
    released: Arc<AtomicU64>,
}

impl Handoff {
    fn new(clock: Instant) -> Handoff {
        Handoff {
            clock,
            released: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A holder was just granted the lock: records the time since the last release began.
    fn granted(&self, h: &mut Histogram<u64>) {
        let at = self.released.load(Ordering::SeqCst);
        if at > 0 {
            h.record(
                (self.clock.elapsed().as_micros() as u64)
                    .saturating_sub(at)
                    .max(1),
            )
            .ok();
        }
    }

    /// The holder is about to release.
    fn releasing(&self) {
        self.released
            .store(self.clock.elapsed().as_micros() as u64, Ordering::SeqCst);
    }
}

/// Tasks contending for one lock.
async fn contended(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    let url = server.url();
    let clock = Instant::now();
    for tasks in [2usize, 8, 32] {
        let params = format!("tasks={tasks}");
        let name = support::unique_name("c");

        let clients = [
            LockClient::connect(&url).await.unwrap(),
            LockClient::connect(&url).await.unwrap(),
        ];
        let handoff = Handoff::new(clock);
        let stats = run_tasks(tasks, mode.run, |i, deadline| {
            let lock = clients[i % 2].lock(&name);
            let handoff = handoff.clone();
            async move {
                let mut h = histogram();
                let mut n = 0;
                while Instant::now() < deadline {
                    let guard = lock.acquire().await.unwrap();
                    handoff.granted(&mut h);
                    n += 1;
                    handoff.releasing();
                    guard.release().await.unwrap();
                }
                (n, h)
            }
        })
        .await;
        rows.push(stats.row("contended", "relock", params.clone(), "sections_per_s", "handoff"));
        for client in &clients {
            client.shutdown().await;
        }

        let rl = Arc::new(rslock::LockManager::new(vec![url.clone()]));
        let handoff = Handoff::new(clock);
        let stats = run_tasks(tasks, mode.run, |_, deadline| {
            let (rl, handoff, name) = (rl.clone(), handoff.clone(), format!("{name}:r"));
            async move {
                let mut h = histogram();
                let mut n = 0;
                while Instant::now() < deadline {
                    let Ok(lock) = rl.lock(name.as_str(), Duration::from_secs(30)).await else {
                        continue;
                    };
                    handoff.granted(&mut h);
                    n += 1;
                    handoff.releasing();
                    rl.unlock(&lock).await;
                }
                (n, h)
            }
        })
        .await;
        rows.push(
            stats
                .row("contended", "rslock", params.clone(), "sections_per_s", "handoff")
                .note("polls"),
        );

        let locker = async_redis_lock::Locker::from_redis_url(&url).await.unwrap();
        let handoff = Handoff::new(clock);
        let stats = run_tasks(tasks, mode.run, |_, deadline| {
            let (locker, handoff, name) = (locker.clone(), handoff.clone(), format!("{name}:a"));
            async move {
                let options = async_redis_lock::Options::new().timeout(Some(Duration::from_millis(500)));
                let mut h = histogram();
                let mut n = 0;
                while Instant::now() < deadline {
                    let Ok(lock) = locker.acquire_with_options(&options, &name).await else {
                        continue;
                    };
                    handoff.granted(&mut h);
                    n += 1;
                    handoff.releasing();
                    let _ = lock.release().await;
                }
                (n, h)
            }
        })
        .await;
        rows.push(
            stats
                .row(
                    "contended",
                    "async-redis-lock",
                    params.clone(),
                    "sections_per_s",
                    "handoff",
                )
                .note("polls"),
        );

        let rl = Arc::new(redlock::RedLock::new(vec![url.clone()]));
        let handoff = Handoff::new(clock);
        let stats = run_tasks(tasks, mode.run, |_, deadline| {
            let (rl, handoff, name) = (rl.clone(), handoff.clone(), format!("{name}:s"));
            async move {
                tokio::task::spawn_blocking(move || {
                    let mut h = histogram();
                    let mut n = 0;
                    while Instant::now() < deadline {
                        let Ok(Some(lock)) = rl.lock(name.as_bytes(), 30_000) else {
                            continue;
                        };
                        handoff.granted(&mut h);
                        n += 1;
                        handoff.releasing();
                        rl.unlock(&lock);
                    }
                    (n, h)
                })
                .await
                .unwrap()
            }
        })
        .await;
        rows.push(
            stats
                .row(
                    "contended",
                    "redlock",
                    params.clone(),
                    "sections_per_s",
                    "handoff",
                )
                .note("polls"),
        );
    }
}

/// Acquire latency and cycles/s with one task over N masters.
async fn redlock_quorum(mode: &Mode, masters: &[RedisServer], rows: &mut Vec<Row>) {
    for n in [1usize, 3, 5] {
        let urls: Vec<String> = masters[..n].iter().map(RedisServer::url).collect();
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        let params = format!("masters={n}");
        let base = support::unique_name("q");

        // The masters were started moments ago (and hold no locks): the restart quarantine would keep
        // them out of every quorum at first.
        let multi = MultiLock::connect_with(&refs, QuorumConfig::default().restart_quarantine(false))
            .await
            .unwrap();
        let stats = run_tasks(1, mode.run, |_, d| relock_uncontended(multi.lock(&base), d)).await;
        rows.push(stats.row("redlock", "relock", params.clone(), "cycles_per_s", "acquire"));
        multi.shutdown().await;

        let rl = Arc::new(rslock::LockManager::new(urls.clone()));
        let stats = run_tasks(1, mode.run, |_, d| {
            rslock_uncontended(rl.clone(), format!("{base}:r"), d)
        })
        .await;
        rows.push(stats.row("redlock", "rslock", params.clone(), "cycles_per_s", "acquire"));

        let rl = Arc::new(redlock::RedLock::new(urls.clone()));
        let stats = run_tasks(1, mode.run, |_, d| {
            redlock_task(rl.clone(), format!("{base}:s"), d)
        })
        .await;
        rows.push(stats.row("redlock", "redlock", params.clone(), "cycles_per_s", "acquire"));
        rows.push(Row::new("redlock", "async-redis-lock", params).note("not supported: single node only"));
    }
}

/// 10,000 held watchdog-mode locks over several renew intervals.
async fn watchdog_scale(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>, rounds: &RoundLog) {
    const LOCKS: usize = 10_000;
    let interval = if mode.quick {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(10)
    };
    let config = LockConfig::default()
        .watchdog_timeout(interval * 3)
        .renew_interval(interval);
    let client = LockClient::connect_with(&server.url(), config).await.unwrap();
    let base = support::unique_name("w");
    let rss_before = rss_bytes();
    let guards = support::acquire_many(&client, &base, LOCKS).await;
    let rss_held = rss_bytes();
    // Skip to a round boundary, then watch whole rounds.
    tokio::time::sleep(interval + Duration::from_millis(200)).await;
    let calls_before = evalsha_calls(server);
    let cpu_before = cpu_seconds();
    rounds.clear();
    let window_rounds = 3;
    let start = Instant::now();
    tokio::time::sleep(interval * window_rounds).await;
    let cpu = (cpu_seconds() - cpu_before) / start.elapsed().as_secs_f64();
    let calls = evalsha_calls(server) - calls_before;
    let (round_count, mean_round) = rounds.summary();
    let held = guards.iter().filter(|g| g.is_held()).count();
    rows.push(
        Row::new(
            "watchdog",
            "relock",
            format!("locks={LOCKS} interval={}s", interval.as_secs()),
        )
        .metric("commands_per_round", calls as f64 / window_rounds as f64)
        .metric("round_ms", mean_round.as_secs_f64() * 1000.0)
        .metric("rounds_seen", round_count as f64)
        .metric("client_cpu_pct_of_core", cpu * 100.0)
        .metric(
            "bytes_per_held_lock",
            rss_held.saturating_sub(rss_before) as f64 / LOCKS as f64,
        )
        .metric("held_after", held as f64),
    );
    for name in ["rslock", "redlock"] {
        rows.push(Row::new("watchdog", name, format!("locks={LOCKS}")).note("not supported: no watchdog"));
    }
    rows.push(
        Row::new("watchdog", "async-redis-lock", format!("locks={LOCKS}"))
            .note("not measured: one extension task per lock"),
    );
    drop(guards);
    client.shutdown().await;
}

/// A Redis Cluster of three primaries on this machine: uncontended cycles at 16 and 256 tasks
/// (names spread over every slot range), and the watchdog with 10,000 locks across slots.
async fn cluster_rows(mode: &Mode, rows: &mut Vec<Row>, rounds: &RoundLog) {
    let cluster = support::topologies::RedisCluster::start(3, 0);
    let url = cluster.url();
    for tasks in [16usize, 256] {
        let params = format!("primaries=3 tasks={tasks}");
        let client = LockClient::connect(&url).await.expect("connect cluster");
        let base = support::unique_name("c");
        let stats = run_tasks(tasks, mode.run, |i, d| {
            relock_uncontended(client.lock(&format!("{base}:{i}")), d)
        })
        .await;
        rows.push(stats.row(
            "cluster uncontended",
            "relock",
            params.clone(),
            "cycles_per_s",
            "acquire",
        ));
        client.shutdown().await;
        rows.push(
            Row::new("cluster uncontended", "rslock", params).note(
                "not run: rslock's cluster support is behind its `cluster-async` feature, not built here",
            ),
        );
    }

    const LOCKS: usize = 10_000;
    let interval = if mode.quick {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(10)
    };
    let config = LockConfig::default()
        .watchdog_timeout(interval * 3)
        .renew_interval(interval);
    let client = LockClient::connect_with(&url, config).await.unwrap();
    let base = support::unique_name("cw");
    let mut slots = std::collections::HashSet::new();
    let guards = support::acquire_many(&client, &base, LOCKS).await;
    for i in 0..LOCKS {
        slots.insert(cluster.slot(&format!("relock:{{{base}:{i}}}")));
    }
    tokio::time::sleep(interval + Duration::from_millis(200)).await;
    let calls =
        |c: &support::topologies::RedisCluster| c.primaries().into_iter().map(evalsha_calls).sum::<u64>();
    let calls_before = calls(&cluster);
    rounds.clear();
    let window_rounds = 3;
    tokio::time::sleep(interval * window_rounds).await;
    let per_round = (calls(&cluster) - calls_before) as f64 / window_rounds as f64;
    let (round_count, mean_round) = rounds.summary();
    let held = guards.iter().filter(|g| g.is_held()).count();
    rows.push(
        Row::new(
            "cluster watchdog",
            "relock",
            format!(
                "primaries=3 locks={LOCKS} slots={} interval={}s",
                slots.len(),
                interval.as_secs()
            ),
        )
        .metric("commands_per_round", per_round)
        .metric("distinct_slots", slots.len() as f64)
        .metric("round_ms", mean_round.as_secs_f64() * 1000.0)
        .metric("rounds_seen", round_count as f64)
        .metric("held_after", held as f64),
    );
    drop(guards);
    client.shutdown().await;
}

/// 10,000 tasks waiting on 10,000 distinct held locks.
async fn waiters_scale(server: &RedisServer, rows: &mut Vec<Row>) {
    const LOCKS: usize = 10_000;
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let base = support::unique_name("wt");
    let guards = support::acquire_many(&holder, &base, LOCKS).await;
    let connections_before = client_connections(server);
    let rss_before = rss_bytes();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let granted = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..LOCKS)
        .map(|i| {
            let lock = waiter.lock(&format!("{base}:{i}"));
            let granted = granted.clone();
            tokio::spawn(async move {
                let guard = lock.acquire().await.unwrap();
                granted.fetch_add(1, Ordering::SeqCst);
                guard.release().await.unwrap();
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
        task.await.unwrap();
    }
    let all_granted = start.elapsed();
    rows.push(
        Row::new("waiters", "relock", format!("waiters={LOCKS}"))
            .metric("connections_opened", connections as f64)
            .metric("bytes_per_waiter", rss as f64 / LOCKS as f64)
            .metric("all_granted_ms", all_granted.as_secs_f64() * 1000.0)
            .metric("granted", granted.load(Ordering::SeqCst) as f64),
    );
    for name in ["rslock", "redlock", "async-redis-lock"] {
        rows.push(Row::new("waiters", name, format!("waiters={LOCKS}")).note("not measured: waiters poll"));
    }
    waiter.shutdown().await;
    holder.shutdown().await;
}

/// The most Redis does with the same scripts on this machine.
async fn ceiling(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) -> f64 {
    // The script relock runs: acquisitions and releases go through the batch script (batches of one
    // here; under load relock puts many operations in one call).
    let batch = concat!(
        include_str!("../scripts/acquire.lua"),
        include_str!("../scripts/release.lua"),
        include_str!("../scripts/batch.lua")
    );
    let sha = server
        .cmd(&["SCRIPT", "LOAD", batch])
        .as_str()
        .unwrap()
        .to_string();
    let requests = if mode.quick { "100000" } else { "400000" };
    let port = server.port().to_string();
    let bench = |pipeline: &str, args: &[&str]| -> f64 {
        let out = std::process::Command::new("redis-benchmark")
            .args([
                "-p", &port, "-c", "50", "-n", requests, "-r", "100000", "-P", pipeline, "-q",
            ])
            .args(args)
            .output()
            .expect("redis-benchmark on PATH");
        let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
        text.lines()
            .filter_map(|l| l.split(": ").nth(1))
            .filter_map(|l| l.split_whitespace().next())
            .filter_map(|n| n.parse::<f64>().ok())
            .next_back()
            .unwrap_or(0.0)
    };
    let key = "relock:{__rand_int__}";
    let fence = "relock:{__rand_int__}:fence";
    let mut cycle_ceiling = 0.0;
    for pipeline in ["1", "16"] {
        let acq = bench(
            pipeline,
            &[
                "EVALSHA",
                &sha,
                "2",
                key,
                fence,
                "1",
                "PUBLISH",
                "a",
                "bench-owner",
                "30000",
                "1",
            ],
        );
        let rel = bench(
            pipeline,
            &[
                "EVALSHA",
                &sha,
                "1",
                key,
                "1",
                "PUBLISH",
                "r",
                "bench-owner",
                "0",
                "relock:bench:released",
            ],
        );
        let cycles = if acq > 0.0 && rel > 0.0 {
            1.0 / (1.0 / acq + 1.0 / rel)
        } else {
            0.0
        };
        if pipeline == "16" {
            cycle_ceiling = cycles;
        }
        rows.push(
            Row::new("ceiling", "redis-benchmark", format!("c=50 P={pipeline}"))
                .metric("acquire_script_per_s", acq)
                .metric("release_script_per_s", rel)
                .metric("cycles_per_s", cycles),
        );
    }
    // One connection, one EVALSHA at a time: the round trip every acquisition pays at least.
    let client = support::fred_client(&server.url()).await;
    let mut h = histogram();
    let deadline = Instant::now() + mode.run;
    while Instant::now() < deadline {
        use fred::interfaces::LuaInterface;
        let t = Instant::now();
        let _: Vec<Vec<i64>> = client
            .evalsha(
                sha.as_str(),
                vec!["relock:{rtt}", "relock:{rtt}:fence"],
                vec!["1", "PUBLISH", "a", "rtt-owner", "30000", "2"],
            )
            .await
            .expect("evalsha");
        h.record(micros(t.elapsed())).ok();
    }
    rows.push(
        Row::new("ceiling", "fred EVALSHA", "1 connection, 1 in flight".into())
            .metric("rtt_p50_us", h.value_at_quantile(0.5) as f64)
            .metric("rtt_p99_us", h.value_at_quantile(0.99) as f64),
    );
    cycle_ceiling
}

// ---------------------------------------------------------------------------------------------
// Process and server figures.

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn cpu_seconds() -> f64 {
    // utime and stime, fields 14 and 15, in clock ticks (100 per second on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|x| x.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    ticks / 100.0
}

fn evalsha_calls(server: &RedisServer) -> u64 {
    let info = server.cmd(&["INFO", "commandstats"]);
    let text = info.as_str().unwrap_or("");
    text.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn client_connections(server: &RedisServer) -> usize {
    let info = server.cmd(&["INFO", "clients"]);
    let text = info.as_str().unwrap_or("");
    text.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .map(|n| n.saturating_sub(1)) // the INFO connection itself
        .unwrap_or(0)
}

/// Watchdog rounds, read from relock's own `tracing` event ("watchdog round", field `elapsed`).
#[derive(Clone, Default)]
struct RoundLog(Arc<parking_lot::Mutex<Vec<Duration>>>);

impl RoundLog {
    fn clear(&self) {
        self.0.lock().clear();
    }

    fn summary(&self) -> (usize, Duration) {
        let rounds = self.0.lock();
        let total: Duration = rounds.iter().sum();
        (
            rounds.len(),
            if rounds.is_empty() {
                Duration::ZERO
            } else {
                total / rounds.len() as u32
            },
        )
    }
}

struct ElapsedVisitor(Option<Duration>);

impl tracing::field::Visit for ElapsedVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "elapsed" {
            self.0 = parse_debug_duration(&format!("{value:?}"));
        }
    }
}

fn parse_debug_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "ns" => number / 1e9,
        "µs" => number / 1e6,
        "ms" => number / 1e3,
        "s" => number,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RoundLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "relock::watchdog" {
            let mut visitor = ElapsedVisitor(None);
            event.record(&mut visitor);
            if let Some(elapsed) = visitor.0 {
                self.0.lock().push(elapsed);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Output.

fn find<'a>(rows: &'a [Row], workload: &str, library: &str, params: &str) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.workload == workload && r.library == library && r.params == params)
}

/// The issue's targets, each with the measured value and whether it holds.
fn targets(rows: &[Row], ceiling: f64) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    let metric = |w: &str, l: &str, p: &str, m: &str| find(rows, w, l, p).and_then(|r| r.get(m));
    if let Some(relock) = metric("uncontended", "relock", "tasks=256", "cycles_per_s") {
        let share = relock / ceiling;
        out.push((
            "uncontended 256 tasks >= 70% of the pipelined ceiling".into(),
            format!("{:.0}%", share * 100.0),
            share >= 0.7,
        ));
        if let Some(rs) = metric("uncontended", "rslock", "tasks=256", "cycles_per_s") {
            out.push((
                "uncontended 256 tasks >= rslock".into(),
                format!("{:.2}x", relock / rs),
                relock >= rs,
            ));
        }
    }
    if let (Some(p50), Some(rtt)) = (
        metric("uncontended", "relock", "tasks=1", "acquire_p50_us"),
        metric(
            "ceiling",
            "fred EVALSHA",
            "1 connection, 1 in flight",
            "rtt_p50_us",
        ),
    ) {
        out.push((
            "uncontended 1 task: acquire p50 <= 1.2x EVALSHA rtt".into(),
            format!("{:.2}x", p50 / rtt),
            p50 <= 1.2 * rtt,
        ));
        if let Some(handoff) = metric("contended", "relock", "tasks=8", "handoff_p50_us") {
            out.push((
                "contended handoff p50 <= 3 round trips (8 tasks)".into(),
                format!("{:.1} rtt", handoff / rtt),
                handoff <= 3.0 * rtt,
            ));
        }
    }
    for tasks in ["tasks=2", "tasks=8", "tasks=32"] {
        let relock = metric("contended", "relock", tasks, "sections_per_s");
        let best_peer = ["rslock", "redlock", "async-redis-lock"]
            .iter()
            .filter_map(|l| metric("contended", l, tasks, "sections_per_s"))
            .fold(0.0, f64::max);
        if let Some(relock) = relock {
            let ratio = relock / best_peer.max(1e-9);
            out.push((
                format!("contended {tasks}: >= 10x the best polling peer"),
                format!("{ratio:.1}x"),
                ratio >= 10.0,
            ));
        }
    }
    if let (Some(n5), Some(n1)) = (
        metric("redlock", "relock", "masters=5", "acquire_p50_us"),
        metric("redlock", "relock", "masters=1", "acquire_p50_us"),
    ) {
        out.push((
            "redlock N=5 acquire p50 <= 1.5x N=1".into(),
            format!("{:.2}x", n5 / n1),
            n5 <= 1.5 * n1,
        ));
    }
    if let Some(row) = rows
        .iter()
        .find(|r| r.workload == "watchdog" && r.library == "relock")
    {
        let commands = row.get("commands_per_round").unwrap_or(f64::MAX);
        let bound = (10_000f64 / 512.0).ceil();
        out.push((
            "watchdog: <= ceil(10000/512) calls per round".into(),
            format!("{commands:.0}"),
            commands <= bound,
        ));
        let cpu = row.get("client_cpu_pct_of_core").unwrap_or(f64::MAX);
        out.push((
            format!("watchdog: < 2% of a core ({})", row.params),
            format!("{cpu:.2}%"),
            cpu < 2.0,
        ));
    }
    if let Some(row) = rows
        .iter()
        .find(|r| r.workload == "waiters" && r.library == "relock")
    {
        let conns = row.get("connections_opened").unwrap_or(f64::MAX);
        out.push((
            "waiters: <= 2 connections per client".into(),
            format!("{conns:.0}"),
            conns <= 2.0,
        ));
    }
    out
}

fn markdown(rows: &[Row], targets: &[(String, String, bool)]) -> String {
    let mut out = String::from("| workload | library | params | figures | note |\n|---|---|---|---|---|\n");
    for row in rows {
        let figures: Vec<String> = row
            .metrics
            .iter()
            .map(|(n, v)| format!("{n} {}", pretty(*v)))
            .collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            row.workload,
            row.library,
            row.params,
            figures.join(", "),
            row.note
        ));
    }
    out.push_str("\n| target | measured | holds |\n|---|---|---|\n");
    for (target, measured, holds) in targets {
        out.push_str(&format!(
            "| {target} | {measured} | {} |\n",
            if *holds { "yes" } else { "**no**" }
        ));
    }
    out
}

fn pretty(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn json_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn json(
    mode: &Mode,
    version: &str,
    rows: &[Row],
    ceiling: f64,
    targets: &[(String, String, bool)],
) -> String {
    let ratio = |w: &str, p: &str, m: &str, peer: &str| -> Option<f64> {
        let relock = find(rows, w, "relock", p)?.get(m)?;
        let other = find(rows, w, peer, p)?.get(m)?;
        (other > 0.0).then(|| relock / other)
    };
    let mut items = Vec::new();
    for row in rows {
        let metrics: Vec<String> = row
            .metrics
            .iter()
            .map(|(n, v)| format!("{}: {}", json_string(n), if v.is_finite() { *v } else { 0.0 }))
            .collect();
        let mut ratios = Vec::new();
        if row.library == "relock" {
            let main = match row.workload.as_str() {
                "contended" => Some("sections_per_s"),
                "uncontended" | "redlock" => Some("cycles_per_s"),
                _ => None,
            };
            if let Some(m) = main {
                for peer in ["rslock", "redlock", "async-redis-lock"] {
                    if let Some(r) = ratio(&row.workload, &row.params, m, peer) {
                        ratios.push(format!("{}: {r:.4}", json_string(&format!("relock/{peer}"))));
                    }
                }
                if let Some(v) = row.get(m) {
                    if ceiling > 0.0 && m == "cycles_per_s" {
                        ratios.push(format!("\"relock/ceiling\": {:.4}", v / ceiling));
                    }
                }
            }
        }
        items.push(format!(
            "    {{\"workload\": {}, \"library\": {}, \"params\": {}, \"metrics\": {{{}}}, \"ratios\": {{{}}}, \"note\": {}}}",
            json_string(&row.workload),
            json_string(&row.library),
            json_string(&row.params),
            metrics.join(", "),
            ratios.join(", "),
            json_string(&row.note)
        ));
    }
    let targets: Vec<String> = targets
        .iter()
        .map(|(t, m, h)| {
            format!(
                "    {{\"target\": {}, \"measured\": {}, \"holds\": {h}}}",
                json_string(t),
                json_string(m)
            )
        })
        .collect();
    format!(
        "{{\n  \"mode\": {},\n  \"machine\": {{\"cores\": {}, \"redis_server\": {}}},\n  \"ceiling_cycles_per_s\": {ceiling:.1},\n  \"rows\": [\n{}\n  ],\n  \"targets\": [\n{}\n  ]\n}}\n",
        json_string(if mode.quick { "quick" } else { "full" }),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        json_string(version),
        items.join(",\n"),
        targets.join(",\n")
    )
}

/// Acquire latency p50/p99 per library (uncontended, 1 task; Redlock over 5 masters), as bars.
fn svg(rows: &[Row]) -> String {
    let mut bars = Vec::new();
    for row in rows {
        let (label, p50, p99) = match (row.workload.as_str(), row.params.as_str()) {
            ("uncontended", "tasks=1") | ("redlock", "masters=5") => {
                match (row.get("acquire_p50_us"), row.get("acquire_p99_us")) {
                    (Some(a), Some(b)) => (format!("{} {} {}", row.library, row.workload, row.params), a, b),
                    _ => continue,
                }
            }
            _ => continue,
        };
        bars.push((label, p50, p99));
    }
    let max = bars.iter().map(|b| b.2).fold(1.0, f64::max);
    let (width, left, bar_h) = (900.0, 330.0, 14.0);
    let height = 40.0 + bars.len() as f64 * (2.0 * bar_h + 10.0);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\">acquire latency (µs): p50 dark, p99 light</text>\n"
    );
    for (i, (label, p50, p99)) in bars.iter().enumerate() {
        let y = 35.0 + i as f64 * (2.0 * bar_h + 10.0);
        let scale = (width - left - 80.0) / max;
        out.push_str(&format!("<text x=\"10\" y=\"{}\">{}</text>\n", y + bar_h, label));
        out.push_str(&format!(
            "<rect x=\"{left}\" y=\"{y}\" width=\"{:.1}\" height=\"{bar_h}\" fill=\"#1f4e79\"/>\n",
            p50 * scale
        ));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{}\">{p50:.0}</text>\n",
            left + p50 * scale + 4.0,
            y + bar_h - 2.0
        ));
        let y2 = y + bar_h;
        out.push_str(&format!(
            "<rect x=\"{left}\" y=\"{y2}\" width=\"{:.1}\" height=\"{bar_h}\" fill=\"#9dc3e6\"/>\n",
            p99 * scale
        ));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{}\">{p99:.0}</text>\n",
            left + p99 * scale + 4.0,
            y2 + bar_h - 2.0
        ));
    }
    out.push_str("</svg>\n");
    out
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick") || std::env::var("RELOCK_BENCH_QUICK").is_ok();
    let mode = Mode {
        quick,
        run: if quick {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(10)
        },
    };
    let rounds = RoundLog::default();
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let filter =
            tracing_subscriber::filter::Targets::new().with_target("relock::watchdog", tracing::Level::DEBUG);
        let subscriber = tracing_subscriber::registry().with(rounds.clone().with_filter(filter));
        tracing::subscriber::set_global_default(subscriber).expect("tracing subscriber");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let version = std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        eprintln!(
            "relock bench ({} mode) on {version}",
            if quick { "quick" } else { "full" }
        );
        let server = RedisServer::start();
        let mut rows = Vec::new();
        eprintln!("ceiling ...");
        let ceiling = ceiling(&mode, &server, &mut rows).await;
        eprintln!("uncontended ...");
        uncontended(&mode, &server, &mut rows).await;
        eprintln!("contended ...");
        contended(&mode, &server, &mut rows).await;
        eprintln!("redlock ...");
        let masters: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
        redlock_quorum(&mode, &masters, &mut rows).await;
        drop(masters);
        eprintln!("watchdog ...");
        watchdog_scale(&mode, &server, &mut rows, &rounds).await;
        eprintln!("waiters ...");
        waiters_scale(&server, &mut rows).await;
        eprintln!("cluster ...");
        cluster_rows(&mode, &mut rows, &rounds).await;

        let targets = targets(&rows, ceiling);
        println!("{}", markdown(&rows, &targets));
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
        std::fs::create_dir_all(&dir).expect("target/bench");
        std::fs::write(
            dir.join("locks.json"),
            json(&mode, &version, &rows, ceiling, &targets),
        )
        .expect("json");
        std::fs::write(dir.join("locks.svg"), svg(&rows)).expect("svg");
        eprintln!("wrote {}/locks.json and locks.svg", dir.display());
    });
}
