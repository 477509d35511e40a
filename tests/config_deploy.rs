//! Declarative deploys: `apply_config`, build tasks, overrides, imperative
//! coexistence and recovery, on paused tokio time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Duration,
};

use flotilla::{
    ApplicationSpec, ApplicationStatus as A, ApplicationStatusInfo, DeploymentSpec, NodeSpec,
    PlacementGroup, PlacementStrategy, Registry, ReplicaState, Resources, Serve, ServeConfig,
    ServeError, StaticCluster, UserError,
};
use serde::{Deserialize, Serialize};
use support::{
    ProbeArgs, Switches, observe, poll_secs, start_fresh_with, wait_snapshot, wait_status,
};

/// What the test application builder does, from the config's `args`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct BuildArgs {
    tag: String,
    fail: bool,
    panic: bool,
    sleep_s: u64,
}

async fn build(args: flotilla::Args) -> Result<ApplicationSpec, UserError> {
    let a: BuildArgs = args.decode().map_err(|e| UserError::new(e.to_string()))?;
    if a.sleep_s > 0 {
        tokio::time::sleep(Duration::from_secs(a.sleep_s)).await;
    }
    if a.fail {
        return Err(UserError::new("the builder refused"));
    }
    if a.panic {
        panic!("the builder panicked");
    }
    ApplicationSpec::builder("ignored")
        .route_prefix("/from-code")
        .deployment(
            DeploymentSpec::builder("probe", "test::Probe").init_args(&ProbeArgs {
                tag: a.tag,
                ..Default::default()
            }),
        )
        .build()
        .map_err(|e| UserError::new(e.to_string()))
}

fn registry(sw: &Arc<Switches>) -> Registry {
    support::registry(sw)
        .register_app("test::app", build)
        .unwrap()
}

async fn start(dir: &tempfile::TempDir, sw: &Arc<Switches>) -> Serve {
    support::start_with(dir, registry(sw)).await
}

fn config(yaml: &str) -> ServeConfig {
    ServeConfig::from_yaml(yaml).unwrap()
}

/// Apply the config `yaml` to `serve`, which accepts it.
async fn apply(serve: &Serve, yaml: &str) {
    serve.apply_config(config(yaml)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_successful_build_deploys_with_the_configs_route_prefix() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:\n  - name: app1\n    route_prefix: /cfg\n    import_path: test::app\n    args: {tag: one, sleep_s: 10}\n",
    )
    .await;
    assert_eq!(serve.app_status("app1").status, A::Deploying);
    let s = wait_status(&serve, "app1", A::Running).await;
    assert_eq!(s.observed_generation, 1);
    let h = serve.app_handle("app1").unwrap();
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "one:x");
    // The config's prefix won over the builder's: another app may not take it.
    let taken = ApplicationSpec::builder("other")
        .route_prefix("/cfg")
        .deployment(DeploymentSpec::builder("d", "test::Probe").init_args(&ProbeArgs::default()))
        .build()
        .unwrap();
    assert!(matches!(
        serve.run(taken).await,
        Err(ServeError::RouteTaken { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_new_application_is_deploying_when_apply_config_returns() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    // The Controller crashes right after its reply, before it starts any build:
    // what the caller sees then must already include the new application.
    serve
        .faults()
        .arm(flotilla::FaultPoint::ControllerAfterReply, 1);
    apply(
        &serve,
        "applications:\n  - {name: fresh, import_path: test::app, args: {tag: f, sleep_s: 5}}\n",
    )
    .await;
    let rx = serve.watch_status("fresh").expect("on the board at once");
    assert_eq!(rx.borrow().status, A::Deploying);
    assert_eq!(serve.app_status("fresh").status, A::Deploying);
    // The restarted Controller builds it from the durable config.
    let s = wait_status(&serve, "fresh", A::Running).await;
    assert_eq!(s.observed_generation, 1);
    assert_eq!(
        serve.metrics().await.unwrap().controller_restarts,
        1,
        "the build came from a restarted Controller"
    );
}

#[tokio::test(start_paused = true)]
async fn an_application_named_again_while_its_old_record_is_deleted_stays_on_the_board() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    let x = |args: &str| {
        format!("applications:\n  - {{name: x, import_path: test::app, args: {args}}}\n")
    };
    apply(&serve, &x("{tag: old}")).await;
    wait_status(&serve, "x", A::Running).await;
    // Dropped (its record is DELETING while its replicas drain), then named again
    // at once, with a build that outlasts the drain.
    apply(&serve, "applications: []\n").await;
    apply(&serve, &x("{tag: new, sleep_s: 30}")).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        serve.app_status("x").status,
        A::Deploying,
        "the old record is gone, the new build runs"
    );
    wait_status(&serve, "x", A::Running).await;
    let h = serve.app_handle("x").unwrap();
    assert_eq!(h.call::<_, String>("q").await.unwrap(), "new:q");

    // The same with a build that fails before the old record is gone: it is
    // built again once it is, and a config that drops it takes it off the board.
    apply(&serve, "applications: []\n").await;
    apply(&serve, &x("{tag: bad, fail: true}")).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(serve.app_status("x").status, A::DeployFailed);
    apply(&serve, "applications: []\n").await;
    wait_status(&serve, "x", A::NotStarted).await;
}

#[tokio::test(start_paused = true)]
async fn failing_panicking_and_slow_builds_are_deploy_failed_saying_why() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:
  - {name: f, import_path: test::app, args: {fail: true}}
  - {name: p, import_path: test::app, args: {panic: true}}
  - {name: t, import_path: test::app, args: {sleep_s: 100000}}
",
    )
    .await;
    // Declared by the config, so declarative (Ray's source), deployed at the
    // apply, while the builds run and after they fail.
    let applied = |app: &str| {
        let s = serve.app_status(app);
        assert_eq!(s.api_type, Some(flotilla::ApiType::Declarative), "{app}");
        s.last_deployed.expect("deployed at the apply")
    };
    let at: Vec<_> = ["f", "p", "t"].into_iter().map(applied).collect();
    for ((app, why), at) in [
        ("f", "the builder refused"),
        ("p", "the builder panicked"),
        ("t", "did not finish within"),
    ]
    .into_iter()
    .zip(at)
    {
        let s = wait_status(&serve, app, A::DeployFailed).await;
        assert!(
            s.message.contains("failed") && s.message.contains(why),
            "{app}: {}",
            s.message
        );
        assert_eq!(s.api_type, Some(flotilla::ApiType::Declarative), "{app}");
        assert_eq!(s.last_deployed, Some(at), "{app}");
    }
}

/// App `a` runs from a config, then a config whose build fails is applied over
/// it: the config that runs, and the DEPLOY_FAILED status.
async fn running_then_failed_build(serve: &Serve) -> (ServeConfig, ApplicationStatusInfo) {
    let good = config("applications:\n  - {name: a, import_path: test::app, args: {tag: b}}\n");
    let bad = config("applications:\n  - {name: a, import_path: test::app, args: {fail: true}}\n");
    serve.apply_config(good.clone()).await.unwrap();
    wait_status(serve, "a", A::Running).await;
    serve.apply_config(bad).await.unwrap();
    (good, wait_status(serve, "a", A::DeployFailed).await)
}

/// Found by the simulator: B runs, A's build fails (B's target keeps running,
/// DEPLOY_FAILED is published), B again is what runs already, so nothing is
/// built; the stale DEPLOY_FAILED must give way to what runs.
#[tokio::test(start_paused = true)]
async fn re_applying_what_runs_after_a_failed_build_ends_running() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    let (good, failed) = running_then_failed_build(&serve).await;
    assert!(
        failed.message.contains("the builder refused"),
        "{}",
        failed.message
    );
    serve.apply_config(good).await.unwrap();
    let s = wait_status(&serve, "a", A::Running).await;
    assert_eq!(s.observed_generation, failed.observed_generation);
}

/// Ray: DEPLOY_FAILED from a failed build sticks until a new config. Over the
/// target that keeps running, it holds whatever the deployments report and
/// through a restart of the application's actor; a config whose entry is what
/// runs clears it.
#[tokio::test(start_paused = true)]
async fn a_failed_builds_deploy_failed_sticks_over_the_running_target() {
    let (_dir, sw, serve) = start_fresh_with(registry).await;
    let (good, failed) = running_then_failed_build(&serve).await;
    // Its replica fails health checks and is replaced: the deployment goes
    // UNHEALTHY and back to HEALTHY underneath.
    sw.unhealthy.store(true, Ordering::SeqCst);
    let replaced = poll_secs(300, async || sw.constructed.load(Ordering::SeqCst) >= 2).await;
    assert!(replaced, "the unhealthy replica was not replaced");
    sw.unhealthy.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(serve.app_status("a").status, A::DeployFailed);
    assert_eq!(serve.app_status("a").message, failed.message);
    // A restarted application actor shows it too.
    assert!(serve.crash_application("a"));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(serve.app_status("a").status, A::DeployFailed);
    assert_eq!(serve.app_status("a").message, failed.message);
    serve.apply_config(good).await.unwrap();
    wait_status(&serve, "a", A::Running).await;
}

#[tokio::test(start_paused = true)]
async fn a_second_config_deletes_what_it_dropped_adds_what_it_names_and_leaves_imperative_apps() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    serve
        .run(support::app("imp", 1, ProbeArgs::default()))
        .await
        .unwrap();
    apply(
        &serve,
        "applications:
  - {name: app1, route_prefix: /a1, import_path: test::app, args: {tag: one}}
  - {name: app2, route_prefix: /a2, import_path: test::app, args: {tag: two}}
",
    )
    .await;
    wait_status(&serve, "app1", A::Running).await;
    wait_status(&serve, "app2", A::Running).await;
    let app2_replica = serve.app_handle("app2").unwrap().replicas()[0].id();
    let commits = serve.metrics().await.unwrap().store.commits;
    apply(
        &serve,
        "applications:
  - {name: app2, route_prefix: /a2, import_path: test::app, args: {tag: two}}
  - {name: app3, route_prefix: /a1, import_path: test::app, args: {tag: three, sleep_s: 5}}
",
    )
    .await;
    // One commit for the config and the deletion of app1 (app3 is still building).
    assert_eq!(serve.metrics().await.unwrap().store.commits, commits + 1);
    assert_eq!(serve.app_status("app1").status, A::Deleting);
    wait_status(&serve, "app3", A::Running).await;
    wait_status(&serve, "app1", A::NotStarted).await;
    // app2's entry did not change: nothing rebuilt, nothing restarted.
    assert_eq!(
        serve.app_handle("app2").unwrap().replicas()[0].id(),
        app2_replica
    );
    assert_eq!(serve.app_status("app2").observed_generation, 1);
    assert_eq!(serve.app_status("imp").status, A::Running);

    // Naming the imperative app without take_over is an error and changes nothing.
    let err = serve
        .apply_config(config(
            "applications:\n  - {name: imp, import_path: test::app}\n",
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::ImperativeApp { .. }), "{err}");
    assert_eq!(serve.app_status("app3").status, A::Running);
    apply(
        &serve,
        "applications:\n  - {name: imp, import_path: test::app, take_over: true, args: {tag: cfg}}\n",
    )
    .await;
    wait_until_tag(&serve, "imp", "cfg").await;
    wait_status(&serve, "app3", A::NotStarted).await;
}

/// Run the imperative application `imp`, then apply a config that takes it
/// over with a build that fails (`args`), and wait for DEPLOY_FAILED.
async fn fail_a_take_over(serve: &flotilla::Serve, args: &str) {
    serve
        .run(support::app("imp", 1, support::tag("mine")))
        .await
        .unwrap();
    let config = format!(
        "applications:\n  - {{name: imp, import_path: test::app, take_over: true, args: {args}}}\n"
    );
    apply(serve, &config).await;
    wait_status(serve, "imp", A::DeployFailed).await;
}

/// An imperative application a config took over, whose build failed, shows
/// DEPLOY_FAILED over what still runs; a config that no longer names it
/// leaves it alone, and the failure with it.
#[tokio::test(start_paused = true)]
async fn a_failed_take_over_no_longer_named_stops_standing_over_the_imperative_app() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    fail_a_take_over(&serve, "{fail: true}").await;
    apply(&serve, "applications: []\n").await;
    wait_status(&serve, "imp", A::Running).await;
    let out: String = serve.app_handle("imp").unwrap().call("x").await.unwrap();
    assert_eq!(out, "mine:x");
}

/// The same across a Controller restart: its successor knows nothing of the
/// failure until its own rebuild fails, and a config applied before that no
/// longer names the entry; the failure must not stand (it did, on the
/// ApplicationActor, with nothing left to clear it).
#[tokio::test(start_paused = true)]
async fn a_failed_take_over_does_not_outlive_a_controller_restart_and_a_config_without_it() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    fail_a_take_over(&serve, "{fail: true, sleep_s: 60}").await;
    serve.crash_controller();
    // Restarted (its rebuild takes a minute, and fails again).
    tokio::time::sleep(Duration::from_secs(1)).await;
    apply(&serve, "applications: []\n").await;
    wait_status(&serve, "imp", A::Running).await;
    // Past the successor's rebuild, which fails: it must not stand again.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let status = serve.app_status("imp");
    assert_eq!(status.status, A::Running, "{status:?}");
    assert!(status.message.is_empty(), "{status:?}");
}

async fn wait_until_tag(serve: &Serve, app: &str, tag: &str) {
    let answered = poll_secs(600, async || {
        let Ok(h) = serve.app_handle(app) else {
            return false;
        };
        h.with_timeout(Duration::from_secs(1))
            .call::<_, String>("x")
            .await
            .is_ok_and(|out| out.starts_with(tag))
    })
    .await;
    assert!(answered, "{app} never answered with tag {tag}");
}

#[tokio::test(start_paused = true)]
async fn config_only_changes_reconfigure_in_place_and_code_changes_roll() {
    let (_dir, sw, serve) = start_fresh_with(registry).await;
    let with = |tag: &str, extra: &str| {
        config(&format!(
            "applications:
  - name: a
    import_path: test::app
    args: {{tag: {tag}}}
    deployments:
      - name: probe
        num_replicas: 2
{extra}"
        ))
    };
    serve.apply_config(with("v1", "")).await.unwrap();
    wait_until_replicas(&serve, "a", 2).await;
    let built = sw.constructed.load(Ordering::SeqCst);
    serve
        .apply_config(with(
            "v1",
            "        user_config: {threshold: 3}\n        max_ongoing_requests: 9\n",
        ))
        .await
        .unwrap();
    wait_status(&serve, "a", A::Running).await;
    poll_secs(100, async || sw.reconfigured.load(Ordering::SeqCst) >= 2).await;
    assert_eq!(
        sw.reconfigured.load(Ordering::SeqCst),
        2,
        "every live replica reconfigured"
    );
    assert_eq!(
        sw.constructed.load(Ordering::SeqCst),
        built,
        "no replica restarted"
    );
    serve.apply_config(with("v2", "")).await.unwrap();
    support::wait_until(&serve, "a", |s| {
        s.observed_generation >= 3 && s.status == A::Running
    })
    .await;
    wait_until_tag(&serve, "a", "v2").await;
    assert!(
        sw.constructed.load(Ordering::SeqCst) >= built + 2,
        "code change rolled the replicas"
    );
}

async fn wait_until_replicas(serve: &Serve, app: &str, n: usize) {
    let reached = poll_secs(600, async || {
        serve.app_handle(app).is_ok_and(|h| h.replicas().len() == n)
            && serve.app_status(app).status == A::Running
    })
    .await;
    assert!(reached, "{app} never had {n} replicas");
}

#[tokio::test(start_paused = true)]
async fn a_newer_config_cancels_a_running_build() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:\n  - {name: a, import_path: test::app, args: {tag: slow, sleep_s: 60}}\n",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    apply(
        &serve,
        "applications:\n  - {name: a, import_path: test::app, args: {tag: fast}}\n",
    )
    .await;
    wait_status(&serve, "a", A::Running).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    let h = serve.app_handle("a").unwrap();
    assert_eq!(
        h.call::<_, String>("x").await.unwrap(),
        "fast:x",
        "the slow build never landed"
    );
    assert_eq!(serve.app_status("a").observed_generation, 1);
}

#[tokio::test(start_paused = true)]
async fn the_applied_config_survives_a_restart_and_a_crash_during_a_build_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let applied = config(
        "applications:
  - {name: done, route_prefix: /done, import_path: test::app, args: {tag: d}}
  - {name: building, route_prefix: /b, import_path: test::app, args: {tag: b, sleep_s: 30}}
",
    );
    {
        let serve = start(&dir, &sw).await;
        serve.apply_config(applied.clone()).await.unwrap();
        wait_status(&serve, "done", A::Running).await;
        // "building" is still in its builder: stop everything now.
        assert_eq!(serve.app_status("building").status, A::Deploying);
        serve.shutdown().await.unwrap();
    }
    let serve = start(&dir, &sw).await;
    wait_status(&serve, "done", A::Running).await;
    wait_status(&serve, "building", A::Running).await;
    let h = serve.app_handle("building").unwrap();
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "b:x");
    // Same config again after recovery: nothing to rebuild, nothing changes.
    let commits = serve.metrics().await.unwrap().store.commits;
    serve.apply_config(applied).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(serve.metrics().await.unwrap().store.commits, commits + 1);
    assert_eq!(serve.app_status("building").observed_generation, 1);
}

#[tokio::test(start_paused = true)]
async fn apply_config_file_reports_parse_errors_with_line_and_column() {
    let (dir, _, serve) = start_fresh_with(registry).await;
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "applications:\n  - name: a\n    import_path: test::app\n   bogus: 1\n",
    )
    .unwrap();
    let err = serve.apply_config_file(&path).await.unwrap_err();
    assert!(err.to_string().contains("line 4"), "{err}");
    let missing = serve
        .apply_config_file(dir.path().join("none.yaml"))
        .await
        .unwrap_err();
    assert!(
        matches!(missing, ServeError::ConfigFile { .. }),
        "{missing}"
    );
    // A directory (as a FIFO or a device) is refused from its metadata: a FIFO
    // opened would wait for a writer.
    let not_a_file = serve.apply_config_file(dir.path()).await.unwrap_err();
    assert!(
        matches!(not_a_file, ServeError::ConfigFileNotAFile { .. }),
        "{not_a_file}"
    );
    // So is a file too large to be a config.
    let big = dir.path().join("big.yaml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(flotilla::MAX_CONFIG_FILE_BYTES + 1).unwrap();
    let too_large = serve.apply_config_file(&big).await.unwrap_err();
    assert!(
        matches!(too_large, ServeError::ConfigFileTooLarge { limit, .. } if limit == flotilla::MAX_CONFIG_FILE_BYTES),
        "{too_large}"
    );
    assert!(serve.status().is_empty());
}

#[tokio::test(start_paused = true)]
async fn delete_and_run_take_an_application_out_of_the_configs_hands() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:
  - {name: gone, route_prefix: /gone, import_path: test::app, args: {tag: g}}
  - {name: mine, route_prefix: /mine, import_path: test::app, args: {tag: slow, sleep_s: 30}}
",
    )
    .await;
    wait_status(&serve, "gone", A::Running).await;
    // An acknowledged delete is not undone by the config after a Controller crash.
    serve.delete_apps(&["gone"], true).await.unwrap();
    // An imperative run while the config's build is in flight wins over the build.
    let watcher = serve
        .watch_status("mine")
        .expect("on the board while it builds");
    let imperative = support::app_of(
        "mine",
        DeploymentSpec::builder("probe", "test::Probe").init_args(&support::tag("run")),
    );
    serve.run(imperative).await.unwrap();
    // The application changed hands; it was never gone.
    assert!(watcher.has_changed().is_ok(), "the watch stays open");
    assert_eq!(watcher.borrow().status, A::Running);
    serve.crash_controller();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        serve.app_status("gone").status,
        A::NotStarted,
        "no resurrection"
    );
    let h = serve.app_handle("mine").unwrap();
    assert_eq!(
        h.call::<_, String>("x").await.unwrap(),
        "run:x",
        "the build did not land"
    );
    assert_eq!(serve.app_status("mine").observed_generation, 1);
}

/// A registry whose `test::counted` builder counts its calls and fails while
/// `broken` is set (otherwise it builds as `test::app`).
fn counted(sw: &Arc<Switches>, calls: &Arc<AtomicU32>, broken: &Arc<AtomicBool>) -> Registry {
    let (calls, broken) = (calls.clone(), broken.clone());
    registry(sw)
        .register_app("test::counted", move |args| {
            let (calls, broken) = (calls.clone(), broken.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                if broken.load(Ordering::SeqCst) {
                    return Err(UserError::new("the builder broke"));
                }
                build(args).await
            }
        })
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_overrides_only_change_is_applied_without_calling_the_builder_again() {
    let (calls, broken) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (c, b) = (calls.clone(), broken.clone());
    let (dir, sw, serve) = start_fresh_with(move |sw| counted(sw, &c, &b)).await;
    let with = |tag: &str, overrides: &str| {
        config(&format!(
            "applications:
  - name: x
    import_path: test::counted
    args: {{tag: {tag}}}
    deployments:
      - {{name: probe, {overrides}}}
"
        ))
    };
    serve
        .apply_config(with("t", "num_replicas: 1"))
        .await
        .unwrap();
    wait_until_replicas(&serve, "x", 1).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The builder would fail now: a pure scale and config change must not care.
    broken.store(true, Ordering::SeqCst);
    let scaled = with(
        "t",
        "num_replicas: 3, max_ongoing_requests: 7, user_config: {k: 1}",
    );
    serve.apply_config(scaled).await.unwrap();
    wait_until_replicas(&serve, "x", 3).await;
    let s = serve.app_status("x");
    assert_eq!((s.status, s.observed_generation), (A::Running, 2));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the builder was not called"
    );
    // The lightweight update is durable: a restart owes no build.
    serve.crash_process().await;
    let serve = support::start_with(&dir, counted(&sw, &calls, &broken)).await;
    wait_until_replicas(&serve, "x", 3).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "nothing rebuilt after a restart"
    );
    // New args are a new build: the broken builder fails it over the running target.
    serve
        .apply_config(with("u", "num_replicas: 3"))
        .await
        .unwrap();
    let failed = wait_status(&serve, "x", A::DeployFailed).await;
    assert!(failed.message.contains("the builder broke"), "{failed:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(serve.app_handle("x").unwrap().replicas().len(), 3);
}

/// Two applications and their route prefixes.
fn pair(a: (&str, &str, u64), b: (&str, &str, u64)) -> ServeConfig {
    let entry = |name: &str, (prefix, tag, sleep): (&str, &str, u64)| {
        format!(
            "  - {{name: {name}, route_prefix: {prefix}, import_path: test::app, args: {{tag: {tag}, sleep_s: {sleep}}}}}\n"
        )
    };
    config(&format!(
        "applications:\n{}{}",
        entry("a", a),
        entry("b", b)
    ))
}

/// Which application holds each prefix.
fn holders(serve: &Serve) -> Vec<(String, String)> {
    serve
        .routes()
        .routes()
        .into_iter()
        .map(|r| (r.prefix.to_string(), r.app.to_string()))
        .collect()
}

/// Wait until `a` and `b` run generations `generations` and answer `tags`.
async fn both_running(serve: &Serve, generations: (u64, u64), tags: (&str, &str)) {
    for (app, generation, tag) in [("a", generations.0, tags.0), ("b", generations.1, tags.1)] {
        let s = support::wait_until(serve, app, |s| {
            s.observed_generation >= generation && s.status != A::Deploying
        })
        .await;
        assert_eq!(s.status, A::Running, "{app}: {s:?}");
        wait_until_tag(serve, app, tag).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_config_may_swap_its_own_applications_prefixes_whatever_order_builds_end_in() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    let pairs = [
        ("/one".to_owned(), "a".to_owned()),
        ("/two".to_owned(), "b".to_owned()),
    ];
    serve
        .apply_config(pair(("/one", "a1", 0), ("/two", "b1", 0)))
        .await
        .unwrap();
    both_running(&serve, (1, 1), ("a1", "b1")).await;
    assert_eq!(holders(&serve), pairs);
    // Swap, b's build finishing first (it waits for a, which holds /one).
    serve
        .apply_config(pair(("/two", "a2", 10), ("/one", "b2", 1)))
        .await
        .unwrap();
    both_running(&serve, (2, 2), ("a2", "b2")).await;
    let swapped = [
        ("/one".to_owned(), "b".to_owned()),
        ("/two".to_owned(), "a".to_owned()),
    ];
    assert_eq!(holders(&serve), swapped);
    // Swap back, a's build finishing first.
    serve
        .apply_config(pair(("/one", "a3", 1), ("/two", "b3", 10)))
        .await
        .unwrap();
    both_running(&serve, (3, 3), ("a3", "b3")).await;
    assert_eq!(holders(&serve), pairs);
    // Swap by the prefixes alone: both updates are lightweight, no builder runs.
    serve
        .apply_config(pair(("/two", "a3", 1), ("/one", "b3", 10)))
        .await
        .unwrap();
    both_running(&serve, (4, 4), ("a3", "b3")).await;
    assert_eq!(holders(&serve), swapped);
}

#[tokio::test(start_paused = true)]
async fn a_config_that_drops_an_application_whose_build_is_parked_does_not_bring_it_back() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    serve
        .apply_config(pair(("/one", "a1", 0), ("/two", "b1", 0)))
        .await
        .unwrap();
    both_running(&serve, (1, 1), ("a1", "b1")).await;
    // A swap: a's build ends first and parks (b holds /two, and b's build
    // runs for 100 s).
    serve
        .apply_config(pair(("/two", "a2", 1), ("/one", "b2", 100)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(serve.app_status("a").observed_generation, 1, "a is parked");
    // A config that names neither: both are deleted, and a's parked build
    // must not land as a new generation of a's record being deleted.
    apply(
        &serve,
        "applications:\n  - {name: c, route_prefix: /three, import_path: test::app, args: {tag: c1}}\n",
    )
    .await;
    wait_status(&serve, "c", A::Running).await;
    for app in ["a", "b"] {
        wait_status(&serve, app, A::NotStarted).await;
    }
    tokio::time::sleep(Duration::from_secs(200)).await;
    for app in ["a", "b"] {
        assert_eq!(
            serve.app_status(app).status,
            A::NotStarted,
            "{app} came back"
        );
    }
    assert_eq!(
        holders(&serve),
        [("/three".to_owned(), "c".to_owned())],
        "only c routes"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_application_may_take_the_prefix_another_moves_off() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:\n  - {name: a, route_prefix: /one, import_path: test::app, args: {tag: a1}}\n",
    )
    .await;
    wait_status(&serve, "a", A::Running).await;
    // b (new, quick build) takes /one while a (slow rebuild) moves to /two.
    serve
        .apply_config(pair(("/two", "a2", 10), ("/one", "b1", 1)))
        .await
        .unwrap();
    both_running(&serve, (2, 1), ("a2", "b1")).await;
    assert_eq!(
        holders(&serve),
        [
            ("/one".to_owned(), "b".to_owned()),
            ("/two".to_owned(), "a".to_owned())
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_build_whose_prefix_another_keeps_fails_naming_the_holder() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:\n  - {name: a, route_prefix: /one, import_path: test::app, args: {tag: a1}}\n",
    )
    .await;
    wait_status(&serve, "a", A::Running).await;
    // The builder of b picks `/from-code`, which `a` takes and keeps.
    apply(
        &serve,
        "applications:
  - {name: a, route_prefix: /from-code, import_path: test::app, args: {tag: a1}}
  - {name: b, import_path: test::app, args: {tag: b1, sleep_s: 5}}
",
    )
    .await;
    let s = wait_status(&serve, "b", A::DeployFailed).await;
    assert!(
        s.message.contains("'/from-code'") && s.message.contains("application 'a'"),
        "{s:?}"
    );
    assert_eq!(serve.app_status("a").status, A::Running);
}

/// A build whose landing commit fails is not lost: the store failed, not
/// the build, and it lands at the next try.
#[tokio::test(start_paused = true)]
async fn a_build_whose_landing_commit_fails_lands_at_the_next_try() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:\n  - {name: x, route_prefix: /x, import_path: test::app, args: {tag: x1, sleep_s: 5}}\n",
    )
    .await;
    serve.fail_next_commit();
    let s = wait_status(&serve, "x", A::Running).await;
    assert_eq!(s.observed_generation, 1);
    wait_until_tag(&serve, "x", "x1").await;
    assert_eq!(serve.metrics().await.unwrap().controller.apps, 1);
    assert_eq!(
        serve.faults().remaining(flotilla::FaultPoint::CommitFails),
        0,
        "a commit failed on the way"
    );
}

/// A newcomer whose build lands with the holder's own new build, both on
/// one prefix: the holder keeps it and its update lands; the newcomer fails,
/// naming it, and does not wait for ever.
#[tokio::test(start_paused = true)]
async fn a_holder_updated_with_a_newcomer_on_its_prefix_keeps_it() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:\n  - {name: b, import_path: test::app, args: {tag: b1}}\n",
    )
    .await;
    wait_status(&serve, "b", A::Running).await;
    // b's builder picks `/from-code` again; a claims it by the config.
    apply(
        &serve,
        "applications:
  - {name: a, route_prefix: /from-code, import_path: test::app, args: {tag: a1, sleep_s: 1}}
  - {name: b, import_path: test::app, args: {tag: b2, sleep_s: 5}}
",
    )
    .await;
    let s = wait_status(&serve, "a", A::DeployFailed).await;
    assert!(s.message.contains("application 'b'"), "{s:?}");
    let b = support::wait_until(&serve, "b", |s| {
        s.observed_generation >= 2 && s.status != A::Deploying
    })
    .await;
    assert_eq!(b.status, A::Running, "{b:?}");
    wait_until_tag(&serve, "b", "b2").await;
    assert_eq!(holders(&serve), [("/from-code".to_owned(), "b".to_owned())]);
}

/// A newcomer waiting for the holder of its prefix, whose own build then
/// fails: the holder keeps its prefix, so the newcomer fails too, at once.
#[tokio::test(start_paused = true)]
async fn a_newcomer_waiting_on_a_holder_whose_build_fails_fails_too() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    apply(
        &serve,
        "applications:
  - {name: b, route_prefix: /two, import_path: test::app, args: {tag: b1}}
  - {name: c, import_path: test::app, args: {tag: c1}}
",
    )
    .await;
    wait_status(&serve, "c", A::Running).await;
    // a wants /two, which b holds; b's new build picks `/from-code`, which
    // c keeps. b fails; a must not wait for b for ever.
    apply(
        &serve,
        "applications:
  - {name: a, route_prefix: /two, import_path: test::app, args: {tag: a1, sleep_s: 1}}
  - {name: b, import_path: test::app, args: {tag: b2, sleep_s: 5}}
  - {name: c, import_path: test::app, args: {tag: c1}}
",
    )
    .await;
    let s = wait_status(&serve, "a", A::DeployFailed).await;
    assert!(s.message.contains("application 'b'"), "{s:?}");
    assert_eq!(serve.app_status("b").status, A::DeployFailed);
    assert_eq!(serve.app_status("c").status, A::Running);
}

#[tokio::test(start_paused = true)]
async fn a_config_naming_an_unregistered_builder_is_refused_and_changes_nothing() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    let before = serve.metrics().await.unwrap().store.commits;
    let err = serve
        .apply_config(config(
            "applications:\n  - {name: ok, import_path: test::app}\n  - {name: u, import_path: test::unknown}\n",
        ))
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
        ("u", None, "test::unknown")
    );
    assert_eq!(serve.metrics().await.unwrap().store.commits, before);
    assert!(serve.status().is_empty());
}

#[tokio::test(start_paused = true)]
async fn autoscaling_policies_and_request_routers_must_be_registered() {
    fn with_policy(sw: &Arc<Switches>) -> Registry {
        registry(sw)
            .register_autoscaling_policy("test::policy", |ctx| ctx.total_requests)
            .unwrap()
    }
    let (_dir, _, serve) = start_fresh_with(with_policy).await;
    let app = |fields: &str| {
        format!("applications:\n  - name: app1\n    import_path: test::app\n{fields}")
    };
    // Named by the application, or by a deployment's autoscaling config:
    // refused at the call, naming application, deployment, field and path.
    for (fields, deployment, field) in [
        (
            "    autoscaling_policy: {policy_function: test::missing}\n",
            None,
            "autoscaling_policy.policy_function",
        ),
        (
            "    deployments:\n      - name: probe\n        autoscaling_config:\n          policy: {policy_function: test::missing}\n",
            Some("probe"),
            "autoscaling_config.policy.policy_function",
        ),
        (
            "    deployments:\n      - name: probe\n        request_router_config: {request_router_class: test.Router}\n",
            Some("probe"),
            "request_router_config.request_router_class",
        ),
    ] {
        let e = serve.apply_config(config(&app(fields))).await.unwrap_err();
        match &e {
            ServeError::NotRegisteredAt {
                app,
                deployment: d,
                field: f,
                ..
            } => {
                assert_eq!(app, "app1");
                assert_eq!(d.as_deref(), deployment);
                assert_eq!(*f, field);
            }
            other => panic!("unexpected {other}"),
        }
        assert!(e.to_string().contains("nothing is registered"), "{e}");
    }
    // Nothing was applied.
    assert_eq!(serve.app_status("app1").status, A::NotStarted);
    // Registered, or Ray's default: accepted and deployed.
    apply(
        &serve,
        &app("    autoscaling_policy: {policy_function: test::policy}\n    deployments:\n      - name: probe\n        num_replicas: auto\n        request_router_config: {request_routing_stats_period_s: 5}\n"),
    )
    .await;
    wait_status(&serve, "app1", A::Running).await;
    // The imperative path checks the same.
    let unregistered = ApplicationSpec::builder("imp")
        .route_prefix("/imp")
        .deployment(
            DeploymentSpec::builder("probe", "test::Probe").with_config(|c| {
                c.with_autoscaling(flotilla::AutoscalingConfig {
                    policy: flotilla::AutoscalingPolicy::named("test::missing".try_into().unwrap()),
                    ..flotilla::AutoscalingConfig::default()
                })
            }),
        )
        .build()
        .unwrap();
    let e = serve.run(unregistered).await.unwrap_err();
    assert!(
        matches!(
            &e,
            ServeError::NotRegisteredAt {
                field: "autoscaling_config.policy.policy_function",
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_config_with_max_replicas_per_node_and_placement_group_bundles_deploys_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let node = |name: &str| NodeSpec::new(name, Resources::none().with_cpus(4.0));
    let cluster = Arc::new(StaticCluster::new([node("n1"), node("n2")]));
    let serve = Serve::start(support::options(&dir, registry(&sw)).cluster(cluster.clone()))
        .await
        .unwrap();
    apply(
        &serve,
        "applications:
  - name: limited
    route_prefix: /limited
    import_path: test::app
    args: {tag: l}
    deployments:
      - name: probe
        num_replicas: 3
        max_replicas_per_node: 1
  - name: grouped
    route_prefix: /grouped
    import_path: test::app
    args: {tag: g}
    deployments:
      - name: probe
        placement_group_bundles: [{CPU: 1}, {CPU: 2}]
        placement_group_strategy: STRICT_SPREAD
",
    )
    .await;
    wait_status(&serve, "grouped", A::Running).await;
    let cpus = |n: f64| Resources::none().with_cpus(n);
    let g = observe(&serve, "grouped", "probe").await;
    assert_eq!(
        g.target.spec.config.placement_group,
        Some(PlacementGroup::new(
            vec![cpus(1.0), cpus(2.0)],
            PlacementStrategy::StrictSpread
        ))
    );
    let mut held: Vec<(String, f64)> = cluster
        .reservations_of(g.replicas[0].id)
        .into_iter()
        .map(|(n, r)| (n, r.cpus))
        .collect();
    held.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(held.len(), 2, "one bundle on each node: {held:?}");
    assert_ne!(held[0].0, held[1].0);

    // Two of three replicas run, one per node; the third waits naming the limit.
    let l = wait_snapshot(&serve, "limited", "probe", |s| {
        s.pending == 1 && s.count(ReplicaState::Running) == 2
    })
    .await;
    assert_eq!(l.target.spec.config.max_replicas_per_node, Some(1));
    let reason = l.pending_reason.unwrap_or_default();
    assert!(reason.contains("max_replicas_per_node is 1"), "{reason}");
    let mut on: Vec<&str> = l.replicas.iter().map(|r| r.node.as_str()).collect();
    on.sort();
    assert_eq!(on, ["n1", "n2"]);
    assert_eq!(serve.app_status("limited").status, A::Deploying);
}

/// A registry whose `test::peaked` builder records how many of its builds run
/// at once (a build cancelled mid-way counts as ended).
fn peaked(sw: &Arc<Switches>, running: &Arc<AtomicU32>, peak: &Arc<AtomicU32>) -> Registry {
    struct Running(Arc<AtomicU32>);
    impl Drop for Running {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let (running, peak) = (running.clone(), peak.clone());
    registry(sw)
        .register_app("test::peaked", move |args| {
            let (running, peak) = (running.clone(), peak.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                let _running = Running(running);
                build(args).await
            }
        })
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_build_in_flight_when_the_controller_crashes_does_not_run_beside_its_rebuild() {
    let (running, peak) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (r, p) = (running.clone(), peak.clone());
    let (_dir, _, serve) = start_fresh_with(move |sw| peaked(sw, &r, &p)).await;
    apply(
        &serve,
        "applications:\n  - {name: slow, import_path: test::peaked, args: {tag: s, sleep_s: 60}}\n",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(running.load(Ordering::SeqCst), 1);
    // The restarted Controller builds it again from the durable config; the
    // dead one's build is cancelled, not left to run (the builder's side
    // effects twice) until its own timeout.
    serve.crash_controller();
    let s = wait_status(&serve, "slow", A::Running).await;
    assert_eq!(s.observed_generation, 1);
    assert_eq!(peak.load(Ordering::SeqCst), 1, "two builds ran at once");
    assert_eq!(running.load(Ordering::SeqCst), 0);
}

/// An application whose build has not landed logs by its config entry's
/// logging_config; a config that drops that setting from the entry (before
/// the build lands) drops it from the logging too.
#[tokio::test(start_paused = true)]
async fn an_unbuilt_applications_logging_follows_its_entry() {
    let dir = tempfile::tempdir().unwrap();
    let options = support::options(&dir, registry(&Arc::new(Switches::default())));
    let logging = options.logging.clone();
    let serve = Serve::start(options).await.unwrap();
    let entry = |extra: &str| {
        format!(
            "applications:\n  - {{name: held, import_path: test::app, args: {{sleep_s: 3600}}{extra}}}\n"
        )
    };
    let debug = flotilla::LoggingConfig {
        log_level: flotilla::LogLevel::Debug,
        ..Default::default()
    };
    apply(&serve, &entry(", logging_config: {log_level: DEBUG}")).await;
    assert_eq!(serve.app_status("held").status, A::Deploying);
    assert_eq!(logging.for_app(Some("held")), debug, "the entry's own");
    apply(&serve, &entry(", route_prefix: /again")).await;
    assert_eq!(
        serve.app_status("held").status,
        A::Deploying,
        "still unbuilt"
    );
    assert_eq!(
        logging.for_app(Some("held")),
        flotilla::LoggingConfig::default(),
        "the entry no longer sets one: the global config applies"
    );
}

/// `route_prefix: null` removes the builder's prefix (Ray: no HTTP route,
/// handles only); left out again, the builder's prefix is back.
#[tokio::test(start_paused = true)]
async fn a_null_route_prefix_removes_the_builders_route() {
    let (_dir, _, serve) = start_fresh_with(registry).await;
    let entry = |route: &str| {
        format!("applications:\n  - {{name: a, import_path: test::app, args: {{tag: t}}{route}}}\n")
    };
    apply(&serve, &entry(", route_prefix: null")).await;
    wait_status(&serve, "a", A::Running).await;
    assert_eq!(holders(&serve), [], "no HTTP route");
    let h = serve.app_handle("a").unwrap();
    assert_eq!(
        h.call::<_, String>("x").await.unwrap(),
        "t:x",
        "a handle reaches it"
    );
    let applied = serve.applied_config().await.unwrap().unwrap();
    assert_eq!(
        applied.applications[0].route_prefix,
        flotilla::RouteOverride::Off,
        "kept as given"
    );

    let before = serve.app_status("a").observed_generation;
    apply(&serve, &entry("")).await;
    support::wait_until(&serve, "a", |s| {
        s.observed_generation > before && s.status == A::Running
    })
    .await;
    assert_eq!(holders(&serve), [("/from-code".to_owned(), "a".to_owned())]);
}
