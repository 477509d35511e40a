//! Starting replicas where the cluster has room, and hearing from the cluster:
//! capacity freed (wakes pending replicas) and node deaths (replaces the replicas
//! that were on the node). No polling: events arrive by a broadcast subscription,
//! forwarded into the actor's mailbox by one small task.

use std::sync::atomic::Ordering;

use flotilla_core::{ReplicaState, actor_names};
use flotilla_replica::{OnExit, ReplicaActor, ReplicaArgs, ReplicaId};
use ractor::ActorRef;
use tokio::{sync::broadcast::error::RecvError, time::Instant};

use flotilla_cluster::{ClusterEvent, PlacementRequest, Refusal};

use crate::{
    DeploymentMsg,
    messages::InternalMsg,
    state::{DeploymentState, Replica},
};

/// Why a replica did not start.
pub(crate) enum StartError {
    /// No node has room: it stays pending.
    NoRoom(Refusal),
    /// The replica actor could not be spawned.
    Spawn(ReplicaId, flotilla_supervision::StartError),
}

/// Subscribe to the cluster's events: capacity events are forwarded only while
/// replicas are pending (and once per wake-up), node deaths always.
pub(crate) fn subscribe(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
    let Some(mut rx) = state.args.cluster.subscribe() else {
        return;
    };
    state.evented_cluster = true;
    let me = myself.clone();
    let wants = state.wants_capacity.clone();
    state.cluster_task = Some(tokio::spawn(async move {
        loop {
            let msg = match rx.recv().await {
                Ok(ClusterEvent::CapacityFreed) => {
                    if !wants.swap(false, Ordering::AcqRel) {
                        continue;
                    }
                    InternalMsg::Cluster(ClusterEvent::CapacityFreed)
                }
                Ok(event) => InternalMsg::Cluster(event),
                Err(RecvError::Lagged(_)) => InternalMsg::ClusterResync,
                Err(RecvError::Closed) => return,
            };
            if me.cast(msg.into()).is_err() {
                return;
            }
        }
    }));
}

/// Place and spawn one replica at the target version.
pub(crate) async fn start_replica(
    myself: &ActorRef<DeploymentMsg>,
    state: &mut DeploymentState,
) -> Result<(), StartError> {
    let id = ReplicaId::fresh();
    let a = &state.args;
    let node = a
        .cluster
        .place(&PlacementRequest::for_config(
            id,
            &a.app,
            &a.target.spec.name,
            &a.target.spec.config,
        ))
        .map_err(StartError::NoRoom)?;
    let args = ReplicaArgs {
        id,
        app: a.app.clone(),
        deployment: a.target.spec.name.clone(),
        spec: a.target.spec.clone(),
        version: state.version.clone(),
        registry: a.registry.clone(),
        directory: a.directory.clone(),
        route: state.route.clone(),
        reporter: state.reporter_for_replicas(),
        group: actor_names::replica_group(&a.ns, &a.app, &a.target.spec.name),
        node: node.clone(),
        faults: a.faults.clone(),
        on_exit: {
            let cluster = a.cluster.clone();
            OnExit::new(move || cluster.release(id))
        },
    };
    let name = actor_names::replica(&a.ns, &a.app, &a.target.spec.name, id.0);
    // (The caller boxes this whole future: the spawn stays out of the actor's loop future.)
    let parent = myself.get_cell();
    let started = match state.args.cluster.host(&node) {
        // Another process: its stand-in here (docs/nodes.md), watched as any replica.
        Some(host) => {
            let remote = flotilla_cluster::nodes::RemoteReplicaArgs::new(args, host);
            let proxy = flotilla_cluster::nodes::RemoteReplica;
            state.children.start(&parent, id, name, proxy, remote).await
        }
        None => {
            state
                .children
                .start(&parent, id, name, ReplicaActor, args)
                .await
        }
    };
    match started {
        Ok(_) => {
            state.route.stats().record_start();
            let replica = Replica {
                state: ReplicaState::Starting,
                version: state.version.clone(),
                endpoint: None,
                limit: 0,
                node: node.clone(),
                since: Instant::now(),
            };
            state.add(id, replica, &format!("placed on node '{node}'"));
            Ok(())
        }
        Err(e) => {
            state.args.cluster.release(id);
            Err(StartError::Spawn(id, e))
        }
    }
}

/// Node `node` died: its replicas are gone. Stop what is left of them at once;
/// the next reconcile starts replacements elsewhere. A RUNNING one at the
/// target is a lost replica (HEALTH_CHECK_FAILED); returned, for the actor to
/// count as startup failures, those of the target's code lost before they
/// were ready for it (STARTING, UPDATING or RECOVERING: as when one crashes
/// so, and as Ray counts a starting replica whose actor died), whichever of
/// the node's death and the replica's own exit is heard first.
pub(crate) fn node_died(state: &mut DeploymentState, node: &str) -> Vec<(ReplicaId, String)> {
    let lost: Vec<(ReplicaId, ReplicaState)> = state
        .replicas
        .iter()
        .filter(|(_, r)| r.node == node)
        .map(|(id, r)| (*id, r.state))
        .collect();
    let mut not_ready = Vec::new();
    for (id, was) in lost {
        let at_target = state.at_target_version(id);
        let at_target_code = state.at_target_code(id);
        let why = format!("Replica {id} was lost with its node '{node}'");
        state.stop(id, false, &format!("its node '{node}' died"));
        match was {
            ReplicaState::Running => state.replica_lost(id, at_target, &why),
            ReplicaState::Starting | ReplicaState::Updating | ReplicaState::Recovering
                if at_target_code =>
            {
                not_ready.push((id, why));
            }
            _ => {}
        }
    }
    not_ready
}

/// The subscription lagged: any node may have died unseen. Returns what
/// [`node_died`] returns, for every node found dead.
pub(crate) fn resync(state: &mut DeploymentState) -> Vec<(ReplicaId, String)> {
    let mut dead: Vec<String> = state
        .replicas
        .values()
        .map(|r| r.node.clone())
        .filter(|n| !n.is_empty() && !state.args.cluster.is_alive(n))
        .collect();
    dead.sort();
    dead.dedup();
    dead.iter()
        .flat_map(|node| node_died(state, node))
        .collect()
}
