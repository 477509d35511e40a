//! `SimCluster`: simulated nodes in groups of different sizes, spread or pack
//! placement, node loss and arrival, and the counters the report plots.
//!
//! It implements Flotilla's [`Cluster`] trait, so DeploymentActors place their
//! replicas on it exactly as on a real cluster: a reservation per replica, a
//! refusal naming what is missing, and events (capacity freed, node died) by
//! broadcast subscription.

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    sync::{Mutex, MutexGuard},
};

use flotilla::{
    AppName, Cluster, ClusterEvent, DeploymentName, NodeId, PlacementRequest, Refusal, ReplicaId,
};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::rng;

/// Events a slow subscriber may fall behind by before it resynchronises.
const EVENT_BUFFER: usize = 1024;
/// Slack for comparing fractional amounts.
const EPS: f64 = 1e-9;
const GIB: f64 = (1u64 << 30) as f64;

/// How a replica picks its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// The live node holding the fewest replicas of the deployment (so a node loss
    /// takes few replicas of each), ties broken by weighted rendezvous hashing of
    /// the deployment's placement count against each node (weight: its CPUs), so
    /// load spreads in proportion to size. The choice depends on the deployment's
    /// own history only, not on the order in which deployments ask: a seed
    /// replays the same placements even if the control plane interleaves
    /// differently (as long as nodes do not run full).
    #[default]
    Spread,
    /// The live node with the least free CPU that still fits (best fit, Ray's
    /// PACK): few nodes carry everything, the rest stay free. Depends on the
    /// order of requests, so it replays exactly only if that order does.
    Pack,
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "spread" => Ok(Strategy::Spread),
            "pack" => Ok(Strategy::Pack),
            other => Err(format!("unknown strategy '{other}' (spread or pack)")),
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Strategy::Spread => "spread",
            Strategy::Pack => "pack",
        })
    }
}

/// A group of identical nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    /// Group name; its nodes are `{name}-{i}`.
    pub name: String,
    /// How many nodes.
    pub count: usize,
    /// CPUs per node.
    pub cpus: f64,
    /// Memory per node, GiB.
    #[serde(default)]
    pub memory_gib: f64,
    /// GPUs per node.
    #[serde(default)]
    pub gpus: f64,
}

impl NodeGroup {
    fn capacity(&self) -> Capacity {
        Capacity {
            cpus: self.cpus,
            memory: self.memory_gib * GIB,
            gpus: self.gpus,
        }
    }
}

/// What a node offers or a replica reserves (custom resources are not simulated:
/// a request for one is refused).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Capacity {
    cpus: f64,
    memory: f64,
    gpus: f64,
}

impl Capacity {
    fn of(r: &flotilla::Resources) -> Self {
        Capacity {
            cpus: r.cpus,
            memory: r.memory_bytes as f64,
            gpus: r.gpus,
        }
    }
}

type DeploymentKey = (AppName, DeploymentName);

struct Node {
    name: NodeId,
    group: usize,
    capacity: Capacity,
    used: Capacity,
    alive: bool,
    replicas: usize,
    per_deployment: HashMap<DeploymentKey, u32>,
}

impl Node {
    fn free(&self) -> Capacity {
        Capacity {
            cpus: self.capacity.cpus - self.used.cpus,
            memory: self.capacity.memory - self.used.memory,
            gpus: self.capacity.gpus - self.used.gpus,
        }
    }

    fn fits(&self, need: &Capacity) -> bool {
        let free = self.free();
        need.cpus <= free.cpus + EPS
            && need.memory <= free.memory + EPS
            && need.gpus <= free.gpus + EPS
    }
}

struct Reservation {
    node: usize,
    need: Capacity,
    key: DeploymentKey,
}

/// The cluster's counters (cumulative since it was built).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterCounters {
    /// Reservations granted.
    pub placements: u64,
    /// Placement requests refused for lack of room.
    pub refusals: u64,
    /// Reservations given back by stopping replicas.
    pub releases: u64,
    /// Reservations lost with a dead node.
    pub lost_with_nodes: u64,
    /// Reservations lost with a crashed process.
    pub lost_with_process: u64,
    /// Nodes killed.
    pub nodes_killed: u64,
    /// Nodes added (or brought back).
    pub nodes_added: u64,
}

/// A point-in-time view of the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClusterView {
    /// Live nodes.
    pub live_nodes: usize,
    /// Reservations held now (replicas placed: starting, running or stopping).
    pub reserved: usize,
    /// CPUs offered by live nodes.
    pub cpus: f64,
    /// CPUs reserved.
    pub cpus_used: f64,
}

struct Inner {
    strategy: Strategy,
    seed: u64,
    /// Placement requests per deployment so far: the key of its next choice.
    asked: HashMap<DeploymentKey, u64>,
    groups: Vec<NodeGroup>,
    nodes: Vec<Node>,
    reservations: HashMap<ReplicaId, Reservation>,
    /// A placement was refused since the last capacity announcement: only then is
    /// anybody waiting for room (DeploymentActors also filter, but a broadcast to
    /// thousands of subscribers per released replica is work for nothing).
    refused_since_announce: bool,
    counters: ClusterCounters,
}

impl Inner {
    fn unreserve(&mut self, replica: ReplicaId) -> bool {
        let Some(r) = self.reservations.remove(&replica) else {
            return false;
        };
        if let Some(node) = self.nodes.get_mut(r.node) {
            node.used.cpus -= r.need.cpus;
            node.used.memory -= r.need.memory;
            node.used.gpus -= r.need.gpus;
            node.replicas = node.replicas.saturating_sub(1);
            if let Some(n) = node.per_deployment.get_mut(&r.key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    node.per_deployment.remove(&r.key);
                }
            }
        }
        true
    }

    fn refusal(&self, need: &Capacity, custom: bool) -> Refusal {
        if custom {
            return Refusal {
                missing: "the simulated cluster offers no custom resources".to_owned(),
            };
        }
        let live: Vec<&Node> = self.nodes.iter().filter(|n| n.alive).collect();
        if live.is_empty() {
            return Refusal {
                missing: "the cluster has no live node".to_owned(),
            };
        }
        let mut missing = String::new();
        type Dim = (&'static str, fn(&Capacity) -> f64);
        let dims: [Dim; 3] = [
            ("cpus", |c| c.cpus),
            ("memory_bytes", |c| c.memory),
            ("gpus", |c| c.gpus),
        ];
        for (name, get) in dims {
            let want = get(need);
            if want <= 0.0 {
                continue;
            }
            let most = live.iter().map(|n| get(&n.free())).fold(f64::MIN, f64::max);
            if want > most + EPS {
                if !missing.is_empty() {
                    missing.push_str("; ");
                }
                let _ = write!(missing, "{name}: need {want}, most free {}", most.max(0.0));
            }
        }
        if missing.is_empty() {
            missing = "no single node has every resource free at once".to_owned();
        }
        Refusal { missing }
    }
}

/// Simulated nodes in groups, with spread or pack placement, node loss and
/// arrival. Cheap and non-blocking, as [`Cluster`] requires.
///
/// ```
/// use flotilla_sim::cluster::{NodeGroup, SimCluster, Strategy};
/// let c = SimCluster::new(
///     vec![NodeGroup { name: "std".into(), count: 2, cpus: 4.0, memory_gib: 16.0, gpus: 0.0 }],
///     Strategy::Spread,
///     7,
/// );
/// assert_eq!(c.live_nodes(), ["std-00", "std-01"]);
/// ```
pub struct SimCluster {
    inner: Mutex<Inner>,
    events: broadcast::Sender<ClusterEvent>,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("SimCluster")
            .field("strategy", &inner.strategy)
            .field("nodes", &inner.nodes.len())
            .field("reservations", &inner.reservations.len())
            .finish()
    }
}

impl SimCluster {
    /// A cluster of every node of `groups`, alive and empty; `seed` drives the
    /// spread strategy's tie-breaking.
    pub fn new(groups: Vec<NodeGroup>, strategy: Strategy, seed: u64) -> Self {
        let mut nodes = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            for i in 0..group.count {
                nodes.push(Node {
                    name: format!("{}-{i:02}", group.name),
                    group: g,
                    capacity: group.capacity(),
                    used: Capacity::default(),
                    alive: true,
                    replicas: 0,
                    per_deployment: HashMap::new(),
                });
            }
        }
        SimCluster {
            inner: Mutex::new(Inner {
                strategy,
                seed,
                asked: HashMap::new(),
                groups,
                nodes,
                reservations: HashMap::new(),
                refused_since_announce: false,
                counters: ClusterCounters::default(),
            }),
            events: broadcast::Sender::new(EVENT_BUFFER),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn announce(&self, event: ClusterEvent) {
        // Nobody subscribed is fine: there is nobody to wake.
        let _ = self.events.send(event);
    }

    /// Names of the live nodes, in declaration order.
    pub fn live_nodes(&self) -> Vec<NodeId> {
        self.lock()
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| n.name.clone())
            .collect()
    }

    /// Kill node `name`: its reservations are dropped and subscribers learn that
    /// its replicas are gone. Returns the applications that had a replica on it
    /// (sorted), or `None` for an unknown or already dead node.
    pub fn kill_node(&self, name: &str) -> Option<BTreeSet<String>> {
        let apps = {
            let mut inner = self.lock();
            let idx = inner.nodes.iter().position(|n| n.alive && n.name == name)?;
            let lost: Vec<ReplicaId> = inner
                .reservations
                .iter()
                .filter(|(_, r)| r.node == idx)
                .map(|(id, _)| *id)
                .collect();
            let apps: BTreeSet<String> = inner.nodes[idx]
                .per_deployment
                .keys()
                .map(|(a, _)| a.to_string())
                .collect();
            for id in &lost {
                inner.unreserve(*id);
            }
            inner.counters.lost_with_nodes += lost.len() as u64;
            inner.counters.nodes_killed += 1;
            inner.nodes[idx].alive = false;
            apps
        };
        self.announce(ClusterEvent::NodeDied(name.to_owned()));
        Some(apps)
    }

    /// Add a node of group `group` (index into the groups), named after the next
    /// free index of the group. Returns its name, or `None` for an unknown group.
    pub fn add_node(&self, group: usize) -> Option<NodeId> {
        let name = {
            let mut inner = self.lock();
            let g = inner.groups.get(group)?.clone();
            let taken = inner.nodes.iter().filter(|n| n.group == group).count();
            let name = format!("{}-{taken:02}", g.name);
            inner.nodes.push(Node {
                name: name.clone(),
                group,
                capacity: g.capacity(),
                used: Capacity::default(),
                alive: true,
                replicas: 0,
                per_deployment: HashMap::new(),
            });
            inner.counters.nodes_added += 1;
            inner.refused_since_announce = false;
            name
        };
        self.announce(ClusterEvent::CapacityFreed);
        Some(name)
    }

    /// How many node groups there are.
    pub fn groups(&self) -> usize {
        self.lock().groups.len()
    }

    /// The whole process crashed: every replica died with it, so every reservation
    /// is gone (nobody is left to release them). Returns how many were dropped.
    pub fn process_crashed(&self) -> usize {
        let mut inner = self.lock();
        let ids: Vec<ReplicaId> = inner.reservations.keys().copied().collect();
        for id in &ids {
            inner.unreserve(*id);
        }
        inner.counters.lost_with_process += ids.len() as u64;
        inner.refused_since_announce = false;
        ids.len()
    }

    /// The counters so far.
    pub fn counters(&self) -> ClusterCounters {
        self.lock().counters
    }

    /// Live nodes, reservations and CPUs now.
    pub fn view(&self) -> ClusterView {
        let inner = self.lock();
        let live = inner.nodes.iter().filter(|n| n.alive);
        let (mut nodes, mut cpus, mut used) = (0, 0.0, 0.0);
        for n in live {
            nodes += 1;
            cpus += n.capacity.cpus;
            used += n.used.cpus;
        }
        ClusterView {
            live_nodes: nodes,
            reserved: inner.reservations.len(),
            cpus,
            cpus_used: used,
        }
    }

    /// Reservations held by replicas of `app` (all its deployments).
    pub fn reserved_by(&self, app: &str) -> usize {
        self.lock()
            .reservations
            .values()
            .filter(|r| r.key.0.as_str() == app)
            .count()
    }
}

impl Cluster for SimCluster {
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        let mut inner = self.lock();
        if let Some(r) = inner.reservations.get(&request.replica) {
            // Placing twice is idempotent.
            return Ok(inner.nodes[r.node].name.clone());
        }
        let need = Capacity::of(request.resources);
        let custom = request.resources.custom.values().any(|v| *v > 0.0);
        let key = (request.app.clone(), request.deployment.clone());
        let asked = {
            let n = inner.asked.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let stream = rng::key(
            inner.seed,
            &[
                rng::label(request.app.as_str()),
                rng::label(request.deployment.as_str()),
                asked,
            ],
        );
        let candidates = inner
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !custom && n.alive && n.fits(&need));
        let best = match inner.strategy {
            Strategy::Spread => candidates
                .map(|(i, n)| {
                    // Weighted rendezvous hashing: -ln(u) / weight, smallest wins.
                    let h = rng::splitmix(stream ^ rng::label(&n.name));
                    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                    let score = -u.ln() / n.capacity.cpus.max(1e-6);
                    (n.per_deployment.get(&key).copied().unwrap_or(0), score, i)
                })
                .min_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)))
                .map(|(_, _, i)| i),
            Strategy::Pack => candidates
                .min_by(|(i, a), (j, b)| {
                    a.free()
                        .cpus
                        .total_cmp(&b.free().cpus)
                        .then_with(|| i.cmp(j))
                })
                .map(|(i, _)| i),
        };
        let Some(idx) = best else {
            inner.counters.refusals += 1;
            inner.refused_since_announce = true;
            return Err(inner.refusal(&need, custom));
        };
        let node = &mut inner.nodes[idx];
        node.used.cpus += need.cpus;
        node.used.memory += need.memory;
        node.used.gpus += need.gpus;
        node.replicas += 1;
        *node.per_deployment.entry(key.clone()).or_insert(0) += 1;
        let name = node.name.clone();
        inner.reservations.insert(
            request.replica,
            Reservation {
                node: idx,
                need,
                key,
            },
        );
        inner.counters.placements += 1;
        Ok(name)
    }

    fn release(&self, replica: ReplicaId) {
        let wake = {
            let mut inner = self.lock();
            if !inner.unreserve(replica) {
                return;
            }
            inner.counters.releases += 1;
            std::mem::take(&mut inner.refused_since_announce)
        };
        if wake {
            self.announce(ClusterEvent::CapacityFreed);
        }
    }

    fn subscribe(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.events.subscribe())
    }

    fn is_alive(&self, node: &str) -> bool {
        self.lock().nodes.iter().any(|n| n.alive && n.name == node)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use flotilla::Resources;
    use std::collections::BTreeMap;

    fn group(name: &str, count: usize, cpus: f64) -> NodeGroup {
        NodeGroup {
            name: name.into(),
            count,
            cpus,
            memory_gib: 8.0,
            gpus: 0.0,
        }
    }

    fn place(c: &SimCluster, id: u64, app: &str, dep: &str, cpus: f64) -> Result<NodeId, Refusal> {
        let app = AppName::new(app).unwrap();
        let dep = DeploymentName::new(dep).unwrap();
        let r = Resources::none().with_cpus(cpus);
        c.place(&PlacementRequest {
            replica: ReplicaId(id),
            app: &app,
            deployment: &dep,
            resources: &r,
        })
    }

    #[test]
    fn spread_spreads_and_pack_packs() {
        let c = SimCluster::new(vec![group("a", 3, 4.0)], Strategy::Spread, 1);
        let mut nodes: Vec<_> = (0..3)
            .map(|i| place(&c, i, "x", "d", 1.0).unwrap())
            .collect();
        nodes.sort();
        assert_eq!(
            nodes,
            ["a-00", "a-01", "a-02"],
            "one replica of a deployment per node"
        );
        let c = SimCluster::new(vec![group("a", 3, 4.0)], Strategy::Pack, 1);
        let nodes: Vec<_> = (0..5)
            .map(|i| place(&c, i, "x", "d", 1.0).unwrap())
            .collect();
        assert_eq!(nodes, ["a-00", "a-00", "a-00", "a-00", "a-01"]);
    }

    #[test]
    fn refusal_wakes_on_release_and_node_loss_frees_room() {
        let c = SimCluster::new(
            vec![group("a", 1, 1.0), group("b", 1, 1.0)],
            Strategy::Spread,
            1,
        );
        let mut rx = c.subscribe().unwrap();
        place(&c, 1, "x", "d", 1.0).unwrap();
        c.release(ReplicaId(1));
        assert!(rx.try_recv().is_err(), "nobody waited: no announcement");
        place(&c, 2, "x", "d", 1.0).unwrap();
        let y = place(&c, 3, "y", "d", 1.0).unwrap();
        let refusal = place(&c, 4, "x", "d", 1.0).unwrap_err();
        assert_eq!(refusal.missing, "cpus: need 1, most free 0");
        c.release(ReplicaId(2));
        assert_eq!(rx.try_recv().unwrap(), ClusterEvent::CapacityFreed);
        let apps = c.kill_node(&y).unwrap();
        assert_eq!(apps.into_iter().collect::<Vec<_>>(), ["y"]);
        assert_eq!(rx.try_recv().unwrap(), ClusterEvent::NodeDied(y.clone()));
        assert!(!c.is_alive(&y));
        assert_eq!(c.view().reserved, 0);
        assert_eq!(c.add_node(1).as_deref(), Some("b-01"));
        assert_eq!(rx.try_recv().unwrap(), ClusterEvent::CapacityFreed);
        place(&c, 5, "x", "d", 1.0).unwrap();
        assert_eq!(c.process_crashed(), 1);
        let k = c.counters();
        assert_eq!((k.placements, k.refusals, k.releases), (4, 1, 2));
        assert_eq!((k.lost_with_nodes, k.lost_with_process), (1, 1));
    }

    #[test]
    fn spread_does_not_depend_on_the_order_deployments_ask_in() {
        let groups = vec![group("a", 3, 8.0), group("b", 2, 32.0)];
        let one = SimCluster::new(groups.clone(), Strategy::Spread, 9);
        let two = SimCluster::new(groups, Strategy::Spread, 9);
        let deps: Vec<String> = (0..20).map(|i| format!("app{i}")).collect();
        let mut first = BTreeMap::new();
        let mut id = 0;
        for app in &deps {
            for _ in 0..2 {
                id += 1;
                first
                    .entry(app.clone())
                    .or_insert_with(Vec::new)
                    .push(place(&one, id, app, "d", 0.5).unwrap());
            }
        }
        let mut second = BTreeMap::new();
        for app in deps.iter().rev() {
            for _ in 0..2 {
                id += 1;
                second
                    .entry(app.clone())
                    .or_insert_with(Vec::new)
                    .push(place(&two, id, app, "d", 0.5).unwrap());
            }
        }
        assert_eq!(first, second);
        let on_b = first
            .values()
            .flatten()
            .filter(|n| n.starts_with("b-"))
            .count();
        assert!(on_b > 20, "bigger nodes take more: {on_b} of 40 on b");
    }
}
