//! Fair lock handoff: the hot lock (one lock, [`HOT_SECTION`] sections, 64 contenders over 4
//! clients) on relock's fair lock, whose waiters are granted in arrival order and woken by name one
//! at a time, and on the plain lock as the baseline, in the same run. Besides the hot lock's figures,
//! each row has the longest wait (in µs and in sections: first come, first served over 64 contenders
//! makes it about 63), the idle gap in round trips of the bare `TcpStream` loop measured just before,
//! and Redis's commands per section by command; the fair row has its ratios to the plain one.

use std::time::Duration;

use relock::LockClient;

use super::{contend, floor, HOT_CLIENTS, HOT_SECTION};
use crate::host::{calls_delta, command_calls, per_section};
use crate::peers::Relock;
use crate::rows::{figure, Library, LockKind, Metric, Params, Row, Workload};
use crate::support::{self, RedisServer};
use crate::Mode;

const CONTENDERS: usize = 64;

/// How long the round trip the idle gap is counted in is measured.
const RTT_RUN: Duration = Duration::from_millis(300);

/// The key of a fair lock handoff row.
pub fn params(lock: LockKind) -> Params {
    Params::Handoff {
        contenders: CONTENDERS,
        clients: HOT_CLIENTS,
        lock,
    }
}

/// The workload on `lock` (fair or plain): its row, without the ratios to the other lock.
async fn one(mode: &Mode, server: &RedisServer, lock: LockKind, rtt: Option<f64>) -> Row {
    let mut clients = Vec::new();
    for _ in 0..HOT_CLIENTS {
        clients.push(LockClient::connect(&server.url()).await.expect("connect"));
    }
    let name = support::unique_name("fair");
    let contenders = (0..CONTENDERS)
        .map(|i| {
            let client = &clients[i % HOT_CLIENTS];
            Relock(match lock {
                LockKind::Fair => client.fair_lock(&name),
                _ => client.lock(&name),
            })
        })
        .collect();
    let calls_before = command_calls(server);
    let r = contend(mode, server, contenders, HOT_SECTION, HOT_CLIENTS).await;
    let calls = calls_delta(&calls_before, &command_calls(server));
    for client in &clients {
        client.shutdown().await;
    }

    let mut row = r.one_holder_row(Workload::FairHandoff, params(lock));
    let waits = &r.tally.acquire;
    if !waits.is_empty() {
        row = row
            .metric(Metric::WaitMaxUs, waits.max() as f64)
            .metric(Metric::WaitMaxSections, waits.max() as f64 * r.rate() / 1e6);
    }
    if let (Some(gap), Some(rtt)) = (row.get(Metric::IdleGapP50Us), rtt) {
        row = row.metric(Metric::IdleGapP50Rtt, gap / rtt);
    }
    row.note(per_section(&calls, r.tally.count))
}

/// Both locks, the plain one first, then the fair lock's row with its ratios to the plain one.
pub async fn fair_handoff(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    let rtt = floor::round_trip_p50(server, RTT_RUN).await;
    let rtt_note = match rtt {
        Some(rtt) => format!(
            "idle_gap_p50_rtt over the bare TcpStream round trip p50, {rtt:.0} µs, measured just before"
        ),
        None => "no round trip measured".to_string(),
    };
    let plain = one(mode, server, LockKind::Plain, rtt).await;
    rows.push(
        plain
            .note("baseline: the plain lock, as the hot lock rows run it")
            .note(&rtt_note),
    );
    let fair = one(mode, server, LockKind::Fair, rtt).await;
    let ratios = [
        (Metric::SectionsPerS, Metric::SectionsVsPlain),
        (Metric::RedisCpuUsPerSection, Metric::RedisCpuVsPlain),
        (Metric::RedisCmdsPerSection, Metric::RedisCmdsVsPlain),
    ];
    let mut row = fair.clone();
    for (metric, ratio) in ratios {
        let plain = figure(
            rows,
            Workload::FairHandoff,
            Library::Relock,
            params(LockKind::Plain),
            metric,
        );
        if let (Some(fair), Some(plain)) = (fair.get(metric), plain) {
            if plain > 0.0 {
                row = row.metric(ratio, fair / plain);
            }
        }
    }
    rows.push(row.note(&rtt_note));
}
