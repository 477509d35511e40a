//! Where replicas run: the `Cluster` trait and the default single local node.

use flotilla_core::Resources;
use flotilla_replica::ReplicaId;

/// A node's name.
pub type NodeId = String;

/// Why a replica could not be placed; it stays pending and is retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no node has room: {missing}")]
pub struct Refusal {
    /// What is missing, for the status message (e.g. "gpus: need 1, most free 0").
    pub missing: String,
}

/// Decides where replicas run. Implementations must be cheap and non-blocking:
/// DeploymentActors call them from their handlers.
pub trait Cluster: Send + Sync + 'static {
    /// Reserve `resources` for `replica` on some node, or refuse.
    fn place(&self, replica: ReplicaId, resources: &Resources) -> Result<NodeId, Refusal>;
    /// Give back what `replica` reserved (a no-op for an unknown replica).
    fn release(&self, replica: ReplicaId);
}

/// One local node with unbounded room: the default.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalCluster;

impl Cluster for LocalCluster {
    fn place(&self, _replica: ReplicaId, _resources: &Resources) -> Result<NodeId, Refusal> {
        Ok("local".to_owned())
    }

    fn release(&self, _replica: ReplicaId) {}
}
