//! relock against its peers (rslock 0.10, redlock 2.0, async-redis-lock 0.4), against a bare
//! round trip and against Redis's own ceiling, side by side in one run, on throwaway redis-servers
//! this program starts itself.
//!
//! ```sh
//! cargo bench -p relock-bench -- --quick                  # everything, 1 s per row (under 2 minutes)
//! cargo bench -p relock-bench                             # everything, 8 s per row (about 10 minutes)
//! cargo bench -p relock-bench -- --quick --only hot,floor # only these workloads
//! cargo bench -p relock-bench -- --docs                   # no run: locks.json into the docs
//! ```
//!
//! Prints a Markdown table (rows, then the targets computed from this run's rows); writes
//! `target/bench/locks.json` and `target/bench/locks.svg`. `--docs` renders that JSON into the tables
//! of `docs/performance.md` and the summary of `README.md` (see `docs.rs`).
//!
//! Workloads, by their `--only` names:
//!
//! - `floor`: a bare `tokio::net::TcpStream` running relock's batch function (acquire, then release:
//!   two round trips per cycle, one in flight), directly and through a driver task as client
//!   libraries do, and `redis-benchmark -c 1` of `SET` and an acquisition.
//! - `ceiling`: `redis-benchmark -c 50` of acquisitions and releases (`FCALL` of relock's library, as
//!   relock runs them on Redis 7.0 and later), without and with pipelining, and fred's `FCALL`
//!   round trip.
//! - `uncontended`: each task cycles on a lock of its own, 1, 16 and 256 tasks; beside the peers, the
//!   thinnest lock on fred itself (`SET NX PX`, a compare-and-delete script), not a peer: what the
//!   driver costs below anything relock adds. The libraries of each task count (and of each quorum
//!   size in `redlock`) run interleaved, in 250 ms slices taken in turn, so that their ratios
//!   compare the same moments of a machine whose speed drifts.
//! - `contended`: 2, 8 and 32 tasks on one lock with an empty critical section (measures barging).
//! - `hot`: one hot lock with a 1 ms critical section, 8, 64 and 512 contenders over 4 clients,
//!   each peer at its default retry settings and polling tightly; then relock's at 64 contenders
//!   with a `handoff_window` of 5 and of 80 ms (the default, in the rows before, is 20 ms).
//! - `redlock`: one task over a quorum of 1, 3 and 5 masters.
//! - `watchdog`: 10,000 held locks renewed by the watchdog.
//! - `waiters`: 10,000 tasks waiting on 10,000 held locks.
//! - `cluster`: uncontended cycles and the watchdog on a Redis Cluster of three primaries.
//! - `network`: the uncontended, hot-lock and Redlock rows again, every library reaching Redis
//!   through the same userspace proxy that delays each way by 250 µs (a same-zone round trip; the
//!   kernel here has no `netem`).
//! - `family`: relock's semaphore, 10 permits shared by 64 tasks over 4 clients, 1 ms sections
//!   (no peer has one: judged against the ideal of 10,000 sections/s); and its read-write lock,
//!   read-heavy: 64 tasks over 4 clients, each section a read with probability 95 % (else a
//!   write), 1 ms sections, beside the plain lock running the same draws (every section
//!   exclusive), with the ratios of the two from the same run; and the fair lock handoff: the hot
//!   lock's 64 contenders over 4 clients with 1 ms sections on `fair_lock(name)` and on the plain
//!   `lock(name)`, with the longest wait (in µs and in sections), the idle gap in round trips of
//!   the bare `TcpStream` loop, Redis's commands per section by command and the fair/plain ratios.
//!
//! Every throughput row (uncontended, contended, hot lock, redlock, cluster uncontended, floor)
//! also reports Redis's CPU time and commands per cycle (or section), summed over the servers of
//! the row (every command they ran, those called by scripts included), and this process's CPU time
//! per cycle, which includes the bench loop itself.

#[path = "../../tests/support/mod.rs"]
mod support;

mod alloc;
mod docs;
mod host;
mod peers;
mod report;
mod rows;
mod workloads;

/// Counts allocations for the rows (see `alloc`).
#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

use std::time::Duration;

use host::RoundLog;
use support::RedisServer;

/// A group of workloads, selectable with `--only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Floor,
    Ceiling,
    Uncontended,
    Contended,
    Hot,
    Redlock,
    Watchdog,
    Waiters,
    Cluster,
    Family,
    Network,
}

impl Group {
    const ALL: [Group; 11] = [
        Group::Floor,
        Group::Ceiling,
        Group::Uncontended,
        Group::Contended,
        Group::Hot,
        Group::Redlock,
        Group::Watchdog,
        Group::Waiters,
        Group::Cluster,
        Group::Family,
        Group::Network,
    ];

    fn name(self) -> &'static str {
        match self {
            Group::Floor => "floor",
            Group::Ceiling => "ceiling",
            Group::Uncontended => "uncontended",
            Group::Contended => "contended",
            Group::Hot => "hot",
            Group::Redlock => "redlock",
            Group::Watchdog => "watchdog",
            Group::Waiters => "waiters",
            Group::Cluster => "cluster",
            Group::Family => "family",
            Group::Network => "network",
        }
    }

    fn parse(name: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == name)
    }
}

/// How this run goes.
pub struct Mode {
    pub quick: bool,
    /// How long each measured row runs.
    pub run: Duration,
    /// The groups to run.
    pub groups: Vec<Group>,
}

impl Mode {
    /// From the command line (`--quick`, `--only a,b`; cargo's own `--bench` is ignored) and
    /// `RELOCK_BENCH_QUICK`.
    fn from_args() -> Mode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = args.iter().any(|a| a == "--quick") || std::env::var("RELOCK_BENCH_QUICK").is_ok();
        let only = args
            .iter()
            .position(|a| a == "--only")
            .and_then(|i| args.get(i + 1).cloned())
            .or_else(|| {
                args.iter()
                    .find_map(|a| a.strip_prefix("--only=").map(str::to_string))
            });
        let groups = match only {
            None => Group::ALL.to_vec(),
            Some(names) => names
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| {
                    Group::parse(n.trim()).unwrap_or_else(|| {
                        let known: Vec<&str> = Group::ALL.iter().map(|g| g.name()).collect();
                        eprintln!("unknown workload {n:?}; known: {}", known.join(", "));
                        std::process::exit(2)
                    })
                })
                .collect(),
        };
        Mode {
            quick,
            run: Duration::from_secs(if quick { 1 } else { 8 }),
            groups,
        }
    }

    fn runs(&self, group: Group) -> bool {
        self.groups.contains(&group)
    }
}

/// The network's delay each way in the `network` rows: a typical round trip within one zone.
const NET_DELAY: Duration = Duration::from_micros(250);

/// The uncontended, hot-lock and Redlock rows with every library reaching Redis through the same
/// delaying proxy ([`NET_DELAY`] each way; one per master), beside the local rows.
async fn network(mode: &Mode, server: &RedisServer, rows: &mut Vec<rows::Row>) {
    use support::delay::DelayProxy;
    let as_net = |rows: &mut Vec<rows::Row>, from: usize, workload: rows::Workload| {
        for row in &mut rows[from..] {
            row.workload = workload;
        }
    };
    let proxy = DelayProxy::start(server.port(), NET_DELAY);
    let from = rows.len();
    workloads::uncontended_via(mode, server, &proxy.url(), rows).await;
    as_net(rows, from, rows::Workload::NetUncontended);
    let from = rows.len();
    workloads::hot_lock_via(mode, server, &proxy.url(), rows).await;
    as_net(rows, from, rows::Workload::NetHotLock);
    let masters: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let proxies: Vec<DelayProxy> = masters
        .iter()
        .map(|m| DelayProxy::start(m.port(), NET_DELAY))
        .collect();
    let urls: Vec<String> = proxies.iter().map(DelayProxy::url).collect();
    let from = rows.len();
    workloads::redlock_quorum_via(mode, &masters, &urls, rows).await;
    as_net(rows, from, rows::Workload::NetRedlock);
}

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if std::env::args().any(|a| a == "--docs") {
        let json = root.join("target/bench/locks.json");
        let rendered = std::fs::read_to_string(&json)
            .map_err(|err| format!("{}: {err} (run the bench first)", json.display()))
            .and_then(|json| docs::write(&json, &root));
        match rendered {
            Ok(()) => eprintln!(
                "wrote the tables of docs/performance.md and README.md from {}",
                json.display()
            ),
            Err(err) => {
                eprintln!("{err}");
                std::process::exit(1);
            }
        }
        return;
    }
    let mode = Mode::from_args();
    let rounds = RoundLog::default();
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let filter = tracing_subscriber::filter::Targets::new()
            .with_target(host::WATCHDOG_TARGET, tracing::Level::DEBUG);
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
        let names: Vec<&str> = mode.groups.iter().map(|g| g.name()).collect();
        eprintln!(
            "relock bench ({} mode: {}) on {version}",
            if mode.quick { "quick" } else { "full" },
            names.join(", ")
        );
        let started = std::time::Instant::now();
        let server = RedisServer::start();
        let mut rows = Vec::new();
        for group in Group::ALL.into_iter().filter(|g| mode.runs(*g)) {
            eprintln!("{} ... ({:.0} s)", group.name(), started.elapsed().as_secs_f64());
            match group {
                Group::Floor => workloads::floor(&mode, &server, &mut rows).await,
                Group::Ceiling => workloads::ceiling(&mode, &server, &mut rows).await,
                Group::Uncontended => workloads::uncontended(&mode, &server, &mut rows).await,
                Group::Contended => workloads::contended(&mode, &server, &mut rows).await,
                Group::Hot => workloads::hot_lock(&mode, &server, &mut rows).await,
                Group::Redlock => {
                    let masters: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
                    workloads::redlock_quorum(&mode, &masters, &mut rows).await;
                }
                Group::Watchdog => workloads::watchdog_scale(&mode, &server, &mut rows, &rounds).await,
                Group::Waiters => workloads::waiters_scale(&server, &mut rows).await,
                Group::Cluster => workloads::cluster_rows(&mode, &mut rows, &rounds).await,
                Group::Family => {
                    workloads::semaphore(&mode, &server, &mut rows).await;
                    workloads::read_heavy(&mode, &server, &mut rows).await;
                    workloads::fair_handoff(&mode, &server, &mut rows).await;
                }
                Group::Network => network(&mode, &server, &mut rows).await,
            }
        }
        eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());

        let targets = report::targets(&rows);
        println!("{}", report::markdown(&rows, &targets));
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
        std::fs::create_dir_all(&dir).expect("target/bench");
        std::fs::write(
            dir.join("locks.json"),
            report::json(&mode, &version, &rows, &targets),
        )
        .expect("json");
        std::fs::write(dir.join("locks.svg"), report::svg(&rows)).expect("svg");
        eprintln!("wrote {}/locks.json and locks.svg", dir.display());
    });
}
