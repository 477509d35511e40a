//! `StaticCluster`: a fixed set of nodes with resources, spread placement and
//! node deaths on demand. Used by tests and by the cluster simulator.

use std::{
    collections::HashMap,
    fmt::Write as _,
    sync::{Mutex, MutexGuard},
};

use flotilla_core::{AppName, DeploymentName, Resources};
use flotilla_replica::ReplicaId;
use tokio::sync::broadcast;
use tracing::info;

use crate::{Cluster, ClusterEvent, NodeId, PlacementRequest, Refusal};

/// Slack for comparing fractional resource amounts.
const EPS: f64 = 1e-9;
/// Events a slow subscriber may fall behind by before it resynchronises.
const EVENT_BUFFER: usize = 256;

/// A node of a [`StaticCluster`]: its name and what it offers.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Unique name.
    pub name: NodeId,
    /// Everything the node offers.
    pub capacity: Resources,
}

impl NodeSpec {
    /// A node called `name` offering `capacity`.
    pub fn new(name: impl Into<NodeId>, capacity: Resources) -> Self {
        NodeSpec {
            name: name.into(),
            capacity,
        }
    }
}

type DeploymentKey = (AppName, DeploymentName);

struct Node {
    spec: NodeSpec,
    used: Resources,
    alive: bool,
    replicas: usize,
    per_deployment: HashMap<DeploymentKey, usize>,
}

impl Node {
    fn free(&self, dim: &Dim) -> f64 {
        dim.amount(&self.spec.capacity) - dim.amount(&self.used)
    }

    fn fits(&self, need: &Resources) -> bool {
        dims(need)
            .iter()
            .all(|d| d.amount(need) <= self.free(d) + EPS)
    }
}

/// One resource dimension.
enum Dim {
    Cpus,
    Memory,
    Gpus,
    Custom(String),
}

impl Dim {
    fn amount(&self, r: &Resources) -> f64 {
        match self {
            Dim::Cpus => r.cpus,
            Dim::Memory => r.memory_bytes as f64,
            Dim::Gpus => r.gpus,
            Dim::Custom(name) => r.custom.get(name).copied().unwrap_or(0.0),
        }
    }

    fn name(&self) -> &str {
        match self {
            Dim::Cpus => "cpus",
            Dim::Memory => "memory_bytes",
            Dim::Gpus => "gpus",
            Dim::Custom(name) => name,
        }
    }
}

/// The dimensions `need` asks for (amounts above zero).
fn dims(need: &Resources) -> Vec<Dim> {
    let mut out: Vec<Dim> = [Dim::Cpus, Dim::Memory, Dim::Gpus]
        .into_iter()
        .filter(|d| d.amount(need) > 0.0)
        .collect();
    out.extend(
        need.custom
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(k, _)| Dim::Custom(k.clone())),
    );
    out
}

fn add(used: &mut Resources, r: &Resources, sign: f64) {
    used.cpus += sign * r.cpus;
    used.gpus += sign * r.gpus;
    used.memory_bytes = if sign > 0.0 {
        used.memory_bytes.saturating_add(r.memory_bytes)
    } else {
        used.memory_bytes.saturating_sub(r.memory_bytes)
    };
    for (k, v) in &r.custom {
        *used.custom.entry(k.clone()).or_insert(0.0) += sign * v;
    }
}

struct Reservation {
    node: usize,
    resources: Resources,
    key: DeploymentKey,
}

struct Inner {
    nodes: Vec<Node>,
    reservations: HashMap<ReplicaId, Reservation>,
}

impl Inner {
    fn unreserve(&mut self, replica: ReplicaId) -> Option<usize> {
        let r = self.reservations.remove(&replica)?;
        let node = self.nodes.get_mut(r.node)?;
        add(&mut node.used, &r.resources, -1.0);
        node.replicas = node.replicas.saturating_sub(1);
        if let Some(n) = node.per_deployment.get_mut(&r.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                node.per_deployment.remove(&r.key);
            }
        }
        Some(r.node)
    }

    fn refusal(&self, need: &Resources) -> Refusal {
        let live: Vec<&Node> = self.nodes.iter().filter(|n| n.alive).collect();
        if live.is_empty() {
            return Refusal {
                missing: "the cluster has no live node".to_owned(),
            };
        }
        let wanted = dims(need);
        let mut missing = String::new();
        for d in &wanted {
            let most = live.iter().map(|n| n.free(d)).fold(f64::MIN, f64::max);
            if d.amount(need) > most + EPS {
                if !missing.is_empty() {
                    missing.push_str("; ");
                }
                let _ = write!(
                    missing,
                    "{}: need {}, most free {}",
                    d.name(),
                    d.amount(need),
                    most.max(0.0)
                );
            }
        }
        if missing.is_empty() {
            let all: Vec<String> = wanted
                .iter()
                .map(|d| format!("{} {}", d.name(), d.amount(need)))
                .collect();
            missing = format!("no single node has {} free at once", all.join(", "));
        }
        Refusal { missing }
    }
}

/// A fixed set of nodes. Placement spreads: a replica goes to the live node with
/// room that holds the fewest replicas of its deployment (then the fewest replicas
/// overall, then the first declared). Releasing a reservation or adding a node
/// announces [`ClusterEvent::CapacityFreed`]; [`kill_node`](Self::kill_node)
/// announces [`ClusterEvent::NodeDied`].
///
/// ```
/// use flotilla_core::Resources;
/// use flotilla_deployment::{NodeSpec, StaticCluster};
/// let c = StaticCluster::new([
///     NodeSpec::new("n1", Resources::default().with_cpus(2.0)),
///     NodeSpec::new("n2", Resources::default().with_gpus(1.0)),
/// ]);
/// assert_eq!(c.live_nodes(), ["n1", "n2"]);
/// ```
pub struct StaticCluster {
    inner: Mutex<Inner>,
    events: broadcast::Sender<ClusterEvent>,
}

impl std::fmt::Debug for StaticCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("StaticCluster")
            .field("nodes", &inner.nodes.len())
            .field("reservations", &inner.reservations.len())
            .finish()
    }
}

impl StaticCluster {
    /// A cluster of `nodes`, all alive and empty.
    pub fn new(nodes: impl IntoIterator<Item = NodeSpec>) -> Self {
        let nodes = nodes
            .into_iter()
            .map(|spec| Node {
                spec,
                used: Resources::none(),
                alive: true,
                replicas: 0,
                per_deployment: HashMap::new(),
            })
            .collect();
        StaticCluster {
            inner: Mutex::new(Inner {
                nodes,
                reservations: HashMap::new(),
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

    /// Kill node `name`: its reservations are dropped and subscribers learn that
    /// its replicas are gone. Returns false for an unknown or already dead node.
    pub fn kill_node(&self, name: &str) -> bool {
        {
            let mut inner = self.lock();
            let Some(idx) = inner
                .nodes
                .iter()
                .position(|n| n.alive && n.spec.name == name)
            else {
                return false;
            };
            let lost: Vec<ReplicaId> = inner
                .reservations
                .iter()
                .filter(|(_, r)| r.node == idx)
                .map(|(id, _)| *id)
                .collect();
            for id in lost {
                inner.unreserve(id);
            }
            inner.nodes[idx].alive = false;
        }
        info!(node = name, "node died");
        self.announce(ClusterEvent::NodeDied(name.to_owned()));
        true
    }

    /// Add a node, or bring a dead one of the same name back empty with `spec`'s
    /// capacity. An alive node of that name is left as it is (returns false).
    pub fn add_node(&self, spec: NodeSpec) -> bool {
        {
            let mut inner = self.lock();
            match inner.nodes.iter_mut().find(|n| n.spec.name == spec.name) {
                Some(n) if n.alive => return false,
                Some(n) => {
                    n.spec = spec;
                    n.alive = true;
                }
                None => inner.nodes.push(Node {
                    spec,
                    used: Resources::none(),
                    alive: true,
                    replicas: 0,
                    per_deployment: HashMap::new(),
                }),
            }
        }
        self.announce(ClusterEvent::CapacityFreed);
        true
    }

    /// Names of the live nodes, in declaration order.
    pub fn live_nodes(&self) -> Vec<NodeId> {
        self.lock()
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| n.spec.name.clone())
            .collect()
    }

    /// What node `name` has free now (`None` if unknown or dead).
    pub fn free(&self, name: &str) -> Option<Resources> {
        let inner = self.lock();
        let n = inner
            .nodes
            .iter()
            .find(|n| n.alive && n.spec.name == name)?;
        let mut free = n.spec.capacity.clone();
        add(&mut free, &n.used, -1.0);
        Some(free)
    }

    /// How many replicas hold a reservation on node `name`.
    pub fn replicas_on(&self, name: &str) -> usize {
        self.lock()
            .nodes
            .iter()
            .find(|n| n.spec.name == name)
            .map_or(0, |n| n.replicas)
    }

    /// Where `replica` holds its reservation.
    pub fn node_of(&self, replica: ReplicaId) -> Option<NodeId> {
        let inner = self.lock();
        let r = inner.reservations.get(&replica)?;
        inner.nodes.get(r.node).map(|n| n.spec.name.clone())
    }
}

impl Cluster for StaticCluster {
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        let mut inner = self.lock();
        if let Some(r) = inner.reservations.get(&request.replica) {
            // Placing twice is idempotent.
            return Ok(inner.nodes[r.node].spec.name.clone());
        }
        let key = (request.app.clone(), request.deployment.clone());
        let best = inner
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.alive && n.fits(request.resources))
            .min_by_key(|(i, n)| {
                (
                    n.per_deployment.get(&key).copied().unwrap_or(0),
                    n.replicas,
                    *i,
                )
            })
            .map(|(i, _)| i);
        let Some(idx) = best else {
            return Err(inner.refusal(request.resources));
        };
        let node = &mut inner.nodes[idx];
        add(&mut node.used, request.resources, 1.0);
        node.replicas += 1;
        *node.per_deployment.entry(key.clone()).or_insert(0) += 1;
        let name = node.spec.name.clone();
        inner.reservations.insert(
            request.replica,
            Reservation {
                node: idx,
                resources: request.resources.clone(),
                key,
            },
        );
        Ok(name)
    }

    fn release(&self, replica: ReplicaId) {
        let freed = self.lock().unreserve(replica).is_some();
        if freed {
            self.announce(ClusterEvent::CapacityFreed);
        }
    }

    fn subscribe(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.events.subscribe())
    }

    fn is_alive(&self, node: &str) -> bool {
        self.lock()
            .nodes
            .iter()
            .any(|n| n.alive && n.spec.name == node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> (AppName, DeploymentName, DeploymentName) {
        (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
            DeploymentName::new("e").unwrap(),
        )
    }

    fn req<'a>(
        id: u64,
        app: &'a AppName,
        dep: &'a DeploymentName,
        r: &'a Resources,
    ) -> PlacementRequest<'a> {
        PlacementRequest {
            replica: ReplicaId(id),
            app,
            deployment: dep,
            resources: r,
        }
    }

    #[test]
    fn spreads_a_deployment_over_nodes_and_refuses_naming_what_is_missing() {
        let c = StaticCluster::new([
            NodeSpec::new("n1", Resources::default().with_cpus(2.0)),
            NodeSpec::new("n2", Resources::default().with_cpus(2.0)),
        ]);
        let (a, d, e) = names();
        let one = Resources::default();
        assert_eq!(c.place(&req(1, &a, &d, &one)).unwrap(), "n1");
        assert_eq!(c.place(&req(2, &a, &d, &one)).unwrap(), "n2");
        // Another deployment spreads on its own count, then on total load.
        assert_eq!(c.place(&req(3, &a, &e, &one)).unwrap(), "n1");
        assert_eq!(c.place(&req(4, &a, &d, &one)).unwrap(), "n2");
        let refusal = c.place(&req(5, &a, &d, &one)).unwrap_err();
        assert_eq!(refusal.missing, "cpus: need 1, most free 0");
        let gpu = Resources::default().with_gpus(1.0);
        let refusal = c.place(&req(6, &a, &d, &gpu)).unwrap_err();
        assert!(
            refusal.missing.contains("gpus: need 1, most free 0"),
            "{refusal}"
        );
        // Placing the same replica twice is idempotent.
        assert_eq!(c.place(&req(1, &a, &d, &one)).unwrap(), "n1");
        assert_eq!(c.replicas_on("n1"), 2);
    }

    #[test]
    fn release_and_node_death_announce_and_free_room() {
        let c = StaticCluster::new([NodeSpec::new("n1", Resources::default().with_cpus(1.0))]);
        let mut rx = c.subscribe().unwrap();
        let (a, d, _) = names();
        let one = Resources::default();
        c.place(&req(1, &a, &d, &one)).unwrap();
        assert!(c.place(&req(2, &a, &d, &one)).is_err());
        c.release(ReplicaId(1));
        assert_eq!(rx.try_recv().unwrap(), ClusterEvent::CapacityFreed);
        c.release(ReplicaId(1));
        assert!(rx.try_recv().is_err(), "a second release frees nothing");
        c.place(&req(2, &a, &d, &one)).unwrap();
        assert!(c.kill_node("n1"));
        assert!(!c.kill_node("n1"));
        assert_eq!(rx.try_recv().unwrap(), ClusterEvent::NodeDied("n1".into()));
        assert!(!c.is_alive("n1"));
        assert_eq!(c.node_of(ReplicaId(2)), None);
        assert_eq!(
            c.place(&req(3, &a, &d, &one)).unwrap_err().missing,
            "the cluster has no live node"
        );
        assert!(c.add_node(NodeSpec::new("n1", Resources::default().with_cpus(1.0))));
        assert_eq!(rx.try_recv().unwrap(), ClusterEvent::CapacityFreed);
        assert_eq!(c.place(&req(3, &a, &d, &one)).unwrap(), "n1");
    }

    #[test]
    fn a_request_no_single_node_can_hold_says_so() {
        let c = StaticCluster::new([
            NodeSpec::new("cpu", Resources::default().with_cpus(4.0)),
            NodeSpec::new("gpu", Resources::none().with_gpus(1.0)),
        ]);
        let (a, d, _) = names();
        let both = Resources::default().with_gpus(1.0);
        let refusal = c.place(&req(1, &a, &d, &both)).unwrap_err();
        assert_eq!(
            refusal.missing,
            "no single node has cpus 1, gpus 1 free at once"
        );
        let custom = Resources::none().with_custom("tpu", 2.0);
        let refusal = c.place(&req(2, &a, &d, &custom)).unwrap_err();
        assert_eq!(refusal.missing, "tpu: need 2, most free 0");
    }
}
