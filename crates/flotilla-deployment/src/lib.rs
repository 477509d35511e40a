//! The DeploymentActor: keeps one deployment's replicas at its target.
//!
//! It owns the replica pool of one deployment: starting replicas where the
//! [`Cluster`] has room, rolling code changes gradually, reconfiguring config-only
//! changes in place, replacing replicas that fail to start, fail health checks or
//! panic, stopping replicas gracefully, publishing the running set to the
//! deployment's route, and deriving the deployment status.
//!
//! It must not write the checkpoint (durable decisions go to the Controller as
//! messages) and must not hold its replicas by a link: replicas outlive a crash of
//! this actor, and its successor re-adopts them through their process group.

mod actor;
mod cluster;
mod messages;
pub mod plan;

pub use actor::{DeploymentActor, DeploymentArgs};
pub use cluster::{Cluster, LocalCluster, NodeId, Refusal};
pub use messages::{
    DeploymentEvent, DeploymentMsg, DeploymentReporter, DeploymentSnapshot, DeploymentTarget,
    ReplicaInfo,
};
