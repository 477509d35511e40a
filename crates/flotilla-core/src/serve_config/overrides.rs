//! Laying a config's overrides over the spec an application builder returned.

use std::time::Duration;

use crate::{
    ApplicationSpec, AutoscalingConfig, BackpressureConfig, DeploymentConfig, MAX_DURATION,
    PlacementGroup, ReplicaCount, RequestRouterConfig, bundle_resources,
    error::{Error, Location},
    spec::set_app_policy,
};

use super::{
    AppConfig, AutoscalingOverride, BackpressureOverride, DeploymentOverride, Nullable,
    NumReplicas, RequestRouterOverride, auto_autoscaling_config,
};

/// Apply `app`'s config to the spec its builder returned. The config wins over the
/// code wherever it says something:
/// - the application's name is the config's;
/// - the config's `route_prefix`, if given, replaces the builder's;
/// - the config's `logging_config`, if given, replaces the builder's (call
///   [`ServeConfig::inherit_logging`](super::ServeConfig::inherit_logging) first to
///   give applications the global one, as Ray does);
/// - each deployment override replaces exactly the fields it gives (see
///   [`DeploymentOverride::apply_to`]);
/// - `external_scaler_enabled` is the config's (then no deployment may
///   autoscale, the builder's included);
/// - `autoscaling_policy`, if given, replaces the policy of every deployment
///   that autoscales (Ray: the application-level policy takes precedence).
///
/// An override of a deployment the builder did not make is an error naming the
/// application and the deployment; so is any value out of range. The result is
/// validated whole ([`ApplicationSpec::validate`]).
pub fn apply_overrides(built: ApplicationSpec, app: &AppConfig) -> Result<ApplicationSpec, Error> {
    app.check().map_err(|b| b.0)?;
    let app_name = app.name.as_str();
    let mut spec = built;
    spec.name = app.name.clone();
    spec.route_prefix = app.route_prefix.apply(spec.route_prefix);
    if let Some(logging) = &app.logging_config {
        spec.logging = Some(logging.clone());
    }
    spec.external_scaler_enabled = app.external_scaler_enabled;
    for o in &app.deployments {
        let dep = o.name.as_str();
        let available = || {
            spec.deployments
                .iter()
                .map(|d| format!("'{}'", d.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some(index) = spec.deployments.iter().position(|d| d.name == o.name) else {
            return Err(Error::InvalidField {
                at: Location {
                    app: Some(app_name.to_owned()),
                    deployment: Some(dep.to_owned()),
                },
                field: "name",
                reason: format!(
                    "the application's builder makes no deployment '{dep}'; it makes: [{}]",
                    available()
                ),
            });
        };
        let d = &mut spec.deployments[index];
        d.config = o
            .apply_to(d.config.clone())
            .and_then(|c| c.validate().map_err(config_field_names).map(|()| c))
            .map_err(|e| e.at(Some(app_name), Some(dep)))?;
    }
    if let Some(policy) = &app.autoscaling_policy {
        set_app_policy(&mut spec.deployments, policy);
    }
    spec.validate()?;
    Ok(spec)
}

impl DeploymentOverride {
    /// Lay this override over `base` (the builder's config): every field given
    /// replaces the matching setting, every field left out keeps `base`'s.
    ///
    /// - `num_replicas: N` makes the count fixed at N.
    /// - `autoscaling_config` alone autoscales with
    ///   [`AutoscalingConfig::default`] updated by the given fields (Ray replaces
    ///   the whole autoscaling config; it does not merge with the code's).
    ///   `autoscaling_config: null` turns autoscaling off: the count is the
    ///   given `num_replicas`, else the builder's fixed count, else 1 (Ray's
    ///   default count).
    /// - `user_config` replaces the builder's; `null` drops it.
    /// - `num_replicas: auto` autoscales with [`auto_autoscaling_config`] updated by
    ///   the given `autoscaling_config`, or, without one (or with an empty
    ///   one, `{}`, as Ray reads it), keeps the builder's autoscaling config
    ///   if it has one.
    /// - `max_ongoing_requests` (or its old name `max_concurrent_queries`).
    /// - `max_queued_requests: -1` is unbounded.
    /// - `ray_actor_options` replaces the resources whole, with Ray's defaults for
    ///   the fields left out.
    /// - `placement_group_bundles` replaces the placement group's bundles (the
    ///   strategy is the given one, else the builder's, else `PACK`);
    ///   `placement_group_strategy` alone re-places the builder's bundles (an
    ///   error if it has none, as in Ray).
    /// - `max_replicas_per_node`, `logging_config` replace the builder's;
    ///   `request_router_config` and `backpressure_config` replace the builder's
    ///   whole, with Ray's defaults for the fields left out.
    /// - `rolling_update_percentage` and `max_surge_percent` set the rollout pace.
    /// - `max_batch_size`, `batch_wait_timeout_s` and `max_concurrent_batches`
    ///   (Flotilla's extension) turn batching on: each given field replaces the
    ///   builder's batching setting, or Ray's default where the builder has none.
    /// - `max_num_models_per_replica` (Flotilla's extension): -1 is no limit.
    ///
    /// Errors name the field as the config file does; the result is not yet
    /// validated as a whole (see [`DeploymentConfig::validate`]).
    pub fn apply_to(&self, base: DeploymentConfig) -> Result<DeploymentConfig, Error> {
        let mut c = base;
        match (self.num_replicas, &self.autoscaling_config) {
            (Some(NumReplicas::Fixed(n)), Nullable::Set(_)) => {
                return Err(Error::field(
                    "num_replicas",
                    format!(
                        "num_replicas: {n} cannot be combined with autoscaling_config; \
                         drop one, or write num_replicas: auto"
                    ),
                ));
            }
            (Some(NumReplicas::Fixed(n)), Nullable::Keep | Nullable::Clear) => {
                c.num_replicas = ReplicaCount::Fixed(n)
            }
            // An empty `autoscaling_config: {}` (or `null`) with `auto` is
            // none at all: Ray takes `options.get("autoscaling_config") or
            // the builder's`, and `{}` and `None` are falsy.
            (Some(NumReplicas::Auto), Nullable::Set(given))
                if *given != AutoscalingOverride::default() =>
            {
                c.num_replicas = ReplicaCount::Auto(given.apply_to(auto_autoscaling_config())?);
            }
            (Some(NumReplicas::Auto), _) => {
                if !matches!(c.num_replicas, ReplicaCount::Auto(_)) {
                    c.num_replicas = ReplicaCount::Auto(auto_autoscaling_config());
                }
            }
            (None, Nullable::Set(given)) => {
                c.num_replicas = ReplicaCount::Auto(given.apply_to(AutoscalingConfig::default())?);
            }
            // `null` alone: no autoscaling, at the builder's count, or Ray's
            // default count (1) where the builder autoscaled.
            (None, Nullable::Clear) => {
                if let ReplicaCount::Auto(_) = c.num_replicas {
                    c.num_replicas = ReplicaCount::Fixed(1);
                }
            }
            (None, Nullable::Keep) => {}
        }
        if let Some(n) = self.effective_max_ongoing_requests() {
            c.max_ongoing_requests = n;
        }
        if let Some(n) = self.max_queued_requests {
            c.max_queued_requests = match n {
                -1 => None,
                n => match u32::try_from(n) {
                    Ok(q) if q >= 1 => Some(q),
                    _ => {
                        return Err(Error::field(
                            "max_queued_requests",
                            format!(
                                "must be -1 (no limit) or an integer from 1 to {}, got {n}",
                                u32::MAX
                            ),
                        ));
                    }
                },
            };
        }
        if let Some(b) = &self.backpressure_config {
            c.backpressure = b.to_config()?;
        }
        match &self.user_config {
            Nullable::Keep => {}
            Nullable::Clear => c.user_config = None,
            Nullable::Set(u) => c.user_config = Some(u.clone()),
        }
        if let Some(s) = self.health_check_period_s {
            c.health_check_period = seconds("health_check_period_s", s)?;
        }
        if let Some(s) = self.health_check_timeout_s {
            c.health_check_timeout = seconds("health_check_timeout_s", s)?;
        }
        if let Some(s) = self.graceful_shutdown_wait_loop_s {
            c.graceful_shutdown_wait_loop = seconds("graceful_shutdown_wait_loop_s", s)?;
        }
        if let Some(s) = self.graceful_shutdown_timeout_s {
            c.graceful_shutdown_timeout = seconds("graceful_shutdown_timeout_s", s)?;
        }
        if let Some(r) = &self.ray_actor_options {
            c.resources = r.to_resources();
        }
        match (&self.placement_group_bundles, self.placement_group_strategy) {
            (Some(bundles), strategy) => {
                let bundles = bundles
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        bundle_resources(b).map_err(|why| {
                            Error::field(
                                "placement_group_bundles",
                                format!("bundle #{}: {why}", i + 1),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let strategy = strategy
                    .or(c.placement_group.as_ref().map(|p| p.strategy))
                    .unwrap_or_default();
                c.placement_group = Some(PlacementGroup::new(bundles, strategy));
            }
            (None, Some(strategy)) => match &mut c.placement_group {
                Some(pg) => pg.strategy = strategy,
                None => {
                    return Err(Error::field(
                        "placement_group_strategy",
                        "If `placement_group_strategy` is provided, `placement_group_bundles` \
                         must also be provided (neither the config nor the application's \
                         builder gives bundles)",
                    ));
                }
            },
            (None, None) => {}
        }
        if let Some(n) = self.max_replicas_per_node {
            c.max_replicas_per_node = Some(n);
        }
        if let Some(l) = &self.logging_config {
            c.logging = Some(l.clone());
        }
        if let Some(r) = &self.request_router_config {
            c.request_router = r.to_config()?;
        }
        if let Some(p) = self.rolling_update_percentage {
            if !(p.is_finite() && p > 0.0 && p <= 1.0) {
                return Err(Error::field(
                    "rolling_update_percentage",
                    format!("must be in (0, 1], got {p}"),
                ));
            }
            c.rollout.max_changing_fraction = p;
        }
        if let Some(p) = self.max_surge_percent {
            c.rollout.max_surge_percent = Some(p);
        }
        if self.max_batch_size.is_some()
            || self.batch_wait_timeout_s.is_some()
            || self.max_concurrent_batches.is_some()
        {
            let mut b = c.batching.unwrap_or_default();
            if let Some(n) = self.max_batch_size {
                b.max_batch_size = n;
            }
            if let Some(s) = self.batch_wait_timeout_s {
                b.batch_wait_timeout = seconds("batch_wait_timeout_s", s)?;
            }
            if let Some(n) = self.max_concurrent_batches {
                b.max_concurrent_batches = n;
            }
            c.batching = Some(b);
        }
        if let Some(n) = self.max_num_models_per_replica {
            c.max_num_models_per_replica = match n {
                -1 => None,
                n => match u32::try_from(n) {
                    Ok(m) if m >= 1 => Some(m),
                    _ => {
                        return Err(Error::field(
                            "max_num_models_per_replica",
                            format!(
                                "must be positive (or -1, unlimited), an integer up to {}, got {n}",
                                u32::MAX
                            ),
                        ));
                    }
                },
            };
        }
        Ok(c)
    }
}

impl AutoscalingOverride {
    /// `base` with every given field replaced; the deprecated aliases fold into
    /// their current fields with Ray's precedence.
    pub fn apply_to(&self, base: AutoscalingConfig) -> Result<AutoscalingConfig, Error> {
        let mut a = base;
        if let Some(v) = self.min_replicas {
            a.min_replicas = v;
        }
        if let Some(v) = self.max_replicas {
            a.max_replicas = v;
        }
        if let Some(v) = self.initial_replicas {
            a.initial_replicas = Some(v);
        }
        if let Some(v) = self.effective_target_ongoing_requests() {
            a.target_ongoing_requests = v;
        }
        if let Some(s) = self.upscale_delay_s {
            a.upscale_delay = seconds("autoscaling_config.upscale_delay_s", s)?;
        }
        if let Some(s) = self.downscale_delay_s {
            a.downscale_delay = seconds("autoscaling_config.downscale_delay_s", s)?;
        }
        if let Some(s) = self.downscale_to_zero_delay_s {
            a.downscale_to_zero_delay =
                Some(seconds("autoscaling_config.downscale_to_zero_delay_s", s)?);
        }
        if let Some(v) = self.effective_upscaling_factor() {
            a.upscaling_factor = Some(v);
        }
        if let Some(v) = self.effective_downscaling_factor() {
            a.downscaling_factor = Some(v);
        }
        if let Some(s) = self.look_back_period_s {
            a.look_back_period = seconds("autoscaling_config.look_back_period_s", s)?;
        }
        if let Some(f) = self.aggregation_function {
            a.aggregation_function = f;
        }
        if let Some(p) = &self.policy {
            a.policy = p.clone();
        }
        Ok(a)
    }
}

impl BackpressureOverride {
    /// The back-pressure config this gives: Ray's defaults for the fields left out.
    pub fn to_config(&self) -> Result<BackpressureConfig, Error> {
        Ok(BackpressureConfig {
            status_code: self.status_code.unwrap_or_default(),
            retry_after: self
                .retry_after_s
                .map(|s| seconds("backpressure_config.retry_after_s", s))
                .transpose()?,
        })
    }
}

impl RequestRouterOverride {
    /// The router config this gives: Ray's defaults for the fields left out.
    pub fn to_config(&self) -> Result<RequestRouterConfig, Error> {
        let d = RequestRouterConfig::default();
        let secs = |field, v: Option<f64>, default| match v {
            Some(s) => positive_seconds(field, s),
            None => Ok(default),
        };
        let multiplier = match self.backoff_multiplier {
            Some(m) if !(m.is_finite() && m > 0.0) => {
                return Err(Error::field(
                    "request_router_config.backoff_multiplier",
                    format!("must be a finite number > 0, got {m}"),
                ));
            }
            Some(m) => m,
            None => d.backoff_multiplier,
        };
        Ok(RequestRouterConfig {
            request_router_class: self
                .request_router_class
                .clone()
                .unwrap_or(d.request_router_class),
            request_router_kwargs: self
                .request_router_kwargs
                .clone()
                .unwrap_or(d.request_router_kwargs),
            request_routing_stats_period: secs(
                "request_router_config.request_routing_stats_period_s",
                self.request_routing_stats_period_s,
                d.request_routing_stats_period,
            )?,
            request_routing_stats_timeout: secs(
                "request_router_config.request_routing_stats_timeout_s",
                self.request_routing_stats_timeout_s,
                d.request_routing_stats_timeout,
            )?,
            initial_backoff: secs(
                "request_router_config.initial_backoff_s",
                self.initial_backoff_s,
                d.initial_backoff,
            )?,
            backoff_multiplier: multiplier,
            max_backoff: secs(
                "request_router_config.max_backoff_s",
                self.max_backoff_s,
                d.max_backoff,
            )?,
        })
    }
}

fn seconds(field: &'static str, s: f64) -> Result<Duration, Error> {
    if !(s.is_finite() && s >= 0.0) {
        return Err(Error::field(
            field,
            format!("must be a finite number of seconds >= 0, got {s}"),
        ));
    }
    Duration::try_from_secs_f64(s)
        .ok()
        // A positive time below a nanosecond is a nanosecond, not zero: Ray's
        // `gt=0` fields take it.
        .map(|d| {
            if d.is_zero() && s > 0.0 {
                Duration::from_nanos(1)
            } else {
                d
            }
        })
        .filter(|d| *d <= MAX_DURATION)
        .ok_or_else(|| {
            Error::field(
                field,
                format!("must be at most {} s, got {s}", MAX_DURATION.as_secs()),
            )
        })
}

fn positive_seconds(field: &'static str, s: f64) -> Result<Duration, Error> {
    if !(s.is_finite() && s > 0.0) {
        return Err(Error::field(
            field,
            format!("must be a finite number of seconds > 0, got {s}"),
        ));
    }
    seconds(field, s)
}

/// Rename the fields [`DeploymentConfig::validate`] names to the config file's names.
pub(crate) fn config_field_names(e: Error) -> Error {
    match e {
        Error::InvalidField { at, field, reason } => Error::InvalidField {
            at,
            field: match field {
                "health_check_period" => "health_check_period_s",
                "health_check_timeout" => "health_check_timeout_s",
                "graceful_shutdown_wait_loop" => "graceful_shutdown_wait_loop_s",
                "graceful_shutdown_timeout" => "graceful_shutdown_timeout_s",
                "autoscaling_config.look_back_period" => "autoscaling_config.look_back_period_s",
                "autoscaling_config.upscale_delay" => "autoscaling_config.upscale_delay_s",
                "autoscaling_config.downscale_delay" => "autoscaling_config.downscale_delay_s",
                "autoscaling_config.downscale_to_zero_delay" => {
                    "autoscaling_config.downscale_to_zero_delay_s"
                }
                "resources.cpus" => "ray_actor_options.num_cpus",
                "resources.gpus" => "ray_actor_options.num_gpus",
                "resources.custom" => "ray_actor_options.resources",
                "rollout.max_changing_fraction" => "rolling_update_percentage",
                "rollout.max_surge_percent" => "max_surge_percent",
                other => other,
            },
            reason,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;
    use crate::{
        Args, DeploymentSpec, LogLevel, LoggingConfig, RayActorOptions, Resources, RouteOverride,
        RoutePrefix, ServeConfig,
    };

    /// The builder's arguments.
    #[derive(Deserialize)]
    struct ShopArgs {
        greeting: String,
        n: u32,
    }

    /// A registered application builder: takes `args`, returns the spec.
    fn shop_builder(args: &Args) -> ApplicationSpec {
        let a: ShopArgs = args.decode().unwrap();
        ApplicationSpec::builder("built-name")
            .route_prefix("/from-code")
            .deployment(
                DeploymentSpec::builder("front", "shop::Front")
                    .init_args(&a.greeting)
                    .replicas(a.n),
            )
            .deployment(
                DeploymentSpec::builder("back", "shop::Back").with_config(|c| {
                    c.with_autoscaling(AutoscalingConfig {
                        min_replicas: 2,
                        max_replicas: 6,
                        ..AutoscalingConfig::default()
                    })
                }),
            )
            .logging(LoggingConfig::default())
            .build()
            .unwrap()
    }

    fn app(deployments: &str) -> AppConfig {
        let text = format!(
            "applications:\n  - name: shop\n    import_path: shop:app\n    args: {{greeting: hi, n: 3}}\n    deployments:\n{deployments}"
        );
        match ServeConfig::from_yaml(&text) {
            Ok(mut c) => c.applications.remove(0),
            Err(e) => panic!("{e}"),
        }
    }

    /// Build with the builder, apply the overrides of one deployment `name`
    /// written as `fields`, and return that deployment's config.
    fn front_with(fields: &str) -> DeploymentConfig {
        let app = app(&format!("      - name: front\n{fields}"));
        let spec = apply_overrides(shop_builder(&app.args), &app).unwrap();
        spec.deployment("front").unwrap().config.clone()
    }

    /// The front deployment's config as the builder makes it.
    fn built_front() -> DeploymentConfig {
        shop_builder(&app("").args)
            .deployment("front")
            .unwrap()
            .config
            .clone()
    }

    #[test]
    fn args_reach_the_builder() {
        let app = app("      - name: front\n");
        let a: ShopArgs = app.args.decode().unwrap();
        assert_eq!((a.greeting.as_str(), a.n), ("hi", 3));
        let spec = apply_overrides(shop_builder(&app.args), &app).unwrap();
        let front = spec.deployment("front").unwrap();
        assert_eq!(front.init_args.decode::<String>().unwrap(), "hi");
        assert_eq!(front.config.num_replicas, ReplicaCount::Fixed(3));
    }

    #[test]
    fn no_override_keeps_the_builders_config() {
        assert_eq!(front_with(""), built_front());
        let app = app("");
        let built = shop_builder(&app.args);
        let spec = apply_overrides(built.clone(), &app).unwrap();
        assert_eq!(spec.deployments, built.deployments);
    }

    #[test]
    fn override_num_replicas() {
        assert_eq!(
            front_with("        num_replicas: 7\n").num_replicas,
            ReplicaCount::Fixed(7)
        );
    }

    #[test]
    fn override_num_replicas_auto() {
        assert_eq!(
            front_with("        num_replicas: auto\n").num_replicas,
            ReplicaCount::Auto(auto_autoscaling_config())
        );
        assert_eq!(auto_autoscaling_config().max_replicas, 100);
        // "auto" with an autoscaling config tunes the "auto" defaults.
        let tuned = front_with(
            "        num_replicas: auto\n        autoscaling_config: {min_replicas: 2}\n",
        );
        assert_eq!(
            tuned.num_replicas,
            ReplicaCount::Auto(AutoscalingConfig {
                min_replicas: 2,
                ..auto_autoscaling_config()
            })
        );
        // "auto" alone keeps an autoscaling config the code already has, and
        // so does "auto" with an empty one (Ray: `{}` is falsy).
        for given in ["", "        autoscaling_config: {}\n"] {
            let app = app(&format!(
                "      - name: back\n        num_replicas: auto\n{given}"
            ));
            let spec = apply_overrides(shop_builder(&app.args), &app).unwrap();
            let ReplicaCount::Auto(a) = &spec.deployment("back").unwrap().config.num_replicas
            else {
                panic!("not autoscaled");
            };
            assert_eq!((a.min_replicas, a.max_replicas), (2, 6), "{given:?}");
        }
    }

    #[test]
    fn override_autoscaling_config_with_every_field() {
        let c = front_with(
            "        autoscaling_config:\n          min_replicas: 0\n          max_replicas: 9\n          initial_replicas: 4\n          target_ongoing_requests: 3.5\n          upscale_delay_s: 1.5\n          downscale_delay_s: 60\n          upscaling_factor: 2\n          downscaling_factor: 0.5\n          look_back_period_s: 12\n          downscale_to_zero_delay_s: 900\n          aggregation_function: MAX\n          policy: {policy_function: shop.policies:queue, policy_kwargs: {depth: 3}}\n",
        );
        assert_eq!(
            c.num_replicas,
            ReplicaCount::Auto(AutoscalingConfig {
                min_replicas: 0,
                initial_replicas: Some(4),
                max_replicas: 9,
                target_ongoing_requests: 3.5,
                upscale_delay: Duration::from_millis(1500),
                downscale_delay: Duration::from_secs(60),
                upscaling_factor: Some(2.0),
                downscaling_factor: Some(0.5),
                look_back_period: Duration::from_secs(12),
                downscale_to_zero_delay: Some(Duration::from_secs(900)),
                aggregation_function: crate::AggregationFunction::Max,
                policy: crate::AutoscalingPolicy::named("shop.policies:queue".try_into().unwrap())
                    .with_kwargs(
                        Args::encode(
                            &[("depth", 3)]
                                .into_iter()
                                .collect::<std::collections::BTreeMap<_, _>>()
                        )
                        .unwrap()
                    ),
            })
        );
        // Fields left out take Ray's class defaults, not the code's (as in Ray).
        let app = app("      - name: back\n        autoscaling_config: {max_replicas: 3}\n");
        let spec = apply_overrides(shop_builder(&app.args), &app).unwrap();
        assert_eq!(
            spec.deployment("back").unwrap().config.num_replicas,
            ReplicaCount::Auto(AutoscalingConfig {
                max_replicas: 3,
                ..AutoscalingConfig::default()
            })
        );
    }

    #[test]
    fn fixed_num_replicas_replaces_the_codes_autoscaling() {
        let app = app("      - name: back\n        num_replicas: 4\n");
        let spec = apply_overrides(shop_builder(&app.args), &app).unwrap();
        assert_eq!(
            spec.deployment("back").unwrap().config.num_replicas,
            ReplicaCount::Fixed(4)
        );
    }

    #[test]
    fn override_max_ongoing_requests() {
        assert_eq!(
            front_with("        max_ongoing_requests: 42\n").max_ongoing_requests,
            42
        );
    }

    #[test]
    fn override_max_queued_requests() {
        assert_eq!(
            front_with("        max_queued_requests: 9\n").max_queued_requests,
            Some(9)
        );
        // -1 is unbounded, and overrides a bound set in code.
        let mut app = app("      - name: front\n        max_queued_requests: -1\n");
        let mut built = shop_builder(&app.args);
        built.deployments[0].config.max_queued_requests = Some(3);
        let spec = apply_overrides(built.clone(), &app).unwrap();
        assert_eq!(spec.deployments[0].config.max_queued_requests, None);
        app.deployments[0].max_queued_requests = Some(0);
        let e = apply_overrides(built, &app).unwrap_err();
        assert_eq!(e.field_name(), Some("max_queued_requests"));
    }

    #[test]
    fn override_user_config() {
        #[derive(Deserialize, PartialEq, Debug)]
        struct Tuning {
            threshold: f64,
            labels: Vec<String>,
        }
        let c = front_with("        user_config: {threshold: 0.5, labels: [a, b]}\n");
        assert_eq!(
            c.user_config.unwrap().decode::<Tuning>().unwrap(),
            Tuning {
                threshold: 0.5,
                labels: vec!["a".into(), "b".into()]
            }
        );
        assert_eq!(
            front_with("        user_config: 7\n").user_config,
            Some(Args::encode(&7u8).unwrap())
        );
    }

    /// `null` is not leaving a field out where Ray gives it a meaning: over
    /// the code's value, `autoscaling_config: null` turns autoscaling off
    /// ("If null, the deployment won't autoscale") and `user_config: null`
    /// drops the code's. Both were read as left out: the code's stood.
    #[test]
    fn null_autoscaling_config_and_user_config_clear_the_builders() {
        let back_with = |fields: &str| {
            let app = app(&format!("      - name: back\n{fields}"));
            let spec = apply_overrides(shop_builder(&app.args), &app).unwrap();
            spec.deployment("back").unwrap().config.clone()
        };
        assert!(matches!(back_with("").num_replicas, ReplicaCount::Auto(_)));
        // Off, at Ray's default count; or at the count given with it.
        let c = back_with("        autoscaling_config: null\n");
        assert_eq!(c.num_replicas, ReplicaCount::Fixed(1));
        let c = back_with("        num_replicas: 4\n        autoscaling_config: null\n");
        assert_eq!(c.num_replicas, ReplicaCount::Fixed(4));
        // `auto` with null takes the builder's, as Ray's `or`.
        let c = back_with("        num_replicas: auto\n        autoscaling_config: null\n");
        assert_eq!(c.num_replicas, back_with("").num_replicas);
        // A fixed builder stays as it is.
        let c = front_with("        autoscaling_config: null\n");
        assert_eq!(c.num_replicas, ReplicaCount::Fixed(3));
        // The code's user_config, replaced, dropped, or kept.
        let with_user_config = |fields: &str| {
            let app = app(&format!("      - name: front\n{fields}"));
            let mut built = shop_builder(&app.args);
            let front = built
                .deployments
                .iter_mut()
                .find(|d| d.name.as_str() == "front");
            front.unwrap().config.user_config = Some(Args::encode(&7).unwrap());
            let spec = apply_overrides(built, &app).unwrap();
            spec.deployment("front").unwrap().config.user_config.clone()
        };
        assert_eq!(with_user_config(""), Some(Args::encode(&7).unwrap()));
        assert_eq!(
            with_user_config("        user_config: 8\n"),
            Some(Args::encode(&8).unwrap())
        );
        assert_eq!(with_user_config("        user_config: null\n"), None);
    }

    #[test]
    fn override_health_check_period_s() {
        let c = front_with("        health_check_period_s: 2.5\n");
        assert_eq!(c.health_check_period, Duration::from_millis(2500));
        assert_eq!(c.health_check_timeout, built_front().health_check_timeout);
    }

    #[test]
    fn override_health_check_timeout_s() {
        let c = front_with("        health_check_timeout_s: 4\n");
        assert_eq!(c.health_check_timeout, Duration::from_secs(4));
        assert_eq!(c.health_check_period, built_front().health_check_period);
    }

    #[test]
    fn override_graceful_shutdown_wait_loop_s() {
        let c = front_with("        graceful_shutdown_wait_loop_s: 0.1\n");
        assert_eq!(c.graceful_shutdown_wait_loop, Duration::from_millis(100));
        // Zero, as Ray allows (ge=0): the replica checks on its shortest tick.
        let zero = front_with("        graceful_shutdown_wait_loop_s: 0\n");
        assert_eq!(zero.graceful_shutdown_wait_loop, Duration::ZERO);
    }

    #[test]
    fn override_graceful_shutdown_timeout_s() {
        let c = front_with("        graceful_shutdown_timeout_s: 0\n");
        assert_eq!(c.graceful_shutdown_timeout, Duration::ZERO);
        assert_eq!(
            c.graceful_shutdown_wait_loop,
            built_front().graceful_shutdown_wait_loop
        );
    }

    #[test]
    fn override_ray_actor_options() {
        let c = front_with(
            "        ray_actor_options: {num_cpus: 0.5, num_gpus: 1, memory: 2048, resources: {tpu: 2}}\n",
        );
        assert_eq!(
            c.resources,
            Resources::default()
                .with_cpus(0.5)
                .with_gpus(1.0)
                .with_memory(2048)
                .with_custom("tpu", 2.0)
        );
        // Fields left out take Ray's defaults (1 CPU), replacing the code's whole.
        let mut app = app("      - name: front\n        ray_actor_options: {num_gpus: 1}\n");
        app.deployments[0].ray_actor_options = Some(RayActorOptions {
            num_gpus: Some(1.0),
            ..RayActorOptions::default()
        });
        let mut built = shop_builder(&app.args);
        built.deployments[0].config.resources = Resources::none().with_custom("x", 1.0);
        let spec = apply_overrides(built, &app).unwrap();
        assert_eq!(
            spec.deployments[0].config.resources,
            Resources::default().with_gpus(1.0)
        );
    }

    #[test]
    fn overrides_touch_only_their_own_deployment() {
        let app = app("      - name: front\n        max_ongoing_requests: 42\n");
        let built = shop_builder(&app.args);
        let spec = apply_overrides(built.clone(), &app).unwrap();
        assert_eq!(spec.deployment("back"), built.deployment("back"));
        // Init args and import paths are the code's.
        assert_eq!(
            spec.deployment("front").unwrap().init_args,
            built.deployment("front").unwrap().init_args
        );
    }

    #[test]
    fn override_name_route_prefix_and_logging() {
        let mut app = app("      - name: front\n");
        let built = shop_builder(&app.args);
        // Without them in the config: the builder's route prefix and logging stay.
        let kept = apply_overrides(built.clone(), &app).unwrap();
        assert_eq!(kept.name.as_str(), "shop");
        assert_eq!(kept.route_prefix, built.route_prefix);
        assert_eq!(kept.logging, built.logging);
        assert_eq!(kept.ingress, built.ingress);
        app.route_prefix = RouteOverride::Prefix(RoutePrefix::new("/shop").unwrap());
        let debug = LoggingConfig {
            log_level: LogLevel::Debug,
            ..LoggingConfig::default()
        };
        app.logging_config = Some(debug.clone());
        let spec = apply_overrides(built.clone(), &app).unwrap();
        assert_eq!(spec.route_prefix.unwrap().as_str(), "/shop");
        assert_eq!(spec.logging, Some(debug));
        // `route_prefix: null`: no HTTP route, whatever the builder chose.
        assert!(built.route_prefix.is_some());
        app.route_prefix = RouteOverride::Off;
        assert_eq!(apply_overrides(built, &app).unwrap().route_prefix, None);
    }

    #[test]
    fn global_logging_is_inherited_by_applications_without_their_own() {
        let c = ServeConfig::from_yaml(
            "logging_config: {encoding: JSON}\napplications:\n  - name: a\n    import_path: x\n  - name: b\n    import_path: x\n    logging_config: {log_level: ERROR}\n",
        )
        .unwrap()
        .inherit_logging();
        assert_eq!(
            c.applications[0]
                .logging_config
                .as_ref()
                .map(|l| l.encoding),
            Some(crate::LogEncoding::Json)
        );
        assert_eq!(
            c.applications[1]
                .logging_config
                .as_ref()
                .map(|l| (l.log_level, l.encoding)),
            Some((LogLevel::Error, crate::LogEncoding::Text))
        );
    }

    #[test]
    fn an_override_for_a_missing_deployment_names_application_and_deployment() {
        let app = app("      - name: frnot\n        num_replicas: 2\n");
        let e = apply_overrides(shop_builder(&app.args), &app).unwrap_err();
        assert_eq!(e.app(), Some("shop"));
        assert_eq!(e.deployment(), Some("frnot"));
        let shown = e.to_string();
        assert!(shown.contains("'front', 'back'"), "{shown}");
    }

    #[test]
    fn the_result_is_validated_naming_application_and_deployment() {
        let mut app = app("      - name: back\n");
        app.deployments[0].autoscaling_config = Nullable::Set(AutoscalingOverride {
            min_replicas: Some(5),
            max_replicas: Some(2),
            ..AutoscalingOverride::default()
        });
        let e = apply_overrides(shop_builder(&app.args), &app).unwrap_err();
        assert_eq!((e.app(), e.deployment()), (Some("shop"), Some("back")));
        assert_eq!(e.field_name(), Some("autoscaling_config.min_replicas"));
        app.deployments[0].autoscaling_config = Nullable::Keep;
        app.deployments[0].health_check_period_s = Some(0.0);
        let e = apply_overrides(shop_builder(&app.args), &app).unwrap_err();
        assert_eq!(e.field_name(), Some("health_check_period_s"));
    }

    #[test]
    fn code_version_is_stable_and_follows_import_path_and_args() {
        let a = app("      - name: front\n");
        assert_eq!(a.code_version(), a.clone().code_version());
        // Pinned: the version must not drift across builds, machines or Rust versions.
        assert_eq!(a.code_version().as_str(), "hd7cc5d515c1d8547");
        // The config's other fields are not code.
        let mut tuned = a.clone();
        tuned.deployments[0].num_replicas = Some(NumReplicas::Fixed(9));
        tuned.route_prefix = RouteOverride::Prefix(RoutePrefix::new("/x").unwrap());
        assert_eq!(tuned.code_version(), a.code_version());
        // Args and import path are.
        let mut args = a.clone();
        args.args = Args::encode(&[("greeting", "hi"), ("n", "4")]).unwrap();
        assert_ne!(args.code_version(), a.code_version());
        let mut path = a.clone();
        path.import_path = "shop:other".try_into().unwrap();
        assert_ne!(path.code_version(), a.code_version());
        // Args encoded by hand in another key order hash as the parsed ones.
        #[derive(serde::Serialize)]
        struct Reordered {
            n: u32,
            greeting: &'static str,
        }
        let mut by_hand = a.clone();
        by_hand.args = Args::encode(&Reordered {
            n: 3,
            greeting: "hi",
        })
        .unwrap();
        assert_ne!(by_hand.args, a.args);
        assert_eq!(by_hand.code_version(), a.code_version());
    }
}
