//! Two plain threads (no async runtime in sight) deduct stock under the blocking API's lock and
//! never oversell.
//!
//! `cargo run --example blocking` (uses `REDIS_URL`, or starts a throwaway redis-server from PATH).

mod support;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use relock::blocking::LockClient;
use relock::LockConfig;

const STOCK: i64 = 50;

/// Stands for a database shared by several service instances. Its read-modify-write is
/// deliberately not atomic: only the lock makes it safe. It refuses writes that carry a fencing
/// token older than the last one it took, as storage behind a lock should.
#[derive(Default)]
struct Storage {
    stock: AtomicI64,
    last_token: AtomicU64,
}

impl Storage {
    fn read(&self) -> i64 {
        self.stock.load(Ordering::SeqCst)
    }

    fn write(&self, stock: i64, token: u64) -> Result<(), String> {
        if self.last_token.fetch_max(token, Ordering::SeqCst) > token {
            return Err(format!("stale write refused (token {token})"));
        }
        self.stock.store(stock, Ordering::SeqCst);
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let storage = Arc::new(Storage::default());
    storage.stock.store(STOCK, Ordering::SeqCst);
    let name = format!("inventory:sku-42-{}", std::process::id());
    println!("{STOCK} units in stock; two threads sell them one by one");

    let sellers: Vec<_> = ["north", "south"]
        .into_iter()
        .map(|seller| {
            let (url, name, storage) = (url.clone(), name.clone(), storage.clone());
            thread::spawn(move || -> Result<(&str, i64), String> {
                // One client per thread, as two service instances would have; the client runs its
                // own small runtime, so this thread just blocks.
                let client = LockClient::connect_with(&url, LockConfig::default().key_prefix("demo"))
                    .map_err(|e| e.to_string())?;
                let lock = client.lock(&name);
                let mut sold = 0;
                loop {
                    let guard = lock.acquire().map_err(|e| e.to_string())?;
                    let stock = storage.read();
                    if stock == 0 {
                        break; // `guard` is dropped here: released in the background
                    }
                    thread::sleep(Duration::from_millis(2)); // "compute" between read and write
                    let token = guard.fencing_token().map_err(|e| e.to_string())?;
                    storage.write(stock - 1, token)?;
                    sold += 1;
                    guard.release().map_err(|e| e.to_string())?; // or just drop it
                }
                client.shutdown().map_err(|e| e.to_string())?;
                Ok((seller, sold))
            })
        })
        .collect();

    let mut total = 0;
    for seller in sellers {
        let (name, sold) = seller.join().map_err(|_| "a seller panicked")??;
        println!("{name} sold {sold}");
        total += sold;
    }
    let left = storage.read();
    println!("sold {total}, {left} left in stock");
    if total != STOCK || left != 0 {
        return Err(format!("oversold or lost an update: sold {total}, left {left}").into());
    }
    println!("no oversell: every unit sold exactly once");
    Ok(())
}
