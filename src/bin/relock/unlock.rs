//! `relock unlock`: a lock removed whoever holds it, after a confirmation unless `--yes`.

use std::io::Write;

use relock::{LockClient, LockInfo};
use serde_json::Value as Json;

use crate::output::{detail, fair_detail, fair_json, info_json, out, owners, rw_detail, rw_json};
use crate::{Cli, Failure, NOT_FOUND, OK, REFUSED};

/// Which lock of a name `unlock` removes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Plain,
    Fair,
    Rw,
}

/// What `unlock` read before removing: how to ask, and what to print once removed.
struct Target {
    question: String,
    detail: String,
    json: (&'static str, Json),
}

/// The lock `unlock` would remove, as read now; `None` if nobody holds it.
async fn unlock_target(client: &LockClient, name: &str, kind: Kind) -> Result<Option<Target>, Failure> {
    let held_by = |info: &LockInfo| format!("held by {} (count {})", owners(info), info.hold_count());
    Ok(match kind {
        Kind::Plain => client.inspect(name).await?.map(|info| Target {
            question: format!("Remove lock {name:?}, {}?", held_by(&info)),
            detail: detail(&info),
            json: ("lock", info_json(&info)),
        }),
        Kind::Fair => match client.inspect_fair_lock(name).await? {
            Some(fair) => fair.lock.as_ref().map(|info| Target {
                question: format!(
                    "Remove fair lock {name:?}, {}? Its {} waiters keep their places.",
                    held_by(info),
                    fair.queue.len()
                ),
                detail: fair_detail(&fair),
                json: ("fair_lock", fair_json(&fair)),
            }),
            None => None,
        },
        Kind::Rw => match client.inspect_rw_lock(name).await? {
            Some(rw) if rw.is_held() => Some(Target {
                question: format!(
                    "Remove read-write lock {name:?}: {}, {} readers, {} waiting writers?",
                    rw.writer
                        .as_ref()
                        .map_or_else(|| "no writer".to_string(), |w| format!("written, {}", held_by(w))),
                    rw.readers.len(),
                    rw.waiting_writers.len()
                ),
                detail: rw_detail(&rw),
                json: ("rw_lock", rw_json(&rw)),
            }),
            _ => None,
        },
    })
}

/// `relock unlock`: removes the lock of `kind` called `name`, once confirmed unless `yes`.
pub(crate) async fn unlock(
    client: &LockClient,
    cli: &Cli,
    name: &str,
    kind: Kind,
    yes: bool,
) -> Result<u8, Failure> {
    // Read first, to say what goes (and to ask about something real).
    let Some(target) = unlock_target(client, name, kind).await? else {
        eprintln!("relock: lock {name:?} is not held; nothing removed");
        return Ok(NOT_FOUND);
    };
    if !yes {
        eprint!("{} [y/N] ", target.question);
        let _ = std::io::stderr().flush();
        let answer = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|_| line)
        })
        .await;
        let agreed = matches!(
            answer,
            Ok(Ok(line)) if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
        );
        if !agreed {
            eprintln!("relock: not confirmed; nothing removed");
            return Ok(REFUSED);
        }
    }
    let removed = match kind {
        Kind::Plain => client.lock(name).force_unlock().await?,
        Kind::Fair => client.fair_lock(name).force_unlock().await?,
        Kind::Rw => client.rw_lock(name).force_unlock().await?,
    };
    if cli.json {
        let (kind, value) = target.json;
        let mut object = serde_json::json!({ "removed": removed });
        object[kind] = value;
        out(&object.to_string())?;
    } else if removed {
        out(&format!("removed:\n{}", target.detail))?;
    }
    if !removed {
        eprintln!("relock: lock {name:?} was released meanwhile; nothing removed");
        return Ok(NOT_FOUND);
    }
    Ok(OK)
}
