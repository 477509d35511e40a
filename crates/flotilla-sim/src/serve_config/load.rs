//! Loading the configs of a run before anything runs, and predicting what each
//! of their applications must become.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use flotilla::{AppConfig, ApplicationSpec, ServeConfig};

use super::builders::{BUILDERS, CHAIN_APP, ChainArgs, FAILING_APP, FailingArgs};
use crate::{
    Result, SimError, cluster::NodeGroup, faults::EventKind, scenario::Scenario,
    workload::app_index,
};

/// One application of a config, and what it must become.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredApp {
    /// Its name.
    pub name: String,
    /// The spec Flotilla must run for it (the builder's, with the config's
    /// overrides laid over it), or why building it must fail (DEPLOY_FAILED).
    pub built: std::result::Result<ApplicationSpec, String>,
    /// Its code is broken: every constructor fails (DEPLOY_FAILED).
    pub broken: bool,
}

impl DeclaredApp {
    /// Whether it must end DEPLOY_FAILED (its build fails or its code is broken).
    pub fn fails(&self) -> bool {
        self.broken || self.built.is_err()
    }
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
                    .map_err(|why| SimError::ServeConfigApp {
                        path: path.to_owned(),
                        app: app.name.to_string(),
                        why,
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
fn predict(app: &AppConfig, scenario: &Scenario) -> std::result::Result<DeclaredApp, String> {
    let name = app.name.as_str();
    if app_index(name).is_some() {
        return Err(format!(
            "'{name}' is a name of the imperative workload (app-NNNNN): choose another"
        ));
    }
    if let Some(prefix) = &app.route_prefix
        && prefix
            .as_str()
            .strip_prefix('/')
            .and_then(app_index)
            .is_some()
    {
        return Err(format!(
            "route prefix '{prefix}' belongs to the imperative workload: choose another"
        ));
    }
    let (built, broken) = match app.import_path.as_str() {
        CHAIN_APP => {
            let args = ChainArgs::decode(&app.args)?;
            (Ok(args.spec(&scenario.workload)?), args.broken)
        }
        FAILING_APP => (Err(FailingArgs::decode(&app.args)?.message()), false),
        other => {
            return Err(format!(
                "import path '{other}' is not one of the simulator's application builders ({})",
                BUILDERS.join(", ")
            ));
        }
    };
    // As the Controller does with a build's result.
    let built =
        built.and_then(|spec| flotilla_core::apply_overrides(spec, app).map_err(|e| e.to_string()));
    if let Ok(spec) = &built {
        for d in &spec.deployments {
            placeable(&d.config.resources, &scenario.cluster.groups)
                .map_err(|why| format!("deployment '{}': {why}", d.name))?;
        }
    }
    Ok(DeclaredApp {
        name: name.to_owned(),
        built,
        broken,
    })
}

/// Whether a replica reserving `r` fits an empty node of some group.
fn placeable(r: &flotilla::Resources, groups: &[NodeGroup]) -> std::result::Result<(), String> {
    if !r.custom.is_empty() {
        let names: Vec<&str> = r.custom.keys().map(String::as_str).collect();
        return Err(format!(
            "asks for custom resources ({}), which the simulated cluster does not offer",
            names.join(", ")
        ));
    }
    if groups.iter().any(|g| g.holds(r)) {
        Ok(())
    } else {
        Err(format!(
            "a replica reserves {} CPUs, {} bytes of memory and {} GPUs: no simulated node is that large, it would never be placed",
            r.cpus, r.memory_bytes, r.gpus
        ))
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
