//! The bench's tables in the documentation, rendered from its JSON (`target/bench/locks.json`),
//! never typed by hand: every table of `docs/performance.md` below the marker `<!-- bench:tables -->`,
//! and the summary in `README.md` between `<!-- bench:summary -->` and `<!-- /bench:summary -->`.
//!
//! ```sh
//! cargo bench -p relock-bench                       # a full run: writes locks.json
//! cargo bench -p relock-bench -- --docs             # renders it into the two files
//! ```

use std::path::Path;

use serde_json::Value;

const TABLES: &str = "<!-- bench:tables -->";
const SUMMARY: &str = "<!-- bench:summary -->";
const SUMMARY_END: &str = "<!-- /bench:summary -->";

/// The libraries judged as peers (the others are floors, ceilings and relock's own baselines).
const PEERS: [&str; 3] = ["rslock", "redlock", "async-redis-lock"];

/// Renders `json` (the text of `locks.json`) into `docs/performance.md` and `README.md` under
/// `root`, the repository's root.
pub fn write(json: &str, root: &Path) -> Result<(), String> {
    let doc: Value = serde_json::from_str(json).map_err(|err| format!("locks.json: {err}"))?;
    let rows = doc["rows"].as_array().ok_or("locks.json has no rows")?;
    let performance = root.join("docs/performance.md");
    let text = read(&performance)?;
    // The marker on a line of its own (the page's text names it too).
    let head = text
        .split_once(&format!("\n{TABLES}\n"))
        .map(|(head, _)| head)
        .ok_or_else(|| format!("{} has no line {TABLES}", performance.display()))?;
    let tables = format!("{head}\n{TABLES}\n\n{}", tables(&doc, rows));
    std::fs::write(&performance, tables).map_err(|err| format!("{}: {err}", performance.display()))?;

    let readme = root.join("README.md");
    let text = read(&readme)?;
    let (head, rest) = text
        .split_once(&format!("\n{SUMMARY}\n"))
        .ok_or_else(|| format!("README.md has no line {SUMMARY}"))?;
    let (_, tail) = rest
        .split_once(&format!("\n{SUMMARY_END}\n"))
        .ok_or_else(|| format!("README.md has no line {SUMMARY_END}"))?;
    let summary = format!("{head}\n{SUMMARY}\n{}{SUMMARY_END}\n{tail}", summary(&doc, rows));
    std::fs::write(&readme, summary).map_err(|err| format!("README.md: {err}"))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|err| format!("{}: {err}", path.display()))
}

fn text<'a>(row: &'a Value, field: &str) -> &'a str {
    row[field].as_str().unwrap_or("")
}

fn metric(row: &Value, name: &str) -> Option<f64> {
    row["metrics"][name].as_f64()
}

/// A figure as the tables print it: thousands separated from 1,000 on, two decimals below 100.
fn pretty(v: f64) -> String {
    if v.abs() >= 1000.0 {
        let digits = format!("{:.0}", v.abs());
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if v < 0.0 {
            out.insert(0, '-');
        }
        out
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// One table per workload, in the run's order: a column per figure any of its rows has, then
/// relock's ratios to each peer, then the note; and the run's targets.
fn tables(doc: &Value, rows: &[Value]) -> String {
    let mut out = format!(
        "## The run these tables come from\n\nA {} run on {} cores, {}; the client and the servers \
         share the machine. Ratios are relock's main figure (cycles/s or sections/s) over each \
         peer's in the same run.\n",
        text(doc, "mode"),
        doc["machine"]["cores"],
        doc["machine"]["redis_server"].as_str().unwrap_or("?")
    );
    let mut workloads: Vec<&str> = Vec::new();
    for row in rows {
        let workload = text(row, "workload");
        if !workloads.contains(&workload) {
            workloads.push(workload);
        }
    }
    for workload in workloads {
        let group: Vec<&Value> = rows.iter().filter(|r| text(r, "workload") == workload).collect();
        let mut columns: Vec<String> = Vec::new();
        for row in &group {
            if let Some(metrics) = row["metrics"].as_object() {
                for name in metrics.keys() {
                    if !columns.contains(name) {
                        columns.push(name.clone());
                    }
                }
            }
        }
        let ratios = group
            .iter()
            .any(|r| r["ratios"].as_object().is_some_and(|m| !m.is_empty()));
        out.push_str(&format!("\n### {workload}\n\n| library | params |"));
        for column in &columns {
            out.push_str(&format!(" {} |", column.replace('_', " ")));
        }
        if ratios {
            out.push_str(" relock / other |");
        }
        out.push_str(" note |\n|---|---|");
        out.push_str(&"---|".repeat(columns.len() + usize::from(ratios) + 1));
        out.push('\n');
        for row in group {
            out.push_str(&format!("| {} | {} |", text(row, "library"), text(row, "params")));
            for column in &columns {
                let cell = metric(row, column).map(pretty).unwrap_or_default();
                out.push_str(&format!(" {cell} |"));
            }
            if ratios {
                let cell: Vec<String> = row["ratios"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(name, v)| {
                        let other = name.strip_prefix("relock/")?;
                        Some(format!("{other} {:.2}×", v.as_f64()?))
                    })
                    .collect();
                out.push_str(&format!(" {} |", cell.join(", ")));
            }
            out.push_str(&format!(" {} |\n", text(row, "note")));
        }
    }
    out.push_str("\n### Targets, from this run's rows\n\n| target | measured | holds |\n|---|---|---|\n");
    for t in doc["targets"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            text(t, "target"),
            text(t, "measured"),
            if t["holds"].as_bool() == Some(true) {
                "yes"
            } else {
                "**no**"
            }
        ));
    }
    out
}

/// relock's row of `workload` at `params`, and the best peer's row at the same point (its
/// params, or those followed by a retry setting): the highest `main` figure, or the lowest when
/// `lower_is_better`.
fn beside<'a>(
    rows: &'a [Value],
    workload: &str,
    params: &str,
    main: &str,
    lower_is_better: bool,
) -> Option<(&'a Value, &'a Value)> {
    let at = |r: &&Value| {
        let p = text(r, "params");
        text(r, "workload") == workload
            && (p == params || p.strip_prefix(params).is_some_and(|s| s.starts_with(' ')))
    };
    let relock = rows.iter().filter(at).find(|r| {
        text(r, "library") == "relock" && text(r, "params") == params && metric(r, main).is_some()
    })?;
    let peers = rows
        .iter()
        .filter(at)
        .filter(|r| PEERS.contains(&text(r, "library")))
        .filter_map(|r| Some((r, metric(r, main)?)));
    let best = if lower_is_better {
        peers.min_by(|a, b| a.1.total_cmp(&b.1))
    } else {
        peers.max_by(|a, b| a.1.total_cmp(&b.1))
    }?;
    Some((relock, best.0))
}

/// The README's summary: relock beside the best peer on the rows a reader asks about first.
fn summary(doc: &Value, rows: &[Value]) -> String {
    let mut out = format!(
        "*Written by the bench from its JSON (`cargo bench -p relock-bench -- --docs`); do not edit by \
         hand.* relock against the best of its peers (`rslock`, `redlock`, `async-redis-lock`) in the \
         same {} run, on {} cores shared by the client and the servers:\n\n\
         | workload | relock | best peer | relock / best peer |\n|---|---|---|---|\n",
        text(doc, "mode"),
        doc["machine"]["cores"],
    );
    let lines: [(&str, &str, &str, &str, bool); 16] = [
        (
            "uncontended",
            "tasks=1",
            "cycles_per_s",
            "uncontended cycles/s, 1 task",
            false,
        ),
        (
            "uncontended",
            "tasks=16",
            "cycles_per_s",
            "uncontended cycles/s, 16 tasks",
            false,
        ),
        (
            "uncontended",
            "tasks=256",
            "cycles_per_s",
            "uncontended cycles/s, 256 tasks",
            false,
        ),
        (
            "uncontended",
            "tasks=1",
            "redis_cpu_us_per_cycle",
            "Redis CPU µs per uncontended cycle, 1 task",
            true,
        ),
        (
            "uncontended",
            "tasks=16",
            "redis_cpu_us_per_cycle",
            "Redis CPU µs per uncontended cycle, 16 tasks",
            true,
        ),
        (
            "uncontended",
            "tasks=256",
            "redis_cpu_us_per_cycle",
            "Redis CPU µs per uncontended cycle, 256 tasks",
            true,
        ),
        (
            "hot lock",
            "contenders=8 clients=4",
            "sections_per_s",
            "hot lock (1 ms sections), 8 contenders: sections/s",
            false,
        ),
        (
            "hot lock",
            "contenders=64 clients=4",
            "sections_per_s",
            "hot lock, 64 contenders: sections/s",
            false,
        ),
        (
            "hot lock",
            "contenders=512 clients=4",
            "sections_per_s",
            "hot lock, 512 contenders: sections/s",
            false,
        ),
        (
            "redlock",
            "masters=3",
            "cycles_per_s",
            "Redlock cycles/s, 3 masters",
            false,
        ),
        (
            "redlock",
            "masters=5",
            "cycles_per_s",
            "Redlock cycles/s, 5 masters",
            false,
        ),
        (
            "uncontended, 250 µs away",
            "tasks=1",
            "cycles_per_s",
            "250 µs away: uncontended cycles/s, 1 task",
            false,
        ),
        (
            "uncontended, 250 µs away",
            "tasks=16",
            "cycles_per_s",
            "250 µs away: uncontended cycles/s, 16 tasks",
            false,
        ),
        (
            "uncontended, 250 µs away",
            "tasks=256",
            "cycles_per_s",
            "250 µs away: uncontended cycles/s, 256 tasks",
            false,
        ),
        (
            "hot lock, 250 µs away",
            "contenders=64 clients=4",
            "sections_per_s",
            "250 µs away: hot lock, 64 contenders: sections/s",
            false,
        ),
        (
            "redlock, 250 µs away",
            "masters=5",
            "cycles_per_s",
            "250 µs away: Redlock cycles/s, 5 masters",
            false,
        ),
    ];
    for (workload, params, main, title, lower) in lines {
        let Some((relock, peer)) = beside(rows, workload, params, main, lower) else {
            continue;
        };
        let (mine, theirs) = (
            metric(relock, main).unwrap_or(0.0),
            metric(peer, main).unwrap_or(0.0),
        );
        let ratio = if theirs > 0.0 { mine / theirs } else { 0.0 };
        let mut peer_name = text(peer, "library").to_string();
        if let Some(retry) = text(peer, "params")
            .strip_prefix(params)
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            peer_name = format!("{peer_name}, {retry}");
        }
        let of_ideal = metric(relock, "of_ideal")
            .map(|v| format!(" ({:.0} % of ideal)", v * 100.0))
            .unwrap_or_default();
        out.push_str(&format!(
            "| {title} | {}{of_ideal} | {} ({peer_name}) | {ratio:.2}× |\n",
            pretty(mine),
            pretty(theirs)
        ));
    }
    out
}
