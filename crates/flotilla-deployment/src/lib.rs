//! The DeploymentActor: keeps one deployment's replicas at its target.
//!
//! It owns the replica pool of one deployment: starting replicas where the
//! [`Cluster`] has room, rolling code changes gradually, reconfiguring config-only
//! changes in place, replacing replicas that fail to start, fail health checks or
//! panic, stopping replicas gracefully, publishing the running set to the
//! deployment's route, and deriving the deployment status.
//!
//! Replica states change in one place (`DeploymentState::set_state`, logged); the
//! reconcile step is the pure [`plan::plan`]; [`observe`] reads a deployment's
//! [`DeploymentSnapshot`] (replicas counted by state and version) for the status
//! API. [`StaticCluster`] is a fixed set of nodes with resources, spread placement
//! and node deaths, for tests and the simulator.
//!
//! It must not write the checkpoint (durable decisions go to the Controller as
//! messages) and must not hold its replicas by a link: replicas outlive a crash of
//! this actor, and its successor re-adopts them through their process group.

mod actor;
pub mod autoscale;
mod cluster;
mod messages;
mod node_pool;
mod observe;
mod placement;
pub mod plan;
mod recovery;
mod state;
mod static_cluster;
mod status;

pub use actor::{DeploymentActor, DeploymentArgs};
pub use cluster::{
    Cluster, ClusterEvent, DEFAULT_LOCAL_CAPACITY, LOCAL_NODE, LocalCluster, NodeId,
    PlacementRequest, Refusal,
};
pub use messages::{
    DeploymentEvent, DeploymentMsg, DeploymentReporter, DeploymentSnapshot, DeploymentTarget,
    ReplicaInfo, StateCount,
};
pub use node_pool::{DeploymentKey, NodePool, NodeSpec, PoolNode};
pub use observe::observe;
pub use placement::PLACEMENT_RETRY;
pub use recovery::RECOVER_TIMEOUT;
pub use static_cluster::StaticCluster;
pub use status::{
    FAILED_BACKOFF, FIRST_BACKOFF, MAX_BACKOFF, MAX_CONSTRUCTOR_RETRIES, SLOW_START, backoff,
};
