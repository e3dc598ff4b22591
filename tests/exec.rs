//! `relock exec`, the binary run as a process against real redis-servers: children of one lock
//! never run at once, a lost lock stops the child, the child's exit code comes through, and a busy
//! lock under `--wait 0` says so with its own code.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use relock::{LockClient, LockConfig};
use support::{unique_name, RedisServer};
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_relock");
/// `relock exec`'s code for a lock it could not take within `--wait`.
const BUSY: i32 = 75;
/// `relock exec`'s code for a lock lost while the child ran.
const LOST: i32 = 76;

/// `relock --url URL exec ARGS…`, as a command ready to spawn.
fn exec(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["--url", url, "exec"])
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs `command` to completion off the runtime.
async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run relock"))
        .await
        .expect("relock thread")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Four `exec`s of one lock, each child appending `start` and `end` around a pause to one file:
/// the lines alternate, so no two children ran at once; and each child saw the lock's name and a
/// fencing token, which rise from child to child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_of_one_lock_never_run_at_once() {
    let server = RedisServer::start();
    let name = unique_name("exec");
    let dir = std::env::temp_dir().join(format!("relock-exec-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let script = format!(
        "echo \"start $RELOCK_LOCK $RELOCK_FENCING_TOKEN\" >> {log}; sleep 0.3; echo end >> {log}",
        log = log.display()
    );
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let command = exec(
                &server.url(),
                &["--lock", &name, "--wait", "30s", "--", "sh", "-c", &script],
            );
            tokio::spawn(output(command))
        })
        .collect();
    for run in runs {
        let out = run.await.unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    let mut last_token = 0;
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        assert_eq!(start[..2], ["start", name.as_str()], "{text}");
        let token: u64 = start[2].parse().expect("a fencing token");
        assert!(token > last_token, "tokens rise: {text}");
        last_token = token;
        assert_eq!(pair[1], "end", "one child at a time: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child's exit code comes through, a signal's as 128 + N; a program that does not exist is
/// 127; and the lock is free again after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_childs_exit_code_comes_through() {
    let server = RedisServer::start();
    let name = unique_name("code");
    let out = output(exec(
        &server.url(),
        &["--lock", &name, "--", "sh", "-c", "exit 7"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let out = output(exec(
        &server.url(),
        &["--lock", &name, "--", "sh", "-c", "kill -TERM $$"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(128 + 15), "{}", stderr(&out));
    let out = output(exec(
        &server.url(),
        &["--lock", &name, "--", "relock-no-such-program"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    let client = LockClient::connect(&server.url()).await.unwrap();
    assert!(
        !client.lock(&name).is_locked().await.unwrap(),
        "released after each"
    );
    client.shutdown().await;
}

/// `--wait 0` on a lock held elsewhere makes one try and exits with the busy code, running
/// nothing; a semaphore with no permit free does the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_under_wait_0_gives_the_busy_code() {
    let server = RedisServer::start();
    let name = unique_name("busy");
    let client = LockClient::connect(&server.url()).await.unwrap();
    let guard = client.lock(&name).acquire().await.unwrap();
    let start = Instant::now();
    let out = output(exec(
        &server.url(),
        &["--lock", &name, "--wait", "0", "--", "sh", "-c", "echo ran"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "nothing ran");
    assert!(stderr(&out).contains("busy"), "{}", stderr(&out));
    assert!(start.elapsed() < Duration::from_secs(10));
    // A bounded wait that runs out: the same code.
    let out = output(exec(
        &server.url(),
        &["--lock", &name, "--wait", "300ms", "--", "true"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    guard.release().await.unwrap();

    let sem = unique_name("busy-sem");
    let permit = client.semaphore(&sem, 1).acquire(1).await.unwrap();
    let args = ["--semaphore", &sem, "--permits", "1", "--wait", "0", "--", "true"];
    let out = output(exec(&server.url(), &args)).await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    permit.release().await.unwrap();
    let out = output(exec(&server.url(), &args)).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    client.shutdown().await;
}

/// A lock removed behind the holder's back is lost at the watchdog's next renewal: a child that
/// ignores `SIGTERM` gets `SIGKILL` after the grace period, and `exec` exits with the lost code,
/// within lease + grace + 1 s of the removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_child() {
    let server = RedisServer::start();
    let name = unique_name("lost");
    let dir = std::env::temp_dir().join(format!("relock-exec-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let started = dir.join("started");
    // The child says it started, then ignores SIGTERM and sleeps far longer than the test.
    let script = format!("touch {}; trap '' TERM; exec sleep 60", started.display());
    let args = [
        "--lock", &name, "--lease", "1s", "--grace", "1s", "--", "sh", "-c", &script,
    ];
    let run = tokio::spawn(output(exec(&server.url(), &args)));
    let client = LockClient::connect_with(&server.url(), LockConfig::default())
        .await
        .unwrap();
    assert!(
        support::eventually(Duration::from_secs(20), || started.exists()).await,
        "the child started"
    );
    assert!(client.lock(&name).is_locked().await.unwrap());
    let removed = Instant::now();
    assert!(client.lock(&name).force_unlock().await.unwrap());
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("exec ended")
        .unwrap();
    let took = removed.elapsed();
    assert_eq!(out.status.code(), Some(LOST), "{}", stderr(&out));
    // Lease (1 s) + grace (1 s) + 1 s.
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the removal"
    );
    assert!(stderr(&out).contains("lost"), "{}", stderr(&out));
    client.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
