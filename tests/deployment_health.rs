//! Replica health, startup retries, panics and graceful stops, through the public
//! API on paused tokio time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::atomic::Ordering, time::Duration};

use flotilla::{ApplicationStatus as A, CallError, DeploymentStatus, ReplicaState as R};
use flotilla_core::DeploymentSpecBuilder;
use support::{
    ProbeArgs, app_of, deployment_actor, no_wait, observe, probe, start_fresh, tag, wait_snapshot,
    wait_status,
};
use tokio::time::Instant;

/// One probe replica with health checks every `period_s`, cut at `timeout_s`.
fn health(period_s: u64, timeout_s: u64) -> DeploymentSpecBuilder {
    probe(1, &tag("h")).with_config(|c| {
        c.with_health_check(
            Duration::from_secs(period_s),
            Duration::from_secs(timeout_s),
        )
    })
}

/// The id of the (only) replica that is not stopping.
fn first_id(s: &flotilla_deployment::DeploymentSnapshot) -> u64 {
    s.replicas
        .iter()
        .find(|r| r.state != R::Stopping)
        .map(|r| r.id.0)
        .unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn health_checks_run_every_period_and_one_failure_is_not_enough() {
    let (_dir, sw, serve) = start_fresh().await;
    serve.run(app_of("a", health(2, 1))).await.unwrap();
    let id = first_id(&observe(&serve, "a", "probe").await);
    let before = sw.health_checks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let checks = sw.health_checks.load(Ordering::SeqCst) - before;
    assert!((9..=11).contains(&checks), "{checks} checks in 20s");

    // Two failed checks, then healthy again: not replaced (three in a row are).
    sw.unhealthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(4)).await;
    sw.unhealthy.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(first_id(&observe(&serve, "a", "probe").await), id);
    assert_eq!(serve.app_status("a").status, A::Running);
}

/// A replica taking a config in place is not health-checked (Ray checks
/// RUNNING replicas only; its reconfigure judges it): checks that would fail
/// during a 10 s reconfigure replace nothing, and checks resume once it runs.
#[tokio::test(start_paused = true)]
async fn a_replica_updating_in_place_is_not_health_checked() {
    let (_dir, sw, serve) = start_fresh().await;
    serve.run(app_of("a", health(1, 1))).await.unwrap();
    let id = first_id(&observe(&serve, "a", "probe").await);
    sw.reconfigure_delay_ms.store(10_000, Ordering::SeqCst);
    let changed = health(1, 1).with_config(|c| {
        c.with_user_config(flotilla::Args::encode("two").expect("a string encodes"))
    });
    serve
        .run_many(vec![app_of("a", changed)], no_wait())
        .await
        .unwrap();
    wait_snapshot(&serve, "a", "probe", |s| s.count(R::Updating) == 1).await;
    let checks = sw.health_checks.load(Ordering::SeqCst);
    sw.unhealthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        sw.health_checks.load(Ordering::SeqCst),
        checks,
        "checked while updating"
    );
    sw.unhealthy.store(false, Ordering::SeqCst);
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        s.count_at(R::Running, &s.version) == 1
    })
    .await;
    assert_eq!(first_id(&s), id, "the replica was replaced");
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        sw.health_checks.load(Ordering::SeqCst) > checks,
        "checks resumed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_health_check_that_hangs_past_its_timeout_fails_and_three_replace_the_replica() {
    let (_dir, sw, serve) = start_fresh().await;
    serve.run(app_of("a", health(1, 2))).await.unwrap();
    let id = first_id(&observe(&serve, "a", "probe").await);
    let built = sw.constructed.load(Ordering::SeqCst);
    let t0 = Instant::now();
    sw.hang_health.store(true, Ordering::SeqCst);
    let s = wait_status(&serve, "a", A::Unhealthy).await;
    let took = t0.elapsed();
    // Three checks, each cut at the 2 s timeout, one period apart at most.
    assert!(
        took >= Duration::from_secs(6) && took <= Duration::from_secs(10),
        "{took:?}"
    );
    let d = &s.deployments.values().next().unwrap();
    assert_eq!(d.status, DeploymentStatus::Unhealthy);
    // Ray's text first (tooling may match it), then why.
    assert!(
        d.message.starts_with(
            "A replica's health check failed. This deployment will be UNHEALTHY until the \
             replica recovers or a new deploy happens."
        ) && d
            .message
            .contains(&format!("replica {id} failed 3 consecutive health checks"))
            && d.message.contains("timed out after 2s"),
        "{}",
        d.message
    );
    sw.hang_health.store(false, Ordering::SeqCst);
    wait_status(&serve, "a", A::Running).await;
    // HEALTHY again only once the count is back at target.
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.count_at(R::Running, &s.version), 1);
    assert_ne!(first_id(&s), id);
    assert!(sw.constructed.load(Ordering::SeqCst) > built);
}

#[tokio::test(start_paused = true)]
async fn constructor_failures_back_off_then_deploy_failed_retries_slowly_and_recovers() {
    let (_dir, sw, serve) = start_fresh().await;
    // One replica: retry limit min(20, 3 x 1) = 3. Five failures, then success.
    let flaky = ProbeArgs {
        fail_constructor: 5,
        ..tag("f")
    };
    serve
        .run_many(vec![app_of("a", probe(1, &flaky))], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.startup_failures == 1).await;
    assert_eq!(s.status.status, DeploymentStatus::Updating);
    assert!(
        s.status
            .message
            .starts_with("A replica failed to start with exception. Retrying 2 more time(s).")
            && s.status.message.contains("1 of 3 tries used")
            && s.status.message.contains("next try in 100ms")
            && s.status.message.contains("probe constructor failure #1"),
        "{}",
        s.status.message
    );
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        s.status.status == DeploymentStatus::DeployFailed
    })
    .await;
    assert!(
        s.status
            .message
            .starts_with("The deployment failed to start 3 times in a row.")
            && s.status.message.contains("retry limit 3")
            && s.status.message.contains("still retrying every 30s")
            && s.status.message.contains("probe constructor failure #3"),
        "{}",
        s.status.message
    );
    assert_eq!(serve.app_status("a").status, A::DeployFailed);
    let s = wait_status(&serve, "a", A::Running).await;
    assert_eq!(s.observed_generation, 1, "recovered without a redeploy");
    assert_eq!(s.deployments.values().next().unwrap().message, "");

    // The spacing in virtual time: 100 ms, 200 ms, then every 30 s.
    let times = sw.constructor_times();
    assert_eq!(times.len(), 6);
    let gaps: Vec<u128> = times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert_eq!(gaps, [100, 200, 30_000, 30_000, 30_000]);
}

/// Failures that come together back off as long as the last of them says: three
/// replicas failing at once are failures 1, 2 and 3, so the next start waits
/// backoff(3) = 400 ms, not the 100 ms the first one armed.
#[tokio::test(start_paused = true)]
async fn failures_at_once_hold_starts_back_for_the_longest_backoff_they_earn() {
    let (_dir, sw, serve) = start_fresh().await;
    let flaky = ProbeArgs {
        fail_constructor: 3,
        ..tag("f")
    };
    serve
        .run_many(vec![app_of("a", probe(3, &flaky))], no_wait())
        .await
        .unwrap();
    wait_status(&serve, "a", A::Running).await;
    let times = sw.constructor_times();
    let t0 = times[0];
    let offsets: Vec<u128> = times.iter().map(|t| (*t - t0).as_millis()).collect();
    assert_eq!(offsets, [0, 0, 0, 400, 400, 400]);
    assert_eq!(sw.failed.load(Ordering::SeqCst), 3);
}
/// A handle's call to a deployment that failed to deploy and has no replica
/// fails at once, as Ray's router raises DeploymentUnavailableError, instead
/// of waiting for a replica that keeps failing to start; once one starts,
/// calls reach it.
#[tokio::test(start_paused = true)]
async fn calls_to_a_deploy_failed_deployment_fail_at_once_until_it_recovers() {
    let (_dir, sw, serve) = start_fresh().await;
    sw.fail_starts.store(true, Ordering::SeqCst);
    serve
        .run_many(vec![app_of("a", probe(1, &tag("f")))], no_wait())
        .await
        .unwrap();
    let h = serve.app_handle("a").unwrap();
    let early = tokio::spawn({
        let h = h.clone();
        async move { h.call::<_, String>("x").await }
    });
    wait_snapshot(&serve, "a", "probe", |s| {
        s.status.status == DeploymentStatus::DeployFailed
    })
    .await;
    let e = tokio::time::timeout(Duration::from_secs(60), early)
        .await
        .expect("the waiting call answers")
        .unwrap()
        .unwrap_err();
    assert!(matches!(e, CallError::DeployFailed { .. }), "{e}");
    let e = h.call::<_, String>("x").await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "deployment 'probe' of application 'a' is unavailable because it failed to deploy"
    );
    // It starts working: its slow retries bring a replica, which serves.
    sw.fail_starts.store(false, Ordering::SeqCst);
    wait_status(&serve, "a", A::Running).await;
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "f:x");
}

/// Only a deployment none of whose target replicas ever ran is unavailable
/// (Ray's `is_available = not _terminally_failed()`): one that is
/// DEPLOY_FAILED because its running new replica was lost mid-roll keeps its
/// callers waiting for the replacement.
#[tokio::test(start_paused = true)]
async fn a_deploy_failed_deployment_whose_new_replica_ran_keeps_its_callers_waiting() {
    let (_dir, _sw, serve) = start_fresh().await;
    let version = |t: &str| {
        let args = ProbeArgs {
            start_delay_ms: 5_000,
            ..tag(t)
        };
        // The old replica drains for 30 s once replaced: the roll stays UPDATING.
        probe(1, &args).with_config(|c| {
            c.with_graceful_shutdown(Duration::from_secs(30), Duration::from_secs(60))
        })
    };
    serve.run(app_of("a", version("v1"))).await.unwrap();
    serve
        .run_many(vec![app_of("a", version("v2"))], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        s.count_at(R::Running, &s.version) == 1 && s.count(R::Stopping) == 1
    })
    .await;
    assert_eq!(s.status.status, DeploymentStatus::Updating);
    let new = s
        .replicas
        .iter()
        .find(|r| r.state == R::Running)
        .unwrap()
        .id;
    assert!(serve.crash_replica("a", "probe", new));
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        s.status.status == DeploymentStatus::DeployFailed
    })
    .await;
    assert_eq!(s.count(R::Running), 0, "{s:?}");
    // No replica serves, and the replacement takes 5 s to start: the call
    // waits for it.
    let h = serve.app_handle("a").unwrap();
    let t0 = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(20), h.call::<_, String>("x"))
        .await
        .expect("the call is answered once the replacement runs");
    assert_eq!(answer.unwrap(), "v2:x");
    assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_redeploy_that_only_rescales_a_failed_deployment_starts_its_retries_afresh() {
    let (_dir, sw, serve) = start_fresh().await;
    let failing = ProbeArgs {
        fail_constructor: u32::MAX,
        ..tag("f")
    };
    serve
        .run_many(vec![app_of("a", probe(1, &failing))], no_wait())
        .await
        .unwrap();
    wait_snapshot(&serve, "a", "probe", |s| {
        s.status.status == DeploymentStatus::DeployFailed
    })
    .await;
    // The user asks for two replicas of the same code. As Ray's `deploy`, any
    // new target resets the retry count and the backoff: the next start comes at
    // once, not after the 30 s DEPLOY_FAILED pace, and counts from one again.
    let tries = sw.constructed.load(Ordering::SeqCst);
    let t0 = Instant::now();
    serve
        .run_many(vec![app_of("a", probe(2, &failing))], no_wait())
        .await
        .unwrap();
    // Both new tries fail at once: the count is back to two at most.
    let s = wait_snapshot(&serve, "a", "probe", |s| s.startup_failures <= 2).await;
    assert!(sw.constructed.load(Ordering::SeqCst) > tries);
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(s.status.status, DeploymentStatus::DeployFailed);
}

#[tokio::test(start_paused = true)]
async fn a_request_panic_replaces_the_replica_and_never_the_deployment_actor() {
    let (_dir, _, serve) = start_fresh().await;
    let h = serve.run(app_of("a", probe(1, &tag("p")))).await.unwrap();
    let actor = deployment_actor(&serve, "a", "probe").unwrap().get_id();
    let id = first_id(&observe(&serve, "a", "probe").await);
    let err = h.call::<_, String>("panic").await.unwrap_err();
    assert!(matches!(err, CallError::Panicked(_)), "{err}");
    // HEALTHY once the replacement runs and the panicked replica has drained.
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        first_id(s) != id && s.count(R::Running) == 1 && s.replicas.len() == 1
    })
    .await;
    assert_eq!(s.status.status, DeploymentStatus::Healthy);
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "p:x");
    assert_eq!(
        deployment_actor(&serve, "a", "probe").unwrap().get_id(),
        actor
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_health_check_is_caught_counts_as_failures_and_replaces_the_replica() {
    let (_dir, sw, serve) = start_fresh().await;
    serve.run(app_of("a", health(1, 5))).await.unwrap();
    let actor = deployment_actor(&serve, "a", "probe").unwrap().get_id();
    let id = first_id(&observe(&serve, "a", "probe").await);
    sw.panic_health.store(true, Ordering::SeqCst);
    // Each panic comes back as a failed check (it is caught in the check's task),
    // so the three-in-a-row rule applies and the replica is replaced.
    let s = wait_status(&serve, "a", A::Unhealthy).await;
    let d = s.deployments.values().next().unwrap();
    assert_eq!(d.trigger, flotilla::StatusTrigger::HealthCheckFailed);
    // Its replacement fails its first check too (the switch is still on), and
    // the message says so, as Ray's does for every startup failure.
    assert!(
        d.message
            .starts_with("A replica failed to start with exception. Retrying.")
            && d.message.contains("initial health check failed: panicked"),
        "{}",
        d.message
    );
    sw.panic_health.store(false, Ordering::SeqCst);
    wait_status(&serve, "a", A::Running).await;
    assert_ne!(first_id(&observe(&serve, "a", "probe").await), id);
    assert_eq!(
        deployment_actor(&serve, "a", "probe").unwrap().get_id(),
        actor
    );
}

/// One probe replica draining every `wait_loop_s`, killed at `timeout_s`.
fn graceful(wait_loop_s: u64, timeout_s: u64) -> DeploymentSpecBuilder {
    probe(1, &tag("g")).with_config(|c| {
        c.with_graceful_shutdown(
            Duration::from_secs(wait_loop_s),
            Duration::from_secs(timeout_s),
        )
    })
}

#[tokio::test(start_paused = true)]
async fn in_flight_requests_finish_during_a_delete_after_leaving_the_route() {
    let (_dir, _, serve) = start_fresh().await;
    let h = serve.run(app_of("a", graceful(1, 20))).await.unwrap();
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move { h.call::<_, String>("sleep:3500").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let t0 = Instant::now();
    serve.delete_apps(&["a"], false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        h.replicas().is_empty(),
        "a stopping replica takes no new work"
    );
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap(), "g:sleep:3500");
    }
    wait_status(&serve, "a", A::NotStarted).await;
    // Idle checks every second: the first one after the requests ended (at 3.5 s)
    // lets the replica go.
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took <= Duration::from_millis(4_100),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stuck_request_is_cut_at_the_graceful_timeout() {
    let (_dir, _, serve) = start_fresh().await;
    let h = serve.run(app_of("a", graceful(1, 5))).await.unwrap();
    let call = {
        let h = h.clone();
        tokio::spawn(async move { h.call::<_, String>("hang").await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let t0 = Instant::now();
    serve.delete_apps(&["a"], false).await.unwrap();
    let err = call.await.unwrap().unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(err, CallError::Killed { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("killed at its graceful shutdown timeout"),
        "{err}"
    );
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_millis(5_100),
        "{took:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(serve.app_status("a").status, A::NotStarted);
}

/// A replica stopped while a health check of it hangs ends that check: the
/// check held the replica's user value until its timeout (30 s), after the
/// replica was gone.
#[tokio::test(start_paused = true)]
async fn a_replica_stopped_mid_health_check_drops_its_user_value() {
    let (_dir, sw, serve) = start_fresh().await;
    serve.run(app_of("a", probe(1, &tag("h")))).await.unwrap();
    sw.hang_health.store(true, Ordering::SeqCst);
    let checks = sw.health_checks.load(Ordering::SeqCst);
    while sw.health_checks.load(Ordering::SeqCst) == checks {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    serve.delete_apps(&["a"], true).await.unwrap();
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 1);
    assert_eq!(
        sw.dropped.load(Ordering::SeqCst),
        1,
        "the user value was dropped"
    );
    serve.shutdown().await.unwrap();
}
