//! The application lifecycle through the public API, on paused tokio time: Ray
//! Serve's status flows, the checkpoint protocol and bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::atomic::Ordering, time::Duration};

use flotilla::{
    ApplicationSpec, ApplicationStatus as A, DeploymentSpec, DeploymentStatus, FaultPoint,
    NotRunning, RunManyOptions, ServeError,
};
use support::{ProbeArgs, app, no_wait, numbered_apps, start_fresh, tag, wait_status};

#[tokio::test(start_paused = true)]
async fn deploy_call_delete_flow() {
    let (_dir, _, serve) = start_fresh().await;
    let handle = serve.run(app("a1", 2, tag("v1"))).await.unwrap();
    let s = serve.app_status("a1");
    assert_eq!((s.status, s.observed_generation), (A::Running, 1));
    assert_eq!(
        s.deployments.values().next().unwrap().status,
        DeploymentStatus::Healthy
    );
    let out: String = handle.call("hi").await.unwrap();
    assert_eq!(out, "v1:hi");
    assert_eq!(handle.replicas().len(), 2);

    serve.delete_apps(&["a1"], false).await.unwrap();
    assert_eq!(serve.app_status("a1").status, A::Deleting);
    serve.delete_apps(&["a1"], true).await.unwrap();
    let gone = serve.app_status("a1");
    assert_eq!(gone.status, A::NotStarted);
    assert_eq!(gone.message, "Application a1 doesn't exist");
    let err = handle.call::<_, String>("hi").await.unwrap_err();
    assert!(matches!(err, flotilla::CallError::NotFound { .. }), "{err}");
    assert!(matches!(
        serve.app_handle("a1"),
        Err(ServeError::NotFound { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn constructor_that_always_fails_is_deploy_failed_then_a_redeploy_recovers() {
    let (_dir, _, serve) = start_fresh().await;
    let broken = ProbeArgs {
        fail_constructor: u32::MAX,
        ..tag("bad")
    };
    let err = serve.run(app("a", 2, broken)).await.unwrap_err();
    let ServeError::DeployFailed { message, .. } = err else {
        panic!("expected DeployFailed, got {err}");
    };
    // The retry limit is min(20, 3 x 2) = 6, and the message names the error.
    assert!(message.contains("6 times"), "{message}");
    assert!(message.contains("probe constructor failure"), "{message}");
    assert_eq!(serve.app_status("a").status, A::DeployFailed);

    let fixed = serve.run(app("a", 2, tag("good"))).await.unwrap();
    let s = serve.app_status("a");
    assert_eq!((s.status, s.observed_generation), (A::Running, 2));
    assert_eq!(s.message, "");
    assert_eq!(fixed.call::<_, String>("x").await.unwrap(), "good:x");
}

#[tokio::test(start_paused = true)]
async fn constructor_that_fails_a_few_times_recovers_without_a_redeploy() {
    let (_dir, sw, serve) = start_fresh().await;
    // One replica: retry limit 3. Fail 4 times: DEPLOY_FAILED, then the slow retry
    // succeeds and the application turns RUNNING by itself.
    let flaky = ProbeArgs {
        fail_constructor: 4,
        ..tag("f")
    };
    serve
        .run_many(vec![app("a", 1, flaky)], no_wait())
        .await
        .unwrap();
    wait_status(&serve, "a", A::DeployFailed).await;
    let s = wait_status(&serve, "a", A::Running).await;
    assert_eq!(s.observed_generation, 1);
    assert_eq!(sw.failed.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn a_version_that_ran_and_then_fails_to_scale_up_is_unhealthy() {
    let (_dir, sw, serve) = start_fresh().await;
    serve.run(app("a", 1, tag("s"))).await.unwrap();
    // Down to none, then up to two of the same version, whose constructor now
    // always fails: past the retry limit (min(20, 3 x 2) = 6) with nothing
    // running, Ray's REPLICA_STARTUP_FAILED makes a scaling deployment
    // UNHEALTHY. It stayed UPSCALING for ever (the version had run once).
    serve.run(app("a", 0, tag("s"))).await.unwrap();
    sw.fail_starts.store(true, Ordering::SeqCst);
    serve
        .run_many(vec![app("a", 2, tag("s"))], no_wait())
        .await
        .unwrap();
    let s = wait_status(&serve, "a", A::Unhealthy).await;
    assert!(s.message.contains("6 times in a row"), "{}", s.message);
    assert!(
        s.message.contains("probe constructor failure"),
        "{}",
        s.message
    );
    assert!(sw.failed.load(Ordering::SeqCst) >= 6);
    // It keeps starting replicas: once they start, it is RUNNING again.
    sw.fail_starts.store(false, Ordering::SeqCst);
    wait_status(&serve, "a", A::Running).await;
    assert_eq!(serve.app_handle("a").unwrap().replicas().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn failing_health_checks_make_it_unhealthy_until_replaced() {
    let (_dir, sw, serve) = start_fresh().await;
    serve.run(app("a", 1, tag("h"))).await.unwrap();
    let built = sw.constructed.load(Ordering::SeqCst);
    sw.unhealthy.store(true, Ordering::SeqCst);
    let s = wait_status(&serve, "a", A::Unhealthy).await;
    // Its cause, or (a moment later: the switch is still on) its replacement
    // failing its first check, which the message then says, as Ray's.
    assert!(s.message.contains("are UNHEALTHY"), "{}", s.message);
    let d = s.deployments.values().next().unwrap();
    assert_eq!(d.trigger, flotilla::StatusTrigger::HealthCheckFailed);
    assert!(
        d.message.contains("consecutive health checks")
            || d.message.contains("initial health check failed"),
        "{}",
        d.message
    );
    sw.unhealthy.store(false, Ordering::SeqCst);
    wait_status(&serve, "a", A::Running).await;
    assert!(
        sw.constructed.load(Ordering::SeqCst) > built,
        "the unhealthy replica was replaced"
    );
}

#[tokio::test(start_paused = true)]
async fn redeploy_with_different_deployments_deletes_creates_and_keeps() {
    let (_dir, _, serve) = start_fresh().await;
    let two = |keep_tag: &str, other: &str| {
        ApplicationSpec::builder("a")
            .deployment(DeploymentSpec::builder("keep", "test::Probe").init_args(&tag(keep_tag)))
            .deployment(DeploymentSpec::builder(other, "test::Probe").init_args(&tag(other)))
            .ingress("keep")
            .build()
            .unwrap()
    };
    serve.run(two("k", "old")).await.unwrap();
    let keep_before = serve.deployment_handle("a", "keep").unwrap().replicas()[0].id();
    let old = serve.deployment_handle("a", "old").unwrap();
    assert_eq!(old.replicas().len(), 1);
    serve.run(two("k", "new")).await.unwrap();
    let s = serve.app_status("a");
    assert_eq!((s.status, s.observed_generation), (A::Running, 2));
    let names: Vec<_> = s.deployments.keys().map(|d| d.to_string()).collect();
    assert_eq!(names, ["keep", "new"]);
    // Unchanged version: the kept deployment's replica was not restarted.
    let keep_after = serve.deployment_handle("a", "keep").unwrap().replicas()[0].id();
    assert_eq!(keep_before, keep_after);
    // The dropped deployment is gone once its replica stopped.
    let gone = old.call::<_, String>("x").await.unwrap_err();
    assert!(
        matches!(gone, flotilla::CallError::NotFound { .. }),
        "{gone}"
    );
}

#[tokio::test(start_paused = true)]
async fn redeploy_while_deleting_cancels_the_deletion() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app("a", 1, tag("v1"))).await.unwrap();
    serve.delete_apps(&["a"], false).await.unwrap();
    assert_eq!(serve.app_status("a").status, A::Deleting);
    let h = serve.run(app("a", 1, tag("v2"))).await.unwrap();
    let s = serve.app_status("a");
    assert_eq!((s.status, s.observed_generation), (A::Running, 3));
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "v2:x");
    // It stays: nothing deletes it later.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(serve.app_status("a").status, A::Running);
}

#[tokio::test(start_paused = true)]
async fn a_deleting_application_releases_its_route_prefix() {
    let (_dir, _, serve) = start_fresh().await;
    let with_prefix = |name: &str| {
        ApplicationSpec::builder(name)
            .route_prefix("/url1")
            .deployment(DeploymentSpec::builder("d", "test::Probe").init_args(&tag(name)))
            .build()
            .unwrap()
    };
    serve.run(with_prefix("app1")).await.unwrap();
    let taken = serve.run(with_prefix("app2")).await.unwrap_err();
    assert!(matches!(taken, ServeError::RouteTaken { .. }), "{taken}");
    serve.delete_apps(&["app1"], false).await.unwrap();
    serve.run(with_prefix("app2")).await.unwrap();
    assert_eq!(serve.app_status("app2").status, A::Running);
    wait_status(&serve, "app1", A::NotStarted).await;
}

#[tokio::test(start_paused = true)]
async fn run_many_without_waiting_returns_before_any_replica_starts() {
    let (_dir, sw, serve) = start_fresh().await;
    let slow = ProbeArgs {
        start_delay_ms: 5_000,
        ..tag("s")
    };
    serve
        .run_many(numbered_apps(20, &slow), no_wait())
        .await
        .unwrap();
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 0);
    assert!(serve.status().iter().all(|(_, s)| s.status == A::Deploying));

    let apps = (20..40)
        .map(|i| app(&format!("a{i}"), 1, slow.clone()))
        .collect();
    serve
        .run_many(apps, RunManyOptions::default())
        .await
        .unwrap();
    for i in 20..40 {
        assert_eq!(serve.app_status(&format!("a{i}")).status, A::Running);
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_never_woken_by_the_previous_generation() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app("a", 1, tag("v1"))).await.unwrap();
    let slow = ProbeArgs {
        start_delay_ms: 30_000,
        ..tag("v2")
    };
    let h = serve.run(app("a", 1, slow)).await.unwrap();
    // run returned only once generation 2 ran: the new code answers.
    assert_eq!(serve.app_status("a").observed_generation, 2);
    let replicas = h.replicas();
    assert_eq!(replicas.len(), 1);
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "v2:x");
}

#[tokio::test(start_paused = true)]
async fn run_many_of_1000_is_exactly_one_commit_and_a_rejected_batch_commits_nothing() {
    let (_dir, _, serve) = start_fresh().await;
    let before = serve.metrics().await.unwrap().store.commits;
    let apps: Vec<_> = (0..1000)
        .map(|i| app(&format!("b{i}"), 1, tag("b")))
        .collect();
    serve.run_many(apps, no_wait()).await.unwrap();
    let m = serve.metrics().await.unwrap();
    assert_eq!(m.store.commits, before + 1);
    assert_eq!(m.controller.apps, 1000);

    // Bad batches: a repeated name, a taken prefix, a bad ingress; none commits.
    let dup = vec![app("n1", 1, tag("x")), app("n1", 1, tag("y"))];
    assert!(matches!(
        serve.run_many(dup, no_wait()).await,
        Err(ServeError::DuplicateApp { .. })
    ));
    let mut taken = app("n2", 1, tag("x"));
    taken.route_prefix = Some(flotilla::RoutePrefix::new("/b7").unwrap());
    let batch = vec![app("n3", 1, tag("x")), taken];
    let err = serve.run_many(batch, no_wait()).await.unwrap_err();
    assert!(
        matches!(&err, ServeError::RouteTaken { app, holder, .. } if app == "n2" && holder == "b7"),
        "{err}"
    );
    let mut bad_ingress = app("n4", 1, tag("x"));
    bad_ingress.ingress = flotilla::DeploymentName::new("nope").unwrap();
    let err = serve
        .run_many(vec![bad_ingress], no_wait())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("application 'n4'"), "{err}");
    let after = serve.metrics().await.unwrap();
    assert_eq!(after.store.commits, m.store.commits);
    assert_eq!(after.controller.apps, 1000);
    assert_eq!(serve.app_status("n3").status, A::NotStarted);

    // A failed commit: the caller gets the error and nothing changes.
    serve.fail_next_commit();
    let err = serve.run(app("n5", 1, tag("x"))).await.unwrap_err();
    assert!(matches!(err, ServeError::Store(_)), "{err}");
    assert_eq!(serve.app_status("n5").status, A::NotStarted);
    serve.run(app("n5", 1, tag("x"))).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn status_flow_is_deploying_running_deleting_gone() {
    let (_dir, _, serve) = start_fresh().await;
    let slow = ProbeArgs {
        start_delay_ms: 1_000,
        ..tag("s")
    };
    serve
        .run_many(vec![app("a", 1, slow)], no_wait())
        .await
        .unwrap();
    let seen = support::record_statuses(&serve, "a", A::Running).await;
    assert_eq!(seen, [A::Deploying, A::Running]);
    serve.delete_apps(&["a"], false).await.unwrap();
    let seen = support::record_statuses(&serve, "a", A::NotStarted).await;
    assert_eq!(seen, [A::Deleting, A::NotStarted]);
}

#[tokio::test(start_paused = true)]
async fn zero_replicas_is_a_live_deployment_not_a_deleted_one() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app("zero", 0, tag("z"))).await.unwrap();
    let first = support::deployment_actor(&serve, "zero", "probe")
        .unwrap()
        .get_id();
    tokio::time::sleep(Duration::from_secs(120)).await;
    let later = support::observe(&serve, "zero", "probe").await;
    assert_eq!(later.target.replicas, 0);
    assert_eq!(later.live(), 0);
    assert_eq!(serve.app_status("zero").status, A::Running);
    assert_eq!(serve.metrics().await.unwrap().controller.app_restarts, 0);
    let now = support::deployment_actor(&serve, "zero", "probe")
        .unwrap()
        .get_id();
    assert_eq!(first, now, "the same DeploymentActor all along");
    assert!(serve.app_handle("zero").is_ok());
}

#[tokio::test(start_paused = true)]
async fn user_code_that_panics_before_returning_its_future_is_a_startup_failure() {
    let (_dir, _, serve) = support::start_fresh_with(|sw| {
        support::registry(sw)
            .register(
                "test::SyncPanic",
                |_ctx| -> std::future::Ready<Result<support::Probe, flotilla::UserError>> {
                    panic!("panicked before returning a future")
                },
            )
            .unwrap()
    })
    .await;
    let spec = ApplicationSpec::builder("p")
        .deployment(DeploymentSpec::builder("d", "test::SyncPanic"))
        .build()
        .unwrap();
    let err = serve.run(spec).await.unwrap_err();
    let ServeError::DeployFailed { message, .. } = err else {
        panic!("expected DeployFailed, got {err}");
    };
    assert!(
        message.contains("panicked before returning a future"),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_delete_waiter_returns_when_a_redeploy_cancels_the_deletion() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app("a", 1, tag("v1"))).await.unwrap();
    // A request that takes long keeps the replica draining while we redeploy.
    let h = serve.app_handle("a").unwrap();
    let busy = tokio::spawn(async move { h.call::<_, String>("sleep:15000").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiter = {
        let s = serve.clone();
        tokio::spawn(async move { s.delete_apps(&["a"], true).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    serve.run(app("a", 1, tag("v2"))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the delete waiter returned")
        .unwrap()
        .unwrap();
    assert_eq!(serve.app_status("a").status, A::Running);
    let _ = busy.await;
}

/// A deletion that reaches the Controller right behind the application's own
/// deploy waits for that application: the caller could not have watched it
/// before sending, since it did not exist yet.
#[tokio::test(start_paused = true)]
async fn a_delete_waiter_waits_for_an_application_deployed_just_before_it() {
    let (_dir, _, serve) = start_fresh().await;
    // The deploy is sent first; the deletion is sent before the Controller
    // has handled it, so the application is not yet on the board.
    let delete = async {
        serve.delete_apps(&["a"], true).await.unwrap();
        // Read as the waiter returns, not once the deploy's wait ends too.
        serve.app_status("a").status
    };
    // The new ApplicationActor crashes in its first step, so the deletion
    // ends only after its restart.
    serve.faults().arm(FaultPoint::ApplicationReconcile, 1);
    let (deployed, seen) = tokio::join!(serve.run(app("a", 1, tag("v1"))), delete);
    assert_eq!(seen, A::NotStarted, "gone when the waiter returned");
    // The deploy's wait lost its application to the deletion.
    let err = deployed.unwrap_err();
    assert!(matches!(err, ServeError::NotFound { .. }), "{err}");
}

/// A `run_many` waits for the applications it deployed, not for later ones
/// of the same names: one deleted and deployed anew (its generations counted
/// from 1 again) while the call waits on another is `NotFound`, where reading
/// the new one's status would wait for a generation it never reaches.
#[tokio::test(start_paused = true)]
async fn a_run_many_waiter_does_not_wait_on_a_later_application_of_the_same_name() {
    let (_dir, _, serve) = start_fresh().await;
    for v in ["v1", "v2"] {
        serve.run(app("b", 1, tag(v))).await.unwrap();
    }
    let slow = ProbeArgs {
        start_delay_ms: 60_000,
        ..tag("slow")
    };
    let call = tokio::spawn({
        let serve = serve.clone();
        async move {
            serve
                .run_many(
                    vec![app("a", 1, slow), app("b", 1, tag("v3"))],
                    Default::default(),
                )
                .await
        }
    });
    support::eventually("b at its third generation", || {
        serve.app_status("b").observed_generation == 3
    })
    .await;
    // While the call waits for "a": "b" goes, and a new "b" runs (generation 1).
    serve.delete_apps(&["b"], true).await.unwrap();
    serve.run(app("b", 1, tag("again"))).await.unwrap();
    assert_eq!(serve.app_status("b").observed_generation, 1);
    let answered = tokio::time::timeout(Duration::from_secs(600), call)
        .await
        .expect("the call ends once \"a\" runs")
        .unwrap();
    let err = answered.unwrap_err();
    assert!(
        matches!(&err, ServeError::NotFound { app, .. } if app == "b"),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn deleting_hundreds_of_applications_in_one_call_completes() {
    let (_dir, _, serve) = start_fresh().await;
    serve
        .run_many(numbered_apps(300, &tag("v")), Default::default())
        .await
        .unwrap();
    let names: Vec<String> = (0..300).map(|i| format!("a{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    tokio::time::timeout(Duration::from_secs(600), serve.delete_apps(&refs, true))
        .await
        .expect("the deletion completes")
        .unwrap();
    assert!(serve.status().is_empty());
    assert!(serve.living_groups().is_empty(), "no actor left behind");
    assert_eq!(serve.metrics().await.unwrap().controller.apps, 0);
}

/// Finished deletions are removed from the checkpoint together: the reports
/// that arrive while one removal waits its turn share its commit, so deleting
/// many applications does not cost a commit each.
#[tokio::test(start_paused = true)]
async fn deleting_many_applications_removes_their_records_together() {
    let (_dir, _, serve) = start_fresh().await;
    serve
        .run_many(
            numbered_apps(20, &ProbeArgs::default()),
            RunManyOptions::default(),
        )
        .await
        .unwrap();
    let before = serve.metrics().await.unwrap().store.commits;
    let names: Vec<String> = (0..20).map(|i| format!("a{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    serve.delete_apps(&names, true).await.unwrap();
    let commits = serve.metrics().await.unwrap().store.commits - before;
    // One for the deletion, then the removals: one each would be 21.
    assert!(commits <= 3, "{commits} commits to delete 20 applications");
    assert!(serve.status().is_empty());
}

#[tokio::test(start_paused = true)]
async fn while_shutting_down_metrics_tell_the_truth_and_calls_are_refused() {
    let (_dir, _, serve) = start_fresh().await;
    serve
        .run_many(numbered_apps(3, &tag("v")), RunManyOptions::default())
        .await
        .unwrap();
    // Asked while the tree drains (replicas wait their graceful loop): the
    // Controller refuses changes but still reports what it holds.
    let during = async {
        tokio::task::yield_now().await;
        let m = serve.metrics().await;
        let late = serve.run(app("late", 1, tag("v"))).await;
        (m, late)
    };
    let (stopped, (m, late)) = tokio::join!(serve.shutdown(), during);
    stopped.unwrap();
    let m = m.unwrap();
    assert_eq!((m.controller.apps, m.controller.deleting), (3, 0));
    assert_eq!(m.deployments, 3);
    assert!(
        matches!(late, Err(ServeError::Unavailable(NotRunning::ShuttingDown))),
        "{late:?}"
    );
    // Once stopped, every call says so.
    assert!(matches!(
        serve.metrics().await,
        Err(ServeError::Unavailable(NotRunning::Stopped))
    ));
}

/// A handle asked for while its application is deleted (a status page, a
/// metrics scrape) makes no route of its own: once the deletion is done,
/// calls on every handle fail with `NotFound`, none waits for ever.
#[tokio::test(start_paused = true)]
async fn a_handle_asked_for_while_its_application_is_deleted_does_not_outlive_it() {
    let (_dir, _, serve) = start_fresh().await;
    let spec = ApplicationSpec::builder("x")
        .deployment(DeploymentSpec::builder("front", "test::Probe").init_args(&tag("f")))
        .deployment(
            DeploymentSpec::builder("slow", "test::Probe")
                .init_args(&tag("s"))
                .with_config(|c| {
                    c.with_graceful_shutdown(Duration::from_secs(1), Duration::from_secs(30))
                }),
        )
        .ingress("front")
        .build()
        .unwrap();
    serve.run(spec).await.unwrap();
    let h = serve.app_handle("x").unwrap();
    // A long request keeps `slow` stopping (its graceful timeout) after
    // `front` is gone.
    let slow = serve.deployment_handle("x", "slow").unwrap();
    let busy = tokio::spawn(async move { slow.call::<_, String>("sleep:20000").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    serve.delete_apps(["x"], false).await.unwrap();
    tokio::time::timeout(Duration::from_secs(600), async {
        loop {
            match h.call::<_, String>("x").await {
                Err(flotilla::CallError::NotFound { .. }) => break,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .expect("the ingress's calls end as NotFound");
    assert_eq!(serve.app_status("x").status, A::Deleting);
    // Asked for again while the deletion goes on.
    let again = serve.app_handle("x");
    let front = serve.deployment_handle("x", "front");
    support::eventually("the deletion to end", || serve.watch_status("x").is_none()).await;
    for handle in [Ok(h), again, front].into_iter().flatten() {
        let outcome = tokio::time::timeout(Duration::from_secs(60), handle.call::<_, String>("x"))
            .await
            .expect("answered, not left waiting");
        assert!(
            matches!(outcome, Err(flotilla::CallError::NotFound { .. })),
            "{outcome:?}"
        );
    }
    let _ = busy.await;
}
