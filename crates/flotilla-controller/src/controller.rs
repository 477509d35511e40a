//! The Controller actor: durable targets, the checkpoint protocol, and the
//! ApplicationActors below it.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use flotilla_application::{AppArgs, AppEvent, AppMsg, AppReporter, ApplicationActor};
use flotilla_core::{
    ApiType, AppName, AppRecord, ApplicationSpec, DeploymentName, DeploymentRecord, FaultPoint,
    Faults, ReplicaCount, RoutePrefix, ServeConfig, naming,
};
use flotilla_deployment::Cluster;
use flotilla_replica::{
    Directory, Registry,
    supervision::{Parent, RestartLog, RestartPolicy, child_exit, watch},
};
use flotilla_store::{Batch, Snapshot, Store};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tracing::{info, warn};

use crate::config_deploy::ConfigState;
use crate::targets::accepted_status;
use crate::{ControllerMsg, ControllerSnapshot, ServeError, StatusBoard, validate::validate_batch};

/// Delay before retrying a spawn whose name is still held by a stopping actor, or a
/// failed commit of a finished deletion.
const RETRY: Duration = Duration::from_millis(10);

/// Everything a Controller needs; the Supervisor gives the same to each restart.
#[derive(Clone)]
pub struct ControllerArgs {
    /// The Serve instance's namespace.
    pub ns: String,
    /// The checkpoint store (the Controller is its only writer).
    pub store: Arc<Store>,
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
    pub logging: crate::LogSettings,
    /// The checkpoint as the caller already read it, for the first Controller.
    pub preloaded: Preloaded,
    /// The wall clock that stamps accepted targets (`last_deployed`).
    pub clock: WallClock,
    /// The published route index (the Controller keeps it current).
    pub route_table: crate::RouteTable,
}

/// A wall clock: [`SystemTime::now`](std::time::SystemTime::now) by default; a
/// test or the simulator gives one of its own so its runs stay reproducible.
pub type WallClock = Arc<dyn Fn() -> std::time::SystemTime + Send + Sync>;

/// A checkpoint already read (`Serve::start` reads it to fail before spawning
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

/// The controller actor.
pub struct Controller;

pub(crate) struct AppEntry {
    pub(crate) record: AppRecord,
    pub(crate) actor: Option<ActorRef<AppMsg>>,
    pub(crate) restarts: RestartLog,
    pub(crate) restart_pending: bool,
}

/// The Controller's state: the durable targets (as last committed) and the living
/// children.
pub struct ControllerState {
    pub(crate) args: ControllerArgs,
    pub(crate) apps: HashMap<AppName, AppEntry>,
    pub(crate) routes: HashMap<RoutePrefix, AppName>,
    /// Durable autoscaling decisions, by application then deployment.
    pub(crate) autoscaled: HashMap<AppName, BTreeMap<DeploymentName, u32>>,
    by_actor: HashMap<ActorId, AppName>,
    /// Finished deletions (name, generation) whose records await removal.
    removals: Vec<(AppName, u64)>,
    app_restarts: u64,
    shutting_down: bool,
    /// The last applied config (durable) and the builds it started (volatile).
    pub(crate) config: ConfigState,
    /// How every ApplicationActor reports here (one, shared by all of them).
    app_reporter: AppReporter,
}

impl ControllerState {
    /// What `Serve::metrics` reports of the Controller.
    fn snapshot(&self) -> ControllerSnapshot {
        ControllerSnapshot {
            apps: self.apps.len(),
            deleting: self.apps.values().filter(|e| e.record.deleting).count(),
            app_actors: self.apps.values().filter(|e| e.actor.is_some()).count(),
            app_restarts: self.app_restarts,
        }
    }

    fn app_args(&self, record: &AppRecord) -> AppArgs {
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
            autoscaled: self
                .autoscaled
                .get(&record.spec.name)
                .cloned()
                .unwrap_or_default(),
            build_failure: self
                .config
                .build_failure(&record.spec.name, record.generation),
        }
    }

    fn board(&self) -> &StatusBoard {
        &self.args.board
    }
}

impl std::ops::Deref for ControllerState {
    type Target = ControllerArgs;
    fn deref(&self) -> &ControllerArgs {
        &self.args
    }
}

/// Commit `batch` with the fault points around it. `Err` is an injected crash;
/// `Ok(Err)` is the store's refusal, for the caller to report (nothing changed).
pub(crate) async fn commit(
    state: &ControllerState,
    batch: Batch,
) -> Result<Result<(), flotilla_store::StoreError>, ActorProcessingErr> {
    fault(&state.faults, FaultPoint::ControllerBeforeCommit)?;
    let result = store_commit(&state.store, batch).await?;
    if result.is_ok() {
        fault(&state.faults, FaultPoint::ControllerAfterCommit)?;
    }
    Ok(result)
}

/// Stage with `stage`, then commit what it wrote: `Ok(Ok(staged))` once durable,
/// `Ok(Err)` when refused (nothing changed; the caller replies it), `Err` an
/// injected crash.
pub(crate) async fn stage_and_commit<T>(
    state: &ControllerState,
    stage: impl FnOnce(&ControllerState, &mut Batch) -> Result<T, flotilla_store::StoreError>,
) -> Result<Result<T, ServeError>, ActorProcessingErr> {
    let mut batch = Batch::new();
    let staged = match stage(state, &mut batch) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e.into())),
    };
    Ok(commit(state, batch)
        .await?
        .map(|()| staged)
        .map_err(ServeError::from))
}

/// Commit `batch` and wait for it; the Controller handles nothing else
/// meanwhile (the protocol's order holds). On a multi-thread runtime the fsync
/// runs on a blocking thread, so it does not hold a worker its children's actors
/// could use. On a current-thread runtime there is no other worker to free, and
/// committing inline keeps a paused-time run (tests, the simulator) a pure
/// function of its seed: a blocking thread would finish at a wall-clock moment.
/// A panic inside the store crashes the Controller (`Err`), whose successor
/// recovers.
pub(crate) async fn store_commit(
    store: &Arc<Store>,
    batch: Batch,
) -> Result<Result<(), flotilla_store::StoreError>, ActorProcessingErr> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::CurrentThread {
        return Ok(store.commit(&batch));
    }
    let store = store.clone();
    tokio::task::spawn_blocking(move || store.commit(&batch))
        .await
        .map_err(|e| format!("checkpoint commit did not finish: {e}").into())
}

/// After `Shutdown`, mutating calls are refused and internal messages dropped, so
/// nothing new starts while the tree drains; `Observe` still tells the truth.
fn refuse_after_shutdown(state: &ControllerState, msg: ControllerMsg) {
    let gone = || ServeError::Unavailable("flotilla is shutting down".into());
    match msg {
        ControllerMsg::Deploy { reply, .. } => {
            let _ = reply.send(Err(gone()));
        }
        ControllerMsg::Delete { reply, .. } => {
            let _ = reply.send(Err(gone()));
        }
        ControllerMsg::ApplyConfig { reply, .. } => {
            let _ = reply.send(Err(gone()));
        }
        ControllerMsg::Observe(reply) => {
            let _ = reply.send(state.snapshot());
        }
        ControllerMsg::AppliedConfig(reply) => {
            let _ = reply.send(state.config.applied().cloned());
        }
        ControllerMsg::Shutdown(reply) => {
            let _ = reply.send(());
        }
        ControllerMsg::App(_)
        | ControllerMsg::BuildDone { .. }
        | ControllerMsg::RestartApp(_)
        | ControllerMsg::RemoveDeleted => {}
    }
}

/// Crash the Controller here if `point` is armed.
pub(crate) fn fault(faults: &Faults, point: FaultPoint) -> Result<(), ActorProcessingErr> {
    if faults.hit(point) {
        return Err(format!("injected fault: {point:?}").into());
    }
    Ok(())
}

impl Controller {
    /// Start or update the ApplicationActor of `name` with its current record.
    pub(crate) async fn command(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: &AppName,
    ) {
        let Some(entry) = state.apps.get_mut(name) else {
            return;
        };
        if let Some(actor) = &entry.actor {
            let target = AppMsg::SetTarget(Box::new(entry.record.clone()));
            if actor.cast(target).is_ok() {
                return;
            }
            // It is gone (its exit event may still be queued): start another.
            state.by_actor.remove(&actor.get_id());
            entry.actor = None;
        }
        if entry.restart_pending {
            return;
        }
        let record = entry.record.clone();
        let args = state.app_args(&record);
        let actor_name = naming::application(&state.ns, name);
        // Boxed: inline, the child's start-up future would sit in every message's
        // future of this actor (and its task's allocation) for its whole life.
        let spawn = Box::pin(Actor::spawn(
            Some(actor_name.clone()),
            ApplicationActor,
            args,
        ));
        let actor = match spawn.await {
            Ok((actor, _)) => actor,
            // The name is held by a living actor we do not watch (an adoption that
            // timed out, or a predecessor still stopping): adopt it if it lives.
            Err(e) => match ActorRef::<AppMsg>::where_is(actor_name) {
                Some(actor) => {
                    let record = state.apps.get(name).map(|e| e.record.clone());
                    if let Some(r) = record {
                        let _ = actor.cast(AppMsg::SetTarget(Box::new(r)));
                    }
                    actor
                }
                None => {
                    warn!(app = %name, error = %e, "could not start application actor; retrying");
                    Self::restart_later(myself, state, name.clone(), RETRY);
                    return;
                }
            },
        };
        if !watch(&myself.get_cell(), &actor.get_cell()) {
            // Already gone (a finished deletion): its Deleted report is on its way.
            Self::restart_later(myself, state, name.clone(), RETRY);
            return;
        }
        state.by_actor.insert(actor.get_id(), name.clone());
        if let Some(e) = state.apps.get_mut(name) {
            e.actor = Some(actor);
        }
    }

    fn restart_later(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: AppName,
        after: Duration,
    ) {
        if let Some(e) = state.apps.get_mut(&name) {
            e.restart_pending = true;
        }
        myself.send_after(after, move || ControllerMsg::RestartApp(name));
    }

    /// Validate -> apply to a copy -> one commit -> swap in -> reply -> command.
    async fn deploy(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        apps: Vec<ApplicationSpec>,
        api_type: ApiType,
        reply: RpcReplyPort<Result<Vec<u64>, ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        if let Err(e) = validate_batch(&apps, &state.registry, &state.routes) {
            let _ = reply.send(Err(e));
            return Ok(());
        }
        let records: Vec<AppRecord> = apps
            .into_iter()
            .map(|spec| state.next_record(spec, api_type, None))
            .collect();
        // An imperative deploy takes its applications out of the config's hands.
        let released = state.config.without(records.iter().map(|r| &r.spec.name));
        let staged = stage_and_commit(state, |s, batch| {
            if let Some(config) = &released {
                batch.put_config(config)?;
            }
            s.stage_targets(&records, batch)
        })
        .await?;
        let dropped = match staged {
            Ok(d) => d,
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        let generations = records.iter().map(|r| r.generation).collect();
        if let Some(config) = released {
            state.release_config(config);
        }
        let names = state.swap_targets(records, dropped);
        let _ = reply.send(Ok(generations));
        fault(&state.faults, FaultPoint::ControllerAfterReply)?;
        for name in &names {
            Self::command(myself, state, name).await;
        }
        // A config build parked behind a prefix this deploy took now fails.
        Self::settle_parked(myself, state).await
    }

    async fn delete(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        names: Vec<AppName>,
        reply: RpcReplyPort<Result<Vec<Option<u64>>, ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        let result = names
            .iter()
            .map(|n| {
                state
                    .apps
                    .get(n)
                    .map(|e| e.record.generation + u64::from(!e.record.deleting))
            })
            .collect();
        // A delete takes its applications out of the config's hands.
        let released = state.config.without(names.iter());
        let staged = stage_and_commit(state, |s, batch| {
            if let Some(config) = &released {
                batch.put_config(config)?;
            }
            s.stage_deletions(&names, batch)
        })
        .await?;
        let changed = match staged {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        if let Some(config) = released {
            state.release_config(config);
        }
        state.swap_deletions(&changed);
        let _ = reply.send(Ok(result));
        fault(&state.faults, FaultPoint::ControllerAfterReply)?;
        for r in &changed {
            Self::command(myself, state, &r.spec.name).await;
        }
        // The deletions released prefixes parked config builds may wait for.
        Self::settle_parked(myself, state).await
    }

    /// Make an autoscaling decision durable (one commit), then hand it to the
    /// application. Decisions for unknown, deleting or no longer autoscaled
    /// deployments are dropped.
    async fn autoscale(
        state: &mut ControllerState,
        app: AppName,
        deployment: DeploymentName,
        replicas: u32,
    ) -> Result<(), ActorProcessingErr> {
        let Some(entry) = state.apps.get(&app) else {
            return Ok(());
        };
        let Some(ReplicaCount::Auto(a)) = entry
            .record
            .spec
            .deployment(deployment.as_str())
            .map(|d| &d.config.num_replicas)
        else {
            return Ok(());
        };
        if entry.record.deleting {
            return Ok(());
        }
        let replicas = replicas.clamp(a.min_replicas, a.max_replicas);
        let current = state.autoscaled.get(&app).and_then(|m| m.get(&deployment));
        if current == Some(&replicas) {
            return Ok(());
        }
        let mut batch = Batch::new();
        batch.put_deployment(
            &app,
            &deployment,
            &DeploymentRecord {
                autoscaled_replicas: Some(replicas),
            },
        )?;
        if let Err(e) = store_commit(&state.store, batch).await? {
            // Not durable, so not applied: the autoscaler decides again next tick.
            warn!(app = %app, deployment = %deployment, error = %e, "autoscaling decision not committed");
            return Ok(());
        }
        info!(app = %app, deployment = %deployment, replicas, "autoscaling decision committed");
        state
            .autoscaled
            .entry(app.clone())
            .or_default()
            .insert(deployment.clone(), replicas);
        if let Some(actor) = state.apps.get(&app).and_then(|e| e.actor.as_ref()) {
            let _ = actor.cast(AppMsg::SetReplicas(deployment, replicas));
        }
        Ok(())
    }

    /// The ApplicationActor finished deleting: its record is removed with the
    /// other deletions finished by then, in one commit ([`Self::remove_deleted`]).
    fn deleted(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: AppName,
        generation: u64,
    ) {
        if state.removals.is_empty() {
            let _ = myself.cast(ControllerMsg::RemoveDeleted);
        }
        state.removals.push((name, generation));
    }

    /// Remove the records of the finished deletions that still stand (a redeploy
    /// may have cancelled one since): one commit for them all.
    async fn remove_deleted(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        let mut done: Vec<AppName> = std::mem::take(&mut state.removals)
            .into_iter()
            .filter(|(name, generation)| {
                state
                    .apps
                    .get(name)
                    .is_some_and(|e| e.record.deleting && e.record.generation == *generation)
            })
            .map(|(name, _)| name)
            .collect();
        done.sort();
        done.dedup();
        if done.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new();
        for name in &done {
            batch.delete_app(name);
        }
        if let Err(err) = store_commit(&state.store, batch).await? {
            warn!(apps = done.len(), error = %err, "could not remove deleted applications; retrying");
            for name in done {
                if let Some(e) = state.apps.get(&name) {
                    let generation = e.record.generation;
                    state.removals.push((name, generation));
                }
            }
            myself.send_after(RETRY, || ControllerMsg::RemoveDeleted);
            return Ok(());
        }
        for name in &done {
            state.apps.remove(name);
            state.autoscaled.remove(name);
            state.config.forget_failure(name);
            state.logging.set_app(name, None);
            state.board().remove(name);
            info!(app = %name, "application removed");
        }
        Self::resume_removed(myself, state, &done);
        Ok(())
    }
}

impl Actor for Controller {
    type Msg = ControllerMsg;
    type State = ControllerState;
    type Arguments = ControllerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ControllerMsg>,
        args: ControllerArgs,
    ) -> Result<ControllerState, ActorProcessingErr> {
        let snapshot = match args.preloaded.take() {
            Some(snapshot) => snapshot,
            None => args.store.load()?,
        };
        let config = snapshot.config::<ServeConfig>()?;
        if let Some(global) = config.as_ref().and_then(|c| c.logging_config.clone()) {
            args.logging.set_global(global);
        }
        let mut apps = HashMap::with_capacity(snapshot.apps.len());
        let mut routes = HashMap::new();
        for record in snapshot.apps {
            // Statuses are volatile: publish the recovered target's now (DEPLOYING,
            // or DELETING for a deletion), so callers see every application as
            // soon as `start` returns.
            args.board
                .sender(&record.spec.name, Some(&record.spec.ingress), || {
                    accepted_status(&record)
                });
            if !record.deleting
                && let Some(p) = &record.spec.route_prefix
            {
                routes.insert(p.clone(), record.spec.name.clone());
            }
            apps.insert(
                record.spec.name.clone(),
                AppEntry {
                    record,
                    actor: None,
                    restarts: RestartLog::default(),
                    restart_pending: false,
                },
            );
        }
        let mut autoscaled: HashMap<AppName, BTreeMap<DeploymentName, u32>> = HashMap::new();
        for (app, dep, rec) in snapshot.deployments {
            if let Some(n) = rec.autoscaled_replicas {
                autoscaled.entry(app).or_default().insert(dep, n);
            }
        }
        args.route_table
            .replace_all(routes.iter().filter_map(|(prefix, app)| {
                apps.get(app).map(|e: &AppEntry| crate::Route {
                    prefix: prefix.clone(),
                    app: app.clone(),
                    ingress: e.record.spec.ingress.clone(),
                })
            }));
        info!(
            apps = apps.len(),
            "controller recovered targets from the checkpoint"
        );
        let controller = Parent::new(naming::controller(&args.ns));
        Ok(ControllerState {
            app_reporter: Arc::new(move |event| controller.cast(ControllerMsg::App(event))),
            args,
            apps,
            routes,
            autoscaled,
            by_actor: HashMap::new(),
            removals: Vec::new(),
            app_restarts: 0,
            shutting_down: false,
            config: ConfigState::recovered(config),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ControllerMsg>,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        // Re-adopt living ApplicationActors; start the missing ones.
        let names: Vec<AppName> = state.apps.keys().cloned().collect();
        for name in names {
            let actor_name = naming::application(&state.ns, &name);
            if let Some(actor) = ActorRef::<AppMsg>::where_is(actor_name)
                && watch(&myself.get_cell(), &actor.get_cell())
            {
                state.by_actor.insert(actor.get_id(), name.clone());
                if let Some(e) = state.apps.get_mut(&name) {
                    e.actor = Some(actor);
                }
            }
            Self::command(&myself, state, &name).await;
        }
        // A crash during a build: rebuild what the last applied config still owes.
        Self::resume_builds(&myself, state);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ControllerMsg>,
        msg: ControllerMsg,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        if state.shutting_down {
            refuse_after_shutdown(state, msg);
            return Ok(());
        }
        match msg {
            ControllerMsg::Deploy {
                apps,
                api_type,
                reply,
            } => Self::deploy(&myself, state, apps, api_type, reply).await?,
            ControllerMsg::Delete { names, reply } => {
                Self::delete(&myself, state, names, reply).await?
            }
            ControllerMsg::App(AppEvent::Deleted { name, generation }) => {
                Self::deleted(&myself, state, name, generation)
            }
            ControllerMsg::App(AppEvent::Autoscale {
                app,
                deployment,
                replicas,
            }) => Self::autoscale(state, app, deployment, replicas).await?,
            ControllerMsg::ApplyConfig { config, reply } => {
                Self::apply_config(&myself, state, config, reply).await?
            }
            ControllerMsg::BuildDone { app, build, result } => {
                Self::build_done(&myself, state, app, build, result).await?
            }
            ControllerMsg::RemoveDeleted => Self::remove_deleted(&myself, state).await?,
            ControllerMsg::RestartApp(name) => {
                if let Some(e) = state.apps.get_mut(&name) {
                    e.restart_pending = false;
                }
                Self::command(&myself, state, &name).await;
            }
            ControllerMsg::Observe(reply) => {
                let _ = reply.send(state.snapshot());
            }
            ControllerMsg::AppliedConfig(reply) => {
                let _ = reply.send(state.config.applied().cloned());
            }
            ControllerMsg::Shutdown(reply) => {
                state.shutting_down = true;
                state.config.cancel_all();
                let actors: Vec<_> = state
                    .apps
                    .values()
                    .filter_map(|e| e.actor.clone())
                    .collect();
                // Drain every application at once; each drains its deployments.
                tokio::spawn(async move {
                    futures::future::join_all(
                        actors.iter().map(|a| a.call(AppMsg::Shutdown, None)),
                    )
                    .await;
                    for a in actors {
                        a.stop(None);
                    }
                    let _ = reply.send(());
                });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ControllerMsg>,
        evt: SupervisionEvent,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        let Some((id, failure)) = child_exit(&evt) else {
            return Ok(());
        };
        let Some(name) = state.by_actor.remove(&id) else {
            return Ok(());
        };
        if state.shutting_down {
            return Ok(());
        }
        let policy = state.restart;
        let Some(entry) = state.apps.get_mut(&name) else {
            return Ok(());
        };
        if entry.actor.as_ref().map(|a| a.get_id()) != Some(id) {
            // A stale exit of an actor that has been replaced since.
            return Ok(());
        }
        entry.actor = None;
        match failure {
            // A graceful exit means it finished deleting.
            None if entry.record.deleting => {
                // Its Deleted report is queued behind this event (supervision events
                // come first): let it land before looking again, or every exit would
                // respawn an actor that reports and exits again, without end. If the
                // report was lost, the later look starts an actor that sends it anew.
                Self::restart_later(&myself, state, name, RETRY);
            }
            // A redeploy cancelled the deletion since: start it with that target.
            None => Self::command(&myself, state, &name).await,
            Some(why) => {
                warn!(app = %name, %why, "application actor crashed");
                let delay = entry.restarts.on_crash(&policy);
                state.app_restarts += 1;
                match delay {
                    Some(delay) => Self::restart_later(&myself, state, name, delay),
                    None => {
                        return Err(format!(
                            "application '{name}' crashed more than {} times in {:?}: escalating",
                            policy.max_restarts, policy.window
                        )
                        .into());
                    }
                }
            }
        }
        Ok(())
    }
}
