//! What is held, read from Redis, for operators: one lock's holders, lease and fence
//! ([`LockClient::inspect`]), every held lock of the client's prefix
//! ([`LockClient::held_locks`]), a fair lock's holder and queue
//! ([`LockClient::inspect_fair_lock`], [`LockClient::held_fair_locks`]), a read-write lock's
//! writer, readers and waiting writers ([`LockClient::inspect_rw_lock`],
//! [`LockClient::held_rw_locks`]), and a semaphore's permits and holders
//! ([`LockClient::inspect_semaphore`], [`LockClient::held_semaphores`]). Reads only: nothing here
//! changes a key.
//!
//! A lock is the hash `{prefix}:{name}` (see `keys.rs`) whose fields are holds, `client:owner:generation`
//! (see `Owner::id_for` and `hold.rs`), each with its hold count; its fence counter is
//! `{prefix}:{name}:fence`. A semaphore is the index hash `{prefix}:{name}:sem` (field `permits`,
//! and one field per holder key with its permits) and one holder key per holder,
//! `{prefix}:{name}:sem:h:client:owner`, a hash whose one field `client:owner:generation` holds its
//! permits, with the holder's lease as its TTL (see `scripts/semaphore_acquire.lua`). A fair lock is
//! a lock hash `{prefix}:{name}:fair` and its queue (see `scripts/fair_acquire.lua`); a read-write
//! lock a lock hash `{prefix}:{name}:rw` (the write lock), its readers' keys and its waiting
//! writers (see `scripts/rw_read.lua`). All of one name are read in one script call,
//! `scripts/inspect.lua`.

use std::collections::BTreeSet;
use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::types::Value;

use crate::config::check_name;
use crate::redis::keys::{FairKeys, LockKeys, RwKeys, SemaphoreKeys};
use crate::redis::node::Node;

pub use crate::redis::identity::ClientInfo;
use crate::{Error, LockClient};

/// A time left, as whole milliseconds (`null` for none), in the inspection types' JSON.
#[cfg(feature = "serde")]
fn millis<S: serde::Serializer>(ttl: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match ttl {
        Some(ttl) => serializer.serialize_some(&(ttl.as_millis().min(u64::MAX as u128) as u64)),
        None => serializer.serialize_none(),
    }
}

/// One lock as read from Redis at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name, as given to [`LockClient::lock`].
    pub name: String,
    /// The Redis key of the lock hash (`{prefix}:{name}`, braces included).
    pub key: String,
    /// The holds in the hash. Normally one; a second one is an ended generation of the same owner
    /// whose removal is still on its way.
    pub holders: Vec<Holder>,
    /// The time left on the lease (`PTTL`); `None` if the key has no expiry, which relock never
    /// leaves behind.
    #[cfg_attr(feature = "serde", serde(rename = "ttl_ms", serialize_with = "millis"))]
    pub ttl: Option<Duration>,
    /// The fencing counter of the name: the token of its latest fresh acquisition (on this master),
    /// `None` if there is none or it is not a number.
    pub fence: Option<u64>,
    /// Another owner was refused while the current hold held the lock, and may wait: its release
    /// will be announced (a refusal marks the hold, see `scripts/acquire.lua`; a release with no
    /// mark publishes nothing).
    pub contended: bool,
}

impl LockInfo {
    /// The sum of the holders' hold counts: the reentrancy depth of the (normally single) holder.
    pub fn hold_count(&self) -> u64 {
        self.holders.iter().map(|h| h.count).sum()
    }
}

/// One hold of a lock: a field of the lock hash, `client:owner:generation`, and its count.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Holder {
    /// The whole hash field, as stored.
    pub field: String,
    /// The id of the [`LockClient`] that holds it (a UUID in 32 hex digits, random per client).
    pub client_id: String,
    /// The owner within that client: `t<id>` for a tokio task, `th<id>` for a thread, `o<uuid>`
    /// for an explicit [`Owner`](crate::Owner).
    pub owner: String,
    /// The generation of the hold: one uninterrupted possession, unique in the holder's process.
    pub generation: u64,
    /// The hold count: how many times the owner acquired it without releasing.
    pub count: u64,
    /// The client that holds it, as it describes itself; `None` if its record is not there (an
    /// older relock, or a client that stopped renewing for a lease).
    pub client: Option<ClientInfo>,
}

impl Holder {
    /// Parses a field and its count; `None` if it is not one relock writes.
    fn parse(field: &str, count: &str) -> Option<Holder> {
        let (id, generation) = field.rsplit_once(':')?;
        let (client_id, owner) = owner_id(id)?;
        if !generation.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Holder {
            field: field.to_string(),
            client_id: client_id.to_string(),
            owner: owner.to_string(),
            generation: generation.parse().ok()?,
            count: count.parse().ok()?,
            client: None,
        })
    }
}

/// The client id and the owner of an owner id `client:owner`, if it is one relock writes.
fn owner_id(id: &str) -> Option<(&str, &str)> {
    let (client_id, owner) = id.split_once(':')?;
    let valid = client_id.len() == 32
        && client_id.bytes().all(|b| b.is_ascii_hexdigit())
        && !owner.is_empty()
        && !owner.chars().any(char::is_control);
    valid.then_some((client_id, owner))
}

/// An owner that waits: in a fair lock's queue, or as a writer of a read-write lock (whose waiting
/// holds new readers back).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Waiter {
    /// The id of the [`LockClient`] it waits in (32 hex digits, random per client).
    pub client_id: String,
    /// The owner within that client, as in [`Holder::owner`].
    pub owner: String,
    /// How long its place is kept without a renewal (its key's `PTTL`): the watchdog renews it
    /// while the owner waits, so a waiter that crashed drops out when it runs out. A read-write
    /// lock's waiting writers share one. `None` if the key has no expiry, which relock never
    /// leaves behind.
    #[cfg_attr(feature = "serde", serde(rename = "ttl_ms", serialize_with = "millis"))]
    pub ttl: Option<Duration>,
}

impl Waiter {
    fn parse(id: &str, ttl: i64) -> Option<Waiter> {
        let (client_id, owner) = owner_id(id)?;
        Some(Waiter {
            client_id: client_id.to_string(),
            owner: owner.to_string(),
            ttl: ttl_of(ttl),
        })
    }
}

/// One fair lock as read from Redis at one moment: its hold and its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct FairLockInfo {
    /// The fair lock's name, as given to [`LockClient::fair_lock`].
    pub name: String,
    /// The lock hash (`{prefix}:{name}:fair`), as [`LockClient::inspect`] reads a lock's; `None`
    /// when nobody holds it.
    pub lock: Option<LockInfo>,
    /// The owners waiting their turn, first come first, the first 1,000 of them. A waiter whose
    /// key ran out (it crashed) is left out, as the lock skips it.
    pub queue: Vec<Waiter>,
}

/// One read-write lock as read from Redis at one moment: its writer, its readers and the writers
/// waiting for them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RwLockInfo {
    /// The read-write lock's name, as given to [`LockClient::rw_lock`].
    pub name: String,
    /// The write lock (`{prefix}:{name}:rw`), as [`LockClient::inspect`] reads a lock's; `None`
    /// when nobody writes.
    pub writer: Option<LockInfo>,
    /// The live read holds, sorted by key: each reader's own key with its own lease.
    pub readers: Vec<ReadHold>,
    /// The writers waiting for the readers to leave (new readers are held back meanwhile).
    pub waiting_writers: Vec<Waiter>,
}

impl RwLockInfo {
    /// Whether it is written or read: a writer, or at least one live reader (writers that only
    /// wait do not hold it).
    pub fn is_held(&self) -> bool {
        self.writer.is_some() || !self.readers.is_empty()
    }
}

/// One reader's hold of a read-write lock: a key of its own, whose TTL is its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ReadHold {
    /// The reader's key (`{prefix}:{name}:rw:readers:client:owner`).
    pub key: String,
    /// Its hold: owner, generation and count, as a lock's.
    pub holder: Holder,
    /// The time left on its lease (`PTTL`); `None` if the key has no expiry, which relock never
    /// leaves behind.
    #[cfg_attr(feature = "serde", serde(rename = "ttl_ms", serialize_with = "millis"))]
    pub ttl: Option<Duration>,
}

/// A `PTTL` as a time left: `None` for no expiry (-1), zero for a key that is gone (-2).
fn ttl_of(ms: i64) -> Option<Duration> {
    match ms {
        -1 => None,
        ms => Some(Duration::from_millis(ms.max(0) as u64)),
    }
}

/// One semaphore as read from Redis at one moment: its permits and its live holders.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SemaphoreInfo {
    /// The semaphore's name, as given to [`LockClient::semaphore`].
    pub name: String,
    /// The Redis key of its index hash (`{prefix}:{name}:sem`, braces included).
    pub key: String,
    /// The number of permits stored with it: the `permits` of the acquisition that set it (see
    /// [`Semaphore`](crate::Semaphore) on callers that disagree).
    pub permits: u64,
    /// Its live holders (their key still there), sorted by key. A holder whose lease ran out (or
    /// whose release is on its way) is left out: its permits count as free, as acquisitions count
    /// them.
    pub holders: Vec<PermitHolder>,
}

impl SemaphoreInfo {
    /// The permits the live holders hold.
    pub fn held(&self) -> u64 {
        self.holders.iter().map(|h| h.permits).sum()
    }

    /// The permits free now: [`permits`](SemaphoreInfo::permits) less [`held`](SemaphoreInfo::held).
    pub fn available(&self) -> u64 {
        self.permits.saturating_sub(self.held())
    }
}

/// One holder of a semaphore's permits: one acquisition, with a lease of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct PermitHolder {
    /// The Redis key of the holder (`{prefix}:{name}:sem:h:client:owner`), whose TTL is its lease.
    pub key: String,
    /// The id of the [`LockClient`] that holds the permits (32 hex digits, random per client).
    pub client_id: String,
    /// The holder within that client: `o<uuid>`, one per acquisition (permits are not reentrant).
    pub owner: String,
    /// The generation of the hold, unique in the holder's process; `None` if its key has no field
    /// relock writes.
    pub generation: Option<u64>,
    /// How many permits it holds.
    pub permits: u64,
    /// The time left on its lease (`PTTL`); `None` if its key has no expiry, which relock never
    /// leaves behind.
    #[cfg_attr(feature = "serde", serde(rename = "ttl_ms", serialize_with = "millis"))]
    pub ttl: Option<Duration>,
    /// The client that holds them, as in [`Holder::client`].
    pub client: Option<ClientInfo>,
}

/// The most lock reads in flight at once while listing.
const READS_IN_FLIGHT: usize = 64;

/// Keys asked of `SCAN` per call: large enough that a big keyspace takes few round trips, small
/// enough that one call does not block the server for long.
const SCAN_COUNT: i64 = 1000;

/// The most `SCAN` pages read of one server: 2^32 keys, Redis's own limit per database.
const MAX_SCAN_PAGES: usize = (1 << 32) / SCAN_COUNT as usize;

/// A lock read: not there, there but not a relock lock, or a lock.
enum Read {
    Free,
    Foreign,
    Held(LockInfo),
}

/// A semaphore, fair lock or read-write lock read: not there, there but not relock's, or found.
enum Lookup<T> {
    Absent,
    Foreign,
    Found(T),
}

impl<T> Lookup<T> {
    /// As the `inspect_*` methods answer: `Foreign` is [`Error::WrongType`] for `key`.
    fn answer(self, key: &str) -> Result<Option<T>, Error> {
        match self {
            Lookup::Absent => Ok(None),
            Lookup::Foreign => Err(Error::WrongType(key.to_string())),
            Lookup::Found(info) => Ok(Some(info)),
        }
    }
}

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

    fn node(&self) -> &Node {
        &self.core.masters.nodes[0]
    }

    /// `items` with each holder's [`ClientInfo`] filled in from the clients' records (one read
    /// per distinct client, at most [`READS_IN_FLIGHT`] at once). A record that is not there, or
    /// not relock's, leaves `None`.
    async fn with_clients<T: Holders>(&self, mut items: Vec<T>) -> Result<Vec<T>, Error> {
        let mut ids = std::collections::BTreeSet::new();
        for item in &mut items {
            item.each_client(&mut |id, _| {
                ids.insert(id.to_string());
            });
        }
        if ids.is_empty() {
            return Ok(items);
        }
        let (node, prefix) = (self.node(), self.config().get_key_prefix());
        let records = read_all(ids.into_iter().collect(), |id| async move {
            let key = crate::redis::identity::record_key(prefix, &id);
            let value = node.read_record(&key).await?;
            Ok(value
                .and_then(|value| crate::redis::identity::parse(&value))
                .map(|info| (id, info)))
        })
        .await?;
        let records: std::collections::HashMap<String, ClientInfo> = records.into_iter().collect();
        for item in &mut items {
            item.each_client(&mut |id, client| *client = records.get(id).cloned());
        }
        Ok(items)
    }
}

/// What has holders whose clients [`LockClient::with_clients`] looks up.
trait Holders {
    /// Calls `f` with each holder's client id and its client slot.
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>));
}

impl Holders for LockInfo {
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>)) {
        for holder in &mut self.holders {
            f(&holder.client_id, &mut holder.client);
        }
    }
}

impl Holders for FairLockInfo {
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>)) {
        if let Some(lock) = &mut self.lock {
            lock.each_client(f);
        }
    }
}

impl Holders for RwLockInfo {
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>)) {
        if let Some(writer) = &mut self.writer {
            writer.each_client(f);
        }
        for reader in &mut self.readers {
            f(&reader.holder.client_id, &mut reader.holder.client);
        }
    }
}

impl Holders for SemaphoreInfo {
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>)) {
        for holder in &mut self.holders {
            f(&holder.client_id, &mut holder.client);
        }
    }
}

/// Reads each of `names` with `read`, at most [`READS_IN_FLIGHT`] at once, and keeps what it
/// found, in order.
async fn read_all<T, F, R>(names: Vec<String>, read: F) -> Result<Vec<T>, Error>
where
    F: Fn(String) -> R,
    R: std::future::Future<Output = Result<Option<T>, Error>>,
{
    let mut out = Vec::new();
    let mut names = names.into_iter().peekable();
    while names.peek().is_some() {
        let reads = names.by_ref().take(READS_IN_FLIGHT).map(&read);
        for found in futures::future::join_all(reads).await {
            out.extend(found?);
        }
    }
    Ok(out)
}

/// The names of the keys `{prefix}:{name}{suffix}` (for any of `suffixes`) on every primary whose
/// name matches `pattern` (every name if `None`), sorted and deduplicated, found by `SCAN`.
async fn scan_names(
    node: &Node,
    prefix: &str,
    pattern: Option<&str>,
    suffixes: &[&str],
) -> Result<Vec<String>, Error> {
    let pattern = pattern.unwrap_or("*");
    if pattern.contains(['{', '}']) || pattern.chars().any(char::is_control) {
        return Err(Error::InvalidName(format!(
            "the pattern must not contain braces or control characters: {pattern:?}"
        )));
    }
    let link = &node.link;
    let mut names = BTreeSet::new();
    let primaries = link.topology.primaries(&link.client, &link.options);
    if primaries.is_empty() {
        // A cluster whose slot map is not known: an empty list would be a lie.
        return Err(Error::Redis(fred::error::Error::new(
            fred::error::ErrorKind::Cluster,
            "the cluster's primaries are not known yet",
        )));
    }
    for suffix in suffixes {
        let matching = format!("{}:{{{pattern}}}{}", escape_glob(prefix), escape_glob(suffix));
        for primary in &primaries {
            for key in scan(node, primary, &matching).await? {
                if let Some(name) = key.strip_suffix(suffix).and_then(|key| name_of(key, prefix)) {
                    names.insert(name.to_string());
                }
            }
        }
    }
    Ok(names.into_iter().collect())
}

/// `pattern` with the characters special to Redis globs escaped, to match itself only.
fn escape_glob(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lock name in a key `{prefix}:{name}`, if it is one a lock can have.
fn name_of<'k>(key: &'k str, prefix: &str) -> Option<&'k str> {
    let name = key.strip_prefix(prefix)?.strip_prefix(":{")?.strip_suffix('}')?;
    check_name(name).ok()?;
    Some(name)
}

/// Every key that `SCAN ... MATCH pattern` finds on one server (a cluster primary, or the server).
async fn scan(node: &Node, server: &WithOptions<Client>, pattern: &str) -> Result<Vec<String>, Error> {
    let mut cursor = "0".to_string();
    let mut keys = Vec::new();
    // A server that never ends the iteration (a cursor seen before, or pages past any keyspace
    // Redis holds) is an error, not an endless loop.
    let mut seen = std::collections::HashSet::new();
    loop {
        if !seen.insert(cursor.clone()) || seen.len() > MAX_SCAN_PAGES {
            return Err(Error::Redis(fred::error::Error::new(
                fred::error::ErrorKind::Parse,
                format!("SCAN did not end: cursor {cursor} after {} pages", seen.len()),
            )));
        }
        let reply = node.scan_page(server, &cursor, pattern, SCAN_COUNT).await?;
        let Value::Array(mut parts) = reply else {
            return Err(malformed("SCAN", &reply));
        };
        let (Some(found), Some(next), None) = (parts.pop(), parts.pop(), parts.pop()) else {
            return Err(malformed("SCAN", &Value::Array(parts)));
        };
        let Some(next) = next.as_string() else {
            return Err(malformed("SCAN", &next));
        };
        let Value::Array(found) = found else {
            return Err(malformed("SCAN", &found));
        };
        // A key that is not UTF-8 is no lock's: names are strings.
        keys.extend(found.iter().filter_map(|key| key.as_str().map(|k| k.to_string())));
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Reads one lock in one script call (`scripts/inspect.lua`, within the node's bound).
async fn read(node: &Node, keys: &LockKeys) -> Result<Read, Error> {
    let parts = items(node.read_lock(&[&keys.lock, &keys.fence], "plain").await?)?;
    parse(&keys.name, &keys.lock, &parts)
}

/// Reads one fair lock and its queue in one script call (`scripts/inspect.lua`).
async fn read_fair(node: &Node, keys: &FairKeys) -> Result<Lookup<FairLockInfo>, Error> {
    let parts = items(
        node.read_lock(&[&keys.lock, &keys.fence, &keys.queue], "fair")
            .await?,
    )?;
    let lock = match parse(&keys.name, &keys.lock, &parts)? {
        Read::Foreign => return Ok(Lookup::Foreign),
        Read::Free => None,
        Read::Held(info) => Some(info),
    };
    let Some(Value::Array(entries)) = parts.get(4) else {
        return Ok(Lookup::Foreign);
    };
    let mut queue = Vec::with_capacity(entries.len());
    for entry in entries {
        let (Some(id), Some(ttl)) = (
            item(entry, 0).and_then(Value::as_string),
            item(entry, 1).and_then(Value::as_i64),
        ) else {
            return Err(malformed("fair lock read", entry));
        };
        // -2: a waiter that crashed (its key ran out); the lock skips it.
        if ttl == -2 {
            continue;
        }
        match Waiter::parse(&id, ttl) {
            Some(waiter) => queue.push(waiter),
            None => return Ok(Lookup::Foreign),
        }
    }
    if lock.is_none() && queue.is_empty() {
        return Ok(Lookup::Absent);
    }
    Ok(Lookup::Found(FairLockInfo {
        name: keys.name.to_string(),
        lock,
        queue,
    }))
}

/// Reads one read-write lock in one script call (`scripts/inspect.lua`).
async fn read_rw(node: &Node, keys: &RwKeys) -> Result<Lookup<RwLockInfo>, Error> {
    let parts = items(
        node.read_lock(&[&keys.write, &keys.fence, &keys.readers, &keys.waiting], "rw")
            .await?,
    )?;
    let writer = match parse(&keys.name, &keys.write, &parts)? {
        Read::Foreign => return Ok(Lookup::Foreign),
        Read::Free => None,
        Read::Held(info) => Some(info),
    };
    let (Some(Value::Array(entries)), Some(Value::Array(waiting))) = (parts.get(4), parts.get(5)) else {
        return Ok(Lookup::Foreign);
    };
    let mut readers = Vec::with_capacity(entries.len());
    for entry in entries {
        let (Some(key), Some(ttl)) = (
            item(entry, 0).and_then(Value::as_string),
            item(entry, 1).and_then(Value::as_i64),
        ) else {
            return Err(malformed("read-write lock read", entry));
        };
        // Gone: released, or its lease ran out (the set is tidied by the next writer).
        if ttl == -2 {
            continue;
        }
        let Some(Value::Array(fields)) = item(entry, 2) else {
            return Ok(Lookup::Foreign);
        };
        let mut holds = fields.chunks(2).map(|pair| {
            let field = pair.first().and_then(Value::as_string)?;
            let count = pair.get(1).and_then(Value::as_string)?;
            Holder::parse(&field, &count)
        });
        let Some(Some(holder)) = holds.next() else {
            return Ok(Lookup::Foreign);
        };
        readers.push(ReadHold {
            key: key.to_string(),
            holder,
            ttl: ttl_of(ttl),
        });
    }
    readers.sort_by(|a, b| a.key.cmp(&b.key));
    let (Some(ttl), Some(Value::Array(ids))) = (waiting.first().and_then(Value::as_i64), waiting.get(1))
    else {
        return Err(malformed("read-write lock read", &Value::Array(waiting.clone())));
    };
    let mut waiting_writers = Vec::with_capacity(ids.len());
    for id in ids {
        match id.as_string().and_then(|id| Waiter::parse(&id, ttl)) {
            Some(waiter) => waiting_writers.push(waiter),
            None => return Ok(Lookup::Foreign),
        }
    }
    if writer.is_none() && readers.is_empty() && waiting_writers.is_empty() {
        return Ok(Lookup::Absent);
    }
    Ok(Lookup::Found(RwLockInfo {
        name: keys.name.to_string(),
        writer,
        readers,
        waiting_writers,
    }))
}

/// The items of a script's list reply.
fn items(reply: Value) -> Result<Vec<Value>, Error> {
    match reply {
        Value::Array(parts) => Ok(parts),
        other => Err(malformed("lock read", &other)),
    }
}

/// Item `i` of a list reply `value`, if it is a list that long.
fn item(value: &Value, i: usize) -> Option<&Value> {
    match value {
        Value::Array(items) => items.get(i),
        _ => None,
    }
}

/// The lock hash of a `scripts/inspect.lua` reply (its first four items) as a [`Read`].
fn parse(name: &str, key: &str, parts: &[Value]) -> Result<Read, Error> {
    let kind = parts.first().and_then(Value::as_string).unwrap_or_default();
    let fence = parts
        .get(1)
        .and_then(Value::as_string)
        .and_then(|f| f.parse::<u64>().ok());
    match kind.as_str() {
        "none" => return Ok(Read::Free),
        "hash" => {}
        _ => return Ok(Read::Foreign),
    }
    let ttl = match parts.get(2).and_then(Value::as_i64) {
        // -2: expired between TYPE and PTTL cannot happen inside a script; be safe anyway.
        Some(-2) => return Ok(Read::Free),
        Some(ms) if ms >= 0 => Some(Duration::from_millis(ms as u64)),
        Some(_) => None,
        None => return Err(malformed("lock read", &Value::Array(parts.to_vec()))),
    };
    let Some(Value::Array(fields)) = parts.get(3) else {
        return Err(malformed("lock read", &Value::Array(parts.to_vec())));
    };
    let mut holders = Vec::with_capacity(fields.len() / 2);
    let mut contended = false;
    for pair in fields.chunks(2) {
        let (Some(field), Some(count)) = (
            pair.first().and_then(Value::as_string),
            pair.get(1).and_then(Value::as_string),
        ) else {
            return Ok(Read::Foreign);
        };
        // A waiter's mark beside its hold (`field~`), not a hold.
        if field.ends_with('~') {
            contended = true;
            continue;
        }
        match Holder::parse(&field, &count) {
            Some(holder) => holders.push(holder),
            None => return Ok(Read::Foreign),
        }
    }
    if holders.is_empty() {
        return Ok(Read::Foreign);
    }
    Ok(Read::Held(LockInfo {
        name: name.to_string(),
        key: key.to_string(),
        holders,
        ttl,
        fence,
        contended,
    }))
}

/// Reads one semaphore in one script call (`scripts/inspect_semaphore.lua`, within the node's
/// bound).
async fn read_semaphore(node: &Node, keys: &SemaphoreKeys) -> Result<Lookup<SemaphoreInfo>, Error> {
    let reply = node.read_semaphore(keys).await?;
    parse_semaphore(&keys.name, &keys.index, reply)
}

/// The reply of `scripts/inspect_semaphore.lua` as a [`Lookup`].
fn parse_semaphore(name: &str, index: &str, reply: Value) -> Result<Lookup<SemaphoreInfo>, Error> {
    let Value::Array(parts) = reply else {
        return Err(malformed("semaphore read", &reply));
    };
    match parts.first().and_then(Value::as_string).as_deref() {
        Some("none") => return Ok(Lookup::Absent),
        Some("hash") => {}
        Some(_) => return Ok(Lookup::Foreign),
        None => return Err(malformed("semaphore read", &Value::Array(parts))),
    }
    // Every acquisition stores the permits before it adds a holder: an index without them is not
    // relock's.
    let Some(permits) = parts
        .get(1)
        .and_then(Value::as_string)
        .and_then(|p| p.parse::<u64>().ok())
    else {
        return Ok(Lookup::Foreign);
    };
    let Some(Value::Array(entries)) = parts.get(2) else {
        return Err(malformed("semaphore read", &Value::Array(parts)));
    };
    let holder_prefix = format!("{index}:h:");
    let mut holders = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(entry) = entry else {
            return Err(malformed("semaphore read", entry));
        };
        let (Some(key), Some(held), Some(ttl)) = (
            entry.first().and_then(Value::as_string),
            entry.get(1).and_then(Value::as_string),
            entry.get(2).and_then(Value::as_i64),
        ) else {
            return Err(malformed("semaphore read", &Value::Array(entry.clone())));
        };
        // The holder part of the key: `client:owner`.
        let Some((client_id, owner)) = key
            .strip_prefix(&holder_prefix)
            .and_then(|holder| holder.split_once(':'))
        else {
            return Ok(Lookup::Foreign);
        };
        let Ok(permits) = held.parse::<u64>() else {
            return Ok(Lookup::Foreign);
        };
        let ttl = match ttl {
            // Released, or its lease ran out: free.
            -2 => continue,
            ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
            _ => None,
        };
        // Its one field `client:owner:generation` (a key of another type reads as false).
        let generation = match entry.get(3) {
            Some(Value::Array(fields)) => fields
                .chunks(2)
                .filter_map(|pair| {
                    let field = pair.first().and_then(Value::as_string)?;
                    let count = pair.get(1).and_then(Value::as_string)?;
                    Holder::parse(&field, &count)
                })
                .find(|h| h.client_id == client_id && h.owner == owner)
                .map(|h| h.generation),
            _ => None,
        };
        holders.push(PermitHolder {
            key: key.to_string(),
            client_id: client_id.to_string(),
            owner: owner.to_string(),
            generation,
            permits,
            ttl,
            client: None,
        });
    }
    holders.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(Lookup::Found(SemaphoreInfo {
        name: name.to_string(),
        key: index.to_string(),
        permits,
        holders,
    }))
}

fn malformed(what: &str, reply: &Value) -> Error {
    Error::unexpected_reply(&format!("the {what}"), reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_parses_fields_relock_writes_and_nothing_else() {
        let id = "0123456789abcdef0123456789abcdef";
        let holder = Holder::parse(&format!("{id}:t42:7"), "2").expect("a relock field");
        assert_eq!(
            (
                holder.client_id.as_str(),
                holder.owner.as_str(),
                holder.generation,
                holder.count
            ),
            (id, "t42", 7, 2)
        );
        assert!(Holder::parse(&format!("{id}:t42:7"), "x").is_none());
        assert!(Holder::parse(&format!("{id}:t42:"), "1").is_none());
        assert!(Holder::parse(&format!("{id}::7"), "1").is_none());
        assert!(Holder::parse("nothex:t1:1", "1").is_none());
        assert!(Holder::parse("plain", "1").is_none());
    }

    #[test]
    fn inspect_finds_names_in_keys_of_its_prefix_only() {
        assert_eq!(name_of("relock:{a:b}", "relock"), Some("a:b"));
        assert_eq!(name_of("relock:{a}:fence", "relock"), None);
        assert_eq!(name_of("relock:{}", "relock"), None);
        assert_eq!(name_of("other:{a}", "relock"), None);
        assert_eq!(escape_glob("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
