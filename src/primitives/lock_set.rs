//! `LockSet`: one guard over several names, all or none (Redisson's `RedissonMultiLock`; relock's
//! own `MultiLock` is Redisson's `RedissonRedLock`).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use std::sync::Arc;

use crate::engine::set_attempt::SetAttempt;
use crate::engine::wait::Wait;
use crate::primitives::guard::LockGuard;
use crate::primitives::lock::{Lock, WakeUp};
use crate::primitives::owner::Owner;
use crate::redis::keys::LockKeys;
use crate::redis::waiters::{Armed, Subscription};
use crate::Error;

/// Several named locks taken together, all or none: made by
/// [`LockClient::lock_all`](crate::LockClient::lock_all) or
/// [`MultiLock::lock_all`](crate::MultiLock::lock_all).
///
/// The names are sorted, duplicates removed. Each name is reentrant
/// per owner as a single lock is, so a task that holds one of the names (or the whole set) takes the
/// set again without waiting for itself; each name keeps its own lease, watchdog renewal and
/// fencing token.
///
/// **On one server** (a [`LockClient`](crate::LockClient) on a single Redis or a Sentinel-managed
/// primary, without `sync_replicas`) the whole set is taken **atomically**, by one script call per
/// attempt: no other client ever sees part of it taken by this acquisition. A refused attempt
/// waits for the release of the name that refused it, as a waiter of that lock alone would.
/// **Elsewhere** (a cluster, whose names live in different slots; a quorum; synced writes) the
/// names are taken one by one **in that fixed order**, each as its own [`Lock`], and what was
/// taken is given back if a later one cannot be: two callers whose sets overlap wait for each
/// other in the same order, so they cannot deadlock. Between the first name and the last, another
/// client can see some names taken (it then waits or is refused, as for any held lock).
///
/// A name in a set is the same lock as on its own: `client.lock("a")` and
/// `client.lock_all(&["a", "b"])` exclude each other on `a`.
///
/// ```no_run
/// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
/// // Move stock between two SKUs: both locked, or neither.
/// let both = client.lock_all(&["sku-42", "sku-7"]);
/// let guard = both.acquire().await?;
/// let from = guard.fencing_token("sku-42").await?;
/// # let _ = from;
/// drop(guard); // both released
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockSet {
    /// Sorted by name, without duplicates: the order every caller takes them in.
    locks: Vec<Lock>,
}

impl LockSet {
    pub(crate) fn new(mut locks: Vec<Lock>) -> LockSet {
        locks.sort_by(|a, b| a.name().cmp(b.name()));
        locks.dedup_by(|a, b| a.name() == b.name());
        LockSet { locks }
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.locks.iter().map(Lock::name)
    }

    /// Every name with a fixed lease (see [`Lock::lease`]).
    pub fn lease(self, lease: Duration) -> LockSet {
        LockSet {
            locks: self.locks.into_iter().map(|l| l.lease(lease)).collect(),
        }
    }

    /// Every name on behalf of `owner` (see [`Lock::owner`]).
    pub fn owner(self, owner: Owner) -> LockSet {
        LockSet {
            locks: self.locks.into_iter().map(|l| l.owner(owner.clone())).collect(),
        }
    }

    /// Waits until every name is held. Fails at the first name that fails (see
    /// [`Lock::acquire`]), giving back those already taken.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back the names taken so far and leaves no lock held.
    pub async fn acquire(&self) -> Result<LockSetGuard, Error> {
        self.check()?;
        if self.atomic() {
            return match self.acquire_at_once(Wait::Forever).await? {
                Some(guard) => Ok(guard),
                None => Err(Error::Shutdown), // not reached: an unbounded wait ends with a guard or an error
            };
        }
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            // On `?`, the guards taken so far are dropped: released in the background.
            guards.push(lock.acquire().await?);
        }
        Ok(LockSetGuard { guards })
    }

    /// One attempt per name, no waiting: `None` (and nothing held) if any name is held by another
    /// owner.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](LockSet::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockSetGuard>, Error> {
        self.check()?;
        if self.atomic() {
            return self.acquire_at_once(Wait::Once).await;
        }
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            match lock.try_acquire().await? {
                Some(guard) => guards.push(guard),
                None => return Ok(None),
            }
        }
        Ok(Some(LockSetGuard { guards }))
    }

    /// Waits at most `wait`, in all, for every name: `None` (and nothing held) if one is still held
    /// by another owner then. Returns within `wait` (see [`Lock::try_acquire_for`]).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](LockSet::acquire).
    pub async fn try_acquire_for(&self, wait: Duration) -> Result<Option<LockSetGuard>, Error> {
        self.check()?;
        if self.atomic() {
            return self.acquire_at_once(Wait::up_to(wait)?).await;
        }
        let until = crate::engine::wait::deadline(wait)?;
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let left = until.saturating_duration_since(Instant::now());
            match lock.try_acquire_for(left).await {
                Ok(Some(guard)) => guards.push(guard),
                Ok(None) => return Ok(None),
                // The wait ran out during a later name's attempt: as refused, not an error.
                Err(Error::Timeout(_)) if !guards.is_empty() && Instant::now() >= until => return Ok(None),
                Err(err) => return Err(err),
            }
        }
        Ok(Some(LockSetGuard { guards }))
    }

    /// Whether the set is taken in one script call (see [`Core::atomic_sets`](crate::engine::core::Core::atomic_sets)): one server.
    fn atomic(&self) -> bool {
        self.locks[0].core().atomic_sets()
    }

    /// The whole set in one script call per attempt, waiting as `wait` says. A refused attempt
    /// names the lock that refused it; the set waits for that lock's release, as a waiter of that
    /// lock alone would (and passes the release on if another name then refuses it, so that a
    /// waiter of that lock alone is not left asleep).
    async fn acquire_at_once(&self, wait: Wait) -> Result<Option<LockSetGuard>, Error> {
        let core = self.locks[0].core();
        let keys: Vec<Arc<LockKeys>> = self.locks.iter().map(|lock| lock.keys().clone()).collect();
        let (owner, mode) = (self.locks[0].owner_id(), self.locks[0].mode());
        let node = &core.masters.nodes[0];
        let until = wait.until();
        // The lock waited for, and the subscription to its release channel.
        let mut waiting: Option<(usize, Subscription)> = None;
        let mut armed: Option<Armed> = None;
        let mut wake_up = WakeUp(None);
        let mut refused = false;
        loop {
            if let Some((_, subscription)) = &waiting {
                armed = Some(subscription.armed());
            }
            let (ttl, at) = match core.attempt_all(&keys, &owner, mode, until).await {
                Ok(SetAttempt::Granted(grants)) => {
                    wake_up.0 = None;
                    let guards = grants
                        .into_iter()
                        .map(|grant| LockGuard::new(core.clone(), grant))
                        .collect();
                    return Ok(Some(LockSetGuard { guards }));
                }
                Ok(SetAttempt::Refused { ttl, at }) => {
                    refused = true;
                    (ttl, at)
                }
                Err(Error::Timeout(_)) if wait.ran_out() => return wait.ran_out_result(refused),
                Err(err) => return Err(err),
            };
            // Woken by the release of a lock that another name then refused: not ours to keep.
            if let Some(notify) = wake_up.0.take() {
                if waiting.as_ref().is_some_and(|(i, _)| *i != at) {
                    notify.notify_one();
                }
            }
            if wait.over() {
                return Ok(None);
            }
            if waiting.as_ref().is_none_or(|(i, _)| *i != at) {
                let (subscription, wake, confirmed) = node.waiters.subscribe(&keys[at].channel, None);
                waiting = Some((at, subscription));
                armed = Some(wake);
                if confirmed {
                    // A release may have come between the attempt and the subscription.
                    continue;
                }
            }
            let wake_at = wait.wake_at(ttl.unwrap_or(core.masters.config.retry_delay));
            match armed.take() {
                Some(released) => tokio::select! {
                    _ = released => wake_up.0 = waiting.as_ref().map(|(_, s)| s.waker()),
                    () = tokio::time::sleep_until(wake_at) => {}
                },
                None => tokio::time::sleep_until(wake_at).await,
            }
        }
    }

    /// Checks every name (and lease) before any I/O: bad input changes nothing.
    fn check(&self) -> Result<(), Error> {
        if self.locks.is_empty() {
            return Err(Error::InvalidName("lock_all needs at least one name".into()));
        }
        self.locks.iter().try_for_each(Lock::check_input)
    }
}

/// The guard of a [`LockSet`]: every name held; dropping it releases them all (without blocking).
#[must_use = "dropping the guard releases the locks at once"]
#[derive(Debug)]
pub struct LockSetGuard {
    guards: Vec<LockGuard>,
}

impl LockSetGuard {
    /// The guard of each name, in the set's order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The fencing token of `name` (each name has its own counter; see
    /// [`LockGuard::fencing_token`]); `Ok(None)` if it is not in the set.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::fencing_token`]: [`Error::LeaseLost`] once that name's lease is lost.
    pub async fn fencing_token(&self, name: &str) -> Result<Option<u64>, Error> {
        match self.guards.iter().find(|g| g.name() == name) {
            Some(guard) => guard.fencing_token().await.map(Some),
            None => Ok(None),
        }
    }

    /// Whether every name's lease is still held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// How long every lease is still known to be valid: the shortest.
    pub fn validity(&self) -> Duration {
        self.guards
            .iter()
            .map(LockGuard::validity)
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Completes when any name's lease is lost.
    pub async fn lost(&self) {
        futures::future::select_all(self.guards.iter().map(|g| Box::pin(g.lost()))).await;
    }

    /// Runs `work` while every lease is held: if one is lost first, `work` is dropped and
    /// `Err(Error::LeaseLost)` is returned.
    pub async fn until_lost<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        crate::primitives::guard::until_lost(self.is_held(), self.lost(), work).await
    }

    /// Releases every name (one level of reentrancy each), in reverse order, and waits for Redis to
    /// confirm; every release is made, and the first error is returned.
    pub async fn release(mut self) -> Result<(), Error> {
        let mut first = None;
        while let Some(guard) = self.guards.pop() {
            if let Err(err) = guard.release().await {
                first.get_or_insert(err);
            }
        }
        first.map_or(Ok(()), Err)
    }
}
