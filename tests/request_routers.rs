//! Request routers as registered code: a deployment's
//! `request_router_config.request_router_class` picks one from the Registry
//! (Ray's default paths are the built-in router), its kwargs reach its
//! factory, a change applies in place, and an unregistered class or refused
//! kwargs are refused at the call naming where.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{collections::BTreeMap, sync::Arc};

use flotilla::{
    ApplicationSpec, Args, Deployment, DeploymentSpec, Registry, ReplicaEndpoint, RequestRouter,
    RequestRouterConfig, RoutingRequest, Serve, ServeConfig, ServeError, UserError,
};

/// Answers with its replica id.
struct WhoAmI(u64);

impl Deployment for WhoAmI {
    type Request = ();
    type Response = u64;
    async fn handle(&self, _: ()) -> Result<u64, UserError> {
        Ok(self.0)
    }
}

/// Always the replica with the lowest id (or the highest, with
/// `{"highest": true}`), when it has room.
struct Pinned {
    highest: bool,
}

impl RequestRouter for Pinned {
    fn choose(&self, _: &RoutingRequest<'_>, replicas: &[Arc<ReplicaEndpoint>]) -> Option<usize> {
        let by_id = (0..replicas.len()).map(|i| (replicas[i].id(), i));
        let (_, i) = if self.highest {
            by_id.max()?
        } else {
            by_id.min()?
        };
        replicas[i].has_room().then_some(i)
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PinnedKwargs {
    #[serde(default)]
    highest: bool,
}

/// Holds back every request for the model `held` (`None`: wait), and sends
/// the others to the first replica with room.
struct HoldBack;

impl RequestRouter for HoldBack {
    fn choose(
        &self,
        request: &RoutingRequest<'_>,
        replicas: &[Arc<ReplicaEndpoint>],
    ) -> Option<usize> {
        if request.model_id() == Some("held") {
            return None;
        }
        (0..replicas.len()).find(|&i| replicas[i].has_room())
    }
}

/// Takes 10 ms, then answers with its replica id.
struct Nap(u64);

impl Deployment for Nap {
    type Request = ();
    type Response = u64;
    async fn handle(&self, _: ()) -> Result<u64, UserError> {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        Ok(self.0)
    }
}

fn registry() -> Registry {
    Registry::new()
        .register("rt::WhoAmI", |ctx| async move { Ok(WhoAmI(ctx.replica.0)) })
        .unwrap()
        .register("rt::Nap", |ctx| async move { Ok(Nap(ctx.replica.0)) })
        .unwrap()
        .register_request_router("rt.routers:HoldBack", |_: &Args| Ok(HoldBack))
        .unwrap()
        .register_request_router("rt.routers:Pinned", |kwargs: &Args| {
            let k: PinnedKwargs = kwargs.decode().map_err(|e| UserError::new(e.to_string()))?;
            Ok(Pinned { highest: k.highest })
        })
        .unwrap()
        .register_app("rt:app", |_args| async {
            ApplicationSpec::builder("unnamed")
                .deployment(DeploymentSpec::builder("who", "rt::WhoAmI").replicas(3))
                .build()
                .map_err(|e| UserError::new(e.to_string()))
        })
        .unwrap()
}

fn app(router: RequestRouterConfig) -> ApplicationSpec {
    ApplicationSpec::builder("rt")
        .deployment(
            DeploymentSpec::builder("who", "rt::WhoAmI")
                .replicas(3)
                .with_config(|c| c.with_request_router(router)),
        )
        .build()
        .unwrap()
}

/// The `Pinned` router with `kwargs`: `{}`, `{highest: true}`, or a field it
/// refuses.
fn pinned(kwargs: &str) -> RequestRouterConfig {
    let kwargs = match kwargs {
        "" => Args::empty_map(),
        "highest" => Args::encode(&BTreeMap::from([("highest", true)])).unwrap(),
        other => Args::encode(&BTreeMap::from([("unknown", other)])).unwrap(),
    };
    RequestRouterConfig {
        request_router_class: "rt.routers:Pinned".try_into().unwrap(),
        request_router_kwargs: kwargs,
        ..RequestRouterConfig::default()
    }
}

async fn answers(serve: &Serve, n: usize) -> Vec<u64> {
    let h = serve.app_handle("rt").unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(h.call::<_, u64>(&()).await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_registered_router_routes_its_deployment_and_changes_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_with(&dir, registry()).await;
    serve.run(app(pinned(""))).await.unwrap();
    let ids: Vec<u64> = support::observe(&serve, "rt", "who")
        .await
        .replicas
        .iter()
        .map(|r| r.id.0)
        .collect();
    let (lowest, highest) = (*ids.iter().min().unwrap(), *ids.iter().max().unwrap());
    assert!(answers(&serve, 20).await.iter().all(|r| *r == lowest));
    // New kwargs: a config-only change, the same replicas, the new router.
    serve.run(app(pinned("highest"))).await.unwrap();
    assert!(answers(&serve, 20).await.iter().all(|r| *r == highest));
    let now: Vec<u64> = support::observe(&serve, "rt", "who")
        .await
        .replicas
        .iter()
        .map(|r| r.id.0)
        .collect();
    assert_eq!(now, ids);
    // Ray's default class: the built-in power of two choices, which spreads.
    serve
        .run(app(RequestRouterConfig::default()))
        .await
        .unwrap();
    let mut seen = answers(&serve, 60).await;
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn unregistered_classes_and_refused_kwargs_are_refused_naming_where() {
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_with(&dir, registry()).await;
    let unknown = RequestRouterConfig {
        request_router_class: "rt.routers:Missing".try_into().unwrap(),
        ..RequestRouterConfig::default()
    };
    let e = serve.run(app(unknown)).await.unwrap_err();
    match &e {
        ServeError::NotRegisteredAt {
            app,
            deployment,
            field,
            import_path,
            ..
        } => {
            assert_eq!(
                (
                    app.as_str(),
                    deployment.as_deref(),
                    *field,
                    import_path.as_str()
                ),
                (
                    "rt",
                    Some("who"),
                    "request_router_config.request_router_class",
                    "rt.routers:Missing"
                )
            );
        }
        other => panic!("expected NotRegisteredAt, got {other}"),
    }
    assert!(
        e.to_string().contains("Registry::register_request_router"),
        "{e}"
    );
    let e = serve.run(app(pinned("bogus"))).await.unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.contains("'rt'")
            && shown.contains("'who'")
            && shown.contains("request_router_config.request_router_kwargs")
            && shown.contains("rt.routers:Pinned"),
        "{shown}"
    );
    assert!(serve.status().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_config_names_a_registered_router_by_its_class() {
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_with(&dir, registry()).await;
    let with = |class: &str, kwargs: &str| {
        ServeConfig::from_yaml(&format!(
            "applications:\n  - name: rt\n    import_path: rt:app\n    deployments:\n      - name: who\n        request_router_config:\n          request_router_class: {class}\n          request_router_kwargs: {kwargs}\n"
        ))
        .unwrap()
    };
    let config = |class: &str| with(class, "{highest: true}");
    let e = serve
        .apply_config(config("rt.routers:Nope"))
        .await
        .unwrap_err();
    assert!(matches!(e, ServeError::NotRegisteredAt { .. }), "{e}");
    // Kwargs its factory refuses: refused at the call, as `run` refuses them
    // (not acknowledged, then DEPLOY_FAILED at the build).
    let e = serve
        .apply_config(with("rt.routers:Pinned", "{unknown: bogus}"))
        .await
        .unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.contains("'rt'")
            && shown.contains("'who'")
            && shown.contains("request_router_config.request_router_kwargs"),
        "{shown}"
    );
    assert!(
        serve.status().is_empty(),
        "a refused config leaves no trace"
    );
    assert_eq!(serve.applied_config().await.unwrap(), None);
    serve
        .apply_config(config("rt.routers:Pinned"))
        .await
        .unwrap();
    support::wait_status(&serve, "rt", flotilla::ApplicationStatus::Running).await;
    let ids: Vec<u64> = support::observe(&serve, "rt", "who")
        .await
        .replicas
        .iter()
        .map(|r| r.id.0)
        .collect();
    let highest = *ids.iter().max().unwrap();
    assert!(answers(&serve, 10).await.iter().all(|r| *r == highest));
}

#[tokio::test(start_paused = true)]
async fn a_recovered_deployment_whose_router_is_no_longer_registered_is_deploy_failed_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_with(&dir, registry()).await;
    serve.run(app(pinned(""))).await.unwrap();
    serve.shutdown().await.unwrap();
    // The same program, restarted without the router class.
    let without = Registry::new()
        .register("rt::WhoAmI", |ctx| async move { Ok(WhoAmI(ctx.replica.0)) })
        .unwrap();
    let serve = support::start_with(&dir, without).await;
    let s = support::wait_status(&serve, "rt", flotilla::ApplicationStatus::DeployFailed).await;
    assert!(s.message.contains("rt.routers:Pinned"), "{}", s.message);
    // It goes on serving, with the built-in router, and stays DEPLOY_FAILED
    // once its replicas are all up (it turned RUNNING, naming nothing, before).
    support::wait_snapshot(&serve, "rt", "who", |d| d.live() == 3).await;
    assert_eq!(answers(&serve, 5).await.len(), 5);
    let s = serve.app_status("rt");
    assert_eq!(s.status, flotilla::ApplicationStatus::DeployFailed, "{s:?}");
    // A target whose router is registered again (the built-in one) clears it.
    serve
        .run(app(RequestRouterConfig::default()))
        .await
        .unwrap();
    assert_eq!(
        serve.app_status("rt").status,
        flotilla::ApplicationStatus::Running
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_its_router_holds_back_does_not_hold_back_the_queue_behind_it() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let serve = support::start_with(&dir, registry()).await;
    let router = RequestRouterConfig {
        request_router_class: "rt.routers:HoldBack".try_into().unwrap(),
        ..RequestRouterConfig::default()
    };
    let spec = ApplicationSpec::builder("hold")
        .deployment(
            DeploymentSpec::builder("nap", "rt::Nap")
                .with_config(|c| c.with_max_ongoing_requests(1).with_request_router(router)),
        )
        .build()
        .unwrap();
    let h = serve.run(spec).await.unwrap();
    let start = tokio::time::Instant::now();
    let call =
        |h: flotilla::DeploymentHandle| tokio::spawn(async move { h.call::<_, u64>(&()).await });
    // The one slot is busy; a request the router holds back queues first, then
    // one it would route.
    let running = call(h.clone());
    tokio::time::sleep(Duration::from_millis(1)).await;
    let held = call(
        h.clone()
            .with_model_id("held")
            .unwrap()
            .with_timeout(Duration::from_secs(1)),
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    let behind = call(h.clone());
    running.await.unwrap().unwrap();
    // The slot freed: the held-back request keeps its place, and the one behind
    // it runs at once rather than when the held one gives up.
    behind.await.unwrap().unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(30),
        "{:?}",
        start.elapsed()
    );
    // A newcomer behind the held-back request runs too.
    h.call::<_, u64>(&()).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(40),
        "{:?}",
        start.elapsed()
    );
    let err = held.await.unwrap().unwrap_err();
    assert!(matches!(err, flotilla::CallError::Timeout { .. }), "{err}");
}
