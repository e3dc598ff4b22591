//! `RwLock`: a read-write lock, Redisson's `RReadWriteLock` made safe against its known failures.

use fred::bytes_utils::Str;
use std::sync::Arc;

use crate::engine::core::Core;
use crate::primitives::lock::Lock;
use crate::redis::keys::RwKeys;
use crate::Error;

/// A named read-write lock: many readers or one writer. Cheap to create and to clone, no I/O until
/// it is used.
///
/// [`read`](RwLock::read) and [`write`](RwLock::write) hand out a plain [`Lock`] for each side, so
/// acquiring, waiting, leases, owners and guards are those of every lock:
///
/// - Both sides are **reentrant** per [`Owner`](crate::Owner).
/// - A **writer may also read** (a downgrade): the owner of the write lock takes the read lock at
///   once, and keeps it after releasing the write lock.
/// - A **reader asking for the write lock** gets [`Error::Upgrade`] at once, not a deadlock.
/// - A **waiting writer holds back new readers**, so a stream of readers cannot starve writers: from
///   its first refusal on, a writer that waits (not [`try_acquire`](Lock::try_acquire)) is recorded,
///   and fresh read acquisitions wait behind it (a reader re-entering its own hold does not). The
///   record lives by a heartbeat that the watchdog keeps while the writer waits: a writer that
///   stops waiting removes it, and one that crashed holds readers back for at most one
///   `watchdog_timeout` after the last live writer stopped waiting (the waiting writers' records
///   are one key, whose TTL their heartbeats share).
/// - **Every reader's lease is its own**: a key per reader, renewed by the watchdog. One reader's
///   crash frees its own share within its lease and cuts no other reader's.
/// - **Fencing tokens** come with the write lock; a read guard's token is 0.
///
/// Waiters of both sides are woken by release messages, without polling.
///
/// Works on one server, a Redis Cluster (the keys of one lock share its `{name}` hash tag) and a
/// Sentinel-managed primary, and by quorum on a [`MultiLock`](crate::MultiLock). The keys
/// (`prefix:{name}:rw...`) are not those of the plain lock of the same name.
///
/// ```no_run
/// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
/// let config = client.rw_lock("config:pricing");
/// {
///     let _read = config.read().acquire().await?;   // many tasks and clients at once
///     // ... read the cached config ...
/// }
/// let write = config.write().acquire().await?;      // alone; new readers wait
/// let token = write.fencing_token().await?;         // for the store that takes the write
/// # let _ = token;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RwLock {
    core: Arc<Core>,
    name: Str,
    keys: Arc<RwKeys>,
}

impl RwLock {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> RwLock {
        let keys = Arc::new(RwKeys::new(core.config.get_key_prefix(), name));
        RwLock {
            core,
            name: name.into(),
            keys,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The read side: held by many owners at once, none while a writer holds the write side.
    pub fn read(&self) -> Lock {
        Lock::with_keys(self.core.clone(), &self.name, Arc::new(self.keys.read_side()))
    }

    /// The write side: held by one owner, and only while no other owner reads.
    pub fn write(&self) -> Lock {
        Lock::with_keys(self.core.clone(), &self.name, Arc::new(self.keys.write(None)))
    }

    /// Whether a writer or a reader holds it (on a majority of the masters).
    pub async fn is_locked(&self) -> Result<bool, Error> {
        Ok(self.write().is_locked().await? || self.read().is_locked().await?)
    }

    /// Removes the writer, every reader and every waiting writer's record, whoever they are (an
    /// administrative override; see [`Lock::force_unlock`]). `true` if a holder was removed.
    pub async fn force_unlock(&self) -> Result<bool, Error> {
        self.write().force_unlock().await
    }
}

impl std::fmt::Debug for RwLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock").field("name", &self.name).finish()
    }
}
