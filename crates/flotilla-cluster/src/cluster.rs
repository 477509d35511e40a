//! Where replicas run: the `Cluster` trait, its events, and the default single
//! local node.
//!
//! A cluster places replicas on nodes with enough free resources or refuses, gets
//! reservations back when replicas stop, and tells DeploymentActors (by a
//! `tokio::sync::broadcast` subscription, never by polling) when capacity frees up
//! and when a node dies.

use std::{
    collections::HashSet,
    sync::{Mutex, MutexGuard, PoisonError},
};

use flotilla_core::{AppName, DeploymentName, Resources};
use flotilla_replica::ReplicaId;
use tokio::sync::broadcast;

/// A node's name.
pub type NodeId = String;

/// Why a replica could not be placed; it stays pending until room appears.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no node has room: {missing}")]
pub struct Refusal {
    /// What is missing, for the status message (e.g. "gpus: need 1, most free 0").
    pub missing: String,
}

/// One replica asking for a place.
#[derive(Debug, Clone, Copy)]
pub struct PlacementRequest<'a> {
    /// The replica (its reservation is released under this id).
    pub replica: ReplicaId,
    /// Its application.
    pub app: &'a AppName,
    /// Its deployment (placement spreads one deployment's replicas over nodes).
    pub deployment: &'a DeploymentName,
    /// What it reserves.
    pub resources: &'a Resources,
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
    /// Reserve the request's resources on some live node, or refuse.
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal>;

    /// Give back what `replica` reserved (a no-op for an unknown replica).
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
/// ```
/// use flotilla_cluster::{Cluster, LocalCluster};
/// let c = LocalCluster::with_capacity(100);
/// assert_eq!((c.capacity(), c.placed()), (100, 0));
/// ```
#[derive(Debug)]
pub struct LocalCluster {
    capacity: usize,
    placed: Mutex<HashSet<ReplicaId>>,
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
            placed: Mutex::new(HashSet::new()),
        }
    }

    /// How many replicas it holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many replicas hold a place now.
    pub fn placed(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<ReplicaId>> {
        self.placed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Cluster for LocalCluster {
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        let mut placed = self.lock();
        if placed.len() >= self.capacity && !placed.contains(&request.replica) {
            return Err(Refusal {
                missing: format!(
                    "the local node holds at most {} replicas (LocalCluster capacity) and \
                     all are placed",
                    self.capacity
                ),
            });
        }
        placed.insert(request.replica);
        Ok(LOCAL_NODE.to_owned())
    }

    fn release(&self, replica: ReplicaId) {
        self.lock().remove(&replica);
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
        let req = |id| PlacementRequest {
            replica: ReplicaId(id),
            app: &app,
            deployment: &dep,
            resources: &r,
        };
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
}
