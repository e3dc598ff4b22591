//! The figures of the feature `metrics`, read through a debugging recorder after a scripted run on a
//! real server: three acquisitions granted, one of them after a wait, one refused, and one lock lost.
//!
//! One test in its own binary: the recorder is global to the process.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use relock::{LockClient, LockConfig};
use support::{eventually, unique_name, RedisServer};
use tokio::time::Instant;

/// Every figure seen so far, summed over snapshots: a snapshot drains counters and histograms and
/// resets gauges, and relock only moves its gauges up and down, so their sum is their value. Keyed by name and sorted labels, `name{k=v,...}`.
#[derive(Default)]
struct Figures {
    counters: HashMap<String, u64>,
    gauges: HashMap<String, f64>,
    histograms: HashMap<String, Vec<f64>>,
}

impl Figures {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let id = format!("{}{{{}}}", key.name(), labels.join(","));
            match value {
                DebugValue::Counter(n) => *self.counters.entry(id).or_default() += n,
                DebugValue::Gauge(g) => *self.gauges.entry(id).or_default() += g.0,
                DebugValue::Histogram(h) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(h.iter().map(|v| v.0)),
            }
        }
    }

    fn counter(&self, id: &str) -> u64 {
        self.counters.get(id).copied().unwrap_or(0)
    }

    fn gauge(&self, id: &str) -> f64 {
        self.gauges.get(id).copied().unwrap_or(0.0)
    }

    fn histogram(&self, id: &str) -> &[f64] {
        self.histograms.get(id).map_or(&[], Vec::as_slice)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_run_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this test binary");
    let mut figures = Figures::default();

    let server = RedisServer::start();
    let config = LockConfig::default()
        .watchdog_timeout(Duration::from_millis(1500))
        .renew_interval(Duration::from_millis(300))
        .metrics_lock_names(true);
    let client = LockClient::connect_with(&server.url(), config.clone())
        .await
        .expect("connect");
    let other = LockClient::connect_with(&server.url(), config)
        .await
        .expect("connect");
    let (a, b, c) = (unique_name("a"), unique_name("b"), unique_name("c"));
    let label = |name: &str, extra: &str| {
        let mut labels = vec![format!("lock={name}"), "kind=lock".to_string()];
        if !extra.is_empty() {
            labels.push(extra.to_string());
        }
        labels.sort();
        labels.join(",")
    };

    // 1. Granted at once, held ~100 ms, released.
    let guard = client.lock(&a).acquire().await.expect("a");
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.expect("release a");

    // 2. Held by `other`; a second owner waits for it, counted as a waiter meanwhile; one more
    //    try is refused.
    let held = other.lock(&b).acquire().await.expect("b");
    let waiter = tokio::spawn({
        let lock = client.lock(&b);
        async move {
            let start = Instant::now();
            let guard = lock.acquire().await.expect("b after the wait");
            let waited = start.elapsed();
            guard.release().await.expect("release b");
            waited
        }
    });
    let waiters = format!("relock_waiters{{{}}}", label(&b, ""));
    let seen_waiting = {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            figures.take(&snapshotter);
            if figures.gauge(&waiters) == 1.0 || Instant::now() > deadline {
                break figures.gauge(&waiters) == 1.0;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert!(seen_waiting, "the waiter was never counted in {waiters}");
    let refused = tokio::spawn({
        let lock = client.lock(&b);
        async move { lock.try_acquire().await }
    });
    assert!(refused.await.unwrap().expect("try").is_none());
    // Held across two watchdog rounds at least.
    tokio::time::sleep(Duration::from_millis(700)).await;
    drop(held);
    let waited = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter got the lock")
        .unwrap();
    assert!(waited >= Duration::from_millis(250), "waited only {waited:?}");

    // 3. Granted, then removed behind the holder's back: lost at the next renewal.
    let guard = client.lock(&c).acquire().await.expect("c");
    assert!(other.lock(&c).force_unlock().await.expect("force"));
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss was noticed");
    drop(guard);

    client.shutdown().await;
    other.shutdown().await;
    // The last gauge updates (the releases from drops) land within the shutdown.
    assert!(
        eventually(Duration::from_secs(5), || {
            figures.take(&snapshotter);
            [&a, &b, &c]
                .iter()
                .all(|n| figures.gauge(&format!("relock_held_locks{{{}}}", label(n, ""))) == 0.0)
        })
        .await,
        "held-locks gauges did not return to 0: {:?}",
        figures.gauges
    );

    let acquisitions = |name: &str, outcome: &str| {
        figures.counter(&format!(
            "relock_acquisitions_total{{{}}}",
            label(name, &format!("outcome={outcome}"))
        ))
    };
    assert_eq!(acquisitions(&a, "granted"), 1);
    assert_eq!(acquisitions(&b, "granted"), 2, "the holder and the waiter");
    assert_eq!(acquisitions(&b, "refused"), 1);
    assert_eq!(acquisitions(&c, "granted"), 1);
    let waits = figures.histogram(&format!(
        "relock_acquire_wait_seconds{{{}}}",
        label(&b, "outcome=granted")
    ));
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert!(
        waits.iter().any(|w| *w >= 0.25),
        "the waiter's wait is missing: {waits:?}"
    );
    assert_eq!(figures.gauge(&waiters), 0.0, "the waiter left the gauge");

    assert_eq!(
        figures.counter(&format!("relock_releases_total{{{}}}", label(&a, ""))),
        1
    );
    assert_eq!(
        figures.counter(&format!("relock_releases_total{{{}}}", label(&b, ""))),
        2
    );
    assert_eq!(
        figures.counter(&format!("relock_locks_lost_total{{{}}}", label(&c, ""))),
        1
    );
    assert_eq!(
        figures.counter(&format!("relock_releases_total{{{}}}", label(&c, ""))),
        0
    );
    let held_a = figures.histogram(&format!("relock_hold_seconds{{{}}}", label(&a, "end=released")));
    assert!(held_a.len() == 1 && held_a[0] >= 0.09, "{held_a:?}");
    assert_eq!(
        figures
            .histogram(&format!("relock_hold_seconds{{{}}}", label(&c, "end=lost")))
            .len(),
        1
    );

    // The watchdog renewed `b` and `c` while they were held, and failed once on `c`.
    assert!(
        figures.counter("relock_renewals_total{}") >= 1,
        "{:?}",
        figures.counters
    );
    assert!(
        figures.counter("relock_renewal_failures_total{}") >= 1,
        "{:?}",
        figures.counters
    );
    let batches = figures.histogram("relock_batch_size{}");
    assert!(
        !batches.is_empty() && batches.iter().all(|b| *b >= 1.0),
        "{batches:?}"
    );
    // Every acquisition and release above is at least one call: of the batch script, or a
    // release's `HDEL` without a script.
    assert!(
        figures.counter("relock_redis_calls_total{script=batch}")
            + figures.counter("relock_redis_calls_total{script=release}")
            >= 8,
        "{:?}",
        figures.counters
    );
    assert!(
        figures.counter("relock_redis_calls_total{script=release}") >= 1,
        "{:?}",
        figures.counters
    );

    // Registered at zero when the clients started, for every kind: an alert has a series to watch.
    for kind in ["lock", "fair", "read", "write", "semaphore"] {
        for series in [
            format!("relock_locks_lost_total{{kind={kind}}}"),
            format!("relock_acquisitions_total{{kind={kind},outcome=granted}}"),
        ] {
            assert!(
                figures.counters.contains_key(&series),
                "{series} not registered: {:?}",
                figures.counters.keys()
            );
        }
        assert!(figures
            .gauges
            .contains_key(&format!("relock_waiters{{kind={kind}}}")));
    }

    // A semaphore's acquisitions count too, by their kind.
    let d = unique_name("d");
    let client = LockClient::connect_with(&server.url(), LockConfig::default().metrics_lock_names(true))
        .await
        .expect("connect");
    let permit = client.semaphore(&d, 1).acquire(1).await.expect("permit");
    assert!(client
        .semaphore(&d, 1)
        .try_acquire(1)
        .await
        .expect("try")
        .is_none());
    permit.release().await.expect("release the permit");
    figures.take(&snapshotter);
    let semaphore = |outcome: &str| {
        figures.counter(&format!(
            "relock_acquisitions_total{{kind=semaphore,lock={d},outcome={outcome}}}"
        ))
    };
    assert_eq!(
        (semaphore("granted"), semaphore("refused")),
        (1, 1),
        "{:?}",
        figures.counters
    );
}
