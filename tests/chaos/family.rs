//! The workloads of the lock's family, and their checks: a semaphore's permits and a countdown
//! latch, under the same faults as the locks.
//!
//! - Semaphore: tasks take 1 (sometimes 2) permits of `sem-i` (of `2 + i` permits), hold them for a
//!   moment or across renewals, and give them back; careful tasks under `until_lost`, naive ones
//!   not. Each hold is a section as a lock's is, valid by the library's own `validity()`, ended by
//!   its release, its loss or its holder's death. Check (f): at no instant do the valid sections
//!   of a semaphore hold more than its permits; and once every holder has stopped and a lease has
//!   passed, all its permits are free again.
//! - Latch: in every worker a coordinator arms `latch-i` with a small count, counters count down,
//!   waiters `wait_for` it. Check (g): no waiter is released before the count reached zero. The
//!   history knows when each call was sent and when its reply came back, not when Redis ran it, so
//!   the check is the one the timestamps prove: a round armed by a `set_count` answered before a
//!   wait began cannot be open when the wait returns unless as many `count_down` calls as its count
//!   were *sent* before that return (and not answered before the round's `set_count` was sent).
//!   A call that failed may still land, at any time after it was sent (a client resends it after a
//!   reconnect, also when its caller has had `Error::Timeout`: seen in a run, landing 1.4 s after
//!   the error); those, and calls of killed workers, count as arrivals at any time after they were
//!   sent: the check errs on the lenient side, never the strict one.
//!
//! After a fault outside the guarantees (a lone Redis restarted empty, an asynchronous replica
//! promoted), the semaphore's and the latch's state may be gone: what follows is counted apart, as
//! for the locks. Neither primitive waits for replicas (`sync_replicas` applies to locks), so the
//! topologies of `cargo test` here are one Redis and a primary with an asynchronous replica; a
//! cluster with synced replicas runs them in long mode (`chaos_family_cluster`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{Error, LockClient};

use crate::history::{now_ns, sections, Event, Harness, Kind, On, Op, Report, Section};
use crate::worker::{counted, describe, hold_plan, Settings};
use crate::Rng;

/// How many semaphores and latches the workers share.
pub const SEMAPHORES: u32 = 2;
pub const LATCHES: u32 = 2;

/// The permits of semaphore `i`: small, so that the tasks contend.
pub fn permits_of(i: u32) -> u64 {
    2 + u64::from(i)
}

pub fn semaphore_name(i: u32) -> String {
    format!("sem-{i}")
}

pub fn latch_name(i: u32) -> String {
    format!("latch-{i}")
}

pub fn emit(worker: u32, task: u32, on: On, item: u32, kind: Kind) {
    emit_at(worker, task, on, item, now_ns(), kind);
}

pub fn emit_at(worker: u32, task: u32, on: On, item: u32, t: u64, kind: Kind) {
    let event = Event {
        worker,
        task,
        on,
        item,
        t,
        kind,
    };
    println!("{event}");
}

/// One semaphore task's loop: take 1 or 2 permits of a random semaphore, hold them (a moment, or
/// with `long` 1 to 3 s, across renewals), saying the validity now and then, and give them back.
pub async fn hold_permits(
    settings: Settings,
    task: u32,
    long: bool,
    mut rng: Rng,
    client: LockClient,
    stop: Arc<AtomicBool>,
) {
    let id = settings.id;
    let sems: Vec<relock::Semaphore> = (0..SEMAPHORES)
        .map(|i| client.semaphore(&semaphore_name(i), permits_of(i)))
        .collect();
    let careful = task % 2 == 0;
    while !stop.load(Ordering::Relaxed) {
        if long {
            tokio::time::sleep(rng.between(Duration::from_secs(1), Duration::from_secs(3))).await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let item = rng.below(u64::from(SEMAPHORES)) as u32;
        let n = if rng.below(4) == 0 { 2 } else { 1 };
        let emit = |kind| emit(id, task, On::Semaphore, item, kind);
        let wait = settings.lease + Duration::from_secs(1);
        emit(Kind::Waiting {
            wait_ms: wait.as_millis() as u64,
            shared: false,
            permits: n,
        });
        let (acquired, calls) = counted(sems[item as usize].try_acquire_for(n, wait)).await;
        let permit = match acquired {
            Ok(Some(permit)) => permit,
            Ok(None) => {
                emit(Kind::Busy);
                emit(Kind::Calls(calls));
                continue;
            }
            Err(err) => {
                emit(Kind::Error(describe(&err)));
                emit(Kind::Calls(calls));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // The clock first, then the validity: the claim can only err on the short side.
        let t = now_ns();
        let valid_ns = permit.validity().as_nanos() as u64;
        emit_at(
            id,
            task,
            On::Semaphore,
            item,
            t,
            Kind::Permit { permits: n, valid_ns },
        );
        emit(Kind::Calls(calls));
        let (hold, steps) = hold_plan(&mut rng, &settings, long);
        let work = hold_for(id, task, On::Semaphore, item, hold, steps, || permit.validity());
        if careful {
            if permit.until_lost(work).await.is_err() {
                emit(Kind::Lost);
            }
        } else {
            work.await;
        }
        let t = now_ns();
        emit_at(id, task, On::Semaphore, item, t, Kind::Releasing);
        let outcome = match permit.release().await {
            Ok(()) => "ok".to_string(),
            Err(Error::NotHeld) => "notheld".to_string(),
            Err(err) => format!("err:{}", describe(&err)),
        };
        emit(Kind::Release(outcome));
    }
}

/// A hold's work: sleeps through `steps` (until `hold` has passed), writing at each step what
/// is left of the hold's validity (the clock first, so that the claim can only err on the short
/// side).
pub async fn hold_for(
    worker: u32,
    task: u32,
    on: On,
    item: u32,
    hold: Duration,
    steps: Vec<Duration>,
    validity: impl Fn() -> Duration,
) {
    let until = tokio::time::Instant::now() + hold;
    for step in steps {
        tokio::time::sleep(step).await;
        let t = now_ns();
        let valid_ns = validity().as_nanos() as u64;
        emit_at(worker, task, on, item, t, Kind::Holding { valid_ns });
        if tokio::time::Instant::now() >= until {
            return;
        }
    }
}

/// What a latch task does in its loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatchRole {
    /// Arms a random latch with a count of 1 to 4 (refused while it still counts), often enough
    /// that the latches are counting most of the time.
    Coordinator,
    /// Counts a random latch down.
    Counter,
    /// Waits up to 2.5 s for a random latch to open, then pauses a little (an open latch returns
    /// at once).
    Waiter,
}

/// One latch task's loop: every call is written when sent and when answered.
pub async fn use_latches(
    settings: Settings,
    task: u32,
    role: LatchRole,
    mut rng: Rng,
    client: LockClient,
    stop: Arc<AtomicBool>,
) {
    let id = settings.id;
    let latches: Vec<relock::CountDownLatch> = (0..LATCHES).map(|i| client.latch(&latch_name(i))).collect();
    while !stop.load(Ordering::Relaxed) {
        let item = rng.below(u64::from(LATCHES)) as u32;
        let latch = &latches[item as usize];
        let emit = |kind| emit(id, task, On::Latch, item, kind);
        // A wait's Redis calls, counted (see `worker::counted`).
        let mut waited = None;
        let outcome = match role {
            LatchRole::Coordinator => {
                tokio::time::sleep(rng.between(Duration::from_millis(50), Duration::from_millis(300))).await;
                let count = 1 + rng.below(4);
                emit(Kind::Call {
                    op: Op::Set,
                    arg: count,
                });
                latch.set_count(count).await.map(|set| set.to_string())
            }
            LatchRole::Counter => {
                tokio::time::sleep(rng.between(Duration::from_millis(100), Duration::from_millis(700))).await;
                emit(Kind::Call {
                    op: Op::CountDown,
                    arg: 0,
                });
                latch.count_down().await.map(|left| left.to_string())
            }
            LatchRole::Waiter => {
                let wait = rng.between(Duration::from_millis(200), Duration::from_millis(2500));
                emit(Kind::Call {
                    op: Op::Wait,
                    arg: wait.as_millis() as u64,
                });
                let (open, calls) = counted(latch.wait_for(wait)).await;
                waited = Some(calls);
                open.map(|open| open.to_string())
            }
        };
        match &outcome {
            Ok(reply) => emit(Kind::Reply(reply.clone())),
            Err(err) => emit(Kind::Reply(format!("err:{}", describe(err)))),
        }
        if let Some(calls) = waited {
            emit(Kind::Calls(calls));
        }
        if outcome.is_err() {
            // A bounded back-off: the servers may be down for a while.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if role == LatchRole::Waiter {
            tokio::time::sleep(rng.between(Duration::ZERO, Duration::from_millis(200))).await;
        }
    }
}

/// The counts of checks (f) and (g).
#[derive(Debug, Default, Clone)]
pub struct FamilyReport {
    pub permit_acquisitions: u64,
    pub permit_grants: u64,
    pub permit_busy: u64,
    pub permit_errors: u64,
    pub permits_lost: u64,
    /// (f) grants after which the valid permits of a semaphore exceeded its number: must be zero.
    pub over_permits: u64,
    /// (f) the same, after a fault outside the guarantees.
    pub over_permits_unprotected: u64,
    /// (f) grants after which the permits held, counting holds past their lease, exceeded it.
    pub over_permits_past_lease: u64,
    /// (f) permits not free at the end, a lease after every holder stopped: must be zero.
    pub permits_missing: u64,
    pub latch_sets: u64,
    pub latch_count_downs: u64,
    pub latch_errors: u64,
    pub waits_released: u64,
    /// Released waits that began after a round was armed: those the rule could catch early.
    pub waits_judged: u64,
    /// Of those, the waits that began before the round's count could have reached zero: released
    /// by its last count down, not by an open latch.
    pub waits_on_counting: u64,
    pub waits_timed_out: u64,
    /// (g) waits released before the round's count could have reached zero: must be zero.
    pub released_early: u64,
    /// (g) the same, after a fault outside the guarantees.
    pub released_early_unprotected: u64,
}

impl FamilyReport {
    pub fn violations(&self) -> u64 {
        self.over_permits + self.permits_missing + self.released_early
    }

    pub fn is_empty(&self) -> bool {
        self.permit_acquisitions == 0 && self.latch_sets + self.latch_count_downs + self.waits_released == 0
    }
}

impl fmt::Display for FamilyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "(f) semaphore: ops {} (granted {}, timed out {}, errors {}, lost {}), \
             valid permits over N {} (+{} after faults outside the guarantees), \
             over N counting holds past their lease {}, permits missing at the end {}; \
             (g) latch: rounds armed {}, count downs {}, errors {}, waits released {} \
             ({} judged against a round, {} of them begun while it counted), timed out {}, released early {} \
             (+{} after faults outside the guarantees)",
            self.permit_acquisitions,
            self.permit_grants,
            self.permit_busy,
            self.permit_errors,
            self.permits_lost,
            self.over_permits,
            self.over_permits_unprotected,
            self.over_permits_past_lease,
            self.permits_missing,
            self.latch_sets,
            self.latch_count_downs,
            self.latch_errors,
            self.waits_released,
            self.waits_judged,
            self.waits_on_counting,
            self.waits_timed_out,
            self.released_early,
            self.released_early_unprotected,
        )
    }
}

/// Checks (f) and (g) on the semaphore's and the latch's lines, into `report.family`.
pub fn check(events: &[Event], harness: &Harness, report: &mut Report) {
    let semaphore: Vec<Event> = events.iter().filter(|e| e.on == On::Semaphore).cloned().collect();
    let mut counts = Report::default();
    let held = sections(&semaphore, harness, &mut counts);
    let family = &mut report.family;
    family.permit_acquisitions = counts.acquisitions;
    family.permit_grants = counts.grants;
    family.permit_busy = counts.busy;
    family.permit_errors = counts.errors;
    family.permits_lost = semaphore.iter().filter(|e| e.kind == Kind::Lost).count() as u64;
    check_permits(&held, harness, report);
    for (&item, &permits) in &harness.permits {
        let free = harness.permits_at_end.get(&item).copied().unwrap_or(0);
        if free < permits {
            report.family.permits_missing += permits - free;
            report.example(format!(
                "semaphore {item}: {free} of {permits} permits free a lease after every holder stopped"
            ));
        }
    }
    let latch: Vec<&Event> = events.iter().filter(|e| e.on == On::Latch).collect();
    check_latches(&latch, harness, report);
}

/// (f): the valid permits only grow at a grant, so checking at every grant checks every instant.
fn check_permits(sections: &[Section], harness: &Harness, report: &mut Report) {
    let mut by_item: BTreeMap<u32, Vec<&Section>> = BTreeMap::new();
    for s in sections {
        by_item.entry(s.item).or_default().push(s);
    }
    for (item, mut list) in by_item {
        let permits = harness.permits.get(&item).copied().unwrap_or(0);
        list.sort_by_key(|s| s.start);
        // The sections not yet ended at the current grant: a few, whatever the run's length.
        let mut open: Vec<&Section> = Vec::new();
        for b in list {
            open.retain(|a| a.end > b.start);
            open.push(b);
            let held: u64 = open.iter().map(|a| a.permits).sum();
            if held > permits {
                report.family.over_permits_past_lease += 1;
            }
            // A section is valid in `[start, valid_end)`.
            let valid: Vec<&&Section> = open.iter().filter(|a| b.start < a.valid_end).collect();
            let valid_permits: u64 = valid.iter().map(|a| a.permits).sum();
            if valid_permits <= permits {
                continue;
            }
            if harness
                .unsynced_windows()
                .any(|(from, to)| (*from..=*to).contains(&b.start))
            {
                report.family.over_permits_unprotected += 1;
                continue;
            }
            report.family.over_permits += 1;
            let holders: Vec<String> = valid
                .iter()
                .map(|a| {
                    format!(
                        "worker {} {} from {} ms valid until {} ms",
                        a.worker,
                        a.permits,
                        a.start as i64 / 1_000_000 - b.start as i64 / 1_000_000,
                        a.valid_end as i64 / 1_000_000 - b.start as i64 / 1_000_000
                    )
                })
                .collect();
            report.example(format!(
                "semaphore {item} ({permits} permits): {valid_permits} valid at worker {}'s grant: {}",
                b.worker,
                holders.join(", ")
            ));
        }
    }
}

/// One latch call: sent at `sent`, answered at `replied` with `reply` (neither if no answer came).
#[derive(Debug, Clone)]
struct Call {
    worker: u32,
    op: Op,
    arg: u64,
    sent: u64,
    replied: Option<u64>,
    reply: Option<String>,
}

impl Call {
    /// When the call had surely landed: its successful reply. A failed call may land later.
    fn landed_by(&self) -> Option<u64> {
        match &self.reply {
            Some(reply) if !reply.starts_with("err:") => self.replied,
            _ => None,
        }
    }
}

/// The calls of one latch from 1 s before `round` was sent until `returned`, and the faults over that
/// span, one per line, times in ms from the round's answer: what a violation's report carries, so that
/// a CI run whose history file is gone still shows it.
fn latch_calls_around(calls: &[Call], round: &Call, returned: u64, harness: &Harness) -> String {
    let from = round.sent.saturating_sub(1_000_000_000);
    let zero = round.replied.unwrap_or(round.sent) as i64;
    let ms = |t: u64| (t as i64 - zero) as f64 / 1e6;
    let mut lines: Vec<(u64, String)> = calls
        .iter()
        .filter(|c| c.sent <= returned && c.replied.is_none_or(|r| r >= from))
        .map(|c| {
            let replied = c
                .replied
                .map_or("no answer".to_string(), |r| format!("answered {:+.1} ms", ms(r)));
            let reply = c.reply.as_deref().unwrap_or("-");
            (
                c.sent,
                format!(
                    "\n    worker {} {:?}({}) sent {:+.1} ms, {replied}: {reply}",
                    c.worker,
                    c.op,
                    c.arg,
                    ms(c.sent)
                ),
            )
        })
        .collect();
    lines.extend(
        harness
            .faults
            .iter()
            .filter(|(start, end)| *start <= returned && *end >= from)
            .map(|(start, end)| {
                (
                    *start,
                    format!("\n    fault from {:+.1} ms to {:+.1} ms", ms(*start), ms(*end)),
                )
            }),
    );
    lines.sort_by_key(|(t, _)| *t);
    lines.into_iter().take(40).map(|(_, line)| line).collect()
}

/// (g), per latch (see the module doc for the rule and its slack).
fn check_latches(events: &[&Event], harness: &Harness, report: &mut Report) {
    let mut pending: HashMap<(u32, u32), (u32, Call)> = HashMap::new();
    let mut calls: BTreeMap<u32, Vec<Call>> = BTreeMap::new();
    for ev in events {
        let key = (ev.worker, ev.task);
        match &ev.kind {
            Kind::Call { op, arg } => {
                let call = Call {
                    worker: ev.worker,
                    op: *op,
                    arg: *arg,
                    sent: ev.t,
                    replied: None,
                    reply: None,
                };
                if let Some((item, unanswered)) = pending.insert(key, (ev.item, call)) {
                    calls.entry(item).or_default().push(unanswered);
                }
            }
            Kind::Reply(reply) => {
                if let Some((item, mut call)) = pending.remove(&key) {
                    call.replied = Some(ev.t);
                    call.reply = Some(reply.clone());
                    calls.entry(item).or_default().push(call);
                }
            }
            _ => {}
        }
    }
    // Calls of killed workers, and of workers stopped in the middle of a call.
    for (item, call) in pending.into_values() {
        calls.entry(item).or_default().push(call);
    }
    let family = &mut report.family;
    let mut examples = Vec::new();
    for (item, calls) in &calls {
        let is = |call: &Call, op: Op, reply: &str| call.op == op && call.reply.as_deref() == Some(reply);
        let sets: Vec<&Call> = calls.iter().filter(|c| is(c, Op::Set, "true")).collect();
        let downs: Vec<&Call> = calls.iter().filter(|c| c.op == Op::CountDown).collect();
        family.latch_sets += sets.len() as u64;
        family.latch_count_downs += downs.len() as u64;
        family.latch_errors += calls
            .iter()
            .filter(|c| c.reply.as_deref().is_some_and(|r| r.starts_with("err:")))
            .count() as u64;
        family.waits_timed_out += calls.iter().filter(|c| is(c, Op::Wait, "false")).count() as u64;
        for wait in calls.iter().filter(|c| is(c, Op::Wait, "true")) {
            family.waits_released += 1;
            let returned = wait.replied.expect("a reply");
            // The latest round armed before the wait began: it had opened by the wait's return
            // only if its count of arrivals could have landed after it was armed and before then.
            let Some(round) = sets
                .iter()
                .filter(|s| s.replied.is_some_and(|r| r <= wait.sent))
                .max_by_key(|s| s.replied)
            else {
                continue;
            };
            family.waits_judged += 1;
            let arrivals_by = |t: u64| {
                downs
                    .iter()
                    .filter(|d| d.sent < t && d.landed_by().is_none_or(|r| r >= round.sent))
                    .count() as u64
            };
            if arrivals_by(wait.sent) < round.arg {
                family.waits_on_counting += 1;
            }
            let arrivals = arrivals_by(returned);
            if arrivals >= round.arg {
                continue;
            }
            // A fault that lost the latch's state while the round counted excuses the release.
            let lost = harness
                .unsynced_windows()
                .any(|(from, _)| (round.sent..=returned).contains(from));
            if lost {
                family.released_early_unprotected += 1;
                continue;
            }
            family.released_early += 1;
            examples.push(format!(
                "latch {item}: a wait sent {} ms after a round of {} was armed returned true {} ms after, \
                 with {arrivals} count downs sent by then{}",
                (wait.sent - round.replied.unwrap_or(round.sent)) / 1_000_000,
                round.arg,
                (returned - round.replied.unwrap_or(round.sent)) / 1_000_000,
                latch_calls_around(calls, round, returned, harness),
            ));
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

    fn permit(worker: u32, t: u64, permits: u64) -> Event {
        ev(
            worker,
            On::Semaphore,
            t,
            Kind::Permit {
                permits,
                valid_ns: 1000 * MS,
            },
        )
    }

    fn released(worker: u32, t: u64) -> Event {
        ev(worker, On::Semaphore, t, Kind::Release("ok".into()))
    }

    #[test]
    fn the_checker_counts_permits_over_n() {
        // Semaphore 0 of 2 permits: workers 1 (2 permits) and 2 (1) overlap, 3 comes after 1 left.
        let events = vec![
            permit(1, 0, 2),
            permit(2, 10 * MS, 1),
            released(1, 20 * MS),
            permit(3, 30 * MS, 1),
            released(2, 40 * MS),
            released(3, 50 * MS),
        ];
        let harness = Harness {
            end: 100 * MS,
            permits: [(0, 2)].into(),
            permits_at_end: [(0, 2)].into(),
            ..Harness::default()
        };
        let report = crate::history::check(&events, &harness);
        assert_eq!(report.family.over_permits, 1, "{report}");
        assert_eq!(report.violations(), 1, "{report}");
        // With 3 permits, the same history is fine.
        let three = Harness {
            permits: [(0, 3)].into(),
            permits_at_end: [(0, 3)].into(),
            ..harness
        };
        let report = crate::history::check(&events, &three);
        assert_eq!(report.violations(), 0, "{report}");
        // A holder whose library said its lease was gone (validity 0) no longer counts.
        let mut given_up = events.clone();
        given_up.insert(1, ev(1, On::Semaphore, 5 * MS, Kind::Holding { valid_ns: 0 }));
        let report = crate::history::check(
            &given_up,
            &Harness {
                permits: [(0, 2)].into(),
                permits_at_end: [(0, 1)].into(),
                ..three
            },
        );
        assert_eq!(
            (report.family.over_permits, report.family.over_permits_past_lease),
            (0, 1),
            "{report}"
        );
        assert_eq!(report.family.permits_missing, 1, "{report}");
    }

    #[test]
    fn the_checker_finds_a_waiter_released_early() {
        let call = |worker, t, op, arg| ev(worker, On::Latch, t, Kind::Call { op, arg });
        let reply = |worker, t, reply: &str| ev(worker, On::Latch, t, Kind::Reply(reply.into()));
        // A round of 2; one count down answered, a second sent at 50 ms; the waiter returns.
        let history = |returned: u64| {
            let mut events = vec![
                call(1, 0, Op::Set, 2),
                reply(1, MS, "true"),
                call(2, 10 * MS, Op::Wait, 1000),
                call(3, 20 * MS, Op::CountDown, 0),
                reply(3, 21 * MS, "1"),
                call(4, 50 * MS, Op::CountDown, 0),
                reply(4, 51 * MS, "0"),
            ];
            events.push(reply(2, returned, "true"));
            events.sort_by_key(|e| e.t);
            events
        };
        let harness = Harness {
            end: 100 * MS,
            ..Harness::default()
        };
        let report = crate::history::check(&history(52 * MS), &harness);
        assert_eq!(
            (report.family.waits_judged, report.family.released_early),
            (1, 0),
            "{report}"
        );
        // Back before the second count down was sent: early, and the report lists the latch's calls.
        let report = crate::history::check(&history(40 * MS), &harness);
        assert_eq!(report.family.released_early, 1, "{report}");
        let shown = report.examples.join("\n");
        assert!(
            shown.contains("worker 3 CountDown(0) sent +19.0 ms, answered +20.0 ms: 1"),
            "{shown}"
        );
        assert!(!shown.contains("worker 4 CountDown"), "{shown}");
        // Unless a fault lost the latch meanwhile.
        let lost = Harness {
            unprotected: vec![(30 * MS, 90 * MS)],
            ..harness
        };
        let report = crate::history::check(&history(40 * MS), &lost);
        assert_eq!(
            (
                report.family.released_early,
                report.family.released_early_unprotected
            ),
            (0, 1),
            "{report}"
        );
        // A count down that failed before the round was armed may land in it all the same (resent
        // after a reconnect): it counts. One answered before the round was armed does not.
        let failed_before = |answer: &str| {
            vec![
                call(5, 0, Op::CountDown, 0),
                reply(5, MS, answer),
                call(1, 2 * MS, Op::Set, 2),
                reply(1, 3 * MS, "true"),
                call(2, 10 * MS, Op::Wait, 1000),
                call(3, 20 * MS, Op::CountDown, 0),
                reply(3, 21 * MS, "1"),
                reply(2, 30 * MS, "true"),
            ]
        };
        let harness = Harness {
            end: 100 * MS,
            ..Harness::default()
        };
        let report = crate::history::check(&failed_before("err:timeout"), &harness);
        assert_eq!(report.family.released_early, 0, "{report}");
        let report = crate::history::check(&failed_before("1"), &harness);
        assert_eq!(report.family.released_early, 1, "{report}");
    }
}
