//! `relock watch`: a lock's acquire, re-enter, release, expire and force-unlock events until
//! Ctrl-C, learnt from keyspace notifications and the release channel, or from a read on a timer.

use std::time::{Duration, SystemTime};

use fred::clients::Client;
use fred::interfaces::{ClientLike, ClusterInterface, EventInterface, PubsubInterface};
use fred::prelude::{Builder, Config, ReconnectPolicy};
use fred::types::config::{Options, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};
use relock::{Holder, LockClient, LockInfo};
use tokio::sync::broadcast;

use crate::output::{holder_name, out, timestamp, to_json, ttl_ms, ttl_text};
use crate::{Cli, Failure, OK};

/// How `watch` learns of changes: the subscriber connection and what it delivers.
#[derive(Default)]
struct Feed {
    /// Kept open while watching.
    subscriber: Option<Client>,
    /// Subscribed to the keyspace channel of the lock key as well as its release channel.
    notified: bool,
    /// Release messages; keyspace notifications (which fred parses) come on their own receiver.
    released: Option<broadcast::Receiver<fred::types::Message>>,
    keyspace: Option<broadcast::Receiver<fred::types::KeyspaceEvent>>,
    /// The subscriber's reconnections, after which it subscribes again (a new connection has no
    /// subscriptions).
    reconnects: Option<broadcast::Receiver<fred::types::config::Server>>,
}

impl Feed {
    /// How often the lock is read besides on messages: seldom with notifications (in case one was
    /// lost with a connection), else every 200 ms.
    fn period(&self) -> Duration {
        if self.notified && self.keyspace.is_some() {
            Duration::from_secs(5)
        } else {
            Duration::from_millis(200)
        }
    }

    /// Connects the subscriber and subscribes to the lock's channels; without a subscriber
    /// connection, a feed of none (`watch` then reads on a timer).
    async fn open(cli: &Cli, key: &str, channel: &str, enable: bool) -> Feed {
        let mut feed = Feed::default();
        match connect_subscriber(&cli.url, cli.timeout).await {
            Some(subscriber) => {
                feed.released = Some(subscriber.message_rx());
                feed.keyspace = Some(subscriber.keyspace_event_rx());
                feed.reconnects = Some(subscriber.reconnect_rx());
                feed.notified = subscribe(&subscriber, key, channel, enable, cli.timeout, true).await;
                feed.subscriber = Some(subscriber);
            }
            None => eprintln!("relock: no subscriber connection; reading the lock every 200 ms"),
        }
        feed
    }

    /// Closes the subscriber connection, bounded.
    async fn close(self) {
        if let Some(subscriber) = self.subscriber {
            let _ = tokio::time::timeout(Duration::from_millis(500), subscriber.quit()).await;
        }
    }
}

/// The next item of an optional broadcast receiver, `None` after a lag; a receiver that closed is
/// dropped, and a missing one never answers.
async fn next<T: Clone>(receiver: &mut Option<broadcast::Receiver<T>>) -> Option<T> {
    let Some(rx) = receiver.as_mut() else {
        return std::future::pending().await;
    };
    match rx.recv().await {
        Ok(item) => Some(item),
        Err(broadcast::error::RecvError::Lagged(_)) => None,
        Err(broadcast::error::RecvError::Closed) => {
            *receiver = None;
            None
        }
    }
}

/// `relock watch`: prints the lock's events until Ctrl-C; `enable` turns keyspace notifications
/// on if they are off.
pub(crate) async fn watch(client: &LockClient, cli: &Cli, name: &str, enable: bool) -> Result<u8, Failure> {
    // When the latest read was sent: a hold gone by the next read ran out (rather than was released)
    // if its lease then left no more than the time since (the server read it after this instant).
    let mut sent = tokio::time::Instant::now();
    // The first read checks the name (no I/O for a bad one) and the connection.
    let mut last = client.inspect(name).await?;
    let lock = client.lock(name);
    let (key, channel) = (lock.redis_key().to_string(), lock.release_channel().to_string());
    let mut feed = Feed::open(cli, &key, &channel, enable).await;
    if let Some(info) = &last {
        emit_held(cli, name, info)?;
    }
    // Said once subscribed and read, so that a caller knows that from here on nothing is missed.
    let how = if feed.notified {
        "keyspace notifications"
    } else {
        "a read every 200 ms"
    };
    eprintln!("relock: watching {name:?} by {how}; Ctrl-C stops");
    let mut period = feed.period();
    let mut ticks = ticker(period);
    let stop = ctrl_c();
    tokio::pin!(stop);
    // The keyspace events of the key since the last read that was answered: a read that fails
    // leaves them to the next, which must still tell a force-unlock from a release.
    let mut ops: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = next(&mut feed.released) => {}
            event = next(&mut feed.keyspace) => ops.extend(event.map(|event| event.operation)),
            reconnected = next(&mut feed.reconnects) => {
                if let (Some(_), Some(subscriber)) = (reconnected, &feed.subscriber) {
                    feed.notified =
                        subscribe(subscriber, &key, &channel, enable, cli.timeout, false).await;
                }
            }
            _ = ticks.tick() => {}
        }
        if feed.period() != period {
            period = feed.period();
            ticks = ticker(period);
        }
        // Events queued meanwhile: a release message comes after the events of the same script.
        if let Some(keyspace) = feed.keyspace.as_mut() {
            while let Ok(event) = keyspace.try_recv() {
                ops.push(event.operation);
            }
        }
        let sending = tokio::time::Instant::now();
        let now = match client.inspect(name).await {
            Ok(now) => now,
            Err(err) => {
                // Passing (a reconnect, a timeout): say so, keep watching.
                eprintln!("relock: reading {name:?} failed: {err}");
                continue;
            }
        };
        let elapsed = sent.elapsed();
        sent = sending;
        // A hold the read found gone before its removal's event was taken: the server sent the
        // event first, but on the other connection, which this task may read later. Without it a
        // force-unlock would read as a release.
        let notified = feed.notified && feed.keyspace.is_some();
        let gone = gone_holders(last.as_ref(), now.as_ref()).next().is_some();
        if notified && gone && !ops.iter().any(|op| removal(op)) {
            await_removal(&mut feed, &mut ops).await;
        }
        let gone_how = gone_how(last.as_ref(), &ops, elapsed);
        for event in changes(last.as_ref(), now.as_ref(), gone_how) {
            emit(cli, name, &event)?;
        }
        last = now;
        ops.clear();
    }
    feed.close().await;
    Ok(OK)
}

/// How long a read that found a hold gone waits for the keyspace event of its removal.
const REMOVAL_WAIT: Duration = Duration::from_millis(250);

/// Whether the keyspace event `op` removes a hold (or the whole lock).
fn removal(op: &str) -> bool {
    matches!(op, "del" | "hdel" | "expired" | "evicted")
}

/// The holders of `before` missing from `after`.
fn gone_holders<'a>(
    before: Option<&'a LockInfo>,
    after: Option<&'a LockInfo>,
) -> impl Iterator<Item = &'a Holder> {
    let holders = before.map_or(&[][..], |before| &before.holders[..]);
    holders
        .iter()
        .filter(move |h| !after.is_some_and(|a| a.holders.iter().any(|n| n.field == h.field)))
}

/// Takes keyspace events into `ops` until a removal's, for at most [`REMOVAL_WAIT`]; the events
/// after it are left to the next turn of the loop.
async fn await_removal(feed: &mut Feed, ops: &mut Vec<String>) {
    let until = tokio::time::Instant::now() + REMOVAL_WAIT;
    while let Ok(Some(event)) = tokio::time::timeout_at(until, next(&mut feed.keyspace)).await {
        let found = removal(&event.operation);
        ops.push(event.operation);
        if found {
            return;
        }
    }
}

/// The `held` events of the holds the first read found.
fn emit_held(cli: &Cli, name: &str, info: &LockInfo) -> Result<(), Failure> {
    for holder in &info.holders {
        let event = Event {
            kind: "held",
            holder,
            count: holder.count,
            ttl: info.ttl,
            fence: info.fence,
        };
        emit(cli, name, &event)?;
    }
    Ok(())
}

/// How the holds of the earlier read `before` that are gone by the next one went: `ops` are the
/// keyspace events of the key between the reads, `elapsed` the time since the earlier was sent.
fn gone_how(before: Option<&LockInfo>, ops: &[String], elapsed: Duration) -> Gone {
    // With notifications the server says so; without, the lease tells (a release in the last
    // few milliseconds of a lease reads as an expiry).
    let expired = |info: &LockInfo| {
        ops.iter().any(|op| op == "expired")
            || info
                .ttl
                .is_some_and(|ttl| elapsed + Duration::from_millis(10) >= ttl)
    };
    // A release removes its field (`hdel`, then `del` once the hash is empty); a force-unlock
    // deletes the key outright (`del` alone). Only notifications tell them apart.
    if expired_any(before, expired) {
        Gone::Expired
    } else if ops.iter().any(|op| op == "del") && !ops.iter().any(|op| op == "hdel") {
        Gone::Forced
    } else {
        Gone::Released
    }
}

/// A timer of `period` whose missed ticks are not made up.
fn ticker(period: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// Completes on Ctrl-C.
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        // No signal handler: run until killed.
        std::future::pending::<()>().await;
    }
}

/// One change of a lock, as `watch` prints it.
struct Event<'a> {
    kind: &'static str,
    holder: &'a Holder,
    /// The holder's count after the event (0 once it holds nothing).
    count: u64,
    /// The lease left after the event, `None` when the lock is free.
    ttl: Option<Duration>,
    fence: Option<u64>,
}

/// How the holds of the earlier read that are gone by the next one went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    Released,
    Expired,
    /// Removed whoever held them (`relock unlock`, `Lock::force_unlock`).
    Forced,
}

/// Whether the earlier read's lease had run out by the next read (see `watch`).
fn expired_any(before: Option<&LockInfo>, expired: impl Fn(&LockInfo) -> bool) -> bool {
    before.is_some_and(expired)
}

/// The events between two reads of a lock; `gone`: how the holds of the earlier read that are gone
/// went.
fn changes<'a>(before: Option<&'a LockInfo>, after: Option<&'a LockInfo>, gone: Gone) -> Vec<Event<'a>> {
    let mut events = Vec::new();
    let ttl = after.and_then(|a| a.ttl);
    let fence = after.or(before).and_then(|i| i.fence);
    for holder in gone_holders(before, after) {
        let kind = match gone {
            Gone::Expired => "expire",
            Gone::Forced => "force-unlock",
            Gone::Released => "release",
        };
        events.push(Event {
            kind,
            holder,
            count: 0,
            ttl,
            fence,
        });
    }
    if let Some(after) = after {
        for holder in &after.holders {
            let earlier = before.and_then(|b| b.holders.iter().find(|h| h.field == holder.field));
            let kind = match earlier {
                None => "acquire",
                Some(earlier) if holder.count > earlier.count => "reenter",
                Some(earlier) if holder.count < earlier.count => "release",
                Some(_) => continue,
            };
            events.push(Event {
                kind,
                holder,
                count: holder.count,
                ttl,
                fence,
            });
        }
    }
    events
}

/// One event line: text, or a JSON object.
fn emit(cli: &Cli, name: &str, event: &Event<'_>) -> Result<(), Failure> {
    let time = timestamp(SystemTime::now());
    let count = event.count;
    let line = if cli.json {
        serde_json::json!({
            "time": time,
            "event": event.kind,
            "lock": name,
            "holder": to_json(event.holder),
            "count": count,
            "ttl_ms": ttl_ms(event.ttl),
            "fence": event.fence,
        })
        .to_string()
    } else {
        format!(
            "{time} {:<7} {name} holder={} count={count} ttl={} fence={}",
            event.kind,
            holder_name(event.holder),
            event.ttl.map_or_else(|| "-".to_string(), |t| ttl_text(Some(t))),
            event.fence.map_or_else(|| "-".to_string(), |f| f.to_string()),
        )
    };
    out(&line)
}

/// A second connection for messages; `None` if it cannot be made (then `watch` reads on a timer).
async fn connect_subscriber(url: &str, timeout: Duration) -> Option<Client> {
    // The URL was accepted by LockClient::connect_with already (TLS set up there as well).
    let config = Config::from_url(url).ok()?;
    let client = Builder::from_config(config)
        .with_connection_config(|conn| {
            conn.connection_timeout = timeout;
            conn.internal_command_timeout = timeout;
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
        .build()
        .ok()?;
    match tokio::time::timeout(timeout, client.init()).await {
        Ok(Ok(_)) => Some(client),
        _ => None,
    }
}

/// Subscribes to the release channel and, when the server sends keyspace notifications (or is
/// told to by `enable`), to the lock key's keyspace channel, on the server that holds the key.
/// True if keyspace notifications come. `announce`: say on stderr why they do not.
async fn subscribe(
    subscriber: &Client,
    key: &str,
    channel: &str,
    enable: bool,
    timeout: Duration,
    announce: bool,
) -> bool {
    let cluster = matches!(subscriber.client_config().server, ServerConfig::Clustered { .. });
    let slot = fred::types::cluster::ClusterRouting::hash_key(key.as_bytes());
    let bounded = Options {
        timeout: Some(timeout),
        ..Options::default()
    };
    let mut options = bounded.clone();
    if cluster {
        options.cluster_node = subscriber
            .cached_cluster_state()
            .and_then(|state| state.get_server(slot).cloned());
    }
    let on_key = subscriber.with_options(&options);
    let config = CustomCommand::new_static("CONFIG", ClusterHash::Custom(slot), false);
    let flags: Option<String> = on_key
        .custom::<Vec<String>, _>(config.clone(), vec!["GET", "notify-keyspace-events"])
        .await
        .ok()
        .and_then(|reply| reply.get(1).cloned());
    let mut notified = flags.as_deref().is_some_and(keyspace_on);
    if !notified && enable {
        let flags = with_keyspace(flags.as_deref().unwrap_or(""));
        let set: Result<Value, _> = on_key
            .custom(config, vec!["SET", "notify-keyspace-events", flags.as_str()])
            .await;
        match set {
            Ok(_) => notified = true,
            Err(err) => eprintln!("relock: could not turn keyspace notifications on: {err}"),
        }
    }
    if notified {
        let db = match &subscriber.client_config().server {
            ServerConfig::Clustered { .. } => 0,
            _ => subscriber.client_config().database.unwrap_or(0),
        };
        if let Err(err) = on_key.subscribe(format!("__keyspace@{db}__:{key}")).await {
            eprintln!("relock: could not subscribe to keyspace notifications: {err}");
            notified = false;
        }
    }
    if !notified && announce {
        match flags {
            Some(flags) => eprintln!(
                "relock: keyspace notifications are off (notify-keyspace-events {flags:?}); reading the \
                 lock every 200 ms instead (--enable-notifications turns them on)"
            ),
            None => eprintln!(
                "relock: cannot read notify-keyspace-events (CONFIG GET refused?); reading the lock \
                 every 200 ms instead"
            ),
        }
    }
    // Releases announce themselves here; on a cluster of Redis 7 or later by sharded pub/sub,
    // which older servers refuse (they publish to the classic channel then).
    let bounded = subscriber.with_options(&bounded);
    let _ = bounded.subscribe(channel).await;
    if cluster {
        let _ = bounded.ssubscribe(channel).await;
    }
    notified
}

/// Whether `notify-keyspace-events` sends what `watch` needs: keyspace events of hash commands,
/// generic commands (DEL, PEXPIRE) and expiries.
fn keyspace_on(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('A') || ['g', 'h', 'x'].iter().all(|c| flags.contains(*c)))
}

/// `flags` with what `watch` needs added.
fn with_keyspace(flags: &str) -> String {
    let mut out = flags.to_string();
    // `A` stands for every class of event, g, h and x among them.
    let classes = if out.contains('A') { "K" } else { "Kghx" };
    for c in classes.chars() {
        if !out.contains(c) {
            out.push(c);
        }
    }
    out
}
