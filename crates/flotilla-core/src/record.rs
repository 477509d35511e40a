//! The durable records the checkpoint holds (DESIGN.md, "State and the checkpoint
//! protocol"). Only the Controller writes them.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::{ApplicationSpec, CodeVersion};

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
    /// For a declarative application: the config entry it was built from and
    /// what its builder returned, so an overrides-only change is applied without
    /// building again, and a recovered Controller knows what is owed.
    #[serde(default)]
    pub config: Option<Box<ConfigSource>>,
    /// When this target (its generation) was accepted, by the Controller's wall
    /// clock; `None` in records written before it was kept.
    #[serde(default)]
    pub deployed_at: Option<SystemTime>,
}

/// Where a declarative application's target came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigSource {
    /// The entry's code version ([`AppConfig::code_version`](crate::AppConfig::code_version):
    /// import path and args): equal means "the same build".
    pub code: CodeVersion,
    /// The whole entry's version (code, overrides, logging, route prefix): equal
    /// means "nothing to do".
    pub entry: u64,
    /// What the builder returned (named as the application), before overrides:
    /// an overrides-only change is laid over this again.
    pub built: ApplicationSpec,
}

/// A deployment's durable decisions that are not in its application's spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentRecord {
    /// The replica target the autoscaler decided, if it has decided one.
    pub autoscaled_replicas: Option<u32>,
}
