//! `NodePool`: the bookkeeping every [`Cluster`](crate::Cluster) with nodes of
//! finite size shares. Nodes with resources, alive or dead; one reservation per
//! placed replica; what each node has free and whether a request fits; why a
//! request fits nowhere; replicas per node and per deployment on each node.
//!
//! It decides nothing: which fitting node a replica gets (spread, pack, ...),
//! whom to tell, and what to count are its owner's. [`StaticCluster`] wraps
//! one; the cluster simulator builds its own placement strategies on one.
//!
//! [`StaticCluster`]: crate::StaticCluster

use std::{collections::HashMap, fmt::Write as _};

use flotilla_core::{AppName, DeploymentName, Resources};
use flotilla_replica::ReplicaId;

use crate::{NodeId, PlacementRequest, Refusal};

/// Slack for comparing fractional resource amounts.
const EPS: f64 = 1e-9;

/// A node: its name and what it offers.
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

    /// Whether an empty node of this spec holds `need`.
    pub fn holds(&self, need: &Resources) -> bool {
        fits(&self.capacity, &Resources::none(), need)
    }
}

/// A deployment, as the pool counts replicas per node.
pub type DeploymentKey = (AppName, DeploymentName);

/// One node of a [`NodePool`].
#[derive(Debug)]
pub struct PoolNode {
    spec: NodeSpec,
    used: Resources,
    alive: bool,
    replicas: usize,
    per_deployment: HashMap<DeploymentKey, usize>,
}

impl PoolNode {
    fn new(spec: NodeSpec) -> Self {
        PoolNode {
            spec,
            used: Resources::none(),
            alive: true,
            replicas: 0,
            per_deployment: HashMap::new(),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// What it offers.
    pub fn capacity(&self) -> &Resources {
        &self.spec.capacity
    }

    /// What its reservations hold.
    pub fn used(&self) -> &Resources {
        &self.used
    }

    /// What it has free.
    pub fn free(&self) -> Resources {
        let mut free = self.spec.capacity.clone();
        add(&mut free, &self.used, -1.0);
        free
    }

    /// Whether it is alive.
    pub fn is_alive(&self) -> bool {
        self.alive
    }

    /// Replicas holding a reservation on it.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Replicas of deployment `key` holding a reservation on it.
    pub fn replicas_of(&self, key: &DeploymentKey) -> usize {
        self.per_deployment.get(key).copied().unwrap_or(0)
    }

    /// Whether `need` fits in what it has free.
    pub fn fits(&self, need: &Resources) -> bool {
        fits(&self.spec.capacity, &self.used, need)
    }

    fn free_of(&self, dim: &Dim) -> f64 {
        dim.amount(&self.spec.capacity) - dim.amount(&self.used)
    }
}

/// Whether `need` fits a node offering `capacity` of which `used` is taken.
fn fits(capacity: &Resources, used: &Resources, need: &Resources) -> bool {
    dims(need)
        .iter()
        .all(|d| d.amount(need) <= d.amount(capacity) - d.amount(used) + EPS)
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

/// Nodes and the reservations held on them. Nodes keep their index for the
/// pool's life (a dead node stays, marked dead), so the index a
/// [`fitting`](Self::fitting) node comes with is what [`reserve`](Self::reserve)
/// takes.
///
/// ```
/// use flotilla_core::{AppName, DeploymentName, Resources};
/// use flotilla_cluster::{NodePool, NodeSpec, PlacementRequest};
/// use flotilla_replica::ReplicaId;
/// let mut pool = NodePool::new([NodeSpec::new("n1", Resources::default().with_cpus(1.0))]);
/// let (app, dep) = (AppName::new("a").unwrap(), DeploymentName::new("d").unwrap());
/// let one = Resources::default();
/// let request = PlacementRequest { replica: ReplicaId(1), app: &app, deployment: &dep, resources: &one };
/// let (idx, _) = pool.fitting(&one).next().unwrap();
/// assert_eq!(pool.reserve(idx, &request), "n1");
/// assert!(pool.fitting(&one).next().is_none());
/// assert_eq!(pool.refusal(&one).missing, "cpus: need 1, most free 0");
/// assert!(pool.release(ReplicaId(1)));
/// ```
#[derive(Default)]
pub struct NodePool {
    nodes: Vec<PoolNode>,
    reservations: HashMap<ReplicaId, Reservation>,
}

impl std::fmt::Debug for NodePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePool")
            .field("nodes", &self.nodes.len())
            .field("reservations", &self.reservations.len())
            .finish()
    }
}

impl NodePool {
    /// A pool of `nodes`, all alive and empty, in this order.
    pub fn new(nodes: impl IntoIterator<Item = NodeSpec>) -> Self {
        NodePool {
            nodes: nodes.into_iter().map(PoolNode::new).collect(),
            reservations: HashMap::new(),
        }
    }

    /// Every node, dead ones included, in declaration order.
    pub fn nodes(&self) -> &[PoolNode] {
        &self.nodes
    }

    /// The live nodes, in declaration order.
    pub fn live(&self) -> impl Iterator<Item = &PoolNode> {
        self.nodes.iter().filter(|n| n.alive)
    }

    /// Names of the live nodes, in declaration order.
    pub fn live_names(&self) -> Vec<NodeId> {
        self.live().map(|n| n.spec.name.clone()).collect()
    }

    /// The first node called `name`, alive or dead.
    pub fn node(&self, name: &str) -> Option<&PoolNode> {
        self.nodes.iter().find(|n| n.spec.name == name)
    }

    /// The live node called `name`.
    pub fn live_node(&self, name: &str) -> Option<&PoolNode> {
        self.live().find(|n| n.spec.name == name)
    }

    /// Whether a node called `name` is alive.
    pub fn is_alive(&self, name: &str) -> bool {
        self.live_node(name).is_some()
    }

    /// The live nodes with room for `need`, with their indexes.
    pub fn fitting<'a>(
        &'a self,
        need: &'a Resources,
    ) -> impl Iterator<Item = (usize, &'a PoolNode)> + 'a {
        self.nodes
            .iter()
            .enumerate()
            .filter(move |(_, n)| n.alive && n.fits(need))
    }

    /// Where `replica` holds its reservation.
    pub fn node_of(&self, replica: ReplicaId) -> Option<&PoolNode> {
        let r = self.reservations.get(&replica)?;
        self.nodes.get(r.node)
    }

    /// Reservations held.
    pub fn reserved(&self) -> usize {
        self.reservations.len()
    }

    /// Reservations held by replicas of application `app` (all its deployments).
    pub fn reserved_by(&self, app: &str) -> usize {
        self.reservations
            .values()
            .filter(|r| r.key.0.as_str() == app)
            .count()
    }

    /// Reserve `request`'s resources on node `node` (an index from
    /// [`fitting`](Self::fitting)) and return the node's name. The caller checks
    /// that the replica holds no reservation yet and that the node fits.
    ///
    /// # Panics
    /// If `node` is not an index of the pool.
    pub fn reserve(&mut self, node: usize, request: &PlacementRequest<'_>) -> NodeId {
        let key = (request.app.clone(), request.deployment.clone());
        let n = &mut self.nodes[node];
        add(&mut n.used, request.resources, 1.0);
        n.replicas += 1;
        *n.per_deployment.entry(key.clone()).or_insert(0) += 1;
        let name = n.spec.name.clone();
        self.reservations.insert(
            request.replica,
            Reservation {
                node,
                resources: request.resources.clone(),
                key,
            },
        );
        name
    }

    /// Give back what `replica` reserved; false if it held nothing.
    pub fn release(&mut self, replica: ReplicaId) -> bool {
        let Some(r) = self.reservations.remove(&replica) else {
            return false;
        };
        if let Some(node) = self.nodes.get_mut(r.node) {
            add(&mut node.used, &r.resources, -1.0);
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

    /// Drop every reservation (every replica died at once); returns how many.
    pub fn release_all(&mut self) -> usize {
        let ids: Vec<ReplicaId> = self.reservations.keys().copied().collect();
        for id in &ids {
            self.release(*id);
        }
        ids.len()
    }

    /// Kill the live node `name`: its reservations are dropped. Returns the
    /// deployment of each reservation it held, or `None` for an unknown or
    /// already dead node.
    pub fn kill(&mut self, name: &str) -> Option<Vec<DeploymentKey>> {
        let idx = self
            .nodes
            .iter()
            .position(|n| n.alive && n.spec.name == name)?;
        let lost: Vec<(ReplicaId, DeploymentKey)> = self
            .reservations
            .iter()
            .filter(|(_, r)| r.node == idx)
            .map(|(id, r)| (*id, r.key.clone()))
            .collect();
        for (id, _) in &lost {
            self.release(*id);
        }
        self.nodes[idx].alive = false;
        Some(lost.into_iter().map(|(_, key)| key).collect())
    }

    /// Add a node, or bring a dead one of the same name back with `spec`'s
    /// capacity. An alive node of that name is left as it is (returns false).
    pub fn add(&mut self, spec: NodeSpec) -> bool {
        match self.nodes.iter_mut().find(|n| n.spec.name == spec.name) {
            Some(n) if n.alive => return false,
            Some(n) => {
                n.spec = spec;
                n.alive = true;
            }
            None => self.nodes.push(PoolNode::new(spec)),
        }
        true
    }

    /// Why `need` fits no live node: [`shortfall`](Self::shortfall), or else
    /// that no single node has every amount free at once (naming them).
    pub fn refusal(&self, need: &Resources) -> Refusal {
        let missing = self.shortfall(need).unwrap_or_else(|| {
            let all: Vec<String> = dims(need)
                .iter()
                .map(|d| format!("{} {}", d.name(), d.amount(need)))
                .collect();
            format!("no single node has {} free at once", all.join(", "))
        });
        Refusal { missing }
    }

    /// What is missing for `need`: that there is no live node, or each amount no
    /// live node has free (`"cpus: need 2, most free 1"`, joined by `; `).
    /// `None` when every amount is free on some node, just not all on one.
    pub fn shortfall(&self, need: &Resources) -> Option<String> {
        let live: Vec<&PoolNode> = self.live().collect();
        if live.is_empty() {
            return Some("the cluster has no live node".to_owned());
        }
        let mut missing = String::new();
        for d in &dims(need) {
            let most = live.iter().map(|n| n.free_of(d)).fold(f64::MIN, f64::max);
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
        (!missing.is_empty()).then_some(missing)
    }
}
