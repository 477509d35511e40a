//! The embedding API's contract, each rule a test through the public API only:
//! what a call refuses, what a status shows from the first moment, what a
//! handle does once its instance is gone, how instances keep to their own
//! namespace, and what dropping a `Serve` leaves behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use flotilla::{
    ApiType, ApplicationSpec, ApplicationSpecBuilder, ApplicationStatus as A, CallError,
    DeploymentSpec, DeploymentSpecBuilder, DeploymentStatus, DeploymentTarget, DeploymentVersion,
    LocalCluster, MAX_REPLICAS, NotRunning, ReplicaInfo, RolloutConfig, Serve, ServeConfig,
    ServeError, ServeOptions, SpecError,
};
use support::{
    ProbeArgs, Switches, app, app_of, no_wait, observe, options, probe, registry, start_fresh, tag,
    wait_snapshot, wait_status,
};

#[tokio::test(start_paused = true)]
async fn an_empty_batch_is_refused_and_delete_takes_any_names() {
    let (_dir, _, serve) = start_fresh().await;
    let err = serve.run_many(vec![], no_wait()).await.unwrap_err();
    assert!(matches!(err, ServeError::NoApplications), "{err}");
    assert_eq!(err.to_string(), "no applications provided");
    serve
        .run_many(
            vec![app("a", 1, tag("x")), app("b", 1, tag("x"))],
            no_wait(),
        )
        .await
        .unwrap();
    let names: Vec<String> = vec!["a".to_owned(), "b".to_owned()];
    serve.delete_apps(names, true).await.unwrap();
    serve
        .delete_apps(std::iter::empty::<&str>(), true)
        .await
        .unwrap();
    assert!(serve.status().is_empty());
}

/// A start that fails (node options that do not validate, a node port in
/// use) leaves no store file behind where there was none.
#[tokio::test]
async fn a_failed_start_leaves_no_store_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let file = dir.path().join("f.redb");
    let cookie = || flotilla::Cookie::new("a-test-cookie").unwrap();
    let bad_id = flotilla::HeadOptions::new(cookie())
        .listen("127.0.0.1:0".parse().unwrap())
        .node_id("not/an id");
    let err = Serve::start(options(&dir, registry(&sw)).nodes(bad_id))
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::Nodes(_)), "{err}");
    assert!(!file.exists(), "{err}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let in_use = flotilla::HeadOptions::new(cookie()).listen(taken.local_addr().unwrap());
    let err = Serve::start(options(&dir, registry(&sw)).nodes(in_use))
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::Nodes(_)), "{err}");
    assert!(!file.exists(), "{err}");
    // A store that was there stays, as it was.
    Serve::start(options(&dir, registry(&sw)))
        .await
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    let in_use = flotilla::HeadOptions::new(cookie()).listen(taken.local_addr().unwrap());
    Serve::start(options(&dir, registry(&sw)).nodes(in_use))
        .await
        .unwrap_err();
    assert!(file.exists());
}

#[tokio::test(start_paused = true)]
async fn unregistered_code_is_refused_naming_it_and_nothing_is_committed() {
    let (_dir, _, serve) = start_fresh().await;
    let before = serve.metrics().await.unwrap().store.commits;
    let bad = ApplicationSpec::builder("shop")
        .deployment(DeploymentSpec::builder("front", "test::Probe"))
        .deployment(DeploymentSpec::builder("back", "test::Missing"))
        .build()
        .unwrap();
    let err = serve
        .run_many(vec![app("fine", 1, tag("x")), bad], no_wait())
        .await
        .unwrap_err();
    let ServeError::NotRegistered {
        app,
        deployment,
        import_path,
    } = &err
    else {
        panic!("expected NotRegistered, got {err}");
    };
    assert_eq!(
        (app.as_str(), deployment.as_deref(), import_path.as_str()),
        ("shop", Some("back"), "test::Missing")
    );
    assert!(err.to_string().contains("'test::Missing'"), "{err}");
    assert_eq!(serve.metrics().await.unwrap().store.commits, before);
    assert!(serve.status().is_empty(), "the whole batch was refused");
}

#[tokio::test(start_paused = true)]
async fn a_status_shows_every_target_deployment_how_and_when_it_was_deployed() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let serve = Serve::start(options(&dir, registry(&sw)).clock(Arc::new(move || at)))
        .await
        .unwrap();
    // Slow constructors: nothing can report HEALTHY before the first look.
    let slow = support::ProbeArgs {
        start_delay_ms: 1_000,
        ..tag("f")
    };
    let two = ApplicationSpec::builder("two")
        .deployment(probe(1, &slow))
        .deployment(DeploymentSpec::builder("back", "test::Probe").init_args(&slow))
        .build()
        .unwrap();
    serve.run_many(vec![two], no_wait()).await.unwrap();
    // At once, before any deployment reported: both are there, UPDATING.
    let s = serve.app_status("two");
    assert_eq!(s.status, A::Deploying);
    let names: Vec<&str> = s.deployments.keys().map(|d| d.as_str()).collect();
    assert_eq!(names, ["back", "probe"]);
    assert!(
        s.deployments
            .values()
            .all(|d| d.status == DeploymentStatus::Updating)
    );
    assert_eq!(
        (s.api_type, s.last_deployed),
        (Some(ApiType::Imperative), Some(at))
    );
    let running = wait_status(&serve, "two", A::Running).await;
    assert_eq!(running.last_deployed, Some(at));
    assert!(serve.app_status("nope").api_type.is_none());
}

#[tokio::test(start_paused = true)]
async fn an_application_recovered_while_deleting_is_deleting_from_the_first_status() {
    let (dir, sw, serve) = start_fresh().await;
    let h = serve.run(app("a", 1, tag("x"))).await.unwrap();
    // A request in flight keeps the replica draining, so the deletion is
    // under way when the process dies.
    let call = tokio::spawn(async move { h.call::<_, String>("sleep:5000").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    serve.delete_apps(["a"], false).await.unwrap();
    serve.crash_process().await;
    call.abort();
    let serve = support::start(&dir, &sw).await;
    assert_eq!(serve.app_status("a").status, A::Deleting);
    serve.delete_apps(["a"], true).await.unwrap();
    assert_eq!(serve.app_status("a").status, A::NotStarted);
}

#[tokio::test(start_paused = true)]
async fn a_handle_to_a_deployment_the_application_lacks_is_not_found() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app("a", 1, tag("x"))).await.unwrap();
    assert!(serve.deployment_handle("a", "probe").is_ok());
    let err = serve.deployment_handle("a", "nope").unwrap_err();
    let ServeError::NotFound { app, deployment } = &err else {
        panic!("expected NotFound, got {err}");
    };
    assert_eq!((app.as_str(), deployment.as_deref()), ("a", Some("nope")));
    assert_eq!(err.to_string(), "application 'a' has no deployment 'nope'");
    assert!(matches!(
        serve.deployment_handle("b", "probe"),
        Err(ServeError::NotFound {
            deployment: None,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn after_shutdown_handles_are_unavailable_and_no_call_waits_forever() {
    let (_dir, _, serve) = start_fresh().await;
    let running = serve.run(app("a", 1, tag("x"))).await.unwrap();
    // A deployment at zero replicas: its calls queue, waiting for one.
    serve
        .run_many(vec![app("idle", 0, tag("x"))], no_wait())
        .await
        .unwrap();
    wait_status(&serve, "idle", A::Running).await;
    let queued_handle = serve.app_handle("idle").unwrap();
    let queued = tokio::spawn(async move { queued_handle.call::<_, String>("x").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!queued.is_finished(), "it waits for a replica");
    serve.shutdown().await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(60), queued)
        .await
        .expect("the queued call returns")
        .unwrap();
    assert!(
        matches!(waited, Err(CallError::Unavailable { .. })),
        "{waited:?}"
    );
    let later = tokio::time::timeout(Duration::from_secs(60), running.call::<_, String>("x"))
        .await
        .expect("a call after shutdown returns");
    assert!(
        matches!(later, Err(CallError::Unavailable { .. })),
        "{later:?}"
    );
    for refused in [serve.app_handle("a"), serve.deployment_handle("a", "probe")] {
        assert!(matches!(refused, Err(ServeError::Unavailable(_))));
    }
}

/// A call waiting on a status (`run` for RUNNING, `delete_apps` for the
/// deletion) ends when the instance shuts down under it, with `Unavailable`:
/// no status moves after that, and the board keeps every channel open.
#[tokio::test(start_paused = true)]
async fn calls_waiting_on_a_status_end_when_the_instance_shuts_down() {
    let (_dir, _, serve) = start_fresh().await;
    // Deleting `stuck` waits an hour for its request to drain.
    let stuck = serve
        .run(app_of(
            "stuck",
            probe(1, &tag("g")).with_config(|c| {
                c.with_graceful_shutdown(Duration::from_secs(1), Duration::from_secs(3_600))
            }),
        ))
        .await
        .unwrap();
    let _hung = tokio::spawn(async move { stuck.call::<_, String>("hang").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let deleting = {
        let s = serve.clone();
        tokio::spawn(async move { s.delete_apps(["stuck"], true).await })
    };
    // `slow`'s replica takes an hour to construct: `run` waits for RUNNING.
    let slow = ProbeArgs {
        start_delay_ms: 3_600_000,
        ..tag("s")
    };
    let running = {
        let s = serve.clone();
        tokio::spawn(async move { s.run(app_of("slow", probe(1, &slow))).await.map(|_| ()) })
    };
    support::eventually("both applications", || serve.status().len() == 2).await;
    assert!(!deleting.is_finished() && !running.is_finished());
    // Its own drain is cut at the graceful timeout; the waits end with it.
    serve.shutdown().await.unwrap();
    for (what, waited) in [("run", running), ("delete_apps", deleting)] {
        let result = tokio::time::timeout(Duration::from_secs(60), waited)
            .await
            .unwrap_or_else(|_| panic!("{what} still waits after the shutdown"))
            .unwrap();
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                ServeError::Unavailable(NotRunning::StoppedWhileWaiting { .. })
            ),
            "{what}: {err}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_process_crash_handles_are_unavailable() {
    let (_dir, _, serve) = start_fresh().await;
    let h = serve.run(app("a", 1, tag("x"))).await.unwrap();
    serve.crash_process().await;
    let out = tokio::time::timeout(Duration::from_secs(60), h.call::<_, String>("x"))
        .await
        .expect("returns");
    assert!(matches!(out, Err(CallError::Unavailable { .. })), "{out:?}");
    assert!(matches!(
        serve.app_handle("a"),
        Err(ServeError::Unavailable(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn namespaces_are_validated_and_instances_keep_to_their_own() {
    let sw = Arc::new(Switches::default());
    for bad in ["x/inner", "", "a b", "tab\t"] {
        let dir = tempfile::tempdir().unwrap();
        let err = Serve::start(options(&dir, registry(&sw)).namespace(bad))
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                ServeError::Invalid(SpecError::InvalidName {
                    what: "namespace",
                    ..
                })
            ),
            "{bad:?}: {err}"
        );
    }
    let (d1, d2, d3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let outer = Serve::start(options(&d1, registry(&sw)).namespace("iso"))
        .await
        .unwrap();
    let err = Serve::start(options(&d3, registry(&sw)).namespace("iso"))
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::NamespaceInUse { .. }), "{err}");
    // A namespace that extends the other's name is another namespace.
    let inner = Serve::start(options(&d2, registry(&sw)).namespace("iso.inner"))
        .await
        .unwrap();
    outer.run(app("a", 2, tag("o"))).await.unwrap();
    let h = inner.run(app("a", 2, tag("i"))).await.unwrap();
    outer.shutdown().await.unwrap();
    assert!(outer.living_groups().is_empty());
    assert_eq!(
        inner.living_groups().iter().map(|(_, n)| n).sum::<usize>(),
        3,
        "its DeploymentActor and two replicas: {:?}",
        inner.living_groups()
    );
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "i:x");
    inner.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_replica_can_be_crashed_by_id_and_is_replaced() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app("a", 2, tag("x"))).await.unwrap();
    let before = observe(&serve, "a", "probe").await;
    let victim = before.replicas[0].id;
    assert!(serve.crash_replica("a", "probe", victim));
    let after = wait_snapshot(&serve, "a", "probe", |s| {
        s.replicas.len() == 2
            && s.replicas.iter().all(|r| r.id != victim)
            && s.count(flotilla::ReplicaState::Running) == 2
    })
    .await;
    assert!(after.replicas.iter().any(|r| r.id == before.replicas[1].id));
    assert!(!serve.crash_replica("a", "probe", victim), "already gone");
    assert!(!serve.crash_replica("a", "nope", victim));
    wait_status(&serve, "a", A::Running).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_serve_releases_its_store_for_the_next_start() {
    let (dir, sw, serve) = start_fresh().await;
    let h = serve.run(app("a", 1, tag("x"))).await.unwrap();
    drop(serve);
    // The instance stopped with it: nothing serves through its handles.
    let out = tokio::time::timeout(Duration::from_secs(60), h.call::<_, String>("x"))
        .await
        .expect("returns");
    assert!(matches!(out, Err(CallError::Unavailable { .. })), "{out:?}");
    let again = support::start(&dir, &sw).await;
    let h = again.app_handle("a").unwrap();
    wait_status(&again, "a", A::Running).await;
    assert_eq!(h.call::<_, String>("y").await.unwrap(), "x:y");
    again.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_target_beyond_the_local_capacity_is_pending_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(LocalCluster::with_capacity(2));
    let serve = Serve::start(options(&dir, registry(&sw)).cluster(cluster.clone()))
        .await
        .unwrap();
    // Another application holds one of the two places.
    serve.run(app("f", 1, tag("f"))).await.unwrap();
    serve
        .run_many(vec![app("a", 2, tag("x"))], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        s.count(flotilla::ReplicaState::Running) == 1 && s.pending == 1
    })
    .await;
    let reason = s.pending_reason.unwrap();
    assert!(reason.contains("at most 2 replicas"), "{reason}");
    assert_eq!(cluster.placed(), 2);
    let status = serve.app_status("a");
    assert_eq!(status.status, A::Deploying);
    assert!(
        status
            .deployments
            .values()
            .next()
            .unwrap()
            .message
            .contains("waiting for a node"),
        "{status:?}"
    );
    // Room frees: the pending replica is placed.
    serve.delete_apps(["f"], true).await.unwrap();
    wait_status(&serve, "a", A::Running).await;
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(
        (s.count(flotilla::ReplicaState::Running), s.pending),
        (2, 0)
    );
    assert_eq!(cluster.placed(), 2);
    serve.delete_apps(["a"], true).await.unwrap();
    assert_eq!(cluster.placed(), 0);
}

#[tokio::test(start_paused = true)]
async fn replica_counts_above_the_bound_are_refused() {
    let err = ApplicationSpec::builder("a")
        .deployment(DeploymentSpec::builder("d", "test::Probe").replicas(u32::MAX))
        .build()
        .unwrap_err();
    assert_eq!(err.field_name(), Some("num_replicas"));
    assert_eq!((err.app(), err.deployment()), (Some("a"), Some("d")));
    assert!(err.to_string().contains(&MAX_REPLICAS.to_string()), "{err}");
}

/// Every type a user names to use the API is reachable through the facade.
#[test]
fn the_facade_names_every_type_its_api_takes_and_returns() {
    let builder: DeploymentSpecBuilder = DeploymentSpec::builder("d", "x::X");
    let app: ApplicationSpecBuilder = ApplicationSpec::builder("a").deployment(builder);
    let spec = app.build().unwrap();
    let version: DeploymentVersion = spec.deployments[0].version();
    let _ = RolloutConfig::default().step(10);
    let _: Option<(DeploymentTarget, ReplicaInfo)> = None;
    assert!(!version.code.as_str().is_empty());
    match ServeConfig::from_yaml("applications: [") {
        Err(SpecError::Parse { line, column, .. }) => assert!(line >= 1 && column >= 1),
        other => panic!("expected a parse error, got {other:?}"),
    }
    let _ = ServeOptions::new(flotilla::Registry::new());
    let _ = app_of;
}

#[tokio::test(start_paused = true)]
async fn an_external_scaler_sets_replica_counts_durably_until_the_app_declares_another() {
    let (dir, sw, serve) = start_fresh().await;
    let scaled = |replicas| {
        ApplicationSpec::builder("ext")
            .route_prefix("/ext")
            .external_scaler_enabled(true)
            .deployment(probe(replicas, &tag("x")))
            .build()
            .unwrap()
    };
    serve.run(scaled(1)).await.unwrap();
    serve.scale_deployment("ext", "probe", 3).await.unwrap();
    wait_snapshot(&serve, "ext", "probe", |s| {
        s.count(flotilla::ReplicaState::Running) == 3 && s.target.replicas == 3
    })
    .await;
    // Durable: a process restart keeps the external decision.
    serve.crash_process().await;
    let serve = support::start(&dir, &sw).await;
    wait_status(&serve, "ext", A::Running).await;
    wait_snapshot(&serve, "ext", "probe", |s| {
        s.count(flotilla::ReplicaState::Running) == 3
    })
    .await;
    // Redeploying the same declaration keeps it; a new declared count wins.
    serve.run(scaled(1)).await.unwrap();
    assert_eq!(observe(&serve, "ext", "probe").await.target.replicas, 3);
    serve.run(scaled(2)).await.unwrap();
    wait_snapshot(&serve, "ext", "probe", |s| {
        s.target.replicas == 2 && s.replicas.len() == 2
    })
    .await;
    // Refusals.
    serve.run(app("plain", 1, tag("x"))).await.unwrap();
    assert!(matches!(
        serve.scale_deployment("plain", "probe", 2).await,
        Err(ServeError::ExternalScalerDisabled { .. })
    ));
    assert!(matches!(
        serve.scale_deployment("ext", "nope", 2).await,
        Err(ServeError::NotFound {
            deployment: Some(_),
            ..
        })
    ));
    assert!(matches!(
        serve.scale_deployment("ghost", "probe", 2).await,
        Err(ServeError::NotFound {
            deployment: None,
            ..
        })
    ));
    assert!(matches!(
        serve
            .scale_deployment("ext", "probe", MAX_REPLICAS + 1)
            .await,
        Err(ServeError::Invalid(_))
    ));
    // Being deleted: said so (Ray's DeploymentIsBeingDeletedError), not that
    // it does not exist.
    serve.scale_deployment("ext", "probe", 3).await.unwrap();
    wait_snapshot(&serve, "ext", "probe", |s| s.target.replicas == 3).await;
    serve.delete_apps(["ext"], false).await.unwrap();
    let e = serve.scale_deployment("ext", "probe", 2).await.unwrap_err();
    assert!(
        matches!(&e, ServeError::BeingDeleted { app } if app == "ext"),
        "{e}"
    );
    // Deployed again while it is still being deleted: it starts afresh, at
    // its declared count, as it would once the deletion ended (the decision
    // went with the deletion).
    assert_eq!(serve.app_status("ext").status, A::Deleting);
    serve.run(scaled(2)).await.unwrap();
    let s = observe(&serve, "ext", "probe").await;
    assert_eq!(s.target.replicas, 2, "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn waiting_for_the_ingress_ends_when_a_later_deploy_dropped_it() {
    let (_dir, _, serve) = start_fresh().await;
    let ingress_only = flotilla::RunManyOptions {
        wait_for_ingress_deployment_creation: true,
        wait_for_applications_running: false,
    };
    let v1 = app_of("a", probe(1, &tag("v1")));
    // The same application, its one deployment renamed.
    let v2 = app_of(
        "a",
        DeploymentSpec::builder("renamed", "test::Probe").init_args(&tag("v2")),
    );
    let (s1, s2) = (serve.clone(), serve.clone());
    let first = tokio::spawn(async move { s1.run_many(vec![v1], ingress_only).await });
    let second = tokio::spawn(async move { s2.run_many(vec![v2], no_wait()).await });
    second.await.unwrap().unwrap();
    let first = tokio::time::timeout(Duration::from_secs(600), first)
        .await
        .expect("the wait ended")
        .unwrap();
    // No handle to the ingress the later deploy dropped: a route made for it
    // would have nothing behind it, and its calls would wait for good.
    assert!(
        matches!(&first, Err(ServeError::NotFound { deployment: Some(d), .. }) if d == "probe"),
        "{first:?}"
    );
    assert_eq!(serve.app_status("a").observed_generation, 2);
    assert!(
        serve
            .routes()
            .routes()
            .iter()
            .all(|r| r.ingress.as_str() != "probe")
    );

    // The same when the first call waits for its application to run (the
    // later generation runs first).
    let slow = |t: &str, ms| ProbeArgs {
        start_delay_ms: ms,
        ..tag(t)
    };
    let v3 = app_of("b", probe(1, &slow("v3", 60_000)));
    let v4 = app_of(
        "b",
        DeploymentSpec::builder("renamed", "test::Probe").init_args(&slow("v4", 1_000)),
    );
    let s3 = serve.clone();
    let first = tokio::spawn(async move { s3.run(v3).await });
    support::eventually("v3's target on the board", || {
        serve.watch_status("b").is_some()
    })
    .await;
    serve.run_many(vec![v4], no_wait()).await.unwrap();
    let first = first.await.unwrap();
    assert!(
        matches!(&first, Err(ServeError::NotFound { deployment: Some(d), .. }) if d == "probe"),
        "{first:?}"
    );
    let gone = serve.deployment_handle("b", "probe").err();
    assert!(
        matches!(gone, Some(ServeError::NotFound { .. })),
        "{gone:?}"
    );
}
