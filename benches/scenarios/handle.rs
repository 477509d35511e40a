//! `handle`: the data plane. Latency of sequential calls from one task to one
//! replica, and throughput of many concurrent callers against 1 and N replicas,
//! with a high `max_ongoing_requests` and with Ray's default (5).

use std::time::{Duration, Instant};

use flotilla::{DeploymentHandle, Serve};

use crate::{
    error::{BenchError, BenchResult, Context},
    report::{self, Figure},
    workload::{self, Shape, TempStore},
};

const S: &str = "handle";

/// Flags of `handle`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Sequential calls timed one by one for the latency figures.
    #[arg(long, default_value_t = 100_000)]
    pub calls: usize,
    /// Concurrent caller tasks for the throughput figures.
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
    /// Seconds each throughput run lasts.
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// Replica counts to measure throughput against.
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    pub replicas: Vec<u32>,
    /// `max_ongoing_requests` values to measure throughput with.
    #[arg(long, value_delimiter = ',', default_value = "1000,5")]
    pub max_ongoing: Vec<u32>,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    let store = TempStore::new(S)?;
    let serve = store.start().await?;

    let h = deploy(&serve, "lat", workload::NOOP, 1, 1000).await?;
    for i in 0..1_000u64 {
        call(&h, i).await?;
    }
    let mut us = Vec::with_capacity(args.calls);
    for i in 0..args.calls as u64 {
        let t = Instant::now();
        call(&h, i).await?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mean = us.iter().sum::<f64>() / us.len().max(1) as f64;
    let lat = |metric: &str, v: f64| {
        Figure::new(S, metric, v, "us")
            .with("replicas", 1u64)
            .with("calls", args.calls)
    };
    lat("p50_us", report::percentile(&mut us, 0.5)).emit()?;
    lat("p99_us", report::percentile(&mut us, 0.99)).emit()?;
    lat("mean_us", mean).emit()?;

    // Noop answers without ever yielding, so a call holds its slot only while it
    // runs on one thread; Yield makes requests overlap so the limit binds.
    for (code, tag, metric) in [
        (workload::NOOP, "n", "req_per_sec"),
        (workload::YIELD, "y", "req_per_sec_yield"),
    ] {
        for &max in &args.max_ongoing {
            for &replicas in &args.replicas {
                let name = format!("t{tag}{replicas}m{max}");
                let h = deploy(&serve, &name, code, replicas, max).await?;
                let rps = throughput(&h, args.callers, Duration::from_secs(args.seconds)).await?;
                Figure::new(S, metric, rps, "req/s")
                    .with("replicas", u64::from(replicas))
                    .with("max_ongoing", u64::from(max))
                    .with("callers", args.callers)
                    .emit()?;
            }
        }
    }
    Ok(())
}

async fn deploy(
    serve: &Serve,
    name: &str,
    code: &'static str,
    replicas: u32,
    max: u32,
) -> BenchResult<DeploymentHandle> {
    let shape = Shape {
        code,
        replicas,
        max_ongoing: Some(max),
        ..Shape::default()
    };
    serve
        .run(workload::app(name, shape)?)
        .await
        .context(|| format!("deploying {name}"))
}

async fn call(h: &DeploymentHandle, i: u64) -> BenchResult<()> {
    let out: u64 = h.call(&i).await.context(|| format!("call {i}"))?;
    if out != i {
        return Err(BenchError::msg(format!("call {i} answered {out}")));
    }
    Ok(())
}

/// Requests per second completed by `callers` tasks calling in a loop for `d`.
async fn throughput(h: &DeploymentHandle, callers: usize, d: Duration) -> BenchResult<f64> {
    let t0 = Instant::now();
    let end = t0 + d;
    let tasks: Vec<_> = (0..callers.max(1))
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < end {
                    call(&h, n).await?;
                    n += 1;
                }
                Ok::<u64, BenchError>(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.context(|| "joining a caller".to_owned())??;
    }
    Ok(total as f64 / t0.elapsed().as_secs_f64())
}
