//! Whole-batch validation: O(size of the batch), whatever is deployed.

use std::collections::{HashMap, HashSet};

use flotilla_core::{AppName, ApplicationSpec, RoutePrefix};
use flotilla_replica::Registry;

use crate::ServeError;

/// Check a deploy batch against itself, the registry and the live route index:
/// not empty, every spec valid, names unique, every deployment's code registered,
/// prefixes unique. An application redeployed under its own name keeps its own
/// prefix; an application being deleted holds none (it is not in `routes`).
pub(crate) fn validate_batch(
    apps: &[ApplicationSpec],
    registry: &Registry,
    routes: &HashMap<RoutePrefix, AppName>,
) -> Result<(), ServeError> {
    if apps.is_empty() {
        return Err(ServeError::NoApplications);
    }
    let mut names = HashSet::with_capacity(apps.len());
    let mut prefixes: HashMap<&RoutePrefix, &AppName> = HashMap::with_capacity(apps.len());
    for app in apps {
        validate_app(app, registry)?;
        if !names.insert(&app.name) {
            return Err(ServeError::DuplicateApp {
                app: app.name.to_string(),
            });
        }
        if let Some(p) = &app.route_prefix {
            if let Some(other) = prefixes.insert(p, &app.name) {
                return Err(ServeError::RouteTaken {
                    app: app.name.to_string(),
                    prefix: p.to_string(),
                    holder: other.to_string(),
                });
            }
            if let Some(holder) = routes.get(p)
                && holder != &app.name
            {
                return Err(ServeError::RouteTaken {
                    app: app.name.to_string(),
                    prefix: p.to_string(),
                    holder: holder.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// One application on its own: a valid spec whose every deployment names
/// registered code.
pub(crate) fn validate_app(app: &ApplicationSpec, registry: &Registry) -> Result<(), ServeError> {
    app.validate()?;
    match app
        .deployments
        .iter()
        .find(|d| !registry.contains(d.import_path.as_str()))
    {
        Some(d) => Err(ServeError::NotRegistered {
            app: app.name.to_string(),
            deployment: Some(d.name.to_string()),
            import_path: d.import_path.to_string(),
        }),
        None => Ok(()),
    }
}
