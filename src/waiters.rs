//! Waiting for releases without polling: one subscriber connection per node, reference-counted
//! channel subscriptions, and wake-ups for the tasks that wait on them.
//!
//! A waiter registers its interest in a lock's release channel and gets a [`Subscription`]. One
//! background task per node owns the subscriber connection: it batches the `SUBSCRIBE`/`UNSUBSCRIBE`
//! commands that the registrations call for, and turns each release message into a wake-up of one
//! waiter of that channel. Anything that may have lost a message (a lagging receiver, a reconnect,
//! a subscription just confirmed) wakes every waiter, who then simply try again; the holder's TTL bounds
//! what a message lost any other way can cost.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use fred::clients::Client;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

#[derive(Default)]
struct Entry {
    refs: usize,
    notify: Arc<Notify>,
    /// A `SUBSCRIBE` for it was sent (and not undone).
    sent: bool,
    /// The server confirmed it: from now on no release is missed.
    confirmed: bool,
}

#[derive(Default)]
struct Shared {
    channels: Mutex<HashMap<Arc<str>, Entry>>,
    kick: Notify,
}

/// The waiting side of one node.
pub(crate) struct Waiters {
    shared: Arc<Shared>,
    /// The subscriber connection (the task's own handle is the one that closes it).
    subscriber: Client,
}

/// Interest in one release channel; dropping it gives the interest up.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: Arc<str>,
    notify: Arc<Notify>,
}

impl Waiters {
    /// Starts the subscriber task of a node on its own connection `subscriber` (already connecting).
    pub(crate) fn start(subscriber: Client) -> Waiters {
        let shared = Arc::new(Shared::default());
        tokio::spawn(run(Arc::downgrade(&shared), subscriber.clone()));
        Waiters { shared, subscriber }
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
        self.subscriber.wait_for_connect().await?;
        self.subscriber.subscribe(channel).await?;
        let pong: fred::types::Value = self.subscriber.ping(None).await?;
        self.subscriber.unsubscribe(channel).await?;
        let resp2 = self.subscriber.protocol_version() == fred::types::RespVersion::RESP2;
        if resp2 && !matches!(pong, fred::types::Value::Array(_)) {
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
    pub(crate) fn subscribe(&self, channel: &Arc<str>) -> (Subscription, Armed, bool) {
        let mut channels = self.shared.channels.lock();
        let entry = channels.entry(channel.clone()).or_default();
        entry.refs += 1;
        let notify = entry.notify.clone();
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
        };
        (subscription, notified, confirmed)
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
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = self.shared.channels.lock();
        let now_unused = match channels.get_mut(&self.channel) {
            Some(entry) => {
                entry.refs = entry.refs.saturating_sub(1);
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
    for entry in shared.channels.lock().values() {
        entry.notify.notify_waiters();
    }
}

async fn run(shared: Weak<Shared>, subscriber: Client) {
    let connection = subscriber.connect();
    let mut messages = subscriber.message_rx();
    let mut reconnects = subscriber.reconnect_rx();
    while let Some(strong) = shared.upgrade() {
        tokio::select! {
            _ = strong.kick.notified() => {
                if Arc::strong_count(&strong) == 1 {
                    break; // the node is gone and nobody waits any more
                }
                sync(&strong, &subscriber).await;
            }
            message = messages.recv() => match message {
                Ok(message) => {
                    let channels = strong.channels.lock();
                    if let Some(entry) = channels.get(&*message.channel) {
                        entry.notify.notify_one();
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
                sync(&strong, &subscriber).await;
                wake_all(&strong);
            }
        }
    }
    crate::node::close(subscriber, Some(connection)).await;
}

/// Brings the server's subscriptions in line with the registered interest, in two batched commands.
async fn sync(shared: &Shared, subscriber: &Client) {
    let (subscribe, unsubscribe) = {
        let mut channels = shared.channels.lock();
        let mut unsubscribe = Vec::new();
        channels.retain(|channel, entry| {
            if entry.refs > 0 {
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
    if !unsubscribe.is_empty() {
        if let Err(err) = subscriber.unsubscribe(unsubscribe).await {
            tracing::debug!(%err, "UNSUBSCRIBE failed");
        }
    }
    if subscribe.is_empty() {
        return;
    }
    let result = subscriber.subscribe(subscribe.clone()).await;
    let mut channels = shared.channels.lock();
    for channel in &subscribe {
        if let Some(entry) = channels.get_mut(channel.as_str()) {
            match &result {
                Ok(()) => entry.confirmed = true,
                // Waiters fall back to the holder's TTL; the next reconnect subscribes again.
                Err(_) => entry.sent = false,
            }
            entry.notify.notify_waiters();
        }
    }
    if let Err(err) = result {
        tracing::warn!(%err, "SUBSCRIBE failed; waiters fall back to the lease's TTL");
    }
}
