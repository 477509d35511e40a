//! One application of a config file (Ray's `ServeApplicationSchema`).

use std::collections::HashMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::{
    AppName, Args, AutoscalingPolicy, CodeVersion, DeploymentConfig, ImportPath, LoggingConfig,
    RoutePrefix, error::Error, stable_hash,
};

use super::{DeploymentOverride, NumReplicas, Site, Sited, app_field, location, logging, value};

/// One application of a [`ServeConfig`](super::ServeConfig).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// Unique within the config; `"default"` when left out, as in Ray.
    #[serde(default = "default_name")]
    pub name: AppName,
    /// What becomes of the route prefix the builder chose: left out, it
    /// stands; a prefix replaces it (unique within the config; validated as
    /// Ray validates it, see [`RoutePrefix`], never rewritten); `null` removes
    /// it, as in Ray: no HTTP route, handles only.
    #[serde(default, skip_serializing_if = "RouteOverride::is_keep")]
    pub route_prefix: RouteOverride,
    /// The application builder's name in the `Registry`.
    pub import_path: ImportPath,
    /// Ray's Python environment for the application (a mapping: `working_dir`,
    /// `pip`, `env_vars`, ...). Compiled code has none: accepted and recorded as
    /// given (canonical MessagePack), it applies nothing, and
    /// [`ServeConfig::warnings`](super::ServeConfig::warnings) names its keys.
    /// It is not part of [`code_version`](Self::code_version) (Ray hashes it,
    /// since in Ray it changes the code that runs).
    #[serde(
        default = "Args::empty_map",
        deserialize_with = "value::map_field::deserialize",
        serialize_with = "value::map_field::serialize"
    )]
    pub runtime_env: Args,
    /// What the builder is called with: any value, as canonical MessagePack;
    /// the empty map when left out or `null`.
    #[serde(default = "Args::empty_map", with = "value::app_args")]
    pub args: Args,
    /// This application's logging, instead of the global one.
    #[serde(default, deserialize_with = "logging::logging_option")]
    pub logging_config: Option<LoggingConfig>,
    /// Replica counts are set from outside (Ray's `external_scaler_enabled`):
    /// no deployment of the application may autoscale, in the config (an error
    /// at parse, as in Ray) or in the builder's code (an error when the overrides
    /// are applied); the scale call sets a deployment's count. Applied over the
    /// builder's choice ([`ApplicationSpec::external_scaler_enabled`]).
    ///
    /// [`ApplicationSpec::external_scaler_enabled`]: crate::ApplicationSpec::external_scaler_enabled
    #[serde(default)]
    pub external_scaler_enabled: bool,
    /// An application-level autoscaling policy (Ray's `autoscaling_policy`,
    /// `{policy_function, policy_kwargs}`): it replaces the policy of every
    /// deployment of the application that autoscales (Ray: it takes precedence
    /// over deployment-level policies). A path other than Ray's default names a
    /// policy registered in the `Registry`, checked when the config is applied.
    /// Unlike Ray's, Flotilla's application-level policy is called for each
    /// deployment on its own, not once over all of them.
    #[serde(default)]
    pub autoscaling_policy: Option<AutoscalingPolicy>,
    /// Take over an application of the same name that was deployed imperatively
    /// (by `run`); without it, that is an error. Flotilla's own field.
    #[serde(default)]
    pub take_over: bool,
    /// Overrides of the builder's deployments, by deployment name.
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub deployments: Vec<DeploymentOverride>,
    /// Refused: Ray's per-application `host`, which Ray itself refuses in a
    /// multi-application config; the HTTP proxy is shared, so it is
    /// `http_options.host`. Kept only to report it.
    #[serde(default, with = "value::args_field::option")]
    pub host: Option<Args>,
    /// Refused: Ray's per-application `port`; see [`host`](Self::host).
    #[serde(default, with = "value::args_field::option")]
    pub port: Option<Args>,
}

fn default_name() -> AppName {
    AppName::known("default")
}

impl AppConfig {
    /// A config for application `name` built by the builder registered as
    /// `import_path`, with no args (the empty map) and no overrides.
    pub fn new(name: AppName, import_path: ImportPath) -> Self {
        AppConfig {
            name,
            route_prefix: RouteOverride::Keep,
            import_path,
            runtime_env: Args::empty_map(),
            args: Args::empty_map(),
            logging_config: None,
            external_scaler_enabled: false,
            autoscaling_policy: None,
            take_over: false,
            deployments: Vec::new(),
            host: None,
            port: None,
        }
    }

    /// The application's config-level code version: a stable hash of its import
    /// path and (canonical) args, as Ray's `get_app_code_version` hashes import
    /// path, runtime env and args (Flotilla leaves the runtime env out: it applies
    /// nothing). Equal to the running target's: apply the config to the built spec
    /// again ([`apply_overrides`](super::apply_overrides)) without rebuilding.
    /// Different: run the builder again.
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

    /// The keys of `runtime_env` and of every deployment's
    /// `ray_actor_options.runtime_env`, sorted and without duplicates: what a
    /// Python environment would set up, and Flotilla does not.
    pub fn runtime_env_keys(&self) -> Vec<String> {
        let mut keys = value::map_keys(&self.runtime_env);
        for d in &self.deployments {
            if let Some(env) = d
                .ray_actor_options
                .as_ref()
                .and_then(|r| r.runtime_env.as_ref())
            {
                keys.extend(value::map_keys(env));
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    pub(super) fn check(&self) -> Result<(), Sited> {
        let app = self.name.as_str();
        let at_app = |field: &'static str, reason: String| {
            Box::new((
                app_field(app, field, reason),
                Site {
                    field: Some(field),
                    ..Site::default()
                },
            ))
        };
        for (field, given) in [("host", &self.host), ("port", &self.port)] {
            if given.is_some() {
                return Err(at_app(
                    field,
                    format!(
                        "{field} is set for application '{app}'; the HTTP proxy is shared by \
                         every application, so set http_options.{field} at the top level \
                         instead (Ray refuses it here too)"
                    ),
                ));
            }
        }
        if let Some(l) = &self.logging_config {
            l.validate().map_err(|e| {
                let field = e.field_name().unwrap_or("logging_config");
                Box::new((
                    e.at(Some(app), None),
                    Site {
                        field: Some(field),
                        ..Site::default()
                    },
                ))
            })?;
        }
        if self.external_scaler_enabled {
            let autoscaled: Vec<String> = self
                .deployments
                .iter()
                .filter(|d| {
                    d.num_replicas == Some(NumReplicas::Auto)
                        || d.autoscaling_config.given().is_some()
                })
                .map(|d| format!("\"{}\"", d.name))
                .collect();
            if !autoscaled.is_empty() {
                return Err(at_app(
                    "external_scaler_enabled",
                    format!(
                        "external_scaler_enabled is set to True, but the following deployment(s) \
                         have autoscaling configured: {}. When using an external autoscaler, \
                         Serve's built-in autoscaling must be disabled for all deployments in \
                         the application",
                        autoscaled.join(", ")
                    ),
                ));
            }
        }
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
            d.check()
                .and_then(|()| d.apply_to(d.check_base()))
                .and_then(|c: DeploymentConfig| {
                    c.validate().map_err(super::overrides::config_field_names)
                })
                .map_err(|e| d.as_written(e))
                .map_err(|e| {
                    let field = e.field_name();
                    Box::new((e.at(Some(app), Some(dep)), site(field)))
                })?;
        }
        Ok(())
    }
}

/// What a config entry's `route_prefix` does to the prefix its builder chose
/// ([`AppConfig::route_prefix`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum RouteOverride {
    /// Left out: the builder's prefix stands.
    #[default]
    Keep,
    /// `null`: no HTTP route (Ray's `route_prefix: None`); the application is
    /// reached through handles only.
    Off,
    /// This prefix replaces the builder's.
    Prefix(RoutePrefix),
}

impl RouteOverride {
    /// Whether the entry leaves the builder's prefix as it is.
    pub fn is_keep(&self) -> bool {
        matches!(self, RouteOverride::Keep)
    }

    /// The prefix the entry gives, if it gives one.
    pub fn prefix(&self) -> Option<&RoutePrefix> {
        match self {
            RouteOverride::Prefix(p) => Some(p),
            RouteOverride::Keep | RouteOverride::Off => None,
        }
    }

    /// The prefix of an application whose builder chose `built`.
    pub fn apply(&self, built: Option<RoutePrefix>) -> Option<RoutePrefix> {
        match self {
            RouteOverride::Keep => built,
            RouteOverride::Off => None,
            RouteOverride::Prefix(p) => Some(p.clone()),
        }
    }
}

/// In a config's text (YAML, JSON) `null` is [`RouteOverride::Off`] (a left
/// out field is `Keep`, by its default: [`AppConfig`] leaves `Keep` out of
/// what it writes; a `Keep` written on its own is `null`, which reads back
/// as `Off`). In the checkpoint's binary encoding
/// `nil` stays `Keep`, as every record written before `Off` existed reads,
/// and `Off` is `false`.
impl Serialize for RouteOverride {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RouteOverride::Prefix(p) => s.serialize_str(p.as_str()),
            RouteOverride::Off if !s.is_human_readable() => s.serialize_bool(false),
            RouteOverride::Off | RouteOverride::Keep => s.serialize_none(),
        }
    }
}

impl<'de> Deserialize<'de> for RouteOverride {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Prefix(String),
            Off(bool),
            Keep(()),
        }
        let prefix = |p: String| {
            RoutePrefix::new(p)
                .map(RouteOverride::Prefix)
                .map_err(serde::de::Error::custom)
        };
        if d.is_human_readable() {
            return match Option::<String>::deserialize(d)? {
                Some(p) => prefix(p),
                None => Ok(RouteOverride::Off),
            };
        }
        match Stored::deserialize(d)? {
            Stored::Prefix(p) => prefix(p),
            Stored::Off(false) => Ok(RouteOverride::Off),
            Stored::Off(true) => Err(serde::de::Error::custom(
                "a route prefix is a string, null or left out, not true",
            )),
            Stored::Keep(()) => Ok(RouteOverride::Keep),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn entry(route: RouteOverride) -> AppConfig {
        let mut app = AppConfig::new(AppName::known("a"), ImportPath::known("x:y"));
        app.route_prefix = route;
        app
    }

    #[test]
    fn each_route_override_survives_the_checkpoints_encoding_and_json() {
        let prefix = RouteOverride::Prefix(RoutePrefix::new("/a").unwrap());
        for route in [RouteOverride::Keep, RouteOverride::Off, prefix] {
            let app = entry(route.clone());
            let stored = rmp_serde::to_vec_named(&app).unwrap();
            let back: AppConfig = rmp_serde::from_slice(&stored).unwrap();
            assert_eq!(back.route_prefix, route, "checkpoint");
            let json = serde_json::to_string(&app).unwrap();
            let back: AppConfig = serde_json::from_str(&json).unwrap();
            assert_eq!(back.route_prefix, route, "json: {json}");
        }
        // A record written before `Off` existed holds `nil` for a left-out
        // prefix: it still reads as the builder's.
        #[derive(Serialize)]
        struct Before {
            name: &'static str,
            route_prefix: Option<String>,
            import_path: &'static str,
        }
        let before = rmp_serde::to_vec_named(&Before {
            name: "a",
            route_prefix: None,
            import_path: "x:y",
        })
        .unwrap();
        let back: AppConfig = rmp_serde::from_slice(&before).unwrap();
        assert_eq!(back.route_prefix, RouteOverride::Keep);
    }
}
