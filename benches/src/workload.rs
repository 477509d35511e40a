//! The trivial deployment, application builders, a temporary store, and waiting
//! until applications are RUNNING.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use flotilla::{
    ApplicationSpec, ApplicationStatus, Deployment, DeploymentSpec, Registry, RunManyOptions,
    Serve, ServeOptions, UserError,
};

use crate::{
    error::{BenchError, BenchResult, Context},
    sys,
};

/// The import path of [`Noop`].
pub const NOOP: &str = "bench::Noop";

/// A deployment that answers its request unchanged: the cost measured is
/// Flotilla's alone.
pub struct Noop;

impl Deployment for Noop {
    type Request = u64;
    type Response = u64;
    async fn handle(&self, request: u64) -> Result<u64, UserError> {
        Ok(request)
    }
}

/// The import path of [`Yield`].
pub const YIELD: &str = "bench::Yield";

/// Like [`Noop`], but yields to the scheduler once per request, so requests
/// really overlap and `max_ongoing_requests` binds.
pub struct Yield;

impl Deployment for Yield {
    type Request = u64;
    type Response = u64;
    async fn handle(&self, request: u64) -> Result<u64, UserError> {
        tokio::task::yield_now().await;
        Ok(request)
    }
}

/// A registry holding [`Noop`] and [`Yield`], with trivial constructors.
pub fn registry() -> BenchResult<Registry> {
    Registry::new()
        .register(NOOP, |_ctx| async { Ok(Noop) })
        .context(|| format!("registering {NOOP}"))?
        .register(YIELD, |_ctx| async { Ok(Yield) })
        .context(|| format!("registering {YIELD}"))
}

/// The shape of each benchmark application: one deployment of [`Noop`].
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The import path of the code ([`NOOP`] or [`YIELD`]).
    pub code: &'static str,
    /// Replicas of the deployment.
    pub replicas: u32,
    /// `max_ongoing_requests` (`None`: Ray's default, 5).
    pub max_ongoing: Option<u32>,
    /// `graceful_shutdown_wait_loop` (`None`: Ray's default, 2 s).
    pub drain_wait: Option<Duration>,
    /// `health_check_period` (`None`: Ray's default, 10 s).
    pub health_period: Option<Duration>,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            code: NOOP,
            replicas: 1,
            max_ongoing: None,
            drain_wait: None,
            health_period: None,
        }
    }
}

/// Application `name`, route prefix `/name`, one deployment `noop` of `shape`.
pub fn app(name: &str, shape: Shape) -> BenchResult<ApplicationSpec> {
    ApplicationSpec::builder(name)
        .route_prefix(format!("/{name}"))
        .deployment(
            DeploymentSpec::builder("noop", shape.code)
                .replicas(shape.replicas)
                .with_config(|mut c| {
                    if let Some(n) = shape.max_ongoing {
                        c = c.with_max_ongoing_requests(n);
                    }
                    if let Some(p) = shape.health_period {
                        let timeout = c.health_check_timeout;
                        c = c.with_health_check(p, timeout);
                    }
                    if let Some(w) = shape.drain_wait {
                        let timeout = c.graceful_shutdown_timeout;
                        c = c.with_graceful_shutdown(w, timeout);
                    }
                    c
                }),
        )
        .build()
        .context(|| format!("building application {name}"))
}

/// `n` applications named `{prefix}{i}`, in batches of `batch` (at least 1).
pub fn batches(
    prefix: &str,
    n: usize,
    batch: usize,
    shape: Shape,
) -> BenchResult<(Vec<String>, Vec<Vec<ApplicationSpec>>)> {
    let names = names(prefix, n);
    let mut out = Vec::with_capacity(n.div_ceil(batch.max(1)));
    for chunk in names.chunks(batch.max(1)) {
        out.push(
            chunk
                .iter()
                .map(|name| app(name, shape))
                .collect::<BenchResult<Vec<_>>>()?,
        );
    }
    Ok((names, out))
}

/// Send every batch with `run_many`, waiting for nothing but the acknowledgement
/// (the commit).
/// With `progress`, print each tenth batch's acknowledgement time on stderr.
pub async fn submit(
    serve: &Serve,
    batches: Vec<Vec<ApplicationSpec>>,
    progress: bool,
) -> BenchResult<()> {
    let no_wait = RunManyOptions {
        wait_for_ingress_deployment_creation: false,
        wait_for_applications_running: false,
    };
    let t0 = Instant::now();
    for (i, b) in batches.into_iter().enumerate() {
        let t = Instant::now();
        serve
            .run_many(b, no_wait)
            .await
            .context(|| format!("run_many of batch {i}"))?;
        if progress && i % 10 == 0 {
            let (user, system) = sys::cpu_split()?;
            eprintln!(
                "batch {i}: acknowledged in {:.1} ms, {:.2} s since the first; \
                 cpu user {user:.2} s, sys {system:.2} s; rss {} MiB",
                t.elapsed().as_secs_f64() * 1e3,
                t0.elapsed().as_secs_f64(),
                sys::rss_bytes()? >> 20
            );
        }
    }
    Ok(())
}

/// Wait until every application in `names` is RUNNING, by subscription (no
/// polling); an application in DEPLOY_FAILED, or `timeout` passing, is an error.
pub async fn wait_running(serve: &Serve, names: &[String], timeout: Duration) -> BenchResult<()> {
    let done = AtomicU32::new(0);
    let all = async {
        for name in names {
            let mut rx = serve
                .watch_status(name)
                .ok_or_else(|| BenchError::msg(format!("application {name} does not exist")))?;
            loop {
                let (status, message) = {
                    let s = rx.borrow_and_update();
                    (s.status, s.message.clone())
                };
                match status {
                    ApplicationStatus::Running => break,
                    ApplicationStatus::DeployFailed => {
                        return Err(BenchError::msg(format!(
                            "application {name} failed to deploy: {message}"
                        )));
                    }
                    _ => {}
                }
                if rx.changed().await.is_err() {
                    return Err(BenchError::msg(format!("application {name} disappeared")));
                }
            }
            done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, all).await {
        Ok(r) => r,
        Err(_) => Err(BenchError::msg(format!(
            "timed out after {timeout:?}: {} of {} applications RUNNING",
            done.load(Ordering::Relaxed),
            names.len()
        ))),
    }
}

/// Deploy `n` applications in batches and wait until all are RUNNING; returns
/// their names and the seconds it took.
pub async fn deploy_running(
    serve: &Serve,
    prefix: &str,
    n: usize,
    batch: usize,
    shape: Shape,
    timeout: Duration,
) -> BenchResult<(Vec<String>, f64)> {
    let (names, b) = batches(prefix, n, batch, shape)?;
    let t0 = Instant::now();
    submit(serve, b, false).await?;
    wait_running(serve, &names, timeout).await?;
    Ok((names, t0.elapsed().as_secs_f64()))
}

static STORES: AtomicU32 = AtomicU32::new(0);

/// A fresh directory under the system temp dir (named by process id) holding
/// one store file; removed on drop.
pub struct TempStore {
    dir: PathBuf,
}

impl TempStore {
    /// Create the directory.
    pub fn new(label: &str) -> BenchResult<Self> {
        let dir = std::env::temp_dir().join(format!(
            "flotilla-bench-{}-{label}-{}",
            std::process::id(),
            STORES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
        Ok(TempStore { dir })
    }

    /// The store file inside it.
    pub fn file(&self) -> PathBuf {
        self.dir.join("flotilla.redb")
    }

    /// Start Flotilla on this store.
    pub async fn start(&self) -> BenchResult<Serve> {
        start_on(self.file()).await
    }
}

/// The names of `n` applications deployed with `prefix`.
pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// Start Flotilla on the store file `file`, with the bench's registry.
pub async fn start_on(file: PathBuf) -> BenchResult<Serve> {
    let registry = registry()?;
    let shown = file.display().to_string();
    Serve::start(ServeOptions::new(registry).store_path(file))
        .await
        .context(|| format!("starting flotilla on {shown}"))
}

impl Drop for TempStore {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!(
                "flotilla-benches: could not remove {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// `--timeout-s` as a duration.
pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
