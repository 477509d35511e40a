//! Logging settings per application and deployment, kept current by the
//! Controller and read by the facade's tracing layer.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use flotilla_core::{AppName, ApplicationSpec, DeploymentName, LoggingConfig};

/// The global logging config, each application's override and each
/// deployment's. Cheap to clone; shared by the Controller (which writes it as
/// targets change) and the log layer (which reads it for every event).
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    inner: Arc<RwLock<Inner>>,
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
#[derive(Debug, Default)]
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

    /// Set the program's global config (applications without their own use
    /// it, unless the applied config file has a top-level `logging_config`).
    pub fn set_global(&self, config: LoggingConfig) {
        self.inner.write().unwrap_or_else(|p| p.into_inner()).global = config;
    }

    /// Take the top-level `logging_config` of the config file applied now
    /// (`None`: it has none, and the program's global config applies again).
    /// The Controller calls it as a config is applied and as it recovers one.
    pub fn set_config_global(&self, config: Option<LoggingConfig>) {
        self.inner
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .from_config = config;
    }

    /// Set (`Some`) or clear (`None`) one application's override; clearing
    /// also drops its deployments' overrides (it is gone).
    pub fn set_app(&self, app: &AppName, config: Option<LoggingConfig>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match config {
            Some(c) => inner.apps.entry(app.clone()).or_default().config = Some(c),
            None => {
                inner.apps.remove(app);
            }
        }
    }

    /// Take the logging of `spec`, an application's target: its own config and
    /// each deployment's.
    pub fn set_target(&self, spec: &ApplicationSpec) {
        let deployments: HashMap<DeploymentName, LoggingConfig> = spec
            .deployments
            .iter()
            .filter_map(|d| Some((d.name.clone(), d.config.logging.clone()?)))
            .collect();
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if spec.logging.is_none() && deployments.is_empty() {
            inner.apps.remove(&spec.name);
            return;
        }
        inner.apps.insert(
            spec.name.clone(),
            AppLogging {
                config: spec.logging.clone(),
                deployments,
            },
        );
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
