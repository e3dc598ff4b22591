//! The fenced store that the chaos workers sell from: a Redis of its own that no fault touches.

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{KeysInterface, LuaInterface};

use crate::history::Store;

const SCRIPT: &str = include_str!("store.lua");
const TIMEOUT: Duration = Duration::from_secs(2);

fn keys(item: u32) -> Vec<String> {
    ["stock", "fence", "seq", "sales"]
        .iter()
        .map(|what| format!("store:{{item-{item}}}:{what}"))
        .collect()
}

/// Sets every item's stock.
pub async fn stock(client: &Client, items: u32, stock: i64) {
    for item in 0..items {
        let _: () = client
            .set(&keys(item)[0], stock, None, None, false)
            .await
            .expect("SET stock");
    }
}

/// Per item: (stock, sales accepted).
pub async fn totals(client: &Client, item: u32) -> (i64, i64) {
    let keys = keys(item);
    let stock: Option<i64> = client.get(&keys[0]).await.expect("GET stock");
    let sales: Option<i64> = client.get(&keys[3]).await.expect("GET sales");
    (stock.unwrap_or(0), sales.unwrap_or(0))
}

/// A fenced read of the stock.
pub async fn read(client: &Client, item: u32, token: u64) -> Store {
    call(client, item, vec!["r".into(), token.to_string(), "0".into()]).await
}

/// A fenced write of the stock.
pub async fn write(client: &Client, item: u32, token: u64, stock: i64) -> Store {
    call(
        client,
        item,
        vec!["w".into(), token.to_string(), stock.to_string()],
    )
    .await
}

async fn call(client: &Client, item: u32, args: Vec<String>) -> Store {
    let reply = tokio::time::timeout(
        TIMEOUT,
        client.eval::<Vec<i64>, _, _, _>(SCRIPT, keys(item), args),
    )
    .await;
    match reply.as_ref().map(|r| r.as_ref().map(Vec::as_slice)) {
        Ok(Ok([1, seq, value])) => Store::Accepted {
            seq: *seq as u64,
            value: *value,
        },
        Ok(Ok([0, fence])) => Store::Rejected { fence: *fence as u64 },
        _ => Store::Failed,
    }
}
