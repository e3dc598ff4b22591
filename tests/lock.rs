//! The core lock against a real redis-server: exclusion, reentrancy, watchdog, loss, fencing,
//! waiting, cancellation, release semantics and recovery.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{Error, LockClient, LockConfig, LockGuard, Owner};
use support::ServerExt;
use support::{eventually, lock_key, unique_name, RedisServer, Reply};
use tokio::time::Instant;

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect_with(&server.url(), support::fast_config())
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_gives_the_exact_total() {
    let server = RedisServer::start();
    let name = unique_name("counter");
    let counter = format!("count:{name}");
    let admin = support::fred_client(&server.url()).await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let client = client(&server).await;
        for _ in 0..4 {
            let lock = client.lock(&name);
            let admin = admin.clone();
            let counter = counter.clone();
            tasks.push(tokio::spawn(async move {
                support::guarded_increments(&lock, &admin, &counter, 100).await
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(server.cmd(&["GET", &counter]).as_str(), Some("6400"));
}

fn nested(
    lock: relock::Lock,
    depth: u32,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<LockGuard>> + Send>> {
    Box::pin(async move {
        let guard = lock.acquire().await.unwrap();
        assert_eq!(guard.hold_count(), 11 - depth);
        let mut guards = if depth > 1 {
            nested(lock, depth - 1).await
        } else {
            Vec::new()
        };
        guards.push(guard);
        guards
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_ten_deep_in_async_fns() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("nested");
    let lock = client.lock(&name);
    let guards = nested(lock.clone(), 10).await;
    // The first read (of the innermost guard) draws the hold's token; every other guard of the hold
    // reads the same one, and draws none of its own.
    let token = guards[0].fencing_token().await.unwrap();
    for guard in &guards {
        assert_eq!(
            guard.fencing_token().await.unwrap(),
            token,
            "reentrant acquisitions share the token"
        );
    }
    let fence = format!("{}:fence", lock_key(&name));
    assert_eq!(
        server.cmd(&["GET", &fence]).as_str(),
        Some(token.to_string().as_str()),
        "one draw for the whole hold"
    );
    let hash = server.cmd(&["HVALS", &lock_key(&name)]);
    assert_eq!(
        format!("{hash:?}"),
        format!(
            "{:?}",
            support::Reply::Array(vec![support::Reply::Str("10".into())])
        )
    );

    // Another task (another owner) is excluded meanwhile.
    let other = client.lock(&name);
    let refused = tokio::spawn(async move { other.try_acquire().await.unwrap().is_none() })
        .await
        .unwrap();
    assert!(refused);

    // Each release takes one level; the key goes only at zero.
    let mut guards = guards;
    while guards.len() > 1 {
        guards.remove(0).release().await.unwrap();
        assert!(server.exists(&lock_key(&name)));
    }
    guards.remove(0).release().await.unwrap();
    assert!(!server.exists(&lock_key(&name)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_the_lock_for_three_leases() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("watchdog");
    let guard = client.lock(&name).acquire().await.unwrap();
    let other = LockClient::connect_with(&server.url(), support::fast_config())
        .await
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(4500) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(guard.is_held(), "lost after {:?}", start.elapsed());
        assert!(other.lock(&name).try_acquire().await.unwrap().is_none());
    }
    let pttl = server.cmd(&["PTTL", &lock_key(&name)]).as_int().unwrap();
    assert!(pttl > 0, "lease still set: {pttl}");
    guard.release().await.unwrap();
    assert!(other.lock(&name).try_acquire().await.unwrap().is_some());
}

/// The watchdog copies a hold's key and field from its last round's bytes: a hold lost and taken
/// again by the same owner before the next round (a new generation, a new field) is renewed with
/// its new field, not the copy of the old one (which Redis no longer has: that would end it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_taken_again_between_two_rounds_is_renewed_with_its_new_field() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("regained");
    let key = lock_key(&name);
    let lock = client.lock(&name);
    let first = lock.acquire().await.unwrap();
    // A few rounds, so that the watchdog's last one copied this hold.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(first.is_held());
    let old_field = server.hold_field(&key);
    server.cmd(&["DEL", &key]);
    tokio::time::timeout(Duration::from_secs(3), first.lost())
        .await
        .expect("lost() did not fire");
    // The same owner (this task) at once: the same hold, its next generation.
    let second = lock.acquire().await.unwrap();
    assert_ne!(
        server.hold_field(&key),
        old_field,
        "a new generation has a new field"
    );
    // Five renew intervals and more: past the watchdog timeout only by its renewals.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(second.is_held(), "lost after {:?}", start.elapsed());
    }
    let pttl = server.cmd(&["PTTL", &key]).as_int().unwrap();
    assert!(pttl > 0, "lease still set: {pttl}");
    drop(first);
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_key_is_deleted_behind_its_back() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("deleted");
    let guard = client.lock(&name).acquire().await.unwrap();
    assert!(guard.is_held());
    server.cmd(&["DEL", &lock_key(&name)]);
    let deleted = Instant::now();
    // One renew interval is 300 ms; allow generous slack for a loaded machine.
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() did not fire");
    assert!(deleted.elapsed() < Duration::from_secs(3));
    assert!(!guard.is_held());
    assert!(matches!(
        guard.until_lost(async { 1 }).await,
        Err(Error::LeaseLost)
    ));
    // Known lost: answered at once, saying so, without a round trip.
    let start = Instant::now();
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::Lost { ago: Some(_) }), "{err:?}");
    assert!(
        err.to_string().contains("lost") && err.to_string().contains("s ago"),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_millis(50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_lost_stops_work_when_the_lease_is_lost() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("until-lost");
    let guard = client.lock(&name).acquire().await.unwrap();
    let key = lock_key(&name);
    let admin = support::fred_client(&server.url()).await;
    tokio::spawn(async move {
        use fred::interfaces::KeysInterface;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _: i64 = admin.del(&key).await.unwrap();
    });
    let finished = Arc::new(AtomicUsize::new(0));
    let f = finished.clone();
    let result = guard
        .until_lost(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            f.fetch_add(1, Ordering::SeqCst);
        })
        .await;
    assert!(matches!(result, Err(Error::LeaseLost)));
    assert_eq!(finished.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_expires_and_a_stale_release_changes_nothing() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let name = unique_name("fixed");
    let guard = a
        .lock(&name)
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    assert!(guard.validity() <= Duration::from_millis(300));
    // Read while held: a plain lock's token is drawn on its first read, which a lost hold no
    // longer gets.
    let stale_token = guard.fencing_token().await.unwrap();
    // Not renewed: it runs out, and the guard says so.
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("fixed lease never ran out");
    assert!(!guard.is_held());
    assert!(matches!(guard.fencing_token().await, Err(Error::LeaseLost)));
    let taken = b.lock(&name).acquire().await.unwrap();
    assert!(taken.fencing_token().await.unwrap() > stale_token);
    // The stale holder's release says its lease was lost, and leaves the new holder alone.
    assert!(matches!(guard.release().await, Err(Error::Lost { .. })));
    assert!(taken.is_held());
    assert!(server.exists(&lock_key(&name)));
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_release_is_not_held() {
    let server = RedisServer::start();
    // The default renewal interval (10 s): no watchdog round finds the hold gone before the
    // release does (it would end the guard as lost, and the release would say so instead).
    let a = LockClient::connect(&server.url()).await.expect("connect");
    let name = unique_name("foreign");
    let guard = a.lock(&name).acquire().await.unwrap();
    // Force-unlocked by an admin, then taken by someone else.
    assert!(a.lock(&name).force_unlock().await.unwrap());
    let b = client(&server).await;
    let other = b.lock(&name).acquire().await.unwrap();
    assert!(matches!(guard.release().await, Err(Error::NotHeld)));
    assert!(other.is_held());
    assert!(b.lock(&name).is_locked().await.unwrap());
    other.release().await.unwrap();
    assert!(!b.lock(&name).is_locked().await.unwrap());
    assert!(!b.lock(&name).force_unlock().await.unwrap());
}

/// A counter ahead of the server's clock (drawn by a server whose clock ran ahead, say) still
/// bounds the next token from below: the clock is not the token when it is behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_counter_ahead_of_the_clock_is_exceeded() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("ahead");
    let ahead: u64 = 9_000_000_000_000_000; // the year 2255 in microseconds
    let fence = format!("{}:fence", lock_key(&name));
    server.cmd(&["SET", &fence, &ahead.to_string()]);
    for i in 1..=3 {
        let guard = client.lock(&name).acquire().await.unwrap();
        // Acquiring a plain lock draws nothing: the counter moves only on the holder's first read.
        assert_eq!(
            server.cmd(&["GET", &fence]).as_str(),
            Some((ahead + i - 1).to_string().as_str())
        );
        assert_eq!(guard.fencing_token().await.unwrap(), ahead + i);
        assert_eq!(
            server.cmd(&["GET", &fence]).as_str(),
            Some((ahead + i).to_string().as_str())
        );
        guard.release().await.unwrap();
    }
}

/// With the counter missing or behind, a new hold's token is the server's clock in microseconds,
/// read between the `TIME` after the acquisition and the one after the token's first read (a plain
/// lock draws its token then, not when it is acquired): seconds and
/// microseconds joined, with the microseconds padded to six digits. Draws go on until one fell in
/// the first tenth of a second, where a missing pad would lose digits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_is_the_server_clock_in_microseconds() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("clock");
    let fence = format!("{}:fence", lock_key(&name));
    let micros = || {
        let Reply::Array(time) = server.cmd(&["TIME"]) else {
            panic!("TIME is no array")
        };
        let [seconds, micros] = [&time[0], &time[1]].map(|part| part.as_int().unwrap() as u64);
        seconds * 1_000_000 + micros
    };
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut draws = 0;
    loop {
        // Half the time the counter is gone (a restart without persistence), else it is behind.
        if draws % 2 == 0 {
            server.cmd(&["DEL", &fence]);
        }
        let guard = client.lock(&name).acquire().await.unwrap();
        let before = micros();
        let token = guard.fencing_token().await.unwrap();
        let after = micros();
        assert!(
            before <= token && token <= after,
            "{before} <= {token} <= {after}"
        );
        guard.release().await.unwrap();
        draws += 1;
        if draws >= 20 && token % 1_000_000 < 100_000 && before / 1_000_000 == token / 1_000_000 {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "no draw in the first tenth of a second in {draws}"
        );
    }
}

/// The acquisitions of one batch call share one reading of the server's clock (`TIME` costs about
/// as much as a small command): one lock taken, released and taken again by other owners in one
/// call, as a batch may carry it, still draws rising tokens, and the call reads the clock once.
/// The batch function of relock's library as relock composes it, with the arguments relock sends:
/// one clock reading per call, shared by the call's acquisitions, and read anew by the next call
/// (the library's state outlives a call).
///
/// The acquisitions that draw at grant are a read-write lock's write side (and a fair lock's): a
/// plain lock's acquisition draws no token (its holder draws one when it reads it), so the plain
/// lock taken and released in the same call answers token 0, leaves its fence unwritten and reads
/// no clock of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_in_one_batch_share_the_clock_and_still_draw_rising_tokens() {
    use fred::interfaces::FunctionInterface;
    let server = RedisServer::start();
    let admin = support::fred_client(&server.url()).await;
    let function = support::load_batch_function(&server);
    let name = unique_name("one-call");
    // A read-write lock's keys (see `RwKeys` in src/keys.rs).
    let write = format!("relock:{{{name}}}:rw");
    let [fence, readers, waiting, channel] =
        ["fence", "readers", "writers", "released"].map(|part| format!("{write}:{part}"));
    // A plain lock of another name, taken and released in the same call.
    let plain = lock_key(&unique_name("one-call-plain"));
    let plain_fence = format!("{plain}:fence");
    let plain_channel = format!("{plain}:released");
    let (mut keys, mut args) = (Vec::new(), vec!["8".to_string(), "PUBLISH".to_string()]);
    for owner in ["a:1", "b:1", "c:1"] {
        keys.extend([write.clone(), fence.clone(), readers.clone(), waiting.clone()]);
        args.extend(["w", owner, "30000", "1"].map(String::from));
        keys.extend([write.clone(), waiting.clone()]);
        args.extend(["o", owner, "0", &channel].map(String::from));
    }
    keys.extend([plain.clone(), plain_fence.clone(), plain.clone()]);
    args.extend(["a", "d:1", "30000", "1"].map(String::from));
    args.extend(["r", "d:1", "0", &plain_channel].map(String::from));
    let ops = ["w", "o", "w", "o", "w", "o", "a", "r"];
    let time_before = server.command_calls("time");
    let reply: Vec<i64> = admin
        .fcall(function.as_str(), keys.clone(), args.clone())
        .await
        .expect("fcall");
    assert_eq!(server.command_calls("time") - time_before, 1, "one clock reading");
    // Per operation: its item count, then its items. A write acquisition's are {1, previous,
    // token}; a plain one's with no previous count in short, {token}; a release's start with its
    // code (2: released).
    let tokens = |reply: &[i64]| {
        let (mut at, mut writes, mut plains) = (0, Vec::new(), Vec::new());
        for op in ops {
            let items = &reply[at + 1..at + 1 + reply[at] as usize];
            match op {
                "w" => {
                    assert_eq!(items.len(), 3, "{reply:?}");
                    assert_eq!(items[..2], [1, 0], "granted: {reply:?}");
                    writes.push(items[2]);
                }
                "a" => {
                    assert_eq!(items.len(), 1, "a fresh grant in short: {reply:?}");
                    plains.push(items[0]);
                }
                _ => assert_eq!(items[0], 2, "released: {reply:?}"),
            }
            at += 1 + items.len();
        }
        assert_eq!(at, reply.len(), "{reply:?}");
        (writes, plains)
    };
    let (first, plains) = tokens(&reply);
    assert_eq!(first.len(), 3, "{reply:?}");
    assert!(first.windows(2).all(|w| w[0] < w[1]), "{first:?}");
    assert!(first[0] > 0, "{first:?}");
    assert_eq!(
        plains,
        [0],
        "a plain lock's acquisition draws no token: {reply:?}"
    );
    assert!(!server.exists(&write));
    assert!(!server.exists(&plain));
    assert!(
        !server.exists(&plain_fence),
        "a plain lock's fence is written only by a draw"
    );

    // 50 ms later, the next call's tokens follow the clock (in µs), not the first call's reading.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reply: Vec<i64> = admin.fcall(function.as_str(), keys, args).await.expect("fcall");
    let (second, _) = tokens(&reply);
    assert!(
        second[0] >= first[2] + 40_000,
        "the second call reused the first one's clock: {first:?} then {second:?}"
    );

    // Plain acquisitions and releases alone read no clock at all.
    let keys = vec![plain.clone(), plain_fence.clone(), plain.clone()];
    let mut args = vec!["2".to_string(), "PUBLISH".to_string()];
    args.extend(["a", "e:1", "30000", "1"].map(String::from));
    args.extend(["r", "e:1", "0", &plain_channel].map(String::from));
    let time_before = server.command_calls("time");
    let reply: Vec<i64> = admin.fcall(function.as_str(), keys, args).await.expect("fcall");
    assert_eq!(reply, [1, 0, 2, 2, 0], "granted with no token, then released");
    assert_eq!(server.command_calls("time"), time_before, "no clock reading");
    assert!(!server.exists(&plain_fence));
}

/// A lone fresh acquisition in short (`A`, owner, lease: what relock sends for an acquisition with
/// nothing else in flight) answers a grant with its token alone, not in a list; a refusal with
/// `{2, 0, ttl}` and the hold untouched; the same field found again (a resend) with
/// `{3, 1, previous count, token}`. A plain lock's acquisition draws no token (its holder draws
/// one on its first read, see `a_plain_lock_draws_no_token_until_read`): the token is 0 in both
/// grants, and the fence is left unwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_fresh_acquisition_in_short_answers_its_token_alone() {
    use fred::interfaces::{FunctionInterface, HashesInterface, KeysInterface};
    use fred::types::Value;
    let server = RedisServer::start();
    let admin = support::fred_client(&server.url()).await;
    let function = support::load_batch_function(&server);
    let lock = lock_key(&unique_name("short"));
    let fence = format!("{lock}:fence");
    let keys = vec![lock.clone(), fence.clone()];
    let acquire = |owner: &str| vec!["A".to_string(), owner.to_string(), "30000".to_string()];

    let granted: Value = admin
        .fcall(function.as_str(), keys.clone(), acquire("a:1"))
        .await
        .expect("fcall");
    let token = match &granted {
        Value::Array(items) => panic!("a grant in a list: {items:?}"),
        token => token.as_i64().expect("a token"),
    };
    assert_eq!(token, 0, "a plain lock's acquisition draws no token");
    let fenced: Option<i64> = admin.get(&fence).await.expect("GET");
    assert_eq!(fenced, None, "the fence is not written");

    let refused: Vec<i64> = admin
        .fcall(function.as_str(), keys.clone(), acquire("b:1"))
        .await
        .expect("fcall");
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert_eq!(refused[..2], [2, 0], "{refused:?}");
    assert!(
        (1..=30_000).contains(&refused[2]),
        "the holder's ttl: {refused:?}"
    );
    let holder: Option<String> = admin.hget(&lock, "a:1").await.expect("HGET");
    assert_eq!(holder.as_deref(), Some("1"), "the holder's count is untouched");

    let again: Vec<i64> = admin
        .fcall(function.as_str(), keys, acquire("a:1"))
        .await
        .expect("fcall");
    assert_eq!(again, [3, 1, 1, 0], "no draw on a resend either");
    let fenced: Option<i64> = admin.get(&fence).await.expect("GET");
    assert_eq!(fenced, None, "the fence is not written");
}

/// A batch in runs (`A+`: what relock sends for a batch of fresh acquisitions and full releases
/// only) runs its acquisitions, then its releases, and answers each as one by one would: a grant
/// with its token alone (0: a plain lock's acquisition draws none, and leaves the fence unwritten),
/// a refusal with the holder's ttl (and the holder marked), a key of another
/// type with that operation's error (the others run), a resend with the previous count; a release
/// with its code, and how many heard it where one was due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_runs_answers_each_operation_as_one_by_one() {
    use fred::interfaces::{FunctionInterface, HashesInterface, KeysInterface};
    use fred::types::Value;
    let server = RedisServer::start();
    let admin = support::fred_client(&server.url()).await;
    let function = support::load_batch_function(&server);
    let name = unique_name("runs");
    let [free, held, wrong, mine, unheld] =
        ["free", "held", "wrong", "mine", "unheld"].map(|lock| lock_key(&format!("{name}-{lock}")));
    let fence = |lock: &str| format!("{lock}:fence");
    let _: () = admin.hset(&held, ("other:1", 1)).await.expect("HSET");
    let _: () = admin.pexpire(&held, 30_000, None).await.expect("PEXPIRE");
    let _: () = admin.set(&wrong, "text", None, None, false).await.expect("SET");
    let _: () = admin.hset(&mine, ("me:1", 1)).await.expect("HSET");
    let _: () = admin.pexpire(&mine, 30_000, None).await.expect("PEXPIRE");

    let mut keys = Vec::new();
    for lock in [&free, &held, &wrong, &mine] {
        keys.extend([lock.clone(), fence(lock)]);
    }
    keys.extend([held.clone(), unheld.clone(), mine.clone()]);
    let args = [
        "A+", "PUBLISH", "30000", "4", "me:1", "me:1", "me:1", "me:1", "other:1", "me:1", "me:1",
    ];
    let reply: Vec<Value> = admin
        .fcall(function.as_str(), keys, args.to_vec())
        .await
        .expect("fcall");
    let int = |at: usize| {
        reply[at]
            .as_i64()
            .unwrap_or_else(|| panic!("item {at} of {reply:?}"))
    };

    // The free lock: its token alone, none drawn.
    assert_eq!([int(0), int(1)], [1, 0], "{reply:?}");
    let fenced: Option<i64> = admin.get(fence(&free)).await.expect("GET");
    assert_eq!(fenced, None, "{reply:?}");
    // Another owner's hold: refused with its ttl, and marked for the waiter.
    assert_eq!([int(2), int(3)], [2, 0], "{reply:?}");
    assert!((1..=30_000).contains(&int(4)), "{reply:?}");
    // A key of another type: this operation's error.
    assert_eq!([int(5), int(6)], [2, -1], "{reply:?}");
    let message = reply[7].as_string().unwrap_or_default();
    assert!(message.contains("WRONGTYPE"), "{reply:?}");
    // Its own hold found again: the previous count, and no token drawn.
    assert_eq!([int(8), int(9), int(10), int(11)], [3, 1, 1, 0], "{reply:?}");
    // The releases, after: the marked hold's announced (nobody subscribed), then one not held,
    // then the hold just acquired again.
    assert_eq!(
        (12..reply.len()).map(int).collect::<Vec<_>>(),
        [2, 2, 0, 1, 0, 2, 2, 0],
        "{reply:?}"
    );
    for lock in [&held, &mine] {
        let left: i64 = admin.exists(lock).await.expect("EXISTS");
        assert_eq!(left, 0, "{lock}: the hold and its mark are gone");
    }
    let holder: Option<String> = admin.hget(&free, "me:1").await.expect("HGET");
    assert_eq!(holder.as_deref(), Some("1"));
    let text: String = admin.get(&wrong).await.expect("GET");
    assert_eq!(text, "text", "the key of another type is untouched");
}

/// The copy of relock's function library that tests and the bench load (`support::batch_library`)
/// is the library relock loads: a fresh server has none, and after an acquisition and a release
/// through relock it has exactly that one (name and code), and its function ran. With
/// `redis_functions(false)` nothing is loaded and the scripts run by `EVALSHA`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_support_copy_of_the_function_library_is_the_one_relock_loads() {
    let server = RedisServer::start();
    assert!(support::function_libraries(&server).is_empty(), "a fresh server");
    let client = LockClient::connect(&server.url()).await.expect("connect");
    let name = unique_name("copy");
    let guard = client.lock(&name).acquire().await.expect("acquire");
    guard.release().await.expect("release");
    let (library, _, code) = support::batch_library();
    assert_eq!(support::function_libraries(&server), vec![library.clone()]);
    assert_eq!(
        support::function_library_code(&server, &library),
        Some(code),
        "relock loaded other code than the copy"
    );
    // The connect check, then the acquisition and the release.
    assert!(server.command_calls("fcall") >= 3, "the function never ran");
    client.shutdown().await;

    let server = RedisServer::start();
    let config = LockConfig::default().redis_functions(false);
    let client = LockClient::connect_with(&server.url(), config)
        .await
        .expect("connect");
    let guard = client.lock(&name).acquire().await.expect("acquire");
    guard.release().await.expect("release");
    assert!(support::function_libraries(&server).is_empty());
    assert_eq!(server.command_calls("fcall"), 0);
    assert!(server.command_calls("evalsha") >= 2);
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_holders_and_a_wiped_server() {
    let mut server = RedisServer::start();
    let name = unique_name("fence");
    let mut last = 0;
    {
        let a = client(&server).await;
        let b = client(&server).await;
        for i in 0..20 {
            let client = if i % 2 == 0 { &a } else { &b };
            let guard = client.lock(&name).acquire().await.unwrap();
            let token = guard.fencing_token().await.unwrap();
            assert!(token > last, "{token} after {last}");
            last = token;
            // Force-unlock must not reset the counter either.
            if i == 10 {
                client.lock(&name).force_unlock().await.unwrap();
            } else {
                guard.release().await.unwrap();
            }
        }
        a.shutdown().await;
        b.shutdown().await;
    }
    // A restart without persistence wipes the counter; the next token is still larger.
    server.restart();
    let c = client(&server).await;
    let guard = c.lock(&name).acquire().await.unwrap();
    let token = guard.fencing_token().await.unwrap();
    assert!(token > last, "{token} after restart, {last} before");
}

/// A plain lock's acquisition draws no fencing token: the fence counter is written only by the
/// holder's first read, which draws the token in Redis (the fence is then the token); later reads
/// of the same hold return it without drawing again. The next holder's first read draws a larger
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_draws_no_token_until_read() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let name = unique_name("lazy-token");
    let fence = format!("{}:fence", lock_key(&name));
    let fence_value = || server.cmd(&["GET", &fence]).as_int().map(|n| n as u64);

    let guard = a.lock(&name).acquire().await.unwrap();
    assert!(server.exists(&lock_key(&name)));
    assert!(!server.exists(&fence), "the acquisition wrote the fence");
    let token = guard.fencing_token().await.unwrap();
    assert!(token > 0);
    assert_eq!(fence_value(), Some(token), "the first read draws the token");
    let again = guard.fencing_token().await.unwrap();
    assert_eq!(again, token, "a second read returns the same token");
    assert_eq!(fence_value(), Some(token), "a second read draws nothing");
    assert!(guard.is_held());
    guard.release().await.unwrap();

    let next = b.lock(&name).acquire().await.unwrap();
    assert_eq!(fence_value(), Some(token), "the next acquisition drew nothing");
    let next_token = next.fencing_token().await.unwrap();
    assert!(next_token > token, "{next_token} after {token}");
    assert_eq!(fence_value(), Some(next_token));
    next.release().await.unwrap();
}

/// A hold whose lease is gone gets no token: neither one lost in Redis behind its back (found so
/// by the draw, which ends the hold as lost) nor one known lost already; nothing is drawn for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_hold_gets_no_token() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("lost-token");
    let key = lock_key(&name);
    let fence = format!("{key}:fence");

    // A long fixed lease (no watchdog to notice the loss first), its key deleted behind its back:
    // the draw finds the hold gone.
    let guard = client
        .lock(&name)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert!(guard.is_held());
    server.cmd(&["DEL", &key]);
    assert!(guard.is_held(), "nothing noticed the loss before the read");
    let read = guard.fencing_token().await;
    assert!(matches!(read, Err(Error::LeaseLost)), "{read:?}");
    assert!(!guard.is_held());
    assert!(!server.exists(&fence), "a token was drawn for a lost hold");
    tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("the read ended the hold as lost");
    // Asked again: answered at once from what the guard knows.
    assert!(matches!(guard.fencing_token().await, Err(Error::LeaseLost)));
    drop(guard);

    // A short fixed lease that runs out: the same.
    let guard = client
        .lock(&name)
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("fixed lease never ran out");
    let read = guard.fencing_token().await;
    assert!(matches!(read, Err(Error::LeaseLost)), "{read:?}");
    assert!(!guard.is_held());
    assert!(!server.exists(&fence), "a token was drawn for a lost hold");
}

/// A task acquiring `lock` (waiting as long as it takes): when it got it, and its guard.
fn wait_for(lock: relock::Lock) -> tokio::task::JoinHandle<(Instant, LockGuard)> {
    tokio::spawn(async move {
        let guard = lock.acquire().await.unwrap();
        (Instant::now(), guard)
    })
}

/// A waiter of `lock` that has had the time to be refused and to subscribe, then `held`'s release:
/// how long after the release the waiter got the lock, and its guard.
async fn handoff_to(lock: relock::Lock, held: LockGuard) -> (Duration, LockGuard) {
    let waiting = wait_for(lock);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (at, guard) = granted(waiting).await;
    (at - released, guard)
}

/// What [`wait_for`]'s task got, within 5 s (a waiter that sleeps through a release wakes only when
/// the 30 s lease runs out).
async fn granted(waiting: tokio::task::JoinHandle<(Instant, LockGuard)>) -> (Instant, LockGuard) {
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter slept through the release")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_handed_the_lock_promptly_despite_a_long_ttl() {
    let server = RedisServer::start();
    let config = LockConfig::default(); // 30 s watchdog lease
    let holder = LockClient::connect_with(&server.url(), config.clone())
        .await
        .unwrap();
    let waiter = LockClient::connect_with(&server.url(), config).await.unwrap();
    let name = unique_name("handoff");
    let guard = holder.lock(&name).acquire().await.unwrap();
    let (handoff, guard) = handoff_to(waiter.lock(&name), guard).await;
    // The spec asks for 100 ms; the bound is doubled for this shared 2-core machine.
    assert!(handoff < Duration::from_millis(200), "handoff took {handoff:?}");
    assert!(guard.is_held());
}

/// A waiter counts its subscription as confirmed only once the server ran it: fred answers
/// `SUBSCRIBE` as soon as it is queued. Here the waiter's `SUBSCRIBE` is held back in a proxy for
/// 600 ms, and the lock is released 200 ms into that, published to nobody. A waiter that took
/// fred's answer for the confirmation has tried again by then, been refused, and sleeps until the
/// 30 s lease would run out; one that waits for the server's confirmation tries again after it
/// and finds the lock free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_before_the_server_ran_the_subscription_is_not_missed() {
    let server = RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port()).await;
    let config = LockConfig::default(); // 30 s watchdog lease
    let holder = LockClient::connect_with(&server.url(), config.clone())
        .await
        .unwrap();
    let waiter = LockClient::connect_with(&proxy.url(), config).await.unwrap();
    let name = unique_name("late-subscribe");
    let guard = holder.lock(&name).acquire().await.unwrap();

    proxy.delay_request_once(b"SUBSCRIBE", Duration::from_millis(600));
    let waiting = wait_for(waiter.lock(&name));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "refused while the lock is held");
    let released = Instant::now();
    guard.release().await.unwrap();
    let (at, guard) = granted(waiting).await;
    assert!(
        at - released < Duration::from_secs(2),
        "granted {:?} after the release",
        at - released
    );
    assert!(guard.is_held());
}

/// A release is published only when a refused waiter marked the hold (`field~` beside its field):
/// an uncontended lock sends no message, a contended one wakes its waiter promptly (with a 30 s
/// lease), and the mark shows in `inspect` and goes with the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_published_only_when_a_waiter_marked_the_hold() {
    let server = RedisServer::start();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let name = unique_name("marked");
    let key = lock_key(&name);
    for _ in 0..3 {
        let guard = holder.lock(&name).acquire().await.unwrap();
        // A release that goes alone is one `HDEL`, no script (`batch::release_alone`).
        let (scripts, hdels) = (server.script_calls(), server.command_calls("hdel"));
        guard.release().await.unwrap();
        assert_eq!(server.script_calls() - scripts, 0);
        assert_eq!(server.command_calls("hdel") - hdels, 1);
        assert!(!server.exists(&key));
    }
    assert_eq!(server.command_calls("publish"), 0, "nobody waited");

    let guard = holder.lock(&name).acquire().await.unwrap();
    assert!(!holder.inspect(&name).await.unwrap().unwrap().contended);
    // A refusal marks the hold, once; a reentry keeps the mark.
    assert!(waiter.lock(&name).try_acquire().await.unwrap().is_none());
    assert!(waiter.lock(&name).try_acquire().await.unwrap().is_none());
    let nested = holder.lock(&name).acquire().await.unwrap();
    drop(nested);
    let info = holder.inspect(&name).await.unwrap().unwrap();
    assert!(info.contended, "{info:?}");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    let field = info.holders[0].field.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            server.cmd(&["HGET", &key, &field]).as_int() == Some(1)
        })
        .await,
        "the nested guard's release did not land"
    );
    assert_eq!(
        server.cmd(&["HGET", &key, &format!("{field}~")]).as_int(),
        Some(1)
    );
    assert_eq!(server.cmd(&["HLEN", &key]).as_int(), Some(2));

    let (handoff, guard) = handoff_to(waiter.lock(&name), guard).await;
    assert!(handoff < Duration::from_millis(500), "handoff took {handoff:?}");
    assert_eq!(server.command_calls("publish"), 1);
    // The mark went with its hold: the new one starts unmarked, and its release sends nothing.
    let info = waiter.inspect(&name).await.unwrap().unwrap();
    assert!(!info.contended, "{info:?}");
    guard.release().await.unwrap();
    assert_eq!(server.command_calls("publish"), 1);
    assert_eq!(server.cmd(&["EXISTS", &key]).as_int(), Some(0));
}

/// A client with waiters of its own on the lock's channel announces its release even where no mark
/// says anyone waits (a waiter held back behind another owner of its client makes no attempt, so
/// leaves none): here the mark is removed behind the waiter's back, and it still wakes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_its_own_waiters_announces_its_release_without_a_mark() {
    let server = RedisServer::start();
    // No handoff: the release frees the lock, and the waiter must hear of it.
    let config = LockConfig::default().handoff_limit(0);
    let client = LockClient::connect_with(&server.url(), config).await.unwrap();
    let name = unique_name("announce");
    let key = lock_key(&name);
    let guard = client.lock(&name).owner(Owner::new()).acquire().await.unwrap();
    let lock = client.lock(&name).owner(Owner::new());
    let waiting = wait_for(lock);
    let field = server.hold_field(&key);
    assert!(
        eventually(Duration::from_secs(5), || {
            server.cmd(&["HEXISTS", &key, &format!("{field}~")]).as_int() == Some(1)
        })
        .await,
        "the waiter's refusal left no mark"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        server.cmd(&["HDEL", &key, &format!("{field}~")]).as_int(),
        Some(1)
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    let (granted, guard) = granted(waiting).await;
    assert!(granted - released < Duration::from_millis(500));
    assert_eq!(server.command_calls("publish"), 1);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_leaks_nothing() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter = client(&server).await;
    let name = unique_name("cancel");
    let channel = format!("{}:released", lock_key(&name));
    let guard = holder.lock(&name).acquire().await.unwrap();
    let lock = waiter.lock(&name);
    // A waiter that gives up while subscribed.
    assert!(tokio::time::timeout(Duration::from_millis(300), lock.acquire())
        .await
        .is_err());
    let unsubscribed = eventually(Duration::from_secs(3), || {
        let reply = server.cmd(&["PUBSUB", "NUMSUB", &channel]);
        format!("{reply:?}").ends_with("Int(0)])")
    })
    .await;
    assert!(
        unsubscribed,
        "the cancelled waiter's subscription was left behind"
    );
    drop(guard);

    // Acquisitions cancelled at every point of their flight leave no lock behind.
    let free = unique_name("cancel-free");
    for i in 0..40u64 {
        let lock = waiter.lock(&free);
        let task = tokio::spawn(async move {
            let _guard = lock.acquire().await;
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        tokio::time::sleep(Duration::from_micros(50 * i)).await;
        task.abort();
        let _ = task.await;
    }
    let gone = eventually(Duration::from_secs(5), || !server.exists(&lock_key(&free))).await;
    assert!(gone, "a cancelled acquisition left the lock held");
    assert!(holder.lock(&free).try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_releases_in_the_background_even_on_panic() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("drop");
    let lock = client.lock(&name);
    let panicked = tokio::spawn(async move {
        let _guard = lock.acquire().await.unwrap();
        panic!("handler failed while holding the lock");
    })
    .await;
    assert!(panicked.is_err());
    assert!(eventually(Duration::from_secs(3), || !server.exists(&lock_key(&name))).await);

    fn fails(guard: &LockGuard) -> Result<(), Error> {
        let _ = guard;
        Err(Error::NotHeld)
    }
    let run = async {
        let guard = client.lock(&name).acquire().await?;
        fails(&guard)?;
        Ok::<_, Error>(())
    };
    assert!(run.await.is_err());
    assert!(eventually(Duration::from_secs(3), || !server.exists(&lock_key(&name))).await);

    // A drop takes effect at once for the same owner, as a synchronous unlock would: acquiring again
    // right after it starts a new hold rather than re-entering the old one.
    let lock = client.lock(&name);
    let first = lock.acquire().await.unwrap();
    let token = first.fencing_token().await.unwrap();
    drop(first);
    let second = lock.acquire().await.unwrap();
    assert_eq!(second.hold_count(), 1);
    assert!(second.fencing_token().await.unwrap() > token);
    assert!(second.is_held());
    tokio::time::sleep(Duration::from_millis(200)).await; // let the first release reach Redis
    assert!(
        server.exists(&lock_key(&name)),
        "the old hold's release removed the new hold"
    );
    second.release().await.unwrap();
    assert!(!server.exists(&lock_key(&name)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_owners_in_one_task_exclude_each_other() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("scoped");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicUsize::new(0));
    let section = |owner: Owner| {
        let lock = client.lock(&name);
        let inside = inside.clone();
        let overlap = overlap.clone();
        owner.scope(async move {
            for _ in 0..10 {
                let guard = lock.acquire().await.unwrap();
                assert_eq!(
                    guard.hold_count(),
                    1,
                    "scoped futures must not re-enter each other"
                );
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlap.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                // Awaited, so that this owner's next acquisition is a fresh one.
                guard.release().await.unwrap();
            }
        })
    };
    tokio::join!(
        section(Owner::new()),
        section(Owner::new()),
        section(Owner::new())
    );
    assert_eq!(overlap.load(Ordering::SeqCst), 0);

    // Without scopes, joined futures of one task share its identity (documented): they re-enter.
    let lock = client.lock(&name);
    let (a, b) = tokio::join!(lock.acquire(), lock.acquire());
    let counts = [a.unwrap().hold_count(), b.unwrap().hold_count()];
    assert!(counts.contains(&2), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_owner_shares_one_hold_across_tasks() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("shared-owner");
    let owner = Owner::new();
    let first = client.lock(&name).owner(owner.clone()).acquire().await.unwrap();
    let lock = client.lock(&name).owner(owner);
    let second = tokio::spawn(async move { lock.acquire().await.unwrap() })
        .await
        .unwrap();
    assert_eq!(second.hold_count(), 2);
    // Drawn by the second guard's read (in this task), read by the first's from the same hold.
    let token = second.fencing_token().await.unwrap();
    assert_eq!(first.fencing_token().await.unwrap(), token);
    // Released from another task than the one that took it.
    tokio::spawn(async move { first.release().await.unwrap() })
        .await
        .unwrap();
    assert!(server.exists(&lock_key(&name)));
    second.release().await.unwrap();
    assert!(!server.exists(&lock_key(&name)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_a_restart_are_survived() {
    let mut server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("recover");
    client
        .lock(&name)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // The scripts, then the function library: each loaded again on the next call.
    for flush in ["SCRIPT", "FUNCTION"] {
        server.cmd(&[flush, "FLUSH"]);
        let guard = client.lock(&name).acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    assert_eq!(support::function_libraries(&server).len(), 1, "loaded again");

    server.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match client.lock(&name).try_acquire().await {
            Ok(Some(guard)) => {
                guard.release().await.unwrap();
                break;
            }
            Ok(None) => panic!("nobody holds the lock on a fresh server"),
            Err(err) => {
                assert!(matches!(err, Error::Redis(_) | Error::Timeout(_)), "{err:?}");
                assert!(Instant::now() < deadline, "no reconnect: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_typed_error_within_the_bound() {
    let mut server = RedisServer::start();
    let config = support::fast_config().command_timeout(Duration::from_millis(500));
    let client = LockClient::connect_with(&server.url(), config).await.unwrap();
    server.kill();
    let start = Instant::now();
    let err = client.lock(&unique_name("down")).acquire().await.unwrap_err();
    assert!(matches!(err, Error::Redis(_) | Error::Timeout(_)), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );

    // A paused server: the bound holds too.
    let paused = RedisServer::start();
    let client = LockClient::connect_with(
        &paused.url(),
        support::fast_config().command_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    paused.pause();
    let start = Instant::now();
    let err = client
        .lock(&unique_name("paused"))
        .try_acquire()
        .await
        .unwrap_err();
    paused.resume();
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// A lone release whose reply comes too late (the server paused past the command timeout) still
/// wakes the other client's waiter once the server runs it, not at the end of the lease that
/// waiter saw: the `HDEL` ran, and the release's message must follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_answered_late_still_wakes_the_waiters() {
    let server = RedisServer::start();
    // A 10 s lease: a waiter that sleeps until it ran out would be granted seconds late.
    let config = LockConfig::default()
        .watchdog_timeout(Duration::from_secs(10))
        .renew_interval(Duration::from_secs(2))
        .command_timeout(Duration::from_millis(500));
    let holder = LockClient::connect_with(&server.url(), config.clone())
        .await
        .unwrap();
    let other = LockClient::connect_with(&server.url(), config).await.unwrap();
    let name = unique_name("late-release");
    let guard = holder.lock(&name).acquire().await.unwrap();
    let waiter = {
        let lock = other.lock(&name);
        tokio::spawn(async move { lock.acquire().await.map(|g| (Instant::now(), g)) })
    };
    // Refused, marked the hold, subscribed and asleep.
    let key = lock_key(&name);
    assert!(
        eventually(Duration::from_secs(5), || server.cmd(&["HLEN", &key]).as_int()
            == Some(2))
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.pause();
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    let resumed = Instant::now();
    let (at, granted) = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter was granted")
        .unwrap()
        .unwrap();
    let late = at.duration_since(resumed);
    assert!(
        late < Duration::from_secs(3),
        "granted {late:?} after the server resumed"
    );
    assert!(granted.is_held());
}

/// A waiting acquisition rides through transient errors until its bound: a server paused past
/// the command timeout answers later, and the waiter is granted then, not failed at its first
/// timeout. An error that waiting cannot cure (a key of another type) ends it at once; a bound
/// that ends during the errors returns the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_waits_keep_trying_through_transient_errors() {
    let server = RedisServer::start();
    let config = support::fast_config().command_timeout(Duration::from_millis(300));
    let client = LockClient::connect_with(&server.url(), config).await.unwrap();

    for wait in [Some(Duration::from_secs(10)), None] {
        let name = unique_name("through");
        server.pause();
        let lock = client.lock(&name);
        let attempt = tokio::spawn(async move {
            match wait {
                Some(wait) => lock.try_acquire_for(wait).await,
                None => lock.acquire().await.map(Some),
            }
        });
        // Several attempts time out meanwhile (a lease of errors is 1.5 s: `acquire` rides
        // through a second).
        tokio::time::sleep(Duration::from_millis(1000)).await;
        server.resume();
        let resumed = Instant::now();
        let granted = tokio::time::timeout(Duration::from_secs(10), attempt)
            .await
            .expect("bounded")
            .unwrap()
            .unwrap_or_else(|err| panic!("{wait:?}: failed with {err:?} instead of trying again"))
            .expect("granted");
        assert!(granted.is_held());
        assert!(resumed.elapsed() < Duration::from_secs(3));
        granted.release().await.unwrap();
    }

    // A bound that ends while the server is still paused: the last error.
    server.pause();
    let start = Instant::now();
    let err = client
        .lock(&unique_name("paused"))
        .try_acquire_for(Duration::from_millis(1200))
        .await;
    server.resume();
    assert!(matches!(err, Err(Error::Timeout(_))), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_millis(2500),
        "{:?}",
        start.elapsed()
    );

    // Not transient: at once.
    let foreign = unique_name("foreign");
    server.cmd(&["SET", &lock_key(&foreign), "x"]);
    let start = Instant::now();
    let err = client
        .lock(&foreign)
        .try_acquire_for(Duration::from_secs(10))
        .await;
    assert!(matches!(err, Err(Error::WrongType(_))), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_typed_error_and_writes_nothing() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let long = "x".repeat(relock::MAX_NAME_LEN + 1);
    for name in ["", "a{b", "a}b", "tab\there", long.as_str()] {
        let lock = client.lock(name);
        assert!(
            matches!(lock.acquire().await, Err(Error::InvalidName(_))),
            "{name:?}"
        );
        assert!(matches!(lock.try_acquire().await, Err(Error::InvalidName(_))));
        assert!(matches!(lock.is_locked().await, Err(Error::InvalidName(_))));
        assert!(matches!(lock.force_unlock().await, Err(Error::InvalidName(_))));
    }
    let lock = client.lock("fine");
    for lease in [
        Duration::ZERO,
        Duration::from_micros(500),
        Duration::from_secs(2 * 24 * 3600),
    ] {
        let err = lock.clone().lease(lease).acquire().await.unwrap_err();
        assert!(matches!(err, Error::InvalidDuration(_)), "{lease:?}: {err:?}");
    }
    assert!(matches!(
        lock.try_acquire_for(Duration::MAX).await,
        Err(Error::InvalidDuration(_))
    ));
    for config in [
        LockConfig::default().renew_interval(Duration::from_secs(30)),
        LockConfig::default().renew_interval(Duration::ZERO),
        LockConfig::default().watchdog_timeout(Duration::ZERO),
        LockConfig::default().key_prefix(""),
        LockConfig::default().key_prefix("a{b}"),
        LockConfig::default().command_timeout(Duration::ZERO),
    ] {
        let err = LockClient::connect_with(&server.url(), config).await.unwrap_err();
        assert!(err.is_bad_input(), "{err:?}");
    }
    let err = LockClient::connect("not a url").await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    assert_eq!(
        server.cmd(&["DBSIZE"]).as_int(),
        Some(0),
        "bad input wrote to Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_a_clear_error_and_left_alone() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("wrongtype");
    server.cmd(&["SET", &lock_key(&name), "not a lock"]);
    let calls = server.script_calls();
    let err = client.lock(&name).acquire().await.unwrap_err();
    assert!(matches!(err, Error::WrongType(_)), "{err:?}");
    // The script wrote nothing before it failed, and one master's error is its whole answer: there
    // is nothing to undo, so no release follows (a background one would come within this sleep).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.script_calls() - calls, 1, "one call: the attempt");
    assert!(matches!(
        client.lock(&name).force_unlock().await,
        Err(Error::WrongType(_))
    ));
    assert_eq!(
        server.cmd(&["GET", &lock_key(&name)]).as_str(),
        Some("not a lock")
    );
    // Other locks are unaffected.
    let other = client.lock(&unique_name("fine")).acquire().await.unwrap();
    assert!(other.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_everything() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let names: Vec<String> = (0..5).map(|_| unique_name("shutdown")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.lock(name).acquire().await.unwrap());
    }
    client.shutdown().await;
    for (name, guard) in names.iter().zip(&guards) {
        assert!(!server.exists(&lock_key(name)));
        assert!(!guard.is_held());
    }
    assert!(matches!(
        client.lock(&names[0]).acquire().await,
        Err(Error::Shutdown)
    ));
    drop(guards); // dropping after shutdown is harmless
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_waiters_share_two_connections() {
    const LOCKS: usize = 10_000;
    let server = RedisServer::start();
    let holder = LockClient::connect_with(&server.url(), LockConfig::default())
        .await
        .unwrap();
    let waiter = LockClient::connect_with(&server.url(), LockConfig::default())
        .await
        .unwrap();
    let base = unique_name("many");
    let names: Vec<String> = (0..LOCKS).map(|i| format!("{base}:{i}")).collect();
    let mut guards = Vec::new();
    for chunk in names.chunks(500) {
        let acquires = chunk.iter().map(|name| {
            let lock = holder.lock(name);
            async move { lock.acquire().await }
        });
        for guard in futures::future::join_all(acquires).await {
            guards.push(guard.unwrap());
        }
    }
    let connections_before = client_count(&server);
    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for name in &names {
        let lock = waiter.lock(name);
        let granted = granted.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            granted.fetch_add(1, Ordering::SeqCst);
            drop(guard);
        }));
    }
    // Wait until every waiter is subscribed.
    let subscribed = eventually(Duration::from_secs(60), || {
        let channels = server.cmd(&["PUBSUB", "CHANNELS", &format!("relock:{{{base}:*")]);
        matches!(channels, support::Reply::Array(ref list) if list.len() == LOCKS)
    })
    .await;
    assert!(subscribed, "waiters did not all subscribe");
    assert_eq!(granted.load(Ordering::SeqCst), 0);
    assert_eq!(
        client_count(&server),
        connections_before,
        "waiting opened connections"
    );
    let start = Instant::now();
    drop(guards);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(granted.load(Ordering::SeqCst), LOCKS);
    println!("{LOCKS} waiters granted {:?} after the release", start.elapsed());
}

fn client_count(server: &RedisServer) -> usize {
    let list = server.cmd(&["CLIENT", "LIST"]);
    // The assertion connection itself shows up once.
    list.as_str()
        .unwrap_or("")
        .lines()
        .filter(|l| !l.contains("cmd=client"))
        .count()
}

/// A nested guard dropped (released in the background) right before the outer one's awaited
/// release: the background release may carry both levels; the awaited one still reports success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_nested_guard_then_releasing_the_outer_one_succeeds() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let lock = client.lock(&unique_name("nested-release"));
    for _ in 0..30 {
        let outer = lock.acquire().await.unwrap();
        let inner = lock.acquire().await.unwrap();
        drop(inner);
        outer.release().await.expect("the outer release");
        assert!(!lock.is_locked().await.unwrap());
    }
}

/// Reentrancy you choose: by default an owner re-enters its hold (and futures joined in one task
/// are one owner); a lock made non-reentrant, by itself or by the client's configuration, refuses
/// the second acquisition at once with `AlreadyHeld` and sends nothing, and owners of their own
/// still exclude each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_can_be_turned_off_per_lock_and_per_client() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let name = unique_name("joined");
    let lock = client.lock(&name);
    // The default: joined futures share one hold.
    let (a, b) = tokio::join!(lock.acquire(), lock.acquire());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(b.hold_count().max(a.hold_count()), 2);
    drop((a, b));
    assert!(eventually(Duration::from_secs(3), || !server.exists(&lock_key(&name))).await);

    let strict = client.lock(&name).reentrant(false);
    let (a, b) = tokio::join!(strict.acquire(), strict.acquire());
    let (held, refused) = match (a, b) {
        (Ok(guard), Err(err)) | (Err(err), Ok(guard)) => (guard, err),
        other => panic!("one of two should be refused: {other:?}"),
    };
    assert!(
        matches!(&refused, Error::AlreadyHeld(n) if *n == name),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("Owner"), "{refused}");
    assert!(!refused.is_transient());
    assert_eq!(held.hold_count(), 1);
    let calls = server.script_calls();
    assert!(matches!(strict.try_acquire().await, Err(Error::AlreadyHeld(_))));
    assert_eq!(server.script_calls(), calls, "a refused re-entry sent something");
    // Owners of their own wait for each other instead.
    let other = Owner::new().scope(async {
        let lock = client.lock(&name).reentrant(false);
        lock.acquire().await.map(|g| (Instant::now(), g))
    });
    let released = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let at = Instant::now();
        held.release().await.unwrap();
        at
    });
    let (granted_at, guard) = other.await.unwrap();
    assert!(granted_at >= released.await.unwrap(), "granted while held");
    drop(guard);

    // The same as the client's default.
    let strict_client = LockClient::connect_with(&server.url(), support::fast_config().reentrant(false))
        .await
        .unwrap();
    let lock = strict_client.lock(&unique_name("strict-client"));
    let _guard = lock.acquire().await.unwrap();
    assert!(matches!(lock.acquire().await, Err(Error::AlreadyHeld(_))));
    // A lock may still ask for reentrancy itself.
    let again = lock.clone().reentrant(true).acquire().await.unwrap();
    assert_eq!(again.hold_count(), 2);
}

/// Operators find the holder: the client's connections carry its name (`CLIENT LIST`), and while
/// it holds anything its record (name, host, process) stands beside its holds, so `inspect` says
/// which program on which host holds a lock. Once nothing is renewed for a lease, the record goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_the_program_host_and_process_that_hold_a_lock() {
    let server = RedisServer::start();
    let config = support::fast_config().client_name("inventory-test");
    let client = LockClient::connect_with(&server.url(), config).await.unwrap();
    let named = eventually(Duration::from_secs(5), || {
        matches!(server.cmd(&["CLIENT", "LIST"]), Reply::Str(list) if list.contains("name=inventory-test "))
    })
    .await;
    assert!(named, "the connections carry the client's name");

    let name = unique_name("identity");
    let guard = client.lock(&name).acquire().await.unwrap();
    let mut client_info = None;
    let deadline = Instant::now() + Duration::from_secs(5);
    while client_info.is_none() && Instant::now() < deadline {
        let info = client.inspect(&name).await.unwrap().expect("held");
        client_info = info.holders[0].client.clone();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client_info = client_info.expect("the holder's record within a watchdog round");
    assert_eq!(client_info.name, "inventory-test");
    assert_eq!(client_info.pid, std::process::id());
    assert!(!client_info.host.is_empty());
    assert!(!client_info.version.is_empty());
    let records = server.keys("relock:client:*");
    assert_eq!(
        records.len(),
        1,
        "one record per client, not per lock: {records:?}"
    );
    drop(guard);
    // Nothing held: the record is not renewed and runs out with the watchdog's lease (1.5 s).
    assert!(
        eventually(Duration::from_secs(5), || server
            .keys("relock:client:*")
            .is_empty())
        .await
    );
    // Held again, recorded again; a shutdown removes the record at once.
    let _guard = client.lock(&name).acquire().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || server.keys("relock:client:*").len()
            == 1)
        .await
    );
    client.shutdown().await;
    assert!(
        server.keys("relock:client:*").is_empty(),
        "removed by the shutdown"
    );

    // A name Redis would refuse is refused before any I/O.
    let bad = LockConfig::default().client_name("two words");
    assert!(matches!(
        LockClient::connect_with(&server.url(), bad).await,
        Err(Error::InvalidConfig(message)) if message.contains("client_name")
    ));
}

/// `testing::lose` takes a held lock from its guard at once, not at the watchdog's next round
/// (10 s away with the default settings): the guard then knows, and another client gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testing_lose_takes_the_lock_from_its_guard_at_once() {
    let server = RedisServer::start();
    let name = unique_name("lose");
    let a = LockClient::connect(&server.url()).await.expect("connect");
    let guard = a.lock(&name).acquire().await.unwrap();
    let start = Instant::now();
    relock::testing::lose(&guard).await.expect("lost");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert!(!guard.is_held());
    let b = client(&server).await;
    let taken = b.lock(&name).try_acquire().await.unwrap();
    assert!(taken.is_some(), "free for another client");
    assert!(matches!(guard.release().await, Err(Error::Lost { .. })));
    b.shutdown().await;
    a.shutdown().await;
}
