//! Replicas and the data plane.
//!
//! This crate owns what runs user code and how requests reach it:
//! - the user-facing [`Deployment`] trait and the [`Registry`] that maps import
//!   paths to constructors, application builders and autoscaling policies (code
//!   cannot be checkpointed, so it is named);
//! - the [`ReplicaActor`], one per replica: it runs the constructor off its mailbox,
//!   health-checks its user code, reconfigures it in place, and drains gracefully;
//! - the data plane: a [`ReplicaEndpoint`] per running replica, the shared
//!   [`Directory`] of routes per deployment (published by subscription, `watch`), and
//!   the [`DeploymentHandle`] that routes requests with the deployment's
//!   [`RequestRouter`] (power-of-two-choices by default, preferring a replica that
//!   holds the request's model);
//! - request batching (a per-replica batcher feeding [`Deployment::handle_batch`])
//!   and model multiplexing ([`MultiplexedDeployment`]: a per-replica LRU model
//!   cache whose loaded ids are published to routers by subscription);
//! - the [`LogSettings`] replicas log by (kept current by the Controller and,
//!   in a node process, by its head), which the facade's log layer reads;
//!
//! Handles live here (and not in the controller) because a deployment's constructor
//! receives them through its [`InitContext`] to call other deployments.
//!
//! It must not decide how many replicas run or where: that is the DeploymentActor's
//! job. It never touches the checkpoint store.

mod access;
mod actor;
mod batching;
mod endpoint;
mod error;
mod handle;
mod home;
mod log_settings;
mod model_cache;
mod multiplex;
mod on_exit;
mod payload;
mod policy;
mod queue;
mod registry;
pub mod remote;
mod route;
mod router;
mod settings;
mod stats;
mod user;

pub use actor::{
    HealthError, Internal, MIN_DRAIN_CHECK_PERIOD, ReplicaActor, ReplicaActorState, ReplicaArgs,
    ReplicaEvent, ReplicaMsg, ReplicaPhase, ReplicaReporter, ReplicaSnapshot,
};
pub use endpoint::{ReplicaEndpoint, ReplicaId};
pub use error::CallError;
pub use handle::{ACCESS_TARGET, Assigned, CallStream, DeploymentHandle, is_access_log};
pub use log_settings::{AppLogSnapshot, LogSettings, LogSnapshot};
pub use model_cache::ModelIds;
pub use multiplex::{MAX_MODEL_ID_LEN, ModelIdError, MultiplexedDeployment, validate_model_id};
pub use on_exit::OnExit;
pub use payload::{ItemSender, ItemsClosed};
pub use policy::{AutoscalingPolicyFn, PolicyContext};
pub use registry::{InitContext, Registry, RequestRouterFactory};
pub use route::{DeploymentRoute, Directory, ReplicaSet, RouteStats};
pub use router::{
    MultiplexedRouter, PowerOfTwoChoicesRouter, RequestRouter, RouterError, RoutingRequest,
    default_router, power_of_two_choices,
};
pub use stats::{
    BATCH_SIZE_BUCKETS, BATCH_UTILIZATION_BUCKETS_PERCENT, BatchCounts, BatchStats, ErrorKind,
    Histogram, HistogramCounts, HistogramSnapshot, LATENCY_BUCKETS_MS, LatencyHistogram,
    ModelCounts, ModelStats, ReplicaStats,
};
pub use user::{Deployment, UserError};
