//! How long an acquisition may wait, and the rules every waiting loop (a lock's, a semaphore's)
//! applies to it: when a refusal ends the call, and what a wait that ran out during an attempt
//! returns.

use std::time::Duration;

use tokio::time::Instant;

use crate::Error;

pub(crate) enum Wait {
    /// One attempt.
    Once,
    /// Until the instant; the wait asked for, for the error.
    Until(Instant, Duration),
    Forever,
}

impl Wait {
    /// A wait of `wait` from now; too long a wait is bad input.
    pub(crate) fn up_to(wait: Duration) -> Result<Wait, Error> {
        let until = deadline(wait)?;
        Ok(Wait::Until(until, wait))
    }

    /// Its name, the `mode` field of the `acquire` span.
    pub(crate) fn mode(&self) -> &'static str {
        match self {
            Wait::Once => "try",
            Wait::Until(..) => "try_for",
            Wait::Forever => "wait",
        }
    }

    /// The caller's bound, if any.
    pub(crate) fn until(&self) -> Option<Instant> {
        match self {
            Wait::Until(until, _) => Some(*until),
            Wait::Once | Wait::Forever => None,
        }
    }

    /// Whether a refusal ends the call (one attempt, or the bound has passed).
    pub(crate) fn over(&self) -> bool {
        match self {
            Wait::Once => true,
            Wait::Until(until, _) => Instant::now() >= *until,
            Wait::Forever => false,
        }
    }

    /// Whether an attempt's `Timeout` came because the caller's bound ran out (the attempt was
    /// abandoned and is undone in the background), rather than from the servers.
    pub(crate) fn ran_out(&self) -> bool {
        self.until().is_some_and(|until| Instant::now() >= until)
    }

    /// The result of a call whose bound ran out during an attempt: refused (`None`) if some attempt
    /// was answered, else `Timeout` of the wait asked for.
    pub(crate) fn ran_out_result<T>(&self, answered: bool) -> Result<Option<T>, Error> {
        match self {
            Wait::Until(_, asked) if !answered => Err(Error::Timeout(*asked)),
            _ => Ok(None),
        }
    }

    /// `at`, or the caller's bound if sooner.
    pub(crate) fn wake_at_instant(&self, at: Instant) -> Instant {
        self.until().map_or(at, |until| at.min(until))
    }

    /// When a waiter sleeping `delay` must wake: then, or at the caller's bound if sooner.
    pub(crate) fn wake_at(&self, delay: Duration) -> Instant {
        self.wake_at_instant(Instant::now() + delay)
    }
}

/// The first pause after a transient error, and the longest (each pause doubles, jittered).
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// A waiting loop's transient errors (see [`Error::is_transient`]): the loop tries again after a
/// pause until its bound, and returns the last error only then. A wait without a bound of the
/// caller's rides through errors in a row for `patience` (a lease: a failover or restart shorter
/// than that goes unnoticed), and through a restart quarantine to its end, which is known.
pub(crate) struct Retries {
    /// Since when attempts fail one after another (a quarantine aside).
    failing_since: Option<Instant>,
    pause: Duration,
    last: Option<Error>,
}

impl Retries {
    pub(crate) fn new() -> Retries {
        Retries {
            failing_since: None,
            pause: FIRST_PAUSE,
            last: None,
        }
    }

    /// An attempt was answered: the next error starts a new run of them.
    pub(crate) fn answered(&mut self) {
        self.failing_since = None;
        self.pause = FIRST_PAUSE;
        self.last = None;
    }

    /// After an attempt failed with `err`: when to try again, or `Err` to end the call with (one
    /// attempt, an error that will not go away by waiting, the bound passed, or `patience` spent).
    pub(crate) fn after(&mut self, wait: &Wait, err: Error, patience: Duration) -> Result<Instant, Error> {
        if matches!(wait, Wait::Once) || !err.is_transient() {
            return Err(err);
        }
        let now = Instant::now();
        let at = match &err {
            Error::Quarantine { ends_in, .. } => now + (*ends_in).max(FIRST_PAUSE),
            _ => {
                let since = *self.failing_since.get_or_insert(now);
                if matches!(wait, Wait::Forever) && now.duration_since(since) >= patience {
                    return Err(err);
                }
                let at = now + crate::engine::quorum::jitter(self.pause);
                self.pause = (self.pause * 2).min(LONGEST_PAUSE);
                // The last try of a wait without a bound comes at the end of its patience, not
                // a pause after it: `acquire` fails within patience and two attempts' bounds.
                match wait {
                    Wait::Forever => at.min(since + patience),
                    _ => at,
                }
            }
        };
        tracing::debug!(%err, pause = ?at - now, "attempt failed; trying again");
        let at = match wait.until() {
            Some(until) if now >= until => return Err(err),
            Some(until) => at.min(until),
            None => at,
        };
        self.last = Some(err);
        Ok(at)
    }

    /// What a call whose bound ran out during an attempt returns: the last attempt's error if one
    /// failed since the last answer, else as [`Wait::ran_out_result`].
    pub(crate) fn ran_out_result<T>(&mut self, wait: &Wait, answered: bool) -> Result<Option<T>, Error> {
        match self.last.take() {
            Some(err) => Err(err),
            None => wait.ran_out_result(answered),
        }
    }

    /// After an attempt failed with `err`: sleeps until the next try ([`after`](Retries::after)),
    /// or ends the call with an error: `err` at once, the last error if the caller's bound passed
    /// meanwhile, or [`Error::Shutdown`] if `core` was shut down.
    pub(crate) async fn pause(
        &mut self,
        wait: &Wait,
        err: Error,
        patience: Duration,
        core: &crate::engine::core::Core,
    ) -> Result<(), Error> {
        let at = self.after(wait, err, patience)?;
        tokio::time::sleep_until(at).await;
        if wait.ran_out() {
            if let Some(err) = self.last.take() {
                return Err(err);
            }
        }
        if core.is_closed() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }
}

/// The instant `wait` from now; too long a wait is bad input.
pub(crate) fn deadline(wait: Duration) -> Result<Instant, Error> {
    Instant::now()
        .checked_add(wait)
        .ok_or_else(|| Error::InvalidDuration(format!("wait of {wait:?} is too long")))
}
