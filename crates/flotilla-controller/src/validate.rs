//! Whole-batch validation: O(size of the batch), whatever is deployed.

use std::collections::{HashMap, HashSet};

use flotilla_core::{AppName, ApplicationSpec, RoutePrefix};

use crate::ServeError;

/// Check a deploy batch against itself and against the live route index. An
/// application redeployed under its own name keeps its own prefix; an application
/// being deleted holds none (it is not in `routes`).
pub(crate) fn validate_batch(
    apps: &[ApplicationSpec],
    routes: &HashMap<RoutePrefix, AppName>,
) -> Result<(), ServeError> {
    let mut names = HashSet::with_capacity(apps.len());
    let mut prefixes: HashMap<&RoutePrefix, &AppName> = HashMap::with_capacity(apps.len());
    for app in apps {
        app.validate()?;
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
