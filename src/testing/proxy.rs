//! An in-process TCP proxy between clients and one redis-server, to inject network faults: added
//! latency, dropped connections, a partition that blackholes the traffic, replies dropped after
//! the server ran the request, a one-way stall, and a switch of the server behind it (a failover
//! behind a virtual address).

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::Server;

/// A proxy on a free loopback port; stops (and drops its connections) when dropped. Must be
/// created inside a tokio runtime, which runs it.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

struct Shared {
    upstream: AtomicU16,
    latency_us: AtomicU64,
    cut_replies: AtomicBool,
    /// True while partitioned: nothing moves in either direction, and new connections wait.
    partitioned: watch::Sender<bool>,
    /// Bumped to close every open connection.
    epoch: watch::Sender<u64>,
    /// True while requests (client to server) are held back; replies still flow.
    stalled: watch::Sender<bool>,
    /// A chunk containing these bytes, a reply (true) or a request (false), is held back this
    /// long, once.
    delay_once: parking_lot::Mutex<Option<(Vec<u8>, Duration, bool)>>,
}

impl Proxy {
    /// A proxy to the redis-server on `upstream` (a loopback port).
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            upstream: AtomicU16::new(upstream),
            latency_us: AtomicU64::new(0),
            cut_replies: AtomicBool::new(false),
            partitioned: watch::channel(false).0,
            epoch: watch::channel(0).0,
            stalled: watch::channel(false).0,
            delay_once: parking_lot::Mutex::new(None),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Proxy { port, shared, accept }
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`: the server behind it, through it.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Delays every chunk, in each direction, by `latency` (order kept); zero for none.
    pub fn latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.shared.latency_us.store(micros, Ordering::Relaxed);
    }

    /// Closes every open connection (the clients see a reset and reconnect).
    pub fn drop_connections(&self) {
        self.shared.epoch.send_modify(|e| *e += 1);
    }

    /// A partition: until [`heal`](Proxy::heal), bytes stay where they are (as with TCP across a
    /// cut link) and new connections hang.
    pub fn partition(&self) {
        self.shared.partitioned.send_replace(true);
    }

    /// Until [`heal`](Proxy::heal), a connection is closed as soon as the server's reply to it
    /// arrives: the request (say, a script) runs on the server, but its reply never reaches the
    /// client.
    pub fn drop_replies(&self) {
        self.shared.cut_replies.store(true, Ordering::Relaxed);
    }

    /// Until [`heal`](Proxy::heal), requests wait in the proxy (in order) while replies and pushed
    /// messages still reach the clients: a one-way stall.
    pub fn stall_requests(&self) {
        self.shared.stalled.send_replace(true);
    }

    /// Ends a partition, dropped replies and a stall (the latency stays: see
    /// [`latency`](Proxy::latency)). A partition's stalled connections are dropped, as the peers'
    /// timeouts would drop them; a stall's requests go on in order.
    pub fn heal(&self) {
        if *self.shared.partitioned.borrow() {
            self.drop_connections();
        }
        self.shared.partitioned.send_replace(false);
        self.shared.cut_replies.store(false, Ordering::Relaxed);
        self.shared.stalled.send_replace(false);
    }

    /// The next reply chunk that contains `pattern` is held back for `delay` (and everything behind
    /// it on that connection, whose order is kept).
    pub fn delay_reply_once(&self, pattern: &[u8], delay: Duration) {
        *self.shared.delay_once.lock() = Some((pattern.to_vec(), delay, true));
    }

    /// The next request chunk that contains `pattern` is held back for `delay` (and everything
    /// behind it on that connection), while the client's other connections go on.
    pub fn delay_request_once(&self, pattern: &[u8], delay: Duration) {
        *self.shared.delay_once.lock() = Some((pattern.to_vec(), delay, false));
    }

    /// Points the proxy at another server and drops the connections to the old one.
    pub fn set_upstream(&self, port: u16) {
        self.shared.upstream.store(port, Ordering::Relaxed);
        self.drop_connections();
    }
}

/// A proxy in front of each server, in order.
pub async fn in_front_of(servers: &[Server]) -> Vec<Proxy> {
    let mut proxies = Vec::with_capacity(servers.len());
    for server in servers {
        proxies.push(Proxy::start(server.port()).await);
    }
    proxies
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.partitioned.send_replace(false);
        self.drop_connections();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(serve(client, shared.clone()));
            }
            // Out of file descriptors or similar: back off instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn serve(client: TcpStream, shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    epoch.borrow_and_update();
    let mut partitioned = shared.partitioned.subscribe();
    tokio::select! {
        healed = partitioned.wait_for(|p| !p) => if healed.is_err() { return },
        _ = epoch.changed() => return,
    }
    let upstream = shared.upstream.load(Ordering::Relaxed);
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return; // the server is down: the client sees the connection closed
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = pump(client_read, server_write, shared.clone(), false) => {}
        () = pump(server_read, client_write, shared.clone(), true) => {}
        _ = epoch.changed() => {}
    }
    // Dropping both halves of both sockets closes the connection on both sides.
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: Arc<Shared>, replies: bool) {
    let mut partitioned = shared.partitioned.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if partitioned.wait_for(|p| !p).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if replies && shared.cut_replies.load(Ordering::Relaxed) {
            return;
        }
        if !replies {
            let mut stalled = shared.stalled.subscribe();
            if stalled.wait_for(|s| !s).await.is_err() {
                return;
            }
        }
        let delay = {
            let mut armed = shared.delay_once.lock();
            let hit = armed.as_ref().is_some_and(|(pattern, _, on_replies)| {
                *on_replies == replies && buf[..n].windows(pattern.len()).any(|w| w == &pattern[..])
            });
            if hit {
                armed.take().map(|(_, delay, _)| delay)
            } else {
                None
            }
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let latency = shared.latency_us.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        // Bytes read just as a partition began wait for it to heal (which then drops them).
        if partitioned.wait_for(|p| !p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
