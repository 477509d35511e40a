//! ServeConfig deploys in the simulator: a run from a config converges through
//! faults (a second config, a process crash) with every invariant; builds that
//! fail end DEPLOY_FAILED as the model expects; a bad config is a typed error
//! before anything runs; and a seed replays the same summary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use common::{group, replays, scenario};
use flotilla_sim::{RunOptions, Scenario, SimError, scenario::WorkloadSpec};

fn scenarios() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// A small scenario: `apps` workload applications, `config` applied at the
/// start, then `faults`.
fn small(seed: u64, apps: usize, config: &Path, faults: &str) -> Scenario {
    Scenario {
        serve_config: Some(config.to_owned()),
        ..scenario(
            seed,
            Duration::from_secs(120),
            vec![group("a", 3, 8.0, 32.0), group("b", 1, 16.0, 32.0)],
            WorkloadSpec {
                apps,
                batch: 3,
                broken_apps: 0,
                constructor_failure_rate: 0.1,
                ..Default::default()
            },
            40.0,
            faults,
        )
    }
}

/// Write `yaml` to a file in `dir`.
fn write(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, yaml).unwrap();
    path
}

#[test]
fn a_run_from_a_serve_config_converges_through_a_second_config_and_a_process_crash() {
    let dir = scenarios();
    let next = dir.join("serve_config_next.yaml");
    let faults = format!(
        "controller@10s,node@20s,replica@25s:4,deployment@28s:3,controller@30s:after-commit,\
         config@30s:{},process@50s,app@60s:3,flap@65s:3:20s,commit@70s,delete@90s:2",
        next.display()
    );
    let s = small(3, 6, &dir.join("serve_config.yaml"), &faults);
    let out = flotilla_sim::run(&s, &RunOptions::default()).unwrap();
    let sum = &out.summary;
    assert!(sum.ok(), "{sum}");
    assert_eq!(sum.scenario.declared_apps, 4);
    assert_eq!(sum.scenario.declared_failing, 2);
    assert_eq!(sum.restarts.process, 1);
    // The workload's two batches, the two configs and one delete: the process
    // crash recovers the applied config from the checkpoint, nobody applies it
    // again.
    assert_eq!(sum.operations.acknowledged, 5, "{sum}");
    // The second config declares four applications, one broken (fraud-check);
    // the workload's six minus those deleted run too.
    let expected = |k: &str| sum.expected.get(k).copied().unwrap_or(0);
    assert_eq!(
        expected("RUNNING") + expected("DEPLOY_FAILED") + expected("deleted"),
        6 + 5,
        "{sum}"
    );
    assert_eq!(sum.applications, {
        let mut m = sum.expected.clone();
        m.remove("deleted");
        m
    });
    assert!(sum.requests.served > 0);
    assert!(
        sum.replicas.reconfigures > 0,
        "user_config is taken in place"
    );
}

#[test]
fn failing_builds_and_broken_code_end_deploy_failed_as_expected() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write(
        tmp.path(),
        "failing.yaml",
        r#"
applications:
  - name: builder-fails
    import_path: sim.failing:app
  - name: override-misses          # the builder makes no d7
    import_path: sim.chain:app
    args: {deployments: 1}
    deployments:
      - name: d7
        num_replicas: 2
  - name: code-broken
    import_path: sim.chain:app
    args: {broken: true, replicas: 1}
  - name: fine
    import_path: sim.chain:app
    args: {deployments: 2, replicas: 1}
"#,
    );
    let s = small(5, 0, &config, "controller@10s,process@40s");
    let out = flotilla_sim::run(&s, &RunOptions::default()).unwrap();
    let sum = &out.summary;
    assert!(sum.ok(), "{sum}");
    assert_eq!(sum.scenario.declared_failing, 3);
    assert_eq!(sum.applications.get("DEPLOY_FAILED"), Some(&3), "{sum}");
    assert_eq!(sum.applications.get("RUNNING"), Some(&1), "{sum}");
    assert_eq!(sum.operations.acknowledged, 1);
}

#[test]
fn bad_config_files_are_typed_errors_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |config: &Path, faults: &str| {
        flotilla_sim::run(&small(1, 1, config, faults), &RunOptions::default()).unwrap_err()
    };
    let missing = tmp.path().join("missing.yaml");
    let e = run(&missing, "none");
    assert!(
        matches!(&e, SimError::ReadServeConfig { path, .. } if *path == missing),
        "{e}"
    );

    let typo = write(
        tmp.path(),
        "typo.yaml",
        "applications:\n  - name: a\n    improt_path: sim.chain:app\n",
    );
    let e = run(&typo, "none");
    assert!(matches!(e, SimError::ParseServeConfig { .. }), "{e}");
    assert!(
        e.to_string().contains("typo.yaml") && e.to_string().contains("line 3"),
        "{e}"
    );

    for (name, yaml, says) in [
        (
            "unknown.yaml",
            "applications:\n  - name: a\n    import_path: shop.app:build\n",
            "sim.chain:app",
        ),
        (
            "args.yaml",
            "applications:\n  - name: a\n    import_path: sim.chain:app\n    args: {replica: 2}\n",
            "replica",
        ),
        (
            "workload.yaml",
            "applications:\n  - name: app-00001\n    import_path: sim.chain:app\n",
            "imperative workload",
        ),
        (
            "custom.yaml",
            "applications:\n  - name: a\n    import_path: sim.chain:app\n    deployments:\n      \
             - name: d0\n        ray_actor_options: {resources: {tpu: 1}}\n",
            "custom resources",
        ),
        (
            "huge.yaml",
            "applications:\n  - name: a\n    import_path: sim.chain:app\n    deployments:\n      \
             - name: d0\n        ray_actor_options: {num_cpus: 64}\n",
            "never be placed",
        ),
    ] {
        let path = write(tmp.path(), name, yaml);
        let e = run(&path, "none");
        assert!(
            matches!(&e, SimError::ServeConfigApp { app, .. } if app.starts_with('a')),
            "{name}: {e}"
        );
        assert!(e.to_string().contains(says), "{name}: {e}");
    }

    // A scheduled config is checked up front too.
    let good = scenarios().join("serve_config.yaml");
    let e = run(&good, &format!("config@10s:{}", missing.display()));
    assert!(matches!(e, SimError::ReadServeConfig { .. }), "{e}");
}

#[test]
fn the_same_seed_gives_the_same_summary_with_a_serve_config() {
    let dir = scenarios();
    let faults = format!(
        "node@20s,config@30s:{},process@40s,replica@50s:3",
        dir.join("serve_config_next.yaml").display()
    );
    replays(&small(9, 3, &dir.join("serve_config.yaml"), &faults));
}

/// Applying A, B, A, B: `legacy-reports` builds under B, fails to build under A
/// (keeping B's target), and under B again its config entry is what runs, so
/// Flotilla skips the build; the DEPLOY_FAILED of A's failed build must not stay
/// while its deployments run healthy at B's target. Found by the simulator.
#[test]
fn re_applying_what_runs_after_a_failed_build_ends_running() {
    let dir = scenarios();
    let (a, b) = (
        dir.join("serve_config.yaml"),
        dir.join("serve_config_next.yaml"),
    );
    let faults = format!(
        "config@20s:{},config@40s:{},config@60s:{}",
        b.display(),
        a.display(),
        b.display()
    );
    let out = flotilla_sim::run(&small(1, 0, &a, &faults), &RunOptions::default()).unwrap();
    assert!(out.summary.ok(), "{}", out.summary);
}
