//! The Controller's arguments and state, and recovering the state from the
//! checkpoint.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use flotilla_application::{AppArgs, AppMsg, AppReporter};
use flotilla_cluster::Cluster;
use flotilla_core::{
    AppName, AppRecord, DeploymentName, Faults, RoutePrefix, ServeConfig, actor_names,
};
use flotilla_replica::{Directory, Registry};
use flotilla_store::Snapshot;
use flotilla_supervision::{Children, Parent, RestartPolicy};
use ractor::ActorProcessingErr;
use tracing::{info, warn};

use crate::{
    Checkpoint, ControllerMsg, ControllerSnapshot, LogSettings, Route, RouteTable, StatusBoard,
    config_deploy::ConfigState, messages::InternalMsg, targets::accepted_status,
};

/// A wall clock: [`SystemTime::now`](std::time::SystemTime::now) by default; a
/// test or the simulator gives one of its own so its runs stay reproducible.
pub type WallClock = Arc<dyn Fn() -> std::time::SystemTime + Send + Sync>;

/// Everything a Controller needs; the Supervisor gives the same to each restart.
#[derive(Clone)]
pub struct ControllerArgs {
    /// The Serve instance's namespace.
    pub ns: String,
    /// The checkpoint (the Controller is its only reader and writer).
    pub checkpoint: Checkpoint,
    /// Where code is registered.
    pub registry: Registry,
    /// Routes, shared with handles.
    pub directory: Directory,
    /// Where replicas run.
    pub cluster: Arc<dyn Cluster>,
    /// Published statuses, shared with callers.
    pub board: StatusBoard,
    /// How crashed children restart.
    pub restart: RestartPolicy,
    /// Armed fault points (fault injection; free when unarmed).
    pub faults: Faults,
    /// Logging settings, kept current as targets and configs change.
    pub logging: LogSettings,
    /// The checkpoint as [`Checkpoint::open`] already read it, for the first
    /// Controller.
    pub preloaded: Preloaded,
    /// The wall clock that stamps accepted targets (`last_deployed`).
    pub clock: WallClock,
    /// The published route index (the Controller keeps it current).
    pub route_table: RouteTable,
    /// ApplicationActor restarts after a crash, counted over every
    /// Controller's life (a metric's counter: it must not drop when the
    /// Controller restarts).
    pub app_restarts: Arc<AtomicU64>,
    /// Set by the Controller that takes the shutdown, for every Controller
    /// after it: one restarted during the drain (which goes on without its
    /// predecessor) refuses every call and starts nothing, as it would have.
    pub shutdown: Arc<AtomicBool>,
}

/// A checkpoint already read (the open reads it, to fail before spawning
/// anything): the first Controller takes it instead of reading the file again;
/// every restart reads the file, the only truth after a crash.
#[derive(Clone, Default)]
pub struct Preloaded(Arc<std::sync::Mutex<Option<Snapshot>>>);

impl Preloaded {
    /// Hand `snapshot` to the first Controller.
    pub fn new(snapshot: Snapshot) -> Self {
        Preloaded(Arc::new(std::sync::Mutex::new(Some(snapshot))))
    }

    /// The snapshot, once; `None` afterwards (or if the lock was poisoned).
    fn take(&self) -> Option<Snapshot> {
        self.0.lock().ok().and_then(|mut s| s.take())
    }
}

/// One application's durable target, as last committed.
pub(crate) struct AppEntry {
    pub(crate) record: AppRecord,
}

/// The Controller's state: the durable targets (as last committed) and the
/// living children.
pub struct ControllerState {
    pub(crate) args: ControllerArgs,
    pub(crate) apps: HashMap<AppName, AppEntry>,
    /// The ApplicationActors, supervised.
    pub(crate) actors: Children<AppName, AppMsg>,
    pub(crate) routes: HashMap<RoutePrefix, AppName>,
    /// Durable autoscaling decisions, by application then deployment.
    pub(crate) autoscaled: HashMap<AppName, BTreeMap<DeploymentName, u32>>,
    /// Finished deletions (name, generation) whose records await removal.
    pub(crate) removals: BTreeMap<AppName, u64>,
    /// Set while a retry of a failed removal commit is scheduled: how many
    /// tries in a row failed (the wait grows with them, `REMOVAL_BACKOFF`).
    pub(crate) removal_retry: Option<u32>,
    /// The last applied config (durable) and the builds it started (volatile).
    pub(crate) config: ConfigState,
    /// How every ApplicationActor reports here (one, shared by all of them).
    app_reporter: AppReporter,
}

impl std::ops::Deref for ControllerState {
    type Target = ControllerArgs;
    fn deref(&self) -> &ControllerArgs {
        &self.args
    }
}

impl ControllerState {
    /// The state recovered from the checkpoint (the preloaded snapshot for the
    /// first Controller, the file for every restart). Statuses are volatile:
    /// every recovered target's is published now (DEPLOYING, or DELETING for a
    /// deletion), so callers see every application as soon as `start` returns.
    pub(crate) fn recover(mut args: ControllerArgs) -> Result<ControllerState, ActorProcessingErr> {
        args.checkpoint = args.checkpoint.claim();
        let snapshot = match args.preloaded.take() {
            Some(snapshot) => snapshot,
            None => args.checkpoint.load()?,
        };
        let config = snapshot.config::<ServeConfig>()?;
        // Written by an earlier Flotilla, a config may break a rule added
        // since. Its applications run from their own records, which were
        // validated when accepted; the config stays the applied one, shown
        // as it is, until the next is applied (a build it still owes fails
        // its own validation, naming the field).
        if let Some(Err(e)) = config.as_ref().map(ServeConfig::validate) {
            warn!(error = %e,
                "the applied config in the checkpoint does not pass today's checks (an earlier \
                 Flotilla accepted it): its applications keep running; apply a corrected config");
        }
        args.logging
            .set_config_global(config.as_ref().and_then(|c| c.logging_config.clone()));
        let mut apps = HashMap::with_capacity(snapshot.apps.len());
        let mut routes = HashMap::new();
        let mut table = Vec::new();
        for record in snapshot.apps {
            let name = record.spec.name.clone();
            args.logging.set_target(&record.spec);
            args.board.sender(&name, Some(&record.spec.ingress), || {
                accepted_status(&record)
            });
            if !record.deleting
                && let Some(p) = &record.spec.route_prefix
            {
                routes.insert(p.clone(), name.clone());
                table.push(Route {
                    prefix: p.clone(),
                    app: name.clone(),
                    ingress: record.spec.ingress.clone(),
                });
            }
            apps.insert(name, AppEntry { record });
        }
        args.route_table.replace_all(table);
        // Every deployment this Controller runs: other processes may drop
        // their copies of any other route. Not those of an application being
        // deleted: after a restart of the head nothing closes their routes
        // (their DeploymentActors are gone with it), and after a restart of
        // the Controller alone their open routes are still published.
        args.cluster.deployments_recovered(
            &mut apps.values().filter(|e| !e.record.deleting).flat_map(|e| {
                let app = &e.record.spec.name;
                (e.record.spec.deployments.iter()).map(|d| (app.clone(), d.name.clone()))
            }),
        );
        // The board outlives Controller crashes: an application whose record a
        // predecessor removed just before it crashed must not linger on it (its
        // stale generation would also hide a new application of the same name).
        // An application the config names but has not built yet stays: the
        // builds resume at once.
        let named = config.as_ref().map(ServeConfig::by_name);
        let stale = args.board.retain(|name, status| {
            apps.contains_key(name)
                || (status.observed_generation == 0
                    && named
                        .as_ref()
                        .is_some_and(|n| n.contains_key(name.as_str())))
        });
        drop(named);
        if stale > 0 {
            info!(
                stale,
                "removed applications whose records are gone from the board"
            );
        }
        let mut autoscaled: HashMap<AppName, BTreeMap<DeploymentName, u32>> = HashMap::new();
        for (app, dep, rec) in snapshot.deployments {
            if let Some(n) = rec.autoscaled_replicas {
                autoscaled.entry(app).or_default().insert(dep, n);
            }
        }
        info!(
            apps = apps.len(),
            "controller recovered targets from the checkpoint"
        );
        let controller: Parent<ControllerMsg> = Parent::new(actor_names::controller(&args.ns));
        Ok(ControllerState {
            app_reporter: Arc::new(move |event| {
                controller.cast(InternalMsg::App(event).into());
            }),
            args,
            actors: Children::with_capacity(apps.len()),
            apps,
            routes,
            autoscaled,
            removals: BTreeMap::new(),
            removal_retry: None,
            config: ConfigState::recovered(config),
        })
    }

    /// Whether a Controller (this one or one before it) took the shutdown.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// What `Serve::metrics` reports of the Controller.
    pub(crate) fn snapshot(&self) -> ControllerSnapshot {
        ControllerSnapshot {
            apps: self.apps.len(),
            deleting: self.apps.values().filter(|e| e.record.deleting).count(),
            app_actors: self.actors.living(),
            app_restarts: self.app_restarts.load(Ordering::Relaxed),
            store: self.checkpoint.counters(),
        }
    }

    /// The message that gives an ApplicationActor `record` as its target, with
    /// the replica decisions that stand for it.
    pub(crate) fn set_target(&self, record: &AppRecord) -> AppMsg {
        AppMsg::SetTarget {
            record: Box::new(record.clone()),
            decisions: self.decisions(&record.spec.name),
            build_failure: self
                .config
                .build_failure(&record.spec.name, record.generation),
        }
    }

    /// The durable replica decisions of `app`'s deployments.
    fn decisions(&self, app: &AppName) -> BTreeMap<DeploymentName, u32> {
        self.autoscaled.get(app).cloned().unwrap_or_default()
    }

    /// What a (re)started ApplicationActor of `record` gets.
    pub(crate) fn app_args(&self, record: &AppRecord) -> AppArgs {
        let a = &self.args;
        AppArgs {
            ns: a.ns.clone(),
            record: record.clone(),
            registry: a.registry.clone(),
            directory: a.directory.clone(),
            cluster: a.cluster.clone(),
            status: self
                .board
                .sender(&record.spec.name, Some(&record.spec.ingress), || {
                    accepted_status(record)
                }),
            reporter: self.app_reporter.clone(),
            restart: a.restart,
            faults: a.faults.clone(),
            autoscaled: self.decisions(&record.spec.name),
            build_failure: self
                .config
                .build_failure(&record.spec.name, record.generation),
        }
    }
}
