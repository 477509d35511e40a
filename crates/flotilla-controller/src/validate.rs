//! Whole-batch validation: O(size of the batch), whatever is deployed.

use std::collections::{HashMap, HashSet};

use flotilla_core::{
    AppName, ApplicationSpec, DEFAULT_MAX_NUM_MODELS_PER_REPLICA, ReplicaCount, RoutePrefix,
};
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

/// Why an unregistered autoscaling policy is refused.
pub(crate) const POLICY_NOT_REGISTERED: &str = "register the policy with \
    Registry::register_autoscaling_policy, or name Ray's default policy \
    (ray.serve.autoscaling_policy:default_autoscaling_policy) for the built-in one";

/// Why an unregistered request router is refused.
pub(crate) const ROUTER_NOT_REGISTERED: &str = "register the router with \
    Registry::register_request_router, or name Ray's default router \
    (ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter) for the built-in one";

/// One application on its own: a valid spec whose every deployment names
/// registered code (code that accepts batches where its config batches, and
/// multiplexed code where it limits the models a replica keeps), and
/// whose autoscaling policies and request routers are registered (or Ray's
/// defaults, the built-in ones).
pub(crate) fn validate_app(app: &ApplicationSpec, registry: &Registry) -> Result<(), ServeError> {
    app.validate()?;
    for d in &app.deployments {
        let unregistered = |field, import_path: &str, reason| ServeError::NotRegisteredAt {
            app: app.name.to_string(),
            deployment: Some(d.name.to_string()),
            field,
            import_path: import_path.to_owned(),
            reason,
        };
        if !registry.contains(d.import_path.as_str()) {
            return Err(ServeError::NotRegistered {
                app: app.name.to_string(),
                deployment: Some(d.name.to_string()),
                import_path: d.import_path.to_string(),
            });
        }
        if d.config.batching.is_some() && !registry.accepts_batches(d.import_path.as_str()) {
            return Err(ServeError::NotBatched {
                app: app.name.to_string(),
                deployment: d.name.to_string(),
                import_path: d.import_path.to_string(),
            });
        }
        if d.config.max_num_models_per_replica != Some(DEFAULT_MAX_NUM_MODELS_PER_REPLICA)
            && !registry.multiplexes(d.import_path.as_str())
        {
            return Err(ServeError::NotMultiplexed {
                app: app.name.to_string(),
                deployment: d.name.to_string(),
                import_path: d.import_path.to_string(),
            });
        }
        if let ReplicaCount::Auto(a) = &d.config.num_replicas
            && !registry.contains_autoscaling_policy(a.policy.policy_function.as_str())
        {
            return Err(unregistered(
                "autoscaling_config.policy.policy_function",
                a.policy.policy_function.as_str(),
                POLICY_NOT_REGISTERED,
            ));
        }
        check_router(
            registry,
            &d.config.request_router,
            app.name.as_str(),
            d.name.as_str(),
        )?;
    }
    Ok(())
}

/// `router` is registered, and (one not built in) its factory takes its
/// kwargs: else the error names the field, in `app`'s `deployment`.
pub(crate) fn check_router(
    registry: &Registry,
    router: &flotilla_core::RequestRouterConfig,
    app: &str,
    deployment: &str,
) -> Result<(), ServeError> {
    let class = router.request_router_class.as_str();
    if !registry.contains_request_router(class) {
        return Err(ServeError::NotRegisteredAt {
            app: app.to_owned(),
            deployment: Some(deployment.to_owned()),
            field: "request_router_config.request_router_class",
            import_path: class.to_owned(),
            reason: ROUTER_NOT_REGISTERED,
        });
    }
    if router.is_builtin() {
        return Ok(());
    }
    registry.request_router(router).map(|_| ()).map_err(|e| {
        flotilla_core::Error::InvalidField {
            at: flotilla_core::Location {
                app: Some(app.to_owned()),
                deployment: Some(deployment.to_owned()),
            },
            field: "request_router_config.request_router_kwargs",
            reason: e.to_string(),
        }
        .into()
    })
}
