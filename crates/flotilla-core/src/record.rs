//! The durable records the checkpoint holds (DESIGN.md, "State and the checkpoint
//! protocol"). Only the Controller writes them.

use serde::{Deserialize, Serialize};

use crate::ApplicationSpec;

/// How an application was deployed (Ray's `APIType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApiType {
    /// By `run` / `run_many`.
    Imperative,
    /// By `apply_config`.
    Declarative,
}

/// One application's durable target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppRecord {
    /// What the user asked for.
    pub spec: ApplicationSpec,
    /// Bumped on every new target, including the decision to delete.
    pub generation: u64,
    /// The application is being deleted.
    pub deleting: bool,
    /// How it was deployed.
    pub api_type: ApiType,
    /// For a declarative application: the version of the config entry it was
    /// built from, so a recovered Controller knows whether to rebuild it.
    #[serde(default)]
    pub config_version: Option<u64>,
}

/// A deployment's durable decisions that are not in its application's spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentRecord {
    /// The replica target the autoscaler decided, if it has decided one.
    pub autoscaled_replicas: Option<u32>,
}
