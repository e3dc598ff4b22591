//! The watchdog: one task per client that renews every watchdog-mode hold each `renew_interval`, in
//! batches of up to [`RENEW_BATCH`](crate::node::RENEW_BATCH) locks per script call, all nodes and
//! batches at once, and that ends a hold's lease the moment it runs out on the monotonic clock.

use std::sync::{Arc, Weak};

use tokio::time::Instant;

use crate::core::{Core, Hold};
use crate::node::RENEW_BATCH;

pub(crate) async fn run(core: Weak<Core>) {
    let mut next_round = Instant::now();
    loop {
        let Some(strong) = core.upgrade() else { return };
        if strong.is_closed() {
            return;
        }
        let interval = strong.config.get_renew_interval();
        let now = Instant::now();
        if now >= next_round {
            renew_round(&strong).await;
            next_round = now + interval;
        }
        // Sleep until the next round or the first lease that would run out before it.
        let mut wake = next_round;
        let now = Instant::now();
        for hold in strong.holds() {
            let st = hold.state.lock();
            if !st.active() {
                continue;
            }
            if st.deadline <= now {
                let gen = st.gen;
                drop(st);
                hold.mark_lost(gen, "the lease ran out before it could be renewed");
            } else {
                wake = wake.min(st.deadline);
            }
        }
        // No strong reference while idle, so that dropping the last handle drops the client.
        let kick = strong.watchdog_kick.clone();
        drop(strong);
        tokio::select! {
            () = kick.notified() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Renews every active watchdog-mode hold once.
async fn renew_round(core: &Arc<Core>) {
    let holds: Vec<(Arc<Hold>, u64)> = core
        .holds()
        .into_iter()
        .filter_map(|hold| {
            let (renewable, gen) = {
                let st = hold.state.lock();
                (st.active() && st.watchdog, st.gen)
            };
            renewable.then_some((hold, gen))
        })
        .collect();
    if holds.is_empty() {
        return;
    }
    let lease = core.config.get_watchdog_timeout();
    let timeout = core.quorum.node_timeout;
    let start = Instant::now();

    let mut requests = Vec::new();
    for (n, node) in core.nodes.iter().enumerate() {
        for (b, batch) in holds.chunks(RENEW_BATCH).enumerate() {
            let locks: Vec<_> = batch
                .iter()
                .map(|(hold, _)| (&*hold.keys, &*hold.owner))
                .collect();
            requests.push(async move {
                let reply = tokio::time::timeout(timeout, node.renew(&locks, lease)).await;
                (n, b, reply)
            });
        }
    }
    let replies = futures::future::join_all(requests).await;

    let mut renewed = vec![0usize; holds.len()];
    let mut gone = vec![0usize; holds.len()];
    for (n, b, reply) in replies {
        match reply {
            Ok(Ok(flags)) => {
                for (offset, flag) in flags.into_iter().enumerate() {
                    let i = b * RENEW_BATCH + offset;
                    if flag {
                        renewed[i] += 1;
                    } else {
                        gone[i] += 1;
                    }
                }
            }
            Ok(Err(err)) => tracing::warn!(node = %core.nodes[n].server, %err, "renewal failed"),
            Err(_) => tracing::warn!(node = %core.nodes[n].server, ?timeout, "renewal timed out"),
        }
    }

    let needed = core.needed();
    let most_gone = core.nodes.len() - needed;
    let deadline = start + lease.saturating_sub(core.quorum.drift(lease));
    let mut ok = 0;
    for (i, (hold, gen)) in holds.iter().enumerate() {
        if renewed[i] >= needed {
            let mut st = hold.state.lock();
            if st.gen == *gen && st.active() && deadline > st.deadline {
                st.deadline = deadline;
            }
            ok += 1;
        } else if gone[i] > most_gone {
            hold.mark_lost(*gen, "renewal found the lock no longer held");
        } else {
            tracing::warn!(lock = %hold.keys.name, renewed = renewed[i], needed, "renewal missed a majority; retrying next round");
        }
    }
    tracing::debug!(renewed = ok, holds = holds.len(), elapsed = ?start.elapsed(), "watchdog round");
}
