//! What a chaos run stands on: the lock servers, a proxy per worker slot and server (so that network
//! faults can hit one worker or one server), the store, and the worker processes with the live view
//! of what each one holds.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::history::{Event, Kind, On, Store};
use crate::support::proxy::Proxy;
use crate::support::topologies::RedisCluster;
use crate::support::{RedisServer, Reply};
use crate::worker::{Settings, Workload};
use crate::Topology;

/// Where a worker task is in its critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Held,
    /// Read the stock and thinks before writing: a pause now makes its write stale.
    Thinking,
}

/// The harness's live view: worker id -> task -> (lock or semaphore, item, phase).
pub type Live = Arc<Mutex<HashMap<u32, HashMap<u32, (On, u32, Phase)>>>>;

pub struct WorkerProcess {
    pub id: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl WorkerProcess {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

pub struct Cluster {
    pub topology: Topology,
    /// The lock servers: one, five masters, or a primary and its replica.
    pub servers: Vec<RedisServer>,
    /// The replicated topology's current primary (an index into `servers`).
    pub primary: usize,
    /// `proxies[slot][server]`; in the replicated topology one per slot, to the current primary.
    pub proxies: Vec<Vec<Proxy>>,
    pub store: RedisServer,
    /// The cluster topology's servers (`servers` is empty then): reached by their own addresses,
    /// so no proxies and no network faults.
    pub redis_cluster: Option<RedisCluster>,
    pub workers: Vec<Option<WorkerProcess>>,
    pub events: Arc<Mutex<Vec<Event>>>,
    pub live: Live,
    pub dir: PathBuf,
    template: Settings,
    next_id: u32,
}

impl Cluster {
    pub async fn start(topology: Topology, slots: usize, template: Settings, dir: PathBuf) -> Cluster {
        let servers: Vec<RedisServer> = match topology {
            Topology::Single => vec![RedisServer::start()],
            Topology::Multi => (0..5).map(|_| RedisServer::start()).collect(),
            Topology::Cluster => Vec::new(),
            Topology::Replicated | Topology::Synced => {
                let primary = RedisServer::start();
                let replica = RedisServer::start();
                replica.cmd(&["REPLICAOF", "127.0.0.1", &primary.port().to_string()]);
                // Workers start once the replica takes writes: before its first sync (seconds,
                // with the diskless sync's delay) every grant of a synced client is undone as
                // short of replicas, and the run would begin with an outage nobody injected.
                tokio::task::block_in_place(|| wait_linked(&replica));
                vec![primary, replica]
            }
        };
        let redis_cluster = (topology == Topology::Cluster)
            .then(|| tokio::task::block_in_place(|| RedisCluster::start(3, 1)));
        let mut proxies = Vec::new();
        for _ in 0..slots {
            // The replicated topology is reached through the primary's address alone.
            let reached = match topology {
                Topology::Replicated | Topology::Synced => &servers[..1],
                _ => &servers[..],
            };
            proxies.push(crate::support::proxy::in_front_of(reached).await);
        }
        let store = RedisServer::start();
        Cluster {
            topology,
            servers,
            primary: 0,
            proxies,
            store,
            redis_cluster,
            workers: (0..slots).map(|_| None).collect(),
            events: Arc::new(Mutex::new(Vec::new())),
            live: Arc::new(Mutex::new(HashMap::new())),
            dir,
            template,
            next_id: 1,
        }
    }

    /// The lock servers that hold the truth: every master, or the current primary.
    pub fn lock_servers(&self) -> Vec<&RedisServer> {
        match self.topology {
            Topology::Replicated | Topology::Synced => vec![&self.servers[self.primary]],
            Topology::Cluster => self
                .redis_cluster
                .as_ref()
                .map(RedisCluster::primaries)
                .unwrap_or_default(),
            _ => self.servers.iter().collect(),
        }
    }

    /// How many items (locks) the workers contend for.
    pub fn items(&self) -> u32 {
        self.template.items
    }

    /// What the workers exercise.
    pub fn workloads(&self) -> &[Workload] {
        &self.template.workloads
    }

    /// A direct address of the lock servers (no proxy): the current primary, or the cluster.
    pub fn admin_url(&self) -> String {
        match &self.redis_cluster {
            Some(cluster) => cluster.url(),
            None => self.servers[self.primary].url(),
        }
    }

    /// Starts a worker process in `slot`, talking to the servers through that slot's proxies.
    pub fn spawn_worker(&mut self, slot: usize) {
        let id = self.next_id;
        self.next_id += 1;
        let settings = Settings {
            id,
            urls: match &self.redis_cluster {
                Some(cluster) => vec![cluster.url()],
                None => self.proxies[slot].iter().map(Proxy::url).collect(),
            },
            store: self.store.url(),
            ..self.template.clone()
        };
        let stderr = std::fs::File::create(self.dir.join(format!("worker-{id}.err"))).expect("worker log");
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args([
                "--ignored",
                "--exact",
                "chaos_worker",
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(settings.to_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        // Tied to this process: a killed harness leaves no worker behind.
        let mut child = crate::support::spawn_tied(command).expect("spawn worker");
        let stdout = child.stdout.take().expect("worker stdout");
        let stdin = child.stdin.take();
        let events = self.events.clone();
        let live = self.live.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(event) = Event::parse(&line) {
                    follow(&live, &event);
                    events.lock().unwrap().push(event);
                }
            }
        });
        self.workers[slot] = Some(WorkerProcess {
            id,
            child,
            stdin,
            reader: Some(reader),
        });
    }

    /// SIGKILL of the worker in `slot`; its lines so far stay in the history.
    pub fn kill_worker(&mut self, slot: usize) {
        if let Some(mut worker) = self.workers[slot].take() {
            let _ = worker.child.kill();
            let _ = worker.child.wait();
            if let Some(reader) = worker.reader.take() {
                let _ = reader.join();
            }
            self.live.lock().unwrap().remove(&worker.id);
        }
    }

    /// What the worker in `slot` holds now, by its lines: (lock or semaphore, item, phase) per task.
    pub fn holding(&self, slot: usize) -> Vec<(On, u32, Phase)> {
        let Some(worker) = &self.workers[slot] else {
            return Vec::new();
        };
        let live = self.live.lock().unwrap();
        live.get(&worker.id)
            .map(|tasks| tasks.values().copied().collect())
            .unwrap_or_default()
    }

    /// Closes every worker's stdin (they finish their round, release and exit), then waits for them;
    /// a worker that does not exit within `limit` is killed. Returns how many had to be killed.
    pub fn stop_workers(&mut self, limit: Duration) -> usize {
        for worker in self.workers.iter_mut().flatten() {
            signal(worker.pid(), libc::SIGCONT);
            worker.stdin.take();
        }
        let deadline = std::time::Instant::now() + limit;
        let mut killed = 0;
        for mut worker in self.workers.iter_mut().filter_map(Option::take) {
            loop {
                if let Ok(Some(_)) = worker.child.try_wait() {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    let _ = worker.child.kill();
                    let _ = worker.child.wait();
                    killed += 1;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Some(reader) = worker.reader.take() {
                let _ = reader.join();
            }
        }
        killed
    }

    /// Keys on the lock servers other than fence counters, semaphore indexes (which keep the number
    /// of permits; a holder's key is checked) and latches (which have no lease: one still counting
    /// at the end stays). A read-write lock's set of readers and a fair lock's queue have no TTL
    /// either: entries of crashed owners are dropped by a later call, so such a key counts as left
    /// only while an owner it lists still has its key (a reader's, a waiter's: that key is left too).
    pub fn keys_left(&self) -> Vec<String> {
        let mut left = Vec::new();
        for server in self.lock_servers() {
            // The guarded writes' lists are the workload's data, not the locks'.
            let keys = crate::support::keys_besides_fences(&[server], "*");
            for key in keys.into_iter().filter(|key| !key.starts_with("guarded:")) {
                let listed = if key.ends_with(":rw:readers") {
                    Some(server.cmd(&["SMEMBERS", &key]))
                } else if key.ends_with(":fair:queue") {
                    Some(server.cmd(&["ZRANGE", &key, "0", "-1"]))
                } else {
                    None
                };
                let owned = match &listed {
                    // A reader's entry is its key; a waiter's, its owner id after the queue's name.
                    Some(crate::support::Reply::Array(items)) => {
                        items.iter().filter_map(|i| i.as_str()).any(|entry| {
                            let entry_key = if key.ends_with(":fair:queue") {
                                format!("{key}:{entry}")
                            } else {
                                entry.to_string()
                            };
                            server.exists(&entry_key)
                        })
                    }
                    Some(_) => true,
                    None => !key.ends_with(":sem") && !key.ends_with(":latch"),
                };
                if owned {
                    left.push(key);
                }
            }
        }
        left
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for slot in 0..self.workers.len() {
            self.kill_worker(slot);
        }
    }
}

pub fn signal(pid: i32, signal: libc::c_int) {
    // SAFETY: kill(2) on a child of ours; an error (already gone) is harmless.
    unsafe { libc::kill(pid, signal) };
}

fn follow(live: &Live, event: &Event) {
    let mut live = live.lock().unwrap();
    let tasks = live.entry(event.worker).or_default();
    let held = |phase| (event.on, event.item, phase);
    match event.kind {
        Kind::Grant { .. } | Kind::Permit { .. } | Kind::Shared { .. } => {
            tasks.insert(event.task, held(Phase::Held));
        }
        Kind::Read {
            store: Store::Accepted { .. },
            ..
        } => {
            tasks.insert(event.task, held(Phase::Thinking));
        }
        Kind::Write { .. } => {
            tasks.insert(event.task, held(Phase::Held));
        }
        Kind::Lost | Kind::Release(_) => {
            tasks.remove(&event.task);
        }
        _ => {}
    }
}

/// Waits (up to 30 s) until `replica`'s link to its primary is up.
fn wait_linked(replica: &RedisServer) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !matches!(replica.try_cmd(&["INFO", "replication"]), Ok(Reply::Str(s)) if s.contains("master_link_status:up"))
    {
        assert!(std::time::Instant::now() < deadline, "the replica never synced");
        std::thread::sleep(Duration::from_millis(50));
    }
}
