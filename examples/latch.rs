//! A batch job waits for its workers: each worker (here a task with its own client, as a separate
//! process would have) counts the latch down when its part is done, and the job wakes on the one
//! message that the last count-down publishes.
//!
//! `cargo run --example latch` (uses `REDIS_URL`, or starts a throwaway redis-server from PATH).

mod support;

use std::time::Duration;

use relock::LockClient;
use tokio::time::Instant;

const WORKERS: u64 = 4;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let name = format!("nightly-import-{}", std::process::id());
    let job = LockClient::connect(&url).await?;
    let latch = job.latch(&name);
    assert!(
        latch.set_count(WORKERS).await?,
        "a latch of that name is still counting"
    );
    println!("waiting for {WORKERS} workers");

    let start = Instant::now();
    for worker in 0..WORKERS {
        let url = url.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let client = LockClient::connect(&url).await?;
            tokio::time::sleep(Duration::from_millis(200 * (worker + 1))).await; // its part
            let left = client.latch(&name).count_down().await?;
            println!(
                "worker {worker} done at {:?}; {left} still working",
                start.elapsed()
            );
            client.shutdown().await;
            Ok::<_, relock::Error>(())
        });
    }

    if latch.wait_for(Duration::from_secs(30)).await? {
        println!(
            "all {WORKERS} workers done after {:?}: the import may go on",
            start.elapsed()
        );
    } else {
        println!(
            "some workers did not finish within 30 s; {} left",
            latch.count().await?
        );
    }
    job.shutdown().await;
    Ok(())
}
