//! Deployment reconciliation through the public API, on paused tokio time: replica
//! states and counts, scaling, rolling code updates, config-only updates in place,
//! and idempotent redeploys.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{collections::BTreeSet, sync::atomic::Ordering, time::Duration};

use flotilla::{
    ApplicationStatus as A, Args, DeploymentSpec, DeploymentStatus, ReplicaState as R, Resources,
};
use flotilla_deployment::{DeploymentMsg, DeploymentSnapshot};
use support::{
    ProbeArgs, Switches, app_of, assert_not_deploy_failed, deployment_actor, no_wait, observe,
    probe, start_fresh, tag, wait_snapshot, wait_status,
};

fn ids(s: &DeploymentSnapshot) -> BTreeSet<u64> {
    s.replicas.iter().map(|r| r.id.0).collect()
}

/// Deploy `probe` of app `a` anew while each reconfigure takes `delay_ms`,
/// and wait until one replica is UPDATING.
async fn update_slowly(
    serve: &flotilla::Serve,
    sw: &Switches,
    probe: flotilla::DeploymentSpecBuilder,
    delay_ms: u64,
) -> DeploymentSnapshot {
    sw.reconfigure_delay_ms.store(delay_ms, Ordering::SeqCst);
    serve
        .run_many(vec![app_of("a", probe)], no_wait())
        .await
        .unwrap();
    wait_snapshot(serve, "a", "probe", |s| s.count(R::Updating) == 1).await
}

fn user_config(v: &str) -> Args {
    Args::encode(v).expect("a string encodes")
}

#[tokio::test(start_paused = true)]
async fn replica_states_and_counts_by_state_and_version_are_observable() {
    let (_dir, sw, serve) = start_fresh().await;
    let slow = ProbeArgs {
        start_delay_ms: 1_000,
        ..tag("v1")
    };
    let spec = |uc: &str| probe(2, &slow).with_config(|c| c.with_user_config(user_config(uc)));
    serve
        .run_many(vec![app_of("a", spec("one"))], no_wait())
        .await
        .unwrap();

    // STARTING: both replicas, at the target version.
    let s = wait_snapshot(&serve, "a", "probe", |s| s.count(R::Starting) == 2).await;
    assert_eq!(s.count_at(R::Starting, &s.version), 2);
    assert_eq!(s.counts.len(), 1, "{:?}", s.counts);
    let v1 = s.version.clone();

    // RUNNING.
    wait_status(&serve, "a", A::Running).await;
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.count_at(R::Running, &v1), 2);
    assert_eq!(s.status.status, DeploymentStatus::Healthy);

    // UPDATING: a config-only change with a slow reconfigure, still at the old
    // version until the reconfigure finishes; paced like a roll (one at a time
    // of two).
    let s = update_slowly(&serve, &sw, spec("two"), 1_000).await;
    assert_eq!(s.count_at(R::Updating, &v1), 1);
    assert_eq!(s.count_at(R::Running, &v1), 1);
    assert_ne!(s.version, v1);
    assert_eq!(s.version.code, v1.code, "config-only: same code version");
    let v2 = s.version.clone();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.count_at(R::Running, &v2) == 2).await;
    assert_eq!(s.counts.len(), 1);

    // STOPPING: a replica draining a request during a delete.
    let h = serve.app_handle("a").unwrap();
    let call = tokio::spawn(async move { h.call::<_, String>("sleep:5000").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    serve.delete_apps(&["a"], false).await.unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.count(R::Stopping) == 2).await;
    assert_eq!(s.count_at(R::Stopping, &v2), 2);
    assert_eq!(s.live(), 0);
    assert!(call.await.unwrap().is_ok());
    wait_status(&serve, "a", A::NotStarted).await;
}

#[tokio::test(start_paused = true)]
async fn scaling_reaches_the_target_and_stops_not_running_then_newest_first() {
    let (_dir, sw, serve) = start_fresh().await;
    let args = tag("s");
    serve.run(app_of("a", probe(2, &args))).await.unwrap();
    let first = ids(&observe(&serve, "a", "probe").await);

    // Scale up to 4 with slow constructors, then down to 2 before they run: the
    // two STARTING replicas go, the running ones stay.
    sw.slow_start_ms.store(10_000, Ordering::SeqCst);
    serve
        .run_many(vec![app_of("a", probe(4, &args))], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.count(R::Starting) == 2).await;
    assert_eq!(s.status.status, DeploymentStatus::Upscaling);
    assert_eq!(s.status.message, "Upscaling from 2 to 4 replicas.");
    serve.run(app_of("a", probe(2, &args))).await.unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.replicas.len() == 2).await;
    assert_eq!(ids(&s), first, "the running replicas were kept");
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 2);

    // Scale up for real, then down by one: the newest goes.
    sw.slow_start_ms.store(0, Ordering::SeqCst);
    serve.run(app_of("a", probe(3, &args))).await.unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.count(R::Running), 3);
    let newest = *ids(&s).last().unwrap();
    serve.run(app_of("a", probe(2, &args))).await.unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.replicas.len() == 2).await;
    assert!(!ids(&s).contains(&newest));
    assert_eq!(s.status.status, DeploymentStatus::Healthy);
    assert_eq!(serve.app_handle("a").unwrap().replicas().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_code_change_rolls_a_fifth_at_a_time_without_dropping_capacity() {
    let (_dir, sw, serve) = start_fresh().await;
    let h = serve.run(app_of("a", probe(5, &tag("v1")))).await.unwrap();
    let old = ids(&observe(&serve, "a", "probe").await);
    let slow_v2 = ProbeArgs {
        start_delay_ms: 2_000,
        ..tag("v2")
    };
    serve
        .run_many(vec![app_of("a", probe(5, &slow_v2))], no_wait())
        .await
        .unwrap();
    let mut max_live = 0;
    loop {
        let published = h.replicas().len();
        assert!(published >= 5, "capacity dropped to {published}");
        let s = observe(&serve, "a", "probe").await;
        let new_starting = s
            .replicas
            .iter()
            .filter(|r| r.state == R::Starting && r.version == s.version)
            .count();
        assert!(new_starting <= 1, "more than max(1, 20% of 5) changing");
        max_live = max_live.max(s.live());
        if s.count_at(R::Running, &s.version) == 5 && s.replicas.len() == 5 {
            assert!(ids(&s).is_disjoint(&old));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(max_live, 6, "surge of one above the target");
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 10);
    wait_status(&serve, "a", A::Running).await;
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "v2:x");
}

/// A roll's next step starts once the last step's replicas run, not once the
/// old replicas they replace have drained (Ray counts no STOPPING replica
/// against the surge): with a 15 s request on each old replica, 5 replicas
/// roll in about five 1 s constructors, not five drains, and every request
/// on an old replica finishes.
#[tokio::test(start_paused = true)]
async fn a_roll_does_not_wait_for_old_replicas_to_drain() {
    let (_dir, _sw, serve) = start_fresh().await;
    let spec = |args: &ProbeArgs| probe(5, args).with_config(|c| c.with_max_ongoing_requests(1));
    let h = serve.run(app_of("a", spec(&tag("v1")))).await.unwrap();
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move { h.call::<_, String>("sleep:15000").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = tokio::time::Instant::now();
    let slow_v2 = ProbeArgs {
        start_delay_ms: 1_000,
        ..tag("v2")
    };
    serve
        .run_many(vec![app_of("a", spec(&slow_v2))], no_wait())
        .await
        .unwrap();
    wait_snapshot(&serve, "a", "probe", |s| {
        s.count_at(R::Running, &s.version) == 5
    })
    .await;
    let rolled = start.elapsed();
    assert!(rolled < Duration::from_secs(10), "rolled in {rolled:?}");
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap(), "v1:sleep:15000");
    }
}

#[tokio::test(start_paused = true)]
async fn every_kind_of_code_change_replaces_the_replicas() {
    let (_dir, sw, serve) = start_fresh().await;
    let base = || probe(2, &tag("a"));
    let changes = [
        (
            "import path",
            DeploymentSpec::builder("probe", "test::Probe2")
                .init_args(&tag("a"))
                .replicas(2),
        ),
        ("init args", probe(2, &tag("b"))),
        (
            "resources",
            probe(2, &tag("b")).with_config(|c| c.with_resources(Resources::none())),
        ),
        ("explicit version", probe(2, &tag("b")).version("7")),
    ];
    serve.run(app_of("a", base())).await.unwrap();
    let mut before = ids(&observe(&serve, "a", "probe").await);
    for (i, (what, spec)) in changes.into_iter().enumerate() {
        serve.run(app_of("a", spec)).await.unwrap();
        let s = wait_snapshot(&serve, "a", "probe", |s| s.replicas.len() == 2).await;
        let now = ids(&s);
        assert!(now.is_disjoint(&before), "{what}: replicas replaced");
        assert_eq!(
            sw.constructed.load(Ordering::SeqCst),
            2 * (i as u32 + 2),
            "{what}"
        );
        before = now;
    }
}

#[tokio::test(start_paused = true)]
async fn a_scale_down_finishes_before_the_roll_starts() {
    let (_dir, _, serve) = start_fresh().await;
    serve.run(app_of("a", probe(4, &tag("v1")))).await.unwrap();
    let v1 = observe(&serve, "a", "probe").await.version;
    serve
        .run_many(vec![app_of("a", probe(2, &tag("v2")))], no_wait())
        .await
        .unwrap();
    let mut saw_draining = false;
    loop {
        let s = observe(&serve, "a", "probe").await;
        let old = s.replicas.iter().filter(|r| r.version == v1).count();
        let new = s.replicas.len() - old;
        saw_draining |= s.count_at(R::Stopping, &v1) > 0;
        if new > 0 {
            assert!(old <= 2, "a new replica started while {old} old ones lived");
        }
        if new == 2 && old == 0 && s.count(R::Running) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(saw_draining);
}

#[tokio::test(start_paused = true)]
async fn a_config_only_change_is_applied_in_place_without_restarts() {
    let (_dir, sw, serve) = start_fresh().await;
    let args = tag("c");
    let with = |n: u32, uc: &str, limits: bool| {
        probe(n, &args).with_config(|c| {
            let c = c.with_user_config(user_config(uc));
            if limits {
                c.with_max_ongoing_requests(7)
                    .with_max_queued_requests(Some(50))
                    .with_health_check(Duration::from_secs(3), Duration::from_secs(4))
                    .with_graceful_shutdown(Duration::from_secs(1), Duration::from_secs(5))
            } else {
                c
            }
        })
    };
    serve.run(app_of("a", with(3, "one", false))).await.unwrap();
    let before = observe(&serve, "a", "probe").await;
    assert_eq!(sw.reconfigured.load(Ordering::SeqCst), 3, "once at start");

    // user_config, limits, health check and graceful settings: all in place.
    serve.run(app_of("a", with(3, "two", true))).await.unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(ids(&s), ids(&before), "no replica restarted");
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 3);
    assert_eq!(
        sw.reconfigured.load(Ordering::SeqCst),
        6,
        "every live replica"
    );
    assert_eq!(s.version.code, before.version.code);
    assert_eq!(s.count_at(R::Running, &s.version), 3);

    // Limits only (user_config unchanged): versions move, reconfigure is not called.
    serve.run(app_of("a", with(3, "two", false))).await.unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.count_at(R::Running, &s.version), 3);
    assert_eq!(sw.reconfigured.load(Ordering::SeqCst), 6);

    // num_replicas only: one more replica, nothing else touched.
    serve.run(app_of("a", with(4, "two", false))).await.unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert!(ids(&before).is_subset(&ids(&s)));
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 4);
    assert_eq!(s.status.status, DeploymentStatus::Healthy);
}

#[tokio::test(start_paused = true)]
async fn a_replica_whose_reconfigure_fails_is_replaced() {
    let (_dir, sw, serve) = start_fresh().await;
    let spec = |uc: &str| probe(2, &tag("r")).with_config(|c| c.with_user_config(user_config(uc)));
    serve.run(app_of("a", spec("one"))).await.unwrap();
    let before = ids(&observe(&serve, "a", "probe").await);
    sw.fail_reconfigures.store(1, Ordering::SeqCst);
    serve.run(app_of("a", spec("two"))).await.unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.replicas.len() == 2).await;
    assert_eq!(s.count_at(R::Running, &s.version), 2);
    assert_eq!(
        ids(&s).intersection(&before).count(),
        1,
        "one kept, one replaced"
    );
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 3);
    assert_eq!(serve.app_status("a").status, A::Running);
}

#[tokio::test(start_paused = true)]
async fn redeploying_an_unchanged_spec_or_the_same_target_changes_nothing() {
    let (_dir, sw, serve) = start_fresh().await;
    let spec = || probe(2, &tag("u")).with_config(|c| c.with_user_config(user_config("x")));
    serve.run(app_of("a", spec())).await.unwrap();
    let before = observe(&serve, "a", "probe").await;
    let reconfigured = sw.reconfigured.load(Ordering::SeqCst);

    serve.run(app_of("a", spec())).await.unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(serve.app_status("a").observed_generation, 2);
    assert_eq!(ids(&s), ids(&before));
    assert_eq!(s.target.generation, 2);
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 2);
    assert_eq!(sw.reconfigured.load(Ordering::SeqCst), reconfigured);
    assert_eq!(s.status, before.status);

    // The same target twice, straight to the actor: nothing moves.
    let actor = deployment_actor(&serve, "a", "probe").unwrap();
    for _ in 0..2 {
        actor
            .cast(DeploymentMsg::SetTarget(Box::new(s.target.clone())))
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = observe(&serve, "a", "probe").await;
    assert_eq!(ids(&again), ids(&s));
    assert_eq!(again.status, s.status);
    assert_eq!(again.counts, s.counts);
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_scale_down_is_downscaling_until_the_stopped_replicas_are_gone() {
    let (_dir, _, serve) = start_fresh().await;
    let h = serve.run(app_of("a", probe(3, &tag("v")))).await.unwrap();
    // Requests in flight keep the replicas that stop draining for a while.
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move { h.call::<_, String>("sleep:3000").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let run = {
        let serve = serve.clone();
        tokio::spawn(async move { serve.run(app_of("a", probe(1, &tag("v")))).await })
    };
    let s = wait_snapshot(&serve, "a", "probe", |s| s.count(R::Stopping) == 2).await;
    assert_eq!(
        (s.status.status, s.status.trigger),
        (
            DeploymentStatus::Downscaling,
            flotilla::StatusTrigger::ConfigUpdateStarted
        )
    );
    assert_eq!(serve.app_status("a").status, A::Deploying);
    assert!(!run.is_finished(), "run waits for the drain");
    run.await.unwrap().unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.replicas.len(), 1, "the stopped replicas are gone");
    assert_eq!(
        (s.status.status, s.status.trigger),
        (
            DeploymentStatus::Healthy,
            flotilla::StatusTrigger::DownscaleCompleted
        )
    );
    for c in calls {
        c.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_user_config_change_reconfigures_at_most_a_roll_step_at_a_time() {
    let (_dir, sw, serve) = start_fresh().await;
    let spec = |uc: &str| probe(5, &tag("v")).with_config(|c| c.with_user_config(user_config(uc)));
    serve.run(app_of("a", spec("one"))).await.unwrap();
    sw.reconfigure_delay_ms.store(500, Ordering::SeqCst);
    let before = sw.reconfigured.load(Ordering::SeqCst);
    serve
        .run_many(vec![app_of("a", spec("two"))], no_wait())
        .await
        .unwrap();
    // The roll step of 5 replicas is one: never two UPDATING at once, and the
    // other four keep serving meanwhile.
    let mut most = 0;
    loop {
        let s = observe(&serve, "a", "probe").await;
        most = most.max(s.count(R::Updating));
        assert!(s.count(R::Running) >= 4, "{:?}", s.counts);
        if s.count_at(R::Running, &s.version) == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(most, 1);
    assert_eq!(sw.reconfigured.load(Ordering::SeqCst), before + 5);
    wait_status(&serve, "a", A::Running).await;
}

/// A config every reconfigure refuses takes one roll step of replicas down,
/// not every replica one step after another: the rest keep serving the old
/// config while the deployment fails (Ray's pacing counts a failed replica
/// as in transition until its replacement runs).
#[tokio::test(start_paused = true)]
async fn a_config_every_reconfigure_refuses_leaves_the_other_replicas_serving() {
    let (_dir, sw, serve) = start_fresh().await;
    let spec = |uc: &str| probe(5, &tag("w")).with_config(|c| c.with_user_config(user_config(uc)));
    serve.run(app_of("a", spec("one"))).await.unwrap();
    sw.fail_reconfigures.store(u32::MAX, Ordering::SeqCst);
    serve
        .run_many(vec![app_of("a", spec("two"))], no_wait())
        .await
        .unwrap();
    wait_status(&serve, "a", A::DeployFailed).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.count(R::Running), 4, "{:?}", s.counts);
}

/// Losing a replica that still runs the old config, mid config update, is
/// not the new config's failure: the update goes on (Ray fires
/// HEALTH_CHECK_FAILED only for a replica at the target version).
#[tokio::test(start_paused = true)]
async fn losing_an_outdated_replica_mid_config_update_does_not_fail_the_update() {
    let (_dir, sw, serve) = start_fresh().await;
    let spec = |uc: &str| probe(3, &tag("x")).with_config(|c| c.with_user_config(user_config(uc)));
    serve.run(app_of("a", spec("one"))).await.unwrap();
    let s = update_slowly(&serve, &sw, spec("two"), 60_000).await;
    let outdated = s
        .replicas
        .iter()
        .find(|r| r.state == R::Running && r.version != s.version)
        .map(|r| r.id)
        .unwrap();
    let statuses = record_until_running(&serve);
    assert!(serve.crash_replica("a", "probe", outdated));
    wait_snapshot(&serve, "a", "probe", |s| {
        !s.replicas.iter().any(|r| r.id == outdated)
    })
    .await;
    sw.reconfigure_delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(statuses.await.unwrap(), [A::Deploying, A::Running]);
}

/// A replica stopped while its `reconfigure` hangs ends that call: the call
/// held the replica's user value (and what it owns: a model's memory, open
/// files) after the replica was gone, for good, past `Serve::shutdown` too.
/// (Ray's force-kill after the graceful timeout ends the process with it.)
#[tokio::test(start_paused = true)]
async fn a_replica_stopped_mid_reconfigure_drops_its_user_value() {
    let (_dir, sw, serve) = start_fresh().await;
    let spec = |uc: &str| probe(1, &tag("x")).with_config(|c| c.with_user_config(user_config(uc)));
    serve.run(app_of("a", spec("one"))).await.unwrap();
    update_slowly(&serve, &sw, spec("hangs"), 1_000_000_000).await;
    serve.delete_apps(&["a"], true).await.unwrap();
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 1);
    assert_eq!(
        sw.dropped.load(Ordering::SeqCst),
        1,
        "the user value was dropped"
    );
    serve.shutdown().await.unwrap();
}

/// A replica taking its config in place for over 30 s is reported as a slow
/// start is (Ray checks UPDATING replicas as it checks STARTING ones); one
/// that crashes while it updates is a startup failure, replaced, not a
/// health-check failure (which from UPDATING would be DEPLOY_FAILED).
#[tokio::test(start_paused = true)]
async fn a_slow_or_crashed_reconfigure_is_a_matter_of_starting() {
    let (_dir, sw, serve) = start_fresh().await;
    let spec = |uc: &str| probe(1, &tag("x")).with_config(|c| c.with_user_config(user_config(uc)));
    serve.run(app_of("a", spec("one"))).await.unwrap();
    update_slowly(&serve, &sw, spec("two"), 100_000).await;
    tokio::time::sleep(Duration::from_secs(31)).await;
    let s = observe(&serve, "a", "probe").await;
    assert!(
        s.status.message.contains(
            "Deployment 'probe' in application 'a' has 1 replicas that have taken more than 30s \
             to initialize."
        ),
        "{:?}",
        s.status
    );
    let updating = s
        .replicas
        .iter()
        .find(|r| r.state == R::Updating)
        .unwrap()
        .id;
    // Every status from the crash until the update runs: never DEPLOY_FAILED.
    let statuses = record_until_running(&serve);
    assert!(serve.crash_replica("a", "probe", updating));
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        !s.replicas.iter().any(|r| r.id == updating)
    })
    .await;
    assert_not_deploy_failed(&s);
    sw.reconfigure_delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(statuses.await.unwrap(), [A::Deploying, A::Running]);
}

/// Every status "a" shows from now until it is RUNNING.
fn record_until_running(serve: &flotilla::Serve) -> tokio::task::JoinHandle<Vec<A>> {
    support::spawn_record_statuses(serve, "a", A::Running)
}

/// A replica that turns unhealthy while it takes its config in place (a
/// request panicked on it: UPDATING replicas take requests) did not become
/// ready for the target: it is a startup failure, not a failed health check
/// (which from UPDATING would be DEPLOY_FAILED), and it stops gracefully, so
/// a request it was running finishes.
#[tokio::test(start_paused = true)]
async fn a_replica_condemned_while_updating_drains_and_is_replaced() {
    let (_dir, sw, serve) = start_fresh().await;
    let spec = |uc: &str| probe(1, &tag("u")).with_config(|c| c.with_user_config(user_config(uc)));
    let h = serve.run(app_of("a", spec("one"))).await.unwrap();
    let s = update_slowly(&serve, &sw, spec("two"), 100_000).await;
    let updating = s.replicas[0].id;
    let running = {
        let h = h.clone();
        tokio::spawn(async move { h.call::<_, String>("sleep:5000").await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let statuses = record_until_running(&serve);
    assert!(h.call::<_, String>("panic").await.is_err());
    sw.reconfigure_delay_ms.store(0, Ordering::SeqCst);
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        s.replicas
            .iter()
            .any(|r| r.id == updating && r.state == R::Stopping)
    })
    .await;
    assert_not_deploy_failed(&s);
    // Graceful: the request it was running when condemned finishes.
    assert!(running.await.unwrap().is_ok());
    assert_eq!(statuses.await.unwrap(), [A::Deploying, A::Running]);
    let s = observe(&serve, "a", "probe").await;
    assert!(!ids(&s).contains(&updating.0), "replaced");
    assert_eq!(s.count_at(R::Running, &s.version), 1);
}

/// `delete_apps_within` answers once the deletion is committed: `false`
/// when its applications are still going at the limit (a replica drains a
/// request), `true` once they are gone within it; a refused deletion is an
/// error, and deletes nothing.
#[tokio::test(start_paused = true)]
async fn delete_apps_within_says_whether_the_applications_went_in_time() {
    let (_dir, _, serve) = start_fresh().await;
    let h = serve.run(app_of("a", probe(1, &tag("w")))).await.unwrap();
    serve.fail_next_commit();
    assert!(
        serve
            .delete_apps_within(["a"], Duration::from_secs(1))
            .await
            .is_err()
    );
    assert_eq!(serve.app_status("a").status, A::Running, "nothing deleted");
    let call = tokio::spawn(async move { h.call::<_, String>("sleep:5000").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let gone = serve
        .delete_apps_within(["a"], Duration::from_secs(1))
        .await;
    assert!(!gone.unwrap(), "the request still drains");
    assert!(call.await.unwrap().is_ok());
    wait_status(&serve, "a", A::NotStarted).await;
    serve.run(app_of("b", probe(1, &tag("w")))).await.unwrap();
    let gone = serve
        .delete_apps_within(["b"], Duration::from_secs(60))
        .await;
    assert!(gone.unwrap(), "nothing holds b");
    assert!(serve.status().is_empty());
}
