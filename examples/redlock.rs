//! A MultiLock over five independent masters: the same Lock and LockGuard, granted by a majority,
//! and still granted with two masters down.
//!
//! `cargo run --example redlock [redis://m1 redis://m2 ...]` (with no URLs it starts five throwaway
//! redis-servers from PATH).

mod support;

use std::time::Duration;

use relock::{LockConfig, MultiLock, QuorumConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    let mut servers = Vec::new();
    if urls.is_empty() {
        for _ in 0..5 {
            let server = support::throwaway()?;
            urls.push(server.url());
            servers.push(server);
        }
        println!("started {} throwaway masters", servers.len());
    }
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    // Masters up for less than the longest lease sit out of quorums (they may have restarted and
    // forgotten locks). Throwaway masters started a moment ago never granted any: let them vote.
    let fresh = !servers.is_empty();
    let config = QuorumConfig::default()
        .node_timeout(Duration::from_millis(100))
        .restart_quarantine(!fresh)
        .lock_config(LockConfig::default().watchdog_timeout(Duration::from_secs(10)));
    let multi = MultiLock::connect_with(&refs, config).await?;
    let lock = multi.lock(&format!("orders:{}", std::process::id()));

    let guard = lock.acquire().await?;
    // Drawn on the first read, from a majority that holds the lock.
    let token = guard.fencing_token().await?;
    println!(
        "held on a majority of {}: token {token}, valid for {:?}",
        multi.masters(),
        guard.validity()
    );
    guard.release().await?;

    if servers.len() == 5 {
        servers.truncate(3); // two masters gone
        let guard = lock.acquire().await?;
        println!(
            "with 2 of 5 masters down: held again, token {} (> {token}), valid for {:?}",
            guard.fencing_token().await?,
            guard.validity()
        );
        guard.release().await?;
        servers.truncate(2); // a majority gone
        match lock.try_acquire_for(Duration::from_millis(300)).await {
            Err(err) => println!("with 3 of 5 down: {err}"),
            Ok(_) => println!("unexpected: granted without a majority"),
        }
    }
    multi.shutdown().await;
    Ok(())
}
