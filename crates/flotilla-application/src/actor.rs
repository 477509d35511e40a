//! The ApplicationActor itself.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use flotilla_cluster::Cluster;
use flotilla_core::{
    AppRecord, AppStatusInputs, ApplicationStatusInfo, DeploymentName, DeploymentSpec,
    DeploymentStatusInfo, DeploymentTrigger, FaultPoint, Faults, ReplicaCount, actor_names,
};
use flotilla_deployment::{
    DeploymentActor, DeploymentArgs, DeploymentEvent, DeploymentMsg, DeploymentReporter,
    DeploymentTarget,
};
use flotilla_replica::{Directory, Registry};
use flotilla_supervision::{
    ChildExit, Children, Escalation, Parent, RestartPolicy, StartError, Started, groups,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent, rpc::CallResult};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    AppEvent, AppMsg, AppReporter,
    messages::{Internal, InternalMsg},
    publish_status,
};

const OBSERVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The DeploymentActor draining each deployment during the shutdown (`None`
/// while one is being started: its start failed, and is retried).
type Draining = BTreeMap<DeploymentName, Option<ActorRef<DeploymentMsg>>>;
/// Delay before retrying a spawn whose name is still held by a stopping actor.
const NAME_BUSY_RETRY: Duration = Duration::from_millis(10);
/// The code path of a stand-in spec for a deployment found without an actor
/// and out of the target (only ever deleted; never registered).
const UNWATCHED_CODE: &str = "flotilla.unwatched:Deployment";

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
    /// Durable replica decisions by deployment: the autoscaler's, or an
    /// external scaler's.
    pub autoscaled: BTreeMap<DeploymentName, u32>,
    /// A failed config build standing over `record`'s generation (see
    /// [`AppMsg::SetTarget`]), so a restarted actor keeps showing it.
    pub build_failure: Option<String>,
}

/// The application actor.
pub struct ApplicationActor;

/// What the ApplicationActor knows of one deployment (its actor is in
/// [`AppState::actors`]).
struct Child {
    /// The spec last sent (kept to delete a deployment no longer in the target).
    spec: Arc<DeploymentSpec>,
    /// The last status, with the generation it describes.
    status: Option<(u64, DeploymentStatusInfo)>,
}

/// The ApplicationActor's state.
pub struct AppState {
    args: AppArgs,
    /// Boxed: a B-tree node holds eleven values, so inline children would cost an
    /// application of one deployment eleven children's worth of memory.
    children: BTreeMap<DeploymentName, Box<Child>>,
    /// The DeploymentActors, supervised.
    actors: Children<DeploymentName, DeploymentMsg>,
    /// A failed config build and the generation it stands over.
    build_failure: Option<(u64, String)>,
    /// Set by the shutdown: the DeploymentActor draining each deployment,
    /// replaced when one crashes mid-drain and its successor takes over.
    drain: Option<watch::Sender<Draining>>,
    /// How its DeploymentActors report here (one, shared by all of them).
    deployment_reporter: DeploymentReporter,
}

impl AppState {
    /// `name`'s spec in the target (none while the application is deleted).
    fn in_target(&self, name: &DeploymentName) -> Option<&DeploymentSpec> {
        let r = &self.args.record;
        if r.deleting {
            None
        } else {
            r.spec.deployment(name.as_str())
        }
    }

    fn target_of(&self, name: &DeploymentName) -> Option<DeploymentTarget> {
        let r = &self.args.record;
        match self.in_target(name) {
            Some(spec) => Some(DeploymentTarget {
                replicas: match &spec.config.num_replicas {
                    // An external scaler's decision wins over the declared count.
                    ReplicaCount::Fixed(n) if r.spec.external_scaler_enabled => {
                        self.args.autoscaled.get(name).copied().unwrap_or(*n)
                    }
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

    /// During the shutdown, who drains `name` now: its new actor, or
    /// (`None`) nobody, it is out of the drain.
    fn drain_by(&self, name: DeploymentName, actor: Option<ActorRef<DeploymentMsg>>) {
        if let Some(drain) = &self.drain {
            drain.send_modify(|d| match actor {
                Some(a) => {
                    d.insert(name, Some(a));
                }
                None => {
                    d.remove(&name);
                }
            });
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
        // change is logged against (by `publish_status`).
        publish_status(&self.args.status, &r.spec.name, info);
    }
}

impl ApplicationActor {
    /// Find living DeploymentActors of this application and learn their targets.
    async fn adopt(myself: &ActorRef<AppMsg>, state: &mut AppState) {
        let group = actor_names::deployment_group(&state.args.ns, &state.args.record.spec.name);
        for cell in groups::members(&group) {
            let r: ActorRef<DeploymentMsg> = cell.clone().into();
            let Ok(CallResult::Success(snap)) =
                r.call(DeploymentMsg::Observe, Some(OBSERVE_TIMEOUT)).await
            else {
                // Alive but not answering: replace it (its replicas survive).
                warn!(app = %state.args.record.spec.name, "deployment actor did not answer; killing it");
                cell.kill();
                continue;
            };
            let name = snap.target.spec.name.clone();
            // An exit after its answer shows as a failed adoption (it is gone).
            if !state.actors.adopt(&myself.get_cell(), name.clone(), r) {
                continue;
            }
            info!(app = %state.args.record.spec.name, deployment = %name,
                "re-adopted living deployment actor");
            state.children.insert(
                name,
                Box::new(Child {
                    spec: snap.target.spec,
                    status: Some((snap.target.generation, snap.status)),
                }),
            );
        }
        Self::adopt_unwatched(state);
    }

    /// A deployment of this application that has a route but no living actor
    /// (it was waiting out a crash backoff when the predecessor died, or was
    /// killed above for not answering), and that the target no longer has:
    /// its replicas may still run. It becomes a child being deleted, so a
    /// DeploymentActor adopts and stops them and releases its route. Its spec
    /// is not known any more: a stand-in of that name, with the default
    /// config (its replicas stop with the default graceful timeout).
    fn adopt_unwatched(state: &mut AppState) {
        let app = &state.args.record.spec.name;
        for name in state.args.directory.deployments_of(app) {
            if state.in_target(&name).is_some() || state.children.contains_key(&name) {
                continue;
            }
            let spec = match DeploymentSpec::builder(name.as_str(), UNWATCHED_CODE).build() {
                Ok(spec) => spec,
                Err(e) => {
                    warn!(app = %app, deployment = %name, error = %e,
                        "cannot stand in for an unwatched deployment");
                    continue;
                }
            };
            info!(app = %app, deployment = %name,
                "deployment without an actor and out of the target: deleting it");
            state.children.insert(
                name,
                Box::new(Child {
                    spec: Arc::new(spec),
                    status: None,
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
        if state.drain.is_some() {
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
                    spec: target.spec.clone(),
                    status: None,
                })
            });
            child.spec = target.spec.clone();
            if let Some(a) = state.actors.actor(&name) {
                // A failed cast means it is stopping: its exit event is on its
                // way (it is watched), and the restart that follows (after a
                // backoff if it crashed) starts it with the target as it is then.
                let _ = a.cast(DeploymentMsg::SetTarget(Box::new(target.clone())));
                continue;
            }
            if !state.actors.is_waiting(&name) {
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
        let actor_name =
            actor_names::deployment(&state.args.ns, &state.args.record.spec.name, &name);
        let deleting = target.deleting;
        let args = state.deployment_args(target.clone());
        let parent = myself.get_cell();
        match state
            .actors
            .start(&parent, name.clone(), actor_name, DeploymentActor, args)
            .await
        {
            Ok(Started::Spawned(_)) => {}
            // A living actor we did not watch held the name: it is ours now.
            Ok(Started::Adopted(actor)) => {
                let _ = actor.cast(DeploymentMsg::SetTarget(Box::new(target)));
            }
            // It finished before we could watch it: a deletion with nothing left.
            Err(StartError::Exited) if deleting => {
                state.children.remove(&name);
            }
            Err(e) => {
                warn!(app = %state.args.record.spec.name, deployment = %name, error = %e,
                    "could not start deployment actor; retrying");
                Self::restart_later(myself, state, name, NAME_BUSY_RETRY);
            }
        }
    }

    /// A deployment whose actor crashed mid-drain: its successor starts (it
    /// recovers the draining replicas, as on any restart) and is drained in
    /// its place.
    async fn drain_successor(
        myself: &ActorRef<AppMsg>,
        state: &mut AppState,
        name: DeploymentName,
    ) {
        if let Some(target) = state.target_of(&name) {
            Self::spawn_child(myself, state, name.clone(), target).await;
        }
        match state.actors.actor(&name) {
            Some(actor) => {
                let actor = actor.clone();
                state.drain_by(name, Some(actor));
            }
            // Its start is retried (the name is still held): given then.
            None if state.actors.is_waiting(&name) => {}
            // Out of every target, or its deletion finished as it started:
            // nothing to drain.
            None => state.drain_by(name, None),
        }
    }

    fn restart_later(
        myself: &ActorRef<AppMsg>,
        state: &mut AppState,
        name: DeploymentName,
        after: Duration,
    ) {
        state.actors.retry_later(name, after, myself, |n| {
            InternalMsg::RestartDeployment(n).into()
        });
    }

    /// An event from one of its deployments.
    fn on_deployment_event(state: &mut AppState, event: DeploymentEvent) {
        match event {
            DeploymentEvent::Status {
                name,
                generation,
                status,
            } => {
                // Its actor is down (crashed, waiting out its restart backoff):
                // this report left before the crash, which ractor hands over
                // first. Its successor reports afresh.
                if state.actors.actor(&name).is_none() {
                    return;
                }
                if let Some(c) = state.children.get_mut(&name) {
                    c.status = Some((generation, status));
                }
                state.derive_status();
            }
            DeploymentEvent::Autoscale {
                name,
                replicas,
                generation,
            } => {
                (state.args.reporter)(AppEvent::Autoscale {
                    app: state.args.record.spec.name.clone(),
                    deployment: name,
                    replicas,
                    generation,
                });
            }
            DeploymentEvent::Deleted { name, .. } => {
                // The actor stops right after; its termination removes the child.
                if let Some(c) = state.children.get_mut(&name) {
                    c.status = None;
                }
            }
        }
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
        let me: Parent<AppMsg> =
            Parent::new(actor_names::application(&args.ns, &args.record.spec.name));
        Ok(AppState {
            args,
            children: BTreeMap::new(),
            actors: Children::new(),
            build_failure,
            drain: None,
            deployment_reporter: Arc::new(move |event| {
                me.cast(InternalMsg::Deployment(event).into())
            }),
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
            AppMsg::SetTarget {
                record,
                decisions,
                build_failure,
            } => {
                let failure = build_failure.map(|m| (record.generation, m));
                if *record == state.args.record && decisions == state.args.autoscaled {
                    if failure != state.build_failure {
                        state.build_failure = failure;
                        state.derive_status();
                    }
                    return Ok(());
                }
                state.args.record = *record;
                state.args.autoscaled = decisions;
                state.build_failure = failure;
            }
            AppMsg::Internal(Internal(InternalMsg::Deployment(event))) => {
                Self::on_deployment_event(state, event);
                return Ok(());
            }
            AppMsg::SetReplicas(name, replicas) => {
                if state.args.autoscaled.get(&name) == Some(&replicas) {
                    return Ok(());
                }
                state.args.autoscaled.insert(name, replicas);
            }
            AppMsg::Internal(Internal(InternalMsg::RestartDeployment(name))) => {
                if !state.actors.retry_due(&name) {
                    return Ok(());
                }
                if state.drain.is_some() {
                    Self::drain_successor(&myself, state, name).await;
                    return Ok(());
                }
            }
            AppMsg::Shutdown(reply) => {
                // A deployment waiting out a restart backoff starts now: its
                // replicas drain only through it (it recovers them as on any
                // restart), and nothing starts it once this is shutting down.
                for name in state.actors.end_waits() {
                    if let Some(target) = state.target_of(&name) {
                        Self::spawn_child(&myself, state, name, target).await;
                    }
                }
                // Every deployment with an actor, and those whose start just
                // failed (retried: `drain_successor` gives their actor).
                let retried = (state.children.keys())
                    .filter(|name| state.actors.is_waiting(name))
                    .map(|name| (name.clone(), None));
                let draining: Draining = (state.actors.actors())
                    .map(|(name, a)| (name.clone(), Some(a.clone())))
                    .chain(retried)
                    .collect();
                let (drain, watching) = watch::channel(draining.clone());
                state.drain = Some(drain);
                // Off the mailbox, and on without this actor if it crashes:
                // its deployments drain on their own.
                tokio::spawn(async move {
                    futures::future::join_all(
                        draining
                            .into_iter()
                            .map(|(name, actor)| drain_one(name, actor, watching.clone())),
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
        let Some((name, how)) = state.actors.exited(&evt) else {
            return Ok(());
        };
        // During the drain, an actor that stopped on its own (a deletion that
        // finished) has nothing left to drain, and nothing restarts it: its
        // drain ends (a crashed one's successor takes over, below).
        if !how.is_crash() {
            state.drain_by(name.clone(), None);
        }
        let wanted = state.target_of(&name).is_some_and(|t| !t.deleting);
        let generation = state.args.record.generation;
        let Some(child) = state.children.get_mut(&name) else {
            return Ok(());
        };
        match how {
            ChildExit::Stopped if !wanted => {
                state.children.remove(&name);
                state.actors.remove(&name);
            }
            ChildExit::Stopped => {}
            how @ (ChildExit::Killed | ChildExit::Failed { .. }) => {
                warn!(app = %state.args.record.spec.name, deployment = %name, %how,
                    "deployment actor crashed");
                // Ray's INTERNAL_ERROR, from any state: UNHEALTHY until its
                // successor reports. A deployment that had not reported on
                // the current target yet (it crashed taking it) is updating
                // it, and is UNHEALTHY over it as well.
                let status = match &mut child.status {
                    Some((g, s)) if *g == generation => s,
                    slot => &mut slot.insert((generation, DeploymentStatusInfo::default())).1,
                };
                status.handle(
                    DeploymentTrigger::InternalError,
                    format!("The deployment's actor crashed ({how}); restarting it."),
                );
                let policy = state.args.restart;
                match state.actors.on_crash(&name, &policy) {
                    Some(delay) => {
                        Self::restart_later(&myself, state, name, delay);
                        state.derive_status();
                        return Ok(());
                    }
                    None => {
                        return Err(Escalation::of(format!("deployment '{name}'"), &policy).into());
                    }
                }
            }
        }
        Self::reconcile(&myself, state).await?;
        Ok(())
    }
}

/// Drain one deployment: ask its actor to shut down and wait for its
/// answer (every replica gone); if there is none yet (its start is retried),
/// or it crashes first, ask the one the ApplicationActor starts next. Ends
/// without one once the deployment leaves the drain (its actor stopped on its
/// own, or no target holds it) or the ApplicationActor is gone too (its
/// restart starts nothing during a shutdown).
async fn drain_one(
    name: DeploymentName,
    mut actor: Option<ActorRef<DeploymentMsg>>,
    mut draining: watch::Receiver<Draining>,
) {
    loop {
        if let Some(a) = &actor
            && let Ok(CallResult::Success(())) = a.call(DeploymentMsg::Shutdown, None).await
        {
            return;
        }
        let last = actor.as_ref().map(|a| a.get_id());
        let next = draining
            .wait_for(|d| match d.get(&name) {
                None => true,
                Some(a) => a.as_ref().map(|a| a.get_id()) != last && a.is_some(),
            })
            .await;
        match next.ok().and_then(|d| d.get(&name).cloned().flatten()) {
            Some(successor) => actor = Some(successor),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests;
