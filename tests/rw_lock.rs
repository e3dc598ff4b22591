//! `RwLock` against real redis-servers: many readers or one writer, reentrancy of both sides, a
//! writer's downgrade, an upgrade refused at once, a waiting writer holding back new readers (and
//! letting them go when it stops waiting or is cut off), every reader's lease its own, bad input and
//! keys of another type, a quorum of masters, and a property test of the rules against a model.
//! Redisson's `RedissonReadWriteLockTest` scenarios (reentrant read under write, read lease under a
//! writer, write after reads expire) are among them.

mod support;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{Error, LockClient, MultiLock, Owner};
use support::proxy::Proxy;
use support::{unique_name, RedisServer};
use tokio::time::Instant;

async fn client(url: &str) -> LockClient {
    LockClient::connect_with(url, support::fast_config())
        .await
        .expect("connect")
}

fn rw_key(name: &str) -> String {
    format!("relock:{{{name}}}:rw")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_readers_or_one_writer() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("rw");
    let (ra, rb) = (a.rw_lock(&name), b.rw_lock(&name));

    // Readers of two clients and two owners hold it together.
    let r1 = ra.read().acquire().await.unwrap();
    let r2 = rb
        .read()
        .owner(Owner::new())
        .try_acquire()
        .await
        .unwrap()
        .expect("a second reader");
    let r3 = rb
        .read()
        .owner(Owner::new())
        .try_acquire()
        .await
        .unwrap()
        .expect("a third reader");
    assert_eq!(r1.fencing_token().await.unwrap(), 0, "readers draw no token");
    assert!(rb.read().is_locked().await.unwrap());
    assert!(!rb.write().is_locked().await.unwrap());
    // No writer while any reads.
    assert!(rb
        .write()
        .owner(Owner::new())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    drop(r1);
    r2.release().await.unwrap();
    assert!(rb
        .write()
        .owner(Owner::new())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    r3.release().await.unwrap();
    let w = rb
        .write()
        .owner(Owner::new())
        .try_acquire_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the writer once every reader left");
    // The write side draws its token when granted: the fence has it before any read.
    let fence = server.cmd(&["GET", &format!("{}:fence", rw_key(&name))]);
    let w_token = w.fencing_token().await.unwrap();
    assert!(w_token > 0);
    assert_eq!(fence.as_str(), Some(w_token.to_string().as_str()));
    assert!(rb.write().is_locked().await.unwrap());
    // No reader and no other writer while it writes.
    assert!(ra
        .read()
        .owner(Owner::new())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(ra
        .write()
        .owner(Owner::new())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    w.release().await.unwrap();
    let w2 = ra.write().acquire().await.unwrap();
    assert!(
        w2.fencing_token().await.unwrap() > w_token,
        "tokens rise across writers"
    );
    w2.release().await.unwrap();
    assert!(!ra.is_locked().await.unwrap());
    // Nothing left behind but the fence counter.
    let left = server.keys(&format!("relock:{{{name}}}*"));
    assert_eq!(
        left,
        vec![format!("{}:fence", rw_key(&name))],
        "keys left: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_are_reentrant_and_a_writer_may_downgrade() {
    let server = RedisServer::start();
    let c = client(&server.url()).await;
    let other = client(&server.url()).await;
    let name = unique_name("reenter");
    let rw = c.rw_lock(&name);
    let w1 = rw.write().acquire().await.unwrap();
    let w2 = rw.write().acquire().await.unwrap();
    assert_eq!(w2.hold_count(), 2);
    assert_eq!(
        w2.fencing_token().await.unwrap(),
        w1.fencing_token().await.unwrap()
    );
    // The writer reads (Redisson: a read lock inside the write lock).
    let r1 = rw.read().acquire().await.unwrap();
    let r2 = rw.read().acquire().await.unwrap();
    assert_eq!(r2.hold_count(), 2);
    drop(w2);
    w1.release().await.unwrap();
    // Downgraded: still read, so no writer gets in, but readers do.
    assert!(r1.is_held());
    let theirs = other.rw_lock(&name);
    assert!(theirs.write().try_acquire().await.unwrap().is_none());
    let shared = theirs
        .read()
        .try_acquire_for(Duration::from_secs(2))
        .await
        .unwrap()
        .expect("a reader beside the downgraded one");
    drop(shared);
    r2.release().await.unwrap();
    r1.release().await.unwrap();
    let w = theirs
        .write()
        .try_acquire_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the writer after the last read");
    w.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_asking_for_the_write_lock_is_refused_at_once() {
    let server = RedisServer::start();
    let c = client(&server.url()).await;
    let name = unique_name("upgrade");
    let rw = c.rw_lock(&name);
    let read = rw.read().acquire().await.unwrap();
    let before = server.keys(&format!("relock:{{{name}}}*"));
    let start = Instant::now();
    // Every way of asking: the wait would never end.
    for result in [
        rw.write().try_acquire().await.map(|g| g.is_some()),
        rw.write()
            .try_acquire_for(Duration::from_secs(30))
            .await
            .map(|g| g.is_some()),
        rw.write().acquire().await.map(|_| true),
    ] {
        assert!(
            matches!(result, Err(Error::Upgrade(ref n)) if *n == name),
            "{result:?}"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "not at once: {:?}",
        start.elapsed()
    );
    // Nothing changed: no write hold, no waiting writer.
    assert_eq!(server.keys(&format!("relock:{{{name}}}*")), before);
    assert!(read.is_held());
    read.release().await.unwrap();
    // Released, the same owner may write.
    rw.write().acquire().await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_back_new_readers() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("starve");
    let first = a.rw_lock(&name).read().acquire().await.unwrap();
    let writer = {
        let rw = b.rw_lock(&name);
        tokio::spawn(async move {
            let guard = rw.write().acquire().await.unwrap();
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(300)).await;
            guard.release().await.unwrap();
            at
        })
    };
    // The writer is waiting (recorded) once its first attempt was refused.
    let waiting = format!("{}:writers", rw_key(&name));
    assert!(support::eventually(Duration::from_secs(5), || server.exists(&waiting)).await);
    // A new reader waits behind it; the first reader may still re-enter.
    let late = a.rw_lock(&name).read().owner(Owner::new());
    assert!(late
        .try_acquire_for(Duration::from_millis(700))
        .await
        .unwrap()
        .is_none());
    let again = a
        .rw_lock(&name)
        .read()
        .try_acquire()
        .await
        .unwrap()
        .expect("a reader re-enters");
    // Stays recorded across several of the watchdog's rounds (1.5 s lease, renewed by heartbeat).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        server.exists(&waiting),
        "the waiting writer's record lapsed while it waited"
    );
    assert!(!writer.is_finished());
    assert_eq!(again.hold_count(), 2);
    drop(again);
    let released = Instant::now();
    first.release().await.unwrap();
    // The writer goes first, then the late reader.
    let late_reader = late.acquire().await.unwrap();
    let read_at = Instant::now();
    let wrote_at = writer.await.unwrap();
    assert!(wrote_at < read_at, "the late reader went before the writer");
    assert!(
        wrote_at - released < Duration::from_secs(2),
        "writer woken late: {:?}",
        wrote_at - released
    );
    assert!(!server.exists(&waiting), "the record outlived the grant");
    late_reader.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_stops_waiting_lets_readers_go_at_once() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("give-up");
    let read = a.rw_lock(&name).read().acquire().await.unwrap();
    // A writer that gives up (its bound, then a cancelled wait) removes its record.
    let rw = b.rw_lock(&name);
    assert!(rw
        .write()
        .try_acquire_for(Duration::from_millis(400))
        .await
        .unwrap()
        .is_none());
    let cancelled = tokio::time::timeout(Duration::from_millis(400), rw.write().acquire()).await;
    assert!(cancelled.is_err());
    let start = Instant::now();
    let reader = a
        .rw_lock(&name)
        .read()
        .owner(Owner::new())
        .try_acquire_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("a new reader");
    // Well within the 1.5 s lease a forgotten record would hold readers back for.
    assert!(
        start.elapsed() < Duration::from_millis(1000),
        "{:?}",
        start.elapsed()
    );
    // A try without waiting never records itself.
    assert!(rw.write().try_acquire().await.unwrap().is_none());
    assert!(!server.exists(&format!("{}:writers", rw_key(&name))));
    drop((read, reader));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_cancelled_right_after_its_refusal_leaves_no_record() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("cancel-early");
    let read = a.rw_lock(&name).read().acquire().await.unwrap();
    let waiting = format!("{}:writers", rw_key(&name));
    for _ in 0..20 {
        let lock = b.rw_lock(&name).write().owner(Owner::new());
        let task = tokio::spawn(async move { lock.acquire().await });
        // Cancelled as soon as Redis has the record, likely before the refusal reached the writer.
        while !server.exists(&waiting) {
            tokio::task::yield_now().await;
        }
        task.abort();
        let _ = task.await;
        assert!(
            support::eventually(Duration::from_millis(500), || !server.exists(&waiting)).await,
            "a cancelled writer still holds readers back"
        );
    }
    let reader = a
        .rw_lock(&name)
        .read()
        .owner(Owner::new())
        .try_acquire()
        .await
        .unwrap();
    assert!(reader.is_some(), "a new reader was held back");
    drop((read, reader));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reader_has_a_lease_of_its_own() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let cut_off = client(&proxy.url()).await;
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("leases");
    let lost = cut_off.rw_lock(&name).read().acquire().await.unwrap();
    let kept = a.rw_lock(&name).read().acquire().await.unwrap();
    // Both kept across several leases by the watchdog.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(lost.is_held() && kept.is_held());
    // One reader cut off: its share runs out with its lease, and it is told; the other's stays.
    proxy.partition();
    tokio::time::timeout(Duration::from_secs(5), lost.lost())
        .await
        .expect("the cut-off reader was told");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(kept.is_held(), "one reader's loss cut another's lease");
    let writer = b.rw_lock(&name);
    assert!(
        writer.write().try_acquire().await.unwrap().is_none(),
        "a writer beside a live reader"
    );
    // The writer gets in as soon as the live reader leaves: the cut-off one no longer counts.
    let left = Instant::now();
    kept.release().await.unwrap();
    let w = writer
        .write()
        .try_acquire_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("writer");
    assert!(left.elapsed() < Duration::from_secs(2));
    w.release().await.unwrap();
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_waiting_writer_holds_readers_back_for_one_lease_at_most() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let writer = client(&proxy.url()).await;
    let reader = client(&server.url()).await;
    let name = unique_name("dead-waiter");
    let held = reader.rw_lock(&name).read().acquire().await.unwrap();
    let rw = writer.rw_lock(&name);
    let wait = tokio::spawn(async move { rw.write().acquire().await });
    let waiting = format!("{}:writers", rw_key(&name));
    assert!(support::eventually(Duration::from_secs(5), || server.exists(&waiting)).await);
    proxy.partition();
    let cut = Instant::now();
    let late = reader
        .rw_lock(&name)
        .read()
        .owner(Owner::new())
        .try_acquire_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("a reader once the dead waiter's record ran out");
    assert!(
        cut.elapsed() < Duration::from_millis(1500 + 1500),
        "{:?}",
        cut.elapsed()
    );
    wait.abort();
    drop((held, late));
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_keys_of_another_type_change_nothing() {
    let server = RedisServer::start();
    let c = client(&server.url()).await;
    for bad in ["", "a{b", "x}"] {
        let rw = c.rw_lock(bad);
        assert!(matches!(
            rw.read().try_acquire().await,
            Err(Error::InvalidName(_))
        ));
        assert!(matches!(rw.write().acquire().await, Err(Error::InvalidName(_))));
    }
    assert!(server.keys("relock:*").is_empty());
    let name = unique_name("typed");
    for key in [
        rw_key(&name),
        format!("{}:readers", rw_key(&name)),
        format!("{}:writers", rw_key(&name)),
    ] {
        server.cmd(&["SET", &key, "not a lock"]);
        let rw = c.rw_lock(&name);
        let read = rw.read().try_acquire().await;
        let write = rw.write().try_acquire_for(Duration::from_millis(500)).await;
        assert!(matches!(read, Err(Error::WrongType(_))), "{key}: {read:?}");
        assert!(matches!(write, Err(Error::WrongType(_))), "{key}: {write:?}");
        assert!(matches!(rw.force_unlock().await, Err(Error::WrongType(_))));
        assert_eq!(server.cmd(&["GET", &key]).as_str(), Some("not a lock"));
        server.cmd(&["DEL", &key]);
        assert!(server.keys(&format!("relock:{{{name}}}*")).is_empty(), "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_frees_writer_and_readers_and_tells_them() {
    let server = RedisServer::start();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let name = unique_name("force");
    let r1 = a.rw_lock(&name).read().acquire().await.unwrap();
    let r2 = b.rw_lock(&name).read().acquire().await.unwrap();
    assert!(b.rw_lock(&name).force_unlock().await.unwrap());
    for guard in [&r1, &r2] {
        tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .expect("told");
    }
    let w = b
        .rw_lock(&name)
        .write()
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(a.rw_lock(&name).force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(3), w.lost())
        .await
        .expect("writer told");
    assert!(!a.rw_lock(&name).force_unlock().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_masters_keeps_readers_and_writers_apart() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let name = unique_name("quorum");
    let inside = Arc::new(AtomicI64::new(0));
    let violations = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for c in 0..2 {
        let multi = MultiLock::connect(&urls, support::fast_config()).await.unwrap();
        for t in 0..3 {
            let rw = multi.rw_lock(&name);
            let (inside, violations) = (inside.clone(), violations.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..8 {
                    // Writers count -1000, readers +1: a writer must see 0, a reader no writer.
                    if (c + t + i) % 3 == 0 {
                        let g = rw.write().acquire().await.unwrap();
                        if inside.fetch_sub(1000, Ordering::SeqCst) != 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        inside.fetch_add(1000, Ordering::SeqCst);
                        g.release().await.unwrap();
                    } else {
                        let g = rw.read().acquire().await.unwrap();
                        if inside.fetch_add(1, Ordering::SeqCst) < 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        g.release().await.unwrap();
                    }
                }
            }));
        }
    }
    let all = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks)).await;
    assert!(all.is_ok(), "stuck");
    assert_eq!(violations.load(Ordering::SeqCst), 0);
}

#[derive(Debug, Clone)]
enum Step {
    /// Owner `o` (of four, over two clients) tries the read side, without waiting.
    Read(usize),
    /// Owner `o` tries the write side, without waiting.
    Write(usize),
    /// Owner `o` releases its latest read (false) or write (true) guard, if any.
    Release(usize, bool),
    /// Owner `o` drops every guard it has (in the background), as a crashed task would.
    DropAll(usize),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0..4usize).prop_map(Step::Read),
        3 => (0..4usize).prop_map(Step::Write),
        3 => (0..4usize, any::<bool>()).prop_map(|(o, w)| Step::Release(o, w)),
        1 => (0..4usize).prop_map(Step::DropAll),
    ]
}

/// The rules against a model, over random steps of four owners on two clients: a read is granted
/// iff the owner reads already or no other owner writes; a write iff the owner writes already, else
/// refused with `Upgrade` if it reads, else granted iff nobody else reads or writes; a write's
/// token rises above every earlier writer's.
#[test]
fn the_rw_lock_follows_its_model_under_random_steps() {
    use proptest::prelude::*;
    let rt = support::runtime();
    let server = RedisServer::start();
    let (clients, owners) = rt.block_on(async {
        let clients = vec![client(&server.url()).await, client(&server.url()).await];
        (clients, (0..4).map(|_| Owner::new()).collect::<Vec<_>>())
    });
    let config = ProptestConfig {
        cases: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let cases = std::sync::atomic::AtomicUsize::new(0);
    proptest!(config, |(steps in proptest::collection::vec(step(), 1..40))| {
        let name = format!("rw-model-{}-{}", std::process::id(), cases.fetch_add(1, Ordering::Relaxed));
        // Per owner: its read guards and its write guards.
        let mut reads: Vec<Vec<relock::LockGuard>> = (0..4).map(|_| Vec::new()).collect();
        let mut writes: Vec<Vec<relock::LockGuard>> = (0..4).map(|_| Vec::new()).collect();
        let mut last_token = 0;
        rt.block_on(async {
            for step in &steps {
                let rw = |o: usize| clients[o % 2].rw_lock(&name);
                match *step {
                    Step::Read(o) => {
                        let other_writer = (0..4).any(|p| p != o && !writes[p].is_empty());
                        let expect = !reads[o].is_empty() || !other_writer;
                        let got = rw(o).read().owner(owners[o].clone()).try_acquire().await.expect("read");
                        prop_assert_eq!(got.is_some(), expect, "{:?}", step);
                        reads[o].extend(got);
                    }
                    Step::Write(o) => {
                        let got = rw(o).write().owner(owners[o].clone()).try_acquire().await;
                        if !writes[o].is_empty() {
                            let guard = got.expect("re-entered").expect("granted");
                            prop_assert_eq!(guard.fencing_token().await.expect("token"), last_token);
                            writes[o].push(guard);
                        } else if !reads[o].is_empty() {
                            prop_assert!(matches!(got, Err(Error::Upgrade(_))), "{:?}: {:?}", step, got);
                        } else {
                            let busy = (0..4).any(|p| !reads[p].is_empty() || !writes[p].is_empty());
                            let got = got.expect("write");
                            prop_assert_eq!(got.is_some(), !busy, "{:?}", step);
                            if let Some(guard) = got {
                                let token = guard.fencing_token().await.expect("token");
                                prop_assert!(token > last_token);
                                last_token = token;
                                writes[o].push(guard);
                            }
                        }
                    }
                    Step::Release(o, write) => {
                        let mine = if write { &mut writes[o] } else { &mut reads[o] };
                        if let Some(guard) = mine.pop() {
                            guard.release().await.expect("release");
                        }
                    }
                    Step::DropAll(o) => {
                        reads[o].clear();
                        writes[o].clear();
                        // Released in the background: wait until Redis shows only what the
                        // others hold, so that the next step sees the model's state.
                        let (reading, writing) = (
                            reads.iter().any(|g| !g.is_empty()),
                            writes.iter().any(|g| !g.is_empty()),
                        );
                        let free = async {
                            while rw(o).read().is_locked().await.unwrap() != reading
                                || rw(o).write().is_locked().await.unwrap() != writing
                            {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                        };
                        tokio::time::timeout(Duration::from_secs(5), free).await.expect("released in the background");
                    }
                }
            }
            for guard in reads.iter_mut().chain(writes.iter_mut()).flat_map(|g| g.drain(..)) {
                guard.release().await.expect("release");
            }
            Ok(())
        })?;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_every_key_is_in_the_lock_slot_and_waiters_are_woken() {
    let cluster = tokio::task::spawn_blocking(|| support::topologies::RedisCluster::start(3, 0))
        .await
        .expect("cluster");
    let (a, b) = (client(&cluster.url()).await, client(&cluster.url()).await);
    let name = unique_name("cluster-rw");
    let read = a.rw_lock(&name).read().acquire().await.unwrap();
    let rw = b.rw_lock(&name);
    let writer = tokio::spawn(async move {
        let guard = rw.write().acquire().await.unwrap();
        (Instant::now(), guard)
    });
    let primary = cluster.primary_of(&rw_key(&name));
    let waiting = format!("{}:writers", rw_key(&name));
    assert!(support::eventually(Duration::from_secs(5), || primary.exists(&waiting)).await);
    // The reader's key, the readers' set and the waiting writer: all on the lock's primary.
    assert_eq!(
        primary.keys(&format!("relock:{{{name}}}:rw*")).len(),
        3,
        "{:?}",
        primary.keys("*")
    );
    let released = Instant::now();
    read.release().await.unwrap();
    // Woken by the sharded release message, well before any lease would have run out.
    let (granted, guard) = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        granted - released < Duration::from_millis(1000),
        "{:?}",
        granted - released
    );
    assert!(guard.fencing_token().await.unwrap() > 0);
    guard.release().await.unwrap();
}

/// A read guard dropped (released in the background) right before the same owner asks for the
/// write lock: the release is still on its way, which is not an upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_right_after_dropping_a_read_guard_is_no_upgrade() {
    let server = RedisServer::start();
    let c = client(&server.url()).await;
    let rw = c.rw_lock(&unique_name("drop-then-write"));
    for _ in 0..40 {
        let read = rw.read().acquire().await.unwrap();
        drop(read);
        let write = rw
            .write()
            .acquire()
            .await
            .expect("no upgrade: the read guard is gone");
        write.release().await.unwrap();
    }
}
