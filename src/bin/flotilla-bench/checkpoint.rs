//! `checkpoint-scaling`: the cost of deploying one application into a controller
//! that already holds many. With several sizes, each size runs in its own child
//! process and the ratio largest/smallest is printed.

use std::time::Instant;

use crate::{
    child,
    error::BenchResult,
    report::{self, Figure},
    workload::{self, Shape, TempStore},
};

const S: &str = "checkpoint-scaling";

/// Flags of `checkpoint-scaling`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Applications already held before the measured deploy.
    #[arg(long, value_delimiter = ',', default_value = "0,10000,100000")]
    pub sizes: Vec<usize>,
    /// Measured deploys per size (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub runs: usize,
    /// Batch size used to fill the controller.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Give up filling after this many seconds.
    #[arg(long, default_value_t = 1_800)]
    pub timeout_s: u64,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    match args.sizes.as_slice() {
        [size] => one_size(args, *size).await,
        sizes => {
            let mut lines = Vec::new();
            for size in sizes {
                let argv = vec![
                    S.to_owned(),
                    format!("--sizes={size}"),
                    format!("--runs={}", args.runs),
                    format!("--batch={}", args.batch),
                    format!("--timeout-s={}", args.timeout_s),
                ];
                lines.extend(child::run(argv).await?);
            }
            for metric in ["wall_s", "ack_s"] {
                ratio(&lines, metric)?;
            }
            Ok(())
        }
    }
}

/// Deploy `size` applications, then time `runs` single deploys.
async fn one_size(args: &Args, size: usize) -> BenchResult<()> {
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let timeout = workload::secs(args.timeout_s);
    if size > 0 {
        workload::deploy_running(&serve, "c", size, args.batch, Shape::default(), timeout).await?;
    }
    let mut acks = Vec::with_capacity(args.runs);
    let mut walls = Vec::with_capacity(args.runs);
    for k in 0..args.runs.max(1) {
        let name = format!("probe{k}");
        let (names, batches) = workload::batches(&name, 1, 1, Shape::default())?;
        let t0 = Instant::now();
        workload::submit(&serve, batches, false).await?;
        acks.push(t0.elapsed().as_secs_f64());
        workload::wait_running(&serve, &names, timeout).await?;
        walls.push(t0.elapsed().as_secs_f64());
    }
    Figure::new(S, "wall_s", report::median(&mut walls), "s")
        .with("apps", size)
        .with("runs", walls.len())
        .emit()?;
    Figure::new(S, "ack_s", report::median(&mut acks), "s")
        .with("apps", size)
        .with("runs", acks.len())
        .emit()
}

/// `metric` at the largest size over `metric` at the smallest, from the
/// children's lines.
fn ratio(lines: &[String], metric: &str) -> BenchResult<()> {
    let points: Vec<(f64, f64)> = lines
        .iter()
        .filter(|l| report::string_field(l, "metric") == Some(metric))
        .filter_map(|l| {
            Some((
                report::number_field(l, "apps")?,
                report::number_field(l, "value")?,
            ))
        })
        .collect();
    let lo = points.iter().min_by(|a, b| a.0.total_cmp(&b.0));
    let hi = points.iter().max_by(|a, b| a.0.total_cmp(&b.0));
    if let (Some(lo), Some(hi)) = (lo, hi) {
        let name = if metric == "wall_s" {
            "ratio".to_owned()
        } else {
            format!("ratio_{metric}")
        };
        Figure::new(S, name, hi.1 / lo.1, "x")
            .with("from_apps", lo.0 as u64)
            .with("to_apps", hi.0 as u64)
            .emit()?;
    }
    Ok(())
}
