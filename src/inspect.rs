//! What is held, read from Redis, for operators: one lock's holders, lease and fence
//! ([`LockClient::inspect`]), every held lock of the client's prefix
//! ([`LockClient::held_locks`]), and a semaphore's permits and holders
//! ([`LockClient::inspect_semaphore`], [`LockClient::held_semaphores`]). Reads only: nothing here
//! changes a key.
//!
//! A lock is the hash `{prefix}:{name}` (see `keys.rs`) whose fields are holds, `client:owner:generation`
//! (see `Owner::id_for` and `hold.rs`), each with its hold count; its fence counter is
//! `{prefix}:{name}:fence`. A semaphore is the index hash `{prefix}:{name}:sem` (field `permits`,
//! and one field per holder key with its permits) and one holder key per holder,
//! `{prefix}:{name}:sem:h:client:owner`, a hash whose one field `client:owner:generation` holds its
//! permits, with the holder's lease as its TTL (see `scripts/semaphore_acquire.lua`).

use std::collections::BTreeSet;
use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::types::Value;

use crate::config::check_name;
use crate::keys::{LockKeys, SemaphoreKeys};
use crate::node::Node;
use crate::{Error, LockClient};

/// One lock as read from Redis at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

impl Holder {
    /// Parses a field and its count; `None` if it is not one relock writes.
    fn parse(field: &str, count: &str) -> Option<Holder> {
        let (client_id, rest) = field.split_once(':')?;
        let (owner, generation) = rest.rsplit_once(':')?;
        let valid = client_id.len() == 32
            && client_id.bytes().all(|b| b.is_ascii_hexdigit())
            && !owner.is_empty()
            && !owner.chars().any(char::is_control)
            && generation.bytes().all(|b| b.is_ascii_digit());
        if !valid {
            return None;
        }
        Some(Holder {
            field: field.to_string(),
            client_id: client_id.to_string(),
            owner: owner.to_string(),
            generation: generation.parse().ok()?,
            count: count.parse().ok()?,
        })
    }
}

/// One semaphore as read from Redis at one moment: its permits and its live holders.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub ttl: Option<Duration>,
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

/// A semaphore read: not there, there but not a relock semaphore, or a semaphore.
enum SemRead {
    Absent,
    Foreign,
    Found(SemaphoreInfo),
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
            Read::Held(info) => Ok(Some(info)),
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
        let names = scan_names(node, prefix, pattern, "").await?;
        let mut out = Vec::new();
        for chunk in names.chunks(READS_IN_FLIGHT) {
            let reads = chunk.iter().map(|name| async move {
                let keys = LockKeys::new(prefix, name);
                read(node, &keys).await
            });
            for outcome in futures::future::join_all(reads).await {
                if let Read::Held(info) = outcome? {
                    out.push(info);
                }
            }
        }
        Ok(out)
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
        match read_semaphore(self.node(), &keys).await? {
            SemRead::Absent => Ok(None),
            SemRead::Foreign => Err(Error::WrongType(keys.index.to_string())),
            SemRead::Found(info) => Ok(Some(info)),
        }
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
        let names = scan_names(self.node(), prefix, pattern, ":sem").await?;
        let node = self.node();
        let mut out = Vec::new();
        for chunk in names.chunks(READS_IN_FLIGHT) {
            let reads = chunk.iter().map(|name| async move {
                let keys = SemaphoreKeys::new(prefix, name);
                read_semaphore(node, &keys).await
            });
            for outcome in futures::future::join_all(reads).await {
                if let SemRead::Found(info) = outcome? {
                    if !info.holders.is_empty() {
                        out.push(info);
                    }
                }
            }
        }
        Ok(out)
    }

    fn node(&self) -> &Node {
        &self.core.masters.nodes[0]
    }
}

/// The names of the keys `{prefix}:{name}{suffix}` on every primary whose name matches `pattern`
/// (every name if `None`), sorted and deduplicated, found by `SCAN`.
async fn scan_names(
    node: &Node,
    prefix: &str,
    pattern: Option<&str>,
    suffix: &str,
) -> Result<Vec<String>, Error> {
    let pattern = pattern.unwrap_or("*");
    if pattern.contains(['{', '}']) || pattern.chars().any(char::is_control) {
        return Err(Error::InvalidName(format!(
            "the pattern must not contain braces or control characters: {pattern:?}"
        )));
    }
    let link = &node.link;
    let matching = format!("{}:{{{pattern}}}{}", escape_glob(prefix), escape_glob(suffix));
    let mut names = BTreeSet::new();
    let primaries = link.topology.primaries(&link.client, &link.options);
    if primaries.is_empty() {
        // A cluster whose slot map is not known: an empty list would be a lie.
        return Err(Error::Redis(fred::error::Error::new(
            fred::error::ErrorKind::Cluster,
            "the cluster's primaries are not known yet",
        )));
    }
    for primary in primaries {
        for key in scan(node, &primary, &matching).await? {
            if let Some(name) = key.strip_suffix(suffix).and_then(|key| name_of(key, prefix)) {
                names.insert(name.to_string());
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

/// Reads one lock in one script call (`scripts/inspect.lua`; made again while a resharding
/// cluster redirects it, within the node's bound).
async fn read(node: &Node, keys: &LockKeys) -> Result<Read, Error> {
    let reply = node.read_lock(keys).await?;
    parse(&keys.name, &keys.lock, reply)
}

/// The reply of `scripts/inspect.lua` as a [`Read`].
fn parse(name: &str, key: &str, reply: Value) -> Result<Read, Error> {
    let Value::Array(parts) = reply else {
        return Err(malformed("lock read", &reply));
    };
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
        None => return Err(malformed("lock read", &Value::Array(parts))),
    };
    let Some(Value::Array(fields)) = parts.get(3) else {
        return Err(malformed("lock read", &Value::Array(parts)));
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
async fn read_semaphore(node: &Node, keys: &SemaphoreKeys) -> Result<SemRead, Error> {
    let reply = node.read_semaphore(keys).await?;
    parse_semaphore(&keys.name, &keys.index, reply)
}

/// The reply of `scripts/inspect_semaphore.lua` as a [`SemRead`].
fn parse_semaphore(name: &str, index: &str, reply: Value) -> Result<SemRead, Error> {
    let Value::Array(parts) = reply else {
        return Err(malformed("semaphore read", &reply));
    };
    match parts.first().and_then(Value::as_string).as_deref() {
        Some("none") => return Ok(SemRead::Absent),
        Some("hash") => {}
        Some(_) => return Ok(SemRead::Foreign),
        None => return Err(malformed("semaphore read", &Value::Array(parts))),
    }
    // Every acquisition stores the permits before it adds a holder: an index without them is not
    // relock's.
    let Some(permits) = parts
        .get(1)
        .and_then(Value::as_string)
        .and_then(|p| p.parse::<u64>().ok())
    else {
        return Ok(SemRead::Foreign);
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
            return Ok(SemRead::Foreign);
        };
        let Ok(permits) = held.parse::<u64>() else {
            return Ok(SemRead::Foreign);
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
        });
    }
    holders.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(SemRead::Found(SemaphoreInfo {
        name: name.to_string(),
        key: index.to_string(),
        permits,
        holders,
    }))
}

fn malformed(what: &str, reply: &Value) -> Error {
    Error::Redis(fred::error::Error::new(
        fred::error::ErrorKind::Parse,
        format!("unexpected reply to the {what}: {reply:?}"),
    ))
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
