//! `bulk-deploy`: `run_many` in batches without waiting, then wait for RUNNING.

use std::time::Instant;

use crate::{
    error::{BenchResult, Context},
    report::Figure,
    sys,
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

    let rss0 = sys::rss_bytes()?;
    let (user0, system0) = sys::cpu_split()?;
    let t0 = Instant::now();
    workload::submit(&serve, batches, args.progress).await?;
    let acked = t0.elapsed().as_secs_f64();
    workload::wait_running(&serve, &names, workload::secs(args.timeout_s)).await?;
    let wall = t0.elapsed().as_secs_f64();
    let (user1, system1) = sys::cpu_split()?;
    let rss1 = sys::rss_bytes()?;

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
    fig("user_cpu_s", user1 - user0, "s").emit()?;
    fig("system_cpu_s", system1 - system0, "s").emit()?;
    let grown = rss1.saturating_sub(rss0) as f64;
    fig("rss_bytes_per_app", grown / n.max(1.0), "bytes").emit()?;
    // What fresh memory cost in this very run: on a VM whose memory the host
    // backs lazily, the kernel's first touch of a page dominates system CPU.
    if grown > 0.0 {
        fig(
            "system_s_per_gib",
            (system1 - system0) / (grown / f64::from(1u32 << 30)),
            "s/GiB",
        )
        .emit()?;
    }
    Figure::new(S, "commits", m.store.commits, "commits")
        .with("apps", args.apps)
        .with("batch", args.batch)
        .emit()?;
    Figure::new(S, "running_replicas", m.running_replicas, "replicas")
        .with("apps", args.apps)
        .emit()?;
    Ok(())
}
