//! The declarative config file format (Ray Serve's `ServeDeploySchema`); see
//! [`ServeConfig`] for the format and its rules.

mod overrides;
mod parse;
mod value;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{
    AppName, Args, CodeVersion, DeploymentConfig, DeploymentName, ImportPath, LogEncoding,
    LogLevel, LoggingConfig, RoutePrefix,
    error::{Error, Location},
    stable_hash,
};

pub use overrides::apply_overrides;

/// A whole config file (Ray Serve's `ServeDeploySchema`): which applications to
/// run, built by which registered application builder with which `args`, and
/// per-deployment overrides of the builder's settings. Applying it runs exactly
/// these applications among those deployed by config: one deployed by an earlier
/// config and missing here is deleted.
///
/// ```yaml
/// logging_config: {log_level: INFO}        # optional, for every application
/// applications:
///   - name: shop
///     route_prefix: /shop                   # optional: replaces the builder's
///     import_path: shop.builders:app        # an application builder in the Registry
///     args: {greeting: hello}               # optional: any value, given to the builder
///     logging_config: {encoding: JSON}      # optional: this application's logging
///     take_over: false                      # optional: take over an imperative app
///     deployments:                          # optional overrides, by deployment name
///       - name: front
///         num_replicas: auto                # or a count; a count excludes autoscaling_config
///         autoscaling_config: {max_replicas: 8}
///         max_ongoing_requests: 8
///         max_queued_requests: -1           # -1: unbounded
///         user_config: {threshold: 0.5}     # any value, given to `reconfigure`
///         health_check_period_s: 10
///         health_check_timeout_s: 30
///         graceful_shutdown_wait_loop_s: 2
///         graceful_shutdown_timeout_s: 20
///         ray_actor_options: {num_cpus: 1, num_gpus: 0, memory: 0, resources: {x: 1}}
/// ```
///
/// This module owns the format only: [`ServeConfig::from_yaml`] parses and validates
/// text (it reads no file), [`apply_overrides`] lays an application's overrides
/// over the spec its builder returned, and [`AppConfig::code_version`] tells "same
/// code, apply the config only" from "rebuild". The types are serde types: through
/// MessagePack (rmp-serde) they round-trip unchanged, so the last applied config can
/// be checkpointed. (Read YAML with `from_yaml`, not with serde directly: it also
/// validates and reports positions.)
///
/// Rules of the format, following Ray Serve:
/// - Unknown fields are errors, at every level: a typo is never silently ignored.
/// - Durations are seconds, as numbers (fractions allowed), in fields named `*_s`.
/// - `num_replicas` is a count or `"auto"`. A count together with
///   `autoscaling_config` is an error; `"auto"` with an `autoscaling_config` starts
///   from the `"auto"` defaults ([`auto_autoscaling_config`]: at most 100 replicas)
///   and takes the given fields.
/// - `max_queued_requests: -1` means unbounded; otherwise it is at least 1.
/// - Booleans are YAML 1.2's (`true`/`false`): `yes`, `on`, `y` are text.
/// - `args` and `user_config` take any YAML value, stored as canonical MessagePack
///   ([`Args`]): every map sorted by key, so the same text always gives the same
///   bytes, and so do texts that differ only in key order or spelling (`0x10` and
///   `16`). A missing `args` is the empty map (Ray's `{}`).
/// - `null` for an optional field is the same as leaving it out.
/// - Duplicate keys, several documents in one text, and YAML nested deeper than 64
///   levels are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Logging for every application that has no `logging_config` of its own.
    #[serde(default, deserialize_with = "logging_option")]
    pub logging_config: Option<LoggingConfig>,
    /// The applications, in file order.
    pub applications: Vec<AppConfig>,
}

/// One application of a [`ServeConfig`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// Unique within the config.
    pub name: AppName,
    /// Replaces the route prefix the builder chose; unique within the config.
    /// Validated as Ray validates it (see [`RoutePrefix`]), never rewritten.
    #[serde(default, deserialize_with = "route_prefix_option")]
    pub route_prefix: Option<RoutePrefix>,
    /// The application builder's name in the `Registry`.
    pub import_path: ImportPath,
    /// What the builder is called with: any value, as canonical MessagePack.
    #[serde(default = "empty_map", with = "value::args_field")]
    pub args: Args,
    /// This application's logging, instead of the global one.
    #[serde(default, deserialize_with = "logging_option")]
    pub logging_config: Option<LoggingConfig>,
    /// Take over an application of the same name that was deployed imperatively
    /// (by `run`); without it, that is an error.
    #[serde(default)]
    pub take_over: bool,
    /// Overrides of the builder's deployments, by deployment name.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub deployments: Vec<DeploymentOverride>,
}

/// `num_replicas` in a config file: a count, or `"auto"` for autoscaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumReplicas {
    /// A fixed count.
    Fixed(u32),
    /// Autoscale, with Ray's `"auto"` defaults (see [`auto_autoscaling_config`]).
    Auto,
}

/// Overrides of one deployment's settings: every field given wins over the
/// builder's; every field left out keeps the builder's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentOverride {
    /// The deployment, as the builder names it.
    pub name: DeploymentName,
    /// A fixed count or `"auto"`; a count excludes `autoscaling_config`.
    #[serde(default)]
    pub num_replicas: Option<NumReplicas>,
    /// Autoscale with these settings; fields left out take Ray's defaults (not the
    /// builder's), as in Ray.
    #[serde(default)]
    pub autoscaling_config: Option<AutoscalingOverride>,
    /// Concurrent requests one replica runs at most (at least 1).
    #[serde(default)]
    pub max_ongoing_requests: Option<u32>,
    /// Requests a handle queues before rejecting: -1 for unbounded, else at least 1.
    #[serde(default)]
    pub max_queued_requests: Option<i64>,
    /// Passed to every replica's `reconfigure`: any value.
    #[serde(default, with = "value::args_field::option")]
    pub user_config: Option<Args>,
    /// Seconds between health checks (> 0).
    #[serde(default)]
    pub health_check_period_s: Option<f64>,
    /// Seconds after which a health check fails (> 0).
    #[serde(default)]
    pub health_check_timeout_s: Option<f64>,
    /// Seconds between a stopping replica's idleness checks (> 0).
    #[serde(default)]
    pub graceful_shutdown_wait_loop_s: Option<f64>,
    /// Seconds after which a stopping replica is killed (>= 0).
    #[serde(default)]
    pub graceful_shutdown_timeout_s: Option<f64>,
    /// What one replica reserves; replaces the builder's resources whole, with
    /// Ray's defaults (1 CPU) for the fields left out.
    #[serde(default)]
    pub ray_actor_options: Option<RayActorOptions>,
}

/// `autoscaling_config` in a config file: Ray's `AutoscalingConfig` fields, in
/// seconds. A field left out takes its default ([`crate::AutoscalingConfig::default`],
/// or [`auto_autoscaling_config`] under `num_replicas: auto`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalingOverride {
    /// Fewest replicas.
    #[serde(default)]
    pub min_replicas: Option<u32>,
    /// Most replicas.
    #[serde(default)]
    pub max_replicas: Option<u32>,
    /// Replicas at first deploy.
    #[serde(default)]
    pub initial_replicas: Option<u32>,
    /// Ongoing requests per replica the policy aims for.
    #[serde(default)]
    pub target_ongoing_requests: Option<f64>,
    /// Seconds an upscale decision must persist.
    #[serde(default)]
    pub upscale_delay_s: Option<f64>,
    /// Seconds a downscale decision must persist.
    #[serde(default)]
    pub downscale_delay_s: Option<f64>,
    /// Multiplier on each upscale step.
    #[serde(default)]
    pub upscaling_factor: Option<f64>,
    /// Multiplier on each downscale step.
    #[serde(default)]
    pub downscaling_factor: Option<f64>,
    /// Seconds over which load is averaged.
    #[serde(default)]
    pub look_back_period_s: Option<f64>,
}

/// `ray_actor_options` in a config file: the resources one replica reserves.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RayActorOptions {
    /// Logical CPUs (default 1).
    #[serde(default)]
    pub num_cpus: Option<f64>,
    /// GPUs (default 0).
    #[serde(default)]
    pub num_gpus: Option<f64>,
    /// Memory in bytes (default 0).
    #[serde(default)]
    pub memory: Option<u64>,
    /// Custom resources by name.
    #[serde(default)]
    pub resources: Option<BTreeMap<String, f64>>,
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

impl ServeConfig {
    /// Check the whole config: application names unique, route prefixes unique,
    /// deployment overrides unique per application, `num_replicas` and
    /// `autoscaling_config` not both a count and a config, and every value in range.
    /// Names, route prefixes and import paths are valid by construction. The error
    /// names the application, the deployment and the field (as in the file).
    ///
    /// [`from_yaml`](Self::from_yaml) runs this already, adding line and column.
    pub fn validate(&self) -> Result<(), Error> {
        self.check().map_err(|b| b.0)
    }

    /// [`validate`](Self::validate), also telling where the error is.
    pub(crate) fn check(&self) -> Result<(), Box<(Error, Site)>> {
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
            if let Some(prefix) = &app.route_prefix
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

    /// The application named `name`.
    pub fn application(&self, name: &str) -> Option<&AppConfig> {
        self.applications.iter().find(|a| a.name.as_str() == name)
    }
}

impl AppConfig {
    /// A config for application `name` built by the builder registered as
    /// `import_path`, with no args (the empty map) and no overrides.
    pub fn new(name: AppName, import_path: ImportPath) -> Self {
        AppConfig {
            name,
            route_prefix: None,
            import_path,
            args: empty_map(),
            logging_config: None,
            take_over: false,
            deployments: Vec::new(),
        }
    }

    /// The application's config-level code version: a stable hash of its import
    /// path and (canonical) args, as Ray's `get_app_code_version` hashes import
    /// path, runtime env and args. Equal to the running target's: apply the config
    /// to the built spec again ([`apply_overrides`]) without rebuilding. Different:
    /// run the builder again.
    pub fn code_version(&self) -> CodeVersion {
        let args = value::canonical_bytes(&self.args);
        let mut bytes = Vec::with_capacity(self.import_path.as_str().len() + args.len() + 9);
        bytes.extend_from_slice(b"app-code\0");
        bytes.extend_from_slice(self.import_path.as_str().as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(&args);
        CodeVersion::hashed(stable_hash(&bytes))
    }

    /// The override for deployment `name`.
    pub fn deployment(&self, name: &str) -> Option<&DeploymentOverride> {
        self.deployments.iter().find(|d| d.name.as_str() == name)
    }

    fn check(&self) -> Result<(), Box<(Error, Site)>> {
        let app = self.name.as_str();
        let mut seen = HashMap::with_capacity(self.deployments.len());
        for (j, d) in self.deployments.iter().enumerate() {
            let dep = d.name.as_str();
            let site = |field| Site {
                app: None,
                deployment: Some(j),
                field,
            };
            if let Some(first) = seen.insert(dep, j) {
                return Err(Box::new((
                    Error::InvalidField {
                        at: location(app, Some(dep)),
                        field: "name",
                        reason: format!(
                            "deployment '{dep}' has two overrides (#{} and #{})",
                            first + 1,
                            j + 1
                        ),
                    },
                    site(Some("name")),
                )));
            }
            d.apply_to(DeploymentConfig::default())
                .and_then(|c| c.validate().map_err(overrides::config_field_names))
                .map_err(|e| {
                    let field = e.field_name();
                    Box::new((e.at(Some(app), Some(dep)), site(field)))
                })?;
        }
        Ok(())
    }
}

impl DeploymentOverride {
    /// An override of deployment `name` that changes nothing yet.
    pub fn new(name: DeploymentName) -> Self {
        DeploymentOverride {
            name,
            num_replicas: None,
            autoscaling_config: None,
            max_ongoing_requests: None,
            max_queued_requests: None,
            user_config: None,
            health_check_period_s: None,
            health_check_timeout_s: None,
            graceful_shutdown_wait_loop_s: None,
            graceful_shutdown_timeout_s: None,
            ray_actor_options: None,
        }
    }
}

fn location(app: &str, deployment: Option<&str>) -> Location {
    Location {
        app: Some(app.to_owned()),
        deployment: deployment.map(str::to_owned),
    }
}

fn app_field(app: &str, field: &'static str, reason: String) -> Error {
    Error::InvalidField {
        at: location(app, None),
        field,
        reason,
    }
}

/// Ray's default `args`: the empty map.
fn empty_map() -> Args {
    Args::from_msgpack(vec![0x80])
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
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<NumReplicas, E> {
                if v == "auto" {
                    Ok(NumReplicas::Auto)
                } else {
                    Err(E::custom(format!(
                        "num_replicas must be an integer or \"auto\", got {v:?}"
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `logging_config` with every field optional (Ray's defaults for the missing ones)
/// and unknown fields rejected.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PartialLogging {
    #[serde(default)]
    log_level: Option<LogLevel>,
    #[serde(default)]
    encoding: Option<LogEncoding>,
    #[serde(default)]
    enable_access_log: Option<bool>,
}

fn logging_option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<LoggingConfig>, D::Error> {
    Ok(Option::<PartialLogging>::deserialize(d)?.map(|p| {
        let def = LoggingConfig::default();
        LoggingConfig {
            log_level: p.log_level.unwrap_or(def.log_level),
            encoding: p.encoding.unwrap_or(def.encoding),
            enable_access_log: p.enable_access_log.unwrap_or(def.enable_access_log),
        }
    }))
}

fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

fn route_prefix_option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RoutePrefix>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(RoutePrefix::new)
        .transpose()
        .map_err(serde::de::Error::custom)
}
