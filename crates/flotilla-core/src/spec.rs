//! What users declare: applications, deployments and their logging config.

use serde::{Deserialize, Serialize};

use crate::{
    AppName, Args, AutoscalingPolicy, CodeVersion, ConfigVersion, DeploymentConfig, DeploymentName,
    DeploymentVersion, ImportPath, LoggingConfig, ReplicaCount, RoutePrefix,
    error::{Error, Location},
    version::hash_value,
};

/// Longest explicit deployment `version`, in bytes.
pub const MAX_VERSION_LEN: usize = 256;

/// One deployment of an application: which code, with which init args and config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentSpec {
    /// Unique within the application.
    pub name: DeploymentName,
    /// The constructor's name in the `Registry`.
    pub import_path: ImportPath,
    /// Arguments for the constructor, as MessagePack.
    pub init_args: Args,
    /// An explicit code version; `None` derives one from the code, args and resources.
    pub version: Option<String>,
    /// Replicas, limits, health checks, resources...
    pub config: DeploymentConfig,
}

impl DeploymentSpec {
    /// Start a builder for deployment `name` running the code registered as
    /// `import_path`.
    ///
    /// ```
    /// use flotilla_core::DeploymentSpec;
    /// let d = DeploymentSpec::builder("echo", "echo::Echo").replicas(2).build().unwrap();
    /// assert_eq!(d.config.initial_replicas(), 2);
    /// ```
    pub fn builder(
        name: impl Into<String>,
        import_path: impl Into<String>,
    ) -> DeploymentSpecBuilder {
        DeploymentSpecBuilder {
            name: name.into(),
            import_path: import_path.into(),
            init_args: Ok(Args::unit()),
            version: None,
            config: DeploymentConfig::default(),
        }
    }

    /// The code version: the explicit version, or else a stable hash of import path
    /// and init args; resources are hashed in either way (replicas hold their
    /// reservations, so a resource change must replace them, as in Ray), and so are
    /// the placement group and `max_replicas_per_node` when set (Ray restarts
    /// replicas when they change). Unset, they leave the version as it was before
    /// they existed.
    pub fn code_version(&self) -> CodeVersion {
        let c = &self.config;
        let placement = (c.placement_group.is_some() || c.max_replicas_per_node.is_some())
            .then(|| hash_value(&(&c.placement_group, c.max_replicas_per_node)));
        match (&self.version, placement) {
            (Some(v), p) => {
                let mut v = v.clone();
                if c.resources != crate::Resources::default() {
                    v = format!("{v}+r{:016x}", hash_value(&c.resources));
                }
                if let Some(p) = p {
                    v = format!("{v}+p{p:016x}");
                }
                CodeVersion::explicit(v)
            }
            (None, None) => CodeVersion::hashed(hash_value(&(
                &self.import_path,
                &self.init_args,
                &c.resources,
            ))),
            (None, Some(p)) => CodeVersion::hashed(hash_value(&(
                &self.import_path,
                &self.init_args,
                &c.resources,
                p,
            ))),
        }
    }

    /// The config version (see [`ConfigVersion`]).
    pub fn config_version(&self) -> ConfigVersion {
        ConfigVersion::of(&self.config)
    }

    /// Both versions.
    pub fn version(&self) -> DeploymentVersion {
        DeploymentVersion {
            code: self.code_version(),
            config: self.config_version(),
        }
    }

    /// Validate the config and the explicit version; errors name the deployment.
    pub fn validate(&self) -> Result<(), Error> {
        let at = |e: Error| e.at(None, Some(self.name.as_str()));
        if let Some(v) = &self.version
            && (v.is_empty() || v.len() > MAX_VERSION_LEN)
        {
            return Err(at(Error::field(
                "version",
                format!(
                    "an explicit version must be 1 to {MAX_VERSION_LEN} bytes, got {} bytes",
                    v.len()
                ),
            )));
        }
        self.config.validate().map_err(at)
    }
}

/// Builds a [`DeploymentSpec`]; [`build`](Self::build) validates.
#[derive(Debug, Clone)]
pub struct DeploymentSpecBuilder {
    name: String,
    import_path: String,
    init_args: Result<Args, Error>,
    version: Option<String>,
    config: DeploymentConfig,
}

impl DeploymentSpecBuilder {
    /// Constructor arguments (any serde value).
    pub fn init_args<T: serde::Serialize + ?Sized>(mut self, args: &T) -> Self {
        self.init_args = Args::encode(args);
        self
    }

    /// An explicit code version.
    pub fn version(mut self, v: impl Into<String>) -> Self {
        self.version = Some(v.into());
        self
    }

    /// A fixed replica count.
    pub fn replicas(mut self, n: u32) -> Self {
        self.config = self.config.with_replicas(n);
        self
    }

    /// Replace the whole config.
    pub fn config(mut self, config: DeploymentConfig) -> Self {
        self.config = config;
        self
    }

    /// Edit the config in place.
    pub fn with_config(mut self, f: impl FnOnce(DeploymentConfig) -> DeploymentConfig) -> Self {
        self.config = f(self.config);
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<DeploymentSpec, Error> {
        let at = |e: Error| e.at(None, Some(&self.name));
        let spec = DeploymentSpec {
            name: DeploymentName::new(self.name.clone()).map_err(at)?,
            import_path: ImportPath::new(self.import_path.clone()).map_err(at)?,
            init_args: self.init_args.clone().map_err(at)?,
            version: self.version,
            config: self.config,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// An application: a named set of deployments with one ingress and an optional route
/// prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplicationSpec {
    /// Unique among live applications.
    pub name: AppName,
    /// HTTP route prefix; unique among live applications.
    pub route_prefix: Option<RoutePrefix>,
    /// The deployment that receives the application's requests.
    pub ingress: DeploymentName,
    /// Its deployments, in declaration order.
    pub deployments: Vec<DeploymentSpec>,
    /// Overrides the global logging config for this application.
    pub logging: Option<LoggingConfig>,
    /// Replica counts are set from outside (Ray's `external_scaler_enabled`): no
    /// deployment may autoscale, and the scale call may set a deployment's count.
    #[serde(default)]
    pub external_scaler_enabled: bool,
}

impl ApplicationSpec {
    /// Start a builder.
    ///
    /// ```
    /// use flotilla_core::{ApplicationSpec, DeploymentSpec};
    /// let app = ApplicationSpec::builder("shop")
    ///     .route_prefix("/shop")
    ///     .deployment(DeploymentSpec::builder("front", "shop::Front"))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(app.ingress.as_str(), "front");
    /// ```
    pub fn builder(name: impl Into<String>) -> ApplicationSpecBuilder {
        ApplicationSpecBuilder {
            name: name.into(),
            route_prefix: None,
            ingress: None,
            deployments: Vec::new(),
            logging: None,
            external_scaler_enabled: false,
            autoscaling_policy: None,
        }
    }

    /// The deployment named `name`.
    pub fn deployment(&self, name: &str) -> Option<&DeploymentSpec> {
        self.deployments.iter().find(|d| d.name.as_str() == name)
    }

    /// Whole-application checks: at least one deployment, unique deployment names,
    /// the ingress is one of them, every deployment valid, the logging config
    /// valid, and no deployment autoscaling when the replica counts are set from
    /// outside. Errors name the application.
    pub fn validate(&self) -> Result<(), Error> {
        let app = self.name.as_str();
        let at_app = |e: Error| e.at(Some(app), None);
        if let Some(l) = &self.logging {
            l.validate().map_err(at_app)?;
        }
        if self.deployments.is_empty() {
            return Err(at_app(Error::field(
                "deployments",
                "an application needs at least one deployment",
            )));
        }
        let mut seen = std::collections::HashSet::with_capacity(self.deployments.len());
        for d in &self.deployments {
            if !seen.insert(d.name.as_str()) {
                return Err(Error::InvalidField {
                    at: Location {
                        app: Some(app.to_owned()),
                        deployment: Some(d.name.to_string()),
                    },
                    field: "name",
                    reason: "the deployment name appears twice in the application".into(),
                });
            }
            d.validate().map_err(at_app)?;
            if self.external_scaler_enabled
                && matches!(d.config.num_replicas, ReplicaCount::Auto(_))
            {
                return Err(Error::InvalidField {
                    at: Location {
                        app: Some(app.to_owned()),
                        deployment: Some(d.name.to_string()),
                    },
                    field: "num_replicas",
                    reason: "the application's replica counts are set by an external scaler \
                             (external_scaler_enabled), so Flotilla's autoscaling must be off \
                             for every deployment: give a fixed count"
                        .into(),
                });
            }
        }
        if !seen.contains(self.ingress.as_str()) {
            return Err(at_app(Error::field(
                "ingress",
                format!(
                    "ingress deployment '{}' is not one of the application's deployments",
                    self.ingress
                ),
            )));
        }
        Ok(())
    }
}

/// Builds an [`ApplicationSpec`]; [`build`](Self::build) validates.
#[derive(Debug)]
pub struct ApplicationSpecBuilder {
    name: String,
    route_prefix: Option<String>,
    ingress: Option<String>,
    deployments: Vec<Result<DeploymentSpec, Error>>,
    logging: Option<LoggingConfig>,
    external_scaler_enabled: bool,
    autoscaling_policy: Option<AutoscalingPolicy>,
}

impl ApplicationSpecBuilder {
    /// The route prefix, validated as Ray validates it (see [`RoutePrefix`]):
    /// `"/api"` or `"/"`; `"api"` and `"/api/"` are errors, never rewritten.
    pub fn route_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.route_prefix = Some(prefix.into());
        self
    }

    /// The ingress deployment; defaults to the first deployment added.
    pub fn ingress(mut self, name: impl Into<String>) -> Self {
        self.ingress = Some(name.into());
        self
    }

    /// Add a deployment.
    pub fn deployment(mut self, d: DeploymentSpecBuilder) -> Self {
        self.deployments.push(d.build());
        self
    }

    /// Add an already built deployment (one taken from another application, say).
    ///
    /// ```
    /// use flotilla_core::{ApplicationSpec, DeploymentSpec};
    /// let front = DeploymentSpec::builder("front", "shop::Front").replicas(2).build()?;
    /// let app = ApplicationSpec::builder("shop").deployment_spec(front.clone()).build()?;
    /// assert_eq!(app.deployments, vec![front]);
    /// assert_eq!(app.ingress.as_str(), "front");
    /// # Ok::<(), flotilla_core::Error>(())
    /// ```
    pub fn deployment_spec(mut self, d: DeploymentSpec) -> Self {
        self.deployments.push(Ok(d));
        self
    }

    /// The application's logging config.
    pub fn logging(mut self, logging: LoggingConfig) -> Self {
        self.logging = Some(logging);
        self
    }

    /// Replica counts are set from outside (Ray's `external_scaler_enabled`):
    /// then no deployment may autoscale.
    pub fn external_scaler_enabled(mut self, enabled: bool) -> Self {
        self.external_scaler_enabled = enabled;
        self
    }

    /// An application-level autoscaling policy (Ray's `autoscaling_policy`): it
    /// replaces the policy of every deployment that autoscales, as Ray's
    /// application-level policy takes precedence over deployment-level ones. In
    /// Flotilla it is the same kind of policy as a deployment's (one function,
    /// called for each deployment on its own), not a function over all of them.
    pub fn autoscaling_policy(mut self, policy: AutoscalingPolicy) -> Self {
        self.autoscaling_policy = Some(policy);
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<ApplicationSpec, Error> {
        let app = self.name.clone();
        let at = |e: Error| e.at(Some(&app), None);
        let name = AppName::new(self.name.clone()).map_err(at)?;
        let route_prefix = self
            .route_prefix
            .as_deref()
            .map(RoutePrefix::new)
            .transpose()
            .map_err(at)?;
        let mut deployments = self
            .deployments
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(at)?;
        if let Some(policy) = &self.autoscaling_policy {
            set_app_policy(&mut deployments, policy);
        }
        let ingress = match self.ingress {
            Some(i) => DeploymentName::new(i).map_err(at)?,
            None => match deployments.first() {
                Some(d) => d.name.clone(),
                None => {
                    return Err(at(Error::field(
                        "deployments",
                        "an application needs at least one deployment",
                    )));
                }
            },
        };
        let spec = ApplicationSpec {
            name,
            route_prefix,
            ingress,
            deployments,
            logging: self.logging,
            external_scaler_enabled: self.external_scaler_enabled,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Give every autoscaled deployment of `deployments` the application's `policy`
/// (Ray: an application-level policy takes precedence).
pub(crate) fn set_app_policy(deployments: &mut [DeploymentSpec], policy: &AutoscalingPolicy) {
    for d in deployments {
        if let ReplicaCount::Auto(a) = &mut d.config.num_replicas {
            a.policy = policy.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Resources;

    fn dep(name: &str) -> DeploymentSpecBuilder {
        DeploymentSpec::builder(name, "test::Echo")
    }

    #[test]
    fn errors_name_the_application_deployment_and_field() {
        let err = ApplicationSpec::builder("shop")
            .deployment(dep("front").with_config(|c| c.with_max_ongoing_requests(0)))
            .build()
            .unwrap_err();
        assert_eq!(err.app(), Some("shop"));
        assert_eq!(err.deployment(), Some("front"));
        assert!(matches!(
            err,
            Error::InvalidField {
                field: "max_ongoing_requests",
                ..
            }
        ));
        assert!(
            err.to_string()
                .contains("application 'shop', deployment 'front'"),
            "{err}"
        );
    }

    #[test]
    fn rejects_duplicate_deployments_missing_ingress_and_empty_apps() {
        let dup = ApplicationSpec::builder("a")
            .deployment(dep("x"))
            .deployment(dep("x"))
            .build()
            .unwrap_err();
        assert_eq!(dup.deployment(), Some("x"));
        let ingress = ApplicationSpec::builder("a")
            .deployment(dep("x"))
            .ingress("y")
            .build()
            .unwrap_err();
        assert!(matches!(
            ingress,
            Error::InvalidField {
                field: "ingress",
                ..
            }
        ));
        let empty = ApplicationSpec::builder("a").build().unwrap_err();
        assert!(matches!(
            empty,
            Error::InvalidField {
                field: "deployments",
                ..
            }
        ));
        let bad_name = ApplicationSpec::builder("a b")
            .deployment(dep("x"))
            .build()
            .unwrap_err();
        assert!(matches!(bad_name, Error::InvalidName { .. }));
    }

    #[test]
    fn route_prefixes_are_validated_never_rewritten() {
        for bad in ["a", "/a/", "/a b", "/{x}"] {
            let err = ApplicationSpec::builder("shop")
                .route_prefix(bad)
                .deployment(dep("x"))
                .build()
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidName {
                        what: "route prefix",
                        ..
                    }
                ),
                "{bad}"
            );
            assert_eq!(err.app(), Some("shop"), "{bad}");
        }
    }

    #[test]
    fn a_bad_explicit_version_names_its_application_and_deployment() {
        for v in [String::new(), "v".repeat(MAX_VERSION_LEN + 1)] {
            let err = ApplicationSpec::builder("shop")
                .deployment(dep("front").version(v))
                .build()
                .unwrap_err();
            assert_eq!((err.app(), err.deployment()), (Some("shop"), Some("front")));
            assert_eq!(err.field_name(), Some("version"));
        }
    }

    #[test]
    fn errors_quote_at_most_a_few_hundred_bytes_of_a_value() {
        let huge = "x".repeat(10 << 20);
        let err = ApplicationSpec::builder(huge.clone())
            .deployment(dep("front"))
            .build()
            .unwrap_err();
        let text = err.to_string();
        assert!(text.len() < 1_000, "{} bytes", text.len());
        assert!(text.contains("10485760 bytes in all"), "{text}");
        let err = ApplicationSpec::builder("shop")
            .deployment(dep(&huge))
            .build()
            .unwrap_err();
        assert!(err.to_string().len() < 1_000);
    }

    #[test]
    fn code_version_is_stable_and_tracks_code_args_and_resources() {
        let a = dep("x").init_args(&1u32).build().unwrap();
        let same = dep("x").init_args(&1u32).build().unwrap();
        assert_eq!(a.code_version(), same.code_version());
        // Pinned value: the hash must not drift across builds, machines or Rust versions.
        assert_eq!(a.code_version().as_str(), "heddbbbcac1fd726a");
        let args = dep("x").init_args(&2u32).build().unwrap();
        let path = DeploymentSpec::builder("x", "test::Other")
            .init_args(&1u32)
            .build()
            .unwrap();
        let res = dep("x")
            .init_args(&1u32)
            .with_config(|c| c.with_resources(Resources::default().with_gpus(1.0)))
            .build()
            .unwrap();
        for other in [&args, &path, &res] {
            assert_ne!(a.code_version(), other.code_version());
        }
        let explicit = dep("x").version("v1").build().unwrap();
        assert_eq!(explicit.code_version().as_str(), "v1");
        let explicit_gpu = dep("x")
            .version("v1")
            .with_config(|c| c.with_resources(Resources::default().with_gpus(1.0)))
            .build()
            .unwrap();
        assert_ne!(explicit.code_version(), explicit_gpu.code_version());
        assert!(explicit_gpu.code_version().as_str().starts_with("v1+r"));
    }

    #[test]
    fn config_version_ignores_the_replica_count_but_not_user_config() {
        let a = dep("x").replicas(1).build().unwrap();
        let scaled = dep("x").replicas(7).build().unwrap();
        assert_eq!(a.version(), scaled.version());
        let reconf = dep("x")
            .with_config(|c| c.with_user_config(Args::encode(&"t").unwrap()))
            .build()
            .unwrap();
        assert_eq!(a.code_version(), reconf.code_version());
        assert_ne!(a.config_version(), reconf.config_version());
    }

    #[test]
    fn an_external_scaler_refuses_autoscaling_and_an_app_policy_reaches_every_autoscaler() {
        use crate::{AutoscalingConfig, AutoscalingPolicy, ReplicaCount};
        let auto = || {
            dep("auto").with_config(|c| {
                c.with_autoscaling(AutoscalingConfig {
                    max_replicas: 3,
                    ..AutoscalingConfig::default()
                })
            })
        };
        let e = ApplicationSpec::builder("a")
            .deployment(dep("fixed"))
            .deployment(auto())
            .external_scaler_enabled(true)
            .build()
            .unwrap_err();
        assert_eq!((e.app(), e.deployment()), (Some("a"), Some("auto")));
        assert_eq!(e.field_name(), Some("num_replicas"));
        let ok = ApplicationSpec::builder("a")
            .deployment(dep("fixed").replicas(2))
            .external_scaler_enabled(true)
            .build()
            .unwrap();
        assert!(ok.external_scaler_enabled);
        let policy = AutoscalingPolicy::named("a:policy".try_into().unwrap());
        let app = ApplicationSpec::builder("a")
            .deployment(dep("fixed"))
            .deployment(auto())
            .autoscaling_policy(policy.clone())
            .build()
            .unwrap();
        let ReplicaCount::Auto(a) = &app.deployment("auto").unwrap().config.num_replicas else {
            panic!("autoscaled");
        };
        assert_eq!(a.policy, policy);
    }

    #[test]
    fn placement_is_code_and_unset_it_leaves_the_version_as_it_was() {
        use crate::{PlacementGroup, PlacementStrategy};
        let plain = dep("x").init_args(&1u32).build().unwrap();
        assert_eq!(plain.code_version().as_str(), "heddbbbcac1fd726a");
        let pg = dep("x")
            .init_args(&1u32)
            .with_config(|c| {
                c.with_placement_group(PlacementGroup::new(
                    vec![Resources::default()],
                    PlacementStrategy::Pack,
                ))
            })
            .build()
            .unwrap();
        assert_ne!(pg.code_version(), plain.code_version());
        assert_eq!(pg.config_version(), plain.config_version());
        let explicit = dep("x")
            .version("v1")
            .with_config(|c| c.with_max_replicas_per_node(2))
            .build()
            .unwrap();
        assert!(explicit.code_version().as_str().starts_with("v1+p"));
    }

    #[test]
    fn spec_round_trips_through_msgpack() {
        let app = ApplicationSpec::builder("a")
            .route_prefix("/a")
            .deployment(dep("x").init_args(&("q", 1)).replicas(3))
            .logging(LoggingConfig::default())
            .build()
            .unwrap();
        assert_eq!(app.route_prefix.as_ref().unwrap().as_str(), "/a");
        let bytes = rmp_serde::to_vec(&app).unwrap();
        assert_eq!(
            rmp_serde::from_slice::<ApplicationSpec>(&bytes).unwrap(),
            app
        );
    }
}
