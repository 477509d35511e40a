//! Autoscaling: Ray Serve's default policy on the replicas' own load counters,
//! decisions made durable by the Controller before replicas change.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use flotilla::{ApplicationStatus, AutoscalingConfig, DeploymentStatus, Serve};
use support::{ProbeArgs, app_of, no_wait, observe, probe, tag, wait_snapshot};
use tokio::time::Instant;

fn autoscaled(min: u32, initial: u32, max: u32) -> flotilla::ApplicationSpec {
    autoscaled_as(min, initial, max, &ProbeArgs::default())
}

/// [`autoscaled`], its code given by `args`.
fn autoscaled_as(min: u32, initial: u32, max: u32, args: &ProbeArgs) -> flotilla::ApplicationSpec {
    autoscaled_by(autoscaling(min, Some(initial), max), args)
}

/// The tests' autoscaling config: one request per replica, 30 s up, 60 s
/// down, a 10 s window.
fn autoscaling(min: u32, initial: Option<u32>, max: u32) -> AutoscalingConfig {
    AutoscalingConfig {
        min_replicas: min,
        initial_replicas: initial,
        max_replicas: max,
        target_ongoing_requests: 1.0,
        upscale_delay: Duration::from_secs(30),
        downscale_delay: Duration::from_secs(60),
        look_back_period: Duration::from_secs(10),
        ..Default::default()
    }
}

/// Application "auto": one probe deployment scaled by `config`, its code
/// given by `args`.
fn autoscaled_by(config: AutoscalingConfig, args: &ProbeArgs) -> flotilla::ApplicationSpec {
    app_of(
        "auto",
        probe(1, args).with_config(|c| c.with_autoscaling(config)),
    )
}

/// Keep `n` requests in flight for a long time.
fn load(serve: &Serve, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let h = serve.app_handle("auto").unwrap();
    (0..n)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                let _ = h.call::<_, String>("sleep:100000000").await;
            })
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn two_ongoing_per_replica_with_target_one_doubles_after_the_upscale_delay() {
    let (_dir, _, serve) = support::start_fresh().await;
    serve.run(autoscaled(1, 2, 10)).await.unwrap();
    let commits = serve.metrics().await.unwrap().store.commits;
    let start = Instant::now();
    let calls = load(&serve, 4);
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(
        observe(&serve, "auto", "probe").await.target.replicas,
        2,
        "no change before the delay"
    );
    let s = wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 4).await;
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(35),
        "{waited:?}"
    );
    assert!(matches!(
        s.status.status,
        DeploymentStatus::Upscaling | DeploymentStatus::Healthy
    ));
    wait_snapshot(&serve, "auto", "probe", |s| {
        s.count(flotilla::ReplicaState::Running) == 4
    })
    .await;
    // The decision went through one Controller commit before replicas changed.
    assert_eq!(serve.metrics().await.unwrap().store.commits, commits + 1);
    for c in calls {
        c.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn bounds_hold_under_heavy_load() {
    let (_dir, _, serve) = support::start_fresh().await;
    serve.run(autoscaled(3, 3, 3)).await.unwrap();
    let calls = load(&serve, 15);
    tokio::time::sleep(Duration::from_secs(300)).await;
    let s = observe(&serve, "auto", "probe").await;
    assert_eq!((s.target.replicas, s.live()), (3, 3));
    for c in calls {
        c.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn idle_scales_down_after_the_delay_to_zero_and_back_when_requests_arrive() {
    let (_dir, _, serve) = support::start_fresh().await;
    serve.run(autoscaled(0, 3, 5)).await.unwrap();
    let start = Instant::now();
    wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 1).await;
    let first = start.elapsed();
    assert!(
        first >= Duration::from_secs(60) && first < Duration::from_secs(65),
        "{first:?}"
    );
    wait_snapshot(&serve, "auto", "probe", |s| {
        s.target.replicas == 0 && s.live() == 0
    })
    .await;
    assert!(start.elapsed() >= Duration::from_secs(120));
    assert!(serve.app_handle("auto").unwrap().replicas().is_empty());
    // A request waits in the handle's queue and triggers the scale-up from zero.
    let h = serve.app_handle("auto").unwrap();
    let asked = Instant::now();
    assert_eq!(h.call::<_, String>("x").await.unwrap(), ":x");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "cold start bypasses the delay"
    );
    assert_eq!(observe(&serve, "auto", "probe").await.target.replicas, 1);
}

#[tokio::test(start_paused = true)]
async fn a_recovered_deployment_resumes_from_its_durable_target() {
    let (dir, sw, serve) = support::start_fresh().await;
    serve.run(autoscaled(1, 2, 10)).await.unwrap();
    let calls = load(&serve, 4);
    wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 4).await;
    serve.crash_process().await;
    for c in calls {
        c.abort();
    }
    let serve = support::start(&dir, &sw).await;
    // One Controller round trip: the recovered targets are in place.
    serve.metrics().await.unwrap();
    let s = wait_snapshot(&serve, "auto", "probe", |s| s.live() == 4).await;
    assert_eq!(
        s.target.replicas, 4,
        "not the initial 2: the decision was durable"
    );
}

#[tokio::test(start_paused = true)]
async fn a_recovered_deployment_whose_policy_is_no_longer_registered_is_deploy_failed_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let sw = std::sync::Arc::new(support::Switches::default());
    let with = support::registry(&sw)
        .register_autoscaling_policy("test::wants_three", |_| 3.0)
        .unwrap();
    let serve = support::start_with(&dir, with).await;
    let config = AutoscalingConfig {
        min_replicas: 1,
        initial_replicas: Some(2),
        max_replicas: 6,
        policy: flotilla::AutoscalingPolicy::named("test::wants_three".try_into().unwrap()),
        ..Default::default()
    };
    serve
        .run(app_of(
            "auto",
            probe(1, &ProbeArgs::default()).with_config(|c| c.with_autoscaling(config)),
        ))
        .await
        .unwrap();
    serve.shutdown().await.unwrap();
    // Restarted without the policy: DEPLOY_FAILED naming it, however its
    // replicas do (it was RUNNING with its target frozen, naming nothing).
    let serve = support::start_with(&dir, support::registry(&sw)).await;
    let s = support::wait_status(&serve, "auto", flotilla::ApplicationStatus::DeployFailed).await;
    assert!(s.message.contains("test::wants_three"), "{}", s.message);
    let d = wait_snapshot(&serve, "auto", "probe", |d| d.live() == d.target.replicas).await;
    assert!(d.live() >= 1);
    assert_eq!(
        serve.app_status("auto").status,
        flotilla::ApplicationStatus::DeployFailed
    );
}

#[tokio::test(start_paused = true)]
async fn a_registered_custom_policy_drives_the_autoscaler_within_its_bounds() {
    // Always wants 9 replicas (with its kwargs' help); the config caps it at 6.
    let (_dir, _, serve) = support::start_fresh_with(|sw| {
        support::registry(sw)
            .register_autoscaling_policy("test::wants_nine", |ctx| {
                let extra: u32 = ctx.kwargs.decode().unwrap();
                f64::from(8 + extra)
            })
            .unwrap()
    })
    .await;
    let policy = flotilla::AutoscalingPolicy::named("test::wants_nine".try_into().unwrap())
        .with_kwargs(flotilla::Args::encode(&1u32).unwrap());
    let config = AutoscalingConfig {
        min_replicas: 1,
        initial_replicas: Some(2),
        max_replicas: 6,
        upscale_delay: Duration::from_secs(30),
        policy,
        ..Default::default()
    };
    serve
        .run(app_of(
            "auto",
            probe(1, &ProbeArgs::default()).with_config(|c| c.with_autoscaling(config)),
        ))
        .await
        .unwrap();
    let start = Instant::now();
    // No load at all: only the policy wants more.
    wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 6).await;
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(35),
        "{waited:?}"
    );
    // The policy still wants 9: past two more upscale delays, the bound holds.
    tokio::time::sleep(Duration::from_secs(70)).await;
    let s = observe(&serve, "auto", "probe").await;
    assert_eq!(s.target.replicas, 6, "capped at max_replicas");
}

/// As Ray's `autoscale`: a decision changes the status only while the
/// replicas RUNNING at the target version are within the bounds. Mid-update
/// (none of the new code runs yet) the deployment stays UPDATING, and its
/// application DEPLOYING, while the target moves.
#[tokio::test(start_paused = true)]
async fn an_autoscaling_decision_mid_update_leaves_the_deployment_updating() {
    let (_dir, sw, serve) = support::start_fresh().await;
    serve.run(autoscaled(2, 2, 10)).await.unwrap();
    let calls = load(&serve, 8);
    sw.slow_start_ms
        .store(600_000, std::sync::atomic::Ordering::SeqCst);
    serve
        .run_many(vec![autoscaled_as(2, 2, 10, &tag("v2"))], no_wait())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(40)).await;
    let s = observe(&serve, "auto", "probe").await;
    assert!(
        s.target.replicas > 2,
        "the autoscaler decided: {:?}",
        s.target
    );
    assert_eq!(
        s.status.status,
        DeploymentStatus::Updating,
        "{:?}",
        s.status
    );
    assert_eq!(
        serve.app_status("auto").status,
        ApplicationStatus::Deploying
    );
    for c in calls {
        c.abort();
    }
}

/// Deleting an autoscaled deployment is (UPDATING, DELETING) while its
/// replicas drain: the count's fall to zero is no autoscaling decision.
#[tokio::test(start_paused = true)]
async fn a_deleted_autoscaled_deployment_is_updating_while_deleting() {
    let (_dir, _, serve) = support::start_fresh().await;
    serve.run(autoscaled(1, 2, 10)).await.unwrap();
    wait_snapshot(&serve, "auto", "probe", |s| {
        s.status.status == DeploymentStatus::Healthy
    })
    .await;
    serve.delete_apps(["auto"], false).await.unwrap();
    let s = wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 0).await;
    assert_eq!(
        (s.status.status, s.status.trigger),
        (
            DeploymentStatus::Updating,
            flotilla::StatusTrigger::Deleting
        ),
        "{:?}",
        s.status
    );
}

/// New bounds clamp the autoscaler's standing decision for good, as Ray's
/// `deploy` sets the target to the current one clamped: bounds widened again
/// later start from the clamped count (and the autoscaler's delay), not from
/// the old decision. (Without `initial_replicas`: with them, a changed
/// deployment starts again from them, below.)
#[tokio::test(start_paused = true)]
async fn new_bounds_clamp_the_standing_decision_for_good() {
    let (_dir, _, serve) = support::start_fresh().await;
    let bounded = |max| autoscaled_by(autoscaling(1, None, max), &ProbeArgs::default());
    serve.run(bounded(10)).await.unwrap();
    let calls = load(&serve, 5);
    wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 5).await;
    serve.run(bounded(3)).await.unwrap();
    assert_eq!(observe(&serve, "auto", "probe").await.target.replicas, 3);
    serve.run(bounded(10)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        observe(&serve, "auto", "probe").await.target.replicas,
        3,
        "the old decision of 5 came back without the upscale delay"
    );
    for c in calls {
        c.abort();
    }
}

/// A deployment with `initial_replicas` deployed again with other settings
/// or code starts again from them, and the autoscaler takes it from there
/// (Ray's `register`: "even if the deployment is already running, it scales
/// to match `initial_replicas`"); deployed again unchanged, it keeps its
/// decision.
#[tokio::test(start_paused = true)]
async fn a_changed_deployment_starts_again_from_initial_replicas() {
    let (_dir, _, serve) = support::start_fresh().await;
    serve.run(autoscaled(1, 2, 10)).await.unwrap();
    let calls = load(&serve, 5);
    wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 5).await;
    serve.run(autoscaled(1, 2, 10)).await.unwrap();
    assert_eq!(
        observe(&serve, "auto", "probe").await.target.replicas,
        5,
        "the same deployment again keeps its decision"
    );
    serve
        .run(autoscaled_as(1, 2, 10, &tag("v2")))
        .await
        .unwrap();
    assert_eq!(
        observe(&serve, "auto", "probe").await.target.replicas,
        2,
        "new code starts again from initial_replicas"
    );
    // The rollout stops the replicas that held the calls: load them again.
    for c in calls {
        c.abort();
    }
    let calls = load(&serve, 5);
    wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 5).await;
    let mut faster = autoscaling(1, Some(2), 10);
    faster.target_ongoing_requests = 5.0;
    serve.run(autoscaled_by(faster, &tag("v2"))).await.unwrap();
    assert_eq!(
        observe(&serve, "auto", "probe").await.target.replicas,
        2,
        "new settings start again from initial_replicas"
    );
    for c in calls {
        c.abort();
    }
}

/// A deployment deployed again with other settings starts its autoscaling
/// delay over: a decision 20 s into its 30 s upscale delay waits 30 s more
/// (Ray's `register` empties the policy state that counts the delay), where
/// it went through at 30 s.
#[tokio::test(start_paused = true)]
async fn a_redeploy_starts_the_autoscaling_delay_over() {
    let (_dir, _, serve) = support::start_fresh().await;
    let config = autoscaling(1, None, 10);
    serve
        .run(autoscaled_by(config.clone(), &ProbeArgs::default()))
        .await
        .unwrap();
    let start = Instant::now();
    let calls = load(&serve, 4);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let mut slower_down = config;
    slower_down.downscale_delay = Duration::from_secs(90);
    serve
        .run(autoscaled_by(slower_down, &ProbeArgs::default()))
        .await
        .unwrap();
    wait_snapshot(&serve, "auto", "probe", |s| s.target.replicas == 4).await;
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(50) && waited < Duration::from_secs(55),
        "{waited:?}"
    );
    for c in calls {
        c.abort();
    }
}

/// A running deployment that turns autoscaled keeps its count (clamped into
/// the new bounds) until the autoscaler decides, as Ray's `register` keeps
/// the current target; `initial_replicas` overrides it.
#[tokio::test(start_paused = true)]
async fn a_fixed_deployment_turned_autoscaled_keeps_its_count() {
    let (dir, sw, serve) = support::start_fresh().await;
    let auto = |initial: Option<u32>| {
        let config = AutoscalingConfig {
            min_replicas: 1,
            initial_replicas: initial,
            max_replicas: 4,
            ..Default::default()
        };
        app_of(
            "auto",
            probe(1, &ProbeArgs::default()).with_config(|c| c.with_autoscaling(config)),
        )
    };
    serve
        .run(app_of("auto", probe(5, &ProbeArgs::default())))
        .await
        .unwrap();
    serve.run(auto(None)).await.unwrap();
    let s = observe(&serve, "auto", "probe").await;
    assert_eq!(
        s.target.replicas, 4,
        "5 clamped into 1..=4, not min_replicas"
    );
    assert_eq!(s.count(flotilla::ReplicaState::Running), 4);
    // Back to a fixed count, then autoscaled with initial_replicas: it wins.
    serve
        .run(app_of("auto", probe(3, &ProbeArgs::default())))
        .await
        .unwrap();
    serve.run(auto(Some(2))).await.unwrap();
    assert_eq!(observe(&serve, "auto", "probe").await.target.replicas, 2);
    // The kept count is durable: a crashed process comes back with it.
    serve
        .run(app_of("auto", probe(3, &ProbeArgs::default())))
        .await
        .unwrap();
    serve.run(auto(None)).await.unwrap();
    assert_eq!(observe(&serve, "auto", "probe").await.target.replicas, 3);
    serve.crash_process().await;
    let serve = support::start(&dir, &sw).await;
    serve.metrics().await.unwrap();
    let s = wait_snapshot(&serve, "auto", "probe", |s| s.live() == 3).await;
    assert_eq!(s.target.replicas, 3);
}
