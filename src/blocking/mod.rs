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

// The top layer: it uses the public async API (the primitives and `inspect`), and of the engine
// only the async client's `Core`, whose last reference it drops on its own runtime. The runtime
// and its drop are here; each wrapped type is in the file named after it.

mod client;
mod latch;
mod lock;
mod lock_set;
mod multi;
mod rw_lock;
mod semaphore;

pub use client::LockClient;
pub use latch::CountDownLatch;
pub use lock::{Lock, LockGuard};
pub use lock_set::{LockSet, LockSetGuard};
pub use multi::MultiLock;
pub use rw_lock::RwLock;
pub use semaphore::{Permit, Semaphore};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::engine::core::Core;
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
