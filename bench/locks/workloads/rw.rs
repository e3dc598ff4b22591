//! A read-heavy lock: 64 tasks over 4 clients on one lock, each section a read with probability
//! 95 % (else a write), held for [`HOT_SECTION`]; on relock's read-write lock (reads share it,
//! writes are alone) and on the plain lock (every section exclusive) as the baseline, with the same
//! draws, in the same run.

use std::time::Duration;

use hdrhistogram::Histogram;
use relock::LockClient;
use tokio::time::Instant;

use super::{HOT_CLIENTS, HOT_SECTION};
use crate::host::{calls_delta, command_calls, measured, per_section, Cost, Per};
use crate::peers::{self, Relock};
use crate::rows::{figure, histogram, micros, Library, LockKind, Metric, Params, Row, Workload};
use crate::support::{self, RedisServer};
use crate::Mode;

const TASKS: usize = 64;
const READ_PCT: u32 = 95;

/// The key of a read-heavy row.
pub fn params(lock: LockKind) -> Params {
    Params::ReadHeavy {
        read_pct: READ_PCT,
        tasks: TASKS,
        clients: HOT_CLIENTS,
        lock,
    }
}

/// The most sections per second the read-write lock could run with sections of `section`: writes
/// one at a time, reads `tasks` at once (write share `w`: 1 / (w + (1 - w) / tasks) sections per
/// section length; 15.4 per ms at 5 % writes and 64 tasks). The plain lock's is one per section.
fn ideal(lock: LockKind, write_share: f64, tasks: usize, section: Duration) -> f64 {
    let per_section = match lock {
        LockKind::Rw => 1.0 / (write_share + (1.0 - write_share) / tasks as f64),
        LockKind::Plain | LockKind::Fair => 1.0,
    };
    per_section / section.as_secs_f64()
}

/// A task's side draws: splitmix64 from a seed, so both locks see the same sequence per task.
struct Draws(u64);

impl Draws {
    fn write(&mut self) -> bool {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        z % 100 >= READ_PCT as u64
    }
}

/// What one task counted.
struct RwTally {
    sections: u64,
    writes: u64,
    reader_wait: Histogram<u64>,
    writer_wait: Histogram<u64>,
    section: Histogram<u64>,
    failed_releases: u64,
}

impl RwTally {
    fn new() -> RwTally {
        RwTally {
            sections: 0,
            writes: 0,
            reader_wait: histogram(),
            writer_wait: histogram(),
            section: histogram(),
            failed_releases: 0,
        }
    }

    fn merge(&mut self, other: RwTally) {
        self.sections += other.sections;
        self.writes += other.writes;
        self.reader_wait.add(other.reader_wait).expect("merge histograms");
        self.writer_wait.add(other.writer_wait).expect("merge histograms");
        self.section.add(other.section).expect("merge histograms");
        self.failed_releases += other.failed_releases;
    }
}

/// One task until `deadline`: draw a side, acquire it, hold it for `section`, release. Counts the
/// sections granted before the deadline; a wait still open at the deadline is recorded as long as
/// it was by then.
async fn task(read: relock::Lock, write: relock::Lock, seed: u64, deadline: Instant) -> RwTally {
    let mut tally = RwTally::new();
    let mut draws = Draws(seed);
    while Instant::now() < deadline {
        let writes = draws.write();
        let (lock, wait) = match writes {
            true => (&write, &mut tally.writer_wait),
            false => (&read, &mut tally.reader_wait),
        };
        let want = Instant::now();
        let guard = match tokio::time::timeout_at(deadline, lock.acquire()).await {
            Ok(guard) => guard.expect("relock acquire"),
            Err(_) => {
                wait.record(micros(deadline.saturating_duration_since(want))).ok();
                break;
            }
        };
        let granted = Instant::now();
        wait.record(micros(granted - want)).ok();
        if granted < deadline {
            tally.sections += 1;
            tally.writes += u64::from(writes);
        }
        peers::hold::<Relock>(granted, HOT_SECTION).await;
        tally.section.record(micros(granted.elapsed())).ok();
        if guard.release().await.is_err() {
            tally.failed_releases += 1;
        }
    }
    tally
}

/// The workload on `lock`: its row, without the ratios to the other lock.
async fn run(mode: &Mode, server: &RedisServer, lock: LockKind) -> Row {
    let mut clients = Vec::new();
    for _ in 0..HOT_CLIENTS {
        clients.push(LockClient::connect(&server.url()).await.expect("connect"));
    }
    let name = support::unique_name("rw");
    let calls_before = command_calls(server);
    let ((tally, elapsed), cost): ((RwTally, Duration), Cost) = measured(&[server], async {
        let start = Instant::now();
        let deadline = start + mode.run;
        let handles: Vec<_> = (0..TASKS)
            .map(|i| {
                let client = &clients[i % HOT_CLIENTS];
                let (read, write) = match lock {
                    LockKind::Rw => {
                        let rw = client.rw_lock(&name);
                        (rw.read(), rw.write())
                    }
                    LockKind::Fair => (client.fair_lock(&name), client.fair_lock(&name)),
                    LockKind::Plain => (client.lock(&name), client.lock(&name)),
                };
                tokio::spawn(task(read, write, i as u64, deadline))
            })
            .collect();
        let mut tally = RwTally::new();
        for handle in handles {
            tally.merge(handle.await.expect("bench task"));
        }
        (tally, mode.run)
    })
    .await;
    let calls = calls_delta(&calls_before, &command_calls(server));
    for client in &clients {
        client.shutdown().await;
    }

    let rate = tally.sections as f64 / elapsed.as_secs_f64();
    let write_share = tally.writes as f64 / tally.sections.max(1) as f64;
    let mut waits = tally.reader_wait.clone();
    waits.add(&tally.writer_wait).expect("merge histograms");
    let row = Row::new(Workload::ReadHeavy, Library::Relock, params(lock))
        .metric(Metric::SectionsPerS, rate)
        .metric(
            Metric::OfIdeal,
            rate / ideal(lock, write_share, TASKS, HOT_SECTION),
        )
        .metric(Metric::MeanHolders, rate * tally.section.mean() / 1e6)
        .metric(Metric::WriteShare, write_share)
        .percentiles(Metric::WaitP50Us, Metric::WaitP99Us, &waits)
        .percentiles(
            Metric::WriterWaitP50Us,
            Metric::WriterWaitP99Us,
            &tally.writer_wait,
        );
    let row = match tally.reader_wait.is_empty() {
        true => row,
        false => row.metric(
            Metric::ReaderWaitP99Us,
            tally.reader_wait.value_at_quantile(0.99) as f64,
        ),
    };
    let row = cost.add_to(
        row.median(Metric::SectionP50Us, &tally.section),
        tally.sections,
        Per::Section,
    );
    let row = row.note(per_section(&calls, tally.sections));
    match tally.failed_releases {
        0 => row,
        n => row.note(format!("{n} releases reported an error")),
    }
}

/// Both locks, the plain one first, then the read-write lock's row with its ratios to the plain
/// one.
pub async fn read_heavy(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    let plain = run(mode, server, LockKind::Plain).await;
    rows.push(plain.note("baseline: every section exclusive; of_ideal over 1,000 sections/s"));
    let rw = run(mode, server, LockKind::Rw).await;
    let of_plain = |metric: Metric| {
        let plain = figure(
            rows,
            Workload::ReadHeavy,
            Library::Relock,
            params(LockKind::Plain),
            metric,
        );
        match (rw.get(metric), plain) {
            (Some(rw), Some(plain)) if plain > 0.0 => Some(rw / plain),
            _ => None,
        }
    };
    let ratios = [
        (Metric::SectionsPerS, Metric::SectionsVsPlain),
        (Metric::RedisCpuUsPerSection, Metric::RedisCpuVsPlain),
        (Metric::RedisCmdsPerSection, Metric::RedisCmdsVsPlain),
    ];
    let mut row = rw.clone();
    for (metric, ratio) in ratios {
        if let Some(v) = of_plain(metric) {
            row = row.metric(ratio, v);
        }
    }
    rows.push(row.note(format!(
        "of_ideal over 1 / (write_share + (1 - write_share) / {TASKS}) sections per ms: writes alone, reads all at once"
    )));
}
