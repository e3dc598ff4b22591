//! `relock list`: the held locks, or semaphores, fair locks or read-write locks, as a table or a
//! JSON array.

use relock::{ElectionInfo, FairLockInfo, LockClient, LockInfo, RwLockInfo, SemaphoreInfo};
use serde_json::Value as Json;

use crate::output::{
    fair_json, info_json, leader_json, out, owners, rw_json, semaphore_json, table, ttl_text,
};
use crate::{Cli, Failure, OK};

/// What `list` prints: one JSON array (`json` per item), or a table under `header`, a row per item
/// that `row` gives one for (a message on stderr when there is none).
fn print_list<T>(
    cli: &Cli,
    items: &[T],
    json: impl Fn(&T) -> Json,
    header: [&str; 5],
    row: impl Fn(&T) -> Option<[String; 5]>,
    empty: &str,
) -> Result<u8, Failure> {
    if cli.json {
        let items: Vec<Json> = items.iter().map(json).collect();
        out(&Json::Array(items).to_string())?;
        return Ok(OK);
    }
    if items.is_empty() {
        eprintln!("relock: {empty}");
        return Ok(OK);
    }
    let mut rows = vec![header.map(String::from)];
    rows.extend(items.iter().filter_map(row));
    out(&table(&rows))?;
    Ok(OK)
}

/// `relock list`: the held locks.
pub(crate) async fn list(client: &LockClient, cli: &Cli, pattern: Option<&str>) -> Result<u8, Failure> {
    let locks = client.held_locks(pattern).await?;
    let row = |info: &LockInfo| {
        Some([
            info.name.clone(),
            owners(info),
            info.hold_count().to_string(),
            ttl_text(info.ttl),
            info.fence.map_or_else(|| "-".to_string(), |f| f.to_string()),
        ])
    };
    let header = ["NAME", "OWNER", "HOLDS", "TTL", "FENCE"];
    print_list(cli, &locks, info_json, header, row, "no locks held")
}

/// `relock list --semaphores`: the semaphores with permits held.
pub(crate) async fn list_semaphores(
    client: &LockClient,
    cli: &Cli,
    pattern: Option<&str>,
) -> Result<u8, Failure> {
    let semaphores = client.held_semaphores(pattern).await?;
    let json = semaphore_json;
    let row = |info: &SemaphoreInfo| {
        let holders: Vec<String> = info
            .holders
            .iter()
            .map(|h| format!("{}:{}={}", h.client_id, h.owner, h.permits))
            .collect();
        Some([
            info.name.clone(),
            info.permits.to_string(),
            info.held().to_string(),
            info.available().to_string(),
            holders.join(","),
        ])
    };
    let header = ["NAME", "PERMITS", "HELD", "FREE", "HOLDERS"];
    print_list(cli, &semaphores, json, header, row, "no semaphore permits held")
}

/// `relock list --fair`: the held fair locks.
pub(crate) async fn list_fair(client: &LockClient, cli: &Cli, pattern: Option<&str>) -> Result<u8, Failure> {
    let locks = client.held_fair_locks(pattern).await?;
    let row = |fair: &FairLockInfo| {
        let info = fair.lock.as_ref()?;
        Some([
            fair.name.clone(),
            owners(info),
            info.hold_count().to_string(),
            ttl_text(info.ttl),
            fair.queue.len().to_string(),
        ])
    };
    let header = ["NAME", "OWNER", "HOLDS", "TTL", "QUEUED"];
    print_list(cli, &locks, fair_json, header, row, "no fair locks held")
}

/// `relock list --rw`: the read-write locks written or read.
pub(crate) async fn list_rw(client: &LockClient, cli: &Cli, pattern: Option<&str>) -> Result<u8, Failure> {
    let locks = client.held_rw_locks(pattern).await?;
    let row = |info: &RwLockInfo| {
        let (writer, ttl) = match &info.writer {
            Some(writer) => (owners(writer), ttl_text(writer.ttl)),
            None => ("-".to_string(), "-".to_string()),
        };
        Some([
            info.name.clone(),
            writer,
            info.readers.len().to_string(),
            info.waiting_writers.len().to_string(),
            ttl,
        ])
    };
    let header = ["NAME", "WRITER", "READERS", "WAITING", "TTL"];
    print_list(
        cli,
        &locks,
        rw_json,
        header,
        row,
        "no read-write locks written or read",
    )
}

/// `relock list --elections`: the elections that have a leader.
pub(crate) async fn list_elections(
    client: &LockClient,
    cli: &Cli,
    pattern: Option<&str>,
) -> Result<u8, Failure> {
    let elections = client.held_elections(pattern).await?;
    let json = |e: &ElectionInfo| serde_json::json!({ "name": e.name, "leader": leader_json(&e.leader) });
    let row = |e: &ElectionInfo| {
        Some([
            e.name.clone(),
            e.leader.value.clone(),
            e.leader.term.to_string(),
            ttl_text(Some(e.leader.ttl)),
            String::new(),
        ])
    };
    let header = ["NAME", "LEADER", "TERM", "TTL", ""];
    print_list(cli, &elections, json, header, row, "no election has a leader")
}
