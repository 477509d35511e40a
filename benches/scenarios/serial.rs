//! `serial-deploy`: `run` one application at a time, each awaited until RUNNING.

use std::time::Instant;

use crate::{
    error::{BenchResult, Context},
    report::{self, Figure},
    workload::{self, Shape, TempStore},
};

/// Flags of `serial-deploy`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Applications to deploy, one after the other.
    #[arg(long, default_value_t = 1_000)]
    pub apps: usize,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    const S: &str = "serial-deploy";
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let specs = (0..args.apps)
        .map(|i| workload::app(&format!("s{i}"), Shape::default()))
        .collect::<BenchResult<Vec<_>>>()?;
    let mut each = Vec::with_capacity(args.apps);
    let t0 = Instant::now();
    for spec in specs {
        let name = spec.name.to_string();
        let t = Instant::now();
        serve.run(spec).await.context(|| format!("run of {name}"))?;
        each.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let wall = t0.elapsed().as_secs_f64();
    let commits = serve
        .metrics()
        .await
        .context(|| "reading metrics".to_owned())?
        .store
        .commits;
    let n = args.apps as f64;
    Figure::new(S, "wall_s", wall, "s")
        .with("apps", args.apps)
        .emit()?;
    Figure::new(S, "apps_per_sec", n / wall, "apps/s")
        .with("apps", args.apps)
        .emit()?;
    Figure::new(S, "run_p50_us", report::median(&mut each), "us")
        .with("apps", args.apps)
        .emit()?;
    Figure::new(S, "run_p99_us", report::percentile(&mut each, 0.99), "us")
        .with("apps", args.apps)
        .emit()?;
    Figure::new(S, "commits", commits, "commits")
        .with("apps", args.apps)
        .emit()?;
    Ok(())
}
