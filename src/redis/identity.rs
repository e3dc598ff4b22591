//! Who a client is, for operators: the name its connections carry (`CLIENT SETNAME`) and the record
//! it keeps in Redis while it holds anything, so that `inspect` and `relock list` can say which
//! program on which host holds a lock.
//!
//! The record is one string key per client, `{prefix}:client:{id}` (its own hash tag), written with
//! the watchdog's lease by each watchdog round that has holds to renew or check: one `SET … PX` per
//! master and round, never a write per lock, and nothing on the acquisition path. A client that
//! holds nothing lets it run out; one that crashed leaves it for a lease at most; `shutdown`
//! removes it.

use fred::bytes_utils::Str;
use std::time::{SystemTime, UNIX_EPOCH};

/// A [`LockClient`](crate::LockClient) as it describes itself in Redis while it holds anything (see
/// [`LockConfig::client_name`](crate::LockConfig::client_name)): the program, host and process
/// behind a [`Holder`](crate::Holder)'s `client_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClientInfo {
    /// Its name, which its connections also carry (`CLIENT LIST`): by default the program's name
    /// and process id, as `inventory-4242`.
    pub name: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// When it started, in milliseconds since the Unix epoch by its host's clock.
    pub started_unix_ms: u64,
    /// The relock version it runs.
    pub version: String,
}

/// The first line of a record: its format.
const FORMAT: &str = "relock-client/1";

/// This client's record.
pub(crate) struct Identity {
    /// The record's key.
    pub(crate) key: Str,
    /// The record's value (see [`parse`]).
    pub(crate) value: Str,
}

impl Identity {
    /// The identity of client `client_id` (32 hex digits) under key prefix `prefix`.
    pub(crate) fn new(prefix: &str, client_id: &str, name: String) -> Identity {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis().min(u64::MAX as u128) as u64);
        let value = format!(
            "{FORMAT}\nname={name}\nhost={}\npid={}\nstarted_unix_ms={started}\nversion={}",
            host_name(),
            std::process::id(),
            env!("CARGO_PKG_VERSION"),
        );
        Identity {
            key: record_key(prefix, client_id).into(),
            value: value.into(),
        }
    }
}

/// The key of client `client_id`'s record.
pub(crate) fn record_key(prefix: &str, client_id: &str) -> String {
    format!("{prefix}:client:{{{client_id}}}")
}

/// The client a record describes; `None` if it is not one relock writes.
pub(crate) fn parse(value: &str) -> Option<ClientInfo> {
    let mut lines = value.lines();
    if lines.next()? != FORMAT {
        return None;
    }
    let (mut name, mut host, mut pid, mut started, mut version) = (None, None, None, None, None);
    for line in lines {
        match line.split_once('=')? {
            ("name", v) => name = Some(v.to_string()),
            ("host", v) => host = Some(v.to_string()),
            ("pid", v) => pid = v.parse().ok(),
            ("started_unix_ms", v) => started = v.parse().ok(),
            ("version", v) => version = Some(v.to_string()),
            // A later format's fields are skipped.
            _ => {}
        }
    }
    Some(ClientInfo {
        name: name?,
        host: host?,
        pid: pid?,
        started_unix_ms: started?,
        version: version?,
    })
}

/// This machine's host name, as far as the standard library lets us learn it without a system
/// call of our own: the kernel's (Linux), else the environment's; `unknown` if none.
fn host_name() -> String {
    let found = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    // One line of the record: no line breaks (nor other control characters).
    let name: String = found.trim().chars().filter(|c| !c.is_control()).collect();
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_the_client_it_describes() {
        let identity = Identity::new("shop", "0123456789abcdef0123456789abcdef", "inventory-42".into());
        assert_eq!(&*identity.key, "shop:client:{0123456789abcdef0123456789abcdef}");
        let info = parse(&identity.value).expect("a record");
        assert_eq!(info.name, "inventory-42");
        assert_eq!(info.pid, std::process::id());
        assert_eq!(info.host, host_name());
        assert!(info.started_unix_ms > 0);
        assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
        assert!(parse("something else").is_none());
        assert!(parse("relock-client/1\nname=x").is_none(), "fields missing");
    }
}
