//! The typed row model: what a row is keyed by (workload, library, parameters) and the figures it
//! carries (metrics, each with its unit in its name), plus the per-task tallies rows are built from.
//! Rows are looked up by these types, so a misspelt key is a compile error, not a silently missing
//! target.

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;

/// A group of rows measuring one thing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// What one connection doing one round trip at a time reaches, without a lock library.
    Floor,
    /// What Redis itself runs of relock's scripts with many connections.
    Ceiling,
    Uncontended,
    /// Tasks contending for one lock with an empty critical section.
    Contended,
    /// Tasks contending for one lock with a 1 ms critical section.
    HotLock,
    /// A quorum over N independent masters.
    Redlock,
    Watchdog,
    Waiters,
    ClusterUncontended,
    ClusterWatchdog,
    /// Tasks sharing a semaphore's permits, each holding one for 1 ms.
    Semaphore,
    /// Tasks on one lock, each section a read (most) or a write, each held for 1 ms: relock's
    /// read-write lock, and the plain lock (every section exclusive) as its baseline.
    ReadHeavy,
    /// Tasks contending for one lock with a 1 ms critical section: relock's fair lock (granted in
    /// arrival order, the next waiter woken by name), and the plain lock as its baseline.
    FairHandoff,
    /// [`Uncontended`](Workload::Uncontended), every library through the same delaying proxy
    /// (`NET_DELAY` each way, see `main.rs`).
    NetUncontended,
    /// [`HotLock`](Workload::HotLock) through the delaying proxy.
    NetHotLock,
    /// [`Redlock`](Workload::Redlock), each master through a delaying proxy of its own.
    NetRedlock,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Floor => "floor",
            Workload::Ceiling => "ceiling",
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::HotLock => "hot lock",
            Workload::Redlock => "redlock",
            Workload::Watchdog => "watchdog",
            Workload::Waiters => "waiters",
            Workload::Semaphore => "semaphore",
            Workload::ReadHeavy => "rw lock, read-heavy",
            Workload::FairHandoff => "fair lock handoff",
            Workload::ClusterUncontended => "cluster uncontended",
            Workload::ClusterWatchdog => "cluster watchdog",
            Workload::NetUncontended => "uncontended, 250 µs away",
            Workload::NetHotLock => "hot lock, 250 µs away",
            Workload::NetRedlock => "redlock, 250 µs away",
        }
    }
}

/// Who is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    Relock,
    Rslock,
    Redlock,
    AsyncRedisLock,
    RedisBenchmark,
    FredFcall,
    /// The thinnest lock on relock's driver: `SET NX PX` and a compare-and-delete script through
    /// one fred client, no relock (not a peer: it shows what fred itself costs per cycle).
    FredSetNx,
    /// relock's own commands (its function's lone acquisition, the lone release's `HDEL`) through
    /// one fred client, no relock: what relock's server work costs on its driver, without relock.
    FredRelockCommands,
    /// A bare `tokio::net::TcpStream` with hand-written RESP.
    BareTcp,
}

impl Library {
    /// The lock libraries relock is compared with.
    pub const PEERS: [Library; 3] = [Library::Rslock, Library::Redlock, Library::AsyncRedisLock];

    pub fn name(self) -> &'static str {
        match self {
            Library::Relock => "relock",
            Library::Rslock => "rslock",
            Library::Redlock => "redlock",
            Library::AsyncRedisLock => "async-redis-lock",
            Library::RedisBenchmark => "redis-benchmark",
            Library::FredFcall => "fred FCALL",
            Library::FredSetNx => "fred SET NX (relock's driver, no relock)",
            Library::FredRelockCommands => "relock's commands on fred (no relock)",
            Library::BareTcp => "bare TcpStream",
        }
    }
}

/// How a peer retries an acquisition the lock refused. relock does not poll: its waiters are woken
/// by the release message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// relock: no polling.
    Waits,
    /// The library's own defaults.
    Default,
    /// Tuned to poll tightly: a 1 ms retry delay and (effectively) unbounded retries.
    Tight,
}

impl Retry {
    pub fn name(self) -> &'static str {
        match self {
            Retry::Waits => "waits",
            Retry::Default => "default",
            Retry::Tight => "tight",
        }
    }
}

/// What redis-benchmark runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchCommand {
    /// relock's acquire and release scripts, one row with both.
    Scripts,
    /// A plain `SET` and relock's acquire script, one row with both.
    SetAndAcquire,
}

/// Which lock the read-heavy and the fair handoff workloads run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// `client.rw_lock(name)`: reads on `.read()`, writes on `.write()`.
    Rw,
    /// `client.fair_lock(name)`: waiters granted in arrival order.
    Fair,
    /// `client.lock(name)`: every section exclusive, reads and writes alike.
    Plain,
}

impl LockKind {
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Rw => "rw_lock",
            LockKind::Fair => "fair_lock",
            LockKind::Plain => "plain lock",
        }
    }
}

/// A row's parameters, part of its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Params {
    Tasks(usize),
    ClusterTasks {
        primaries: usize,
        tasks: usize,
    },
    /// `contenders` tasks over `clients` clients (hot lock).
    Hot {
        contenders: usize,
        clients: usize,
        retry: Retry,
    },
    Masters(usize),
    Bench {
        clients: usize,
        pipeline: usize,
        command: BenchCommand,
    },
    /// One connection, one request in flight.
    OneInFlight,
    /// The same through a driver task that owns the connection.
    OneInFlightDriver,
    Watchdog {
        locks: usize,
        interval_s: u64,
    },
    ClusterWatchdog {
        primaries: usize,
        locks: usize,
        interval_s: u64,
    },
    /// A peer's row in the watchdog workload (nothing measured).
    Locks(usize),
    Waiters(usize),
    /// `tasks` tasks over `clients` clients sharing `permits` permits.
    Permits {
        permits: u64,
        tasks: usize,
        clients: usize,
    },
    /// `tasks` tasks over `clients` clients on one lock, each section a read with probability
    /// `read_pct` %, else a write.
    ReadHeavy {
        read_pct: u32,
        tasks: usize,
        clients: usize,
        lock: LockKind,
    },
    /// The hot lock (relock's) with a `handoff_window` of `window_ms`.
    HotWindow {
        contenders: usize,
        clients: usize,
        window_ms: u64,
    },
    /// `contenders` tasks over `clients` clients on one lock of kind `lock` (fair lock handoff).
    Handoff {
        contenders: usize,
        clients: usize,
        lock: LockKind,
    },
}

impl Params {
    /// The same point of a workload, whatever the retry setting (a peer's row beside relock's).
    pub fn same_point(&self, other: &Params) -> bool {
        match (self, other) {
            (
                Params::Hot {
                    contenders: a,
                    clients: b,
                    ..
                },
                Params::Hot {
                    contenders: c,
                    clients: d,
                    ..
                },
            ) => a == c && b == d,
            _ => self == other,
        }
    }

    /// The retry setting, for the rows that have one.
    pub fn retry(&self) -> Option<Retry> {
        match self {
            Params::Hot { retry, .. } if *retry != Retry::Waits => Some(*retry),
            _ => None,
        }
    }
}

impl fmt::Display for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Params::Tasks(n) => write!(f, "tasks={n}"),
            Params::ClusterTasks { primaries, tasks } => write!(f, "primaries={primaries} tasks={tasks}"),
            Params::Hot {
                contenders,
                clients,
                retry,
            } => {
                write!(f, "contenders={contenders} clients={clients}")?;
                match retry {
                    Retry::Waits => Ok(()),
                    other => write!(f, " retry={}", other.name()),
                }
            }
            Params::HotWindow {
                contenders,
                clients,
                window_ms,
            } => write!(
                f,
                "contenders={contenders} clients={clients} handoff_window={window_ms}ms"
            ),
            Params::Masters(n) => write!(f, "masters={n}"),
            Params::Bench {
                clients,
                pipeline,
                command,
            } => match command {
                BenchCommand::Scripts => write!(f, "c={clients} P={pipeline}"),
                BenchCommand::SetAndAcquire => write!(f, "c={clients} P={pipeline} SET, acquire script"),
            },
            Params::OneInFlight => write!(f, "1 connection, 1 in flight"),
            Params::OneInFlightDriver => write!(f, "1 connection, 1 in flight, via a driver task"),
            Params::Watchdog { locks, interval_s } => write!(f, "locks={locks} interval={interval_s}s"),
            Params::ClusterWatchdog {
                primaries,
                locks,
                interval_s,
            } => write!(f, "primaries={primaries} locks={locks} interval={interval_s}s"),
            Params::Locks(n) => write!(f, "locks={n}"),
            Params::Waiters(n) => write!(f, "waiters={n}"),
            Params::Permits {
                permits,
                tasks,
                clients,
            } => write!(f, "permits={permits} tasks={tasks} clients={clients}"),
            Params::ReadHeavy {
                read_pct,
                tasks,
                clients,
                lock,
            } => write!(
                f,
                "reads={read_pct}% tasks={tasks} clients={clients} {}",
                lock.name()
            ),
            Params::Handoff {
                contenders,
                clients,
                lock,
            } => write!(f, "contenders={contenders} clients={clients} {}", lock.name()),
        }
    }
}

/// A figure of a row; its name carries its unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    CyclesPerS,
    SectionsPerS,
    /// Sections per second as a fraction of the ideal (one section right after another).
    OfIdeal,
    /// The share of the run the lock was held: sections times their measured mean length over the
    /// run's time (the section itself overruns its nominal 1 ms on this VM; this does not count
    /// that against the lock).
    Utilization,
    AcquireP50Us,
    AcquireP99Us,
    ReleaseP50Us,
    /// From a holder's release call to the next holder's grant.
    HandoffP50Us,
    HandoffP99Us,
    /// The same, in the hot lock rows: the time the lock sits idle between holders.
    IdleGapP50Us,
    IdleGapP99Us,
    /// The mean section as it ran (hot lock rows; see `Run::where_the_time_goes`).
    SectionMeanUs,
    /// The idle gaps' time per section: their sum over the sections.
    GapUsPerSection,
    /// The share of the handoffs that passed the lock to another client's contender.
    CrossClientShare,
    /// Those handoffs' idle time per section, and their gap's p50.
    CrossClientGapUsPerSection,
    CrossClientGapP50Us,
    /// The idle gap p50 in round trips of the bare `TcpStream` floor loop measured in the same run
    /// (fair lock handoff rows).
    IdleGapP50Rtt,
    /// A contender's wait, from wanting the lock to its grant.
    WaitP50Us,
    WaitP99Us,
    /// The longest wait (fair lock handoff rows).
    WaitMaxUs,
    /// The longest wait in sections: how many sections were granted, at the run's rate, while the
    /// longest waiter waited (first come, first served over N contenders: about N - 1).
    WaitMaxSections,
    /// The same, of the sections that were writes (read-heavy rows).
    WriterWaitP50Us,
    WriterWaitP99Us,
    /// The same, of the sections that were reads (read-heavy rows).
    ReaderWaitP99Us,
    /// The share of the sections that were writes.
    WriteShare,
    /// Holders at once, on average: sections/s times the mean section as it ran.
    MeanHolders,
    /// The read-write (or fair) lock's figure over the plain lock's, from the same run (read-heavy
    /// and fair lock handoff rows).
    SectionsVsPlain,
    RedisCpuVsPlain,
    RedisCmdsVsPlain,
    /// How long a holder held the lock (the critical section as it ran).
    SectionP50Us,
    RttP50Us,
    RttP99Us,
    RedisCpuUsPerCycle,
    RedisCmdsPerCycle,
    ClientCpuUsPerCycle,
    /// This process's context switches (voluntary and involuntary, every thread) per cycle.
    ClientCswPerCycle,
    /// This process's heap allocations (every thread) per cycle.
    ClientAllocsPerCycle,
    /// Times a runtime worker of this process went to sleep and was woken again, per cycle.
    ClientParksPerCycle,
    RedisCpuUsPerSection,
    RedisCmdsPerSection,
    ClientCpuUsPerSection,
    ClientCswPerSection,
    ClientAllocsPerSection,
    ClientParksPerSection,
    AcquireScriptPerS,
    ReleaseScriptPerS,
    SetPerS,
    SetP50Us,
    AcquireScriptP50Us,
    CommandsPerRound,
    RoundMs,
    RoundsSeen,
    ClientCpuPctOfCore,
    RedisCpuPctOfCore,
    BytesPerHeldLock,
    RedisBytesPerHeldLock,
    HeldAfter,
    DistinctSlots,
    ConnectionsOpened,
    BytesPerWaiter,
    AllGrantedMs,
    Granted,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::CyclesPerS => "cycles_per_s",
            Metric::SectionsPerS => "sections_per_s",
            Metric::OfIdeal => "of_ideal",
            Metric::Utilization => "utilization",
            Metric::AcquireP50Us => "acquire_p50_us",
            Metric::AcquireP99Us => "acquire_p99_us",
            Metric::ReleaseP50Us => "release_p50_us",
            Metric::HandoffP50Us => "handoff_p50_us",
            Metric::HandoffP99Us => "handoff_p99_us",
            Metric::IdleGapP50Us => "idle_gap_p50_us",
            Metric::IdleGapP99Us => "idle_gap_p99_us",
            Metric::IdleGapP50Rtt => "idle_gap_p50_rtt",
            Metric::SectionMeanUs => "section_mean_us",
            Metric::GapUsPerSection => "gap_us_per_section",
            Metric::CrossClientShare => "cross_client_share",
            Metric::CrossClientGapUsPerSection => "cross_client_gap_us_per_section",
            Metric::CrossClientGapP50Us => "cross_client_gap_p50_us",
            Metric::WaitP50Us => "wait_p50_us",
            Metric::WaitP99Us => "wait_p99_us",
            Metric::WaitMaxUs => "wait_max_us",
            Metric::WaitMaxSections => "wait_max_sections",
            Metric::WriterWaitP50Us => "writer_wait_p50_us",
            Metric::WriterWaitP99Us => "writer_wait_p99_us",
            Metric::ReaderWaitP99Us => "reader_wait_p99_us",
            Metric::WriteShare => "write_share",
            Metric::MeanHolders => "mean_holders",
            Metric::SectionsVsPlain => "sections_vs_plain",
            Metric::RedisCpuVsPlain => "redis_cpu_vs_plain",
            Metric::RedisCmdsVsPlain => "redis_cmds_vs_plain",
            Metric::SectionP50Us => "section_p50_us",
            Metric::RttP50Us => "rtt_p50_us",
            Metric::RttP99Us => "rtt_p99_us",
            Metric::RedisCpuUsPerCycle => "redis_cpu_us_per_cycle",
            Metric::RedisCmdsPerCycle => "redis_cmds_per_cycle",
            Metric::ClientCpuUsPerCycle => "client_cpu_us_per_cycle",
            Metric::ClientCswPerCycle => "client_csw_per_cycle",
            Metric::ClientAllocsPerCycle => "client_allocs_per_cycle",
            Metric::ClientParksPerCycle => "client_parks_per_cycle",
            Metric::RedisCpuUsPerSection => "redis_cpu_us_per_section",
            Metric::RedisCmdsPerSection => "redis_cmds_per_section",
            Metric::ClientCpuUsPerSection => "client_cpu_us_per_section",
            Metric::ClientCswPerSection => "client_csw_per_section",
            Metric::ClientAllocsPerSection => "client_allocs_per_section",
            Metric::ClientParksPerSection => "client_parks_per_section",
            Metric::AcquireScriptPerS => "acquire_script_per_s",
            Metric::ReleaseScriptPerS => "release_script_per_s",
            Metric::SetPerS => "set_per_s",
            Metric::SetP50Us => "set_p50_us",
            Metric::AcquireScriptP50Us => "acquire_script_p50_us",
            Metric::CommandsPerRound => "commands_per_round",
            Metric::RoundMs => "round_ms",
            Metric::RoundsSeen => "rounds_seen",
            Metric::ClientCpuPctOfCore => "client_cpu_pct_of_core",
            Metric::RedisCpuPctOfCore => "redis_cpu_pct_of_core",
            Metric::BytesPerHeldLock => "bytes_per_held_lock",
            Metric::RedisBytesPerHeldLock => "redis_bytes_per_held_lock",
            Metric::HeldAfter => "held_after",
            Metric::DistinctSlots => "distinct_slots",
            Metric::ConnectionsOpened => "connections_opened",
            Metric::BytesPerWaiter => "bytes_per_waiter",
            Metric::AllGrantedMs => "all_granted_ms",
            Metric::Granted => "granted",
        }
    }
}

/// One measured row.
#[derive(Clone, Debug)]
pub struct Row {
    pub workload: Workload,
    pub library: Library,
    pub params: Params,
    /// Figures, in the unit their name says.
    pub metrics: Vec<(Metric, f64)>,
    pub note: String,
}

impl Row {
    pub fn new(workload: Workload, library: Library, params: Params) -> Row {
        Row {
            workload,
            library,
            params,
            metrics: Vec::new(),
            note: String::new(),
        }
    }

    pub fn metric(mut self, metric: Metric, value: f64) -> Row {
        self.metrics.push((metric, value));
        self
    }

    /// The p50 and p99 of `h` (µs) as two figures; none if `h` is empty.
    pub fn percentiles(self, p50: Metric, p99: Metric, h: &Histogram<u64>) -> Row {
        if h.is_empty() {
            return self;
        }
        self.metric(p50, h.value_at_quantile(0.50) as f64)
            .metric(p99, h.value_at_quantile(0.99) as f64)
    }

    /// The p50 of `h` (µs) as a figure; none if `h` is empty.
    pub fn median(self, p50: Metric, h: &Histogram<u64>) -> Row {
        match h.is_empty() {
            true => self,
            false => self.metric(p50, h.value_at_quantile(0.50) as f64),
        }
    }

    /// Adds a note (after any note already there).
    pub fn note(mut self, note: impl AsRef<str>) -> Row {
        if !self.note.is_empty() {
            self.note.push_str("; ");
        }
        self.note.push_str(note.as_ref());
        self
    }

    pub fn get(&self, metric: Metric) -> Option<f64> {
        self.metrics.iter().find(|(m, _)| *m == metric).map(|(_, v)| *v)
    }
}

/// The row of `workload`, `library` and `params`.
pub fn find(rows: &[Row], workload: Workload, library: Library, params: Params) -> Option<&Row> {
    rows.iter()
        .find(|r| r.workload == workload && r.library == library && r.params == params)
}

/// One figure of the row of `workload`, `library` and `params`.
pub fn figure(
    rows: &[Row],
    workload: Workload,
    library: Library,
    params: Params,
    metric: Metric,
) -> Option<f64> {
    find(rows, workload, library, params).and_then(|r| r.get(metric))
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// Whole microseconds, at least 1 (the histogram's lowest value).
pub fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

/// What one bench task counted: its cycles (or granted sections) and latencies in µs.
pub struct Tally {
    pub count: u64,
    /// Acquire latency (uncontended) or a contender's wait (contended, hot lock).
    pub acquire: Histogram<u64>,
    pub release: Histogram<u64>,
    /// From a holder's release call to the next holder's grant.
    pub handoff: Histogram<u64>,
    /// The same, where the next holder was of another client than the releasing one.
    pub cross_gap: Histogram<u64>,
    /// How long the lock was held.
    pub section: Histogram<u64>,
    /// Releases that reported an error.
    pub failed_releases: u64,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally::new()
    }
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            count: 0,
            acquire: histogram(),
            release: histogram(),
            handoff: histogram(),
            cross_gap: histogram(),
            section: histogram(),
            failed_releases: 0,
        }
    }

    pub fn merge(&mut self, other: Tally) {
        self.count += other.count;
        self.acquire.add(other.acquire).expect("merge histograms");
        self.release.add(other.release).expect("merge histograms");
        self.handoff.add(other.handoff).expect("merge histograms");
        self.cross_gap.add(other.cross_gap).expect("merge histograms");
        self.section.add(other.section).expect("merge histograms");
        self.failed_releases += other.failed_releases;
    }
}
