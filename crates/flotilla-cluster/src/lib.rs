//! Where replicas run.
//!
//! This crate owns the [`Cluster`] trait a DeploymentActor places its replicas
//! through, the events a cluster announces ([`ClusterEvent`]: capacity freed, a
//! node died), and the clusters Flotilla ships: [`LocalCluster`] (this process,
//! a finite number of replicas), and [`StaticCluster`] (a fixed set of nodes with
//! resources, spread placement and node deaths on demand, for tests and the
//! simulator), both on the [`NodePool`] bookkeeping any cluster with nodes can
//! share. Nodes joined over the network will live here too.
//!
//! It must not start or stop replicas (the DeploymentActor does, where a
//! cluster said they fit) and must not block: placement is called from actor
//! handlers.

mod cluster;
mod node_pool;
mod static_cluster;

use std::time::Duration;

pub use cluster::{
    Cluster, ClusterEvent, DEFAULT_LOCAL_CAPACITY, LOCAL_NODE, LocalCluster, NodeId,
    PlacementRequest, Refusal,
};
pub use node_pool::{DeploymentKey, NodePool, NodeSpec, PoolNode};
pub use static_cluster::StaticCluster;

/// How often a DeploymentActor retries placing pending replicas on a cluster
/// that announces nothing ([`Cluster::subscribe`] is `None`).
pub const PLACEMENT_RETRY: Duration = Duration::from_secs(1);
