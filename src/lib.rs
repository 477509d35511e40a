//! Flotilla: an in-process control plane for serving code, built as a tree of actors.
//!
//! A program embeds Flotilla, registers its code in a [`Registry`], declares
//! applications ([`ApplicationSpec`]: a set of deployments, each a pool of replicas)
//! and calls [`Serve::run`] or [`Serve::run_many`]. Flotilla keeps what runs equal to
//! what was declared, checkpoints every accepted target in one redb commit, and
//! recovers it all after a crash. Requests reach replicas through
//! [`DeploymentHandle`]s that keep working while control actors restart.
//!
//! This crate is the facade: it owns [`Serve`] (starting the actor tree on a
//! store, and the public calls, each a message to the Controller), the
//! per-application log layer and the re-exports of the crates below it. It
//! must not hold control state of its own or decide anything the Controller
//! decides: every change goes through the Controller's messages, and every
//! status is read from the status board the Controller writes.
//!
//! ```no_run
//! use flotilla::{ApplicationSpec, Deployment, DeploymentSpec, Registry, Serve, ServeOptions, UserError};
//!
//! struct Echo;
//! impl Deployment for Echo {
//!     type Request = String;
//!     type Response = String;
//!     async fn handle(&self, r: String) -> Result<String, UserError> { Ok(r) }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Registry::new().register("echo::Echo", |_ctx| async { Ok(Echo) })?;
//! let serve = Serve::start(ServeOptions::new(registry)).await?;
//! let app = ApplicationSpec::builder("hello")
//!     .route_prefix("/hello")
//!     .deployment(DeploymentSpec::builder("echo", "echo::Echo").replicas(2))
//!     .build()?;
//! let handle = serve.run(app).await?;
//! let out: String = handle.call("hi").await?;
//! assert_eq!(out, "hi");
//! serve.shutdown().await?;
//! # Ok(()) }
//! ```

mod details;
mod error_text;
mod logging;
mod namespace;
mod serve;

pub use error_text::with_causes;

/// Node processes: the user's own binary, run in node mode, joins a head
/// (a process whose `Serve` was started with [`ServeOptions::nodes`]) and runs
/// the replicas the head places on it (`docs/nodes.md`).
///
/// ```no_run
/// # async fn demo(registry: flotilla::Registry) -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla::{Cookie, node::{self, NodeOptions}};
/// let options = NodeOptions::new("127.0.0.1:4697".parse()?, Cookie::from_env("FLOTILLA_COOKIE")?)
///     .name("worker-1");
/// node::run(registry, options).await?; // until Ctrl-C, or the head refuses it
/// # Ok(()) }
/// ```
pub mod node {
    pub use flotilla_cluster::nodes::{ConnectFailure, Node, NodeError, NodeOptions, run, start};
}

pub use details::{DeploymentDetail, READ_ATTEMPTS};
pub use flotilla_cluster::nodes::{
    Cookie, CookieError, CookieSource, DEFAULT_HEAD_PORT, HeadOptions, NodeCounters, NodeInfo,
    OptionsError,
};
pub use flotilla_cluster::{
    Cluster, ClusterEvent, DEFAULT_LOCAL_CAPACITY, DeploymentKey, LOCAL_NODE, LocalCluster, NodeId,
    NodePool, NodeSpec, PLACEMENT_RETRY, PlacementRequest, PoolNode, Refusal, StaticCluster,
};
pub use flotilla_controller::LogSettings;
pub use flotilla_controller::{
    BUILD_TIMEOUT, BuildError, ControllerSnapshot, Fatal, FileKind, MAX_CONFIG_FILE_BYTES,
    NotRunning, Route, RouteTable, ServeError, StatusBoard, StoreCounters, StoreError, WallClock,
};
pub use flotilla_core::{
    AggregationFunction, ApiType, AppConfig, AppName, ApplicationSpec, ApplicationSpecBuilder,
    ApplicationStatus, ApplicationStatusInfo, Args, AutoscalingConfig, AutoscalingPolicy,
    BackpressureConfig, BackpressureStatus, BatchConfig, CodeVersion, ConfigVersion, ConfigWarning,
    DEFAULT_MAX_NUM_MODELS_PER_REPLICA, DeploymentConfig, DeploymentName, DeploymentSpec,
    DeploymentSpecBuilder, DeploymentStatus, DeploymentStatusInfo, DeploymentVersion,
    Error as SpecError, FaultPoint, Faults, GrpcOptions, HttpOptionError, HttpOptions, Location,
    LogAttr, LogEncoding, LogLevel, LoggingConfig, MAX_DURATION, MAX_REPLICAS,
    MIN_EXPOSED_SECRET_LEN, PlacementGroup, PlacementStrategy, ProxyLocation, ReplicaCount,
    ReplicaState, RequestRouterConfig, Resources, RolloutConfig, RouteOverride, RoutePrefix,
    SecretError, ServeConfig, StatusTrigger, exposable, secret_from_text,
};
pub use flotilla_deployment::{DeploymentSnapshot, DeploymentTarget, ReplicaInfo, StateCount};
pub use flotilla_replica::{
    Assigned, AutoscalingPolicyFn, BATCH_SIZE_BUCKETS, BATCH_UTILIZATION_BUCKETS_PERCENT,
    BatchStats, CallError, CallStream, Deployment, DeploymentHandle, DeploymentRoute, ErrorKind,
    Histogram, HistogramSnapshot, InitContext, LATENCY_BUCKETS_MS, LatencyHistogram,
    MAX_MODEL_ID_LEN, ModelIdError, ModelIds, ModelStats, MultiplexedDeployment, MultiplexedRouter,
    PolicyContext, PowerOfTwoChoicesRouter, Registry, ReplicaEndpoint, ReplicaId, ReplicaSet,
    ReplicaStats, RequestRouter, RequestRouterFactory, RouteStats, RouterError, RoutingRequest,
    UserError, default_router, power_of_two_choices, validate_model_id,
};
pub use flotilla_supervision::{Escalation, RestartPolicy};
pub use logging::{ACCESS_TARGET, AppLogLayer, is_access_log};
pub use serve::{LivingReplica, Metrics, RunManyOptions, Serve, ServeOptions};

/// The README's Rust blocks, compiled by `cargo test --doc` so that what a
/// new user copies first keeps compiling.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
