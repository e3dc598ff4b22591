//! One name's keys read in one script call (`scripts/inspect.lua`,
//! `scripts/inspect_semaphore.lua`), and the replies parsed into the inspection types. Keys that
//! hold what relock does not write read as foreign, never as a lock.

use std::time::Duration;

use fred::types::Value;

use super::info::{
    FairLockInfo, Holder, LockInfo, PermitHolder, ReadHold, RwLockInfo, SemaphoreInfo, Waiter,
};
use crate::redis::keys::{FairKeys, LockKeys, RwKeys, SemaphoreKeys};
use crate::redis::node::Node;
use crate::Error;

/// A lock read: not there, there but not a relock lock, or a lock.
pub(super) enum Read {
    Free,
    Foreign,
    Held(LockInfo),
}

/// A semaphore, fair lock or read-write lock read: not there, there but not relock's, or found.
pub(super) enum Lookup<T> {
    Absent,
    Foreign,
    Found(T),
}

impl<T> Lookup<T> {
    /// As the `inspect_*` methods answer: `Foreign` is [`Error::WrongType`] for `key`.
    pub(super) fn answer(self, key: &str) -> Result<Option<T>, Error> {
        match self {
            Lookup::Absent => Ok(None),
            Lookup::Foreign => Err(Error::WrongType(key.to_string())),
            Lookup::Found(info) => Ok(Some(info)),
        }
    }
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

/// A `PTTL` as a time left: `None` for no expiry (-1), zero for a key that is gone (-2).
fn ttl_of(ms: i64) -> Option<Duration> {
    match ms {
        -1 => None,
        ms => Some(Duration::from_millis(ms.max(0) as u64)),
    }
}

/// Reads one lock in one script call (`scripts/inspect.lua`, within the node's bound).
pub(super) async fn read(node: &Node, keys: &LockKeys) -> Result<Read, Error> {
    let parts = items(node.read_lock(&[&keys.lock, &keys.fence], "plain").await?)?;
    parse(&keys.name, &keys.lock, &parts)
}

/// Reads one fair lock and its queue in one script call (`scripts/inspect.lua`).
pub(super) async fn read_fair(node: &Node, keys: &FairKeys) -> Result<Lookup<FairLockInfo>, Error> {
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
pub(super) async fn read_rw(node: &Node, keys: &RwKeys) -> Result<Lookup<RwLockInfo>, Error> {
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
pub(super) async fn read_semaphore(
    node: &Node,
    keys: &SemaphoreKeys,
) -> Result<Lookup<SemaphoreInfo>, Error> {
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
        match parse_permit_holder(entry, &holder_prefix)? {
            // Its key is gone: its permits count as free.
            Lookup::Absent => continue,
            Lookup::Foreign => return Ok(Lookup::Foreign),
            Lookup::Found(holder) => holders.push(holder),
        }
    }
    holders.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(Lookup::Found(SemaphoreInfo {
        name: name.to_string(),
        key: index.to_string(),
        permits,
        holders,
    }))
}

/// One holder of a semaphore read (its key, permits, `PTTL` and fields): `Absent` if its key is
/// gone, `Foreign` if it is not one relock writes.
fn parse_permit_holder(entry: &Value, holder_prefix: &str) -> Result<Lookup<PermitHolder>, Error> {
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
        .strip_prefix(holder_prefix)
        .and_then(|holder| holder.split_once(':'))
    else {
        return Ok(Lookup::Foreign);
    };
    let Ok(permits) = held.parse::<u64>() else {
        return Ok(Lookup::Foreign);
    };
    let ttl = match ttl {
        // Released, or its lease ran out: free.
        -2 => return Ok(Lookup::Absent),
        ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
        _ => None,
    };
    let generation = permit_generation(entry.get(3), client_id, owner);
    Ok(Lookup::Found(PermitHolder {
        key: key.to_string(),
        client_id: client_id.to_string(),
        owner: owner.to_string(),
        generation,
        permits,
        ttl,
        client: None,
    }))
}

/// The generation in a holder key's one field `client:owner:generation` (a key of another type
/// reads as false): `fields` is its hash, as field and value pairs.
fn permit_generation(fields: Option<&Value>, client_id: &str, owner: &str) -> Option<u64> {
    match fields {
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
    }
}

/// The error for a reply that is not what `what` returns.
pub(super) fn malformed(what: &str, reply: &Value) -> Error {
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
}
