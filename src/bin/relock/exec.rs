//! `relock exec`: runs a program only while this process holds a lock (or a semaphore's permit),
//! and stops it when the lock is lost.
//!
//! The watchdog renews the lease while the child runs. The child gets the lock's name and, for a
//! lock, its fencing token in its environment. When the lease is lost the child gets `SIGTERM`,
//! then `SIGKILL` after the grace period. `SIGINT`, `SIGTERM`, `SIGHUP` and `SIGQUIT` sent to
//! `relock` are passed on to the child, which decides when to stop; the lock is released once it
//! has exited. A `SIGINT` is not passed on while `relock` runs in its terminal's foreground: the
//! terminal sent it to the child too.

use std::process::ExitStatus;
use std::time::Duration;

use relock::{LockClient, LockGuard, Permit};
use tokio::process::Child;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::{Failure, REDIS};

/// The lock or permit was not obtained within `--wait`.
pub const BUSY: u8 = 75;
/// The lock was lost while the child ran: the child was stopped.
pub const LOST: u8 = 76;
/// The program could not be started (as `env` and `timeout` say it).
pub const CANNOT_RUN: u8 = 126;
/// The program was not found.
pub const NOT_FOUND: u8 = 127;

/// The environment variable that carries the lock's (or semaphore's) name to the child.
pub const ENV_NAME: &str = "RELOCK_LOCK";
/// The environment variable that carries the lock's fencing token to the child.
pub const ENV_TOKEN: &str = "RELOCK_FENCING_TOKEN";

/// What `exec` runs under.
pub struct Exec<'a> {
    /// A lock's name, or a semaphore's with its permits.
    pub what: What<'a>,
    /// How long to wait for it: `None` for as long as it takes, zero for one try.
    pub wait: Option<Duration>,
    /// How long the child has between `SIGTERM` and `SIGKILL` once the lock is lost.
    pub grace: Duration,
    /// The program and its arguments.
    pub command: &'a [String],
}

/// The lock `exec` takes.
pub enum What<'a> {
    /// A lock of this name.
    Lock(&'a str),
    /// One permit of the semaphore of this name, which has this many.
    Semaphore(&'a str, u64),
}

/// What is held while the child runs.
enum Held {
    Lock(LockGuard),
    Permit(Permit),
}

impl Held {
    async fn lost(&self) {
        match self {
            Held::Lock(guard) => guard.lost().await,
            Held::Permit(permit) => permit.lost().await,
        }
    }

    async fn release(self) -> Result<(), relock::Error> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Permit(permit) => permit.release().await,
        }
    }
}

/// Runs `exec`; its exit code: the child's, or one of this module's.
pub async fn exec(client: &LockClient, exec: Exec<'_>) -> Result<u8, Failure> {
    let Some(held) = take(client, &exec).await? else {
        return Err(Failure::new(BUSY, format!("{} is busy", exec.what.describe())));
    };
    let mut child = match spawn(&exec, &held).await {
        Ok(child) => child,
        Err(failure) => {
            let _ = held.release().await;
            return Err(failure);
        }
    };
    let outcome = supervise(&mut child, &held, exec.grace).await;
    let released = held.release().await;
    match (outcome, released) {
        (Supervised::Exited(status), Ok(())) => Ok(exit_code(status)),
        (Supervised::Exited(status), Err(err)) => {
            // The child finished under the lock as far as this process knows; the release's
            // error is worth a word, not the child's code.
            eprintln!("relock: releasing {}: {err}", exec.what.describe());
            Ok(exit_code(status))
        }
        (Supervised::Lost, _) => Err(Failure::new(
            LOST,
            format!("{} was lost: the program was stopped", exec.what.describe()),
        )),
        (Supervised::Failed(err), _) => Err(Failure::new(REDIS, format!("waiting for the program: {err}"))),
    }
}

impl What<'_> {
    fn describe(&self) -> String {
        match self {
            What::Lock(name) => format!("lock {name}"),
            What::Semaphore(name, _) => format!("semaphore {name}"),
        }
    }

    fn name(&self) -> &str {
        match self {
            What::Lock(name) | What::Semaphore(name, _) => name,
        }
    }
}

/// Takes the lock or permit within `--wait`; `None` if it stayed busy.
async fn take(client: &LockClient, exec: &Exec<'_>) -> Result<Option<Held>, Failure> {
    Ok(match exec.what {
        What::Lock(name) => {
            let lock = client.lock(name);
            let guard = match exec.wait {
                None => Some(lock.acquire().await?),
                Some(wait) if wait.is_zero() => lock.try_acquire().await?,
                Some(wait) => lock.try_acquire_for(wait).await?,
            };
            guard.map(Held::Lock)
        }
        What::Semaphore(name, permits) => {
            let semaphore = client.semaphore(name, permits);
            let permit = match exec.wait {
                None => Some(semaphore.acquire(1).await?),
                Some(wait) if wait.is_zero() => semaphore.try_acquire(1).await?,
                Some(wait) => semaphore.try_acquire_for(1, wait).await?,
            };
            permit.map(Held::Permit)
        }
    })
}

/// Starts the child with the lock's name (and token) in its environment.
async fn spawn(exec: &Exec<'_>, held: &Held) -> Result<Child, Failure> {
    let (program, args) = exec
        .command
        .split_first()
        .ok_or_else(|| Failure::new(crate::USAGE, "no program to run"))?;
    let mut command = tokio::process::Command::new(program);
    command.args(args).env(ENV_NAME, exec.what.name());
    if let Held::Lock(guard) = held {
        command.env(ENV_TOKEN, guard.fencing_token().await?.to_string());
    }
    command.spawn().map_err(|err| {
        let code = if err.kind() == std::io::ErrorKind::NotFound {
            NOT_FOUND
        } else {
            CANNOT_RUN
        };
        Failure::new(code, format!("cannot run {program}: {err}"))
    })
}

/// How the child's run ended.
enum Supervised {
    Exited(ExitStatus),
    /// The lock was lost; the child was stopped.
    Lost,
    Failed(std::io::Error),
}

/// Waits for the child, passing signals on; stops it if the lock is lost.
async fn supervise(child: &mut Child, held: &Held, grace: Duration) -> Supervised {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(err) => return Supervised::Failed(err),
    };
    let lost = held.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(status) => Supervised::Exited(status),
                    Err(err) => Supervised::Failed(err),
                };
            }
            () = &mut lost => {
                eprintln!("relock: the lock was lost: stopping the program");
                stop(child, grace).await;
                return Supervised::Lost;
            }
            signal = signals.next() => {
                if signal != libc::SIGINT || !in_foreground() {
                    send(child, signal);
                }
            }
        }
    }
}

/// `SIGTERM`, then `SIGKILL` if the child is still running after `grace`.
async fn stop(child: &mut Child, grace: Duration) {
    send(child, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

fn send(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) {
        // SAFETY: kill(2) with a pid of our own child, which has not been reaped (`id` is `None`
        // once it has), and a valid signal number.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Whether this process is in its terminal's foreground process group (a terminal's `SIGINT`
/// then reached the child, which shares the group, already).
fn in_foreground() -> bool {
    // SAFETY: plain queries of this process and its standard input; no memory is passed.
    unsafe { libc::tcgetpgrp(libc::STDIN_FILENO) == libc::getpgrp() }
}

/// The signals passed on to the child.
struct Signals(Vec<(libc::c_int, Signal)>);

impl Signals {
    fn new() -> std::io::Result<Signals> {
        let kinds = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];
        let signals = kinds
            .into_iter()
            .map(|kind| Ok((kind, signal(SignalKind::from_raw(kind))?)))
            .collect::<std::io::Result<_>>()?;
        Ok(Signals(signals))
    }

    /// The next signal received.
    async fn next(&mut self) -> libc::c_int {
        let received = self.0.iter_mut().map(|(kind, signal)| {
            let kind = *kind;
            Box::pin(async move {
                signal.recv().await;
                kind
            })
        });
        futures::future::select_all(received).await.0
    }
}

/// The child's exit code; 128 plus the signal's number if a signal ended it (as shells say it).
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}
