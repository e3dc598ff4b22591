//! What the subcommands print: locks and their kin as text (details, tables) and as JSON, times
//! and leases, and the URL with its passwords masked.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use relock::{ClientInfo, FairLockInfo, Holder, LockInfo, RwLockInfo, SemaphoreInfo, Waiter};
use serde_json::Value as Json;

use crate::{Failure, OK, REDIS};

/// Writes a line to stdout. A closed pipe (`relock list | head`) ends the command quietly.
pub(crate) fn out(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::new(OK, "")),
        Err(err) => Err(Failure::new(REDIS, format!("cannot write the output: {err}"))),
    }
}

pub(crate) fn detail(info: &LockInfo) -> String {
    let mut text = format!(
        "lock   {}\nkey    {}\nholds  {}\nttl    {}\nfence  {}",
        info.name,
        info.key,
        info.hold_count(),
        ttl_text(info.ttl),
        info.fence.map_or_else(|| "-".to_string(), |f| f.to_string()),
    );
    for holder in &info.holders {
        text.push_str(&format!("\nholder {}", holder_text(holder)));
    }
    text
}

pub(crate) fn semaphore_detail(info: &SemaphoreInfo) -> String {
    let mut text = format!(
        "semaphore {}\nkey       {}\npermits   {}\nheld      {}\nfree      {}",
        info.name,
        info.key,
        info.permits,
        info.held(),
        info.available(),
    );
    for holder in &info.holders {
        text.push_str(&format!(
            "\nholder client {} owner {} generation {} permits {} ttl {}{}",
            holder.client_id,
            holder.owner,
            holder
                .generation
                .map_or_else(|| "-".to_string(), |g| g.to_string()),
            holder.permits,
            ttl_text(holder.ttl),
            client_text(holder.client.as_ref()),
        ));
    }
    text
}

/// A semaphore in JSON: as `Serialize` writes it, with how many permits are held and free.
pub(crate) fn semaphore_json(info: &SemaphoreInfo) -> Json {
    let mut value = to_json(info);
    value["held"] = info.held().into();
    value["available"] = info.available().into();
    value
}

pub(crate) fn fair_detail(info: &FairLockInfo) -> String {
    let mut text = match &info.lock {
        Some(lock) => format!("fair {}", detail(lock)),
        None => format!("fair lock {}: not held", info.name),
    };
    for (place, waiter) in info.queue.iter().enumerate() {
        text.push_str(&format!("\nqueued {} {}", place + 1, waiter_text(waiter)));
    }
    text
}

pub(crate) fn rw_detail(info: &RwLockInfo) -> String {
    let mut text = match &info.writer {
        Some(writer) => format!("read-write {}", detail(writer)),
        None => format!("read-write lock {}: not written", info.name),
    };
    for reader in &info.readers {
        text.push_str(&format!(
            "\nreader {} ttl {}",
            holder_text(&reader.holder),
            ttl_text(reader.ttl)
        ));
    }
    for waiter in &info.waiting_writers {
        text.push_str(&format!("\nwaiting writer {}", waiter_text(waiter)));
    }
    text
}

fn waiter_text(waiter: &Waiter) -> String {
    format!(
        "client {} owner {} ttl {}",
        waiter.client_id,
        waiter.owner,
        ttl_text(waiter.ttl)
    )
}

/// A fair lock in JSON: its hold as [`info_json`] writes a lock, and its queue.
pub(crate) fn fair_json(info: &FairLockInfo) -> Json {
    let mut value = to_json(info);
    value["lock"] = info.lock.as_ref().map_or(Json::Null, info_json);
    value
}

/// A read-write lock in JSON: its writer as [`info_json`] writes a lock, each reader as its holder
/// with its key and lease, and the waiting writers.
pub(crate) fn rw_json(info: &RwLockInfo) -> Json {
    let readers: Vec<Json> = info
        .readers
        .iter()
        .map(|reader| {
            let mut value = to_json(&reader.holder);
            value["key"] = reader.key.clone().into();
            value["ttl_ms"] = ttl_ms(reader.ttl);
            value
        })
        .collect();
    serde_json::json!({
        "name": info.name,
        "writer": info.writer.as_ref().map_or(Json::Null, info_json),
        "readers": readers,
        "waiting_writers": to_json(&info.waiting_writers),
    })
}

/// A lease left in JSON: milliseconds, or `null` for none.
pub(crate) fn ttl_ms(ttl: Option<Duration>) -> Json {
    ttl.map_or(Json::Null, |t| {
        (t.as_millis().min(u64::MAX as u128) as u64).into()
    })
}

/// A lock's holders, `client:owner` each (with the client's name and host where it said them),
/// comma-separated.
pub(crate) fn owners(info: &LockInfo) -> String {
    let owners: Vec<String> = info
        .holders
        .iter()
        .map(|holder| format!("{}{}", holder_name(holder), client_text(holder.client.as_ref())))
        .collect();
    owners.join(",")
}

fn holder_text(holder: &Holder) -> String {
    format!(
        "client {} owner {} generation {} count {}{}",
        holder.client_id,
        holder.owner,
        holder.generation,
        holder.count,
        client_text(holder.client.as_ref())
    )
}

/// Who a client is, as its record says: ` (inventory-4242 on web-1, pid 4242)`; empty without one.
fn client_text(client: Option<&ClientInfo>) -> String {
    client.map_or_else(String::new, |c| {
        format!(" ({} on {}, pid {})", c.name, c.host, c.pid)
    })
}

pub(crate) fn holder_name(holder: &Holder) -> String {
    format!("{}:{}", holder.client_id, holder.owner)
}

/// An election's leader as JSON: its value, term and lease left in ms.
pub(crate) fn leader_json(leader: &relock::Leader) -> Json {
    serde_json::json!({
        "value": leader.value,
        "term": leader.term,
        "ttl_ms": u64::try_from(leader.ttl.as_millis()).unwrap_or(u64::MAX),
    })
}

pub(crate) fn ttl_text(ttl: Option<Duration>) -> String {
    match ttl {
        Some(ttl) => format!("{:.1}s", ttl.as_secs_f64()),
        None => "none".to_string(),
    }
}

/// Left-aligned columns two spaces apart.
pub(crate) fn table(rows: &[[String; 5]]) -> String {
    let mut widths = [0usize; 5];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let lines: Vec<String> = rows
        .iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            cells.join("  ").trim_end().to_string()
        })
        .collect();
    lines.join("\n")
}

/// A lock in JSON: as `Serialize` writes it, with its hold count.
pub(crate) fn info_json(info: &LockInfo) -> Json {
    let mut value = to_json(info);
    value["hold_count"] = info.hold_count().into();
    value
}

/// `value` in JSON (the inspection types serialize without fail).
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Json {
    serde_json::to_value(value).unwrap_or(Json::Null)
}

/// UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub(crate) fn timestamp(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut out = match authority.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split_once(':').map_or(credentials, |(user, _)| user);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{tail}"),
    };
    // Query parameters may carry passwords too (fred reads `sentinelPassword`, `sentinel_password`).
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _)) if key.to_ascii_lowercase().contains("password") => format!("{key}=***"),
                _ => param.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_masked_in_the_user_info_and_the_query() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(
            redact("redis-sentinel://h:1/0?sentinelServiceName=m&sentinelPassword=s3&node=h2:2"),
            "redis-sentinel://h:1/0?sentinelServiceName=m&sentinelPassword=***&node=h2:2"
        );
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("not a url"), "not a url");
    }
}
