//! What a lock cycle cannot beat on this machine. `floor`: a bare `tokio::net::TcpStream` with
//! hand-written RESP running relock's batch (as relock runs it: `FCALL` of its library's function), one acquire and then one release per cycle, one
//! request in flight (two round trips per cycle, as a lock cycle), once from the loop's own task and
//! once through a driver task that owns the connection (as fred's and redis-rs's clients do); and
//! `redis-benchmark -c 1` of a plain `SET` and of the acquire script. `ceiling`: what Redis runs of
//! the same function with 50 connections, with and without pipelining, and fred's `FCALL` round trip.
//!
//! On this 2-vCPU VM one request in flight mostly waits for an idle vCPU to wake up: the direct
//! loop measured ~60 µs per round trip alone and ~15 µs with another thread keeping a vCPU busy. So
//! these rows are the floor of a client that leaves the CPUs idle between requests, not of the
//! wire, and a client whose other work happens to keep a vCPU awake can come out below them (see
//! `peers::Arl`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use hdrhistogram::Histogram;

use crate::host::{measured, Per};
use crate::rows::{histogram, micros, BenchCommand, Library, Metric, Params, Row, Workload};
use crate::support::RedisServer;
use crate::Mode;

/// The batch function's arguments for one fresh acquisition of `key` by `owner` (target count 1),
/// in the short form relock sends for an acquisition alone (`A`: no count of operations, no publish
/// command, no target; a grant answers 0 alone: a plain lock draws its token when it is read).
fn acquire_args<'a>(function: &'a str, key: &'a str, fence: &'a str, owner: &'a str) -> Vec<&'a str> {
    vec!["FCALL", function, "2", key, fence, "A", owner, "30000"]
}

/// The batch function's arguments for one release of `key` by `owner` (down to 0, published if a
/// waiter marked the hold), in the short form relock sends (`R`: no target, the channel made by
/// the script).
fn release_args<'a>(function: &'a str, key: &'a str, owner: &'a str) -> Vec<&'a str> {
    vec!["FCALL", function, "1", key, "1", "PUBLISH", "R", owner]
}

/// Where the RESP reply starting at `at` ends, if `buf` holds all of it.
fn reply_end(buf: &[u8], at: usize) -> Option<usize> {
    let line = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let number = || -> i64 {
        std::str::from_utf8(&buf[at + 1..line])
            .ok()
            .and_then(|n| n.parse().ok())
            .expect("RESP length")
    };
    match buf[at] {
        b'+' | b'-' | b':' => Some(line + 2),
        b'$' => {
            let end = match number() {
                len if len < 0 => line + 2,
                len => line + 2 + len as usize + 2,
            };
            (buf.len() >= end).then_some(end)
        }
        b'*' => (0..number().max(0)).try_fold(line + 2, |p, _| reply_end(buf, p)),
        other => panic!("unexpected RESP type byte {other}"),
    }
}

/// One request, one whole reply.
async fn round_trip(stream: &mut TcpStream, buf: &mut Vec<u8>, request: &[u8]) -> Vec<u8> {
    stream.write_all(request).await.expect("write");
    buf.clear();
    loop {
        if let Some(end) = (!buf.is_empty()).then(|| reply_end(buf, 0)).flatten() {
            return buf[..end].to_vec();
        }
        let mut chunk = [0u8; 512];
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "the server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
}

type Request = (Arc<[u8]>, oneshot::Sender<Vec<u8>>);

/// How the floor loop reaches its connection.
enum Transport {
    /// The loop's own task writes and reads the stream.
    Direct(TcpStream, Vec<u8>),
    /// A driver task owns the stream; requests go to it over a channel and replies come back over
    /// a oneshot, as in fred's and redis-rs's multiplexed connections.
    Driver(mpsc::Sender<Request>),
}

impl Transport {
    async fn connect(server: &RedisServer, driver: bool) -> Transport {
        let stream = TcpStream::connect(server.addr()).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        if !driver {
            return Transport::Direct(stream, Vec::with_capacity(512));
        }
        let (tx, mut rx) = mpsc::channel::<Request>(1);
        tokio::spawn(async move {
            let (mut stream, mut buf) = (stream, Vec::with_capacity(512));
            while let Some((request, reply)) = rx.recv().await {
                let _ = reply.send(round_trip(&mut stream, &mut buf, &request).await);
            }
        });
        Transport::Driver(tx)
    }

    async fn round_trip(&mut self, request: &Arc<[u8]>) -> Vec<u8> {
        match self {
            Transport::Direct(stream, buf) => round_trip(stream, buf, request).await,
            Transport::Driver(tx) => {
                let (reply, answer) = oneshot::channel();
                tx.send((request.clone(), reply)).await.expect("driver task");
                answer.await.expect("driver task")
            }
        }
    }
}

/// Lock cycles of two round trips (acquire, then release) over `transport` for `run`.
async fn floor_cycles(run: Duration, server: &RedisServer, function: &str, transport: Transport) -> Row {
    let params = match transport {
        Transport::Direct(..) => Params::OneInFlight,
        Transport::Driver(_) => Params::OneInFlightDriver,
    };
    let (key, fence) = ("relock:{floor}", "relock:{floor}:fence");
    let owner = "floor-owner:1";
    let acquire: Arc<[u8]> = crate::support::encode(&acquire_args(function, key, fence, owner)).into();
    let release: Arc<[u8]> = crate::support::encode(&release_args(function, key, owner)).into();
    let ((cycles, elapsed, rtt, acquire_rtt), cost) =
        measured(&[server], on_worker(floor_loop(run, transport, acquire, release))).await;
    let row = Row::new(Workload::Floor, Library::BareTcp, params)
        .metric(Metric::CyclesPerS, cycles as f64 / elapsed.as_secs_f64())
        .percentiles(Metric::RttP50Us, Metric::RttP99Us, &rtt)
        .median(Metric::AcquireP50Us, &acquire_rtt)
        .note("relock's batch function, acquire then release: 2 round trips per cycle");
    cost.add_to(row, cycles, Per::Cycle)
}

/// The loop of [`floor_cycles`]: (cycles, elapsed, every round trip, the acquisitions' round trips).
async fn floor_loop(
    run: Duration,
    mut transport: Transport,
    acquire: Arc<[u8]>,
    release: Arc<[u8]>,
) -> (u64, Duration, Histogram<u64>, Histogram<u64>) {
    let (mut rtt, mut acquire_rtt) = (histogram(), histogram());
    let start = Instant::now();
    let deadline = start + run;
    let mut cycles = 0u64;
    while Instant::now() < deadline {
        let t = Instant::now();
        let reply = transport.round_trip(&acquire).await;
        let us = micros(t.elapsed());
        // A fresh grant alone answers 0 alone, not in a list (no token drawn): a real grant each
        // time.
        assert!(reply.as_slice() == b":0\r\n", "acquire answered {reply:?}");
        rtt.record(us).ok();
        acquire_rtt.record(us).ok();
        let t = Instant::now();
        let reply = transport.round_trip(&release).await;
        rtt.record(micros(t.elapsed())).ok();
        // 2 items: 2 released, 0 subscribers heard the release message.
        assert_eq!(reply, b"*3\r\n:2\r\n:2\r\n:0\r\n", "release answered");
        cycles += 1;
    }
    (cycles, start.elapsed(), rtt, acquire_rtt)
}

/// Runs `task` on a runtime worker, as every other row's loops run (`peers::spawn`), and waits for
/// it. A loop awaited in `main`'s `block_on` runs on the main thread instead, which no worker ever
/// is: each reply then wakes it from another thread. Measured on this VM (one request in flight):
/// 35-42 µs p50 in `block_on` against 27-37 µs on a worker for a bare `TcpStream`, and
/// 57-71 against 36-48 µs through fred.
async fn on_worker<T: Send + 'static>(task: impl std::future::Future<Output = T> + Send + 'static) -> T {
    tokio::spawn(task).await.expect("bench task")
}

/// The p50 round trip of the direct `floor` loop (relock's batch function on a bare `TcpStream`, one
/// request in flight) over `run`, in µs: the round trip that workloads outside `floor` count their
/// idle gaps in.
pub async fn round_trip_p50(server: &RedisServer, run: Duration) -> Option<f64> {
    let function = crate::support::load_batch_function(server);
    let transport = Transport::connect(server, false).await;
    floor_cycles(run, server, &function, transport)
        .await
        .get(Metric::RttP50Us)
}

/// Runs `redis-benchmark -q` against `port` and returns (requests per second, p50 in µs).
fn redis_benchmark(port: u16, clients: usize, requests: usize, pipeline: usize, args: &[&str]) -> (f64, f64) {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-c", &clients.to_string()])
        .args(["-n", &requests.to_string(), "-r", "100000"])
        .args(["-P", &pipeline.to_string(), "-q"])
        .args(args)
        .output()
        .expect("redis-benchmark on PATH");
    // The last line: "<command>: 93896.71 requests per second, p50=0.263 msec".
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    let last = text
        .lines()
        .rfind(|l| l.contains("requests per second"))
        .unwrap_or("");
    let per_s = last
        .split(": ")
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    let p50_ms: f64 = last
        .split("p50=")
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    (per_s, p50_ms * 1000.0)
}

/// The floor rows: a bare TcpStream doing lock cycles of two round trips, and redis-benchmark with
/// one connection.
pub async fn floor(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    let function = crate::support::load_batch_function(server);
    for driver in [false, true] {
        let transport = Transport::connect(server, driver).await;
        rows.push(floor_cycles(mode.run, server, &function, transport).await);
    }

    let requests = if mode.quick { 20_000 } else { 100_000 };
    let port = server.port();
    let (set_per_s, set_p50) =
        redis_benchmark(port, 1, requests, 1, &["SET", "relock:floor:{__rand_int__}", "v"]);
    let (acq_per_s, acq_p50) = redis_benchmark(
        port,
        1,
        requests,
        1,
        &acquire_args(
            &function,
            "relock:{f__rand_int__}",
            "relock:{f__rand_int__}:fence",
            "bench-owner",
        ),
    );
    rows.push(
        Row::new(
            Workload::Floor,
            Library::RedisBenchmark,
            Params::Bench {
                clients: 1,
                pipeline: 1,
                command: BenchCommand::SetAndAcquire,
            },
        )
        .metric(Metric::SetPerS, set_per_s)
        .metric(Metric::SetP50Us, set_p50)
        .metric(Metric::AcquireScriptPerS, acq_per_s)
        .metric(Metric::AcquireScriptP50Us, acq_p50)
        .note("redis-benchmark's own latency: a C client, one request in flight"),
    );
}

/// The most Redis does with the same scripts on this machine, and fred's round trip.
pub async fn ceiling(mode: &Mode, server: &RedisServer, rows: &mut Vec<Row>) {
    let function = crate::support::load_batch_function(server);
    let requests = if mode.quick { 50_000 } else { 400_000 };
    let (key, fence) = ("relock:{__rand_int__}", "relock:{__rand_int__}:fence");
    for pipeline in [1usize, 16] {
        let bench = |args: &[&str]| redis_benchmark(server.port(), 50, requests, pipeline, args).0;
        let acq = bench(&acquire_args(&function, key, fence, "bench-owner"));
        let rel = bench(&release_args(&function, key, "bench-owner"));
        let cycles = if acq > 0.0 && rel > 0.0 {
            1.0 / (1.0 / acq + 1.0 / rel)
        } else {
            0.0
        };
        rows.push(
            Row::new(
                Workload::Ceiling,
                Library::RedisBenchmark,
                Params::Bench {
                    clients: 50,
                    pipeline,
                    command: BenchCommand::Scripts,
                },
            )
            .metric(Metric::AcquireScriptPerS, acq)
            .metric(Metric::ReleaseScriptPerS, rel)
            .metric(Metric::CyclesPerS, cycles),
        );
    }
    // One fred connection, one FCALL at a time: the round trip through fred's own client.
    let client = crate::support::fred_client(&server.url()).await;
    let run = mode.run;
    let h = on_worker(async move {
        use fred::interfaces::FunctionInterface;
        let mut h = histogram();
        let deadline = Instant::now() + run;
        while Instant::now() < deadline {
            let t = Instant::now();
            let _: Vec<Vec<i64>> = client
                .fcall(
                    function.as_str(),
                    vec!["relock:{rtt}", "relock:{rtt}:fence"],
                    vec!["1", "PUBLISH", "a", "rtt-owner", "30000", "2"],
                )
                .await
                .expect("fcall");
            h.record(micros(t.elapsed())).ok();
        }
        h
    })
    .await;
    rows.push(
        Row::new(Workload::Ceiling, Library::FredFcall, Params::OneInFlight).percentiles(
            Metric::RttP50Us,
            Metric::RttP99Us,
            &h,
        ),
    );
}
