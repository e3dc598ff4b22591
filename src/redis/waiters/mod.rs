//! Waiting for releases without polling: one subscriber connection per node, reference-counted
//! channel subscriptions, and wake-ups for the tasks that wait on them.
//! Here the registrations and their wake-ups; in `subscriber` the task that owns the connection.
//!
//! May use: `crate::util`, and the transport's `link` and `topology`; never the engine, the
//! primitives, `inspect` or `blocking`.
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
//! again; and once more at the scan after any change, when the move has settled.

use fred::bytes_utils::Str;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, PubsubInterface};
use fred::types::config::Server;
use fred::types::Value;
use parking_lot::Mutex;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::redis::link::NodeClient;
use subscriber::{run, subscribe_then_ping};

mod subscriber;

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
    /// The last wake-up it delivered came from an undo (a message `~…`, see `Node::undo_grant`).
    undo: bool,
}

impl Entry {
    /// Wakes every waiter of the channel, named ones included: nothing is left to pass on.
    fn wake_all(&mut self) {
        self.undo = false;
        self.delivered += 1;
        self.relayed = self.delivered;
        self.notify.notify_waiters();
        for (_, notify) in self.named.values() {
            notify.notify_waiters();
        }
    }

    /// Turns one message into wake-ups: `*` (a latch opened, a read-write lock released) wakes
    /// every waiter, names (separated by spaces: a fair lock's next waiters) the waiters of those
    /// names, anything else (a lock's release) one unnamed waiter. A `~` before `*` or a release's
    /// message marks an undo: it wakes the same waiters, who learn it from [`Subscription::by_undo`].
    fn deliver(&mut self, message: &[u8]) {
        let undo = message.first() == Some(&b'~');
        let message = if undo { &message[1..] } else { message };
        if message == b"*" {
            self.wake_all();
            self.undo = undo;
            return;
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
        self.undo = undo;
        self.notify.notify_one();
    }
}

#[derive(Default)]
struct Shared {
    channels: Mutex<HashMap<Str, Entry>>,
    kick: Notify,
    /// On a cluster, the largest `cluster_current_epoch` a scan has read; 0 before the first.
    epoch: std::sync::atomic::AtomicU64,
    /// On a cluster, the last scan found slots moved (or the epoch risen): the next one subscribes
    /// every channel again, once the move has settled.
    unsettled: std::sync::atomic::AtomicBool,
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

    /// Whether the channel's last wake-up came from an undo of a grant that never was a hold (see
    /// `Node::undo_grant`), not from a holder's release. Read after a wake-up, it tells that
    /// wake-up's cause, but for a message that came in between (rare, and either way a waiter
    /// then only tries once too early or too late by its rate limit).
    pub(crate) fn by_undo(&self) -> bool {
        let channels = self.shared.channels.lock();
        channels.get(&self.channel).is_some_and(|entry| entry.undo)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `~` before a message marks an undo: it wakes as the message without it does, and the
    /// channel remembers which kind woke last.
    #[tokio::test]
    async fn an_undo_wakes_as_its_message_and_says_so() {
        let mut entry = Entry::default();
        let one = arm(&entry.notify);
        entry.deliver(b"~1");
        assert!(entry.undo && entry.delivered == 1);
        one.await;
        let (first, second) = (arm(&entry.notify), arm(&entry.notify));
        entry.deliver(b"~*");
        assert!(entry.undo && entry.relayed == entry.delivered);
        first.await;
        second.await;
        entry.deliver(b"1");
        assert!(!entry.undo && entry.delivered == 3);
    }
}
