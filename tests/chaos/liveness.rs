//! The waiters' liveness, for every primitive the harness runs (lock, semaphore, latch, read-write
//! lock, fair lock), judged outside fault windows. Safety is (a) to (i); this is whether waiting
//! works: waiters neither poll, nor oversleep, nor stall.
//!
//! The history says, per acquisition (or latch wait): when it was sent (`Waiting`, a latch's
//! `call wait`), its bound, its outcome and when it came back, and how many Redis calls relock sent
//! from the waiter's own task meanwhile (`Calls`, counted by a recorder of the feature `metrics`:
//! see `worker::counted`). And per hold: when its grant came back, when its release began and when
//! that release was answered (`Releasing`, `Release`).
//!
//! **When a lock is free, by the history.** Only what the client side proves. A hold is taken to
//! last from its grant's record until the latest moment it can still have been in Redis: the
//! answer to its release (`ok`, `notheld`); a lease after its release began where that release
//! failed or was never answered (its worker killed); a lease after its worker was killed or stopped
//! (SIGSTOP: its watchdog renews nothing); a fair-lock hold with a fixed lease, that lease after
//! its grant came back. A lease here is `watchdog_timeout` plus [`LEASE_SLACK`]. An acquisition in
//! flight when its worker was killed or stopped, or that failed with an error, may have been
//! granted unrecorded (and a fair or write waiter's place or mark stays): it counts as a hold for
//! a lease from then; a dead writer's mark for a lease past the last heartbeat of the writers that
//! waited while it lived (their heartbeats renew the one hash that holds every writer's mark).
//! Every free moment is so the *latest* moment the lock can have become free; the delays measured
//! from it are lower bounds of the true ones, and a late one is surely late.
//!
//! **Live waiters, outside fault windows.** A fault window is every fault the nemesis injected or
//! noticed, from its start until [`FAULT_SETTLE`] after it healed, and the windows after faults
//! outside the guarantees or that replicas may not have survived. A crashed holder's own window
//! (SIGKILL, SIGSTOP) is not one for the others: its lease's end, which they wait for, is judged;
//! its worker's waiters are not live meanwhile, nor until [`FAULT_SETTLE`] after a stopped one
//! woke (a killed worker's never again). Nor is a worker's before its first answer from Redis (a
//! process starting, on a loaded machine, takes a while to connect and load the scripts).
//!
//! - (j) **No polling.** Per wait of at least [`POLL_MIN_WAIT`] that ended (granted or timed out)
//!   outside fault windows, its worker live throughout: its Redis calls per master (a `MultiLock`'s
//!   attempt asks each master once; an attempt's undo of a split vote counts too) less what
//!   wake-ups explain (3, and 2 for each change of the holders of its lock during the wait: a grant
//!   or a free moment; for a latch, each answered `set_count` or `count_down`), per second of
//!   waiting. Over [`POLL_BOUND`] is a violation. The summary gives the worst raw rate and the worst
//!   unexplained one, per primitive.
//! - (k) **No oversleeping.** At each free moment of a lock, a semaphore's permits, a read-write
//!   lock (no reader nor writer left) or a fair lock, where a live waiter was waiting that still
//!   had [`LATE`] of its wait left (and, for a semaphore, asked no more permits than were free): the
//!   delay to the next grant of it, to anyone. For a latch, each live waiter at its opening (the
//!   first `count_down` answered 0 that read the round armed), the delay until it returned, or at
//!   least until the latch was armed again where it had not returned by then. Reported per
//!   primitive against the target [`TARGET`] (p50, p99, max, how many over it); a delay over
//!   [`LATE`] is a violation: the machine's two cores starve the workers now and then, so the
//!   target alone would count scheduling noise, and only a delay no scheduler explains counts.
//! - (l) **Progress.** No fair lock, and no read-write lock that a live writer waits for, stands
//!   free (as above, and outside fault windows) with a live waiter (any, a writer) for a whole
//!   lease (`watchdog_timeout`) without a grant.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use crate::history::{sections, Crash, Event, Harness, Kind, On, Op, Report, Section};
use crate::rw::{fixed_lease_of, FAULT_SETTLE};

/// (k): the delay from a free moment to the next grant that the library aims for.
pub const TARGET: Duration = Duration::from_millis(250);
/// (k): a delay past this is a violation.
pub const LATE: Duration = Duration::from_secs(1);
/// (j): the shortest wait judged.
pub const POLL_MIN_WAIT: Duration = Duration::from_millis(500);
/// (j): unexplained calls per master per second of waiting.
pub const POLL_BOUND: f64 = 20.0;
/// What a lease's end may lag its bound by: a renewal sent just before a crash that lands after it.
pub const LEASE_SLACK: Duration = Duration::from_millis(100);

fn name(on: On) -> &'static str {
    match on {
        On::Lock => "lock",
        On::Semaphore => "semaphore",
        On::Latch => "latch",
        On::Rw => "rw",
        On::Fair => "fair",
        On::Election => "election",
    }
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// (j) per primitive.
#[derive(Debug, Default, Clone)]
pub struct Polling {
    /// Waits judged: long enough, ended outside fault windows.
    pub judged: u64,
    /// The highest calls per master per waiting second.
    pub worst_rate: f64,
    /// The highest of the same less what wake-ups explain.
    pub worst_unexplained: f64,
    /// Waits over [`POLL_BOUND`]: violations.
    pub polling: u64,
}

/// (k) per primitive.
#[derive(Debug, Default, Clone)]
pub struct Wakes {
    /// The delays judged, in µs.
    pub gaps_us: Vec<u64>,
    /// Free moments with a live waiter, not judged: a fault window was too close.
    pub excused: u64,
    /// Delays over [`LATE`]: violations.
    pub late: u64,
}

impl Wakes {
    /// The `q`-quantile (nearest rank) in ms.
    fn quantile_ms(&self, q: f64) -> f64 {
        let mut gaps = self.gaps_us.clone();
        gaps.sort_unstable();
        if gaps.is_empty() {
            return 0.0;
        }
        let rank = ((q * gaps.len() as f64).ceil() as usize).clamp(1, gaps.len());
        gaps[rank - 1] as f64 / 1000.0
    }

    fn over_target(&self) -> usize {
        self.gaps_us
            .iter()
            .filter(|&&g| g > TARGET.as_micros() as u64)
            .count()
    }
}

/// (l) per primitive (fair lock, read-write lock).
#[derive(Debug, Default, Clone)]
pub struct Stalls {
    /// The longest stretch a lock stood free with a live waiter (a writer), outside faults, in ms.
    pub longest_ms: u64,
    /// Stretches of a lease or more: violations.
    pub stalled: u64,
}

/// The counts of (j), (k) and (l).
#[derive(Debug, Default, Clone)]
pub struct LivenessReport {
    pub polling: BTreeMap<On, Polling>,
    pub wakes: BTreeMap<On, Wakes>,
    pub stalls: BTreeMap<On, Stalls>,
    /// (k) the delays over the target (not violations), the 5 longest, each with what was around.
    pub over_target: Vec<(u64, String)>,
}

impl LivenessReport {
    /// Keeps `what`, a delay of `gap` over the target, if it is among the 5 longest.
    fn over(&mut self, gap: u64, what: String) {
        self.over_target.push((gap, what));
        self.over_target.sort_by_key(|o| std::cmp::Reverse(o.0));
        self.over_target.truncate(5);
    }

    pub fn violations(&self) -> u64 {
        self.polling.values().map(|p| p.polling).sum::<u64>()
            + self.wakes.values().map(|w| w.late).sum::<u64>()
            + self.stalls.values().map(|s| s.stalled).sum::<u64>()
    }
}

impl fmt::Display for LivenessReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let polling: Vec<String> = self
            .polling
            .iter()
            .map(|(on, p)| {
                format!(
                    "{} {} waits, worst {:.1}/s ({:.1}/s unexplained)",
                    name(*on),
                    p.judged,
                    p.worst_rate,
                    p.worst_unexplained
                )
            })
            .collect();
        write!(
            f,
            "(j) polling (waits of {} ms or more, calls per master per waiting second): [{}], over {}/s {}; ",
            POLL_MIN_WAIT.as_millis(),
            polling.join(", "),
            POLL_BOUND,
            self.polling.values().map(|p| p.polling).sum::<u64>()
        )?;
        let wakes: Vec<String> = self
            .wakes
            .iter()
            .map(|(on, w)| {
                if w.gaps_us.is_empty() {
                    return format!("{} none judged", name(*on));
                }
                format!(
                    "{} {}: p50 {:.1} p99 {:.1} max {:.1} ms, over target {}",
                    name(*on),
                    w.gaps_us.len(),
                    w.quantile_ms(0.5),
                    w.quantile_ms(0.99),
                    w.quantile_ms(1.0),
                    w.over_target()
                )
            })
            .collect();
        write!(
            f,
            "(k) free to granted (target {} ms): [{}], excused by faults {}, late (over {} ms) {}; ",
            TARGET.as_millis(),
            wakes.join(", "),
            self.wakes.values().map(|w| w.excused).sum::<u64>(),
            LATE.as_millis(),
            self.wakes.values().map(|w| w.late).sum::<u64>()
        )?;
        let stalls: Vec<String> = self
            .stalls
            .iter()
            .map(|(on, s)| {
                let who = if *on == On::Rw { "rw writer" } else { name(*on) };
                format!("{who} {} ms", s.longest_ms)
            })
            .collect();
        write!(
            f,
            "(l) longest free with a waiter: [{}], stalled a lease {}",
            stalls.join(", "),
            self.stalls.values().map(|s| s.stalled).sum::<u64>()
        )
    }
}

/// How an acquisition (or a latch wait) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Granted,
    TimedOut,
    Failed,
    /// Its worker was killed first (`ended` is the kill).
    Killed,
    /// Still waiting when the run ended.
    Open,
}

/// One acquisition or latch wait.
#[derive(Debug, Clone)]
struct Wait {
    on: On,
    item: u32,
    worker: u32,
    shared: bool,
    permits: u64,
    sent: u64,
    deadline: u64,
    ended: u64,
    end: End,
    calls: Option<u64>,
}

/// One latch call (set or count down), sent and answered.
#[derive(Debug, Clone)]
struct LatchCall {
    item: u32,
    op: Op,
    sent: u64,
    replied: Option<u64>,
    reply: Option<String>,
}

/// One hold as far as liveness goes: from its grant's record to the latest moment it can have been
/// in Redis (see the module doc).
#[derive(Debug, Clone, Copy)]
struct Hold {
    start: u64,
    until: u64,
    permits: u64,
}

/// What every rule needs: the bounds and the windows.
struct Context<'a> {
    harness: &'a Harness,
    lease: u64,
    slack: u64,
    /// Fault windows, extended by the settle time after them.
    windows: Vec<(u64, u64)>,
    /// Per worker: the windows it was stopped, and when it was killed.
    stops: HashMap<u32, Vec<(u64, u64)>>,
    kills: HashMap<u32, u64>,
    /// Per worker, its first answer from Redis (a grant, a refusal, a latch's reply, a release's
    /// outcome): a process starting (connecting its clients, loading the scripts, on a loaded
    /// machine) is not judged before.
    warm: HashMap<u32, u64>,
}

impl Context<'_> {
    fn new<'a>(harness: &'a Harness, events: &[Event]) -> Context<'a> {
        let lease = match (harness.lease_ns, harness.liveness_ns) {
            (0, 0) => ns(Duration::from_secs(2)),
            (0, bound) => bound.saturating_sub(ns(Duration::from_secs(1))),
            (lease, _) => lease,
        };
        let settle = ns(FAULT_SETTLE);
        let crashed = |t: u64| harness.crashes.iter().any(|c| c.t == t);
        let windows = harness
            .faults
            .iter()
            .filter(|(from, _)| !crashed(*from))
            .chain(&harness.unprotected)
            .chain(&harness.unsynced)
            .map(|&(from, to)| (from, to + settle))
            .collect();
        let mut stops: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        let mut kills = HashMap::new();
        for c in &harness.crashes {
            if c.killed {
                let kill = kills.entry(c.worker).or_insert(c.t);
                *kill = (*kill).min(c.t);
            } else {
                // Its window runs until it was woken (the fault's), else a lease and a second; a
                // process that wakes finds its state stale (holds lost, attempts abandoned), and
                // settles as after other faults.
                let to = harness
                    .faults
                    .iter()
                    .find(|(from, _)| *from == c.t)
                    .map_or(c.t + lease + ns(Duration::from_secs(1)), |&(_, to)| to);
                stops.entry(c.worker).or_default().push((c.t, to + settle));
            }
        }
        let mut warm = HashMap::new();
        for ev in events {
            let answered = match &ev.kind {
                Kind::Grant { .. } | Kind::Permit { .. } | Kind::Shared { .. } | Kind::Busy => true,
                Kind::Reply(reply) | Kind::Release(reply) => !reply.starts_with("err"),
                _ => false,
            };
            if answered {
                let first = warm.entry(ev.worker).or_insert(ev.t);
                *first = (*first).min(ev.t);
            }
        }
        Context {
            harness,
            lease,
            slack: ns(LEASE_SLACK),
            windows,
            stops,
            kills,
            warm,
        }
    }

    /// Whether a fault window (with its settle time) meets `[from, to]`.
    fn excluded(&self, from: u64, to: u64) -> bool {
        self.windows.iter().any(|&(a, b)| a <= to && b >= from)
    }

    /// Whether `worker` ran all through `[from, to]`: started, neither stopped nor killed.
    fn live(&self, worker: u32, from: u64, to: u64) -> bool {
        if self.warm.get(&worker).is_none_or(|&warm| warm > from) {
            return false;
        }
        let killed = self.kills.get(&worker).is_some_and(|&k| k < to);
        let stopped = self
            .stops
            .get(&worker)
            .is_some_and(|s| s.iter().any(|&(a, b)| a <= to && b >= from));
        !killed && !stopped
    }

    /// The moment by which the crash begun at `t` took effect: a kill waits for the process to exit
    /// (its fault window's end); a stop is a signal, in effect at once.
    fn crash_done(&self, c: &Crash) -> u64 {
        if !c.killed {
            return c.t;
        }
        self.harness
            .faults
            .iter()
            .find(|(from, _)| *from == c.t)
            .map_or(c.t, |&(_, to)| to.max(c.t))
    }

    /// The crashes (kills and stops) of `worker` that met `[from, to]`, each at the latest of its
    /// start and `from`: a process logs a request's sending up to the moment the kill lands, after
    /// the nemesis took the kill's time.
    fn crashes_in(&self, worker: u32, from: u64, to: u64) -> impl Iterator<Item = u64> + '_ {
        self.harness
            .crashes
            .iter()
            .filter(move |c| c.worker == worker && c.t <= to && self.crash_done(c) >= from)
            .map(move |c| c.t.max(from))
    }

    fn lease_end(&self, t: u64) -> u64 {
        t + self.lease + self.slack
    }

    /// The latest moment the hold of section `s` can have been in Redis (see the module doc).
    fn held_until(&self, s: &Section, on: On) -> u64 {
        let mut until = if s.release_failed {
            self.lease_end(s.end)
        } else if let Some(answered) = s.released {
            answered
        } else if s.end >= self.harness.end {
            u64::MAX // held when the run ended
        } else {
            // No answer: its worker was killed holding it, or while it was being released.
            self.lease_end(s.end)
        };
        let crashes: Vec<u64> = self.crashes_in(s.worker, s.start, until).collect();
        for t in crashes {
            until = until.min(self.lease_end(t));
        }
        if on == On::Fair {
            if let Some(lease) = fixed_lease_of(s.task) {
                until = until.min(s.start + ns(lease) + self.slack);
            }
        }
        until.max(s.start)
    }

    /// What an acquisition may have left in Redis unrecorded: a grant (or a fair or write waiter's
    /// place or mark) of a wait cut by its worker's kill or stop, or that failed; for a lease. A
    /// waiting writer's mark is a field of the lock's one hash of waiting writers, whose TTL every
    /// waiting writer's heartbeat renews: a dead writer's mark lasts a lease past the last heartbeat
    /// of the writers that waited while it lived (`writers`: the lock's exclusive waits).
    fn ghosts(&self, w: &Wait, writers: &[&Wait]) -> Vec<Hold> {
        let mut from: Vec<u64> = self.crashes_in(w.worker, w.sent, w.ended).collect();
        if w.end == End::Failed {
            from.push(w.ended);
        }
        let marks = w.on == On::Rw && !w.shared;
        from.into_iter()
            .map(|t| {
                let mut last = t;
                if marks {
                    while let Some(ended) = writers
                        .iter()
                        .filter(|o| o.sent <= last + self.lease && o.ended > last)
                        .map(|o| o.ended)
                        .max()
                    {
                        last = ended;
                    }
                }
                Hold {
                    start: t,
                    until: self.lease_end(last),
                    permits: w.permits,
                }
            })
            .collect()
    }
}

/// The acquisitions and latch waits of the history, and the latches' other calls.
fn waits(events: &[Event], ctx: &Context) -> (Vec<Wait>, Vec<LatchCall>) {
    let mut pending: HashMap<(u32, u32), Wait> = HashMap::new();
    let mut calls: HashMap<(u32, u32), LatchCall> = HashMap::new();
    let mut done: Vec<Wait> = Vec::new();
    let mut latch_calls: Vec<LatchCall> = Vec::new();
    // Per task, its wait that ended last: a `Calls` line follows its outcome.
    let mut last: HashMap<(u32, u32), usize> = HashMap::new();
    for ev in events {
        let key = (ev.worker, ev.task);
        let mut open = |wait_ms: u64, shared: bool, permits: u64| {
            let wait = Wait {
                on: ev.on,
                item: ev.item,
                worker: ev.worker,
                shared,
                permits,
                sent: ev.t,
                deadline: ev.t + wait_ms * 1_000_000,
                ended: ev.t,
                end: End::Failed,
                calls: None,
            };
            if let Some(mut stale) = pending.insert(key, wait) {
                stale.ended = ev.t;
                done.push(stale);
            }
        };
        let end = match &ev.kind {
            Kind::Waiting {
                wait_ms,
                shared,
                permits,
            } => {
                open(*wait_ms, *shared, *permits);
                None
            }
            Kind::Call { op: Op::Wait, arg } if ev.on == On::Latch => {
                open(*arg, false, 1);
                None
            }
            Kind::Call { op, .. } if ev.on == On::Latch => {
                let call = LatchCall {
                    item: ev.item,
                    op: *op,
                    sent: ev.t,
                    replied: None,
                    reply: None,
                };
                if let Some(stale) = calls.insert(key, call) {
                    latch_calls.push(stale);
                }
                None
            }
            Kind::Grant { .. } | Kind::Permit { .. } | Kind::Shared { .. } => Some(End::Granted),
            Kind::Busy => Some(End::TimedOut),
            Kind::Error(_) => Some(End::Failed),
            Kind::Reply(reply) => {
                if let Some(mut call) = calls.remove(&key) {
                    call.replied = Some(ev.t);
                    call.reply = Some(reply.clone());
                    latch_calls.push(call);
                    None
                } else {
                    Some(match reply.as_str() {
                        "true" => End::Granted,
                        "false" => End::TimedOut,
                        _ => End::Failed,
                    })
                }
            }
            Kind::Calls(n) => {
                if let Some(&i) = last.get(&key) {
                    done[i].calls = Some(*n);
                }
                None
            }
            _ => None,
        };
        if let Some(end) = end {
            if let Some(mut wait) = pending.remove(&key) {
                wait.ended = ev.t;
                wait.end = end;
                last.insert(key, done.len());
                done.push(wait);
            }
        }
    }
    for (_, mut wait) in pending {
        let kill = ctx
            .harness
            .crashes
            .iter()
            .filter(|c| c.killed && c.worker == wait.worker);
        match kill.map(|c| (c.t, ctx.crash_done(c))).min() {
            Some((kill, done)) if done >= wait.sent => {
                wait.ended = kill.max(wait.sent);
                wait.end = End::Killed;
            }
            _ => {
                wait.ended = ctx.harness.end.max(wait.sent);
                wait.end = End::Open;
            }
        }
        done.push(wait);
    }
    latch_calls.extend(calls.into_values());
    (done, latch_calls)
}

/// Checks (j), (k) and (l) on every primitive's lines, into `report.live`.
pub fn check(events: &[Event], harness: &Harness, report: &mut Report) {
    let ctx = Context::new(harness, events);
    let (waits, latch_calls) = waits(events, &ctx);
    if waits.is_empty() {
        return;
    }
    // Per primitive and item: its holds (and what unrecorded grants may hold), its waits.
    let mut holds: BTreeMap<(On, u32), Vec<Hold>> = BTreeMap::new();
    let mut ghosts: BTreeMap<(On, u32), Vec<Hold>> = BTreeMap::new();
    let mut by_item: BTreeMap<(On, u32), Vec<&Wait>> = BTreeMap::new();
    for on in [On::Lock, On::Semaphore, On::Rw, On::Fair, On::Election] {
        let lines: Vec<Event> = events.iter().filter(|e| e.on == on).cloned().collect();
        if lines.is_empty() {
            continue;
        }
        let mut counts = Report::default();
        for s in sections(&lines, harness, &mut counts) {
            holds.entry((on, s.item)).or_default().push(Hold {
                start: s.start,
                until: ctx.held_until(&s, on),
                permits: s.permits,
            });
        }
    }
    for w in &waits {
        by_item.entry((w.on, w.item)).or_default().push(w);
    }
    for (&(on, item), list) in &by_item {
        if on == On::Latch {
            continue;
        }
        let writers: Vec<&Wait> = list.iter().copied().filter(|w| !w.shared).collect();
        let found = list.iter().flat_map(|w| ctx.ghosts(w, &writers));
        ghosts.entry((on, item)).or_default().extend(found);
    }
    for list in holds.values_mut() {
        list.sort_by_key(|h| h.start);
    }
    let none = Vec::new();
    for (&(on, item), list) in &by_item {
        let held = holds.get(&(on, item)).unwrap_or(&none);
        let ghosted = ghosts.get(&(on, item)).unwrap_or(&none);
        let latch: Vec<&LatchCall> = latch_calls.iter().filter(|c| c.item == item).collect();
        let activity: Vec<u64> = if on == On::Latch {
            latch.iter().filter_map(|c| c.replied).collect()
        } else {
            held.iter().flat_map(|h| [h.start, h.until]).collect()
        };
        check_polling(on, item, list, &activity, &ctx, report);
        if on == On::Latch {
            check_latch_wakes(item, list, &latch, &ctx, report);
        } else {
            let capacity = if on == On::Semaphore {
                harness.permits.get(&item).copied().unwrap_or(1)
            } else {
                1
            };
            check_wakes(on, item, list, held, ghosted, capacity, &ctx, report);
        }
        if matches!(on, On::Fair | On::Rw) {
            check_progress(on, item, list, held, ghosted, &ctx, report);
        }
    }
}

/// (j) on the waits of one item; `activity`: the moments its holders changed (or its latch was
/// answered), each a wake-up that explains an attempt.
fn check_polling(on: On, item: u32, waits: &[&Wait], activity: &[u64], ctx: &Context, report: &mut Report) {
    let masters = ctx.harness.masters.max(1) as f64;
    let mut examples = Vec::new();
    let stats = report.live.polling.entry(on).or_default();
    for w in waits {
        let Some(calls) = w.calls else { continue };
        let waited = w.ended.saturating_sub(w.sent);
        if !matches!(w.end, End::Granted | End::TimedOut) || waited < ns(POLL_MIN_WAIT) {
            continue;
        }
        if ctx.excluded(w.sent, w.ended) || !ctx.live(w.worker, w.sent, w.ended) {
            continue;
        }
        let wakeups = activity.iter().filter(|&&t| t > w.sent && t < w.ended).count() as f64;
        let secs = waited as f64 / 1e9;
        let per_master = calls as f64 / masters;
        let rate = per_master / secs;
        let unexplained = (per_master - 3.0 - 2.0 * wakeups).max(0.0) / secs;
        stats.judged += 1;
        stats.worst_rate = stats.worst_rate.max(rate);
        stats.worst_unexplained = stats.worst_unexplained.max(unexplained);
        if unexplained > POLL_BOUND {
            stats.polling += 1;
            examples.push(format!(
                "(j) {} {item}: worker {}'s wait from t={} of {} ms made {calls} calls ({rate:.1} per master per second) \
                 for {wakeups} changes of its holders: {unexplained:.1}/s unexplained",
                name(on),
                w.worker,
                w.sent,
                waited / 1_000_000,
            ));
        }
    }
    for example in examples {
        report.example(example);
    }
}

/// (k) on one lock, semaphore, read-write lock or fair lock.
#[allow(clippy::too_many_arguments)]
fn check_wakes(
    on: On,
    item: u32,
    waits: &[&Wait],
    holds: &[Hold],
    ghosts: &[Hold],
    capacity: u64,
    ctx: &Context,
    report: &mut Report,
) {
    let late = ns(LATE);
    let end = ctx.harness.end;
    let mut frees: Vec<u64> = holds
        .iter()
        .chain(ghosts)
        .map(|h| h.until)
        .filter(|&t| t.saturating_add(late) <= end)
        .collect();
    frees.sort_unstable();
    frees.dedup();
    let mut examples = Vec::new();
    let mut over = Vec::new();
    let stats = report.live.wakes.entry(on).or_default();
    for free_at in frees {
        let covers = |h: &&Hold| h.start <= free_at && free_at < h.until;
        let held: u64 = holds.iter().chain(ghosts).filter(covers).map(|h| h.permits).sum();
        if held >= capacity {
            continue;
        }
        let free = capacity - held;
        let waiter = waits.iter().find(|w| {
            w.sent < free_at
                && w.ended > free_at
                && w.deadline >= free_at + late
                && w.permits <= free
                && w.end != End::Failed
                && ctx.live(w.worker, free_at, free_at + late)
        });
        let Some(waiter) = waiter else { continue };
        // A fair lock goes to the head of its queue: a waiter ahead of this one whose worker is not
        // live (stopped, or settling after it woke: its timers and wake-ups are stale) holds the
        // queue up as a stalled holder would, and the fair lock promises its place until then.
        let stalled_ahead = on == On::Fair
            && waits.iter().any(|w| {
                w.sent < waiter.sent
                    && w.ended > free_at
                    && w.end != End::Failed
                    && !ctx.live(w.worker, free_at, free_at + late)
            });
        if stalled_ahead {
            stats.excused += 1;
            continue;
        }
        // The next grant: holds are sorted by start. An unrecorded grant (a ghost: its worker was
        // killed as it acquired) may be the next.
        let recorded = holds[holds.partition_point(|h| h.start <= free_at)..]
            .first()
            .map(|h| h.start);
        let unrecorded = ghosts.iter().map(|h| h.start).filter(|&t| t > free_at).min();
        let next = recorded.into_iter().chain(unrecorded).min();
        if ctx.excluded(free_at, next.unwrap_or(end).min(free_at + late)) {
            stats.excused += 1;
            continue;
        }
        let gap = next.unwrap_or(end) - free_at;
        stats.gaps_us.push(gap / 1000);
        let what = || {
            format!(
                "{} {item}: free at t={free_at} with worker {}'s waiter (sent {} ms before) live, next grant {}; \
                 faults from 5 s before: [{}]",
                name(on),
                waiter.worker,
                (free_at - waiter.sent) / 1_000_000,
                match next {
                    Some(t) => format!("at +{} ms", (t - free_at) / 1_000_000),
                    None => "never".to_string(),
                },
                ctx.harness
                    .faults_between(free_at.saturating_sub(5_000_000_000), free_at + gap, free_at),
            )
        };
        if gap > late {
            stats.late += 1;
            examples.push(format!("(k) {}", what()));
        } else if gap > ns(TARGET) {
            over.push((gap, format!("(k) over target: {}", what())));
        }
    }
    for example in examples {
        report.example(example);
    }
    for (gap, what) in over {
        report.live.over(gap, what);
    }
}

/// (k) on one latch: its openings and the waiters live at each.
fn check_latch_wakes(item: u32, waits: &[&Wait], calls: &[&LatchCall], ctx: &Context, report: &mut Report) {
    let late = ns(LATE);
    let end = ctx.harness.end;
    let answered = |c: &&&LatchCall, op: Op, reply: &str| c.op == op && c.reply.as_deref() == Some(reply);
    let rounds: Vec<&&LatchCall> = calls.iter().filter(|c| answered(c, Op::Set, "true")).collect();
    let mut examples = Vec::new();
    let mut over = Vec::new();
    let stats = report.live.wakes.entry(On::Latch).or_default();
    for round in &rounds {
        let armed = round.replied.expect("answered");
        // Open by then: a count down that read the round (sent after it was armed) and answered 0.
        let Some(opened) = calls
            .iter()
            .filter(|c| answered(c, Op::CountDown, "0") && c.sent > armed)
            .filter_map(|c| c.replied)
            .min()
        else {
            continue;
        };
        // Armed again no earlier than: the first other `set_count` that may have landed after it.
        let rearmed = calls
            .iter()
            .filter(|c| c.op == Op::Set && c.reply.as_deref() != Some("false"))
            .filter(|c| c.sent != round.sent && c.replied.unwrap_or(u64::MAX) >= armed)
            .map(|c| c.sent)
            .min()
            .unwrap_or(end);
        if rearmed <= opened || opened + late > end {
            continue;
        }
        for w in waits {
            if !(w.sent < opened
                && w.ended > opened
                && w.deadline >= opened + late
                && w.end != End::Failed
                && ctx.live(w.worker, opened, opened + late))
            {
                continue;
            }
            let returned = if w.end == End::Granted { w.ended } else { u64::MAX };
            // Back before the latch was armed again: when it saw it open. Else it slept at least
            // until then; judged only if that was long.
            let gap = if returned <= rearmed {
                returned - opened
            } else if rearmed - opened > late {
                rearmed.min(w.ended) - opened
            } else {
                continue;
            };
            if ctx.excluded(opened, opened + gap.min(late)) {
                stats.excused += 1;
                continue;
            }
            stats.gaps_us.push(gap / 1000);
            if gap > ns(TARGET) {
                let what = format!(
                    "latch {item}: open at t={opened} (armed again at +{} ms), worker {}'s waiter (sent {} ms \
                     before) returned at +{} ms",
                    (rearmed - opened) / 1_000_000,
                    w.worker,
                    (opened - w.sent) / 1_000_000,
                    (w.ended - opened) / 1_000_000,
                );
                over.push((gap, format!("(k) over target: {what}")));
            }
            if gap > late {
                stats.late += 1;
                examples.push(format!(
                    "(k) latch {item}: open at t={opened} (armed again at +{} ms), worker {}'s waiter (sent {} ms \
                     before) {}; faults from 5 s before: [{}]",
                    (rearmed - opened) / 1_000_000,
                    w.worker,
                    (opened - w.sent) / 1_000_000,
                    match w.end {
                        End::Granted => format!("returned at +{} ms", (w.ended - opened) / 1_000_000),
                        _ => format!("timed out at +{} ms", (w.ended - opened) / 1_000_000),
                    },
                    ctx.harness
                        .faults_between(opened.saturating_sub(5_000_000_000), opened + gap, opened),
                ));
            }
        }
    }
    for example in examples {
        report.example(example);
    }
    for (gap, what) in over {
        report.live.over(gap, what);
    }
}

/// (l) on one fair lock (any waiter) or read-write lock (writers).
fn check_progress(
    on: On,
    item: u32,
    waits: &[&Wait],
    holds: &[Hold],
    ghosts: &[Hold],
    ctx: &Context,
    report: &mut Report,
) {
    let end = ctx.harness.end;
    // (time, held, excluded, waiting) deltas.
    let mut deltas: Vec<(u64, i64, i64, i64)> = Vec::new();
    let mut span = |from: u64, to: u64, delta: (i64, i64, i64)| {
        let (from, to) = (from.min(end), to.min(end));
        if from < to {
            deltas.push((from, delta.0, delta.1, delta.2));
            deltas.push((to, -delta.0, -delta.1, -delta.2));
        }
    };
    for h in holds.iter().chain(ghosts) {
        span(h.start, h.until, (1, 0, 0));
    }
    for &(from, to) in &ctx.windows {
        span(from, to, (0, 1, 0));
    }
    for w in waits {
        let judged = on == On::Fair || !w.shared;
        let warm = ctx.warm.get(&w.worker).copied().unwrap_or(u64::MAX);
        if judged && w.end != End::Failed {
            span(w.sent.max(warm), w.ended.min(w.deadline), (0, 0, 1));
        }
    }
    deltas.sort_unstable_by_key(|d| d.0);
    let (mut held, mut excluded, mut waiting) = (0, 0, 0);
    let (mut longest, mut longest_from, mut from) = (0, 0, None);
    let mut i = 0;
    while i < deltas.len() {
        let t = deltas[i].0;
        while i < deltas.len() && deltas[i].0 == t {
            held += deltas[i].1;
            excluded += deltas[i].2;
            waiting += deltas[i].3;
            i += 1;
        }
        let stalled = held == 0 && excluded == 0 && waiting > 0;
        match (stalled, from) {
            (true, None) => from = Some(t),
            (false, Some(start)) => {
                if t - start > longest {
                    (longest, longest_from) = (t - start, start);
                }
                from = None;
            }
            _ => {}
        }
    }
    let stats = report.live.stalls.entry(on).or_default();
    stats.longest_ms = stats.longest_ms.max(longest / 1_000_000);
    let what = || {
        format!(
            "{} {item}: stood free from t={longest_from} with a live {} waiting for {} ms without a grant; \
             faults from 5 s before: [{}]",
            name(on),
            if on == On::Rw { "writer" } else { "waiter" },
            longest / 1_000_000,
            ctx.harness.faults_between(
                longest_from.saturating_sub(5_000_000_000),
                longest_from + longest,
                longest_from
            ),
        )
    };
    if longest >= ctx.lease {
        stats.stalled += 1;
        report.example(format!("(l) {}", what()));
    } else if longest > ns(LATE) {
        report
            .live
            .over(longest, format!("(l) over {} ms: {}", LATE.as_millis(), what()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{check, test_event as ev, Crash};

    const MS: u64 = 1_000_000;

    fn waiting(on: On, worker: u32, t: u64, shared: bool, permits: u64) -> Event {
        ev(
            worker,
            on,
            t,
            Kind::Waiting {
                wait_ms: 3000,
                shared,
                permits,
            },
        )
    }

    fn grant(on: On, worker: u32, t: u64) -> Event {
        let kind = match on {
            On::Semaphore => Kind::Permit {
                permits: 1,
                valid_ns: 2000 * MS,
            },
            _ => Kind::Grant {
                token: t,
                valid_ns: 2000 * MS,
            },
        };
        ev(worker, on, t, kind)
    }

    /// A hold's end: its release begins at `t` and is answered 1 ms later.
    fn release(on: On, worker: u32, t: u64) -> Vec<Event> {
        vec![
            ev(worker, on, t, Kind::Releasing),
            ev(worker, on, t + MS, Kind::Release("ok".into())),
        ]
    }

    fn harness() -> Harness {
        Harness {
            end: 20_000 * MS,
            lease_ns: 2000 * MS,
            liveness_ns: 3000 * MS,
            masters: 1,
            // Semaphore 0 has 1 permit, free at the end.
            permits: [(0, 1)].into(),
            permits_at_end: [(0, 1)].into(),
            ..Harness::default()
        }
    }

    /// The events in time order, each worker answered once first (at 0: a worker is judged once
    /// it has started, see `Context::warm`).
    fn sorted(mut events: Vec<Event>) -> Vec<Event> {
        let mut workers: Vec<u32> = events.iter().map(|e| e.worker).collect();
        workers.sort_unstable();
        workers.dedup();
        for worker in workers {
            let mut started = ev(worker, On::Lock, 0, Kind::Release("ok".into()));
            started.item = 99;
            events.push(started);
        }
        events.sort_by_key(|e| e.t);
        events
    }

    /// Worker 1 holds `on` 0 from 0 to 1000 ms; worker 2 waits from 100 ms and is granted at
    /// `granted`, having made `calls` calls.
    fn one_waiter(on: On, granted: u64, calls: u64) -> Vec<Event> {
        let mut events = vec![
            waiting(on, 1, 0, false, 1),
            grant(on, 1, MS),
            ev(1, on, 2 * MS, Kind::Calls(1)),
            waiting(on, 2, 100 * MS, false, 1),
            grant(on, 2, granted),
            ev(2, on, granted + 1, Kind::Calls(calls)),
        ];
        events.extend(release(on, 1, 1000 * MS));
        events.extend(release(on, 2, granted + 50 * MS));
        sorted(events)
    }

    #[test]
    fn the_checker_finds_a_waiter_that_polls() {
        for on in [On::Lock, On::Semaphore, On::Rw, On::Fair, On::Election] {
            // A wait of 1.9 s with one release in it: 5 calls are what its wake-ups explain.
            let report = check(&one_waiter(on, 2000 * MS, 5), &harness());
            let polling = &report.live.polling[&on];
            assert_eq!((polling.judged, polling.polling), (1, 0), "{on:?}: {report}");
            // 200 calls in the same wait: polling.
            let report = check(&one_waiter(on, 2000 * MS, 200), &harness());
            assert_eq!(report.live.polling[&on].polling, 1, "{on:?}: {report}");
            assert_eq!(report.violations(), 1, "{on:?}: {report}");
            // Not inside a fault window.
            let faulted = Harness {
                faults: vec![(500 * MS, 600 * MS)],
                ..harness()
            };
            let report = check(&one_waiter(on, 2000 * MS, 200), &faulted);
            assert_eq!(report.live.polling[&on].polling, 0, "{on:?}: {report}");
        }
        // A quorum's attempt asks every master: 5 masters, 5 times the calls.
        let quorum = Harness {
            masters: 5,
            ..harness()
        };
        let report = check(&one_waiter(On::Lock, 2000 * MS, 50), &quorum);
        assert_eq!(report.live.polling[&On::Lock].polling, 0, "{report}");
        let report = check(&one_waiter(On::Lock, 2000 * MS, 50), &harness());
        assert_eq!(report.live.polling[&On::Lock].polling, 1, "{report}");
        // Many changes of the holders explain many calls: 40 holds of others during the wait.
        let mut busy = one_waiter(On::Lock, 2000 * MS, 150);
        for i in 0..40 {
            let t = 1010 * MS + i * 20 * MS;
            busy.push(grant(On::Lock, 3, t));
            busy.extend(release(On::Lock, 3, t + 10 * MS));
        }
        let report = check(&sorted(busy), &harness());
        assert_eq!(report.live.polling[&On::Lock].polling, 0, "{report}");
        // A latch's waiter that polls: 300 calls in a 2 s wait that nothing answered.
        let latch = |calls| {
            sorted(vec![
                ev(
                    1,
                    On::Latch,
                    0,
                    Kind::Call {
                        op: Op::Wait,
                        arg: 2000,
                    },
                ),
                ev(1, On::Latch, 2000 * MS, Kind::Reply("false".into())),
                ev(1, On::Latch, 2000 * MS, Kind::Calls(calls)),
            ])
        };
        let report = check(&latch(300), &harness());
        assert_eq!(report.live.polling[&On::Latch].polling, 1, "{report}");
        let report = check(&latch(2), &harness());
        assert_eq!(report.violations(), 0, "{report}");
    }

    #[test]
    fn a_fair_queue_held_up_by_a_stopped_waiter_ahead_is_excused() {
        // Worker 3, stopped from 200 to 900 ms, queues as it wakes (its place kept from before),
        // and worker 2 behind it. The lock is freed at 1001 ms; worker 3, within the settle time
        // after it woke, is granted only at 2.5 s, worker 2 after it.
        let history = |on: On| {
            let mut events = vec![
                waiting(on, 1, 0, false, 1),
                grant(on, 1, MS),
                waiting(on, 3, 950 * MS, false, 1),
                waiting(on, 2, 960 * MS, false, 1),
                grant(on, 3, 2500 * MS),
                grant(on, 2, 2650 * MS),
            ];
            events.extend(release(on, 1, 1000 * MS));
            events.extend(release(on, 3, 2600 * MS));
            events.extend(release(on, 2, 2700 * MS));
            sorted(events)
        };
        let stopped = Harness {
            faults: vec![(200 * MS, 900 * MS)],
            crashes: vec![Crash {
                worker: 3,
                t: 200 * MS,
                items: Vec::new(),
                killed: false,
            }],
            ..harness()
        };
        // A fair lock keeps the stopped waiter's place: the queue waits for it, as promised.
        let report = check(&history(On::Fair), &stopped);
        let wakes = &report.live.wakes[&On::Fair];
        assert_eq!((wakes.late, wakes.excused), (0, 1), "{report}");
        // A plain lock promises no place: its free lock waited on by a live waiter is late.
        let report = check(&history(On::Lock), &stopped);
        assert_eq!(report.live.wakes[&On::Lock].late, 1, "{report}");
    }

    #[test]
    fn the_checker_finds_a_waiter_granted_late() {
        for on in [On::Lock, On::Semaphore, On::Rw, On::Fair, On::Election] {
            // Freed at 1001 ms (the release's answer), granted 20 ms later: fine.
            let report = check(&one_waiter(on, 1021 * MS, 3), &harness());
            let wakes = &report.live.wakes[&on];
            assert_eq!(
                (wakes.gaps_us.clone(), wakes.late),
                (vec![20_000], 0),
                "{on:?}: {report}"
            );
            assert_eq!(report.violations(), 0, "{on:?}: {report}");
            // Granted 1.5 s later: late.
            let report = check(&one_waiter(on, 2501 * MS, 3), &harness());
            assert_eq!(report.live.wakes[&on].late, 1, "{on:?}: {report}");
            // A fault in between excuses it.
            let faulted = Harness {
                faults: vec![(1200 * MS, 1300 * MS)],
                ..harness()
            };
            let report = check(&one_waiter(on, 2501 * MS, 3), &faulted);
            let wakes = &report.live.wakes[&on];
            assert_eq!((wakes.late, wakes.excused), (0, 1), "{on:?}: {report}");
            // So does a waiter whose worker was stopped then: not live.
            let stopped = Harness {
                faults: vec![(900 * MS, 3500 * MS)],
                crashes: vec![Crash {
                    worker: 2,
                    t: 900 * MS,
                    items: Vec::new(),
                    killed: false,
                }],
                ..harness()
            };
            let report = check(&one_waiter(on, 2501 * MS, 3), &stopped);
            assert_eq!(report.live.wakes[&on].late, 0, "{on:?}: {report}");
        }
        // A killed holder's lock is free a lease (and the slack) after the kill: judged from then.
        let killed = |granted: u64| {
            sorted(vec![
                waiting(On::Lock, 1, 0, false, 1),
                grant(On::Lock, 1, MS),
                waiting(On::Lock, 2, 1000 * MS, false, 1),
                grant(On::Lock, 2, granted),
            ])
        };
        let crash = Harness {
            faults: vec![(500 * MS, 510 * MS)],
            crashes: vec![Crash {
                worker: 1,
                t: 500 * MS,
                items: vec![(On::Lock, 0)],
                killed: true,
            }],
            ..harness()
        };
        let report = check(&killed(2650 * MS), &crash);
        assert_eq!(report.live.wakes[&On::Lock].gaps_us, vec![50_000], "{report}");
        let report = check(&killed(3900 * MS), &crash);
        assert_eq!(report.live.wakes[&On::Lock].late, 1, "{report}");
        // A holder releases at 1000 ms and asks again at 1003 ms, as the nemesis (from 1002 ms)
        // kills it; the kill lands by 1010 ms. Its new request may have been granted unrecorded:
        // the lock is judged free again a lease after the kill, not at the release.
        let mut events = vec![
            waiting(On::Lock, 1, 0, false, 1),
            grant(On::Lock, 1, MS),
            waiting(On::Lock, 2, 500 * MS, false, 1),
            waiting(On::Lock, 1, 1003 * MS, false, 1),
            grant(On::Lock, 2, 3100 * MS),
        ];
        events.extend(release(On::Lock, 1, 1000 * MS));
        let late_kill = Harness {
            faults: vec![(1002 * MS, 1010 * MS)],
            crashes: vec![Crash {
                worker: 1,
                t: 1002 * MS,
                items: vec![(On::Lock, 0)],
                killed: true,
            }],
            ..harness()
        };
        let report = check(&sorted(events.clone()), &late_kill);
        assert_eq!(report.live.wakes[&On::Lock].late, 0, "{report}");
        // Had the kill landed before the request, the free lock waited on would be late.
        let early_kill = Harness {
            faults: vec![(1002 * MS, 1002 * MS)],
            ..late_kill
        };
        let report = check(&sorted(events), &early_kill);
        assert_eq!(report.live.wakes[&On::Lock].late, 1, "{report}");
        // A semaphore of 3 permits, all held: a release of 2 frees 2; a waiter for 2 is judged, one
        // for 3 is not.
        let semaphore = |wanted: u64| {
            let mut events = vec![
                ev(
                    3,
                    On::Semaphore,
                    50 * MS,
                    Kind::Permit {
                        permits: 1,
                        valid_ns: 2000 * MS,
                    },
                ),
                ev(
                    1,
                    On::Semaphore,
                    0,
                    Kind::Permit {
                        permits: 2,
                        valid_ns: 2000 * MS,
                    },
                ),
                waiting(On::Semaphore, 2, 100 * MS, false, wanted),
                ev(2, On::Semaphore, 2900 * MS, Kind::Busy),
            ];
            events.extend(release(On::Semaphore, 1, 1000 * MS));
            sorted(events)
        };
        let permits = Harness {
            permits: [(0, 3)].into(),
            permits_at_end: [(0, 3)].into(),
            ..harness()
        };
        let report = check(&semaphore(2), &permits);
        assert_eq!(report.live.wakes[&On::Semaphore].late, 1, "{report}");
        let report = check(&semaphore(3), &permits);
        assert_eq!(report.live.wakes[&On::Semaphore].late, 0, "{report}");
        // A fair lock's fixed lease ends without a release: free at its end.
        let fixed = |granted: u64| {
            let mut events = vec![
                waiting(On::Fair, 1, 0, false, 1),
                grant(On::Fair, 1, MS),
                waiting(On::Fair, 2, 100 * MS, false, 1),
                grant(On::Fair, 2, granted),
            ];
            events.extend(release(On::Fair, 1, 1000 * MS));
            for e in &mut events {
                if e.worker == 1 {
                    e.task = crate::rw::FIXED_FAIR_TASK;
                }
            }
            sorted(events)
        };
        let report = check(&fixed(500 * MS), &harness());
        assert_eq!(report.live.wakes[&On::Fair].gaps_us, vec![99_000], "{report}");
        let report = check(&fixed(1500 * MS), &harness());
        assert_eq!(report.live.wakes[&On::Fair].late, 1, "{report}");
        // A read-write lock: writer 3 waits from 50 ms and is killed at 500 ms; writer 4 waits from
        // 600 ms to its grant at 1010 ms, renewing the waiting writers' hash (and so writer 3's
        // mark) until then: readers may be held back until a lease after 1010 ms. Reader 2 (from
        // 1500 ms) granted at 3700 ms is 590 ms after that; had 4 been a reader, 3's mark would
        // have ended a lease after its kill, and the same grant would be 1.1 s late.
        let marked = |writer: bool| {
            let mut events = vec![
                waiting(On::Rw, 1, 0, false, 1),
                grant(On::Rw, 1, MS),
                waiting(On::Rw, 3, 50 * MS, false, 1),
                waiting(On::Rw, 4, 600 * MS, !writer, 1),
                if writer {
                    grant(On::Rw, 4, 1010 * MS)
                } else {
                    ev(4, On::Rw, 1010 * MS, Kind::Shared { valid_ns: 2000 * MS })
                },
                waiting(On::Rw, 2, 1500 * MS, true, 1),
                ev(2, On::Rw, 3700 * MS, Kind::Shared { valid_ns: 2000 * MS }),
            ];
            events.extend(release(On::Rw, 1, 1000 * MS));
            events.extend(release(On::Rw, 4, 1050 * MS));
            sorted(events)
        };
        let killed = Harness {
            faults: vec![(500 * MS, 510 * MS)],
            crashes: vec![Crash {
                worker: 3,
                t: 500 * MS,
                items: Vec::new(),
                killed: true,
            }],
            ..harness()
        };
        let report = check(&marked(true), &killed);
        let wakes = &report.live.wakes[&On::Rw];
        assert_eq!(
            (wakes.gaps_us.clone(), wakes.late),
            (vec![590_000], 0),
            "{report}"
        );
        let report = check(&marked(false), &killed);
        assert_eq!(report.live.wakes[&On::Rw].late, 1, "{report}");
    }

    #[test]
    fn the_checker_finds_a_latch_waiter_that_overslept() {
        let call = |worker, t, op, arg| ev(worker, On::Latch, t, Kind::Call { op, arg });
        let reply = |worker, t, reply: &str| ev(worker, On::Latch, t, Kind::Reply(reply.into()));
        // A round of 1 armed at 0; a waiter from 10 ms; the count down answers 0 at 100 ms; armed
        // again at `rearmed`; the waiter returns at `returned`.
        let history = |returned: u64, outcome: &str, rearmed: u64| {
            sorted(vec![
                call(1, 0, Op::Set, 1),
                reply(1, MS, "true"),
                call(2, 10 * MS, Op::Wait, 3000),
                call(3, 50 * MS, Op::CountDown, 0),
                reply(3, 100 * MS, "0"),
                reply(2, returned, outcome),
                call(1, rearmed, Op::Set, 2),
                reply(1, rearmed + MS, "true"),
            ])
        };
        let report = check(&history(105 * MS, "true", 3000 * MS), &harness());
        let wakes = &report.live.wakes[&On::Latch];
        assert_eq!((wakes.gaps_us.clone(), wakes.late), (vec![5000], 0), "{report}");
        // Back 1.5 s after it opened, the latch open all along: late.
        let report = check(&history(1600 * MS, "true", 3000 * MS), &harness());
        assert_eq!(report.live.wakes[&On::Latch].late, 1, "{report}");
        // Timed out though it opened 3 s before: late.
        let report = check(&history(3010 * MS, "false", 4000 * MS), &harness());
        assert_eq!(report.live.wakes[&On::Latch].late, 1, "{report}");
        // Armed again 50 ms after it opened: a waiter that slept through cannot be judged.
        let report = check(&history(3010 * MS, "false", 150 * MS), &harness());
        assert_eq!(report.live.wakes[&On::Latch].late, 0, "{report}");
    }

    #[test]
    fn the_checker_finds_a_queue_that_stalled() {
        // A fair lock free from 1001 ms; a waiter from 100 ms times out at 3100 ms: 2.1 s free.
        let stalled = |on: On, shared: bool| {
            let mut events = vec![
                waiting(on, 1, 0, false, 1),
                grant(on, 1, MS),
                waiting(on, 2, 100 * MS, shared, 1),
                ev(2, on, 3100 * MS, Kind::Busy),
            ];
            events.extend(release(on, 1, 1000 * MS));
            sorted(events)
        };
        let report = check(&stalled(On::Fair, false), &harness());
        let stalls = &report.live.stalls[&On::Fair];
        assert_eq!((stalls.longest_ms, stalls.stalled), (2099, 1), "{report}");
        let report = check(&stalled(On::Rw, false), &harness());
        assert_eq!(report.live.stalls[&On::Rw].stalled, 1, "{report}");
        // A waiting reader is not (l)'s (its (k) is late all the same).
        let report = check(&stalled(On::Rw, true), &harness());
        assert_eq!(report.live.stalls[&On::Rw].stalled, 0, "{report}");
        // Held until 1500 ms: free 1.6 s, under a lease.
        let mut held = stalled(On::Fair, false);
        for e in &mut held {
            if e.worker == 1 && e.t >= 1000 * MS {
                e.t += 500 * MS;
            }
        }
        let report = check(&sorted(held), &harness());
        assert_eq!(report.live.stalls[&On::Fair].stalled, 0, "{report}");
        // A killed waiter's place stays a lease: the queue waits behind it.
        let mut dead = stalled(On::Fair, false);
        dead.push(waiting(On::Fair, 3, 50 * MS, false, 1));
        let killed = Harness {
            crashes: vec![Crash {
                worker: 3,
                t: 900 * MS,
                items: Vec::new(),
                killed: true,
            }],
            ..harness()
        };
        let report = check(&sorted(dead), &killed);
        assert_eq!(report.live.stalls[&On::Fair].stalled, 0, "{report}");
        // A granted waiter: no stall.
        let report = check(&one_waiter(On::Fair, 1021 * MS, 3), &harness());
        assert_eq!(report.live.stalls[&On::Fair].stalled, 0, "{report}");
        assert_eq!(report.violations(), 0, "{report}");
    }
}
