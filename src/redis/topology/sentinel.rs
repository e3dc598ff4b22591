//! A primary managed by Sentinel (`redis-sentinel://host:port?sentinelServiceName=NAME`). fred asks the
//! sentinels for the primary and follows failovers; to relock it is one server whose identity is the
//! service name. A failover shows as a new `run_id`: in a `MultiLock` the group then sits out like a
//! restarted master, since the promoted replica may lack the locks. Checks and requests are those
//! of a single server (see `standalone.rs`).

pub(super) fn name(service: &str) -> String {
    format!("sentinel service {service}")
}

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::prelude::{Builder, Config, ReconnectPolicy, ServerConfig};

/// Follows the sentinels' `+switch-master` announcements for the node's service, and makes the
/// node's clients reconnect at once, which sends fred to the sentinels for the new primary.
/// Without it, a client stays on a demoted primary until that primary drops its connections, which
/// after a `SENTINEL FAILOVER` can take seconds (the old primary serves, unreplicated, meanwhile).
/// Runs until aborted (the node's drop).
pub(crate) async fn follow_switches(config: Config, clients: Vec<Client>) {
    let ServerConfig::Sentinel {
        hosts, service_name, ..
    } = &config.server
    else {
        return;
    };
    let mut watchers = Vec::new();
    for host in hosts {
        let watcher = Builder::from_config(Config {
            server: ServerConfig::Centralized { server: host.clone() },
            #[cfg(any(feature = "tls-rustls", feature = "tls-native"))]
            tls: config.tls.clone(),
            ..Config::default()
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2))
        .build();
        match watcher {
            Ok(watcher) => watchers.push(watcher),
            Err(err) => tracing::debug!(%err, "cannot watch a sentinel"),
        }
    }
    let mut handles = Vec::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for watcher in &watchers {
        handles.push(watcher.connect());
        let mut messages = watcher.message_rx();
        let watcher = watcher.clone();
        let tx = tx.clone();
        handles.push(tokio::spawn(async move {
            // SUBSCRIBE again after every reconnect (fred's plain client does not).
            let mut reconnects = watcher.reconnect_rx();
            let _ = super::connected(&watcher).await;
            let _ = watcher.subscribe("+switch-master").await;
            loop {
                tokio::select! {
                    message = messages.recv() => match message {
                        Ok(message) => {
                            let _ = tx.send(message.value.as_string().unwrap_or_default());
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(_) => return Ok(()),
                    },
                    reconnect = reconnects.recv() => {
                        if reconnect.is_err() {
                            return Ok(());
                        }
                        let _ = watcher.subscribe("+switch-master").await;
                    }
                }
            }
        }));
    }
    drop(tx);
    // Each sentinel announces the same switch: react once per new primary.
    let mut last = String::new();
    let stop = Stop(handles);
    drop(watchers);
    while let Some(message) = rx.recv().await {
        // "<service> <old ip> <old port> <new ip> <new port>"
        let mut words = message.split_whitespace();
        if words.next() != Some(service_name.as_str()) {
            continue;
        }
        let new: Vec<&str> = words.skip(2).collect();
        let new = new.join(":");
        if new == last {
            continue;
        }
        tracing::info!(service = %service_name, primary = %new, "sentinels switched the primary; reconnecting");
        last = new;
        for client in &clients {
            let client = client.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), client.force_reconnection()).await;
            });
        }
    }
    drop(stop);
}

/// Stops the sentinel watchers (their connection tasks among them) when the follower ends or is
/// aborted.
struct Stop(Vec<tokio::task::JoinHandle<Result<(), fred::error::Error>>>);

impl Drop for Stop {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}
