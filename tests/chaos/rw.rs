//! The workloads of the read-write lock and the fair lock, and their checks.
//!
//! - Read-write lock: tasks take the read side (4 times in 5) or the write side of `rw-i`, hold it
//!   for a moment or (one task per worker) for 1 to 3 s across renewals, saying the validity now
//!   and then, and release it; careful tasks under `until_lost`, naive ones not. Each hold is a
//!   section, valid by the library's own `validity()` and ended by its release, its loss or its
//!   holder's death, exactly as a lock's (`history::sections`). Check (h): no valid write section
//!   overlaps any other valid section (read or write) of the same lock. Overlaps that begin inside
//!   a window after a fault outside the guarantees are counted apart, as for the locks.
//! - Fair lock: tasks wait (`try_acquire_for`, up to a lease and a second) for `fair-i`, hold it a
//!   short while (so that queues form) and release it. Check (i): live waiters are granted in
//!   arrival order. The history only has the client's side: the moment each acquisition was sent
//!   (`Waiting`) and the moment its grant came back. A waiter A *arrived before* B when A's call
//!   was sent at least [`FAIR_SLACK`] before B's (its refusal, which queues it, comes back within
//!   a round trip). A violation is a grant to B while such an A was still waiting, live, and had
//!   at least [`FAIR_SLACK`] of its wait bound left past B's grant (A ended, by its own grant or
//!   timeout or error, later than that; a killed worker's waiter is never live past its kill),
//!   with no fault of any kind between A's call and B's grant, nor in the [`FAULT_SETTLE`] after
//!   one (a cut-off or stopped waiter loses its place, rightly; a latency or a reconnect delays
//!   its arrival). Pairs where A was granted first are counted as judged in order. Check (a) for
//!   the fair lock too: no two valid sections of one fair lock overlap.
//!
//! The fair lock is not offered on a `MultiLock`; the read-write lock is.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{Error, Lock};

use crate::history::{now_ns, sections, Event, Harness, Kind, On, Report, Section};
use crate::worker::{counted, describe, hold_plan, Settings};
use crate::Rng;

/// How many read-write locks and fair locks the workers share.
pub const RW_LOCKS: u32 = 2;
pub const FAIR_LOCKS: u32 = 2;

/// (i): how much earlier A's acquisition must have been sent than B's for A to count as arrived
/// first, and how much of A's wait must be left after B's grant for A to count as still waiting.
pub const FAIR_SLACK: Duration = Duration::from_millis(100);

/// (i): how long after a fault heals its effects may still shift arrivals (a reconnect, a client
/// that finds its place gone and queues again).
pub const FAULT_SETTLE: Duration = Duration::from_secs(1);

/// How long a lock must have stood free inside a wait that timed out for the wait to count as
/// stuck (a waiter nobody woke).
pub const STUCK_FREE: Duration = Duration::from_millis(500);

/// The fair-lock task (one per worker) that takes its lock with a fixed lease (`Lock::lease`) of
/// [`FAIR_LEASE`] instead of the watchdog's, and now and then holds it past that lease: the lock
/// then frees without a release message, at the lease's end, which its waiters must not sleep past.
pub const FIXED_FAIR_TASK: u32 = 450;
pub const FAIR_LEASE: Duration = Duration::from_millis(300);

/// The fixed lease a fair-lock task's holds have, if any.
pub fn fixed_lease_of(task: u32) -> Option<Duration> {
    (task == FIXED_FAIR_TASK).then_some(FAIR_LEASE)
}

pub fn rw_name(i: u32) -> String {
    format!("rw-{i}")
}

pub fn fair_name(i: u32) -> String {
    format!("fair-{i}")
}

/// One read-write task's loop: take the read side (mostly) or the write side of a random lock,
/// hold it (a moment, or with `long` 1 to 3 s), saying the validity now and then, release it.
pub async fn read_and_write(
    settings: Settings,
    task: u32,
    long: bool,
    mut rng: Rng,
    locks: Vec<relock::RwLock>,
    stop: Arc<AtomicBool>,
) {
    let id = settings.id;
    let careful = task % 2 == 0;
    while !stop.load(Ordering::Relaxed) {
        if long {
            tokio::time::sleep(rng.between(Duration::from_secs(1), Duration::from_secs(3))).await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let item = rng.below(locks.len() as u64) as u32;
        let write = rng.below(5) == 0;
        let emit = |t: u64, kind| {
            let event = Event {
                worker: id,
                task,
                on: On::Rw,
                item,
                t,
                kind,
            };
            println!("{event}");
        };
        let side = if write {
            locks[item as usize].write()
        } else {
            locks[item as usize].read()
        };
        let wait = settings.lease + Duration::from_secs(1);
        emit(
            now_ns(),
            Kind::Waiting {
                wait_ms: wait.as_millis() as u64,
                shared: !write,
                permits: 1,
            },
        );
        let (acquired, calls) = counted(side.try_acquire_for(wait)).await;
        let guard = match acquired {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                emit(now_ns(), Kind::Busy);
                emit(now_ns(), Kind::Calls(calls));
                continue;
            }
            Err(err) => {
                emit(now_ns(), Kind::Error(describe(&err)));
                emit(now_ns(), Kind::Calls(calls));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // The clock first, then the validity: the claim can only err on the short side.
        let t = now_ns();
        let valid_ns = guard.validity().as_nanos() as u64;
        if write {
            // Drawn at the grant (the write side's): read at once.
            let token = guard.fencing_token().await.unwrap_or(0);
            emit(t, Kind::Grant { token, valid_ns });
        } else {
            emit(t, Kind::Shared { valid_ns });
        }
        emit(now_ns(), Kind::Calls(calls));
        let (hold, steps) = hold_plan(&mut rng, &settings, long);
        let work = async {
            let until = tokio::time::Instant::now() + hold;
            for step in steps {
                tokio::time::sleep(step).await;
                let t = now_ns();
                let valid_ns = guard.validity().as_nanos() as u64;
                emit(t, Kind::Holding { valid_ns });
                if tokio::time::Instant::now() >= until {
                    return;
                }
            }
        };
        if careful {
            if guard.until_lost(work).await.is_err() {
                emit(now_ns(), Kind::Lost);
            }
        } else {
            work.await;
        }
        let t = now_ns();
        emit(t, Kind::Releasing);
        let outcome = match guard.release().await {
            Ok(()) => "ok".to_string(),
            Err(Error::NotHeld) => "notheld".to_string(),
            Err(err) => format!("err:{}", describe(&err)),
        };
        emit(now_ns(), Kind::Release(outcome));
    }
}

/// One fair-lock task's loop: wait for a random fair lock, hold it a short while, release it,
/// pause a little. Every acquisition is written when it is sent (`Waiting`) and when it ends. With
/// a fixed lease (see [`FIXED_FAIR_TASK`]), one hold in three outlives it.
pub async fn wait_in_line(
    settings: Settings,
    task: u32,
    mut rng: Rng,
    locks: Vec<Lock>,
    stop: Arc<AtomicBool>,
) {
    let id = settings.id;
    while !stop.load(Ordering::Relaxed) {
        let item = rng.below(locks.len() as u64) as u32;
        let emit = |t: u64, kind| {
            let event = Event {
                worker: id,
                task,
                on: On::Fair,
                item,
                t,
                kind,
            };
            println!("{event}");
        };
        let wait = settings.lease + Duration::from_secs(1);
        emit(
            now_ns(),
            Kind::Waiting {
                wait_ms: wait.as_millis() as u64,
                shared: false,
                permits: 1,
            },
        );
        let lock = match fixed_lease_of(task) {
            Some(lease) => locks[item as usize].clone().lease(lease),
            None => locks[item as usize].clone(),
        };
        let (acquired, calls) = counted(lock.try_acquire_for(wait)).await;
        let guard = match acquired {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                emit(now_ns(), Kind::Busy);
                emit(now_ns(), Kind::Calls(calls));
                continue;
            }
            Err(err) => {
                emit(now_ns(), Kind::Error(describe(&err)));
                emit(now_ns(), Kind::Calls(calls));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let t = now_ns();
        let valid_ns = guard.validity().as_nanos() as u64;
        emit(
            t,
            Kind::Grant {
                // Drawn at the grant (a fair lock's): read at once.
                token: guard.fencing_token().await.unwrap_or(0),
                valid_ns,
            },
        );
        emit(now_ns(), Kind::Calls(calls));
        let hold = match fixed_lease_of(task) {
            Some(lease) if rng.below(3) == 0 => rng.between(
                lease + Duration::from_millis(50),
                lease + Duration::from_millis(200),
            ),
            _ => rng.between(Duration::from_millis(10), Duration::from_millis(80)),
        };
        tokio::time::sleep(hold).await;
        let t = now_ns();
        emit(
            t,
            Kind::Holding {
                valid_ns: guard.validity().as_nanos() as u64,
            },
        );
        emit(t, Kind::Releasing);
        let outcome = match guard.release().await {
            Ok(()) => "ok".to_string(),
            Err(Error::NotHeld) => "notheld".to_string(),
            Err(err) => format!("err:{}", describe(&err)),
        };
        emit(now_ns(), Kind::Release(outcome));
        tokio::time::sleep(rng.between(Duration::ZERO, Duration::from_millis(60))).await;
    }
}

/// The counts of checks (h) and (i).
#[derive(Debug, Default, Clone)]
pub struct RwReport {
    pub rw_acquisitions: u64,
    pub reads_granted: u64,
    pub writes_granted: u64,
    pub rw_busy: u64,
    pub rw_errors: u64,
    pub rw_lost: u64,
    /// Pairs of valid read sections that overlapped: the read side is shared (informative).
    pub shared_reads: u64,
    /// (h) a valid write section overlapping another valid section of its lock: must be zero.
    pub write_overlaps: u64,
    /// (h) the same, beginning after a fault outside the guarantees.
    pub write_overlaps_unprotected: u64,
    /// (h) conflicting sections that overlapped past a lease.
    pub write_overlaps_past_lease: u64,
    /// Read and write waits that timed out while their lock stood free, unfaulted, for
    /// [`STUCK_FREE`] or more (a liveness finding, not a violation).
    pub rw_stuck_reads: u64,
    pub rw_stuck_writes: u64,
    pub fair_acquisitions: u64,
    pub fair_grants: u64,
    pub fair_busy: u64,
    pub fair_errors: u64,
    /// The same for the fair lock.
    pub fair_stuck: u64,
    /// (i) pairs (A arrived first, both waiting) judged, where A was granted first.
    pub fair_in_order: u64,
    /// (i) pairs where B was granted first, excused by a fault or a crash between.
    pub fair_excused: u64,
    /// (i) B granted while A, arrived first, live and unfaulted, still waited: must be zero.
    pub fair_out_of_order: u64,
    /// (a) for the fair lock: valid sections of one fair lock overlapping: must be zero.
    pub fair_overlaps: u64,
    /// The same, after a fault outside the guarantees.
    pub fair_overlaps_unprotected: u64,
}

impl RwReport {
    pub fn violations(&self) -> u64 {
        self.write_overlaps + self.fair_out_of_order + self.fair_overlaps
    }

    pub fn is_empty(&self) -> bool {
        self.rw_acquisitions + self.fair_acquisitions == 0
    }
}

impl fmt::Display for RwReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.rw_acquisitions > 0 {
            parts.push(format!(
                "(h) rw: ops {} (reads {}, writes {}, timed out {}, errors {}, lost {}), \
                 overlapping valid reads {}, valid write overlaps {} (+{} after faults outside the guarantees), \
                 past their lease {}, waits timed out on a free lock {} reads and {} writes",
                self.rw_acquisitions,
                self.reads_granted,
                self.writes_granted,
                self.rw_busy,
                self.rw_errors,
                self.rw_lost,
                self.shared_reads,
                self.write_overlaps,
                self.write_overlaps_unprotected,
                self.write_overlaps_past_lease,
                self.rw_stuck_reads,
                self.rw_stuck_writes,
            ));
        }
        if self.fair_acquisitions > 0 {
            parts.push(format!(
                "(i) fair (slack {} ms): ops {} (granted {}, timed out {}, errors {}), \
                 waiter pairs granted in order {}, out of order {} (+{} excused by faults), \
                 valid overlaps {} (+{} after faults outside the guarantees), waits timed out on a free lock {}",
                FAIR_SLACK.as_millis(),
                self.fair_acquisitions,
                self.fair_grants,
                self.fair_busy,
                self.fair_errors,
                self.fair_in_order,
                self.fair_out_of_order,
                self.fair_excused,
                self.fair_overlaps,
                self.fair_overlaps_unprotected,
                self.fair_stuck,
            ));
        }
        write!(f, "{}", parts.join("; "))
    }
}

/// Checks (h) and (i) on the read-write and fair locks' lines, into `report.rw`.
pub fn check(events: &[Event], harness: &Harness, report: &mut Report) {
    let rw: Vec<Event> = events.iter().filter(|e| e.on == On::Rw).cloned().collect();
    let mut counts = Report::default();
    let held = sections(&rw, harness, &mut counts);
    report.rw.rw_acquisitions = counts.acquisitions;
    report.rw.reads_granted = held.iter().filter(|s| s.shared).count() as u64;
    report.rw.writes_granted = held.iter().filter(|s| !s.shared).count() as u64;
    report.rw.rw_busy = counts.busy;
    report.rw.rw_errors = counts.errors;
    report.rw.rw_lost = rw.iter().filter(|e| e.kind == Kind::Lost).count() as u64;
    let (overlaps, excused, past, shared) = conflicts(&held, harness, "rw", report);
    report.rw.write_overlaps = overlaps;
    report.rw.write_overlaps_unprotected = excused;
    report.rw.write_overlaps_past_lease = past;
    report.rw.shared_reads = shared;
    let (reads, writes) = stuck_waits(&attempts(&rw), &held, harness, "rw", report);
    report.rw.rw_stuck_reads = reads;
    report.rw.rw_stuck_writes = writes;

    let fair: Vec<Event> = events.iter().filter(|e| e.on == On::Fair).cloned().collect();
    let mut counts = Report::default();
    let held = sections(&fair, harness, &mut counts);
    report.rw.fair_acquisitions = counts.acquisitions;
    report.rw.fair_grants = counts.grants;
    report.rw.fair_busy = counts.busy;
    report.rw.fair_errors = counts.errors;
    let (overlaps, excused, _, _) = conflicts(&held, harness, "fair", report);
    report.rw.fair_overlaps = overlaps;
    report.rw.fair_overlaps_unprotected = excused;
    let waits = attempts(&fair);
    report.rw.fair_stuck = stuck_waits(&waits, &held, harness, "fair", report).1;
    check_order(waits, harness, report);
}

/// Overlaps of conflicting sections (at least one not shared) of one lock: (valid, valid after a
/// fault outside the guarantees, past a lease, valid shared pairs).
fn conflicts(
    sections: &[Section],
    harness: &Harness,
    what: &str,
    report: &mut Report,
) -> (u64, u64, u64, u64) {
    let mut by_item: BTreeMap<u32, Vec<&Section>> = BTreeMap::new();
    for s in sections {
        by_item.entry(s.item).or_default().push(s);
    }
    let (mut valid, mut excused, mut past, mut shared) = (0, 0, 0, 0);
    for (item, mut list) in by_item {
        list.sort_by_key(|s| s.start);
        // The sections not yet ended at the current start: a few, whatever the run's length.
        let mut open: Vec<&Section> = Vec::new();
        for b in list {
            open.retain(|a| a.end > b.start);
            for a in &open {
                // Both valid at `b.start` (a began no later): their valid parts overlap.
                let both_valid = b.start < a.valid_end && b.start < b.valid_end;
                if a.shared && b.shared {
                    shared += u64::from(both_valid);
                    continue;
                }
                if !both_valid {
                    past += 1;
                    continue;
                }
                if harness.unprotected_at(b.start) {
                    excused += 1;
                    continue;
                }
                valid += 1;
                let side = |s: &Section| if s.shared { "read" } else { "write" };
                report.example(format!(
                    "{what} {item}: worker {}'s {} (valid until +{} ms) and worker {}'s {} from +{} ms",
                    a.worker,
                    side(a),
                    (a.valid_end - a.start) / 1_000_000,
                    b.worker,
                    side(b),
                    (b.start - a.start) / 1_000_000
                ));
            }
            open.push(b);
        }
    }
    (valid, excused, past, shared)
}

/// One fair-lock acquisition, from its `Waiting` line to its outcome.
#[derive(Debug, Clone)]
struct Attempt {
    shared: bool,
    worker: u32,
    item: u32,
    sent: u64,
    /// When it would have given up.
    deadline: u64,
    /// When it ended (granted, timed out, failed); never for a killed worker's last attempt.
    ended: Option<u64>,
    granted: bool,
}

/// The acquisitions of `events`, from their `Waiting` lines to their outcomes.
fn attempts(events: &[Event]) -> Vec<Attempt> {
    let mut pending: BTreeMap<(u32, u32), Attempt> = BTreeMap::new();
    let mut attempts: Vec<Attempt> = Vec::new();
    for ev in events {
        let key = (ev.worker, ev.task);
        match ev.kind {
            Kind::Waiting { wait_ms, shared, .. } => {
                let attempt = Attempt {
                    shared,
                    worker: ev.worker,
                    item: ev.item,
                    sent: ev.t,
                    deadline: ev.t + wait_ms * 1_000_000,
                    ended: None,
                    granted: false,
                };
                if let Some(unanswered) = pending.insert(key, attempt) {
                    attempts.push(unanswered);
                }
            }
            Kind::Grant { .. } | Kind::Shared { .. } | Kind::Busy | Kind::Error(_) => {
                if let Some(mut attempt) = pending.remove(&key) {
                    attempt.ended = Some(ev.t);
                    attempt.granted = matches!(ev.kind, Kind::Grant { .. } | Kind::Shared { .. });
                    attempts.push(attempt);
                }
            }
            _ => {}
        }
    }
    attempts.extend(pending.into_values());
    attempts
}

/// Waits that timed out although their lock stood free (no section of it open, none of a killed
/// holder within a lease of its death, none whose release failed within a lease of that release)
/// for at least [`STUCK_FREE`] inside the wait,
/// with no fault in or within [`FAULT_SETTLE`] before that stretch: a waiter nobody woke. A
/// liveness finding, counted but not a violation. Returns (reads, exclusive) stuck.
fn stuck_waits(
    attempts: &[Attempt],
    sections: &[Section],
    harness: &Harness,
    what: &str,
    report: &mut Report,
) -> (u64, u64) {
    let settle = FAULT_SETTLE.as_nanos() as u64;
    let free_for = STUCK_FREE.as_nanos() as u64;
    // A killed holder's lease runs out at most a lease after its death.
    let lease = harness.liveness_ns.saturating_sub(1_000_000_000);
    let killed = |worker: u32, end: u64| {
        harness
            .crashes
            .iter()
            .any(|c| c.killed && c.worker == worker && c.t == end)
    };
    let (mut reads, mut exclusive) = (0, 0);
    for a in attempts.iter().filter(|a| !a.granted) {
        let Some(ended) = a.ended else { continue };
        if ended + 1_000_000 < a.deadline {
            continue; // an error, not a timeout
        }
        let mut busy: Vec<(u64, u64)> = sections
            .iter()
            .filter(|s| s.item == a.item && s.start < ended)
            .map(|s| {
                // A killed holder's hold, and one whose release failed, may stay a lease.
                let end = if killed(s.worker, s.end) || s.release_failed {
                    s.end + lease
                } else {
                    s.end
                };
                (s.start, end)
            })
            .filter(|&(_, end)| end > a.sent)
            .chain(harness.faults.iter().map(|&(f, t)| (f, t + settle)))
            .collect();
        busy.sort();
        // The longest stretch of [sent, ended] that no section or fault covers.
        let (mut at, mut longest, mut from) = (a.sent, 0, a.sent);
        for (start, end) in busy {
            let gap = start.min(ended).saturating_sub(at);
            if gap > longest {
                longest = gap;
                from = at;
            }
            at = at.max(end);
        }
        if ended > at && ended - at > longest {
            longest = ended - at;
            from = at;
        }
        if longest < free_for {
            continue;
        }
        if a.shared {
            reads += 1;
        } else {
            exclusive += 1;
        }
        report.finding(format!(
            "{what} {}: worker {}'s {} wait timed out {} ms after it was sent, though the lock stood free \
             from +{} ms for {} ms; faults from 5 s before: [{}]",
            a.item,
            a.worker,
            if a.shared { "read" } else { "exclusive" },
            (ended - a.sent) / 1_000_000,
            (from - a.sent) / 1_000_000,
            longest / 1_000_000,
            harness.faults_between(a.sent.saturating_sub(5_000_000_000), ended, a.sent),
        ));
    }
    (reads, exclusive)
}

/// (i), per fair lock (see the module doc for the rule and its slack).
fn check_order(attempts: Vec<Attempt>, harness: &Harness, report: &mut Report) {
    let slack = FAIR_SLACK.as_nanos() as u64;
    let settle = FAULT_SETTLE.as_nanos() as u64;
    // A waiter is live until its worker was killed; an attempt left open by a worker that stopped
    // at the end of the run was waiting until then.
    let killed_at = |worker: u32| {
        harness
            .crashes
            .iter()
            .filter(|c| c.killed && c.worker == worker)
            .map(|c| c.t)
            .min()
    };
    let windows: Vec<(u64, u64)> = harness
        .faults
        .iter()
        .copied()
        .chain(harness.crashes.iter().map(|c| (c.t, c.t)))
        .collect();
    let faulted = |from: u64, to: u64| windows.iter().any(|&(f, t)| f <= to && from <= t + settle);
    let mut by_item: BTreeMap<u32, Vec<Attempt>> = BTreeMap::new();
    for a in attempts {
        by_item.entry(a.item).or_default().push(a);
    }
    let rw = &mut report.rw;
    let mut examples = Vec::new();
    for (item, mut list) in by_item {
        list.sort_by_key(|a| a.sent);
        for (j, b) in list.iter().enumerate() {
            let (true, Some(granted)) = (b.granted, b.ended) else {
                continue;
            };
            // Every A sent at least the slack before B, back to the longest wait.
            for a in list[..j].iter().rev() {
                if a.sent + slack > b.sent {
                    continue;
                }
                if a.deadline + slack < b.sent {
                    break;
                }
                // A still live and waiting when B was sent.
                let a_end = a
                    .ended
                    .or_else(|| killed_at(a.worker))
                    .unwrap_or(harness.end)
                    .min(a.deadline);
                if a_end <= b.sent {
                    continue;
                }
                if a.granted && a_end <= granted {
                    rw.fair_in_order += 1;
                    continue;
                }
                // B granted: was A still waiting, with room to spare?
                if a_end < granted + slack {
                    continue;
                }
                if faulted(a.sent, granted) {
                    rw.fair_excused += 1;
                    continue;
                }
                rw.fair_out_of_order += 1;
                examples.push(format!(
                    "fair {item}: worker {} (sent at +0 ms) still waiting when worker {} (sent at +{} ms) \
                     was granted at +{} ms",
                    a.worker,
                    b.worker,
                    (b.sent - a.sent) / 1_000_000,
                    (granted - a.sent) / 1_000_000,
                ));
            }
        }
    }
    for example in examples {
        report.example(example);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::test_event as ev;

    const MS: u64 = 1_000_000;

    fn write(worker: u32, t: u64) -> Event {
        ev(
            worker,
            On::Rw,
            t,
            Kind::Grant {
                token: u64::from(worker),
                valid_ns: 1000 * MS,
            },
        )
    }

    fn read(worker: u32, t: u64) -> Event {
        ev(worker, On::Rw, t, Kind::Shared { valid_ns: 1000 * MS })
    }

    fn released(worker: u32, on: On, t: u64) -> Event {
        ev(worker, on, t, Kind::Release("ok".into()))
    }

    #[test]
    fn the_checker_finds_a_write_overlapping_a_read() {
        let harness = Harness {
            end: 100 * MS,
            ..Harness::default()
        };
        // Readers 1 and 2 overlap (fine); writer 3 comes after both left (fine).
        let fine = vec![
            read(1, 0),
            read(2, 10 * MS),
            released(1, On::Rw, 20 * MS),
            released(2, On::Rw, 30 * MS),
            write(3, 40 * MS),
            released(3, On::Rw, 50 * MS),
        ];
        let report = crate::history::check(&fine, &harness);
        assert_eq!(
            (report.rw.shared_reads, report.rw.write_overlaps),
            (1, 0),
            "{report}"
        );
        assert_eq!(report.violations(), 0, "{report}");
        // A writer granted while reader 2 is still valid.
        let mut bad = fine.clone();
        bad[4] = write(3, 25 * MS);
        bad.sort_by_key(|e| e.t);
        let report = crate::history::check(&bad, &harness);
        assert_eq!(report.rw.write_overlaps, 1, "{report}");
        assert_eq!(report.violations(), 1, "{report}");
        // Unless reader 2's library had called its lease gone by then.
        let mut given_up = bad.clone();
        given_up.push(ev(2, On::Rw, 22 * MS, Kind::Holding { valid_ns: 0 }));
        given_up.sort_by_key(|e| e.t);
        let report = crate::history::check(&given_up, &harness);
        assert_eq!(
            (report.rw.write_overlaps, report.rw.write_overlaps_past_lease),
            (0, 1),
            "{report}"
        );
        // Or a fault outside the guarantees came first.
        let lost = Harness {
            end: 100 * MS,
            unprotected: vec![(24 * MS, 60 * MS)],
            ..Harness::default()
        };
        let report = crate::history::check(&bad, &lost);
        assert_eq!(
            (report.rw.write_overlaps, report.rw.write_overlaps_unprotected),
            (0, 1),
            "{report}"
        );
        // A reader granted under a valid writer is caught too.
        let under = vec![
            write(1, 0),
            read(2, 5 * MS),
            released(2, On::Rw, 6 * MS),
            released(1, On::Rw, 9 * MS),
        ];
        let report = crate::history::check(&under, &harness);
        assert_eq!(report.rw.write_overlaps, 1, "{report}");
    }

    #[test]
    fn the_checker_counts_a_wait_that_nobody_woke() {
        let waiting = |worker, t| {
            ev(
                worker,
                On::Rw,
                t,
                Kind::Waiting {
                    wait_ms: 3000,
                    shared: true,
                    permits: 1,
                },
            )
        };
        // A writer holds 0..1000 ms; a reader waits from 100 ms and times out at 3100 ms.
        let history = |release: u64| {
            let mut events = vec![
                write(1, 0),
                waiting(2, 100 * MS),
                released(1, On::Rw, release),
                ev(2, On::Rw, 3100 * MS, Kind::Busy),
            ];
            events.sort_by_key(|e| e.t);
            events
        };
        let harness = Harness {
            end: 10_000 * MS,
            ..Harness::default()
        };
        let report = crate::history::check(&history(1000 * MS), &harness);
        assert_eq!(report.rw.rw_stuck_reads, 1, "{report}");
        assert_eq!(report.violations(), 0, "not a violation: {report}");
        // Held until 2800 ms: free for 300 ms only.
        let report = crate::history::check(&history(2800 * MS), &harness);
        assert_eq!(report.rw.rw_stuck_reads, 0, "{report}");
        // A fault in the free stretch explains it.
        let faulted = Harness {
            end: 10_000 * MS,
            faults: vec![(1400 * MS, 2000 * MS)],
            ..Harness::default()
        };
        let report = crate::history::check(&history(1000 * MS), &faulted);
        assert_eq!(report.rw.rw_stuck_reads, 0, "{report}");
        // So does a release that failed: the hold may stay its lease (2 s here), until 3000 ms.
        let leased = Harness {
            end: 10_000 * MS,
            liveness_ns: 3000 * MS,
            ..Harness::default()
        };
        let report = crate::history::check(&history(1000 * MS), &leased);
        assert_eq!(report.rw.rw_stuck_reads, 1, "{report}");
        let mut failed = history(1000 * MS);
        failed[2] = ev(1, On::Rw, 1000 * MS, Kind::Release("err:timeout".into()));
        let report = crate::history::check(&failed, &leased);
        assert_eq!(report.rw.rw_stuck_reads, 0, "{report}");
    }

    #[test]
    fn the_checker_finds_a_waiter_overtaken() {
        let waiting = |worker, t| {
            ev(
                worker,
                On::Fair,
                t,
                Kind::Waiting {
                    wait_ms: 3000,
                    shared: false,
                    permits: 1,
                },
            )
        };
        let grant = |worker, t| {
            ev(
                worker,
                On::Fair,
                t,
                Kind::Grant {
                    token: t,
                    valid_ns: 2000 * MS,
                },
            )
        };
        // Worker 1 holds; 2 waits from 100 ms, 3 from 300 ms; 1 releases at 500 ms.
        let history = |first: u32, second: u32| {
            let mut events = vec![
                waiting(1, 0),
                grant(1, MS),
                waiting(2, 100 * MS),
                waiting(3, 300 * MS),
                released(1, On::Fair, 500 * MS),
                grant(first, 510 * MS),
                released(first, On::Fair, 600 * MS),
                grant(second, 610 * MS),
                released(second, On::Fair, 700 * MS),
            ];
            events.sort_by_key(|e| e.t);
            events
        };
        let harness = Harness {
            end: 10_000 * MS,
            ..Harness::default()
        };
        let report = crate::history::check(&history(2, 3), &harness);
        assert_eq!(
            (report.rw.fair_in_order, report.rw.fair_out_of_order),
            (1, 0),
            "{report}"
        );
        assert_eq!(report.violations(), 0, "{report}");
        let report = crate::history::check(&history(3, 2), &harness);
        assert_eq!(report.rw.fair_out_of_order, 1, "{report}");
        assert_eq!(report.violations(), 1, "{report}");
        // A fault between excuses it; so does a waiter whose worker was killed.
        let faulted = Harness {
            end: 10_000 * MS,
            faults: vec![(200 * MS, 250 * MS)],
            ..Harness::default()
        };
        let report = crate::history::check(&history(3, 2), &faulted);
        assert_eq!(
            (report.rw.fair_out_of_order, report.rw.fair_excused),
            (0, 1),
            "{report}"
        );
        // Two waiters sent within the slack: no order between them.
        let mut close = history(3, 2);
        for e in &mut close {
            if e.worker == 3 && matches!(e.kind, Kind::Waiting { .. }) {
                e.t = 150 * MS;
            }
        }
        close.sort_by_key(|e| e.t);
        let report = crate::history::check(&close, &harness);
        assert_eq!(report.rw.fair_out_of_order, 0, "{report}");
    }
}
