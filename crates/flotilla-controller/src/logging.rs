//! Logging settings per application, kept current by the Controller and read by the
//! facade's tracing layer.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use flotilla_core::{AppName, LoggingConfig};

/// The global logging config and each application's override. Cheap to clone;
/// shared by the Controller (which writes it as targets change) and the log layer
/// (which reads it for every event).
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    inner: Arc<RwLock<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    global: LoggingConfig,
    apps: HashMap<AppName, LoggingConfig>,
}

impl LogSettings {
    /// Defaults everywhere (INFO, text, access logs on).
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the global config (applications without their own use it).
    pub fn set_global(&self, config: LoggingConfig) {
        self.inner.write().unwrap_or_else(|p| p.into_inner()).global = config;
    }

    /// Set (`Some`) or clear (`None`) one application's override.
    pub fn set_app(&self, app: &AppName, config: Option<LoggingConfig>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match config {
            Some(c) => {
                inner.apps.insert(app.clone(), c);
            }
            None => {
                inner.apps.remove(app);
            }
        }
    }

    /// The config that applies to events of `app` (`None`: not an application's).
    pub fn for_app(&self, app: Option<&str>) -> LoggingConfig {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        app.and_then(|a| inner.apps.get(a))
            .unwrap_or(&inner.global)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::LogLevel;

    use super::*;

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
