//! The watchdog: one task per client that renews every watchdog-mode hold each `renew_interval` (and
//! checks that fixed-lease holds are still there), in batches of up to
//! [`RENEW_BATCH`](crate::redis::node::RENEW_BATCH) holds per script call and one call per cluster slot
//! (so a round makes at most as many calls per node as there are distinct slots held), all at once;
//! and that ends a hold's lease the moment it runs out on the monotonic clock.
//!
//! The deadlines run on their own timer: a renewal round in flight (each request may take up to the
//! node timeout) never delays the news of a lease that ran out meanwhile.
//!
//! It stops when the client is shut down or dropped (it holds only a weak reference between rounds;
//! `Core`'s drop and `shutdown` kick it awake to see that).

use fred::bytes::{Bytes, BytesMut};
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

use crate::engine::core::Core;
use crate::engine::hold::{Copied, Hold, HoldState};
use crate::redis::node::{RenewItem, Renewed};
use crate::util::telemetry;

/// How far ahead the watchdog sleeps when nothing is due (it is kicked for anything new).
const IDLE: Duration = Duration::from_secs(3600);

/// A round in flight: it ends with the earliest deadline of the holds it saw, as it left them, and
/// its emptied buffers for the next round.
type Round = Pin<Box<dyn Future<Output = (Option<Instant>, Batch)> + Send>>;

pub(crate) async fn run(core: Weak<Core>) {
    let mut next_round = Instant::now();
    let mut round: Option<Round> = None;
    // The earliest deadline of an active hold, as last seen (by a round or a pass over the holds)
    // or asked for since: never later than the true one, so no lease runs out unseen; an earlier
    // one only costs a pass. Every hold is looked at once per round, and otherwise only when a
    // deadline is due: with many holds, those passes are most of the watchdog's work.
    let mut earliest: Option<Instant> = None;
    // What holds that came during the round in flight asked for: the round may not have seen them.
    let mut asked_in_round: Option<Instant> = None;
    // The earliest deadline of the holds the round in flight left out (pending ones).
    let mut skipped: Option<Instant> = None;
    // The last round's buffers, kept: with many holds they are megabytes, which a fresh
    // allocation maps anew (and faults in, page by page) every round.
    let mut spare = Batch::default();
    // Rounds are numbered from 1: a hold's `Copied` names the round whose bytes hold its key.
    let mut rounds: u64 = 0;
    loop {
        let Some(strong) = core.upgrade() else { return };
        if strong.is_closed() {
            return;
        }
        strong.watchdog.set_wake(None);
        let asked = strong.watchdog.take_asked();
        earliest = soonest(earliest, asked);
        let now = Instant::now();
        if round.is_none() && (now >= next_round || strong.watchdog.round_asked.swap(false, Ordering::SeqCst))
        {
            // The round's pass, made here: while the round waits for Redis, the loop knows every
            // deadline (a partitioned round must not hide a lease that runs out meanwhile).
            let mut batch = std::mem::take(&mut spare);
            rounds += 1;
            batch.round = rounds;
            let lease = strong.config.get_watchdog_timeout();
            let seen = survey(&strong, now, Some((&mut batch, lease)));
            earliest = seen.all;
            skipped = seen.skipped;
            round = Some(Box::pin(renew_round(strong.clone(), batch)));
            next_round = now + strong.config.get_renew_interval();
            asked_in_round = None;
        } else {
            if round.is_some() {
                asked_in_round = soonest(asked_in_round, asked);
            }
            if earliest.is_some_and(|at| at <= now) {
                earliest = survey(&strong, now, None).all;
            }
        }
        // Sleep until the next round or the first lease that runs out, whichever comes first.
        let wake = if round.is_none() { next_round } else { now + IDLE };
        let wake = earliest.map_or(wake, |at| wake.min(at));
        // No strong reference while idle, so that dropping the last handle drops the client (a
        // round in flight keeps it for at most one node timeout).
        let kick = strong.watchdog.kick.clone();
        strong.watchdog.set_wake(Some(wake));
        drop(strong);
        let in_flight = async {
            match round.as_mut() {
                Some(round) => round.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = kick.notified() => {}
            () = tokio::time::sleep_until(wake) => {}
            (seen, emptied) = in_flight => {
                round = None;
                spare = emptied;
                earliest = soonest(seen, soonest(skipped.take(), asked_in_round.take()));
            }
        }
    }
}

fn soonest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a pass over the holds saw: the earliest deadline of the active holds, and of those it did
/// not collect for a round.
struct Seen {
    all: Option<Instant>,
    skipped: Option<Instant>,
}

/// One pass over the holds: marks lost those whose lease ran out by `now`, and tells the earliest
/// deadline of the others. With `batch`, also collects a [`Renewal`] of each hold the watchdog
/// renews (or checks) now, with `lease` for watchdog-mode holds.
fn survey(core: &Core, now: Instant, mut batch: Option<(&mut Batch, Duration)>) -> Seen {
    let mut seen = Seen {
        all: None,
        skipped: None,
    };
    let holds = core.holds.snapshot();
    if let Some((batch, _)) = batch.as_mut() {
        // Kept buffers of a round with far more holds go (their memory with them).
        if batch.holds.capacity() > 2 * holds.len() + 1024 {
            **batch = Batch {
                round: batch.round,
                ..Batch::default()
            };
        }
        // A key and a field are about 70 bytes.
        batch.holds.reserve(holds.len());
        batch.items.reserve(holds.len());
        batch.bytes.reserve(holds.len() * 80);
    }
    for hold in holds {
        let mut st = hold.state.lock();
        if !st.active() {
            continue;
        }
        if st.deadline <= now {
            let gen = st.gen;
            drop(st);
            hold.mark_lost(gen, "the lease ran out before it could be renewed");
            continue;
        }
        seen.all = soonest(seen.all, Some(st.deadline));
        // A handoff's call on its way confirms a pending hold, or ends it.
        match batch.as_mut().filter(|_| !st.pending) {
            Some((batch, lease)) => {
                let (gen, deadline) = (st.gen, st.deadline);
                let lease = if st.watchdog { *lease } else { Duration::ZERO };
                let (key, field) = batch.copy(&hold, &mut st);
                drop(st);
                batch.holds.push(Renewal { hold, gen, deadline });
                batch.items.push(RenewItem { key, field, lease });
            }
            None => seen.skipped = soonest(seen.skipped, Some(st.deadline)),
        }
    }
    seen
}

/// The holds of a round, with the bytes of their keys and fields copied into one buffer: the
/// calls share that buffer, where a reference to each hold's own strings would touch two more
/// cold cache lines per hold, twice (100,000 held locks: about a third of the client's work).
/// A hold the last round copied is copied from that round's bytes, kept for this one.
#[derive(Default)]
struct Batch {
    holds: Vec<Renewal>,
    /// What the calls need of each hold, in the same order.
    items: Vec<RenewItem>,
    bytes: BytesMut,
    /// This round's number.
    round: u64,
    /// The last round's bytes, and its number (0: none).
    prev: Bytes,
    prev_round: u64,
}

impl Batch {
    /// Appends the key and field of `hold` (its state `st`) to the buffer, from the last round's
    /// bytes if they are there; where they went.
    fn copy(&mut self, hold: &Hold, st: &mut HoldState) -> (Range<usize>, Range<usize>) {
        let start = self.bytes.len();
        let again = st
            .copied
            .filter(|c| c.round == self.prev_round && c.gen == st.gen)
            .and_then(|c| {
                let key_len = c.key_len as usize;
                let from = c.at as usize;
                let bytes = self.prev.get(from..from + key_len + c.field_len as usize)?;
                Some((bytes, key_len))
            });
        let key_len = match again {
            Some((bytes, key_len)) => {
                self.bytes.extend_from_slice(bytes);
                key_len
            }
            None => {
                self.bytes.extend_from_slice(hold.keys.lock.as_bytes());
                self.bytes.extend_from_slice(st.field.as_bytes());
                hold.keys.lock.len()
            }
        };
        let (split, end) = (start + key_len, self.bytes.len());
        st.copied = match (
            u32::try_from(start),
            u32::try_from(key_len),
            u32::try_from(end - split),
        ) {
            (Ok(at), Ok(key_len), Ok(field_len)) => Some(Copied {
                round: self.round,
                gen: st.gen,
                at,
                key_len,
                field_len,
            }),
            _ => None,
        };
        (start..split, split..end)
    }
}

/// One hold in a round: its generation and its deadline when the round began.
struct Renewal {
    hold: Arc<Hold>,
    gen: u64,
    deadline: Instant,
}

/// Renews every active watchdog-mode hold once, and checks every fixed-lease one (`batch`, from
/// the loop's pass); returns the earliest deadline of those holds, as it left them.
async fn renew_round(core: Arc<Core>, batch: Batch) -> (Option<Instant>, Batch) {
    let Batch {
        mut holds,
        mut items,
        bytes,
        round,
        prev,
        prev_round,
    } = batch;
    if holds.is_empty() {
        let batch = Batch {
            holds,
            items,
            bytes,
            round,
            prev,
            prev_round,
        };
        return (None, batch);
    }
    // Its events (renewal failures, losses) nest in the round's span.
    let span = tracing::debug_span!(
        "watchdog_round",
        holds = holds.len(),
        renewed = Empty,
        elapsed_us = Empty
    );
    // The client's record (see `redis/identity.rs`) goes beside the round, on every master.
    let record = write_record(&core);
    let bytes = bytes.freeze();
    let (renewed, ()) = futures::join!(renew(&core, &mut holds, &items, &bytes).instrument(span), record);
    holds.clear();
    items.clear();
    // The next round copies from this round's bytes, and writes where the last round's were:
    // unique again, as that round's calls are long done (if not, the next round allocates).
    let next = prev.try_into_mut().map_or_else(
        |_| BytesMut::new(),
        |mut bytes| {
            bytes.clear();
            bytes
        },
    );
    let batch = Batch {
        holds,
        items,
        bytes: next,
        round: 0,
        prev: bytes,
        prev_round: round,
    };
    (renewed, batch)
}

/// Writes this client's record with the watchdog's lease on every master. Best effort: a failure
/// leaves it to the next round.
async fn write_record(core: &Core) {
    let (identity, lease) = (&core.identity, core.config.get_watchdog_timeout());
    let writes = core
        .masters
        .nodes
        .iter()
        .map(|node| node.write_record(&identity.key, &identity.value, lease));
    for result in futures::future::join_all(writes).await {
        if let Err(err) = result {
            tracing::debug!(%err, "the client's record was not written");
        }
    }
}

/// One round over `holds`: renewed where a majority confirms, lost where a majority has lost them.
/// Returns the earliest of their deadlines, as it left them.
///
/// The holds are let go of as their answers are applied (`holds` is left empty): each one's
/// reference count is on the cache line just read, not cold again in a second pass.
async fn renew(core: &Core, holds: &mut Vec<Renewal>, items: &[RenewItem], bytes: &Bytes) -> Option<Instant> {
    let lease = core.config.get_watchdog_timeout();
    let start = Instant::now();

    // One call per node and slot (see `Node::renew`), every node at once.
    let requests = core.masters.nodes.iter().map(|node| node.renew(bytes, items));
    let replies = futures::future::join_all(requests).await;

    // Counts of nodes per hold (a quorum has a handful of masters).
    let mut renewed = vec![0u16; holds.len()];
    let mut gone = vec![0u16; holds.len()];
    for (n, reply) in replies.into_iter().enumerate() {
        for (i, flag) in reply.flags.into_iter().enumerate() {
            match flag {
                Renewed::Held => renewed[i] += 1,
                Renewed::Gone => gone[i] += 1,
                Renewed::Failed => {}
            }
        }
        if let Some(err) = reply.error {
            tracing::warn!(node = %core.masters.nodes[n].server, %err, "renewal failed");
        }
    }

    let (nodes, needed) = (core.masters.nodes.len(), core.masters.needed());
    let most_gone = u16::try_from(nodes - needed).unwrap_or(u16::MAX);
    let needed = u16::try_from(needed).unwrap_or(u16::MAX);
    let deadline = start + lease.saturating_sub(core.masters.config.drift(lease));
    let mut ok = 0;
    let mut earliest = None;
    // Watchdog-mode holds, and those of them renewed (fixed leases are only checked).
    let (mut renewals, mut confirmed) = (0u64, 0u64);
    let count = holds.len();
    for (i, (r, item)) in holds.drain(..).zip(items).enumerate() {
        let mut left = r.deadline;
        let watched = !item.lease.is_zero();
        renewals += u64::from(watched);
        if renewed[i] >= needed {
            if watched {
                confirmed += 1;
                let mut st = r.hold.state.lock();
                if st.gen == r.gen && st.active() && deadline > st.deadline {
                    st.deadline = deadline;
                }
                left = st.deadline;
            }
            ok += 1;
        } else if gone[i] > most_gone {
            r.hold.mark_lost(r.gen, "renewal found the lock no longer held");
        } else {
            tracing::warn!(lock = %r.hold.keys.name, renewed = renewed[i], needed, "renewal missed a majority; retrying next round");
        }
        earliest = soonest(earliest, Some(left));
    }
    telemetry::renewals(confirmed, renewals - confirmed);
    // `elapsed_us` as an integer, so that a subscriber (the bench) reads it without parsing text.
    let elapsed_us = start.elapsed().as_micros().min(u64::MAX as u128) as u64;
    let span = tracing::Span::current();
    span.record("renewed", ok);
    span.record("elapsed_us", elapsed_us);
    tracing::debug!(renewed = ok, holds = count, elapsed_us, "watchdog round");
    earliest
}
