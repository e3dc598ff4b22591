//! Waiting for releases without polling: one subscriber connection per node, reference-counted
//! channel subscriptions, and wake-ups for the tasks that wait on them.
//!
//! A waiter registers its interest in a lock's release channel and gets a [`Subscription`]. One
//! background task per node owns the subscriber connection: it batches the `SUBSCRIBE`/`UNSUBSCRIBE`
//! commands that the registrations call for, and turns each release message into a wake-up of one
//! waiter of that channel (a latch's `*` message into a wake-up of all). A channel that its last
//! waiter left stays subscribed for [`LINGER`] to [`LINGER`] × 2 (one sweep of the task for all of
//! them), so that a waiter that comes back soon finds it live. Anything that may have lost
//! a message (a lagging receiver, a reconnect, a subscription just confirmed) wakes every waiter,
//! who then simply try again; the holder's TTL bounds what a message lost any other way can cost.
//!
//! On a Redis ≥ 7 cluster the channels are sharded (`SSUBSCRIBE`, one command per slot, each
//! awaited: fred confirms them). A slot that moves (resharding, failover) drops its subscriptions
//! on the server without a word that fred passes on, so while anyone waits the task re-reads the
//! slot map every [`CLUSTER_SCAN`] (as Redisson's `scanInterval`), subscribes again where a waited
//! slot now lives, and wakes its waiters to try again; and where the cluster's epoch rose since the
//! last scan (a slot moved away and back in between looks unmoved), it subscribes everything
//! again.

use fred::bytes_utils::Str;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use fred::types::config::Server;
use fred::types::{ClusterHash, CustomCommand, Value};
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::redis::link::NodeClient;
use crate::redis::topology::Kind;

/// How often a cluster's slot map is re-read while anyone waits on it.
pub(crate) const CLUSTER_SCAN: Duration = Duration::from_secs(1);

/// How long a channel stays subscribed after its last waiter left, at least. On a hot lock whose
/// contenders are few per client, a waiter granted by a handoff leaves the channel, and the owner
/// that handed the lock over comes back to wait a moment later: had the channel gone, it would
/// have to try (refused: another owner of this client holds the lock) and subscribe again, and
/// the server would run four requests per critical section instead of one. A lingering channel
/// costs the server nothing until a release on it is published.
const LINGER: Duration = Duration::from_millis(500);

#[derive(Default)]
struct Entry {
    refs: usize,
    notify: Arc<Notify>,
    /// A `SUBSCRIBE` for it was sent (and not undone).
    sent: bool,
    /// The server confirmed it: from now on no release is missed.
    confirmed: bool,
    /// On a cluster, the primary it was subscribed on.
    owner: Option<Server>,
    /// Waiters woken by name (a fair lock's: the message names whose turn it is), with how many
    /// subscriptions share each name.
    named: HashMap<Str, (usize, Arc<Notify>)>,
    /// Since when nobody waits on it (it lingers, see [`LINGER`]).
    idle_since: Option<Instant>,
    /// How many wake-ups of unnamed waiters it delivered (messages, and events that woke all), and
    /// at which of them a waiter last passed its wake-up on to the others
    /// ([`Subscription::pass_on`]): once per wake-up, so waiters that cannot use what is free do
    /// not wake each other, or themselves, for ever.
    delivered: u64,
    relayed: u64,
}

impl Entry {
    /// Wakes every waiter of the channel, named ones included: nothing is left to pass on.
    fn wake_all(&mut self) {
        self.delivered += 1;
        self.relayed = self.delivered;
        self.notify.notify_waiters();
        for (_, notify) in self.named.values() {
            notify.notify_waiters();
        }
    }

    /// Turns one message into wake-ups: `*` (a latch opened, a read-write lock released) wakes
    /// every waiter, names (separated by spaces: a fair lock's next waiters) the waiters of those
    /// names, anything else (a lock's release) one unnamed waiter.
    fn deliver(&mut self, message: &[u8]) {
        if message == b"*" {
            return self.wake_all();
        }
        if !self.named.is_empty() {
            let names = std::str::from_utf8(message).unwrap_or_default().split(' ');
            let mut found = false;
            for (_, notify) in names.filter_map(|name| self.named.get(name)) {
                notify.notify_one();
                found = true;
            }
            if found {
                return;
            }
        }
        self.delivered += 1;
        self.notify.notify_one();
    }
}

#[derive(Default)]
struct Shared {
    channels: Mutex<HashMap<Str, Entry>>,
    kick: Notify,
    /// On a cluster, the largest `cluster_current_epoch` a scan has read; 0 before the first.
    epoch: std::sync::atomic::AtomicU64,
}

/// The waiting side of one node.
pub(crate) struct Waiters {
    shared: Arc<Shared>,
    /// The subscriber connection (the task's own handle is the one that closes it).
    subscriber: Client,
    link: Arc<NodeClient>,
}

/// Interest in one release channel; dropping it gives the interest up.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: Str,
    notify: Arc<Notify>,
    /// The name it is woken by, if any.
    name: Option<Str>,
}

impl Waiters {
    /// Starts the subscriber task of a node on its own connection `subscriber`. The task stops once
    /// the `Waiters` and every [`Subscription`] are gone (or at shutdown), closing that connection.
    pub(crate) fn start(subscriber: Client, link: Arc<NodeClient>) -> Waiters {
        let shared = Arc::new(Shared::default());
        tokio::spawn(run(Arc::downgrade(&shared), subscriber.clone(), link.clone()));
        Waiters {
            shared,
            subscriber,
            link,
        }
    }

    /// Subscribes to `channel` and unsubscribes again, once the subscriber connection is up: tells at
    /// connect whether the server lets this user subscribe to relock's channels (ACL). Unbounded in
    /// time; the caller bounds it. Only for a subscriber connection without subscriptions yet.
    ///
    /// fred does not wait for the reply of `SUBSCRIBE`: its `Ok` says nothing, and a refusal
    /// (`NOPERM`) is dropped, or handed to the next command awaiting a reply if one is queued by then.
    /// So a `PING` follows: it gets that refusal if it was queued in time, and over RESP2 its reply
    /// shows in any case whether the connection is in subscribed mode (`["pong", ""]`) or not
    /// (`PONG`). Over RESP3 (a fred client so configured) only the first way tells.
    pub(crate) async fn check(&self, channel: &str) -> Result<(), fred::error::Error> {
        crate::redis::topology::connected(&self.subscriber).await?;
        if self.link.topology.sharded() {
            // fred awaits the reply of SSUBSCRIBE: a refusal comes back here.
            self.subscriber.ssubscribe(channel).await?;
            return self.subscriber.sunsubscribe(channel).await;
        }
        let pong = subscribe_then_ping(&self.subscriber, vec![channel.to_string()]).await?;
        self.subscriber.unsubscribe(channel).await?;
        let resp2 = self.subscriber.protocol_version() == fred::types::RespVersion::RESP2;
        if resp2 && !matches!(pong, Value::Array(_)) {
            return Err(fred::error::Error::new(
                fred::error::ErrorKind::Unknown,
                format!(
                    "SUBSCRIBE {channel} was refused, most likely by the user's ACL (a PING after it \
                     was answered {pong:?}, outside of subscribed mode)"
                ),
            ));
        }
        Ok(())
    }

    /// Registers interest in `channel`. The returned wake-up is already armed, so nothing published
    /// after this call is missed once the subscription is confirmed. The flag tells whether it is
    /// confirmed already; if not, the confirmation itself wakes the waiter, who must then try again,
    /// since a release may have come before it.
    ///
    /// With a `name`, the waiter is woken by a message naming it (besides `*` and the events that
    /// wake everyone), not by a plain release.
    pub(crate) fn subscribe(&self, channel: &Str, name: Option<&Str>) -> (Subscription, Armed, bool) {
        let mut channels = self.shared.channels.lock();
        let entry = channels.entry(channel.clone()).or_default();
        if entry.idle_since.take().is_some() {
            // A lingering channel taken up again: a wake-up stored by a message that nobody here
            // waited for would wake this waiter for nothing. Whatever was published before its
            // first attempt, the attempt sees.
            entry.notify = Arc::new(Notify::new());
        }
        entry.refs += 1;
        let notify = match name {
            Some(name) => {
                let named = entry
                    .named
                    .entry(name.clone())
                    .or_insert_with(|| (0, Arc::new(Notify::new())));
                named.0 += 1;
                named.1.clone()
            }
            None => entry.notify.clone(),
        };
        // Armed under the lock: a confirmation, which also takes the lock, cannot slip past it.
        let notified = arm(&notify);
        let (new, confirmed) = (!entry.sent, entry.confirmed);
        drop(channels);
        if new {
            self.shared.kick.notify_one();
        }
        let subscription = Subscription {
            shared: self.shared.clone(),
            channel: channel.clone(),
            notify,
            name: name.cloned(),
        };
        (subscription, notified, confirmed)
    }

    /// [`subscribe`](Waiters::subscribe), but only if the channel's subscription is confirmed
    /// already (others wait on it): then no release is missed from now on, so a waiter that
    /// subscribes before its first attempt need not try again at once after a refusal. Costs no
    /// command to Redis.
    pub(crate) fn join_if_live(&self, channel: &Str, name: Option<&Str>) -> Option<Subscription> {
        if !self
            .shared
            .channels
            .lock()
            .get(channel)
            .is_some_and(|entry| entry.confirmed)
        {
            return None;
        }
        let (subscription, _, confirmed) = self.subscribe(channel, name);
        // Unconfirmed meanwhile (a reconnect): as if not joined; dropping it gives the interest up.
        confirmed.then_some(subscription)
    }

    /// Whether this client's subscriber connection is subscribed to `channel` (its `SUBSCRIBE` sent
    /// and not undone): then a release message on it is heard here too.
    pub(crate) fn subscribed(&self, channel: &Str) -> bool {
        self.shared
            .channels
            .lock()
            .get(channel)
            .is_some_and(|entry| entry.sent)
    }

    /// Whether a waiter of this client waits on `channel` (subscribed or on its way to it).
    pub(crate) fn waited_on(&self, channel: &Str) -> bool {
        self.shared
            .channels
            .lock()
            .get(channel)
            .is_some_and(|entry| entry.refs > 0)
    }

    /// Wakes every waiter of every channel (shutdown).
    pub(crate) fn wake_all(&self) {
        wake_all(&self.shared);
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        // The task holds only a weak reference: wake it so that it sees it is no longer needed.
        self.shared.kick.notify_one();
    }
}

impl Subscription {
    /// A wake-up armed now: the next release message (or any event that may have lost one) completes it.
    pub(crate) fn armed(&self) -> Armed {
        arm(&self.notify)
    }

    /// The wake-up of this channel, to pass a release message on to another waiter.
    pub(crate) fn waker(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    /// Wakes every other waiter of the channel that is armed now, if nobody did so since the
    /// channel's last wake-up: a waiter that a release woke found something free that it could not
    /// use (a semaphore waiter short of permits), which another waiter may. The caller drops its
    /// own armed wake-up first (this one stores no wake-up for later, so it cannot come back to
    /// the caller). Once per wake-up: the waiters it wakes, refused in turn, pass nothing on, and
    /// a waiter that no release woke has nothing to pass on.
    pub(crate) fn pass_on(&self) {
        let mut channels = self.shared.channels.lock();
        if let Some(entry) = channels.get_mut(&self.channel) {
            if entry.relayed != entry.delivered {
                entry.relayed = entry.delivered;
                entry.notify.notify_waiters();
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = self.shared.channels.lock();
        let now_unused = match channels.get_mut(&self.channel) {
            Some(entry) => {
                entry.refs = entry.refs.saturating_sub(1);
                if entry.refs == 0 {
                    entry.idle_since = Some(Instant::now());
                }
                if let Some(name) = &self.name {
                    if let Some(named) = entry.named.get_mut(name) {
                        named.0 = named.0.saturating_sub(1);
                        if named.0 == 0 {
                            entry.named.remove(name);
                        }
                    }
                }
                entry.refs == 0
            }
            None => false,
        };
        drop(channels);
        if now_unused {
            self.shared.kick.notify_one();
        }
    }
}

/// A wake-up that is registered already, so a notification sent before it is awaited is not lost.
pub(crate) type Armed = Pin<Box<OwnedNotified>>;

fn arm(notify: &Arc<Notify>) -> Armed {
    let mut notified = Box::pin(notify.clone().notified_owned());
    notified.as_mut().enable();
    notified
}

fn wake_all(shared: &Shared) {
    for entry in shared.channels.lock().values_mut() {
        entry.wake_all();
    }
}

async fn run(shared: Weak<Shared>, subscriber: Client, link: Arc<NodeClient>) {
    let connection = subscriber.connect();
    let mut messages = subscriber.message_rx();
    let mut reconnects = subscriber.reconnect_rx();
    let cluster = link.topology.kind() == Kind::Cluster;
    // The next sweep of lingering channels, while there are any.
    let mut sweep_at: Option<Instant> = None;
    while let Some(strong) = shared.upgrade() {
        let scan = async {
            // Only sharded subscriptions follow their slot (plain ones live on every node).
            if cluster && link.topology.sharded() && !strong.channels.lock().is_empty() {
                tokio::time::sleep(CLUSTER_SCAN).await
            } else {
                std::future::pending().await
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
            () = scan => follow_slots(&strong, &subscriber, &link).await,
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
async fn follow_slots(shared: &Shared, subscriber: &Client, link: &NodeClient) {
    if let Err(err) = bounded(link, subscriber.sync_cluster()).await {
        tracing::debug!(%err, "reading the cluster's slots failed");
        return;
    }
    let bumped = match current_epoch(link).await {
        Some(epoch) => {
            let before = shared
                .epoch
                .fetch_max(epoch, std::sync::atomic::Ordering::Relaxed);
            before != 0 && epoch > before
        }
        None => false,
    };
    let (moved, unsent) = {
        let mut channels = shared.channels.lock();
        let (mut moved, mut unsent) = (0, 0);
        for (channel, entry) in channels.iter_mut() {
            if !entry.sent {
                unsent += 1; // a subscription that failed: try again
                continue;
            }
            let owner = crate::redis::topology::slot_owner(subscriber, link.topology.slot(channel));
            if bumped || owner != entry.owner {
                entry.sent = false;
                entry.confirmed = false;
                moved += 1;
            }
        }
        (moved, unsent)
    };
    if moved + unsent > 0 {
        tracing::debug!(
            moved,
            unsent,
            "subscribing release channels again where their slots live"
        );
        sync(shared, subscriber, link).await;
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
async fn subscribe_then_ping(
    subscriber: &Client,
    channels: Vec<String>,
) -> Result<Value, fred::error::Error> {
    subscriber.subscribe(channels).await?;
    let ping = CustomCommand::new_static(
        "PING",
        ClusterHash::Custom(fred::util::redis_keyslot(subscriber.id().as_bytes())),
        false,
    );
    subscriber.custom(ping, Vec::<Value>::new()).await
}

/// [`sync`] for sharded channels: one `SSUBSCRIBE` (and `SUNSUBSCRIBE`) per slot, each awaited
/// (fred follows `MOVED` for them only when they are not pipelined).
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
        let result = bounded(link, subscriber.ssubscribe(group.clone())).await;
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
