//! The releaser: one task per client that brings Redis in line after guards go (a release from a
//! drop, or one a caller awaits), undoes operations whose outcome is unknown (an attempt cancelled
//! or timed out mid-round), and awaits the answers that a quorum's release did not wait for
//! (`Job::Settle`, see `quorum::release_settled`), and records handoffs left unrecorded
//! (`Job::Record`, see `engine/core/handoff.rs`; those due later wait in a heap behind one timer). Jobs run
//! concurrently, so their commands pipeline on each connection; a master that did not answer is
//! retried with backoff until it does or until what the operation may have left there has run out
//! by itself.
//!
//! It stops when every sender is gone (every core of the process that used it dropped), after
//! finishing the jobs in flight. It keeps no core alive but the ones its jobs carry, and neither a
//! retry between tries nor a record waiting for its time keeps one.

use fred::bytes_utils::Str;
use std::collections::BinaryHeap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, OwnedMutexGuard};
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

use crate::engine::core::Core;
use crate::engine::hold::{Hold, Job, Resync};
use crate::engine::quorum::{self, Release};
use crate::redis::keys::LockKeys;
use crate::util::deadline::Due;
use crate::Error;

/// The releaser task.
pub(crate) async fn run(mut rx: mpsc::UnboundedReceiver<(Arc<Core>, Job)>) {
    let mut running = FuturesUnordered::new();
    // Records due later (`Job::Record` with a time, one per streak of a hot lock): waited for by
    // one timer, not a sleep each.
    let mut later: BinaryHeap<Later> = BinaryHeap::new();
    let timer = tokio::time::sleep_until(Instant::now());
    tokio::pin!(timer);
    loop {
        if let Some(Due(at, _)) = later.peek() {
            if timer.deadline() != *at {
                timer.as_mut().reset(*at);
            }
        }
        tokio::select! {
            job = rx.recv() => match job {
                Some((core, Job::Record { keys, at: Some(at) })) => {
                    // Keeps no core alive while it waits.
                    later.push(Due(at, (Arc::downgrade(&core), keys)));
                }
                Some((core, job)) => running.push(run_job(core, job)),
                None => break,
            },
            () = &mut timer, if !later.is_empty() => {
                let now = Instant::now();
                while later.peek().is_some_and(|next| next.0 <= now) {
                    let Some(Due(at, (core, keys))) = later.pop() else { break };
                    if let Some(core) = core.upgrade() {
                        running.push(run_job(core, Job::Record { keys, at: Some(at) }));
                    }
                }
            }
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
    // Every sender is gone: so are the cores that records were due for.
    while running.next().await.is_some() {}
}

/// A record due later (see [`run`]): the lock, and its core, which it does not keep alive.
type Later = Due<(Weak<Core>, Arc<LockKeys>)>;

async fn run_job(core: Arc<Core>, job: Job) {
    match job {
        Job::Release {
            hold,
            gen,
            field,
            was_lost,
            ops,
        } => {
            if let Err(err) = release_now(&core, &hold, gen, &field, was_lost, ops).await {
                if !matches!(err, Error::NotHeld) {
                    tracing::warn!(lock = %hold.keys.name, %err, "release from drop failed");
                }
            }
        }
        Job::Resync { resync, on } => resync_until_answered(Arc::downgrade(&core), resync, on).await,
        Job::Settle {
            resync,
            mut on,
            answers,
        } => {
            on.extend(answers.await);
            if on.is_empty() {
                core.track_undo(&resync.keys, &resync.field, -1);
            } else {
                resync_until_answered(Arc::downgrade(&core), resync, on).await;
            }
        }
        // Due now: one with a time waited for it in `run`.
        Job::Record { keys, at } => core.record_late(&keys, at).await,
    }
}

/// Brings Redis to the hold's count after a guard of generation `gen` went (see
/// [`Hold::drop_level`]). Runs in the caller's task when the release is awaited (no hop to the
/// releaser); masters that did not answer are left to the releaser, which retries them.
///
/// Cancelling it part way leaves the release's outcome unknown: the caller then queues a
/// [`Job::Resync`] (see `core::UndoOnDrop`).
///
/// Runs in a `release` span (fields `lock`, `owner`, `left`: the hold count left, and `outcome`),
/// in which its events nest; a waiter's mark's, in none.
pub(crate) async fn release_now(
    core: &Arc<Core>,
    hold: &Arc<Hold>,
    gen: u64,
    field: &Str,
    was_lost: bool,
    ops: Option<OwnedMutexGuard<()>>,
) -> Result<(), Error> {
    // A waiter's mark (see `engine/marks.rs`) holds nothing: its release is no `release` of the lock.
    let span = if hold.counted {
        tracing::info_span!("release", lock = %hold.keys.name, owner = %hold.owner, left = Empty, outcome = Empty)
    } else {
        tracing::Span::none()
    };
    let result = release_in_span(core, hold, gen, field, was_lost, ops)
        .instrument(span.clone())
        .await;
    if !span.is_disabled() {
        let outcome = match &result {
            Ok(()) => "released",
            Err(Error::NotHeld) => "not_held",
            Err(_) => "error",
        };
        span.record("outcome", outcome);
    }
    result
}

async fn release_in_span(
    core: &Arc<Core>,
    hold: &Arc<Hold>,
    gen: u64,
    field: &Str,
    was_lost: bool,
    ops: Option<OwnedMutexGuard<()>>,
) -> Result<(), Error> {
    let _ops = match ops {
        Some(ops) => ops,
        None => hold.ops.clone().lock_owned().await,
    };
    // Sent even if the hold was retired meanwhile (say, by a refused attempt of the same owner
    // that saw this generation's field still there): a repeat is harmless, a skip is not.
    let (target, done, lost) = {
        let st = hold.state.lock();
        let target = st.redis_count(gen, field);
        let current = st.gen == gen;
        (
            target,
            !was_lost && current && st.confirmed == Some(target),
            current && *st.lost.borrow(),
        )
    };
    tracing::Span::current().record("left", target);
    if done {
        // An earlier guard's background release, sent after this level went too, did it; or
        // Redis refused a handoff's grant after its guard went (see `core::record::Pending`).
        if target == 0 {
            core.holds.retire_if_idle(hold);
        }
        return if lost { Err(Error::NotHeld) } else { Ok(()) };
    }
    // Another owner of this client waiting for the lock may be handed it in the same step.
    if let Some(taker) = (target == 0 && !was_lost).then(|| core.taker(hold)).flatten() {
        // Boxed: its future inside every release's would nest the types of an awaited release
        // past the compiler's default depth (and be moved with it every time).
        if let Some(result) = Box::pin(core.hand_over(hold, gen, field, taker)).await {
            core.holds.retire_if_idle(hold);
            return result;
        }
        // Redis refused a grant made early: released below as if nobody had waited.
    }
    // Held by handoffs that Redis has not recorded: a release at 0 removes the hold that Redis
    // recorded instead (the lock was this client's throughout); a release to a lower count needs
    // this hold's own field, recorded first.
    let unrecorded = if target == 0 {
        core.release_unrecorded(hold, gen)
    } else {
        core.record_owed(hold).await;
        None
    };
    let releasing = hold;
    let (hold, gen, field) = match &unrecorded {
        Some((recorded, gen, field, _)) => (recorded, *gen, field),
        None => (hold, gen, field),
    };
    let outcome = send_release(core, releasing, hold, gen, field, target).await;
    if was_lost {
        return Err(Error::NotHeld);
    }
    match outcome.outcome(&core.masters) {
        Ok(true) => {
            tracing::debug!(lock = %hold.keys.name, owner = %hold.owner, left = target, "lock released");
            Ok(())
        }
        Ok(false) => {
            if target > 0 {
                hold.mark_lost(gen, "the lock was gone when releasing a nested hold");
            }
            Err(Error::NotHeld)
        }
        Err(err) => {
            tracing::warn!(lock = %hold.keys.name, %err, "release not confirmed; retrying in the background");
            Err(err)
        }
    }
}

/// Sends the release of generation `gen` of `hold` (its `field`, to count `target`) and records
/// what came of it; masters that did not answer are brought in line in the background. `releasing`
/// is the hold whose guard went (`hold` itself, or one held by handoffs Redis has not recorded).
async fn send_release(
    core: &Arc<Core>,
    releasing: &Arc<Hold>,
    hold: &Arc<Hold>,
    gen: u64,
    field: &Str,
    target: u32,
) -> Release {
    // This client's waiters hold back while a release that ends a handoff streak is on its way.
    let ending = (target == 0)
        .then(|| core.handoffs.ending(&hold.keys.lock))
        .flatten();
    // After a loss this is best effort: whatever is left of the hold in Redis is ours to remove.
    let sent = Instant::now();
    // Masters whose last release went unanswered are not waited for: the releaser awaits them.
    let (outcome, stragglers) = quorum::release_settled(&core.masters, &hold.keys, field, target).await;
    if target == 0 {
        // The lock is free (or was not ours): a handoff streak starts again. Other clients heard
        // the release message if more subscribers did than this client's.
        let channel = hold.keys.wait_channel();
        let ours = |i: usize| u32::from(core.masters.nodes[i].waiters.subscribed(channel));
        let others = outcome.heard.map(|(i, heard)| heard > ours(i));
        core.handoffs.freed(hold, sent.elapsed(), others);
    }
    drop(ending);
    {
        let mut st = hold.state.lock();
        if st.gen == gen {
            st.confirmed = matches!(outcome.outcome(&core.masters), Ok(true)).then_some(target);
        }
    }
    if target == 0 {
        // Only now: until the release is sent, the same owner's next acquisition must queue
        // behind it on this hold rather than race it from a new one.
        core.holds.retire_if_idle(releasing);
        core.holds.retire_if_idle(hold);
    }
    if !outcome.silent.is_empty() || !stragglers.is_empty() {
        // The release may or may not have landed there: bring them in line once they answer.
        let (resync, on) = (hold.resync(field, gen), outcome.silent.clone());
        core.enqueue(if stragglers.is_empty() {
            Job::Resync { resync, on }
        } else {
            let answers = Box::pin(quorum::silent_among(stragglers));
            Job::Settle { resync, on, answers }
        });
    }
    outcome
}

/// One try at setting generation `resync.gen` of a hold to its local count (0 if it is not the
/// active one) on the masters in `pending`; returns those that did not answer. The target is read
/// under the hold's lock, so a try at any moment is correct, even after the same owner acquired
/// again.
async fn resync_once(core: &Core, resync: &Resync, pending: &[usize]) -> Vec<usize> {
    let (hold, ops) = core.holds.lock_hold(&resync.keys, &resync.owner).await;
    let (target, current) = {
        let st = hold.state.lock();
        (
            st.redis_count(resync.gen, &resync.field),
            st.holds(resync.gen, &resync.field),
        )
    };
    // Only the active generation's operations must stay in order with this one; an ended one's
    // field is nobody's, so the owner's next acquisition need not wait for silent masters.
    let _ops = if current {
        Some(ops)
    } else {
        core.holds.retire_if_idle(&hold);
        drop(ops);
        None
    };
    // An early handoff's token (see `Resync::fence_floor`) is covered before anything goes.
    let mut silent = Vec::new();
    let mut ready = Vec::with_capacity(pending.len());
    for &i in pending {
        let raised = match resync.fence_floor {
            Some(token) => core.masters.nodes[i]
                .raise_fence(&resync.keys, token)
                .await
                .is_ok(),
            None => true,
        };
        if raised {
            ready.push(i);
        } else {
            silent.push(i);
        }
    }
    let undo = resync.after_attempt;
    let answered = quorum::release_on(&core.masters, &resync.keys, &resync.field, target, &ready, undo).await;
    if target == 0 && !undo && matches!(resync.keys.kind, crate::redis::keys::Kind::Plain) {
        // The lost reply may have been a release's that freed the lock unannounced.
        let announce = ready.iter().filter(|i| !answered.silent.contains(i));
        futures::future::join_all(announce.map(|&i| core.masters.nodes[i].announce_release(&resync.keys)))
            .await;
    }
    silent.extend(answered.silent);
    silent
}

/// Brings the masters in `pending` in line with the local count of a hold generation after an
/// operation whose outcome is unknown (a grant whose reply was lost, a release that failed).
/// Masters that do not answer are tried again, with backoff, until whatever the operation may have
/// left there has run out by itself: otherwise a lost reply would block everyone for a whole
/// lease. Between tries it keeps no client alive, and a shutdown finishes what is left.
async fn resync_until_answered(core: Weak<Core>, resync: Resync, mut pending: Vec<usize>) {
    let Some(strong) = core.upgrade() else { return };
    let give_up = Instant::now() + strong.longest_lease();
    drop(strong);
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(core) = core.upgrade() else { return };
        if core.is_closed() {
            return; // shutdown releases what is tracked
        }
        pending = resync_once(&core, &resync, &pending).await;
        let done = pending.is_empty();
        if done || Instant::now() + backoff >= give_up {
            if !done {
                tracing::warn!(lock = %resync.keys.name, silent = pending.len(), "could not undo an interrupted acquisition or release; its lease will run out");
            }
            core.track_undo(&resync.keys, &resync.field, -1);
            return;
        }
        tracing::debug!(lock = %resync.keys.name, silent = pending.len(), ?backoff, "undo not answered; retrying");
        drop(core);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
