//! The `relock` binary and the inspection API under it, against real redis-servers: locks held by a
//! `LockClient` here, read and removed by the binary run as a process.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use relock::{Error, LockClient, LockConfig, Owner};
use support::topologies::RedisCluster;
use support::{free_port, unique_name, RedisServer};
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_relock");

fn config() -> LockConfig {
    LockConfig::default()
        .watchdog_timeout(Duration::from_secs(3))
        .command_timeout(Duration::from_secs(2))
}

async fn client(url: &str) -> LockClient {
    LockClient::connect_with(url, config()).await.expect("connect")
}

/// Runs the binary to completion off the runtime, `input` on its stdin.
async fn relock(args: &[&str], input: &str) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let input = input.to_string();
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(BIN)
            .args(&args)
            .env_remove("REDIS_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn relock");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(input.as_bytes());
        }
        child.wait_with_output().expect("relock output")
    })
    .await
    .expect("relock thread")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn code(output: &Output) -> Option<i32> {
    output.status.code()
}

/// The cells of the `list` row of `name` (name, owner, holds, ttl, fence).
fn row<'a>(table: &'a str, name: &str) -> Option<Vec<&'a str>> {
    table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
}

/// `list`, `list PATTERN`, `list --json` and `show` describe locks held here: holder, hold counts
/// (a reentrant 2), lease left and fence; a key under the prefix that is not a lock is left out.
/// The fence moves only when a holder draws its token (a plain lock's first read): the holders here
/// read theirs before the lock is inspected, but for one, whose fence is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_describe_held_locks() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = client(&url).await;
    let base = unique_name("cli");
    let twice = format!("{base}:twice");
    let once = format!("{base}:once");
    // A name that JSON must escape.
    let odd = format!("{base}:q\"uo\\te");
    let first = holder.lock(&twice).acquire().await.expect("acquire");
    let second = holder.lock(&twice).acquire().await.expect("re-enter");
    assert_eq!(second.hold_count(), 2);
    let other = holder
        .lock(&once)
        .owner(Owner::new())
        .acquire()
        .await
        .expect("acquire");
    let odd_guard = holder.lock(&odd).acquire().await.expect("acquire");
    // Drawn now: the fence of each of these locks is then its holder's token.
    let first_token = first.fencing_token().await.expect("token");
    let other_token = other.fencing_token().await.expect("token");
    server.cmd(&["SET", &format!("relock:{{{base}:junk}}"), "not a lock"]);
    server.cmd(&["SET", "relock:{unrelated}", "x"]);

    let info = holder.inspect(&twice).await.expect("inspect").expect("held");
    assert_eq!(info.hold_count(), 2);
    assert_eq!(info.holders.len(), 1);
    let client_id = info.holders[0].client_id.clone();
    assert!(info.holders[0].owner.starts_with('t'), "{info:?}");
    assert_eq!(info.fence, Some(first_token));
    assert!(info
        .ttl
        .is_some_and(|t| t > Duration::ZERO && t <= Duration::from_secs(3)));
    // Feature `serde`: the same as JSON, the time left in whole milliseconds.
    let json = serde_json::to_value(&info).expect("serialize");
    assert_eq!(json["name"], twice.as_str(), "{json}");
    assert_eq!(json["fence"], first_token, "{json}");
    assert_eq!(json["holders"][0]["client_id"], client_id.as_str(), "{json}");
    assert!(
        json["ttl_ms"].as_u64().is_some_and(|ms| ms > 0 && ms <= 3000),
        "{json}"
    );

    let listed = relock(&["--url", &url, "list", &format!("{base}:*")], "").await;
    assert_eq!(code(&listed), Some(0), "{listed:?}");
    let table = stdout(&listed);
    println!("{table}");
    assert!(table.starts_with("NAME"), "{table}");
    let cells = row(&table, &twice).unwrap_or_else(|| panic!("{twice} missing: {table}"));
    assert_eq!(cells.len(), 5, "{table}");
    assert_eq!(cells[1], format!("{client_id}:{}", info.holders[0].owner));
    assert_eq!(cells[2], "2");
    let ttl: f64 = cells[3].trim_end_matches('s').parse().expect("ttl");
    assert!(ttl > 0.0 && ttl <= 3.0, "{table}");
    assert_eq!(cells[4], first_token.to_string());
    let cells = row(&table, &once).unwrap_or_else(|| panic!("{once} missing: {table}"));
    assert_eq!(cells[2], "1");
    assert_eq!(cells[4], other_token.to_string());
    // Held, but its holder never read its token: nothing drawn, no fence.
    let odd_info = holder.inspect(&odd).await.expect("inspect").expect("held");
    assert_eq!(odd_info.fence, None, "{odd_info:?}");
    assert!(!table.contains("junk") && !table.contains("unrelated"), "{table}");
    assert_eq!(table.lines().count(), 4, "header and three locks: {table}");

    // A pattern narrows the list; REDIS_URL stands for --url.
    let narrowed = tokio::task::spawn_blocking({
        let url = url.clone();
        let pattern = format!("{base}:tw*");
        move || {
            Command::new(BIN)
                .args(["list", &pattern])
                .env("REDIS_URL", url)
                .output()
                .expect("relock")
        }
    })
    .await
    .expect("thread");
    assert_eq!(code(&narrowed), Some(0), "{narrowed:?}");
    let table = stdout(&narrowed);
    assert!(
        row(&table, &twice).is_some() && row(&table, &once).is_none(),
        "{table}"
    );

    let json = relock(&["--url", &url, "--json", "list", &format!("{base}:*")], "").await;
    assert_eq!(code(&json), Some(0), "{json:?}");
    let json = parse(&stdout(&json));
    let locks = json.as_array().unwrap_or_else(|| panic!("an array: {json}"));
    let listed = |name: &str| locks.iter().find(|lock| lock["name"] == name).cloned();
    let lock = listed(&twice).unwrap_or_else(|| panic!("{twice} listed: {json}"));
    assert_eq!(lock["key"], format!("relock:{{{twice}}}"), "{lock}");
    assert_eq!(lock["hold_count"], 2, "{lock}");
    assert_eq!(lock["fence"], first_token, "{lock}");
    assert_eq!(lock["contended"], false, "{lock}");
    assert_eq!(lock["holders"][0]["client_id"], client_id.as_str(), "{lock}");
    assert!(lock["holders"][0].get("client").is_some(), "{lock}");
    assert!(listed(&format!("{base}:q\"uo\\te")).is_some(), "{json}");

    let shown = relock(&["--url", &url, "show", &twice], "").await;
    assert_eq!(code(&shown), Some(0), "{shown:?}");
    let text = stdout(&shown);
    assert!(text.contains(&format!("key    relock:{{{twice}}}")), "{text}");
    assert!(text.contains("holds  2"), "{text}");
    assert!(text.contains(&format!("fence  {first_token}")), "{text}");
    assert!(
        text.contains(&format!("holder client {client_id} owner t")) && text.contains("count 2"),
        "{text}"
    );

    // Another prefix sees none of them.
    let elsewhere = relock(&["--url", &url, "--prefix", "other", "list"], "").await;
    assert_eq!(code(&elsewhere), Some(0), "{elsewhere:?}");
    assert!(stdout(&elsewhere).is_empty(), "{elsewhere:?}");

    // Nothing was changed by looking.
    assert!(first.is_held() && second.is_held() && other.is_held() && odd_guard.is_held());
    let after = holder.inspect(&twice).await.expect("inspect").expect("held");
    assert_eq!((&after.holders, after.fence), (&info.holders, info.fence));
    holder.shutdown().await;
}

/// `show` of a lock nobody holds exits 1, of a key that is not a lock 3, of a bad name 2; a bad or
/// unreachable URL exits 3; the inspection API refuses bad input before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_locks_bad_names_and_bad_urls_have_their_exit_codes() {
    let server = RedisServer::start();
    let url = server.url();
    let missing = relock(&["--url", &url, "show", &unique_name("missing")], "").await;
    assert_eq!(code(&missing), Some(1), "{missing:?}");
    assert!(stdout(&missing).is_empty());

    // A counting latch of that name is shown (a lock of the name is not held).
    let batch = unique_name("batch");
    let latches = client(&url).await;
    assert!(latches.latch(&batch).set_count(3).await.unwrap());
    let latch = relock(&["--url", &url, "show", &batch], "").await;
    assert_eq!(code(&latch), Some(0), "{latch:?}");
    assert!(
        stdout(&latch).contains(&format!("latch {batch}: 3 count-downs left")),
        "{latch:?}"
    );
    let json = relock(&["--url", &url, "--json", "show", &batch], "").await;
    assert_eq!(
        parse(&stdout(&json)),
        serde_json::json!({ "name": batch, "latch_count": 3 })
    );
    latches.shutdown().await;

    server.cmd(&["SET", "relock:{a-string}", "x"]);
    let foreign = relock(&["--url", &url, "show", "a-string"], "").await;
    assert_eq!(code(&foreign), Some(3), "{foreign:?}");

    let bad_name = relock(&["--url", &url, "show", "a{b}"], "").await;
    assert_eq!(code(&bad_name), Some(2), "{bad_name:?}");
    let bad_prefix = relock(&["--url", &url, "--prefix", "", "list"], "").await;
    assert_eq!(code(&bad_prefix), Some(2), "{bad_prefix:?}");
    let usage = relock(&["--url", &url, "frobnicate"], "").await;
    assert_eq!(code(&usage), Some(2), "{usage:?}");
    for timeout in ["soon", "0s", "2h"] {
        let bad = relock(&["--url", &url, "--timeout", timeout, "list"], "").await;
        assert_eq!(code(&bad), Some(2), "{timeout}: {bad:?}");
    }
    let seconds = relock(&["--url", &url, "--timeout", "2", "list"], "").await;
    assert_eq!(code(&seconds), Some(0), "{seconds:?}");

    let started = Instant::now();
    let refused = format!("redis://127.0.0.1:{}", free_port());
    let unreachable = relock(&["--url", &refused, "--timeout", "1500ms", "list"], "").await;
    assert_eq!(code(&unreachable), Some(3), "{unreachable:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    // A URL that is no URL, or of another scheme, is bad input: refused before any I/O.
    let garbage = relock(&["--url", "not a url", "list"], "").await;
    assert_eq!(code(&garbage), Some(2), "{garbage:?}");
    let http = relock(&["--url", &url.replace("redis://", "http://"), "list"], "").await;
    assert_eq!(code(&http), Some(2), "{http:?}");

    let client = client(&url).await;
    assert!(matches!(client.inspect("").await, Err(Error::InvalidName(_))));
    assert!(matches!(client.inspect("x}").await, Err(Error::InvalidName(_))));
    assert!(matches!(
        client.held_locks(Some("{x")).await,
        Err(Error::InvalidName(_))
    ));
    assert!(matches!(
        client.inspect("a-string").await,
        Err(Error::WrongType(_))
    ));
    assert_eq!(client.inspect(&unique_name("free")).await.expect("inspect"), None);
    client.shutdown().await;
}

/// `unlock` answered "n" removes nothing (exit 4); `unlock --yes` removes the lock and prints what
/// it removed: another client then acquires it, and the holder's guard learns it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_asks_then_removes_and_the_holder_learns_it() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = client(&url).await;
    let name = unique_name("unlock");
    let first = holder.lock(&name).acquire().await.expect("acquire");
    let second = holder.lock(&name).acquire().await.expect("re-enter");

    let refused = relock(&["--url", &url, "unlock", &name], "n\n").await;
    assert_eq!(code(&refused), Some(4), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("[y/N]"),
        "{refused:?}"
    );
    assert!(stdout(&refused).is_empty(), "{refused:?}");
    let info = holder.inspect(&name).await.expect("inspect").expect("still held");
    assert_eq!(info.hold_count(), 2);
    // No answer at all (stdin closed) is no either.
    let silent = relock(&["--url", &url, "unlock", &name], "").await;
    assert_eq!(code(&silent), Some(4), "{silent:?}");
    assert!(holder.lock(&name).is_locked().await.expect("is_locked"));

    let removed = relock(&["--url", &url, "unlock", "--yes", &name], "").await;
    assert_eq!(code(&removed), Some(0), "{removed:?}");
    let text = stdout(&removed);
    assert!(text.starts_with("removed:"), "{text}");
    assert!(
        text.contains(&format!("lock   {name}")) && text.contains("holds  2"),
        "{text}"
    );
    assert!(text.contains(&info.holders[0].client_id), "{text}");

    let other = client(&url).await;
    let taken = other
        .lock(&name)
        .try_acquire_for(Duration::from_secs(5))
        .await
        .expect("acquire")
        .expect("free after unlock");
    // The watchdog renews every second (a third of 3 s): it finds the hold gone.
    let lost = tokio::time::timeout(Duration::from_secs(10), first.lost()).await;
    assert!(lost.is_ok(), "the holder was not told within 10 s");
    assert!(!first.is_held() && !second.is_held());
    drop(taken);

    let nothing = relock(&["--url", &url, "unlock", "--yes", &unique_name("free")], "").await;
    assert_eq!(code(&nothing), Some(1), "{nothing:?}");
    holder.shutdown().await;
    other.shutdown().await;
}

/// A running `relock watch`, its stdout and stderr read line by line on threads.
struct Watch {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    errors: mpsc::Receiver<String>,
}

impl Watch {
    fn start(url: &str, name: &str, extra: &[&str]) -> Watch {
        let mut child = Command::new(BIN)
            .args(["--url", url, "watch", name])
            .args(extra)
            .env_remove("REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn relock watch");
        let (out_tx, lines) = mpsc::channel();
        let (err_tx, errors) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = out_tx.send(line);
                }
            });
        }
        if let Some(stderr) = child.stderr.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let _ = err_tx.send(line);
                }
            });
        }
        Watch { child, lines, errors }
    }

    /// The first line of `rx` containing `text` within `limit`, or the lines that came instead.
    fn wait_for(rx: &mpsc::Receiver<String>, text: &str, limit: Duration) -> Result<String, Vec<String>> {
        let deadline = std::time::Instant::now() + limit;
        let mut others = Vec::new();
        loop {
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
                return Err(others);
            };
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(text) => return Ok(line),
                Ok(line) => others.push(line),
                Err(_) => return Err(others),
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `watch` prints an acquire, a re-entry, a release and an expiry as they happen, by polling when
/// the server sends no keyspace notifications (saying so), and stops with exit 0 on Ctrl-C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_events_by_polling() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("watched");
    let watch = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || {
            let watch = Watch::start(&url, &name, &[]);
            let ready = Watch::wait_for(&watch.errors, "watching", Duration::from_secs(20));
            (watch, ready)
        }
    })
    .await
    .expect("thread");
    let (mut watch, ready) = watch;
    let ready = ready.unwrap_or_else(|err| panic!("watch did not start: {err:?}"));
    assert!(ready.contains("a read every 200 ms"), "{ready}");
    watch_events(&url, &name, &mut watch, false).await;

    // Ctrl-C ends it cleanly.
    let pid = watch.child.id().to_string();
    let status = tokio::task::spawn_blocking(move || {
        let signalled = Command::new("kill").args(["-INT", &pid]).status();
        assert!(signalled.is_ok_and(|s| s.success()));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = watch.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .expect("thread");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "watch did not stop on SIGINT"
    );
}

/// The same events by keyspace notifications, on a server that has them on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_events_by_keyspace_notifications() {
    let server = RedisServer::start_with(&["--notify-keyspace-events", "KA"]);
    let url = server.url();
    let name = unique_name("notified");
    let (mut watch, ready) = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || {
            let watch = Watch::start(&url, &name, &[]);
            let ready = Watch::wait_for(&watch.errors, "watching", Duration::from_secs(20));
            (watch, ready)
        }
    })
    .await
    .expect("thread");
    let ready = ready.unwrap_or_else(|err| panic!("watch did not start: {err:?}"));
    assert!(ready.contains("keyspace notifications"), "{ready}");
    watch_events(&url, &name, &mut watch, true).await;
}

/// Acquire, re-enter, release both levels, then a short fixed lease that runs out, then a
/// force-unlock (told from a release where notifications come): each seen.
async fn watch_events(url: &str, name: &str, watch: &mut Watch, notified: bool) {
    let client = client(url).await;
    let limit = Duration::from_secs(10);
    let guard = client.lock(name).acquire().await.expect("acquire");
    let acquired = next_line(watch, "acquire", limit).await;
    assert!(
        acquired.contains(name) && acquired.contains("count=1"),
        "{acquired}"
    );
    // A plain lock's acquisition draws no token: no fence yet (the name is new).
    assert!(acquired.contains("fence=-"), "{acquired}");
    // The holder's first read draws it; the next event shows it.
    let token = guard.fencing_token().await.expect("token");
    let again = client.lock(name).acquire().await.expect("re-enter");
    let reentered = next_line(watch, "reenter", limit).await;
    assert!(reentered.contains("count=2"), "{reentered}");
    assert!(reentered.contains(&format!("fence={token}")), "{reentered}");
    again.release().await.expect("release");
    let down = next_line(watch, "release", limit).await;
    assert!(down.contains("count=1"), "{down}");
    guard.release().await.expect("release");
    let released = next_line(watch, "release", limit).await;
    assert!(released.contains("count=0"), "{released}");

    let leased = client
        .lock(name)
        .lease(Duration::from_secs(3))
        .acquire()
        .await
        .expect("acquire");
    next_line(watch, "acquire", limit).await;
    let expired = next_line(watch, "expire", limit).await;
    assert!(expired.contains(name), "{expired}");
    drop(leased);

    let held = client.lock(name).acquire().await.expect("acquire");
    next_line(watch, "acquire", limit).await;
    assert!(client.lock(name).force_unlock().await.expect("force"));
    let forced = next_line(watch, if notified { "force-unlock" } else { "release" }, limit).await;
    assert!(forced.contains(name), "{forced}");
    drop(held);
    client.shutdown().await;
}

async fn next_line(watch: &mut Watch, text: &str, limit: Duration) -> String {
    // The receiver is read on a blocking thread and handed back.
    let lines = std::mem::replace(&mut watch.lines, mpsc::channel().1);
    let text_owned = text.to_string();
    let (lines, line) = tokio::task::spawn_blocking(move || {
        let line = Watch::wait_for(&lines, &text_owned, limit);
        (lines, line)
    })
    .await
    .expect("thread");
    watch.lines = lines;
    match line {
        Ok(line) => {
            println!("{line}");
            line
        }
        Err(others) => {
            let errors: Vec<String> = watch.errors.try_iter().collect();
            panic!("no {text} event from watch within {limit:?}; instead {others:?}; stderr {errors:?}")
        }
    }
}

/// `list` on a Redis Cluster finds the locks held on every primary, and only those matching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_a_cluster_scans_every_primary() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .expect("cluster");
    let url = cluster.url();
    let holder = client(&url).await;
    let base = unique_name("spread");
    // Names until every primary has some (the slots decide, not the count).
    let mut names: Vec<String> = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    while covered.len() < 3 || names.len() < 12 {
        let name = format!("{base}:{}", names.len());
        covered.insert(cluster.primary_of(&support::lock_key(&name)).port());
        names.push(name);
    }
    let mut guards = Vec::new();
    for name in &names {
        guards.push(holder.lock(name).acquire().await.expect("acquire"));
    }
    // Drawn (each on its lock's primary), so that each fence is its holder's token.
    let mut tokens = Vec::new();
    for guard in &guards {
        tokens.push(guard.fencing_token().await.expect("token"));
    }
    let primaries: std::collections::BTreeSet<u16> = names
        .iter()
        .map(|name| cluster.primary_of(&support::lock_key(name)).port())
        .collect();
    assert_eq!(primaries.len(), 3, "the names must land on every primary");
    let unrelated = holder
        .lock(&unique_name("unrelated"))
        .acquire()
        .await
        .expect("acquire");

    let listed = relock(&["--url", &url, "list", &format!("{base}:*")], "").await;
    assert_eq!(code(&listed), Some(0), "{listed:?}");
    let table = stdout(&listed);
    println!("{table}");
    for (name, token) in names.iter().zip(&tokens) {
        let cells = row(&table, name).unwrap_or_else(|| panic!("{name} missing: {table}"));
        assert_eq!(cells[2], "1");
        assert_eq!(cells[4], token.to_string());
    }
    assert_eq!(table.lines().count(), 1 + names.len(), "{table}");
    assert!(!table.contains(unrelated.name()), "{table}");

    let all = holder.held_locks(None).await.expect("held_locks");
    assert_eq!(all.len(), names.len() + 1);
    drop(unrelated);
    drop(guards);
    holder.shutdown().await;
}

/// `watch --enable-notifications` on a cluster turns keyspace notifications on where the lock lives
/// (and nowhere else) and prints the events from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_a_cluster_enables_notifications_on_the_lock_primary() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .expect("cluster");
    let url = cluster.url();
    let name = unique_name("clustered");
    let (mut watch, ready) = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || {
            let watch = Watch::start(&url, &name, &["--enable-notifications"]);
            let ready = Watch::wait_for(&watch.errors, "watching", Duration::from_secs(20));
            (watch, ready)
        }
    })
    .await
    .expect("thread");
    let ready = ready.unwrap_or_else(|err| panic!("watch did not start: {err:?}"));
    assert!(ready.contains("keyspace notifications"), "{ready}");
    let owner = cluster.primary_of(&support::lock_key(&name)).port();
    for primary in cluster.primaries() {
        let flags = match primary.cmd(&["CONFIG", "GET", "notify-keyspace-events"]) {
            support::Reply::Array(reply) => reply.get(1).and_then(|f| f.as_str().map(String::from)),
            _ => None,
        };
        let flags = flags.expect("notify-keyspace-events");
        assert_eq!(flags.contains('K'), primary.port() == owner, "{flags:?}");
    }
    // Subscribed where the notifications come from.
    let keyspace = format!("__keyspace@0__:{}", support::lock_key(&name));
    let channels = cluster
        .primary_of(&support::lock_key(&name))
        .cmd(&["PUBSUB", "CHANNELS", "__keyspace@*"]);
    assert_eq!(
        channels,
        support::Reply::Array(vec![support::Reply::Str(keyspace)])
    );
    watch_events(&url, &name, &mut watch, true).await;
}

/// `show` of a semaphore prints its permits and each holder's permits and lease (also with
/// `--json`, and next to a lock of the same name); a holder whose key is gone counts as free;
/// `list --semaphores` lists it; its index of another type exits 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_describes_a_semaphore_and_its_holders() {
    let server = RedisServer::start();
    let url = server.url();
    let (one, two) = (client(&url).await, client(&url).await);
    let name = unique_name("api");
    let two_permits = one.semaphore(&name, 4).acquire(2).await.expect("acquire 2");
    let one_permit = two.semaphore(&name, 4).acquire(1).await.expect("acquire 1");

    let info = one
        .inspect_semaphore(&name)
        .await
        .expect("inspect")
        .expect("a semaphore");
    assert_eq!((info.permits, info.held(), info.available()), (4, 3, 1));
    assert_eq!(info.key, format!("relock:{{{name}}}:sem"));
    assert_eq!(info.holders.len(), 2, "{info:?}");
    let by_permits = |n: u64| {
        info.holders
            .iter()
            .find(|h| h.permits == n)
            .unwrap_or_else(|| panic!("no holder of {n}: {info:?}"))
            .clone()
    };
    let (first, second) = (by_permits(2), by_permits(1));
    assert_ne!(first.client_id, second.client_id);
    assert!(first.generation.is_some() && first.owner.starts_with('o'));
    for holder in &info.holders {
        assert!(
            holder
                .ttl
                .is_some_and(|t| t > Duration::ZERO && t <= Duration::from_secs(3)),
            "{holder:?}"
        );
    }

    let shown = relock(&["--url", &url, "show", &name], "").await;
    assert_eq!(code(&shown), Some(0), "{shown:?}");
    let text = stdout(&shown);
    println!("{text}");
    assert!(text.starts_with(&format!("semaphore {name}\n")), "{text}");
    assert!(
        text.contains(&format!("key       relock:{{{name}}}:sem")),
        "{text}"
    );
    assert!(text.contains("permits   4"), "{text}");
    assert!(text.contains("held      3"), "{text}");
    assert!(text.contains("free      1"), "{text}");
    for holder in [&first, &second] {
        let line = text
            .lines()
            .find(|line| line.contains(&holder.client_id))
            .unwrap_or_else(|| panic!("{} missing: {text}", holder.client_id));
        assert!(
            line.contains(&format!("owner {} ", holder.owner))
                && line.contains(&format!("permits {} ", holder.permits)),
            "{line}"
        );
        let ttl: f64 = line
            .rsplit("ttl ")
            .next()
            .and_then(|t| t.trim_end_matches('s').parse().ok())
            .unwrap_or_else(|| panic!("no ttl: {line}"));
        assert!(ttl > 0.0 && ttl <= 3.0, "{line}");
    }

    let json = relock(&["--url", &url, "--json", "show", &name], "").await;
    assert_eq!(code(&json), Some(0), "{json:?}");
    let json = parse(&stdout(&json));
    assert_eq!(json["name"], name.as_str(), "{json}");
    let semaphore = &json["semaphore"];
    assert_eq!(semaphore["key"], format!("relock:{{{name}}}:sem"), "{json}");
    assert_eq!(
        [&semaphore["permits"], &semaphore["held"], &semaphore["available"]],
        [4, 3, 1],
        "{json}"
    );
    let holders = semaphore["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 2, "{json}");
    for holder in [&first, &second] {
        let shown = holders
            .iter()
            .find(|h| h["key"] == holder.key.as_str())
            .unwrap_or_else(|| panic!("{} shown: {json}", holder.key));
        assert_eq!(shown["client_id"], holder.client_id.as_str(), "{shown}");
        assert_eq!(shown["owner"], holder.owner.as_str(), "{shown}");
        assert_eq!(
            shown["generation"],
            holder.generation.expect("generation"),
            "{shown}"
        );
        assert_eq!(shown["permits"], holder.permits, "{shown}");
        assert!(shown["ttl_ms"].as_u64().is_some(), "{shown}");
    }

    let listed = relock(&["--url", &url, "list", "--semaphores", &name], "").await;
    assert_eq!(code(&listed), Some(0), "{listed:?}");
    let table = stdout(&listed);
    assert_eq!(
        row(&table, &name).map(|cells| cells[..4].to_vec()),
        Some(vec![name.as_str(), "4", "3", "1"]),
        "{table}"
    );

    // A holder whose key is gone (a crashed holder whose lease ran out) counts as free.
    server.cmd(&["DEL", &second.key]);
    let info = one
        .inspect_semaphore(&name)
        .await
        .expect("inspect")
        .expect("a semaphore");
    assert_eq!(info.held(), 2, "{info:?}");
    let keys: Vec<&str> = info.holders.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(keys, vec![first.key.as_str()]);

    // A lock of the same name is shown first, the semaphore after it, in one JSON object too.
    let guard = one.lock(&name).acquire().await.expect("lock");
    let both = relock(&["--url", &url, "show", &name], "").await;
    let text = stdout(&both);
    assert!(
        text.starts_with(&format!("lock   {name}\n"))
            && text.contains(&format!("\n\nsemaphore {name}\n"))
            && text.contains("held      2"),
        "{text}"
    );
    let json = parse(&stdout(
        &relock(&["--url", &url, "--json", "show", &name], "").await,
    ));
    assert_eq!(json["key"], format!("relock:{{{name}}}"), "{json}");
    assert_eq!(json["semaphore"]["held"], 2, "{json}");
    drop(guard);

    // Given back: the semaphore stays, with its permits and no holder; not listed as held.
    two_permits.release().await.expect("release");
    drop(one_permit);
    let shown = relock(&["--url", &url, "show", &name], "").await;
    assert_eq!(code(&shown), Some(0), "{shown:?}");
    assert!(stdout(&shown).contains("free      4"), "{shown:?}");
    let listed = relock(&["--url", &url, "list", "--semaphores", &name], "").await;
    assert_eq!(code(&listed), Some(0), "{listed:?}");
    assert!(stdout(&listed).is_empty(), "{listed:?}");

    server.cmd(&["SET", "relock:{not-a-sem}:sem", "x"]);
    let foreign = relock(&["--url", &url, "show", "not-a-sem"], "").await;
    assert_eq!(code(&foreign), Some(3), "{foreign:?}");
    assert!(matches!(
        one.inspect_semaphore("not-a-sem").await,
        Err(Error::WrongType(_))
    ));
    assert!(matches!(
        one.inspect_semaphore("a{b").await,
        Err(Error::InvalidName(_))
    ));
    one.shutdown().await;
    two.shutdown().await;
}

/// Waits (up to 10 s) until `check` holds for what `read` reads.
async fn until<T, F, R>(what: &str, mut read: F, check: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> R,
    R: std::future::Future<Output = T>,
    T: std::fmt::Debug,
{
    let start = Instant::now();
    loop {
        let value = read().await;
        if check(&value) {
            return value;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: {value:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fair lock's holder and its queue, in order: read by `inspect_fair_lock`, shown by `show`
/// (also with `--json`), listed by `list --fair`; the queue moves on as the lock is handed down
/// and when `unlock --fair` removes the holder; a queue of another type exits 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_describes_a_fair_lock_and_its_queue() {
    let server = RedisServer::start();
    let url = server.url();
    let (one, two) = (client(&url).await, client(&url).await);
    let name = unique_name("fair");
    let held = one.fair_lock(&name).acquire().await.expect("acquire");
    let read = || async { one.inspect_fair_lock(&name).await.expect("inspect") };
    let mut waiters = Vec::new();
    for place in 1..=2 {
        let lock = two.fair_lock(&name);
        waiters.push(tokio::spawn(async move { lock.acquire().await }));
        until("queued", read, |info| {
            info.as_ref().is_some_and(|i| i.queue.len() == place)
        })
        .await;
    }
    let info = read().await.expect("a fair lock");
    let lock = info.lock.as_ref().expect("held");
    assert_eq!(lock.key, format!("relock:{{{name}}}:fair"));
    assert_eq!(lock.hold_count(), 1);
    let holder = &lock.holders[0];
    let queue = &info.queue;
    assert_eq!(queue[0].client_id, queue[1].client_id, "{info:?}");
    assert_ne!(queue[0].client_id, holder.client_id, "{info:?}");
    assert_ne!(queue[0].owner, queue[1].owner, "{info:?}");
    assert!(
        queue.iter().all(|w| w.ttl.is_some_and(|t| t > Duration::ZERO)),
        "{info:?}"
    );

    let shown = relock(&["--url", &url, "show", &name], "").await;
    assert_eq!(code(&shown), Some(0), "{shown:?}");
    let text = stdout(&shown);
    println!("{text}");
    assert!(text.starts_with(&format!("fair lock   {name}\n")), "{text}");
    for (place, waiter) in queue.iter().enumerate() {
        assert!(
            text.contains(&format!(
                "\nqueued {} client {} owner {} ttl ",
                place + 1,
                waiter.client_id,
                waiter.owner
            )),
            "{text}"
        );
    }
    let json = parse(&stdout(
        &relock(&["--url", &url, "--json", "show", &name], "").await,
    ));
    let fair = &json["fair_lock"];
    assert_eq!(fair["name"], name.as_str(), "{json}");
    assert_eq!(fair["lock"]["key"], format!("relock:{{{name}}}:fair"), "{json}");
    assert_eq!(
        fair["queue"][0]["client_id"],
        queue[0].client_id.as_str(),
        "{json}"
    );
    assert_eq!(fair["queue"][0]["owner"], queue[0].owner.as_str(), "{json}");
    assert!(fair["queue"][0]["ttl_ms"].as_u64().is_some(), "{json}");
    let listed = stdout(&relock(&["--url", &url, "list", "--fair", &name], "").await);
    let cells = row(&listed, &name).unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(
        (cells[1], cells[2], cells[4]),
        (
            format!("{}:{}", holder.client_id, holder.owner).as_str(),
            "1",
            "2"
        ),
        "{listed}"
    );

    // Handed down in order: the first waiter holds it, the second still queues.
    held.release().await.expect("release");
    let first = waiters.remove(0).await.unwrap().expect("the first waiter's turn");
    let info = until("handed down", read, |info| {
        info.as_ref()
            .is_some_and(|i| i.lock.is_some() && i.queue.len() == 1)
    })
    .await
    .expect("a fair lock");
    assert_eq!(info.lock.expect("held").holders[0].owner, queue[0].owner);
    assert_eq!(info.queue[0].owner, queue[1].owner);

    // `unlock --fair`: the holder goes (and learns it), the queued waiter gets its turn.
    let refused = relock(&["--url", &url, "unlock", "--fair", &name], "n\n").await;
    assert_eq!(code(&refused), Some(4), "{refused:?}");
    assert!(first.is_held());
    let unlocked = relock(&["--url", &url, "unlock", "--fair", "--yes", &name], "").await;
    assert_eq!(code(&unlocked), Some(0), "{unlocked:?}");
    assert!(
        stdout(&unlocked).starts_with(&format!("removed:\nfair lock   {name}\n")),
        "{unlocked:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), first.lost())
        .await
        .expect("the holder learns it at its watchdog's next round");
    let second = tokio::time::timeout(Duration::from_secs(5), waiters.remove(0))
        .await
        .expect("the queued waiter's turn")
        .unwrap()
        .expect("acquired");
    second.release().await.expect("release");
    assert_eq!(one.inspect_fair_lock(&name).await.expect("inspect"), None);
    let gone = relock(&["--url", &url, "show", &name], "").await;
    assert_eq!(code(&gone), Some(1), "{gone:?}");

    server.cmd(&["SET", "relock:{not-fair}:fair:queue", "x"]);
    assert!(matches!(
        one.inspect_fair_lock("not-fair").await,
        Err(Error::WrongType(_))
    ));
    let foreign = relock(&["--url", &url, "show", "not-fair"], "").await;
    assert_eq!(code(&foreign), Some(3), "{foreign:?}");
    one.shutdown().await;
    two.shutdown().await;
}

/// A read-write lock's readers (each with its lease) and the writer waiting for them: read by
/// `inspect_rw_lock`, shown by `show` (also with `--json`), listed by `list --rw`; then the writer
/// that got it, removed by `unlock --rw`; a readers' set of another type exits 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_describes_a_read_write_lock_its_readers_and_waiting_writers() {
    let server = RedisServer::start();
    let url = server.url();
    let (one, two) = (client(&url).await, client(&url).await);
    let name = unique_name("rw");
    let readers = [
        one.rw_lock(&name).read().acquire().await.expect("read"),
        two.rw_lock(&name).read().acquire().await.expect("read"),
    ];
    let writer = {
        let lock = two.rw_lock(&name).write();
        tokio::spawn(async move { lock.acquire().await })
    };
    let read = || async { one.inspect_rw_lock(&name).await.expect("inspect") };
    let info = until("a writer waits", read, |info| {
        info.as_ref().is_some_and(|i| i.waiting_writers.len() == 1)
    })
    .await
    .expect("a read-write lock");
    assert!(info.writer.is_none(), "{info:?}");
    assert_eq!(info.readers.len(), 2, "{info:?}");
    for reader in &info.readers {
        assert!(
            reader.key.starts_with(&format!("relock:{{{name}}}:rw:readers:"))
                && reader.holder.count == 1
                && reader
                    .ttl
                    .is_some_and(|t| t > Duration::ZERO && t <= Duration::from_secs(3)),
            "{reader:?}"
        );
    }
    assert_ne!(info.readers[0].holder.client_id, info.readers[1].holder.client_id);
    let waiting = &info.waiting_writers[0];

    let shown = relock(&["--url", &url, "show", &name], "").await;
    assert_eq!(code(&shown), Some(0), "{shown:?}");
    let text = stdout(&shown);
    println!("{text}");
    assert!(
        text.starts_with(&format!("read-write lock {name}: not written\n")),
        "{text}"
    );
    for reader in &info.readers {
        assert!(
            text.contains(&format!(
                "\nreader client {} owner {} generation {} count 1 ttl ",
                reader.holder.client_id, reader.holder.owner, reader.holder.generation
            )),
            "{text}"
        );
    }
    assert!(
        text.contains(&format!(
            "\nwaiting writer client {} owner {} ttl ",
            waiting.client_id, waiting.owner
        )),
        "{text}"
    );
    let json = parse(&stdout(
        &relock(&["--url", &url, "--json", "show", &name], "").await,
    ));
    let rw = &json["rw_lock"];
    assert_eq!(rw["name"], name.as_str(), "{json}");
    assert!(rw["writer"].is_null(), "{json}");
    let shown = rw["readers"].as_array().expect("readers");
    assert!(
        shown.iter().any(|r| r["key"] == info.readers[0].key.as_str()),
        "{json}"
    );
    assert!(shown.iter().all(|r| r["ttl_ms"].as_u64().is_some()), "{json}");
    assert_eq!(
        rw["waiting_writers"][0]["client_id"],
        waiting.client_id.as_str(),
        "{json}"
    );
    assert_eq!(
        rw["waiting_writers"][0]["owner"],
        waiting.owner.as_str(),
        "{json}"
    );
    let listed = stdout(&relock(&["--url", &url, "list", "--rw", &name], "").await);
    assert_eq!(
        row(&listed, &name),
        Some(vec![name.as_str(), "-", "2", "1", "-"]),
        "{listed}"
    );

    // The readers leave; the writer gets it.
    for reader in readers {
        reader.release().await.expect("release");
    }
    let written = writer.await.unwrap().expect("the writer's turn");
    let info = read().await.expect("written");
    let lock = info.writer.as_ref().expect("a writer");
    assert_eq!(lock.key, format!("relock:{{{name}}}:rw"));
    assert_eq!(lock.holders[0].owner, waiting.owner);
    assert!(
        info.readers.is_empty() && info.waiting_writers.is_empty(),
        "{info:?}"
    );
    let listed = stdout(&relock(&["--url", &url, "list", "--rw", &name], "").await);
    let cells = row(&listed, &name).unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(
        (cells[1], cells[2], cells[3]),
        (
            format!("{}:{}", waiting.client_id, waiting.owner).as_str(),
            "0",
            "0"
        ),
        "{listed}"
    );
    // `unlock --rw`: the writer goes, and learns it.
    let unlocked = relock(&["--url", &url, "--json", "unlock", "--rw", "--yes", &name], "").await;
    assert_eq!(code(&unlocked), Some(0), "{unlocked:?}");
    let json = parse(&stdout(&unlocked));
    assert_eq!(json["removed"], true, "{json}");
    assert_eq!(json["rw_lock"]["name"], name.as_str(), "{json}");
    assert!(json["rw_lock"]["writer"].is_object(), "{json}");
    tokio::time::timeout(Duration::from_secs(5), written.lost())
        .await
        .expect("the writer learns it at its watchdog's next round");
    assert_eq!(one.inspect_rw_lock(&name).await.expect("inspect"), None);
    let nothing = relock(&["--url", &url, "unlock", "--rw", "--yes", &name], "").await;
    assert_eq!(code(&nothing), Some(1), "{nothing:?}");

    server.cmd(&["SET", "relock:{not-rw}:rw:readers", "x"]);
    assert!(matches!(
        one.inspect_rw_lock("not-rw").await,
        Err(Error::WrongType(_))
    ));
    let foreign = relock(&["--url", &url, "show", "not-rw"], "").await;
    assert_eq!(code(&foreign), Some(3), "{foreign:?}");
    assert!(matches!(
        one.inspect_rw_lock("a{b").await,
        Err(Error::InvalidName(_))
    ));
    one.shutdown().await;
    two.shutdown().await;
}

/// The CLI's JSON output, parsed.
fn parse(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|err| panic!("JSON ({err}): {text}"))
}

/// `list --elections` and `show` name an election's leader (value, term, lease), as text and JSON;
/// after a resignation the election is no longer listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_describe_an_elections_leader() {
    let server = RedisServer::start();
    let url = server.url();
    let leader = client(&url).await;
    let name = unique_name("cli-election");
    let leadership = leader
        .election(&name)
        .campaign("10.0.0.7:8080")
        .await
        .expect("campaign");
    let term = leadership.term().to_string();
    let listed = relock(&["--url", &url, "list", "--elections"], "").await;
    assert_eq!(code(&listed), Some(0));
    let cells = row(&stdout(&listed), &name).expect("listed").join(" ");
    assert!(
        cells.contains("10.0.0.7:8080") && cells.contains(&term),
        "{cells}"
    );
    let json = relock(&["--url", &url, "--json", "list", "--elections"], "").await;
    let parsed: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("JSON");
    let found = parsed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name.as_str())
        .expect("listed");
    assert_eq!(found["leader"]["term"].as_u64(), Some(leadership.term()));
    assert_eq!(found["leader"]["value"], "10.0.0.7:8080");
    let shown = relock(&["--url", &url, "show", &name], "").await;
    assert_eq!(code(&shown), Some(0));
    assert!(
        stdout(&shown).contains(&format!("term {term}")),
        "{}",
        stdout(&shown)
    );
    let shown = relock(&["--url", &url, "--json", "show", &name], "").await;
    let parsed: serde_json::Value = serde_json::from_str(&stdout(&shown)).expect("JSON");
    assert_eq!(parsed["election"]["value"], "10.0.0.7:8080");
    leadership.resign().await.expect("resign");
    let listed = relock(&["--url", &url, "list", "--elections"], "").await;
    assert!(row(&stdout(&listed), &name).is_none(), "gone after resigning");
    let shown = relock(&["--url", &url, "show", &name], "").await;
    assert_eq!(code(&shown), Some(1), "nothing of that name");
    leader.shutdown().await;
}
