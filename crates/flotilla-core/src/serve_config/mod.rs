//! The declarative config file format (Ray Serve's `ServeDeploySchema`); see
//! [`ServeConfig`] for the format and its rules.
//!
//! Every field of Ray's current schema (Ray 2.60: `ServeDeploySchema`,
//! `ServeApplicationSchema`, `DeploymentSchema`, `RayActorOptionsSchema`,
//! `AutoscalingConfig`, `AutoscalingPolicy`, `RequestRouterConfig`,
//! `BackpressureConfig`, `LoggingConfig`, `HTTPOptionsSchema`,
//! `gRPCOptionsSchema`, `ControllerOptions`, `TracingConfig`) is known here:
//! each is either read into the model (and applied, or kept for the stage that
//! applies it, or recorded and warned about), or refused with an error that names
//! it, its line and column, and says why it does not apply to Flotilla. The
//! module is split by schema: `app` (applications), `deployment`, `autoscaling`,
//! `http` (proxy, HTTP and gRPC options), `system` (controller and tracing
//! options), `logging`; `lax` reads numbers as Ray does, `warnings` lists what a
//! config asks for that Flotilla does not do, `suggest` names the nearest field
//! for a typo, `overrides` lays a config over a builder's spec, `parse` reads
//! YAML.

mod app;
mod autoscaling;
mod deployment;
mod http;
mod lax;
mod logging;
mod nullable;
mod overrides;
mod parse;
mod suggest;
mod system;
pub(crate) mod value;
mod warnings;
mod wide_ints;

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::{
    LoggingConfig,
    error::{Error, Location},
};

pub use app::{AppConfig, RouteOverride};
pub use autoscaling::AutoscalingOverride;
pub use deployment::{
    BackpressureOverride, DeploymentOverride, NumReplicas, RayActorOptions, RequestRouterOverride,
};
pub use http::{
    DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, DEFAULT_KEEP_ALIVE_TIMEOUT_S, GrpcOptions,
    HttpOptionError, HttpOptions, ProxyLocation,
};
pub use nullable::Nullable;
pub use overrides::apply_overrides;
pub use system::{ControllerOptions, ControllerRuntimeEnv, TracingConfig};
pub use warnings::ConfigWarning;

/// A whole config file (Ray Serve's `ServeDeploySchema`): which applications to
/// run, built by which registered application builder with which `args`, and
/// per-deployment overrides of the builder's settings. Applying it runs exactly
/// these applications among those deployed by config: one deployed by an earlier
/// config and missing here is deleted.
///
/// ```yaml
/// proxy_location: EveryNode                 # Disabled | HeadOnly | EveryNode
/// http_options: {port: 8000, request_timeout_s: 30}
/// grpc_options: {grpc_servicer_functions: []}   # must stay empty: no gRPC proxy
/// logging_config: {log_level: INFO}         # optional, for every application
/// applications:
///   - name: shop                            # default: "default", as Ray
///     route_prefix: /shop                   # optional: replaces the builder's
///     import_path: shop.builders:app        # an application builder in the Registry
///     args: {greeting: hello}               # optional: any value, given to the builder
///     runtime_env: {working_dir: "s3://b/x.zip"}  # accepted, applies nothing (warned)
///     logging_config: {encoding: JSON}      # optional: this application's logging
///     external_scaler_enabled: false        # true: counts set from outside
///     autoscaling_policy: {policy_function: shop.policies:coordinated}
///     take_over: false                      # optional: take over an imperative app
///     deployments:                          # optional overrides, by deployment name
///       - name: front
///         num_replicas: auto                # or a count; a count excludes autoscaling_config
///         autoscaling_config: {max_replicas: 8, aggregation_function: max}
///         max_ongoing_requests: 8
///         max_queued_requests: -1           # -1: unbounded
///         user_config: {threshold: 0.5}     # any value, given to `reconfigure`
///         health_check_period_s: 10
///         ray_actor_options: {num_cpus: 1, num_gpus: 0, memory: 0, resources: {x: 1}}
///         placement_group_bundles: [{CPU: 1}, {GPU: 1}]
///         placement_group_strategy: STRICT_PACK
///         request_router_config: {request_routing_stats_period_s: 10}
///         rolling_update_percentage: 0.2
/// ```
///
/// This module owns the format only: [`ServeConfig::from_yaml`] parses and validates
/// text (it reads no file), [`apply_overrides`] lays an application's overrides
/// over the spec its builder returned, [`AppConfig::code_version`] tells "same
/// code, apply the config only" from "rebuild", and [`ServeConfig::warnings`]
/// lists what the config asks for that Flotilla accepts but does not do (the
/// Controller logs them when it applies the config). The types are serde types:
/// through MessagePack (rmp-serde) they round-trip unchanged, so the last applied
/// config can be checkpointed; fields added after the first release default when
/// an older checkpoint lacks them. (Read YAML with `from_yaml`, not with serde
/// directly: it also validates and reports positions.)
///
/// Rules of the format, following Ray Serve 2.60 except where noted:
/// - **Unknown fields are errors**, at every level, and the error names the
///   nearest known field (Ray drops unknown fields silently in most classes: a
///   departure, decided, since a typo is worth catching). Fields Ray removed (a
///   deployment's `route_prefix`, `object_store_memory`, ...) are unknown too,
///   with a hint.
/// - **Ray's old names** `max_concurrent_queries` and
///   `target_num_ongoing_requests_per_replica` (gone from Ray since 2.34) are
///   read as `max_ongoing_requests` and `target_ongoing_requests`, with a
///   deprecation warning; giving both the old and the new name is an error.
///   `smoothing_factor`, `upscale_smoothing_factor` and
///   `downscale_smoothing_factor` are Ray's deprecated aliases of the factors,
///   folded with Ray's precedence (`upscaling_factor`, else
///   `upscale_smoothing_factor`, else `smoothing_factor`), also warned about.
/// - **Ray's single-application format** (a top-level `import_path`, no
///   `applications:`) is an error that says to wrap it under `applications:`.
/// - **Durations** are seconds, as numbers (fractions allowed), in fields named `*_s`.
/// - **Numbers** are read as Ray's pydantic reads them (lax mode): an integer
///   field takes `2`, `2.0`, `1.5e9` or `"2"`; a float field takes `"2.5"`.
///   `max_queued_requests` and `backpressure_config.status_code` are strict, as
///   in Ray; `num_replicas` takes `"2"` and `2.0` too, as Ray's
///   `Union[PositiveInt, str]` does. Departures: a fraction in an integer
///   field (`1.5`) is refused (Ray truncates it), and a boolean is never a
///   number (Ray reads `true` as 1). Log levels take Python's names
///   and numbers (`20` is `INFO`).
/// - `num_replicas` is a count or `"auto"`. A count together with
///   `autoscaling_config` is an error; `"auto"` with an `autoscaling_config` starts
///   from the `"auto"` defaults ([`auto_autoscaling_config`]: at most 100 replicas)
///   and takes the given fields. A count of 0 is accepted (Ray refuses it).
/// - `max_queued_requests: -1` means unbounded; otherwise it is at least 1.
/// - **Booleans are YAML 1.2's** (`true`/`false`): `yes`, `on`, `y` are text, so
///   `enable_access_log: yes` is an error (Ray reads YAML 1.1, where it is true).
/// - `args` and `user_config` take any YAML value (Ray: a mapping), stored as
///   canonical MessagePack ([`Args`](crate::Args)): every map sorted by key, so
///   the same text always gives the same bytes, and so do texts that differ only
///   in key order or spelling (`0x10` and `16`). A missing `args` is the empty map
///   (Ray's `{}`). An integer too wide for 64 bits is an error, at its place
///   (quote it to keep it as text): read as a float, it would change (PyYAML
///   keeps it exact). `runtime_env` and the `*_kwargs` fields must be mappings.
/// - `null` for a field is the same as leaving it out (Ray refuses `null` for
///   most non-optional fields), except where Ray gives it a meaning over the
///   code's value ([`Nullable`]): an application's `route_prefix: null`
///   removes its HTTP route, a deployment's `autoscaling_config: null` turns
///   the code's autoscaling off and `user_config: null` drops the code's, as
///   in Ray (left out, the builder's stands). A deployment's
///   `max_replicas_per_node`, `placement_group_*` and `logging_config` read
///   `null` as left out (Ray: none, over the code's; a departure).
/// - An application's `name` defaults to `"default"`, as in Ray; two
///   applications without a `route_prefix` do not collide (in Ray both count as
///   `/`). Duplicate deployment overrides are an error (Ray applies them in
///   order).
/// - Duplicate keys, several documents in one text, and YAML nested deeper than 64
///   levels are errors.
///
/// What each field becomes is documented on the field. Refused, each with its
/// reason: a non-empty `grpc_options.grpc_servicer_functions` (no gRPC proxy),
/// `target_capacity` other than `null` or 100 (no capacity scaling), an
/// application's `host`/`port` (Ray refuses them in this format too), and a
/// deployment's `gang_scheduling_config` (no gang scheduling), non-empty
/// `deployment_actors` (no deployment-scoped actors), and label selectors
/// (`placement_group_bundle_label_selector`, `ray_actor_options.label_selector`,
/// `ray_actor_options.fallback_strategy`: nodes carry no labels).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Where the HTTP proxies run (Ray's default: `EveryNode`). Kept for the
    /// HTTP proxy, which it drives.
    #[serde(default, deserialize_with = "null_as_default")]
    pub proxy_location: ProxyLocation,
    /// The HTTP proxy's options, validated as Ray validates them; kept for the
    /// HTTP proxy, which they drive.
    #[serde(default, deserialize_with = "null_as_default")]
    pub http_options: HttpOptions,
    /// The gRPC proxy's options: Flotilla has no gRPC proxy, so only an empty
    /// `grpc_servicer_functions` (Ray's "no gRPC server") is accepted; kept as
    /// given.
    #[serde(default, deserialize_with = "null_as_default")]
    pub grpc_options: GrpcOptions,
    /// Ray's options for its controller actor: validated as Ray does and kept,
    /// but Flotilla's controller runs in this process and applies none of them
    /// (a warning says so).
    #[serde(default)]
    pub controller_options: Option<ControllerOptions>,
    /// Logging for every application that has no `logging_config` of its own.
    #[serde(default, deserialize_with = "logging::logging_option")]
    pub logging_config: Option<LoggingConfig>,
    /// Ray's tracing options: validated and kept; Flotilla exports no traces, so
    /// an enabled tracing config is warned about.
    #[serde(default)]
    pub tracing_config: Option<TracingConfig>,
    /// The applications, in file order.
    pub applications: Vec<AppConfig>,
    /// Ray's capacity scaling, in percent (0 to 100). Flotilla does not scale
    /// deployments by a target capacity: `null` and 100 (full capacity, which
    /// changes nothing) are accepted, any other value is refused.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub target_capacity: Option<f64>,
}

/// The autoscaling config `num_replicas: "auto"` starts from: Ray's
/// `AutoscalingConfig.default()`, that is the class defaults with
/// `max_replicas = 100` (and `min_replicas = 1`, `target_ongoing_requests = 2`).
pub fn auto_autoscaling_config() -> crate::AutoscalingConfig {
    crate::AutoscalingConfig {
        max_replicas: 100,
        ..crate::AutoscalingConfig::default()
    }
}

/// Where in a config an error was found, for finding its line in the file:
/// indexes into `applications` and the application's `deployments`, and the field
/// (dotted for nested fields) relative to the innermost of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Site {
    pub(crate) app: Option<usize>,
    pub(crate) deployment: Option<usize>,
    pub(crate) field: Option<&'static str>,
}

/// An error and where it is.
pub(crate) type Sited = Box<(Error, Site)>;

/// `error` at the top-level field `field`.
fn top(error: Error, field: &'static str) -> Sited {
    Box::new((
        error,
        Site {
            field: Some(field),
            ..Site::default()
        },
    ))
}

impl ServeConfig {
    /// A config running `applications`, every other setting at Ray's default.
    pub fn new(applications: Vec<AppConfig>) -> Self {
        ServeConfig {
            proxy_location: ProxyLocation::default(),
            http_options: HttpOptions::default(),
            grpc_options: GrpcOptions::default(),
            controller_options: None,
            logging_config: None,
            tracing_config: None,
            applications,
            target_capacity: None,
        }
    }

    /// Check the whole config: application names unique, route prefixes unique,
    /// deployment overrides unique per application, `num_replicas` and
    /// `autoscaling_config` not both a count and a config, every value in range,
    /// and no refused field set. Names, route prefixes and import paths are valid
    /// by construction. The error names the application, the deployment and the
    /// field (as in the file).
    ///
    /// [`from_yaml`](Self::from_yaml) runs this already, adding line and column.
    pub fn validate(&self) -> Result<(), Error> {
        self.check().map_err(|b| b.0)
    }

    /// [`validate`](Self::validate), also telling where the error is.
    pub(crate) fn check(&self) -> Result<(), Sited> {
        self.http_options.check()?;
        self.grpc_options.check()?;
        if let Some(c) = &self.controller_options {
            c.check()?;
        }
        if let Some(t) = &self.tracing_config {
            t.check()?;
        }
        if let Some(l) = &self.logging_config {
            l.validate().map_err(|e| {
                let field = e.field_name().unwrap_or("logging_config");
                top(e, field)
            })?;
        }
        if let Some(tc) = self.target_capacity {
            check_target_capacity(tc)?;
        }
        let mut names: HashMap<&str, usize> = HashMap::with_capacity(self.applications.len());
        let mut prefixes: HashMap<&str, &str> = HashMap::with_capacity(self.applications.len());
        for (i, app) in self.applications.iter().enumerate() {
            let name = app.name.as_str();
            let site = |field| Site {
                app: Some(i),
                deployment: None,
                field: Some(field),
            };
            if let Some(first) = names.insert(name, i) {
                return Err(Box::new((
                    app_field(
                        name,
                        "name",
                        format!(
                            "application name '{name}' appears twice (applications #{} and #{})",
                            first + 1,
                            i + 1
                        ),
                    ),
                    site("name"),
                )));
            }
            if let Some(prefix) = app.route_prefix.prefix()
                && let Some(other) = prefixes.insert(prefix.as_str(), name)
            {
                return Err(Box::new((
                    app_field(
                        name,
                        "route_prefix",
                        format!("route prefix '{prefix}' is also used by application '{other}'"),
                    ),
                    site("route_prefix"),
                )));
            }
            for (j, d) in app.deployments.iter().enumerate() {
                d.check_amounts().map_err(|e| {
                    let field = e.field_name();
                    Box::new((
                        e.at(Some(name), Some(d.name.as_str())),
                        Site {
                            app: Some(i),
                            deployment: Some(j),
                            field,
                        },
                    ))
                })?;
            }
            app.check().map_err(|b| {
                let (e, s) = *b;
                Box::new((e, Site { app: Some(i), ..s }))
            })?;
        }
        Ok(())
    }

    /// Give every application without a `logging_config` of its own the global one,
    /// as Ray does when it applies a config.
    pub fn inherit_logging(mut self) -> Self {
        if let Some(global) = &self.logging_config {
            for app in &mut self.applications {
                if app.logging_config.is_none() {
                    app.logging_config = Some(global.clone());
                }
            }
        }
        self
    }

    /// The application named `name` (a scan: a caller that looks up many
    /// names takes [`by_name`](Self::by_name) once).
    pub fn application(&self, name: &str) -> Option<&AppConfig> {
        self.applications.iter().find(|a| a.name.as_str() == name)
    }

    /// Its applications by name (names are unique in a validated config; of
    /// a repeated one, the first).
    pub fn by_name(&self) -> std::collections::HashMap<&str, &AppConfig> {
        let mut map = std::collections::HashMap::with_capacity(self.applications.len());
        for a in &self.applications {
            map.entry(a.name.as_str()).or_insert(a);
        }
        map
    }
}

fn check_target_capacity(tc: f64) -> Result<(), Sited> {
    let refuse = |reason: String| {
        top(
            Error::InvalidField {
                at: Location::default(),
                field: "target_capacity",
                reason,
            },
            "target_capacity",
        )
    };
    if !(0.0..=100.0).contains(&tc) {
        return Err(refuse(format!(
            "must be a percentage from 0 to 100 (or null), got {tc}"
        )));
    }
    if tc != 100.0 {
        return Err(refuse(format!(
            "Flotilla does not scale deployments by a target capacity (Ray's capacity \
             scaling for incremental upgrades): only null or 100 (the full capacity, which \
             changes nothing) apply, got {tc}"
        )));
    }
    Ok(())
}

pub(crate) fn location(app: &str, deployment: Option<&str>) -> Location {
    Location {
        app: Some(app.to_owned()),
        deployment: deployment.map(str::to_owned),
    }
}

pub(crate) fn app_field(app: &str, field: &'static str, reason: String) -> Error {
    Error::InvalidField {
        at: location(app, None),
        field,
        reason,
    }
}

pub(crate) fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

pub(crate) fn null_as_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
