//! Check (c) for guarded writes (`LockGuard::atomically`): a write Redis applied must have landed
//! inside its holder's hold. A holder's hold ends, in Redis, before the next holder's grant; so a
//! write that was sent only after a later holder (a larger token) had been granted the same lock,
//! and that Redis still applied, landed outside its hold. Writes sent in a window after a fault
//! outside the guarantees (a Redis that lost its data) are counted apart.

use std::fmt;

use crate::history::{Event, Harness, Kind, Report};

/// What the guarded writes of a run came to.
#[derive(Debug, Default, Clone)]
pub struct GuardedReport {
    pub applied: u64,
    /// Refused by Redis (or before sending): the hold was no longer current.
    pub refused: u64,
    /// Applied, though sent after a later holder's grant: must be zero.
    pub outside: u64,
    /// The same, sent in a window after a fault outside the guarantees.
    pub outside_unprotected: u64,
}

impl fmt::Display for GuardedReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "guarded writes applied {} (refused {}), applied outside their hold {} (+{} after faults outside the guarantees)",
            self.applied, self.refused, self.outside, self.outside_unprotected
        )
    }
}

/// Judges every guarded write of `locks` (the lock workload's events).
pub fn check(locks: &[Event], harness: &Harness, report: &mut Report) {
    // Per item, every grant with a token: (token, when the holder had it).
    let mut grants: std::collections::HashMap<u32, Vec<(u64, u64)>> = Default::default();
    for ev in locks {
        if let Kind::Grant { token, .. } = ev.kind {
            if token > 0 {
                grants.entry(ev.item).or_default().push((token, ev.t));
            }
        }
    }
    for ev in locks {
        let Kind::Guarded { token, outcome } = &ev.kind else {
            continue;
        };
        match outcome.as_str() {
            "applied" => report.guarded.applied += 1,
            "lost" => {
                report.guarded.refused += 1;
                continue;
            }
            _ => continue,
        }
        let later = grants
            .get(&ev.item)
            .into_iter()
            .flatten()
            .find(|&&(other, granted)| other > *token && granted < ev.t);
        let Some(&(other, granted)) = later else {
            continue;
        };
        if harness.unprotected_at(ev.t) || harness.unprotected_at(granted) {
            report.guarded.outside_unprotected += 1;
        } else {
            report.guarded.outside += 1;
            report.example(format!(
                "guarded write of worker {} task {} on item {} (token {token}) applied, sent {} µs \
                 after the holder with token {other} was granted",
                ev.worker,
                ev.task,
                ev.item,
                (ev.t - granted) / 1_000
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{test_event, On};

    fn guarded(t: u64, token: u64, outcome: &str) -> Event {
        test_event(
            1,
            On::Lock,
            t,
            Kind::Guarded {
                token,
                outcome: outcome.to_string(),
            },
        )
    }

    fn grant(t: u64, token: u64) -> Event {
        test_event(
            2,
            On::Lock,
            t,
            Kind::Grant {
                token,
                valid_ns: 1_000_000,
            },
        )
    }

    /// A write applied after a later holder's grant is a violation; one refused, or sent before
    /// that grant, is not; one in a window outside the guarantees is counted apart.
    #[test]
    fn a_write_applied_after_a_later_grant_is_outside_its_hold() {
        let mut harness = Harness::default();
        let events = [
            grant(10, 5),
            guarded(20, 5, "applied"),
            grant(30, 6),
            guarded(40, 5, "applied"),
        ];
        let mut report = Report::default();
        check(&events, &harness, &mut report);
        assert_eq!((report.guarded.applied, report.guarded.outside), (2, 1));
        assert_eq!(report.violations(), 1);

        let events = [grant(30, 6), guarded(40, 5, "lost")];
        let mut report = Report::default();
        check(&events, &harness, &mut report);
        assert_eq!((report.guarded.refused, report.guarded.outside), (1, 0));

        harness.unprotected.push((35, 45));
        let events = [grant(30, 6), guarded(40, 5, "applied")];
        let mut report = Report::default();
        check(&events, &harness, &mut report);
        assert_eq!(
            (report.guarded.outside, report.guarded.outside_unprotected),
            (0, 1)
        );
    }

    #[test]
    fn its_lines_read_back() {
        let ev = guarded(7, 3, "err:timeout");
        assert_eq!(Event::parse(&ev.to_string()), Some(ev));
    }
}
