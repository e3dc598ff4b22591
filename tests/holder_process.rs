//! A holder process killed with SIGKILL: its lock is free again within the lease plus a second.
//!
//! The holder is this very test binary, run again in child mode (`RELOCK_HOLDER_URL` set), so that it
//! can be killed without taking the test with it.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use relock::{LockClient, LockConfig};
use support::{unique_name, RedisServer};
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(2);

fn config() -> LockConfig {
    LockConfig::default().watchdog_timeout(LEASE)
}

/// Child mode: take the lock, say so, and hold it (renewed by the watchdog) until killed.
#[tokio::test]
#[ignore = "run by killed_holder_frees_the_lock_within_the_lease in a child process"]
async fn holder_child() {
    let (Ok(url), Ok(name)) = (
        std::env::var("RELOCK_HOLDER_URL"),
        std::env::var("RELOCK_HOLDER_NAME"),
    ) else {
        return;
    };
    let client = LockClient::connect_with(&url, config()).await.unwrap();
    let guard = client.lock(&name).acquire().await.unwrap();
    // Read (so drawn) while held: the next holder's token must be above it.
    println!("HELD {}", guard.fencing_token().await.unwrap());
    tokio::time::sleep(Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_frees_the_lock_within_the_lease() {
    let server = RedisServer::start();
    let name = unique_name("killed");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "holder_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RELOCK_HOLDER_URL", server.url())
        .env("RELOCK_HOLDER_NAME", &name)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let token: u64 = loop {
        let line = lines
            .next()
            .expect("child ended before holding the lock")
            .unwrap();
        // libtest prints the test's name on the same line first.
        if let Some(at) = line.find("HELD ") {
            break line[at + 5..].trim().parse().unwrap();
        }
    };
    let client = LockClient::connect_with(&server.url(), config()).await.unwrap();
    let lock = client.lock(&name);
    // Held across several renewals while the holder lives.
    tokio::time::sleep(LEASE * 2).await;
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "the watchdog did not keep the holder's lease"
    );

    child.kill().unwrap(); // SIGKILL: no release, no goodbye
    let killed = Instant::now();
    child.wait().unwrap();
    let guard = lock
        .try_acquire_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("lock never freed");
    let freed = killed.elapsed();
    assert!(freed <= LEASE + Duration::from_secs(1), "freed after {freed:?}");
    assert!(guard.fencing_token().await.unwrap() > token);
}
