//! Long work keeps its lock: the watchdog renews the lease every `renew_interval`, visible in the
//! tracing output, and the guard says at once when the lease is lost. The subscriber prints each
//! span as it closes: `acquire` (with `waited_us`, `token`, `outcome`), every `watchdog_round`, and
//! `release`, with the library's events nested in them.
//!
//! `RUST_LOG=relock=debug cargo run --example watchdog`
//! (uses `REDIS_URL`, or starts a throwaway redis-server from PATH).

mod support;

use std::time::Duration;

use fred::interfaces::{ClientLike, KeysInterface};
use relock::{Error, LockClient, LockConfig};
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // `RUST_LOG` as targets and levels (`relock=debug,relock::engine::watchdog=trace`).
    let filter: tracing_subscriber::filter::Targets = std::env::var("RUST_LOG")
        .ok()
        .and_then(|spec| spec.parse().ok())
        .unwrap_or_else(|| "relock=debug".parse().expect("a valid filter"));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE),
        )
        .with(filter)
        .init();
    let (url, _server) = support::redis_url()?;

    // A 3 s lease renewed every second: work of 5 s outlives the lease several times over.
    let config = LockConfig::default()
        .watchdog_timeout(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1));
    let client = LockClient::connect_with(&url, config).await?;
    let name = format!("report:{}", std::process::id());
    let guard = client.lock(&name).acquire().await?;
    let start = Instant::now();
    guard
        .until_lost(tokio::time::sleep(Duration::from_secs(5)))
        .await?;
    println!(
        "5 s of work done under a 3 s lease; still held: {}, valid for {:?}",
        guard.is_held(),
        guard.validity()
    );

    // Someone deletes the key behind our back: the next renewal notices and the work is stopped.
    let admin = fred::clients::Client::new(fred::prelude::Config::from_url(&url)?, None, None, None);
    admin.init().await?;
    let key = format!("relock:{{{name}}}");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _: i64 = admin.del(&key).await.unwrap_or(0);
    });
    match guard
        .until_lost(tokio::time::sleep(Duration::from_secs(30)))
        .await
    {
        Err(Error::LeaseLost) => println!("lease lost after {:?}; the work was stopped", start.elapsed()),
        other => println!("unexpected: {other:?}"),
    }
    client.shutdown().await;
    Ok(())
}
