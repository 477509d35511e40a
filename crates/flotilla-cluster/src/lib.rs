//! Where replicas run.
//!
//! This crate owns the [`Cluster`] trait a DeploymentActor places its replicas
//! through, the events a cluster announces ([`ClusterEvent`]: capacity freed, a
//! node died), and the clusters Flotilla ships: [`LocalCluster`] (this process,
//! a finite number of replicas), [`StaticCluster`] (a fixed set of nodes with
//! resources, spread placement and node deaths on demand, for tests and the
//! simulator), both on the [`NodePool`] bookkeeping any cluster with nodes can
//! share, and [`nodes`]: node processes joined over the network, with the
//! head's registry and [`NodeCluster`](nodes::NodeCluster), the node agent that
//! runs replicas there, and the head's stand-in for each of them.
//!
//! A [`PlacementRequest`] carries what a deployment's config says about where
//! its replicas go, and every cluster here applies it:
//!
//! - `max_replicas_per_node`: a node already running that many replicas of the
//!   deployment takes no more of them (replicas are counted, not bundles); a
//!   replica that would exceed it on every node with room is refused, naming
//!   the limit. [`LocalCluster`], one node, so places at most that many of the
//!   deployment's replicas.
//! - A placement group's bundles are reserved instead of the replica's own
//!   resources (the replica runs in the first bundle). `PACK` and
//!   `STRICT_PACK` reserve the bundles' sum on one node (`PACK`, where none
//!   has room for it, the bundles on as few nodes as it can); `STRICT_SPREAD` puts
//!   each bundle on a different live node and is refused, naming the strategy
//!   and how many nodes it needs and has, when too few fit; `SPREAD` uses
//!   distinct nodes where it can and lets bundles share a node where it cannot
//!   (best effort, as Ray). On [`LocalCluster`] every group fits except a
//!   `STRICT_SPREAD` of more than one bundle.
//!
//! [`Cluster::place`] returns the node the replica runs on (its first
//! bundle's); the cluster holds every bundle under the replica's id, and
//! [`Cluster::release`] gives all of them back. A refusal leaves the replica
//! pending with the reason on its deployment's status until a capacity event
//! (or, on a cluster that announces none, [`PLACEMENT_RETRY`]) lets it try
//! again.
//!
//! It must not decide how many replicas a deployment runs, or start or stop
//! one for it: the DeploymentActor does, where a cluster said they fit. The
//! node machinery carries those starts and stops out on nodes, and on its own
//! stops only replicas no deployment owns any more (a re-attached one none
//! adopted, every one on a node the head declared lost). It must not block
//! either: placement is called from actor handlers.

mod cluster;
mod node_pool;
pub mod nodes;
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
