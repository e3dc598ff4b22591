//! A throwaway redis-server: started on a free loopback port, paused, resumed, killed and restarted
//! at will, and tied to this process so that it never outlives it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::resp::{command_on, Reply};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// What a missing `redis-server` is told.
pub(super) const NOT_ON_PATH: &str =
    "relock::testing starts redis-server, which is not on PATH: install it (e.g. `apt-get install redis-server`)";

/// A throwaway redis-server on a free loopback port, without persistence: killed, and its
/// directory removed, when dropped, and killed with this process if the process dies first.
pub struct Server {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    password: Option<String>,
}

impl Server {
    /// Starts a server without persistence on a free port.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// As [`start`](Server::start), but an error instead of a panic when `redis-server` cannot be
    /// run (not on `PATH`): for programs that fall back to something else.
    pub fn try_start() -> std::io::Result<Server> {
        match Command::new("redis-server").arg("--version").output() {
            Ok(out) if out.status.success() => Ok(Server::start()),
            Ok(_) | Err(_) => Err(std::io::Error::new(std::io::ErrorKind::NotFound, NOT_ON_PATH)),
        }
    }

    /// Starts a server with extra configuration arguments (e.g. `["--requirepass", "secret"]`).
    pub fn start_with(extra: &[&str]) -> Server {
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
            let mut server = Server {
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

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, for [`LockClient::connect`](crate::LockClient::connect).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`.
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

    /// Whether the process is still running (not killed, not exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Runs one command and returns its reply; panics if the server cannot be reached.
    pub fn cmd(&self, args: &[&str]) -> Reply {
        self.try_cmd(args)
            .unwrap_or_else(|err| panic!("{args:?} on port {}: {err}", self.port))
    }

    /// Runs one command on a connection of its own, within 5 s.
    pub fn try_cmd(&self, args: &[&str]) -> std::io::Result<Reply> {
        self.try_cmd_timeout(args, Duration::from_secs(5))
    }

    /// Runs one command on a connection of its own, within `timeout`.
    pub fn try_cmd_timeout(&self, args: &[&str], timeout: Duration) -> std::io::Result<Reply> {
        command_on(self.port, self.password.as_deref(), args, timeout)
    }

    /// Whether `key` exists.
    pub fn exists(&self, key: &str) -> bool {
        self.cmd(&["EXISTS", key]).as_int() == Some(1)
    }

    /// The keys matching `pattern` (`KEYS`: for tests, not for a server in use).
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

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
    let mut child = spawn_tied(command).unwrap_or_else(|err| panic!("{NOT_ON_PATH} ({err})"));
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

/// A free TCP port on 127.0.0.1 (free when asked; another process may take it before it is used).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}
