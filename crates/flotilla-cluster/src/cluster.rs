//! Where replicas run: the `Cluster` trait, its events, and the default single
//! local node.
//!
//! A cluster places replicas on nodes with enough free resources or refuses, gets
//! reservations back when replicas stop, and tells DeploymentActors (by a
//! `tokio::sync::broadcast` subscription, never by polling) when capacity frees up
//! and when a node dies.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard, PoisonError},
};

use flotilla_core::{
    AppName, DeploymentConfig, DeploymentName, PlacementGroup, PlacementStrategy, Resources,
};
use flotilla_replica::ReplicaId;
use tokio::sync::broadcast;

use crate::DeploymentKey;

/// A node's name.
pub type NodeId = String;

/// Why a replica could not be placed; it stays pending until room appears.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no node has room: {missing}")]
pub struct Refusal {
    /// What is missing, for the status message (e.g. "gpus: need 1, most free 0").
    pub missing: String,
}

/// One replica asking for a place: what it reserves and where it may go.
///
/// Without a placement group the replica reserves `resources` on one node.
/// With one, it reserves the group's bundles instead (the replica runs in the
/// first bundle, so its `resources` are inside it, as in Ray): `PACK` and
/// `STRICT_PACK` reserve the bundles' sum on one node (`PACK`, where none has
/// room for it, the bundles on as few nodes as it can), `STRICT_SPREAD` each
/// bundle on a different node, `SPREAD` each bundle on a different node where
/// it can and on a shared one where it cannot. `max_replicas_per_node` keeps
/// the replica off a node that already runs that many replicas of its
/// deployment (replicas are counted where they run, not bundles). The node
/// [`Cluster::place`] returns is where the replica runs (its first bundle's);
/// every bundle is held under the replica's id until [`Cluster::release`].
///
/// ```
/// use flotilla_cluster::PlacementRequest;
/// use flotilla_core::{AppName, DeploymentConfig, DeploymentName};
/// use flotilla_replica::ReplicaId;
/// let (app, dep) = (AppName::new("a").unwrap(), DeploymentName::new("d").unwrap());
/// let config = DeploymentConfig::default().with_max_replicas_per_node(1);
/// let request = PlacementRequest::for_config(ReplicaId(1), &app, &dep, &config);
/// assert_eq!(request.max_replicas_per_node, Some(1));
/// assert!(request.placement_group.is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PlacementRequest<'a> {
    /// The replica (its reservations are released under this id).
    pub replica: ReplicaId,
    /// Its application.
    pub app: &'a AppName,
    /// Its deployment (placement spreads one deployment's replicas over nodes).
    pub deployment: &'a DeploymentName,
    /// What the replica itself reserves (inside the first bundle when
    /// `placement_group` is set).
    pub resources: &'a Resources,
    /// At most this many replicas of the deployment on one node; `None` is no
    /// limit.
    pub max_replicas_per_node: Option<u32>,
    /// The bundles reserved for the replica and how they are placed; `None`
    /// reserves `resources` alone.
    pub placement_group: Option<&'a PlacementGroup>,
}

impl<'a> PlacementRequest<'a> {
    /// `replica` of `app`/`deployment` reserving `resources` on one node, with
    /// no limit per node and no placement group.
    pub fn new(
        replica: ReplicaId,
        app: &'a AppName,
        deployment: &'a DeploymentName,
        resources: &'a Resources,
    ) -> Self {
        PlacementRequest {
            replica,
            app,
            deployment,
            resources,
            max_replicas_per_node: None,
            placement_group: None,
        }
    }

    /// `replica` of `app`/`deployment` placed as `config` says: its resources,
    /// `max_replicas_per_node` and placement group.
    pub fn for_config(
        replica: ReplicaId,
        app: &'a AppName,
        deployment: &'a DeploymentName,
        config: &'a DeploymentConfig,
    ) -> Self {
        PlacementRequest {
            replica,
            app,
            deployment,
            resources: &config.resources,
            max_replicas_per_node: config.max_replicas_per_node,
            placement_group: config.placement_group.as_ref(),
        }
    }

    /// The same request with at most `n` replicas of the deployment per node.
    pub fn with_max_replicas_per_node(mut self, n: u32) -> Self {
        self.max_replicas_per_node = Some(n);
        self
    }

    /// The same request reserving `group`'s bundles instead of `resources`.
    pub fn with_placement_group(mut self, group: &'a PlacementGroup) -> Self {
        self.placement_group = Some(group);
        self
    }
}

/// What a cluster tells the DeploymentActors subscribed to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// Resources were released or a node joined: pending replicas may fit now.
    CapacityFreed,
    /// A node died: every replica on it is gone, and its reservations are released.
    NodeDied(NodeId),
}

/// Decides where replicas run. Implementations must be cheap and non-blocking:
/// DeploymentActors call them from their handlers.
pub trait Cluster: Send + Sync + 'static {
    /// Reserve what the request reserves (its resources, or its placement
    /// group's bundles as the group's strategy says) on live nodes, keeping to
    /// its `max_replicas_per_node`, and return the node the replica runs on; or
    /// refuse, saying why. Placing a placed replica again returns its node.
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal>;

    /// Give back everything `replica` reserved, every bundle of its placement
    /// group included (a no-op for an unknown replica).
    fn release(&self, replica: ReplicaId);

    /// Subscribe to capacity and node-death events. `None` (the default) means the
    /// cluster never announces anything: a DeploymentActor with pending replicas
    /// then retries placement on a timer instead.
    fn subscribe(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        None
    }

    /// Whether `node` is alive (checked after a lagged subscription and when
    /// re-adopting replicas). Default: every node is.
    fn is_alive(&self, node: &str) -> bool {
        let _ = node;
        true
    }

    /// Where a replica placed on `node` runs when it is another process: the
    /// DeploymentActor then starts a [`RemoteReplica`](crate::nodes::RemoteReplica)
    /// for it instead of a `ReplicaActor`. Default: `None`, every node is this
    /// process.
    fn host(&self, node: &str) -> Option<crate::nodes::RemoteHost> {
        let _ = node;
        None
    }

    /// A DeploymentActor published a changed replica set on `route`, or
    /// changed what other processes copy (the queue limit, batching, the
    /// model limit, the request router, a replica's `max_ongoing_requests`):
    /// a cluster of several processes tells the others (see
    /// `docs/nodes.md`). Default: nothing.
    fn route_changed(&self, route: &std::sync::Arc<flotilla_replica::DeploymentRoute>) {
        let _ = route;
    }

    /// The Controller recovered its checkpoint (at every start, and after every
    /// restart of its own): `live` is every deployment it runs now, but those
    /// of applications being deleted. With [`route_changed`](Self::route_changed) from then
    /// on, the cluster knows every live route, so other processes can drop a
    /// copy of one that is not (deleted while they were away, or unknown to a
    /// head restarted on another store). Default: nothing.
    /// `live` is walked only by a cluster that needs it (a single process
    /// pays nothing for 100,000 applications).
    fn deployments_recovered(&self, live: &mut dyn Iterator<Item = DeploymentKey>) {
        let _ = live;
    }
}

/// How many replicas [`LocalCluster::new`] holds: every deployment's replicas
/// together. Generous for one process, and finite, so a mistaken target is
/// pending with a reason instead of spawning without end.
pub const DEFAULT_LOCAL_CAPACITY: usize = 200_000;

/// The default: one local node, `"local"`, that holds at most `capacity`
/// replicas (resources are not counted: they all share this process). A replica
/// beyond it is refused, so its deployment shows it pending with the reason and
/// retries placement every [`PLACEMENT_RETRY`](crate::PLACEMENT_RETRY) (this
/// cluster announces nothing: a subscription would cost every DeploymentActor a
/// task, for an event that only a full node needs).
///
/// Being one node, it applies `max_replicas_per_node` to the whole deployment
/// (at most that many of its replicas are placed) and a placement group by its
/// strategy: `PACK`, `STRICT_PACK` and `SPREAD` (best effort) put every bundle
/// here; `STRICT_SPREAD` of more than one bundle cannot fit and is refused.
///
/// ```
/// use flotilla_cluster::{Cluster, LocalCluster};
/// let c = LocalCluster::with_capacity(100);
/// assert_eq!((c.capacity(), c.placed()), (100, 0));
/// ```
#[derive(Debug)]
pub struct LocalCluster {
    capacity: usize,
    placed: Mutex<Placed>,
}

/// The replicas [`LocalCluster`] placed, and how many per deployment.
#[derive(Debug, Default)]
struct Placed {
    replicas: HashMap<ReplicaId, DeploymentKey>,
    per_deployment: HashMap<DeploymentKey, u32>,
}

impl Default for LocalCluster {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalCluster {
    /// A local node of [`DEFAULT_LOCAL_CAPACITY`] replicas.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_LOCAL_CAPACITY)
    }

    /// A local node of `capacity` replicas.
    pub fn with_capacity(capacity: usize) -> Self {
        LocalCluster {
            capacity,
            placed: Mutex::new(Placed::default()),
        }
    }

    /// How many replicas it holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many replicas hold a place now.
    pub fn placed(&self) -> usize {
        self.lock().replicas.len()
    }

    /// How many replicas of `app`/`deployment` hold a place now.
    pub fn placed_of(&self, app: &AppName, deployment: &DeploymentName) -> usize {
        let key = (app.clone(), deployment.clone());
        self.lock().per_deployment.get(&key).copied().unwrap_or(0) as usize
    }

    fn lock(&self) -> MutexGuard<'_, Placed> {
        self.placed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Cluster for LocalCluster {
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        let mut placed = self.lock();
        if placed.replicas.contains_key(&request.replica) {
            return Ok(LOCAL_NODE.to_owned());
        }
        if placed.replicas.len() >= self.capacity {
            return Err(Refusal {
                missing: format!(
                    "the local node holds at most {} replicas (LocalCluster capacity) and \
                     all are placed",
                    self.capacity
                ),
            });
        }
        if let Some(group) = request.placement_group
            && group.strategy == PlacementStrategy::StrictSpread
            && group.bundles.len() > 1
        {
            return Err(Refusal {
                missing: format!(
                    "STRICT_SPREAD puts each of its {} bundles on a different node: it needs \
                     {} nodes, and the local cluster is one node",
                    group.bundles.len(),
                    group.bundles.len()
                ),
            });
        }
        let key = (request.app.clone(), request.deployment.clone());
        let here = placed.per_deployment.get(&key).copied().unwrap_or(0);
        if let Some(limit) = request.max_replicas_per_node
            && here >= limit
        {
            return Err(limit_refusal(limit, "the local node"));
        }
        match placed.per_deployment.get_mut(&key) {
            Some(n) => *n += 1,
            None => {
                placed.per_deployment.insert(key.clone(), 1);
            }
        }
        placed.replicas.insert(request.replica, key);
        Ok(LOCAL_NODE.to_owned())
    }

    fn release(&self, replica: ReplicaId) {
        let mut placed = self.lock();
        let Some(key) = placed.replicas.remove(&replica) else {
            return;
        };
        if let Some(n) = placed.per_deployment.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                placed.per_deployment.remove(&key);
            }
        }
    }
}

/// Why a replica is refused where `nodes` (e.g. "every live node with room")
/// already run(s) `limit` replicas of its deployment.
pub(crate) fn limit_refusal(limit: u32, nodes: &str) -> Refusal {
    let replicas = if limit == 1 { "replica" } else { "replicas" };
    Refusal {
        missing: format!(
            "max_replicas_per_node is {limit} and {nodes} already runs {limit} {replicas} of \
             this deployment"
        ),
    }
}

/// The name of [`LocalCluster`]'s one node.
pub const LOCAL_NODE: &str = "local";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_node_refuses_beyond_its_capacity_and_takes_released_places_back() {
        let c = LocalCluster::with_capacity(2);
        let (app, dep) = (
            AppName::new("a").unwrap_or_else(|e| panic!("{e}")),
            DeploymentName::new("d").unwrap_or_else(|e| panic!("{e}")),
        );
        let r = Resources::default();
        let req = |id| PlacementRequest::new(ReplicaId(id), &app, &dep, &r);
        assert_eq!(c.place(&req(1)).as_deref(), Ok("local"));
        assert_eq!(c.place(&req(2)).as_deref(), Ok("local"));
        let refusal = c.place(&req(3)).unwrap_err();
        assert!(refusal.missing.contains("at most 2 replicas"), "{refusal}");
        // Placing a placed replica again is idempotent, even when full.
        assert!(c.place(&req(2)).is_ok());
        c.release(ReplicaId(9));
        assert_eq!(c.placed(), 2, "an unknown release frees nothing");
        c.release(ReplicaId(1));
        assert!(c.place(&req(3)).is_ok());
    }

    #[test]
    fn the_local_node_caps_a_deployment_at_max_replicas_per_node() {
        let c = LocalCluster::with_capacity(10);
        let a = AppName::new("a").unwrap_or_else(|e| panic!("{e}"));
        let (d, e) = (
            DeploymentName::new("d").unwrap_or_else(|e| panic!("{e}")),
            DeploymentName::new("e").unwrap_or_else(|e| panic!("{e}")),
        );
        let r = Resources::default();
        let req = |id, dep| {
            PlacementRequest::new(ReplicaId(id), &a, dep, &r).with_max_replicas_per_node(2)
        };
        assert!(c.place(&req(1, &d)).is_ok());
        assert!(c.place(&req(2, &d)).is_ok());
        let refusal = c.place(&req(3, &d)).unwrap_err();
        assert_eq!(
            refusal.missing,
            "max_replicas_per_node is 2 and the local node already runs 2 replicas of this \
             deployment"
        );
        // Another deployment has its own count; a placed replica is placed again.
        assert!(c.place(&req(4, &e)).is_ok());
        assert!(c.place(&req(2, &d)).is_ok());
        assert_eq!((c.placed_of(&a, &d), c.placed_of(&a, &e)), (2, 1));
        c.release(ReplicaId(1));
        assert_eq!(c.placed_of(&a, &d), 1);
        assert!(c.place(&req(3, &d)).is_ok());
    }

    #[test]
    fn the_local_node_holds_every_placement_group_but_a_strict_spread_of_several_bundles() {
        let c = LocalCluster::with_capacity(10);
        let (a, d) = (
            AppName::new("a").unwrap_or_else(|e| panic!("{e}")),
            DeploymentName::new("d").unwrap_or_else(|e| panic!("{e}")),
        );
        let r = Resources::default();
        let two = vec![Resources::default(), Resources::none().with_gpus(1.0)];
        for (id, strategy) in [
            (1, PlacementStrategy::Pack),
            (2, PlacementStrategy::StrictPack),
            (3, PlacementStrategy::Spread),
        ] {
            let group = PlacementGroup::new(two.clone(), strategy);
            let req = PlacementRequest::new(ReplicaId(id), &a, &d, &r).with_placement_group(&group);
            assert_eq!(c.place(&req).as_deref(), Ok(LOCAL_NODE), "{strategy:?}");
        }
        let group = PlacementGroup::new(two, PlacementStrategy::StrictSpread);
        let req = PlacementRequest::new(ReplicaId(4), &a, &d, &r).with_placement_group(&group);
        let refusal = c.place(&req).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "no node has room: STRICT_SPREAD puts each of its 2 bundles on a different node: \
             it needs 2 nodes, and the local cluster is one node"
        );
        let one = PlacementGroup::new(vec![Resources::default()], PlacementStrategy::StrictSpread);
        let req = PlacementRequest::new(ReplicaId(5), &a, &d, &r).with_placement_group(&one);
        assert!(c.place(&req).is_ok());
        assert_eq!(c.placed(), 4);
    }
}
