//! One deployment's overrides in a config file (Ray's `DeploymentSchema`,
//! `RayActorOptionsSchema`, `RequestRouterConfig`, `BackpressureConfig`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{
    Args, BackpressureStatus, DeploymentConfig, DeploymentName, ImportPath, LoggingConfig,
    PlacementGroup, PlacementStrategy, Resources, error::Error, resources::check_precision,
};

use super::{AutoscalingOverride, Nullable, lax, logging, nullable, value};

/// `num_replicas` in a config file: a count, or `"auto"` for autoscaling.
///
/// A count may be written as an integer, an integral float (`2.0`) or text
/// (`"2"`), as Ray's `Union[PositiveInt, str]` reads them (pydantic's v1
/// API coerces both to the integer before trying text). A fraction (`1.5`) is
/// refused, where Ray truncates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumReplicas {
    /// A fixed count.
    Fixed(u32),
    /// Autoscale, with Ray's `"auto"` defaults (see
    /// [`auto_autoscaling_config`](super::auto_autoscaling_config)).
    Auto,
}

/// Overrides of one deployment's settings: every field given wins over the
/// builder's; every field left out keeps the builder's value (Ray's
/// `DeploymentSchema`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentOverride {
    /// The deployment, as the builder names it.
    pub name: DeploymentName,
    /// A fixed count or `"auto"`; a count excludes `autoscaling_config`.
    #[serde(default)]
    pub num_replicas: Option<NumReplicas>,
    /// Autoscale with these settings; fields left out take Ray's defaults (not the
    /// builder's), as in Ray. `null` turns the builder's autoscaling off (Ray:
    /// "If null, the deployment won't autoscale").
    #[serde(default, skip_serializing_if = "Nullable::is_keep")]
    pub autoscaling_config: Nullable<AutoscalingOverride>,
    /// Concurrent requests one replica runs at most (at least 1).
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub max_ongoing_requests: Option<u32>,
    /// Ray's old name of `max_ongoing_requests` (removed from Ray in 2.34): read
    /// as it, with a deprecation warning; giving both is an error.
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub max_concurrent_queries: Option<u32>,
    /// Requests a handle queues before rejecting: -1 for unbounded, else at least
    /// 1. Written as an integer (Ray's `StrictInt`).
    #[serde(default, deserialize_with = "lax::opt_strict_i64")]
    pub max_queued_requests: Option<i64>,
    /// The HTTP answer to a request refused by a full queue; replaces the
    /// builder's whole, with Ray's defaults for the fields left out. Kept in
    /// [`DeploymentConfig::backpressure`] for the HTTP proxy.
    #[serde(default)]
    pub backpressure_config: Option<BackpressureOverride>,
    /// Passed to every replica's `reconfigure`: any value. `null` drops the
    /// builder's, as in Ray (`reconfigure` is not called).
    #[serde(
        default,
        skip_serializing_if = "Nullable::is_keep",
        with = "nullable::args"
    )]
    pub user_config: Nullable<Args>,
    /// Seconds between health checks (> 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub health_check_period_s: Option<f64>,
    /// Seconds after which a health check fails (> 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub health_check_timeout_s: Option<f64>,
    /// Seconds between a stopping replica's idleness checks (>= 0, as Ray).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub graceful_shutdown_wait_loop_s: Option<f64>,
    /// Seconds after which a stopping replica is killed (>= 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub graceful_shutdown_timeout_s: Option<f64>,
    /// What one replica reserves; replaces the builder's resources whole, with
    /// Ray's defaults (1 CPU) for the fields left out.
    #[serde(default)]
    pub ray_actor_options: Option<RayActorOptions>,
    /// A placement group reserved for each replica, as bundles of resources
    /// (`{CPU: 1, GPU: 1, memory: ..., custom: ...}`); replaces the builder's.
    /// Applied as [`DeploymentConfig::placement_group`] (the replica runs in the
    /// first bundle, so its resources must fit in it). Excludes
    /// `max_replicas_per_node`.
    #[serde(default, deserialize_with = "lax::opt_f64_maps")]
    pub placement_group_bundles: Option<Vec<BTreeMap<String, f64>>>,
    /// How the bundles are placed (`PACK`, the default, `SPREAD`, `STRICT_PACK`,
    /// `STRICT_SPREAD`); needs bundles, given here or by the builder.
    #[serde(default)]
    pub placement_group_strategy: Option<PlacementStrategy>,
    /// Refused: a label selector per bundle. Flotilla's nodes carry no labels;
    /// select nodes with custom resources in the bundles instead. Kept only to
    /// report it.
    #[serde(default, with = "value::args_field::option")]
    pub placement_group_bundle_label_selector: Option<Args>,
    /// At most this many replicas of the deployment on one node (1 to 100);
    /// applied as [`DeploymentConfig::max_replicas_per_node`] by placement.
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub max_replicas_per_node: Option<u32>,
    /// This deployment's logging (Ray: completed with the defaults, not merged
    /// with the application's); kept in [`DeploymentConfig::logging`].
    #[serde(default, deserialize_with = "logging::logging_option")]
    pub logging_config: Option<LoggingConfig>,
    /// The request router and its settings; replaces the builder's whole, with
    /// Ray's defaults for the fields left out. Kept in
    /// [`DeploymentConfig::request_router`].
    #[serde(default)]
    pub request_router_config: Option<RequestRouterOverride>,
    /// Refused: Flotilla places replicas one at a time; it has no gang
    /// scheduling. Kept only to report it.
    #[serde(default, with = "value::args_field::option")]
    pub gang_scheduling_config: Option<Args>,
    /// Refused unless empty: Flotilla has no deployment-scoped actors (shared
    /// state lives in another deployment, reached through a handle). Kept only
    /// to report it.
    #[serde(default, with = "value::args_field::option")]
    pub deployment_actors: Option<Args>,
    /// Fraction of the target a roll may change at once, in (0, 1]; applied as
    /// [`RolloutConfig::max_changing_fraction`](crate::RolloutConfig::max_changing_fraction).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub rolling_update_percentage: Option<f64>,
    /// Extra replicas a roll may start, in percent of the target (0 to 100);
    /// kept in [`RolloutConfig::max_surge_percent`](crate::RolloutConfig::max_surge_percent).
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub max_surge_percent: Option<u32>,
    /// Flotilla's extension (Ray has no config field for it: it is
    /// `@serve.batch`'s argument): most requests in one batch (an integer >= 1).
    /// Any of the three batching fields turns batching on, the others keeping
    /// the builder's batching settings, else Ray's defaults. Kept in
    /// [`DeploymentConfig::batching`].
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub max_batch_size: Option<u32>,
    /// Flotilla's extension (`@serve.batch`'s argument): seconds a batch waits
    /// for more requests after its first (a number >= 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub batch_wait_timeout_s: Option<f64>,
    /// Flotilla's extension (`@serve.batch`'s argument): most batches running at
    /// once per replica (an integer >= 1).
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub max_concurrent_batches: Option<u32>,
    /// Flotilla's extension (`@serve.multiplexed`'s argument): most models a
    /// replica keeps loaded, -1 for no limit (an integer, written as one, as
    /// Ray checks `isinstance(int)`). Kept in
    /// [`DeploymentConfig::max_num_models_per_replica`].
    #[serde(default, deserialize_with = "lax::opt_strict_i64")]
    pub max_num_models_per_replica: Option<i64>,
}

/// `backpressure_config` in a config file (Ray's `BackpressureConfig`, which
/// forbids unknown fields too).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackpressureOverride {
    /// 503 (the default) or 429, written as an integer.
    #[serde(default)]
    pub status_code: Option<BackpressureStatus>,
    /// Seconds for a `Retry-After` header (finite, >= 0); none by default.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub retry_after_s: Option<f64>,
}

/// `request_router_config` in a config file (Ray's `RequestRouterConfig`). A
/// field left out takes Ray's default
/// ([`RequestRouterConfig::default`](crate::RequestRouterConfig::default)).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestRouterOverride {
    /// The router's import path: Ray's default (power of two choices, Flotilla's
    /// router), or a router registered in the `Registry` (checked when the config
    /// is applied).
    #[serde(default)]
    pub request_router_class: Option<ImportPath>,
    /// Given to the router: a mapping.
    #[serde(default, with = "value::map_field::option")]
    pub request_router_kwargs: Option<Args>,
    /// Seconds between routing-stats recordings (> 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub request_routing_stats_period_s: Option<f64>,
    /// Seconds a routing-stats recording may take (> 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub request_routing_stats_timeout_s: Option<f64>,
    /// Seconds of the first retry wait (> 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub initial_backoff_s: Option<f64>,
    /// What each further wait is multiplied by (> 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub backoff_multiplier: Option<f64>,
    /// Seconds of the longest retry wait (> 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub max_backoff_s: Option<f64>,
}

/// `ray_actor_options` in a config file: the resources one replica reserves (Ray's
/// `RayActorOptionsSchema`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RayActorOptions {
    /// Ray's Python environment for this deployment (a mapping): accepted,
    /// recorded, applies nothing; its keys join the application's runtime-env
    /// warning.
    #[serde(default, with = "value::map_field::option")]
    pub runtime_env: Option<Args>,
    /// Logical CPUs (default 1).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub num_cpus: Option<f64>,
    /// GPUs (default 0).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub num_gpus: Option<f64>,
    /// Memory in bytes (default 0): a whole number, which may be written as a
    /// float (`1.5e9`).
    #[serde(default, deserialize_with = "lax::opt_u64")]
    pub memory: Option<u64>,
    /// Custom resources by name (`CPU` and `GPU` are refused, as in Ray: use
    /// `num_cpus` and `num_gpus`).
    #[serde(default, deserialize_with = "lax::opt_f64_map")]
    pub resources: Option<BTreeMap<String, f64>>,
    /// Run only on nodes with this accelerator: applied as Ray applies it, as
    /// the custom resource `accelerator_type:<type>` (0.001 of it), which nodes
    /// with that accelerator offer.
    #[serde(default)]
    pub accelerator_type: Option<String>,
    /// Refused unless empty: Flotilla's nodes carry no labels. Kept only to
    /// report it.
    #[serde(default, with = "value::args_field::option")]
    pub label_selector: Option<Args>,
    /// Refused unless empty: its entries are label selectors, and Flotilla's
    /// nodes carry no labels. Kept only to report it.
    #[serde(default, with = "value::args_field::option")]
    pub fallback_strategy: Option<Args>,
}

/// How much of `accelerator_type:<type>` a replica with an `accelerator_type`
/// reserves (Ray's amount).
pub const ACCELERATOR_TYPE_AMOUNT: f64 = 0.001;

impl RayActorOptions {
    /// The resources these options ask for, with Ray's defaults (1 CPU, no GPU, no
    /// memory, no custom resources) for the fields left out, and the
    /// accelerator type as Ray's custom resource `accelerator_type:<type>`.
    pub fn to_resources(&self) -> Resources {
        let d = Resources::default();
        let mut r = Resources {
            cpus: self.num_cpus.unwrap_or(d.cpus),
            gpus: self.num_gpus.unwrap_or(d.gpus),
            memory_bytes: self.memory.unwrap_or(d.memory_bytes),
            custom: self.resources.clone().unwrap_or(d.custom),
        };
        if let Some(t) = &self.accelerator_type {
            r.custom
                .insert(format!("accelerator_type:{t}"), ACCELERATOR_TYPE_AMOUNT);
        }
        r
    }

    fn check(&self) -> Result<(), Error> {
        if let Some(res) = &self.resources {
            for k in ["CPU", "GPU"] {
                if res.contains_key(k) {
                    return Err(Error::field(
                        "ray_actor_options.resources",
                        "Use the 'num_cpus' and 'num_gpus' keyword instead of 'CPU' and 'GPU' \
                         in 'resources' keyword (as Ray)",
                    ));
                }
            }
            // As Ray's `resources_from_ray_options`: memory is its own option
            // (as a custom resource no node offers it, so nothing would fit).
            if ["memory", "object_store_memory"]
                .iter()
                .any(|k| res.contains_key(*k))
            {
                return Err(Error::field(
                    "ray_actor_options.resources",
                    "The resources dictionary must not contain the key 'memory' or \
                     'object_store_memory' (as Ray); a replica's memory is \
                     ray_actor_options.memory",
                ));
            }
            if res.contains_key("bundle") {
                return Err(Error::field(
                    "ray_actor_options.resources",
                    "'bundle' is a reserved resource name (as Ray)",
                ));
            }
        }
        if let Some(t) = &self.accelerator_type
            && (t.is_empty() || t.chars().any(char::is_whitespace))
        {
            return Err(Error::field(
                "ray_actor_options.accelerator_type",
                format!(
                    "must be a non-empty name without whitespace, got {:?}",
                    crate::shown(t)
                ),
            ));
        }
        refuse_nonempty(
            "ray_actor_options.label_selector",
            &self.label_selector,
            "Flotilla's nodes carry no labels, so a label selector cannot be honoured; \
             reserve a custom resource (ray_actor_options.resources) that only the chosen \
             nodes offer instead",
        )?;
        refuse_nonempty(
            "ray_actor_options.fallback_strategy",
            &self.fallback_strategy,
            "its entries are label selectors, and Flotilla's nodes carry no labels",
        )
    }
}

fn refuse_nonempty(field: &'static str, given: &Option<Args>, why: &str) -> Result<(), Error> {
    match given {
        Some(v) if !value::is_empty(v) => Err(Error::field(field, format!("not supported: {why}"))),
        _ => Ok(()),
    }
}

impl DeploymentOverride {
    /// An override of deployment `name` that changes nothing yet.
    pub fn new(name: DeploymentName) -> Self {
        DeploymentOverride {
            name,
            num_replicas: None,
            autoscaling_config: Nullable::Keep,
            max_ongoing_requests: None,
            max_concurrent_queries: None,
            max_queued_requests: None,
            backpressure_config: None,
            user_config: Nullable::Keep,
            health_check_period_s: None,
            health_check_timeout_s: None,
            graceful_shutdown_wait_loop_s: None,
            graceful_shutdown_timeout_s: None,
            ray_actor_options: None,
            placement_group_bundles: None,
            placement_group_strategy: None,
            placement_group_bundle_label_selector: None,
            max_replicas_per_node: None,
            logging_config: None,
            request_router_config: None,
            gang_scheduling_config: None,
            deployment_actors: None,
            rolling_update_percentage: None,
            max_surge_percent: None,
            max_batch_size: None,
            batch_wait_timeout_s: None,
            max_concurrent_batches: None,
            max_num_models_per_replica: None,
        }
    }

    /// No resource amount finer than Ray's unit ([`MIN_RESOURCE_AMOUNT`]):
    /// checked when a config is parsed or applied
    /// ([`ServeConfig::validate`](super::ServeConfig::validate)), not when a
    /// stored config's overrides are laid over a builder again, so a config
    /// stored before the rule still rebuilds.
    ///
    /// [`MIN_RESOURCE_AMOUNT`]: crate::MIN_RESOURCE_AMOUNT
    pub(super) fn check_amounts(&self) -> Result<(), Error> {
        let actor = self.ray_actor_options.as_ref();
        for (field, amount) in [
            ("ray_actor_options.num_cpus", actor.and_then(|r| r.num_cpus)),
            ("ray_actor_options.num_gpus", actor.and_then(|r| r.num_gpus)),
        ] {
            check_precision(field, amount.unwrap_or(0.0))?;
        }
        let resources = actor.and_then(|r| r.resources.as_ref());
        for amount in resources.into_iter().flat_map(|r| r.values()) {
            check_precision("ray_actor_options.resources", *amount)?;
        }
        let bundles = self.placement_group_bundles.iter().flatten();
        for amount in bundles.flat_map(|b| b.values()) {
            check_precision("placement_group_bundles", *amount)?;
        }
        Ok(())
    }

    /// `max_ongoing_requests`, or its old name `max_concurrent_queries`.
    pub fn effective_max_ongoing_requests(&self) -> Option<u32> {
        self.max_ongoing_requests.or(self.max_concurrent_queries)
    }

    /// The fields given as `null` ([`Nullable::Clear`]), which a written
    /// config that leaves out nulls must put back.
    pub fn nulls(&self) -> impl Iterator<Item = &'static str> + use<> {
        [
            (
                "autoscaling_config",
                self.autoscaling_config == Nullable::Clear,
            ),
            ("user_config", self.user_config == Nullable::Clear),
        ]
        .into_iter()
        .filter_map(|(field, null)| null.then_some(field))
    }

    /// `e`, naming the field as this override spells it: a range error on a
    /// value given under an old name (`max_concurrent_queries`,
    /// `target_num_ongoing_requests_per_replica`, the smoothing factors)
    /// names that one, so it points at the line the file has.
    pub(super) fn as_written(&self, e: Error) -> Error {
        let Error::InvalidField { at, field, reason } = e else {
            return e;
        };
        let a = self.autoscaling_config.given();
        let field = match field {
            "max_ongoing_requests" if self.max_ongoing_requests.is_none() => {
                "max_concurrent_queries"
            }
            "autoscaling_config.target_ongoing_requests"
                if a.is_some_and(|a| a.target_ongoing_requests.is_none()) =>
            {
                "autoscaling_config.target_num_ongoing_requests_per_replica"
            }
            "autoscaling_config.upscaling_factor" => match a {
                Some(a) if a.upscaling_factor.is_none() && a.upscale_smoothing_factor.is_some() => {
                    "autoscaling_config.upscale_smoothing_factor"
                }
                Some(a) if a.upscaling_factor.is_none() && a.smoothing_factor.is_some() => {
                    "autoscaling_config.smoothing_factor"
                }
                _ => field,
            },
            "autoscaling_config.downscaling_factor" => match a {
                Some(a)
                    if a.downscaling_factor.is_none() && a.downscale_smoothing_factor.is_some() =>
                {
                    "autoscaling_config.downscale_smoothing_factor"
                }
                Some(a) if a.downscaling_factor.is_none() && a.smoothing_factor.is_some() => {
                    "autoscaling_config.smoothing_factor"
                }
                _ => field,
            },
            other => other,
        };
        Error::InvalidField { at, field, reason }
    }

    /// Checks of the override on its own: no old name beside its new one, no
    /// refused field set, `max_replicas_per_node` not beside bundles (Ray's
    /// schema rule). Errors name the field as the file does.
    pub(super) fn check(&self) -> Result<(), Error> {
        if self.max_concurrent_queries.is_some() && self.max_ongoing_requests.is_some() {
            return Err(Error::field(
                "max_concurrent_queries",
                "max_concurrent_queries is the old name of max_ongoing_requests; give only \
                 max_ongoing_requests",
            ));
        }
        if let Some(a) = self.autoscaling_config.given() {
            a.check()?;
        }
        if let Some(r) = &self.ray_actor_options {
            r.check()?;
        }
        if self.max_replicas_per_node.is_some() && self.placement_group_bundles.is_some() {
            return Err(Error::field(
                "max_replicas_per_node",
                "Setting max_replicas_per_node is not allowed when placement_group_bundles is \
                 provided (as in Ray)",
            ));
        }
        if let Some(b) = &self.backpressure_config
            && let Some(s) = b.retry_after_s
            && !(s.is_finite() && s >= 0.0)
        {
            return Err(Error::field(
                "backpressure_config.retry_after_s",
                format!("must be a finite number of seconds >= 0, got {s}"),
            ));
        }
        if self.gang_scheduling_config.is_some() {
            return Err(Error::field(
                "gang_scheduling_config",
                "not supported: Flotilla places replicas one at a time and has no gang \
                 scheduling (no atomic placement of a group of replicas); remove it",
            ));
        }
        refuse_nonempty(
            "deployment_actors",
            &self.deployment_actors,
            "Flotilla has no deployment-scoped actors; keep shared state in another \
             deployment and reach it through a handle",
        )?;
        refuse_nonempty(
            "placement_group_bundle_label_selector",
            &self.placement_group_bundle_label_selector,
            "Flotilla's nodes carry no labels, so a bundle label selector cannot be honoured; \
             put a custom resource that only the chosen nodes offer in the bundles instead",
        )
    }

    /// The config [`check`](Self::check) lays this override over to validate it
    /// without the builder's: the defaults, with a placement group the override's
    /// replica fits in when it sets a strategy without bundles (the builder may
    /// give the bundles; whether it does is checked when the overrides are
    /// applied), and a replica that needs nothing when it sets bundles but no
    /// `ray_actor_options` (the replica is the builder's, not the default
    /// 1-CPU one: whether it fits is checked when the overrides are applied).
    pub(super) fn check_base(&self) -> DeploymentConfig {
        let mut base = DeploymentConfig::default();
        if self.placement_group_bundles.is_some() && self.ray_actor_options.is_none() {
            base.resources = Resources::none();
        }
        if self.placement_group_strategy.is_some() && self.placement_group_bundles.is_none() {
            let replica = self
                .ray_actor_options
                .as_ref()
                .map_or_else(Resources::default, RayActorOptions::to_resources);
            let bundle = Resources {
                cpus: replica.cpus.max(1.0),
                ..replica
            };
            base.placement_group = Some(PlacementGroup::new(vec![bundle], PlacementStrategy::Pack));
        }
        base
    }
}

impl Serialize for NumReplicas {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NumReplicas::Fixed(n) => s.serialize_u32(*n),
            NumReplicas::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for NumReplicas {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = NumReplicas;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a replica count (an integer >= 0) or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<NumReplicas, E> {
                u32::try_from(v)
                    .map(NumReplicas::Fixed)
                    .map_err(|_| E::custom(format!("num_replicas {v} is too large")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<NumReplicas, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!(
                        "num_replicas must be >= 0 or \"auto\", got {v}"
                    ))),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<NumReplicas, E> {
                if v.is_finite() && v.fract() == 0.0 && v >= 0.0 && v <= f64::from(u32::MAX) {
                    Ok(NumReplicas::Fixed(v as u32))
                } else {
                    Err(E::custom(format!(
                        "num_replicas must be a whole count >= 0 or \"auto\", got {v}"
                    )))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<NumReplicas, E> {
                if v == "auto" {
                    return Ok(NumReplicas::Auto);
                }
                match lax::parse_int_text(v) {
                    Some(n) => u64::try_from(n)
                        .map_err(|_| {
                            E::custom(format!("num_replicas must be >= 0 or \"auto\", got {n}"))
                        })
                        .and_then(|u| self.visit_u64(u)),
                    None => Err(E::custom(format!(
                        "num_replicas must be an integer or \"auto\" (lower case), got {:?}",
                        crate::shown(v)
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}
