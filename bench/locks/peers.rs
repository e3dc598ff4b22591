//! The libraries, each as one acquisition and one release (a [`Contender`]), how each peer is built
//! at a retry setting, and the two loops every library runs the same way: back-to-back cycles on a
//! lock of its own ([`cycles`]), and contending for one lock with a critical section ([`contend`]).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::rows::{micros, Library, Retry, Tally};

/// The lease every peer asks for; long enough never to run out during a cycle.
const LEASE: Duration = Duration::from_secs(30);

/// One lock of one library, as one task uses it.
pub trait Contender: Send + Sync + 'static {
    /// What a granted acquisition hands back, to release it.
    type Held: Send + 'static;

    const LIBRARY: Library;

    /// A synchronous library: its loop runs on a blocking thread.
    const BLOCKING: bool = false;

    /// One acquisition as the library makes it, its own retries included: `None` when it gave up.
    fn acquire(&self) -> impl Future<Output = Option<Self::Held>> + Send;

    /// Releases and waits for Redis to confirm; `false` if the library reported an error.
    fn release(&self, held: Self::Held) -> impl Future<Output = bool> + Send;
}

/// relock: waits for the release message, never gives up.
pub struct Relock(pub relock::Lock);

impl Contender for Relock {
    type Held = relock::LockGuard;
    const LIBRARY: Library = Library::Relock;

    async fn acquire(&self) -> Option<relock::LockGuard> {
        Some(self.0.acquire().await.expect("relock acquire"))
    }

    async fn release(&self, guard: relock::LockGuard) -> bool {
        guard.release().await.is_ok()
    }
}

/// relock's semaphore: one permit per acquisition, waits for a release message, never gives up.
pub struct RelockPermit(pub relock::Semaphore);

impl Contender for RelockPermit {
    type Held = relock::Permit;
    const LIBRARY: Library = Library::Relock;

    async fn acquire(&self) -> Option<relock::Permit> {
        Some(self.0.acquire(1).await.expect("relock semaphore acquire"))
    }

    async fn release(&self, permit: relock::Permit) -> bool {
        permit.release().await.is_ok()
    }
}

/// The thinnest lock on relock's own driver, fred: `SET key owner NX PX` to acquire, a
/// compare-and-delete script (`GET`, then `DEL`) to release, as rslock does over redis-rs. Not a
/// peer: its cycles show what fred itself costs, below anything relock adds.
pub struct FredSetNx {
    pub client: fred::clients::Client,
    pub key: String,
    /// The SHA of the release script, loaded once.
    pub release_sha: Arc<str>,
}

/// The compare-and-delete script of [`FredSetNx`].
pub const FRED_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

impl Contender for FredSetNx {
    type Held = ();
    const LIBRARY: Library = Library::FredSetNx;

    async fn acquire(&self) -> Option<()> {
        use fred::interfaces::KeysInterface;
        let set: Option<String> = self
            .client
            .set(
                self.key.as_str(),
                "fred-owner",
                Some(fred::types::Expiration::PX(LEASE.as_millis() as i64)),
                Some(fred::types::SetOptions::NX),
                false,
            )
            .await
            .expect("fred SET NX");
        set.map(|_| ())
    }

    async fn release(&self, (): ()) -> bool {
        use fred::interfaces::LuaInterface;
        let deleted: i64 = self
            .client
            .evalsha(&*self.release_sha, vec![self.key.as_str()], vec!["fred-owner"])
            .await
            .expect("fred release");
        deleted == 1
    }
}

/// relock's own commands through its driver with nothing of relock between: an `FCALL` of relock's
/// function as a lone fresh acquisition sends it (`A`, owner, lease; the lock and fence keys) and
/// the `HDEL` of the hold and its mark that a lone full release sends, through one fred client. Not
/// a peer: the server runs exactly what relock's single operations make it run, and the client
/// only fred's work, so its cycles are the most relock's design can make of fred here (relock
/// coalesces operations under load, which this does not).
pub struct FredRelockCommands {
    pub client: fred::clients::Client,
    /// relock's function, as loaded on the server (see [`relock_function`]).
    pub function: Arc<str>,
    pub lock: String,
    pub fence: String,
}

/// The owner id of [`FredRelockCommands`]: relock's form, `id:generation`.
const COMMANDS_OWNER: &str = "fred-commands:1";
/// Its hold's mark (see `scripts/acquire.lua`), removed with the hold as relock's release does.
const COMMANDS_MARK: &str = "fred-commands:1~";

/// The name of relock's batch function loaded on the server `client` is connected to (a
/// `LockClient` loads it when it connects), if there is one.
pub async fn relock_function(client: &fred::clients::Client) -> Option<Arc<str>> {
    use fred::interfaces::FunctionInterface;
    let list: fred::types::Value = client.function_list(None::<&str>, false).await.ok()?;
    fn find(value: &fred::types::Value) -> Option<Arc<str>> {
        match value {
            fred::types::Value::String(s) if s.starts_with("relock_batch_") => Some(Arc::from(&**s)),
            fred::types::Value::Array(items) => items.iter().find_map(find),
            fred::types::Value::Map(map) => map.values().find_map(find),
            _ => None,
        }
    }
    find(&list)
}

impl Contender for FredRelockCommands {
    type Held = ();
    const LIBRARY: Library = Library::FredRelockCommands;

    async fn acquire(&self) -> Option<()> {
        use fred::interfaces::FunctionInterface;
        use fred::types::Value;
        let lease = LEASE.as_millis() as i64;
        let reply: Value = self
            .client
            .fcall(
                &*self.function,
                vec![self.lock.as_str(), self.fence.as_str()],
                vec![Value::from("A"), Value::from(COMMANDS_OWNER), Value::from(lease)],
            )
            .await
            .expect("fred FCALL of relock's function");
        // A fresh grant answers 0 alone (no token drawn); anything else comes as a list.
        (!matches!(reply, Value::Array(_))).then_some(())
    }

    async fn release(&self, (): ()) -> bool {
        use fred::interfaces::HashesInterface;
        let removed: i64 = self
            .client
            .hdel(self.lock.as_str(), vec![COMMANDS_OWNER, COMMANDS_MARK])
            .await
            .expect("fred HDEL");
        removed == 1
    }
}

/// rslock: `SET NX PX` on every master, `retry_count` tries with a pause drawn from
/// `0..retry_delay` whole milliseconds between them (the failed try's keys deleted first).
pub struct Rslock {
    pub manager: Arc<rslock::LockManager>,
    pub key: String,
}

/// An rslock manager over `urls` at a retry setting. Defaults: 3 tries, pauses of 0-199 ms. Tight:
/// unbounded tries, a 1 ms retry delay, which rslock draws from `0..1` ms: no pause at all.
pub fn rslock_manager(urls: &[String], retry: Retry) -> Arc<rslock::LockManager> {
    let mut manager = rslock::LockManager::new(urls.to_vec());
    if retry == Retry::Tight {
        manager.set_retry(u32::MAX, Duration::from_millis(1));
    }
    Arc::new(manager)
}

impl Contender for Rslock {
    type Held = rslock::Lock;
    const LIBRARY: Library = Library::Rslock;

    async fn acquire(&self) -> Option<rslock::Lock> {
        match self.manager.lock(self.key.as_str(), LEASE).await {
            Ok(lock) => Some(lock),
            Err(rslock::LockError::Unavailable | rslock::LockError::TtlExceeded) => None,
            Err(err) => panic!("rslock acquire: {err:?}"),
        }
    }

    async fn release(&self, lock: rslock::Lock) -> bool {
        // Best effort in rslock: no outcome to report.
        self.manager.unlock(&lock).await;
        true
    }
}

/// async-redis-lock, one acquisition and one release per cycle.
///
/// Why an earlier run reported its 1-task acquire p50 at ~29-35 µs, below the "round trip" it was
/// compared with (fred's `EVALSHA`, ~91 µs then), while the crate measured alone gave ~92 µs:
///
/// - The cycle is real. From its 0.4.0 source: `acquire_with_options` runs its lock script once
///   (`EXISTS`, then `SET PX`) through redis-rs's `ConnectionManager` and spawns an extension task
///   that sleeps `extend` (1 s) and is cancelled through a oneshot at release, sending nothing in a
///   short cycle; `release()` awaits the unlock script's reply (`GET`, then `DEL`) and clears the
///   guard, so `Drop` spawns no second unlock and the key is free for the next cycle.
///   `timeout(None)` only changes the retry loop, which an uncontended acquisition never enters.
///   `INFO commandstats` agrees: 6 commands per cycle (2 `EVALSHA`, `EXISTS`, `SET`, `GET`, `DEL`).
/// - fred's round trip was never the physical one: a bare `TcpStream` (the `floor` rows) and
///   redis-rs's plain `SET` both take ~60 µs here when the machine is otherwise idle, fred ~75-90 µs.
/// - On this 2-vCPU VM a request's round trip is mostly the wake-up of an idle vCPU: the bare loop
///   takes ~15 µs when another thread keeps a vCPU busy. In the same process, minutes apart,
///   async-redis-lock's acquire measured 28-40 µs while its own release, redis-rs's `SET` and the
///   bare loop measured 52-62 µs; with one worker thread (or a current-thread runtime, as under
///   `#[tokio::test]`) its acquire is ~65 µs, the bare round trip, at 7,400-7,700 cycles/s. So the
///   low figure is most likely its per-lock extension task (spawned at acquire, woken by the cancel
///   at release) keeping the runtime's second worker, and its vCPU, awake when the next acquire's
///   reply arrives; the ~92 µs "alone" figure fits a one-worker runtime on a busier machine.
///
/// The bench now also reports every library's release latency, Redis commands and CPU per cycle
/// (a release returning early, or a cycle that skips Redis, would show there), and its cycles/s,
/// which is the robust comparison, beside a floor measured in the same run.
pub struct Arl {
    pub locker: async_redis_lock::Locker,
    pub key: String,
    pub options: async_redis_lock::Options,
}

/// async-redis-lock's options at a retry setting. Defaults: retry every 100 ms, give up after 1 s.
/// Tight: retry every 1 ms (a tokio sleep, so 1-2 ms), never give up.
pub fn arl_options(retry: Retry) -> async_redis_lock::Options {
    match retry {
        Retry::Tight => async_redis_lock::Options::new()
            .retry(Duration::from_millis(1))
            .timeout(None),
        _ => async_redis_lock::Options::new(),
    }
}

impl Contender for Arl {
    type Held = async_redis_lock::Lock;
    const LIBRARY: Library = Library::AsyncRedisLock;

    async fn acquire(&self) -> Option<async_redis_lock::Lock> {
        match self.locker.acquire_with_options(&self.options, &self.key).await {
            Ok(lock) => Some(lock),
            Err(async_redis_lock::Error::Timeout) => None,
            Err(err) => panic!("async-redis-lock acquire: {err:?}"),
        }
    }

    async fn release(&self, lock: async_redis_lock::Lock) -> bool {
        lock.release().await.is_ok()
    }
}

/// redlock (synchronous): a new TCP connection for every `SET NX PX` and every unlock script.
pub struct Redlock {
    pub redlock: Arc<redlock::RedLock>,
    pub key: Vec<u8>,
}

/// A redlock client over `urls` at its defaults (3 tries, pauses of 0-199 ms). Not run polling
/// tightly: each try opens two TCP connections, which would use up the loopback's ports.
pub fn redlock_client(urls: &[String]) -> Arc<redlock::RedLock> {
    Arc::new(redlock::RedLock::new(urls.to_vec()))
}

impl Contender for Redlock {
    /// The lock's resource and value (`redlock::Lock` borrows its client).
    type Held = (Vec<u8>, Vec<u8>);
    const LIBRARY: Library = Library::Redlock;
    const BLOCKING: bool = true;

    async fn acquire(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        match self.redlock.lock(&self.key, LEASE.as_millis() as usize) {
            Ok(Some(lock)) => Some((lock.resource, lock.val)),
            _ => None,
        }
    }

    async fn release(&self, (resource, val): (Vec<u8>, Vec<u8>)) -> bool {
        self.redlock.unlock(&redlock::Lock {
            lock_manager: &self.redlock,
            resource,
            val,
            validity_time: 0,
        });
        true
    }
}

/// Spawns one bench task of `C`: on a blocking thread for a synchronous library (where its calls
/// run inline under `Handle::block_on`), as a tokio task otherwise.
pub fn spawn<C: Contender, F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if C::BLOCKING {
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || handle.block_on(task))
    } else {
        tokio::spawn(task)
    }
}

/// Back-to-back acquire + release cycles on `c`'s own lock until `deadline`.
pub async fn cycles<C: Contender>(c: C, deadline: Instant) -> Tally {
    let mut tally = Tally::new();
    while Instant::now() < deadline {
        let start = Instant::now();
        let held = loop {
            if let Some(held) = c.acquire().await {
                break Some(held);
            }
            if Instant::now() >= deadline {
                break None;
            }
        };
        let Some(held) = held else { break };
        tally.acquire.record(micros(start.elapsed())).ok();
        let start = Instant::now();
        if !c.release(held).await {
            tally.failed_releases += 1;
        }
        tally.release.record(micros(start.elapsed())).ok();
        tally.count += 1;
    }
    tally
}

/// Handoff: from the start of a release call to the next holder's grant, over all contenders.
#[derive(Clone)]
pub struct Handoff {
    clock: Instant,
    /// When the last release began, in µs since `clock` (0: none yet), shifted left by
    /// [`CLIENT_BITS`], and the releasing contender's client in the bits below.
    released: Arc<AtomicU64>,
}

/// The bits of [`Handoff::released`] that hold the releasing contender's client.
const CLIENT_BITS: u32 = 8;

impl Default for Handoff {
    fn default() -> Handoff {
        Handoff::new()
    }
}

impl Handoff {
    pub fn new() -> Handoff {
        Handoff {
            clock: Instant::now(),
            released: Arc::new(AtomicU64::new(0)),
        }
    }

    fn now(&self) -> u64 {
        (self.clock.elapsed().as_micros() as u64).max(1)
    }

    /// A holder of `client` was just granted the lock: records the time since the last release
    /// began, and again apart if that release was another client's.
    fn granted(&self, client: usize, tally: &mut Tally) {
        let last = self.released.load(Ordering::SeqCst);
        let at = last >> CLIENT_BITS;
        if at > 0 {
            let gap = self.now().saturating_sub(at).max(1);
            tally.handoff.record(gap).ok();
            if last & ((1 << CLIENT_BITS) - 1) != client as u64 {
                tally.cross_gap.record(gap).ok();
            }
        }
    }

    /// The holder, of `client`, is about to release.
    fn releasing(&self, client: usize) {
        let client = client as u64 & ((1 << CLIENT_BITS) - 1);
        self.released
            .store(self.now() << CLIENT_BITS | client, Ordering::SeqCst);
    }
}

/// Holds the lock until `granted + section`: a sleep off the runtime (a blocking thread's
/// `thread::sleep`), standing in for a database write that takes `section` from the grant.
///
/// Why not `thread::sleep(section)` after the hop: Linux lets a sleep overrun by its thread's timer
/// slack (50 µs by default), and the hop to the blocking thread adds its own wake-up, so a 1 ms
/// section ran 1.10-1.13 ms here, a cap of about 0.9 on every library's share of the ideal. With
/// the slack at 1 ns and the sleep measured from the grant it runs about 1.02-1.04 ms; the hop
/// back to the holder's task stays in. `tokio::time::sleep` would round up to its millisecond
/// wheel (about 2 ms for 1 ms on this machine).
pub async fn hold<C: Contender>(granted: Instant, section: Duration) {
    if section.is_zero() {
        return;
    }
    let until = (granted + section).into_std();
    if C::BLOCKING {
        sleep_until(until);
    } else {
        tokio::task::spawn_blocking(move || sleep_until(until))
            .await
            .expect("critical section");
    }
}

/// Sleeps the current thread until `until`, with its timer slack at 1 ns (see [`hold`]).
fn sleep_until(until: std::time::Instant) {
    thread_local! {
        static FINE_SLACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    FINE_SLACK.with(|set| {
        if !set.replace(true) {
            // SAFETY: PR_SET_TIMERSLACK takes a plain integer and changes only this thread.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
        }
    });
    std::thread::sleep(until.saturating_duration_since(std::time::Instant::now()));
}

/// Contends for `c`'s lock (shared with the other contenders) until `deadline`: acquire (again
/// whenever the library gives up), hold for `section`, release. Counts the sections granted before
/// the deadline; a wait still open at the deadline is recorded as long as it was by then. `client`:
/// which of the run's clients `c` uses (see [`Handoff`]).
pub async fn contend<C: Contender>(
    c: C,
    deadline: Instant,
    section: Duration,
    handoff: Handoff,
    client: usize,
) -> Tally {
    let mut tally = Tally::new();
    while Instant::now() < deadline {
        let want = Instant::now();
        let held = loop {
            match tokio::time::timeout_at(deadline, c.acquire()).await {
                Ok(Some(held)) => break Some(held),
                Ok(None) if Instant::now() < deadline => continue,
                _ => break None,
            }
        };
        let granted = Instant::now();
        let Some(held) = held else {
            tally
                .acquire
                .record(micros(deadline.saturating_duration_since(want)))
                .ok();
            break;
        };
        handoff.granted(client, &mut tally);
        tally.acquire.record(micros(granted - want)).ok();
        if granted < deadline {
            tally.count += 1;
        }
        hold::<C>(granted, section).await;
        if !section.is_zero() {
            tally.section.record(micros(granted.elapsed())).ok();
        }
        handoff.releasing(client);
        if !c.release(held).await {
            tally.failed_releases += 1;
        }
    }
    tally
}
