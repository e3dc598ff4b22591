//! Figures read from the host and from Redis: this process's memory and CPU time, Redis's CPU time,
//! command counts and client connections, relock's watchdog rounds (from its `tracing` events), and
//! the one helper that takes them before and after a run and turns them into per-cycle figures.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::rows::{Metric, Row};
use crate::support::RedisServer;

/// Resident memory of this process, in bytes.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// CPU time of this process (user + system, every thread), in seconds.
pub fn process_cpu_seconds() -> f64 {
    process_usage().0
}

/// CPU time of this process (user + system, every thread) in seconds, and its context switches
/// (voluntary and involuntary): a task woken on another worker thread costs one where that worker
/// slept.
fn process_usage() -> (f64, u64) {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return (0.0, 0);
        }
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let switches = (usage.ru_nvcsw + usage.ru_nivcsw).max(0) as u64;
    (seconds(usage.ru_utime) + seconds(usage.ru_stime), switches)
}

/// One `INFO` section of `server` as text.
fn info(server: &RedisServer, section: &str) -> String {
    server.cmd(&["INFO", section]).as_str().unwrap_or("").to_string()
}

/// `used_memory` of `server`, in bytes.
pub fn redis_used_memory(server: &RedisServer) -> u64 {
    info(server, "memory")
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `used_cpu_sys + used_cpu_user` of `server`, in seconds.
pub fn redis_cpu_seconds(server: &RedisServer) -> f64 {
    info(server, "cpu")
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// Calls per command (`cmdstat_<name>`), from `INFO commandstats`.
pub fn command_calls(server: &RedisServer) -> Vec<(String, u64)> {
    info(server, "commandstats")
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split("calls=").nth(1)?.split(',').next()?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// Calls per command between two `INFO commandstats` readings, the bench's own `INFO` left out,
/// most called first.
pub fn calls_delta(before: &[(String, u64)], after: &[(String, u64)]) -> Vec<(String, u64)> {
    let mut delta: Vec<(String, u64)> = after
        .iter()
        .filter(|(name, _)| name != "info")
        .map(|(name, calls)| {
            let was = before.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c);
            (name.clone(), calls.saturating_sub(was))
        })
        .filter(|(_, calls)| *calls > 0)
        .collect();
    delta.sort_by_key(|c| std::cmp::Reverse(c.1));
    delta
}

/// The commands per section, by command: where the server's work goes.
pub fn per_section(calls: &[(String, u64)], sections: u64) -> String {
    let n = sections.max(1) as f64;
    let each: Vec<String> = calls
        .iter()
        .map(|(name, c)| format!("{name} {:.2}", *c as f64 / n))
        .collect();
    format!("commands per section: {}", each.join(", "))
}

/// Calls of every command but `INFO` (which the bench itself sends to read these figures).
pub fn commands_besides_info(server: &RedisServer) -> u64 {
    command_calls(server)
        .into_iter()
        .filter(|(name, _)| name != "info")
        .map(|(_, calls)| calls)
        .sum()
}

/// `EVALSHA` calls so far.
pub fn evalsha_calls(server: &RedisServer) -> u64 {
    command_calls(server)
        .into_iter()
        .find(|(name, _)| name == "evalsha")
        .map(|(_, calls)| calls)
        .unwrap_or(0)
}

/// Connected clients, the one asking left out.
pub fn client_connections(server: &RedisServer) -> usize {
    info(server, "clients")
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .map(|n| n.saturating_sub(1))
        .unwrap_or(0)
}

/// The server and client figures at one moment.
struct Snapshot {
    redis_cpu_s: f64,
    redis_cmds: u64,
    client_cpu_s: f64,
    client_csw: u64,
    client_allocs: u64,
    worker_parks: u64,
}

/// How many times the current runtime's workers went to sleep (each was woken again to run a task
/// woken from elsewhere): 0 outside a runtime.
fn worker_parks() -> u64 {
    tokio::runtime::Handle::try_current().map_or(0, |runtime| {
        let metrics = runtime.metrics();
        (0..metrics.num_workers())
            .map(|w| metrics.worker_park_count(w))
            .sum()
    })
}

impl Snapshot {
    fn take(servers: &[&RedisServer]) -> Snapshot {
        let redis_cpu_s = servers.iter().map(|s| redis_cpu_seconds(s)).sum();
        let redis_cmds = servers.iter().map(|s| commands_besides_info(s)).sum();
        let (client_cpu_s, client_csw) = process_usage();
        Snapshot {
            redis_cpu_s,
            redis_cmds,
            client_cpu_s,
            client_csw,
            client_allocs: crate::alloc::allocations(),
            worker_parks: worker_parks(),
        }
    }
}

/// What a run cost: Redis CPU and commands (summed over the servers of the row) and this process's
/// CPU, which includes the bench loop itself (timing, histograms, task spawning).
#[derive(Clone, Copy, Debug)]
pub struct Cost {
    pub redis_cpu_s: f64,
    pub redis_cmds: u64,
    pub client_cpu_s: f64,
    pub client_csw: u64,
    /// Heap allocations in this process, every thread (see `alloc`).
    pub client_allocs: u64,
    /// Times a runtime worker went to sleep (and was woken again).
    pub worker_parks: u64,
}

/// What the per-unit figures are counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Per {
    Cycle,
    Section,
}

impl Cost {
    /// Adds another run's cost.
    pub fn add(&mut self, other: &Cost) {
        self.redis_cpu_s += other.redis_cpu_s;
        self.redis_cmds += other.redis_cmds;
        self.client_cpu_s += other.client_cpu_s;
        self.client_csw += other.client_csw;
        self.client_allocs += other.client_allocs;
        self.worker_parks += other.worker_parks;
    }

    /// Adds the cost per cycle (or section) of `count` of them to `row`.
    pub fn add_to(&self, row: Row, count: u64, per: Per) -> Row {
        if count == 0 {
            return row.note("no cycles: no cost per cycle");
        }
        let n = count as f64;
        let (cpu, cmds, client, csw, allocs, parks) = match per {
            Per::Cycle => (
                Metric::RedisCpuUsPerCycle,
                Metric::RedisCmdsPerCycle,
                Metric::ClientCpuUsPerCycle,
                Metric::ClientCswPerCycle,
                Metric::ClientAllocsPerCycle,
                Metric::ClientParksPerCycle,
            ),
            Per::Section => (
                Metric::RedisCpuUsPerSection,
                Metric::RedisCmdsPerSection,
                Metric::ClientCpuUsPerSection,
                Metric::ClientCswPerSection,
                Metric::ClientAllocsPerSection,
                Metric::ClientParksPerSection,
            ),
        };
        row.metric(cpu, self.redis_cpu_s * 1e6 / n)
            .metric(cmds, self.redis_cmds as f64 / n)
            .metric(client, self.client_cpu_s * 1e6 / n)
            .metric(csw, self.client_csw as f64 / n)
            .metric(allocs, self.client_allocs as f64 / n)
            .metric(parks, self.worker_parks as f64 / n)
            .note("client CPU includes the bench loop")
    }
}

/// Runs `run` between two snapshots of `servers` and of this process, and returns its output and
/// what it cost.
pub async fn measured<T>(servers: &[&RedisServer], run: impl Future<Output = T>) -> (T, Cost) {
    let before = Snapshot::take(servers);
    let out = run.await;
    let after = Snapshot::take(servers);
    let cost = Cost {
        redis_cpu_s: (after.redis_cpu_s - before.redis_cpu_s).max(0.0),
        redis_cmds: after.redis_cmds.saturating_sub(before.redis_cmds),
        client_cpu_s: (after.client_cpu_s - before.client_cpu_s).max(0.0),
        client_csw: after.client_csw.saturating_sub(before.client_csw),
        client_allocs: after.client_allocs.saturating_sub(before.client_allocs),
        worker_parks: after.worker_parks.saturating_sub(before.worker_parks),
    };
    (out, cost)
}

/// The `tracing` target of relock's watchdog (its module's path): where [`RoundLog`] listens.
pub const WATCHDOG_TARGET: &str = "relock::engine::watchdog";

/// Watchdog rounds, read from relock's own `tracing` event (target [`WATCHDOG_TARGET`], message
/// "watchdog round", integer field `elapsed_us`).
#[derive(Clone, Default)]
pub struct RoundLog(Arc<parking_lot::Mutex<Vec<Duration>>>);

impl RoundLog {
    pub fn clear(&self) {
        self.0.lock().clear();
    }

    /// Rounds seen since the last `clear`, and their mean duration.
    pub fn summary(&self) -> (usize, Duration) {
        let rounds = self.0.lock();
        let total: Duration = rounds.iter().sum();
        let mean = match rounds.len() {
            0 => Duration::ZERO,
            n => total / n as u32,
        };
        (rounds.len(), mean)
    }
}

/// Reads the `elapsed_us` field of a round event.
struct ElapsedVisitor(Option<u64>);

impl tracing::field::Visit for ElapsedVisitor {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "elapsed_us" {
            self.0 = Some(value);
        }
    }

    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RoundLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == WATCHDOG_TARGET {
            let mut visitor = ElapsedVisitor(None);
            event.record(&mut visitor);
            if let Some(us) = visitor.0 {
                self.0.lock().push(Duration::from_micros(us));
            }
        }
    }
}
