//! Logging settings per application and deployment: kept current by the
//! Controller (and, in a node process, by its head), read by the facade's
//! tracing layer wherever replicas run.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock, RwLockWriteGuard},
};

use flotilla_core::{AppName, ApplicationSpec, DeploymentName, LoggingConfig};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The global logging config, each application's override and each
/// deployment's. Cheap to clone; shared by the Controller (which writes it as
/// targets change), the log layer (which reads it for every event) and, on a
/// head, the task that sends it to the nodes ([`subscribe`](Self::subscribe),
/// [`snapshot`](Self::snapshot)), which take it whole
/// ([`replace`](Self::replace)).
#[derive(Debug, Clone)]
pub struct LogSettings {
    inner: Arc<RwLock<Inner>>,
    /// Bumped after every change.
    changes: Arc<watch::Sender<u64>>,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            inner: Arc::default(),
            changes: Arc::new(watch::Sender::new(0)),
        }
    }
}

/// [`LogSettings`] as a value: the global config in force, and every
/// application's and deployment's own. What a head sends its nodes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LogSnapshot {
    /// The global config in force (the applied config file's, else the
    /// program's).
    pub global: LoggingConfig,
    /// Each application with settings of its own, by name.
    pub apps: Vec<AppLogSnapshot>,
}

/// One application's settings in a [`LogSnapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppLogSnapshot {
    /// The application.
    pub name: AppName,
    /// Its own config (else the global one applies).
    pub config: Option<LoggingConfig>,
    /// Its deployments' own, by name.
    pub deployments: Vec<(DeploymentName, LoggingConfig)>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The program's ([`LogSettings::set_global`]).
    global: LoggingConfig,
    /// The applied config file's top-level `logging_config`, which stands
    /// in for the program's while that config is applied.
    from_config: Option<LoggingConfig>,
    apps: HashMap<AppName, AppLogging>,
}

impl Inner {
    fn global(&self) -> &LoggingConfig {
        self.from_config.as_ref().unwrap_or(&self.global)
    }
}

/// One application's overrides.
#[derive(Debug, Clone, PartialEq, Default)]
struct AppLogging {
    /// Its own (else the global one).
    config: Option<LoggingConfig>,
    /// Its deployments' own (Ray's per-deployment `logging_config`).
    deployments: HashMap<DeploymentName, LoggingConfig>,
}

impl LogSettings {
    /// Defaults everywhere (INFO, text, access logs on).
    pub fn new() -> Self {
        Self::default()
    }

    /// Change the settings, then tell the subscribers if `change` says it
    /// changed something.
    fn write(&self, change: impl FnOnce(&mut Inner) -> bool) {
        if change(&mut self.lock()) {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn lock(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that sees a change after every change of the settings.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The settings now, as a value.
    pub fn snapshot(&self) -> LogSnapshot {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let mut apps: Vec<_> = inner
            .apps
            .iter()
            .map(|(name, a)| {
                let mut deployments: Vec<_> = a
                    .deployments
                    .iter()
                    .map(|(d, c)| (d.clone(), c.clone()))
                    .collect();
                deployments.sort_by(|x, y| x.0.cmp(&y.0));
                AppLogSnapshot {
                    name: name.clone(),
                    config: a.config.clone(),
                    deployments,
                }
            })
            .collect();
        apps.sort_by(|x, y| x.name.cmp(&y.name));
        LogSnapshot {
            global: inner.global().clone(),
            apps,
        }
    }

    /// Take `snapshot` in place of every setting (a node, from its head): its
    /// global config stands in for this process's own, as an applied config
    /// file's does.
    pub fn replace(&self, snapshot: LogSnapshot) {
        self.write(|inner| {
            inner.from_config = Some(snapshot.global);
            inner.apps = snapshot
                .apps
                .into_iter()
                .map(|app| {
                    let logging = AppLogging {
                        config: app.config,
                        deployments: app.deployments.into_iter().collect(),
                    };
                    (app.name, logging)
                })
                .collect();
            true
        });
    }

    /// Set the program's global config (applications without their own use
    /// it, unless the applied config file has a top-level `logging_config`).
    pub fn set_global(&self, config: LoggingConfig) {
        self.write(|inner| std::mem::replace(&mut inner.global, config) != inner.global);
    }

    /// Take the top-level `logging_config` of the config file applied now
    /// (`None`: it has none, and the program's global config applies again).
    /// The Controller calls it as a config is applied and as it recovers one.
    pub fn set_config_global(&self, config: Option<LoggingConfig>) {
        self.write(|inner| std::mem::replace(&mut inner.from_config, config) != inner.from_config);
    }

    /// Set (`Some`) or clear (`None`) one application's override; clearing
    /// also drops its deployments' overrides (it is gone).
    pub fn set_app(&self, app: &AppName, config: Option<LoggingConfig>) {
        self.write(|inner| match config {
            Some(c) => {
                let app = inner.apps.entry(app.clone()).or_default();
                app.config.replace(c.clone()) != Some(c)
            }
            None => inner.apps.remove(app).is_some(),
        });
    }

    /// Take the logging of `spec`, an application's target: its own config and
    /// each deployment's.
    pub fn set_target(&self, spec: &ApplicationSpec) {
        let deployments: HashMap<DeploymentName, LoggingConfig> = spec
            .deployments
            .iter()
            .filter_map(|d| Some((d.name.clone(), d.config.logging.clone()?)))
            .collect();
        self.write(|inner| {
            if spec.logging.is_none() && deployments.is_empty() {
                return inner.apps.remove(&spec.name).is_some();
            }
            let new = AppLogging {
                config: spec.logging.clone(),
                deployments,
            };
            if inner.apps.get(&spec.name) == Some(&new) {
                return false;
            }
            inner.apps.insert(spec.name.clone(), new);
            true
        });
    }

    /// The config that applies to events of `app` (`None`: not an application's).
    pub fn for_app(&self, app: Option<&str>) -> LoggingConfig {
        self.for_event(app, None)
    }

    /// The config that applies to an event of `deployment` of `app`: the
    /// deployment's own, else the application's, else the global one.
    pub fn for_event(&self, app: Option<&str>, deployment: Option<&str>) -> LoggingConfig {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some(a) = app.and_then(|a| inner.apps.get(a)) else {
            return inner.global().clone();
        };
        deployment
            .and_then(|d| a.deployments.get(d))
            .or(a.config.as_ref())
            .unwrap_or_else(|| inner.global())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::LogLevel;

    use super::*;

    #[test]
    fn a_config_files_logging_stands_in_for_the_programs_while_applied() {
        let s = LogSettings::new();
        let level = |s: &LogSettings| s.for_app(None).log_level;
        s.set_global(LoggingConfig {
            log_level: LogLevel::Debug,
            ..Default::default()
        });
        s.set_config_global(Some(LoggingConfig {
            log_level: LogLevel::Warning,
            ..Default::default()
        }));
        assert_eq!(level(&s), LogLevel::Warning);
        // A config without one: the program's again, not the default.
        s.set_config_global(None);
        assert_eq!(level(&s), LogLevel::Debug);
    }

    #[test]
    fn a_snapshot_replaces_another_processs_settings_whole_and_changes_are_told() {
        let head = LogSettings::new();
        let debug = LoggingConfig {
            log_level: LogLevel::Debug,
            ..Default::default()
        };
        let warning = LoggingConfig {
            log_level: LogLevel::Warning,
            ..Default::default()
        };
        let mut changes = head.subscribe();
        head.set_config_global(Some(warning.clone()));
        head.set_app(&AppName::new("a").unwrap(), Some(debug.clone()));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        // Setting what is already set is no change (nothing to send).
        head.set_app(&AppName::new("a").unwrap(), Some(debug.clone()));
        head.set_app(&AppName::new("b").unwrap(), None);
        head.set_config_global(Some(warning.clone()));
        assert!(!changes.has_changed().unwrap());

        let node = LogSettings::new();
        let told = node.subscribe();
        node.set_app(&AppName::new("stale").unwrap(), Some(warning.clone()));
        node.replace(head.snapshot());
        assert!(told.has_changed().unwrap());
        assert_eq!(node.for_app(Some("a")), debug);
        assert_eq!(node.for_app(Some("b")), warning, "the head's global config");
        assert_eq!(node.for_app(Some("stale")), warning, "its own is gone");
        assert_eq!(node.snapshot(), head.snapshot());
    }

    #[test]
    fn an_application_override_wins_over_the_global_config() {
        let s = LogSettings::new();
        let a = AppName::new("a").unwrap();
        s.set_global(LoggingConfig {
            log_level: LogLevel::Warning,
            ..Default::default()
        });
        s.set_app(
            &a,
            Some(LoggingConfig {
                log_level: LogLevel::Debug,
                ..Default::default()
            }),
        );
        assert_eq!(s.for_app(Some("a")).log_level, LogLevel::Debug);
        assert_eq!(s.for_app(Some("b")).log_level, LogLevel::Warning);
        assert_eq!(s.for_app(None).log_level, LogLevel::Warning);
        s.set_app(&a, None);
        assert_eq!(s.for_app(Some("a")).log_level, LogLevel::Warning);
    }
}
