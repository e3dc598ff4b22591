//! The `tracing` spans of an acquisition, a release and a watchdog round, with their fields, and
//! the library's events nested inside them, read by a capturing layer on a real server.

mod support;

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relock::{LockClient, LockConfig, MultiLock, QuorumConfig};
use support::{unique_name, RedisServer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A closed span: its name and its fields as text.
#[derive(Debug, Clone)]
struct Closed {
    name: &'static str,
    fields: HashMap<String, String>,
}

/// An event's message, the name of the span it was in, and its other fields as text.
type Seen = (String, Option<&'static str>, HashMap<String, String>);

#[derive(Default, Clone)]
struct Capture {
    closed: Arc<Mutex<Vec<Closed>>>,
    events: Arc<Mutex<Vec<Seen>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<HashMap<String, String>>() {
                values.record(&mut Fields(fields));
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let span = ctx.event_span(event).map(|s| s.name());
        self.events.lock().unwrap().push((message, span, fields));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<HashMap<String, String>>()
                .cloned()
                .unwrap_or_default();
            self.closed.lock().unwrap().push(Closed {
                name: span.name(),
                fields,
            });
        }
    }
}

impl Capture {
    /// A capture of `debug` and above, the thread's subscriber until the guard goes. The tests
    /// run on one thread: it then sees every task of the test, the library's included.
    fn install() -> (Capture, tracing::subscriber::DefaultGuard) {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry()
            .with(capture.clone())
            .with(tracing_subscriber::filter::LevelFilter::DEBUG);
        (capture, tracing::subscriber::set_default(subscriber))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn acquire_release_and_watchdog_rounds_have_spans() {
    let (capture, _default) = Capture::install();

    let server = RedisServer::start();
    let config = LockConfig::default()
        .watchdog_timeout(Duration::from_millis(900))
        .renew_interval(Duration::from_millis(200));
    let client = LockClient::connect_with(&server.url(), config)
        .await
        .expect("connect");
    let other = LockClient::connect(&server.url()).await.expect("connect");
    let name = unique_name("spans");
    let guard = client.lock(&name).acquire().await.expect("acquire");
    // A plain lock's token is drawn on its first read, after the acquire span closed.
    let token = guard.fencing_token().await.expect("token");
    assert!(token > 0);
    // Held across a few watchdog rounds, then refused to another client.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(other.lock(&name).try_acquire().await.expect("try").is_none());
    // A waiter whose caller gives up: its span still says how it ended.
    let gave_up = tokio::time::timeout(Duration::from_millis(100), other.lock(&name).acquire()).await;
    assert!(gave_up.is_err(), "the lock was held");
    guard.release().await.expect("release");
    // A fair lock and the write side of a read-write lock draw their tokens when granted: their
    // acquire spans record them.
    let fair_name = unique_name("spans-fair");
    let fair = client.fair_lock(&fair_name).acquire().await.expect("acquire");
    let fair_token = fair.fencing_token().await.expect("token");
    fair.release().await.expect("release");
    let write_name = unique_name("spans-write");
    let write = client
        .rw_lock(&write_name)
        .write()
        .acquire()
        .await
        .expect("acquire");
    let write_token = write.fencing_token().await.expect("token");
    write.release().await.expect("release");
    client.shutdown().await;
    other.shutdown().await;

    let closed = capture.closed.lock().unwrap().clone();
    let with = |span: &str, field: &str, value: &str| {
        closed
            .iter()
            .filter(|c| c.name == span && c.fields.get(field).map(String::as_str) == Some(value))
            .count()
    };
    let acquires: Vec<&Closed> = closed
        .iter()
        .filter(|c| c.name == "acquire" && c.fields.get("lock") == Some(&name))
        .collect();
    assert_eq!(acquires.len(), 3, "{closed:#?}");
    let granted = acquires
        .iter()
        .find(|c| c.fields.get("outcome").map(String::as_str) == Some("granted"))
        .expect("a granted acquire span");
    assert_eq!(granted.fields.get("mode").map(String::as_str), Some("wait"));
    // A plain lock's grant carries no token (none is drawn until the holder reads it): the span's
    // `token` stays empty.
    assert_eq!(granted.fields.get("token"), None, "{granted:?}");
    for (lock, token) in [(&fair_name, fair_token), (&write_name, write_token)] {
        let granted: Vec<&Closed> = closed
            .iter()
            .filter(|c| c.name == "acquire" && c.fields.get("lock") == Some(lock))
            .collect();
        assert_eq!(granted.len(), 1, "{closed:#?}");
        assert_eq!(
            granted[0].fields.get("outcome").map(String::as_str),
            Some("granted")
        );
        assert!(token > 0, "{lock}: {token}");
        assert_eq!(
            granted[0].fields.get("token"),
            Some(&token.to_string()),
            "{lock}: drawn at grant, recorded in the span"
        );
    }
    assert!(
        granted.fields.get("owner").is_some_and(|o| !o.is_empty()),
        "{granted:?}"
    );
    assert!(
        granted
            .fields
            .get("waited_us")
            .is_some_and(|w| w.parse::<u64>().is_ok()),
        "{granted:?}"
    );
    assert_eq!(with("acquire", "outcome", "refused"), 1, "{closed:#?}");
    let cancelled = acquires
        .iter()
        .find(|c| c.fields.get("outcome").map(String::as_str) == Some("cancelled"))
        .expect("a cancelled acquire span");
    assert!(
        cancelled
            .fields
            .get("waited_us")
            .and_then(|w| w.parse::<u64>().ok())
            .is_some_and(|w| w >= 90_000),
        "{cancelled:?}"
    );
    let releases = closed
        .iter()
        .filter(|c| c.name == "release" && c.fields.get("lock") == Some(&name))
        .filter(|c| c.fields.get("outcome").map(String::as_str) == Some("released"))
        .count();
    assert_eq!(releases, 1, "{closed:#?}");
    // The fair and the write lock's releases.
    assert_eq!(with("release", "outcome", "released"), 3, "{closed:#?}");
    let rounds = closed.iter().filter(|c| c.name == "watchdog_round").count();
    assert!(rounds >= 2, "{rounds} watchdog rounds: {closed:#?}");

    // The library's events nest in the spans.
    let events = capture.events.lock().unwrap().clone();
    let inside = |message: &str, span: &str| events.iter().any(|(m, s, _)| m == message && *s == Some(span));
    assert!(inside("lock acquired", "acquire"), "{events:#?}");
    assert!(inside("lock released", "release"), "{events:#?}");
    assert!(inside("watchdog round", "watchdog_round"), "{events:#?}");
}

/// A refused round over several masters says which masters granted and which had the lock
/// taken: a waiter that stays refused while the lock looks free is explained by that event.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_quorum_round_names_the_masters_that_were_busy() {
    let (capture, _default) = Capture::install();

    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    // Masters started just now would sit out their first lease.
    let quorum = QuorumConfig::default().restart_quarantine(false);
    let holder = MultiLock::connect_with(&urls, quorum.clone())
        .await
        .expect("connect");
    let waiter = MultiLock::connect_with(&urls, quorum).await.expect("connect");
    let name = unique_name("refused");
    let guard = holder.lock(&name).acquire().await.expect("acquire");
    assert!(waiter.lock(&name).try_acquire().await.expect("try").is_none());
    guard.release().await.expect("release");

    let events = capture.events.lock().unwrap().clone();
    let refused: Vec<_> = events
        .iter()
        .filter(|(m, _, _)| m == "quorum round refused; undoing its grants")
        .collect();
    assert_eq!(refused.len(), 1, "{events:#?}");
    let fields = &refused[0].2;
    // Two refusals decide the round: the third master's answer is not waited for.
    let busy = &fields["busy"];
    let named = servers
        .iter()
        .filter(|server| busy.contains(&format!("127.0.0.1:{}", server.port())))
        .count();
    assert_eq!(named, 2, "{fields:?}");
    assert_eq!(fields["answered"], "2", "{fields:?}");
    assert_eq!(fields["granted"], "[]", "{fields:?}");
    assert_eq!(fields["needed"], "2", "{fields:?}");
}
