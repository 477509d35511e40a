//! `idle`: CPU used by a controller holding N RUNNING applications that nobody
//! calls (only health checks should run).

use std::time::Duration;

use crate::{error::BenchResult, fleet::Fleet, report::Figure, sys, workload::TempStore};

/// Flags of `idle`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The fleet deployed before measuring.
    #[command(flatten)]
    pub fleet: Fleet,
    /// Wall seconds to measure over.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    const S: &str = "idle";
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    args.fleet.deploy(&serve, "i").await?;
    // Let stragglers (status reports, first health checks) settle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = sys::cpu_seconds()?;
    let t0 = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds.max(1))).await;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = sys::cpu_seconds()? - before;
    Figure::new(S, "cpu_pct", 100.0 * cpu / wall, "% of one core")
        .with("apps", args.fleet.apps)
        .with("seconds", wall)
        .emit()?;
    Figure::new(S, "cpu_s", cpu, "s")
        .with("apps", args.fleet.apps)
        .with("seconds", wall)
        .emit()
}
