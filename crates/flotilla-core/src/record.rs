//! The durable records the checkpoint holds (DESIGN.md, "State and the checkpoint
//! protocol"). Only the Controller writes them.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::{ApplicationSpec, CodeVersion, Error, MAX_REPLICAS};

/// The highest generation a record may hold: beyond any real history (a new
/// target every nanosecond for a century stays far below it), and far enough
/// from `u64::MAX` that the next generation is always one more.
pub const MAX_GENERATION: u64 = 1 << 62;

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

impl AppRecord {
    /// What an API call could have written: a valid spec and a generation at
    /// most [`MAX_GENERATION`] (a record read back from a file is checked so).
    pub fn validate(&self) -> Result<(), Error> {
        self.spec.validate()?;
        if self.generation > MAX_GENERATION {
            return Err(Error::field(
                "generation",
                format!("must be at most {MAX_GENERATION}, got {}", self.generation),
            ));
        }
        Ok(())
    }
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

impl DeploymentRecord {
    /// What an API call could have written: a decided target of at most
    /// [`MAX_REPLICAS`].
    pub fn validate(&self) -> Result<(), Error> {
        match self.autoscaled_replicas {
            Some(n) if n > MAX_REPLICAS => Err(Error::field(
                "autoscaled_replicas",
                format!("must be at most {MAX_REPLICAS}, got {n}"),
            )),
            _ => Ok(()),
        }
    }
}
