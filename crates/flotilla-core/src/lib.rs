//! The ground every other Flotilla crate stands on: plain data.
//!
//! This crate owns the vocabulary of DESIGN.md as types: validated names and route
//! prefixes, application and deployment specs with Ray Serve's defaults, code and
//! config versions, statuses (with the deployment status transition table), the
//! durable records the checkpoint holds, the ServeConfig file format (parsed from
//! text; reading the file is the caller's), and the typed errors for bad input.
//!
//! It must not spawn actors, touch the file system or the network, or read clocks:
//! everything here is a pure function of its input, so it can be tested exhaustively
//! and used from any layer.

pub mod actor_names;
mod args;
mod autoscaling;
mod batching;
mod config;
mod error;
mod fault;
mod logging;
mod names;
mod placement;
mod record;
mod resources;
mod routing;
mod secret;
mod serve_config;
mod spec;
mod status;
mod version;

pub use args::Args;
pub use autoscaling::{
    AggregationFunction, AutoscalingConfig, AutoscalingPolicy, BUILTIN_AUTOSCALING_POLICIES,
    DEFAULT_AUTOSCALING_POLICY, is_builtin_policy,
};
pub use batching::{BatchConfig, DEFAULT_MAX_NUM_MODELS_PER_REPLICA};
pub use config::{DeploymentConfig, MAX_DURATION, MAX_REPLICAS, ReplicaCount, RolloutConfig};
pub use error::{Error, Location, MAX_QUOTED, Result, shown};
pub use fault::{FaultPoint, Faults};
pub use logging::{LogAttr, LogAttrError, LogEncoding, LogLevel, LoggingConfig, MAX_LOGS_DIR_LEN};
pub use names::{AppName, DeploymentName, ImportPath, MAX_NAME_LEN, MAX_PATH_LEN, RoutePrefix};
pub use placement::{
    BundleError, MAX_REPLICAS_PER_NODE, PlacementGroup, PlacementStrategy, bundle_resources,
};
pub use record::{ApiType, AppRecord, ConfigSource, DeploymentRecord, MAX_GENERATION};
pub use resources::{MIN_RESOURCE_AMOUNT, Resources};
pub use routing::{
    BUILTIN_REQUEST_ROUTERS, BackpressureConfig, BackpressureStatus, DEFAULT_REQUEST_ROUTER,
    RequestRouterConfig, is_builtin_router,
};
pub use secret::{
    MAX_SECRET_LEN, MIN_EXPOSED_SECRET_LEN, SecretError, exposable, secret_from_text,
};
pub use serve_config::{
    AppConfig, AutoscalingOverride, BackpressureOverride, ConfigWarning, ControllerOptions,
    ControllerRuntimeEnv, DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    DeploymentOverride, GrpcOptions, HttpOptionError, HttpOptions, Nullable, NumReplicas,
    ProxyLocation, RayActorOptions, RequestRouterOverride, RouteOverride, ServeConfig,
    TracingConfig, apply_overrides, auto_autoscaling_config,
};
pub use spec::{
    ApplicationSpec, ApplicationSpecBuilder, DeploymentSpec, DeploymentSpecBuilder, MAX_VERSION_LEN,
};
pub use status::{
    AppStatusInputs, ApplicationStatus, ApplicationStatusInfo, DeploymentStatus,
    DeploymentStatusInfo, DeploymentTrigger, ReplicaState, StatusTrigger,
};
pub use version::{CodeVersion, ConfigVersion, DeploymentVersion, stable_hash};
