//! The DeploymentActor itself: events in, one reconcile step, statuses out.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use flotilla_core::{
    AppName, DeploymentStatus, DeploymentStatusInfo, DeploymentTrigger, DeploymentVersion,
    ReplicaState, naming,
};
use flotilla_replica::{
    DeploymentRoute, Directory, Registry, ReplicaActor, ReplicaArgs, ReplicaEndpoint, ReplicaEvent,
    ReplicaId, ReplicaMsg, ReplicaPhase, ReplicaReporter, START_FAILED,
};
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
    rpc::CallResult,
};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{
    Cluster, DeploymentEvent, DeploymentMsg, DeploymentReporter, DeploymentSnapshot,
    DeploymentTarget, ReplicaInfo,
    plan::{ReplicaView, plan},
};

/// Most constructor retries before DEPLOY_FAILED (Ray's
/// `MAX_DEPLOYMENT_CONSTRUCTOR_RETRY_COUNT`); the limit is min(this, 3 x target).
pub const MAX_CONSTRUCTOR_RETRIES: u32 = 20;
/// First constructor retry delay; doubles per failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest retry delay below the retry limit.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Retry delay once DEPLOY_FAILED ("keeps retrying slowly").
pub const FAILED_BACKOFF: Duration = Duration::from_secs(30);
/// Retry delay when no node has room.
pub const PLACEMENT_RETRY: Duration = Duration::from_secs(1);
/// How long a re-adopting actor waits for a replica to describe itself.
const OBSERVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything a DeploymentActor needs; a restarted one gets the same.
#[derive(Clone)]
pub struct DeploymentArgs {
    /// The Serve instance's namespace.
    pub ns: String,
    /// The application.
    pub app: AppName,
    /// The target.
    pub target: DeploymentTarget,
    /// Where code is registered.
    pub registry: Registry,
    /// Routes, shared with handles.
    pub directory: Directory,
    /// Where replicas run.
    pub cluster: Arc<dyn Cluster>,
    /// How it reports to its ApplicationActor.
    pub reporter: DeploymentReporter,
}

/// The deployment actor.
pub struct DeploymentActor;

struct Replica {
    actor: ActorRef<ReplicaMsg>,
    state: ReplicaState,
    version: DeploymentVersion,
    endpoint: Option<Arc<ReplicaEndpoint>>,
    node: String,
}

/// The DeploymentActor's state.
pub struct DeploymentState {
    args: DeploymentArgs,
    version: DeploymentVersion,
    route: Arc<DeploymentRoute>,
    replicas: BTreeMap<ReplicaId, Replica>,
    by_actor: HashMap<ActorId, ReplicaId>,
    status: DeploymentStatusInfo,
    reported: Option<(u64, DeploymentStatusInfo)>,
    failures: u32,
    has_started: bool,
    backoff: Option<JoinHandle<()>>,
    shutdown: Vec<RpcReplyPort<()>>,
}

impl DeploymentState {
    fn target_count(&self) -> u32 {
        if self.args.target.deleting || !self.shutdown.is_empty() {
            0
        } else {
            self.args.target.replicas
        }
    }

    fn retry_limit(&self) -> u32 {
        MAX_CONSTRUCTOR_RETRIES.min(3 * self.args.target.replicas.max(1))
    }

    fn set_state(&mut self, id: ReplicaId, to: ReplicaState) {
        if let Some(r) = self.replicas.get_mut(&id)
            && r.state != to
        {
            info!(app = %self.args.app, deployment = %self.args.target.spec.name,
                replica = %id, from = %r.state, to = %to, "replica state");
            r.state = to;
        }
    }

    fn forget(&mut self, id: ReplicaId) {
        if let Some(r) = self.replicas.remove(&id) {
            self.by_actor.remove(&r.actor.get_id());
            self.args.cluster.release(id);
        }
    }

    fn publish(&self) {
        let set = self
            .replicas
            .values()
            .filter(|r| matches!(r.state, ReplicaState::Running | ReplicaState::Updating))
            .filter_map(|r| r.endpoint.clone())
            .filter(|e| e.is_accepting())
            .collect();
        self.route.publish(set);
    }

    fn report(&mut self) {
        let cur = (self.args.target.generation, self.status.clone());
        if self.reported.as_ref() != Some(&cur) {
            self.reported = Some(cur);
            (self.args.reporter)(DeploymentEvent::Status {
                name: self.args.target.spec.name.clone(),
                generation: self.args.target.generation,
                status: self.status.clone(),
            });
        }
    }

    fn transition(&mut self, trigger: DeploymentTrigger, message: String) {
        let from = self.status.status;
        if self.status.handle(trigger, message) && from != self.status.status {
            info!(app = %self.args.app, deployment = %self.args.target.spec.name,
                from = %from, to = %self.status.status, message = %self.status.message,
                "deployment status");
        }
    }

    fn snapshot(&self) -> DeploymentSnapshot {
        DeploymentSnapshot {
            target: self.args.target.clone(),
            status: self.status.clone(),
            replicas: self
                .replicas
                .iter()
                .map(|(id, r)| ReplicaInfo {
                    id: *id,
                    state: r.state,
                    version: r.version.clone(),
                    node: r.node.clone(),
                })
                .collect(),
            startup_failures: self.failures,
        }
    }

    fn reporter_for_replicas(&self) -> ReplicaReporter {
        let name = naming::deployment(&self.args.ns, &self.args.app, &self.args.target.spec.name);
        Arc::new(move |id, event| {
            if let Some(me) = ActorRef::<DeploymentMsg>::where_is(name.clone()) {
                let _ = me.cast(DeploymentMsg::Replica(id, event));
            }
        })
    }
}

fn phase_state(p: ReplicaPhase) -> ReplicaState {
    match p {
        ReplicaPhase::Starting => ReplicaState::Starting,
        ReplicaPhase::Running => ReplicaState::Running,
        ReplicaPhase::Updating => ReplicaState::Updating,
        ReplicaPhase::Stopping => ReplicaState::Stopping,
    }
}

impl DeploymentActor {
    /// Find the living replicas of this deployment (their process group) and learn
    /// their state: a restarted DeploymentActor starts from what is alive.
    async fn adopt(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
        let a = &state.args;
        let group = naming::replica_group(&a.ns, &a.app, &a.target.spec.name);
        for cell in ractor::pg::get_members(&group) {
            let r: ActorRef<ReplicaMsg> = cell.clone().into();
            let Ok(CallResult::Success(snap)) =
                r.call(ReplicaMsg::Observe, Some(OBSERVE_TIMEOUT)).await
            else {
                continue;
            };
            myself.get_cell().monitor(cell.clone());
            info!(app = %state.args.app, deployment = %state.args.target.spec.name,
                replica = %snap.id, phase = ?snap.phase, "re-adopted living replica");
            state.by_actor.insert(cell.get_id(), snap.id);
            state.replicas.insert(
                snap.id,
                Replica {
                    actor: r,
                    state: phase_state(snap.phase),
                    version: snap.version,
                    endpoint: snap.endpoint,
                    node: snap.node,
                },
            );
        }
    }

    async fn start_replica(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
    ) -> Result<(), String> {
        let id = ReplicaId::fresh();
        let a = &state.args;
        let node = a
            .cluster
            .place(id, &a.target.spec.config.resources)
            .map_err(|r| r.to_string())?;
        let args = ReplicaArgs {
            id,
            app: a.app.clone(),
            deployment: a.target.spec.name.clone(),
            spec: a.target.spec.clone(),
            registry: a.registry.clone(),
            directory: a.directory.clone(),
            route: state.route.clone(),
            reporter: state.reporter_for_replicas(),
            group: naming::replica_group(&a.ns, &a.app, &a.target.spec.name),
            node: node.clone(),
        };
        let name = naming::replica(&a.ns, &a.app, &a.target.spec.name, id.0);
        match Actor::spawn(Some(name), ReplicaActor, args).await {
            Ok((actor, _)) => {
                myself.get_cell().monitor(actor.get_cell());
                state.by_actor.insert(actor.get_id(), id);
                state.replicas.insert(
                    id,
                    Replica {
                        actor,
                        state: ReplicaState::Starting,
                        version: state.version.clone(),
                        endpoint: None,
                        node,
                    },
                );
                info!(app = %state.args.app, deployment = %state.args.target.spec.name,
                    replica = %id, "replica -> STARTING");
                Ok(())
            }
            Err(e) => {
                state.args.cluster.release(id);
                Err(format!("could not spawn replica actor: {e}"))
            }
        }
    }

    fn schedule_retry(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
        after: Duration,
    ) {
        if state.backoff.is_none() {
            let me = myself.clone();
            state.backoff = Some(tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = me.cast(DeploymentMsg::Retry);
            }));
        }
    }

    /// One reconcile step (level-triggered: safe to run after any event).
    async fn reconcile(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
        let views: Vec<ReplicaView> = state
            .replicas
            .iter()
            .map(|(id, r)| ReplicaView {
                id: *id,
                state: r.state,
                version: r.version.clone(),
            })
            .collect();
        let target = state.target_count();
        let p = plan(
            target,
            &state.version,
            state.args.target.spec.config.rollout,
            &views,
            state.backoff.is_none(),
        );
        for id in p.reconfigure {
            if let Some(r) = state.replicas.get(&id) {
                let _ = r.actor.cast(ReplicaMsg::Reconfigure(Box::new(
                    state.args.target.spec.clone(),
                )));
            }
            state.set_state(id, ReplicaState::Updating);
        }
        for (id, graceful) in p.stop {
            if let Some(r) = state.replicas.get(&id) {
                let _ = r.actor.cast(ReplicaMsg::Stop { graceful });
            }
            state.set_state(id, ReplicaState::Stopping);
        }
        for _ in 0..p.start {
            if let Err(why) = Self::start_replica(myself, state).await {
                warn!(app = %state.args.app, deployment = %state.args.target.spec.name,
                    %why, "replica pending");
                if state.status.status != DeploymentStatus::DeployFailed {
                    state.status.message = format!("replicas pending: {why}");
                }
                Self::schedule_retry(myself, state, PLACEMENT_RETRY);
                break;
            }
        }
        state.publish();
        Self::update_status(state);
        state.report();
        if target == 0 && state.replicas.is_empty() {
            Self::finish(myself, state);
        }
    }

    fn update_status(state: &mut DeploymentState) {
        if state.args.target.deleting || !state.shutdown.is_empty() {
            return;
        }
        let at_target = state
            .replicas
            .values()
            .filter(|r| r.state == ReplicaState::Running && r.version == state.version)
            .count() as u32;
        let others = state
            .replicas
            .values()
            .filter(|r| r.state != ReplicaState::Stopping)
            .count() as u32
            - at_target;
        if at_target > 0 {
            state.has_started = true;
        }
        if at_target == state.args.target.replicas && others == 0 {
            state.failures = 0;
            state.transition(DeploymentTrigger::Healthy, String::new());
        }
    }

    /// No replica left and none wanted: deleted (or shut down).
    fn finish(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
        let a = &state.args;
        if !state.shutdown.is_empty() {
            for reply in state.shutdown.drain(..) {
                let _ = reply.send(());
            }
        } else {
            info!(app = %a.app, deployment = %a.target.spec.name, "deployment deleted");
            (a.reporter)(DeploymentEvent::Deleted {
                name: a.target.spec.name.clone(),
                generation: a.target.generation,
            });
        }
        a.directory.remove(&a.app, &a.target.spec.name);
        myself.stop(None);
    }

    fn set_target(state: &mut DeploymentState, target: DeploymentTarget) {
        let old = &state.args.target;
        let spec_changed = old.spec != target.spec;
        let (from, to) = (old.replicas, target.replicas);
        let deleting = target.deleting && !old.deleting;
        let undeleting = !target.deleting && old.deleting;
        state
            .route
            .set_max_queued(target.spec.config.max_queued_requests);
        state.version = target.spec.version();
        state.args.target = target;
        if deleting {
            state.transition(DeploymentTrigger::Delete, String::new());
        } else if spec_changed || undeleting {
            state.failures = 0;
            state.has_started = false;
            state.transition(DeploymentTrigger::ConfigUpdate, String::new());
        } else if to > from {
            state.transition(
                DeploymentTrigger::ManuallyIncrease,
                format!("Upscaling from {from} to {to} replicas."),
            );
        } else if to < from {
            state.transition(
                DeploymentTrigger::ManuallyDecrease,
                format!("Downscaling from {from} to {to} replicas."),
            );
        }
    }

    fn on_start_failed(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
        id: ReplicaId,
        error: String,
    ) {
        let stale = state
            .replicas
            .get(&id)
            .is_some_and(|r| r.version.code != state.version.code);
        state.forget(id);
        if stale || state.target_count() == 0 {
            return;
        }
        state.failures += 1;
        let limit = state.retry_limit();
        let name = &state.args.target.spec.name;
        if state.failures >= limit && !state.has_started {
            state.transition(
                DeploymentTrigger::ReplicaStartupFailed,
                format!(
                    "The deployment '{name}' failed to start a replica {} times (retry limit {limit}); still retrying every {}s. Last error: {error}",
                    state.failures,
                    FAILED_BACKOFF.as_secs()
                ),
            );
            Self::schedule_retry(myself, state, FAILED_BACKOFF);
        } else {
            if matches!(
                state.status.status,
                DeploymentStatus::Updating
                    | DeploymentStatus::Upscaling
                    | DeploymentStatus::Downscaling
            ) {
                state.status.message = format!(
                    "A replica failed to start ({} of {limit} retries used). Error: {error}",
                    state.failures
                );
            }
            let exp = state.failures.saturating_sub(1).min(16);
            let delay = FIRST_BACKOFF.saturating_mul(1 << exp).min(MAX_BACKOFF);
            Self::schedule_retry(myself, state, delay);
        }
    }
}

impl Actor for DeploymentActor {
    type Msg = DeploymentMsg;
    type State = DeploymentState;
    type Arguments = DeploymentArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<DeploymentMsg>,
        args: DeploymentArgs,
    ) -> Result<DeploymentState, ActorProcessingErr> {
        ractor::pg::join(
            naming::deployment_group(&args.ns, &args.app),
            vec![myself.get_cell()],
        );
        let route = args.directory.route(&args.app, &args.target.spec.name);
        route.set_max_queued(args.target.spec.config.max_queued_requests);
        let mut status = DeploymentStatusInfo::default();
        if args.target.deleting {
            status.handle(DeploymentTrigger::Delete, "");
        }
        Ok(DeploymentState {
            version: args.target.spec.version(),
            args,
            route,
            replicas: BTreeMap::new(),
            by_actor: HashMap::new(),
            status,
            reported: None,
            failures: 0,
            has_started: false,
            backoff: None,
            shutdown: Vec::new(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
    ) -> Result<(), ActorProcessingErr> {
        Self::adopt(&myself, state).await;
        Self::reconcile(&myself, state).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<DeploymentMsg>,
        msg: DeploymentMsg,
        state: &mut DeploymentState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DeploymentMsg::SetTarget(target) => {
                if *target != state.args.target {
                    Self::set_target(state, *target);
                }
            }
            DeploymentMsg::Replica(id, event) => {
                if !state.replicas.contains_key(&id) {
                    // A replica we never heard of: started by a predecessor that
                    // crashed between spawn and group join; adopt it by name.
                    let a = &state.args;
                    let name = naming::replica(&a.ns, &a.app, &a.target.spec.name, id.0);
                    if let Some(cell) = ractor::registry::where_is(name) {
                        Self::adopt_one(&myself, state, id, cell);
                    } else {
                        return Ok(());
                    }
                }
                match event {
                    ReplicaEvent::Ready { endpoint, version } => {
                        if let Some(r) = state.replicas.get_mut(&id) {
                            r.endpoint = Some(endpoint);
                            r.version = version;
                        }
                        if state
                            .replicas
                            .get(&id)
                            .is_some_and(|r| r.state == ReplicaState::Starting)
                        {
                            state.set_state(id, ReplicaState::Running);
                        }
                    }
                    ReplicaEvent::Reconfigured { version } => {
                        if let Some(r) = state.replicas.get_mut(&id) {
                            r.version = version;
                        }
                        if state
                            .replicas
                            .get(&id)
                            .is_some_and(|r| r.state == ReplicaState::Updating)
                        {
                            state.set_state(id, ReplicaState::Running);
                        }
                    }
                    ReplicaEvent::StartFailed { error } => {
                        Self::on_start_failed(&myself, state, id, error);
                    }
                    ReplicaEvent::Unhealthy { reason } => {
                        let at_target = state
                            .replicas
                            .get(&id)
                            .is_some_and(|r| r.version.code == state.version.code);
                        if let Some(r) = state.replicas.get(&id) {
                            let _ = r.actor.cast(ReplicaMsg::Stop { graceful: true });
                        }
                        state.set_state(id, ReplicaState::Stopping);
                        if at_target && state.target_count() > 0 {
                            state.transition(DeploymentTrigger::HealthCheckFailed, reason);
                        }
                    }
                }
            }
            DeploymentMsg::Retry => {
                state.backoff = None;
            }
            DeploymentMsg::Observe(reply) => {
                let _ = reply.send(state.snapshot());
                return Ok(());
            }
            DeploymentMsg::Shutdown(reply) => {
                state.shutdown.push(reply);
            }
        }
        Self::reconcile(&myself, state).await;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<DeploymentMsg>,
        evt: SupervisionEvent,
        state: &mut DeploymentState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &evt {
            SupervisionEvent::ActorTerminated(c, _, reason) => (c, reason.clone()),
            SupervisionEvent::ActorFailed(c, e) => (c, Some(format!("replica actor crashed: {e}"))),
            _ => return Ok(()),
        };
        let Some(id) = state.by_actor.get(&cell.get_id()).copied() else {
            return Ok(());
        };
        let starting = state
            .replicas
            .get(&id)
            .is_some_and(|r| r.state == ReplicaState::Starting);
        match why {
            // It died before it ever ran: a startup failure, counted and backed off.
            Some(why) if starting => {
                let error = why.strip_prefix(START_FAILED).unwrap_or(&why).to_owned();
                Self::on_start_failed(&myself, state, id, error);
            }
            Some(why) => {
                warn!(app = %state.args.app, deployment = %state.args.target.spec.name,
                    replica = %id, %why, "replica exited");
                state.forget(id);
            }
            None => state.forget(id),
        }
        Self::reconcile(&myself, state).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.backoff.take() {
            t.abort();
        }
        Ok(())
    }
}

impl DeploymentActor {
    fn adopt_one(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
        id: ReplicaId,
        cell: ActorCell,
    ) {
        myself.get_cell().monitor(cell.clone());
        state.by_actor.insert(cell.get_id(), id);
        state.replicas.insert(
            id,
            Replica {
                actor: cell.into(),
                state: ReplicaState::Starting,
                version: state.version.clone(),
                endpoint: None,
                node: String::new(),
            },
        );
    }
}
