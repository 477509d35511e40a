//! What a DeploymentActor receives and reports.

use std::sync::Arc;

use flotilla_core::{
    DeploymentName, DeploymentSpec, DeploymentStatusInfo, DeploymentVersion, ReplicaState,
};
use flotilla_replica::{ReplicaEvent, ReplicaId};
use ractor::RpcReplyPort;

/// A deployment's target, as its ApplicationActor sets it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentTarget {
    /// The spec (code, args, config).
    pub spec: DeploymentSpec,
    /// How many replicas (the spec's count, or the durable autoscaled one).
    pub replicas: u32,
    /// The deployment is being deleted.
    pub deleting: bool,
    /// The application generation this target belongs to.
    pub generation: u64,
}

/// How a DeploymentActor reports to its ApplicationActor (looked up by name).
pub type DeploymentReporter = Arc<dyn Fn(DeploymentEvent) + Send + Sync>;

/// What a DeploymentActor tells its ApplicationActor.
#[derive(Debug, Clone)]
pub enum DeploymentEvent {
    /// The status for target `generation` changed.
    Status {
        /// The deployment.
        name: DeploymentName,
        /// The generation whose target it describes.
        generation: u64,
        /// The status.
        status: DeploymentStatusInfo,
    },
    /// Deleted: every replica stopped; the actor has stopped.
    Deleted {
        /// The deployment.
        name: DeploymentName,
        /// The generation whose deletion finished.
        generation: u64,
    },
}

/// One replica in a snapshot.
#[derive(Debug, Clone)]
pub struct ReplicaInfo {
    /// Its id.
    pub id: ReplicaId,
    /// Its state.
    pub state: ReplicaState,
    /// Its version.
    pub version: DeploymentVersion,
    /// Its node.
    pub node: String,
}

/// A DeploymentActor's state, for tests and the status API.
#[derive(Debug, Clone)]
pub struct DeploymentSnapshot {
    /// The target.
    pub target: DeploymentTarget,
    /// The status.
    pub status: DeploymentStatusInfo,
    /// Every replica it owns.
    pub replicas: Vec<ReplicaInfo>,
    /// Consecutive constructor failures.
    pub startup_failures: u32,
}

/// Messages to a DeploymentActor.
#[derive(Debug)]
pub enum DeploymentMsg {
    /// A new target (idempotent: the same target twice changes nothing).
    SetTarget(Box<DeploymentTarget>),
    /// An event from one of its replicas.
    Replica(ReplicaId, ReplicaEvent),
    /// Internal: a backoff or placement retry timer fired.
    Retry,
    /// Reply with a snapshot.
    Observe(RpcReplyPort<DeploymentSnapshot>),
    /// Stop every replica gracefully, reply when all are gone, then stop.
    Shutdown(RpcReplyPort<()>),
}
