//! A deployment's configuration, with Ray Serve's fields and defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Args, Resources, error::Error};

/// Most replicas one deployment may ask for: `num_replicas`, and the
/// autoscaling bounds (`max_replicas`, hence `min_replicas` and
/// `initial_replicas`). A target above it is refused at the call; the cluster's
/// capacity bounds what actually runs (a target beyond it is pending).
pub const MAX_REPLICAS: u32 = 10_000;

/// How many replicas a deployment wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReplicaCount {
    /// A fixed count.
    Fixed(u32),
    /// Decided by the autoscaler within the config's bounds.
    Auto(AutoscalingConfig),
}

/// Ray Serve's autoscaling settings and defaults (`ray.serve.config.AutoscalingConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoscalingConfig {
    /// Fewest replicas (1). Zero allows scale to zero.
    pub min_replicas: u32,
    /// Replicas at first deploy; `None` starts at `min_replicas`.
    pub initial_replicas: Option<u32>,
    /// Most replicas (1).
    pub max_replicas: u32,
    /// Ongoing requests per replica the policy aims for (2.0).
    pub target_ongoing_requests: f64,
    /// How long upscale decisions must persist before they act (30 s).
    pub upscale_delay: Duration,
    /// How long downscale decisions must persist before they act (600 s).
    pub downscale_delay: Duration,
    /// Multiplier on each upscale step (`None` = 1.0).
    pub upscaling_factor: Option<f64>,
    /// Multiplier on each downscale step (`None` = 1.0).
    pub downscaling_factor: Option<f64>,
    /// Window over which load is averaged (30 s).
    pub look_back_period: Duration,
}

impl Default for AutoscalingConfig {
    fn default() -> Self {
        AutoscalingConfig {
            min_replicas: 1,
            initial_replicas: None,
            max_replicas: 1,
            target_ongoing_requests: 2.0,
            upscale_delay: Duration::from_secs(30),
            downscale_delay: Duration::from_secs(600),
            upscaling_factor: None,
            downscaling_factor: None,
            look_back_period: Duration::from_secs(30),
        }
    }
}

impl AutoscalingConfig {
    /// Bounds in order, factors and target positive.
    pub fn validate(&self) -> Result<(), Error> {
        if self.min_replicas > self.max_replicas {
            return Err(Error::field(
                "autoscaling_config.min_replicas",
                format!(
                    "min_replicas ({}) must not exceed max_replicas ({})",
                    self.min_replicas, self.max_replicas
                ),
            ));
        }
        if self.max_replicas == 0 || self.max_replicas > MAX_REPLICAS {
            return Err(Error::field(
                "autoscaling_config.max_replicas",
                format!(
                    "must be from 1 to {MAX_REPLICAS}, got {}",
                    self.max_replicas
                ),
            ));
        }
        if let Some(init) = self.initial_replicas
            && (init < self.min_replicas || init > self.max_replicas)
        {
            return Err(Error::field(
                "autoscaling_config.initial_replicas",
                format!(
                    "{init} is outside [min_replicas, max_replicas] = [{}, {}]",
                    self.min_replicas, self.max_replicas
                ),
            ));
        }
        if !(self.target_ongoing_requests.is_finite() && self.target_ongoing_requests > 0.0) {
            return Err(Error::field(
                "autoscaling_config.target_ongoing_requests",
                format!("must be > 0, got {}", self.target_ongoing_requests),
            ));
        }
        for (field, f) in [
            ("autoscaling_config.upscaling_factor", self.upscaling_factor),
            (
                "autoscaling_config.downscaling_factor",
                self.downscaling_factor,
            ),
        ] {
            if let Some(f) = f
                && !(f.is_finite() && f > 0.0)
            {
                return Err(Error::field(field, format!("must be > 0, got {f}")));
            }
        }
        if self.look_back_period.is_zero() {
            return Err(Error::field(
                "autoscaling_config.look_back_period",
                "must be longer than zero",
            ));
        }
        Ok(())
    }

    /// The replica count at first deploy.
    pub fn initial(&self) -> u32 {
        self.initial_replicas.unwrap_or(self.min_replicas)
    }
}

/// How fast a code-version change rolls through the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RolloutConfig {
    /// Fraction of the target that may change at once; at least one replica (0.2).
    pub max_changing_fraction: f64,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            max_changing_fraction: 0.2,
        }
    }
}

impl RolloutConfig {
    /// How many replicas may be changing at once for a target of `target` replicas.
    pub fn step(&self, target: u32) -> u32 {
        ((self.max_changing_fraction * f64::from(target)) as u32).max(1)
    }
}

/// A deployment's configuration (Ray Serve's `DeploymentConfig`).
///
/// ```
/// use flotilla_core::DeploymentConfig;
/// let c = DeploymentConfig::default().with_replicas(3).with_max_ongoing_requests(8);
/// c.validate().unwrap();
/// assert_eq!(c.graceful_shutdown_timeout.as_secs(), 20);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentConfig {
    /// A fixed count (1) or an autoscaling config.
    pub num_replicas: ReplicaCount,
    /// Concurrent requests one replica runs at most (5).
    pub max_ongoing_requests: u32,
    /// Requests a handle queues beyond that before rejecting; `None` is unbounded.
    pub max_queued_requests: Option<u32>,
    /// Passed to `reconfigure` on every replica; changing it needs no restart.
    pub user_config: Option<Args>,
    /// Time between health checks (10 s).
    pub health_check_period: Duration,
    /// A health check slower than this fails (30 s).
    pub health_check_timeout: Duration,
    /// While stopping, how often a replica checks whether it is idle (2 s).
    pub graceful_shutdown_wait_loop: Duration,
    /// A stopping replica is killed after this long (20 s).
    pub graceful_shutdown_timeout: Duration,
    /// What one replica reserves on its node.
    pub resources: Resources,
    /// Rolling update pace.
    pub rollout: RolloutConfig,
}

impl Default for DeploymentConfig {
    fn default() -> Self {
        DeploymentConfig {
            num_replicas: ReplicaCount::Fixed(1),
            max_ongoing_requests: 5,
            max_queued_requests: None,
            user_config: None,
            health_check_period: Duration::from_secs(10),
            health_check_timeout: Duration::from_secs(30),
            graceful_shutdown_wait_loop: Duration::from_secs(2),
            graceful_shutdown_timeout: Duration::from_secs(20),
            resources: Resources::default(),
            rollout: RolloutConfig::default(),
        }
    }
}

impl DeploymentConfig {
    /// A fixed replica count.
    pub fn with_replicas(mut self, n: u32) -> Self {
        self.num_replicas = ReplicaCount::Fixed(n);
        self
    }

    /// Autoscale within `config`.
    pub fn with_autoscaling(mut self, config: AutoscalingConfig) -> Self {
        self.num_replicas = ReplicaCount::Auto(config);
        self
    }

    /// Cap on concurrent requests per replica.
    pub fn with_max_ongoing_requests(mut self, n: u32) -> Self {
        self.max_ongoing_requests = n;
        self
    }

    /// Cap on requests queued in handles (`None` = unbounded).
    pub fn with_max_queued_requests(mut self, n: Option<u32>) -> Self {
        self.max_queued_requests = n;
        self
    }

    /// The user config passed to `reconfigure`.
    pub fn with_user_config(mut self, user_config: Args) -> Self {
        self.user_config = Some(user_config);
        self
    }

    /// Health check period and timeout.
    pub fn with_health_check(mut self, period: Duration, timeout: Duration) -> Self {
        self.health_check_period = period;
        self.health_check_timeout = timeout;
        self
    }

    /// Graceful shutdown wait loop and timeout.
    pub fn with_graceful_shutdown(mut self, wait_loop: Duration, timeout: Duration) -> Self {
        self.graceful_shutdown_wait_loop = wait_loop;
        self.graceful_shutdown_timeout = timeout;
        self
    }

    /// Resources per replica.
    pub fn with_resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }

    /// Rolling update pace.
    pub fn with_rollout(mut self, rollout: RolloutConfig) -> Self {
        self.rollout = rollout;
        self
    }

    /// The replica target at first deploy.
    pub fn initial_replicas(&self) -> u32 {
        match &self.num_replicas {
            ReplicaCount::Fixed(n) => *n,
            ReplicaCount::Auto(a) => a.initial(),
        }
    }

    /// Every field in range. The error names the field; callers add the location.
    pub fn validate(&self) -> Result<(), Error> {
        match &self.num_replicas {
            ReplicaCount::Auto(a) => a.validate()?,
            ReplicaCount::Fixed(n) if *n > MAX_REPLICAS => {
                return Err(Error::field(
                    "num_replicas",
                    format!("must be at most {MAX_REPLICAS}, got {n}"),
                ));
            }
            ReplicaCount::Fixed(_) => {}
        }
        if self.max_ongoing_requests == 0 {
            return Err(Error::field("max_ongoing_requests", "must be at least 1"));
        }
        if self.max_queued_requests == Some(0) {
            // Ray: -1 (here `None`) or at least 1. Zero would refuse every request
            // before it queued, so a deployment scaled to zero could never wake.
            return Err(Error::field(
                "max_queued_requests",
                "must be at least 1 (or unset: unbounded)",
            ));
        }
        if self.health_check_period.is_zero() {
            return Err(Error::field(
                "health_check_period",
                "must be longer than zero",
            ));
        }
        if self.health_check_timeout.is_zero() {
            return Err(Error::field(
                "health_check_timeout",
                "must be longer than zero",
            ));
        }
        if self.graceful_shutdown_wait_loop.is_zero() {
            return Err(Error::field(
                "graceful_shutdown_wait_loop",
                "must be longer than zero",
            ));
        }
        let f = self.rollout.max_changing_fraction;
        if !(f.is_finite() && f > 0.0 && f <= 1.0) {
            return Err(Error::field(
                "rollout.max_changing_fraction",
                format!("must be in (0, 1], got {f}"),
            ));
        }
        self.resources.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ray_defaults() {
        let c = DeploymentConfig::default();
        assert_eq!(c.num_replicas, ReplicaCount::Fixed(1));
        assert_eq!(c.max_ongoing_requests, 5);
        assert_eq!(c.max_queued_requests, None);
        assert_eq!(c.health_check_period, Duration::from_secs(10));
        assert_eq!(c.health_check_timeout, Duration::from_secs(30));
        assert_eq!(c.graceful_shutdown_wait_loop, Duration::from_secs(2));
        assert_eq!(c.graceful_shutdown_timeout, Duration::from_secs(20));
        let a = AutoscalingConfig::default();
        assert_eq!((a.min_replicas, a.max_replicas), (1, 1));
        assert_eq!(a.target_ongoing_requests, 2.0);
        assert_eq!(a.upscale_delay, Duration::from_secs(30));
        assert_eq!(a.downscale_delay, Duration::from_secs(600));
        c.validate().unwrap();
    }

    #[test]
    fn rejects_out_of_range_fields_by_name() {
        let field_of = |c: DeploymentConfig| match c.validate().unwrap_err() {
            Error::InvalidField { field, .. } => field,
            other => panic!("unexpected {other}"),
        };
        let d = DeploymentConfig::default;
        assert_eq!(
            field_of(d().with_max_ongoing_requests(0)),
            "max_ongoing_requests"
        );
        assert_eq!(field_of(d().with_replicas(u32::MAX)), "num_replicas");
        assert!(d().with_replicas(MAX_REPLICAS).validate().is_ok());
        let too_many = AutoscalingConfig {
            max_replicas: MAX_REPLICAS + 1,
            ..Default::default()
        };
        assert_eq!(
            field_of(d().with_autoscaling(too_many)),
            "autoscaling_config.max_replicas"
        );
        let no_queue = DeploymentConfig {
            max_queued_requests: Some(0),
            ..d()
        };
        assert_eq!(field_of(no_queue), "max_queued_requests");
        assert_eq!(
            field_of(d().with_health_check(Duration::ZERO, Duration::from_secs(1))),
            "health_check_period"
        );
        let bounds = AutoscalingConfig {
            min_replicas: 5,
            max_replicas: 2,
            ..Default::default()
        };
        assert_eq!(
            field_of(d().with_autoscaling(bounds)),
            "autoscaling_config.min_replicas"
        );
        let init = AutoscalingConfig {
            min_replicas: 1,
            max_replicas: 2,
            initial_replicas: Some(3),
            ..Default::default()
        };
        assert_eq!(
            field_of(d().with_autoscaling(init)),
            "autoscaling_config.initial_replicas"
        );
        assert_eq!(
            field_of(d().with_resources(Resources::default().with_cpus(-1.0))),
            "resources.cpus"
        );
        assert_eq!(
            field_of(d().with_rollout(RolloutConfig {
                max_changing_fraction: 0.0
            })),
            "rollout.max_changing_fraction"
        );
    }

    #[test]
    fn rollout_step_is_a_fifth_and_at_least_one() {
        let r = RolloutConfig::default();
        assert_eq!(r.step(1), 1);
        assert_eq!(r.step(4), 1);
        assert_eq!(r.step(10), 2);
        assert_eq!(r.step(100), 20);
    }
}
