//! Many concurrent buyers deduct stock under RAII lock guards and never oversell: each sale is a
//! guarded write, which Redis applies only while the buyer's hold on the lock is current.
//!
//! `cargo run --example inventory` (uses `REDIS_URL`, or starts a throwaway redis-server from PATH).

mod support;

use fred::interfaces::{ClientLike, KeysInterface};
use relock::{LockClient, LockConfig};

const STOCK: i64 = 50;
const CLIENTS: usize = 4;
const BUYERS_PER_CLIENT: usize = 20;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let sku = format!("sku-42-{}", std::process::id());
    // The data shares the lock's hash tag (the lock `sku` has the key `demo:{sku}`): one slot, so
    // one script call can check the hold and write, on a cluster too.
    let stock_key = format!("stock:{{{sku}}}");
    let orders_key = format!("orders:{{{sku}}}");

    let admin = fred::clients::Client::new(fred::prelude::Config::from_url(&url)?, None, None, None);
    admin.init().await?;
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
            let lock = client.lock(&sku);
            let (stock_key, orders_key) = (stock_key.clone(), orders_key.clone());
            buyers.push(tokio::spawn(async move {
                let guard = lock.acquire().await?;
                // Check the stock, take one and record the order in one call, applied only while
                // this hold is current: a buyer paused past its lease cannot sell after the next
                // buyer took the lock.
                let order = format!("buyer-{c}-{b}");
                let sale = guard
                    .atomically(|tx| {
                        tx.when_at_least(&stock_key, 1)
                            .decr_by(&stock_key, 1)
                            .rpush(&orders_key, &order);
                    })
                    .await?;
                drop(guard); // released here (it would be on `?` or panic too)
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(sale.is_some())
            }));
        }
    }

    let mut sold = 0;
    for buyer in buyers {
        sold += i64::from(buyer.await?.map_err(|e| e.to_string())?);
    }
    let left: i64 = admin.get(&stock_key).await?;
    let llen = fred::types::CustomCommand::new_static("LLEN", fred::types::ClusterHash::FirstKey, false);
    let orders: i64 = admin.custom(llen, vec![orders_key.as_str()]).await?;
    println!("sold {sold}, {left} left in stock, {orders} orders recorded");
    for client in &clients {
        client.shutdown().await;
    }
    let _: () = admin.del(vec![stock_key.as_str(), orders_key.as_str()]).await?;
    if sold != STOCK || left != 0 || orders != STOCK {
        return Err(format!("oversold or lost an update: sold {sold}, left {left}").into());
    }
    println!("no oversell: every unit sold exactly once");
    Ok(())
}
