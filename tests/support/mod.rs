//! Shared test support: throwaway redis-server processes on free loopback ports, faults (kill, pause,
//! restart), and a tiny synchronous RESP client for assertions that does not go through relock.
#![allow(dead_code)]

pub mod delay;
pub mod proxy;
pub mod tls;
pub mod topologies;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Short leases, so that a few seconds see several watchdog renewals and a lost lease is noticed
/// within seconds: a 1.5 s watchdog lease renewed every 300 ms, requests bounded at 2 s.
pub fn fast_config() -> relock::LockConfig {
    relock::LockConfig::default()
        .watchdog_timeout(Duration::from_millis(1500))
        .renew_interval(Duration::from_millis(300))
        .command_timeout(Duration::from_secs(2))
}

/// A redis-server of this test alone, killed and cleaned up on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    password: Option<String>,
}

impl RedisServer {
    /// Starts a server without persistence on a free port.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra configuration arguments (e.g. `["--requirepass", "secret"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let password = args
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| args.get(i + 1))
            .cloned();
        for _ in 0..20 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!(
                "relock-test-{}-{port}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut server = RedisServer {
                child: None,
                port,
                dir,
                args: args.clone(),
                password: password.clone(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start redis-server on a free port");
    }

    fn spawn(&mut self) -> bool {
        let mut args: Vec<std::ffi::OsString> = vec!["--port".into(), self.port.to_string().into()];
        args.extend(self.args.iter().map(Into::into));
        let ready = || match self.try_cmd_timeout(&["PING"], Duration::from_millis(500)) {
            Ok(Reply::Str(s)) => s == "PONG",
            Ok(Reply::Err(e)) => e.starts_with("NOAUTH"),
            _ => false,
        };
        self.child = spawn_redis(&self.dir, self.port, &args, ready);
        self.child.is_some()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the server keeps its connections but answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
            assert!(
                status.map(|s| s.success()).unwrap_or(false),
                "kill {signal} failed"
            );
        }
    }

    /// Kills the server (if running) and starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "could not restart redis-server on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Runs one command and returns its reply; panics if the server cannot be reached.
    pub fn cmd(&self, args: &[&str]) -> Reply {
        self.try_cmd(args)
            .unwrap_or_else(|err| panic!("{args:?} on port {}: {err}", self.port))
    }

    pub fn try_cmd(&self, args: &[&str]) -> std::io::Result<Reply> {
        self.try_cmd_timeout(args, Duration::from_secs(5))
    }

    pub fn try_cmd_timeout(&self, args: &[&str], timeout: Duration) -> std::io::Result<Reply> {
        command_on(self.port, self.password.as_deref(), args, timeout)
    }

    /// How many times the server ran `command` (lower case, e.g. "evalsha"), from `INFO commandstats`.
    pub fn command_calls(&self, command: &str) -> u64 {
        let info = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.as_str()
            .unwrap_or("")
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// How many script calls the server ran: `EVALSHA` and `FCALL` (the batch runs as a function of
    /// relock's library where the server has them).
    pub fn script_calls(&self) -> u64 {
        self.command_calls("evalsha") + self.command_calls("fcall")
    }

    pub fn exists(&self, key: &str) -> bool {
        self.cmd(&["EXISTS", key]).as_int() == Some(1)
    }

    /// The field of the hold in the lock hash `key` (the first one; a waiter's mark, `field~`, is
    /// no hold).
    pub fn hold_field(&self, key: &str) -> String {
        match self.cmd(&["HKEYS", key]) {
            Reply::Array(fields) => fields
                .iter()
                .filter_map(Reply::as_str)
                .find(|f| !f.ends_with('~'))
                .expect("a hold")
                .to_string(),
            other => panic!("HKEYS {key}: {other:?}"),
        }
    }

    pub fn keys(&self, pattern: &str) -> Vec<String> {
        match self.cmd(&["KEYS", pattern]) {
            Reply::Array(items) => items
                .iter()
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect(),
            other => panic!("KEYS answered {other:?}"),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A reply of the RESP protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Str(String),
    Err(String),
    Array(Vec<Reply>),
}

impl Reply {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            Reply::Str(s) => s.parse().ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Nil)
    }
}

/// One command to the server on `port` (loopback), on a connection of its own.
pub fn command_at(port: u16, args: &[&str], timeout: Duration) -> std::io::Result<Reply> {
    command_on(port, None, args, timeout)
}

fn command_on(port: u16, password: Option<&str>, args: &[&str], timeout: Duration) -> std::io::Result<Reply> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    if let Some(password) = password {
        writer.write_all(&encode(&["AUTH", password]))?;
        read_reply(&mut reader)?;
    }
    writer.write_all(&encode(args))?;
    read_reply(&mut reader)
}

/// `args` as a RESP request.
pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad reply line {line:?}"),
        )
    };
    let (kind, rest) = line.split_at(1.min(line.len()));
    Ok(match kind {
        "+" => Reply::Str(rest.to_string()),
        "-" => Reply::Err(rest.to_string()),
        ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                Reply::Nil
            } else {
                let mut buf = vec![0; len as usize + 2];
                reader.read_exact(&mut buf)?;
                buf.truncate(len as usize);
                Reply::Str(String::from_utf8_lossy(&buf).into_owned())
            }
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                Reply::Nil
            } else {
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(read_reply(reader)?);
                }
                Reply::Array(items)
            }
        }
        _ => return Err(bad()),
    })
}

/// Starts a throwaway redis-server in `dir` (no persistence, loopback only, its log in
/// `dir/redis.log`) with `args` (the port among them), tied to this process (see [`spawn_tied`]),
/// and waits until `ready` says it answers on `port`. `None` if it exited first (most likely the port
/// was taken meanwhile); panics with its log if it does not come up within 10 s.
pub fn spawn_redis(
    dir: &std::path::Path,
    port: u16,
    args: &[std::ffi::OsString],
    mut ready: impl FnMut() -> bool,
) -> Option<Child> {
    let log = std::fs::File::create(dir.join("redis.log")).expect("log file");
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args([
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
        ])
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .stdin(Stdio::null());
    let mut child = spawn_tied(command).expect("redis-server must be on PATH");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if ready() {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    panic!("redis-server on port {port} did not come up:\n{log}");
}

/// Starts `command` from one thread that lives as long as this process, with the kernel asked to
/// SIGKILL the child when that thread dies (`PR_SET_PDEATHSIG` follows the thread that forked): so
/// a server never outlives a test process that was killed. Drop still kills it on a normal exit.
pub fn spawn_tied(command: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc;
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Request>>> = std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::spawn(move || {
            let parent = std::process::id() as libc::pid_t;
            for (mut command, reply) in rx {
                // SAFETY: only async-signal-safe calls between fork and exec.
                unsafe {
                    command.pre_exec(move || {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        // The parent died before the line above: nobody would kill us.
                        if libc::getppid() != parent {
                            libc::_exit(1);
                        }
                        Ok(())
                    });
                }
                let _ = reply.send(command.spawn());
            }
        });
        std::sync::Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((command, reply))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A lock client of either kind, for code that runs the same over one Redis and a MultiLock.
pub enum Locks {
    One(relock::LockClient),
    Quorum(relock::MultiLock),
}

impl Locks {
    pub fn lock(&self, name: &str) -> relock::Lock {
        match self {
            Locks::One(client) => client.lock(name),
            Locks::Quorum(multi) => multi.lock(name),
        }
    }

    pub async fn shutdown(&self) {
        match self {
            Locks::One(client) => client.shutdown().await,
            Locks::Quorum(multi) => multi.shutdown().await,
        }
    }
}

/// A runtime for a synchronous test (a property test drives its cases from plain code): two
/// workers, as the async tests have.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The functions of relock's batch script as the library composes them (`BATCH_FUNCTIONS` in
/// `src/scripts.rs`): the helpers and the functions of every operation.
pub const BATCH_FUNCTIONS: &str = concat!(
    include_str!("../../scripts/prelude.lua"),
    include_str!("../../scripts/acquire.lua"),
    include_str!("../../scripts/release.lua"),
    include_str!("../../scripts/rw_read.lua"),
    include_str!("../../scripts/rw_write.lua"),
    include_str!("../../scripts/rw_write_release.lua"),
    include_str!("../../scripts/rw_unmark.lua"),
    include_str!("../../scripts/fair_acquire.lua"),
    include_str!("../../scripts/fair_release.lua"),
    include_str!("../../scripts/fair_leave.lua"),
    include_str!("../../scripts/transfer.lua"),
    include_str!("../../scripts/transfer_granted.lua"),
);

/// relock's function library as the library composes it (`Library` in `src/scripts.rs`): its
/// name, the name of its batch function, and its code (for `FUNCTION LOAD`).
pub fn batch_library() -> (String, String, String) {
    let template = format!(
        "#!lua name=relock_#\n{BATCH_FUNCTIONS}\nredis.register_function('relock_batch_#', function(KEYS, ARGV)\n{}\nend)\n",
        include_str!("../../scripts/batch.lua")
    );
    let hash = &fred::util::sha1_hash(&template)[..16];
    let (name, function) = (format!("relock_{hash}"), format!("relock_batch_{hash}"));
    let code = template
        .replacen("name=relock_#", &format!("name={name}"), 1)
        .replacen("'relock_batch_#'", &format!("'{function}'"), 1);
    (name, function, code)
}

/// [`batch_library`] loaded on `server` (or found there, loaded already): the name of its batch
/// function, to `FCALL` as relock does. Any other reply of `FUNCTION LOAD` panics.
pub fn load_batch_function(server: &RedisServer) -> String {
    let (_, function, code) = batch_library();
    match server.cmd(&["FUNCTION", "LOAD", &code]) {
        Reply::Str(_) => {}
        Reply::Err(err) if err.contains("already exists") => {}
        other => panic!("FUNCTION LOAD: {other:?}"),
    }
    function
}

/// The names of the function libraries on `server` (`FUNCTION LIST`).
pub fn function_libraries(server: &RedisServer) -> Vec<String> {
    function_list(server, &["FUNCTION", "LIST"], "library_name")
}

/// The code of the function library `name` on `server`, if it has it (`FUNCTION LIST WITHCODE`).
pub fn function_library_code(server: &RedisServer, name: &str) -> Option<String> {
    let list = ["FUNCTION", "LIST", "LIBRARYNAME", name, "WITHCODE"];
    function_list(server, &list, "library_code").into_iter().next()
}

/// The field `field` of each library that the `FUNCTION LIST` command `list` lists.
fn function_list(server: &RedisServer, list: &[&str], field: &str) -> Vec<String> {
    let Reply::Array(libraries) = server.cmd(list) else {
        panic!("FUNCTION LIST");
    };
    libraries
        .iter()
        .filter_map(|library| match library {
            // Each library: a flat list of field names and values.
            Reply::Array(fields) => fields
                .chunks(2)
                .find(|pair| pair[0].as_str() == Some(field))
                .and_then(|pair| pair[1].as_str().map(str::to_string)),
            _ => None,
        })
        .collect()
}

/// The Redis key of the lock `name` under the default prefix.
pub fn lock_key(name: &str) -> String {
    format!("relock:{{{name}}}")
}

/// Waits (without asserting a tight time) until `check` holds; false after `limit`.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// A name no other test (in this process or another) uses.
pub fn unique_name(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Acquires the locks `{base}:0` .. `{base}:{n-1}` of `client`, 500 at a time.
pub async fn acquire_many(client: &relock::LockClient, base: &str, n: usize) -> Vec<relock::LockGuard> {
    let mut guards = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let acquires = chunk.iter().map(|i| {
            let lock = client.lock(&format!("{base}:{i}"));
            async move { lock.acquire().await.expect("acquire") }
        });
        guards.extend(futures::future::join_all(acquires).await);
    }
    guards
}

/// The keys matching `pattern` on `servers`, fence counters and clients' records left out (a fence
/// outlives every lock, and a client's record its holds by up to a lease).
pub fn keys_besides_fences(servers: &[&RedisServer], pattern: &str) -> Vec<String> {
    servers
        .iter()
        .flat_map(|server| server.keys(pattern))
        .filter(|key| !key.ends_with(":fence") && !is_client_record(key))
        .collect()
}

/// Whether `key` is a client's record (`{prefix}:client:{id}`), which a client keeps while it
/// holds anything and which outlives its holds by up to a lease.
pub fn is_client_record(key: &str) -> bool {
    key.split_once(":client:{")
        .is_some_and(|(_, id)| id.len() == 33 && id.ends_with('}'))
}

/// A plain fred client, for reads and writes that do not go through relock.
pub async fn fred_client(url: &str) -> fred::clients::Client {
    use fred::interfaces::ClientLike;
    let config = fred::prelude::Config::from_url(url).expect("url");
    let client = fred::clients::Client::new(config, None, None, None);
    client.init().await.expect("connect");
    client
}

/// `times` non-atomic read-modify-write increments of `counter`, each under `lock`: only mutual
/// exclusion makes the total exact.
pub async fn guarded_increments(
    lock: &relock::Lock,
    admin: &fred::clients::Client,
    counter: &str,
    times: usize,
) {
    use fred::interfaces::KeysInterface;
    for _ in 0..times {
        let guard = lock.acquire().await.expect("acquire");
        let value: Option<i64> = admin.get(counter).await.expect("GET");
        let _: () = admin
            .set(counter, value.unwrap_or(0) + 1, None, None, false)
            .await
            .expect("SET");
        drop(guard);
    }
}
