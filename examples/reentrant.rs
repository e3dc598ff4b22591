//! A nested call chain takes the same lock at every level without deadlocking itself, while another
//! task waits for the whole chain to finish.
//!
//! `cargo run --example reentrant` (uses `REDIS_URL`, or starts a throwaway redis-server from PATH).

mod support;

use std::time::Duration;

use relock::{Error, Lock, LockClient};

async fn transfer(lock: &Lock) -> Result<(), Error> {
    let guard = lock.acquire().await?;
    println!(
        "transfer: holding (depth {}, token {})",
        guard.hold_count(),
        guard.fencing_token().await?
    );
    debit(lock).await?;
    credit(lock).await
}

async fn debit(lock: &Lock) -> Result<(), Error> {
    let guard = lock.acquire().await?; // same task: re-entered, not deadlocked
    println!("  debit: holding (depth {})", guard.hold_count());
    audit(lock).await
}

async fn credit(lock: &Lock) -> Result<(), Error> {
    let guard = lock.acquire().await?;
    println!("  credit: holding (depth {})", guard.hold_count());
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

async fn audit(lock: &Lock) -> Result<(), Error> {
    let guard = lock.acquire().await?;
    println!("    audit: holding (depth {})", guard.hold_count());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = LockClient::connect(&url).await?;
    let lock = client.lock(&format!("account:{}", std::process::id()));

    let other = lock.clone();
    let waiter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        println!("other task: waiting for the lock");
        let guard = other.acquire().await?;
        println!(
            "other task: got it after the whole chain let go (depth {})",
            guard.hold_count()
        );
        Ok::<_, Error>(())
    });

    transfer(&lock).await?;
    waiter.await??;
    client.shutdown().await;
    Ok(())
}
