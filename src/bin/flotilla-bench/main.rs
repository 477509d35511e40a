//! flotilla-bench: Flotilla's figures, one JSON object per line on stdout:
//! `{"scenario": .., "metric": .., "value": .., "unit": .., ...}`.
//!
//! Run from the repository root:
//!
//! ```sh
//! cargo run --release --bin flotilla-bench -- SCENARIO [--flags]
//! ```
//!
//! Scenarios: `bulk-deploy`, `serial-deploy`, `checkpoint-scaling`, `recovery`,
//! `idle`, `memory`, `handle`, and `all` (every one at moderate sizes, each in its
//! own child process). `--help` on any of them lists its flags. Every scenario
//! uses a fresh store file in a temporary directory (named by process id) that
//! it removes when done. How to read the figures: BENCHMARKS.md.

mod all;
mod allocator;
mod bulk;
mod checkpoint;
mod child;
mod error;
mod handle;
mod idle;
mod memory;
mod recovery;
mod report;
mod serial;
mod sys;
mod workload;

use clap::{Parser, Subcommand};

/// The allocator a serving program would choose: glibc's per-thread arenas grow by
/// `mprotect` in small steps, which dominated bulk-deploy's profile (BENCHMARKS.md).
/// Its settings: [`allocator`].
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Flotilla's benchmarks.
#[derive(Debug, Parser)]
#[command(
    name = "flotilla-bench",
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
    /// Every scenario at moderate sizes, side by side.
    All(all::Args),
    /// `recovery`'s restart in a new process (run by `recovery`).
    #[command(hide = true)]
    RestartChild(recovery::ChildArgs),
}

fn main() {
    let cli = Cli::parse();
    if let Some(code) = allocator::rerun_configured() {
        std::process::exit(code);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flotilla-bench: could not start the tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(run(cli));
}

async fn run(cli: Cli) {
    let result = match &cli.scenario {
        Scenario::BulkDeploy(a) => bulk::run(a).await,
        Scenario::SerialDeploy(a) => serial::run(a).await,
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
            eprintln!("flotilla-bench: {e}");
            std::process::exit(1);
        }
    }
}
