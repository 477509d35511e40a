//! `NodePool`: the bookkeeping every [`Cluster`](crate::Cluster) with nodes of
//! finite size shares. Nodes with resources, alive or dead; the reservations of
//! each placed replica (one, or one per bundle of its placement group); what
//! each node has free and whether a request fits; the rules every such cluster
//! applies the same way (`max_replicas_per_node`, the placement group
//! strategies); why a request fits nowhere; replicas per node and per
//! deployment on each node.
//!
//! Its owner decides which of the nodes that fit a replica (or a bundle) gets,
//! by ranking them (spread, pack, ...), whom to tell, and what to count.
//! [`StaticCluster`] wraps one; the cluster simulator ranks nodes its own way
//! on one.
//!
//! [`StaticCluster`]: crate::StaticCluster

mod placement;
mod resources;
#[cfg(test)]
mod tests;

use std::{collections::HashMap, fmt::Write as _};

use flotilla_core::{AppName, DeploymentName, Resources};
use flotilla_replica::ReplicaId;

use crate::{NodeId, Refusal};

use resources::{Dim, EPS, add, dims, fits};

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
    /// Leaving the cluster: alive, its replicas still run, nothing new is
    /// placed on it.
    draining: bool,
    replicas: usize,
    per_deployment: HashMap<DeploymentKey, usize>,
}

impl PoolNode {
    fn new(spec: NodeSpec) -> Self {
        PoolNode {
            spec,
            used: Resources::none(),
            alive: true,
            draining: false,
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

    /// Whether it is leaving the cluster ([`NodePool::drain`]).
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Whether new replicas may be placed on it: alive and not leaving.
    fn open(&self) -> bool {
        self.alive && !self.draining
    }

    /// Replicas running on it (a replica runs where its first bundle is; a
    /// bundle of a replica running elsewhere does not count).
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Replicas of deployment `key` running on it (what
    /// `max_replicas_per_node` limits).
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

/// What one placed replica holds.
struct Reservation {
    /// Where the replica runs (its first bundle's node).
    node: usize,
    /// What it holds there: its resources, its first bundle, or (`PACK`,
    /// `STRICT_PACK` on one node) every bundle's sum.
    resources: Resources,
    key: DeploymentKey,
    /// Its other bundles and their nodes (`SPREAD`, `STRICT_SPREAD`, and a
    /// `PACK` whose bundles no node holds together); empty, and so not
    /// allocated, otherwise.
    more: Vec<(usize, Resources)>,
}

/// Nodes and the reservations held on them. A dead node stays, marked dead,
/// until its owner [forgets](Self::forget) it; nodes keep their order, which
/// breaks ties between them.
///
/// [`place`](Self::place) applies a [`PlacementRequest`](crate::PlacementRequest) the same way for every
/// cluster built on a pool: without a placement group the replica's resources
/// go on one node; `PACK` and `STRICT_PACK` put the bundles' sum on one node,
/// and where no node has room for it `PACK` puts each bundle on a node an
/// earlier one took if it can, else on another (best effort, as in Ray);
/// `STRICT_SPREAD` puts each bundle on a different live node or refuses;
/// `SPREAD` puts each bundle on a node no other bundle of the replica took
/// where it can, and on a shared one where it cannot. A node that already runs
/// `max_replicas_per_node` replicas of the deployment takes no more of them.
/// Among the nodes that fit, the owner's ranking picks (lowest first, then the
/// first declared).
///
/// ```
/// use flotilla_core::{AppName, DeploymentName, Resources};
/// use flotilla_cluster::{NodePool, NodeSpec, PlacementRequest};
/// use flotilla_replica::ReplicaId;
/// let mut pool = NodePool::new([NodeSpec::new("n1", Resources::default().with_cpus(1.0))]);
/// let (app, dep) = (AppName::new("a").unwrap(), DeploymentName::new("d").unwrap());
/// let one = Resources::default();
/// let request = PlacementRequest::new(ReplicaId(1), &app, &dep, &one);
/// // Rank nodes by how many replicas they run: the least loaded wins.
/// assert_eq!(pool.place(&request, |_, node, _| node.replicas()).unwrap(), "n1");
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

    /// The nodes new replicas may go to (alive, not draining) with room for
    /// `need`, with their indexes (resources only: no limit per node, no
    /// placement group).
    pub fn fitting<'a>(
        &'a self,
        need: &'a Resources,
    ) -> impl Iterator<Item = (usize, &'a PoolNode)> + 'a {
        self.nodes
            .iter()
            .enumerate()
            .filter(move |(_, n)| n.open() && n.fits(need))
    }

    /// Where `replica` runs (its first bundle's node).
    pub fn node_of(&self, replica: ReplicaId) -> Option<&PoolNode> {
        let r = self.reservations.get(&replica)?;
        self.nodes.get(r.node)
    }

    /// Everything `replica` holds, node by node: where it runs first, then its
    /// other bundles in order (a bundle on a node that died since is gone).
    pub fn reservations_of(
        &self,
        replica: ReplicaId,
    ) -> impl Iterator<Item = (&PoolNode, &Resources)> + '_ {
        self.reservations
            .get(&replica)
            .into_iter()
            .flat_map(|r| {
                std::iter::once((r.node, &r.resources))
                    .chain(r.more.iter().map(|(node, res)| (*node, res)))
            })
            .filter_map(|(node, res)| Some((self.nodes.get(node)?, res)))
    }

    /// Replicas holding reservations.
    pub fn reserved(&self) -> usize {
        self.reservations.len()
    }

    /// Replicas of application `app` (all its deployments) holding reservations.
    pub fn reserved_by(&self, app: &str) -> usize {
        self.reservations
            .values()
            .filter(|r| r.key.0.as_str() == app)
            .count()
    }

    /// Give back everything `replica` holds; false if it held nothing.
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
        for (i, bundle) in &r.more {
            if let Some(node) = self.nodes.get_mut(*i) {
                add(&mut node.used, bundle, -1.0);
            }
        }
        true
    }

    /// Drop every reservation (every replica died at once); returns how many.
    pub fn release_all(&mut self) -> usize {
        let mut ids: Vec<ReplicaId> = self.reservations.keys().copied().collect();
        // In id order, not the map's: the nodes' f64 sums, and so the ties
        // placement breaks, are a function of what happened, not of hashing.
        ids.sort_unstable();
        for id in &ids {
            self.release(*id);
        }
        ids.len()
    }

    /// Kill the live node `name`: the replicas running on it lose everything
    /// they hold (their bundles on other nodes too), and the bundles it held
    /// for replicas running elsewhere are gone (those replicas keep running).
    /// Returns the deployment of each replica that ran on it, or `None` for an
    /// unknown or already dead node.
    pub fn kill(&mut self, name: &str) -> Option<Vec<DeploymentKey>> {
        let idx = self
            .nodes
            .iter()
            .position(|n| n.alive && n.spec.name == name)?;
        let mut lost: Vec<(ReplicaId, DeploymentKey)> = self
            .reservations
            .iter()
            .filter(|(_, r)| r.node == idx)
            .map(|(id, r)| (*id, r.key.clone()))
            .collect();
        // In id order (see `release_all`).
        lost.sort_unstable_by_key(|(id, _)| *id);
        for (id, _) in &lost {
            self.release(*id);
        }
        for r in self.reservations.values_mut() {
            r.more.retain(|(node, _)| *node != idx);
        }
        let node = &mut self.nodes[idx];
        node.alive = false;
        node.draining = false;
        node.used = Resources::none();
        node.replicas = 0;
        node.per_deployment.clear();
        Some(lost.into_iter().map(|(_, key)| key).collect())
    }

    /// Forget the dead node `name`, for an owner whose nodes never come back
    /// under a name they had (the head: every node incarnation has an id of its
    /// own), so that dead nodes cost neither memory nor a skipped entry in
    /// every placement. The nodes after it keep their order. False for an
    /// unknown or live node.
    pub fn forget(&mut self, name: &str) -> bool {
        let Some(idx) = self
            .nodes
            .iter()
            .position(|n| !n.alive && n.spec.name == name)
        else {
            return false;
        };
        self.nodes.remove(idx);
        // A dead node holds nothing (`kill` released it), so only the indexes
        // past it move.
        let shift = |i: &mut usize| {
            if *i > idx {
                *i -= 1;
            }
        };
        for r in self.reservations.values_mut() {
            shift(&mut r.node);
            r.more.iter_mut().for_each(|(i, _)| shift(i));
        }
        true
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

    /// The live node `name` is leaving the cluster: its replicas keep what
    /// they hold and run on, and nothing new is placed on it until it dies.
    /// False for an unknown or dead node.
    pub fn drain(&mut self, name: &str) -> bool {
        match self
            .nodes
            .iter_mut()
            .find(|n| n.alive && n.spec.name == name)
        {
            Some(n) => {
                n.draining = true;
                true
            }
            None => false,
        }
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

    /// What is missing for `need`: that there is no live node (or every live
    /// one is leaving), or each amount no node that takes replicas has free
    /// (`"cpus: need 2, most free 1"`, joined by `; `). `None` when every
    /// amount is free on some node, just not all on one.
    pub fn shortfall(&self, need: &Resources) -> Option<String> {
        let live: Vec<&PoolNode> = self.nodes.iter().filter(|n| n.open()).collect();
        if live.is_empty() {
            return Some(if self.live().next().is_some() {
                "every live node is leaving the cluster".to_owned()
            } else {
                "the cluster has no live node".to_owned()
            });
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
