//! Listing: the names of the keys under a prefix, found by `SCAN` on every primary, and their
//! reads, a batch at a time.

use std::collections::BTreeSet;

use fred::clients::{Client, WithOptions};
use fred::types::Value;

use super::read::malformed;
use crate::config::check_name;
use crate::redis::node::Node;
use crate::Error;

/// The most lock reads in flight at once while listing.
pub(super) const READS_IN_FLIGHT: usize = 64;

/// Keys asked of `SCAN` per call: large enough that a big keyspace takes few round trips, small
/// enough that one call does not block the server for long.
const SCAN_COUNT: i64 = 1000;

/// The most `SCAN` pages read of one server: 2^32 keys, Redis's own limit per database.
const MAX_SCAN_PAGES: usize = (1 << 32) / SCAN_COUNT as usize;

/// Reads each of `names` with `read`, at most [`READS_IN_FLIGHT`] at once, and keeps what it
/// found, in order.
pub(super) async fn read_all<T, F, R>(names: Vec<String>, read: F) -> Result<Vec<T>, Error>
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
pub(super) async fn scan_names(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_finds_names_in_keys_of_its_prefix_only() {
        assert_eq!(name_of("relock:{a:b}", "relock"), Some("a:b"));
        assert_eq!(name_of("relock:{a}:fence", "relock"), None);
        assert_eq!(name_of("relock:{}", "relock"), None);
        assert_eq!(name_of("other:{a}", "relock"), None);
        assert_eq!(escape_glob("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
