//! `bulk-deploy`: `run_many` in batches without waiting, then wait for RUNNING.

use std::time::Instant;

use crate::{
    error::{BenchResult, Context},
    report::Figure,
    workload::{self, Shape, TempStore},
};

/// Flags of `bulk-deploy`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Applications to deploy.
    #[arg(long, default_value_t = 100_000)]
    pub apps: usize,
    /// Applications per `run_many` call (one commit each).
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 1_800)]
    pub timeout_s: u64,
    /// Print the acknowledgement time of every tenth batch on stderr.
    #[arg(long)]
    pub progress: bool,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    const S: &str = "bulk-deploy";
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let (names, batches) = workload::batches("a", args.apps, args.batch, Shape::default())?;

    let t0 = Instant::now();
    workload::submit(&serve, batches, args.progress).await?;
    let acked = t0.elapsed().as_secs_f64();
    workload::wait_running(&serve, &names, workload::secs(args.timeout_s)).await?;
    let wall = t0.elapsed().as_secs_f64();

    let m = serve
        .metrics()
        .await
        .context(|| "reading metrics".to_owned())?;
    let n = args.apps as f64;
    let fig = |metric: &str, v: f64, unit| {
        Figure::new(S, metric, v, unit)
            .with("apps", args.apps)
            .with("batch", args.batch)
    };
    fig("acked_s", acked, "s").emit()?;
    fig("wall_s", wall, "s").emit()?;
    fig("apps_per_sec", n / wall, "apps/s").emit()?;
    Figure::new(S, "commits", m.store.commits, "commits")
        .with("apps", args.apps)
        .with("batch", args.batch)
        .emit()?;
    Figure::new(S, "running_replicas", m.running_replicas, "replicas")
        .with("apps", args.apps)
        .emit()?;
    Ok(())
}
