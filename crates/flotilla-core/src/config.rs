//! A deployment's configuration, with Ray Serve's fields and defaults.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{
    Args, AutoscalingConfig, BackpressureConfig, BatchConfig, LoggingConfig, PlacementGroup,
    RequestRouterConfig, Resources,
    batching::{DEFAULT_MAX_NUM_MODELS_PER_REPLICA, validate_max_models},
    error::Error,
    placement::validate_max_replicas_per_node,
};

/// Most replicas one deployment may ask for: `num_replicas`, and the
/// autoscaling bounds (`max_replicas`, hence `min_replicas` and
/// `initial_replicas`). A target above it is refused at the call; the cluster's
/// capacity bounds what actually runs (a target beyond it is pending).
pub const MAX_REPLICAS: u32 = 10_000;

/// The longest duration a config may set (10^9 s, about 31.7 years). Longer
/// ones are refused: a timer that far ahead would overflow the clock it is
/// added to. Ray has no bound; no wait that long is meant as anything but
/// "never".
pub const MAX_DURATION: Duration = Duration::from_secs(1_000_000_000);

/// Refuse `d` as `field` if it is longer than [`MAX_DURATION`].
pub(crate) fn check_max_duration(field: &'static str, d: Duration) -> Result<(), Error> {
    if d > MAX_DURATION {
        return Err(Error::field(
            field,
            format!(
                "must be at most {} s, got {} s",
                MAX_DURATION.as_secs(),
                d.as_secs_f64()
            ),
        ));
    }
    Ok(())
}

/// How many replicas a deployment wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReplicaCount {
    /// A fixed count.
    Fixed(u32),
    /// Decided by the autoscaler within the config's bounds.
    Auto(AutoscalingConfig),
}

/// How fast a code-version change rolls through the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RolloutConfig {
    /// Fraction of the target that may change at once; at least one replica (0.2).
    /// Ray's `rolling_update_percentage`.
    pub max_changing_fraction: f64,
    /// Ray's `max_surge_percent`: extra replicas a roll may start above the
    /// target, as a percentage of the target rounded up (0 to 100), the rest of
    /// the step being replicas stopped before their replacements run. `None`
    /// (Flotilla's default, a departure from Ray's 0): the whole step is surge,
    /// so serving capacity never drops below the target during a roll.
    #[serde(default)]
    pub max_surge_percent: Option<u32>,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            max_changing_fraction: 0.2,
            max_surge_percent: None,
        }
    }
}

impl RolloutConfig {
    /// How many replicas may be changing at once for a target of `target` replicas.
    pub fn step(&self, target: u32) -> u32 {
        ((self.max_changing_fraction * f64::from(target)) as u32).max(1)
    }

    /// How many replicas above `target` a roll may run: the whole step by
    /// default, else `max_surge_percent` of the target, rounded up.
    pub fn surge(&self, target: u32) -> u32 {
        match self.max_surge_percent {
            None => self.step(target),
            Some(p) => (u64::from(target) * u64::from(p)).div_ceil(100) as u32,
        }
    }

    /// How many replicas below `target` a roll may leave serving at once: what
    /// of the step the surge does not cover (none by default).
    pub fn unavailable(&self, target: u32) -> u32 {
        self.step(target).saturating_sub(self.surge(target))
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
    /// Zero is allowed, as in Ray (`ge=0`): the replica then checks on its
    /// shortest tick (`flotilla_replica`'s `MIN_DRAIN_CHECK_PERIOD`, 1 ms)
    /// instead of spinning.
    pub graceful_shutdown_wait_loop: Duration,
    /// A stopping replica is killed after this long (20 s).
    pub graceful_shutdown_timeout: Duration,
    /// What one replica reserves on its node.
    pub resources: Resources,
    /// Rolling update pace.
    pub rollout: RolloutConfig,
    /// At most this many replicas of the deployment on one node (1 to
    /// [`MAX_REPLICAS_PER_NODE`](crate::MAX_REPLICAS_PER_NODE)); `None` is no
    /// limit. Placement keeps a replica off every node that already runs this
    /// many of the deployment's replicas (of any version); one that fits no
    /// other node is pending, its status naming the limit, until a node with
    /// room joins or a replica stops. On the single local node it caps the
    /// deployment's placed replicas. Excludes `placement_group`. Part of the
    /// code version.
    #[serde(default)]
    pub max_replicas_per_node: Option<u32>,
    /// A placement group reserved for each replica, instead of `resources`
    /// (the replica runs in the first bundle, so its resources must fit in
    /// it); `None` reserves `resources` alone. `PACK` and `STRICT_PACK` reserve
    /// the bundles' sum on one node (`PACK`, where no node has room for it,
    /// puts the bundles on as few nodes as it can); `STRICT_SPREAD` puts each bundle on a
    /// different node, and the replica is pending (its status naming the
    /// strategy and how many nodes it needs and has) while too few nodes fit;
    /// `SPREAD` uses distinct nodes where it can and shares one where it
    /// cannot. The replica runs on its first bundle's node, and every bundle
    /// is released when it stops. Part of the code version.
    #[serde(default)]
    pub placement_group: Option<PlacementGroup>,
    /// The request router and its settings (Ray's default router by default).
    #[serde(default)]
    pub request_router: RequestRouterConfig,
    /// The HTTP answer to a request refused by a full queue.
    #[serde(default)]
    pub backpressure: BackpressureConfig,
    /// This deployment's logging, instead of its application's (`None`).
    #[serde(default)]
    pub logging: Option<LoggingConfig>,
    /// Gather requests into batches for the deployment's batch handler
    /// (`Deployment::handle_batch`): Ray's `@serve.batch` arguments; `None`
    /// (the default) serves every request on its own. Part of the config
    /// version: a change takes effect in place, from each replica's next batch.
    #[serde(default)]
    pub batching: Option<BatchConfig>,
    /// Most models a replica of a multiplexed deployment keeps loaded; loading
    /// one more unloads the least recently used first (Ray's
    /// `@serve.multiplexed(max_num_models_per_replica)`, default 3). `None` is
    /// Ray's -1: no limit. Part of the config version, changed in place: a
    /// lower limit evicts each replica's least recently used models down to
    /// it as soon as the load under way there, if any, is done (Ray's cannot
    /// change without a redeploy).
    #[serde(default = "default_max_models")]
    pub max_num_models_per_replica: Option<u32>,
}

fn default_max_models() -> Option<u32> {
    Some(DEFAULT_MAX_NUM_MODELS_PER_REPLICA)
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
            max_replicas_per_node: None,
            placement_group: None,
            request_router: RequestRouterConfig::default(),
            backpressure: BackpressureConfig::default(),
            logging: None,
            batching: None,
            max_num_models_per_replica: default_max_models(),
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

    /// At most `n` replicas of this deployment per node (1 to 100).
    pub fn with_max_replicas_per_node(mut self, n: u32) -> Self {
        self.max_replicas_per_node = Some(n);
        self
    }

    /// Reserve `group` for each replica (its resources run in the first bundle).
    pub fn with_placement_group(mut self, group: PlacementGroup) -> Self {
        self.placement_group = Some(group);
        self
    }

    /// The request router and its settings.
    pub fn with_request_router(mut self, router: RequestRouterConfig) -> Self {
        self.request_router = router;
        self
    }

    /// The HTTP answer to requests refused by a full queue.
    pub fn with_backpressure(mut self, backpressure: BackpressureConfig) -> Self {
        self.backpressure = backpressure;
        self
    }

    /// This deployment's own logging.
    pub fn with_logging(mut self, logging: LoggingConfig) -> Self {
        self.logging = Some(logging);
        self
    }

    /// Batch requests for the deployment's batch handler with `batching`
    /// (`None` serves every request on its own).
    ///
    /// ```
    /// use std::time::Duration;
    /// use flotilla_core::{BatchConfig, DeploymentConfig};
    /// let c = DeploymentConfig::default()
    ///     .with_max_ongoing_requests(64)
    ///     .with_batching(BatchConfig::new(32, Duration::from_millis(5)));
    /// c.validate().unwrap();
    /// ```
    pub fn with_batching(mut self, batching: impl Into<Option<BatchConfig>>) -> Self {
        self.batching = batching.into();
        self
    }

    /// Keep at most `n` models loaded per replica of a multiplexed deployment
    /// (`None`: no limit).
    pub fn with_max_num_models_per_replica(mut self, n: Option<u32>) -> Self {
        self.max_num_models_per_replica = n;
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
        for (field, d) in [
            ("health_check_period", self.health_check_period),
            ("health_check_timeout", self.health_check_timeout),
            (
                "graceful_shutdown_wait_loop",
                self.graceful_shutdown_wait_loop,
            ),
            ("graceful_shutdown_timeout", self.graceful_shutdown_timeout),
        ] {
            check_max_duration(field, d)?;
        }
        let f = self.rollout.max_changing_fraction;
        if !(f.is_finite() && f > 0.0 && f <= 1.0) {
            return Err(Error::field(
                "rollout.max_changing_fraction",
                format!("must be in (0, 1], got {f}"),
            ));
        }
        if let Some(p) = self.rollout.max_surge_percent
            && p > 100
        {
            return Err(Error::field(
                "rollout.max_surge_percent",
                format!("must be from 0 to 100, got {p}"),
            ));
        }
        self.resources.validate()?;
        if let Some(n) = self.max_replicas_per_node {
            validate_max_replicas_per_node(n)?;
            if self.placement_group.is_some() {
                return Err(Error::field(
                    "max_replicas_per_node",
                    "Setting max_replicas_per_node is not allowed when \
                     placement_group_bundles is provided",
                ));
            }
        }
        if let Some(pg) = &self.placement_group {
            pg.validate(&self.resources)?;
        }
        self.request_router.validate()?;
        if let Some(r) = self.backpressure.retry_after
            && r > Duration::from_secs(u64::from(u32::MAX))
        {
            return Err(Error::field(
                "backpressure_config.retry_after_s",
                format!("{}s is too long for a Retry-After header", r.as_secs()),
            ));
        }
        if let Some(l) = &self.logging {
            l.validate()?;
        }
        if let Some(b) = &self.batching {
            b.validate()?;
        }
        validate_max_models(self.max_num_models_per_replica)?;
        Ok(())
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
        assert_eq!(
            field_of(d().with_health_check(Duration::MAX, Duration::from_secs(1))),
            "health_check_period"
        );
        assert_eq!(
            field_of(d().with_graceful_shutdown(Duration::from_secs(1), MAX_DURATION * 2)),
            "graceful_shutdown_timeout"
        );
        assert!(
            d().with_health_check(MAX_DURATION, MAX_DURATION)
                .validate()
                .is_ok()
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
        // Finer than Ray's resource unit is for a config file to refuse: a
        // record checkpointed before that rule still validates.
        let fine = Resources::default().with_custom("tpu", 0.00001);
        assert!(d().with_resources(fine).validate().is_ok());
        assert_eq!(
            field_of(d().with_rollout(RolloutConfig {
                max_changing_fraction: 0.0,
                ..RolloutConfig::default()
            })),
            "rollout.max_changing_fraction"
        );
    }

    #[test]
    fn a_zero_graceful_shutdown_wait_loop_is_accepted_as_in_ray() {
        // Ray: `graceful_shutdown_wait_loop_s` is NonNegativeFloat (ge=0).
        let zero = DeploymentConfig::default()
            .with_graceful_shutdown(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(zero.validate(), Ok(()));
        let too_long = DeploymentConfig::default()
            .with_graceful_shutdown(MAX_DURATION * 2, Duration::from_secs(1));
        assert_eq!(
            too_long.validate().map_err(|e| e.field_name()),
            Err(Some("graceful_shutdown_wait_loop"))
        );
    }

    #[test]
    fn the_newer_settings_have_builders_and_the_config_files_validation() {
        use crate::{BackpressureStatus, LogAttr, PlacementStrategy, error::Error as E};
        let field_of = |c: DeploymentConfig| c.validate().unwrap_err().field_name();
        let d = DeploymentConfig::default;
        let pg = |cpus: f64| {
            PlacementGroup::new(
                vec![Resources::none().with_cpus(cpus)],
                PlacementStrategy::Spread,
            )
        };
        let c = d()
            .with_max_replicas_per_node(3)
            .with_request_router(RequestRouterConfig {
                backoff_multiplier: 4.0,
                ..RequestRouterConfig::default()
            })
            .with_backpressure(BackpressureConfig {
                status_code: BackpressureStatus::TooManyRequests,
                retry_after: Some(Duration::from_secs(1)),
            })
            .with_logging(LoggingConfig::default().with_logs_dir("/logs"));
        c.validate().unwrap();
        assert_eq!(c.max_replicas_per_node, Some(3));
        d().with_placement_group(pg(1.0)).validate().unwrap();
        assert_eq!(
            field_of(d().with_max_replicas_per_node(0)),
            Some("max_replicas_per_node")
        );
        assert_eq!(
            field_of(
                d().with_max_replicas_per_node(2)
                    .with_placement_group(pg(1.0))
            ),
            Some("max_replicas_per_node")
        );
        assert_eq!(
            field_of(d().with_placement_group(pg(0.5))),
            Some("placement_group_bundles")
        );
        assert_eq!(
            field_of(d().with_request_router(RequestRouterConfig {
                initial_backoff: Duration::ZERO,
                ..RequestRouterConfig::default()
            })),
            Some("request_router_config.initial_backoff_s")
        );
        assert_eq!(
            field_of(d().with_logging(LoggingConfig::default().with_logs_dir(""))),
            Some("logging_config.logs_dir")
        );
        let attrs = LoggingConfig {
            additional_log_standard_attrs: vec![LogAttr::Thread, LogAttr::Name],
            ..LoggingConfig::default()
        };
        assert!(matches!(
            d().with_logging(attrs).validate(),
            Err(E::InvalidField { .. })
        ));
        assert_eq!(
            field_of(d().with_rollout(RolloutConfig {
                max_surge_percent: Some(101),
                ..RolloutConfig::default()
            })),
            Some("rollout.max_surge_percent")
        );
    }

    #[test]
    fn rollout_step_is_a_fifth_and_at_least_one() {
        let r = RolloutConfig::default();
        assert_eq!(r.step(1), 1);
        assert_eq!(r.step(4), 1);
        assert_eq!(r.step(10), 2);
        assert_eq!(r.step(100), 20);
        // Flotilla's default: the whole step is surge.
        assert_eq!((r.surge(10), r.unavailable(10)), (2, 0));
        // Ray's max_surge_percent: the surge is that share, the rest of the
        // step is stopped first.
        let ray = RolloutConfig {
            max_surge_percent: Some(0),
            ..r
        };
        assert_eq!((ray.surge(10), ray.unavailable(10)), (0, 2));
        let some = RolloutConfig {
            max_surge_percent: Some(25),
            ..r
        };
        assert_eq!((some.surge(10), some.unavailable(10)), (3, 0));
        assert_eq!((some.surge(2), some.unavailable(2)), (1, 0));
    }
}
