//! A seed replays a run: two simulations of the same tiny scenario, with every
//! kind of event, give the same summary (wall-clock figures aside) and the same
//! timeline, and every invariant holds. The report files are written too.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use flotilla_sim::{
    RunOptions, Scenario,
    cluster::NodeGroup,
    faults,
    scenario::{ClusterSpec, TrafficSpec, WorkloadSpec},
};

fn tiny(seed: u64) -> Scenario {
    let group = |name: &str, count, cpus| NodeGroup {
        name: name.into(),
        count,
        cpus,
        memory_gib: 16.0,
        gpus: 0.0,
    };
    Scenario {
        seed,
        duration: Duration::from_secs(90),
        settle_timeout: Duration::from_secs(300),
        cluster: ClusterSpec {
            groups: vec![group("a", 2, 4.0), group("b", 1, 8.0)],
            ..Default::default()
        },
        workload: WorkloadSpec {
            apps: 8,
            deployments: 2,
            replicas: 2,
            batch: 4,
            broken_apps: 1,
            constructor_failure_rate: 0.1,
            ..Default::default()
        },
        traffic: TrafficSpec {
            rate: 20.0,
            ..Default::default()
        },
        faults: faults::split(
            "controller@10s,node@20s,app@25s:2,deployment@28s:2,commit@30s,update@30s:3,\
             controller@35s:after-commit,scale@35s:2,replica@40s:2,process@50s,delete@60s:2,\
             deploy@62s:2,flap@65s:2:20s,ctor@70s:0.5:10s,node-add@72s",
        ),
        ..Default::default()
    }
}

#[test]
fn the_same_seed_gives_the_same_summary() {
    let scenario = tiny(11);
    let one = flotilla_sim::run(&scenario, &RunOptions::default()).unwrap();
    let two = flotilla_sim::run(&scenario, &RunOptions::default()).unwrap();
    assert!(one.summary.ok(), "{}", one.summary);
    assert_eq!(
        one.summary.without_wall_clock(),
        two.summary.without_wall_clock(),
        "\n{}\n---\n{}",
        one.summary,
        two.summary
    );
    assert_eq!(one.timeline, two.timeline);
    let s = &one.summary;
    assert_eq!(s.events.len(), 15);
    assert_eq!(s.restarts.process, 1);
    assert!(s.requests.served > 0 && s.checkpoint.commits > 0);
    assert_eq!(s.applications.get("DEPLOY_FAILED"), Some(&1));

    let dir = tempfile::tempdir().unwrap();
    let files = flotilla_sim::report::write(dir.path(), &one).unwrap();
    let png = std::fs::read(&files.picture).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&files.summary).unwrap()).unwrap();
    assert_eq!(json["scenario"]["seed"], 11);
}
