//! The workloads: each runs its libraries and pushes its rows. Shared here: running a set of
//! contenders under the host and Redis figures ([`run`]), and turning a run into a row.

mod contended;
mod fair;
mod floor;
mod rw;
mod scale;
mod uncontended;

use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

pub use contended::{contended, hot_lock, hot_lock_via, semaphore};
pub use fair::fair_handoff;
pub use floor::{ceiling, floor};
pub use rw::read_heavy;
pub use scale::{cluster_rows, waiters_scale, watchdog_scale};
pub use uncontended::{redlock_quorum, redlock_quorum_via, uncontended, uncontended_via};

use crate::host::{measured, Cost, Per};
use crate::peers::{self, Contender, Handoff};
use crate::rows::{Library, Metric, Params, Row, Tally, Workload};
use crate::support::RedisServer;
use crate::Mode;

/// The critical section of the hot lock rows.
pub const HOT_SECTION: Duration = Duration::from_millis(1);

/// Clients (relock's `LockClient`s, the peers' managers or lockers) the hot lock's contenders are
/// spread over.
pub const HOT_CLIENTS: usize = 4;

/// How each contender task runs.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// Back-to-back cycles, each task on a lock of its own.
    Cycles,
    /// All tasks on one lock, each holding it for `section`; task `i` is of client `i % clients`.
    Contend { section: Duration, clients: usize },
}

/// A finished run: what its tasks counted, how long it took, and what it cost.
pub struct Run {
    library: Library,
    tally: Tally,
    /// Cycles: until the last task ended. Contend: the run time (only grants before it count).
    elapsed: Duration,
    cost: Cost,
}

/// Runs one task per contender for `run`, between snapshots of `servers` (Redis CPU and commands)
/// and of this process's CPU.
pub async fn run<C: Contender>(
    servers: &[&RedisServer],
    run: Duration,
    contenders: Vec<C>,
    shape: Shape,
) -> Run {
    let ((tally, elapsed), cost) = measured(servers, async {
        let start = Instant::now();
        let deadline = start + run;
        let handoff = Handoff::new();
        let handles: Vec<_> = contenders
            .into_iter()
            .enumerate()
            .map(|(i, c)| match shape {
                Shape::Cycles => peers::spawn::<C, _>(peers::cycles(c, deadline)),
                Shape::Contend { section, clients } => {
                    let client = i % clients.max(1);
                    peers::spawn::<C, _>(peers::contend(c, deadline, section, handoff.clone(), client))
                }
            })
            .collect();
        let mut tally = Tally::new();
        for handle in handles {
            tally.merge(handle.await.expect("bench task"));
        }
        let elapsed = match shape {
            Shape::Cycles => start.elapsed(),
            Shape::Contend { .. } => run,
        };
        (tally, elapsed)
    })
    .await;
    Run {
        library: C::LIBRARY,
        tally,
        elapsed,
        cost,
    }
}

/// [`run`] of `contenders` for one lock on `server`, each holding it for `section`, task `i` of
/// client `i % clients` (see [`Shape::Contend`]).
pub async fn contend<C: Contender>(
    mode: &Mode,
    server: &RedisServer,
    contenders: Vec<C>,
    section: Duration,
    clients: usize,
) -> Run {
    run(
        &[server],
        mode.run,
        contenders,
        Shape::Contend { section, clients },
    )
    .await
}

impl Run {
    /// Adds another run of the same library: its counts, time and cost (see
    /// `uncontended::interleaved`).
    pub fn merge(&mut self, other: Run) {
        self.tally.merge(other.tally);
        self.elapsed += other.elapsed;
        self.cost.add(&other.cost);
    }

    fn rate(&self) -> f64 {
        self.tally.count as f64 / self.elapsed.as_secs_f64()
    }

    /// Adds the cost per cycle (or section) and a note of failed releases, if any.
    fn finish(&self, row: Row, per: Per) -> Row {
        let row = self.cost.add_to(row, self.tally.count, per);
        match self.tally.failed_releases {
            0 => row,
            n => row.note(format!("{n} releases reported an error")),
        }
    }

    /// Uncontended cycles: rate, acquire and release latency, cost per cycle.
    pub fn cycles_row(&self, workload: Workload, params: Params) -> Row {
        let row = Row::new(workload, self.library, params)
            .metric(Metric::CyclesPerS, self.rate())
            .percentiles(Metric::AcquireP50Us, Metric::AcquireP99Us, &self.tally.acquire);
        let row = row.median(Metric::ReleaseP50Us, &self.tally.release);
        self.finish(row, Per::Cycle)
    }

    /// An empty critical section: sections per second and handoff latency, cost per section.
    pub fn contended_row(&self, params: Params, notes: &[&str]) -> Row {
        let row = Row::new(Workload::Contended, self.library, params)
            .metric(Metric::SectionsPerS, self.rate())
            .percentiles(Metric::HandoffP50Us, Metric::HandoffP99Us, &self.tally.handoff);
        let row = notes.iter().fold(row, |row, note| row.note(note));
        self.finish(row, Per::Section)
    }

    /// A semaphore of `permits`: sections per second (and of the ideal, `permits` sections per
    /// section length), the waits, how long the section took, cost per section.
    pub fn semaphore_row(&self, params: Params, permits: u64) -> Row {
        let ideal = permits as f64 / HOT_SECTION.as_secs_f64();
        let row = Row::new(Workload::Semaphore, self.library, params)
            .metric(Metric::SectionsPerS, self.rate())
            .metric(Metric::OfIdeal, self.rate() / ideal)
            .metric(
                Metric::Utilization,
                self.rate() * self.tally.section.mean() / 1e6 / permits as f64,
            )
            .percentiles(Metric::WaitP50Us, Metric::WaitP99Us, &self.tally.acquire);
        let row = row.median(Metric::SectionP50Us, &self.tally.section);
        self.finish(row, Per::Section)
    }

    /// The hot lock: sections per second (and of the ideal), the lock's idle gap between holders,
    /// the contenders' waits, how long the section took, cost per section.
    pub fn hot_row(&self, params: Params) -> Row {
        self.one_holder_row(Workload::HotLock, params)
    }

    /// The hot lock with another `handoff_window`: its figures and the longest wait.
    pub fn window_row(&self, params: Params) -> Row {
        let row = self.one_holder_row(Workload::HotLock, params);
        if self.tally.acquire.is_empty() {
            return row;
        }
        row.metric(Metric::WaitMaxUs, self.tally.acquire.max() as f64)
    }

    /// Where a section's time goes besides its nominal length: the section as it ran (mean), and
    /// the idle gaps per section, all of them and those where the lock passed to another client's
    /// contender (with how often that happened and its gap's p50). `1e6 / (section_mean_us +
    /// gap_us_per_section)` is the rate the run reached, near enough; the rest of the ideal is the
    /// section's own overrun.
    fn where_the_time_goes(&self, row: Row) -> Row {
        let (gaps, cross, sections) = (&self.tally.handoff, &self.tally.cross_gap, self.tally.count);
        if sections == 0 || gaps.is_empty() || self.tally.section.is_empty() {
            return row;
        }
        let per_section = |h: &Histogram<u64>| h.mean() * h.len() as f64 / sections as f64;
        let row = row
            .metric(Metric::SectionMeanUs, self.tally.section.mean())
            .metric(Metric::GapUsPerSection, per_section(gaps))
            .metric(Metric::CrossClientShare, cross.len() as f64 / gaps.len() as f64)
            .metric(Metric::CrossClientGapUsPerSection, per_section(cross));
        row.median(Metric::CrossClientGapP50Us, cross)
    }

    /// The same figures for any workload of one holder at a time and [`HOT_SECTION`] sections (hot
    /// lock, fair lock handoff).
    fn one_holder_row(&self, workload: Workload, params: Params) -> Row {
        let ideal = 1.0 / HOT_SECTION.as_secs_f64();
        let row = Row::new(workload, self.library, params)
            .metric(Metric::SectionsPerS, self.rate())
            .metric(Metric::OfIdeal, self.rate() / ideal)
            .metric(Metric::Utilization, self.rate() * self.tally.section.mean() / 1e6)
            .percentiles(Metric::IdleGapP50Us, Metric::IdleGapP99Us, &self.tally.handoff)
            .percentiles(Metric::WaitP50Us, Metric::WaitP99Us, &self.tally.acquire);
        let row = row.median(Metric::SectionP50Us, &self.tally.section);
        let row = self.where_the_time_goes(row);
        self.finish(row, Per::Section)
    }
}
