//! A worker process: its own lock clients and several tasks that sell from the fenced store under
//! the locks (or use semaphores and latches, see `family.rs`), printing every step as an event
//! line. It stops when its standard input closes.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{Error, Lock, LockClient, LockConfig, MultiLock, QuorumConfig};

use crate::support::Locks;

use crate::family::{self, LatchRole};
use crate::history::{now_ns, Event, Kind, On, Store};
use crate::rw;
use crate::{store, Rng, Topology};

/// What the worker tasks exercise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Sell from the fenced store under the locks.
    Lock,
    /// Take and give back a semaphore's permits.
    Semaphore,
    /// Arm, count down and wait for countdown latches.
    Latch,
    /// Take the read side (mostly) or the write side of read-write locks.
    Rw,
    /// Wait in line for fair locks.
    Fair,
    /// Campaign in elections, lead a while, resign.
    Election,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lock => "lock",
            Workload::Semaphore => "semaphore",
            Workload::Latch => "latch",
            Workload::Rw => "rw",
            Workload::Fair => "fair",
            Workload::Election => "election",
        }
    }

    fn from_name(name: &str) -> Option<Workload> {
        [
            Workload::Lock,
            Workload::Semaphore,
            Workload::Latch,
            Workload::Rw,
            Workload::Fair,
            Workload::Election,
        ]
        .into_iter()
        .find(|w| w.name() == name)
    }
}

/// What the harness passes to a worker, through its environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub id: u32,
    pub topology: Topology,
    pub urls: Vec<String>,
    pub store: String,
    pub items: u32,
    pub lease: Duration,
    pub clients: u32,
    pub tasks: u32,
    pub think: Duration,
    pub seed: u64,
    pub workloads: Vec<Workload>,
}

impl Settings {
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RELOCK_CHAOS_WORKER", self.id.to_string()),
            ("RELOCK_CHAOS_TOPOLOGY", self.topology.name().to_string()),
            ("RELOCK_CHAOS_URLS", self.urls.join(",")),
            ("RELOCK_CHAOS_STORE", self.store.clone()),
            ("RELOCK_CHAOS_ITEMS", self.items.to_string()),
            ("RELOCK_CHAOS_LEASE_MS", self.lease.as_millis().to_string()),
            ("RELOCK_CHAOS_CLIENTS", self.clients.to_string()),
            ("RELOCK_CHAOS_TASKS", self.tasks.to_string()),
            ("RELOCK_CHAOS_THINK_MS", self.think.as_millis().to_string()),
            ("RELOCK_CHAOS_SEED", self.seed.to_string()),
            (
                "RELOCK_CHAOS_WORKLOADS",
                self.workloads
                    .iter()
                    .map(|w| w.name())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]
    }

    pub fn from_env() -> Option<Settings> {
        let var = |name: &str| std::env::var(name).ok();
        let num = |name: &str| var(name)?.parse::<u64>().ok();
        Some(Settings {
            id: num("RELOCK_CHAOS_WORKER")? as u32,
            topology: Topology::from_name(&var("RELOCK_CHAOS_TOPOLOGY")?)?,
            urls: var("RELOCK_CHAOS_URLS")?.split(',').map(str::to_string).collect(),
            store: var("RELOCK_CHAOS_STORE")?,
            items: num("RELOCK_CHAOS_ITEMS")? as u32,
            lease: Duration::from_millis(num("RELOCK_CHAOS_LEASE_MS")?),
            clients: num("RELOCK_CHAOS_CLIENTS")? as u32,
            tasks: num("RELOCK_CHAOS_TASKS")? as u32,
            think: Duration::from_millis(num("RELOCK_CHAOS_THINK_MS")?),
            seed: num("RELOCK_CHAOS_SEED")?,
            workloads: var("RELOCK_CHAOS_WORKLOADS")?
                .split(',')
                .map(Workload::from_name)
                .collect::<Option<_>>()?,
        })
    }
}

impl Locks {
    /// The worker's lock client, of the topology's kind: the rest of the code cannot tell them apart.
    async fn connect(settings: &Settings) -> Result<Locks, Error> {
        let config = LockConfig::default()
            .watchdog_timeout(settings.lease)
            .command_timeout(Duration::from_secs(1))
            .key_prefix("chaos");
        Ok(match settings.topology {
            Topology::Multi => {
                let urls: Vec<&str> = settings.urls.iter().map(String::as_str).collect();
                Locks::Quorum(
                    MultiLock::connect_with(&urls, QuorumConfig::default().lock_config(config)).await?,
                )
            }
            Topology::Single | Topology::Replicated => {
                Locks::One(LockClient::connect_with(&settings.urls[0], config).await?)
            }
            Topology::Synced | Topology::Cluster => {
                let config = config.sync_replicas(1).sync_timeout(Duration::from_millis(300));
                Locks::One(LockClient::connect_with(&settings.urls[0], config).await?)
            }
        })
    }
}

tokio::task_local! {
    /// The Redis calls relock sent from this task while the future [`counted`] runs was polled.
    static CALLS: Cell<u64>;
}

/// A recorder of the feature `metrics` that counts `relock_redis_calls_total` (every script call,
/// and a lone release's `HDEL` and `PUBLISH`) into the task-local count of the task that sends it,
/// if that task is inside [`counted`]; every other figure goes nowhere. One per worker process.
struct CallsPerTask;

struct TaskCalls;

impl metrics::CounterFn for TaskCalls {
    fn increment(&self, n: u64) {
        let _ = CALLS.try_with(|calls| calls.set(calls.get() + n));
    }

    fn absolute(&self, _: u64) {}
}

impl metrics::Recorder for CallsPerTask {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        static CALLS: std::sync::OnceLock<Arc<TaskCalls>> = std::sync::OnceLock::new();
        if key.name() == "relock_redis_calls_total" {
            metrics::Counter::from_arc(CALLS.get_or_init(|| Arc::new(TaskCalls)).clone())
        } else {
            metrics::Counter::noop()
        }
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// Runs `work` (an acquisition, a latch's wait) and counts the Redis calls relock sends from this
/// task meanwhile. A call is counted in the task that sends it: a waiter's attempt that leads a
/// batched round counts that round's one call (whatever else it carries); one that rides in another
/// task's round counts nothing here; the watchdog's renewals of its mark, and the subscriber's
/// (S)SUBSCRIBE, are not script calls of this task. With a quorum, an attempt is one call per
/// master.
pub async fn counted<F: Future>(work: F) -> (F::Output, u64) {
    CALLS
        .scope(Cell::new(0), async {
            let out = work.await;
            (out, CALLS.with(Cell::get))
        })
        .await
}

pub async fn run(settings: Settings) {
    // Only this process's: the harness's own clients (and the unit tests) count nothing.
    let _ = metrics::set_global_recorder(CallsPerTask);
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // The harness closes our stdin to stop us (or dies, which closes it too).
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let store = crate::support::fred_client(&settings.store).await;
    let mut clients = Vec::new();
    for _ in 0..settings.clients {
        // A server may be down for a moment (the nemesis works while workers start): retry.
        let mut tries = 0;
        let locks = loop {
            match Locks::connect(&settings).await {
                Ok(locks) => break locks,
                Err(err) if tries < 20 => {
                    tries += 1;
                    eprintln!("worker {}: connect: {err}", settings.id);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(err) => panic!("worker {} could not connect: {err}", settings.id),
            }
        };
        clients.push(Arc::new(locks));
    }
    let mut tasks = Vec::new();
    let rng = |task: u32| Rng::new(settings.seed ^ (u64::from(settings.id) << 32) ^ u64::from(task));
    if settings.workloads.contains(&Workload::Lock) {
        let mut start = |task: u32, pace: Pace, locks: &Arc<Locks>| {
            tasks.push(tokio::spawn(sell(
                settings.clone(),
                task,
                pace,
                rng(task),
                locks.clone(),
                store.clone(),
                stop.clone(),
            )));
        };
        for (c, locks) in clients.iter().enumerate() {
            for t in 0..settings.tasks {
                start(c as u32 * settings.tasks + t, Pace::Short, locks);
            }
        }
        // One long holder per worker, careful in some workers and naive in others.
        let long = settings.clients * settings.tasks + settings.id % 2;
        start(long, Pace::Long, &clients[0]);
    }
    // The family's tasks number from 100 (semaphore) and 200 (latch), apart from the lock's.
    let one = |locks: &Arc<Locks>| match &**locks {
        Locks::One(client) => client.clone(),
        Locks::Quorum(_) => panic!("semaphores, latches and fair locks are not offered on a MultiLock"),
    };
    if settings.workloads.contains(&Workload::Semaphore) {
        for (c, locks) in clients.iter().enumerate() {
            for t in 0..settings.tasks {
                let task = 100 + c as u32 * settings.tasks + t;
                let hold =
                    family::hold_permits(settings.clone(), task, false, rng(task), one(locks), stop.clone());
                tasks.push(tokio::spawn(hold));
            }
        }
        // One long holder per worker, careful in some workers and naive in others.
        let task = 100 + settings.clients * settings.tasks + settings.id % 2;
        let hold = family::hold_permits(
            settings.clone(),
            task,
            true,
            rng(task),
            one(&clients[0]),
            stop.clone(),
        );
        tasks.push(tokio::spawn(hold));
    }
    if settings.workloads.contains(&Workload::Latch) {
        use LatchRole::*;
        for (i, role) in [Coordinator, Counter, Counter, Waiter, Waiter]
            .into_iter()
            .enumerate()
        {
            let task = 200 + i as u32;
            let locks = &clients[i % clients.len()];
            let run = family::use_latches(settings.clone(), task, role, rng(task), one(locks), stop.clone());
            tasks.push(tokio::spawn(run));
        }
    }
    // The read-write lock's tasks number from 300, the fair lock's from 400.
    if settings.workloads.contains(&Workload::Rw) {
        let rw_locks = |locks: &Arc<Locks>| -> Vec<relock::RwLock> {
            (0..rw::RW_LOCKS)
                .map(|i| match &**locks {
                    Locks::One(client) => client.rw_lock(&rw::rw_name(i)),
                    Locks::Quorum(multi) => multi.rw_lock(&rw::rw_name(i)),
                })
                .collect()
        };
        for (c, locks) in clients.iter().enumerate() {
            for t in 0..settings.tasks {
                let task = 300 + c as u32 * settings.tasks + t;
                let run = rw::read_and_write(
                    settings.clone(),
                    task,
                    false,
                    rng(task),
                    rw_locks(locks),
                    stop.clone(),
                );
                tasks.push(tokio::spawn(run));
            }
        }
        // One long holder per worker, careful in some workers and naive in others.
        let task = 300 + settings.clients * settings.tasks + settings.id % 2;
        let run = rw::read_and_write(
            settings.clone(),
            task,
            true,
            rng(task),
            rw_locks(&clients[0]),
            stop.clone(),
        );
        tasks.push(tokio::spawn(run));
    }
    if settings.workloads.contains(&Workload::Fair) {
        for (c, locks) in clients.iter().enumerate() {
            for t in 0..2 {
                // One task per worker holds with a fixed lease (see `rw::FIXED_FAIR_TASK`).
                let task = if c == 1 && t == 1 {
                    rw::FIXED_FAIR_TASK
                } else {
                    400 + c as u32 * 2 + t
                };
                let client = one(locks);
                let fair = (0..rw::FAIR_LOCKS)
                    .map(|i| client.fair_lock(&rw::fair_name(i)))
                    .collect();
                let run = rw::wait_in_line(settings.clone(), task, rng(task), fair, stop.clone());
                tasks.push(tokio::spawn(run));
            }
        }
    }
    // The elections' tasks number from 500, one per client.
    if settings.workloads.contains(&Workload::Election) {
        for (c, locks) in clients.iter().enumerate() {
            let task = 500 + c as u32;
            let run = crate::election::campaign(settings.clone(), task, rng(task), one(locks), stop.clone());
            tasks.push(tokio::spawn(run));
        }
    }
    for task in tasks {
        task.await.expect("worker task");
    }
    for locks in &clients {
        locks.shutdown().await;
    }
    println!("DONE {}", settings.id);
}

/// How a task holds its locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// One read, a short think, one write: the bulk of the operations.
    Short,
    /// Held for 1 to 3 s (so across watchdog renewals, and often past the lease), a read and a write
    /// every few hundred ms, then idle for a while: the holds that faults hit in the middle.
    Long,
}

/// One task's loop: take a random item's lock, read the stock, think, write it minus one, release.
/// Even tasks run the work under `until_lost` (careful), odd ones do not (naive: a pause between the
/// read and the write sends a stale write, which fencing must reject).
async fn sell(
    settings: Settings,
    task: u32,
    pace: Pace,
    mut rng: Rng,
    locks: Arc<Locks>,
    store: fred::clients::Client,
    stop: Arc<AtomicBool>,
) {
    let names: Vec<Lock> = (0..settings.items)
        .map(|i| locks.lock(&format!("item-{i}")))
        .collect();
    let careful = task % 2 == 0;
    let emit = |item: u32, t: u64, kind: Kind| {
        let event = Event {
            worker: settings.id,
            task,
            on: On::Lock,
            item,
            t,
            kind,
        };
        println!("{event}");
    };
    let valid_ns = |guard: &relock::LockGuard| guard.validity().as_nanos() as u64;
    while !stop.load(Ordering::Relaxed) {
        if pace == Pace::Long {
            tokio::time::sleep(rng.between(Duration::from_secs(1), Duration::from_secs(3))).await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let item = rng.below(u64::from(settings.items)) as u32;
        let wait = settings.lease + Duration::from_secs(1);
        emit(
            item,
            now_ns(),
            Kind::Waiting {
                wait_ms: wait.as_millis() as u64,
                shared: false,
                permits: 1,
            },
        );
        let (acquired, calls) = counted(names[item as usize].try_acquire_for(wait)).await;
        let guard = match acquired {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                emit(item, now_ns(), Kind::Busy);
                emit(item, now_ns(), Kind::Calls(calls));
                continue;
            }
            Err(err) => {
                emit(item, now_ns(), Kind::Error(describe(&err)));
                emit(item, now_ns(), Kind::Calls(calls));
                // A bounded back-off: the servers may be down for a while.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Read the clock first, then the validity: the claim can only err on the short side.
        let t = now_ns();
        let valid = valid_ns(&guard);
        // A plain lock's token is drawn on its first read, while the hold holds the lock in Redis:
        // a hold lost by then gets none (token 0: no section's token to judge) and writes nothing.
        let token = guard.fencing_token().await.unwrap_or(0);
        emit(
            item,
            t,
            Kind::Grant {
                token,
                valid_ns: valid,
            },
        );
        emit(item, now_ns(), Kind::Calls(calls));
        let (hold, think) = match pace {
            Pace::Short => (Duration::ZERO, (Duration::ZERO, settings.think)),
            Pace::Long => (
                rng.between(Duration::from_secs(1), Duration::from_secs(3)),
                (Duration::from_millis(100), Duration::from_millis(400)),
            ),
        };
        let thinks: Vec<Duration> = (0..64).map(|_| rng.between(think.0, think.1)).collect();
        let work = async {
            if token == 0 {
                return;
            }
            let until = tokio::time::Instant::now() + hold;
            for think in thinks {
                let t = now_ns();
                let valid = valid_ns(&guard);
                let read = store::read(&store, item, token).await;
                emit(
                    item,
                    t,
                    Kind::Read {
                        valid_ns: valid,
                        store: read,
                    },
                );
                let Store::Accepted { value, .. } = read else {
                    return;
                };
                if value <= 0 {
                    return; // sold out
                }
                tokio::time::sleep(think).await;
                let t = now_ns();
                let valid = valid_ns(&guard);
                let written = store::write(&store, item, token, value - 1).await;
                emit(
                    item,
                    t,
                    Kind::Write {
                        valid_ns: valid,
                        store: written,
                    },
                );
                if tokio::time::Instant::now() >= until {
                    return;
                }
            }
        };
        if careful {
            if guard.until_lost(work).await.is_err() {
                emit(item, now_ns(), Kind::Lost);
            }
        } else {
            work.await;
        }
        // A guarded write beside the lock, last (a holder stalled in its work makes it late).
        if settings.topology != Topology::Multi && token > 0 {
            let t = now_ns();
            let outcome = guarded_write(&guard, item, token).await;
            emit(item, t, Kind::Guarded { token, outcome });
        }
        let t = now_ns();
        emit(item, t, Kind::Releasing);
        let outcome = match guard.release().await {
            Ok(()) => "ok".to_string(),
            Err(Error::NotHeld) => "notheld".to_string(),
            Err(err) => format!("err:{}", err.to_string().replace(char::is_whitespace, "_")),
        };
        emit(item, now_ns(), Kind::Release(outcome));
    }
}

/// Appends `token` to the item's list beside its lock (`guarded:{item-N}`, the lock's slot), only
/// while the hold is current: what came of it, as a history line says it.
async fn guarded_write(guard: &relock::LockGuard, item: u32, token: u64) -> String {
    let key = format!("guarded:{{item-{item}}}");
    let write = guard.atomically(|tx| {
        tx.rpush(&key, &token.to_string());
    });
    match write.await {
        Ok(Some(_)) => "applied".to_string(),
        Ok(None) => "declined".to_string(),
        Err(Error::LeaseLost) => "lost".to_string(),
        Err(err) => format!("err:{}", describe(&err)),
    }
}

/// An error as a worker's history line names it (one word).
pub fn describe(err: &Error) -> String {
    match err {
        // Granted/answered of the masters: a split vote and an unreachable majority differ.
        Error::Quorum {
            granted, answered, ..
        } => format!("quorum:{granted}/{answered}"),
        Error::Timeout(_) => "timeout".to_string(),
        other => other.to_string().replace(char::is_whitespace, "_"),
    }
}

/// How long a semaphore or read-write task holds what it took, and the steps at which it says its
/// validity: a moment (up to four think times, steps of 5 ms to a think time), or with `long` 1 to
/// 3 s across renewals (steps of 100 to 400 ms).
pub fn hold_plan(rng: &mut Rng, settings: &Settings, long: bool) -> (Duration, Vec<Duration>) {
    let (hold, step) = if long {
        (
            rng.between(Duration::from_secs(1), Duration::from_secs(3)),
            (Duration::from_millis(100), Duration::from_millis(400)),
        )
    } else {
        (
            rng.between(Duration::ZERO, settings.think * 4),
            (
                Duration::from_millis(5),
                settings.think.max(Duration::from_millis(6)),
            ),
        )
    };
    let steps = (0..64).map(|_| rng.between(step.0, step.1)).collect();
    (hold, steps)
}
