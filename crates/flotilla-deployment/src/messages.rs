//! What a DeploymentActor receives and reports.

use std::sync::Arc;

use flotilla_core::{
    DeploymentName, DeploymentSpec, DeploymentStatusInfo, DeploymentVersion, ReplicaState,
};
use flotilla_replica::{ReplicaEvent, ReplicaId, ReplicaSnapshot};
use ractor::RpcReplyPort;

use flotilla_cluster::ClusterEvent;

/// A deployment's target, as its ApplicationActor sets it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentTarget {
    /// The spec (code, args, config), shared by the ApplicationActor, the
    /// DeploymentActor and every replica rather than copied into each.
    pub spec: Arc<DeploymentSpec>,
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
    /// The autoscaler wants `replicas`; the Controller makes it durable and it
    /// comes back as a new target.
    Autoscale {
        /// The deployment.
        name: DeploymentName,
        /// The decided replica count.
        replicas: u32,
        /// The application generation of the target it was decided under: a
        /// decision that crossed a redeploy is dropped.
        generation: u64,
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
    /// The models it has loaded, sorted (a multiplexed deployment's).
    pub model_ids: Vec<String>,
}

/// How many replicas are in one state at one version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    /// The state.
    pub state: ReplicaState,
    /// The version.
    pub version: DeploymentVersion,
    /// How many replicas.
    pub count: u32,
}

/// A DeploymentActor's state, for tests and the status API.
#[derive(Debug, Clone)]
pub struct DeploymentSnapshot {
    /// The target.
    pub target: DeploymentTarget,
    /// The target version.
    pub version: DeploymentVersion,
    /// The status.
    pub status: DeploymentStatusInfo,
    /// Every replica it owns, oldest first.
    pub replicas: Vec<ReplicaInfo>,
    /// Replica counts by (state, version), sorted by state then version.
    pub counts: Vec<StateCount>,
    /// Replicas wanted but not placed: no node has room for them.
    pub pending: u32,
    /// Why they are not placed (the cluster's refusal), if any are pending.
    pub pending_reason: Option<String>,
    /// Consecutive constructor failures.
    pub startup_failures: u32,
}

impl DeploymentSnapshot {
    /// Replicas in `state`, at any version.
    pub fn count(&self, state: ReplicaState) -> u32 {
        self.counts
            .iter()
            .filter(|c| c.state == state)
            .map(|c| c.count)
            .sum()
    }

    /// Replicas in `state` at exactly `version`.
    pub fn count_at(&self, state: ReplicaState, version: &DeploymentVersion) -> u32 {
        self.counts
            .iter()
            .filter(|c| c.state == state && &c.version == version)
            .map(|c| c.count)
            .sum()
    }

    /// Replicas not stopping (the ones that count toward the target).
    pub fn live(&self) -> u32 {
        self.replicas
            .iter()
            .filter(|r| r.state != ReplicaState::Stopping)
            .count() as u32
    }
}

/// Messages to a DeploymentActor: its ApplicationActor's requests, and its own
/// internal ones.
#[derive(Debug)]
pub enum DeploymentMsg {
    /// A new target (idempotent: the same target twice changes nothing).
    SetTarget(Box<DeploymentTarget>),
    /// Reply with a snapshot.
    Observe(RpcReplyPort<DeploymentSnapshot>),
    /// Stop every replica gracefully, reply when all are gone, then stop.
    Shutdown(RpcReplyPort<()>),
    /// The actor's own messages (replica reports, timers, cluster events); only
    /// this crate makes one.
    Internal(Internal),
}

/// `ractor`'s `cluster` feature (on for nodes) wants every message type to say it is one; this one stays local.
impl ractor::Message for DeploymentMsg {}

/// A DeploymentActor's message to itself; opaque outside this crate.
#[derive(Debug)]
pub struct Internal(pub(crate) InternalMsg);

#[derive(Debug)]
pub(crate) enum InternalMsg {
    /// An event from one of its replicas.
    Replica(ReplicaId, ReplicaEvent),
    /// The constructor backoff armed to end at this instant is over (a timer
    /// replaced by a longer one, or dropped by a new target, ends nothing).
    Retry(tokio::time::Instant),
    /// The placement retry timer fired (clusters without events only).
    PlacementRetry,
    /// A RECOVERING replica described itself (`None`: it did not answer).
    Recovered(ReplicaId, Option<Box<ReplicaSnapshot>>),
    /// An event of the cluster (capacity freed, node died).
    Cluster(ClusterEvent),
    /// The cluster subscription lagged; re-check every replica's node.
    ClusterResync,
    /// The slow-start timer fired.
    SlowStartCheck,
    /// Time to sample load and ask the autoscaler (autoscaled only).
    AutoscaleTick,
    /// Reconcile once for the replica events and exits taken since the last
    /// pass (queued by the first of them).
    Reconcile,
}

impl From<InternalMsg> for DeploymentMsg {
    fn from(m: InternalMsg) -> Self {
        DeploymentMsg::Internal(Internal(m))
    }
}
