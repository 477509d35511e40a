//! `recovery`: a Controller crash (re-adoption of living actors), then a whole
//! restart: shut down, start again on the same store file, and wait until every
//! application is RUNNING again; then the same restart in a new process. Each
//! restart has its floor measured in the same process (read the same file back,
//! spawn three bare actors per application): `ratio_to_floor`.

use std::time::{Duration, Instant};

use flotilla::{Serve, ServeError, StoreError};
use flotilla_benches::floor::{self, FloorRun};

use crate::{
    child,
    error::{BenchError, BenchResult, Context},
    report::Figure,
    sys,
    workload::{self, Shape, TempStore},
};

const S: &str = "recovery";
/// The applications' name prefix.
const PREFIX: &str = "r";
/// The namespace of the floor's stand-ins (Flotilla's is `flotilla<n>`).
const FLOOR_NS: &str = "floor";

/// Flags of `recovery`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Applications to deploy before the crash and the restart.
    #[arg(long, default_value_t = 1_000)]
    pub apps: usize,
    /// Batch size of the first deploy.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// `graceful_shutdown_wait_loop` of the deployments, in ms. Ray's default
    /// (2000) makes `shutdown` take 2 s per application (see BENCHMARKS.md).
    #[arg(long, default_value_t = 10)]
    pub drain_wait_ms: u64,
    /// Give up after this many seconds (per phase).
    #[arg(long, default_value_t = 1_800)]
    pub timeout_s: u64,
    /// Measure no floor (no `floor_*` figures, no `ratio_to_floor`).
    #[arg(long)]
    pub no_floor: bool,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    let store = TempStore::new(S)?;
    let serve = store.start().await?;
    let timeout = workload::secs(args.timeout_s);
    let shape = Shape {
        drain_wait: Some(Duration::from_millis(args.drain_wait_ms.max(1))),
        ..Shape::default()
    };
    let (names, _) =
        workload::deploy_running(&serve, PREFIX, args.apps, args.batch, shape, timeout).await?;
    let fig = |metric: &str, v: f64| {
        Figure::new(S, metric, v, "s")
            .with("apps", args.apps)
            .with("drain_wait_ms", args.drain_wait_ms)
    };

    // 1. Kill the Controller: the Supervisor restarts it and it re-adopts every
    // living ApplicationActor; applications stay RUNNING throughout.
    let t0 = Instant::now();
    serve.crash_controller();
    // `controller_answer_s`: the restarted Controller answers only once it has
    // re-adopted every application (in its post_start), so its first answer
    // to a call that changes nothing times the recovery itself.
    // `controller_crash_s` also waits for the metrics to show every actor:
    // its polls are spaced at ten times their cost (below), so it overstates
    // by up to a poll.
    loop {
        match serve.delete_apps(&["no-such-app"], false).await {
            Ok(()) => break,
            // The call reached the Controller being killed: ask again.
            Err(ServeError::ControllerCrashed) => {}
            Err(e) => return Err(e).context(|| "probing after the crash".to_owned()),
        }
    }
    fig("controller_answer_s", t0.elapsed().as_secs_f64()).emit()?;
    readopted(&serve, args.apps, timeout).await?;
    fig("controller_crash_s", t0.elapsed().as_secs_f64()).emit()?;
    workload::wait_running(&serve, &names, timeout).await?;

    // 2. Shut down (drains and stops every replica), then start on the same file.
    let t0 = Instant::now();
    serve
        .shutdown()
        .await
        .context(|| "shutting down".to_owned())?;
    fig("shutdown_s", t0.elapsed().as_secs_f64()).emit()?;
    drop(serve);

    let (user0, system0) = sys::cpu_split()?;
    let t0 = Instant::now();
    let serve = reopen(store.file(), timeout).await?;
    let reopened = t0.elapsed().as_secs_f64();
    workload::wait_running(&serve, &names, timeout).await?;
    let wall = t0.elapsed().as_secs_f64();
    let (user1, system1) = sys::cpu_split()?;
    fig("wall_s", wall).emit()?;
    fig("start_s", reopened).emit()?;
    // Both cores busy means the restart is bound by its CPU, not by a serial step.
    let restart_user = user1 - user0;
    fig("restart_user_cpu_s", restart_user).emit()?;
    fig("restart_system_cpu_s", system1 - system0).emit()?;

    // 3. The same restart in a new process, as after a crash of the whole
    // program: it also pays for its memory afresh (see BENCHMARKS.md).
    serve
        .shutdown()
        .await
        .context(|| "shutting down after the restart".to_owned())?;
    drop(serve);

    // The floor of the restart in this process: after a shutdown, as the restart
    // was, so it finds the memory the shutdown freed as the restart did. Its
    // stand-ins stay until the process ends.
    let _fleet = if args.no_floor {
        None
    } else {
        let (run, fleet) = floor::restart(&store.file(), FLOOR_NS, timeout).await?;
        emit_floor(
            args.apps,
            args.drain_wait_ms,
            "",
            &run,
            (wall, restart_user),
        )?;
        Some(fleet)
    };

    let mut argv = vec![
        "restart-child".to_owned(),
        format!("--store={}", store.file().display()),
        format!("--apps={}", args.apps),
        format!("--drain-wait-ms={}", args.drain_wait_ms),
        format!("--timeout-s={}", args.timeout_s),
    ];
    if args.no_floor {
        argv.push("--no-floor".to_owned());
    }
    child::run(argv).await?;
    Ok(())
}

/// A restart's floor figures (`{prefix}floor_wall_s` ...), `{prefix}ratio_to_floor`
/// (the restart's `wall` over the floor's) and `{prefix}user_cpu_ratio_to_floor`
/// (its user CPU `user` over the floor's).
fn emit_floor(
    apps: usize,
    drain_wait_ms: u64,
    prefix: &str,
    run: &FloorRun,
    (wall, user): (f64, f64),
) -> BenchResult<()> {
    let fig = |metric: &str, v: f64, unit| {
        Figure::new(S, format!("{prefix}{metric}"), v, unit)
            .with("apps", apps)
            .with("drain_wait_ms", drain_wait_ms)
    };
    fig("floor_wall_s", run.wall_s, "s").emit()?;
    fig("floor_open_s", run.store_s, "s").emit()?;
    fig("floor_user_cpu_s", run.user_cpu_s, "s").emit()?;
    fig("floor_system_cpu_s", run.system_cpu_s, "s").emit()?;
    fig("ratio_to_floor", wall / run.wall_s, "x").emit()?;
    fig("user_cpu_ratio_to_floor", user / run.user_cpu_s, "x").emit()
}

/// Flags of the hidden `restart-child` scenario (run by `recovery`).
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// The store file `recovery` deployed to.
    #[arg(long)]
    pub store: std::path::PathBuf,
    /// Applications it holds (named `r0`, `r1`, ...).
    #[arg(long)]
    pub apps: usize,
    /// Echoed in the figures.
    #[arg(long)]
    pub drain_wait_ms: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 1_800)]
    pub timeout_s: u64,
    /// Measure no floor.
    #[arg(long)]
    pub no_floor: bool,
}

/// Start on `--store` in this fresh process and wait until every application is
/// RUNNING: `new_process_wall_s`, with this process's CPU. Right before, the
/// floor in this process (its stand-ins stay, so the restart pays for fresh
/// memory as the floor did): `new_process_ratio_to_floor`.
pub async fn restart_child(args: &ChildArgs) -> BenchResult<()> {
    let names = workload::names(PREFIX, args.apps);
    let timeout = workload::secs(args.timeout_s);
    let (floor_run, _fleet) = if args.no_floor {
        (None, None)
    } else {
        let (run, fleet) = floor::restart(&args.store, FLOOR_NS, timeout).await?;
        (Some(run), Some(fleet))
    };
    let (user0, system0) = sys::cpu_split()?;
    let t0 = Instant::now();
    let serve = reopen(args.store.clone(), timeout).await?;
    workload::wait_running(&serve, &names, timeout).await?;
    let wall = t0.elapsed().as_secs_f64();
    let (user1, system1) = sys::cpu_split()?;
    let fig = |metric: &str, v: f64| {
        Figure::new(S, metric, v, "s")
            .with("apps", args.apps)
            .with("drain_wait_ms", args.drain_wait_ms)
    };
    fig("new_process_wall_s", wall).emit()?;
    fig("new_process_user_cpu_s", user1 - user0).emit()?;
    fig("new_process_system_cpu_s", system1 - system0).emit()?;
    if let Some(run) = floor_run {
        emit_floor(
            args.apps,
            args.drain_wait_ms,
            "new_process_",
            &run,
            (wall, user1 - user0),
        )?;
    }
    Ok(())
}

/// Wait until the restarted Controller answers and holds every application actor.
/// `metrics()` clones every status, so polls are spaced at ten times their own
/// cost: polling takes at most a tenth of a core from the recovery it measures.
async fn readopted(serve: &Serve, apps: usize, timeout: Duration) -> BenchResult<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let t = Instant::now();
        let m = serve.metrics().await;
        let pause = (t.elapsed() * 10).max(Duration::from_millis(1));
        match m {
            Ok(m) if m.controller_restarts >= 1 && m.controller.app_actors >= apps => {
                return Ok(());
            }
            // The call raced the crash: ask again.
            Ok(_) | Err(ServeError::ControllerCrashed) => {}
            Err(e) => return Err(e).context(|| "reading metrics after the crash".to_owned()),
        }
        if Instant::now() > deadline {
            return Err(BenchError::msg("the controller did not come back in time"));
        }
        tokio::time::sleep(pause).await;
    }
}

/// Start on the store again; the old instance releases the file lock when its
/// last actor has dropped it, so a locked file is retried.
async fn reopen(file: std::path::PathBuf, timeout: Duration) -> BenchResult<Serve> {
    let deadline = Instant::now() + timeout;
    loop {
        match workload::start_on(file.clone()).await {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline && is_locked(&e) => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn is_locked(e: &BenchError) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(ServeError::Store(StoreError::Locked { .. })) = err.downcast_ref::<ServeError>()
        {
            return true;
        }
        cur = err.source();
    }
    false
}
