//! The Controller actor: durable targets, the checkpoint protocol, and the
//! ApplicationActors below it.

use std::{collections::HashMap, sync::Arc, time::Duration};

use flotilla_application::{AppArgs, AppEvent, AppMsg, ApplicationActor, publish_status};
use flotilla_core::{
    ApiType, AppName, AppRecord, ApplicationSpec, ApplicationStatusInfo, FaultPoint, Faults,
    RoutePrefix, naming,
};
use flotilla_deployment::Cluster;
use flotilla_replica::{
    Directory, Registry,
    supervision::{RestartLog, RestartPolicy},
};
use flotilla_store::{Batch, Store};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tracing::{info, warn};

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
}

/// The controller actor.
pub struct Controller;

struct AppEntry {
    record: AppRecord,
    actor: Option<ActorRef<AppMsg>>,
    restarts: RestartLog,
    restart_pending: bool,
}

/// The Controller's state: the durable targets (as last committed) and the living
/// children.
pub struct ControllerState {
    args: ControllerArgs,
    apps: HashMap<AppName, AppEntry>,
    routes: HashMap<RoutePrefix, AppName>,
    by_actor: HashMap<ActorId, AppName>,
    app_restarts: u64,
    shutting_down: bool,
}

impl ControllerState {
    fn app_args(&self, record: &AppRecord) -> AppArgs {
        let a = &self.args;
        let name = naming::controller(&a.ns);
        AppArgs {
            ns: a.ns.clone(),
            record: record.clone(),
            registry: a.registry.clone(),
            directory: a.directory.clone(),
            cluster: a.cluster.clone(),
            status: self
                .board
                .sender(&record.spec.name, &record.spec.ingress, || {
                    ApplicationStatusInfo::deploying(record.generation)
                }),
            reporter: Arc::new(move |event| {
                if let Some(c) = ActorRef::<ControllerMsg>::where_is(name.clone()) {
                    let _ = c.cast(ControllerMsg::App(event));
                }
            }),
            restart: a.restart,
            faults: a.faults.clone(),
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

/// Crash the Controller here if `point` is armed.
fn fault(faults: &Faults, point: FaultPoint) -> Result<(), ActorProcessingErr> {
    if faults.hit(point) {
        return Err(format!("injected fault: {point:?}").into());
    }
    Ok(())
}

impl Controller {
    /// Start or update the ApplicationActor of `name` with its current record.
    async fn command(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: &AppName,
    ) {
        let Some(entry) = state.apps.get(name) else {
            return;
        };
        if let Some(actor) = &entry.actor {
            let _ = actor.cast(AppMsg::SetTarget(Box::new(entry.record.clone())));
            return;
        }
        if entry.restart_pending {
            return;
        }
        let args = state.app_args(&entry.record);
        let actor_name = naming::application(&state.ns, name);
        match Actor::spawn(Some(actor_name), ApplicationActor, args).await {
            Ok((actor, _)) => {
                myself.get_cell().monitor(actor.get_cell());
                state.by_actor.insert(actor.get_id(), name.clone());
                if let Some(e) = state.apps.get_mut(name) {
                    e.actor = Some(actor);
                }
            }
            Err(e) => {
                warn!(app = %name, error = %e, "could not start application actor; retrying");
                Self::restart_later(myself, state, name.clone(), RETRY);
            }
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
        if let Err(e) = validate_batch(&apps, &state.routes) {
            let _ = reply.send(Err(e));
            return Ok(());
        }
        let records: Vec<AppRecord> = apps
            .into_iter()
            .map(|spec| AppRecord {
                generation: state
                    .apps
                    .get(&spec.name)
                    .map_or(1, |e| e.record.generation + 1),
                spec,
                deleting: false,
                api_type,
            })
            .collect();
        let mut batch = Batch::new();
        for r in &records {
            if let Err(e) = batch.put_app(r) {
                let _ = reply.send(Err(e.into()));
                return Ok(());
            }
        }
        fault(&state.faults, FaultPoint::ControllerBeforeCommit)?;
        if let Err(e) = state.store.commit(&batch) {
            let _ = reply.send(Err(e.into()));
            return Ok(());
        }
        fault(&state.faults, FaultPoint::ControllerAfterCommit)?;
        let generations = records.iter().map(|r| r.generation).collect();
        let names: Vec<AppName> = records.iter().map(|r| r.spec.name.clone()).collect();
        for r in records {
            let name = r.spec.name.clone();
            if let Some(old) = state
                .apps
                .get(&name)
                .and_then(|e| e.record.spec.route_prefix.clone())
                && state.routes.get(&old) == Some(&name)
            {
                state.routes.remove(&old);
            }
            if let Some(p) = &r.spec.route_prefix {
                state.routes.insert(p.clone(), name.clone());
            }
            let tx = state.board().sender(&name, &r.spec.ingress, || {
                ApplicationStatusInfo::deploying(r.generation)
            });
            publish_status(&tx, ApplicationStatusInfo::deploying(r.generation));
            info!(app = %name, generation = r.generation, "application target accepted");
            match state.apps.get_mut(&name) {
                Some(e) => e.record = r,
                None => {
                    state.apps.insert(
                        name,
                        AppEntry {
                            record: r,
                            actor: None,
                            restarts: RestartLog::default(),
                            restart_pending: false,
                        },
                    );
                }
            }
        }
        let _ = reply.send(Ok(generations));
        fault(&state.faults, FaultPoint::ControllerAfterReply)?;
        for name in &names {
            Self::command(myself, state, name).await;
        }
        Ok(())
    }

    async fn delete(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        names: Vec<AppName>,
        reply: RpcReplyPort<Result<Vec<Option<u64>>, ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        let mut changed = Vec::new();
        let mut result = Vec::with_capacity(names.len());
        let mut batch = Batch::new();
        for name in &names {
            match state.apps.get(name) {
                Some(e) if e.record.deleting => result.push(Some(e.record.generation)),
                Some(e) => {
                    let mut r = e.record.clone();
                    r.deleting = true;
                    r.generation += 1;
                    if let Err(err) = batch.put_app(&r) {
                        let _ = reply.send(Err(err.into()));
                        return Ok(());
                    }
                    result.push(Some(r.generation));
                    changed.push(r);
                }
                None => result.push(None),
            }
        }
        fault(&state.faults, FaultPoint::ControllerBeforeCommit)?;
        if let Err(e) = state.store.commit(&batch) {
            let _ = reply.send(Err(e.into()));
            return Ok(());
        }
        fault(&state.faults, FaultPoint::ControllerAfterCommit)?;
        for r in &changed {
            let name = &r.spec.name;
            if let Some(p) = &r.spec.route_prefix
                && state.routes.get(p) == Some(name)
            {
                state.routes.remove(p);
            }
            let tx = state.board().sender(name, &r.spec.ingress, || {
                ApplicationStatusInfo::deploying(r.generation)
            });
            let mut deleting = tx.borrow().clone();
            deleting.status = flotilla_core::ApplicationStatus::Deleting;
            deleting.message = String::new();
            deleting.observed_generation = r.generation;
            publish_status(&tx, deleting);
            info!(app = %name, generation = r.generation, "application deletion accepted");
            if let Some(e) = state.apps.get_mut(name) {
                e.record = r.clone();
            }
        }
        let _ = reply.send(Ok(result));
        fault(&state.faults, FaultPoint::ControllerAfterReply)?;
        for r in &changed {
            Self::command(myself, state, &r.spec.name).await;
        }
        Ok(())
    }

    /// The ApplicationActor finished deleting: remove the record (one commit).
    fn deleted(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: AppName,
        generation: u64,
    ) {
        let Some(e) = state.apps.get(&name) else {
            return;
        };
        if !e.record.deleting || e.record.generation != generation {
            return;
        }
        let mut batch = Batch::new();
        batch.delete_app(&name);
        if let Err(err) = state.store.commit(&batch) {
            warn!(app = %name, error = %err, "could not remove deleted application; retrying");
            myself.send_after(RETRY, move || {
                ControllerMsg::App(AppEvent::Deleted { name, generation })
            });
            return;
        }
        state.apps.remove(&name);
        state.board().remove(&name);
        info!(app = %name, "application removed");
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
        let snapshot = args.store.load()?;
        let mut apps = HashMap::with_capacity(snapshot.apps.len());
        let mut routes = HashMap::new();
        for record in snapshot.apps {
            // Statuses are volatile: publish DEPLOYING at the recovered generation
            // now, so callers see every application as soon as `start` returns.
            args.board
                .sender(&record.spec.name, &record.spec.ingress, || {
                    ApplicationStatusInfo::deploying(record.generation)
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
        info!(
            apps = apps.len(),
            "controller recovered targets from the checkpoint"
        );
        Ok(ControllerState {
            args,
            apps,
            routes,
            by_actor: HashMap::new(),
            app_restarts: 0,
            shutting_down: false,
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
            if let Some(actor) = ActorRef::<AppMsg>::where_is(actor_name) {
                myself.get_cell().monitor(actor.get_cell());
                state.by_actor.insert(actor.get_id(), name.clone());
                if let Some(e) = state.apps.get_mut(&name) {
                    e.actor = Some(actor);
                }
            }
            Self::command(&myself, state, &name).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ControllerMsg>,
        msg: ControllerMsg,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
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
            ControllerMsg::RestartApp(name) => {
                if let Some(e) = state.apps.get_mut(&name) {
                    e.restart_pending = false;
                }
                Self::command(&myself, state, &name).await;
            }
            ControllerMsg::Observe(reply) => {
                let _ = reply.send(ControllerSnapshot {
                    apps: state.apps.len(),
                    deleting: state.apps.values().filter(|e| e.record.deleting).count(),
                    app_actors: state.apps.values().filter(|e| e.actor.is_some()).count(),
                    app_restarts: state.app_restarts,
                });
            }
            ControllerMsg::Shutdown(reply) => {
                state.shutting_down = true;
                let actors: Vec<_> = state
                    .apps
                    .values()
                    .filter_map(|e| e.actor.clone())
                    .collect();
                tokio::spawn(async move {
                    for a in &actors {
                        let _ = a.call(AppMsg::Shutdown, None).await;
                    }
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
        let (cell, failure) = match &evt {
            // A kill (fault injection, or a stuck actor) is a crash, not a stop.
            SupervisionEvent::ActorTerminated(c, _, reason) => {
                (c, reason.clone().filter(|r| r == "killed"))
            }
            SupervisionEvent::ActorFailed(c, e) => (c, Some(e.to_string())),
            _ => return Ok(()),
        };
        let Some(name) = state.by_actor.remove(&cell.get_id()) else {
            return Ok(());
        };
        if state.shutting_down {
            return Ok(());
        }
        let policy = state.restart;
        let Some(entry) = state.apps.get_mut(&name) else {
            return Ok(());
        };
        entry.actor = None;
        match failure {
            // Stopped after finishing a deletion that a redeploy has since
            // cancelled: start it again with the current target.
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
