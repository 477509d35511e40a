//! Flotilla: an in-process control plane for serving code, built as a tree of actors.
//!
//! A program embeds Flotilla, registers its code in a [`Registry`], declares
//! applications ([`ApplicationSpec`]: a set of deployments, each a pool of replicas)
//! and calls [`Serve::run`] or [`Serve::run_many`]. Flotilla keeps what runs equal to
//! what was declared, checkpoints every accepted target in one redb commit, and
//! recovers it all after a crash. Requests reach replicas through
//! [`DeploymentHandle`]s that keep working while control actors restart.
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
mod logging;
mod serve;

pub use details::{DeploymentDetail, READ_ATTEMPTS};
pub use flotilla_controller::LogSettings;
pub use flotilla_controller::{
    BUILD_TIMEOUT, BuildError, ControllerSnapshot, Route, RouteTable, ServeError, StatusBoard,
    WallClock,
};
pub use flotilla_core::{
    ApiType, AppConfig, AppName, ApplicationSpec, ApplicationSpecBuilder, ApplicationStatus,
    ApplicationStatusInfo, Args, AutoscalingConfig, CodeVersion, ConfigVersion, DeploymentConfig,
    DeploymentName, DeploymentSpec, DeploymentSpecBuilder, DeploymentStatus, DeploymentStatusInfo,
    DeploymentVersion, Error as SpecError, FaultPoint, Faults, Location, LogEncoding, LogLevel,
    LoggingConfig, MAX_REPLICAS, ReplicaCount, ReplicaState, Resources, RolloutConfig, RoutePrefix,
    ServeConfig, StatusTrigger,
};
pub use flotilla_deployment::{
    Cluster, ClusterEvent, DEFAULT_LOCAL_CAPACITY, DeploymentKey, DeploymentSnapshot,
    DeploymentTarget, LOCAL_NODE, LocalCluster, NodeId, NodePool, NodeSpec, PlacementRequest,
    PoolNode, Refusal, ReplicaInfo, StateCount, StaticCluster,
};
pub use flotilla_replica::{
    CallError, CallStream, Deployment, DeploymentHandle, DeploymentRoute, ErrorKind,
    HistogramSnapshot, InitContext, LATENCY_BUCKETS_MS, LatencyHistogram, Registry,
    ReplicaEndpoint, ReplicaId, ReplicaSet, ReplicaStats, RouteStats, UserError, groups,
    supervision::RestartPolicy,
};
pub use flotilla_store::{FileKind, Store, StoreCounters, StoreError};
pub use logging::{ACCESS_TARGET, AppLogLayer};
pub use serve::{Metrics, RunManyOptions, Serve, ServeOptions};
