//! The election workload and its check: each worker client campaigns in a few elections, leads a
//! while (a moment, or across renewals) and resigns, its leaderships written as sections of their
//! own. The check: at most one valid leader of an election at a time, and every term above the
//! terms of the leaders that ended before it began (the lock's checks (a) and (b), on the
//! leaderships).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relock::{Error, LockClient};

use crate::family::{emit, emit_at, hold_for};
use crate::history::{check_overlaps, check_tokens, now_ns, sections, Event, Harness, Kind, On, Report};
use crate::worker::{counted, describe, hold_plan, Settings};
use crate::Rng;

/// Elections contended for.
pub const ELECTIONS: u32 = 2;

/// What the election workload came to.
#[derive(Debug, Default, Clone)]
pub struct ElectionReport {
    pub campaigns: u64,
    /// Leaderships taken (terms).
    pub terms: u64,
    /// Two valid leaders of one election at once: must be zero.
    pub overlaps: u64,
    /// The same, beginning after a fault outside the guarantees.
    pub overlaps_unprotected: u64,
    /// Terms not above an ended leader's: must be zero.
    pub terms_back: u64,
}

impl ElectionReport {
    pub fn violations(&self) -> u64 {
        self.overlaps + self.terms_back
    }
}

impl fmt::Display for ElectionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "elections: {} campaigns, {} terms, valid leaders overlapping {} (+{} after faults outside the guarantees), terms not rising {}",
            self.campaigns, self.terms, self.overlaps, self.overlaps_unprotected, self.terms_back
        )
    }
}

/// Checks the leaderships of `events` into `report.election`.
pub fn check(events: &[Event], harness: &Harness, report: &mut Report) {
    let led: Vec<Event> = events.iter().filter(|e| e.on == On::Election).cloned().collect();
    let mut counts = Report::default();
    let held = sections(&led, harness, &mut counts);
    check_overlaps(&held, harness, &mut counts);
    check_tokens(&held, harness, &mut counts);
    report.election = ElectionReport {
        campaigns: counts.acquisitions,
        terms: counts.grants,
        overlaps: counts.valid_overlaps,
        overlaps_unprotected: counts.valid_overlaps_unprotected,
        terms_back: counts.token_regressions,
    };
    for example in counts.examples {
        report.example(format!("election {example}"));
    }
}

/// One client's loop: campaign in a random election, lead (writing its validity as it goes),
/// resign. Even tasks lead under `until_lost`, odd ones do not.
pub async fn campaign(
    settings: Settings,
    task: u32,
    mut rng: Rng,
    client: LockClient,
    stop: Arc<AtomicBool>,
) {
    let id = settings.id;
    let elections: Vec<relock::Election> = (0..ELECTIONS)
        .map(|i| client.election(&format!("election-{i}")))
        .collect();
    let careful = task % 2 == 0;
    while !stop.load(Ordering::Relaxed) {
        let item = rng.below(u64::from(ELECTIONS)) as u32;
        let emit = |kind| emit(id, task, On::Election, item, kind);
        let wait = settings.lease + Duration::from_secs(1);
        emit(Kind::Waiting {
            wait_ms: wait.as_millis() as u64,
            shared: false,
            permits: 1,
        });
        let value = format!("w{id}t{task}");
        let campaign = tokio::time::timeout(wait, elections[item as usize].campaign(&value));
        let (won, calls) = counted(campaign).await;
        let leadership = match won {
            Ok(Ok(leadership)) => leadership,
            Ok(Err(err)) => {
                emit(Kind::Error(describe(&err)));
                emit(Kind::Calls(calls));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => {
                emit(Kind::Busy);
                emit(Kind::Calls(calls));
                continue;
            }
        };
        // The clock first, then the validity: the claim can only err on the short side.
        let t = now_ns();
        let valid_ns = leadership.guard().validity().as_nanos() as u64;
        emit_at(
            id,
            task,
            On::Election,
            item,
            t,
            Kind::Grant {
                token: leadership.term(),
                valid_ns,
            },
        );
        emit(Kind::Calls(calls));
        let long = rng.below(4) == 0;
        let (hold, steps) = hold_plan(&mut rng, &settings, long);
        let validity = || leadership.guard().validity();
        let work = hold_for(id, task, On::Election, item, hold, steps, validity);
        if careful {
            if leadership.until_lost(work).await.is_err() {
                emit(Kind::Lost);
            }
        } else {
            work.await;
        }
        emit_at(id, task, On::Election, item, now_ns(), Kind::Releasing);
        let outcome = match leadership.resign().await {
            Ok(()) => "ok".to_string(),
            Err(Error::NotHeld) => "notheld".to_string(),
            Err(err) => format!("err:{}", describe(&err)),
        };
        emit(Kind::Release(outcome));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::test_event as ev;

    const MS: u64 = 1_000_000;

    fn led(worker: u32, term: u64, t: u64) -> Event {
        let grant = Kind::Grant {
            token: term,
            valid_ns: 1000 * MS,
        };
        ev(worker, On::Election, t, grant)
    }

    fn resigned(worker: u32, t: u64) -> Event {
        ev(worker, On::Election, t, Kind::Release("ok".into()))
    }

    fn report(events: Vec<Event>) -> Report {
        let harness = Harness {
            end: 100 * MS,
            ..Harness::default()
        };
        let mut report = Report::default();
        check(&events, &harness, &mut report);
        report
    }

    #[test]
    fn the_checker_finds_two_leaders_and_a_term_going_back() {
        // Leaders 1 then 2, one after the other, terms rising: fine.
        let fine = report(vec![
            led(1, 5, 0),
            resigned(1, 10 * MS),
            led(2, 6, 20 * MS),
            resigned(2, 30 * MS),
        ]);
        assert_eq!(
            (fine.election.terms, fine.election.violations()),
            (2, 0),
            "{fine}"
        );
        // Leader 2 takes office while 1 still leads, validly.
        let two = report(vec![
            led(1, 5, 0),
            led(2, 6, 5 * MS),
            resigned(1, 10 * MS),
            resigned(2, 30 * MS),
        ]);
        assert_eq!(two.election.overlaps, 1, "{two}");
        // Leader 2's term is below the one that ended before it began.
        let back = report(vec![
            led(1, 5, 0),
            resigned(1, 10 * MS),
            led(2, 4, 20 * MS),
            resigned(2, 30 * MS),
        ]);
        assert_eq!(back.election.terms_back, 1, "{back}");
    }
}
