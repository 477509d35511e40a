//! The DeploymentActor: keeps one deployment's replicas at its target.
//!
//! It owns the replica pool of one deployment: starting replicas where the
//! [`Cluster`](flotilla_cluster::Cluster) has room, rolling code changes gradually, reconfiguring config-only
//! changes in place, replacing replicas that fail to start, fail health checks or
//! panic, stopping replicas gracefully, publishing the running set to the
//! deployment's route, and deriving the deployment status.
//!
//! Replica states change in one place (`DeploymentState::set_state`, logged); the
//! reconcile step is the pure [`plan::plan`]; [`observe`] reads a deployment's
//! [`DeploymentSnapshot`] (replicas counted by state and version) for the status
//! API. Where replicas may run is the [`Cluster`](flotilla_cluster::Cluster)'s (the `flotilla-cluster` crate).
//!
//! It must not write the checkpoint (durable decisions go to the Controller as
//! messages) and must not hold its replicas by a link: replicas outlive a crash of
//! this actor, and its successor re-adopts them through their process group.

mod actor;
pub mod autoscale;
mod messages;
mod observe;
mod placement;
pub mod plan;
mod recovery;
mod state;
mod status;

pub use actor::{DeploymentActor, DeploymentArgs};
pub use messages::{
    DeploymentEvent, DeploymentMsg, DeploymentReporter, DeploymentSnapshot, DeploymentTarget,
    ReplicaInfo, StateCount,
};
pub use observe::observe;
pub use recovery::RECOVER_TIMEOUT;
pub use state::replica_reporter;
pub use status::{
    FAILED_BACKOFF, FIRST_BACKOFF, MAX_BACKOFF, MAX_CONSTRUCTOR_RETRIES, SLOW_START, backoff,
};
