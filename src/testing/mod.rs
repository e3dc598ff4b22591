//! Test your own code against real Redis and its faults (feature `testing`): throwaway
//! redis-servers ([`Server`]) and clusters ([`Cluster`], [`Replicated`], [`SentinelGroup`]) that
//! can be paused, killed, restarted and failed over, a proxy that cuts and slows the network in
//! front of one ([`Proxy`]), and [`lose`], which makes a guard lose its lock at the moment a test
//! chooses. relock's own tests, bench and chaos harness run on these.
//!
//! The top layer beside `blocking`: it uses the public API, and of the engine only what [`lose`]
//! needs to reach a guard's hold.
//!
//! **Needs `redis-server` on `PATH`** (and `redis-cli` for a [`Cluster`]). Without it,
//! [`Server::start`] panics at once, saying so; [`Server::try_start`] returns the error instead.
//! Every process started here runs on a free loopback port without persistence, is killed when its
//! handle drops, and is killed with the test process if that dies first (on Linux, by
//! `PR_SET_PDEATHSIG`), so a crashed test leaves no server behind.
//!
//! # Example: a handler that must stop when the lock is lost
//!
//! ```
//! use std::time::Duration;
//! use relock::testing::{self, Server};
//! use relock::{Error, LockClient};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Error> {
//! let server = Server::start();
//! let client = LockClient::connect(&server.url()).await?;
//! let guard = client.lock("nightly-report").acquire().await?;
//!
//! // The handler works in steps for as long as it holds the lock.
//! let handler = async {
//!     loop {
//!         tokio::time::sleep(Duration::from_millis(10)).await;
//!     }
//! };
//! let (outcome, lost) = tokio::join!(guard.until_lost(handler), async {
//!     tokio::time::sleep(Duration::from_millis(100)).await;
//!     testing::lose(&guard).await
//! });
//! lost?;
//! assert!(matches!(outcome, Err(Error::LeaseLost)), "the handler stopped");
//! assert!(!guard.is_held());
//! client.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod cluster;
mod proxy;
mod resp;
mod server;

use crate::{Error, LockGuard};

pub use cluster::{Cluster, Replicated, Sentinel, SentinelGroup, SERVICE};
pub use proxy::{in_front_of, Proxy};
pub use resp::{command_at, encode, Reply};
pub use server::{free_port, spawn_redis, spawn_tied, Server};

/// Makes `guard` lose its lock now, as a lease that ran out behind its back would: its hold is
/// removed in Redis (as [`Lock::force_unlock`](crate::Lock::force_unlock) removes it, waking the
/// lock's waiters) and the client's watchdog is woken to find it gone. Returns once the guard
/// knows it: [`is_held`](LockGuard::is_held) is false and [`lost`](LockGuard::lost) has completed.
///
/// `Err` if Redis could not be reached, or if the guard did not learn of it within the watchdog's
/// renewal interval and two command timeouts.
pub async fn lose(guard: &LockGuard) -> Result<(), Error> {
    let (core, hold) = guard.engine_parts();
    crate::primitives::lock::remove(core, &hold.keys).await?;
    core.watchdog.renew_now();
    let bound = core.config.get_renew_interval() + 2 * core.config.get_command_timeout();
    tokio::time::timeout(bound, guard.lost())
        .await
        .map_err(|_| Error::Timeout(bound))
}
