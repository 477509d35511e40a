//! `SimCluster`: simulated nodes in groups of different sizes, spread or pack
//! placement, node loss and arrival, and the counters the report plots.
//!
//! It implements Flotilla's [`Cluster`] trait, so DeploymentActors place their
//! replicas on it exactly as on a real cluster: a reservation per replica, a
//! refusal naming what is missing, and events (capacity freed, node died) by
//! broadcast subscription. The bookkeeping of nodes and reservations is
//! Flotilla's [`NodePool`] (as in `StaticCluster`); what is the simulator's
//! own is the choice of node, node groups, whole-process loss and the counters.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Mutex, MutexGuard},
};

use flotilla::{
    Cluster, ClusterEvent, DeploymentKey, NodeId, NodePool, NodeSpec, PlacementRequest, Refusal,
    ReplicaId, Resources,
};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::rng;

/// Events a slow subscriber may fall behind by before it resynchronises.
const EVENT_BUFFER: usize = 1024;
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

/// A placement strategy's name that is neither `spread` nor `pack`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown strategy '{0}' (spread or pack)")]
pub struct UnknownStrategy(pub String);

impl std::str::FromStr for Strategy {
    type Err = UnknownStrategy;
    fn from_str(s: &str) -> Result<Self, UnknownStrategy> {
        match s {
            "spread" => Ok(Strategy::Spread),
            "pack" => Ok(Strategy::Pack),
            other => Err(UnknownStrategy(other.to_owned())),
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
    /// What one node of the group offers (no custom resources: the simulated
    /// cluster offers none).
    fn capacity(&self) -> Resources {
        Resources::none()
            .with_cpus(self.cpus)
            .with_memory((self.memory_gib * GIB) as u64)
            .with_gpus(self.gpus)
    }

    /// Whether an empty node of the group takes a replica reserving `need` (the
    /// placement's own test).
    pub fn holds(&self, need: &Resources) -> bool {
        self.node(0).holds(need)
    }

    /// Node `i` of the group.
    fn node(&self, i: usize) -> NodeSpec {
        NodeSpec::new(format!("{}-{i:02}", self.name), self.capacity())
    }
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
    /// Nodes made of each group so far (the next one's index).
    made: Vec<usize>,
    pool: NodePool,
    /// A placement was refused since the last capacity announcement: only then is
    /// anybody waiting for room (DeploymentActors also filter, but a broadcast to
    /// thousands of subscribers per released replica is work for nothing).
    refused_since_announce: bool,
    counters: ClusterCounters,
}

impl Inner {
    /// Place `request` on the node `strategy` ranks first among those that fit
    /// (the pool applies the request's limit per node and placement group), or
    /// refuse. Counts the deployment's request.
    fn place(&mut self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        let key = (request.app.clone(), request.deployment.clone());
        let asked = {
            let n = self.asked.entry(key).or_insert(0);
            *n += 1;
            *n
        };
        if asks_custom(request.resources) {
            return Err(Refusal {
                missing: "the simulated cluster offers no custom resources".to_owned(),
            });
        }
        match self.strategy {
            Strategy::Spread => {
                let stream = rng::key(
                    self.seed,
                    &[
                        rng::label(request.app.as_str()),
                        rng::label(request.deployment.as_str()),
                        asked,
                    ],
                );
                self.pool.place(request, |i, n, key| {
                    // Weighted rendezvous hashing: -ln(u) / weight, smallest wins.
                    let h = rng::splitmix(stream ^ rng::label(n.name()));
                    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                    let score = -u.ln() / n.capacity().cpus.max(1e-6);
                    (n.replicas_of(key), score, i)
                })
            }
            Strategy::Pack => self.pool.place(request, |i, n, _| (n.free().cpus, i)),
        }
    }
}

/// Whether `need` asks for a custom resource, which no simulated node offers.
fn asks_custom(need: &Resources) -> bool {
    need.custom.values().any(|v| *v > 0.0)
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
            .field("nodes", &inner.pool.nodes().len())
            .field("reservations", &inner.pool.reserved())
            .finish()
    }
}

impl SimCluster {
    /// A cluster of every node of `groups`, alive and empty; `seed` drives the
    /// spread strategy's tie-breaking.
    pub fn new(groups: Vec<NodeGroup>, strategy: Strategy, seed: u64) -> Self {
        let pool = NodePool::new(
            groups
                .iter()
                .flat_map(|g| (0..g.count).map(move |i| g.node(i))),
        );
        SimCluster {
            inner: Mutex::new(Inner {
                strategy,
                seed,
                asked: HashMap::new(),
                made: groups.iter().map(|g| g.count).collect(),
                groups,
                pool,
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
        self.lock().pool.live_names()
    }

    /// Kill node `name`: its reservations are dropped and subscribers learn that
    /// its replicas are gone. Returns the applications that had a replica on it
    /// (sorted), or `None` for an unknown or already dead node.
    pub fn kill_node(&self, name: &str) -> Option<BTreeSet<String>> {
        let apps = {
            let mut inner = self.lock();
            let lost = inner.pool.kill(name)?;
            inner.counters.lost_with_nodes += lost.len() as u64;
            inner.counters.nodes_killed += 1;
            lost.into_iter().map(|(app, _)| app.to_string()).collect()
        };
        self.announce(ClusterEvent::NodeDied(name.to_owned()));
        Some(apps)
    }

    /// Add a node of group `group` (index into the groups), named after the next
    /// free index of the group. Returns its name, or `None` for an unknown group.
    pub fn add_node(&self, group: usize) -> Option<NodeId> {
        let name = {
            let mut inner = self.lock();
            let spec = inner.groups.get(group)?.node(inner.made[group]);
            let name = spec.name.clone();
            inner.made[group] += 1;
            inner.pool.add(spec);
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
        let dropped = inner.pool.release_all();
        inner.counters.lost_with_process += dropped as u64;
        inner.refused_since_announce = false;
        dropped
    }

    /// The counters so far.
    pub fn counters(&self) -> ClusterCounters {
        self.lock().counters
    }

    /// Live nodes, reservations and CPUs now.
    pub fn view(&self) -> ClusterView {
        let inner = self.lock();
        let (mut nodes, mut cpus, mut used) = (0, 0.0, 0.0);
        for n in inner.pool.live() {
            nodes += 1;
            cpus += n.capacity().cpus;
            used += n.used().cpus;
        }
        ClusterView {
            live_nodes: nodes,
            reserved: inner.pool.reserved(),
            cpus,
            cpus_used: used,
        }
    }

    /// Reservations held by replicas of `app` (all its deployments).
    pub fn reserved_by(&self, app: &str) -> usize {
        self.lock().pool.reserved_by(app)
    }
}

impl Cluster for SimCluster {
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        let mut inner = self.lock();
        if let Some(node) = inner.pool.node_of(request.replica) {
            // Placing twice is idempotent.
            return Ok(node.name().to_owned());
        }
        match inner.place(request) {
            Ok(node) => {
                inner.counters.placements += 1;
                Ok(node)
            }
            Err(refusal) => {
                inner.counters.refusals += 1;
                inner.refused_since_announce = true;
                Err(refusal)
            }
        }
    }

    fn release(&self, replica: ReplicaId) {
        let wake = {
            let mut inner = self.lock();
            if !inner.pool.release(replica) {
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
        self.lock().pool.is_alive(node)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use flotilla::{AppName, DeploymentName};
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
            max_replicas_per_node: None,
            placement_group: None,
        })
    }

    #[test]
    fn strategies_parse_by_name() {
        assert_eq!("spread".parse::<Strategy>(), Ok(Strategy::Spread));
        assert_eq!("pack".parse::<Strategy>(), Ok(Strategy::Pack));
        let e = "random".parse::<Strategy>().unwrap_err();
        assert_eq!(e, UnknownStrategy("random".into()));
        assert_eq!(e.to_string(), "unknown strategy 'random' (spread or pack)");
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
        // Two replicas of each app's deployment, the apps asking in `order`.
        let mut id = 0;
        let mut placements = |c: &SimCluster, order: Vec<&String>| {
            let mut out = BTreeMap::new();
            for app in order {
                for _ in 0..2 {
                    id += 1;
                    out.entry(app.clone())
                        .or_insert_with(Vec::new)
                        .push(place(c, id, app, "d", 0.5).unwrap());
                }
            }
            out
        };
        let first = placements(&one, deps.iter().collect());
        let second = placements(&two, deps.iter().rev().collect());
        assert_eq!(first, second);
        let on_b = first
            .values()
            .flatten()
            .filter(|n| n.starts_with("b-"))
            .count();
        assert!(on_b > 20, "bigger nodes take more: {on_b} of 40 on b");
    }
}
