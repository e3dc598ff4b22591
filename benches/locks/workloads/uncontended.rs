//! Uncontended cycles: every task acquires and releases a lock of its own, on one server at 1, 16
//! and 256 tasks, and as a Redlock quorum over 1, 3 and 5 masters with one task.

use relock::{LockClient, MultiLock, QuorumConfig};

use super::{run, Shape};
use crate::peers::{
    arl_options, redlock_client, rslock_manager, Arl, FredSetNx, Redlock, Relock, Rslock, FRED_RELEASE,
};
use crate::rows::{Library, Params, Retry, Row, Workload};
use crate::support::{self, RedisServer};
use crate::Mode;

/// redlock opens a TCP connection per call: past this many threads it runs out of ports.
const REDLOCK_MAX_TASKS: usize = 16;

/// The peers' cycles over `urls` (several: a quorum), `tasks` tasks on locks named after `base`.
async fn peer_cycles(
    mode: &Mode,
    servers: &[&RedisServer],
    workload: Workload,
    params: Params,
    tasks: usize,
    base: &str,
    rows: &mut Vec<Row>,
) {
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let manager = rslock_manager(&urls, Retry::Default);
    let contenders = (0..tasks)
        .map(|i| Rslock {
            manager: manager.clone(),
            key: format!("{base}:r{i}"),
        })
        .collect();
    let r = run(servers, mode.run, contenders, Shape::Cycles).await;
    rows.push(r.cycles_row(workload, params));

    // async-redis-lock locks one node: no quorum rows.
    if workload != Workload::Redlock {
        let locker = async_redis_lock::Locker::from_redis_url(&urls[0])
            .await
            .expect("async-redis-lock");
        let contenders = (0..tasks)
            .map(|i| Arl {
                locker: locker.clone(),
                key: format!("{base}:a{i}"),
                options: arl_options(Retry::Default),
            })
            .collect();
        let r = run(servers, mode.run, contenders, Shape::Cycles).await;
        rows.push(r.cycles_row(workload, params));
    } else {
        rows.push(
            Row::new(workload, Library::AsyncRedisLock, params).note("not supported: single node only"),
        );
    }

    if tasks <= REDLOCK_MAX_TASKS {
        let client = redlock_client(&urls);
        let contenders = (0..tasks)
            .map(|i| Redlock {
                redlock: client.clone(),
                key: format!("{base}:s{i}").into_bytes(),
            })
            .collect();
        let r = run(servers, mode.run, contenders, Shape::Cycles).await;
        rows.push(r.cycles_row(workload, params));
    } else {
        rows.push(
            Row::new(workload, Library::Redlock, params)
                .note("not run: synchronous, opens a TCP connection per call; 256 threads exhaust ports"),
        );
    }
}

/// relock's cycles through `client`'s locks, `tasks` tasks.
pub async fn relock_cycles(
    mode: &Mode,
    servers: &[&RedisServer],
    client: &LockClient,
    workload: Workload,
    params: Params,
    tasks: usize,
) -> Row {
    let base = support::unique_name("u");
    let contenders = (0..tasks)
        .map(|i| Relock(client.lock(&format!("{base}:{i}"))))
        .collect();
    run(servers, mode.run, contenders, Shape::Cycles)
        .await
        .cycles_row(workload, params)
}

/// The thinnest lock on fred ([`FredSetNx`]), `tasks` tasks sharing one client as relock's do.
async fn fred_cycles(mode: &Mode, server: &RedisServer, params: Params, tasks: usize, base: &str) -> Row {
    use fred::interfaces::{ClientLike, LuaInterface};
    let client = support::fred_client(&server.url()).await;
    let sha: String = client.script_load(FRED_RELEASE).await.expect("SCRIPT LOAD");
    let release_sha: std::sync::Arc<str> = sha.into();
    let contenders = (0..tasks)
        .map(|i| FredSetNx {
            client: client.clone(),
            key: format!("{base}:f{i}"),
            release_sha: release_sha.clone(),
        })
        .collect();
    let row = run(&[server], mode.run, contenders, Shape::Cycles)
        .await
        .cycles_row(Workload::Uncontended, params);
    let _ = client.quit().await;
    row
}

/// One server, 1, 16 and 256 tasks.
pub async fn uncontended(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    for tasks in [1usize, 16, 256] {
        let params = Params::Tasks(tasks);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        rows.push(relock_cycles(mode, &[server], &client, Workload::Uncontended, params, tasks).await);
        client.shutdown().await;
        let base = support::unique_name("u");
        rows.push(fred_cycles(mode, server, params, tasks, &base).await);
        peer_cycles(mode, &[server], Workload::Uncontended, params, tasks, &base, rows).await;
    }
}

/// One task over N = 1, 3 and 5 masters.
pub async fn redlock_quorum(mode: &Mode, masters: &[RedisServer], rows: &mut Vec<Row>) {
    for n in [1usize, 3, 5] {
        let servers: Vec<&RedisServer> = masters[..n].iter().collect();
        let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        let params = Params::Masters(n);
        let base = support::unique_name("q");

        // The masters were started moments ago (and hold no locks): the restart quarantine would keep
        // them out of every quorum at first.
        let multi = MultiLock::connect_with(&refs, QuorumConfig::default().restart_quarantine(false))
            .await
            .expect("connect masters");
        let r = run(&servers, mode.run, vec![Relock(multi.lock(&base))], Shape::Cycles).await;
        rows.push(r.cycles_row(Workload::Redlock, params));
        multi.shutdown().await;

        peer_cycles(mode, &servers, Workload::Redlock, params, 1, &base, rows).await;
    }
}
