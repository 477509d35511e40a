//! `memory`: resident memory before and after deploying N applications of one
//! replica each.

use std::time::Duration;

use crate::{
    error::BenchResult,
    report::Figure,
    sys,
    workload::{self, Shape, TempStore},
};

/// Flags of `memory`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Applications to deploy.
    #[arg(long, default_value_t = 10_000)]
    pub apps: usize,
    /// Batch size of the deploy.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Give up deploying after this many seconds.
    #[arg(long, default_value_t = 1_800)]
    pub timeout_s: u64,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    const S: &str = "memory";
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let before = sys::rss_bytes()?;
    workload::deploy_running(
        &serve,
        "m",
        args.apps,
        args.batch,
        Shape::default(),
        workload::secs(args.timeout_s),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = sys::rss_bytes()?;
    let per = after.saturating_sub(before) as f64 / args.apps.max(1) as f64;
    let fig = |metric: &str, v: f64, unit| Figure::new(S, metric, v, unit).with("apps", args.apps);
    fig("rss_before_bytes", before as f64, "bytes").emit()?;
    fig("rss_after_bytes", after as f64, "bytes").emit()?;
    fig("bytes_per_replica", per, "bytes").emit()
}
