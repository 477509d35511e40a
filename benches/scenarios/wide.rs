//! `wide-deployment`: one application whose one deployment has many
//! replicas: the time until it is RUNNING, the time to delete it, and how
//! long a snapshot of the deployment (what status and the REST API read)
//! takes while it starts.

use std::time::{Duration, Instant};

use crate::{
    error::{BenchResult, Context},
    report::Figure,
    workload::{self, Shape, TempStore, secs, wait_running},
};

/// Flags of `wide-deployment`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Replicas of the one deployment.
    #[arg(long, default_value_t = 10_000)]
    pub replicas: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    const S: &str = "wide-deployment";
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let shape = Shape {
        replicas: args.replicas,
        ..Shape::default()
    };
    let spec = workload::app("wide", shape)?;
    let names = vec!["wide".to_owned()];
    let t0 = Instant::now();
    serve
        .run_many(
            vec![spec],
            flotilla::RunManyOptions {
                wait_for_ingress_deployment_creation: false,
                wait_for_applications_running: false,
            },
        )
        .await
        .context(|| "deploying".to_owned())?;
    // Snapshots asked for while it starts: the slowest answer.
    let watcher = {
        let serve = serve.clone();
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            loop {
                let t = Instant::now();
                let details = serve.deployment_details(Duration::from_secs(60)).await;
                slowest = slowest.max(t.elapsed());
                let running = details
                    .iter()
                    .filter_map(|d| d.snapshot.as_ref())
                    .any(|s| s.status.status == flotilla::DeploymentStatus::Healthy);
                if running {
                    return slowest;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    wait_running(&serve, &names, secs(args.timeout_s)).await?;
    let up = t0.elapsed().as_secs_f64();
    let slowest = watcher
        .await
        .map_err(|e| crate::error::BenchError::msg(format!("snapshot watcher: {e}")))?;
    let t1 = Instant::now();
    serve
        .delete_apps(["wide"], true)
        .await
        .context(|| "deleting".to_owned())?;
    let down = t1.elapsed().as_secs_f64();
    let n = args.replicas as usize;
    Figure::new(S, "running_s", up, "s")
        .with("replicas", n)
        .emit()?;
    Figure::new(S, "replicas_per_sec", n as f64 / up, "replicas/s")
        .with("replicas", n)
        .emit()?;
    Figure::new(S, "slowest_snapshot_ms", slowest.as_secs_f64() * 1e3, "ms")
        .with("replicas", n)
        .emit()?;
    Figure::new(S, "deleted_s", down, "s")
        .with("replicas", n)
        .emit()?;
    Ok(())
}
