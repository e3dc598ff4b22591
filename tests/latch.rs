//! `CountDownLatch` against a real redis-server: arming only when open, counting down to zero and
//! reuse (Redisson's `RedissonCountDownLatchTest` scenarios), waiters of several clients woken by
//! the one message, bounded waits with the server paused, a resend counted once, a late arrival
//! kept out of the next round, a latch armed before rounds, bad input, and a model of the latch's
//! rules driven by random operations over several clients.

mod support;

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface, LuaInterface};
use proptest::prelude::*;
use relock::{CountDownLatch, Error, LockClient, LockConfig};
use support::{unique_name, RedisServer};
use tokio::time::Instant;

fn config() -> LockConfig {
    LockConfig::default().command_timeout(Duration::from_millis(800))
}

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect_with(&server.url(), config())
        .await
        .expect("connect")
}

fn latch_key(name: &str) -> String {
    format!("relock:{{{name}}}:latch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_count_arms_only_an_open_latch_and_it_can_be_reused() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let latch = client.latch(&unique_name("reuse"));
    assert_eq!(latch.count().await.unwrap(), 0, "never set: open");
    assert!(latch.set_count(2).await.unwrap());
    assert!(!latch.set_count(5).await.unwrap(), "still counting: unchanged");
    assert_eq!(latch.count().await.unwrap(), 2);
    assert_eq!(latch.count_down().await.unwrap(), 1);
    assert!(!latch.set_count(5).await.unwrap());
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert!(
        !server.exists(&latch_key(latch.name())),
        "an open latch leaves no key"
    );
    assert_eq!(
        latch.count_down().await.unwrap(),
        0,
        "an open latch does not go below zero"
    );
    assert!(latch.set_count(3).await.unwrap(), "open again: armed again");
    assert_eq!(latch.count().await.unwrap(), 3);
    assert!(latch
        .wait_for(Duration::from_millis(100))
        .await
        .is_ok_and(|open| !open));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiter_of_every_client_wakes_when_the_count_reaches_zero() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let name = unique_name("batch");
    let latch = a.latch(&name);
    assert!(latch.set_count(2).await.unwrap());
    let mut waiters = Vec::new();
    for latch in [a.latch(&name), a.latch(&name), b.latch(&name), b.latch(&name)] {
        waiters.push(tokio::spawn(async move {
            latch.wait().await.expect("wait");
            Instant::now()
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.latch(&name).count_down().await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter was released before zero"
    );
    let opened = Instant::now();
    assert_eq!(a.latch(&name).count_down().await.unwrap(), 0);
    for waiter in waiters {
        let woke = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the message")
            .unwrap();
        // By the message: the waiters have no timer to wake them otherwise.
        assert!(
            woke.duration_since(opened) < Duration::from_secs(2),
            "woke {:?} late",
            woke - opened
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_is_bounded_with_the_server_paused() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let latch = client.latch(&unique_name("paused"));
    assert!(latch.set_count(1).await.unwrap());
    let start = Instant::now();
    assert!(!latch.wait_for(Duration::from_millis(300)).await.unwrap());
    assert!(start.elapsed() < Duration::from_secs(2));
    server.pause();
    let start = Instant::now();
    let outcome = latch.wait_for(Duration::from_millis(300)).await;
    let took = start.elapsed();
    server.resume();
    assert!(
        matches!(outcome, Err(Error::Timeout(_))),
        "no read was answered: {outcome:?}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
    server.pause();
    let start = Instant::now();
    let outcome = latch.count_down().await;
    let took = start.elapsed();
    server.resume();
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(
        took < Duration::from_secs(3),
        "count_down took {took:?} (command timeout 800 ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_count_down_counts_once() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let latch = client.latch(&unique_name("resend"));
    assert!(latch.set_count(3).await.unwrap());
    // The same call twice, as a resend would deliver it: the script and arguments relock sends.
    let admin = support::fred_client(&server.url()).await;
    let body = concat!(
        include_str!("../scripts/prelude.lua"),
        include_str!("../scripts/latch_count_down.lua")
    );
    let channel = format!("{}:zero", latch_key(latch.name()));
    let round: String = admin.hget(latch_key(latch.name()), "round").await.expect("round");
    let args = vec!["call-1".to_string(), channel, "PUBLISH".to_string(), round];
    for _ in 0..2 {
        let left: i64 = admin
            .eval(body, vec![latch_key(latch.name())], args.clone())
            .await
            .expect("eval");
        assert_eq!(left, 2);
    }
    assert_eq!(latch.count().await.unwrap(), 2);
    assert_eq!(
        latch.count_down().await.unwrap(),
        1,
        "another call is another arrival"
    );
}

/// A count-down that its caller gave up on (`Error::Timeout`) and that reaches the server only
/// after its round opened and the next was armed counts for nothing: an arrival belongs to the
/// round it was sent in. (A late copy landing in the next round would release that round's waiters
/// one arrival early.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_down_that_lands_after_its_round_opened_does_not_count_in_the_next() {
    let server = RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port()).await;
    let late = LockClient::connect_with(
        &proxy.url(),
        LockConfig::default().command_timeout(Duration::from_millis(300)),
    )
    .await
    .expect("connect through the proxy");
    let coordinator = client(&server).await;
    let name = unique_name("late");
    let latch = coordinator.latch(&name);
    assert!(latch.set_count(2).await.unwrap());
    // Only the count-down call names the channel: the proxy holds it back past the caller's bound.
    proxy.delay_request_once(b":zero", Duration::from_millis(1500));
    let gave_up = late.latch(&name).count_down().await;
    assert!(matches!(gave_up, Err(Error::Timeout(_))), "{gave_up:?}");
    assert_eq!(latch.count_down().await.unwrap(), 1);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert!(latch.set_count(2).await.unwrap(), "the next round");
    // The held call reaches the server 1.5 s after it was sent.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        latch.count().await.unwrap(),
        2,
        "the first round's late arrival counted in the second"
    );
    late.shutdown().await;
}

/// A latch armed before rounds (a hash with `count` and arrivals only, as an older relock leaves
/// it) still counts down and opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_armed_without_a_round_still_counts_down() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let latch = client.latch(&unique_name("older"));
    let key = latch_key(latch.name());
    server.cmd(&["HSET", &key, "count", "3", "a:earlier", "1"]);
    assert_eq!(latch.count().await.unwrap(), 2);
    assert!(!latch.set_count(5).await.unwrap(), "still counting");
    assert_eq!(latch.count_down().await.unwrap(), 1);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert!(!server.exists(&key), "opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_typed_error_that_writes_nothing() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let latch = client.latch(&unique_name("bad"));
    assert!(matches!(latch.set_count(0).await, Err(Error::InvalidConfig(_))));
    assert!(!server.exists(&latch_key(latch.name())));
    let bad = client.latch("no{braces}");
    assert!(matches!(bad.set_count(1).await, Err(Error::InvalidName(_))));
    assert!(matches!(bad.count_down().await, Err(Error::InvalidName(_))));
    assert!(matches!(
        bad.wait_for(Duration::from_millis(10)).await,
        Err(Error::InvalidName(_))
    ));
    assert!(server.keys("*").is_empty(), "{:?}", server.keys("*"));
    // A key of another type at the latch's name is left alone.
    let admin = support::fred_client(&server.url()).await;
    let key = latch_key(latch.name());
    let _: () = admin.set(&key, "mine", None, None, false).await.unwrap();
    assert!(matches!(latch.set_count(1).await, Err(Error::WrongType(_))));
    assert!(matches!(latch.count_down().await, Err(Error::WrongType(_))));
    assert!(matches!(latch.count().await, Err(Error::WrongType(_))));
    let kept: String = admin.get(&key).await.unwrap();
    assert_eq!(kept, "mine");
}

/// One step of the model run: which client, and what it does.
#[derive(Debug, Clone)]
enum Step {
    Set(usize, u64),
    CountDown(usize),
    Count(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize, 1..4u64).prop_map(|(c, n)| Step::Set(c, n)),
        (0..3usize).prop_map(Step::CountDown),
        (0..3usize).prop_map(Step::CountDown),
        (0..3usize).prop_map(Step::Count),
    ]
}

#[test]
fn the_latch_follows_its_model_under_random_operations() {
    let rt = support::runtime();
    let server = RedisServer::start();
    let clients: Vec<LockClient> = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(client(&server).await);
        }
        clients
    });
    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let cases = std::sync::atomic::AtomicU64::new(0);
    proptest!(config, |(steps in proptest::collection::vec(step(), 1..40))| {
        let name = format!("model-{}-{}", std::process::id(), cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let latches: Vec<Arc<CountDownLatch>> = clients.iter().map(|c| Arc::new(c.latch(&name))).collect();
        // The model: the count left (0 = open).
        let mut left: u64 = 0;
        rt.block_on(async {
            for step in &steps {
                match *step {
                    Step::Set(c, n) => {
                        let set = latches[c].set_count(n).await.expect("set");
                        prop_assert_eq!(set, left == 0, "{:?} with {} left", step, left);
                        if set {
                            left = n;
                        }
                    }
                    Step::CountDown(c) => {
                        left = left.saturating_sub(1);
                        prop_assert_eq!(latches[c].count_down().await.expect("count down"), left);
                    }
                    Step::Count(c) => prop_assert_eq!(latches[c].count().await.expect("count"), left),
                }
                prop_assert_eq!(server.exists(&latch_key(&name)), left > 0, "key while {} left", left);
            }
            Ok(())
        })?;
    });
}
