//! Re-adopting living replicas after this actor restarted: each is RECOVERING until
//! it describes itself (Ray: RECOVERING until the actor reports ready).

use std::time::Duration;

use flotilla_core::{ReplicaState, naming};
use flotilla_replica::{ReplicaId, ReplicaMsg, ReplicaPhase, ReplicaSnapshot, groups};
use ractor::{ActorCell, ActorRef, rpc::CallResult};
use tokio::time::Instant;

use crate::{
    DeploymentMsg,
    state::{DeploymentState, Replica},
};

/// How long a RECOVERING replica has to describe itself before it is stopped.
pub const RECOVER_TIMEOUT: Duration = Duration::from_secs(5);

fn phase_state(p: ReplicaPhase) -> ReplicaState {
    match p {
        ReplicaPhase::Starting => ReplicaState::Starting,
        ReplicaPhase::Running => ReplicaState::Running,
        ReplicaPhase::Updating => ReplicaState::Updating,
        ReplicaPhase::Stopping => ReplicaState::Stopping,
    }
}

/// The replica id in a replica actor's name (`...#{id}`).
fn replica_id_of(cell: &ActorCell) -> Option<ReplicaId> {
    let name = cell.get_name()?;
    let (_, id) = name.rsplit_once('#')?;
    id.parse().ok().map(ReplicaId)
}

/// Adopt every living member of this deployment's replica group.
pub(crate) fn adopt_all(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
    let a = &state.args;
    let group = naming::replica_group(&a.ns, &a.app, &a.target.spec.name);
    for cell in groups::members(&group) {
        if let Some(id) = replica_id_of(&cell) {
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
    myself.get_cell().monitor(cell.clone());
    let actor: ActorRef<ReplicaMsg> = cell.into();
    state.add(
        id,
        Replica {
            actor: actor.clone(),
            state: ReplicaState::Recovering,
            version: state.version.clone(),
            endpoint: None,
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
        let _ = me.cast(DeploymentMsg::Recovered(id, snap));
    });
}

/// A RECOVERING replica described itself (or did not answer in time).
pub(crate) fn recovered(
    state: &mut DeploymentState,
    id: ReplicaId,
    snap: Option<Box<ReplicaSnapshot>>,
) {
    if state.replicas.get(&id).map(|r| r.state) != Some(ReplicaState::Recovering) {
        // An event from the replica already told us.
        return;
    }
    let Some(snap) = snap else {
        state.stop(id, false, "did not describe itself while recovering");
        return;
    };
    let alive = state.args.cluster.is_alive(&snap.node);
    if let Some(r) = state.replicas.get_mut(&id) {
        r.version = snap.version;
        r.endpoint = snap.endpoint;
        r.node = snap.node;
    }
    if let Some(why) = &snap.condemned {
        // It had reported itself unhealthy to our predecessor: replace it now.
        state.set_state(id, phase_state(snap.phase), "recovered");
        let at_target = state.at_target_code(id);
        state.stop(id, true, &format!("recovered as unhealthy: {why}"));
        state.replica_lost(id, at_target, why);
    } else if alive {
        state.set_state(id, phase_state(snap.phase), "recovered");
    } else {
        state.stop(id, false, "its node died while the deployment recovered");
    }
}
