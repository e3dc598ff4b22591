//! The types the inspection answers with: one lock, fair lock, read-write lock or semaphore as
//! read at one moment, and their holders and waiters.

use std::time::Duration;

use super::ClientInfo;
#[cfg(doc)]
use crate::LockClient;

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

/// An election with a leader, as [`LockClient::held_elections`](crate::LockClient::held_elections)
/// lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ElectionInfo {
    /// The election's name.
    pub name: String,
    /// Its leader.
    pub leader: crate::Leader,
}
