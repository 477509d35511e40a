//! `checkpoint-scaling`: the cost of deploying one application into a controller
//! that already holds many. With several sizes, each size runs in its own child
//! process and the ratio largest/smallest is printed.

use std::time::Instant;

use crate::{
    child,
    error::{BenchResult, Context},
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
    /// `health_check_period` of every application, in seconds (default: Ray's
    /// 10 s). A long period removes the background health checks of the held
    /// applications from the measurement.
    #[arg(long)]
    pub health_period_s: Option<u64>,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    match args.sizes.as_slice() {
        [size] => one_size(args, *size).await,
        sizes => {
            let mut lines = Vec::new();
            for size in sizes {
                let mut argv = vec![
                    S.to_owned(),
                    format!("--sizes={size}"),
                    format!("--runs={}", args.runs),
                    format!("--batch={}", args.batch),
                    format!("--timeout-s={}", args.timeout_s),
                ];
                if let Some(p) = args.health_period_s {
                    argv.push(format!("--health-period-s={p}"));
                }
                lines.extend(child::run(argv).await?);
            }
            ratio(&lines, "wall_s", "ratio")?;
            ratio(&lines, "ack_s", "ratio_ack")?;
            Ok(())
        }
    }
}

/// Deploy `size` applications, then time `runs` single deploys.
async fn one_size(args: &Args, size: usize) -> BenchResult<()> {
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let timeout = workload::secs(args.timeout_s);
    let shape = Shape {
        health_period: args.health_period_s.map(workload::secs),
        ..Shape::default()
    };
    if size > 0 {
        workload::deploy_running(&serve, "c", size, args.batch, shape, timeout).await?;
    }
    let mut acks = Vec::with_capacity(args.runs);
    let mut walls = Vec::with_capacity(args.runs);
    for k in 0..args.runs.max(1) {
        let name = format!("probe{k}");
        let (names, batches) = workload::batches(&name, 1, 1, shape)?;
        let t0 = Instant::now();
        workload::submit(&serve, batches, false).await?;
        acks.push(t0.elapsed().as_secs_f64());
        workload::wait_running(&serve, &names, timeout).await?;
        walls.push(t0.elapsed().as_secs_f64());
    }
    // A controller round trip that commits nothing (deleting an unknown name): the
    // part of `ack_s` that is not validation and the checkpoint commit.
    let mut trips = Vec::with_capacity(args.runs);
    for _ in 0..args.runs.max(1) {
        let t0 = Instant::now();
        serve
            .delete_apps(&["no-such-app"], false)
            .await
            .context(|| "deleting an unknown application".to_owned())?;
        trips.push(t0.elapsed().as_secs_f64());
    }
    let health = args.health_period_s.unwrap_or(10);
    for (metric, xs) in [
        ("wall_s", &mut walls),
        ("ack_s", &mut acks),
        ("roundtrip_s", &mut trips),
    ] {
        Figure::new(S, metric, report::median(xs), "s")
            .with("apps", size)
            .with("runs", xs.len())
            .with("min_s", report::percentile(xs, 0.0))
            .with("max_s", report::percentile(xs, 1.0))
            .with("health_period_s", health)
            .emit()?;
    }
    Ok(())
}

/// `metric` at the largest size over `metric` at the smallest, from the
/// children's lines: `name` compares medians, `{name}_min` the fastest runs (less
/// sensitive to a noisy disk).
fn ratio(lines: &[String], metric: &str, name: &str) -> BenchResult<()> {
    let points: Vec<(f64, f64, f64)> = lines
        .iter()
        .filter(|l| report::string_field(l, "metric") == Some(metric))
        .filter_map(|l| {
            Some((
                report::number_field(l, "apps")?,
                report::number_field(l, "value")?,
                report::number_field(l, "min_s")?,
            ))
        })
        .collect();
    let lo = points.iter().min_by(|a, b| a.0.total_cmp(&b.0));
    let hi = points.iter().max_by(|a, b| a.0.total_cmp(&b.0));
    if let (Some(lo), Some(hi)) = (lo, hi) {
        for (label, r) in [
            (name.to_owned(), hi.1 / lo.1),
            (format!("{name}_min"), hi.2 / lo.2),
        ] {
            Figure::new(S, label, r, "x")
                .with("from_apps", lo.0 as u64)
                .with("to_apps", hi.0 as u64)
                .emit()?;
        }
    }
    Ok(())
}
