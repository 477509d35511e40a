//! Re-adopting living replicas after this actor restarted: each is RECOVERING until
//! it describes itself (Ray: RECOVERING until the actor reports ready).

use std::time::Duration;

use flotilla_core::{ReplicaState, actor_names};
use flotilla_replica::{ReplicaId, ReplicaMsg, ReplicaPhase, ReplicaSnapshot};
use flotilla_supervision::groups;
use ractor::{ActorCell, ActorRef, rpc::CallResult};
use tokio::time::Instant;

use crate::{
    DeploymentMsg,
    messages::InternalMsg,
    state::{DeploymentState, Replica},
};

/// How long a RECOVERING replica has to describe itself before it is stopped.
pub const RECOVER_TIMEOUT: Duration = Duration::from_secs(5);

fn phase_state(p: ReplicaPhase) -> ReplicaState {
    match p {
        ReplicaPhase::Starting | ReplicaPhase::StartFailed => ReplicaState::Starting,
        ReplicaPhase::Running => ReplicaState::Running,
        ReplicaPhase::Updating => ReplicaState::Updating,
        ReplicaPhase::Stopping => ReplicaState::Stopping,
    }
}

/// The replica id in a replica actor's name.
fn replica_id_of(ns: &str, cell: &ActorCell) -> Option<ReplicaId> {
    let (_, _, id) = actor_names::parse_replica(ns, &cell.get_name()?)?;
    Some(ReplicaId(id))
}

/// Adopt every living member of this deployment's replica group.
pub(crate) fn adopt_all(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
    let a = &state.args;
    let group = actor_names::replica_group(&a.ns, &a.app, &a.target.spec.name);
    let ns = a.ns.clone();
    for cell in groups::members(&group) {
        if let Some(id) = replica_id_of(&ns, &cell) {
            adopt(myself, state, id, cell);
        }
    }
}

/// Adopt one living replica as RECOVERING and ask it, off the mailbox, what it is.
pub(crate) fn adopt(
    myself: &ActorRef<DeploymentMsg>,
    state: &mut DeploymentState,
    id: ReplicaId,
    cell: ActorCell,
) {
    if state.replicas.contains_key(&id) {
        return;
    }
    let actor: ActorRef<ReplicaMsg> = cell.into();
    if !state.children.adopt(&myself.get_cell(), id, actor.clone()) {
        // Already stopping: it is no replica of ours any more.
        return;
    }
    state.add(
        id,
        Replica {
            state: ReplicaState::Recovering,
            version: state.version.clone(),
            endpoint: None,
            limit: 0,
            node: String::new(),
            since: Instant::now(),
        },
        "found alive after a restart",
    );
    let me = myself.clone();
    tokio::spawn(async move {
        let snap = match actor.call(ReplicaMsg::Observe, Some(RECOVER_TIMEOUT)).await {
            Ok(CallResult::Success(s)) => Some(Box::new(s)),
            _ => None,
        };
        let _ = me.cast(InternalMsg::Recovered(id, snap).into());
    });
}

/// What a recovered replica leaves for the actor to do.
pub(crate) enum Recovered {
    /// Nothing more: it is known now (or stopped).
    Known,
    /// Its start had failed, and its predecessor may not have heard: handle it
    /// as a start failure now.
    StartFailed(String),
    /// It lives, but had reported itself unhealthy (or its reconfigure
    /// failed) to the predecessor: not ready, to stop gracefully and count as
    /// a startup failure.
    NotReady(String),
}

/// A RECOVERING replica described itself (or did not answer in time).
pub(crate) fn recovered(
    state: &mut DeploymentState,
    id: ReplicaId,
    snap: Option<Box<ReplicaSnapshot>>,
) -> Recovered {
    if state.replicas.get(&id).map(|r| r.state) != Some(ReplicaState::Recovering) {
        // An event from the replica already told us its state; its node, and
        // its endpoint (a `Reconfigured` carries none), may still be missing:
        // without an endpoint a RUNNING replica would never be routed to.
        if let (Some(r), Some(snap)) = (state.replicas.get_mut(&id), &snap) {
            if r.node.is_empty() {
                r.node = snap.node.clone();
            }
            if r.endpoint.is_none()
                && let Some(e) = &snap.endpoint
            {
                r.limit = e.max_ongoing_requests();
                r.endpoint = Some(e.clone());
            }
        }
        return Recovered::Known;
    }
    let Some(snap) = snap else {
        state.stop(id, false, "did not describe itself while recovering");
        return Recovered::Known;
    };
    let alive = state.args.cluster.is_alive(&snap.node);
    if let Some(r) = state.replicas.get_mut(&id) {
        r.version = snap.version;
        r.limit = snap
            .endpoint
            .as_ref()
            .map_or(0, |e| e.max_ongoing_requests());
        r.endpoint = snap.endpoint;
        r.node = snap.node;
    }
    if snap.phase == ReplicaPhase::StartFailed {
        state.set_state(id, ReplicaState::Starting, "recovered");
        let why = snap.condemned.unwrap_or_default();
        return Recovered::StartFailed(why);
    }
    if let Some(why) = snap.condemned {
        // It had reported itself unhealthy to our predecessor. Recovering,
        // it is not ready: as Ray's RECOVERING replica that fails, a startup
        // failure (not a health-check failure, which from this successor's
        // UPDATING would be DEPLOY_FAILED). It still serves what it holds.
        state.set_state(id, phase_state(snap.phase), "recovered");
        return Recovered::NotReady(format!("recovered as unhealthy: {why}"));
    } else if alive {
        state.set_state(id, phase_state(snap.phase), "recovered");
    } else {
        state.stop(id, false, "its node died while the deployment recovered");
    }
    Recovered::Known
}
