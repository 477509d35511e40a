//! Test support: a deployment whose behaviour is set by its init args and by
//! switches the test holds, and helpers to wait on statuses in virtual time.

#![allow(dead_code)]

use std::{
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use flotilla::{
    ApplicationSpec, ApplicationStatus, ApplicationStatusInfo, Cluster, Deployment, DeploymentSpec,
    InitContext, Registry, RestartPolicy, RunManyOptions, Serve, ServeOptions, UserError,
};
use flotilla_core::{AppName, DeploymentName, DeploymentSpecBuilder};
use flotilla_deployment::{DeploymentMsg, DeploymentSnapshot};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// What a probe replica does, from its init args.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProbeArgs {
    /// Fail this many constructor calls (counted across replicas) before succeeding;
    /// `u32::MAX` fails forever.
    pub fail_constructor: u32,
    /// Sleep this long (virtual time) in the constructor.
    pub start_delay_ms: u64,
    /// Tag echoed in responses (changing it changes the code version).
    pub tag: String,
    /// Call this deployment of the same application and append its answer.
    pub downstream: Option<String>,
}

/// Probe args that only set the tag.
pub fn tag(t: &str) -> ProbeArgs {
    ProbeArgs {
        tag: t.into(),
        ..Default::default()
    }
}

/// Switches shared by a test and its probes.
#[derive(Debug, Default)]
pub struct Switches {
    /// Constructor calls so far.
    pub constructed: AtomicU32,
    /// Probes (user values) dropped so far.
    pub dropped: AtomicU32,
    /// Constructor failures so far.
    pub failed: AtomicU32,
    /// When set, constructors fail (whatever their args).
    pub fail_starts: AtomicBool,
    /// Requests handled.
    pub handled: AtomicU32,
    /// When set, health checks fail.
    pub unhealthy: AtomicBool,
    /// reconfigure calls.
    pub reconfigured: AtomicU32,
    /// Fail this many of the next reconfigure calls.
    pub fail_reconfigures: AtomicU32,
    /// When set, health checks never return (they time out).
    pub hang_health: AtomicBool,
    /// When set, health checks panic.
    pub panic_health: AtomicBool,
    /// check_health calls.
    pub health_checks: AtomicU32,
    /// Extra constructor delay in ms (not part of the code version).
    pub slow_start_ms: AtomicU64,
    /// Delay of every reconfigure call in ms.
    pub reconfigure_delay_ms: AtomicU64,
    /// The (virtual) time of every constructor call, in order.
    pub constructor_times: Mutex<Vec<Instant>>,
}

impl Switches {
    /// The virtual times of the constructor calls so far.
    pub fn constructor_times(&self) -> Vec<Instant> {
        self.constructor_times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub struct Probe {
    args: ProbeArgs,
    switches: Arc<Switches>,
    downstream: Option<flotilla::DeploymentHandle>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.switches.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Deployment for Probe {
    type Request = String;
    type Response = String;

    async fn handle(&self, request: String) -> Result<String, UserError> {
        self.switches.handled.fetch_add(1, Ordering::SeqCst);
        if request == "fail" {
            return Err(UserError::new("asked to fail"));
        }
        if request == "panic" {
            panic!("probe asked to panic");
        }
        if request == "hang" {
            std::future::pending::<()>().await;
        }
        if let Some(marker) = request.strip_prefix("log:") {
            // User code logging with no fields of its own.
            tracing::info!(marker, "user code logs");
        }
        if let Some(ms) = request.strip_prefix("sleep:") {
            let ms: u64 = ms.parse().map_err(|_| UserError::new("bad sleep"))?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let mut out = format!("{}:{request}", self.args.tag);
        if let Some(h) = &self.downstream {
            let more: String = h
                .call(&request)
                .await
                .map_err(|e| UserError::new(e.to_string()))?;
            out.push_str(&format!("|{more}"));
        }
        Ok(out)
    }

    async fn reconfigure(&self, _user_config: flotilla::Args) -> Result<(), UserError> {
        self.switches.reconfigured.fetch_add(1, Ordering::SeqCst);
        let delay = self.switches.reconfigure_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let failing = self
            .switches
            .fail_reconfigures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(UserError::new("probe reconfigure told to fail"));
        }
        Ok(())
    }

    async fn check_health(&self) -> Result<(), UserError> {
        self.switches.health_checks.fetch_add(1, Ordering::SeqCst);
        if self.switches.panic_health.load(Ordering::SeqCst) {
            panic!("probe health check asked to panic");
        }
        if self.switches.hang_health.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.switches.unhealthy.load(Ordering::SeqCst) {
            Err(UserError::new("probe told to be unhealthy"))
        } else {
            Ok(())
        }
    }
}

/// The constructor of `test::Probe` (and `test::Probe2`), bound to `switches`.
pub async fn construct(ctx: InitContext, switches: Arc<Switches>) -> Result<Probe, UserError> {
    let args: ProbeArgs = ctx.args()?;
    switches
        .constructor_times
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Instant::now());
    let delay = args.start_delay_ms + switches.slow_start_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let n = switches.constructed.fetch_add(1, Ordering::SeqCst);
    if n < args.fail_constructor || switches.fail_starts.load(Ordering::SeqCst) {
        switches.failed.fetch_add(1, Ordering::SeqCst);
        return Err(UserError::new(format!(
            "probe constructor failure #{}",
            n + 1
        )));
    }
    let downstream = match &args.downstream {
        Some(d) => Some(ctx.handle(d)?),
        None => None,
    };
    Ok(Probe {
        args,
        switches,
        downstream,
    })
}

/// A registry with `test::Probe` (and the same code as `test::Probe2`, to change
/// an import path), bound to `switches`.
pub fn registry(switches: &Arc<Switches>) -> Registry {
    let s = switches.clone();
    let s2 = switches.clone();
    Registry::new()
        .register("test::Probe", move |ctx| construct(ctx, s.clone()))
        .and_then(|r| r.register("test::Probe2", move |ctx| construct(ctx, s2.clone())))
        .expect("valid import path")
}

/// A one-deployment application of probes.
pub fn app(name: &str, replicas: u32, args: ProbeArgs) -> ApplicationSpec {
    app_of(name, probe(replicas, &args))
}

/// `n` one-replica applications of probes with `args`, named `a0`, `a1`, ...
pub fn numbered_apps(n: usize, args: &ProbeArgs) -> Vec<ApplicationSpec> {
    (0..n)
        .map(|i| app(&format!("a{i}"), 1, args.clone()))
        .collect()
}

/// A one-deployment application named `name` (route `/{name}`) of `deployment`.
pub fn app_of(name: &str, deployment: DeploymentSpecBuilder) -> ApplicationSpec {
    ApplicationSpec::builder(name)
        .route_prefix(format!("/{name}"))
        .deployment(deployment)
        .build()
        .expect("valid app")
}

/// The probe deployment "probe" with `replicas` and `args`, to refine further.
pub fn probe(replicas: u32, args: &ProbeArgs) -> DeploymentSpecBuilder {
    DeploymentSpec::builder("probe", "test::Probe")
        .init_args(args)
        .replicas(replicas)
}

/// `run_many` options that wait for nothing.
pub fn no_wait() -> RunManyOptions {
    RunManyOptions {
        wait_for_ingress_deployment_creation: false,
        wait_for_applications_running: false,
    }
}

/// Options for a Serve of `registry` on the store `f.redb` in `dir`.
pub fn options(dir: impl AsRef<Path>, registry: Registry) -> ServeOptions {
    ServeOptions::new(registry).store_path(dir.as_ref().join("f.redb"))
}

/// A Serve of `registry` on a fresh store in `dir`.
pub async fn start_with(dir: &tempfile::TempDir, registry: Registry) -> Serve {
    Serve::start(options(dir, registry))
        .await
        .expect("serve starts")
}

/// A Serve on a fresh store in `dir`.
pub async fn start(dir: &tempfile::TempDir, switches: &Arc<Switches>) -> Serve {
    start_with(dir, registry(switches)).await
}

/// A Serve on a fresh store in `dir`, placing replicas on `cluster`.
pub async fn start_on(
    dir: &tempfile::TempDir,
    switches: &Arc<Switches>,
    cluster: Arc<dyn Cluster>,
) -> Serve {
    Serve::start(options(dir, registry(switches)).cluster(cluster))
        .await
        .expect("serve starts")
}

/// A Serve on a fresh store in `dir` whose crashed actors restart by `restart`.
pub async fn start_restarting(
    dir: &tempfile::TempDir,
    switches: &Arc<Switches>,
    restart: RestartPolicy,
) -> Serve {
    Serve::start(ServeOptions {
        restart,
        ..options(dir, registry(switches))
    })
    .await
    .expect("serve starts")
}

/// A new temporary directory, new switches, and a Serve of
/// `registry_of(&switches)` on a store in that directory (keep the directory
/// alive as long as the Serve).
pub async fn start_fresh_with(
    registry_of: impl FnOnce(&Arc<Switches>) -> Registry,
) -> (tempfile::TempDir, Arc<Switches>, Serve) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let switches = Arc::new(Switches::default());
    let serve = start_with(&dir, registry_of(&switches)).await;
    (dir, switches, serve)
}

/// [`start_fresh_with`] the probe [`registry`].
pub async fn start_fresh() -> (tempfile::TempDir, Arc<Switches>, Serve) {
    start_fresh_with(registry).await
}

/// Poll `ready` every virtual millisecond until it holds; panics naming
/// `what` after ten virtual minutes, so a wait that never ends fails.
pub async fn eventually(what: &str, mut ready: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(600), async {
        while !ready() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "still waiting for {what}");
}

/// Poll `ready` once a virtual second, at most `tries` times; whether it held.
pub async fn poll_secs(tries: u32, mut ready: impl AsyncFnMut() -> bool) -> bool {
    for _ in 0..tries {
        if ready().await {
            return true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    false
}

/// The DeploymentActor of `app`/`deployment`, by its registered name.
pub fn deployment_actor(
    serve: &Serve,
    app: &str,
    deployment: &str,
) -> Option<ractor::ActorRef<DeploymentMsg>> {
    let app = AppName::new(app).expect("valid app name");
    let dep = DeploymentName::new(deployment).expect("valid deployment name");
    ractor::ActorRef::<DeploymentMsg>::where_is(flotilla_core::actor_names::deployment(
        serve.namespace(),
        &app,
        &dep,
    ))
}

/// The snapshot of `app`/`deployment` (panics if its actor is not alive).
/// `s`'s deployment is not DEPLOY_FAILED (a replica lost while it started
/// or updated is a startup failure, replaced, not a failed deployment).
pub fn assert_not_deploy_failed(s: &DeploymentSnapshot) {
    assert_ne!(
        s.status.status,
        flotilla::DeploymentStatus::DeployFailed,
        "{:?}",
        s.status
    );
}

pub async fn observe(serve: &Serve, app: &str, deployment: &str) -> DeploymentSnapshot {
    let app = AppName::new(app).expect("valid app name");
    let dep = DeploymentName::new(deployment).expect("valid deployment name");
    flotilla_deployment::observe(serve.namespace(), &app, &dep, Duration::from_secs(5))
        .await
        .expect("the deployment actor answers")
}

/// Poll (every 10 ms of virtual time, at most 10 virtual minutes) until the
/// snapshot of `app`/`deployment` satisfies `pred`.
pub async fn wait_snapshot(
    serve: &Serve,
    app: &str,
    deployment: &str,
    pred: impl Fn(&DeploymentSnapshot) -> bool,
) -> DeploymentSnapshot {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let s = observe(serve, app, deployment).await;
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting on {app}/{deployment}: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wait (in virtual time, at most 10 virtual minutes) until `pred` holds.
pub async fn wait_until(
    serve: &Serve,
    app: &str,
    pred: impl Fn(&ApplicationStatusInfo) -> bool,
) -> ApplicationStatusInfo {
    let Some(mut rx) = serve.watch_status(app) else {
        // Gone (or never there): its status is NOT_STARTED.
        let s = serve.app_status(app);
        assert!(pred(&s), "{app} does not exist: {s:?}");
        return s;
    };
    let fut = async {
        loop {
            {
                let s = rx.borrow_and_update();
                if pred(&s) {
                    return s.clone();
                }
            }
            if rx.changed().await.is_err() {
                // Removed meanwhile: what it is now must still be what was awaited.
                let s = serve.app_status(app);
                assert!(pred(&s), "{app} was removed while awaited: {s:?}");
                return s;
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(600), fut).await {
        Ok(s) => s,
        Err(_) => panic!(
            "timed out waiting on {app}: now {:?}",
            serve.app_status(app)
        ),
    }
}

/// Wait until `app` has `status`.
pub async fn wait_status(
    serve: &Serve,
    app: &str,
    status: ApplicationStatus,
) -> ApplicationStatusInfo {
    wait_until(serve, app, |s| s.status == status).await
}

/// Record every distinct status `app` passes through until `last` is reached.
pub async fn record_statuses(
    serve: &Serve,
    app: &str,
    last: ApplicationStatus,
) -> Vec<ApplicationStatus> {
    let rx = serve.watch_status(app).expect("app exists");
    record_from(rx, serve, app, last).await
}

/// [`record_statuses`] in a task of its own, subscribed before this returns:
/// it sees every status published after the call (each one a watcher is woken
/// for: one overwritten before the task runs is not seen).
pub fn spawn_record_statuses(
    serve: &Serve,
    app: &str,
    last: ApplicationStatus,
) -> tokio::task::JoinHandle<Vec<ApplicationStatus>> {
    let rx = serve.watch_status(app).expect("app exists");
    let (serve, app) = (serve.clone(), app.to_owned());
    tokio::spawn(async move { record_from(rx, &serve, &app, last).await })
}

async fn record_from(
    mut rx: tokio::sync::watch::Receiver<flotilla::ApplicationStatusInfo>,
    serve: &Serve,
    app: &str,
    last: ApplicationStatus,
) -> Vec<ApplicationStatus> {
    let mut seen = Vec::new();
    let fut = async {
        loop {
            let s = rx.borrow_and_update().status;
            if seen.last() != Some(&s) {
                seen.push(s);
            }
            if s == last {
                return;
            }
            if rx.changed().await.is_err() {
                // A closed channel means the application is gone.
                let s = serve.app_status(app).status;
                if seen.last() != Some(&s) {
                    seen.push(s);
                }
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(600), fut)
        .await
        .expect("status sequence completes");
    seen
}
