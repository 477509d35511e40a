//! `bulk-deploy`: `run_many` in batches without waiting, then wait for RUNNING;
//! and right before it (or after it) the floor of the same deploy, so that
//! `ratio_to_floor` compares two measurements under the same machine conditions.

use std::time::Instant;

use flotilla_benches::floor::{self, FloorRun, StateSizes};

use crate::{
    error::{BenchResult, Context},
    report::Figure,
    sys,
    workload::{self, Shape, TempStore},
};

/// The namespace of the floor's stand-ins (Flotilla's is `flotilla<n>`).
const FLOOR_NS: &str = "floor";

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
    /// Measure no floor (no `floor_*` figures, no `ratio_to_floor`).
    #[arg(long)]
    pub no_floor: bool,
    /// Measure the floor after Flotilla's deploy instead of right before it.
    #[arg(long, conflicts_with = "no_floor")]
    pub floor_after: bool,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    const S: &str = "bulk-deploy";
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let (names, batches) = workload::batches("a", args.apps, args.batch, Shape::default())?;
    let timeout = workload::secs(args.timeout_s);
    // The floor's store and its copy of the same specs, made before anything is timed.
    let floor_store = TempStore::new("bulk-deploy-floor")?;
    let mut floor_batches = if args.no_floor {
        None
    } else {
        Some(workload::batches("a", args.apps, args.batch, Shape::default())?.1)
    };
    let floor_first = !args.floor_after;
    // Its stand-ins stay alive to the end (as Flotilla's actors do): the one
    // measured second pays for fresh memory too.
    let mut floor_run = None;
    let mut _fleet = None;
    if floor_first && let Some(b) = floor_batches.take() {
        let (run, fleet) = floor::deploy(&floor_store.file(), FLOOR_NS, b, timeout).await?;
        (floor_run, _fleet) = (Some(run), Some(fleet));
    }

    let rss0 = sys::rss_bytes()?;
    let (user0, system0) = sys::cpu_split()?;
    let t0 = Instant::now();
    workload::submit(&serve, batches, args.progress).await?;
    let acked = t0.elapsed().as_secs_f64();
    workload::wait_running(&serve, &names, timeout).await?;
    let wall = t0.elapsed().as_secs_f64();
    let (user1, system1) = sys::cpu_split()?;
    let rss1 = sys::rss_bytes()?;
    if !floor_first && let Some(b) = floor_batches {
        let (run, fleet) = floor::deploy(&floor_store.file(), FLOOR_NS, b, timeout).await?;
        (floor_run, _fleet) = (Some(run), Some(fleet));
    }

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
    if let Some(run) = floor_run {
        emit_floor(args, &run, (wall, user1 - user0), floor_first)?;
    }
    Ok(())
}

/// The floor's figures, and Flotilla's time and user CPU (`wall`, `user`) over
/// the floor's.
fn emit_floor(
    args: &Args,
    run: &FloorRun,
    (wall, user): (f64, f64),
    floor_first: bool,
) -> BenchResult<()> {
    const S: &str = "bulk-deploy";
    let fig = |metric: &str, v: f64, unit| {
        Figure::new(S, metric, v, unit)
            .with("apps", args.apps)
            .with("batch", args.batch)
    };
    fig("floor_wall_s", run.wall_s, "s").emit()?;
    fig("floor_commit_s", run.store_s, "s").emit()?;
    fig("floor_user_cpu_s", run.user_cpu_s, "s").emit()?;
    fig("floor_system_cpu_s", run.system_cpu_s, "s").emit()?;
    let n = (args.apps as f64).max(1.0);
    fig("floor_rss_bytes_per_app", run.rss_grown as f64 / n, "bytes").emit()?;
    if let Some(s) = run.system_s_per_gib() {
        fig("floor_system_s_per_gib", s, "s/GiB").emit()?;
    }
    let states = StateSizes::APPLICATION + StateSizes::DEPLOYMENT + StateSizes::REPLICA;
    Figure::new(S, "floor_state_bytes", states, "bytes")
        .with("application", StateSizes::APPLICATION)
        .with("deployment", StateSizes::DEPLOYMENT)
        .with("replica", StateSizes::REPLICA)
        .emit()?;
    fig("ratio_to_floor", wall / run.wall_s, "x")
        .with("floor_first", u64::from(floor_first))
        .emit()?;
    // User CPU is not taken by other processes' load: the steadier ratio on a
    // busy machine (it does not see waits: the commits' fsync, idle cores).
    fig("user_cpu_ratio_to_floor", user / run.user_cpu_s, "x")
        .with("floor_first", u64::from(floor_first))
        .emit()
}
