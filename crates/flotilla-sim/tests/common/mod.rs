//! What the simulator's integration tests share: small scenarios, and the check
//! that a seed replays its run.

#![allow(clippy::unwrap_used, dead_code)]

use std::time::Duration;

use flotilla_sim::{
    Outcome, RunOptions, Scenario,
    cluster::NodeGroup,
    faults,
    scenario::{ClusterSpec, TrafficSpec, WorkloadSpec},
};

/// A group of `count` nodes of `cpus` CPUs and `memory_gib` GiB.
pub fn group(name: &str, count: usize, cpus: f64, memory_gib: f64) -> NodeGroup {
    NodeGroup {
        name: name.into(),
        count,
        cpus,
        memory_gib,
        gpus: 0.0,
    }
}

/// A small scenario: `groups`, `workload`, `rate` requests per second and the
/// events `faults` for `duration`, with 300 s to settle.
pub fn scenario(
    seed: u64,
    duration: Duration,
    groups: Vec<NodeGroup>,
    workload: WorkloadSpec,
    rate: f64,
    faults: &str,
) -> Scenario {
    Scenario {
        seed,
        duration,
        settle_timeout: Duration::from_secs(300),
        cluster: ClusterSpec {
            groups,
            ..Default::default()
        },
        workload,
        traffic: TrafficSpec {
            rate,
            ..Default::default()
        },
        faults: faults::split(faults),
        ..Default::default()
    }
}

/// Run `scenario` twice: every invariant holds, and both runs give the same
/// summary (wall-clock figures aside) and the same timeline. Returns the first.
pub fn replays(scenario: &Scenario) -> Outcome {
    let one = flotilla_sim::run(scenario, &RunOptions::default()).unwrap();
    let two = flotilla_sim::run(scenario, &RunOptions::default()).unwrap();
    assert!(one.summary.ok(), "{}", one.summary);
    assert_eq!(
        one.summary.without_wall_clock(),
        two.summary.without_wall_clock(),
        "\n{}\n---\n{}",
        one.summary,
        two.summary
    );
    assert_eq!(one.timeline, two.timeline);
    one
}
