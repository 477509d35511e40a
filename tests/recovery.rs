//! Control-plane crashes and process restarts, on paused tokio time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::Arc, sync::atomic::Ordering, time::Duration};

use flotilla::{
    ApplicationStatus as A, FaultPoint, NotRunning, RestartPolicy, Serve, ServeError, StoreError,
};
use support::{
    ProbeArgs, Switches, app, no_wait, numbered_apps, poll_secs, start, start_fresh,
    start_restarting, tag, wait_status,
};

#[tokio::test(start_paused = true)]
async fn controller_crash_keeps_apps_running_replicas_alive_and_handles_serving() {
    let (_dir, sw, serve) = start_fresh().await;
    let handles = serve
        .run_many(
            (0..3).map(|i| app(&format!("a{i}"), 2, tag("v"))).collect(),
            Default::default(),
        )
        .await
        .unwrap();
    let built = sw.constructed.load(Ordering::SeqCst);
    let ids: Vec<_> = handles.iter().map(|h| h.replicas()[0].id()).collect();

    serve.crash_controller();
    // Requests keep being served while the Controller restarts.
    for h in &handles {
        assert_eq!(h.call::<_, String>("x").await.unwrap(), "v:x");
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let m = serve.metrics().await.unwrap();
    assert_eq!(m.controller_restarts, 1);
    assert_eq!(
        m.controller.app_actors, 3,
        "living application actors were re-adopted"
    );
    assert_eq!(
        sw.constructed.load(Ordering::SeqCst),
        built,
        "no replica restarted"
    );
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.replicas()[0].id(), ids[i]);
        assert_eq!(serve.app_status(&format!("a{i}")).status, A::Running);
    }
    // The restarted Controller takes new work.
    serve.run(app("b", 1, tag("w"))).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn whole_process_restart_brings_every_acknowledged_app_back() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    {
        let serve = start(&dir, &sw).await;
        serve
            .run_many(numbered_apps(50, &tag("v")), Default::default())
            .await
            .unwrap();
        serve.delete_apps(&["a7"], true).await.unwrap();
        serve.shutdown().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let serve = start(&dir, &sw).await;
    for i in 0..50 {
        let name = format!("a{i}");
        if i == 7 {
            assert_eq!(
                serve.app_status(&name).status,
                A::NotStarted,
                "no resurrection"
            );
            continue;
        }
        let s = support::wait_status(&serve, &name, A::Running).await;
        assert_eq!(s.observed_generation, 1);
        let h = serve.app_handle(&name).unwrap();
        assert_eq!(h.call::<_, String>("y").await.unwrap(), "v:y");
    }
}

/// Wait until the applications of `numbered_apps(n, _)` are all RUNNING.
async fn all_running(serve: &Serve, n: usize) {
    for i in 0..n {
        support::wait_status(serve, &format!("a{i}"), A::Running).await;
    }
}

/// Arm `point` once, then deploy 500 applications without waiting: the
/// Controller crashes and the call says so.
async fn run_500_into_a_crash(serve: &Serve, point: FaultPoint) {
    serve.faults().arm(point, 1);
    let err = serve
        .run_many(numbered_apps(500, &tag("v")), no_wait())
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::ControllerCrashed), "{err}");
}

#[tokio::test(start_paused = true)]
async fn controller_crash_before_the_commit_loses_nothing_acknowledged_and_applies_nothing() {
    let (_dir, _, serve) = start_fresh().await;
    run_500_into_a_crash(&serve, FaultPoint::ControllerBeforeCommit).await;
    // Retry after the restart: accepted once, nothing duplicated.
    serve
        .run_many(numbered_apps(500, &tag("v")), no_wait())
        .await
        .unwrap();
    all_running(&serve, 500).await;
    let m = serve.metrics().await.unwrap();
    assert_eq!((m.controller.apps, m.controller_restarts), (500, 1));
    assert_eq!(serve.app_status("a0").observed_generation, 1);
}

#[tokio::test(start_paused = true)]
async fn controller_crash_after_the_commit_keeps_the_batch_and_converges() {
    let (_dir, _, serve) = start_fresh().await;
    run_500_into_a_crash(&serve, FaultPoint::ControllerAfterCommit).await;
    // The commit happened: the restarted Controller recovers and starts them all.
    tokio::time::sleep(Duration::from_secs(1)).await;
    all_running(&serve, 500).await;
    assert_eq!(serve.metrics().await.unwrap().controller.apps, 500);
}

/// A commit whose outcome the store cannot tell (its last flush failed after
/// the header that names it was written) is neither taken as written nor as
/// not: the call hears the Controller crash (may or may not be applied), and
/// the successor goes by the file. Taken as not written, as before, the next
/// call on the same route prefix was accepted over the record already in the
/// file, and the file refused every later start (two live routes on one
/// prefix).
#[tokio::test(start_paused = true)]
async fn a_commit_of_unknown_outcome_is_settled_by_the_file() {
    let (dir, sw, serve) = start_fresh().await;
    serve.faults().arm(FaultPoint::CommitUnsettled, 1);
    let first = serve.run(app("x", 1, tag("x"))).await;
    assert!(
        matches!(first, Err(ServeError::ControllerCrashed)),
        "{first:?}"
    );
    // The file holds x: the successor runs it, and its prefix is taken.
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_status(&serve, "x", A::Running).await;
    let rival = flotilla::ApplicationSpec::builder("y")
        .route_prefix("/x")
        .deployment(support::probe(1, &tag("y")))
        .build()
        .unwrap();
    let taken = serve.run(rival).await;
    assert!(
        matches!(taken, Err(ServeError::RouteTaken { .. })),
        "{taken:?}"
    );
    serve.crash_process().await;
    drop(serve);
    let serve = start(&dir, &sw).await;
    wait_status(&serve, "x", A::Running).await;
}

#[tokio::test(start_paused = true)]
async fn controller_crash_after_the_reply_still_starts_every_application() {
    let (_dir, sw, serve) = start_fresh().await;
    serve.faults().arm(FaultPoint::ControllerAfterReply, 1);
    serve
        .run_many(numbered_apps(500, &tag("v")), no_wait())
        .await
        .unwrap();
    all_running(&serve, 500).await;
    let m = serve.metrics().await.unwrap();
    assert_eq!((m.controller.apps, m.controller_restarts), (500, 1));
    assert_eq!(
        sw.constructed.load(Ordering::SeqCst),
        500,
        "no replica started twice"
    );
}

#[tokio::test(start_paused = true)]
async fn application_actor_crash_mid_reconcile_converges() {
    let (_dir, _, serve) = start_fresh().await;
    serve.faults().arm(FaultPoint::ApplicationReconcile, 2);
    serve.run(app("a", 2, tag("v"))).await.unwrap();
    let m = serve.metrics().await.unwrap();
    assert_eq!(m.controller.app_restarts, 2);
    assert_eq!(serve.app_handle("a").unwrap().replicas().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn requests_keep_succeeding_while_every_control_level_crashes() {
    let (_dir, sw, serve) = start_fresh().await;
    let h = serve.run(app("a", 2, tag("v"))).await.unwrap();
    let built = sw.constructed.load(Ordering::SeqCst);
    let caller = {
        let h = h.clone();
        tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..300 {
                let out: String = h.call("x").await.expect("every request succeeds");
                assert_eq!(out, "v:x");
                ok += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ok
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    serve.crash_controller();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(serve.crash_application("a"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(serve.crash_deployment("a", "probe"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(caller.await.unwrap(), 300);
    assert_eq!(serve.app_status("a").status, A::Running);
    assert_eq!(
        sw.constructed.load(Ordering::SeqCst),
        built,
        "replicas survived every crash"
    );
    let m = serve.metrics().await.unwrap();
    assert_eq!(m.controller_restarts, 1);
    assert_eq!(m.controller.app_restarts, 1);
}

#[tokio::test(start_paused = true)]
async fn too_many_controller_crashes_become_a_fatal_error_the_program_can_await() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let restart = RestartPolicy {
        max_restarts: 2,
        ..Default::default()
    };
    let serve = start_restarting(&dir, &sw, restart).await;
    let fatal = {
        let s = serve.clone();
        tokio::spawn(async move { s.fatal().await })
    };
    for _ in 0..3 {
        serve.crash_controller();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let why = fatal.await.unwrap().expect("the supervisor gave up");
    let flotilla::Fatal::ControllerCrashLoop { escalation, last } = &why;
    assert_eq!(escalation.max_restarts, 2);
    assert!(!last.is_empty());
    assert!(
        why.to_string().contains("crashed more than 2 times"),
        "{why}"
    );
    let err = serve.run(app("a", 1, tag("v"))).await.unwrap_err();
    assert!(
        matches!(err, ServeError::Unavailable(NotRunning::GaveUp(_))),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_instance_whose_supervisor_gave_up_keeps_its_store_and_namespace_until_stopped() {
    let (dir, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sw = Arc::new(Switches::default());
    let restart = RestartPolicy {
        max_restarts: 0,
        ..Default::default()
    };
    let serve = start_restarting(&dir, &sw, restart).await;
    let h = serve.run(app("a", 1, tag("v"))).await.unwrap();
    let ns = serve.namespace().to_owned();
    serve.crash_controller();
    serve.fatal().await.expect("the supervisor gave up");
    // Its replica still serves, so a second instance may neither open its
    // store (it would run "a" twice) nor take its namespace (the first one's
    // stop would kill the second one's actors).
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "v:x");
    let err = Serve::start(support::options(&dir, support::registry(&sw)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ServeError::Store(StoreError::Locked { .. })),
        "{err}"
    );
    let err = Serve::start(support::options(&other, support::registry(&sw)).namespace(&ns))
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::NamespaceInUse { .. }), "{err}");
    // Its last handle dropped stops it, as a crash: both are free again, and
    // what dropping it killed is the old instance only.
    drop(serve);
    let next = Serve::start(support::options(&dir, support::registry(&sw)).namespace(&ns))
        .await
        .unwrap();
    wait_status(&next, "a", A::Running).await;
    let h = next.app_handle("a").unwrap();
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "v:x");
    next.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_deployment_actor_crash_mid_roll_keeps_new_replicas_and_leaks_none() {
    let (_dir, sw, serve) = start_fresh().await;
    let slow = |t: &str| ProbeArgs {
        start_delay_ms: 5_000,
        ..tag(t)
    };
    serve.run(app("a", 5, slow("old"))).await.unwrap();
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 5);
    serve
        .run_many(vec![app("a", 5, slow("new"))], no_wait())
        .await
        .unwrap();
    // Part-way through the roll: a kill, then a crash inside a reconcile step.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(serve.crash_deployment("a", "probe"));
    tokio::time::sleep(Duration::from_secs(6)).await;
    serve.faults().arm(FaultPoint::DeploymentReconcile, 1);
    support::wait_until(&serve, "a", |s| {
        s.observed_generation == 2 && s.status == A::Running
    })
    .await;
    assert_eq!(
        serve.faults().remaining(FaultPoint::DeploymentReconcile),
        0,
        "the reconcile crash fired"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let h = serve.app_handle("a").unwrap();
    assert_eq!(h.replicas().len(), 5);
    for _ in 0..10 {
        assert_eq!(h.call::<_, String>("x").await.unwrap(), "new:x");
    }
    assert_eq!(
        sw.constructed.load(Ordering::SeqCst),
        10,
        "every new replica started once, none twice"
    );
    let groups = serve.living_groups();
    let replicas: usize = groups
        .iter()
        .filter(|(g, _)| g.contains("/replicas:a/"))
        .map(|(_, n)| *n)
        .sum();
    assert_eq!(replicas, 5, "no replica leaked: {groups:?}");
    assert!(serve.metrics().await.unwrap().controller.app_actors == 1);
}

#[tokio::test(start_paused = true)]
async fn whole_process_crash_with_1000_applications_recovers_them_all() {
    let (dir, sw, serve) = start_fresh().await;
    serve
        .run_many(numbered_apps(1000, &tag("v")), Default::default())
        .await
        .unwrap();
    serve.crash_process().await;
    assert!(
        serve.living_groups().is_empty(),
        "the crash left actors alive"
    );
    let serve = start(&dir, &sw).await;
    all_running(&serve, 1000).await;
    assert_eq!(serve.metrics().await.unwrap().running_replicas, 1000);
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_report_lost_while_the_deployment_actor_restarts_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    // Keep the DeploymentActor down for a minute after its crash.
    let restart = RestartPolicy {
        first_backoff: Duration::from_secs(60),
        max_backoff: Duration::from_secs(60),
        ..Default::default()
    };
    let serve = start_restarting(&dir, &sw, restart).await;
    serve.run(app("a", 1, tag("v"))).await.unwrap();
    let sick = serve.app_handle("a").unwrap().replicas()[0].id();
    assert!(serve.crash_deployment("a", "probe"));
    // Three failed checks while nobody listens: the report is lost.
    sw.unhealthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(45)).await;
    sw.unhealthy.store(false, Ordering::SeqCst);
    // The restarted actor learns it from the replica itself and replaces it.
    support::wait_until(&serve, "a", |s| s.status == A::Running).await;
    let replaced = poll_secs(120, async || {
        let set = serve.app_handle("a").unwrap().replicas();
        set.len() == 1 && set[0].id() != sick
    })
    .await;
    assert!(replaced, "the unhealthy replica was never replaced");
}

#[tokio::test(start_paused = true)]
async fn a_crashed_deployment_actor_is_unhealthy_until_its_successor_reports() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app("a", 1, tag("v"))).await.unwrap();
    assert!(serve.crash_deployment("a", "probe"));
    // Ray's INTERNAL_ERROR: the deployment (and so the application) is UNHEALTHY,
    // saying why, until the restarted actor reports what it found.
    let s = support::wait_until(&serve, "a", |s| s.status == A::Unhealthy).await;
    let d = s.deployments.values().next().unwrap();
    assert_eq!(d.status, flotilla::DeploymentStatus::Unhealthy);
    assert_eq!(d.trigger, flotilla::StatusTrigger::InternalError);
    assert!(d.message.contains("actor crashed"), "{}", d.message);
    assert!(s.message.contains("UNHEALTHY"), "{}", s.message);
    support::wait_status(&serve, "a", A::Running).await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_right_after_a_deletion_is_removed_leaves_no_stale_status() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app("a", 1, tag("old"))).await.unwrap();
    serve.delete_apps(["a"], false).await.unwrap();
    // The next commit is the removal of the finished deletion: crash right after it.
    serve.faults().arm(FaultPoint::ControllerAfterCommit, 1);
    wait_status(&serve, "a", A::NotStarted).await;
    assert!(serve.watch_status("a").is_none(), "gone from the board");
    let h = serve.run(app("a", 1, tag("new"))).await.unwrap();
    assert_eq!(serve.app_status("a").observed_generation, 1);
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "new:x");
    assert_eq!(serve.metrics().await.unwrap().controller_restarts, 1);
}

/// A fresh instance running "a", its one replica busy with a 5 s request
/// (the call, to await), and its probes' switches.
async fn busy_with_a_long_request() -> (
    tempfile::TempDir,
    Serve,
    tokio::task::JoinHandle<Result<String, flotilla::CallError>>,
    Arc<Switches>,
) {
    let (dir, sw, serve) = start_fresh().await;
    let h = serve.run(app("a", 1, tag("v"))).await.unwrap();
    let call = tokio::spawn(async move { h.call::<_, String>("sleep:5000").await });
    support::eventually("the request to begin", || {
        sw.handled.load(Ordering::SeqCst) > 0
    })
    .await;
    (dir, serve, call, sw)
}

/// A shutdown whose request the Controller lost (it crashed with the request
/// in its mailbox) is asked of its successor: the replicas drain, and a
/// request in flight finishes, where before the call failed with
/// `ControllerCrashed` and everything was stopped at once.
#[tokio::test(start_paused = true)]
async fn a_shutdown_the_controller_lost_in_a_crash_still_drains() {
    let (_dir, serve, call, _) = busy_with_a_long_request().await;
    let mut shutdown = Box::pin(serve.shutdown());
    // Sent; the Controller is killed before it reads it.
    assert!(futures::poll!(&mut shutdown).is_pending());
    serve.crash_controller();
    shutdown.await.unwrap();
    let answer = call.await.unwrap();
    assert_eq!(answer.ok().as_deref(), Some("v:sleep:5000"));
}

/// An ApplicationActor that crashes while the shutdown drains it is not
/// started again, and needs not be: its deployments drain on their own, and
/// the request in flight on its replica finishes.
#[tokio::test(start_paused = true)]
async fn an_application_actor_that_crashes_during_the_drain_leaves_its_replicas_draining() {
    let (_dir, serve, call, _) = busy_with_a_long_request().await;
    let mut shutdown = Box::pin(serve.shutdown());
    let draining = tokio::time::timeout(Duration::from_millis(100), &mut shutdown).await;
    assert!(draining.is_err(), "the replica drains its request");
    assert!(serve.crash_application("a"));
    shutdown.await.unwrap();
    let answer = call.await.unwrap();
    assert_eq!(answer.ok().as_deref(), Some("v:sleep:5000"));
}

/// A DeploymentActor that crashes while the shutdown drains it: its
/// successor starts and drains in its place, so the request in flight on its
/// replica finishes (the lost answer ended the drain at once, and every
/// replica was stopped under its requests).
#[tokio::test(start_paused = true)]
async fn a_deployment_actor_that_crashes_during_the_drain_is_drained_by_its_successor() {
    let (_dir, serve, call, _) = busy_with_a_long_request().await;
    let mut shutdown = Box::pin(serve.shutdown());
    let draining = tokio::time::timeout(Duration::from_millis(100), &mut shutdown).await;
    assert!(draining.is_err(), "the replica drains its request");
    assert!(serve.crash_deployment("a", "probe"));
    shutdown.await.unwrap();
    let answer = call.await.unwrap();
    assert_eq!(answer.ok().as_deref(), Some("v:sleep:5000"));
    assert!(serve.living_replicas().is_empty());
}

/// A Controller that crashes while the shutdown drains: the drain goes on
/// without it, and its successor starts nothing (it restarted every
/// application the drain stopped, running user code again) and refuses
/// every call (it took them, committed, and started their work).
#[tokio::test(start_paused = true)]
async fn a_controller_restarted_during_the_drain_starts_nothing_and_refuses_calls() {
    let (_dir, serve, call, sw) = busy_with_a_long_request().await;
    let built = sw.constructed.load(Ordering::SeqCst);
    let s2 = serve.clone();
    let shutdown = tokio::spawn(async move { s2.shutdown().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!shutdown.is_finished(), "the replica drains its request");
    serve.crash_controller();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = serve.run_many(vec![app("c", 1, tag("w"))], no_wait()).await;
    assert!(
        matches!(refused, Err(ServeError::Unavailable(_))),
        "{:?}",
        refused.map(|_| ())
    );
    shutdown.await.unwrap().unwrap();
    let answer = call.await.unwrap();
    assert_eq!(answer.ok().as_deref(), Some("v:sleep:5000"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        sw.constructed.load(Ordering::SeqCst),
        built,
        "no replica started during the shutdown"
    );
    assert!(serve.living_replicas().is_empty());
}

/// A shutdown drains the replicas of a deployment, and of an application,
/// whose actor is waiting out a restart backoff: the waiting actor starts at
/// once and stops its replicas gracefully, so a request in flight finishes
/// (it was killed with its replica before).
#[tokio::test(start_paused = true)]
async fn a_shutdown_drains_the_replicas_of_actors_waiting_to_restart() {
    for level in ["deployment", "application"] {
        let dir = tempfile::tempdir().unwrap();
        let sw = Arc::new(Switches::default());
        // The first restart waits 10 minutes.
        let restart = RestartPolicy {
            first_backoff: Duration::from_secs(600),
            max_backoff: Duration::from_secs(600),
            ..Default::default()
        };
        let serve = start_restarting(&dir, &sw, restart).await;
        let h = serve.run(app("a", 1, tag("v"))).await.unwrap();
        let call = tokio::spawn(async move { h.call::<_, String>("sleep:5000").await });
        support::eventually("the request to begin", || {
            sw.handled.load(Ordering::SeqCst) > 0
        })
        .await;
        let crashed = match level {
            "deployment" => serve.crash_deployment("a", "probe"),
            _ => serve.crash_application("a"),
        };
        assert!(crashed, "{level}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        serve.shutdown().await.unwrap();
        let answer = call.await.unwrap();
        assert_eq!(answer.ok().as_deref(), Some("v:sleep:5000"), "{level}");
    }
}

/// A recovered checkpoint whose code is no longer registered loads: that
/// application is DEPLOY_FAILED naming the missing import path, the others
/// run, and a target naming registered code clears it.
#[tokio::test(start_paused = true)]
async fn a_recovered_app_whose_code_is_no_longer_registered_is_deploy_failed_naming_it() {
    let (dir, sw, serve) = start_fresh().await;
    serve.run(app("kept", 1, tag("k"))).await.unwrap();
    let gone = support::app_of(
        "gone",
        flotilla::DeploymentSpec::builder("probe", "test::Probe2").init_args(&tag("g")),
    );
    serve.run(gone).await.unwrap();
    serve.shutdown().await.unwrap();
    // The same program, restarted without `test::Probe2`.
    let s = sw.clone();
    let without = flotilla::Registry::new()
        .register("test::Probe", move |ctx| support::construct(ctx, s.clone()))
        .unwrap();
    let serve = support::start_with(&dir, without).await;
    let status = wait_status(&serve, "gone", A::DeployFailed).await;
    assert!(
        status.message.contains("test::Probe2"),
        "{}",
        status.message
    );
    wait_status(&serve, "kept", A::Running).await;
    let out: String = serve.app_handle("kept").unwrap().call("x").await.unwrap();
    assert_eq!(out, "k:x");
    serve.run(app("gone", 1, tag("back"))).await.unwrap();
    assert_eq!(serve.app_status("gone").status, A::Running);
    serve.shutdown().await.unwrap();
}
