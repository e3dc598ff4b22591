//! The figures of the feature `metrics` through `metrics-exporter-prometheus`, set up as the
//! operating notes show: described (`# HELP`), registered at zero before any event, histograms with
//! buckets (so the PromQL on `_bucket` series works), every primitive under its `kind`.
//!
//! One test in its own binary: the recorder is global to the process.

mod support;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use relock::LockClient;
use support::{unique_name, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prometheus_exporter_shows_every_figure_with_help_and_buckets() {
    // As in docs/operating.md (there with `.install()`, which also serves `/metrics`).
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_string()),
            &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0],
        )
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");

    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.expect("connect");
    // Before any event: described, and the series an alert watches are there at zero.
    let text = handle.render();
    for line in [
        "# HELP relock_locks_lost_total",
        "# TYPE relock_locks_lost_total counter",
        "relock_locks_lost_total{kind=\"lock\"} 0",
        "relock_locks_lost_total{kind=\"semaphore\"} 0",
        "relock_renewal_failures_total 0",
        "relock_waiters{kind=\"fair\"} 0",
        "relock_held_locks{kind=\"lock\"} 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }

    let guard = client.lock(&unique_name("p")).acquire().await.expect("acquire");
    guard.release().await.expect("release");
    let permit = client
        .semaphore(&unique_name("s"), 2)
        .acquire(1)
        .await
        .expect("permit");
    permit.release().await.expect("release the permit");
    let text = handle.render();
    for line in [
        "# TYPE relock_acquire_wait_seconds histogram",
        "# HELP relock_acquire_wait_seconds",
        "relock_acquire_wait_seconds_bucket{outcome=\"granted\",kind=\"lock\",le=\"0.005\"}",
        "relock_acquisitions_total{outcome=\"granted\",kind=\"lock\"} 1",
        "relock_acquisitions_total{outcome=\"granted\",kind=\"semaphore\"} 1",
        "relock_hold_seconds_bucket{end=\"released\",kind=\"lock\",le=\"1\"}",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    client.shutdown().await;
}
