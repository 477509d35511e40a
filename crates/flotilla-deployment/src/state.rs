//! The DeploymentActor's state: its replicas and the one place their states change.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use flotilla_core::{
    DeploymentStatusInfo, DeploymentTrigger, DeploymentVersion, ReplicaState, actor_names,
};
use flotilla_replica::{DeploymentRoute, ReplicaEndpoint, ReplicaId, ReplicaMsg, ReplicaReporter};
use flotilla_supervision::{Children, Parent, groups::Membership};
use ractor::RpcReplyPort;
use tokio::{task::JoinHandle, time::Instant};
use tracing::{info, warn};

use crate::{
    DeploymentArgs, DeploymentEvent, DeploymentSnapshot, ReplicaInfo, StateCount,
    messages::InternalMsg, plan::ReplicaView,
};

/// What the DeploymentActor knows of one replica it owns (its actor is in
/// [`DeploymentState::children`]).
pub(crate) struct Replica {
    pub(crate) state: ReplicaState,
    pub(crate) version: DeploymentVersion,
    pub(crate) endpoint: Option<Arc<ReplicaEndpoint>>,
    /// Its endpoint's `max_ongoing_requests` when last seen (other processes
    /// copy it with the route: a change in place is exported).
    pub(crate) limit: u32,
    pub(crate) node: String,
    /// When it entered its current state (slow-start detection).
    pub(crate) since: Instant,
}

/// Replicas wanted but refused by the cluster.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) count: u32,
    pub(crate) since: Option<Instant>,
    pub(crate) reason: String,
}

/// The per-deployment slow-start timer and the last warning it produced.
#[derive(Default)]
pub(crate) struct SlowStart {
    pub(crate) timer: Option<(Instant, JoinHandle<()>)>,
    pub(crate) last_warned: Option<Instant>,
    /// The message it put on the status, to clear it once nothing is slow.
    pub(crate) message: Option<String>,
}

/// The DeploymentActor's state.
pub struct DeploymentState {
    pub(crate) args: DeploymentArgs,
    pub(crate) version: DeploymentVersion,
    pub(crate) route: Arc<DeploymentRoute>,
    /// Boxed: a B-tree node holds eleven values, so inline replicas would cost a
    /// deployment of one replica eleven replicas' worth of memory.
    pub(crate) replicas: BTreeMap<ReplicaId, Box<Replica>>,
    /// The replica actors, watched (never restarted: a lost replica is replaced
    /// by a new one under a new id).
    pub(crate) children: Children<ReplicaId, ReplicaMsg>,
    pub(crate) status: DeploymentStatusInfo,
    pub(crate) reported: Option<(u64, DeploymentStatusInfo)>,
    /// Consecutive startup failures (reset on a new spec and on HEALTHY).
    pub(crate) failures: u32,
    /// A replica at the target version has run since the last new spec.
    pub(crate) has_started: bool,
    /// Code the target names that the Registry does not have (a request router
    /// class, an autoscaling policy): only a recovered target can, since a
    /// call naming it is refused. While set, the status stays DEPLOY_FAILED
    /// naming it ([`check_code`](Self::check_code)).
    pub(crate) missing_code: Option<String>,
    /// Constructor backoff: while set, no replica starts; with the instant it
    /// ends.
    pub(crate) backoff: Option<(Instant, JoinHandle<()>)>,
    /// Placement retry timer, only for clusters that announce nothing.
    pub(crate) placement_timer: Option<JoinHandle<()>>,
    pub(crate) pending: Pending,
    pub(crate) slow: SlowStart,
    /// Set while replicas are pending: the cluster subscription forwards the next
    /// capacity event (and clears it), so bursts of releases wake us once.
    pub(crate) wants_capacity: Arc<AtomicBool>,
    /// Whether the cluster announces capacity and node deaths.
    pub(crate) evented_cluster: bool,
    pub(crate) cluster_task: Option<JoinHandle<()>>,
    /// A replica's event or exit was taken since the last pass over every
    /// replica.
    pub(crate) unreconciled: bool,
    /// An `InternalMsg::Reconcile` is queued: the replica events and exits
    /// queued before it share the one pass it makes.
    pub(crate) reconcile_queued: bool,
    pub(crate) shutdown: Vec<RpcReplyPort<()>>,
    /// The autoscaler and its sampling timer, for autoscaled deployments only.
    pub(crate) autoscaler: Option<(crate::autoscale::Autoscaler, JoinHandle<()>)>,
    /// How its replicas report here (one, shared by all of them).
    replica_reporter: ReplicaReporter,
    /// Its place in its application's group, left when this state is dropped.
    _membership: Membership,
}

/// How a replica of `app`/`deployment` in namespace `ns` reports to its
/// DeploymentActor: by name, so a restarted actor hears it (the head's node
/// registry gives one to the proxy of a replica a node re-attached with).
pub fn replica_reporter(
    ns: &str,
    app: &flotilla_core::AppName,
    deployment: &flotilla_core::DeploymentName,
) -> ReplicaReporter {
    let me: Parent<crate::DeploymentMsg> =
        Parent::new(actor_names::deployment(ns, app, deployment));
    Arc::new(move |id, event| me.cast(InternalMsg::Replica(id, event).into()))
}

/// Replica state changes a DeploymentActor may make (`None` = not owned).
fn allowed(from: Option<ReplicaState>, to: Option<ReplicaState>) -> bool {
    use ReplicaState::*;
    matches!(
        (from, to),
        (None, Some(Starting | Recovering))
            | (Some(_), None)
            | (Some(Starting), Some(Running | Stopping))
            | (
                Some(Recovering),
                Some(Starting | Running | Updating | Stopping)
            )
            | (Some(Running), Some(Updating | Stopping))
            | (Some(Updating), Some(Running | Stopping))
    )
}

fn name(s: Option<ReplicaState>) -> String {
    s.map_or_else(|| "-".to_owned(), |s| s.to_string())
}

impl DeploymentState {
    /// A fresh state for `args` (no replicas yet).
    pub(crate) fn new(
        args: DeploymentArgs,
        route: Arc<DeploymentRoute>,
        membership: Membership,
    ) -> Self {
        let replica_reporter = replica_reporter(&args.ns, &args.app, &args.target.spec.name);
        let mut status = DeploymentStatusInfo::default();
        if args.target.deleting {
            status.handle(DeploymentTrigger::Delete, "");
        }
        DeploymentState {
            version: args.target.spec.version(),
            args,
            route,
            replicas: BTreeMap::new(),
            children: Children::new(),
            status,
            reported: None,
            failures: 0,
            has_started: false,
            missing_code: None,
            backoff: None,
            placement_timer: None,
            pending: Pending::default(),
            slow: SlowStart::default(),
            wants_capacity: Arc::new(AtomicBool::new(false)),
            evented_cluster: false,
            cluster_task: None,
            unreconciled: false,
            reconcile_queued: false,
            shutdown: Vec::new(),
            autoscaler: None,
            replica_reporter,
            _membership: membership,
        }
    }

    /// The replica count wanted now (0 while deleting or shutting down).
    pub(crate) fn target_count(&self) -> u32 {
        if self.args.target.deleting || !self.shutdown.is_empty() {
            0
        } else {
            self.args.target.replicas
        }
    }

    fn log_transition(
        &self,
        id: ReplicaId,
        node: &str,
        from: Option<ReplicaState>,
        to: Option<ReplicaState>,
        why: &str,
    ) {
        info!(app = %self.args.app, deployment = %self.args.target.spec.name,
            replica = %id, node, from = %name(from), to = %name(to), why, "replica state");
    }

    /// Take ownership of a new replica (STARTING or RECOVERING).
    pub(crate) fn add(&mut self, id: ReplicaId, replica: Replica, why: &str) {
        debug_assert!(allowed(None, Some(replica.state)));
        self.log_transition(id, &replica.node, None, Some(replica.state), why);
        self.replicas.insert(id, Box::new(replica));
    }

    /// The one place a replica's state changes. Returns whether it changed; a
    /// change the state machine does not allow is logged and ignored.
    pub(crate) fn set_state(&mut self, id: ReplicaId, to: ReplicaState, why: &str) -> bool {
        let Some(r) = self.replicas.get(&id) else {
            return false;
        };
        let from = r.state;
        if from == to {
            return false;
        }
        if !allowed(Some(from), Some(to)) {
            warn!(app = %self.args.app, deployment = %self.args.target.spec.name,
                replica = %id, node = %r.node, from = %from, to = %to, why,
                "replica state change refused");
            return false;
        }
        self.log_transition(id, &r.node, Some(from), Some(to), why);
        if let Some(r) = self.replicas.get_mut(&id) {
            r.state = to;
            r.since = Instant::now();
        }
        true
    }

    /// Tell replica `id` to stop and mark it STOPPING.
    pub(crate) fn stop(&mut self, id: ReplicaId, graceful: bool, why: &str) {
        self.cast(id, ReplicaMsg::Stop { graceful });
        self.set_state(id, ReplicaState::Stopping, why);
    }

    /// Send `msg` to replica `id`'s actor (dropped if it is gone: its exit is
    /// on its way).
    pub(crate) fn cast(&self, id: ReplicaId, msg: ReplicaMsg) {
        if let Some(actor) = self.children.actor(&id) {
            let _ = actor.cast(msg);
        }
    }

    /// Drop a replica that is gone, and give its resources back.
    pub(crate) fn forget(&mut self, id: ReplicaId, why: &str) {
        if let Some(r) = self.replicas.remove(&id) {
            self.log_transition(id, &r.node, Some(r.state), None, why);
            self.children.remove(&id);
            self.args.cluster.release(id);
        }
    }

    /// Whether replica `id` runs the target code.
    pub(crate) fn at_target_code(&self, id: ReplicaId) -> bool {
        self.replicas
            .get(&id)
            .is_some_and(|r| r.version.code == self.version.code)
    }

    /// Whether replica `id` is at the target version, config included, or on
    /// its way there (UPDATING): whether its loss is the target version's
    /// failure (Ray: `replica.version == target_state.version`, the version an
    /// UPDATING replica already carries).
    pub(crate) fn at_target_version(&self, id: ReplicaId) -> bool {
        self.replicas.get(&id).is_some_and(|r| {
            r.version == self.version || r.state == flotilla_core::ReplicaState::Updating
        })
    }

    /// The replicas as the planner sees them.
    pub(crate) fn views(&self) -> Vec<ReplicaView> {
        self.replicas
            .iter()
            .map(|(id, r)| ReplicaView {
                id: *id,
                state: r.state,
                version: r.version.clone(),
                node: r.node.clone(),
            })
            .collect()
    }

    /// Publish the serving replicas to the route. Skipped while replicas are
    /// RECOVERING: the route keeps what the previous actor published until this
    /// one knows its replicas.
    ///
    /// An UPDATING replica stays routed (a request may overlap its
    /// reconfigure), where Ray's routers drop it: most config-only changes
    /// (`max_ongoing_requests`, batching, ...) run no user code, and dropping
    /// it would empty a one-replica deployment's route, here and on every
    /// node, for each of them.
    pub(crate) fn publish(&self) {
        if self
            .replicas
            .values()
            .any(|r| r.state == ReplicaState::Recovering)
        {
            return;
        }
        let set = self
            .replicas
            .values()
            .filter(|r| matches!(r.state, ReplicaState::Running | ReplicaState::Updating))
            .filter_map(|r| r.endpoint.clone())
            .filter(|e| e.is_accepting())
            .collect();
        let before = self.route.replicas();
        self.route.publish(set);
        if !Arc::ptr_eq(&before, &self.route.replicas()) {
            // Other processes copy the route (docs/nodes.md).
            self.args.cluster.route_changed(&self.route);
        }
    }

    /// Tell the ApplicationActor about a status it has not seen, and the
    /// route whether the deployment is terminally failed (its callers that
    /// find no replica then fail at once, here and on every node).
    pub(crate) fn report(&mut self) {
        if self.route.set_deploy_failed(self.terminally_failed()) {
            self.args.cluster.route_changed(&self.route);
        }
        let generation = self.args.target.generation;
        let unchanged = self
            .reported
            .as_ref()
            .is_some_and(|(g, s)| *g == generation && *s == self.status);
        if !unchanged {
            self.reported = Some((generation, self.status.clone()));
            (self.args.reporter)(DeploymentEvent::Status {
                name: self.args.target.spec.name.clone(),
                generation: self.args.target.generation,
                status: self.status.clone(),
            });
        }
    }

    /// Feed the status machine (the transition table lives in
    /// `DeploymentStatusInfo::handle`); `replica` names the replica behind it.
    pub(crate) fn transition(
        &mut self,
        trigger: DeploymentTrigger,
        message: String,
        replica: Option<ReplicaId>,
    ) {
        let from = self.status.status;
        if self.status.handle(trigger, message) {
            info!(app = %self.args.app, deployment = %self.args.target.spec.name,
                replica = ?replica, from = %from, to = %self.status.status,
                trigger = ?self.status.trigger, message = %self.status.message,
                "deployment status");
        }
    }

    /// Change only the status message.
    pub(crate) fn set_message(&mut self, message: String) {
        if self.status.message != message {
            info!(app = %self.args.app, deployment = %self.args.target.spec.name,
                status = %self.status.status, %message, "deployment status message");
            self.status.message = message;
        }
    }

    /// Whether replicas wait for a node; keeps the capacity subscription armed.
    pub(crate) fn set_wants_capacity(&self, wants: bool) {
        self.wants_capacity.store(wants, Ordering::Release);
    }

    pub(crate) fn snapshot(&self) -> DeploymentSnapshot {
        let mut counts: HashMap<(ReplicaState, &DeploymentVersion), u32> = HashMap::new();
        for r in self.replicas.values() {
            *counts.entry((r.state, &r.version)).or_insert(0) += 1;
        }
        let mut counts: Vec<StateCount> = counts
            .into_iter()
            .map(|((state, version), count)| StateCount {
                state,
                version: version.clone(),
                count,
            })
            .collect();
        counts.sort_by(|a, b| {
            (a.state, a.version.to_string()).cmp(&(b.state, b.version.to_string()))
        });
        DeploymentSnapshot {
            target: self.args.target.clone(),
            version: self.version.clone(),
            status: self.status.clone(),
            replicas: self
                .replicas
                .iter()
                .map(|(id, r)| ReplicaInfo {
                    id: *id,
                    state: r.state,
                    version: r.version.clone(),
                    node: r.node.clone(),
                    model_ids: r
                        .endpoint
                        .as_ref()
                        .map(|e| e.model_ids())
                        .unwrap_or_default(),
                })
                .collect(),
            counts,
            pending: self.pending.count,
            pending_reason: (self.pending.count > 0).then(|| self.pending.reason.clone()),
            startup_failures: self.failures,
        }
    }

    /// How replicas reach this deployment: by name, so a restarted actor hears them.
    pub(crate) fn reporter_for_replicas(&self) -> ReplicaReporter {
        self.replica_reporter.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReplicaState::*;

    #[test]
    fn the_replica_state_machine() {
        assert!(allowed(None, Some(Starting)));
        assert!(allowed(None, Some(Recovering)));
        assert!(!allowed(None, Some(Running)));
        assert!(allowed(Some(Starting), Some(Running)));
        assert!(!allowed(Some(Starting), Some(Updating)));
        assert!(allowed(Some(Running), Some(Updating)));
        assert!(allowed(Some(Updating), Some(Running)));
        assert!(allowed(Some(Recovering), Some(Updating)));
        assert!(!allowed(Some(Stopping), Some(Running)));
        assert!(allowed(Some(Stopping), None));
    }
}
