//! `autoscaling_config` in a config file (Ray's `AutoscalingConfig`).

use serde::{Deserialize, Serialize};

use crate::{AggregationFunction, AutoscalingPolicy, error::Error};

use super::lax;

/// `autoscaling_config` in a config file: Ray's `AutoscalingConfig` fields, in
/// seconds. A field left out takes its default ([`crate::AutoscalingConfig::default`],
/// or [`auto_autoscaling_config`](super::auto_autoscaling_config) under
/// `num_replicas: auto`).
///
/// Ray's deprecated fields are read and kept as given, so the applied config
/// records them and [`ServeConfig::warnings`](super::ServeConfig::warnings) can
/// name them: `metrics_interval_s` (validated > 0; Flotilla samples load on its
/// own period), the smoothing factors (folded into the scaling factors with
/// Ray's precedence) and `target_num_ongoing_requests_per_replica` (the old name
/// of `target_ongoing_requests`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalingOverride {
    /// Fewest replicas.
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub min_replicas: Option<u32>,
    /// Most replicas.
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub max_replicas: Option<u32>,
    /// Replicas at first deploy.
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub initial_replicas: Option<u32>,
    /// Ongoing requests per replica the policy aims for.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub target_ongoing_requests: Option<f64>,
    /// Seconds an upscale decision must persist.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub upscale_delay_s: Option<f64>,
    /// Seconds a downscale decision must persist.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub downscale_delay_s: Option<f64>,
    /// Multiplier on each upscale step.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub upscaling_factor: Option<f64>,
    /// Multiplier on each downscale step.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub downscaling_factor: Option<f64>,
    /// Seconds over which load is aggregated.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub look_back_period_s: Option<f64>,
    /// Seconds a decision to go from one replica to none must persist (default:
    /// `downscale_delay_s`).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub downscale_to_zero_delay_s: Option<f64>,
    /// How the look-back window is reduced: `mean`, `max` or `min` (any case).
    #[serde(default)]
    pub aggregation_function: Option<AggregationFunction>,
    /// The policy (`{policy_function, policy_kwargs}`): Ray's default path is the
    /// built-in policy; another names a policy registered in the `Registry`.
    #[serde(default)]
    pub policy: Option<AutoscalingPolicy>,
    /// Ray's deprecated sampling period (> 0): recorded and warned about; Flotilla
    /// samples load on its own period.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub metrics_interval_s: Option<f64>,
    /// Ray's deprecated factor for both directions (> 0): the factor of a
    /// direction whose own factor is not given.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub smoothing_factor: Option<f64>,
    /// Ray's deprecated name of `upscaling_factor` (> 0), used when that is not
    /// given.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub upscale_smoothing_factor: Option<f64>,
    /// Ray's deprecated name of `downscaling_factor` (> 0), used when that is not
    /// given.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub downscale_smoothing_factor: Option<f64>,
    /// Ray's old name of `target_ongoing_requests` (removed from Ray in 2.34):
    /// read as it, with a deprecation warning; giving both is an error.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub target_num_ongoing_requests_per_replica: Option<f64>,
}

impl AutoscalingOverride {
    /// `upscaling_factor` with Ray's precedence: `upscaling_factor`, else
    /// `upscale_smoothing_factor`, else `smoothing_factor`.
    pub fn effective_upscaling_factor(&self) -> Option<f64> {
        self.upscaling_factor
            .or(self.upscale_smoothing_factor)
            .or(self.smoothing_factor)
    }

    /// `downscaling_factor` with Ray's precedence: `downscaling_factor`, else
    /// `downscale_smoothing_factor`, else `smoothing_factor`.
    pub fn effective_downscaling_factor(&self) -> Option<f64> {
        self.downscaling_factor
            .or(self.downscale_smoothing_factor)
            .or(self.smoothing_factor)
    }

    /// `target_ongoing_requests`, or its old name.
    pub fn effective_target_ongoing_requests(&self) -> Option<f64> {
        self.target_ongoing_requests
            .or(self.target_num_ongoing_requests_per_replica)
    }

    /// Checks of the fields Ray validates that have no place in
    /// [`crate::AutoscalingConfig`]: the deprecated ones, and no old name beside
    /// its new one.
    pub(super) fn check(&self) -> Result<(), Error> {
        if self.target_num_ongoing_requests_per_replica.is_some()
            && self.target_ongoing_requests.is_some()
        {
            return Err(Error::field(
                "autoscaling_config.target_num_ongoing_requests_per_replica",
                "target_num_ongoing_requests_per_replica is the old name of \
                 target_ongoing_requests; give only target_ongoing_requests",
            ));
        }
        for (field, v) in [
            (
                "autoscaling_config.metrics_interval_s",
                self.metrics_interval_s,
            ),
            ("autoscaling_config.smoothing_factor", self.smoothing_factor),
            (
                "autoscaling_config.upscale_smoothing_factor",
                self.upscale_smoothing_factor,
            ),
            (
                "autoscaling_config.downscale_smoothing_factor",
                self.downscale_smoothing_factor,
            ),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(Error::field(
                    field,
                    format!("must be a finite number > 0, got {v}"),
                ));
            }
        }
        Ok(())
    }
}
