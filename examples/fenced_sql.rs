//! Fencing a SQL database with the lock's fencing token: a holder that paused past its lease comes
//! back and writes what it read before, and the database refuses it, because a later holder wrote
//! with a larger token. Uses SQLite through the `sqlite3` command (Debian: `apt-get install
//! sqlite3`); the same `WHERE fence <= $token` works in PostgreSQL or MySQL.
//!
//! `cargo run --example fenced_sql` (uses `REDIS_URL`, or starts a throwaway redis-server).

mod support;

use std::process::Command;
use std::time::Duration;

use relock::LockClient;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Runs `sql` on the database file `db`; its output, trimmed.
fn sqlite(db: &std::path::Path, sql: &str) -> Result<String> {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg(sql)
        .output()
        .map_err(|err| format!("sqlite3 could not run ({err}): install it (apt-get install sqlite3)"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The fenced write: applied only if no holder with a larger token wrote before. Returns whether
/// it was applied.
fn write_stock(db: &std::path::Path, qty: i64, token: u64) -> Result<bool> {
    let changed = sqlite(
        db,
        &format!(
            "UPDATE stock SET qty = {qty}, fence = {token} WHERE sku = 'sku-42' AND fence <= {token}; \
             SELECT changes();"
        ),
    )?;
    Ok(changed == "1")
}

#[tokio::main]
pub async fn main() -> Result<()> {
    let (url, _server) = support::redis_url()?;
    let dir = std::env::temp_dir().join(format!("relock-fenced-sql-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("shop.db");
    sqlite(
        &db,
        "CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL, fence INTEGER NOT NULL); \
         INSERT INTO stock VALUES ('sku-42', 10, 0);",
    )?;
    let (a, b) = (LockClient::connect(&url).await?, LockClient::connect(&url).await?);
    let name = format!("sku-42-{}", std::process::id());

    // A takes the lock with a short fixed lease, reads the stock, and then stalls (a GC pause, a
    // swapped-out process) past its lease.
    let stale = a.lock(&name).lease(Duration::from_millis(300)).acquire().await?;
    let stale_token = stale.fencing_token().await?;
    let read: i64 = sqlite(&db, "SELECT qty FROM stock WHERE sku = 'sku-42';")?.parse()?;
    println!("A holds the lock with token {stale_token}, reads {read} in stock, and stalls");
    tokio::time::sleep(Duration::from_millis(400)).await;

    // B gets the lock once A's lease ran out, and sells one unit with its larger token.
    let current = b.lock(&name).acquire().await?;
    let token = current.fencing_token().await?;
    let applied = write_stock(&db, read - 1, token)?;
    println!(
        "B holds it with token {token} and writes {}: applied = {applied}",
        read - 1
    );
    current.release().await?;

    // A wakes up and writes what it computed from its stale read: the database refuses it.
    let stale_applied = write_stock(&db, read - 1, stale_token)?;
    println!(
        "A, back, writes {} with token {stale_token}: applied = {stale_applied}",
        read - 1
    );
    let row = sqlite(&db, "SELECT qty, fence FROM stock WHERE sku = 'sku-42';")?;
    println!("the row: qty|fence = {row}");
    drop(stale);
    a.shutdown().await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    if !applied || stale_applied || row != format!("{}|{token}", read - 1) {
        return Err("the fence did not hold".into());
    }
    println!("the stale write was refused: the fence held");
    Ok(())
}
