//! # relock
//!
//! Distributed locks on Redis in the style of Redisson's `RLock`: reentrant, hash-counted locks
//! whose leases a watchdog keeps alive, RAII guards that release on drop, fencing tokens, waiting
//! without polling, and a [`MultiLock`] that applies the Redlock algorithm across several independent
//! masters with the very same [`Lock`] and [`LockGuard`] types.
//!
//! ```no_run
//! use relock::LockClient;
//!
//! # async fn demo() -> Result<(), relock::Error> {
//! let client = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let lock = client.lock("inventory:sku-42");
//! {
//!     let guard = lock.acquire().await?;     // waits until held
//!     // ... deduct stock; write with guard.fencing_token().await? where storage checks it ...
//! }                                           // released here, also on `?`, panic or abort
//! # Ok(())
//! # }
//! ```
//!
//! ## Guarantees and their limits
//!
//! - **Mutual exclusion** holds while the lease is valid: [`LockGuard::validity`] tells how long, on
//!   the monotonic clock. A holder that is paused (GC-like stall, swapping) or cut off longer than its
//!   lease can lose the lock without running any code; its guard then reports
//!   [`is_held`](LockGuard::is_held) false, [`lost`](LockGuard::lost) completes, and
//!   [`until_lost`](LockGuard::until_lost) stops the work. Work already sent on its way cannot be
//!   recalled, which is why storage that must never take a stale write checks the
//!   [`fencing_token`](LockGuard::fencing_token) (Kleppmann's argument; antirez's answer is that the
//!   same check can use any unique, comparable value, and that Redlock's safety rests on bounded
//!   clock drift, not on synchronised clocks).
//! - **Fencing tokens** strictly increase across successive holders of a name. The counter is never
//!   reset, and every new token is also at least the server's clock in microseconds, so tokens keep
//!   rising when the counter lost its latest increments (a Redis without persistence restarted, a
//!   replica promoted before it had them), as long as the clock that draws the next token (the new
//!   primary's, after a failover) is not behind the one that drew the last by more than the time
//!   since.
//! - **One Redis** is a single point of failure, and a replica promoted after an asynchronous failover
//!   may not have the lock: use a [`MultiLock`] over independent masters where that matters.

//!
//! Besides locks, a [`LockClient`] hands out fair locks ([`LockClient::fair_lock`]: waiters in
//! arrival order, a queue that never sticks behind a crashed waiter), [`RwLock`]s (many readers or
//! one writer; writers do not starve, every reader has a lease of its own; a [`MultiLock`] too),
//! [`Semaphore`]s (every permit holder with a lease the watchdog renews), [`CountDownLatch`]es
//! (Redisson's `RCountDownLatch`: waiters of every client are woken by one message when the count
//! reaches zero) and, with a [`MultiLock`] too, [`LockSet`]s over several names (`lock_all`).
//!
//! ## Topologies
//!
//! One [`LockClient`] serves one server (`redis://`), a Redis Cluster (`redis-cluster://`) or a
//! Sentinel-managed primary (`redis-sentinel://`); a [`MultiLock`] combines any of them as its
//! masters. With [`LockConfig::sync_replicas`], an acquisition counts only once that many replicas
//! acknowledged it (`WAIT`), so a failover that promotes one of them keeps the lock.
//!
//! The layers and background tasks are drawn in `ARCHITECTURE.md` at the repository's root.
//!
//! ## Operating it
//!
//! - **Spans**: every acquire call runs in an `acquire` span (fields `lock`, `owner`, `mode`,
//!   `waited_us`, `token`, `outcome`), every awaited or background release in a `release` span,
//!   and each watchdog round in a `watchdog_round` span; relock's events nest in them.
//! - **Metrics** (feature `metrics`): counters, gauges and histograms through the `metrics` facade,
//!   listed in `docs/operating.md`; [`LockConfig::metrics_lock_names`] adds the lock's name as a label.
//! - **Inspection**: [`LockClient::inspect`] and [`LockClient::held_locks`] read who holds what
//!   (and their kin for fair locks, read-write locks and semaphores); the `relock` binary (feature
//!   `cli`) prints them, force-unlocks and watches a lock.
//! - **Blocking code**: [`blocking`] wraps the API for threads outside any runtime.
//!
//! Features (none by default): `tls-rustls` or `tls-native` for `rediss://`; `metrics`; `cli`; `testing`
//! ([`testing`]: throwaway servers and faults for your own tests).

#![warn(missing_docs)]

// The layers, top to bottom: a module uses the layers below its own, never one above (checked by
// the `layers` test). `error` and `config` are the vocabulary every layer shares.

// The blocking API, over the async one.
pub mod blocking;

// Throwaway servers, clusters and a faulty network for users' tests (feature `testing`).
#[cfg(feature = "testing")]
pub mod testing;

// Operators' reads of who holds what.
mod inspect;

// The primitives users hold: locks, guards, semaphores, latches, the client that makes them.
mod primitives;

// The engine: attempts, holds, handoffs, releases, the watchdog, quorums.
mod engine;

// The Redis transport: connections, batches, scripts, keys, wake-up channels, topologies.
mod redis;

// Small tools of every layer: deadlines, small collections, telemetry.
mod util;

// The shared vocabulary.
mod config;
mod error;

// The README's examples are compiled with the doctests: the quick start and the blocking program
// as they stand (`no_run`: they need a server), the snippets that assume a `client` not at all.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The Redis driver relock runs on, whose client [`LockClient::from_fred`] takes: the same version,
/// so that a client built through this path fits.
pub use fred;

pub use config::{
    LockConfig, QuorumConfig, MAX_CLIENT_NAME_LEN, MAX_LEASE, MAX_NAME_LEN, MAX_PREFIX_LEN, MIN_LEASE,
    MIN_RENEW_INTERVAL, MIN_RETRY_DELAY, MIN_TIMEOUT,
};
pub use error::Error;
pub use inspect::{
    ClientInfo, ElectionInfo, FairLockInfo, Holder, LockInfo, PermitHolder, ReadHold, RwLockInfo,
    SemaphoreInfo, Waiter,
};
pub use primitives::client::LockClient;
pub use primitives::election::{Election, Leader, Leadership};
pub use primitives::guard::LockGuard;
pub use primitives::guarded::Tx;
pub use primitives::latch::CountDownLatch;
pub use primitives::lock::Lock;
pub use primitives::lock_set::{LockSet, LockSetGuard};
pub use primitives::multi::MultiLock;
pub use primitives::owner::Owner;
pub use primitives::rw_lock::RwLock;
pub use primitives::semaphore::{Permit, Semaphore};
