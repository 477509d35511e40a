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

use std::{collections::HashMap, collections::VecDeque, fmt::Write as _};

use flotilla_core::{AppName, DeploymentName, PlacementGroup, PlacementStrategy, Resources};
use flotilla_replica::ReplicaId;

use crate::{NodeId, PlacementRequest, Refusal, cluster::limit_refusal};

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

/// Whether `need` fits a node offering `capacity` of which `used` is taken.
/// Allocates nothing: it runs for every node of every placement.
fn fits(capacity: &Resources, used: &Resources, need: &Resources) -> bool {
    let room = |need: f64, capacity: f64, used: f64| need <= 0.0 || need <= capacity - used + EPS;
    let custom = |r: &Resources, k: &str| r.custom.get(k).copied().unwrap_or(0.0);
    room(need.cpus, capacity.cpus, used.cpus)
        && room(
            need.memory_bytes as f64,
            capacity.memory_bytes as f64,
            used.memory_bytes as f64,
        )
        && room(need.gpus, capacity.gpus, used.gpus)
        && need
            .custom
            .iter()
            .all(|(k, v)| room(*v, custom(capacity, k), custom(used, k)))
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
/// [`place`](Self::place) applies a [`PlacementRequest`] the same way for every
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

    /// Place `request` (see the type's rules) and return the node where the
    /// replica runs, or refuse saying why. Among the live nodes that fit (a
    /// replica, a bundle, or a group's sum), the one with the lowest
    /// `rank(index, node, deployment)` is taken, the first declared on a tie;
    /// a spread group ranks once per bundle, with its earlier bundles already
    /// held. A replica that holds reservations already gets its node back and
    /// nothing more is reserved.
    ///
    /// Without a placement group nothing is allocated beyond the reservation's
    /// own record.
    pub fn place<K: PartialOrd>(
        &mut self,
        request: &PlacementRequest<'_>,
        mut rank: impl FnMut(usize, &PoolNode, &DeploymentKey) -> K,
    ) -> Result<NodeId, Refusal> {
        if let Some(node) = self.node_of(request.replica) {
            return Ok(node.spec.name.clone());
        }
        let key = (request.app.clone(), request.deployment.clone());
        let limit = request.max_replicas_per_node;
        let Some(group) = request.placement_group else {
            return match self.best(request.resources, &key, limit, &[], &mut rank) {
                Some(node) => {
                    add(&mut self.nodes[node].used, request.resources, 1.0);
                    Ok(self.record(
                        request.replica,
                        node,
                        request.resources.clone(),
                        key,
                        Vec::new(),
                    ))
                }
                None => Err(self.no_room(request.resources, limit)),
            };
        };
        if group.bundles.is_empty() {
            return Err(Refusal {
                missing: "its placement group has no bundle".to_owned(),
            });
        }
        match group.strategy {
            PlacementStrategy::Pack | PlacementStrategy::StrictPack => {
                let sum = group.total();
                match self.best(&sum, &key, limit, &[], &mut rank) {
                    Some(node) => {
                        add(&mut self.nodes[node].used, &sum, 1.0);
                        Ok(self.record(request.replica, node, sum, key, Vec::new()))
                    }
                    None if group.strategy == PlacementStrategy::Pack => {
                        self.pack_apart(request.replica, group, key, limit, rank)
                    }
                    None => Err(Refusal {
                        missing: format!(
                            "{} puts its {} on one node: {}",
                            group.strategy.name(),
                            bundles(group.bundles.len()),
                            self.no_room(&sum, limit).missing
                        ),
                    }),
                }
            }
            PlacementStrategy::Spread => {
                self.spread(request.replica, group, key, limit, false, rank)
            }
            PlacementStrategy::StrictSpread => {
                self.spread(request.replica, group, key, limit, true, rank)
            }
        }
    }

    /// The live node with room for `need` (and under `limit` replicas of `key`),
    /// not in `exclude`, that `rank` puts lowest; the first declared on a tie.
    fn best<K: PartialOrd>(
        &self,
        need: &Resources,
        key: &DeploymentKey,
        limit: Option<u32>,
        exclude: &[usize],
        rank: &mut impl FnMut(usize, &PoolNode, &DeploymentKey) -> K,
    ) -> Option<usize> {
        let mut best: Option<(K, usize)> = None;
        for (i, n) in self.nodes.iter().enumerate() {
            if !self.takes(i, need, key, limit) || exclude.contains(&i) {
                continue;
            }
            let k = rank(i, n, key);
            if best.as_ref().is_none_or(|(b, _)| k < *b) {
                best = Some((k, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Whether node `i` is alive, has room for `need` and runs fewer than
    /// `limit` replicas of `key`.
    fn takes(&self, i: usize, need: &Resources, key: &DeploymentKey, limit: Option<u32>) -> bool {
        self.nodes.get(i).is_some_and(|n| {
            n.open() && n.fits(need) && limit.is_none_or(|l| n.replicas_of(key) < l as usize)
        })
    }

    /// `SPREAD` (`strict` false) and `STRICT_SPREAD` (`strict` true): each bundle
    /// on a node none of the replica's other bundles took, in bundle order by
    /// `rank`; under `SPREAD` a bundle with no such node shares one. Where that
    /// greedy pass fails, any assignment to distinct nodes is looked for before
    /// refusing.
    fn spread<K: PartialOrd>(
        &mut self,
        replica: ReplicaId,
        group: &PlacementGroup,
        key: DeploymentKey,
        limit: Option<u32>,
        strict: bool,
        mut rank: impl FnMut(usize, &PoolNode, &DeploymentKey) -> K,
    ) -> Result<NodeId, Refusal> {
        let n = group.bundles.len();
        let greedy = self.hold_bundles(group, limit, |pool, bundle, lim, taken| {
            let pick = pool.best(bundle, &key, lim, taken, &mut rank);
            if pick.is_none() && !strict {
                return pool.best(bundle, &key, lim, &[], &mut rank);
            }
            pick
        });
        let taken = match greedy {
            Ok(taken) => taken,
            Err((b, why)) => {
                // The greedy pass can miss an assignment to distinct nodes (an
                // early bundle taking the only node a later one fits).
                let distinct = self.distinct_nodes(&group.bundles, &key, limit);
                if distinct.len() < n {
                    return Err(if strict {
                        self.strict_spread_refusal(group, &key, limit, distinct.len())
                    } else {
                        Refusal {
                            missing: format!(
                                "SPREAD: no room for bundle #{} of {n} beside the ones before \
                                 it: {}",
                                b + 1,
                                why.missing
                            ),
                        }
                    });
                }
                for (node, bundle) in distinct.iter().zip(&group.bundles) {
                    add(&mut self.nodes[*node].used, bundle, 1.0);
                }
                distinct
            }
        };
        Ok(self.record_bundles(replica, &taken, group, key))
    }

    /// `PACK` when no node has room for the bundles' sum (Ray's best effort):
    /// each bundle, in order, on a node an earlier bundle of the replica took
    /// if one has room, else on the node `rank` puts lowest; pending only
    /// when some bundle fits nowhere. Greedy, in bundle order: it does not
    /// look for the fewest nodes (bin packing), as Ray's does not.
    fn pack_apart<K: PartialOrd>(
        &mut self,
        replica: ReplicaId,
        group: &PlacementGroup,
        key: DeploymentKey,
        limit: Option<u32>,
        mut rank: impl FnMut(usize, &PoolNode, &DeploymentKey) -> K,
    ) -> Result<NodeId, Refusal> {
        let held = self.hold_bundles(group, limit, |pool, bundle, lim, taken| {
            taken
                .iter()
                .copied()
                .find(|&i| pool.takes(i, bundle, &key, lim))
                .or_else(|| pool.best(bundle, &key, lim, &[], &mut rank))
        });
        match held {
            Ok(taken) => Ok(self.record_bundles(replica, &taken, group, key)),
            Err((b, why)) => Err(Refusal {
                missing: format!(
                    "PACK: its {} fit no node together, and bundle #{} fits none{}: {}",
                    bundles(group.bundles.len()),
                    b + 1,
                    if b == 0 {
                        ""
                    } else {
                        " beside the ones before it"
                    },
                    why.missing
                ),
            }),
        }
    }

    /// Hold each of `group`'s bundles, in order, on the node `choose` picks
    /// for it (given the nodes the bundles before it took); the replica runs
    /// in its first bundle, so `limit` is that node's. The nodes taken, one
    /// per bundle; or the first bundle `choose` found no node for and why,
    /// with every node as it was before (restored exactly, no drift from
    /// adding and subtracting fractions).
    fn hold_bundles(
        &mut self,
        group: &PlacementGroup,
        limit: Option<u32>,
        mut choose: impl FnMut(&Self, &Resources, Option<u32>, &[usize]) -> Option<usize>,
    ) -> Result<Vec<usize>, (usize, Refusal)> {
        let n = group.bundles.len();
        let mut taken: Vec<usize> = Vec::with_capacity(n);
        let mut before: Vec<(usize, Resources)> = Vec::with_capacity(n);
        for (b, bundle) in group.bundles.iter().enumerate() {
            let lim = if b == 0 { limit } else { None };
            let Some(node) = choose(self, bundle, lim, &taken) else {
                // Why, while the bundles before it are still held.
                let why = self.no_room(bundle, lim);
                for (node, used) in before {
                    self.nodes[node].used = used;
                }
                return Err((b, why));
            };
            if !taken.contains(&node) {
                before.push((node, self.nodes[node].used.clone()));
            }
            add(&mut self.nodes[node].used, bundle, 1.0);
            taken.push(node);
        }
        Ok(taken)
    }

    /// Record `replica` as running in its first bundle on `taken[0]`, with
    /// bundle `b` held on `taken[b]` (each already added to its node's use).
    fn record_bundles(
        &mut self,
        replica: ReplicaId,
        taken: &[usize],
        group: &PlacementGroup,
        key: DeploymentKey,
    ) -> NodeId {
        let mut bundles = group.bundles.iter().cloned();
        let first = bundles.next().unwrap_or_else(Resources::none);
        let more = taken.iter().skip(1).copied().zip(bundles).collect();
        // Every bundle has a node here, and there is at least one bundle.
        let node = taken.first().copied().unwrap_or(0);
        self.record(replica, node, first, key, more)
    }

    /// Why `STRICT_SPREAD` cannot place `group` when at most `placed` of its
    /// bundles fit on distinct nodes: how many nodes it needs and how many have
    /// room, and any bundle that fits no node at all.
    fn strict_spread_refusal(
        &self,
        group: &PlacementGroup,
        key: &DeploymentKey,
        limit: Option<u32>,
        placed: usize,
    ) -> Refusal {
        let live = self.live().count();
        if live == 0 {
            return Refusal {
                missing: "the cluster has no live node".to_owned(),
            };
        }
        let mut missing = format!(
            "STRICT_SPREAD puts each of its {} on a different node: it needs {} nodes with \
             room, and has {placed} (of {live} live)",
            bundles(group.bundles.len()),
            group.bundles.len(),
        );
        for (b, bundle) in group.bundles.iter().enumerate() {
            let lim = if b == 0 { limit } else { None };
            if !(0..self.nodes.len()).any(|i| self.takes(i, bundle, key, lim)) {
                let _ = write!(
                    missing,
                    "; bundle #{}: {}",
                    b + 1,
                    self.no_room(bundle, lim).missing
                );
            }
        }
        Refusal { missing }
    }

    /// A node for each of `bundles`, all different, if there is such an
    /// assignment (bundle `b` on node `out[b]`); otherwise the most bundles
    /// that fit on distinct nodes, as nodes in no bundle order (only the
    /// length means anything then). Bipartite matching by breadth-first
    /// augmenting paths, without recursion; run only when the greedy pass
    /// failed.
    fn distinct_nodes(
        &self,
        bundles: &[Resources],
        key: &DeploymentKey,
        limit: Option<u32>,
    ) -> Vec<usize> {
        let fits: Vec<Vec<usize>> = bundles
            .iter()
            .enumerate()
            .map(|(b, bundle)| {
                let lim = if b == 0 { limit } else { None };
                (0..self.nodes.len())
                    .filter(|i| self.takes(*i, bundle, key, lim))
                    .collect()
            })
            .collect();
        let nodes = self.nodes.len();
        let mut holder: Vec<Option<usize>> = vec![None; nodes];
        let mut node_of: Vec<Option<usize>> = vec![None; bundles.len()];
        for b in 0..bundles.len() {
            // Breadth first over alternating paths from bundle b.
            let mut via: Vec<Option<usize>> = vec![None; nodes];
            let mut queue = VecDeque::from([b]);
            let mut free = None;
            'search: while let Some(x) = queue.pop_front() {
                for &j in &fits[x] {
                    if via[j].is_some() {
                        continue;
                    }
                    via[j] = Some(x);
                    match holder[j] {
                        None => {
                            free = Some(j);
                            break 'search;
                        }
                        Some(y) => queue.push_back(y),
                    }
                }
            }
            // Flip the path: each node on it goes to the bundle that reached it.
            let mut at = free;
            while let Some(j) = at {
                let Some(x) = via[j] else { break };
                holder[j] = Some(x);
                at = node_of[x].replace(j);
            }
        }
        // Complete, this is in bundle order; otherwise only its length counts.
        node_of.into_iter().flatten().collect()
    }

    /// Record what `replica` holds (already added to the nodes' use) and
    /// return the name of the node it runs on.
    fn record(
        &mut self,
        replica: ReplicaId,
        node: usize,
        resources: Resources,
        key: DeploymentKey,
        more: Vec<(usize, Resources)>,
    ) -> NodeId {
        let n = &mut self.nodes[node];
        n.replicas += 1;
        // No key allocated for a deployment the node already counts.
        match n.per_deployment.get_mut(&key) {
            Some(count) => *count += 1,
            None => {
                n.per_deployment.insert(key.clone(), 1);
            }
        }
        let name = n.spec.name.clone();
        self.reservations.insert(
            replica,
            Reservation {
                node,
                resources,
                key,
                more,
            },
        );
        name
    }

    /// Why `need` fits no live node once `limit` replicas of the deployment
    /// per node are counted: the limit where some node has the room (so every
    /// such node is at the limit), else [`refusal`](Self::refusal).
    fn no_room(&self, need: &Resources, limit: Option<u32>) -> Refusal {
        if let Some(l) = limit
            && self.fitting(need).next().is_some()
        {
            return limit_refusal(l, "every live node with room");
        }
        self.refusal(need)
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

/// "1 bundle", "3 bundles".
fn bundles(n: usize) -> String {
    if n == 1 {
        "1 bundle".to_owned()
    } else {
        format!("{n} bundles")
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::{AppName, DeploymentName, PlacementGroup, PlacementStrategy as S};

    use super::*;

    fn names() -> (AppName, DeploymentName, DeploymentName) {
        (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
            DeploymentName::new("e").unwrap(),
        )
    }

    fn cpus(n: f64) -> Resources {
        Resources::none().with_cpus(n)
    }

    fn pool(nodes: &[(&str, Resources)]) -> NodePool {
        NodePool::new(nodes.iter().map(|(n, r)| NodeSpec::new(*n, r.clone())))
    }

    /// The first declared node that fits wins (rank ties everywhere).
    fn first(pool: &mut NodePool, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        pool.place(request, |_, _, _| 0)
    }

    /// Spread by replicas of the deployment, as StaticCluster does.
    fn spread(pool: &mut NodePool, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        pool.place(request, |i, n, key| (n.replicas_of(key), n.replicas(), i))
    }

    fn free(pool: &NodePool, node: &str) -> f64 {
        pool.node(node).unwrap().free().cpus
    }

    fn held(pool: &NodePool, id: u64) -> Vec<(String, f64)> {
        pool.reservations_of(ReplicaId(id))
            .map(|(n, r)| (n.name().to_owned(), r.cpus))
            .collect()
    }

    #[test]
    fn a_draining_node_keeps_its_replicas_and_takes_no_new_one() {
        let mut p = pool(&[("n1", cpus(2.0)), ("n2", cpus(1.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        let req = |id| PlacementRequest::new(ReplicaId(id), &a, &d, &one);
        assert_eq!(first(&mut p, &req(1)).unwrap(), "n1");
        assert!(p.drain("n1"));
        assert!(p.node("n1").unwrap().is_draining() && p.is_alive("n1"));
        assert_eq!(
            held(&p, 1),
            [("n1".to_owned(), 1.0)],
            "its replica keeps its place"
        );
        // n1 has room for one more, but it is leaving.
        assert_eq!(first(&mut p, &req(2)).unwrap(), "n2");
        let refusal = first(&mut p, &req(3)).unwrap_err();
        assert_eq!(refusal.missing, "cpus: need 1, most free 0");
        assert!(p.drain("n2"));
        assert_eq!(
            first(&mut p, &req(3)).unwrap_err().missing,
            "every live node is leaving the cluster"
        );
        // A drained node that dies and comes back takes replicas again.
        assert!(p.kill("n1").is_some());
        assert!(!p.drain("n1"), "a dead node does not drain");
        assert!(p.add(NodeSpec::new("n1", cpus(2.0))));
        assert_eq!(first(&mut p, &req(3)).unwrap(), "n1");
    }

    #[test]
    fn a_node_at_max_replicas_per_node_takes_no_more_of_that_deployment() {
        let mut p = pool(&[("n1", cpus(4.0)), ("n2", cpus(4.0))]);
        let (a, d, e) = names();
        let one = cpus(1.0);
        let req = |id, dep| PlacementRequest::new(ReplicaId(id), &a, dep, &one);
        // With the first node always preferred, the limit alone spreads them.
        assert_eq!(
            first(&mut p, &req(1, &d).with_max_replicas_per_node(1)).unwrap(),
            "n1"
        );
        assert_eq!(
            first(&mut p, &req(2, &d).with_max_replicas_per_node(1)).unwrap(),
            "n2"
        );
        let refusal = first(&mut p, &req(3, &d).with_max_replicas_per_node(1)).unwrap_err();
        assert_eq!(
            refusal.missing,
            "max_replicas_per_node is 1 and every live node with room already runs 1 replica \
             of this deployment"
        );
        // Another deployment is not counted, nor is a request without the limit.
        assert_eq!(
            first(&mut p, &req(4, &e).with_max_replicas_per_node(1)).unwrap(),
            "n1"
        );
        assert_eq!(first(&mut p, &req(5, &d)).unwrap(), "n1");
        // A limit of 2: n1 runs two of d's replicas, n2 one.
        assert_eq!(
            p.node("n1").unwrap().replicas_of(&(a.clone(), d.clone())),
            2
        );
        assert_eq!(
            first(&mut p, &req(6, &d).with_max_replicas_per_node(2)).unwrap(),
            "n2"
        );
        let refusal = first(&mut p, &req(7, &d).with_max_replicas_per_node(2)).unwrap_err();
        assert!(
            refusal.missing.contains("already runs 2 replicas"),
            "{refusal}"
        );
        // Released, a replica's place is free again.
        assert!(p.release(ReplicaId(2)));
        assert_eq!(
            first(&mut p, &req(7, &d).with_max_replicas_per_node(2)).unwrap(),
            "n2"
        );
    }

    #[test]
    fn without_room_anywhere_the_refusal_names_the_resource_not_the_limit() {
        let mut p = pool(&[("n1", cpus(1.0)), ("n2", cpus(4.0))]);
        let (a, d, _) = names();
        let (one, three) = (cpus(1.0), cpus(3.0));
        let req =
            |id, r| PlacementRequest::new(ReplicaId(id), &a, &d, r).with_max_replicas_per_node(1);
        assert_eq!(first(&mut p, &req(1, &one)).unwrap(), "n1");
        assert_eq!(first(&mut p, &req(2, &three)).unwrap(), "n2");
        // n1 is full; n2 has room for one CPU but runs d's one replica.
        let refusal = first(&mut p, &req(3, &one)).unwrap_err();
        assert!(
            refusal.missing.starts_with("max_replicas_per_node is 1"),
            "{refusal}"
        );
        // Room for three CPUs is nowhere: that is said, not the limit.
        let refusal = first(&mut p, &req(4, &three)).unwrap_err();
        assert_eq!(refusal.missing, "cpus: need 3, most free 1");
    }

    #[test]
    fn pack_and_strict_pack_reserve_the_bundles_sum_on_one_node() {
        let mut p = pool(&[("small", cpus(2.0)), ("big", cpus(4.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        for (id, strategy) in [(1, S::Pack), (2, S::StrictPack)] {
            let group = PlacementGroup::new(vec![cpus(1.0), cpus(2.0)], strategy);
            let req =
                PlacementRequest::new(ReplicaId(id), &a, &d, &one).with_placement_group(&group);
            assert_eq!(first(&mut p, &req).unwrap(), "big", "{strategy:?}");
            assert_eq!(held(&p, id), [("big".to_owned(), 3.0)]);
            assert_eq!(free(&p, "big"), 1.0);
            assert_eq!(free(&p, "small"), 2.0);
            // A pack's bundles are one replica on one node.
            assert_eq!(p.node("big").unwrap().replicas(), 1);
            assert!(p.release(ReplicaId(id)));
            assert_eq!(free(&p, "big"), 4.0);
        }
        let group = PlacementGroup::new(vec![cpus(3.0), cpus(2.0)], S::StrictPack);
        let req = PlacementRequest::new(ReplicaId(3), &a, &d, &one).with_placement_group(&group);
        let refusal = first(&mut p, &req).unwrap_err();
        assert_eq!(
            refusal.missing,
            "STRICT_PACK puts its 2 bundles on one node: cpus: need 5, most free 4"
        );
        assert_eq!(p.reserved(), 0);
    }

    #[test]
    fn pack_spills_bundles_no_node_holds_together_onto_as_few_nodes_as_it_can() {
        let mut p = pool(&[("n1", cpus(2.0)), ("n2", cpus(3.0)), ("n3", cpus(3.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        // 5 CPUs fit no node: bundle 1 (2) where rank puts it (n1), bundle 2
        // (1) no longer fits n1, so n2, and bundle 3 (2) joins bundle 2 on n2
        // rather than open n3.
        let group = PlacementGroup::new(vec![cpus(2.0), cpus(1.0), cpus(2.0)], S::Pack);
        let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
        assert_eq!(
            first(&mut p, &req).unwrap(),
            "n1",
            "runs in its first bundle"
        );
        assert_eq!(
            held(&p, 1),
            [
                ("n1".to_owned(), 2.0),
                ("n2".to_owned(), 1.0),
                ("n2".to_owned(), 2.0)
            ]
        );
        assert_eq!((free(&p, "n2"), free(&p, "n3")), (0.0, 3.0));
        // A bundle that fits no node leaves the replica pending, and nothing held.
        let group = PlacementGroup::new(vec![cpus(1.0), cpus(4.0)], S::Pack);
        let req = PlacementRequest::new(ReplicaId(2), &a, &d, &one).with_placement_group(&group);
        assert_eq!(
            first(&mut p, &req).unwrap_err().missing,
            "PACK: its 2 bundles fit no node together, and bundle #2 fits none beside the \
             ones before it: cpus: need 4, most free 2"
        );
        assert_eq!(free(&p, "n3"), 3.0, "bundle #1's hold was given back");
        assert!(p.release(ReplicaId(1)));
        assert_eq!(p.reserved(), 0);
    }

    #[test]
    fn strict_spread_puts_each_bundle_on_a_different_node_or_refuses_counting_nodes() {
        let mut p = pool(&[("n1", cpus(8.0)), ("n2", cpus(8.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        let group = PlacementGroup::new(vec![cpus(1.0), cpus(2.0), cpus(3.0)], S::StrictSpread);
        let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
        let refusal = spread(&mut p, &req).unwrap_err();
        assert_eq!(
            refusal.missing,
            "STRICT_SPREAD puts each of its 3 bundles on a different node: it needs 3 nodes \
             with room, and has 2 (of 2 live)"
        );
        // Nothing stays held after a refusal.
        assert_eq!(
            (free(&p, "n1"), free(&p, "n2"), p.reserved()),
            (8.0, 8.0, 0)
        );

        assert!(p.add(NodeSpec::new("n3", cpus(8.0))));
        // The replica runs where its first bundle is.
        assert_eq!(spread(&mut p, &req).unwrap(), "n1");
        assert_eq!(
            held(&p, 1),
            [
                ("n1".to_owned(), 1.0),
                ("n2".to_owned(), 2.0),
                ("n3".to_owned(), 3.0)
            ]
        );
        // Replicas, not bundles, are counted per node.
        let replicas: Vec<usize> = p.nodes().iter().map(PoolNode::replicas).collect();
        assert_eq!(replicas, [1, 0, 0]);
        // Placing again is idempotent; releasing gives every bundle back.
        assert_eq!(spread(&mut p, &req).unwrap(), "n1");
        assert!(p.release(ReplicaId(1)));
        assert_eq!(
            (free(&p, "n1"), free(&p, "n2"), free(&p, "n3")),
            (8.0, 8.0, 8.0)
        );
        assert_eq!(held(&p, 1), []);
    }

    #[test]
    fn strict_spread_finds_distinct_nodes_the_greedy_pass_misses_and_names_a_bundle_that_fits_nowhere()
     {
        // n1 is preferred, but the GPU bundle fits only there.
        let mut p = pool(&[("n1", cpus(1.0).with_gpus(1.0)), ("n2", cpus(1.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        let group = PlacementGroup::new(
            vec![cpus(1.0), Resources::none().with_gpus(1.0)],
            S::StrictSpread,
        );
        let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
        assert_eq!(first(&mut p, &req).unwrap(), "n2");
        assert_eq!(
            held(&p, 1),
            [("n2".to_owned(), 1.0), ("n1".to_owned(), 0.0)]
        );
        assert_eq!(p.node("n1").unwrap().free().gpus, 0.0);

        let tpu = PlacementGroup::new(
            vec![cpus(0.5), Resources::none().with_custom("tpu", 1.0)],
            S::StrictSpread,
        );
        let half = cpus(0.5);
        let req = PlacementRequest::new(ReplicaId(2), &a, &d, &half).with_placement_group(&tpu);
        let refusal = first(&mut p, &req).unwrap_err();
        assert_eq!(
            refusal.missing,
            "STRICT_SPREAD puts each of its 2 bundles on a different node: it needs 2 nodes \
             with room, and has 1 (of 2 live); bundle #2: tpu: need 1, most free 0"
        );
    }

    #[test]
    fn spread_uses_distinct_nodes_where_it_can_and_shares_where_it_cannot() {
        let mut p = pool(&[("n1", cpus(4.0)), ("n2", cpus(4.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        let group = PlacementGroup::new(vec![cpus(1.0), cpus(1.0), cpus(2.0)], S::Spread);
        let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
        assert_eq!(first(&mut p, &req).unwrap(), "n1");
        // The third bundle has no node of its own: it shares the first one that fits.
        assert_eq!(
            held(&p, 1),
            [
                ("n1".to_owned(), 1.0),
                ("n2".to_owned(), 1.0),
                ("n1".to_owned(), 2.0)
            ]
        );
        assert_eq!((free(&p, "n1"), free(&p, "n2")), (1.0, 3.0));
        let big = PlacementGroup::new(vec![cpus(1.0), cpus(3.5)], S::Spread);
        let req = PlacementRequest::new(ReplicaId(2), &a, &d, &one).with_placement_group(&big);
        let refusal = first(&mut p, &req).unwrap_err();
        assert_eq!(
            refusal.missing,
            "SPREAD: no room for bundle #2 of 2 beside the ones before it: cpus: need 3.5, \
             most free 3"
        );
        assert_eq!(
            (free(&p, "n1"), free(&p, "n2")),
            (1.0, 3.0),
            "nothing left held"
        );
        assert!(p.release(ReplicaId(1)));
        assert_eq!((free(&p, "n1"), free(&p, "n2")), (4.0, 4.0));
    }

    #[test]
    fn a_dead_node_takes_its_replicas_whole_and_its_bundles_of_others_with_it() {
        let mut p = pool(&[("n1", cpus(4.0)), ("n2", cpus(4.0)), ("n3", cpus(4.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        let group = PlacementGroup::new(vec![cpus(1.0), cpus(2.0)], S::StrictSpread);
        let req =
            |id| PlacementRequest::new(ReplicaId(id), &a, &d, &one).with_placement_group(&group);
        assert_eq!(spread(&mut p, &req(1)).unwrap(), "n1");
        assert_eq!(spread(&mut p, &req(2)).unwrap(), "n2");
        assert_eq!(
            held(&p, 1),
            [("n1".to_owned(), 1.0), ("n2".to_owned(), 2.0)]
        );
        assert_eq!(
            held(&p, 2),
            [("n2".to_owned(), 1.0), ("n3".to_owned(), 2.0)]
        );
        // n2 dies: replica 2 ran there and is lost, with its bundle on n3;
        // replica 1 runs on, without its bundle on n2.
        assert_eq!(p.kill("n2").unwrap(), [(a.clone(), d.clone())]);
        assert_eq!(held(&p, 1), [("n1".to_owned(), 1.0)]);
        assert_eq!(held(&p, 2), []);
        assert_eq!((free(&p, "n1"), free(&p, "n3")), (3.0, 4.0));
        assert_eq!(p.node_of(ReplicaId(1)).unwrap().name(), "n1");
        assert!(p.release(ReplicaId(1)));
        assert_eq!(free(&p, "n1"), 4.0);
        // Back, the node is empty.
        assert!(p.add(NodeSpec::new("n2", cpus(4.0))));
        assert_eq!(free(&p, "n2"), 4.0);
    }

    #[test]
    fn a_forgotten_dead_node_leaves_the_others_reservations_where_they_were() {
        let mut p = pool(&[("n1", cpus(4.0)), ("n2", cpus(4.0)), ("n3", cpus(4.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        let group = PlacementGroup::new(vec![cpus(1.0), cpus(2.0)], S::StrictSpread);
        let req =
            |id| PlacementRequest::new(ReplicaId(id), &a, &d, &one).with_placement_group(&group);
        assert_eq!(spread(&mut p, &req(1)).unwrap(), "n1");
        assert_eq!(spread(&mut p, &req(2)).unwrap(), "n2");
        assert_eq!(spread(&mut p, &req(3)).unwrap(), "n3");
        assert!(!p.forget("n1"), "a live node is not forgotten");
        assert!(!p.forget("n9"));
        p.kill("n2").unwrap();
        assert!(p.forget("n2"));
        assert!(!p.forget("n2"));
        let names: Vec<&str> = p.nodes().iter().map(PoolNode::name).collect();
        assert_eq!(names, ["n1", "n3"]);
        // Replica 3 runs on n3 with its bundle on n1; replica 1 on n1.
        assert_eq!(held(&p, 1), [("n1".to_owned(), 1.0)]);
        assert_eq!(
            held(&p, 3),
            [("n3".to_owned(), 1.0), ("n1".to_owned(), 2.0)]
        );
        assert_eq!((free(&p, "n1"), free(&p, "n3")), (1.0, 3.0));
        assert!(p.release(ReplicaId(3)));
        assert_eq!((free(&p, "n1"), free(&p, "n3")), (3.0, 4.0));
        assert_eq!(p.node("n3").unwrap().replicas(), 0);
        // The order still breaks ties: n1 before n3.
        let plain = PlacementRequest::new(ReplicaId(4), &a, &d, &one);
        assert_eq!(first(&mut p, &plain).unwrap(), "n1");
    }

    #[test]
    fn a_placement_group_without_bundles_is_refused() {
        let mut p = pool(&[("n1", cpus(4.0))]);
        let (a, d, _) = names();
        let one = cpus(1.0);
        let group = PlacementGroup::new(vec![], S::StrictSpread);
        let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
        assert_eq!(
            first(&mut p, &req).unwrap_err().missing,
            "its placement group has no bundle"
        );
    }
}
