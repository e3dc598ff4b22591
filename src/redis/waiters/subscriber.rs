//! The subscriber task of a node: it owns the subscriber connection, keeps the server's
//! subscriptions in line with the waiters' interest (and, on a cluster, with where the slots live),
//! and turns release messages into wake-ups.

use std::sync::{Arc, Weak};

use fred::clients::Client;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use fred::types::config::Server;
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::{wake_all, Shared, CLUSTER_SCAN, LINGER};
use crate::redis::link::NodeClient;
use crate::redis::topology::Kind;

/// Runs the subscriber task of a node on `subscriber` until the node and every waiter are gone,
/// its event channels close, or shutdown; then closes the connection.
pub(super) async fn run(shared: Weak<Shared>, subscriber: Client, link: Arc<NodeClient>) {
    let connection = subscriber.connect();
    let mut messages = subscriber.message_rx();
    let mut reconnects = subscriber.reconnect_rx();
    let cluster = link.topology.kind() == Kind::Cluster;
    // The next sweep of lingering channels, while there are any.
    let mut sweep_at: Option<Instant> = None;
    // The next scan of the slot map, while there are channels. A deadline kept across the loop's
    // turns, not a sleep begun at each: release messages arrive many times a second on a busy
    // client, and each would put the scan off again, for as long as they came.
    let mut scan_at: Option<Instant> = None;
    while let Some(strong) = shared.upgrade() {
        // Only sharded subscriptions follow their slot (plain ones live on every node).
        if cluster && link.topology.sharded() && !strong.channels.lock().is_empty() {
            scan_at.get_or_insert_with(|| Instant::now() + CLUSTER_SCAN);
        } else {
            scan_at = None;
        }
        let scan = async {
            match scan_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let sweep = async {
            match sweep_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = strong.kick.notified() => {
                if Arc::strong_count(&strong) == 1 {
                    break; // the node is gone and nobody waits any more
                }
                if sync(&strong, &subscriber, &link).await {
                    sweep_at.get_or_insert_with(|| Instant::now() + LINGER);
                }
            }
            () = sweep => {
                sweep_at = None;
                if sync(&strong, &subscriber, &link).await {
                    sweep_at = Some(Instant::now() + LINGER);
                }
            }
            () = scan => {
                scan_at = None;
                follow_slots(&strong, &subscriber, &link).await;
            }
            message = messages.recv() => match message {
                Ok(message) => {
                    let mut channels = strong.channels.lock();
                    if let Some(entry) = channels.get_mut(&*message.channel) {
                        entry.deliver(message.value.as_bytes().unwrap_or_default());
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "release messages were dropped; waking every waiter");
                    wake_all(&strong);
                }
                Err(RecvError::Closed) => break,
            },
            reconnect = reconnects.recv() => {
                if let Err(RecvError::Closed) = reconnect {
                    break;
                }
                tracing::debug!("subscriber reconnected; subscribing again");
                for entry in strong.channels.lock().values_mut() {
                    entry.sent = false;
                    entry.confirmed = false;
                }
                // Lingering channels are not subscribed again: they go here.
                sync(&strong, &subscriber, &link).await;
                wake_all(&strong);
            }
        }
    }
    crate::redis::link::quit(&subscriber).await;
    connection.abort();
}

/// Re-reads the cluster's slot map; channels whose slot moved are subscribed again where it lives
/// now, and their waiters woken (a release may have been announced where nobody listened).
///
/// A slot that moved away and back between two scans has the same primary as before, but that
/// primary dropped its subscriptions when the slot left (without a word that fred passes on).
/// Every such move raises the cluster's epoch (the primary that takes a slot bumps its own), so
/// a scan that reads a higher `cluster_current_epoch` than any before subscribes every channel
/// again where it lives, and wakes its waiters. Epochs rise only with moves and failovers: that
/// costs nothing while the cluster stands still.
///
/// Neither sign is enough while a move is under way. The nodes take the new owner one after
/// another (`CLUSTER SETSLOT … NODE`, each dropping its subscriptions of the slot as it does): a
/// subscription sent then may follow a `MOVED` to the old owner and be dropped there a moment
/// later, while the map already named the new one, and a slot moved to the node that already has
/// the cluster's largest config epoch raises no epoch. So every scan that found a change is
/// followed by one more that subscribes everything again: by then the move has settled.
async fn follow_slots(shared: &Shared, subscriber: &Client, link: &NodeClient) {
    use std::sync::atomic::Ordering::Relaxed;
    if let Err(err) = bounded(link, subscriber.sync_cluster()).await {
        tracing::debug!(%err, "reading the cluster's slots failed");
        return;
    }
    let rose = match current_epoch(link).await {
        Some(epoch) => {
            let before = shared.epoch.fetch_max(epoch, Relaxed);
            before != 0 && epoch > before
        }
        None => false,
    };
    // The scan after a change subscribes everything again (see above).
    let again = shared.unsettled.swap(false, Relaxed) || rose;
    let (moved, unsent, shifted) = {
        let mut channels = shared.channels.lock();
        let (mut moved, mut unsent, mut shifted) = (0, 0, false);
        for (channel, entry) in channels.iter_mut() {
            if !entry.sent {
                unsent += 1; // a subscription that failed: try again
                continue;
            }
            let owner = crate::redis::topology::slot_owner(subscriber, link.topology.slot(channel));
            shifted |= owner != entry.owner;
            if again || owner != entry.owner {
                entry.sent = false;
                entry.confirmed = false;
                moved += 1;
            }
        }
        (moved, unsent, shifted)
    };
    if moved + unsent > 0 {
        tracing::debug!(
            moved,
            unsent,
            "subscribing release channels again where their slots live"
        );
        sync(shared, subscriber, link).await;
    }
    if rose || shifted {
        shared.unsettled.store(true, Relaxed);
    }
}

/// The `cluster_current_epoch` of a node of the cluster (any), if it answers.
async fn current_epoch(link: &NodeClient) -> Option<u64> {
    let info = CustomCommand::new_static("CLUSTER", ClusterHash::Random, false);
    // Bounded by the command client's own timeout.
    let request = link
        .cmd
        .custom::<String, _>(info, vec![Value::from_static_str("INFO")]);
    let text = match request.await {
        Ok(text) => text,
        Err(err) => {
            tracing::debug!(%err, "CLUSTER INFO failed");
            return None;
        }
    };
    text.lines()
        .find_map(|line| line.strip_prefix("cluster_current_epoch:"))
        .and_then(|epoch| epoch.trim().parse().ok())
}

/// Brings the server's subscriptions in line with the registered interest: two batched commands, or
/// for sharded channels two per slot. Channels that nobody has waited on for [`LINGER`] go; returns
/// whether others linger still.
async fn sync(shared: &Shared, subscriber: &Client, link: &NodeClient) -> bool {
    let mut lingering = false;
    let (subscribe, unsubscribe) = {
        let mut channels = shared.channels.lock();
        let mut unsubscribe = Vec::new();
        channels.retain(|channel, entry| {
            if entry.refs > 0 {
                return true;
            }
            if entry.sent && entry.idle_since.is_some_and(|since| since.elapsed() < LINGER) {
                lingering = true;
                return true;
            }
            if entry.sent {
                unsubscribe.push(channel.to_string());
            }
            false
        });
        let mut subscribe = Vec::new();
        for (channel, entry) in channels.iter_mut() {
            if !entry.sent {
                entry.sent = true;
                subscribe.push(channel.to_string());
            }
        }
        (subscribe, unsubscribe)
    };
    if link.topology.sharded() {
        sync_sharded(shared, subscriber, link, subscribe, unsubscribe).await;
        return lingering;
    }
    if !unsubscribe.is_empty() {
        if let Err(err) = bounded(link, subscriber.unsubscribe(unsubscribe)).await {
            tracing::debug!(%err, "UNSUBSCRIBE failed");
        }
    }
    if subscribe.is_empty() {
        return lingering;
    }
    // The `PING`'s reply is the confirmation, not fred's answer to `SUBSCRIBE`: a waiter that took
    // that answer for one tried again, was refused, and slept through a release published before
    // the server had its subscription (on a busy runtime about one run in six of
    // `tests/handoff.rs`'s early handoff test; `tests/lock.rs` holds the `SUBSCRIBE` back).
    let result = bounded(link, async {
        subscribe_then_ping(subscriber, subscribe.clone()).await.map(drop)
    })
    .await;
    // On failure waiters fall back to the holder's TTL; the next reconnect subscribes again.
    settle(shared, &subscribe, &result, None);
    if let Err(err) = result {
        tracing::warn!(%err, "SUBSCRIBE failed; waiters fall back to the lease's TTL");
    }
    lingering
}

/// `SUBSCRIBE` of `channels`, then a `PING` behind it on the same connection: the `PING`'s reply.
/// fred answers `SUBSCRIBE` once it is queued, not when the server ran it (and drops a refusal, or
/// hands it to the next command awaiting a reply): the `PING` is answered only after the server
/// ran both, and gets that refusal if it was queued in time. On a cluster it goes where fred sends
/// the client's plain subscriptions: the slot of its id.
pub(super) async fn subscribe_then_ping(
    subscriber: &Client,
    channels: Vec<String>,
) -> Result<Value, fred::error::Error> {
    subscriber.subscribe(channels).await?;
    ping_behind(subscriber, fred::util::redis_keyslot(subscriber.id().as_bytes())).await
}

/// A `PING` on the subscriber's connection to where `slot` lives: answered only after everything
/// sent there before it ran.
async fn ping_behind(subscriber: &Client, slot: u16) -> Result<Value, fred::error::Error> {
    let ping = CustomCommand::new_static("PING", ClusterHash::Custom(slot), false);
    subscriber.custom(ping, Vec::<Value>::new()).await
}

/// [`sync`] for sharded channels: one `SSUBSCRIBE` (and `SUNSUBSCRIBE`) per slot, each awaited
/// (fred follows `MOVED` for them only when they are not pipelined) with a `PING` behind it.
async fn sync_sharded(
    shared: &Shared,
    subscriber: &Client,
    link: &NodeClient,
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
) {
    for group in link.topology.by_slot(unsubscribe, |c| c) {
        if let Err(err) = bounded(link, subscriber.sunsubscribe(group)).await {
            tracing::debug!(%err, "SUNSUBSCRIBE failed");
        }
    }
    for group in link.topology.by_slot(subscribe, |c| c) {
        let slot = link.topology.slot(&group[0]);
        let owner = crate::redis::topology::slot_owner(subscriber, slot);
        // Confirmed by the `PING` behind it, as a plain `SUBSCRIBE` is (see `sync`).
        let request = async {
            subscriber.ssubscribe(group.clone()).await?;
            ping_behind(subscriber, slot).await.map(drop)
        };
        let result = bounded(link, request).await;
        if let Err(err) = &result {
            tracing::warn!(%err, "SSUBSCRIBE failed; retrying at the next slot scan");
        }
        settle(shared, &group, &result, owner);
    }
}

/// Records the outcome of a subscription of `channels` (confirmed on `owner`, or not sent after
/// all) and wakes their waiters, who must try again: a release may have come before it.
fn settle(
    shared: &Shared,
    channels: &[String],
    result: &Result<(), fred::error::Error>,
    owner: Option<Server>,
) {
    let mut entries = shared.channels.lock();
    for channel in channels {
        if let Some(entry) = entries.get_mut(channel.as_str()) {
            match result {
                Ok(()) => {
                    entry.confirmed = true;
                    entry.owner = owner.clone();
                }
                Err(_) => entry.sent = false,
            }
            entry.wake_all();
        }
    }
}

/// A request of the subscriber task, bounded like every other (the subscriber client has no
/// per-command timeout of its own): a server that went away must not hold the task, which could
/// then no longer see that it is not needed any more. A subscription that timed out may still land
/// later; the next sync sends it again, which is harmless.
///
/// A plain function that boxes the request before anything awaits it: fred's command future (about
/// 7 KB) held inline, as an `async fn`'s argument and again as the future it awaits, made the task's
/// `sync` 15 KB, moved at every call.
fn bounded<'a>(
    link: &NodeClient,
    request: impl std::future::Future<Output = Result<(), fred::error::Error>> + 'a,
) -> impl std::future::Future<Output = Result<(), fred::error::Error>> + 'a {
    let request = Box::pin(request);
    let bound = link.bound();
    async move {
        match tokio::time::timeout(bound, request).await {
            Ok(outcome) => outcome,
            Err(_) => Err(fred::error::Error::new(
                fred::error::ErrorKind::Timeout,
                "the subscriber's request was not answered in time",
            )),
        }
    }
}
