//! `relock show`: one name's lock, counting latch, semaphore, fair lock, read-write lock and
//! election, in detail.

use relock::LockClient;

use crate::output::{
    detail, fair_detail, fair_json, info_json, leader_json, out, rw_detail, rw_json, semaphore_detail,
    semaphore_json, ttl_text,
};
use crate::{Cli, Failure, NOT_FOUND, OK};

/// `relock show`: every kind of lock of `name` there is; `NOT_FOUND` if none.
pub(crate) async fn show(client: &LockClient, cli: &Cli, name: &str) -> Result<u8, Failure> {
    let info = client.inspect(name).await?;
    // The countdown latch of the same name, if it is counting (0: never set, or open).
    let latch = client.latch(name).count().await?;
    let semaphore = client.inspect_semaphore(name).await?;
    let fair = client.inspect_fair_lock(name).await?;
    let rw = client.inspect_rw_lock(name).await?;
    let election = client.election(name).leader().await?;
    let none = info.is_none() && latch == 0 && semaphore.is_none() && fair.is_none() && rw.is_none();
    if none && election.is_none() {
        if cli.json {
            out("null")?;
        }
        eprintln!(
            "relock: lock {name:?} is not held (and no latch of that name is counting, and there is \
             no semaphore, fair lock, read-write lock or led election of that name)"
        );
        return Ok(NOT_FOUND);
    }
    if cli.json {
        // One object: the lock's if it is held, with the latch and the semaphore added.
        let mut object = match &info {
            Some(info) => info_json(info),
            None => serde_json::json!({ "name": name }),
        };
        if latch > 0 {
            object["latch_count"] = latch.into();
        }
        if let Some(semaphore) = &semaphore {
            object["semaphore"] = semaphore_json(semaphore);
        }
        if let Some(fair) = &fair {
            object["fair_lock"] = fair_json(fair);
        }
        if let Some(rw) = &rw {
            object["rw_lock"] = rw_json(rw);
        }
        if let Some(leader) = &election {
            object["election"] = leader_json(leader);
        }
        out(&object.to_string())?;
        return Ok(OK);
    }
    let mut parts = Vec::new();
    if let Some(info) = &info {
        parts.push(detail(info));
    }
    if latch > 0 {
        parts.push(format!("latch {name}: {latch} count-downs left"));
    }
    if let Some(semaphore) = &semaphore {
        parts.push(semaphore_detail(semaphore));
    }
    if let Some(fair) = &fair {
        parts.push(fair_detail(fair));
    }
    if let Some(rw) = &rw {
        parts.push(rw_detail(rw));
    }
    if let Some(leader) = &election {
        parts.push(format!(
            "election {name}: led by {:?}, term {}, lease left {}",
            leader.value,
            leader.term,
            ttl_text(Some(leader.ttl))
        ));
    }
    out(&parts.join("\n\n"))?;
    Ok(OK)
}
