//! Many concurrent buyers deduct stock under RAII lock guards and never oversell.
//!
//! `cargo run --example inventory` (uses `REDIS_URL`, or starts a throwaway redis-server from PATH).

mod support;

use std::time::Duration;

use fred::interfaces::KeysInterface;
use relock::{LockClient, LockConfig};

const STOCK: i64 = 50;
const CLIENTS: usize = 4;
const BUYERS_PER_CLIENT: usize = 20;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let sku = format!("sku-42-{}", std::process::id());
    let stock_key = format!("stock:{sku}");

    let admin = fred::clients::Client::new(fred::prelude::Config::from_url(&url)?, None, None, None);
    fred::interfaces::ClientLike::init(&admin).await?;
    let _: () = admin.set(&stock_key, STOCK, None, None, false).await?;
    println!(
        "{STOCK} units of {sku} in stock; {} buyers want one each",
        CLIENTS * BUYERS_PER_CLIENT
    );

    // Several clients, as several service instances would have.
    let mut buyers = Vec::new();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let client = LockClient::connect_with(&url, LockConfig::default().key_prefix("demo")).await?;
        clients.push(client.clone());
        for b in 0..BUYERS_PER_CLIENT {
            let lock = client.lock(&format!("inventory:{sku}"));
            let admin = admin.clone();
            let stock_key = stock_key.clone();
            buyers.push(tokio::spawn(async move {
                let guard = lock.acquire().await?;
                // Drawn on this first read (a holder that never reads it costs Redis nothing).
                let token = guard.fencing_token().await?;
                // A deliberately non-atomic read-modify-write: only the lock makes it safe.
                let stock: i64 = admin.get(&stock_key).await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                let bought = stock > 0;
                if bought {
                    let _: () = admin.set(&stock_key, stock - 1, None, None, false).await?;
                }
                drop(guard); // released here (it would be on `?` or panic too)
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((c, b, bought, token))
            }));
        }
    }

    let mut sold = 0;
    let mut tokens = Vec::new();
    for buyer in buyers {
        let (_, _, bought, token) = buyer.await?.map_err(|e| e.to_string())?;
        sold += i64::from(bought);
        tokens.push(token);
    }
    let left: i64 = admin.get(&stock_key).await?;
    tokens.sort_unstable();
    tokens.dedup();
    println!(
        "sold {sold}, {left} left in stock, {} distinct fencing tokens",
        tokens.len()
    );
    for client in &clients {
        client.shutdown().await;
    }
    let _: () = admin.del(&stock_key).await?;
    if sold != STOCK || left != 0 {
        return Err(format!("oversold or lost an update: sold {sold}, left {left}").into());
    }
    println!("no oversell: every unit sold exactly once");
    Ok(())
}
