//! A seed replays a run: two simulations of the same tiny scenario, with every
//! kind of event, give the same summary (wall-clock figures aside) and the same
//! timeline, and every invariant holds. The report files are written too.

#![allow(clippy::unwrap_used)]

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
