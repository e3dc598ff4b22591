//! What relock reports about itself beyond its `tracing` events: the figures of the feature
//! `metrics`, through the [`metrics`](https://docs.rs/metrics) facade. They cost nothing until the
//! application installs a recorder (Prometheus, StatsD, ...), and without the feature every function
//! here is empty.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `relock_acquisitions_total` | counter | `outcome`, `kind`, `lock`* | acquire calls by outcome: `granted`, `refused`, `timeout`, `error`, `cancelled` |
//! | `relock_acquire_wait_seconds` | histogram | `outcome`, `kind`, `lock`* | from the call to its outcome |
//! | `relock_hold_seconds` | histogram | `end`, `kind`, `lock`* | from a fresh grant to the release (`end="released"`) or the loss (`end="lost"`) of that possession |
//! | `relock_releases_total` | counter | `kind`, `lock`* | possessions given back (the last guard went, or the client shut down) |
//! | `relock_locks_lost_total` | counter | `kind`, `lock`* | possessions lost (lease ran out, renewal found the lock gone, force-unlock) |
//! | `relock_renewals_total` | counter | | watchdog renewals that a majority confirmed |
//! | `relock_renewal_failures_total` | counter | | renewals that a majority did not confirm (retried next round, or the lock is lost) |
//! | `relock_waiters` | gauge | `kind`, `lock`* | acquisitions waiting for a release now |
//! | `relock_held_locks` | gauge | `kind`, `lock`* | possessions held now |
//! | `relock_batch_size` | histogram | | acquisitions and releases sent in one call (coalescing) |
//! | `relock_redis_calls_total` | counter | `script` | script calls sent to Redis (one request each; calls sent together share a round trip); `script="release"`: the requests of a plain lock's release sent alone without a script (an `HDEL`, and a `PUBLISH` where a waiter marked the hold) |
//!
//! \* `lock` (the lock's name) is a label only when the client was configured with
//! [`LockConfig::metrics_lock_names`](crate::LockConfig::metrics_lock_names): names can be
//! unbounded, and every distinct label value is a new series in the recorder.
//!
//! `kind` is the primitive: `lock` (a plain lock), `fair`, `read` and `write` (the sides of a
//! read-write lock), `semaphore`. Every figure is described (unit and help text) when a client
//! starts, and the counters and gauges without a `lock` label are registered at zero then, so
//! that an alert on them has a series before the first event. Install the recorder before
//! connecting.

use fred::bytes_utils::Str;

/// The primitive a figure is about: its `kind` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prim {
    Lock,
    Fair,
    Read,
    Write,
    Semaphore,
}

impl Prim {
    /// Every kind, for the figures registered at zero.
    #[cfg(feature = "metrics")]
    const ALL: [Prim; 5] = [Prim::Lock, Prim::Fair, Prim::Read, Prim::Write, Prim::Semaphore];
}

/// The labels of a lock's figures: its kind, and its name where the client opted in.
#[derive(Debug, Clone)]
// Read only by the figures of feature `metrics`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Label {
    pub(crate) kind: Prim,
    pub(crate) lock: Option<Str>,
}

/// The labels for a primitive `kind` named `name` under a client's configuration.
pub(crate) fn label(kind: Prim, name: &Str, names_in_metrics: bool) -> Label {
    Label {
        kind,
        lock: names_in_metrics.then(|| name.clone()),
    }
}

/// How an acquire call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Granted,
    Refused,
    Timeout,
    Error,
    /// The caller dropped the future first.
    Cancelled,
}

impl Outcome {
    /// How an acquire call that returned `result` ended.
    pub(crate) fn of<T>(result: &Result<Option<T>, crate::Error>) -> Outcome {
        match result {
            Ok(Some(_)) => Outcome::Granted,
            Ok(None) => Outcome::Refused,
            Err(crate::Error::Timeout(_)) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Refused => "refused",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// How a possession ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Released,
    Lost,
}

#[cfg(feature = "metrics")]
mod imp {
    use super::{End, Label, Outcome, Prim};
    use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};
    use std::time::Duration;

    // Label values given as literals make a static key: the figures of a client with no recorder
    // (and without the opt-in `lock` label) allocate nothing. A value in a variable would build
    // the key's label list on every call, recorder or not.
    macro_rules! with_labels {
        ($macro:ident, $name:literal, $label:expr $(, $k:literal => $v:literal)*) => {
            match ($label.kind, &$label.lock) {
                (Prim::Lock, None) => $macro!($name $(, $k => $v)*, "kind" => "lock"),
                (Prim::Fair, None) => $macro!($name $(, $k => $v)*, "kind" => "fair"),
                (Prim::Read, None) => $macro!($name $(, $k => $v)*, "kind" => "read"),
                (Prim::Write, None) => $macro!($name $(, $k => $v)*, "kind" => "write"),
                (Prim::Semaphore, None) => $macro!($name $(, $k => $v)*, "kind" => "semaphore"),
                (Prim::Lock, Some(l)) => $macro!($name $(, $k => $v)*, "kind" => "lock", "lock" => l.to_string()),
                (Prim::Fair, Some(l)) => $macro!($name $(, $k => $v)*, "kind" => "fair", "lock" => l.to_string()),
                (Prim::Read, Some(l)) => $macro!($name $(, $k => $v)*, "kind" => "read", "lock" => l.to_string()),
                (Prim::Write, Some(l)) => $macro!($name $(, $k => $v)*, "kind" => "write", "lock" => l.to_string()),
                (Prim::Semaphore, Some(l)) => {
                    $macro!($name $(, $k => $v)*, "kind" => "semaphore", "lock" => l.to_string())
                }
            }
        };
    }

    /// Describes every figure, and registers at zero those without a `lock` label (see the module's
    /// header). Cheap, and harmless to repeat: every client does it when it starts.
    pub(crate) fn register() {
        describe_counter!(
            "relock_acquisitions_total",
            Unit::Count,
            "Acquire calls, by outcome (granted, refused, timeout, error, cancelled) and kind"
        );
        describe_histogram!(
            "relock_acquire_wait_seconds",
            Unit::Seconds,
            "Time from an acquire call to its outcome"
        );
        describe_histogram!(
            "relock_hold_seconds",
            Unit::Seconds,
            "Time a lock was held, from a fresh grant to its release (end=released) or loss (end=lost)"
        );
        describe_counter!(
            "relock_releases_total",
            Unit::Count,
            "Possessions given back (the last guard went, or the client shut down)"
        );
        describe_counter!(
            "relock_locks_lost_total",
            Unit::Count,
            "Possessions lost: the lease ran out, a renewal found the lock gone, or it was force-unlocked"
        );
        describe_counter!(
            "relock_renewals_total",
            Unit::Count,
            "Watchdog renewals that a majority confirmed"
        );
        describe_counter!(
            "relock_renewal_failures_total",
            Unit::Count,
            "Watchdog renewals that a majority did not confirm (retried next round, or the lock is lost)"
        );
        describe_gauge!(
            "relock_waiters",
            Unit::Count,
            "Acquire calls waiting for a release now"
        );
        describe_gauge!("relock_held_locks", Unit::Count, "Possessions held now");
        describe_histogram!(
            "relock_batch_size",
            Unit::Count,
            "Acquisitions and releases sent in one script call (coalescing)"
        );
        describe_counter!(
            "relock_redis_calls_total",
            Unit::Count,
            "Requests sent to Redis, by script"
        );
        counter!("relock_renewals_total").increment(0);
        counter!("relock_renewal_failures_total").increment(0);
        for kind in Prim::ALL {
            let label = Label { kind, lock: None };
            for outcome in [
                Outcome::Granted,
                Outcome::Refused,
                Outcome::Timeout,
                Outcome::Error,
                Outcome::Cancelled,
            ] {
                acquisition_counter(&label, outcome).increment(0);
            }
            with_labels!(counter, "relock_releases_total", label).increment(0);
            with_labels!(counter, "relock_locks_lost_total", label).increment(0);
            with_labels!(gauge, "relock_waiters", label).increment(0.0);
            with_labels!(gauge, "relock_held_locks", label).increment(0.0);
        }
    }

    fn acquisition_counter(label: &Label, outcome: Outcome) -> metrics::Counter {
        match outcome {
            Outcome::Granted => {
                with_labels!(counter, "relock_acquisitions_total", label, "outcome" => "granted")
            }
            Outcome::Refused => {
                with_labels!(counter, "relock_acquisitions_total", label, "outcome" => "refused")
            }
            Outcome::Timeout => {
                with_labels!(counter, "relock_acquisitions_total", label, "outcome" => "timeout")
            }
            Outcome::Error => with_labels!(counter, "relock_acquisitions_total", label, "outcome" => "error"),
            Outcome::Cancelled => {
                with_labels!(counter, "relock_acquisitions_total", label, "outcome" => "cancelled")
            }
        }
    }

    pub(crate) fn acquisition(label: &Label, outcome: Outcome, waited: Duration) {
        acquisition_counter(label, outcome).increment(1);
        let wait = match outcome {
            Outcome::Granted => {
                with_labels!(histogram, "relock_acquire_wait_seconds", label, "outcome" => "granted")
            }
            Outcome::Refused => {
                with_labels!(histogram, "relock_acquire_wait_seconds", label, "outcome" => "refused")
            }
            Outcome::Timeout => {
                with_labels!(histogram, "relock_acquire_wait_seconds", label, "outcome" => "timeout")
            }
            Outcome::Error => {
                with_labels!(histogram, "relock_acquire_wait_seconds", label, "outcome" => "error")
            }
            Outcome::Cancelled => {
                with_labels!(histogram, "relock_acquire_wait_seconds", label, "outcome" => "cancelled")
            }
        };
        wait.record(waited.as_secs_f64());
    }

    pub(crate) fn waiters(label: &Label, delta: f64) {
        with_labels!(gauge, "relock_waiters", label).increment(delta);
    }

    pub(crate) fn hold_started(label: &Label) {
        with_labels!(gauge, "relock_held_locks", label).increment(1.0);
    }

    pub(crate) fn hold_ended(label: &Label, end: End, held: Duration) {
        with_labels!(gauge, "relock_held_locks", label).decrement(1.0);
        let held = held.as_secs_f64();
        match end {
            End::Released => {
                with_labels!(histogram, "relock_hold_seconds", label, "end" => "released").record(held);
                with_labels!(counter, "relock_releases_total", label).increment(1);
            }
            End::Lost => {
                with_labels!(histogram, "relock_hold_seconds", label, "end" => "lost").record(held);
                with_labels!(counter, "relock_locks_lost_total", label).increment(1);
            }
        }
    }

    pub(crate) fn renewals(confirmed: u64, failed: u64) {
        counter!("relock_renewals_total").increment(confirmed);
        counter!("relock_renewal_failures_total").increment(failed);
    }

    pub(crate) fn batch(size: usize) {
        histogram!("relock_batch_size").record(size as f64);
    }

    pub(crate) fn redis_call(script: &'static str) {
        // The common scripts by literal (see `with_labels!`), the rest as they come.
        match script {
            "batch" => counter!("relock_redis_calls_total", "script" => "batch").increment(1),
            "renew" => counter!("relock_redis_calls_total", "script" => "renew").increment(1),
            "release" => counter!("relock_redis_calls_total", "script" => "release").increment(1),
            other => counter!("relock_redis_calls_total", "script" => other).increment(1),
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use super::{End, Label, Outcome};
    use std::time::Duration;

    #[inline(always)]
    pub(crate) fn acquisition(_: &Label, _: Outcome, _: Duration) {}
    #[inline(always)]
    pub(crate) fn waiters(_: &Label, _: f64) {}
    #[inline(always)]
    pub(crate) fn hold_started(_: &Label) {}
    #[inline(always)]
    pub(crate) fn hold_ended(_: &Label, _: End, _: Duration) {}
    #[inline(always)]
    pub(crate) fn renewals(_: u64, _: u64) {}
    #[inline(always)]
    pub(crate) fn batch(_: usize) {}
    #[inline(always)]
    pub(crate) fn redis_call(_: &'static str) {}
    #[inline(always)]
    pub(crate) fn register() {}
}

pub(crate) use imp::{batch, hold_ended, hold_started, redis_call, register, renewals};

/// A waiter counted in `relock_waiters` while it lives.
pub(crate) struct Waiting(Label);

impl Waiting {
    pub(crate) fn start(label: &Label) -> Waiting {
        imp::waiters(label, 1.0);
        Waiting(label.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        imp::waiters(&self.0, -1.0);
    }
}

/// The wait of one acquire call, from its start: reported once, with its outcome, or as
/// `cancelled` if the call is dropped first, both to the figures and to the call's `acquire` span
/// (`waited_us`, `outcome`, and `token` when granted).
pub(crate) struct AcquireReport {
    label: Label,
    span: tracing::Span,
    started: tokio::time::Instant,
    outcome: Option<(Outcome, Option<u64>)>,
}

impl AcquireReport {
    pub(crate) fn start(label: Label, span: tracing::Span) -> AcquireReport {
        AcquireReport {
            label,
            span,
            started: tokio::time::Instant::now(),
            outcome: None,
        }
    }

    /// The `lock` label of the call's figures.
    pub(crate) fn label(&self) -> &Label {
        &self.label
    }

    /// The call ended with `outcome` (and the fencing `token` of a grant).
    pub(crate) fn finish(mut self, outcome: Outcome, token: Option<u64>) {
        self.outcome = Some((outcome, token));
    }
}

impl Drop for AcquireReport {
    fn drop(&mut self) {
        let (outcome, token) = self.outcome.unwrap_or((Outcome::Cancelled, None));
        let waited = self.started.elapsed();
        imp::acquisition(&self.label, outcome, waited);
        if !self.span.is_disabled() {
            let waited_us = waited.as_micros().min(u64::MAX as u128) as u64;
            self.span.record("waited_us", waited_us);
            self.span.record("outcome", outcome.name());
            if let Some(token) = token {
                self.span.record("token", token);
            }
        }
    }
}
