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
mod config;
mod error;
mod fault;
mod names;
mod record;
mod resources;
mod serve_config;
mod spec;
mod status;
mod version;

pub use args::Args;
pub use config::{AutoscalingConfig, DeploymentConfig, MAX_REPLICAS, ReplicaCount, RolloutConfig};
pub use error::{Error, Location, MAX_QUOTED, Result, shown};
pub use fault::{FaultPoint, Faults};
pub use names::{AppName, DeploymentName, ImportPath, MAX_NAME_LEN, MAX_PATH_LEN, RoutePrefix};
pub use record::{ApiType, AppRecord, ConfigSource, DeploymentRecord};
pub use resources::Resources;
pub use serve_config::{
    AppConfig, AutoscalingOverride, DeploymentOverride, NumReplicas, RayActorOptions, ServeConfig,
    apply_overrides, auto_autoscaling_config,
};
pub use spec::{
    ApplicationSpec, ApplicationSpecBuilder, DeploymentSpec, DeploymentSpecBuilder, LogEncoding,
    LogLevel, LoggingConfig, MAX_VERSION_LEN,
};
pub use status::{
    AppStatusInputs, ApplicationStatus, ApplicationStatusInfo, DeploymentStatus,
    DeploymentStatusInfo, DeploymentTrigger, ReplicaState, StatusTrigger,
};
pub use version::{CodeVersion, ConfigVersion, DeploymentVersion, stable_hash};
