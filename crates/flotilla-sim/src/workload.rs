//! The simulated user code: `sim::Worker`, a deployment whose constructor sleeps a
//! seeded start latency and fails at a rate (always, for broken applications),
//! whose health checks flap on command, and whose requests sleep the latency
//! they ask for (calling the next deployment of the chain first).
//!
//! Its shared [`World`] holds the switches the event schedule flips and the
//! counters the summary reports (Flotilla's metrics do not count constructor
//! calls or replicas started, so the code counts itself).
//!
//! The same code runs under two import paths: [`WORKER`] for the imperative
//! workload (its init args name its application's index) and
//! [`DECLARED_WORKER`] for applications built from a ServeConfig (their builder
//! is not told the application's name, so the replica finds its index by name
//! in the world's [`AppNames`]).

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use flotilla::{
    ApplicationSpec, Args, Deployment, DeploymentHandle, DeploymentSpec, InitContext, Registry,
    Resources, UserError,
};
use serde::{Deserialize, Serialize};

use crate::{Result, SetupError, names::AppNames, rng, scenario::WorkloadSpec};

/// The import path of [`Worker`] in the imperative workload ([`WorkerArgs`]).
pub const WORKER: &str = "sim::Worker";

/// The import path of [`Worker`] in applications built from a ServeConfig
/// ([`DeclaredWorkerArgs`]).
pub const DECLARED_WORKER: &str = "sim::DeclaredWorker";

/// The name of application `idx`.
pub fn app_name(idx: u32) -> String {
    format!("app-{idx:05}")
}

/// The index in an application name made by [`app_name`].
pub fn app_index(name: &str) -> Option<u32> {
    name.strip_prefix("app-")?.parse().ok()
}

/// The name of deployment `idx` of an application (`d0` is the ingress).
pub fn deployment_name(idx: u32) -> String {
    format!("d{idx}")
}

/// A [`Worker`]'s init args (part of its code version).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerArgs {
    /// Application index.
    pub app: u32,
    /// Deployment index within the application.
    pub deployment: u32,
    /// Deployments in the chain.
    pub chain: u32,
    /// Code tag: changing it is a code change (replicas roll).
    pub tag: String,
    /// Broken code: the constructor always fails.
    pub broken: bool,
}

/// A [`Worker`]'s init args in an application built from a ServeConfig (part of
/// its code version). Its application is the one it is deployed in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeclaredWorkerArgs {
    /// Deployment index within the application.
    pub deployment: u32,
    /// Deployments in the chain.
    pub chain: u32,
    /// Code tag: changing it is a code change (replicas roll).
    pub tag: String,
    /// Broken code: the constructor always fails.
    pub broken: bool,
}

/// Who a replica is: its application's index and its place in the chain.
#[derive(Debug, Clone, Copy)]
struct Identity {
    app: u32,
    deployment: u32,
    chain: u32,
    broken: bool,
}

/// A request: run for `ms` milliseconds (split over the chain).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Work {
    /// Milliseconds of virtual time to spend.
    pub ms: u64,
}

/// Counters kept by the simulated code (cumulative over the whole run, across
/// process restarts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldCounters {
    /// Constructor calls that finished (succeeded or failed).
    pub constructor_calls: u64,
    /// Constructor calls that failed (injected or broken code).
    pub constructor_failures: u64,
    /// Constructors that succeeded: replicas started.
    pub started: u64,
    /// Health checks run.
    pub health_checks: u64,
    /// Health checks that failed (flapping).
    pub health_failures: u64,
    /// Requests handled by a replica (every hop of a chain counts).
    pub handled: u64,
    /// User configs taken in place (`reconfigure` calls).
    pub reconfigures: u64,
}

/// What the simulated code shares with the simulation: switches and counters.
#[derive(Debug)]
pub struct World {
    seed: u64,
    median: f64,
    sigma: f64,
    max: f64,
    flap_rate: f64,
    failure_rate: AtomicU64,
    any_flapping: AtomicBool,
    flapping: Mutex<BTreeSet<u32>>,
    ordinals: Mutex<HashMap<(u32, u32), u64>>,
    constructing: AtomicI64,
    constructor_calls: AtomicU64,
    constructor_failures: AtomicU64,
    started: AtomicU64,
    health_checks: AtomicU64,
    health_failures: AtomicU64,
    handled: AtomicU64,
    reconfigures: AtomicU64,
    names: Arc<AppNames>,
}

impl World {
    /// A world for `spec`'s code under `seed`.
    pub fn new(seed: u64, spec: &WorkloadSpec) -> Self {
        World {
            seed,
            median: spec.start_latency.median.as_secs_f64(),
            sigma: spec.start_latency.sigma,
            max: spec.start_latency.max.as_secs_f64(),
            flap_rate: spec.flap_failure_rate,
            failure_rate: AtomicU64::new(spec.constructor_failure_rate.to_bits()),
            any_flapping: AtomicBool::new(false),
            flapping: Mutex::new(BTreeSet::new()),
            ordinals: Mutex::new(HashMap::new()),
            constructing: AtomicI64::new(0),
            constructor_calls: AtomicU64::new(0),
            constructor_failures: AtomicU64::new(0),
            started: AtomicU64::new(0),
            health_checks: AtomicU64::new(0),
            health_failures: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            reconfigures: AtomicU64::new(0),
            names: Arc::new(AppNames::new()),
        }
    }

    /// The application names and their indexes.
    pub fn names(&self) -> &Arc<AppNames> {
        &self.names
    }

    /// Set the chance that a constructor call fails.
    pub fn set_failure_rate(&self, rate: f64) {
        self.failure_rate
            .store(rate.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    /// The chance that a constructor call fails now.
    pub fn failure_rate(&self) -> f64 {
        f64::from_bits(self.failure_rate.load(Ordering::Relaxed))
    }

    /// Make the health checks of `apps` flap (`on`) or stop flapping.
    pub fn set_flapping(&self, apps: &[u32], on: bool) {
        let mut set = self.flapping.lock().unwrap_or_else(|p| p.into_inner());
        for a in apps {
            if on {
                set.insert(*a);
            } else {
                set.remove(a);
            }
        }
        self.any_flapping.store(!set.is_empty(), Ordering::Release);
    }

    fn is_flapping(&self, app: u32) -> bool {
        self.any_flapping.load(Ordering::Acquire)
            && self
                .flapping
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&app)
    }

    fn next_ordinal(&self, app: u32, deployment: u32) -> u64 {
        let mut m = self.ordinals.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry((app, deployment)).or_insert(0);
        *n += 1;
        *n
    }

    /// Constructors running now (replicas STARTING).
    pub fn constructing(&self) -> u64 {
        self.constructing.load(Ordering::Relaxed).max(0) as u64
    }

    /// The counters so far.
    pub fn counters(&self) -> WorldCounters {
        WorldCounters {
            constructor_calls: self.constructor_calls.load(Ordering::Relaxed),
            constructor_failures: self.constructor_failures.load(Ordering::Relaxed),
            started: self.started.load(Ordering::Relaxed),
            health_checks: self.health_checks.load(Ordering::Relaxed),
            health_failures: self.health_failures.load(Ordering::Relaxed),
            handled: self.handled.load(Ordering::Relaxed),
            reconfigures: self.reconfigures.load(Ordering::Relaxed),
        }
    }
}

/// Counts a constructor in progress, even if its future is dropped (the replica
/// was killed mid-start).
struct Constructing(Arc<World>);

impl Drop for Constructing {
    fn drop(&mut self) {
        self.0.constructing.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The simulated deployment.
pub struct Worker {
    world: Arc<World>,
    app: u32,
    deployment: u32,
    ordinal: u64,
    chain: u32,
    checks: AtomicU32,
    downstream: Option<DeploymentHandle>,
}

impl Deployment for Worker {
    type Request = Work;
    type Response = u64;

    async fn handle(&self, work: Work) -> Result<u64, UserError> {
        self.world.handled.fetch_add(1, Ordering::Relaxed);
        let share = work.ms / u64::from(self.chain.max(1));
        if share > 0 {
            tokio::time::sleep(Duration::from_millis(share)).await;
        }
        if let Some(next) = &self.downstream {
            next.call::<_, u64>(&work)
                .await
                .map_err(|e| UserError::new(format!("downstream: {e}")))?;
        }
        Ok(work.ms)
    }

    async fn reconfigure(&self, _user_config: Args) -> Result<(), UserError> {
        self.world.reconfigures.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn check_health(&self) -> Result<(), UserError> {
        let w = &self.world;
        w.health_checks.fetch_add(1, Ordering::Relaxed);
        let n = self.checks.fetch_add(1, Ordering::Relaxed);
        if w.is_flapping(self.app) {
            let mut r = rng::Rng::keyed(
                w.seed,
                &[
                    rng::label("health"),
                    u64::from(self.app),
                    u64::from(self.deployment),
                    self.ordinal,
                    u64::from(n),
                ],
            );
            if r.chance(w.flap_rate) {
                w.health_failures.fetch_add(1, Ordering::Relaxed);
                return Err(UserError::new("simulated health check failure (flapping)"));
            }
        }
        Ok(())
    }
}

/// Start a replica of the imperative workload.
async fn construct(ctx: InitContext, world: Arc<World>) -> Result<Worker, UserError> {
    let args: WorkerArgs = ctx.args()?;
    let id = Identity {
        app: args.app,
        deployment: args.deployment,
        chain: args.chain,
        broken: args.broken,
    };
    start(ctx, world, id).await
}

/// Start a replica of an application built from a ServeConfig.
async fn construct_declared(ctx: InitContext, world: Arc<World>) -> Result<Worker, UserError> {
    let args: DeclaredWorkerArgs = ctx.args()?;
    let app = world.names.index(ctx.app.as_str()).ok_or_else(|| {
        UserError::new(format!(
            "application '{}' has no index in the simulation",
            ctx.app
        ))
    })?;
    let id = Identity {
        app,
        deployment: args.deployment,
        chain: args.chain,
        broken: args.broken,
    };
    start(ctx, world, id).await
}

/// The constructor proper: a seeded start latency, then a failure at the
/// world's rate (always, for broken code), else a replica.
async fn start(ctx: InitContext, world: Arc<World>, id: Identity) -> Result<Worker, UserError> {
    world.constructing.fetch_add(1, Ordering::Relaxed);
    let guard = Constructing(world.clone());
    let ordinal = world.next_ordinal(id.app, id.deployment);
    let mut r = rng::Rng::keyed(
        world.seed,
        &[
            rng::label("constructor"),
            u64::from(id.app),
            u64::from(id.deployment),
            ordinal,
        ],
    );
    let latency = r.lognormal(world.median, world.sigma).min(world.max);
    tokio::time::sleep(Duration::from_secs_f64(latency.max(0.0))).await;
    let fail = r.chance(world.failure_rate());
    drop(guard);
    world.constructor_calls.fetch_add(1, Ordering::Relaxed);
    if id.broken || fail {
        world.constructor_failures.fetch_add(1, Ordering::Relaxed);
        return Err(UserError::new(if id.broken {
            "broken code: the model file this version loads does not exist"
        } else {
            "simulated constructor failure"
        }));
    }
    let downstream = if id.deployment + 1 < id.chain {
        Some(ctx.handle(&deployment_name(id.deployment + 1))?)
    } else {
        None
    };
    world.started.fetch_add(1, Ordering::Relaxed);
    Ok(Worker {
        world,
        app: id.app,
        deployment: id.deployment,
        ordinal,
        chain: id.chain,
        checks: AtomicU32::new(0),
        downstream,
    })
}

/// A registry holding [`Worker`] bound to `world`, under [`WORKER`] and
/// [`DECLARED_WORKER`].
pub fn registry(world: &Arc<World>) -> Result<Registry> {
    let w = world.clone();
    let d = world.clone();
    Registry::new()
        .register(WORKER, move |ctx| construct(ctx, w.clone()))
        .and_then(|r| {
            r.register(DECLARED_WORKER, move |ctx| {
                construct_declared(ctx, d.clone())
            })
        })
        .map_err(|source| {
            SetupError::Register {
                what: "the simulated code",
                source: Box::new(source),
            }
            .into()
        })
}

/// What an application should be: its code tag, replica count, and whether its
/// code is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppTarget {
    /// Code tag.
    pub tag: String,
    /// Replicas per deployment.
    pub replicas: u32,
    /// Broken code (must end DEPLOY_FAILED).
    pub broken: bool,
}

/// The spec of application `idx` at `target`: a chain of `spec.deployments`
/// Workers, route `/{name}`.
pub fn app_spec(spec: &WorkloadSpec, idx: u32, target: &AppTarget) -> Result<ApplicationSpec> {
    let name = app_name(idx);
    let chain = spec.deployments as u32;
    let mut b = ApplicationSpec::builder(name.clone()).route_prefix(format!("/{name}"));
    for d in 0..chain {
        let args = WorkerArgs {
            app: idx,
            deployment: d,
            chain,
            tag: target.tag.clone(),
            broken: target.broken,
        };
        b = b.deployment(worker_deployment(spec, d, WORKER, &args, target.replicas));
    }
    b.ingress(deployment_name(0)).build().map_err(|source| {
        SetupError::App {
            name,
            source: Box::new(source),
        }
        .into()
    })
}

/// Deployment `d` of a chain: `import_path` with `args`, `replicas` replicas,
/// the workload's resources and health check period.
pub fn worker_deployment(
    spec: &WorkloadSpec,
    d: u32,
    import_path: &str,
    args: &impl Serialize,
    replicas: u32,
) -> flotilla_core::DeploymentSpecBuilder {
    let resources = Resources::none()
        .with_cpus(spec.replica_cpus)
        .with_memory(spec.replica_memory_mib.saturating_mul(1 << 20));
    let period = spec.health_check_period;
    DeploymentSpec::builder(deployment_name(d), import_path)
        .init_args(args)
        .replicas(replicas)
        .with_config(move |c| {
            let timeout = c.health_check_timeout;
            c.with_resources(resources)
                .with_health_check(period, timeout)
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_round_trip_and_specs_build() {
        assert_eq!(app_index(&app_name(42)), Some(42));
        assert_eq!(app_index("other"), None);
        let spec = WorkloadSpec {
            deployments: 3,
            ..Default::default()
        };
        let t = AppTarget {
            tag: "v1".into(),
            replicas: 2,
            broken: false,
        };
        let app = app_spec(&spec, 7, &t).unwrap();
        assert_eq!(app.name.as_str(), "app-00007");
        assert_eq!(app.deployments.len(), 3);
        assert_eq!(app.ingress.as_str(), "d0");
        let other = app_spec(
            &spec,
            7,
            &AppTarget {
                tag: "v2".into(),
                ..t
            },
        )
        .unwrap();
        assert_ne!(
            app.deployments[0].version().code,
            other.deployments[0].version().code
        );
    }
}
