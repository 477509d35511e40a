//! The scenario benchmarks (a `harness = false` bench target): Flotilla's figures,
//! one JSON object per line on stdout:
//! `{"scenario": .., "metric": .., "value": .., "unit": .., ...}`.
//!
//! Run from the repository root:
//!
//! ```sh
//! cargo bench --bench scenarios -- SCENARIO [--flags]
//! ```
//!
//! Scenarios: `bulk-deploy`, `serial-deploy`, `checkpoint-scaling`, `recovery`,
//! `idle`, `memory`, `handle`, `wide-deployment`, and `all` (every one but
//! `wide-deployment`, at moderate sizes, each in its own child process).
//! `--help` on any of them lists its flags. Without a scenario
//! (a plain `cargo bench`) it runs `all`; run as a test (`cargo test --benches`),
//! `all --quick`. Every scenario uses a fresh store file in a temporary directory
//! (named by process id) that it removes when done. How to read the figures:
//! BENCHMARKS.md.

// The scenarios, one file each in benches/scenarios/ (a crate root finds its
// modules beside it, hence the paths).
#[path = "scenarios/all.rs"]
mod all;
#[path = "scenarios/allocator.rs"]
mod allocator;
#[path = "scenarios/bulk.rs"]
mod bulk;
#[path = "scenarios/checkpoint.rs"]
mod checkpoint;
#[path = "scenarios/child.rs"]
mod child;
#[path = "scenarios/fleet.rs"]
mod fleet;
#[path = "scenarios/handle.rs"]
mod handle;
#[path = "scenarios/idle.rs"]
mod idle;
#[path = "scenarios/memory.rs"]
mod memory;
#[path = "scenarios/recovery.rs"]
mod recovery;
#[path = "scenarios/serial.rs"]
mod serial;
#[path = "scenarios/wide.rs"]
mod wide;

use std::ffi::OsString;

use clap::{Parser, Subcommand};
// The shared modules, by the paths the scenarios name them with (`crate::report`).
use flotilla_benches::{error, report, sys, workload};

/// The allocator a serving program would choose: glibc's per-thread arenas grow by
/// `mprotect` in small steps, which dominated bulk-deploy's profile (BENCHMARKS.md).
/// Its settings: [`allocator`].
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Flotilla's benchmarks.
#[derive(Debug, Parser)]
#[command(
    name = "scenarios",
    about = "Flotilla's benchmarks: one JSON figure per line"
)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// `run_many` in batches without waiting, then wait until all are RUNNING.
    BulkDeploy(bulk::Args),
    /// `run` one application at a time, each awaited.
    SerialDeploy(serial::Args),
    /// One deployment with many replicas: up, snapshots while it starts, down.
    WideDeployment(wide::Args),
    /// Cost of one deploy into a controller holding 0, 10k, 100k applications.
    CheckpointScaling(checkpoint::Args),
    /// Controller crash, then shutdown and restart on the same store.
    Recovery(recovery::Args),
    /// Process CPU while N applications sit idle.
    Idle(idle::Args),
    /// Resident memory per replica.
    Memory(memory::Args),
    /// Handle call latency and throughput.
    Handle(handle::Args),
    /// Every scenario but `wide-deployment`, at moderate sizes, side by side.
    All(all::Args),
    /// `recovery`'s restart in a new process (run by `recovery`).
    #[command(hide = true)]
    RestartChild(recovery::ChildArgs),
}

/// The flag `cargo bench` passes to every bench target (`cargo test --benches`
/// passes none).
const CARGO_BENCH_FLAG: &str = "--bench";

/// This program's arguments without cargo's `--bench`; with no scenario, `all`
/// under `cargo bench` and `all --quick` when run as a test.
fn arguments() -> Vec<OsString> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let given = args.len();
    args.retain(|a| a != CARGO_BENCH_FLAG);
    let benching = args.len() < given;
    if args.len() <= 1 {
        args.push("all".into());
        if !benching {
            args.push("--quick".into());
        }
    }
    args
}

fn main() {
    let cli = Cli::parse_from(arguments());
    if let Some(code) = allocator::rerun_configured() {
        std::process::exit(code);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("scenarios: could not start the tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(run(cli));
}

async fn run(cli: Cli) {
    let result = match &cli.scenario {
        Scenario::BulkDeploy(a) => bulk::run(a).await,
        Scenario::SerialDeploy(a) => serial::run(a).await,
        Scenario::WideDeployment(a) => wide::run(a).await,
        Scenario::CheckpointScaling(a) => checkpoint::run(a).await,
        Scenario::Recovery(a) => recovery::run(a).await,
        Scenario::Idle(a) => idle::run(a).await,
        Scenario::Memory(a) => memory::run(a).await,
        Scenario::Handle(a) => handle::run(a).await,
        Scenario::All(a) => all::run(a).await,
        Scenario::RestartChild(a) => recovery::restart_child(a).await,
    };
    // Exit at once: tearing down a tree of 100,000 actors measures nothing, and the
    // scenario has already removed its store directory.
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("scenarios: {e}");
            std::process::exit(1);
        }
    }
}
