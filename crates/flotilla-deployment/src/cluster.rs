//! Where replicas run: the `Cluster` trait, its events, and the default single
//! local node.
//!
//! A cluster places replicas on nodes with enough free resources or refuses, gets
//! reservations back when replicas stop, and tells DeploymentActors (by a
//! `tokio::sync::broadcast` subscription, never by polling) when capacity frees up
//! and when a node dies.

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

/// One local node with unbounded room: the default.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalCluster;

impl Cluster for LocalCluster {
    fn place(&self, _request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        Ok("local".to_owned())
    }

    fn release(&self, _replica: ReplicaId) {}
}
