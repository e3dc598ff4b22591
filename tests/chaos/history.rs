//! The history of a chaos run and its checker.
//!
//! Workers print one line per event, stamped on `CLOCK_MONOTONIC`, which every process of this host
//! shares: that is the one clock of the run. The harness adds what it did (crashes of holders,
//! faults outside the guarantees). The checker rebuilds every critical section from the lines and
//! reports (a) overlaps of sections whose lease was still valid, by the library's own `validity()`,
//! (b) overlaps of sections past their lease and whether fencing caught them, (c) oversell and lost
//! updates in the store, (d) how long locks of crashed holders took to be granted again. The lines
//! of the semaphore and latch workloads are checked in `family.rs`, those of the read-write and
//! fair locks in `rw.rs`; every primitive's waiters' liveness, (j) to (l), in `liveness.rs`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Nanoseconds on `CLOCK_MONOTONIC`, the same clock in every process of the host.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the fenced store said to one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// Done, as the `seq`-th operation on the item; the stock read or written.
    Accepted { seq: u64, value: i64 },
    /// Refused: the item's fence was already at this higher token.
    Rejected { fence: u64 },
    /// No answer.
    Failed,
}

impl fmt::Display for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Store::Accepted { seq, value } => write!(f, "ok {seq} {value}"),
            Store::Rejected { fence } => write!(f, "stale {fence}"),
            Store::Failed => write!(f, "fail"),
        }
    }
}

/// Which primitive a line is about: its item is a lock, a semaphore or a latch of that number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum On {
    Lock,
    Semaphore,
    Latch,
    /// A read-write lock (`rw.rs`).
    Rw,
    /// A fair lock (`rw.rs`).
    Fair,
    /// An election's leadership (`election.rs`).
    Election,
}

impl On {
    /// Written before the item's number (nothing for a lock, so that lock lines read as before).
    pub fn tag(self) -> &'static str {
        match self {
            On::Lock => "",
            On::Semaphore => "s",
            On::Latch => "l",
            On::Rw => "w",
            On::Fair => "f",
            On::Election => "e",
        }
    }
}

/// A latch call, written when it is sent (its `Reply` follows on the task's next line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `set_count(arg)`.
    Set,
    /// `count_down()`.
    CountDown,
    /// `wait_for(arg ms)`.
    Wait,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Set => "set",
            Op::CountDown => "down",
            Op::Wait => "wait",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// The lock was granted; `valid_ns` is `validity()` read right after `t`.
    Grant { token: u64, valid_ns: u64 },
    /// The wait bound passed without a grant.
    Busy,
    /// The acquisition failed with an error.
    Error(String),
    /// A fenced read, and the validity read right after `t`, before it was sent.
    Read { valid_ns: u64, store: Store },
    /// A fenced write of the stock read minus one, and the validity right after `t`.
    Write { valid_ns: u64, store: Store },
    /// `until_lost` stopped the work: the lease was lost.
    Lost,
    /// The guard's release begins at `t`: written before the release is awaited, so that a holder
    /// killed while its release is on the way (already freeing the lock for others) still says where
    /// its section ended.
    Releasing,
    /// The outcome of the release that began at the task's `Releasing` line, stamped when its reply
    /// came back (`t`): `ok`, `notheld` or `err:...`.
    Release(String),
    /// Semaphore: `permits` permits were granted; `valid_ns` is `validity()` read right after `t`.
    /// `Busy`, `Error`, `Lost`, `Releasing` and `Release` follow as for a lock.
    Permit { permits: u64, valid_ns: u64 },
    /// Semaphore: the holder's `validity()` at `t`, read in the middle of its hold.
    Holding { valid_ns: u64 },
    /// Latch: a call sent at `t` (`t` is read before the call leaves).
    Call { op: Op, arg: u64 },
    /// Latch: the reply to the task's last call, received at `t`: `true`/`false` (set, wait), the
    /// count left (count down), or `err:...`.
    Reply(String),
    /// Read-write lock: the read side was granted; `valid_ns` is `validity()` read right after `t`.
    /// (The write side's grant is a `Grant`, with its fencing token.)
    Shared { valid_ns: u64 },
    /// Lock, semaphore, fair or read-write lock: an acquisition bounded by `wait_ms` begins at `t`
    /// (`t` read before it is sent), of a read side (`shared`) or an exclusive one, for `permits`
    /// permits (1 but for a semaphore); its `Grant`, `Permit`, `Shared`, `Busy` or `Error` follows
    /// on the task's next line.
    Waiting {
        wait_ms: u64,
        shared: bool,
        permits: u64,
    },
    /// A guarded write (`LockGuard::atomically`) of the holder with `token`, sent at `t`:
    /// `applied`, `declined`, `lost` (refused: the hold was not current) or `err:...`.
    Guarded { token: u64, outcome: String },
    /// The Redis calls the task's last acquisition (or latch wait) sent from its own task while it
    /// ran (`relock_redis_calls_total`, counted per task: see `worker::counted`), written right after
    /// its outcome line.
    Calls(u64),
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub worker: u32,
    pub task: u32,
    pub on: On,
    pub item: u32,
    pub t: u64,
    pub kind: Kind,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EV {} {} {}{} {} ",
            self.worker,
            self.task,
            self.on.tag(),
            self.item,
            self.t
        )?;
        match &self.kind {
            Kind::Grant { token, valid_ns } => write!(f, "grant {token} {valid_ns}"),
            Kind::Busy => write!(f, "busy"),
            Kind::Error(what) => write!(f, "err {what}"),
            Kind::Read { valid_ns, store } => write!(f, "read {valid_ns} {store}"),
            Kind::Write { valid_ns, store } => write!(f, "write {valid_ns} {store}"),
            Kind::Lost => write!(f, "lost"),
            Kind::Releasing => write!(f, "releasing"),
            Kind::Release(outcome) => write!(f, "rel {outcome}"),
            Kind::Permit { permits, valid_ns } => write!(f, "permit {permits} {valid_ns}"),
            Kind::Holding { valid_ns } => write!(f, "holding {valid_ns}"),
            Kind::Call { op, arg } => write!(f, "call {} {arg}", op.name()),
            Kind::Reply(outcome) => write!(f, "reply {outcome}"),
            Kind::Shared { valid_ns } => write!(f, "shared {valid_ns}"),
            Kind::Waiting {
                wait_ms,
                shared,
                permits,
            } => {
                write!(f, "waiting {wait_ms} {}", if *shared { "r" } else { "x" })?;
                if *permits != 1 {
                    write!(f, " {permits}")?;
                }
                Ok(())
            }
            Kind::Calls(calls) => write!(f, "calls {calls}"),
            Kind::Guarded { token, outcome } => write!(f, "guarded {token} {outcome}"),
        }
    }
}

impl Event {
    /// Parses a line printed by `Display` (anything may precede `EV `: libtest prints there).
    pub fn parse(line: &str) -> Option<Event> {
        let at = line.find("EV ")?;
        let mut words = line[at + 3..].split_whitespace();
        let (worker, task) = (words.next()?.parse().ok()?, words.next()?.parse().ok()?);
        let item = words.next()?;
        let (on, item) = match item.as_bytes().first() {
            Some(b's') => (On::Semaphore, &item[1..]),
            Some(b'l') => (On::Latch, &item[1..]),
            Some(b'w') => (On::Rw, &item[1..]),
            Some(b'f') => (On::Fair, &item[1..]),
            Some(b'e') => (On::Election, &item[1..]),
            _ => (On::Lock, item),
        };
        let item = item.parse().ok()?;
        let t = words.next()?.parse().ok()?;
        let mut words = line[at + 3..].split_whitespace().skip(4);
        let kind = words.next()?;
        let rest: Vec<&str> = words.collect();
        let n = |i: usize| rest.get(i).and_then(|w| w.parse::<u64>().ok());
        let store = |i: usize| match rest.get(i).copied() {
            Some("ok") => Some(Store::Accepted {
                seq: n(i + 1)?,
                value: rest.get(i + 2)?.parse().ok()?,
            }),
            Some("stale") => Some(Store::Rejected { fence: n(i + 1)? }),
            Some("fail") => Some(Store::Failed),
            _ => None,
        };
        let kind = match kind {
            "grant" => Kind::Grant {
                token: n(0)?,
                valid_ns: n(1)?,
            },
            "busy" => Kind::Busy,
            "err" => Kind::Error(rest.join(" ")),
            "read" => Kind::Read {
                valid_ns: n(0)?,
                store: store(1)?,
            },
            "write" => Kind::Write {
                valid_ns: n(0)?,
                store: store(1)?,
            },
            "lost" => Kind::Lost,
            "releasing" => Kind::Releasing,
            "rel" => Kind::Release(rest.join(" ")),
            "permit" => Kind::Permit {
                permits: n(0)?,
                valid_ns: n(1)?,
            },
            "holding" => Kind::Holding { valid_ns: n(0)? },
            "call" => Kind::Call {
                op: [Op::Set, Op::CountDown, Op::Wait]
                    .into_iter()
                    .find(|op| Some(op.name()) == rest.first().copied())?,
                arg: n(1)?,
            },
            "reply" => Kind::Reply(rest.join(" ")),
            "shared" => Kind::Shared { valid_ns: n(0)? },
            "waiting" => Kind::Waiting {
                wait_ms: n(0)?,
                shared: *rest.get(1)? == "r",
                permits: n(2).unwrap_or(1),
            },
            "calls" => Kind::Calls(n(0)?),
            "guarded" => Kind::Guarded {
                token: n(0)?,
                outcome: rest.get(1..)?.join(" "),
            },
            _ => return None,
        };
        Some(Event {
            worker,
            task,
            on,
            item,
            t,
            kind,
        })
    }
}

/// A holder that crashed (SIGKILL) or stalled past its lease (SIGSTOP) while holding `items`
/// (locks, or semaphores it had permits of).
#[derive(Debug, Clone)]
pub struct Crash {
    pub worker: u32,
    pub t: u64,
    pub items: Vec<(On, u32)>,
    /// Whether the process was killed (its open sections end here) or only stopped.
    pub killed: bool,
}

/// A line of `worker`'s (task 0, item 0), for the checkers' tests.
#[cfg(test)]
pub fn test_event(worker: u32, on: On, t: u64, kind: Kind) -> Event {
    Event {
        worker,
        task: 0,
        on,
        item: 0,
        t,
        kind,
    }
}

/// What the harness adds to the workers' lines.
#[derive(Debug, Default)]
pub struct Harness {
    pub crashes: Vec<Crash>,
    /// Windows `[from, to]` after faults that the guarantees do not cover (a Redis that lost its
    /// data): overlaps that begin inside one are counted apart.
    pub unprotected: Vec<(u64, u64)>,
    /// Windows after failovers that the locks' synced writes survive and the semaphore's and the
    /// latch's writes (which wait for no replica) may not: counted apart by those two checks only.
    pub unsynced: Vec<(u64, u64)>,
    /// When the workers were told to stop (sections still open end here).
    pub end: u64,
    pub initial_stock: i64,
    /// Per item, the stock in the store at the end and the sales the store accepted.
    pub final_stock: HashMap<u32, (i64, i64)>,
    /// The liveness bound: lease + 1 s.
    pub liveness_ns: u64,
    /// The lease (`watchdog_timeout`): a crashed holder's hold, a failed release's, a dead waiter's
    /// mark run out within it. The bound of (l).
    pub lease_ns: u64,
    /// The masters an attempt asks (5 with `MultiLock`, else 1): (j) counts calls per master.
    pub masters: u64,
    /// Per semaphore, its number of permits.
    pub permits: BTreeMap<u32, u64>,
    /// Per semaphore, the permits `available()` reported once every holder had stopped and a lease
    /// had passed (a crashed holder's permits must be back by then).
    pub permits_at_end: BTreeMap<u32, u64>,
    /// Every fault the nemesis injected, `[from, to]`: from its start until it was healed (a
    /// crashed holder: until it was killed, or woken); and every unplanned failover it noticed.
    /// The fair lock's order is judged outside them.
    pub faults: Vec<(u64, u64)>,
    /// Every fault, injected or noticed: its window (as in `faults`) and its name, what a finding's
    /// report lists.
    pub fault_names: Vec<(u64, u64, &'static str)>,
}

impl Harness {
    /// Whether `t` falls in a window after a fault the guarantees do not cover.
    pub fn unprotected_at(&self, t: u64) -> bool {
        self.unprotected
            .iter()
            .any(|(from, to)| (*from..=*to).contains(&t))
    }

    /// The faults that began in `[from, to]`, one per item: its name and its window, in ms from
    /// `origin`.
    pub fn faults_between(&self, from: u64, to: u64, origin: u64) -> String {
        let ms = |t: u64| (t as i64 - origin as i64) / 1_000_000;
        let faults: Vec<String> = self
            .fault_names
            .iter()
            .filter(|(start, _, _)| (from..=to).contains(start))
            .map(|&(start, end, name)| format!("{name} {:+}..{:+} ms", ms(start), ms(end)))
            .collect();
        faults.join(", ")
    }

    /// The windows after faults that writes waiting for no replica may not survive: the
    /// unprotected ones and the unsynced ones.
    pub fn unsynced_windows(&self) -> impl Iterator<Item = &(u64, u64)> {
        self.unprotected.iter().chain(&self.unsynced)
    }
}

/// One owner's possession of one lock (or of permits of one semaphore), rebuilt from the history.
#[derive(Debug, Clone)]
pub struct Section {
    pub worker: u32,
    pub task: u32,
    pub item: u32,
    token: u64,
    /// 1 for a lock; the permits held for a semaphore.
    pub permits: u64,
    /// A read-write lock's read side (shared with other readers).
    pub shared: bool,
    pub start: u64,
    /// Release, loss, crash or the end of the run.
    pub end: u64,
    /// The last moment the library still called the lease valid.
    pub valid_end: u64,
    /// Its release failed (a timeout, a dropped connection): the hold may have stayed in Redis
    /// until its lease ran out.
    pub release_failed: bool,
    /// When its release's answer (`ok` or `notheld`) came back: the hold was gone from Redis by then.
    pub released: Option<u64>,
    /// The fenced reads (false) and writes (true), in order.
    ops: Vec<(bool, Store)>,
}

/// The counts of one run.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub acquisitions: u64,
    pub grants: u64,
    pub busy: u64,
    pub errors: u64,
    pub writes_accepted: u64,
    pub stale_rejected: u64,
    /// (a) inside the guarantees: must be zero.
    pub valid_overlaps: u64,
    /// (a) after a fault outside the guarantees.
    pub valid_overlaps_unprotected: u64,
    /// (b) sections that ran on past their lease into another holder's section.
    pub expired_overlaps: u64,
    /// (b) accepted writes whose token was below one the store had already seen: must be zero.
    pub stale_accepted: u64,
    /// (b) holders whose token was not above that of every holder that ended before they began:
    /// must be zero (tokens strictly increase across successive holders).
    pub token_regressions: u64,
    /// (b) the same for holders whose section began in a window after a fault outside the
    /// guarantees: a grant made before a restart that lost the lock, its reply read after others
    /// had drawn larger tokens from the restarted server (the fenced store still rejects it).
    pub token_regressions_unprotected: u64,
    /// (b) the same for sections whose lease had run out before they began (their grant recorded
    /// late: see `check_tokens`).
    pub token_regressions_expired: u64,
    /// (c) sales beyond the stock that left the store.
    pub oversell: u64,
    /// (c) accepted writes that overwrote another section's accepted write.
    pub lost_updates: u64,
    /// (c) guarded writes: applied, and refused because the hold was no longer current.
    pub guarded: crate::guarded::GuardedReport,
    /// (d) crashes of holders, and how many were not followed by a grant within the bound.
    pub crashes: u64,
    pub liveness_misses: u64,
    pub worst_regrant_ms: u64,
    /// (e) keys left behind on the lock servers.
    pub keys_left: u64,
    /// (f), (g) the semaphore's and the latch's checks.
    pub family: crate::family::FamilyReport,
    /// (h), (i) the read-write lock's and the fair lock's checks.
    pub rw: crate::rw::RwReport,
    /// Elections: at most one valid leader at a time, and terms that rise.
    pub election: crate::election::ElectionReport,
    /// (j), (k), (l) the waiters' liveness, of every primitive.
    pub live: crate::liveness::LivenessReport,
    pub examples: Vec<String>,
    /// Liveness findings (not violations), listed after the examples: kept apart so that they never
    /// crowd a violation's example out.
    pub findings: Vec<String>,
}

impl Report {
    pub fn violations(&self) -> u64 {
        self.valid_overlaps
            + self.stale_accepted
            + self.token_regressions
            + self.oversell
            + self.lost_updates
            + self.guarded.outside
            + self.liveness_misses
            + self.keys_left
            + self.family.violations()
            + self.rw.violations()
            + self.election.violations()
            + self.live.violations()
    }

    pub fn example(&mut self, what: String) {
        if self.examples.len() < 10 {
            self.examples.push(what);
        }
    }

    /// A liveness finding (see [`findings`](Report::findings)), the first 5 kept.
    pub fn finding(&mut self, what: String) {
        if self.findings.len() < 5 {
            self.findings.push(what);
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A run of the semaphore and latch workloads alone leaves out the lock's (a) to (d).
        if (self.family.is_empty() && self.rw.is_empty()) || self.acquisitions > 0 {
            self.fmt_locks(f)?;
        } else {
            write!(f, "holder crashes {}; ", self.crashes)?;
        }
        if !self.family.is_empty() {
            write!(f, "{}; ", self.family)?;
        }
        if !self.rw.is_empty() {
            write!(f, "{}; ", self.rw)?;
        }
        if self.election.campaigns > 0 {
            write!(f, "{}; ", self.election)?;
        }
        write!(f, "{}; ", self.live)?;
        write!(
            f,
            "(e) keys left {}; violations: {}",
            self.keys_left,
            self.violations()
        )
    }
}

impl Report {
    fn fmt_locks(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ops {} (granted {}, timed out {}, errors {}, writes accepted {}, stale rejected {}); \
             (a) valid overlaps {} (+{} after faults outside the guarantees); \
             (b) sections past their lease overlapping another {}, stale writes accepted {}, tokens not increasing {} (+{} after faults outside the guarantees, +{} by holders expired when they began); \
             (c) oversell {}, lost updates {}, {}; \
             (d) holder crashes {}, regranted late {}, worst {} ms; ",
            self.acquisitions,
            self.grants,
            self.busy,
            self.errors,
            self.writes_accepted,
            self.stale_rejected,
            self.valid_overlaps,
            self.valid_overlaps_unprotected,
            self.expired_overlaps,
            self.stale_accepted,
            self.token_regressions,
            self.token_regressions_unprotected,
            self.token_regressions_expired,
            self.oversell,
            self.lost_updates,
            self.guarded,
            self.crashes,
            self.liveness_misses,
            self.worst_regrant_ms,
        )
    }
}

/// Rebuilds the sections (events of one worker task are in order) and checks them.
pub fn check(events: &[Event], harness: &Harness) -> Report {
    let mut report = Report::default();
    let locks: Vec<Event> = events.iter().filter(|e| e.on == On::Lock).cloned().collect();
    let sections = sections(&locks, harness, &mut report);
    check_overlaps(&sections, harness, &mut report);
    check_tokens(&sections, harness, &mut report);
    check_store(&sections, harness, &mut report);
    crate::guarded::check(&locks, harness, &mut report);
    check_liveness(&locks, harness, &mut report);
    crate::family::check(events, harness, &mut report);
    crate::rw::check(events, harness, &mut report);
    crate::election::check(events, harness, &mut report);
    crate::liveness::check(events, harness, &mut report);
    report
}

/// The sections of `events` (of one primitive), counting the acquisitions into `report`.
pub fn sections(events: &[Event], harness: &Harness, report: &mut Report) -> Vec<Section> {
    let kill_of = |worker: u32| {
        harness
            .crashes
            .iter()
            .find(|c| c.killed && c.worker == worker)
            .map(|c| c.t)
    };
    let mut open: HashMap<(u32, u32), Section> = HashMap::new();
    let mut done = Vec::new();
    // Per task, its section that a release closed last (the release's outcome comes after).
    let mut released: HashMap<(u32, u32), usize> = HashMap::new();
    let close = |mut s: Section, end: u64, done: &mut Vec<Section>| {
        s.end = end.max(s.start);
        s.valid_end = s.valid_end.min(s.end);
        done.push(s);
    };
    for ev in events {
        let key = (ev.worker, ev.task);
        // A positive validity says the lease holds until `t + validity`; a validity of zero says the
        // library had given the lease up by `t` (ran out, or found lost early): the section's valid
        // part ends there, whatever earlier claims promised.
        let claim = |s: &mut Section, valid_ns: u64| {
            if valid_ns > 0 {
                s.valid_end = s.valid_end.max(ev.t + valid_ns);
            } else {
                s.valid_end = s.valid_end.min(ev.t);
            }
        };
        match &ev.kind {
            // A grant opens a section: a lock's (with its token), permits, or a shared read.
            Kind::Grant { .. } | Kind::Permit { .. } | Kind::Shared { .. } => {
                let (token, permits, shared, valid_ns) = match ev.kind {
                    Kind::Grant { token, valid_ns } => (token, 1, false, valid_ns),
                    Kind::Permit { permits, valid_ns } => (0, permits, false, valid_ns),
                    Kind::Shared { valid_ns } => (0, 1, true, valid_ns),
                    _ => unreachable!("matched above"),
                };
                report.acquisitions += 1;
                report.grants += 1;
                if let Some(stale) = open.remove(&key) {
                    close(stale, ev.t, &mut done);
                }
                open.insert(
                    key,
                    Section {
                        worker: ev.worker,
                        task: ev.task,
                        item: ev.item,
                        token,
                        permits,
                        shared,
                        start: ev.t,
                        end: u64::MAX,
                        valid_end: ev.t + valid_ns,
                        release_failed: false,
                        released: None,
                        ops: Vec::new(),
                    },
                );
            }
            Kind::Holding { valid_ns } => {
                if let Some(s) = open.get_mut(&key) {
                    claim(s, *valid_ns);
                }
            }
            Kind::Call { .. }
            | Kind::Reply(_)
            | Kind::Waiting { .. }
            | Kind::Calls(_)
            | Kind::Guarded { .. } => {}
            Kind::Busy => {
                report.acquisitions += 1;
                report.busy += 1;
            }
            Kind::Error(_) => {
                report.acquisitions += 1;
                report.errors += 1;
            }
            Kind::Read { valid_ns, store } => {
                if let Some(s) = open.get_mut(&key) {
                    claim(s, *valid_ns);
                    s.ops.push((false, *store));
                }
            }
            Kind::Write { valid_ns, store } => {
                if let Some(s) = open.get_mut(&key) {
                    claim(s, *valid_ns);
                    s.ops.push((true, *store));
                }
                match store {
                    Store::Accepted { .. } => report.writes_accepted += 1,
                    Store::Rejected { .. } => report.stale_rejected += 1,
                    Store::Failed => {}
                }
            }
            Kind::Lost => {
                if let Some(s) = open.get_mut(&key) {
                    s.valid_end = s.valid_end.min(ev.t);
                }
            }
            Kind::Releasing | Kind::Release(_) => {
                if let Some(s) = open.remove(&key) {
                    released.insert(key, done.len());
                    close(s, ev.t, &mut done);
                }
                if let Kind::Release(outcome) = &ev.kind {
                    if let Some(&i) = released.get(&key) {
                        done[i].release_failed = outcome.starts_with("err");
                        if !done[i].release_failed {
                            done[i].released = Some(ev.t.max(done[i].end));
                        }
                    }
                }
            }
        }
    }
    for (_, s) in open {
        let end = kill_of(s.worker).unwrap_or(harness.end);
        close(s, end, &mut done);
    }
    done
}

pub fn check_overlaps(sections: &[Section], harness: &Harness, report: &mut Report) {
    let mut by_item: BTreeMap<u32, Vec<&Section>> = BTreeMap::new();
    for s in sections {
        by_item.entry(s.item).or_default().push(s);
    }
    let mut expired = std::collections::HashSet::new();
    for (item, mut list) in by_item {
        list.sort_by_key(|s| s.start);
        for (i, a) in list.iter().enumerate() {
            // Sections are short and mostly disjoint: this inner loop stops at once as a rule.
            for b in &list[i + 1..] {
                if b.start >= a.end {
                    break;
                }
                let valid = b.start < a.valid_end && b.start < b.valid_end;
                if !valid {
                    // Counted once per section that ran on past its lease into another's.
                    let stale = if a.valid_end <= b.start { a } else { b };
                    expired.insert((stale.worker, stale.start));
                    continue;
                }
                if harness.unprotected_at(b.start) {
                    report.valid_overlaps_unprotected += 1;
                } else {
                    report.valid_overlaps += 1;
                    report.example(format!(
                        "item {item}: worker {} (token {}, valid until +{} ms) and worker {} (token {}) from +{} ms",
                        a.worker,
                        a.token,
                        (a.valid_end - a.start) / 1_000_000,
                        b.worker,
                        b.token,
                        (b.start - a.start) / 1_000_000
                    ));
                }
            }
        }
    }
    report.expired_overlaps = expired.len() as u64;
}

/// Tokens of successive holders of an item strictly increase: each section's token is above the
/// token of every section of the item that had ended before it began. A section that began after a
/// fault outside the guarantees is counted apart, as its overlaps are. A section whose lease had
/// run out when it began is no holder, as in the overlap check: its worker recorded the grant late
/// (a process stopped between the grant and its record), and the fenced store rejects what it does.
/// A plain lock's token is drawn after its grant, while the hold still holds the lock: every holder
/// that ended before this one began drew its own before then.
pub fn check_tokens(sections: &[Section], harness: &Harness, report: &mut Report) {
    let mut by_item: BTreeMap<u32, Vec<&Section>> = BTreeMap::new();
    for s in sections {
        by_item.entry(s.item).or_default().push(s);
    }
    for (item, mut list) in by_item {
        list.sort_by_key(|s| s.start);
        let mut ended: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64)>> = Default::default();
        let mut highest_ended = 0;
        // A holder that drew no token (a plain lock's is drawn on its first read: one lost by then
        // gets none, and writes nothing) has none to judge.
        for s in list.into_iter().filter(|s| s.token > 0) {
            while let Some(std::cmp::Reverse((end, token))) = ended.peek().copied() {
                if end > s.start {
                    break;
                }
                ended.pop();
                highest_ended = highest_ended.max(token);
            }
            if s.token <= highest_ended && s.valid_end <= s.start {
                report.token_regressions_expired += 1;
            } else if s.token <= highest_ended && harness.unprotected_at(s.start) {
                report.token_regressions_unprotected += 1;
            } else if s.token <= highest_ended {
                report.token_regressions += 1;
                report.example(format!(
                    "item {item}: worker {} got token {} after a holder with token {highest_ended} had ended",
                    s.worker, s.token
                ));
            }
            ended.push(std::cmp::Reverse((s.end, s.token)));
        }
    }
}

/// The store's own order (`seq`) of every accepted operation, per item, checked as a chain: tokens
/// never go back, and each write follows its own section's latest read with no other section's
/// write in between (else it overwrote an update it never saw).
fn check_store(sections: &[Section], harness: &Harness, report: &mut Report) {
    struct Op {
        seq: u64,
        token: u64,
        section: usize,
        write: bool,
        value: i64,
    }
    let mut ops: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
    for (section, s) in sections.iter().enumerate() {
        for &(write, store) in &s.ops {
            if let Store::Accepted { seq, value } = store {
                ops.entry(s.item).or_default().push(Op {
                    seq,
                    token: s.token,
                    section,
                    write,
                    value,
                });
            }
        }
    }
    for (item, mut list) in ops {
        list.sort_by_key(|op| op.seq);
        let mut highest = 0;
        for (i, op) in list.iter().enumerate() {
            if op.token < highest {
                report.stale_accepted += 1;
                report.example(format!(
                    "item {item}: op {} accepted with token {} after token {highest}",
                    op.seq, op.token
                ));
            }
            highest = highest.max(op.token);
            if !op.write {
                continue;
            }
            // Back to this section's read: any write met first (another section's, or a second
            // write of this one) means this write did not build on what it read.
            let before = list[..i].iter().rev();
            let lost = match before.take_while(|o| !o.write).find(|o| o.section == op.section) {
                Some(read) => read.value - 1 != op.value,
                None => true,
            };
            if lost {
                report.lost_updates += 1;
                report.example(format!(
                    "item {item}: write {} (token {}) overwrote an update it did not read",
                    op.seq, op.token
                ));
            }
        }
    }
    // The store's own count of sales against the stock that left it (events of a worker killed
    // mid-write may be missing; the store's count is not).
    for (item, (stock, sales)) in &harness.final_stock {
        let left_store = harness.initial_stock - stock;
        if *sales > left_store {
            report.oversell += (sales - left_store) as u64;
            report.example(format!(
                "item {item}: {sales} sales but only {left_store} units left the store"
            ));
        } else if *sales < left_store {
            report.lost_updates += (left_store - sales) as u64;
            report.example(format!(
                "item {item}: {left_store} units left the store for {sales} sales"
            ));
        }
    }
}

fn check_liveness(events: &[Event], harness: &Harness, report: &mut Report) {
    for crash in &harness.crashes {
        for (on, item) in &crash.items {
            report.crashes += 1;
            if *on != On::Lock {
                // A semaphore's permits come back by the end of the run: `family.rs` checks that.
                continue;
            }
            let regrant = events
                .iter()
                .filter(|e| e.item == *item && e.t > crash.t && matches!(e.kind, Kind::Grant { .. }))
                .map(|e| e.t)
                .min();
            match regrant {
                Some(t) => {
                    let ms = (t - crash.t) / 1_000_000;
                    report.worst_regrant_ms = report.worst_regrant_ms.max(ms);
                    if t - crash.t > harness.liveness_ns {
                        report.liveness_misses += 1;
                        // What the others met on that item meanwhile says why.
                        let mut met = BTreeMap::<String, u32>::new();
                        for e in events
                            .iter()
                            .filter(|e| e.item == *item && e.t > crash.t && e.t < t)
                        {
                            let kind = match &e.kind {
                                Kind::Error(why) => format!("err {why}"),
                                Kind::Busy => "busy".into(),
                                other => format!("{other:?}")
                                    .split([' ', '('])
                                    .next()
                                    .unwrap_or("?")
                                    .into(),
                            };
                            *met.entry(kind).or_default() += 1;
                        }
                        report.example(format!(
                            "item {item}: granted {ms} ms after worker {} crashed (meanwhile on it: {met:?})",
                            crash.worker
                        ));
                    }
                }
                None => {
                    report.liveness_misses += 1;
                    report.example(format!(
                        "item {item}: never granted after worker {} crashed",
                        crash.worker
                    ));
                }
            }
        }
    }
}

#[test]
fn events_round_trip_through_their_lines() {
    let events = [
        Kind::Grant {
            token: 1_700_000_000_000_001,
            valid_ns: 1_900_000_000,
        },
        Kind::Busy,
        Kind::Error("quorum".into()),
        Kind::Read {
            valid_ns: 5,
            store: Store::Accepted { seq: 3, value: -1 },
        },
        Kind::Write {
            valid_ns: 0,
            store: Store::Rejected { fence: 9 },
        },
        Kind::Write {
            valid_ns: 0,
            store: Store::Failed,
        },
        Kind::Lost,
        Kind::Releasing,
        Kind::Release("notheld".into()),
        Kind::Permit {
            permits: 2,
            valid_ns: 1_900_000_000,
        },
        Kind::Holding { valid_ns: 0 },
        Kind::Call { op: Op::Set, arg: 3 },
        Kind::Call {
            op: Op::CountDown,
            arg: 0,
        },
        Kind::Call {
            op: Op::Wait,
            arg: 1500,
        },
        Kind::Reply("err:timed_out".into()),
        Kind::Shared {
            valid_ns: 1_900_000_000,
        },
        Kind::Waiting {
            wait_ms: 3000,
            shared: true,
            permits: 1,
        },
        Kind::Waiting {
            wait_ms: 3000,
            shared: false,
            permits: 2,
        },
        Kind::Calls(17),
    ];
    for kind in events {
        for on in [On::Lock, On::Semaphore, On::Latch, On::Rw, On::Fair] {
            let event = Event {
                worker: 3,
                task: 4,
                on,
                item: 1,
                t: 123,
                kind: kind.clone(),
            };
            let line = format!("test chaos_worker ... {event}");
            assert_eq!(Event::parse(&line), Some(event));
        }
    }
}

#[test]
fn the_checker_finds_an_overlap_a_stale_write_and_a_lost_update() {
    let ev = |worker, t, kind| Event {
        worker,
        task: 0,
        on: On::Lock,
        item: 0,
        t,
        kind,
    };
    let ms = 1_000_000;
    let ok = |seq, value| Store::Accepted { seq, value };
    // Worker 1 holds token 5 with 1 s of validity; worker 2 is granted token 6 while 1 is still
    // valid; both read 10 and write 9, and the store (not fenced here) takes both writes.
    let events = vec![
        ev(
            1,
            0,
            Kind::Grant {
                token: 5,
                valid_ns: 1000 * ms,
            },
        ),
        ev(
            1,
            ms,
            Kind::Read {
                valid_ns: 999 * ms,
                store: ok(1, 10),
            },
        ),
        ev(
            2,
            10 * ms,
            Kind::Grant {
                token: 6,
                valid_ns: 1000 * ms,
            },
        ),
        ev(
            2,
            11 * ms,
            Kind::Read {
                valid_ns: 999 * ms,
                store: ok(2, 10),
            },
        ),
        ev(
            2,
            12 * ms,
            Kind::Write {
                valid_ns: 999 * ms,
                store: ok(3, 9),
            },
        ),
        ev(
            1,
            13 * ms,
            Kind::Write {
                valid_ns: 990 * ms,
                store: ok(4, 9),
            },
        ),
        ev(2, 14 * ms, Kind::Release("ok".into())),
        ev(1, 15 * ms, Kind::Release("ok".into())),
    ];
    let harness = Harness {
        end: 20 * ms,
        initial_stock: 10,
        final_stock: [(0, (9, 2))].into(),
        liveness_ns: 3000 * ms,
        ..Harness::default()
    };
    let report = check(&events, &harness);
    assert_eq!(report.valid_overlaps, 1, "{report}");
    assert_eq!(report.token_regressions, 0, "{report}");
    assert_eq!(report.stale_accepted, 1, "{report}");
    assert!(report.lost_updates >= 1, "{report}");
    assert_eq!(report.oversell, 1, "{report}");
    // The same overlap inside a window after an unprotected fault is counted apart.
    let excused = Harness {
        unprotected: vec![(5 * ms, 20 * ms)],
        ..harness
    };
    let report = check(&events, &excused);
    assert_eq!((report.valid_overlaps, report.valid_overlaps_unprotected), (0, 1));

    // A later holder with a token that is not higher (a counter that went back) is caught.
    let repeated = vec![
        ev(
            1,
            0,
            Kind::Grant {
                token: 7,
                valid_ns: 1000 * ms,
            },
        ),
        ev(1, ms, Kind::Release("ok".into())),
        ev(
            2,
            2 * ms,
            Kind::Grant {
                token: 7,
                valid_ns: 1000 * ms,
            },
        ),
        ev(2, 3 * ms, Kind::Release("ok".into())),
    ];
    let report = check(
        &repeated,
        &Harness {
            end: 5 * ms,
            ..Harness::default()
        },
    );
    assert_eq!(report.token_regressions, 1, "{report}");
    // The same regression by a section that began after a fault outside the guarantees (a grant
    // whose reply was read after a restart that lost the lock) is counted apart.
    let report = check(
        &repeated,
        &Harness {
            end: 5 * ms,
            unprotected: vec![(ms, 4 * ms)],
            ..Harness::default()
        },
    );
    assert_eq!(
        (report.token_regressions, report.token_regressions_unprotected),
        (0, 1),
        "{report}"
    );
    // And by a section whose lease had run out when it began (its worker stopped between the grant
    // and its record): no holder, counted apart too.
    let mut late = repeated.clone();
    late[2] = ev(
        2,
        2 * ms,
        Kind::Grant {
            token: 7,
            valid_ns: 0,
        },
    );
    let report = check(
        &late,
        &Harness {
            end: 5 * ms,
            ..Harness::default()
        },
    );
    assert_eq!(
        (report.token_regressions, report.token_regressions_expired),
        (0, 1),
        "{report}"
    );

    // A holder whose library reported the lease gone (validity 0) before its promised end is no
    // longer valid: a successor after that is an expired overlap, not a valid one.
    let given_up = vec![
        ev(
            1,
            0,
            Kind::Grant {
                token: 5,
                valid_ns: 1000 * ms,
            },
        ),
        ev(
            1,
            100 * ms,
            Kind::Read {
                valid_ns: 900 * ms,
                store: ok(1, 10),
            },
        ),
        ev(
            1,
            200 * ms,
            Kind::Write {
                valid_ns: 0,
                store: ok(2, 9),
            },
        ),
        ev(
            2,
            300 * ms,
            Kind::Grant {
                token: 6,
                valid_ns: 1000 * ms,
            },
        ),
        ev(2, 310 * ms, Kind::Release("ok".into())),
        ev(1, 400 * ms, Kind::Release("notheld".into())),
    ];
    let harness = Harness {
        end: 500 * ms,
        initial_stock: 10,
        final_stock: [(0, (9, 1))].into(),
        ..Harness::default()
    };
    let report = check(&given_up, &harness);
    assert_eq!(
        (report.valid_overlaps, report.expired_overlaps),
        (0, 1),
        "{report}"
    );
    // A holder killed while its release was on the way: the release freed the lock (a successor got
    // it) but no outcome line was written. Its `releasing` line ends the section; without it, the
    // section would run on to the kill and look like a valid overlap.
    let grant = |worker, t, token| {
        ev(
            worker,
            t,
            Kind::Grant {
                token,
                valid_ns: 1000 * ms,
            },
        )
    };
    let killed_releasing = vec![
        grant(1, 0, 5),
        ev(1, 20 * ms, Kind::Releasing),
        grant(2, 30 * ms, 6),
        ev(2, 40 * ms, Kind::Releasing),
        ev(2, 40 * ms, Kind::Release("ok".into())),
    ];
    let harness = Harness {
        end: 500 * ms,
        crashes: vec![Crash {
            worker: 1,
            t: 100 * ms,
            items: vec![(On::Lock, 1)],
            killed: true,
        }],
        ..Harness::default()
    };
    let report = check(&killed_releasing, &harness);
    assert_eq!(report.valid_overlaps, 0, "{report}");
    let unmarked: Vec<Event> = killed_releasing
        .into_iter()
        .filter(|e| !(e.worker == 1 && e.kind == Kind::Releasing))
        .collect();
    let report = check(&unmarked, &harness);
    assert_eq!(report.valid_overlaps, 1, "the control: {report}");
}
