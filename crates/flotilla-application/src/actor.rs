//! The ApplicationActor itself.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use flotilla_core::{
    AppRecord, AppStatusInputs, ApplicationStatusInfo, DeploymentName, DeploymentSpec,
    DeploymentStatusInfo, DeploymentTrigger, FaultPoint, Faults, ReplicaCount, naming,
};
use flotilla_deployment::{
    Cluster, DeploymentActor, DeploymentArgs, DeploymentEvent, DeploymentMsg, DeploymentReporter,
    DeploymentTarget,
};
use flotilla_replica::{
    Directory, Registry, groups,
    supervision::{Parent, RestartLog, RestartPolicy, child_exit, watch},
};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent, rpc::CallResult};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{AppEvent, AppMsg, AppReporter, publish_status};

const OBSERVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Delay before retrying a spawn whose name is still held by a stopping actor.
const NAME_BUSY_RETRY: Duration = Duration::from_millis(10);

/// Everything an ApplicationActor needs; a restarted one gets the same.
#[derive(Clone)]
pub struct AppArgs {
    /// The Serve instance's namespace.
    pub ns: String,
    /// The durable target.
    pub record: AppRecord,
    /// Where code is registered.
    pub registry: Registry,
    /// Routes, shared with handles.
    pub directory: Directory,
    /// Where replicas run.
    pub cluster: Arc<dyn Cluster>,
    /// Where its status is published (outlives the actor).
    pub status: watch::Sender<ApplicationStatusInfo>,
    /// How it reports to the Controller.
    pub reporter: AppReporter,
    /// How it restarts crashed deployment actors.
    pub restart: RestartPolicy,
    /// Armed fault points (fault injection; free when unarmed).
    pub faults: Faults,
    /// Durable autoscaling decisions by deployment.
    pub autoscaled: BTreeMap<DeploymentName, u32>,
    /// A failed config build standing over `record`'s generation (see
    /// [`AppMsg::BuildFailure`]), so a restarted actor keeps showing it.
    pub build_failure: Option<String>,
}

/// The application actor.
pub struct ApplicationActor;

struct Child {
    actor: Option<ActorRef<DeploymentMsg>>,
    /// The spec last sent (kept to delete a deployment no longer in the target).
    spec: Arc<DeploymentSpec>,
    /// The last status, with the generation it describes.
    status: Option<(u64, DeploymentStatusInfo)>,
    restarts: RestartLog,
    restart_pending: bool,
}

/// The ApplicationActor's state.
pub struct AppState {
    args: AppArgs,
    /// Boxed: a B-tree node holds eleven values, so inline children would cost an
    /// application of one deployment eleven children's worth of memory.
    children: BTreeMap<DeploymentName, Box<Child>>,
    by_actor: HashMap<ActorId, DeploymentName>,
    /// A failed config build and the generation it stands over.
    build_failure: Option<(u64, String)>,
    shutting_down: bool,
    /// How its DeploymentActors report here (one, shared by all of them).
    deployment_reporter: DeploymentReporter,
}

impl AppState {
    fn target_of(&self, name: &DeploymentName) -> Option<DeploymentTarget> {
        let r = &self.args.record;
        let in_target = if r.deleting {
            None
        } else {
            r.spec.deployment(name.as_str())
        };
        match in_target {
            Some(spec) => Some(DeploymentTarget {
                replicas: match &spec.config.num_replicas {
                    ReplicaCount::Fixed(n) => *n,
                    ReplicaCount::Auto(a) => self
                        .args
                        .autoscaled
                        .get(name)
                        .map_or(a.initial(), |n| (*n).clamp(a.min_replicas, a.max_replicas)),
                },
                // Share the spec already sent when it has not changed.
                spec: match self.children.get(name) {
                    Some(c) if *c.spec == *spec => c.spec.clone(),
                    _ => Arc::new(spec.clone()),
                },
                deleting: false,
                generation: r.generation,
            }),
            None => self.children.get(name).map(|c| DeploymentTarget {
                replicas: 0,
                spec: c.spec.clone(),
                deleting: true,
                generation: r.generation,
            }),
        }
    }

    fn deployment_args(&self, target: DeploymentTarget) -> DeploymentArgs {
        let a = &self.args;
        DeploymentArgs {
            ns: a.ns.clone(),
            app: a.record.spec.name.clone(),
            target,
            registry: a.registry.clone(),
            directory: a.directory.clone(),
            cluster: a.cluster.clone(),
            faults: a.faults.clone(),
            reporter: self.deployment_reporter.clone(),
        }
    }

    fn derive_status(&self) {
        let r = &self.args.record;
        let reported = self
            .children
            .iter()
            .filter_map(|(name, c)| match &c.status {
                Some((g, s)) if *g == r.generation => Some((name.clone(), s.clone())),
                _ => None,
            })
            .collect();
        let build_failure = match &self.build_failure {
            Some((generation, message)) if *generation == r.generation => Some(message.as_str()),
            _ => None,
        };
        let info = ApplicationStatusInfo::derive(AppStatusInputs {
            record: Some(r),
            reported: &reported,
            build_failure,
        });
        // The published status is the only copy: what watchers see is what a
        // change is logged against.
        let from = {
            let published = self.args.status.borrow();
            if *published == info {
                return;
            }
            (published.status != info.status || published.message != info.message)
                .then_some(published.status)
        };
        let (to, detail) = (info.status, info.message.clone());
        if publish_status(&self.args.status, info)
            && let Some(from) = from
        {
            info!(app = %r.spec.name, generation = r.generation, %from, %to, %detail,
                "application status");
        }
    }
}

impl ApplicationActor {
    /// Find living DeploymentActors of this application and learn their targets.
    async fn adopt(myself: &ActorRef<AppMsg>, state: &mut AppState) {
        let group = naming::deployment_group(&state.args.ns, &state.args.record.spec.name);
        for cell in groups::members(&group) {
            let r: ActorRef<DeploymentMsg> = cell.clone().into();
            // Watch first: an exit between the answer and the watch would be missed.
            if !watch(&myself.get_cell(), &cell) {
                continue;
            }
            let Ok(CallResult::Success(snap)) =
                r.call(DeploymentMsg::Observe, Some(OBSERVE_TIMEOUT)).await
            else {
                // Alive but not answering: replace it (its replicas survive).
                warn!(app = %state.args.record.spec.name, "deployment actor did not answer; killing it");
                myself.get_cell().unmonitor(cell.clone());
                cell.kill();
                continue;
            };
            let name = snap.target.spec.name.clone();
            info!(app = %state.args.record.spec.name, deployment = %name,
                "re-adopted living deployment actor");
            state.by_actor.insert(cell.get_id(), name.clone());
            state.children.insert(
                name,
                Box::new(Child {
                    actor: Some(r),
                    spec: snap.target.spec,
                    status: Some((snap.target.generation, snap.status)),
                    restarts: RestartLog::default(),
                    restart_pending: false,
                }),
            );
        }
    }

    /// One reconcile step: every target deployment has an actor with the current
    /// target; every other one is being deleted.
    ///
    /// Boxed: ractor keeps one loop future per actor, sized for the largest
    /// message handler, and this step's frame (targets, names, a child's spawn)
    /// would make every application's loop future kilobytes larger. It runs only
    /// when the target or a child changes, so the allocation is rare.
    async fn reconcile(
        myself: &ActorRef<AppMsg>,
        state: &mut AppState,
    ) -> Result<(), ActorProcessingErr> {
        Box::pin(Self::reconcile_step(myself, state)).await
    }

    async fn reconcile_step(
        myself: &ActorRef<AppMsg>,
        state: &mut AppState,
    ) -> Result<(), ActorProcessingErr> {
        if state.shutting_down {
            return Ok(());
        }
        if state.args.faults.hit(FaultPoint::ApplicationReconcile) {
            return Err("injected fault: ApplicationReconcile".into());
        }
        let mut names: Vec<DeploymentName> = state.children.keys().cloned().collect();
        if !state.args.record.deleting {
            for d in &state.args.record.spec.deployments {
                if !state.children.contains_key(&d.name) {
                    names.push(d.name.clone());
                }
            }
        }
        for name in names {
            let Some(target) = state.target_of(&name) else {
                continue;
            };
            let child = state.children.entry(name.clone()).or_insert_with(|| {
                Box::new(Child {
                    actor: None,
                    spec: target.spec.clone(),
                    status: None,
                    restarts: RestartLog::default(),
                    restart_pending: false,
                })
            });
            child.spec = target.spec.clone();
            if let Some(a) = &child.actor {
                match a.cast(DeploymentMsg::SetTarget(Box::new(target.clone()))) {
                    Ok(()) => continue,
                    // Gone (its exit event may still be queued): start another.
                    Err(_) => {
                        state.by_actor.remove(&a.get_id());
                        child.actor = None;
                    }
                }
            }
            if !child.restart_pending {
                Self::spawn_child(myself, state, name, target).await;
            }
        }
        state.derive_status();
        if state.args.record.deleting && state.children.is_empty() {
            let r = &state.args.record;
            info!(app = %r.spec.name, generation = r.generation, "application deleted");
            (state.args.reporter)(AppEvent::Deleted {
                name: r.spec.name.clone(),
                generation: r.generation,
            });
            myself.stop(None);
        }
        Ok(())
    }

    async fn spawn_child(
        myself: &ActorRef<AppMsg>,
        state: &mut AppState,
        name: DeploymentName,
        target: DeploymentTarget,
    ) {
        let actor_name = naming::deployment(&state.args.ns, &state.args.record.spec.name, &name);
        let deleting = target.deleting;
        let args = state.deployment_args(target.clone());
        // Inline: reconcile boxes the whole step, spawn included.
        let actor = match Actor::spawn(Some(actor_name.clone()), DeploymentActor, args).await {
            Ok((actor, _)) => actor,
            // The name is held by a living actor we do not watch: adopt it.
            Err(e) => match ActorRef::<DeploymentMsg>::where_is(actor_name) {
                Some(actor) => {
                    let _ = actor.cast(DeploymentMsg::SetTarget(Box::new(target)));
                    actor
                }
                None => {
                    warn!(app = %state.args.record.spec.name, deployment = %name, error = %e,
                        "could not start deployment actor; retrying");
                    Self::restart_later(myself, state, name, NAME_BUSY_RETRY);
                    return;
                }
            },
        };
        if !watch(&myself.get_cell(), &actor.get_cell()) {
            // It finished before we could watch it: a deletion with nothing left.
            if deleting {
                state.children.remove(&name);
            } else {
                Self::restart_later(myself, state, name, NAME_BUSY_RETRY);
            }
            return;
        }
        state.by_actor.insert(actor.get_id(), name.clone());
        if let Some(c) = state.children.get_mut(&name) {
            c.actor = Some(actor);
        }
    }

    fn restart_later(
        myself: &ActorRef<AppMsg>,
        state: &mut AppState,
        name: DeploymentName,
        after: Duration,
    ) {
        if let Some(c) = state.children.get_mut(&name) {
            c.restart_pending = true;
        }
        myself.send_after(after, move || AppMsg::RestartDeployment(name));
    }
}

impl Actor for ApplicationActor {
    type Msg = AppMsg;
    type State = AppState;
    type Arguments = AppArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<AppMsg>,
        args: AppArgs,
    ) -> Result<AppState, ActorProcessingErr> {
        let build_failure = args
            .build_failure
            .clone()
            .map(|m| (args.record.generation, m));
        let me = Parent::new(naming::application(&args.ns, &args.record.spec.name));
        Ok(AppState {
            args,
            children: BTreeMap::new(),
            by_actor: HashMap::new(),
            build_failure,
            shutting_down: false,
            deployment_reporter: Arc::new(move |event| me.cast(AppMsg::Deployment(event))),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<AppMsg>,
        state: &mut AppState,
    ) -> Result<(), ActorProcessingErr> {
        Self::adopt(&myself, state).await;
        Self::reconcile(&myself, state).await?;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<AppMsg>,
        msg: AppMsg,
        state: &mut AppState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AppMsg::SetTarget(record) => {
                if *record == state.args.record {
                    return Ok(());
                }
                state.args.record = *record;
            }
            AppMsg::Deployment(DeploymentEvent::Status {
                name,
                generation,
                status,
            }) => {
                if let Some(c) = state.children.get_mut(&name) {
                    c.status = Some((generation, status));
                }
                state.derive_status();
                return Ok(());
            }
            AppMsg::Deployment(DeploymentEvent::Autoscale { name, replicas }) => {
                (state.args.reporter)(AppEvent::Autoscale {
                    app: state.args.record.spec.name.clone(),
                    deployment: name,
                    replicas,
                });
                return Ok(());
            }
            AppMsg::Deployment(DeploymentEvent::Deleted { name, .. }) => {
                // The actor stops right after; its termination removes the child.
                if let Some(c) = state.children.get_mut(&name) {
                    c.status = None;
                }
                return Ok(());
            }
            AppMsg::SetReplicas(name, replicas) => {
                if state.args.autoscaled.get(&name) == Some(&replicas) {
                    return Ok(());
                }
                state.args.autoscaled.insert(name, replicas);
            }
            AppMsg::BuildFailure {
                generation,
                message,
            } => {
                state.build_failure = message.map(|m| (generation, m));
                state.derive_status();
                return Ok(());
            }
            AppMsg::RestartDeployment(name) => {
                if let Some(c) = state.children.get_mut(&name) {
                    c.restart_pending = false;
                }
            }
            AppMsg::Shutdown(reply) => {
                state.shutting_down = true;
                let children: Vec<_> = state
                    .children
                    .values()
                    .filter_map(|c| c.actor.clone())
                    .collect();
                tokio::spawn(async move {
                    futures::future::join_all(
                        children
                            .iter()
                            .map(|c| c.call(DeploymentMsg::Shutdown, None)),
                    )
                    .await;
                    let _ = reply.send(());
                });
                return Ok(());
            }
        }
        Self::reconcile(&myself, state).await?;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<AppMsg>,
        evt: SupervisionEvent,
        state: &mut AppState,
    ) -> Result<(), ActorProcessingErr> {
        let Some((id, failure)) = child_exit(&evt) else {
            return Ok(());
        };
        let Some(name) = state.by_actor.remove(&id) else {
            return Ok(());
        };
        let wanted = state.target_of(&name).is_some_and(|t| !t.deleting);
        let Some(child) = state.children.get_mut(&name) else {
            return Ok(());
        };
        if child.actor.as_ref().map(|a| a.get_id()) != Some(id) {
            // A stale exit of an actor that has been replaced since.
            return Ok(());
        }
        child.actor = None;
        match failure {
            None if !wanted => {
                state.children.remove(&name);
            }
            None => {}
            Some(why) => {
                warn!(app = %state.args.record.spec.name, deployment = %name, %why,
                    "deployment actor crashed");
                // Ray's INTERNAL_ERROR: UNHEALTHY until its successor reports.
                if let Some((_, status)) = child.status.as_mut() {
                    status.handle(
                        DeploymentTrigger::InternalError,
                        format!("The deployment's actor crashed ({why}); restarting it."),
                    );
                }
                match child.restarts.on_crash(&state.args.restart) {
                    Some(delay) => {
                        Self::restart_later(&myself, state, name, delay);
                        state.derive_status();
                        return Ok(());
                    }
                    None => {
                        return Err(format!(
                            "deployment '{name}' crashed more than {} times in {:?}: escalating",
                            state.args.restart.max_restarts, state.args.restart.window
                        )
                        .into());
                    }
                }
            }
        }
        Self::reconcile(&myself, state).await?;
        Ok(())
    }
}
