//! What a valid config asks for that Flotilla accepts and does not do, as data:
//! core does no I/O, so the Controller logs these when it applies the config.

use std::fmt;

use crate::{AppName, AutoscalingPolicy, DeploymentName, is_builtin_policy, is_builtin_router};

use super::{AppConfig, DeploymentOverride, ServeConfig, value};

/// One thing a config asks for that Flotilla accepts but does not do, or a
/// deprecated spelling it reads. [`ServeConfig::warnings`] lists them; each
/// application has at most one [`RuntimeEnvNotApplied`](Self::RuntimeEnvNotApplied).
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigWarning {
    /// The application (or one of its deployments, in
    /// `ray_actor_options.runtime_env`) has a Python `runtime_env`: compiled code
    /// has none, so none of these keys applies. The value is kept in the applied
    /// config.
    RuntimeEnvNotApplied {
        /// The application.
        app: AppName,
        /// The keys given (`working_dir`, `pip`, `env_vars`, ...), sorted.
        keys: Vec<String>,
    },
    /// A deprecated name of a field was used: it was read as its current name.
    DeprecatedField {
        /// The application.
        app: AppName,
        /// The deployment.
        deployment: DeploymentName,
        /// The name used, as in the file (`max_concurrent_queries`,
        /// `autoscaling_config.smoothing_factor`, ...).
        field: &'static str,
        /// The current name(s) it stands for.
        instead: &'static str,
    },
    /// `autoscaling_config.metrics_interval_s` was given other than Ray's
    /// default, 10 s: Ray deprecated it, and Flotilla samples load on its own
    /// period, so it changes nothing.
    MetricsIntervalIgnored {
        /// The application.
        app: AppName,
        /// The deployment.
        deployment: DeploymentName,
        /// The value given, in seconds.
        seconds: f64,
    },
    /// A deployment gives an autoscaling policy and its application gives one
    /// too: the application's wins (Ray's rule and warning).
    ApplicationPolicyWins {
        /// The application.
        app: AppName,
        /// The deployment whose own policy is not used.
        deployment: DeploymentName,
    },
    /// A placement group bundle reserves `object_store_memory`: Flotilla has no
    /// object store, so the amount is dropped (Ray warns about it too).
    ObjectStoreMemoryIgnored {
        /// The application.
        app: AppName,
        /// The deployment.
        deployment: DeploymentName,
    },
    /// `request_router_config` sets routing-stats or retry-backoff fields:
    /// Flotilla's replicas record no routing stats (routers read their live
    /// counters), and a handle with no replica free waits for a slot by
    /// notification instead of backing off, so these change nothing.
    RouterSettingsWithoutEffect {
        /// The application.
        app: AppName,
        /// The deployment.
        deployment: DeploymentName,
        /// The fields given, in the schema's order
        /// (`request_router_config.request_routing_stats_period_s`, ...).
        fields: Vec<&'static str>,
    },
    /// `policy_kwargs` were given with the built-in autoscaling policy (a path
    /// in [`BUILTIN_AUTOSCALING_POLICIES`](crate::BUILTIN_AUTOSCALING_POLICIES),
    /// Ray's default included), which takes no kwargs: they change nothing.
    PolicyKwargsWithoutEffect {
        /// The application.
        app: AppName,
        /// The deployment, for its `autoscaling_config.policy`; `None` for the
        /// application's `autoscaling_policy`.
        deployment: Option<DeploymentName>,
        /// The kwargs' keys, sorted.
        keys: Vec<String>,
    },
    /// `request_router_config.request_router_kwargs` were given with the
    /// built-in router (the class left out, or a path in
    /// [`BUILTIN_REQUEST_ROUTERS`](crate::BUILTIN_REQUEST_ROUTERS)), which takes
    /// no kwargs: they change nothing (Ray's default router ignores them too).
    RouterKwargsWithoutEffect {
        /// The application.
        app: AppName,
        /// The deployment.
        deployment: DeploymentName,
        /// The kwargs' keys, sorted.
        keys: Vec<String>,
    },
    /// `controller_options` were given: Flotilla's controller runs in this
    /// process, so its environment variables are the process's own; none is set.
    ControllerOptionsNotApplied {
        /// The environment variables given, by name.
        env_vars: Vec<String>,
    },
    /// `tracing_config` asks for traces to be exported: Flotilla exports none
    /// (its events go to the program's `tracing` subscriber).
    TracingNotExported,
}

impl ConfigWarning {
    /// The application the warning is about (`None` for the whole config).
    pub fn app(&self) -> Option<&AppName> {
        match self {
            ConfigWarning::RuntimeEnvNotApplied { app, .. }
            | ConfigWarning::DeprecatedField { app, .. }
            | ConfigWarning::MetricsIntervalIgnored { app, .. }
            | ConfigWarning::ApplicationPolicyWins { app, .. }
            | ConfigWarning::ObjectStoreMemoryIgnored { app, .. }
            | ConfigWarning::RouterSettingsWithoutEffect { app, .. }
            | ConfigWarning::RouterKwargsWithoutEffect { app, .. }
            | ConfigWarning::PolicyKwargsWithoutEffect { app, .. } => Some(app),
            ConfigWarning::ControllerOptionsNotApplied { .. }
            | ConfigWarning::TracingNotExported => None,
        }
    }

    /// The deployment the warning is about, if it is about one.
    pub fn deployment(&self) -> Option<&DeploymentName> {
        match self {
            ConfigWarning::DeprecatedField { deployment, .. }
            | ConfigWarning::MetricsIntervalIgnored { deployment, .. }
            | ConfigWarning::ApplicationPolicyWins { deployment, .. }
            | ConfigWarning::ObjectStoreMemoryIgnored { deployment, .. }
            | ConfigWarning::RouterSettingsWithoutEffect { deployment, .. }
            | ConfigWarning::RouterKwargsWithoutEffect { deployment, .. } => Some(deployment),
            ConfigWarning::PolicyKwargsWithoutEffect { deployment, .. } => deployment.as_ref(),
            _ => None,
        }
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::RuntimeEnvNotApplied { app, keys } => write!(
                f,
                "application '{app}': runtime_env sets up a Python environment, which compiled \
                 code does not have; not applied: {}",
                keys.join(", ")
            ),
            ConfigWarning::DeprecatedField {
                app,
                deployment,
                field,
                instead,
            } => write!(
                f,
                "application '{app}', deployment '{deployment}': `{field}` is deprecated; it \
                 was read as `{instead}`, write that instead"
            ),
            ConfigWarning::MetricsIntervalIgnored {
                app,
                deployment,
                seconds,
            } => write!(
                f,
                "application '{app}', deployment '{deployment}': \
                 autoscaling_config.metrics_interval_s ({seconds}) is deprecated in Ray and \
                 changes nothing: Flotilla samples load on its own period"
            ),
            ConfigWarning::ApplicationPolicyWins { app, deployment } => write!(
                f,
                "application '{app}', deployment '{deployment}': both a deployment-level and \
                 an application-level autoscaling policy are given; the application-level \
                 policy takes precedence"
            ),
            ConfigWarning::ObjectStoreMemoryIgnored { app, deployment } => write!(
                f,
                "application '{app}', deployment '{deployment}': a placement group bundle \
                 reserves object_store_memory; Flotilla has no object store, so it is dropped"
            ),
            ConfigWarning::RouterSettingsWithoutEffect {
                app,
                deployment,
                fields,
            } => write!(
                f,
                "application '{app}', deployment '{deployment}': {} (no effect): Flotilla's \
                 routers read replicas' live counters (no routing stats are recorded) and a \
                 request waits for a free replica by notification (no retry backoff)",
                fields.join(", ")
            ),
            ConfigWarning::RouterKwargsWithoutEffect {
                app,
                deployment,
                keys,
            } => write!(
                f,
                "application '{app}', deployment '{deployment}': \
                 request_router_config.request_router_kwargs ({}) given to the built-in request \
                 router, which takes no kwargs: they change nothing (name a router registered \
                 in the Registry to use them)",
                keys.join(", ")
            ),
            ConfigWarning::PolicyKwargsWithoutEffect {
                app,
                deployment,
                keys,
            } => {
                match deployment {
                    Some(d) => write!(
                        f,
                        "application '{app}', deployment '{d}': \
                         autoscaling_config.policy.policy_kwargs"
                    )?,
                    None => write!(f, "application '{app}': autoscaling_policy.policy_kwargs")?,
                }
                write!(
                    f,
                    " ({}) given to the built-in autoscaling policy, which takes no kwargs: \
                     they change nothing (name a policy registered in the Registry to use them)",
                    keys.join(", ")
                )
            }
            ConfigWarning::ControllerOptionsNotApplied { env_vars } => write!(
                f,
                "controller_options: Flotilla's controller runs in this process, so these \
                 environment variables are not set for it (set them on the process): [{}]",
                env_vars.join(", ")
            ),
            ConfigWarning::TracingNotExported => f.write_str(
                "tracing_config: Flotilla exports no traces; its events go to the program's \
                 tracing subscriber",
            ),
        }
    }
}

impl ServeConfig {
    /// What this config asks for that Flotilla accepts but does not do, and the
    /// deprecated names it uses: the whole config's first, then each
    /// application's ([`AppConfig::warnings`]) in file order. The Controller logs
    /// them when it applies the config; nothing here does I/O.
    pub fn warnings(&self) -> Vec<ConfigWarning> {
        let mut out = Vec::new();
        if let Some(c) = &self.controller_options {
            out.push(ConfigWarning::ControllerOptionsNotApplied {
                env_vars: c.env_vars().into_iter().map(str::to_owned).collect(),
            });
        }
        if self
            .tracing_config
            .as_ref()
            .is_some_and(|t| t.wants_export())
        {
            out.push(ConfigWarning::TracingNotExported);
        }
        for app in &self.applications {
            out.extend(app.warnings());
        }
        out
    }
}

impl AppConfig {
    /// This application's warnings (see [`ServeConfig::warnings`]): at most one
    /// about its runtime environments, then the application-level autoscaling
    /// policy's, then its deployments' in file order.
    pub fn warnings(&self) -> Vec<ConfigWarning> {
        let mut out = Vec::new();
        let keys = self.runtime_env_keys();
        if !keys.is_empty() {
            out.push(ConfigWarning::RuntimeEnvNotApplied {
                app: self.name.clone(),
                keys,
            });
        }
        if let Some(keys) = self.autoscaling_policy.as_ref().and_then(unused_kwargs) {
            out.push(ConfigWarning::PolicyKwargsWithoutEffect {
                app: self.name.clone(),
                deployment: None,
                keys,
            });
        }
        for d in &self.deployments {
            deployment_warnings(self, d, &mut out);
        }
        out
    }
}

fn deployment_warnings(app: &AppConfig, d: &DeploymentOverride, out: &mut Vec<ConfigWarning>) {
    let deprecated = |field, instead| ConfigWarning::DeprecatedField {
        app: app.name.clone(),
        deployment: d.name.clone(),
        field,
        instead,
    };
    if d.max_concurrent_queries.is_some() {
        out.push(deprecated("max_concurrent_queries", "max_ongoing_requests"));
    }
    if let Some(a) = d.autoscaling_config.given() {
        for (given, field, instead) in [
            (
                a.target_num_ongoing_requests_per_replica.is_some(),
                "autoscaling_config.target_num_ongoing_requests_per_replica",
                "autoscaling_config.target_ongoing_requests",
            ),
            // At its default (1.0, which `serve build` writes out) it
            // changes nothing: not worth a warning.
            (
                a.smoothing_factor.is_some_and(|f| f != 1.0),
                "autoscaling_config.smoothing_factor",
                "autoscaling_config.upscaling_factor and downscaling_factor",
            ),
            (
                a.upscale_smoothing_factor.is_some(),
                "autoscaling_config.upscale_smoothing_factor",
                "autoscaling_config.upscaling_factor",
            ),
            (
                a.downscale_smoothing_factor.is_some(),
                "autoscaling_config.downscale_smoothing_factor",
                "autoscaling_config.downscaling_factor",
            ),
        ] {
            if given {
                out.push(deprecated(field, instead));
            }
        }
        // Ray warns only off its default (10 s, which `serve build` writes
        // out).
        if let Some(seconds) = a.metrics_interval_s.filter(|s| *s != 10.0) {
            out.push(ConfigWarning::MetricsIntervalIgnored {
                app: app.name.clone(),
                deployment: d.name.clone(),
                seconds,
            });
        }
        if a.policy.is_some() && app.autoscaling_policy.is_some() {
            out.push(ConfigWarning::ApplicationPolicyWins {
                app: app.name.clone(),
                deployment: d.name.clone(),
            });
        }
        if let Some(keys) = a.policy.as_ref().and_then(unused_kwargs) {
            out.push(ConfigWarning::PolicyKwargsWithoutEffect {
                app: app.name.clone(),
                deployment: Some(d.name.clone()),
                keys,
            });
        }
    }
    if let Some(r) = &d.request_router_config {
        let fields: Vec<&'static str> = [
            (
                r.request_routing_stats_period_s.is_some(),
                "request_router_config.request_routing_stats_period_s",
            ),
            (
                r.request_routing_stats_timeout_s.is_some(),
                "request_router_config.request_routing_stats_timeout_s",
            ),
            (
                r.initial_backoff_s.is_some(),
                "request_router_config.initial_backoff_s",
            ),
            (
                r.backoff_multiplier.is_some(),
                "request_router_config.backoff_multiplier",
            ),
            (
                r.max_backoff_s.is_some(),
                "request_router_config.max_backoff_s",
            ),
        ]
        .into_iter()
        .filter_map(|(given, field)| given.then_some(field))
        .collect();
        if !fields.is_empty() {
            out.push(ConfigWarning::RouterSettingsWithoutEffect {
                app: app.name.clone(),
                deployment: d.name.clone(),
                fields,
            });
        }
        let builtin = r
            .request_router_class
            .as_ref()
            .is_none_or(|c| is_builtin_router(c.as_str()));
        if let Some(kwargs) = r
            .request_router_kwargs
            .as_ref()
            .filter(|k| !value::is_empty(k))
            && builtin
        {
            out.push(ConfigWarning::RouterKwargsWithoutEffect {
                app: app.name.clone(),
                deployment: d.name.clone(),
                keys: value::map_keys(kwargs),
            });
        }
    }
    if d.placement_group_bundles
        .iter()
        .flatten()
        .any(|b| b.contains_key("object_store_memory"))
    {
        out.push(ConfigWarning::ObjectStoreMemoryIgnored {
            app: app.name.clone(),
            deployment: d.name.clone(),
        });
    }
}

/// The keys of `policy`'s kwargs if it is the built-in policy and they are not
/// empty: the built-in policy reads no kwargs.
fn unused_kwargs(policy: &AutoscalingPolicy) -> Option<Vec<String>> {
    (is_builtin_policy(policy.policy_function.as_str()) && !value::is_empty(&policy.policy_kwargs))
        .then(|| value::map_keys(&policy.policy_kwargs))
}
