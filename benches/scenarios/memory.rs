//! `memory`: resident memory before and after deploying N applications of one
//! replica each.

use std::time::Duration;

use crate::{error::BenchResult, fleet::Fleet, report::Figure, sys, workload::TempStore};

/// Flags of `memory`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The fleet whose memory is measured.
    #[command(flatten)]
    pub fleet: Fleet,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    const S: &str = "memory";
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let before = sys::rss_bytes()?;
    args.fleet.deploy(&serve, "m").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = sys::rss_bytes()?;
    let per = after.saturating_sub(before) as f64 / args.fleet.apps.max(1) as f64;
    let fig =
        |metric: &str, v: f64, unit| Figure::new(S, metric, v, unit).with("apps", args.fleet.apps);
    fig("rss_before_bytes", before as f64, "bytes").emit()?;
    fig("rss_after_bytes", after as f64, "bytes").emit()?;
    fig("bytes_per_replica", per, "bytes").emit()
}
