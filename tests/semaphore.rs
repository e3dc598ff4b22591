//! `Semaphore` against a real redis-server: never more than N permits held, several permits at
//! once, waiters woken by a release (not by their timers), leases kept by the watchdog, a cut-off
//! holder's permits coming back within its lease (Redisson's `RPermitExpirableSemaphore` expiry
//! scenarios, with the watchdog), callers disagreeing on N, and bad input.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{Error, LockClient, LockConfig};
use support::proxy::Proxy;
use support::ServerExt;
use support::{unique_name, RedisServer};
use tokio::time::Instant;

async fn client(url: &str, config: LockConfig) -> LockClient {
    LockClient::connect_with(url, config).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_n_permits_are_held() {
    let server = RedisServer::start();
    let name = unique_name("api");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client(&server.url(), support::fast_config()).await;
        for _ in 0..4 {
            let semaphore = client.semaphore(&name, 3);
            let (inside, most) = (inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let permit = semaphore.acquire(1).await.expect("acquire");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.expect("release");
                }
            }));
        }
    }
    let all = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks)).await;
    assert!(all.is_ok(), "stuck");
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} permits held at once");
    assert!(most >= 2, "the permits were never shared ({most} at most)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_permits_at_once_and_available() {
    let server = RedisServer::start();
    let c = client(&server.url(), support::fast_config()).await;
    let semaphore = c.semaphore(&unique_name("pool"), 5);
    assert_eq!(semaphore.available().await.unwrap(), 5);
    let three = semaphore.acquire(3).await.unwrap();
    assert_eq!(three.permits(), 3);
    assert_eq!(semaphore.available().await.unwrap(), 2);
    assert!(semaphore.try_acquire(3).await.unwrap().is_none());
    let two = semaphore.try_acquire(2).await.unwrap().expect("two left");
    assert_eq!(semaphore.available().await.unwrap(), 0);
    assert!(semaphore
        .try_acquire_for(1, Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    three.release().await.unwrap();
    assert_eq!(semaphore.available().await.unwrap(), 3);
    drop(two); // given back in the background
    let deadline = Instant::now() + Duration::from_secs(3);
    while semaphore.available().await.unwrap() != 5 {
        assert!(Instant::now() < deadline, "a dropped permit was not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_every_waiter_it_can_serve() {
    let server = RedisServer::start();
    // A 30 s lease: a waiter woken by its timer (the holder's lease) would wait that long.
    let config = LockConfig::default();
    let holder = client(&server.url(), config.clone()).await;
    let name = unique_name("wake");
    let both = holder.semaphore(&name, 2).acquire(2).await.unwrap();
    // Both waiters on one client: one release message must wake both.
    let c = client(&server.url(), config.clone()).await;
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let semaphore = c.semaphore(&name, 2);
        waiters.push(tokio::spawn(async move {
            let permit = semaphore.acquire(1).await.expect("acquire");
            (Instant::now(), permit)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "granted while every permit was held"
    );
    let released = Instant::now();
    both.release().await.unwrap();
    for waiter in waiters {
        let (at, permit) = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert!(at.duration_since(released) < Duration::from_secs(3), "woken late");
        assert!(permit.is_held());
    }
}

/// A waiter short of permits makes no attempt until a release or a lease's end: it does not wake
/// itself (3 permits, 2 held, 2 asked: thousands of script calls a second before), and two such
/// waiters of one client do not wake each other after a release that frees too few.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_short_of_permits_do_not_spin() {
    let server = RedisServer::start();
    // 30 s leases: no waiter's timer runs out during the test.
    let holder = client(&server.url(), LockConfig::default()).await;
    let name = unique_name("short");
    let semaphore = holder.semaphore(&name, 3);
    let mut held = vec![
        semaphore.acquire(1).await.unwrap(),
        semaphore.acquire(1).await.unwrap(),
    ];
    let c = client(&server.url(), LockConfig::default()).await;

    // One waiter, one permit free, two asked.
    let calls = server.script_calls();
    let got = c
        .semaphore(&name, 3)
        .try_acquire_for(2, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(got.is_none(), "granted 2 of 1 free");
    let made = server.script_calls() - calls;
    assert!(
        made <= 6,
        "a one-second wait short of permits made {made} script calls"
    );

    // Two waiters of one client, each asking for 2, with 1 free; then a release frees a second
    // permit... for only one of them.
    held.push(semaphore.acquire(1).await.unwrap());
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let semaphore = c.semaphore(&name, 3);
        waiters.push(tokio::spawn(async move {
            semaphore.acquire(2).await.expect("acquire")
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = server.script_calls();
    held.pop().unwrap().release().await.unwrap(); // 1 free: too few for either
    tokio::time::sleep(Duration::from_secs(1)).await;
    let made = server.script_calls() - calls;
    assert!(
        made <= 8,
        "a release that freed too few made two waiters run {made} script calls in a second"
    );
    assert!(waiters.iter().all(|w| !w.is_finished()), "granted 2 of 1 free");
    // A second permit back: one waiter is served at once, by the release's message.
    let released = Instant::now();
    held.pop().unwrap().release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(i) = waiters.iter().position(|w| w.is_finished()) {
                return waiters.remove(i).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a waiter was served by the release");
    assert!(released.elapsed() < Duration::from_secs(3));
    assert_eq!(first.permits(), 2);
    assert!(first.is_held());
    drop(held);
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), waiters.pop().unwrap())
        .await
        .expect("the other waiter was served once its permits were back")
        .unwrap();
    assert!(second.is_held());
}

/// A release that wakes a waiter who cannot use what it freed reaches a waiter of the same client
/// who can, at once (not at the end of a holder's lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_short_of_permits_passes_a_release_on() {
    let server = RedisServer::start();
    let holder = client(&server.url(), LockConfig::default()).await;
    let name = unique_name("relay");
    let semaphore = holder.semaphore(&name, 2);
    let (one, two) = (
        semaphore.acquire(1).await.unwrap(),
        semaphore.acquire(1).await.unwrap(),
    );
    let c = client(&server.url(), LockConfig::default()).await;
    // Whichever of the two the message wakes first, the one asking for 1 must get it.
    let big = {
        let semaphore = c.semaphore(&name, 2);
        tokio::spawn(async move { semaphore.acquire(2).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let small = {
        let semaphore = c.semaphore(&name, 2);
        tokio::spawn(async move { semaphore.acquire(1).await.map(|p| (Instant::now(), p)) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    one.release().await.unwrap();
    let (at, permit) = tokio::time::timeout(Duration::from_secs(10), small)
        .await
        .expect("the small waiter was served")
        .unwrap()
        .unwrap();
    assert!(
        at.duration_since(released) < Duration::from_secs(3),
        "served {:?} after the release",
        at.duration_since(released)
    );
    assert!(permit.is_held());
    assert!(!big.is_finished());
    big.abort();
    drop(two);
}

/// A waiter that a release woke, but whose bound ends before its attempt is answered (here the
/// attempt is held up on its way), passes the wake-up on: the next waiter of its client gets the
/// permit at once, not at the end of the holder's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_that_runs_out_of_time_passes_the_release_on() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let holder = client(&server.url(), LockConfig::default()).await;
    let name = unique_name("ran-out");
    let permit = holder.semaphore(&name, 1).acquire(1).await.unwrap();
    let c = client(&proxy.url(), LockConfig::default()).await;
    let first = {
        let semaphore = c.semaphore(&name, 1);
        tokio::spawn(async move { semaphore.try_acquire_for(1, Duration::from_millis(1500)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = {
        let semaphore = c.semaphore(&name, 1);
        tokio::spawn(async move {
            let permit = semaphore.try_acquire_for(1, Duration::from_secs(10)).await;
            (Instant::now(), permit)
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The first waiter, woken first, sends an attempt that reaches Redis after its bound.
    proxy.delay_request_once(name.as_bytes(), Duration::from_millis(1000));
    let released = Instant::now();
    permit.release().await.unwrap();
    assert!(
        first.await.unwrap().unwrap().is_none(),
        "the first waiter ran out of time"
    );
    let (at, permit) = tokio::time::timeout(Duration::from_secs(12), second)
        .await
        .unwrap()
        .unwrap();
    let permit = permit.unwrap().expect("the second waiter was served");
    let after = at.duration_since(released);
    assert!(
        after < Duration::from_secs(4),
        "served {after:?} after the release"
    );
    permit.release().await.unwrap();
    holder.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_permit_and_a_cut_off_holder_gives_it_back_within_its_lease() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let name = unique_name("lease");
    let holder = client(&proxy.url(), support::fast_config()).await;
    let other = client(&server.url(), support::fast_config()).await;
    let permit = holder.semaphore(&name, 1).acquire(1).await.unwrap();
    // Held across several leases by the watchdog.
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert!(permit.is_held());
    assert!(other.semaphore(&name, 1).try_acquire(1).await.unwrap().is_none());
    // Cut off: no renewal lands; the lease runs out in Redis, and the holder is told.
    proxy.partition();
    let cut = Instant::now();
    let taken = other
        .semaphore(&name, 1)
        .try_acquire_for(1, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the permit came back");
    let back = cut.elapsed();
    assert!(
        back < Duration::from_millis(1500 + 2500),
        "came back after {back:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), permit.lost())
        .await
        .expect("the holder was told");
    assert!(!permit.is_held());
    assert!(taken.is_held());
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_disagree_on_the_permits_and_bad_input() {
    let server = RedisServer::start();
    let c = client(&server.url(), support::fast_config()).await;
    let name = unique_name("n");
    let held = c.semaphore(&name, 3).acquire(1).await.unwrap();
    // Another number while permits are held: refused, nothing changed.
    assert!(matches!(
        c.semaphore(&name, 5).try_acquire(1).await,
        Err(Error::InvalidConfig(_))
    ));
    assert_eq!(c.semaphore(&name, 3).available().await.unwrap(), 2);
    held.release().await.unwrap();
    // Nothing held: the next number is the one in force.
    let five = c.semaphore(&name, 5).acquire(5).await.unwrap();
    assert!(c.semaphore(&name, 3).try_acquire(1).await.is_err());
    // Released here, not dropped: a dropped permit's release is a background script call, which
    // could land inside the count of script calls below (it did once, in CI).
    five.release().await.unwrap();

    let fresh = unique_name("bad");
    assert!(matches!(
        c.semaphore(&fresh, 0).try_acquire(1).await,
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        c.semaphore(&fresh, 2).try_acquire(0).await,
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        c.semaphore(&fresh, 2).try_acquire(3).await,
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        c.semaphore("a{b}", 2).acquire(1).await,
        Err(Error::InvalidName(_))
    ));
    assert!(server.keys(&format!("*{fresh}*")).is_empty());
    assert!(server.keys("*a{b}*").is_empty());

    // A semaphore key of another type: an error in one call that wrote nothing, and nothing to
    // undo after it.
    let foreign = unique_name("foreign");
    let index = format!("relock:{{{foreign}}}:sem");
    server.cmd(&["SET", &index, "not a semaphore"]);
    let calls = server.script_calls();
    assert!(matches!(
        c.semaphore(&foreign, 2).try_acquire(1).await,
        Err(Error::WrongType(_))
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.script_calls() - calls, 1);
    assert_eq!(server.keys(&format!("*{foreign}*")), vec![index.clone()]);
    assert_eq!(server.cmd(&["GET", &index]).as_str(), Some("not a semaphore"));
}

/// One step of the model run.
#[derive(Debug, Clone)]
enum Step {
    /// An actor (of three clients) tries for `n` permits, without waiting.
    Try(usize, u64),
    /// An actor gives back its permits taken `k`-th from last (if it holds any).
    Release(usize, usize),
    /// Anyone reads how many are free.
    Available(usize),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        (0..3usize, 1..=3u64).prop_map(|(a, n)| Step::Try(a, n)),
        (0..3usize, 0..3usize).prop_map(|(a, k)| Step::Release(a, k)),
        (0..3usize).prop_map(Step::Available),
    ]
}

/// The rules against a model, over random steps of three clients on a semaphore of 4: `n` permits
/// are granted iff `n` are free, `available` is 4 minus what is held, and a release frees what it
/// held.
#[test]
fn the_semaphore_follows_its_model_under_random_steps() {
    use proptest::prelude::*;
    let rt = support::runtime();
    let server = RedisServer::start();
    let clients: Vec<LockClient> = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(client(&server.url(), support::fast_config()).await);
        }
        clients
    });
    let config = ProptestConfig {
        cases: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let cases = AtomicUsize::new(0);
    proptest!(config, |(steps in proptest::collection::vec(step(), 1..40))| {
        let name = format!("model-{}-{}", std::process::id(), cases.fetch_add(1, Ordering::Relaxed));
        let mut held: Vec<Vec<relock::Permit>> = vec![Vec::new(), Vec::new(), Vec::new()];
        rt.block_on(async {
            for step in &steps {
                let used: u64 = held.iter().flatten().map(relock::Permit::permits).sum();
                match *step {
                    Step::Try(actor, n) => {
                        let got = clients[actor].semaphore(&name, 4).try_acquire(n).await.expect("try");
                        prop_assert_eq!(got.is_some(), used + n <= 4, "{:?} with {} held", step, used);
                        held[actor].extend(got);
                    }
                    Step::Release(actor, k) => {
                        let mine = &mut held[actor];
                        if !mine.is_empty() {
                            let permit = mine.remove(mine.len() - 1 - k.min(mine.len() - 1));
                            permit.release().await.expect("release");
                        }
                    }
                    Step::Available(actor) => {
                        let free = clients[actor].semaphore(&name, 4).available().await.expect("available");
                        prop_assert_eq!(free, 4 - used, "{} held", used);
                    }
                }
            }
            for permit in held.iter_mut().flat_map(|h| h.drain(..)) {
                permit.release().await.expect("release");
            }
            Ok(())
        })?;
    });
}
