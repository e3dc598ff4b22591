//! The deployments beyond one server: a Redis Cluster (`redis-cli --cluster create` over
//! throwaway servers), a primary with replicas, and a Sentinel group. Every process is a
//! [`Server`] or tied to this process the same way (see [`spawn_tied`]), so nothing outlives it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::resp::command_at;
use super::{free_port, spawn_tied, Reply, Server};

/// A Redis Cluster on loopback: `primaries` primaries, each with `replicas` replicas, node timeout
/// 1 s, every replica synced before it is handed out.
pub struct Cluster {
    /// Every node, primaries first (`redis-cli --cluster create` makes the first `primaries` of
    /// them primaries), as started: a killed node stays in its place.
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts the cluster and waits until it is settled (see [`settled`](Cluster::settled)).
    pub fn start(primaries: usize, replicas: usize) -> Cluster {
        let nodes: Vec<Server> = (0..primaries * (1 + replicas))
            .map(|_| {
                let bus = free_port().to_string();
                Server::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-port",
                    &bus,
                    // A primary whose replicas are all gone still serves (the tests fault them).
                    "--cluster-require-full-coverage",
                    "no",
                    "--cluster-allow-replica-migration",
                    "no",
                    // A replica is always eligible for failover, however long ago it last heard
                    // from its primary (the tests pause and kill nodes on a loaded machine).
                    "--cluster-replica-validity-factor",
                    "0",
                ])
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(node.addr());
        }
        create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let out = create.output().expect("redis-cli must be on PATH");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { nodes };
        cluster.wait_until(Duration::from_secs(30), "cluster ok, replicas synced", |c| {
            c.settled()
        });
        cluster
    }

    /// `redis-cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://{}", self.nodes[0].addr());
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            url.push(if i == 1 { '?' } else { '&' });
            url.push_str(&format!("node={}", node.addr()));
        }
        url
    }

    /// Whether every live node says the cluster is ok, agrees on the slots, and every replica's
    /// link to its primary is up.
    pub fn settled(&self) -> bool {
        let live: Vec<&Server> = self.live().collect();
        let mut views = Vec::new();
        for node in &live {
            let Ok(Reply::Str(info)) = node.try_cmd(&["CLUSTER", "INFO"]) else {
                return false;
            };
            if !info.contains("cluster_state:ok") {
                return false;
            }
            let Ok(Reply::Str(repl)) = node.try_cmd(&["INFO", "replication"]) else {
                return false;
            };
            if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                return false;
            }
            views.push(self.slot_map_of(node));
        }
        views.windows(2).all(|w| w[0] == w[1])
    }

    fn live(&self) -> impl Iterator<Item = &Server> {
        self.nodes
            .iter()
            .filter(|n| n.try_cmd_timeout(&["PING"], Duration::from_millis(300)).is_ok())
    }

    /// Waits until `done` holds of the cluster, up to `limit`; panics naming `what` if it does not.
    pub fn wait_until(&self, limit: Duration, what: &str, mut done: impl FnMut(&Cluster) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(self) {
            assert!(Instant::now() < deadline, "cluster: not {what} within {limit:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// (first slot, last slot, primary port) per range, as `node` sees it.
    fn slot_map_of(&self, node: &Server) -> Vec<(i64, i64, i64)> {
        let Ok(Reply::Array(ranges)) = node.try_cmd(&["CLUSTER", "SLOTS"]) else {
            return Vec::new();
        };
        let mut out: Vec<(i64, i64, i64)> = ranges
            .iter()
            .filter_map(|range| match range {
                Reply::Array(items) if items.len() >= 3 => {
                    let port = match &items[2] {
                        Reply::Array(primary) => primary.get(1).and_then(Reply::as_int)?,
                        _ => return None,
                    };
                    Some((items[0].as_int()?, items[1].as_int()?, port))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    /// The ports of the primaries that serve slots, sorted (as the first live node sees it).
    pub fn primary_ports(&self) -> Vec<i64> {
        let map = self
            .live()
            .next()
            .map(|n| self.slot_map_of(n))
            .unwrap_or_default();
        let ports: BTreeSet<i64> = map.into_iter().map(|(_, _, port)| port).collect();
        ports.into_iter().collect()
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        let node = self.live().next().expect("a live node");
        node.cmd(&["CLUSTER", "KEYSLOT", key]).as_int().expect("KEYSLOT") as u16
    }

    /// The node serving `slot` now (as a live node sees it).
    pub fn primary_of_slot(&self, slot: u16) -> &Server {
        let node = self.live().next().expect("a live node");
        let port = self
            .slot_map_of(node)
            .into_iter()
            .find(|(a, b, _)| (*a..=*b).contains(&i64::from(slot)))
            .map(|(_, _, port)| port)
            .expect("slot served");
        self.nodes
            .iter()
            .find(|n| i64::from(n.port()) == port)
            .expect("a node of this cluster")
    }

    /// The node holding `key`.
    pub fn primary_of(&self, key: &str) -> &Server {
        self.primary_of_slot(self.slot(key))
    }

    /// The live primaries.
    pub fn primaries(&self) -> Vec<&Server> {
        self.live()
            .filter(|n| matches!(n.try_cmd(&["ROLE"]), Ok(Reply::Array(r)) if r.first().and_then(Reply::as_str) == Some("master")))
            .collect()
    }

    /// A live primary whose port is none of `ports` (the first in node order): where to move a
    /// slot away from its primary, say.
    ///
    /// # Panics
    ///
    /// If there is no such primary.
    pub fn primary_other_than(&self, ports: &[u16]) -> &Server {
        self.primaries()
            .into_iter()
            .find(|p| !ports.contains(&p.port()))
            .expect("a primary other than those")
    }

    /// The live primaries that own slots in the cluster's slot map (as the first live node sees
    /// it). A primary without slots is a failed-over one that woke up and is about to turn
    /// replica: a slot moved to it would fail (`SETSLOT` only runs on primaries).
    pub fn primaries_with_slots(&self) -> Vec<&Server> {
        let map = self
            .live()
            .next()
            .map(|n| self.slot_map_of(n))
            .unwrap_or_default();
        self.primaries()
            .into_iter()
            .filter(|p| map.iter().any(|&(_, _, port)| port == i64::from(p.port())))
            .collect()
    }

    /// The replicas of `primary`.
    pub fn replicas_of(&self, primary: &Server) -> Vec<&Server> {
        let id = node_id(primary);
        self.live()
            .filter(|n| {
                matches!(n.try_cmd(&["CLUSTER", "NODES"]), Ok(Reply::Str(nodes)) if nodes.lines().any(|l| {
                    l.contains("myself") && l.contains("slave") && l.contains(&id)
                }))
            })
            .collect()
    }

    /// Moves `slot` with its keys from its primary to `to`, as `redis-cli --cluster reshard` does:
    /// `SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE` in batches, then `SETSLOT NODE` everywhere.
    pub fn move_slot(&self, slot: u16, to: &Server) {
        self.move_slot_from(self.primary_of_slot(slot), slot, to);
        self.wait_until(Duration::from_secs(20), "agreed on the moved slot", |c| {
            c.settled() && c.primary_of_slot(slot).port() == to.port()
        });
    }

    /// [`move_slot`](Cluster::move_slot) to a primary other than the slot's own (the first in
    /// node order), which it returns: a resharding move of the slot away from where it lives.
    ///
    /// # Panics
    ///
    /// As [`move_slot`](Cluster::move_slot), and if no other primary is live.
    pub fn move_slot_away(&self, slot: u16) -> &Server {
        let to = self.primary_other_than(&[self.primary_of_slot(slot).port()]);
        self.move_slot(slot, to);
        to
    }

    /// [`move_slot`](Cluster::move_slot) from the primary `from`, without waiting for the
    /// cluster to agree on it (every primary was told): a move in a few milliseconds, as a
    /// resharding tool makes it.
    pub fn move_slot_from(&self, from: &Server, slot: u16, to: &Server) {
        assert_ne!(from.port(), to.port(), "the slot is there already");
        let (from_id, to_id) = (node_id(from), node_id(to));
        let slot_arg = slot.to_string();
        expect_ok(to.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id]));
        expect_ok(from.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id]));
        loop {
            let keys = match from.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]) {
                Reply::Array(keys) => keys
                    .iter()
                    .filter_map(|k| k.as_str().map(str::to_string))
                    .collect::<Vec<_>>(),
                other => panic!("GETKEYSINSLOT answered {other:?}"),
            };
            if keys.is_empty() {
                break;
            }
            let port = to.port().to_string();
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            migrate.extend(keys.iter().map(String::as_str));
            expect_ok(from.cmd(&migrate));
        }
        for node in self.primaries() {
            expect_ok(node.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]));
        }
    }

    /// Kills the primary serving `slot`, waits until one of its replicas serves it, then starts the
    /// killed node again (empty: it rejoins as a replica of the new primary) and waits until it is
    /// synced.
    pub fn failover_and_rejoin(&mut self, slot: u16) -> u16 {
        let old = self.primary_of_slot(slot).port();
        let new = self.failover(slot);
        let node = self.nodes.iter_mut().find(|n| n.port() == old).expect("node");
        node.restart();
        self.wait_until(Duration::from_secs(30), "rejoined", |c| {
            c.settled() && c.replicas_of(c.primary_of_slot(slot)).len() == 1
        });
        new
    }

    /// Kills the primary serving `slot` and waits until one of its replicas serves it. If no
    /// replica has won an election within 15 s (the machine is loaded: the votes come late), one
    /// is told to take over (`CLUSTER FAILOVER TAKEOVER`), which needs no votes.
    pub fn failover(&mut self, slot: u16) -> u16 {
        let primary = self.primary_of_slot(slot);
        let port = primary.port();
        let replicas: Vec<u16> = self.replicas_of(primary).iter().map(|r| r.port()).collect();
        let node = self.nodes.iter_mut().find(|n| n.port() == port).expect("node");
        node.kill();
        let moved = |c: &Cluster| {
            c.live().next().is_some_and(|live| {
                c.slot_map_of(live)
                    .iter()
                    .any(|(a, b, p)| (*a..=*b).contains(&i64::from(slot)) && *p != i64::from(port))
            })
        };
        let elected = Instant::now() + Duration::from_secs(15);
        while !moved(self) && Instant::now() < elected {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !moved(self) {
            if let Some(replica) = self.nodes.iter().find(|n| replicas.contains(&n.port())) {
                let _ = replica.try_cmd(&["CLUSTER", "FAILOVER", "TAKEOVER"]);
            }
        }
        self.wait_until(Duration::from_secs(30), "failed over", moved);
        self.primary_of_slot(slot).port()
    }
}

fn node_id(node: &Server) -> String {
    node.cmd(&["CLUSTER", "MYID"]).as_str().expect("MYID").to_string()
}

fn expect_ok(reply: Reply) {
    assert!(
        matches!(&reply, Reply::Str(s) if s == "OK") || matches!(&reply, Reply::Str(_)),
        "expected OK, got {reply:?}"
    );
}

/// A primary with `replicas` replicas (plain replication), every replica synced.
pub struct Replicated {
    /// The primary.
    pub primary: Server,
    /// Its replicas.
    pub replicas: Vec<Server>,
}

impl Replicated {
    /// Starts the primary and `replicas` replicas of it, and waits until they are synced.
    pub fn start(replicas: usize) -> Replicated {
        let primary = Server::start();
        let port = primary.port().to_string();
        let replicas = (0..replicas)
            .map(|_| Server::start_with(&["--replicaof", "127.0.0.1", &port]))
            .collect();
        let group = Replicated { primary, replicas };
        group.wait_synced();
        group
    }

    /// Waits until every replica's link to the primary is up.
    pub fn wait_synced(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for replica in &self.replicas {
            while !matches!(replica.try_cmd(&["INFO", "replication"]), Ok(Reply::Str(s)) if s.contains("master_link_status:up"))
            {
                assert!(Instant::now() < deadline, "replica not synced");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A primary, its replicas, and three sentinels watching them as the service `relock`.
pub struct SentinelGroup {
    /// The primary and its replicas.
    pub data: Replicated,
    /// The three sentinels.
    pub sentinels: Vec<Sentinel>,
}

/// One `redis-server --sentinel` process.
pub struct Sentinel {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The service name the sentinels watch the primary as.
pub const SERVICE: &str = "relock";

impl SentinelGroup {
    /// Starts a primary with `replicas` replicas and three sentinels, and waits until the
    /// sentinels know the replicas and each other.
    pub fn start(replicas: usize) -> SentinelGroup {
        let data = Replicated::start(replicas);
        let sentinels = (0..3).map(|_| Sentinel::start(data.primary.port())).collect();
        let group = SentinelGroup { data, sentinels };
        // Every sentinel knows the replica and the other sentinels before anyone relies on them.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !group.sentinels.iter().all(|s| {
            let replicas = s.cmd(&["SENTINEL", "REPLICAS", SERVICE]);
            let others = s.cmd(&["SENTINEL", "SENTINELS", SERVICE]);
            matches!(replicas, Reply::Array(r) if r.len() == group.data.replicas.len())
                && matches!(others, Reply::Array(o) if o.len() == 2)
        }) {
            assert!(Instant::now() < deadline, "sentinels did not discover each other");
            std::thread::sleep(Duration::from_millis(200));
        }
        group
    }

    /// `redis-sentinel://` over the three sentinels.
    pub fn url(&self) -> String {
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName={SERVICE}",
            self.sentinels[0].port
        );
        for s in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", s.port));
        }
        url
    }

    /// The port of the primary as the sentinels see it.
    pub fn primary_port(&self) -> u16 {
        match self.sentinels[0].cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]) {
            Reply::Array(addr) => addr[1].as_int().expect("port") as u16,
            other => panic!("GET-MASTER-ADDR-BY-NAME answered {other:?}"),
        }
    }

    /// `SENTINEL FAILOVER`, and waits until the old replica is the primary and the old primary
    /// replicates from it.
    pub fn failover(&self) -> u16 {
        let before = self.primary_port();
        expect_ok(self.sentinels[0].cmd(&["SENTINEL", "FAILOVER", SERVICE]));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = self.primary_port();
            let promoted = [&self.data.primary]
                .into_iter()
                .chain(&self.data.replicas)
                .find(|s| s.port() == now);
            if now != before
                && promoted.is_some_and(|p| matches!(p.try_cmd(&["ROLE"]), Ok(Reply::Array(r)) if r.first().and_then(Reply::as_str) == Some("master")))
            {
                return now;
            }
            assert!(Instant::now() < deadline, "sentinel failover did not finish");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Sentinel {
    fn start(primary: u16) -> Sentinel {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("relock-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 5000\n",
                dir.display()
            ),
        )
        .expect("sentinel.conf");
        let log = std::fs::File::create(dir.join("sentinel.log")).expect("log");
        let mut command = Command::new("redis-server");
        command
            .arg(&conf)
            .arg("--sentinel")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .stdin(Stdio::null());
        let child =
            spawn_tied(command).unwrap_or_else(|err| panic!("{} ({err})", super::server::NOT_ON_PATH));
        let sentinel = Sentinel { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while sentinel.try_cmd(&["PING"]).is_err() {
            assert!(Instant::now() < deadline, "sentinel did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }

    fn try_cmd(&self, args: &[&str]) -> std::io::Result<Reply> {
        command_at(self.port, args, Duration::from_secs(5))
    }

    /// Runs one command on the sentinel; panics if it cannot be reached.
    pub fn cmd(&self, args: &[&str]) -> Reply {
        self.try_cmd(args).expect("sentinel command")
    }
}
