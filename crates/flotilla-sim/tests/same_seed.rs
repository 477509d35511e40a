//! A seed replays a run: two simulations of the same tiny scenario, with every
//! kind of event, give the same summary (wall-clock figures aside) and the same
//! timeline, and every invariant holds. The report files are written too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{group, replays, scenario};
use flotilla_sim::{Scenario, scenario::WorkloadSpec};

fn tiny(seed: u64) -> Scenario {
    scenario(
        seed,
        Duration::from_secs(90),
        vec![group("a", 2, 4.0, 16.0), group("b", 1, 8.0, 16.0)],
        WorkloadSpec {
            apps: 8,
            deployments: 2,
            replicas: 2,
            batch: 4,
            broken_apps: 1,
            constructor_failure_rate: 0.1,
            ..Default::default()
        },
        20.0,
        "controller@10s,node@20s,app@25s:2,deployment@28s:2,commit@30s,update@30s:3,\
         controller@35s:after-commit,scale@35s:2,replica@40s:2,process@50s,delete@60s:2,\
         deploy@62s:2,flap@65s:2:20s,ctor@70s:0.5:10s,node-add@72s",
    )
}

#[test]
fn the_same_seed_gives_the_same_summary() {
    let one = replays(&tiny(11));
    let s = &one.summary;
    assert_eq!(s.events.len(), 15);
    assert_eq!(s.restarts.process, 1);
    assert!(s.requests.served > 0 && s.checkpoint.commits > 0);
    assert_eq!(s.applications.get("DEPLOY_FAILED"), Some(&1));
    // The timeline follows the cluster's CPUs: 2 x 4 + 1 x 8 offered at first,
    // some of them held by replicas, never more than offered.
    let samples = &one.timeline.samples;
    assert_eq!(samples[0].cpus, 16.0);
    assert!(samples.iter().any(|x| x.cpus_used > 0.0));
    assert!(samples.iter().all(|x| x.cpus_used <= x.cpus + 1e-9));

    let dir = tempfile::tempdir().unwrap();
    let files = flotilla_sim::report::write(dir.path(), &one).unwrap();
    let png = std::fs::read(&files.picture).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&files.summary).unwrap()).unwrap();
    assert_eq!(json["scenario"]["seed"], 11);
}

/// A cluster too small for the workload, through a process crash: after the
/// restart, which applications get the room must not depend on the order of a
/// hash map (the restarted Controller starts its applications in name order).
#[test]
fn the_same_seed_gives_the_same_summary_when_the_cluster_is_full() {
    let full = scenario(
        5,
        Duration::from_secs(60),
        vec![group("a", 1, 4.0, 16.0)],
        WorkloadSpec {
            apps: 24,
            deployments: 2,
            replicas: 1,
            batch: 24,
            broken_apps: 0,
            replica_cpus: 1.0,
            ..Default::default()
        },
        20.0,
        "process@30s",
    );
    // It cannot converge (the invariants fail, naming each run's own generated
    // namespace); everything else must replay.
    let run = || {
        let out = flotilla_sim::run(&full, &flotilla_sim::RunOptions::default()).unwrap();
        without_namespace(&out.summary.without_wall_clock().to_string())
    };
    let (one, two) = (run(), run());
    assert!(one.contains("DEPLOYING"), "{one}");
    assert_eq!(one, two);
}

/// `text` with every generated namespace (`flotilla` and digits) as `flotilla`.
fn without_namespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("flotilla") {
        out.push_str(&rest[..i + "flotilla".len()]);
        rest = rest[i + "flotilla".len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// A control-plane fault the schedule arms but no message ever reaches (no
/// operation follows it) is a crash that never happened: the run fails, it
/// does not pass untested.
#[test]
fn an_armed_fault_that_never_fires_fails_the_run() {
    let quiet = scenario(
        3,
        Duration::from_secs(40),
        vec![group("a", 1, 8.0, 16.0)],
        WorkloadSpec {
            apps: 4,
            deployments: 1,
            replicas: 1,
            batch: 4,
            broken_apps: 0,
            ..Default::default()
        },
        5.0,
        "controller@30s:before-commit",
    );
    let out = flotilla_sim::run(&quiet, &flotilla_sim::RunOptions::default()).unwrap();
    let fired = out
        .summary
        .invariants
        .iter()
        .find(|i| i.name == "every armed control-plane fault fired")
        .unwrap();
    assert!(!fired.ok, "{}", out.summary);
    assert!(
        fired.detail.contains("ControllerBeforeCommit"),
        "{}",
        fired.detail
    );
    assert!(!out.summary.ok());
}
