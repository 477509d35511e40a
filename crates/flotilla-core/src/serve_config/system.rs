//! Ray's options for its own system actors (`ControllerOptions`, `TracingConfig`):
//! validated as Ray validates them and kept in the applied config. Flotilla's
//! controller runs in the embedding process and exports no traces, so neither
//! applies anything; [`ServeConfig::warnings`](super::ServeConfig::warnings) says
//! so.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Location};

use super::{Sited, lax, top};

/// `controller_options` (Ray's `ControllerOptions`, which forbids unknown fields).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerOptions {
    /// The controller actor's runtime environment: only `env_vars`, as in Ray.
    #[serde(default)]
    pub runtime_env: Option<ControllerRuntimeEnv>,
}

/// `controller_options.runtime_env`: Ray takes only `env_vars` here.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerRuntimeEnv {
    /// Environment variables for Ray's controller actor (names non-empty, values
    /// text). Flotilla's controller is part of this process: set them on the
    /// process instead.
    #[serde(default, deserialize_with = "super::null_as_default")]
    pub env_vars: BTreeMap<String, String>,
}

impl ControllerOptions {
    /// The environment variables given, by name.
    pub fn env_vars(&self) -> Vec<&str> {
        self.runtime_env
            .iter()
            .flat_map(|r| r.env_vars.keys().map(String::as_str))
            .collect()
    }

    pub(super) fn check(&self) -> Result<(), Sited> {
        if self.env_vars().iter().any(|k| k.is_empty()) {
            let field = "controller_options.runtime_env.env_vars";
            return Err(top(
                Error::InvalidField {
                    at: Location::default(),
                    field,
                    reason: "env_vars key must be a non-empty str (as Ray)".into(),
                },
                field,
            ));
        }
        Ok(())
    }
}

/// `tracing_config` (Ray's `TracingConfig`, which forbids unknown fields). Each
/// field is `None` where the file leaves it out (Ray's defaults come from
/// environment variables).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// Whether spans are exported.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Ray's exporter function's import path.
    #[serde(default)]
    pub exporter_import_path: Option<String>,
    /// The share of requests traced, from 0 to 1.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub sampling_ratio: Option<f64>,
}

impl TracingConfig {
    /// Whether the config asks for traces to be exported: `enabled: true`, or an
    /// exporter given without `enabled: false`.
    pub fn wants_export(&self) -> bool {
        match self.enabled {
            Some(e) => e,
            None => self
                .exporter_import_path
                .as_deref()
                .is_some_and(|p| !p.is_empty()),
        }
    }

    pub(super) fn check(&self) -> Result<(), Sited> {
        if let Some(r) = self.sampling_ratio
            && !(0.0..=1.0).contains(&r)
        {
            let field = "tracing_config.sampling_ratio";
            return Err(top(
                Error::InvalidField {
                    at: Location::default(),
                    field,
                    reason: format!("sampling_ratio must be between 0.0 and 1.0, got {r}"),
                },
                field,
            ));
        }
        Ok(())
    }
}
