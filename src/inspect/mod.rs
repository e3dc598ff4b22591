//! Operators' reads of who holds what: the `LockClient::inspect*` and `held_*` methods and the
//! types they answer with. Uses `crate::redis` (node, keys, identity), `crate::primitives::client`
//! (`LockClient`), config and error; nothing above it.
//!
//! What they read: one lock's holders, lease and fence ([`LockClient::inspect`]), every held lock
//! of the client's prefix ([`LockClient::held_locks`]), a fair lock's holder and queue
//! ([`LockClient::inspect_fair_lock`], [`LockClient::held_fair_locks`]), a read-write lock's
//! writer, readers and waiting writers ([`LockClient::inspect_rw_lock`],
//! [`LockClient::held_rw_locks`]), and a semaphore's permits and holders
//! ([`LockClient::inspect_semaphore`], [`LockClient::held_semaphores`]). Reads only: nothing here
//! changes a key.
//!
//! A lock is the hash `{prefix}:{name}` (see `redis/keys.rs`) whose fields are holds,
//! `client:owner:generation` (see `Owner::id_for` and `engine/hold.rs`), each with its hold count;
//! its fence counter is `{prefix}:{name}:fence`. A semaphore is the index hash
//! `{prefix}:{name}:sem` (field `permits`, and one field per holder key with its permits) and one
//! holder key per holder, `{prefix}:{name}:sem:h:client:owner`, a hash whose one field
//! `client:owner:generation` holds its permits, with the holder's lease as its TTL (see
//! `scripts/semaphore_acquire.lua`). A fair lock is a lock hash `{prefix}:{name}:fair` and its
//! queue (see `scripts/fair_acquire.lua`); a read-write lock a lock hash `{prefix}:{name}:rw` (the
//! write lock), its readers' keys and its waiting writers (see `scripts/rw_read.lua`). All of one
//! name are read in one script call, `scripts/inspect.lua`.
//!
//! Here the public types are re-exported and the `LockClient` methods defined; `info.rs` holds the
//! types, `read.rs` the script calls and the parsing of their replies, `scan.rs` the listing by
//! `SCAN`, and `clients.rs` the holders' client records.

mod clients;
mod info;
mod read;
mod scan;

pub use crate::redis::identity::ClientInfo;
pub use info::{
    ElectionInfo, FairLockInfo, Holder, LockInfo, PermitHolder, ReadHold, RwLockInfo, SemaphoreInfo, Waiter,
};

use crate::config::check_name;
use crate::primitives::election::ELECTION_PREFIX;
use crate::redis::keys::{FairKeys, LockKeys, RwKeys, SemaphoreKeys};
use crate::redis::node::Node;
use crate::{Error, LockClient};
use read::{read, read_fair, read_rw, read_semaphore, Lookup, Read};
use scan::{read_all, scan_names};

impl LockClient {
    /// The state of the lock `name` on this client's Redis: its holders, the time left on its lease
    /// and its fencing counter, read in one script call (consistent). `Ok(None)` if nobody holds it.
    /// Reads only.
    ///
    /// Fails with [`Error::InvalidName`] for a name no lock can have (before any I/O), with
    /// [`Error::WrongType`] if the key holds something that is not a relock lock, and within the
    /// command timeout with [`Error::Timeout`] or [`Error::Redis`].
    ///
    /// ```no_run
    /// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
    /// if let Some(info) = client.inspect("inventory:sku-42").await? {
    ///     for holder in &info.holders {
    ///         println!("{}:{} holds it {} times", holder.client_id, holder.owner, holder.count);
    ///     }
    ///     println!("lease left {:?}, fence {:?}", info.ttl, info.fence);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>, Error> {
        check_name(name)?;
        let keys = LockKeys::new(self.config().get_key_prefix(), name);
        match read(self.node(), &keys).await? {
            Read::Free => Ok(None),
            Read::Foreign => Err(Error::WrongType(keys.lock.to_string())),
            Read::Held(info) => Ok(self.with_clients(vec![info]).await?.pop()),
        }
    }

    /// Every lock held on this client's Redis under its key prefix, sorted by name; with a
    /// `pattern`, only those whose name matches it (a Redis glob: `*`, `?`, `[abc]`, `\` escapes).
    /// On a cluster, every primary is scanned. Keys under the prefix that are not relock locks are
    /// left out.
    ///
    /// Uses `SCAN` (never `KEYS`, which blocks the server), so a lock taken or released while the
    /// scan runs may or may not be listed; each lock listed is read consistently. Reads only. Each
    /// request is bounded by the command timeout; the whole takes a round trip per thousand keys of
    /// the keyspace.
    ///
    /// Fails with [`Error::InvalidName`] for a pattern with braces or control characters (no lock
    /// name has them), before any I/O.
    pub async fn held_locks(&self, pattern: Option<&str>) -> Result<Vec<LockInfo>, Error> {
        let prefix = self.config().get_key_prefix();
        let node = self.node();
        let names = scan_names(node, prefix, pattern, &[""]).await?;
        let locks = read_all(names, |name| async move {
            let keys = LockKeys::new(prefix, &name);
            Ok(match read(node, &keys).await? {
                Read::Held(info) => Some(info),
                _ => None,
            })
        })
        .await?;
        self.with_clients(locks).await
    }

    /// The state of the fair lock `name` (see [`fair_lock`](LockClient::fair_lock)): its hold as
    /// [`inspect`](LockClient::inspect) reads a lock's, and its queue in order, read in one script
    /// call (consistent). `Ok(None)` if nobody holds it and nobody waits. Reads only.
    ///
    /// # Errors
    ///
    /// As [`inspect`](LockClient::inspect): [`Error::WrongType`] if one of its keys holds something
    /// that is not relock's.
    pub async fn inspect_fair_lock(&self, name: &str) -> Result<Option<FairLockInfo>, Error> {
        check_name(name)?;
        let keys = FairKeys::new(self.config().get_key_prefix(), name);
        let info = read_fair(self.node(), &keys).await?.answer(&keys.lock)?;
        Ok(self.with_clients(info.into_iter().collect()).await?.pop())
    }

    /// Every held fair lock under this client's key prefix, sorted by name; with a `pattern`, only
    /// those whose name matches it (a Redis glob, as [`held_locks`](LockClient::held_locks)). On a
    /// cluster, every primary is scanned, with `SCAN`; each lock listed is read consistently, with
    /// its queue. Keys that are not relock's are left out. Reads only.
    ///
    /// # Errors
    ///
    /// As [`held_locks`](LockClient::held_locks).
    pub async fn held_fair_locks(&self, pattern: Option<&str>) -> Result<Vec<FairLockInfo>, Error> {
        let prefix = self.config().get_key_prefix();
        let node = self.node();
        let names = scan_names(node, prefix, pattern, &[":fair"]).await?;
        let locks = read_all(names, |name| async move {
            let keys = FairKeys::new(prefix, &name);
            Ok(match read_fair(node, &keys).await? {
                Lookup::Found(info) if info.lock.is_some() => Some(info),
                _ => None,
            })
        })
        .await?;
        self.with_clients(locks).await
    }

    /// The state of the read-write lock `name` (see [`rw_lock`](LockClient::rw_lock)): its write
    /// hold as [`inspect`](LockClient::inspect) reads a lock's, each live reader's hold and lease,
    /// and the writers waiting, read in one script call (consistent). `Ok(None)` if nobody writes,
    /// reads or waits to write. Reads only.
    ///
    /// # Errors
    ///
    /// As [`inspect`](LockClient::inspect): [`Error::WrongType`] if one of its keys holds something
    /// that is not relock's.
    ///
    /// ```no_run
    /// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
    /// if let Some(info) = client.inspect_rw_lock("config").await? {
    ///     println!("{} readers, {} writers waiting", info.readers.len(), info.waiting_writers.len());
    ///     if let Some(writer) = &info.writer {
    ///         println!("written by {:?}", writer.holders);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect_rw_lock(&self, name: &str) -> Result<Option<RwLockInfo>, Error> {
        check_name(name)?;
        let keys = RwKeys::new(self.config().get_key_prefix(), name);
        let info = read_rw(self.node(), &keys).await?.answer(&keys.write)?;
        Ok(self.with_clients(info.into_iter().collect()).await?.pop())
    }

    /// Every read-write lock that is written or read under this client's key prefix, sorted by
    /// name; with a `pattern`, only those whose name matches it (a Redis glob, as
    /// [`held_locks`](LockClient::held_locks)). On a cluster, every primary is scanned, with
    /// `SCAN`; each lock listed is read consistently. Keys that are not relock's are left out.
    /// Reads only.
    ///
    /// # Errors
    ///
    /// As [`held_locks`](LockClient::held_locks).
    pub async fn held_rw_locks(&self, pattern: Option<&str>) -> Result<Vec<RwLockInfo>, Error> {
        let prefix = self.config().get_key_prefix();
        let node = self.node();
        let names = scan_names(node, prefix, pattern, &[":rw", ":rw:readers"]).await?;
        let locks = read_all(names, |name| async move {
            let keys = RwKeys::new(prefix, &name);
            Ok(match read_rw(node, &keys).await? {
                Lookup::Found(info) if info.is_held() => Some(info),
                _ => None,
            })
        })
        .await?;
        self.with_clients(locks).await
    }

    /// The state of the semaphore `name` on this client's Redis: the permits stored with it, and
    /// each live holder's permits and lease left, read in one script call (consistent).
    /// `Ok(None)` if there is no semaphore of that name. A semaphore that was used keeps its index
    /// (with its permits) when nobody holds any: it is then `Some`, with no holders. Reads only.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name no semaphore can have (before any I/O),
    /// [`Error::WrongType`] if its index key holds something that is not a relock semaphore, and
    /// within the command timeout [`Error::Timeout`] or [`Error::Redis`].
    ///
    /// ```no_run
    /// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
    /// if let Some(info) = client.inspect_semaphore("partner-api").await? {
    ///     println!("{} of {} permits free", info.available(), info.permits);
    ///     for holder in &info.holders {
    ///         println!("{}:{} holds {} for {:?} more", holder.client_id, holder.owner,
    ///                  holder.permits, holder.ttl);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect_semaphore(&self, name: &str) -> Result<Option<SemaphoreInfo>, Error> {
        check_name(name)?;
        let keys = SemaphoreKeys::new(self.config().get_key_prefix(), name);
        let info = read_semaphore(self.node(), &keys).await?.answer(&keys.index)?;
        Ok(self.with_clients(info.into_iter().collect()).await?.pop())
    }

    /// Every semaphore with at least one live holder under this client's key prefix, sorted by
    /// name; with a `pattern`, only those whose name matches it (a Redis glob, as
    /// [`held_locks`](LockClient::held_locks)). On a cluster, every primary is scanned. Uses `SCAN`,
    /// never `KEYS`; each semaphore listed is read consistently. Keys that are not relock semaphores
    /// are left out. Reads only.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a pattern with braces or control characters (before any I/O);
    /// [`Error::Timeout`] or [`Error::Redis`] when a request fails.
    pub async fn held_semaphores(&self, pattern: Option<&str>) -> Result<Vec<SemaphoreInfo>, Error> {
        let prefix = self.config().get_key_prefix();
        let node = self.node();
        let names = scan_names(node, prefix, pattern, &[":sem"]).await?;
        let semaphores = read_all(names, |name| async move {
            let keys = SemaphoreKeys::new(prefix, &name);
            Ok(match read_semaphore(node, &keys).await? {
                Lookup::Found(info) if !info.holders.is_empty() => Some(info),
                _ => None,
            })
        })
        .await?;
        self.with_clients(semaphores).await
    }
    /// The elections that have a leader now (see [`election`](LockClient::election)), whose
    /// names match the Redis glob `pattern` (every one if `None`): found by `SCAN` of the leaders'
    /// records on every primary, then each leader read as [`Election::leader`](crate::Election::leader)
    /// reads it, sorted by name. Reads only.
    pub async fn held_elections(&self, pattern: Option<&str>) -> Result<Vec<ElectionInfo>, Error> {
        let prefix = self.config().get_key_prefix();
        let pattern = format!("{ELECTION_PREFIX}{}", pattern.unwrap_or("*"));
        let names = scan_names(self.node(), prefix, Some(&pattern), &[":leader"]).await?;
        read_all(names, |lock| async move {
            let name = lock.strip_prefix(ELECTION_PREFIX).unwrap_or(&lock).to_string();
            let leader = self.election(&name).leader().await?;
            Ok(leader.map(|leader| ElectionInfo { name, leader }))
        })
        .await
    }

    fn node(&self) -> &Node {
        &self.core.masters.nodes[0]
    }
}
