//! `StaticCluster`: a fixed set of nodes with resources, spread placement and
//! node deaths on demand. Used by tests and by the cluster simulator.

use std::sync::{Mutex, MutexGuard};

use flotilla_core::Resources;
use flotilla_replica::ReplicaId;
use tokio::sync::broadcast;
use tracing::info;

use crate::{
    Cluster, ClusterEvent, NodeId, NodePool, NodeSpec, PlacementRequest, PoolNode, Refusal,
};

/// Events a slow subscriber may fall behind by before it resynchronises.
const EVENT_BUFFER: usize = 256;

/// A fixed set of nodes. Placement spreads: a replica (or each bundle of a
/// spread placement group) goes to the live node with room that holds the
/// fewest replicas of its deployment (then the fewest replicas overall, then
/// the first declared); the limit per node and the placement group strategies
/// are applied as [`NodePool::place`] says. Releasing a reservation or adding a node
/// announces [`ClusterEvent::CapacityFreed`]; [`kill_node`](Self::kill_node)
/// announces [`ClusterEvent::NodeDied`]. The bookkeeping is a [`NodePool`]'s.
///
/// ```
/// use flotilla_core::Resources;
/// use flotilla_cluster::{NodeSpec, StaticCluster};
/// let c = StaticCluster::new([
///     NodeSpec::new("n1", Resources::default().with_cpus(2.0)),
///     NodeSpec::new("n2", Resources::default().with_gpus(1.0)),
/// ]);
/// assert_eq!(c.live_nodes(), ["n1", "n2"]);
/// ```
pub struct StaticCluster {
    pool: Mutex<NodePool>,
    events: broadcast::Sender<ClusterEvent>,
}

impl std::fmt::Debug for StaticCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pool = self.lock();
        f.debug_struct("StaticCluster")
            .field("nodes", &pool.nodes().len())
            .field("reservations", &pool.reserved())
            .finish()
    }
}

impl StaticCluster {
    /// A cluster of `nodes`, all alive and empty.
    pub fn new(nodes: impl IntoIterator<Item = NodeSpec>) -> Self {
        StaticCluster {
            pool: Mutex::new(NodePool::new(nodes)),
            events: broadcast::Sender::new(EVENT_BUFFER),
        }
    }

    fn lock(&self) -> MutexGuard<'_, NodePool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn announce(&self, event: ClusterEvent) {
        // Nobody subscribed is fine: there is nobody to wake.
        let _ = self.events.send(event);
    }

    /// Kill node `name`: its reservations are dropped and subscribers learn that
    /// its replicas are gone. Returns false for an unknown or already dead node.
    pub fn kill_node(&self, name: &str) -> bool {
        if self.lock().kill(name).is_none() {
            return false;
        }
        info!(node = name, "node died");
        self.announce(ClusterEvent::NodeDied(name.to_owned()));
        true
    }

    /// Add a node, or bring a dead one of the same name back empty with `spec`'s
    /// capacity. An alive node of that name is left as it is (returns false).
    pub fn add_node(&self, spec: NodeSpec) -> bool {
        if !self.lock().add(spec) {
            return false;
        }
        self.announce(ClusterEvent::CapacityFreed);
        true
    }

    /// Names of the live nodes, in declaration order.
    pub fn live_nodes(&self) -> Vec<NodeId> {
        self.lock().live_names()
    }

    /// What node `name` has free now (`None` if unknown or dead).
    pub fn free(&self, name: &str) -> Option<Resources> {
        self.lock().live_node(name).map(PoolNode::free)
    }

    /// How many replicas hold a reservation on node `name`.
    pub fn replicas_on(&self, name: &str) -> usize {
        self.lock().node(name).map_or(0, PoolNode::replicas)
    }

    /// Where `replica` runs (its first bundle's node).
    pub fn node_of(&self, replica: ReplicaId) -> Option<NodeId> {
        self.lock().node_of(replica).map(|n| n.name().to_owned())
    }

    /// Everything `replica` holds, node by node: where it runs first, then
    /// its other bundles in order (empty for an unknown replica).
    pub fn reservations_of(&self, replica: ReplicaId) -> Vec<(NodeId, Resources)> {
        self.lock()
            .reservations_of(replica)
            .map(|(n, r)| (n.name().to_owned(), r.clone()))
            .collect()
    }
}

impl Cluster for StaticCluster {
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        let mut pool = self.lock();
        if let Some(node) = pool.node_of(request.replica) {
            // Placing twice is idempotent.
            return Ok(node.name().to_owned());
        }
        pool.place(request, |i, n, key| (n.replicas_of(key), n.replicas(), i))
    }

    fn release(&self, replica: ReplicaId) {
        let freed = self.lock().release(replica);
        if freed {
            self.announce(ClusterEvent::CapacityFreed);
        }
    }

    fn subscribe(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.events.subscribe())
    }

    fn is_alive(&self, node: &str) -> bool {
        self.lock().is_alive(node)
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::{AppName, DeploymentName, PlacementGroup, PlacementStrategy};

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
        PlacementRequest::new(ReplicaId(id), app, dep, r)
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

    #[test]
    fn the_limit_per_node_and_placement_groups_apply_and_release_announces() {
        let c = StaticCluster::new([
            NodeSpec::new("n1", Resources::default().with_cpus(4.0)),
            NodeSpec::new("n2", Resources::default().with_cpus(4.0)),
        ]);
        let mut rx = c.subscribe().unwrap();
        let (a, d, e) = names();
        let one = Resources::default();
        let limited = |id| req(id, &a, &d, &one).with_max_replicas_per_node(1);
        assert_eq!(c.place(&limited(1)).unwrap(), "n1");
        assert_eq!(c.place(&limited(2)).unwrap(), "n2");
        let refusal = c.place(&limited(3)).unwrap_err();
        assert!(
            refusal.missing.starts_with("max_replicas_per_node is 1"),
            "{refusal}"
        );

        // PACK: the sum on one node, where the replica runs.
        let pack = PlacementGroup::new(
            vec![
                Resources::none().with_cpus(1.0),
                Resources::none().with_cpus(1.5),
            ],
            PlacementStrategy::Pack,
        );
        let packed = req(4, &a, &e, &one).with_placement_group(&pack);
        assert_eq!(c.place(&packed).unwrap(), "n1");
        assert_eq!(c.free("n1").unwrap().cpus, 0.5);
        assert_eq!(
            c.reservations_of(ReplicaId(4)),
            [("n1".to_owned(), Resources::none().with_cpus(2.5))]
        );

        // STRICT_SPREAD: one bundle on each node.
        let spread = PlacementGroup::new(
            vec![
                Resources::none().with_cpus(0.5),
                Resources::none().with_cpus(1.0),
            ],
            PlacementStrategy::StrictSpread,
        );
        let spread_req = req(5, &a, &e, &one).with_placement_group(&spread);
        assert_eq!(c.place(&spread_req).unwrap(), "n1");
        assert_eq!(
            (c.free("n1").unwrap().cpus, c.free("n2").unwrap().cpus),
            (0.0, 2.0)
        );
        // Releasing gives back every bundle, and announces it once.
        c.release(ReplicaId(5));
        assert_eq!(rx.try_recv().unwrap(), ClusterEvent::CapacityFreed);
        assert!(rx.try_recv().is_err());
        assert_eq!(
            (c.free("n1").unwrap().cpus, c.free("n2").unwrap().cpus),
            (0.5, 3.0)
        );
        assert_eq!(c.reservations_of(ReplicaId(5)), []);
    }
}
