//! Test support: a deployment whose behaviour is set by its init args and by
//! switches the test holds, and helpers to wait on statuses in virtual time.

#![allow(dead_code)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Duration,
};

use flotilla::{
    ApplicationSpec, ApplicationStatus, ApplicationStatusInfo, Deployment, DeploymentSpec,
    InitContext, Registry, Serve, ServeOptions, UserError,
};
use serde::{Deserialize, Serialize};

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

/// Switches shared by a test and its probes.
#[derive(Debug, Default)]
pub struct Switches {
    /// Constructor calls so far.
    pub constructed: AtomicU32,
    /// Constructor failures so far.
    pub failed: AtomicU32,
    /// Requests handled.
    pub handled: AtomicU32,
    /// When set, health checks fail.
    pub unhealthy: AtomicBool,
    /// reconfigure calls.
    pub reconfigured: AtomicU32,
}

pub struct Probe {
    args: ProbeArgs,
    switches: Arc<Switches>,
    downstream: Option<flotilla::DeploymentHandle>,
}

impl Deployment for Probe {
    type Request = String;
    type Response = String;

    async fn handle(&self, request: String) -> Result<String, UserError> {
        self.switches.handled.fetch_add(1, Ordering::SeqCst);
        if request == "fail" {
            return Err(UserError::new("asked to fail"));
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
        Ok(())
    }

    async fn check_health(&self) -> Result<(), UserError> {
        if self.switches.unhealthy.load(Ordering::SeqCst) {
            Err(UserError::new("probe told to be unhealthy"))
        } else {
            Ok(())
        }
    }
}

async fn construct(ctx: InitContext, switches: Arc<Switches>) -> Result<Probe, UserError> {
    let args: ProbeArgs = ctx.args()?;
    if args.start_delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(args.start_delay_ms)).await;
    }
    let n = switches.constructed.fetch_add(1, Ordering::SeqCst);
    if n < args.fail_constructor {
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

/// A registry with `test::Probe`, bound to `switches`.
pub fn registry(switches: &Arc<Switches>) -> Registry {
    let s = switches.clone();
    Registry::new()
        .register("test::Probe", move |ctx| construct(ctx, s.clone()))
        .expect("valid import path")
}

/// A one-deployment application of probes.
pub fn app(name: &str, replicas: u32, args: ProbeArgs) -> ApplicationSpec {
    ApplicationSpec::builder(name)
        .route_prefix(format!("/{name}"))
        .deployment(
            DeploymentSpec::builder("probe", "test::Probe")
                .init_args(&args)
                .replicas(replicas),
        )
        .build()
        .expect("valid app")
}

/// A Serve on a fresh store in `dir`.
pub async fn start(dir: &tempfile::TempDir, switches: &Arc<Switches>) -> Serve {
    Serve::start(ServeOptions::new(registry(switches)).store_path(dir.path().join("f.redb")))
        .await
        .expect("serve starts")
}

/// Wait (in virtual time, at most 10 virtual minutes) until `pred` holds.
pub async fn wait_until(
    serve: &Serve,
    app: &str,
    pred: impl Fn(&ApplicationStatusInfo) -> bool,
) -> ApplicationStatusInfo {
    let mut rx = serve.watch_status(app).expect("app exists");
    let fut = async {
        loop {
            {
                let s = rx.borrow_and_update();
                if pred(&s) {
                    return s.clone();
                }
            }
            if rx.changed().await.is_err() {
                return serve.app_status(app);
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
    let mut rx = serve.watch_status(app).expect("app exists");
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
