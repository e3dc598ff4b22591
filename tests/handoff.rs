//! Local handoff (`LockConfig::handoff_limit`): a release passes the lock straight to a waiter of the
//! same client in one script call, without freeing it or publishing; the limit lets the waiters of
//! other clients in; a waiter that leaves never strands a lock handed to it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use relock::{LockClient, LockConfig, Owner};
use support::ServerExt;
use support::{eventually, lock_key, unique_name, RedisServer};

async fn client(server: &RedisServer, config: LockConfig) -> LockClient {
    LockClient::connect_with(&server.url(), config)
        .await
        .expect("connect")
}

/// Default leases (30 s): a waiter left asleep by a missing release message would be seen.
fn config(limit: u32) -> LockConfig {
    LockConfig::default()
        .handoff_limit(limit)
        .command_timeout(Duration::from_secs(2))
}

/// Two clients of `server`, and a lock of `name` held by one owner of the first while another
/// owner of it waits (refused once and asleep, queued for a handoff).
struct Handoff {
    here: LockClient,
    there: LockClient,
    key: String,
    first: relock::LockGuard,
    waiter: tokio::task::JoinHandle<relock::LockGuard>,
}

/// Shuts down both clients of a [`Handoff`].
async fn close(here: &LockClient, there: &LockClient) {
    here.shutdown().await;
    there.shutdown().await;
}

/// The lock of `h` removed behind its holder's back and taken by the other client.
async fn taken_behind_its_back(server: &RedisServer, h: &Handoff, name: &str) -> relock::LockGuard {
    server.cmd(&["DEL", &h.key]);
    h.there.lock(name).acquire().await.unwrap()
}

async fn held_with_a_waiter(server: &RedisServer, name: &str) -> Handoff {
    let here = client(server, config(8)).await;
    let there = client(server, config(8)).await;
    let first = here.lock(name).acquire().await.unwrap();
    let lock = here.lock(name);
    let waiter = tokio::spawn(async move { lock.acquire().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    Handoff {
        here,
        there,
        key: lock_key(name),
        first,
        waiter,
    }
}

/// An owner of `here` takes the lock `name` while another waits for it (refused once and asleep),
/// and the first one's release hands it over: the second one's guard.
async fn handed_over(here: &LockClient, name: &str) -> relock::LockGuard {
    let first = here.lock(name).acquire().await.unwrap();
    handed_on(here, name, first, Owner::new()).await
}

/// `guard`'s release hands the lock to `owner`, which waits for it on `here` (spawned here, asleep
/// after one refusal): that owner's guard.
async fn handed_on(
    here: &LockClient,
    name: &str,
    guard: relock::LockGuard,
    owner: Owner,
) -> relock::LockGuard {
    let lock = here.lock(name);
    let waiter = tokio::spawn(owner.scope(async move { lock.acquire().await.unwrap() }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter is handed the lock")
        .unwrap()
}

/// Pauses `server` and releases `first`; the waiter's guard, handed over while the server answers
/// nothing (the server is resumed before a failure), and the release on its way.
async fn handed_while_paused(
    server: &RedisServer,
    first: relock::LockGuard,
    waiter: tokio::task::JoinHandle<relock::LockGuard>,
) -> (
    relock::LockGuard,
    tokio::task::JoinHandle<Result<(), relock::Error>>,
) {
    server.pause();
    let release = tokio::spawn(first.release());
    match tokio::time::timeout(Duration::from_millis(800), waiter).await {
        Ok(second) => (second.unwrap(), release),
        Err(_) => {
            server.resume();
            panic!("handed over while the server answers nothing");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_a_waiter_of_the_same_client_in_one_call() {
    let server = RedisServer::start();
    let name = unique_name("handoff");
    let here = client(&server, config(8)).await;
    let there = client(&server, config(8)).await;

    let first = here.lock(&name).acquire().await.unwrap();
    let lock = here.lock(&name);
    let local = tokio::spawn(async move { lock.acquire().await.unwrap() });
    let lock = there.lock(&name);
    let remote = tokio::spawn(async move { lock.acquire().await.unwrap() });
    // Both refused once and asleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!local.is_finished() && !remote.is_finished());

    // Read (so drawn, in a call of its own) before the release: the handoff passes the next token
    // on at no cost.
    let token = first.fencing_token().await.unwrap();
    let (scripts, published) = (server.script_calls(), server.command_calls("publish"));
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(2), local)
        .await
        .expect("the local waiter is handed the lock")
        .unwrap();
    assert_eq!(
        second.fencing_token().await.unwrap(),
        token + 1,
        "a handoff from a hold that drew its token hands on the next one"
    );
    assert_eq!(
        server.script_calls() - scripts,
        1,
        "one script call: the transfer (the handed token costs no draw)"
    );
    assert_eq!(
        server.command_calls("publish") - published,
        0,
        "nothing is published"
    );
    assert!(server.exists(&lock_key(&name)));
    assert!(!remote.is_finished(), "the other client's waiter sleeps on");

    // No waiter of this client left: the release frees the lock and tells the other client.
    let token = second.fencing_token().await.unwrap();
    second.release().await.unwrap();
    let third = tokio::time::timeout(Duration::from_secs(2), remote)
        .await
        .expect("the other client's waiter is woken by the release")
        .unwrap();
    assert!(third.fencing_token().await.unwrap() > token);
    third.release().await.unwrap();
    here.shutdown().await;
    there.shutdown().await;
}

/// Two owners of one client taking a lock in turn: the waiter handed the lock leaves the release
/// channel, and the owner that handed it over comes back to wait on it a moment later. The channel
/// lingers, so that owner queues behind the holder without a word to Redis: no attempt (it would
/// be refused) and no `SUBSCRIBE`. Once nobody has waited on it for a while, it is unsubscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_comes_back_at_once_finds_the_channel_live() {
    let server = RedisServer::start();
    let name = unique_name("handoff-linger");
    let channel = format!("{}:released", lock_key(&name));
    // Sections longer than the default window would end the streak at every release.
    let here = client(&server, config(8).handoff_window(Duration::from_secs(60))).await;
    let second = handed_over(&here, &name).await;

    // The first owner comes back while the second holds the lock.
    let (subscribes, scripts) = (server.command_calls("subscribe"), server.script_calls());
    let lock = here.lock(&name);
    let back = tokio::spawn(Owner::new().scope(async move { lock.acquire().await.unwrap() }));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!back.is_finished());
    assert_eq!(
        server.command_calls("subscribe") - subscribes,
        0,
        "no SUBSCRIBE again"
    );
    assert_eq!(
        server.script_calls() - scripts,
        0,
        "no attempt: another owner here holds it"
    );

    // Handed back without a call: Redis records it later (unrecorded handoffs).
    second.release().await.unwrap();
    let third = tokio::time::timeout(Duration::from_secs(2), back)
        .await
        .expect("handed back")
        .unwrap();
    assert_eq!(server.script_calls() - scripts, 0, "not recorded yet");
    // Its release removes the hold Redis recorded, as a plain release does: still no script call.
    third.release().await.unwrap();
    assert_eq!(server.script_calls() - scripts, 0, "a plain HDEL");
    assert!(!server.exists(&lock_key(&name)), "released");
    // A fresh hold that nobody waits for: its release publishes nothing, though the channel
    // lingers (a lingering channel is no waiter of this client's).
    let published = server.command_calls("publish");
    here.lock(&name).acquire().await.unwrap().release().await.unwrap();
    assert_eq!(
        server.command_calls("publish") - published,
        0,
        "nothing is published"
    );

    // Nobody waits any more: the channel goes after a while (0.5 to 1 s).
    let numsub = || format!("{:?}", server.cmd(&["PUBSUB", "NUMSUB", &channel]));
    let unsubscribed = eventually(Duration::from_secs(5), || numsub().ends_with("Int(0)])")).await;
    assert!(unsubscribed, "the lingering channel was unsubscribed");
    here.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_of_zero_frees_the_lock_on_every_release() {
    let server = RedisServer::start();
    let name = unique_name("handoff-off");
    let here = client(&server, config(0)).await;
    let first = here.lock(&name).acquire().await.unwrap();
    let lock = here.lock(&name);
    let local = tokio::spawn(async move { lock.acquire().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let published = server.command_calls("publish");
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(2), local)
        .await
        .expect("woken by the release message")
        .unwrap();
    assert_eq!(server.command_calls("publish") - published, 1);
    second.release().await.unwrap();
    here.shutdown().await;
}

/// Owners of one client that keep taking a lock in turn would pass it among themselves forever;
/// the limit frees it every few handoffs, and the other client's waiter gets in: at the first
/// streak's end, mostly. This client's own waiters hear the same release message, a little sooner
/// than the other client's waiter (whose attempt also comes a round trip after the releasing
/// owner's next one); they hold back while other clients heard it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_lets_the_waiters_of_other_clients_in() {
    // The section under way when the waiter came, then a streak (a fresh acquisition and 2
    // handoffs): 4 sections at most before the first streak's end.
    other_clients_get_in(config(2), 4).await;
}

/// The same with a limit that is never reached: the window ends each streak. Sections of 5 ms
/// (6 ms as tokio's timer runs them) and a 12 ms window: the section under way, a fresh acquisition
/// and the handoffs made within 12 ms of the first, 5 sections at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_lets_the_waiters_of_other_clients_in() {
    other_clients_get_in(config(1_000_000).handoff_window(Duration::from_millis(12)), 5).await;
}

/// Three owners of one client take a lock in turn (5 ms sections) while an owner of another client
/// acquires it 20 times: it should mostly get in within `first_end` sections of this client.
async fn other_clients_get_in(config: LockConfig, first_end: usize) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let server = RedisServer::start();
    let name = unique_name("handoff-streak");
    let here = client(&server, config.clone()).await;
    let there = client(&server, config).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sections = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut busy = Vec::new();
    for _ in 0..3 {
        let lock = here.lock(&name);
        let (stop, sections, tokens) = (stop.clone(), sections.clone(), tokens.clone());
        busy.push(tokio::spawn(Owner::new().scope(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.acquire().await.unwrap();
                let token = guard.fencing_token().await.unwrap();
                tokens.lock().push(token);
                sections.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard.release().await.unwrap();
            }
        })));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // How many of this client's sections passed while the other client waited, per round.
    let mut passed = Vec::new();
    for _ in 0..20 {
        let before = sections.load(Ordering::Relaxed);
        let got = there
            .lock(&name)
            .try_acquire_for(Duration::from_secs(5))
            .await
            .unwrap();
        let guard = got.expect("the other client's waiter gets the lock well before the 30 s lease");
        passed.push(sections.load(Ordering::Relaxed) - before);
        let token = guard.fencing_token().await.unwrap();
        tokens.lock().push(token);
        guard.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in busy {
        task.await.unwrap();
    }
    // Without the hold-back, this client's waiter took the lock back at most ends: about 1 round
    // in 5 got in at the first.
    let at_first_end = passed.iter().filter(|&&n| n <= first_end).count();
    assert!(
        at_first_end >= passed.len() * 3 / 4,
        "the other client mostly gets in at the first streak's end; sections passed: {passed:?}"
    );
    let tokens = tokens.lock().clone();
    assert!(tokens.len() > 20);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens rise with every section, handoffs included"
    );
    here.shutdown().await;
    there.shutdown().await;
}

/// Waiters that give up at random moments (some while a handoff to them is on its way) leave no
/// lock behind: once every task is done, the lock is free at once, not after its 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_leave_never_strand_the_lock() {
    let server = RedisServer::start();
    let name = unique_name("handoff-leave");
    let here = client(&server, config(8)).await;
    let admin = support::fred_client(&server.url()).await;
    let counter = format!("count:{name}");
    let granted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let lock = here.lock(&name);
        let (admin, counter, granted) = (admin.clone(), counter.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            use fred::interfaces::KeysInterface;
            for j in 0..60u64 {
                // Waits of 0.2 to 3 ms: many end while a release is handing the lock over.
                let wait = Duration::from_micros(200 + (i * 7919 + j * 104_729) % 2800);
                let Ok(Some(guard)) = lock.try_acquire_for(wait).await else {
                    continue;
                };
                granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let value: Option<i64> = admin.get(&counter).await.unwrap();
                let _: () = admin
                    .set(&counter, value.unwrap_or(0) + 1, None, None, false)
                    .await
                    .unwrap();
                if j % 2 == 0 {
                    drop(guard);
                } else {
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let granted = granted.load(std::sync::atomic::Ordering::Relaxed);
    assert!(granted > 0);
    assert_eq!(
        server.cmd(&["GET", &counter]).as_int(),
        Some(granted as i64),
        "every section ran alone"
    );
    assert!(
        eventually(Duration::from_secs(2), || !server.exists(&lock_key(&name))).await,
        "a lock handed to a waiter that left is released, not left for its lease"
    );
    here.shutdown().await;
}

/// A waiter of the client that holds the lock (handed to another of its owners) waits without
/// attempts; when that hold is lost (the lock removed behind its back, no release message), the
/// waiter tries at once, not at the end of the lost hold's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_local_holder_tries_as_soon_as_that_hold_is_lost() {
    let server = RedisServer::start();
    let name = unique_name("handoff-lost");
    // Renewals every 3 s: a hold found lost at one still had 6 s of its lease left locally.
    let here = client(&server, config(8).watchdog_timeout(Duration::from_secs(9))).await;

    let second = handed_over(&here, &name).await;
    // Handed on by a hold that drew no token, it has none: read (drawn) while it holds the lock.
    let second_token = second.fencing_token().await.unwrap();

    let lock = here.lock(&name);
    let third = tokio::spawn(async move { lock.acquire().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !third.is_finished(),
        "the lock is held by another owner of the client"
    );

    server.cmd(&["DEL", &lock_key(&name)]);
    tokio::time::timeout(Duration::from_secs(6), second.lost())
        .await
        .expect("the next renewal finds the lock gone");
    let lost = tokio::time::Instant::now();
    let third = tokio::time::timeout(Duration::from_secs(3), third)
        .await
        .expect("the waiter tries once the holder's hold is lost, not 6 s later")
        .unwrap();
    assert!(lost.elapsed() < Duration::from_secs(3));
    assert!(third.fencing_token().await.unwrap() > second_token);
    assert!(matches!(
        second.fencing_token().await,
        Err(relock::Error::LeaseLost)
    ));
    drop(second);
    third.release().await.unwrap();
    here.shutdown().await;
}

/// The waiter is handed the lock as the release starts, with the next token, before Redis answers
/// (here: while the server is paused); the release's call then moves the hold in Redis, raises the
/// fence past that token and gives the waiter its own lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_handed_the_lock_before_redis_answers() {
    let server = RedisServer::start();
    let name = unique_name("handoff-early");
    let h = held_with_a_waiter(&server, &name).await;
    let first_field = server.hold_field(&h.key);
    // Drawn before the release: the handoff then carries the next token.
    let token = h.first.fencing_token().await.unwrap();

    let (second, release) = handed_while_paused(&server, h.first, h.waiter).await;
    // Read while the server answers nothing: the handed token needs no call.
    assert_eq!(
        second.fencing_token().await.unwrap(),
        token + 1,
        "the next token after the releasing hold's"
    );
    server.resume();
    release
        .await
        .unwrap()
        .expect("the release is confirmed once the server answers");

    let second_field = server.hold_field(&h.key);
    assert_ne!(second_field, first_field, "the hold moved in Redis");
    let reserve = LockConfig::default().get_unrecorded_handoffs();
    assert_eq!(
        server.cmd(&["GET", &format!("{}:fence", h.key)]).as_str(),
        Some((token + 1 + u64::from(reserve)).to_string().as_str()),
        "the fence is past the handed token, by the reserve for unrecorded handoffs"
    );
    let ttl = server.cmd(&["PTTL", &h.key]).as_int().unwrap();
    assert!(ttl > 25_000, "the waiter's own lease, set by the call: {ttl} ms");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(1), second.lost())
            .await
            .is_err(),
        "the handed hold stands once Redis recorded it"
    );

    let lock = h.there.lock(&name);
    let other = tokio::spawn(async move { lock.acquire().await.unwrap() });
    second.release().await.unwrap();
    let other = tokio::time::timeout(Duration::from_secs(2), other)
        .await
        .expect("the other client gets the lock")
        .unwrap();
    assert!(
        other.fencing_token().await.unwrap() > token + 1,
        "later tokens draw above the handed one"
    );
    other.release().await.unwrap();
    close(&h.here, &h.there).await;
}

/// A hold whose lock was taken behind its back (removed, then acquired by another client) hands
/// its waiter a grant that the release's call refuses: the waiter is told at once that it lost the
/// lock, the release reports the lock not held, and the other client's hold is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_handoff_of_a_lock_taken_meanwhile_ends_as_lost_at_once() {
    let server = RedisServer::start();
    let name = unique_name("handoff-taken");
    let h = held_with_a_waiter(&server, &name).await;
    // Drawn while it still holds the lock (a read after the lock was taken would find the hold
    // gone, and end it as lost before its release).
    let first_token = h.first.fencing_token().await.unwrap();

    let other = taken_behind_its_back(&server, &h, &name).await;
    let other_field = server.hold_field(&h.key);
    let other_token = other.fencing_token().await.unwrap();
    assert!(other_token > first_token);

    assert!(matches!(h.first.release().await, Err(relock::Error::NotHeld)));
    let second = tokio::time::timeout(Duration::from_secs(2), h.waiter)
        .await
        .expect("the waiter was handed a grant")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(1), second.lost())
        .await
        .expect("told at once, not at the next renewal");
    // Fenced out: its grant (the next token after the first hold's, below the other client's) is
    // lost, and a lost hold gets no token at all.
    assert!(first_token + 1 < other_token);
    assert!(
        matches!(second.fencing_token().await, Err(relock::Error::LeaseLost)),
        "fenced out"
    );
    assert_eq!(
        server.hold_field(&h.key),
        other_field,
        "the other client still holds it"
    );
    drop(second);
    other.release().await.unwrap();
    close(&h.here, &h.there).await;
}

/// The same refusal when the waiter released its grant before Redis answered (a section shorter than
/// the call): its release reports the lock not held, not a clean release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_released_before_redis_refused_it_reports_the_lock_not_held() {
    let server = RedisServer::start();
    let name = unique_name("handoff-refused");
    let h = held_with_a_waiter(&server, &name).await;
    let other = taken_behind_its_back(&server, &h, &name).await;

    let (second, release) = handed_while_paused(&server, h.first, h.waiter).await;
    let second_release = tokio::spawn(second.release());
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.resume();
    assert!(matches!(release.await.unwrap(), Err(relock::Error::NotHeld)));
    assert!(
        matches!(second_release.await.unwrap(), Err(relock::Error::NotHeld)),
        "the waiter learns that its section did not hold the lock"
    );
    assert!(server.exists(&h.key), "the other client's hold is untouched");
    other.release().await.unwrap();
    close(&h.here, &h.there).await;
}

/// An early handoff whose call gets no answer in time (the server paused past the node timeout):
/// the waiter is told at once that it lost the lock, and the undos leave the lock free with the
/// fence at or above the token the waiter was given, so that the next holder's token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_handoff_without_an_answer_ends_lost_and_leaves_the_fence_above_its_token() {
    let server = RedisServer::start();
    let name = unique_name("handoff-unanswered");
    let h = held_with_a_waiter(&server, &name).await;
    // Drawn before the release: the early handoff carries the next token.
    let token = h.first.fencing_token().await.unwrap();

    let (second, release) = handed_while_paused(&server, h.first, h.waiter).await;
    let second_token = second.fencing_token().await.unwrap();
    assert_eq!(second_token, token + 1);
    let lost = tokio::time::timeout(Duration::from_secs(4), second.lost()).await;
    let released = tokio::time::timeout(Duration::from_secs(2), release).await;
    server.resume();
    lost.expect("told of the loss once the call's bound ran out");
    assert!(
        matches!(released, Ok(Ok(Err(relock::Error::Timeout(_))))),
        "the release reports the missing answer: {released:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || !server.exists(&h.key)).await,
        "the undos free the lock once the server answers again"
    );
    let fence: u64 = server
        .cmd(&["GET", &format!("{}:fence", h.key)])
        .as_str()
        .and_then(|f| f.parse().ok())
        .unwrap();
    assert!(fence > token, "the fence covers the handed token");
    let next = h.there.lock(&name).acquire().await.unwrap();
    assert!(next.fencing_token().await.unwrap() > second_token);
    assert!(matches!(
        second.fencing_token().await,
        Err(relock::Error::LeaseLost)
    ));
    next.release().await.unwrap();
    drop(second);
    close(&h.here, &h.there).await;
}

/// An owner of `here` that takes the lock `name` by a handoff that Redis recorded (a first owner
/// held it, released it while this one waited): its owner and guard, and its field in Redis.
/// `drawn`: the first owner read its token before the release, so that the handoff carried the
/// next one (and the record a reserve of tokens for unrecorded handoffs); else the guard has no
/// token until it reads one.
async fn recorded_handoff(
    server: &RedisServer,
    here: &LockClient,
    name: &str,
    drawn: bool,
) -> (Owner, relock::LockGuard, String) {
    let first = here.lock(name).acquire().await.unwrap();
    if drawn {
        first.fencing_token().await.unwrap();
    }
    let owner = Owner::new();
    let guard = handed_on(here, name, first, owner.clone()).await;
    (owner, guard, server.hold_field(&lock_key(name)))
}

/// Handoffs in a row go unrecorded in Redis (`LockConfig::unrecorded_handoffs`): no script call,
/// Redis holding the lock for the owner it last recorded, until the next call records the latest
/// owner, within 10 ms. Fencing tokens still rise, and the fence stays above every token handed out:
/// a lock that Redis lets go of (this client crashed, say) is taken elsewhere with a larger token.
/// The holds read their tokens, so each handoff passes on the next one: the reserve that the
/// recorded handoff set covers them without a draw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoffs_in_a_row_go_unrecorded_with_the_fence_above_their_tokens() {
    let server = RedisServer::start();
    let name = unique_name("handoff-unrecorded");
    let key = lock_key(&name);
    let here = client(&server, config(8).handoff_window(Duration::from_secs(60))).await;
    let there = client(&server, config(8)).await;
    let (_, recorded, recorded_field) = recorded_handoff(&server, &here, &name, true).await;

    let scripts = server.script_calls();
    let mut tokens = vec![recorded.fencing_token().await.unwrap()];
    let mut guard = recorded;
    // Each handoff queues its waiter 300 ms before: the record of the first runs 10 ms after it.
    let second = handed_on(&here, &name, guard, Owner::new()).await;
    tokens.push(second.fencing_token().await.unwrap());
    assert_eq!(server.script_calls() - scripts, 0, "handed on without a call");
    assert_eq!(
        server.hold_field(&key),
        recorded_field,
        "Redis records the first owner still"
    );
    let recorded_at = eventually(Duration::from_secs(2), || {
        server.hold_field(&key) != recorded_field
    })
    .await;
    assert!(recorded_at, "the latest owner is recorded within the window");
    assert_eq!(server.script_calls() - scripts, 1, "in one call");
    guard = second;
    for _ in 0..3 {
        guard = handed_on(&here, &name, guard, Owner::new()).await;
        tokens.push(guard.fencing_token().await.unwrap());
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens rise: {tokens:?}");

    // Redis lets go of the lock (as it would at its lease's end after a crash): the next token
    // drawn is above every one handed out here.
    let pending = handed_on(&here, &name, guard, Owner::new()).await;
    let pending_token = pending.fencing_token().await.unwrap();
    assert!(pending_token > tokens[tokens.len() - 1]);
    server.cmd(&["DEL", &key]);
    let elsewhere = there.lock(&name).acquire().await.unwrap();
    let elsewhere_token = elsewhere.fencing_token().await.unwrap();
    assert!(
        elsewhere_token > pending_token,
        "{elsewhere_token} drawn elsewhere after {pending_token} handed out here"
    );
    elsewhere.release().await.unwrap();
    drop(pending);
    close(&here, &there).await;
}

/// Redis records a lock for an owner that handed it on without a call (see above). That owner's
/// next attempt would replace its own ended hold there (see acquire.lua) and be granted while
/// another owner holds the lock: the handoffs are recorded first, and the attempt is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_handed_the_lock_on_unrecorded_is_refused_on_its_next_attempt() {
    let server = RedisServer::start();
    let name = unique_name("handoff-unrecorded-owner");
    let key = lock_key(&name);
    let here = client(&server, config(8).handoff_window(Duration::from_secs(60))).await;
    let (owner, recorded, recorded_field) = recorded_handoff(&server, &here, &name, false).await;
    let scripts = server.script_calls();
    let holder = handed_on(&here, &name, recorded, Owner::new()).await;
    assert_eq!(server.script_calls() - scripts, 0, "handed on without a call");
    assert_eq!(server.hold_field(&key), recorded_field);

    let lock = here.lock(&name);
    let again = owner
        .scope(async move { lock.try_acquire().await.unwrap() })
        .await;
    assert!(again.is_none(), "refused: another owner holds the lock");
    assert_ne!(server.hold_field(&key), recorded_field, "the holder is recorded");
    assert!(
        tokio::time::timeout(Duration::from_millis(1), holder.lost())
            .await
            .is_err(),
        "the holder keeps the lock"
    );
    holder.release().await.unwrap();
    assert!(!server.exists(&key), "released");
    here.shutdown().await;
}

/// Owners of one client taking one lock in turn, as fast as they can, with no other client: every
/// release is of a hold the owner really held, so none may report `NotHeld`, whichever way the
/// lock went (handed over with a call or without, or freed) and however the worker threads
/// interleave. The race that broke this (a release of a recorded hold overtaken by its owner's
/// next attempt) is tested deterministically in `handoff.rs`'s own tests; this is the end-to-end
/// check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_after_unrecorded_handoffs_never_report_the_lock_not_held() {
    let server = RedisServer::start();
    let name = unique_name("handoff-release-race");
    let here = client(&server, config(8).handoff_window(Duration::from_secs(60))).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let lock = here.lock(&name);
        let errors = errors.clone();
        tasks.push(tokio::spawn(Owner::new().scope(async move {
            let mut cycles = 0u64;
            while tokio::time::Instant::now() < until {
                let guard = lock.acquire().await.unwrap();
                tokio::task::yield_now().await;
                if let Err(err) = guard.release().await {
                    errors.lock().push(err.to_string());
                }
                cycles += 1;
            }
            cycles
        })));
    }
    let mut cycles = 0;
    for task in tasks {
        cycles += task.await.unwrap();
    }
    let errors = errors.lock().clone();
    assert!(cycles > 1000, "{cycles} cycles");
    assert!(
        errors.is_empty(),
        "{} of {cycles} releases failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    here.shutdown().await;
}
