//! The nemesis: faults drawn on a seeded schedule, one at a time, each healed before the next.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::cluster::{signal, Cluster, Phase};
use crate::history::{now_ns, Crash, Harness, Kind, On};
use crate::worker::Workload;
use crate::{Rng, Topology};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL and restart, empty, of the server (one Redis) or of a minority of the masters.
    RestartServers,
    /// SIGSTOP, then SIGCONT, of a server (or a minority of the masters).
    PauseServers,
    /// SIGKILL of a worker process that holds a lock; a new worker takes its place.
    KillHolder,
    /// SIGSTOP of a worker that holds a lock, past its lease (the GC pause), then SIGCONT.
    StopHolder,
    /// `SCRIPT FLUSH` and `FUNCTION FLUSH` on the servers, with the replies of the reloads held back.
    ScriptFlush,
    /// Added latency on one worker's connections.
    Latency,
    /// One worker's connections closed under it.
    DropConnections,
    /// One worker cut off from the servers (or, with masters, a minority of the masters from
    /// everyone) for longer than the lease.
    Partition,
    /// Replicated topologies: the primary dies, its replica is promoted.
    Failover,
    /// Cluster: the slot of a held lock moves to another primary (`SETSLOT` + `MIGRATE`).
    Reshard,
    /// Cluster: a primary replaced without the nemesis (a replica took over on its own: the
    /// loaded machine starved its primary past the node timeout). Never injected: noticed before
    /// each fault and after each one that should not move the primaries, its window running from
    /// the last look that found them as they were.
    UnplannedFailover,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::RestartServers => "restart",
            Fault::PauseServers => "pause",
            Fault::KillHolder => "kill-holder",
            Fault::StopHolder => "stop-holder",
            Fault::ScriptFlush => "script-flush",
            Fault::Latency => "latency",
            Fault::DropConnections => "drop-connections",
            Fault::Partition => "partition",
            Fault::Failover => "failover",
            Fault::Reshard => "reshard",
            Fault::UnplannedFailover => "unplanned-failover",
        }
    }

    /// Every fault of a topology: the way it loses data (a restart, or a failover), and the rest.
    fn menu(topology: Topology) -> Vec<Fault> {
        use Fault::*;
        if topology == Topology::Cluster {
            // The cluster is reached at the addresses its nodes announce: no proxies, so no
            // network faults on the client side.
            return vec![
                Failover,
                PauseServers,
                KillHolder,
                StopHolder,
                ScriptFlush,
                Reshard,
            ];
        }
        let loses_data = if topology.replicated() {
            Failover
        } else {
            RestartServers
        };
        let common = [
            PauseServers,
            KillHolder,
            StopHolder,
            ScriptFlush,
            Latency,
            DropConnections,
            Partition,
        ];
        std::iter::once(loses_data).chain(common).collect()
    }

    /// The menu of a hunt (`RELOCK_CHAOS_HUNT`): the faults that lose or freeze a server's state
    /// drawn three times as often, where a rare history is likeliest.
    fn hunting_menu(topology: Topology) -> Vec<Fault> {
        let mut menu = Fault::menu(topology);
        let heavy: Vec<Fault> = menu
            .iter()
            .copied()
            .filter(|f| matches!(f, Fault::RestartServers | Fault::Failover | Fault::PauseServers))
            .collect();
        for _ in 0..2 {
            menu.extend(&heavy);
        }
        menu
    }
}

pub struct Nemesis {
    rng: Rng,
    lease: Duration,
    pub injected: BTreeMap<Fault, u32>,
    /// Faults to draw the first one from, until one of them hits (empty: the whole menu). A short
    /// run has room for a few faults only: this makes sure a holder crashes in it.
    pub opening: Vec<Fault>,
    /// A hunt for rare histories (`RELOCK_CHAOS_HUNT`): restarts, failovers and pauses three times
    /// as often, and on five masters a restart with another master paused meanwhile.
    pub hunt: bool,
}

impl Nemesis {
    pub fn new(seed: u64, lease: Duration) -> Nemesis {
        Nemesis {
            rng: Rng::new(seed ^ 0x6e656d65736973),
            lease,
            injected: BTreeMap::new(),
            opening: Vec::new(),
            hunt: false,
        }
    }

    /// Injects faults until `until` (nanoseconds on the run's clock), recording what the checker
    /// needs in `harness`.
    pub async fn run(&mut self, cluster: &mut Cluster, harness: &mut Harness, until: u64) {
        let mut healed = now_ns();
        let mut primaries = primary_ports(cluster);
        // Every run must see a holder crash: one whose schedule drew none by half its fault window
        // draws from the holder faults from then on (earlier draws, and so every schedule that had
        // one by then, stay as their seeds replay them).
        let halfway = healed + until.saturating_sub(healed) / 2;
        while now_ns() < until {
            let crashed = self.injected.contains_key(&Fault::KillHolder)
                || self.injected.contains_key(&Fault::StopHolder);
            if !crashed && self.opening.is_empty() && now_ns() >= halfway {
                self.opening = vec![Fault::KillHolder, Fault::StopHolder];
            }
            let gap = self
                .rng
                .between(Duration::from_millis(200), Duration::from_millis(800));
            tokio::time::sleep(gap).await;
            self.notice_unplanned(cluster, harness, &primaries, healed);
            let menu = if !self.opening.is_empty() {
                self.opening.clone()
            } else if self.hunt {
                Fault::hunting_menu(cluster.topology)
            } else {
                Fault::menu(cluster.topology)
            };
            let fault = menu[self.rng.below(menu.len() as u64) as usize];
            if matches!(fault, Fault::KillHolder | Fault::StopHolder) {
                // A crashed holder's lock must be granted again within its lease: judge that on
                // clients that have recovered from the last fault, not only on servers that have.
                recovered(cluster, healed, Duration::from_secs(20)).await;
            }
            let from = now_ns();
            let before = primary_ports(cluster);
            if self.inject(fault, cluster, harness).await {
                // A crashed holder's window was recorded before the quiet time that follows it.
                if !matches!(fault, Fault::KillHolder | Fault::StopHolder) {
                    harness.faults.push((from, now_ns()));
                }
                if let Some(&(from, to)) = harness.faults.last() {
                    harness.fault_names.push((from, to, fault.name()));
                }
                *self.injected.entry(fault).or_default() += 1;
                self.opening.clear();
            }
            // Only a failover or a pause may change the primaries; under any other fault (a
            // crashed holder's quiet time lasts seconds) a change was unplanned.
            if !matches!(fault, Fault::Failover | Fault::PauseServers) {
                self.notice_unplanned(cluster, harness, &before, from);
            }
            healed = now_ns();
            primaries = primary_ports(cluster);
        }
    }

    /// Records an unplanned failover since `since` if the cluster's primaries are no longer
    /// `expected` (see [`Fault::UnplannedFailover`]).
    fn notice_unplanned(
        &mut self,
        cluster: &Cluster,
        harness: &mut Harness,
        expected: &Option<Vec<i64>>,
        since: u64,
    ) {
        if primary_ports(cluster) == *expected {
            return;
        }
        let t = now_ns();
        harness.faults.push((since, t));
        harness
            .fault_names
            .push((since, t, Fault::UnplannedFailover.name()));
        unsynced(harness, since, self.lease);
        *self.injected.entry(Fault::UnplannedFailover).or_default() += 1;
    }

    /// Returns false when the fault had no target (no worker held a lock just then).
    async fn inject(&mut self, fault: Fault, cluster: &mut Cluster, harness: &mut Harness) -> bool {
        let lease = self.lease;
        let slots = cluster.workers.len();
        match fault {
            // Noticed, never injected (see `run`).
            Fault::UnplannedFailover => return false,
            Fault::RestartServers => {
                let mut victims = self.minority(cluster);
                // A hunt on five masters restarts one while another sleeps: two of five, still a
                // minority, one of them forgetting its locks and one keeping stale ones.
                let paused = (self.hunt && cluster.topology == Topology::Multi && victims.len() == 2)
                    .then(|| victims.pop())
                    .flatten();
                let t = now_ns();
                if let Some(p) = paused {
                    cluster.servers[p].pause();
                }
                for &i in &victims {
                    cluster.servers[i].kill();
                }
                tokio::time::sleep(self.rng.between(Duration::ZERO, Duration::from_millis(500))).await;
                for &i in &victims {
                    blocking_restart(cluster, i).await;
                }
                if let Some(p) = paused {
                    tokio::time::sleep(self.rng.between(Duration::ZERO, lease)).await;
                    cluster.servers[p].resume();
                }
                if cluster.topology == Topology::Single {
                    // One Redis that kept nothing on disk forgot its locks: outside the guarantees.
                    harness
                        .unprotected
                        .push((t, now_ns() + nanos(lease + Duration::from_secs(1))));
                }
            }
            Fault::PauseServers if cluster.topology == Topology::Cluster => {
                // One primary, sometimes past the node timeout (1 s): its replica then takes over
                // while it sleeps, and it rejoins as a replica when it wakes.
                let pause = self.rng.between(Duration::from_millis(300), lease * 3 / 2);
                let Some(redis) = cluster.redis_cluster.as_ref() else {
                    return false;
                };
                let primaries = redis.primaries();
                let victim = primaries[self.rng.below(primaries.len() as u64) as usize];
                let t = now_ns();
                victim.pause();
                tokio::time::sleep(pause).await;
                victim.resume();
                tokio::task::block_in_place(|| {
                    redis.wait_until(Duration::from_secs(30), "settled after a pause", |c| c.settled())
                });
                // Its replica may have taken over.
                unsynced(harness, t, lease);
            }
            Fault::PauseServers => {
                let victims = self.minority(cluster);
                for &i in &victims {
                    cluster.servers[i].pause();
                }
                tokio::time::sleep(self.rng.between(Duration::from_millis(300), lease * 3 / 2)).await;
                for &i in &victims {
                    cluster.servers[i].resume();
                }
            }
            Fault::KillHolder | Fault::StopHolder => {
                // A stop between the read and the write is the GC pause that makes a stale write.
                let thinking =
                    (fault == Fault::StopHolder).then(|| self.holder(cluster, Some(Phase::Thinking)));
                let Some((slot, items)) = thinking.flatten().or_else(|| self.holder(cluster, None)) else {
                    return false;
                };
                let worker = cluster.workers[slot].as_ref().map(|w| (w.id, w.pid()));
                let Some((id, pid)) = worker else { return false };
                let t = now_ns();
                let killed = fault == Fault::KillHolder;
                if killed {
                    cluster.kill_worker(slot);
                    cluster.spawn_worker(slot);
                } else {
                    signal(pid, libc::SIGSTOP);
                    let pause = lease
                        + self
                            .rng
                            .between(Duration::from_millis(300), Duration::from_millis(900));
                    tokio::time::sleep(pause).await;
                    signal(pid, libc::SIGCONT);
                }
                harness.faults.push((t, now_ns()));
                harness.crashes.push(Crash {
                    worker: id,
                    t,
                    items,
                    killed,
                });
                // Quiet until the lock must have been granted again, so that no other fault delays it.
                tokio::time::sleep(lease + Duration::from_millis(1500)).await;
            }
            Fault::ScriptFlush => {
                // The reloads that follow answer late on every link, past the request timeouts: a
                // call resent after them would run behind later calls (safety review, finding 2).
                // Both caches go; the late reply is, by turns, `SCRIPT LOAD`'s (a 40-byte SHA) or
                // `FUNCTION LOAD`'s (the library's name: the batch runs as its function).
                let (library, _, _) = crate::support::batch_library();
                let late: &[u8] = if self.rng.below(2) == 0 {
                    b"$40\r\n"
                } else {
                    library.as_bytes()
                };
                for proxies in &cluster.proxies {
                    for proxy in proxies {
                        proxy.delay_reply_once(late, Duration::from_millis(400));
                    }
                }
                for server in cluster.lock_servers() {
                    server.cmd(&["SCRIPT", "FLUSH"]);
                    server.cmd(&["FUNCTION", "FLUSH"]);
                }
            }
            Fault::Latency => {
                let slot = self.rng.below(slots as u64) as usize;
                let latency = self
                    .rng
                    .between(Duration::from_millis(20), Duration::from_millis(150));
                for proxy in &cluster.proxies[slot] {
                    proxy.latency(latency);
                }
                tokio::time::sleep(self.rng.between(Duration::from_secs(1), Duration::from_secs(3))).await;
                for proxy in &cluster.proxies[slot] {
                    proxy.latency(Duration::ZERO);
                }
            }
            Fault::DropConnections => {
                let slot = self.rng.below(slots as u64) as usize;
                for proxy in &cluster.proxies[slot] {
                    proxy.drop_connections();
                }
            }
            Fault::Partition => {
                let cut = lease + self.rng.between(Duration::ZERO, Duration::from_secs(1));
                // With masters, half the time a minority of masters is cut off from every worker.
                let proxies: Vec<(usize, usize)> =
                    if cluster.topology == Topology::Multi && self.rng.below(2) == 0 {
                        let masters = self.minority(cluster);
                        (0..slots)
                            .flat_map(|s| masters.iter().map(move |&m| (s, m)))
                            .collect()
                    } else {
                        let slot = self.rng.below(slots as u64) as usize;
                        (0..cluster.proxies[slot].len()).map(|m| (slot, m)).collect()
                    };
                for &(s, m) in &proxies {
                    cluster.proxies[s][m].partition();
                }
                tokio::time::sleep(cut).await;
                for &(s, m) in &proxies {
                    cluster.proxies[s][m].heal();
                }
            }
            Fault::Failover if cluster.topology == Topology::Cluster => {
                let slot = self.held_slot(cluster);
                let t = now_ns();
                let Some(redis) = cluster.redis_cluster.as_mut() else {
                    return false;
                };
                tokio::task::block_in_place(|| redis.failover_and_rejoin(slot));
                unsynced(harness, t, lease);
            }
            Fault::Reshard => {
                let slot = self.held_slot(cluster);
                let pick = self.rng.below(2) as usize;
                let Some(redis) = cluster.redis_cluster.as_ref() else {
                    return false;
                };
                let moved = tokio::task::block_in_place(|| {
                    // Onto a primary the settled cluster agrees on: one that a pause just failed
                    // over may still answer ROLE as a primary for a moment before it turns replica.
                    redis.wait_until(Duration::from_secs(30), "settled before a reshard", |c| {
                        c.settled()
                    });
                    let from = redis.primary_of_slot(slot).port();
                    let others: Vec<u16> = redis
                        .primaries_with_slots()
                        .iter()
                        .map(|p| p.port())
                        .filter(|p| *p != from)
                        .collect();
                    let Some(&to) = others.get(pick % others.len().max(1)) else {
                        return false;
                    };
                    let to = redis.nodes.iter().find(|n| n.port() == to).expect("primary");
                    redis.move_slot(slot, to);
                    true
                });
                if !moved {
                    return false;
                }
            }
            Fault::Failover => {
                let old = cluster.primary;
                let new = 1 - old;
                let t = now_ns();
                cluster.servers[old].kill();
                cluster.servers[new].cmd(&["REPLICAOF", "NO", "ONE"]);
                cluster.primary = new;
                for row in &cluster.proxies {
                    row[0].set_upstream(cluster.servers[new].port());
                }
                // Whatever the replica had not received yet is gone: outside the guarantees,
                // unless every grant and renewal waited for the replica.
                if cluster.topology == Topology::Replicated {
                    harness
                        .unprotected
                        .push((t, now_ns() + nanos(lease + Duration::from_secs(1))));
                }
                blocking_restart(cluster, old).await;
                let port = cluster.servers[new].port().to_string();
                cluster.servers[old].cmd(&["REPLICAOF", "127.0.0.1", &port]);
                if cluster.topology == Topology::Synced {
                    // With one replica, nothing can be granted until it has synced again (the
                    // price of `sync_replicas`): let it, so that the next fault, a crashed holder
                    // above all, is judged on a healed system, as after the other faults.
                    let replica = &cluster.servers[old];
                    tokio::task::block_in_place(|| {
                        let deadline = std::time::Instant::now() + Duration::from_secs(30);
                        while !matches!(replica.try_cmd(&["INFO", "replication"]),
                            Ok(crate::support::Reply::Str(s)) if s.contains("master_link_status:up"))
                        {
                            assert!(std::time::Instant::now() < deadline, "replica never synced");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    });
                }
            }
        }
        true
    }

    /// One server, or one or two of five masters: never a majority.
    fn minority(&mut self, cluster: &Cluster) -> Vec<usize> {
        match cluster.topology {
            Topology::Multi => {
                let first = self.rng.below(5) as usize;
                let mut victims = vec![first];
                if self.rng.below(2) == 0 {
                    victims.push((first + 1 + self.rng.below(4) as usize) % 5);
                }
                victims
            }
            Topology::Single => vec![0],
            Topology::Replicated | Topology::Synced => vec![cluster.primary],
            Topology::Cluster => Vec::new(), // its faults pick their own targets
        }
    }

    /// Cluster: the slot of a lock (or semaphore) some worker holds now, else of a random item's lock.
    fn held_slot(&mut self, cluster: &Cluster) -> u16 {
        let name = match self.holder(cluster, None) {
            Some((_, items)) => match items[0] {
                (On::Semaphore, i) => crate::family::semaphore_name(i),
                (On::Rw, i) => crate::rw::rw_name(i),
                (On::Fair, i) => crate::rw::fair_name(i),
                (_, i) => format!("item-{i}"),
            },
            None => format!("item-{}", self.rng.below(u64::from(cluster.items()))),
        };
        let redis = cluster.redis_cluster.as_ref().expect("cluster topology");
        redis.slot(&format!("chaos:{{{name}}}"))
    }

    /// A slot whose worker holds a lock or permits (in `phase`, if given), and what it holds.
    fn holder(&mut self, cluster: &Cluster, phase: Option<Phase>) -> Option<(usize, Vec<(On, u32)>)> {
        let slots = cluster.workers.len();
        let start = self.rng.below(slots as u64) as usize;
        (0..slots).map(|i| (start + i) % slots).find_map(|slot| {
            let held = cluster.holding(slot);
            let wanted = phase.is_none_or(|p| held.iter().any(|h| h.2 == p));
            (wanted && !held.is_empty()).then(|| (slot, held.iter().map(|h| (h.0, h.1)).collect()))
        })
    }
}

/// Waits (at most `bound`) until every live worker, and some worker on every item, has been granted
/// a lock (or permits, in the semaphore workload) since `since`: a cluster reports itself settled
/// before its clients have found the new slot owners (on a loaded machine, seconds later).
async fn recovered(cluster: &Cluster, since: u64, bound: Duration) {
    let deadline = tokio::time::Instant::now() + bound;
    let mut items = BTreeSet::new();
    if cluster.workloads().contains(&Workload::Lock) {
        items.extend((0..cluster.items()).map(|i| (On::Lock, i)));
    }
    if cluster.workloads().contains(&Workload::Semaphore) {
        items.extend((0..crate::family::SEMAPHORES).map(|i| (On::Semaphore, i)));
    }
    if cluster.workloads().contains(&Workload::Rw) {
        items.extend((0..crate::rw::RW_LOCKS).map(|i| (On::Rw, i)));
    }
    if cluster.workloads().contains(&Workload::Fair) {
        items.extend((0..crate::rw::FAIR_LOCKS).map(|i| (On::Fair, i)));
    }
    while tokio::time::Instant::now() < deadline {
        let workers: Vec<u32> = cluster.workers.iter().flatten().map(|w| w.id).collect();
        let (mut by_worker, mut by_item) = (BTreeSet::new(), BTreeSet::new());
        for event in cluster.events.lock().unwrap().iter().rev() {
            // Events arrive in order per worker, nearly in order across them.
            if event.t + 1_000_000_000 < since {
                break;
            }
            if event.t > since
                && matches!(
                    event.kind,
                    Kind::Grant { .. } | Kind::Permit { .. } | Kind::Shared { .. }
                )
            {
                by_worker.insert(event.worker);
                by_item.insert((event.on, event.item));
            }
        }
        if workers.iter().all(|w| by_worker.contains(w)) && by_item == items {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Restarts a lock server (empty) without blocking the runtime that runs the proxies.
async fn blocking_restart(cluster: &mut Cluster, i: usize) {
    let server = &mut cluster.servers[i];
    tokio::task::block_in_place(|| server.restart());
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Records the window after a failover from `t`: a replica took over with what it had received, all
/// the locks' synced writes but maybe not the semaphore's and the latch's (see `Harness::unsynced`).
fn unsynced(harness: &mut Harness, t: u64, lease: Duration) {
    harness
        .unsynced
        .push((t, now_ns() + nanos(lease + Duration::from_secs(1))));
}

/// The ports of the primaries that serve slots, on a cluster (`None` elsewhere).
fn primary_ports(cluster: &Cluster) -> Option<Vec<i64>> {
    let redis = cluster.redis_cluster.as_ref()?;
    Some(tokio::task::block_in_place(|| redis.primary_ports()))
}
