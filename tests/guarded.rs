//! Guarded writes (`LockGuard::atomically`) against real servers: applied only while the hold is
//! current, declined by their checks with nothing applied, refused with nothing applied once the
//! lock was lost (known here, or only in Redis), and refused before any I/O for keys of another
//! slot and for a MultiLock; a write held up in the network past its lease is refused by Redis; on
//! a cluster, also after the lock's slot moved, and after a lease ran out across a move.

mod support;

use std::time::Duration;

use fred::types::Value;
use relock::{Error, LockClient, LockConfig, MultiLock, QuorumConfig};
use support::topologies::RedisCluster;
use support::{unique_name, RedisServer, ServerExt};

async fn client(url: &str) -> LockClient {
    // The default renewal interval (10 s): no watchdog round learns of a loss during a test.
    LockClient::connect(url).await.expect("connect")
}

fn stock(server: &RedisServer, key: &str) -> Option<i64> {
    server.cmd(&["GET", key]).as_int()
}

fn orders(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["LLEN", key]).as_int().unwrap_or(0)
}

/// The inventory case: the stock is checked, decremented and the order recorded in one call while
/// the lock is held; when the stock runs out the check declines and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_writes_and_its_checks_decline_with_nothing_applied() {
    let server = RedisServer::start();
    let name = unique_name("sku");
    let (stock_key, orders_key) = (format!("stock:{{{name}}}"), format!("orders:{{{name}}}"));
    server.cmd(&["SET", &stock_key, "2"]);
    let client = client(&server.url()).await;
    let guard = client.lock(&name).acquire().await.unwrap();
    for sold in 1..=2 {
        let replies = guard
            .atomically(|tx| {
                tx.when_at_least(&stock_key, 1)
                    .decr_by(&stock_key, 1)
                    .rpush(&orders_key, &format!("order-{sold}"));
            })
            .await
            .unwrap()
            .expect("in stock");
        assert_eq!(replies, [Value::Integer(2 - sold), Value::Integer(sold)]);
    }
    let declined = guard
        .atomically(|tx| {
            tx.when_at_least(&stock_key, 1)
                .decr_by(&stock_key, 1)
                .rpush(&orders_key, "order-3");
        })
        .await
        .unwrap();
    assert!(declined.is_none(), "sold out");
    assert_eq!(stock(&server, &stock_key), Some(0));
    assert_eq!(orders(&server, &orders_key), 2);
    // The other checks, and a command's reply that is no integer.
    let flag = format!("flag:{{{name}}}");
    let set = guard
        .atomically(|tx| {
            tx.when_absent(&flag).set(&flag, "on");
        })
        .await
        .unwrap()
        .expect("absent");
    assert_eq!(set, [Value::from("OK")]);
    let again = guard.atomically(|tx| {
        tx.when_absent(&flag).set(&flag, "twice");
    });
    assert!(again.await.unwrap().is_none());
    let equal = guard.atomically(|tx| {
        tx.when_equal(&flag, "on").del(&flag);
    });
    assert_eq!(equal.await.unwrap().expect("equal"), [Value::Integer(1)]);
    assert!(guard.is_held());
    guard.release().await.unwrap();
    client.shutdown().await;
}

/// A lock removed behind its holder's back and taken by another client: the holder does not know
/// yet (its watchdog's next round is seconds away), but Redis refuses its guarded write, which
/// changes nothing, and the holder learns it lost the lock. The new holder's writes go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_lost_its_lock_in_redis_writes_nothing() {
    let server = RedisServer::start();
    let name = unique_name("lost");
    let stock_key = format!("stock:{{{name}}}");
    server.cmd(&["SET", &stock_key, "10"]);
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let stale = a.lock(&name).acquire().await.unwrap();
    assert!(b.lock(&name).force_unlock().await.unwrap());
    let current = b.lock(&name).acquire().await.unwrap();
    assert!(stale.is_held(), "the stale holder has not noticed");
    let write = stale.atomically(|tx| {
        tx.decr_by(&stock_key, 1);
    });
    assert!(matches!(write.await, Err(Error::LeaseLost)));
    assert_eq!(stock(&server, &stock_key), Some(10), "nothing applied");
    assert!(!stale.is_held(), "the refusal ends the hold as lost");
    let write = current.atomically(|tx| {
        tx.decr_by(&stock_key, 1);
    });
    assert_eq!(write.await.unwrap().expect("applied"), [Value::Integer(9)]);
    current.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// A holder paused past its fixed lease while another client took the lock: its guarded write is
/// refused before anything is sent, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_writes_nothing() {
    let server = RedisServer::start();
    let name = unique_name("paused");
    let stock_key = format!("stock:{{{name}}}");
    server.cmd(&["SET", &stock_key, "10"]);
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let lease = Duration::from_millis(500);
    let stale = a.lock(&name).lease(lease).acquire().await.unwrap();
    let current = b.lock(&name).acquire().await.unwrap();
    let calls = server.command_calls("evalsha");
    let write = stale.atomically(|tx| {
        tx.decr_by(&stock_key, 1);
    });
    assert!(matches!(write.await, Err(Error::LeaseLost)));
    assert_eq!(stock(&server, &stock_key), Some(10), "nothing applied");
    assert!(current.is_held());
    assert_eq!(server.command_calls("evalsha"), calls, "nothing sent");
    current.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// A holder whose write is held up in the network past its lease, while another client takes the
/// lock: Redis refuses the write when it arrives, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_delayed_past_the_lease_is_refused_by_redis() {
    let server = RedisServer::start();
    let proxy = relock::testing::Proxy::start(server.port()).await;
    let name = unique_name("delayed");
    let stock_key = format!("stock:{{{name}}}");
    server.cmd(&["SET", &stock_key, "10"]);
    let (a, b) = (client(&proxy.url()).await, client(&server.url()).await);
    let lease = Duration::from_millis(600);
    let stale = a.lock(&name).lease(lease).acquire().await.unwrap();
    // The write leaves while the hold is valid, and reaches Redis two seconds later.
    proxy.delay_request_once(stock_key.as_bytes(), Duration::from_millis(2000));
    let key = stock_key.clone();
    let sent = tokio::time::Instant::now();
    let write = tokio::spawn(async move {
        let result = stale.atomically(|tx| {
            tx.decr_by(&key, 1);
        });
        (result.await, stale)
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    let before_b = server.script_calls();
    let current = b.lock(&name).acquire().await.unwrap();
    let before_write = server.script_calls();
    // The stale guard is kept: its release on drop is a script call too.
    let (result, _stale) = write.await.unwrap();
    assert!(matches!(result, Err(Error::LeaseLost)), "{result:?}");
    assert!(before_write > before_b, "the other client took the lock first");
    // Refused by Redis, not here: the answer waited for the delayed request.
    assert!(
        sent.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        sent.elapsed()
    );
    assert!(server.script_calls() > before_write, "the write reached Redis");
    assert_eq!(stock(&server, &stock_key), Some(10), "nothing applied");
    assert!(current.is_held());
    current.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// A key of another slot, and a MultiLock's guard: refused before any I/O, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_another_slot_and_multilocks_are_refused_before_any_io() {
    let server = RedisServer::start();
    let name = unique_name("slot");
    let client = client(&server.url()).await;
    let guard = client.lock(&name).acquire().await.unwrap();
    let write = guard.atomically(|tx| {
        tx.set("stock", "1");
    });
    match write.await {
        Err(err @ Error::InvalidConfig(_)) => {
            let text = err.to_string();
            assert!(
                text.contains(&format!("stock:{{{name}}}")),
                "names the tag: {text}"
            );
        }
        other => panic!("refused, not {other:?}"),
    }
    assert!(!server.exists("stock"));
    guard.release().await.unwrap();
    client.shutdown().await;

    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let config = QuorumConfig::default()
        .restart_quarantine(false)
        .lock_config(LockConfig::default());
    let multi = MultiLock::connect_with(&urls, config).await.unwrap();
    let guard = multi.lock(&name).acquire().await.unwrap();
    let key = format!("stock:{{{name}}}");
    let write = guard.atomically(|tx| {
        tx.set(&key, "1");
    });
    assert!(matches!(write.await, Err(Error::InvalidConfig(_))));
    assert!(servers.iter().all(|s| !s.exists(&key)));
    guard.release().await.unwrap();
    multi.shutdown().await;
}

/// On a cluster, a guarded write follows the lock's slot to another primary, and after the lock
/// was taken from its holder there, the holder's write changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_write_follows_a_resharded_slot() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .unwrap();
    let name = unique_name("cluster");
    let stock_key = format!("stock:{{{name}}}");
    let slot = cluster.slot(&stock_key);
    cluster.primary_of_slot(slot).cmd(&["SET", &stock_key, "5"]);
    let (a, b) = (client(&cluster.url()).await, client(&cluster.url()).await);
    let guard = a.lock(&name).acquire().await.unwrap();
    let write = guard.atomically(|tx| {
        tx.decr_by(&stock_key, 1);
    });
    assert_eq!(write.await.unwrap().expect("applied"), [Value::Integer(4)]);
    let from = cluster.primary_of_slot(slot).port();
    tokio::task::block_in_place(|| cluster.move_slot_away(slot));
    let write = guard.atomically(|tx| {
        tx.decr_by(&stock_key, 1);
    });
    assert_eq!(
        write.await.unwrap().expect("applied after the move"),
        [Value::Integer(3)]
    );
    assert!(b.lock(&name).force_unlock().await.unwrap());
    let current = b.lock(&name).acquire().await.unwrap();
    let write = guard.atomically(|tx| {
        tx.decr_by(&stock_key, 1);
    });
    assert!(matches!(write.await, Err(Error::LeaseLost)));
    let stock = cluster.primary_of_slot(slot).cmd(&["GET", &stock_key]).as_int();
    assert_eq!(stock, Some(3), "nothing applied");
    current.release().await.unwrap();
    // A holder with a fixed lease: the slot moves back during the lease, the lease runs out, another
    // client takes the lock on the slot's new primary, and the holder's write changes nothing.
    let stale = a
        .lock(&name)
        .lease(Duration::from_millis(800))
        .acquire()
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        let from = cluster.nodes.iter().find(|n| n.port() == from).unwrap();
        cluster.move_slot(slot, from);
    });
    let current = b.lock(&name).acquire().await.unwrap();
    let write = stale.atomically(|tx| {
        tx.decr_by(&stock_key, 1);
    });
    assert!(matches!(write.await, Err(Error::LeaseLost)));
    let stock = cluster.primary_of_slot(slot).cmd(&["GET", &stock_key]).as_int();
    assert_eq!(
        stock,
        Some(3),
        "nothing applied after the move and the lease's end"
    );
    current.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}
