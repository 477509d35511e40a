//! The DeploymentActor itself: events in, one reconcile step, statuses out.

use std::{sync::Arc, time::Duration};

use flotilla_cluster::{Cluster, ClusterEvent, PLACEMENT_RETRY};
use flotilla_core::{
    AppName, DeploymentSpec, DeploymentTrigger, FaultPoint, Faults, ReplicaCount, ReplicaState,
    actor_names,
};
use flotilla_replica::{Directory, Registry, ReplicaEvent, ReplicaId, ReplicaMsg};
use flotilla_supervision::{ChildExit, groups};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::{
    DeploymentEvent, DeploymentMsg, DeploymentReporter, DeploymentTarget,
    messages::{Internal, InternalMsg},
    placement::{self, StartError},
    plan::{Starts, plan},
    recovery::{self, Recovered},
    state::DeploymentState,
};

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
    /// Armed fault points (fault injection; free when unarmed).
    pub faults: Faults,
}

/// The deployment actor.
pub struct DeploymentActor;

/// Whether `new` differs from `old` by at most a fixed replica count (Ray's
/// "scaled copy": a MANUALLY_INCREASE/DECREASE, not a CONFIG_UPDATE).
fn scaled_copy(old: &DeploymentSpec, new: &DeploymentSpec) -> bool {
    if let (ReplicaCount::Fixed(_), ReplicaCount::Fixed(n)) =
        (&old.config.num_replicas, &new.config.num_replicas)
    {
        let mut same_count = old.clone();
        same_count.config.num_replicas = ReplicaCount::Fixed(*n);
        same_count == *new
    } else {
        old == new
    }
}

impl DeploymentActor {
    /// Hold replica starts back for `after` from now (constructor backoff), or
    /// as long as a backoff already armed holds them, whichever ends later:
    /// failures that come together back off as long as the last one's count
    /// says (Ray's backoff grows with each failure), even when the armed timer
    /// has already fired and its `Retry` waits in the mailbox.
    fn schedule_retry(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
        after: Duration,
    ) {
        let until = Instant::now() + after;
        if state.backoff.as_ref().is_some_and(|(at, _)| *at >= until) {
            return;
        }
        if let Some((_, t)) = state.backoff.take() {
            t.abort();
        }
        let me = myself.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            let _ = me.cast(InternalMsg::Retry(until).into());
        });
        state.backoff = Some((until, timer));
    }

    /// Arm the slow-start timer for the next moment a warning may be due.
    fn arm_slow_timer(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
        let Some(due) = state.slow_start_due() else {
            if let Some((_, t)) = state.slow.timer.take() {
                t.abort();
            }
            state.clear_slow_message();
            return;
        };
        if state.slow.timer.as_ref().is_some_and(|(at, _)| *at <= due) {
            // An earlier check is armed; it re-arms for this one.
            return;
        }
        if let Some((_, t)) = state.slow.timer.take() {
            t.abort();
        }
        let me = myself.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            let _ = me.cast(InternalMsg::SlowStartCheck.into());
        });
        state.slow.timer = Some((due, timer));
    }

    /// Reconcile after the messages queued now: a replica's event or exit
    /// changes one replica, and a burst of them (thousands of replicas
    /// starting or stopping at once) shares one pass over every replica
    /// instead of one pass each.
    fn reconcile_soon(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
        state.unreconciled = true;
        if !state.reconcile_queued {
            state.reconcile_queued = myself.cast(InternalMsg::Reconcile.into()).is_ok();
        }
    }

    /// One reconcile step (level-triggered: safe to run after any event).
    ///
    /// Boxed: ractor keeps one loop future per actor, sized for its largest
    /// handler, and this step's frame would stay in it for the actor's whole life;
    /// a small allocation per message costs less than that resident memory.
    async fn reconcile(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
        state.unreconciled = false;
        Box::pin(Self::reconcile_step(myself, state)).await;
    }

    async fn reconcile_step(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
        let target = state.target_count();
        let can_start = state.backoff.is_none();
        let starts = match (can_start, state.pending.count > 0) {
            (false, _) => Starts::HeldBack,
            (true, true) => Starts::NoRoom,
            (true, false) => Starts::Allowed,
        };
        let p = plan(
            target,
            &state.version,
            state.args.target.spec.config.rollout,
            &state.views(),
            starts,
        );
        for id in p.reconfigure {
            state.cast(id, ReplicaMsg::Reconfigure(state.args.target.spec.clone()));
            state.set_state(
                id,
                ReplicaState::Updating,
                "config changed: reconfigure in place",
            );
        }
        for (id, graceful) in p.stop {
            let why = if target == 0 {
                "no replica wanted (deleting or scaled to zero)"
            } else if !state.at_target_code(id) {
                "outdated code version (rolling update)"
            } else {
                "more replicas than the target (scale-down)"
            };
            state.stop(id, graceful, why);
        }
        if p.start > 0 {
            // Armed before trying, so capacity freed while we try still wakes us.
            state.set_wants_capacity(true);
        }
        let mut refused = None;
        for i in 0..p.start {
            // Boxed: inline, a replica's placement and spawn would enlarge the
            // loop future every message of this actor runs in.
            match Box::pin(placement::start_replica(myself, state)).await {
                Ok(()) => {}
                Err(StartError::NoRoom(refusal)) => {
                    refused = Some((p.start - i, refusal.to_string()));
                    break;
                }
                Err(StartError::Spawn(id, error)) => {
                    warn!(app = %state.args.app, deployment = %state.args.target.spec.name,
                        replica = %id, %error, "replica not started");
                    let delay = state.record_startup_failure(id, &error.to_string());
                    Self::schedule_retry(myself, state, delay);
                    break;
                }
            }
        }
        // Refused while starts were allowed: the cluster is full. A roll frees
        // room by stopping old replicas first, which only a plan that knows
        // there is no room does: during a roll, plan again now (Ray decides
        // both in one pass), not when a timer or freed capacity next wakes
        // this actor.
        let plan_again = starts == Starts::Allowed
            && refused.is_some()
            && state.replicas.keys().any(|id| !state.at_target_code(*id));
        if can_start {
            match refused {
                Some((n, why)) => {
                    state.set_pending(n, why);
                    if !state.evented_cluster && state.placement_timer.is_none() {
                        let me = myself.clone();
                        state.placement_timer = Some(tokio::spawn(async move {
                            tokio::time::sleep(PLACEMENT_RETRY).await;
                            let _ = me.cast(InternalMsg::PlacementRetry.into());
                        }));
                    }
                }
                None => state.set_pending(0, String::new()),
            }
        }
        state.publish();
        state.update_status();
        Self::arm_slow_timer(myself, state);
        state.report();
        if plan_again {
            // Once: the next pass plans with `Starts::NoRoom`.
            return Box::pin(Self::reconcile_step(myself, state)).await;
        }
        // Zero replicas wanted is a live deployment (scaled to zero) unless it is
        // being deleted or shut down.
        let leaving = state.args.target.deleting || !state.shutdown.is_empty();
        if leaving && state.replicas.is_empty() {
            Self::finish(myself, state);
        }
    }

    /// No replica left and none wanted: deleted (or shut down).
    fn finish(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
        let a = &state.args;
        if !state.shutdown.is_empty() {
            // Shut down, not deleted: the route stays until the instance closes
            // every route at once (its callers then hear `Unavailable`).
            for reply in state.shutdown.drain(..) {
                let _ = reply.send(());
            }
        } else {
            info!(app = %a.app, deployment = %a.target.spec.name, "deployment deleted");
            (a.reporter)(DeploymentEvent::Deleted {
                name: a.target.spec.name.clone(),
                generation: a.target.generation,
            });
            a.directory.remove(&a.app, &a.target.spec.name);
            // Other processes close their copies too (docs/nodes.md).
            a.cluster.route_changed(&state.route);
        }
        myself.stop(None);
    }

    fn set_target(state: &mut DeploymentState, target: DeploymentTarget) {
        let old = &state.args.target;
        let spec_changed = !scaled_copy(&old.spec, &target.spec);
        let (from, to) = (old.replicas, target.replicas);
        let deleting = target.deleting && !old.deleting;
        let undeleting = !target.deleting && old.deleting;
        if state
            .route
            .configure(&target.spec.config, &state.args.registry)
        {
            // Other processes copy these settings (docs/nodes.md).
            state.args.cluster.route_changed(&state.route);
        }
        state.version = target.spec.version();
        state.args.target = target;
        if deleting {
            // (UPDATING, DELETING) until it is gone: the count's fall to 0 is
            // no autoscaling decision (Ray's `autoscale` does nothing while
            // deleting).
            state.transition(DeploymentTrigger::Delete, String::new(), None);
            return;
        } else if spec_changed || undeleting {
            // A new spec starts with a clean slate: no failures, no backoff,
            // no autoscaling decision half through its delay.
            state.failures = 0;
            if let Some((autoscaler, _)) = &mut state.autoscaler {
                autoscaler.restart_delay();
            }
            state.has_started = false;
            if let Some((_, t)) = state.backoff.take() {
                t.abort();
            }
            state.transition(DeploymentTrigger::ConfigUpdate, String::new(), None);
            return;
        }
        if to == from {
            return;
        }
        let autoscaled = match &state.args.target.spec.config.num_replicas {
            ReplicaCount::Auto(a) => {
                // As Ray's `autoscale`: a decision changes the status only
                // while the replicas RUNNING at the target version are within
                // the bounds. Mid-update they are not: it stays UPDATING.
                let running = state
                    .replicas
                    .values()
                    .filter(|r| r.state == ReplicaState::Running && r.version == state.version)
                    .count() as u32;
                if !(a.min_replicas..=a.max_replicas).contains(&running) {
                    info!(app = %state.args.app, deployment = %state.args.target.spec.name,
                        from, to, running, "autoscaling target changed mid-update");
                    return;
                }
                true
            }
            ReplicaCount::Fixed(_) => false,
        };
        if !autoscaled {
            // A user's new replica count is a new deploy: as Ray's `deploy`, the
            // retry count and the backoff start afresh (an autoscaling decision
            // keeps them, as Ray's `_set_target_state_autoscaling` does).
            state.failures = 0;
            if let Some((_, t)) = state.backoff.take() {
                t.abort();
            }
        }
        let (trigger, verb) = match (autoscaled, to > from) {
            (true, true) => (DeploymentTrigger::AutoscaleUp, "Upscaling"),
            (true, false) => (DeploymentTrigger::AutoscaleDown, "Downscaling"),
            (false, true) => (DeploymentTrigger::ManuallyIncrease, "Upscaling"),
            (false, false) => (DeploymentTrigger::ManuallyDecrease, "Downscaling"),
        };
        state.transition(
            trigger,
            format!("{verb} from {from} to {to} replicas."),
            None,
        );
    }

    /// A replica failed to start: stop and forget it, count it (unless it was
    /// outdated) and back off before starting another.
    fn on_start_failed(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
        id: ReplicaId,
        error: String,
    ) {
        let error = state.naming_node(id, error);
        let at_target = state.at_target_code(id);
        // One already stopping was counted, if it had to be, when it was
        // stopped (its node died) or needs no count (a scale-down): a
        // failure it reports late (a node's frame crossing the node's loss)
        // is not counted again.
        let stopping = state
            .replicas
            .get(&id)
            .is_none_or(|r| r.state == ReplicaState::Stopping);
        state.cast(id, ReplicaMsg::Stop { graceful: false });
        state.forget(id, &format!("failed to start: {error}"));
        if !stopping {
            Self::count_startup_failure(myself, state, id, at_target, &error);
        }
    }

    /// Count a startup failure of `id` and back off, unless it was outdated
    /// (`at_target`: of the target's code) or no replica is wanted.
    fn count_startup_failure(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
        id: ReplicaId,
        at_target: bool,
        error: &str,
    ) {
        if at_target && state.target_count() > 0 {
            let delay = state.record_startup_failure(id, error);
            Self::schedule_retry(myself, state, delay);
        }
    }

    /// A living replica failed to become ready for the target (its
    /// reconfigure failed, or it turned unhealthy while UPDATING or
    /// RECOVERING): stopped gracefully (its requests drain) and counted as a
    /// startup failure, as Ray's `_check_startup_replicas` does with a FAILED
    /// one, unless it was outdated.
    fn not_ready(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
        id: ReplicaId,
        error: &str,
    ) {
        let error = state.naming_node(id, error.to_owned());
        let at_target = state.at_target_code(id);
        state.stop(id, true, &error);
        Self::count_startup_failure(myself, state, id, at_target, &error);
    }

    fn on_replica_event(
        myself: &ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
        id: ReplicaId,
        event: ReplicaEvent,
    ) {
        if !state.replicas.contains_key(&id) {
            // A replica we never heard of: started by a predecessor that crashed
            // between spawn and group join; adopt it by name.
            let a = &state.args;
            let name = actor_names::replica(&a.ns, &a.app, &a.target.spec.name, id.0);
            match ractor::registry::where_is(name) {
                Some(cell) => recovery::adopt(myself, state, id, cell),
                None => return,
            }
        }
        let current = state.replicas.get(&id).map(|r| r.state);
        match event {
            ReplicaEvent::Ready { endpoint, version } => {
                if matches!(
                    current,
                    Some(ReplicaState::Starting | ReplicaState::Recovering)
                ) {
                    if let Some(r) = state.replicas.get_mut(&id) {
                        // An adopted replica can say it is ready before it
                        // answers `Observe`: its endpoint knows its node.
                        if r.node.is_empty() {
                            r.node = endpoint.node().to_owned();
                        }
                        r.limit = endpoint.max_ongoing_requests();
                        r.endpoint = Some(endpoint);
                        r.version = version;
                    }
                    state.set_state(id, ReplicaState::Running, "constructed and healthy");
                }
            }
            ReplicaEvent::Reconfigured { version } => {
                if let Some(r) = state.replicas.get_mut(&id)
                    && r.state != ReplicaState::Stopping
                {
                    r.version = version;
                    // Its endpoint took the new config's `max_ongoing_requests`,
                    // which other processes copy with the route (docs/nodes.md).
                    if let Some(e) = &r.endpoint
                        && e.max_ongoing_requests() != r.limit
                    {
                        r.limit = e.max_ongoing_requests();
                        if e.is_accepting() {
                            state.args.cluster.route_changed(&state.route);
                        }
                    }
                }
                if matches!(
                    current,
                    Some(ReplicaState::Updating | ReplicaState::Recovering)
                ) {
                    state.set_state(id, ReplicaState::Running, "reconfigured in place");
                }
            }
            ReplicaEvent::StartFailed { error } => {
                Self::on_start_failed(myself, state, id, error);
            }
            ReplicaEvent::Unhealthy { reason } => {
                if current == Some(ReplicaState::Stopping) {
                    return;
                }
                // Ray health-checks RUNNING replicas only (a replica checks
                // itself only while it runs): one that turned UPDATING or
                // RECOVERING here before its report came, and fails, is a
                // startup failure (from UPDATING a health-check failure
                // would be DEPLOY_FAILED).
                if matches!(
                    current,
                    Some(ReplicaState::Updating | ReplicaState::Recovering)
                ) {
                    Self::not_ready(myself, state, id, &reason);
                    return;
                }
                let at_target = state.at_target_version(id);
                state.stop(id, true, &reason);
                state.replica_lost(id, at_target, &reason);
            }
            ReplicaEvent::ReconfigureFailed { error } => {
                if current == Some(ReplicaState::Stopping) {
                    return;
                }
                Self::not_ready(myself, state, id, &error);
            }
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
        let membership = groups::join(
            actor_names::deployment_group(&args.ns, &args.app),
            myself.get_cell(),
        );
        let route = args.directory.route(&args.app, &args.target.spec.name);
        if route.configure(&args.target.spec.config, &args.registry) {
            args.cluster.route_changed(&route);
        }
        Ok(DeploymentState::new(args, route, membership))
    }

    async fn post_start(
        &self,
        myself: ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
    ) -> Result<(), ActorProcessingErr> {
        placement::subscribe(&myself, state);
        state.check_code();
        crate::autoscale::arm(&myself, state);
        recovery::adopt_all(&myself, state);
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
                if *target == state.args.target {
                    // The same target twice changes nothing.
                    return Ok(());
                }
                Self::set_target(state, *target);
                state.check_code();
                crate::autoscale::arm(&myself, state);
            }
            DeploymentMsg::Observe(reply) => {
                // What it shows is reconciled, as after any other message.
                if state.unreconciled {
                    Self::reconcile(&myself, state).await;
                }
                let _ = reply.send(state.snapshot());
                return Ok(());
            }
            DeploymentMsg::Shutdown(reply) => state.shutdown.push(reply),
            DeploymentMsg::Internal(Internal(m)) => match m {
                InternalMsg::Replica(id, event) => {
                    Self::on_replica_event(&myself, state, id, event);
                    Self::reconcile_soon(&myself, state);
                    return Ok(());
                }
                InternalMsg::Reconcile => {
                    state.reconcile_queued = false;
                    if !state.unreconciled {
                        // Another message's pass came first.
                        return Ok(());
                    }
                }
                InternalMsg::Retry(until) => {
                    if state.backoff.as_ref().is_some_and(|(at, _)| *at == until) {
                        state.backoff = None;
                    }
                }
                InternalMsg::PlacementRetry => state.placement_timer = None,
                InternalMsg::Recovered(id, snap) => match recovery::recovered(state, id, snap) {
                    Recovered::Known => {}
                    Recovered::StartFailed(error) => {
                        Self::on_start_failed(&myself, state, id, error);
                    }
                    Recovered::NotReady(error) => Self::not_ready(&myself, state, id, &error),
                },
                InternalMsg::Cluster(ClusterEvent::CapacityFreed) => {}
                InternalMsg::Cluster(ClusterEvent::NodeDied(node)) => {
                    for (id, error) in placement::node_died(state, &node) {
                        // Lost before it was ready for the target (of its
                        // code): a startup failure, not a health-check one.
                        Self::count_startup_failure(&myself, state, id, true, &error);
                    }
                }
                InternalMsg::ClusterResync => {
                    for (id, error) in placement::resync(state) {
                        Self::count_startup_failure(&myself, state, id, true, &error);
                    }
                }
                InternalMsg::SlowStartCheck => {
                    state.slow.timer = None;
                    state.check_slow_start(Instant::now());
                }
                InternalMsg::AutoscaleTick => {
                    crate::autoscale::tick(state);
                    return Ok(());
                }
            },
        }
        if state.args.faults.hit(FaultPoint::DeploymentReconcile) {
            return Err("injected fault: DeploymentReconcile".into());
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
        let Some((id, how)) = state.children.exited(&evt) else {
            return Ok(());
        };
        let was = state.replicas.get(&id).map(|r| r.state);
        match how {
            // Gone before it ever ran (killed or failed while constructing),
            // while a successor recovers it (its version is the target's only
            // as a stand-in), or while it takes a config in place: a startup
            // failure, counted and backed off, as Ray counts a replica that
            // fails recovery or its reconfigure. Not a health-check failure,
            // which from UPDATING would be DEPLOY_FAILED.
            how @ (ChildExit::Killed | ChildExit::Failed { .. })
                if matches!(
                    was,
                    Some(
                        ReplicaState::Starting | ReplicaState::Recovering | ReplicaState::Updating
                    )
                ) =>
            {
                Self::on_start_failed(&myself, state, id, format!("replica actor {how}"));
            }
            ChildExit::Stopped => state.forget(id, "stopped"),
            how @ (ChildExit::Killed | ChildExit::Failed { .. }) => {
                warn!(app = %state.args.app, deployment = %state.args.target.spec.name,
                    replica = %id, %how, "replica exited");
                let at_target = state.at_target_version(id);
                state.forget(id, &how.to_string());
                if was != Some(ReplicaState::Stopping) {
                    state.replica_lost(id, at_target, &format!("Replica {id} crashed: {how}"));
                }
            }
        }
        Self::reconcile_soon(&myself, state);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<DeploymentMsg>,
        state: &mut DeploymentState,
    ) -> Result<(), ActorProcessingErr> {
        state.set_wants_capacity(false);
        let timers = [
            state.backoff.take().map(|(_, t)| t),
            state.placement_timer.take(),
            state.slow.timer.take().map(|(_, t)| t),
            state.cluster_task.take(),
            state.autoscaler.take().map(|(_, t)| t),
        ];
        for t in timers.into_iter().flatten() {
            t.abort();
        }
        Ok(())
    }
}
