//! `relock`: an inspector for the locks relock keeps in Redis. It uses only the public `relock`
//! API (and fred, for the subscriber connection of `watch`). This file parses the arguments and
//! dispatches to one module per subcommand (`list`, `show`, `unlock`, `watch`); `output` writes
//! what they print, as text or JSON.
//!
//! ```text
//! relock list [PATTERN]      held locks (name, holder, hold count, lease left, fence), by SCAN
//!   --semaphores             held semaphores instead (name, permits, held, free, holders)
//!   --fair                   held fair locks instead (name, holder, hold count, lease left, queued)
//!   --rw                     read-write locks written or read instead (name, writer, readers,
//!                            writers waiting, the write lease left)
//!   --elections              elections with a leader instead (name, leader, term, lease left)
//! relock show NAME           one lock in detail, and of that name: a latch that is counting, a
//!                            semaphore (its permits, each holder's permits and lease), a fair lock
//!                            (its holder and queue) and a read-write lock (its writer, each
//!                            reader's hold and lease, the writers waiting)
//! relock unlock NAME [--yes] force-unlock, after a confirmation on stdin unless --yes
//!   --fair, --rw             the fair lock, or the read-write lock, of that name
//! relock watch NAME          acquire / re-enter / release / expire / force-unlock events until Ctrl-C
//! relock exec --lock NAME -- CMD [ARGS]
//!                            run CMD while holding the lock; stop it if the lock is lost
//!   --semaphore NAME --permits N   one permit of that semaphore instead
//!   --wait 30s               give up if not held by then (0: try once); default: wait
//!   --lease 30s              the lease the watchdog renews (default: the library's, 30 s)
//!   --grace 10s              from SIGTERM to SIGKILL once the lock is lost
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

mod exec;
mod list;
mod output;
mod show;
mod unlock;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use relock::{Error, LockClient, LockConfig};

use exec::{exec, Exec, What};
use list::{list, list_elections, list_fair, list_rw, list_semaphores};
use output::redact;
use show::show;
use unlock::{unlock, Kind};
use watch::watch;

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
  4  confirmation refused (unlock)
See `relock exec --help` for the codes of exec.";

const EXEC_EXIT_CODES: &str = "\
The program gets RELOCK_LOCK (the lock's or semaphore's name) and, for a lock, RELOCK_FENCING_TOKEN
in its environment. SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to it; the lock is released
once it has exited.

Exit codes:
  the program's own code once it has exited (128 + N if signal N ended it)
  2    usage error (bad arguments, lock name, prefix or URL)
  3    connection or Redis error before the program started
  75   busy: not held within --wait (with --wait 0, at the one try)
  76   the lock was lost while the program ran: it got SIGTERM, and SIGKILL after --grace
  126  the program could not be started
  127  the program was not found";

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
        #[arg(long, conflicts_with_all = ["fair", "rw", "elections"])]
        semaphores: bool,
        /// List the elections that have a leader instead: name, leader's value, term, lease left.
        #[arg(long, conflicts_with_all = ["fair", "rw"])]
        elections: bool,
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
    /// Run a program only while holding a lock (or a permit of a semaphore), with the watchdog
    /// renewing it; stop the program if the lock is lost.
    #[command(after_help = EXEC_EXIT_CODES)]
    Exec {
        /// The lock to hold.
        #[arg(long, required_unless_present = "semaphore", conflicts_with = "semaphore")]
        lock: Option<String>,
        /// The semaphore to take one permit of (with --permits).
        #[arg(long, requires = "permits")]
        semaphore: Option<String>,
        /// How many permits the semaphore has.
        #[arg(long, requires = "semaphore", value_parser = clap::value_parser!(u64).range(1..))]
        permits: Option<u64>,
        /// Give up if not held within this long (`0`: one try); by default wait as long as it takes.
        #[arg(long, value_parser = wait)]
        wait: Option<Duration>,
        /// The lease the watchdog keeps renewing (`LockConfig::watchdog_timeout`): how long others
        /// wait after this process dies without releasing.
        #[arg(long, value_parser = duration)]
        lease: Option<Duration>,
        /// Once the lock is lost, how long the program has between SIGTERM and SIGKILL.
        #[arg(long, default_value = "10s", value_parser = duration)]
        grace: Duration,
        /// The program and its arguments (after `--`).
        #[arg(required = true, last = true)]
        command: Vec<String>,
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
        return Err("a duration must be 1ms to 1h".into());
    }
    Ok(duration)
}

/// A wait: a duration as [`duration`] reads it, or `0` for one try.
fn wait(arg: &str) -> Result<Duration, String> {
    if arg.trim().parse::<f64>() == Ok(0.0) {
        return Ok(Duration::ZERO);
    }
    duration(arg)
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
    let mut config = LockConfig::default()
        .key_prefix(cli.prefix.clone())
        .command_timeout(cli.timeout);
    if let Command::Exec {
        lease: Some(lease), ..
    } = &cli.command
    {
        config = config.watchdog_timeout(*lease);
    }
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
    let outcome = dispatch(&client, &cli).await;
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

/// Runs the subcommand on `client`.
async fn dispatch(client: &LockClient, cli: &Cli) -> Result<u8, Failure> {
    match &cli.command {
        Command::List {
            pattern,
            semaphores,
            elections,
            fair,
            rw,
        } => {
            let pattern = pattern.as_deref();
            if *elections {
                list_elections(client, cli, pattern).await
            } else if *semaphores {
                list_semaphores(client, cli, pattern).await
            } else if *fair {
                list_fair(client, cli, pattern).await
            } else if *rw {
                list_rw(client, cli, pattern).await
            } else {
                list(client, cli, pattern).await
            }
        }
        Command::Show { name } => show(client, cli, name).await,
        Command::Unlock { name, yes, fair, rw } => {
            let kind = match (*fair, *rw) {
                (true, _) => Kind::Fair,
                (_, true) => Kind::Rw,
                _ => Kind::Plain,
            };
            unlock(client, cli, name, kind, *yes).await
        }
        Command::Watch {
            name,
            enable_notifications,
        } => watch(client, cli, name, *enable_notifications).await,
        Command::Exec {
            lock,
            semaphore,
            permits,
            wait,
            grace,
            command,
            ..
        } => {
            let what = match (lock, semaphore, permits) {
                (Some(name), _, _) => What::Lock(name),
                (None, Some(name), Some(permits)) => What::Semaphore(name, *permits),
                // clap asks for one or the other.
                _ => {
                    return Err(Failure::new(
                        USAGE,
                        "give --lock NAME, or --semaphore NAME --permits N",
                    ))
                }
            };
            let run = Exec {
                what,
                wait: *wait,
                grace: *grace,
                command,
            };
            exec(client, run).await
        }
    }
}
