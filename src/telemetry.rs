//! What relock reports about itself beyond its `tracing` events: the figures of the feature
//! `metrics`, through the [`metrics`](https://docs.rs/metrics) facade. They cost nothing until the
//! application installs a recorder (Prometheus, StatsD, ...), and without the feature every function
//! here is empty.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `relock_acquisitions_total` | counter | `outcome`, `lock`* | acquire calls by outcome: `granted`, `refused`, `timeout`, `error`, `cancelled` |
//! | `relock_acquire_wait_seconds` | histogram | `outcome`, `lock`* | from the call to its outcome |
//! | `relock_hold_seconds` | histogram | `end`, `lock`* | from a fresh grant to the release (`end="released"`) or the loss (`end="lost"`) of that possession |
//! | `relock_releases_total` | counter | `lock`* | possessions given back (the last guard went, or the client shut down) |
//! | `relock_locks_lost_total` | counter | `lock`* | possessions lost (lease ran out, renewal found the lock gone, force-unlock) |
//! | `relock_renewals_total` | counter | | watchdog renewals that a majority confirmed |
//! | `relock_renewal_failures_total` | counter | | renewals that a majority did not confirm (retried next round, or the lock is lost) |
//! | `relock_waiters` | gauge | `lock`* | acquisitions waiting for a release now |
//! | `relock_held_locks` | gauge | `lock`* | possessions held now |
//! | `relock_batch_size` | histogram | | acquisitions and releases sent in one call (coalescing) |
//! | `relock_redis_calls_total` | counter | `script` | script calls sent to Redis (one request each; calls sent together share a round trip); `script="release"`: the requests of a plain lock's release sent alone without a script (an `HDEL`, and a `PUBLISH` where a waiter marked the hold) |
//!
//! \* `lock` (the lock's name) is a label only when the client was configured with
//! [`LockConfig::metrics_lock_names`](crate::LockConfig::metrics_lock_names): names can be
//! unbounded, and every distinct label value is a new series in the recorder.

use fred::bytes_utils::Str;

/// The `lock` label of a lock's figures: its name where the client opted in, else none.
pub(crate) type Label = Option<Str>;

/// The label for `name` under a client's configuration.
pub(crate) fn label(name: &Str, names_in_metrics: bool) -> Label {
    names_in_metrics.then(|| name.clone())
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
    use super::{End, Label, Outcome};
    use metrics::{counter, gauge, histogram};
    use std::time::Duration;

    // Label values given as literals make a static key: the figures of a client with no recorder
    // (and without the opt-in `lock` label) allocate nothing. A value in a variable would build
    // the key's label list on every call, recorder or not.
    macro_rules! with_lock {
        ($macro:ident, $name:literal, $label:expr $(, $k:literal => $v:literal)*) => {
            match $label {
                Some(lock) => $macro!($name $(, $k => $v)*, "lock" => lock.to_string()),
                None => $macro!($name $(, $k => $v)*),
            }
        };
    }

    pub(crate) fn acquisition(label: &Label, outcome: Outcome, waited: Duration) {
        macro_rules! record {
            ($outcome:literal) => {{
                with_lock!(counter, "relock_acquisitions_total", label, "outcome" => $outcome).increment(1);
                with_lock!(histogram, "relock_acquire_wait_seconds", label, "outcome" => $outcome)
                    .record(waited.as_secs_f64());
            }};
        }
        match outcome {
            Outcome::Granted => record!("granted"),
            Outcome::Refused => record!("refused"),
            Outcome::Timeout => record!("timeout"),
            Outcome::Error => record!("error"),
            Outcome::Cancelled => record!("cancelled"),
        }
    }

    pub(crate) fn waiters(label: &Label, delta: f64) {
        with_lock!(gauge, "relock_waiters", label).increment(delta);
    }

    pub(crate) fn hold_started(label: &Label) {
        with_lock!(gauge, "relock_held_locks", label).increment(1.0);
    }

    pub(crate) fn hold_ended(label: &Label, end: End, held: Duration) {
        with_lock!(gauge, "relock_held_locks", label).decrement(1.0);
        let held = held.as_secs_f64();
        match end {
            End::Released => {
                with_lock!(histogram, "relock_hold_seconds", label, "end" => "released").record(held);
                with_lock!(counter, "relock_releases_total", label).increment(1);
            }
            End::Lost => {
                with_lock!(histogram, "relock_hold_seconds", label, "end" => "lost").record(held);
                with_lock!(counter, "relock_locks_lost_total", label).increment(1);
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
        // The common scripts by literal (see `with_lock!`), the rest as they come.
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
}

pub(crate) use imp::{batch, hold_ended, hold_started, redis_call, renewals};

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
