//! The cluster simulator: thousands of applications on simulated nodes, on
//! virtual time, through controller crashes, node losses, failing constructors,
//! flapping health checks, failed commits and a process restart, with traffic
//! flowing; then a summary and every crash-recovery invariant checked. Exits
//! non-zero if an invariant fails.
//!
//! Run (from the repository root): `cargo run --release --example cluster_sim -- [FLAGS]`
//! (`--help` lists them). With `--serve-config FILE` it also deploys a ServeConfig
//! through `Serve::apply_config_file` (e.g.
//! `crates/flotilla-sim/scenarios/serve_config.yaml`). It is the `flotilla-sim`
//! crate's example (the workspace's default members include that crate, so the
//! command works from the root), a thin command line over the crate's library.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::Parser;
use flotilla_sim::{
    Overrides, RunOptions, Scenario, cluster::Strategy, report, scenario::parse_duration,
};

/// Simulate a Flotilla cluster on virtual time and check every invariant.
#[derive(Debug, Parser)]
#[command(name = "cluster_sim")]
struct Flags {
    /// Nodes (the node groups keep their proportions) [default: 20]
    #[arg(long)]
    nodes: Option<usize>,
    /// Applications deployed at the start; 0 with --serve-config deploys only
    /// the config's [default: 2000]
    #[arg(long)]
    apps: Option<usize>,
    /// Deployments per application, called in a chain [default: 1]
    #[arg(long)]
    deployments: Option<usize>,
    /// Replicas per deployment [default: 2]
    #[arg(long)]
    replicas: Option<u32>,
    /// Applications per `run_many` call (one checkpoint commit each) [default: 200]
    #[arg(long)]
    batch: Option<usize>,
    /// A YAML scenario file; the other flags override it
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A ServeConfig file (Ray Serve's format) to apply at the start, through
    /// `Serve::apply_config_file`, next to the workload; its import paths name
    /// the simulator's builders `sim.chain:app` and `sim.failing:app`
    #[arg(long, value_name = "FILE")]
    serve_config: Option<PathBuf>,
    /// Virtual time to run traffic and events for, e.g. 10m, 1h [default: 10m];
    /// a shorter run keeps the default event schedule's events that fit in it
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Event schedule, e.g. "controller@60s,node@120s,process@300s,config@400s:next.yaml"
    /// ("none": no events)
    #[arg(long)]
    faults: Option<String>,
    /// Seed: the same seed gives the same summary [default: 1]
    #[arg(long)]
    seed: Option<u64>,
    /// Placement strategy: spread or pack [default: spread]
    #[arg(long)]
    strategy: Option<Strategy>,
    /// Requests per second over all applications [default: 200]
    #[arg(long)]
    rate: Option<f64>,
    /// Chance that a replica constructor fails [default: 0.05]
    #[arg(long)]
    constructor_failure_rate: Option<f64>,
    /// Write summary.json, timeline.json and timeline.png here
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Print the summary as JSON instead of text
    #[arg(long)]
    json: bool,
    /// No progress bar
    #[arg(long)]
    quiet: bool,
    /// Give up (exit status 3) if virtual time stops advancing for this many
    /// wall seconds (at least 1): a live-lock in the system under test
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    stall_timeout: u64,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    match simulate(&flags) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("cluster_sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn simulate(flags: &Flags) -> Result<bool, flotilla_sim::SimError> {
    let mut scenario = match &flags.config {
        Some(path) => Scenario::from_file(path)?,
        None => Scenario::default(),
    };
    scenario.apply(&Overrides {
        nodes: flags.nodes,
        apps: flags.apps,
        deployments: flags.deployments,
        replicas: flags.replicas,
        batch: flags.batch,
        duration: flags.duration,
        faults: flags.faults.clone(),
        seed: flags.seed,
        strategy: flags.strategy,
        rate: flags.rate,
        constructor_failure_rate: flags.constructor_failure_rate,
        serve_config: flags.serve_config.clone(),
    })?;
    let need = scenario.workload.apps as f64
        * scenario.workload.deployments as f64
        * f64::from(scenario.workload.replicas)
        * scenario.workload.replica_cpus;
    if need > scenario.cluster.cpus() {
        eprintln!(
            "warning: the workload reserves {need:.0} CPUs but the cluster offers {:.0}: replicas will stay pending",
            scenario.cluster.cpus()
        );
    }
    let outcome = flotilla_sim::run(
        &scenario,
        &RunOptions {
            progress: !flags.quiet,
            store_dir: None,
            stall_timeout: Some(Duration::from_secs(flags.stall_timeout)),
        },
    )?;
    if flags.json {
        println!("{}", outcome.summary.to_json());
    } else {
        println!("{}", outcome.summary);
    }
    if let Some(dir) = &flags.report {
        let files = report::write(dir, &outcome)?;
        let line = format!(
            "report: {}, {}, {}",
            files.summary.display(),
            files.timeline.display(),
            files.picture.display()
        );
        // Keep stdout pure JSON with --json.
        if flags.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    Ok(outcome.summary.ok())
}
