//! `relock`: an inspector for the locks relock keeps in Redis.
//!
//! ```text
//! relock list [PATTERN]      held locks (name, holder, hold count, lease left, fence), by SCAN
//!   --semaphores             held semaphores instead (name, permits, held, free, holders)
//!   --fair                   held fair locks instead (name, holder, hold count, lease left, queued)
//!   --rw                     read-write locks written or read instead (name, writer, readers,
//!                            writers waiting, the write lease left)
//! relock show NAME           one lock in detail, and of that name: a latch that is counting, a
//!                            semaphore (its permits, each holder's permits and lease), a fair lock
//!                            (its holder and queue) and a read-write lock (its writer, each
//!                            reader's hold and lease, the writers waiting)
//! relock unlock NAME [--yes] force-unlock, after a confirmation on stdin unless --yes
//!   --fair, --rw             the fair lock, or the read-write lock, of that name
//! relock watch NAME          acquire / re-enter / release / expire / force-unlock events until Ctrl-C
//! ```
//!
//! Global options: `--url` (or `REDIS_URL`; `redis://`, `redis-cluster://`, `redis-sentinel://`
//! and their TLS forms), `--prefix` (the key prefix of the locks, as `LockConfig::key_prefix`),
//! `--timeout` (per Redis request: `500ms`, `2s`, or seconds) and `--json` (one JSON document, or for `watch` one per
//! line).
//!
//! `watch` does not poll when it need not: it subscribes to the lock's release channel and, when
//! the server has keyspace notifications on for hashes, generic commands and expiries
//! (`notify-keyspace-events` with `K` and `A`, or `K`, `g`, `h` and `x`), to the lock key's keyspace
//! channel, and reads the lock again on each message (and every 5 s, in case a message was lost
//! with a connection). With the notifications off it says so on stderr and reads the lock every
//! 200 ms instead; `--enable-notifications` turns them on (`CONFIG SET`, on the server that holds the
//! key). A hold shorter than one read may go unseen.
//!
//! Exit codes: 0 done; 1 not found or nothing to do (`show` of a name with no held lock, counting
//! latch, semaphore, fair lock or read-write lock; `unlock` of a lock nobody holds);
//! 2 usage error (bad arguments, lock name or prefix); 3 connection or Redis error (also a bad URL,
//! or a key at the lock's name that is not a relock lock); 4 confirmation refused (`unlock`
//! answered anything but `y`/`yes`, or stdin closed).
//!
//! `show --json` prints one object: the lock's (as `list --json`) if it is held, else `{"name":...}`;
//! with `"latch_count"` when a latch of the name is counting, `"semaphore"` (key, permits, held,
//! available, holders with their permits and `ttl_ms`) when a semaphore of the name exists,
//! `"fair_lock"` (`lock`: as `list --json`'s or `null`, `queue`: client id, owner and `ttl_ms` of
//! each waiter in order) and `"rw_lock"` (`writer`: as `list --json`'s or `null`, `readers`: key,
//! client id, owner, generation, count and `ttl_ms` of each, `waiting_writers` as a queue); `null`
//! when there is none of them.
//!
//! `unlock` prints the lock as read just before it removed it: a holder that changed in between
//! (a release and a new acquisition) is removed all the same.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use fred::clients::Client;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use fred::prelude::{Builder, Config, ReconnectPolicy};
use fred::types::config::{Options, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};
use relock::{
    ClientInfo, Error, FairLockInfo, Holder, LockClient, LockConfig, LockInfo, RwLockInfo, SemaphoreInfo,
    Waiter,
};
use serde_json::Value as Json;
use tokio::sync::broadcast;

/// Done.
const OK: u8 = 0;
/// Not found, nothing to do.
const NOT_FOUND: u8 = 1;
/// Bad arguments (clap's own code for them).
const USAGE: u8 = 2;
/// Connection or Redis error.
const REDIS: u8 = 3;
/// The confirmation was refused.
const REFUSED: u8 = 4;

const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  not found or nothing to do (show of a name with no lock, latch or semaphore; unlock of a lock
     nobody holds)
  2  usage error (bad arguments, lock name, prefix or URL)
  3  connection or Redis error (also a key that is not a relock lock)
  4  confirmation refused (unlock)";

/// Inspect and manage relock's distributed locks in Redis.
#[derive(Debug, Parser)]
#[command(name = "relock", version, after_help = EXIT_CODES)]
struct Cli {
    /// Redis URL: redis://, redis-cluster://host:port?node=host2:port2, redis-sentinel://, or the
    /// rediss forms.
    // The environment's value is not shown by --help: it may carry a password.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    url: String,
    /// Key prefix of the locks (LockConfig::key_prefix).
    #[arg(long, default_value_t = LockConfig::default().get_key_prefix().to_string(), global = true)]
    prefix: String,
    /// How long each Redis request may take: `500ms`, `2s`, `1m`, or a number of seconds.
    #[arg(long, default_value = "5s", value_parser = duration, global = true)]
    timeout: Duration,
    /// Machine-readable output: JSON (for watch, one object per line).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List held locks: name, holder (client id and task), hold count, lease left, fence.
    List {
        /// Only locks whose name matches this Redis glob (*, ?, [abc]).
        pattern: Option<String>,
        /// List the semaphores with permits held instead: name, permits, held, free, holders.
        #[arg(long, conflicts_with_all = ["fair", "rw"])]
        semaphores: bool,
        /// List the held fair locks instead: name, holder, hold count, lease left, waiters queued.
        #[arg(long, conflicts_with = "rw")]
        fair: bool,
        /// List the read-write locks written or read instead: name, writer, readers, writers
        /// waiting, the write lease left.
        #[arg(long)]
        rw: bool,
    },
    /// Show one lock in detail, and of that name: the countdown latch if it is counting, the
    /// semaphore (its permits, each holder's permits and lease left), the fair lock (its holder and
    /// queue) and the read-write lock (its writer, readers and waiting writers), those there are
    /// (exit code 1 if none of them).
    Show {
        /// The lock's (latch's, semaphore's) name.
        name: String,
    },
    /// Remove a lock whoever holds it, and print what was removed. The holder learns it at its
    /// watchdog's next round.
    Unlock {
        /// The lock's name.
        name: String,
        /// Do not ask for confirmation.
        #[arg(long, short)]
        yes: bool,
        /// The fair lock of that name: its holder goes, its waiters keep their places (and all
        /// wake to try).
        #[arg(long, conflicts_with = "rw")]
        fair: bool,
        /// The read-write lock of that name: its writer, every reader and every waiting writer's
        /// record go.
        #[arg(long)]
        rw: bool,
    },
    /// Print acquire, re-enter, release, expire and force-unlock events of a lock until Ctrl-C. Uses keyspace
    /// notifications when the server has them on, else reads the lock every 200 ms.
    Watch {
        /// The lock's name.
        name: String,
        /// Turn keyspace notifications on (CONFIG SET notify-keyspace-events, adding K, g, h and x)
        /// if they are off.
        #[arg(long)]
        enable_notifications: bool,
    },
}

/// Why the command stopped early: an exit code and what to say on stderr.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Failure {
        let code = if err.is_bad_input() { USAGE } else { REDIS };
        Failure::new(code, err.to_string())
    }
}

/// A duration as `humantime` writes them (`500ms`, `2s`, `1m 30s`), or a bare number of seconds.
fn duration(arg: &str) -> Result<Duration, String> {
    let duration = match arg.trim().parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Duration::from_secs_f64(secs.min(1e9)),
        Ok(_) => return Err(format!("not a duration: {arg:?}")),
        Err(_) => humantime::parse_duration(arg)
            .map_err(|err| format!("not a duration (like 500ms, 2s or 1m): {arg:?}: {err}"))?,
    };
    if !(Duration::from_millis(1)..=Duration::from_secs(3600)).contains(&duration) {
        return Err("the timeout must be 1ms to 1h".into());
    }
    Ok(duration)
}

fn main() -> ExitCode {
    // Usage errors exit here with clap's code 2 (and --help, --version with 0).
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("relock: cannot start the runtime: {err}");
            return ExitCode::from(REDIS);
        }
    };
    let code = runtime.block_on(run(cli));
    // fred's connection tasks are not waited for.
    runtime.shutdown_timeout(Duration::from_millis(200));
    ExitCode::from(code)
}

async fn run(cli: Cli) -> u8 {
    let config = LockConfig::default()
        .key_prefix(cli.prefix.clone())
        .command_timeout(cli.timeout);
    // A bad prefix is a usage error, not a connection error: checked before connecting.
    if let Err(err) = config.validate() {
        eprintln!("relock: {err}");
        return USAGE;
    }
    let client = match LockClient::connect_with(&cli.url, config).await {
        Ok(client) => client,
        Err(err) => {
            eprintln!("relock: cannot use {}: {err}", redact(&cli.url));
            // A URL that is no URL is a usage error, found before any I/O.
            return if err.is_bad_input() { USAGE } else { REDIS };
        }
    };
    let outcome = match &cli.command {
        Command::List {
            pattern,
            semaphores,
            fair,
            rw,
        } => {
            let pattern = pattern.as_deref();
            if *semaphores {
                list_semaphores(&client, &cli, pattern).await
            } else if *fair {
                list_fair(&client, &cli, pattern).await
            } else if *rw {
                list_rw(&client, &cli, pattern).await
            } else {
                list(&client, &cli, pattern).await
            }
        }
        Command::Show { name } => show(&client, &cli, name).await,
        Command::Unlock { name, yes, fair, rw } => {
            let kind = match (*fair, *rw) {
                (true, _) => Kind::Fair,
                (_, true) => Kind::Rw,
                _ => Kind::Plain,
            };
            unlock(&client, &cli, name, kind, *yes).await
        }
        Command::Watch {
            name,
            enable_notifications,
        } => watch(&client, &cli, name, *enable_notifications).await,
    };
    client.shutdown().await;
    match outcome {
        Ok(code) => code,
        Err(failure) => {
            // A closed stdout has nothing to say.
            if !failure.message.is_empty() {
                eprintln!("relock: {}", failure.message);
            }
            failure.code
        }
    }
}

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

async fn list(client: &LockClient, cli: &Cli, pattern: Option<&str>) -> Result<u8, Failure> {
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

async fn list_semaphores(client: &LockClient, cli: &Cli, pattern: Option<&str>) -> Result<u8, Failure> {
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

async fn list_fair(client: &LockClient, cli: &Cli, pattern: Option<&str>) -> Result<u8, Failure> {
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

async fn list_rw(client: &LockClient, cli: &Cli, pattern: Option<&str>) -> Result<u8, Failure> {
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

async fn show(client: &LockClient, cli: &Cli, name: &str) -> Result<u8, Failure> {
    let info = client.inspect(name).await?;
    // The countdown latch of the same name, if it is counting (0: never set, or open).
    let latch = client.latch(name).count().await?;
    let semaphore = client.inspect_semaphore(name).await?;
    let fair = client.inspect_fair_lock(name).await?;
    let rw = client.inspect_rw_lock(name).await?;
    if info.is_none() && latch == 0 && semaphore.is_none() && fair.is_none() && rw.is_none() {
        if cli.json {
            out("null")?;
        }
        eprintln!(
            "relock: lock {name:?} is not held (and no latch of that name is counting, and there is \
             no semaphore, fair lock or read-write lock of that name)"
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
    out(&parts.join("\n\n"))?;
    Ok(OK)
}

/// Which lock of a name `unlock` removes.
#[derive(Debug, Clone, Copy)]
enum Kind {
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

async fn unlock(client: &LockClient, cli: &Cli, name: &str, kind: Kind, yes: bool) -> Result<u8, Failure> {
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

/// How `watch` learns of changes: the subscriber connection and what it delivers.
#[derive(Default)]
struct Feed {
    /// Kept open while watching.
    subscriber: Option<Client>,
    /// Subscribed to the keyspace channel of the lock key as well as its release channel.
    notified: bool,
    /// Release messages; keyspace notifications (which fred parses) come on their own receiver.
    released: Option<broadcast::Receiver<fred::types::Message>>,
    keyspace: Option<broadcast::Receiver<fred::types::KeyspaceEvent>>,
    /// The subscriber's reconnections, after which it subscribes again (a new connection has no
    /// subscriptions).
    reconnects: Option<broadcast::Receiver<fred::types::config::Server>>,
}

impl Feed {
    /// How often the lock is read besides on messages: seldom with notifications (in case one was
    /// lost with a connection), else every 200 ms.
    fn period(&self) -> Duration {
        if self.notified && self.keyspace.is_some() {
            Duration::from_secs(5)
        } else {
            Duration::from_millis(200)
        }
    }
}

/// The next item of an optional broadcast receiver, `None` after a lag; a receiver that closed is
/// dropped, and a missing one never answers.
async fn next<T: Clone>(receiver: &mut Option<broadcast::Receiver<T>>) -> Option<T> {
    let Some(rx) = receiver.as_mut() else {
        return std::future::pending().await;
    };
    match rx.recv().await {
        Ok(item) => Some(item),
        Err(broadcast::error::RecvError::Lagged(_)) => None,
        Err(broadcast::error::RecvError::Closed) => {
            *receiver = None;
            None
        }
    }
}

async fn watch(client: &LockClient, cli: &Cli, name: &str, enable: bool) -> Result<u8, Failure> {
    // When the latest read was sent: a hold gone by the next read ran out (rather than was released)
    // if its lease then left no more than the time since (the server read it after this instant).
    let mut sent = tokio::time::Instant::now();
    // The first read checks the name (no I/O for a bad one) and the connection.
    let mut last = client.inspect(name).await?;
    let lock = client.lock(name);
    let (key, channel) = (lock.redis_key().to_string(), lock.release_channel().to_string());
    let mut feed = Feed::default();
    match connect_subscriber(&cli.url, cli.timeout).await {
        Some(subscriber) => {
            feed.released = Some(subscriber.message_rx());
            feed.keyspace = Some(subscriber.keyspace_event_rx());
            feed.reconnects = Some(subscriber.reconnect_rx());
            feed.notified = subscribe(&subscriber, &key, &channel, enable, cli.timeout, true).await;
            feed.subscriber = Some(subscriber);
        }
        None => eprintln!("relock: no subscriber connection; reading the lock every 200 ms"),
    }
    if let Some(info) = &last {
        for holder in &info.holders {
            let event = Event {
                kind: "held",
                holder,
                count: holder.count,
                ttl: info.ttl,
                fence: info.fence,
            };
            emit(cli, name, &event)?;
        }
    }
    // Said once subscribed and read, so that a caller knows that from here on nothing is missed.
    let how = if feed.notified {
        "keyspace notifications"
    } else {
        "a read every 200 ms"
    };
    eprintln!("relock: watching {name:?} by {how}; Ctrl-C stops");
    let mut period = feed.period();
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = async {
        if tokio::signal::ctrl_c().await.is_err() {
            // No signal handler: run until killed.
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(stop);
    loop {
        // The keyspace events of the key since the last read.
        let mut ops: Vec<String> = Vec::new();
        tokio::select! {
            () = &mut stop => break,
            _ = next(&mut feed.released) => {}
            event = next(&mut feed.keyspace) => ops.extend(event.map(|event| event.operation)),
            reconnected = next(&mut feed.reconnects) => {
                if let (Some(_), Some(subscriber)) = (reconnected, &feed.subscriber) {
                    feed.notified =
                        subscribe(subscriber, &key, &channel, enable, cli.timeout, false).await;
                }
            }
            _ = ticks.tick() => {}
        }
        if feed.period() != period {
            period = feed.period();
            ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        // Events queued meanwhile: a release message comes after the events of the same script.
        if let Some(keyspace) = feed.keyspace.as_mut() {
            while let Ok(event) = keyspace.try_recv() {
                ops.push(event.operation);
            }
        }
        let sending = tokio::time::Instant::now();
        let now = match client.inspect(name).await {
            Ok(now) => now,
            Err(err) => {
                // Passing (a reconnect, a timeout): say so, keep watching.
                eprintln!("relock: reading {name:?} failed: {err}");
                continue;
            }
        };
        let elapsed = sent.elapsed();
        sent = sending;
        // With notifications the server says so; without, the lease tells (a release in the last
        // few milliseconds of a lease reads as an expiry).
        let expired = |info: &LockInfo| {
            ops.iter().any(|op| op == "expired")
                || info
                    .ttl
                    .is_some_and(|ttl| elapsed + Duration::from_millis(10) >= ttl)
        };
        // A release removes its field (`hdel`, then `del` once the hash is empty); a force-unlock
        // deletes the key outright (`del` alone). Only notifications tell them apart.
        let gone_how = if expired_any(last.as_ref(), expired) {
            Gone::Expired
        } else if ops.iter().any(|op| op == "del") && !ops.iter().any(|op| op == "hdel") {
            Gone::Forced
        } else {
            Gone::Released
        };
        for event in changes(last.as_ref(), now.as_ref(), gone_how) {
            emit(cli, name, &event)?;
        }
        last = now;
    }
    if let Some(subscriber) = feed.subscriber {
        let _ = tokio::time::timeout(Duration::from_millis(500), subscriber.quit()).await;
    }
    Ok(OK)
}

/// One change of a lock, as `watch` prints it.
struct Event<'a> {
    kind: &'static str,
    holder: &'a Holder,
    /// The holder's count after the event (0 once it holds nothing).
    count: u64,
    /// The lease left after the event, `None` when the lock is free.
    ttl: Option<Duration>,
    fence: Option<u64>,
}

/// How the holds of the earlier read that are gone by the next one went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    Released,
    Expired,
    /// Removed whoever held them (`relock unlock`, `Lock::force_unlock`).
    Forced,
}

/// Whether the earlier read's lease had run out by the next read (see `watch`).
fn expired_any(before: Option<&LockInfo>, expired: impl Fn(&LockInfo) -> bool) -> bool {
    before.is_some_and(expired)
}

/// The events between two reads of a lock; `gone`: how the holds of the earlier read that are gone
/// went.
fn changes<'a>(before: Option<&'a LockInfo>, after: Option<&'a LockInfo>, gone: Gone) -> Vec<Event<'a>> {
    let mut events = Vec::new();
    let ttl = after.and_then(|a| a.ttl);
    let fence = after.or(before).and_then(|i| i.fence);
    if let Some(before) = before {
        let gone_holders = before
            .holders
            .iter()
            .filter(|h| !after.is_some_and(|a| a.holders.iter().any(|n| n.field == h.field)));
        for holder in gone_holders {
            let kind = match gone {
                Gone::Expired => "expire",
                Gone::Forced => "force-unlock",
                Gone::Released => "release",
            };
            events.push(Event {
                kind,
                holder,
                count: 0,
                ttl,
                fence,
            });
        }
    }
    if let Some(after) = after {
        for holder in &after.holders {
            let earlier = before.and_then(|b| b.holders.iter().find(|h| h.field == holder.field));
            let kind = match earlier {
                None => "acquire",
                Some(earlier) if holder.count > earlier.count => "reenter",
                Some(earlier) if holder.count < earlier.count => "release",
                Some(_) => continue,
            };
            events.push(Event {
                kind,
                holder,
                count: holder.count,
                ttl,
                fence,
            });
        }
    }
    events
}

/// One event line: text, or a JSON object.
fn emit(cli: &Cli, name: &str, event: &Event<'_>) -> Result<(), Failure> {
    let time = timestamp(SystemTime::now());
    let count = event.count;
    let line = if cli.json {
        serde_json::json!({
            "time": time,
            "event": event.kind,
            "lock": name,
            "holder": to_json(event.holder),
            "count": count,
            "ttl_ms": ttl_ms(event.ttl),
            "fence": event.fence,
        })
        .to_string()
    } else {
        format!(
            "{time} {:<7} {name} holder={} count={count} ttl={} fence={}",
            event.kind,
            holder_name(event.holder),
            event.ttl.map_or_else(|| "-".to_string(), |t| ttl_text(Some(t))),
            event.fence.map_or_else(|| "-".to_string(), |f| f.to_string()),
        )
    };
    out(&line)
}

/// A second connection for messages; `None` if it cannot be made (then `watch` reads on a timer).
async fn connect_subscriber(url: &str, timeout: Duration) -> Option<Client> {
    // The URL was accepted by LockClient::connect_with already (TLS set up there as well).
    let config = Config::from_url(url).ok()?;
    let client = Builder::from_config(config)
        .with_connection_config(|conn| {
            conn.connection_timeout = timeout;
            conn.internal_command_timeout = timeout;
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
        .build()
        .ok()?;
    match tokio::time::timeout(timeout, client.init()).await {
        Ok(Ok(_)) => Some(client),
        _ => None,
    }
}

/// Subscribes to the release channel and, when the server sends keyspace notifications (or is
/// told to by `enable`), to the lock key's keyspace channel, on the server that holds the key.
/// True if keyspace notifications come. `announce`: say on stderr why they do not.
async fn subscribe(
    subscriber: &Client,
    key: &str,
    channel: &str,
    enable: bool,
    timeout: Duration,
    announce: bool,
) -> bool {
    let cluster = matches!(subscriber.client_config().server, ServerConfig::Clustered { .. });
    let slot = fred::types::cluster::ClusterRouting::hash_key(key.as_bytes());
    let bounded = Options {
        timeout: Some(timeout),
        ..Options::default()
    };
    let mut options = bounded.clone();
    if cluster {
        options.cluster_node = subscriber
            .cached_cluster_state()
            .and_then(|state| state.get_server(slot).cloned());
    }
    let on_key = subscriber.with_options(&options);
    let config = CustomCommand::new_static("CONFIG", ClusterHash::Custom(slot), false);
    let flags: Option<String> = on_key
        .custom::<Vec<String>, _>(config.clone(), vec!["GET", "notify-keyspace-events"])
        .await
        .ok()
        .and_then(|reply| reply.get(1).cloned());
    let mut notified = flags.as_deref().is_some_and(keyspace_on);
    if !notified && enable {
        let flags = with_keyspace(flags.as_deref().unwrap_or(""));
        let set: Result<Value, _> = on_key
            .custom(config, vec!["SET", "notify-keyspace-events", flags.as_str()])
            .await;
        match set {
            Ok(_) => notified = true,
            Err(err) => eprintln!("relock: could not turn keyspace notifications on: {err}"),
        }
    }
    if notified {
        let db = match &subscriber.client_config().server {
            ServerConfig::Clustered { .. } => 0,
            _ => subscriber.client_config().database.unwrap_or(0),
        };
        if let Err(err) = on_key.subscribe(format!("__keyspace@{db}__:{key}")).await {
            eprintln!("relock: could not subscribe to keyspace notifications: {err}");
            notified = false;
        }
    }
    if !notified && announce {
        match flags {
            Some(flags) => eprintln!(
                "relock: keyspace notifications are off (notify-keyspace-events {flags:?}); reading the \
                 lock every 200 ms instead (--enable-notifications turns them on)"
            ),
            None => eprintln!(
                "relock: cannot read notify-keyspace-events (CONFIG GET refused?); reading the lock \
                 every 200 ms instead"
            ),
        }
    }
    // Releases announce themselves here; on a cluster of Redis 7 or later by sharded pub/sub,
    // which older servers refuse (they publish to the classic channel then).
    let bounded = subscriber.with_options(&bounded);
    let _ = bounded.subscribe(channel).await;
    if cluster {
        let _ = bounded.ssubscribe(channel).await;
    }
    notified
}

/// Whether `notify-keyspace-events` sends what `watch` needs: keyspace events of hash commands,
/// generic commands (DEL, PEXPIRE) and expiries.
fn keyspace_on(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('A') || ['g', 'h', 'x'].iter().all(|c| flags.contains(*c)))
}

/// `flags` with what `watch` needs added.
fn with_keyspace(flags: &str) -> String {
    let mut out = flags.to_string();
    // `A` stands for every class of event, g, h and x among them.
    let classes = if out.contains('A') { "K" } else { "Kghx" };
    for c in classes.chars() {
        if !out.contains(c) {
            out.push(c);
        }
    }
    out
}

/// Writes a line to stdout. A closed pipe (`relock list | head`) ends the command quietly.
fn out(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::new(OK, "")),
        Err(err) => Err(Failure::new(REDIS, format!("cannot write the output: {err}"))),
    }
}

fn detail(info: &LockInfo) -> String {
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

fn semaphore_detail(info: &SemaphoreInfo) -> String {
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
fn semaphore_json(info: &SemaphoreInfo) -> Json {
    let mut value = to_json(info);
    value["held"] = info.held().into();
    value["available"] = info.available().into();
    value
}

fn fair_detail(info: &FairLockInfo) -> String {
    let mut text = match &info.lock {
        Some(lock) => format!("fair {}", detail(lock)),
        None => format!("fair lock {}: not held", info.name),
    };
    for (place, waiter) in info.queue.iter().enumerate() {
        text.push_str(&format!("\nqueued {} {}", place + 1, waiter_text(waiter)));
    }
    text
}

fn rw_detail(info: &RwLockInfo) -> String {
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
fn fair_json(info: &FairLockInfo) -> Json {
    let mut value = to_json(info);
    value["lock"] = info.lock.as_ref().map_or(Json::Null, info_json);
    value
}

/// A read-write lock in JSON: its writer as [`info_json`] writes a lock, each reader as its holder
/// with its key and lease, and the waiting writers.
fn rw_json(info: &RwLockInfo) -> Json {
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
fn ttl_ms(ttl: Option<Duration>) -> Json {
    ttl.map_or(Json::Null, |t| {
        (t.as_millis().min(u64::MAX as u128) as u64).into()
    })
}

/// A lock's holders, `client:owner` each (with the client's name and host where it said them),
/// comma-separated.
fn owners(info: &LockInfo) -> String {
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

fn holder_name(holder: &Holder) -> String {
    format!("{}:{}", holder.client_id, holder.owner)
}

fn ttl_text(ttl: Option<Duration>) -> String {
    match ttl {
        Some(ttl) => format!("{:.1}s", ttl.as_secs_f64()),
        None => "none".to_string(),
    }
}

/// Left-aligned columns two spaces apart.
fn table(rows: &[[String; 5]]) -> String {
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
fn info_json(info: &LockInfo) -> Json {
    let mut value = to_json(info);
    value["hold_count"] = info.hold_count().into();
    value
}

/// `value` in JSON (the inspection types serialize without fail).
fn to_json<T: serde::Serialize>(value: &T) -> Json {
    serde_json::to_value(value).unwrap_or(Json::Null)
}

/// UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn timestamp(at: SystemTime) -> String {
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
fn redact(url: &str) -> String {
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
