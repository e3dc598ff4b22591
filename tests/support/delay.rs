//! A TCP proxy that delays every byte by a fixed time each way: a network between a client and a
//! redis-server on the same machine (the kernel here has no `netem`). Threads, not tokio tasks:
//! tokio's timers count whole milliseconds, and the delays here are a fraction of one. Each
//! direction of each connection has a reader, which stamps what it reads with the time it is due,
//! and a writer, which sends it then: a pipelined stream keeps its throughput, each chunk arriving
//! the delay after it left.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A delaying proxy on a free loopback port; stops accepting when dropped (open connections end
/// with their peers).
pub struct DelayProxy {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl DelayProxy {
    /// A proxy to the redis-server on `upstream` (a loopback port), delaying each way by `one_way`.
    pub fn start(upstream: u16, one_way: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind delay proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
                        continue;
                    };
                    pipe(client, server2, one_way);
                    pipe(server, client2, one_way);
                }
            })
            .expect("delay proxy thread");
        DelayProxy { port, stop }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `redis://` URL to the server through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Forwards what `from` sends to `to`, each chunk `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let _ = std::thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    let _ = std::thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || {
            // The kernel's default timer slack (50 µs) would add itself to every delay.
            #[cfg(target_os = "linux")]
            // SAFETY: PR_SET_TIMERSLACK only sets this thread's timer slack.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
            }
            while let Ok((due, bytes)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&bytes).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
}
