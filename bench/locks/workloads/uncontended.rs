//! Uncontended cycles: every task acquires and releases a lock of its own, on one server at 1, 16
//! and 256 tasks, and as a Redlock quorum over 1, 3 and 5 masters with one task. The libraries of
//! a row group run interleaved (see [`interleaved`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use relock::{LockClient, MultiLock, QuorumConfig};

use super::{run, Run, Shape};
use crate::peers::{
    arl_options, redlock_client, relock_function, rslock_manager, Arl, FredRelockCommands, FredSetNx,
    Redlock, Relock, Rslock, FRED_RELEASE,
};
use crate::rows::{Library, Params, Retry, Row, Workload};
use crate::support::{self, RedisServer};
use crate::Mode;

/// redlock opens a TCP connection per call: past this many threads it runs out of ports.
const REDLOCK_MAX_TASKS: usize = 16;

/// How long each library runs at a time in [`interleaved`].
const SLICE: Duration = Duration::from_millis(250);

/// A slice's run (see [`Entrant`]).
type SliceRun<'a> = Pin<Box<dyn Future<Output = Run> + 'a>>;

/// One library's cycles, run a slice at a time: each call runs its tasks for the given time.
struct Entrant<'a> {
    slice: Box<dyn FnMut(Duration) -> SliceRun<'a> + 'a>,
}

impl<'a> Entrant<'a> {
    /// `contenders` makes the tasks of one slice: `tasks` cycling tasks on `servers`.
    fn new<C: crate::peers::Contender>(
        servers: &'a [&'a RedisServer],
        mut contenders: impl FnMut() -> Vec<C> + 'a,
    ) -> Entrant<'a> {
        Entrant {
            slice: Box::new(move |time| Box::pin(run(servers, time, contenders(), Shape::Cycles))),
        }
    }

    /// One cycling task per name of `names` on `servers`, its contender made by `make`.
    fn per_name<C: crate::peers::Contender>(
        servers: &'a [&'a RedisServer],
        names: &'a [String],
        make: impl Fn(&'a String) -> C + 'a,
    ) -> Entrant<'a> {
        Entrant::new(servers, move || names.iter().map(&make).collect())
    }
}

/// Runs every entrant for `total` in all, in slices of about [`SLICE`], taking turns (the order
/// rotates, and reverses every other round), and merges each one's slices. On this shared 2-vCPU machine the speed
/// drifts by a factor of two within minutes; rows run one after the other compared moments of
/// different speed (a 1-task row once cost the server 2.45× rslock's in one run and 1.64× in the
/// run before), while interleaved ones meet the same moments.
async fn interleaved(total: Duration, mut entrants: Vec<Entrant<'_>>) -> Vec<Run> {
    let slices = (total.as_millis() / SLICE.as_millis()).max(1) as u32;
    let time = total / slices;
    let mut runs: Vec<Option<Run>> = entrants.iter().map(|_| None).collect();
    let n = entrants.len();
    for round in 0..slices as usize {
        for k in 0..n {
            // Rotated each round, and backwards every other round: each library follows each other
            // one in turn (the server's state after redlock's connection per call, say).
            let k = if round % 2 == 0 { k } else { n - 1 - k };
            let i = (round / 2 + k) % n;
            let slice = (entrants[i].slice)(time).await;
            match &mut runs[i] {
                Some(total) => total.merge(slice),
                None => runs[i] = Some(slice),
            }
        }
    }
    runs.into_iter().map(|r| r.expect("one slice at least")).collect()
}

/// The rows of one group: relock (through `lock`), fred `SET NX` and relock's commands on fred on
/// one server, and the peers, interleaved; `tasks` tasks on locks named after `base`, over
/// `servers` (several: a quorum), which every library reaches at `urls` (the servers', or proxies').
#[allow(clippy::too_many_arguments)]
async fn cycle_rows(
    mode: &Mode,
    servers: &[&RedisServer],
    urls: &[String],
    workload: Workload,
    params: Params,
    tasks: usize,
    lock: &(dyn Fn(&str) -> relock::Lock + Sync),
    rows: &mut Vec<Row>,
) {
    let base = support::unique_name("u");
    let urls = urls.to_vec();
    let quorum = workload == Workload::Redlock;
    let names = |kind: &str| -> Vec<String> { (0..tasks).map(|i| format!("{base}:{kind}{i}")).collect() };
    let (relock_names, fred_names, command_names, rs_names, arl_names, redlock_names) = (
        names("l"),
        names("f"),
        names("c"),
        names("r"),
        names("a"),
        names("s"),
    );

    // The thinnest lock on fred, one client shared by the tasks as relock's are: one server only.
    let fred = if quorum {
        None
    } else {
        use fred::interfaces::LuaInterface;
        let client = support::fred_client(&urls[0]).await;
        let sha: String = client.script_load(FRED_RELEASE).await.expect("SCRIPT LOAD");
        Some((client, std::sync::Arc::<str>::from(sha)))
    };
    // relock's function, loaded by relock's client when it connected (none before Redis 7).
    let function = match &fred {
        Some((client, _)) => relock_function(client).await,
        None => None,
    };
    let manager = rslock_manager(&urls, Retry::Default);
    // async-redis-lock locks one node: no quorum rows.
    let locker = if quorum {
        None
    } else {
        Some(
            async_redis_lock::Locker::from_redis_url(&urls[0])
                .await
                .expect("async-redis-lock"),
        )
    };
    let redlock = (tasks <= REDLOCK_MAX_TASKS).then(|| redlock_client(&urls));

    // In the order of the rows.
    let mut entrants = vec![Entrant::per_name(servers, &relock_names, |name| {
        Relock(lock(name))
    })];
    if let Some((client, sha)) = &fred {
        entrants.push(Entrant::per_name(&servers[..1], &fred_names, |key| FredSetNx {
            client: client.clone(),
            key: key.clone(),
            release_sha: sha.clone(),
        }));
        if let Some(function) = &function {
            entrants.push(Entrant::per_name(&servers[..1], &command_names, |name| {
                FredRelockCommands {
                    client: client.clone(),
                    function: function.clone(),
                    lock: format!("{{{name}}}"),
                    fence: format!("{{{name}}}:fence"),
                }
            }));
        }
    }
    entrants.push(Entrant::per_name(servers, &rs_names, |key| Rslock {
        manager: manager.clone(),
        key: key.clone(),
    }));
    if let Some(locker) = &locker {
        entrants.push(Entrant::per_name(servers, &arl_names, |key| Arl {
            locker: locker.clone(),
            key: key.clone(),
            options: arl_options(Retry::Default),
        }));
    }
    if let Some(redlock) = &redlock {
        entrants.push(Entrant::per_name(servers, &redlock_names, |key| Redlock {
            redlock: redlock.clone(),
            key: key.clone().into_bytes(),
        }));
    }

    for r in interleaved(mode.run, entrants).await {
        rows.push(
            r.cycles_row(workload, params)
                .note("libraries interleaved in 250 ms slices"),
        );
    }
    if quorum {
        rows.push(
            Row::new(workload, Library::AsyncRedisLock, params).note("not supported: single node only"),
        );
    }
    if redlock.is_none() {
        rows.push(
            Row::new(workload, Library::Redlock, params)
                .note("not run: synchronous, opens a TCP connection per call; 256 threads exhaust ports"),
        );
    }
    if let Some((client, _)) = fred {
        use fred::interfaces::ClientLike;
        let _ = client.quit().await;
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

/// One server, 1, 16 and 256 tasks.
pub async fn uncontended(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    uncontended_via(mode, server, &server.url(), rows).await;
}

/// [`uncontended`]'s rows, every library reaching `server` at `url` (a proxy, or the server).
pub async fn uncontended_via(mode: &Mode, server: &RedisServer, url: &str, rows: &mut Vec<Row>) {
    for tasks in [1usize, 16, 256] {
        let client = LockClient::connect(url).await.expect("connect");
        let lock = |name: &str| client.lock(name);
        cycle_rows(
            mode,
            &[server],
            &[url.to_string()],
            Workload::Uncontended,
            Params::Tasks(tasks),
            tasks,
            &lock,
            rows,
        )
        .await;
        client.shutdown().await;
    }
}

/// One task over N = 1, 3 and 5 masters.
pub async fn redlock_quorum(mode: &Mode, masters: &[RedisServer], rows: &mut Vec<Row>) {
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    redlock_quorum_via(mode, masters, &urls, rows).await;
}

/// [`redlock_quorum`]'s rows, every library reaching master `i` at `urls[i]` (a proxy, or the
/// server).
pub async fn redlock_quorum_via(mode: &Mode, masters: &[RedisServer], urls: &[String], rows: &mut Vec<Row>) {
    for n in [1usize, 3, 5] {
        let servers: Vec<&RedisServer> = masters[..n].iter().collect();
        let urls: Vec<String> = urls[..n].to_vec();
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        // The masters were started moments ago (and hold no locks): the restart quarantine would keep
        // them out of every quorum at first.
        let multi = MultiLock::connect_with(&refs, QuorumConfig::default().restart_quarantine(false))
            .await
            .expect("connect masters");
        let lock = |name: &str| multi.lock(name);
        cycle_rows(
            mode,
            &servers,
            &urls,
            Workload::Redlock,
            Params::Masters(n),
            1,
            &lock,
            rows,
        )
        .await;
        multi.shutdown().await;
    }
}
