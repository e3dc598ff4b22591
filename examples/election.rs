//! Three instances of a scheduler campaign to run it; one leads at a time, and an observer sees
//! every change of leader. Each instance (a task with its own client, as a separate process would
//! have) leads for a moment and resigns, and the next takes office with a higher term.
//!
//! `cargo run --example election` (uses `REDIS_URL`, or starts a throwaway redis-server from PATH).

mod support;

use std::time::Duration;

use futures::StreamExt;
use relock::LockClient;

const INSTANCES: u32 = 3;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let name = format!("scheduler-{}", std::process::id());

    // Anyone may watch: the current leader first, then each change (None: nobody leads).
    let watcher = LockClient::connect(&url).await?;
    let mut changes = Box::pin(watcher.election(&name).observe());
    let observer = tokio::spawn(async move {
        let mut terms = 0;
        while let Some(change) = changes.next().await {
            match change? {
                Some(leader) => {
                    println!("observer: {} leads in term {}", leader.value, leader.term);
                    terms += 1;
                    if terms == INSTANCES {
                        break;
                    }
                }
                None => println!("observer: nobody leads"),
            }
        }
        Ok::<_, relock::Error>(())
    });

    let mut instances = Vec::new();
    for i in 0..INSTANCES {
        let (url, name) = (url.clone(), name.clone());
        instances.push(tokio::spawn(async move {
            let client = LockClient::connect(&url).await?;
            let address = format!("10.0.0.{}:8080", i + 1);
            let leadership = client.election(&name).campaign(&address).await?; // waits its turn
            println!("{address}: took office in term {}", leadership.term());
            let work = tokio::time::sleep(Duration::from_millis(300)); // schedule jobs meanwhile
            leadership.until_lost(work).await?; // stopped at once if the lease were lost
            leadership.resign().await?; // observers hear of it at once
            client.shutdown().await;
            Ok::<_, relock::Error>(())
        }));
    }
    for instance in instances {
        instance.await??;
    }
    observer.await??;
    watcher.shutdown().await;
    Ok(())
}
