//! The run's output: the targets (each computed from rows of the same run), and the rows and targets
//! as a Markdown table, `locks.json` and `locks.svg`.

use crate::rows::{figure, BenchCommand, Library, LockKind, Metric, Params, Retry, Row, Workload};
use crate::workloads::HOT_CLIENTS;
use crate::Mode;

/// One target: what it asks, what was measured, whether it holds.
pub struct Target {
    pub target: String,
    pub measured: String,
    pub holds: bool,
}

fn target(target: impl Into<String>, measured: impl Into<String>, holds: bool) -> Target {
    Target {
        target: target.into(),
        measured: measured.into(),
        holds,
    }
}

/// The pipelined ceiling: acquire + release cycles Redis itself runs (50 connections, P=16).
pub fn ceiling_cycles(rows: &[Row]) -> Option<f64> {
    let params = Params::Bench {
        clients: 50,
        pipeline: 16,
        command: BenchCommand::Scripts,
    };
    figure(
        rows,
        Workload::Ceiling,
        Library::RedisBenchmark,
        params,
        Metric::CyclesPerS,
    )
}

/// The peer rows beside relock's row at `params` (every retry setting).
fn peer_rows(rows: &[Row], workload: Workload, params: Params) -> impl Iterator<Item = &Row> {
    rows.iter().filter(move |r| {
        r.workload == workload && Library::PEERS.contains(&r.library) && r.params.same_point(&params)
    })
}

/// A peer row's label: its library and its retry setting, if any.
fn label(row: &Row) -> String {
    match row.params.retry() {
        Some(retry) => format!("{} ({})", row.library.name(), retry.name()),
        None => row.library.name().to_string(),
    }
}

/// The peer with the highest (`max`) or lowest value of `metric` beside relock at `params`.
fn best_peer(
    rows: &[Row],
    workload: Workload,
    params: Params,
    metric: Metric,
    max: bool,
) -> Option<(String, f64)> {
    peer_rows(rows, workload, params)
        .filter_map(|r| r.get(metric).map(|v| (label(r), v)))
        .reduce(|a, b| if (b.1 > a.1) == max { b } else { a })
}

/// Every target whose rows this run has.
pub fn targets(rows: &[Row]) -> Vec<Target> {
    let mut out = Vec::new();
    let relock = |w: Workload, p: Params, m: Metric| figure(rows, w, Library::Relock, p, m);
    let fred_rtt = figure(
        rows,
        Workload::Ceiling,
        Library::FredFcall,
        Params::OneInFlight,
        Metric::RttP50Us,
    );
    let floor_rtt = figure(
        rows,
        Workload::Floor,
        Library::BareTcp,
        Params::OneInFlight,
        Metric::RttP50Us,
    );
    let (u, c) = (Workload::Uncontended, Metric::CyclesPerS);

    // The targets kept from before.
    if let Some(relock_256) = relock(u, Params::Tasks(256), c) {
        if let Some(ceiling) = ceiling_cycles(rows) {
            let share = relock_256 / ceiling;
            out.push(target(
                "uncontended 256 tasks >= 70% of the pipelined ceiling",
                format!("{:.0}%", share * 100.0),
                share >= 0.7,
            ));
        }
        if let Some(rs) = figure(rows, u, Library::Rslock, Params::Tasks(256), c) {
            out.push(target(
                "uncontended 256 tasks >= rslock",
                format!("{:.2}x", relock_256 / rs),
                relock_256 >= rs,
            ));
        }
    }
    if let (Some(p50), Some(rtt)) = (relock(u, Params::Tasks(1), Metric::AcquireP50Us), fred_rtt) {
        out.push(target(
            "uncontended 1 task: acquire p50 <= 1.2x fred FCALL rtt",
            format!("{:.2}x", p50 / rtt),
            p50 <= 1.2 * rtt,
        ));
    }
    if let (Some(handoff), Some(rtt)) = (
        relock(Workload::Contended, Params::Tasks(8), Metric::HandoffP50Us),
        fred_rtt,
    ) {
        out.push(target(
            "contended handoff p50 <= 3 fred round trips (8 tasks)",
            format!("{:.1} rtt", handoff / rtt),
            handoff <= 3.0 * rtt,
        ));
    }
    for tasks in [2usize, 8, 32] {
        let (w, p, m) = (Workload::Contended, Params::Tasks(tasks), Metric::SectionsPerS);
        if let (Some(relock), Some((_, best))) = (relock(w, p, m), best_peer(rows, w, p, m, true)) {
            let ratio = relock / best.max(1e-9);
            out.push(target(
                format!("contended {p} (empty section): >= 10x the best polling peer"),
                format!("{ratio:.1}x"),
                ratio >= 10.0,
            ));
        }
    }

    // (1) Uncontended cycles/s at least the best peer's; (2) Redis CPU per cycle at most 1.5x the
    // lowest peer's.
    for tasks in [1usize, 16, 256] {
        let p = Params::Tasks(tasks);
        if let (Some(relock), Some((peer, best))) = (relock(u, p, c), best_peer(rows, u, p, c, true)) {
            // How far relock's own commands get on its driver, relock's layers left out: the
            // most the design makes of fred here.
            let commands = figure(rows, u, Library::FredRelockCommands, p, c)
                .map(|v| format!("; relock's commands on fred, no relock: {:.2}x", v / best))
                .unwrap_or_default();
            out.push(target(
                format!("uncontended {p}: cycles/s >= 1.0x best peer"),
                format!("{:.2}x of {peer}{commands}", relock / best),
                relock >= best,
            ));
        }
        let m = Metric::RedisCpuUsPerCycle;
        if let (Some(relock), Some((peer, low))) = (relock(u, p, m), best_peer(rows, u, p, m, false)) {
            out.push(target(
                format!("uncontended {p}: Redis CPU per cycle <= 1.1x best peer"),
                format!("{relock:.1} µs, {:.2}x of {peer}", relock / low.max(1e-9)),
                relock <= 1.1 * low,
            ));
        }
        // relock's layers: at least as fast as its own commands sent through fred alone.
        if let (Some(relock), Some(own)) = (
            relock(u, p, c),
            figure(rows, u, Library::FredRelockCommands, p, c),
        ) {
            out.push(target(
                format!("uncontended {p}: cycles/s >= 1.0x relock's own commands on fred"),
                format!("{:.2}x", relock / own.max(1e-9)),
                relock >= own,
            ));
        }
    }

    // (3) The hot lock.
    for contenders in [8usize, 64, 512] {
        let p = Params::Hot {
            contenders,
            clients: HOT_CLIENTS,
            retry: Retry::Waits,
        };
        let h = Workload::HotLock;
        if let Some(of_ideal) = relock(h, p, Metric::OfIdeal) {
            // Where the rest went: the section's own overrun caps the share, the idle gaps take
            // the rest (see `Run::where_the_time_goes`).
            let split = match (
                relock(h, p, Metric::SectionMeanUs),
                relock(h, p, Metric::GapUsPerSection),
                relock(h, p, Metric::CrossClientGapUsPerSection),
                relock(h, p, Metric::CrossClientShare),
            ) {
                (Some(section), Some(gaps), Some(cross), Some(share)) => format!(
                    " (the section ran {section:.0} µs: {:.0}% at most; idle {gaps:.0} µs per section, \
                     {cross:.0} of them in the {:.1}% of handoffs to another client)",
                    1e5 / section,
                    share * 100.0
                ),
                _ => String::new(),
            };
            out.push(target(
                format!("hot lock {contenders} contenders: >= 90% of ideal (1,000 sections/s)"),
                format!("{:.0}%{split}", of_ideal * 100.0),
                of_ideal >= 0.9,
            ));
        }
        if let Some(busy) = relock(h, p, Metric::Utilization) {
            out.push(target(
                format!("hot lock {contenders} contenders: held >= 95% of the time (sections as they ran)"),
                format!("{:.1}%", busy * 100.0),
                busy >= 0.95,
            ));
        }
        if let (Some(gap), Some(rtt)) = (relock(h, p, Metric::IdleGapP50Us), floor_rtt) {
            out.push(target(
                format!("hot lock {contenders} contenders: idle gap p50 <= 2 round trips (floor)"),
                format!("{:.1} rtt", gap / rtt),
                gap <= 2.0 * rtt,
            ));
        }
        let m = Metric::SectionsPerS;
        if let (Some(relock), Some((peer, best))) = (relock(h, p, m), best_peer(rows, h, p, m, true)) {
            out.push(target(
                format!("hot lock {contenders} contenders: sections/s >= every peer, both settings"),
                format!("{:.2}x of {peer}", relock / best.max(1e-9)),
                relock >= best,
            ));
        }
        let m = Metric::RedisCpuUsPerSection;
        let tight = peer_rows(rows, h, p)
            .filter(|r| r.params.retry() == Some(Retry::Tight))
            .filter_map(|r| r.get(m).map(|v| (label(r), v)))
            .reduce(|a, b| if b.1 < a.1 { b } else { a });
        if let (true, Some(relock), Some((peer, low))) = (contenders >= 64, relock(h, p, m), tight) {
            out.push(target(
                format!(
                    "hot lock {contenders} contenders: Redis CPU per section <= 0.2x tight-polling peers"
                ),
                format!("{:.3}x of {peer}", relock / low.max(1e-9)),
                relock <= 0.2 * low,
            ));
        }
    }

    // (4) Redlock over N masters.
    let q = |n: usize, m: Metric| relock(Workload::Redlock, Params::Masters(n), m);
    if let (Some(n5), Some(n1)) = (q(5, Metric::AcquireP50Us), q(1, Metric::AcquireP50Us)) {
        out.push(target(
            "redlock N=5 acquire p50 <= 1.5x N=1",
            format!("{:.2}x", n5 / n1),
            n5 <= 1.5 * n1,
        ));
    }
    let rs = |n: usize| {
        figure(
            rows,
            Workload::Redlock,
            Library::Rslock,
            Params::Masters(n),
            Metric::AcquireP50Us,
        )
    };
    if let (Some(n5), Some(n1), Some(rs5), Some(rs1)) = (
        q(5, Metric::AcquireP50Us),
        q(1, Metric::AcquireP50Us),
        rs(5),
        rs(1),
    ) {
        out.push(target(
            "redlock acquire p50, N=5 over N=1: no worse than rslock's",
            format!("{:.2}x (rslock {:.2}x)", n5 / n1, rs5 / rs1),
            n5 / n1 <= rs5 / rs1,
        ));
    }
    for n in [3usize, 5] {
        let rs = figure(rows, Workload::Redlock, Library::Rslock, Params::Masters(n), c);
        if let (Some(relock), Some(rs)) = (q(n, c), rs) {
            out.push(target(
                format!("redlock N={n}: cycles/s >= rslock"),
                format!("{:.2}x", relock / rs),
                relock >= rs,
            ));
        }
    }

    // (6) Across a network (every library through the same delaying proxy).
    for tasks in [1usize, 16, 256] {
        let (w, p) = (Workload::NetUncontended, Params::Tasks(tasks));
        if let (Some(relock), Some((peer, best))) = (relock(w, p, c), best_peer(rows, w, p, c, true)) {
            out.push(target(
                format!("{} {p}: cycles/s >= 1.0x best peer", w.name()),
                format!("{:.2}x of {peer}", relock / best.max(1e-9)),
                relock >= best,
            ));
        }
    }
    for contenders in [8usize, 64, 512] {
        let (w, m) = (Workload::NetHotLock, Metric::SectionsPerS);
        let p = Params::Hot {
            contenders,
            clients: HOT_CLIENTS,
            retry: Retry::Waits,
        };
        if let (Some(relock), Some((peer, best))) = (relock(w, p, m), best_peer(rows, w, p, m, true)) {
            out.push(target(
                format!("{} {contenders} contenders: sections/s >= every peer", w.name()),
                format!("{:.2}x of {peer}", relock / best.max(1e-9)),
                relock >= best,
            ));
        }
    }

    // (5) One task's acquisition against the bare round trip.
    if let (Some(p50), Some(rtt)) = (relock(u, Params::Tasks(1), Metric::AcquireP50Us), floor_rtt) {
        out.push(target(
            "uncontended 1 task: acquire p50 <= 1.2x the bare TcpStream round trip",
            format!("{:.2}x ({p50:.0} µs vs {rtt:.0} µs)", p50 / rtt),
            p50 <= 1.2 * rtt,
        ));
    }

    if let Some(row) = rows
        .iter()
        .find(|r| r.workload == Workload::Watchdog && r.library == Library::Relock)
    {
        let commands = row.get(Metric::CommandsPerRound).unwrap_or(f64::MAX);
        let bound = (10_000f64 / 512.0).ceil();
        out.push(target(
            "watchdog: <= ceil(10000/512) calls per round",
            format!("{commands:.0}"),
            commands <= bound,
        ));
        let cpu = row.get(Metric::ClientCpuPctOfCore).unwrap_or(f64::MAX);
        out.push(target(
            format!("watchdog: < 2% of a core ({})", row.params),
            format!("{cpu:.2}%"),
            cpu < 2.0,
        ));
    }
    // 100,000 held locks with the default settings (a full run only).
    if let Some(row) = rows.iter().find(|r| {
        r.workload == Workload::Watchdog
            && r.library == Library::Relock
            && matches!(r.params, Params::Watchdog { locks: 100_000, .. })
    }) {
        let client = row.get(Metric::ClientCpuPctOfCore).unwrap_or(f64::MAX);
        out.push(target(
            format!(
                "watchdog, 100,000 held locks, default settings: <= 1% of a core in the client ({})",
                row.params
            ),
            format!("{client:.2}%"),
            client <= 1.0,
        ));
        let redis = row.get(Metric::RedisCpuPctOfCore).unwrap_or(f64::MAX);
        out.push(target(
            "watchdog, 100,000 held locks: <= 3% of a core in Redis",
            format!("{redis:.2}%"),
            redis <= 3.0,
        ));
    }
    if let Some(row) = rows
        .iter()
        .find(|r| r.workload == Workload::Waiters && r.library == Library::Relock)
    {
        let conns = row.get(Metric::ConnectionsOpened).unwrap_or(f64::MAX);
        out.push(target(
            "waiters: <= 2 connections per client",
            format!("{conns:.0}"),
            conns <= 2.0,
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

/// What some figures mean, printed under the rows.
const LEGEND: &str = "
`client_cpu_*`: this process's CPU time (getrusage), the bench loop included. `client_csw_*`: its \
context switches (getrusage, voluntary and involuntary): mostly a worker thread woken from sleep to \
run a task another thread woke. `client_allocs_*`: its heap allocations, every thread (a counting \
global allocator). `client_parks_*`: how often a runtime worker went to sleep and was woken again \
(tokio's `worker_park_count`). `redis_cpu_*`: \
`used_cpu_sys + used_cpu_user` summed over the row's servers. `redis_cmds_*`: every command the \
servers ran (`INFO commandstats`: the commands scripts call included, the bench's `INFO` calls left \
out). Hot lock: the critical section is a sleep on a blocking thread until 1 ms after the grant (its \
timer slack at 1 ns; `section_p50_us` as it ran, the hop back to the holder's task included); `of_ideal` is sections/s over 1,000; `utilization` is sections/s times the mean section as it \
ran, the share of the run the lock was held; a wait still open at the end of the run counts as long as \
it was then, so a `wait_p99_us` near the run time means some contenders waited the whole run. RW lock, \
read-heavy: the same section; `mean_holders` is sections/s times the mean section as it ran (how many \
held it at once); `write_share` the share of sections that were writes; `*_vs_plain` the read-write \
lock's figure over the plain lock's of the same run. Fair lock handoff: the hot lock's 64 contenders on \
`fair_lock` and on the plain lock; `wait_max_sections` is the longest wait times sections/s (first \
come, first served over 64 contenders: about 63); `idle_gap_p50_rtt` the idle gap p50 over the bare \
`TcpStream` round trip p50 measured just before; `*_vs_plain` the fair lock's figure over the plain \
lock's. Uncontended, `fred SET NX`: the thinnest lock (rslock's two commands) on relock's own driver \
with no relock in between, one client shared by the tasks: not a peer, the ceiling of any lock built \
on fred here; its gap to the peers is fred's. Uncontended, `relock's commands on fred`: the `FCALL` \
of relock's function that a lone fresh acquisition sends and the `HDEL` that a lone release sends, \
through one fred client, no relock (no coalescing either): its gap to `fred SET NX` is what relock's \
commands cost over a `SET NX`, and relock's gap to it what relock's layers add. Every loop \
runs on a runtime worker, as a user's task does (one awaited in `main`'s `block_on` had each reply \
wake the main thread from a worker). One request in flight on this 2-vCPU VM mostly waits for an \
idle vCPU to wake.
";

pub fn markdown(rows: &[Row], targets: &[Target]) -> String {
    let mut out = String::from("| workload | library | params | figures | note |\n|---|---|---|---|---|\n");
    for row in rows {
        let figures: Vec<String> = row
            .metrics
            .iter()
            .map(|(m, v)| format!("{} {}", m.name(), pretty(*v)))
            .collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            row.workload.name(),
            row.library.name(),
            row.params,
            figures.join(", "),
            row.note
        ));
    }
    out.push_str(LEGEND);
    out.push_str("\n| target | measured | holds |\n|---|---|---|\n");
    for t in targets {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            t.target,
            t.measured,
            if t.holds { "yes" } else { "**no**" }
        ));
    }
    out
}

fn json_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// relock's ratios on its own row: its main figure over each peer's at the same point (each retry
/// setting), and over the ceiling.
fn ratios(rows: &[Row], row: &Row) -> Vec<String> {
    if let Params::ReadHeavy {
        lock: LockKind::Rw,
        read_pct,
        tasks,
        clients,
    } = row.params
    {
        // The read-write lock over the plain lock, same draws, same run.
        let plain = Params::ReadHeavy {
            lock: LockKind::Plain,
            read_pct,
            tasks,
            clients,
        };
        let m = Metric::SectionsPerS;
        return match (row.get(m), figure(rows, row.workload, row.library, plain, m)) {
            (Some(rw), Some(plain)) if plain > 0.0 => {
                vec![format!("\"rw_lock/plain lock\": {:.4}", rw / plain)]
            }
            _ => Vec::new(),
        };
    }
    if let Params::Handoff {
        lock: LockKind::Fair,
        contenders,
        clients,
    } = row.params
    {
        // The fair lock over the plain lock, same run.
        let plain = Params::Handoff {
            lock: LockKind::Plain,
            contenders,
            clients,
        };
        let m = Metric::SectionsPerS;
        return match (row.get(m), figure(rows, row.workload, row.library, plain, m)) {
            (Some(fair), Some(plain)) if plain > 0.0 => {
                vec![format!("\"fair_lock/plain lock\": {:.4}", fair / plain)]
            }
            _ => Vec::new(),
        };
    }
    let main = match row.workload {
        Workload::Contended | Workload::HotLock | Workload::NetHotLock => Metric::SectionsPerS,
        Workload::Uncontended | Workload::Redlock | Workload::NetUncontended | Workload::NetRedlock => {
            Metric::CyclesPerS
        }
        _ => return Vec::new(),
    };
    let Some(value) = row.get(main) else {
        return Vec::new();
    };
    let mut out: Vec<String> = peer_rows(rows, row.workload, row.params)
        .filter_map(|peer| {
            let other = peer.get(main)?;
            (other > 0.0).then(|| {
                format!(
                    "{}: {:.4}",
                    json_string(&format!("relock/{}", label(peer))),
                    value / other
                )
            })
        })
        .collect();
    if let (Some(ceiling), Metric::CyclesPerS) = (ceiling_cycles(rows), main) {
        out.push(format!("\"relock/ceiling\": {:.4}", value / ceiling));
    }
    out
}

pub fn json(mode: &Mode, version: &str, rows: &[Row], targets: &[Target]) -> String {
    let items: Vec<String> = rows
        .iter()
        .map(|row| {
            let metrics: Vec<String> = row
                .metrics
                .iter()
                .map(|(m, v)| format!("{}: {}", json_string(m.name()), if v.is_finite() { *v } else { 0.0 }))
                .collect();
            let ratios = match row.library {
                Library::Relock => ratios(rows, row),
                _ => Vec::new(),
            };
            format!(
                "    {{\"workload\": {}, \"library\": {}, \"params\": {}, \"metrics\": {{{}}}, \"ratios\": {{{}}}, \"note\": {}}}",
                json_string(row.workload.name()),
                json_string(row.library.name()),
                json_string(&row.params.to_string()),
                metrics.join(", "),
                ratios.join(", "),
                json_string(&row.note)
            )
        })
        .collect();
    let targets: Vec<String> = targets
        .iter()
        .map(|t| {
            format!(
                "    {{\"target\": {}, \"measured\": {}, \"holds\": {}}}",
                json_string(&t.target),
                json_string(&t.measured),
                t.holds
            )
        })
        .collect();
    format!(
        "{{\n  \"mode\": {},\n  \"machine\": {{\"cores\": {}, \"redis_server\": {}}},\n  \"ceiling_cycles_per_s\": {:.1},\n  \"rows\": [\n{}\n  ],\n  \"targets\": [\n{}\n  ]\n}}\n",
        json_string(if mode.quick { "quick" } else { "full" }),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        json_string(version),
        ceiling_cycles(rows).unwrap_or(0.0),
        items.join(",\n"),
        targets.join(",\n")
    )
}

/// Acquire latency p50/p99 per library (uncontended, 1 task; Redlock over 5 masters), as bars.
pub fn svg(rows: &[Row]) -> String {
    let bars: Vec<(String, f64, f64)> = rows
        .iter()
        .filter(|r| {
            matches!(
                (r.workload, r.params),
                (Workload::Uncontended, Params::Tasks(1)) | (Workload::Redlock, Params::Masters(5))
            )
        })
        .filter_map(|r| {
            let label = format!("{} {} {}", r.library.name(), r.workload.name(), r.params);
            Some((label, r.get(Metric::AcquireP50Us)?, r.get(Metric::AcquireP99Us)?))
        })
        .collect();
    let max = bars.iter().map(|b| b.2).fold(1.0, f64::max);
    let (width, left, bar_h) = (900.0, 330.0, 14.0);
    let height = 40.0 + bars.len() as f64 * (2.0 * bar_h + 10.0);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\">acquire latency (µs): p50 dark, p99 light</text>\n"
    );
    let scale = (width - left - 80.0) / max;
    for (i, (label, p50, p99)) in bars.iter().enumerate() {
        let y = 35.0 + i as f64 * (2.0 * bar_h + 10.0);
        out.push_str(&format!("<text x=\"10\" y=\"{}\">{label}</text>\n", y + bar_h));
        for (value, y, fill) in [(p50, y, "#1f4e79"), (p99, y + bar_h, "#9dc3e6")] {
            out.push_str(&format!(
                "<rect x=\"{left}\" y=\"{y}\" width=\"{:.1}\" height=\"{bar_h}\" fill=\"{fill}\"/>\n",
                value * scale
            ));
            out.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{}\">{value:.0}</text>\n",
                left + value * scale + 4.0,
                y + bar_h - 2.0
            ));
        }
    }
    out.push_str("</svg>\n");
    out
}
