//! A blocking API over the async one, for code that does not run in an async runtime.
//!
//! In the style of reqwest's `blocking` module: [`LockClient`], [`Lock`] (also a fair lock's, and
//! each side of an [`RwLock`]), [`LockGuard`], [`MultiLock`], [`Semaphore`] and its [`Permit`],
//! [`LockSet`] (`lock_all`) and its
//! [`LockSetGuard`], and [`CountDownLatch`] here mirror the crate's async types of the same names,
//! with every `async fn` turned into a call that blocks the calling thread until it is done; the
//! inspection calls ([`LockClient::inspect`], [`LockClient::held_locks`],
//! [`LockClient::inspect_semaphore`]) too. Not mirrored: building a client from a fred client or
//! from other clients, `until_lost` and the unbounded latch wait (use the async API for those).
//!
//! ```no_run
//! use relock::blocking::LockClient;
//!
//! # fn demo() -> Result<(), relock::Error> {
//! let client = LockClient::connect("redis://127.0.0.1:6379")?;
//! let lock = client.lock("inventory:sku-42");
//! {
//!     let guard = lock.acquire()?;            // blocks this thread until held
//!     // ... deduct stock; write with guard.fencing_token()? where storage checks it ...
//! }                                           // released here, without blocking
//! client.shutdown()?;
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! Each client ([`LockClient::connect`], [`MultiLock::connect`]) starts its own small tokio runtime
//! (one worker thread, named `relock-blocking`), shared by its clones, its locks and their guards.
//! The async client lives on it, so its background work (the watchdog that renews leases, the
//! releaser, the connections to Redis) goes on between calls and while the calling thread does
//! its own work. A blocking call runs the matching async call on that runtime and waits for it.
//!
//! **Owners are threads.** An acquisition is owned by the OS thread that makes it: two threads
//! exclude each other, and a thread that acquires a lock it already holds re-enters its hold
//! (its [`hold_count`](LockGuard::hold_count) goes up). [`Lock::owner`] acquires on behalf of an
//! explicit [`Owner`] instead, e.g. to share one hold between threads. A guard is `Send`: it may be
//! released or dropped on another thread than the one that acquired it.
//!
//! **Dropping a guard never blocks** (a [`LockGuard`], [`Permit`] or [`LockSetGuard`]): its release
//! is queued to the client's background releaser, as with the async [`LockGuard`](crate::LockGuard).
//! Their `release` methods wait for the release instead. When the last handle of a client (client, lock or guard) goes, the drop waits for the
//! releases still queued (at most the node timeout: the command timeout of a `LockClient`, the
//! `node_timeout` of a `MultiLock`), then stops the runtime; dropped inside an async runtime, it
//! hands that to a short-lived thread instead of blocking.
//!
//! # Not inside an async runtime
//!
//! Every call here that blocks (constructors included) first checks whether the calling thread is
//! inside a tokio runtime (a task, `block_on`, or `spawn_blocking`; anywhere
//! `tokio::runtime::Handle::try_current` succeeds) and then returns [`Error::InsideRuntime`]
//! instead of blocking a runtime thread, deadlocking it or panicking: use the async API there.
//! Calls that do not block (names, tokens, [`LockGuard::is_held`], making a [`Lock`], a
//! [`Semaphore`] or a [`LockSet`]) and drops work anywhere.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::config::{LockConfig, QuorumConfig};
use crate::engine::core::Core;
use crate::inspect::{LockInfo, SemaphoreInfo};
use crate::primitives::owner::Owner;
use crate::Error;

// The handles may be shared and sent between threads.
const _: fn() = || {
    fn assert<T: Send + Sync>() {}
    assert::<LockClient>();
    assert::<Lock>();
    assert::<LockGuard>();
    assert::<MultiLock>();
    assert::<CountDownLatch>();
    assert::<Semaphore>();
    assert::<Permit>();
    assert::<LockSet>();
    assert::<LockSetGuard>();
    assert::<RwLock>();
};

/// What a client, its clones, locks and guards share: the runtime the async client lives on.
struct Shared {
    handle: Handle,
    /// The async client's core, so that its last reference outside the background tasks goes in
    /// [`Shared`]'s drop, inside the runtime's context (its connections are closed on the runtime).
    core: Option<Arc<Core>>,
    runtime: Background,
}

/// A runtime that is shut down without waiting when dropped, so that dropping it never panics,
/// even inside an async context.
struct Background(Option<tokio::runtime::Runtime>);

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl Background {
    /// A new runtime, refused inside a runtime.
    fn start() -> Result<Background, Error> {
        refuse_inside_runtime()?;
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("relock-blocking")
            .enable_all()
            .build()
            .map(|runtime| Background(Some(runtime)))
            .map_err(|err| {
                Error::Redis(fred::error::Error::new(
                    fred::error::ErrorKind::IO,
                    format!("could not start the runtime of relock's blocking client: {err}"),
                ))
            })
    }

    /// Runs `future` to completion on this runtime (from a thread outside every runtime).
    fn block_on<F: Future>(&self, future: F) -> Result<F::Output, Error> {
        refuse_inside_runtime()?;
        match &self.0 {
            Some(runtime) => Ok(runtime.block_on(future)),
            None => Err(Error::Shutdown),
        }
    }

    /// The shared state of a client whose async core is `core`.
    fn share(self, core: Arc<Core>) -> Result<Arc<Shared>, Error> {
        let handle = match &self.0 {
            Some(runtime) => runtime.handle().clone(),
            None => return Err(Error::Shutdown),
        };
        Ok(Arc::new(Shared {
            handle,
            core: Some(core),
            runtime: self,
        }))
    }
}

fn refuse_inside_runtime() -> Result<(), Error> {
    match Handle::try_current() {
        Ok(_) => Err(Error::InsideRuntime),
        Err(_) => Ok(()),
    }
}

impl Shared {
    /// Runs `future` on the runtime, as the calling thread's owner, and waits for it.
    fn block_on<F: Future>(&self, future: F) -> Result<F::Output, Error> {
        refuse_inside_runtime()?;
        // Outside every runtime and task, the current owner is this thread (`Owner::current`);
        // inside `block_on` it would not be, so the future is scoped with it.
        let owner = Owner::current();
        Ok(self.handle.block_on(owner.scope(future)))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let runtime = std::mem::replace(&mut self.runtime, Background(None));
        let core = self.core.take();
        let finish = move || finish(runtime, core);
        if Handle::try_current().is_ok() {
            // Blocking here could stall (or deadlock) the caller's runtime. Should the thread not
            // start, the runtime is shut down at once when the closure is dropped.
            let _ = std::thread::Builder::new()
                .name("relock-blocking-drop".into())
                .spawn(finish);
        } else {
            finish();
        }
    }
}

/// The end of a client's runtime, on a thread outside every runtime: drops the core in the
/// runtime's context, waits (bounded) until the releases queued by dropped guards are done (they
/// hold the core until then), and shuts the runtime down.
fn finish(runtime: Background, core: Option<Arc<Core>>) {
    let Some(rt) = &runtime.0 else { return };
    let Some(core) = core else { return };
    let bound = core.masters.config.node_timeout + Duration::from_millis(100);
    let mut alive = core.alive.subscribe();
    {
        let _enter = rt.enter();
        drop(core);
    }
    // Ends when the core is dropped (its sender closes), after the releases that hold it.
    let _ = rt.block_on(async { tokio::time::timeout(bound, alive.changed()).await });
    drop(runtime);
}

/// A blocking client of one Redis deployment (a server, a cluster, or a Sentinel-managed primary)
/// that hands out [`Lock`]s: the blocking [`LockClient`](crate::LockClient).
///
/// It owns a small runtime on which the async client and its background tasks run (see the
/// [module docs](self)). Cheap to clone; every clone, lock and guard shares it.
///
/// ```no_run
/// use std::time::Duration;
/// use relock::{blocking::LockClient, LockConfig};
///
/// # fn demo() -> Result<(), relock::Error> {
/// let config = LockConfig::default().watchdog_timeout(Duration::from_secs(30)).key_prefix("shop");
/// let client = LockClient::connect_with("redis://127.0.0.1:6379", config)?;
/// let guard = client.lock("inventory:sku-42").acquire()?;
/// // ... deduct the stock ...
/// guard.release()?;
/// client.shutdown()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient {
    // Dropped before `shared`, whose drop finishes the client.
    inner: crate::LockClient,
    shared: Arc<Shared>,
}

impl LockClient {
    /// Connects with the default [`LockConfig`]. As [`connect_with`](LockClient::connect_with).
    pub fn connect(url: &str) -> Result<LockClient, Error> {
        LockClient::connect_with(url, LockConfig::default())
    }

    /// Starts the client's runtime and connects to the server, cluster or sentinel group at `url`:
    /// the blocking [`LockClient::connect_with`](crate::LockClient::connect_with), which tells the
    /// URL formats and the errors. [`Error::InsideRuntime`] inside an async runtime.
    pub fn connect_with(url: &str, config: LockConfig) -> Result<LockClient, Error> {
        let runtime = Background::start()?;
        let inner = runtime.block_on(crate::LockClient::connect_with(url, config))??;
        let shared = runtime.share(inner.core.clone())?;
        Ok(LockClient { inner, shared })
    }

    /// The lock called `name`. No I/O; the name is checked when the lock is used.
    pub fn lock(&self, name: &str) -> Lock {
        Lock {
            inner: self.inner.lock(name),
            shared: self.shared.clone(),
        }
    }

    /// The fair lock called `name`, blocking: see
    /// [`LockClient::fair_lock`](crate::LockClient::fair_lock) (waiters granted in arrival order).
    /// No I/O.
    pub fn fair_lock(&self, name: &str) -> Lock {
        Lock {
            inner: self.inner.fair_lock(name),
            shared: self.shared.clone(),
        }
    }

    /// The read-write lock called `name`, blocking: see [`RwLock`](crate::RwLock). No I/O.
    pub fn rw_lock(&self, name: &str) -> RwLock {
        RwLock {
            inner: self.inner.rw_lock(name),
            shared: self.shared.clone(),
        }
    }

    /// The countdown latch called `name` (see [`CountDownLatch`](crate::CountDownLatch)), blocking.
    /// No I/O.
    pub fn latch(&self, name: &str) -> CountDownLatch {
        CountDownLatch {
            inner: self.inner.latch(name),
            shared: self.shared.clone(),
        }
    }

    /// The semaphore called `name`, of `permits` permits, blocking: see
    /// [`Semaphore`](crate::Semaphore) for its rules (every holder has a lease the watchdog renews;
    /// callers that disagree on `permits`). No I/O; the name and numbers are checked when it is used.
    pub fn semaphore(&self, name: &str, permits: u64) -> Semaphore {
        Semaphore {
            inner: self.inner.semaphore(name, permits),
            shared: self.shared.clone(),
        }
    }

    /// Several names locked together, all or none, blocking: see [`LockSet`](crate::LockSet)
    /// (sorted, deduplicated, taken in that order with rollback). No I/O; the names are checked when
    /// the set is used.
    pub fn lock_all(&self, names: &[&str]) -> LockSet {
        LockSet {
            inner: self.inner.lock_all(names),
            shared: self.shared.clone(),
        }
    }

    /// The state of the lock `name` (holders, lease left, fence), read in one script call:
    /// `Ok(None)` if nobody holds it. Reads only. The blocking
    /// [`LockClient::inspect`](crate::LockClient::inspect).
    ///
    /// # Errors
    ///
    /// As the async call ([`Error::InvalidName`] before any I/O, [`Error::WrongType`],
    /// [`Error::Timeout`], [`Error::Redis`]); [`Error::InsideRuntime`] inside an async runtime.
    pub fn inspect(&self, name: &str) -> Result<Option<LockInfo>, Error> {
        self.shared.block_on(self.inner.inspect(name))?
    }

    /// Every lock held under the client's key prefix whose name matches `pattern` (a Redis glob;
    /// every lock if `None`), found by `SCAN`: the blocking
    /// [`LockClient::held_locks`](crate::LockClient::held_locks).
    ///
    /// # Errors
    ///
    /// As the async call; [`Error::InsideRuntime`] inside an async runtime.
    pub fn held_locks(&self, pattern: Option<&str>) -> Result<Vec<LockInfo>, Error> {
        self.shared.block_on(self.inner.held_locks(pattern))?
    }

    /// The state of the semaphore `name` (its permits, and each live holder's permits and lease
    /// left), read in one script call: `Ok(None)` if there is none. Reads only. The blocking
    /// [`LockClient::inspect_semaphore`](crate::LockClient::inspect_semaphore).
    ///
    /// # Errors
    ///
    /// As the async call; [`Error::InsideRuntime`] inside an async runtime.
    pub fn inspect_semaphore(&self, name: &str) -> Result<Option<SemaphoreInfo>, Error> {
        self.shared.block_on(self.inner.inspect_semaphore(name))?
    }

    /// The configuration in force.
    pub fn config(&self) -> &LockConfig {
        self.inner.config()
    }

    /// The deployment this client talks to: `host:port`, `cluster host:port,...` or
    /// `sentinel service NAME`.
    pub fn server(&self) -> &str {
        self.inner.server()
    }

    /// Releases every lock this client holds (their guards become lost), stops the background tasks
    /// and closes the connections, and waits for that. Later acquisitions fail with
    /// [`Error::Shutdown`]. [`Error::InsideRuntime`] inside an async runtime.
    pub fn shutdown(&self) -> Result<(), Error> {
        self.shared.block_on(self.inner.shutdown())
    }
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockClient").field(&self.inner).finish()
    }
}

/// A named lock, whose acquisitions block the calling thread: the blocking
/// [`Lock`](crate::Lock). Cheap to create and to clone, no I/O until it is used.
///
/// Acquisitions are reentrant per [`Owner`]: by default the calling OS thread.
///
/// ```no_run
/// use std::time::Duration;
/// # fn demo(client: relock::blocking::LockClient) -> Result<(), relock::Error> {
/// let lock = client.lock("inventory:sku-42");
/// let guard = lock.acquire()?;                    // blocks; the watchdog keeps the lease
/// let again = lock.acquire()?;                    // same thread: re-entered, no deadlock
/// assert_eq!(again.hold_count(), 2);
/// drop(again);
/// drop(guard);                                    // released in the background
///
/// if let Some(guard) = lock.try_acquire_for(Duration::from_millis(500))? {
///     // held; released when `guard` goes out of scope
/// #   drop(guard);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: crate::Lock,
    shared: Arc<Shared>,
}

impl Lock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Acquires with a fixed lease that the watchdog does not renew, as
    /// [`Lock::lease`](crate::Lock::lease).
    pub fn lease(self, lease: Duration) -> Lock {
        Lock {
            inner: self.inner.lease(lease),
            shared: self.shared,
        }
    }

    /// Whether an acquisition by the owner that holds this lock already joins its hold, as
    /// [`Lock::reentrant`](crate::Lock::reentrant).
    pub fn reentrant(self, on: bool) -> Lock {
        Lock {
            inner: self.inner.reentrant(on),
            shared: self.shared,
        }
    }

    /// Acquires on behalf of `owner` instead of the calling thread: every acquisition with the same
    /// owner (through this client) joins one reentrant hold, whichever thread makes it.
    pub fn owner(self, owner: Owner) -> Lock {
        Lock {
            inner: self.inner.owner(owner),
            shared: self.shared,
        }
    }

    /// Blocks until the lock is held, as [`Lock::acquire`](crate::Lock::acquire) waits.
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn acquire(&self) -> Result<LockGuard, Error> {
        let guard = self.shared.block_on(self.inner.acquire())??;
        Ok(self.guard(guard))
    }

    /// One attempt, no waiting: `None` if another owner holds the lock, as
    /// [`Lock::try_acquire`](crate::Lock::try_acquire). [`Error::InsideRuntime`] inside an async
    /// runtime.
    pub fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    /// Blocks at most `wait` for the lock: `None` if another owner still holds it then, as
    /// [`Lock::try_acquire_for`](crate::Lock::try_acquire_for). [`Error::InsideRuntime`] inside an
    /// async runtime.
    pub fn try_acquire_for(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire_for(wait))??;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    /// Whether anyone holds the lock, as [`Lock::is_locked`](crate::Lock::is_locked).
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn is_locked(&self) -> Result<bool, Error> {
        self.shared.block_on(self.inner.is_locked())?
    }

    /// Removes the lock whoever holds it (an administrative override), as
    /// [`Lock::force_unlock`](crate::Lock::force_unlock). [`Error::InsideRuntime`] inside an async
    /// runtime.
    pub fn force_unlock(&self) -> Result<bool, Error> {
        self.shared.block_on(self.inner.force_unlock())?
    }

    fn guard(&self, inner: crate::LockGuard) -> LockGuard {
        LockGuard {
            inner,
            shared: self.shared.clone(),
        }
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Lock").field(&self.inner).finish()
    }
}

/// Proof that a lock is held: the blocking [`LockGuard`](crate::LockGuard), returned by
/// [`Lock::acquire`] and its siblings.
///
/// Dropping it releases its hold (one level of reentrancy) in the background, without blocking,
/// from any thread, inside an async runtime or not. [`release`](LockGuard::release) waits for the
/// release instead. The lease can be lost while the guard lives (see the async guard): check
/// [`is_held`](LockGuard::is_held), or wait for the loss with
/// [`wait_lost_for`](LockGuard::wait_lost_for); writes to storage that must never take a stale write
/// should carry the [`fencing_token`](LockGuard::fencing_token).
///
/// ```no_run
/// # fn demo(client: relock::blocking::LockClient) -> Result<(), relock::Error> {
/// let guard = client.lock("inventory:sku-42").acquire()?;
/// let token = guard.fencing_token()?;
/// // ... read, compute and write with `token` ...
/// if !guard.is_held() {
///     return Err(relock::Error::LeaseLost);
/// }
/// guard.release()?;
/// # let _ = token;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    // Dropped before `shared`: its release is queued before the client may finish.
    inner: crate::LockGuard,
    shared: Arc<Shared>,
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The fencing token of this hold, as [`LockGuard::fencing_token`](crate::LockGuard::fencing_token):
    /// a plain lock's is drawn on the first read (one round trip), while the hold holds the lock.
    /// [`Error::LeaseLost`] if the lease was lost; [`Error::InsideRuntime`] inside an async runtime.
    pub fn fencing_token(&self) -> Result<u64, Error> {
        self.shared.block_on(self.inner.fencing_token())?
    }

    /// The reentrancy depth of this owner right after this acquisition (1 for a first acquisition).
    pub fn hold_count(&self) -> u32 {
        self.inner.hold_count()
    }

    /// Whether the lease is still held: false once it is known lost or has no validity left.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// How long the lease is still safe for, on the monotonic clock (zero once lost), as
    /// [`LockGuard::validity`](crate::LockGuard::validity).
    pub fn validity(&self) -> Duration {
        self.inner.validity()
    }

    /// Blocks until the lease is lost, for at most `timeout`: `true` if it was lost (at once if it
    /// is lost already), `false` if it was still held when `timeout` ran out. The blocking
    /// counterpart of [`LockGuard::lost`](crate::LockGuard::lost). [`Error::InsideRuntime`] inside
    /// an async runtime.
    pub fn wait_lost_for(&self, timeout: Duration) -> Result<bool, Error> {
        self.shared
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await.is_ok() })
    }

    /// Releases this hold (one level of reentrancy) and blocks until Redis confirms, as
    /// [`LockGuard::release`](crate::LockGuard::release): `Err(Error::Lost)` if the lease was
    /// known lost, `Err(Error::NotHeld)` if Redis found it gone. Inside an async runtime, the guard is dropped (released in the background) and the
    /// result is [`Error::InsideRuntime`].
    pub fn release(self) -> Result<(), Error> {
        let LockGuard { inner, shared } = self;
        shared.block_on(inner.release())?
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockGuard").field(&self.inner).finish()
    }
}

/// A read-write lock, blocking: [`RwLock`](crate::RwLock) (many readers or one writer; writers do
/// not starve; every reader's lease is its own). Each side is a blocking [`Lock`].
#[derive(Clone)]
pub struct RwLock {
    inner: crate::RwLock,
    shared: Arc<Shared>,
}

impl RwLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The read side (see [`RwLock::read`](crate::RwLock::read)).
    pub fn read(&self) -> Lock {
        Lock {
            inner: self.inner.read(),
            shared: self.shared.clone(),
        }
    }

    /// The write side (see [`RwLock::write`](crate::RwLock::write)).
    pub fn write(&self) -> Lock {
        Lock {
            inner: self.inner.write(),
            shared: self.shared.clone(),
        }
    }
}

impl std::fmt::Debug for RwLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock").field("name", &self.name()).finish()
    }
}

/// A countdown latch, blocking: the blocking [`CountDownLatch`](crate::CountDownLatch). Made by
/// [`LockClient::latch`]; cheap to clone.
#[derive(Clone)]
pub struct CountDownLatch {
    inner: crate::CountDownLatch,
    shared: Arc<Shared>,
}

impl CountDownLatch {
    /// The latch's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Arms an open latch with `count`: `false` if it is still counting (see
    /// [`CountDownLatch::set_count`](crate::CountDownLatch::set_count)).
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn set_count(&self, count: u64) -> Result<bool, Error> {
        self.shared.block_on(self.inner.set_count(count))?
    }

    /// Counts one arrival; returns the count left. [`Error::InsideRuntime`] inside an async runtime.
    pub fn count_down(&self) -> Result<u64, Error> {
        self.shared.block_on(self.inner.count_down())?
    }

    /// The count left (0: open). [`Error::InsideRuntime`] inside an async runtime.
    pub fn count(&self) -> Result<u64, Error> {
        self.shared.block_on(self.inner.count())?
    }

    /// Blocks at most `wait` for the latch to open: `true` if it did (see
    /// [`CountDownLatch::wait_for`](crate::CountDownLatch::wait_for)). [`Error::InsideRuntime`]
    /// inside an async runtime.
    pub fn wait_for(&self, wait: Duration) -> Result<bool, Error> {
        self.shared.block_on(self.inner.wait_for(wait))?
    }
}

impl std::fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::CountDownLatch")
            .field(&self.inner)
            .finish()
    }
}

/// Locks held on a majority of N independent Redis masters (Redlock), blocking: the blocking
/// [`MultiLock`](crate::MultiLock). It hands out the same blocking [`Lock`] and [`LockGuard`] as a
/// [`LockClient`]. Cheap to clone.
///
/// ```no_run
/// # fn demo() -> Result<(), relock::Error> {
/// use relock::{blocking::MultiLock, LockConfig};
///
/// let urls = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
/// let multi = MultiLock::connect(&urls, LockConfig::default())?;
/// let guard = multi.lock("orders:42").acquire()?;
/// println!("token {} valid for {:?}", guard.fencing_token()?, guard.validity());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    inner: crate::MultiLock,
    shared: Arc<Shared>,
}

impl MultiLock {
    /// Starts the runtime and connects to every master at once, with the default [`QuorumConfig`]
    /// and `config` for the locks, as [`MultiLock::connect`](crate::MultiLock::connect).
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn connect(urls: &[&str], config: LockConfig) -> Result<MultiLock, Error> {
        MultiLock::connect_with(urls, QuorumConfig::default().lock_config(config))
    }

    /// [`connect`](MultiLock::connect) with a full [`QuorumConfig`].
    pub fn connect_with(urls: &[&str], config: QuorumConfig) -> Result<MultiLock, Error> {
        let runtime = Background::start()?;
        let inner = runtime.block_on(crate::MultiLock::connect_with(urls, config))??;
        let shared = runtime.share(inner.core.clone())?;
        Ok(MultiLock { inner, shared })
    }

    /// The lock called `name` over every master. No I/O.
    pub fn lock(&self, name: &str) -> Lock {
        Lock {
            inner: self.inner.lock(name),
            shared: self.shared.clone(),
        }
    }

    /// The read-write lock called `name` over every master, blocking: see
    /// [`RwLock`](crate::RwLock). No I/O.
    pub fn rw_lock(&self, name: &str) -> RwLock {
        RwLock {
            inner: self.inner.rw_lock(name),
            shared: self.shared.clone(),
        }
    }

    /// Several names locked together over every master, all or none, blocking: see
    /// [`MultiLock::lock_all`](crate::MultiLock::lock_all). No I/O.
    pub fn lock_all(&self, names: &[&str]) -> LockSet {
        LockSet {
            inner: self.inner.lock_all(names),
            shared: self.shared.clone(),
        }
    }

    /// The number of masters.
    pub fn masters(&self) -> usize {
        self.inner.masters()
    }

    /// Releases every lock this MultiLock holds, stops its background tasks and closes its
    /// connections, and waits for that. [`Error::InsideRuntime`] inside an async runtime.
    pub fn shutdown(&self) -> Result<(), Error> {
        self.shared.block_on(self.inner.shutdown())
    }
}

impl std::fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::MultiLock").field(&self.inner).finish()
    }
}

/// A semaphore of N permits shared through Redis, whose acquisitions block the calling thread: the
/// blocking [`Semaphore`](crate::Semaphore), made by [`LockClient::semaphore`]. Cheap to clone, no
/// I/O until it is used.
///
/// Every acquisition is a holder of its own (permits are not reentrant, and not tied to the thread:
/// a [`Permit`] may be given back from any thread), with a lease the client's watchdog renews, so
/// the permits of a process that dies come back within its lease.
///
/// ```no_run
/// use std::time::Duration;
/// # fn demo(client: relock::blocking::LockClient) -> Result<(), relock::Error> {
/// // At most 10 calls in flight to a rate-limited API, across every process.
/// let api = client.semaphore("partner-api", 10);
/// let permit = api.acquire(1)?;               // blocks until a permit is free
/// // ... call the API ...
/// drop(permit);                               // given back in the background, without blocking
///
/// if let Some(permits) = api.try_acquire_for(3, Duration::from_millis(500))? {
///     assert_eq!(permits.permits(), 3);
///     permits.release()?;                     // given back, and confirmed
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    inner: crate::Semaphore,
    shared: Arc<Shared>,
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The number of permits this handle gives the semaphore.
    pub fn permits(&self) -> u64 {
        self.inner.permits()
    }

    /// Blocks until `n` permits are free, and takes them: the blocking
    /// [`Semaphore::acquire`](crate::Semaphore::acquire). Waiting costs no polling (a release
    /// message, or the soonest holder's lease running out, wakes it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for `n` of 0 or above the permits, or for permits that disagree
    /// with those stored while some are held; [`Error::InvalidName`] for a bad name (both before
    /// any I/O); [`Error::Timeout`] or [`Error::Redis`] when Redis fails; [`Error::Shutdown`];
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn acquire(&self, n: u64) -> Result<Permit, Error> {
        let permit = self.shared.block_on(self.inner.acquire(n))??;
        Ok(self.permit(permit))
    }

    /// One attempt, no waiting: `None` if fewer than `n` permits are free, as
    /// [`Semaphore::try_acquire`](crate::Semaphore::try_acquire).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Semaphore::acquire).
    pub fn try_acquire(&self, n: u64) -> Result<Option<Permit>, Error> {
        let permit = self.shared.block_on(self.inner.try_acquire(n))??;
        Ok(permit.map(|permit| self.permit(permit)))
    }

    /// Blocks at most `wait` for `n` permits: `None` if they were not free by then, as
    /// [`Semaphore::try_acquire_for`](crate::Semaphore::try_acquire_for). Returns within `wait`,
    /// whatever the server does.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Semaphore::acquire); [`Error::InvalidDuration`] for a `wait` out of range;
    /// [`Error::Timeout`] if no attempt was answered within `wait`.
    pub fn try_acquire_for(&self, n: u64, wait: Duration) -> Result<Option<Permit>, Error> {
        let permit = self.shared.block_on(self.inner.try_acquire_for(n, wait))??;
        Ok(permit.map(|permit| self.permit(permit)))
    }

    /// The permits free now (holders whose lease ran out count as free), as
    /// [`Semaphore::available`](crate::Semaphore::available).
    ///
    /// # Errors
    ///
    /// Bad input as [`acquire`](Semaphore::acquire); [`Error::Timeout`] or [`Error::Redis`] within
    /// the command timeout; [`Error::InsideRuntime`] inside an async runtime.
    pub fn available(&self) -> Result<u64, Error> {
        self.shared.block_on(self.inner.available())?
    }

    fn permit(&self, inner: crate::Permit) -> Permit {
        Permit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Semaphore").field(&self.inner).finish()
    }
}

/// Permits of a [`Semaphore`], held until the guard goes: the blocking
/// [`Permit`](crate::Permit). Dropping it gives the permits back in the background, without
/// blocking, from any thread, inside an async runtime or not; [`release`](Permit::release) waits
/// for Redis to confirm instead. The watchdog renews its lease; should it be lost (the process cut
/// off from Redis longer than the lease), [`is_held`](Permit::is_held) turns false and
/// [`wait_lost_for`](Permit::wait_lost_for) returns `true`.
#[must_use = "dropping the permit gives it back at once"]
pub struct Permit {
    // Dropped before `shared`: its release is queued before the client may finish.
    inner: crate::Permit,
    shared: Arc<Shared>,
}

impl Permit {
    /// How many permits it holds.
    pub fn permits(&self) -> u64 {
        self.inner.permits()
    }

    /// Whether its lease is still held: false once it is known lost or has no validity left.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// How long its lease is still known to be valid, on the monotonic clock (zero once lost).
    pub fn validity(&self) -> Duration {
        self.inner.validity()
    }

    /// Blocks until the lease is lost, for at most `timeout`: `true` if it was lost (at once if it
    /// is lost already), `false` if it was still held when `timeout` ran out. The blocking
    /// counterpart of [`Permit::lost`](crate::Permit::lost).
    ///
    /// # Errors
    ///
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn wait_lost_for(&self, timeout: Duration) -> Result<bool, Error> {
        self.shared
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await.is_ok() })
    }

    /// Gives the permits back and blocks until Redis confirms, as
    /// [`Permit::release`](crate::Permit::release).
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the lease was known lost, [`Error::NotHeld`] if Redis found it gone;
    /// [`Error::Timeout`] or [`Error::Redis`] when Redis fails. Inside an async runtime, the permit is dropped (given back in the background) and the
    /// result is [`Error::InsideRuntime`].
    pub fn release(self) -> Result<(), Error> {
        let Permit { inner, shared } = self;
        shared.block_on(inner.release())?
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Permit").field(&self.inner).finish()
    }
}

/// Several named locks taken together, all or none, blocking: the blocking
/// [`LockSet`](crate::LockSet), made by [`LockClient::lock_all`] or [`MultiLock::lock_all`]. Cheap
/// to clone, no I/O until it is used.
///
/// The names are sorted and deduplicated and taken in that order, each as its own lock, and what
/// was taken is given back if a later one cannot be: two threads (or processes) whose sets overlap
/// cannot deadlock. Each name is reentrant per owner (by default the calling thread), as a single
/// [`Lock`] is, and excludes `client.lock(name)` of the same name. Not atomic: between the first
/// name and the last, another client may see some of them taken. (relock's [`MultiLock`] is
/// Redisson's `RedLock`; this set is Redisson's `MultiLock`.)
///
/// ```no_run
/// # fn demo(client: relock::blocking::LockClient) -> Result<(), relock::Error> {
/// // Move stock between two SKUs: both locked, or neither.
/// let both = client.lock_all(&["sku-42", "sku-7"]);
/// let guard = both.acquire()?;
/// let token = guard.fencing_token("sku-42")?;
/// # let _ = token;
/// drop(guard);                                // both released, without blocking
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockSet {
    inner: crate::LockSet,
    shared: Arc<Shared>,
}

impl LockSet {
    /// The names, in the order they are taken (sorted, without duplicates).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.names()
    }

    /// Every name with a fixed lease that the watchdog does not renew (see [`Lock::lease`]).
    pub fn lease(self, lease: Duration) -> LockSet {
        LockSet {
            inner: self.inner.lease(lease),
            shared: self.shared,
        }
    }

    /// Every name on behalf of `owner` instead of the calling thread (see [`Lock::owner`]).
    pub fn owner(self, owner: Owner) -> LockSet {
        LockSet {
            inner: self.inner.owner(owner),
            shared: self.shared,
        }
    }

    /// Blocks until every name is held, as [`LockSet::acquire`](crate::LockSet::acquire).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty set or a bad name, and bad leases, before any I/O; else
    /// the first name's error (as [`Lock::acquire`]), with the names taken so far given back;
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn acquire(&self) -> Result<LockSetGuard, Error> {
        let guard = self.shared.block_on(self.inner.acquire())??;
        Ok(self.guard(guard))
    }

    /// One attempt per name, no waiting: `None`, with nothing held, if another owner holds any of
    /// them, as [`LockSet::try_acquire`](crate::LockSet::try_acquire).
    ///
    /// # Errors
    ///
    /// As [`acquire`](LockSet::acquire).
    pub fn try_acquire(&self) -> Result<Option<LockSetGuard>, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    /// Blocks at most `wait`, in all, for every name: `None`, with nothing held, if one is still
    /// held by another owner then, as [`LockSet::try_acquire_for`](crate::LockSet::try_acquire_for).
    ///
    /// # Errors
    ///
    /// As [`acquire`](LockSet::acquire); [`Error::InvalidDuration`] for a `wait` out of range.
    pub fn try_acquire_for(&self, wait: Duration) -> Result<Option<LockSetGuard>, Error> {
        let guard = self.shared.block_on(self.inner.try_acquire_for(wait))??;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    fn guard(&self, inner: crate::LockSetGuard) -> LockSetGuard {
        LockSetGuard {
            inner,
            shared: self.shared.clone(),
        }
    }
}

impl std::fmt::Debug for LockSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockSet").field(&self.inner).finish()
    }
}

/// The guard of a [`LockSet`]: every name held, the blocking
/// [`LockSetGuard`](crate::LockSetGuard). Dropping it releases them all in the background, without
/// blocking, from any thread; [`release`](LockSetGuard::release) waits for Redis to confirm instead.
#[must_use = "dropping the guard releases the locks at once"]
pub struct LockSetGuard {
    // Dropped before `shared`: its releases are queued before the client may finish.
    inner: crate::LockSetGuard,
    shared: Arc<Shared>,
}

impl LockSetGuard {
    /// The names held, in the set's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.guards().iter().map(crate::LockGuard::name)
    }

    /// The fencing token of `name` (each name has its own counter), as
    /// [`LockSetGuard::fencing_token`](crate::LockSetGuard::fencing_token); `Ok(None)` if it is
    /// not in the set. [`Error::InsideRuntime`] inside an async runtime.
    pub fn fencing_token(&self, name: &str) -> Result<Option<u64>, Error> {
        self.shared.block_on(self.inner.fencing_token(name))?
    }

    /// Whether every name's lease is still held.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// How long every lease is still known to be valid: the shortest (zero once one is lost).
    pub fn validity(&self) -> Duration {
        self.inner.validity()
    }

    /// Blocks until any name's lease is lost, for at most `timeout`: `true` if one was lost (at once
    /// if one is lost already), `false` if all were still held when `timeout` ran out. The blocking
    /// counterpart of [`LockSetGuard::lost`](crate::LockSetGuard::lost).
    ///
    /// # Errors
    ///
    /// [`Error::InsideRuntime`] inside an async runtime.
    pub fn wait_lost_for(&self, timeout: Duration) -> Result<bool, Error> {
        self.shared
            .block_on(async { tokio::time::timeout(timeout, self.inner.lost()).await.is_ok() })
    }

    /// Releases every name (one level of reentrancy each) and blocks until Redis confirms, as
    /// [`LockSetGuard::release`](crate::LockSetGuard::release): every release is made, and the
    /// first error is returned.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] or [`Error::NotHeld`] for a name whose lease was lost (as
    /// [`LockGuard::release`](crate::LockGuard::release)); [`Error::Timeout`] or [`Error::Redis`]
    /// when Redis fails. Inside an async runtime, the guard is dropped (released in the background)
    /// and the result is [`Error::InsideRuntime`].
    pub fn release(self) -> Result<(), Error> {
        let LockSetGuard { inner, shared } = self;
        shared.block_on(inner.release())?
    }
}

impl std::fmt::Debug for LockSetGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockSetGuard")
            .field(&self.inner)
            .finish()
    }
}
