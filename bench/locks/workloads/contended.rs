//! Tasks contending for one lock: with an empty critical section (`contended`: measures barging,
//! how fast a lock changes hands when nobody holds it for any time), and the hot lock as users meet
//! it (`hot lock`: a 1 ms critical section standing in for a database write, 8 to 512 contenders
//! over 4 clients, each peer at its default retry settings and tuned to poll tightly).

use std::time::Duration;

use relock::{LockClient, LockConfig};

use super::{contend, Run, HOT_CLIENTS, HOT_SECTION};
use crate::peers::{arl_options, redlock_client, rslock_manager, Arl, Redlock, Relock, RelockPermit, Rslock};
use crate::rows::{Library, Params, Retry, Row, Workload};
use crate::support::{self, RedisServer};
use crate::Mode;

/// The contenders and the `handoff_window`s of the window rows ([`handoff_windows`]).
const WINDOW_CONTENDERS: usize = 64;
const WINDOWS_MS: [u64; 2] = [5, 80];

/// redlock's contenders are threads that open a TCP connection per call: past this many, or
/// polling tightly, they would use up the loopback's ephemeral ports (shared with this machine's
/// other work).
const REDLOCK_MAX_CONTENDERS: usize = 64;

/// relock: `tasks` contenders over `clients` clients (of `config`) on one lock.
async fn relock_contend(
    mode: &Mode,
    server: &RedisServer,
    url: &str,
    tasks: usize,
    clients: usize,
    section: Duration,
    config: &LockConfig,
) -> Run {
    let mut connected = Vec::new();
    for _ in 0..clients {
        let client = LockClient::connect_with(url, config.clone()).await;
        connected.push(client.expect("connect"));
    }
    let name = support::unique_name("c");
    let contenders = (0..tasks)
        .map(|i| Relock(connected[i % clients].lock(&name)))
        .collect();
    let r = contend(mode, server, contenders, section, clients).await;
    for client in &connected {
        client.shutdown().await;
    }
    r
}

/// The peers at `retry`: `tasks` contenders over `clients` managers (lockers) on one lock each.
/// redlock only at its default settings and up to [`REDLOCK_MAX_CONTENDERS`].
async fn peers_contend(
    mode: &Mode,
    server: &RedisServer,
    url: &str,
    tasks: usize,
    clients: usize,
    section: Duration,
    retry: Retry,
) -> Vec<Result<Run, (Library, &'static str)>> {
    let urls = vec![url.to_string()];
    let name = support::unique_name("c");
    let mut runs = Vec::new();

    let managers: Vec<_> = (0..clients).map(|_| rslock_manager(&urls, retry)).collect();
    let contenders = (0..tasks)
        .map(|i| Rslock {
            manager: managers[i % clients].clone(),
            key: format!("{name}:r"),
        })
        .collect();
    runs.push(Ok(contend(mode, server, contenders, section, clients).await));

    let mut lockers = Vec::new();
    for _ in 0..clients {
        lockers.push(
            async_redis_lock::Locker::from_redis_url(&urls[0])
                .await
                .expect("async-redis-lock"),
        );
    }
    let contenders = (0..tasks)
        .map(|i| Arl {
            locker: lockers[i % clients].clone(),
            key: format!("{name}:a"),
            options: arl_options(retry),
        })
        .collect();
    runs.push(Ok(contend(mode, server, contenders, section, clients).await));

    if retry == Retry::Tight {
        runs.push(Err((
            Library::Redlock,
            "not run: a TCP connection per try; polling tightly would use up the loopback's ports",
        )));
    } else if tasks > REDLOCK_MAX_CONTENDERS {
        runs.push(Err((
            Library::Redlock,
            "not run: one thread and a TCP connection per try for each contender; this many exhaust ports",
        )));
    } else {
        let clients: Vec<_> = (0..clients).map(|_| redlock_client(&urls)).collect();
        let contenders = (0..tasks)
            .map(|i| Redlock {
                redlock: clients[i % clients.len()].clone(),
                key: format!("{name}:s").into_bytes(),
            })
            .collect();
        runs.push(Ok(contend(mode, server, contenders, section, clients.len()).await));
    }
    runs
}

/// Empty critical section, 2, 8 and 32 tasks over 2 clients: measures barging.
pub async fn contended(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    const NOTE: &str = "empty critical section: measures barging";
    for tasks in [2usize, 8, 32] {
        let params = Params::Tasks(tasks);
        let url = server.url();
        let r = relock_contend(
            mode,
            server,
            &url,
            tasks,
            2,
            Duration::ZERO,
            &LockConfig::default(),
        )
        .await;
        rows.push(r.contended_row(params, &[NOTE]));
        for r in peers_contend(mode, server, &url, tasks, 2, Duration::ZERO, Retry::Default).await {
            rows.push(match r {
                Ok(r) => r.contended_row(params, &[NOTE, "polls"]),
                Err((library, why)) => Row::new(Workload::Contended, library, params).note(why),
            });
        }
    }
}

/// One hot lock, a 1 ms critical section, 8, 64 and 512 contenders over 4 clients; each peer at its
/// default retry settings and polling tightly.
pub async fn hot_lock(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    hot_lock_via(mode, server, &server.url(), rows).await;
    handoff_windows(mode, server, rows).await;
}

/// [`hot_lock`]'s rows, every library reaching `server` at `url` (a proxy, or the server itself).
pub async fn hot_lock_via(mode: &Mode, server: &RedisServer, url: &str, rows: &mut Vec<Row>) {
    for contenders in [8usize, 64, 512] {
        let params = |retry| Params::Hot {
            contenders,
            clients: HOT_CLIENTS,
            retry,
        };
        let default = LockConfig::default();
        let r = relock_contend(mode, server, url, contenders, HOT_CLIENTS, HOT_SECTION, &default).await;
        rows.push(r.hot_row(params(Retry::Waits)));
        for retry in [Retry::Default, Retry::Tight] {
            for r in peers_contend(mode, server, url, contenders, HOT_CLIENTS, HOT_SECTION, retry).await {
                rows.push(match r {
                    Ok(r) => r.hot_row(params(retry)),
                    Err((library, why)) => Row::new(Workload::HotLock, library, params(retry)).note(why),
                });
            }
        }
    }
}

/// relock's hot lock at [`WINDOW_CONTENDERS`] contenders with a shorter and a longer
/// `handoff_window` than the default 20 ms (the hot lock row above): how much of the ideal a
/// longer streak of handoffs within one client buys, and what it costs the other clients' waiters
/// (the wait p99 and the longest wait).
async fn handoff_windows(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    for window_ms in WINDOWS_MS {
        let config = LockConfig::default().handoff_window(Duration::from_millis(window_ms));
        let url = server.url();
        let r = relock_contend(
            mode,
            server,
            &url,
            WINDOW_CONTENDERS,
            HOT_CLIENTS,
            HOT_SECTION,
            &config,
        )
        .await;
        let params = Params::HotWindow {
            contenders: WINDOW_CONTENDERS,
            clients: HOT_CLIENTS,
            window_ms,
        };
        rows.push(r.window_row(params));
    }
}

/// Permits of one semaphore shared by many tasks, each holding one for [`HOT_SECTION`]: how close
/// the permits stay to busy (the ideal: `permits` sections per section length).
pub async fn semaphore(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    const PERMITS: u64 = 10;
    const TASKS: usize = 64;
    let mut connected = Vec::new();
    for _ in 0..HOT_CLIENTS {
        connected.push(LockClient::connect(&server.url()).await.expect("connect"));
    }
    let name = support::unique_name("sem");
    let contenders = (0..TASKS)
        .map(|i| RelockPermit(connected[i % HOT_CLIENTS].semaphore(&name, PERMITS)))
        .collect();
    let r = contend(mode, server, contenders, HOT_SECTION, HOT_CLIENTS).await;
    for client in &connected {
        client.shutdown().await;
    }
    let params = Params::Permits {
        permits: PERMITS,
        tasks: TASKS,
        clients: HOT_CLIENTS,
    };
    rows.push(
        r.semaphore_row(params, PERMITS)
            .note("no peer has a semaphore; the ideal is 10 permits × 1,000 sections/s"),
    );
}
