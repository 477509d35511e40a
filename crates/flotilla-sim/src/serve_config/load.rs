//! Loading the configs of a run before anything runs, and predicting what each
//! of their applications must become.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use flotilla::{AppConfig, ApplicationSpec, ServeConfig, SpecError};

use super::builders::{BUILDERS, BuilderError, CHAIN_APP, ChainArgs, FAILING_APP, FailingArgs};
use crate::{
    Result, SimError, cluster::NodeGroup, faults::EventKind, scenario::Scenario,
    workload::app_index,
};

/// One application of a config, and what it must become.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredApp {
    /// Its name.
    pub name: String,
    /// What building it must give.
    pub built: Build,
    /// Its code is broken: every constructor fails (DEPLOY_FAILED).
    pub broken: bool,
}

impl DeclaredApp {
    /// Whether it must end DEPLOY_FAILED (its build fails or its code is broken).
    pub fn fails(&self) -> bool {
        self.broken || self.built.failure().is_some()
    }
}

/// What building a config's application must give.
#[derive(Debug, Clone, PartialEq)]
pub enum Build {
    /// The spec Flotilla must run for it: the builder's, with the config's
    /// overrides laid over it.
    Runs(ApplicationSpec),
    /// The build must fail: the application ends DEPLOY_FAILED, its status
    /// message saying this.
    Fails(BuildFailure),
}

impl Build {
    /// The spec Flotilla must run, if the build succeeds.
    pub fn spec(&self) -> Option<&ApplicationSpec> {
        match self {
            Build::Runs(spec) => Some(spec),
            Build::Fails(_) => None,
        }
    }

    /// Why the build must fail, if it does.
    pub fn failure(&self) -> Option<&BuildFailure> {
        match self {
            Build::Runs(_) => None,
            Build::Fails(why) => Some(why),
        }
    }
}

/// Why building a config's application must fail; its message is what the
/// application's DEPLOY_FAILED status must say.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BuildFailure {
    /// The builder always fails ([`FAILING_APP`]), saying
    /// [`FailingArgs::message`].
    #[error("{}", .0.message())]
    Builder(FailingArgs),
    /// The config's overrides do not fit the builder's application (an override
    /// of a deployment it does not make, say): Flotilla's `apply_overrides`
    /// refuses them, as the Controller does.
    #[error(transparent)]
    Overrides(SpecError),
}

/// Why the simulation cannot run an application of a config (an error before
/// anything runs, not an expected DEPLOY_FAILED).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigAppError {
    /// Its name is one of the imperative workload's.
    #[error("'{name}' is a name of the imperative workload (app-NNNNN): choose another")]
    WorkloadName {
        /// The name.
        name: String,
    },
    /// Its route prefix is one of the imperative workload's.
    #[error("route prefix '{prefix}' belongs to the imperative workload: choose another")]
    WorkloadRoute {
        /// The prefix.
        prefix: String,
    },
    /// Its import path names none of the simulator's builders.
    #[error(
        "import path '{import_path}' is not one of the simulator's application builders ({})",
        BUILDERS.join(", ")
    )]
    UnknownBuilder {
        /// The import path.
        import_path: String,
    },
    /// Its builder refuses its `args`.
    #[error(transparent)]
    Builder(#[from] BuilderError),
    /// A deployment no simulated node can hold.
    #[error("deployment '{deployment}': {source}")]
    Unplaceable {
        /// The deployment.
        deployment: String,
        /// Why no node holds a replica of it.
        source: Unplaceable,
    },
}

/// Why no simulated node can hold a replica.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unplaceable {
    /// It asks for custom resources, which no simulated node offers.
    #[error(
        "asks for custom resources ({}), which the simulated cluster does not offer",
        names.join(", ")
    )]
    CustomResources {
        /// Their names.
        names: Vec<String>,
    },
    /// It reserves more than the largest simulated node offers.
    #[error(
        "a replica reserves {cpus} CPUs, {memory_bytes} bytes of memory and {gpus} GPUs: no simulated node is that large, it would never be placed"
    )]
    TooLarge {
        /// CPUs per replica.
        cpus: f64,
        /// Memory per replica, bytes.
        memory_bytes: u64,
        /// GPUs per replica.
        gpus: f64,
    },
}

/// A config file, parsed, checked, and its applications predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedConfig {
    /// The file, as the scenario names it (relative to the working directory).
    pub path: PathBuf,
    /// The config.
    pub config: ServeConfig,
    /// Its applications, in file order.
    pub apps: Vec<Arc<DeclaredApp>>,
}

impl LoadedConfig {
    /// Read, parse and check the config at `path` for `scenario`: every
    /// application must name one of the simulator's builders with args it takes,
    /// must not use a name or route prefix of the imperative workload
    /// (`app-NNNNN`, `/app-NNNNN`), and every deployment must fit a node of the
    /// simulated cluster. A config whose overrides do not fit its builder's
    /// application (an override of a deployment it does not make, say) loads:
    /// Flotilla must fail to build that application, and the run expects
    /// DEPLOY_FAILED.
    pub fn load(path: &Path, scenario: &Scenario) -> Result<LoadedConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::ReadServeConfig {
            path: path.to_owned(),
            source,
        })?;
        let config =
            ServeConfig::from_yaml(&text).map_err(|source| SimError::ParseServeConfig {
                path: path.to_owned(),
                source: Box::new(source),
            })?;
        let inherited = config.clone().inherit_logging();
        let apps = inherited
            .applications
            .iter()
            .map(|app| {
                predict(app, scenario)
                    .map(Arc::new)
                    .map_err(|source| SimError::ServeConfigApp {
                        path: path.to_owned(),
                        app: app.name.to_string(),
                        source,
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(LoadedConfig {
            path: path.to_owned(),
            config,
            apps,
        })
    }

    /// Applications that must end DEPLOY_FAILED.
    pub fn failing(&self) -> usize {
        self.apps.iter().filter(|a| a.fails()).count()
    }
}

/// What `app` must become, or why the simulation cannot run it.
fn predict(
    app: &AppConfig,
    scenario: &Scenario,
) -> std::result::Result<DeclaredApp, ConfigAppError> {
    let name = app.name.as_str();
    if app_index(name).is_some() {
        return Err(ConfigAppError::WorkloadName {
            name: name.to_owned(),
        });
    }
    if let Some(prefix) = app.route_prefix.prefix()
        && prefix
            .as_str()
            .strip_prefix('/')
            .and_then(app_index)
            .is_some()
    {
        return Err(ConfigAppError::WorkloadRoute {
            prefix: prefix.to_string(),
        });
    }
    let (built, broken) = match app.import_path.as_str() {
        CHAIN_APP => {
            let args = ChainArgs::decode(&app.args)?;
            // As the Controller does with a build's result.
            let built = match flotilla_core::apply_overrides(args.spec(&scenario.workload)?, app) {
                Ok(spec) => Build::Runs(spec),
                Err(e) => Build::Fails(BuildFailure::Overrides(e)),
            };
            (built, args.broken)
        }
        FAILING_APP => {
            let args = FailingArgs::decode(&app.args)?;
            (Build::Fails(BuildFailure::Builder(args)), false)
        }
        other => {
            return Err(ConfigAppError::UnknownBuilder {
                import_path: other.to_owned(),
            });
        }
    };
    if let Some(spec) = built.spec() {
        for d in &spec.deployments {
            placeable(&d.config.resources, &scenario.cluster.groups).map_err(|source| {
                ConfigAppError::Unplaceable {
                    deployment: d.name.to_string(),
                    source,
                }
            })?;
        }
    }
    Ok(DeclaredApp {
        name: name.to_owned(),
        built,
        broken,
    })
}

/// Whether a replica reserving `r` fits an empty node of some group.
fn placeable(
    r: &flotilla::Resources,
    groups: &[NodeGroup],
) -> std::result::Result<(), Unplaceable> {
    if !r.custom.is_empty() {
        return Err(Unplaceable::CustomResources {
            names: r.custom.keys().cloned().collect(),
        });
    }
    if groups.iter().any(|g| g.holds(r)) {
        Ok(())
    } else {
        Err(Unplaceable::TooLarge {
            cpus: r.cpus,
            memory_bytes: r.memory_bytes,
            gpus: r.gpus,
        })
    }
}

/// Every config a run applies, loaded before it starts.
#[derive(Debug, Clone, Default)]
pub struct Configs {
    /// The scenario's `serve_config`, applied at the start.
    pub initial: Option<Arc<LoadedConfig>>,
    /// The configs of `config@T:PATH` events, by path.
    pub scheduled: BTreeMap<PathBuf, Arc<LoadedConfig>>,
}

impl Configs {
    /// Load the scenario's `serve_config` and the config of every `config@`
    /// event. Any error is returned before anything runs.
    pub fn load(scenario: &Scenario) -> Result<Configs> {
        let initial = scenario
            .serve_config
            .as_deref()
            .map(|p| LoadedConfig::load(p, scenario).map(Arc::new))
            .transpose()?;
        let mut scheduled = BTreeMap::new();
        for e in scenario.events()? {
            if let EventKind::Config(path) = e.kind
                && !scheduled.contains_key(&path)
            {
                let loaded = Arc::new(LoadedConfig::load(&path, scenario)?);
                scheduled.insert(path, loaded);
            }
        }
        Ok(Configs { initial, scheduled })
    }

    /// The config of a `config@` event.
    pub fn scheduled(&self, path: &Path) -> Result<Arc<LoadedConfig>> {
        self.scheduled.get(path).cloned().ok_or_else(|| {
            SimError::Scenario(format!(
                "the config {} of an event was not loaded",
                path.display()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn predicted(yaml: &str) -> Vec<std::result::Result<DeclaredApp, ConfigAppError>> {
        let config = ServeConfig::from_yaml(yaml).unwrap().inherit_logging();
        let scenario = Scenario::default();
        config
            .applications
            .iter()
            .map(|a| predict(a, &scenario))
            .collect()
    }

    #[test]
    fn builds_are_predicted_and_failures_typed() {
        let apps = predicted(
            "applications:\n\
             - {name: ok, import_path: sim.chain:app, args: {deployments: 2}}\n\
             - {name: down, import_path: sim.failing:app, args: {why: gone}}\n\
             - name: miss\n  import_path: sim.chain:app\n  deployments: [{name: d7, num_replicas: 2}]\n\
             - {name: bad, import_path: sim.chain:app, args: {broken: true}}\n",
        );
        let [ok, down, miss, bad] = &apps[..] else {
            panic!("{apps:?}");
        };
        let ok = ok.as_ref().unwrap();
        assert_eq!(ok.built.spec().unwrap().deployments.len(), 2);
        assert!(!ok.fails());
        let down = down.as_ref().unwrap();
        assert!(
            matches!(&down.built, Build::Fails(BuildFailure::Builder(a)) if a.why.as_deref() == Some("gone"))
        );
        assert_eq!(
            down.built.failure().unwrap().to_string(),
            "simulated builder failure: gone"
        );
        let miss = miss.as_ref().unwrap();
        assert!(
            matches!(&miss.built, Build::Fails(BuildFailure::Overrides(e)) if e.to_string().contains("d7")),
            "{miss:?}"
        );
        let bad = bad.as_ref().unwrap();
        assert!(bad.fails() && bad.built.spec().is_some());
    }

    #[test]
    fn what_cannot_run_is_a_typed_error() {
        let apps = predicted(
            "applications:\n\
             - {name: app-00001, import_path: sim.chain:app}\n\
             - {name: a, route_prefix: /app-00002, import_path: sim.chain:app}\n\
             - {name: b, import_path: shop.app:build}\n\
             - {name: c, import_path: sim.chain:app, args: {deployments: 0}}\n\
             - name: d\n  import_path: sim.chain:app\n  deployments: [{name: d0, ray_actor_options: {num_cpus: 512}}]\n\
             - name: e\n  import_path: sim.chain:app\n  deployments: [{name: d0, ray_actor_options: {resources: {tpu: 1}}}]\n",
        );
        let errors: Vec<ConfigAppError> = apps.into_iter().map(|a| a.unwrap_err()).collect();
        let [name, route, builder, args, huge, custom] = &errors[..] else {
            panic!("{errors:?}");
        };
        assert!(matches!(name, ConfigAppError::WorkloadName { name } if name == "app-00001"));
        assert!(
            matches!(route, ConfigAppError::WorkloadRoute { prefix } if prefix == "/app-00002")
        );
        assert!(
            matches!(builder, ConfigAppError::UnknownBuilder { import_path } if import_path == "shop.app:build")
        );
        assert_eq!(
            builder.to_string(),
            "import path 'shop.app:build' is not one of the simulator's application builders (sim.chain:app, sim.failing:app)"
        );
        assert_eq!(args, &ConfigAppError::Builder(BuilderError::NoDeployments));
        assert!(matches!(
            huge,
            ConfigAppError::Unplaceable { deployment, source: Unplaceable::TooLarge { .. } } if deployment == "d0"
        ));
        assert!(
            huge.to_string().contains("it would never be placed"),
            "{huge}"
        );
        assert_eq!(
            custom,
            &ConfigAppError::Unplaceable {
                deployment: "d0".into(),
                source: Unplaceable::CustomResources {
                    names: vec!["tpu".into()]
                },
            }
        );
        assert_eq!(
            custom.to_string(),
            "deployment 'd0': asks for custom resources (tpu), which the simulated cluster does not offer"
        );
    }
}
