//! `idle`: CPU used by a controller holding N RUNNING applications that nobody
//! calls (only health checks should run).

use std::time::Duration;

use crate::{
    error::BenchResult,
    report::Figure,
    sys,
    workload::{self, Shape, TempStore},
};

/// Flags of `idle`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Applications to deploy.
    #[arg(long, default_value_t = 10_000)]
    pub apps: usize,
    /// Wall seconds to measure over.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Batch size of the deploy.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Give up deploying after this many seconds.
    #[arg(long, default_value_t = 1_800)]
    pub timeout_s: u64,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    const S: &str = "idle";
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    workload::deploy_running(
        &serve,
        "i",
        args.apps,
        args.batch,
        Shape::default(),
        workload::secs(args.timeout_s),
    )
    .await?;
    // Let stragglers (status reports, first health checks) settle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = sys::cpu_seconds()?;
    let t0 = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds.max(1))).await;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = sys::cpu_seconds()? - before;
    Figure::new(S, "cpu_pct", 100.0 * cpu / wall, "% of one core")
        .with("apps", args.apps)
        .with("seconds", wall)
        .emit()?;
    Figure::new(S, "cpu_s", cpu, "s")
        .with("apps", args.apps)
        .with("seconds", wall)
        .emit()
}
