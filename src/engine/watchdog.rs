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
use crate::engine::hold::Hold;
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
            **batch = Batch::default();
        }
        // A key and a field are about 70 bytes.
        batch.holds.reserve(holds.len());
        batch.items.reserve(holds.len());
        batch.bytes.reserve(holds.len() * 80);
    }
    for hold in holds {
        let st = hold.state.lock();
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
                let key = batch.copy(hold.keys.lock.as_bytes());
                let field = batch.copy(st.field.as_bytes());
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
#[derive(Default)]
struct Batch {
    holds: Vec<Renewal>,
    /// What the calls need of each hold, in the same order.
    items: Vec<RenewItem>,
    bytes: BytesMut,
}

impl Batch {
    /// Appends `bytes` to the buffer; where they went in it.
    fn copy(&mut self, bytes: &[u8]) -> Range<usize> {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(bytes);
        start..self.bytes.len()
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
    } = batch;
    if holds.is_empty() {
        return (None, Batch { holds, items, bytes });
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
    let (renewed, ()) = futures::join!(renew(&core, &holds, &items, &bytes).instrument(span), record);
    holds.clear();
    items.clear();
    // Unique again once every call is done with its slices; if not, the next round allocates.
    let bytes = bytes.try_into_mut().map_or_else(
        |_| BytesMut::new(),
        |mut bytes| {
            bytes.clear();
            bytes
        },
    );
    (renewed, Batch { holds, items, bytes })
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
async fn renew(core: &Core, holds: &[Renewal], items: &[RenewItem], bytes: &Bytes) -> Option<Instant> {
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
    for (i, (r, item)) in holds.iter().zip(items).enumerate() {
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
    tracing::debug!(renewed = ok, holds = holds.len(), elapsed_us, "watchdog round");
    earliest
}
