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

    /// When a waiter sleeping `delay` must wake: then, or at the caller's bound if sooner.
    pub(crate) fn wake_at(&self, delay: Duration) -> Instant {
        let wake_at = Instant::now() + delay;
        self.until().map_or(wake_at, |until| wake_at.min(until))
    }
}

/// The instant `wait` from now; too long a wait is bad input.
pub(crate) fn deadline(wait: Duration) -> Result<Instant, Error> {
    Instant::now()
        .checked_add(wait)
        .ok_or_else(|| Error::InvalidDuration(format!("wait of {wait:?} is too long")))
}
