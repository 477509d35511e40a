//! Joins: whether a node saying hello may join, the refusals it hears, and
//! the end of a join (whole or in parts, after a head restart).

use std::{
    collections::HashSet,
    sync::{Arc, atomic::Ordering},
};

use flotilla_core::{Resources, actor_names};
use flotilla_replica::{OnExit, ReplicaId};
use ractor::Actor;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Joining, RegistryState, nodes_changed, send};
use crate::{
    ClusterEvent, NodeSpec, PlacementRequest,
    nodes::{
        RemoteHost,
        head::{NodeEntry, lock},
        options::{OptionsError, check_id, check_resources},
        proxy::{Adopted, RemoteReplica, RemoteReplicaArgs},
        wire::{Control, Hello, ReplicaReport, Welcome},
    },
};

/// Whether a node saying hello as `node` with `resources` may join: its id
/// must be one a node could have (`check_id`), not the head's own (the
/// head's replicas run under it, and the session's close would declare it
/// lost), not one that is `joined` (alive), and not one this head declared
/// `lost`; its resources must be amounts replicas can be placed against
/// (`check_resources`: a node of another build could send a NaN).
pub(super) fn admission(
    node: &str,
    resources: &Resources,
    head: &str,
    lost: bool,
    joined: bool,
) -> Result<(), Refusal> {
    check_id(node).map_err(Refusal::BadId)?;
    check_resources("node", resources).map_err(Refusal::BadResources)?;
    if node == head {
        return Err(Refusal::HeadsOwn {
            node: node.to_owned(),
        });
    }
    if lost {
        return Err(Refusal::Lost {
            node: node.to_owned(),
        });
    }
    if joined {
        return Err(Refusal::Joined {
            node: node.to_owned(),
        });
    }
    Ok(())
}

/// Why the head refuses a node's hello; its text is what the node hears
/// ([`Control::Refused`]).
#[derive(Debug, PartialEq, thiserror::Error)]
pub(super) enum Refusal {
    /// The node id is not one a node could have.
    #[error(transparent)]
    BadId(OptionsError),
    /// The node offers resources no replica could be placed against.
    #[error(transparent)]
    BadResources(OptionsError),
    /// The node id is the head's own.
    #[error("node id {node} is the head's own")]
    HeadsOwn {
        /// The node id given.
        node: String,
    },
    /// This head declared the node lost.
    #[error(
        "node {node} was declared lost by this head: its replicas were replaced; stop them and \
         join as a new node"
    )]
    Lost {
        /// The node id given.
        node: String,
    },
    /// A node of that id is alive.
    #[error("node {node} already joined")]
    Joined {
        /// The node id given.
        node: String,
    },
}

pub(super) fn refuse(state: &RegistryState, peer: &str, node: &str, reason: Refusal) {
    // Counted; logged every time: a refused member (its cookie passed).
    let _ = state.shared.refused.hit();
    warn!(%peer, %node, %reason, "head: node refused");
    send(
        state,
        peer,
        Control::Refused {
            reason: reason.to_string(),
        },
    );
}

pub(super) async fn hello(state: &mut RegistryState, from: String, h: Hello) {
    let shared = state.shared.clone();
    let lost = lock(&shared.lost).contains(&h.node);
    let joined = lock(&shared.nodes).get(&h.node).is_some_and(|n| n.alive)
        || shared.pool().is_alive(&h.node);
    if let Err(reason) = admission(&h.node, &h.resources, &shared.options.node_id, lost, joined) {
        // Its parts, if any follow, belong to no join.
        state.joining.remove(&from);
        refuse(state, &from, &h.node, reason);
        return;
    }
    // The welcome goes before the node joins the pool: once it is there, a
    // DeploymentActor may place a replica on it at once, and the node ignores
    // a `Start` that comes before its welcome (it has no namespace yet). Both
    // go over the one session, in the order sent.
    send(
        state,
        &from,
        Control::Welcome(Welcome {
            epoch: shared.epoch,
            ns: shared.ns.clone(),
            head_node: shared.options.node_id.clone(),
        }),
    );
    let (address, listen) = state
        .reach
        .get(&from)
        .map(|r| (r.addr.clone(), r.listen.clone()))
        .unwrap_or_default();
    lock(&shared.nodes).insert(
        h.node.clone(),
        NodeEntry {
            peer: from.clone(),
            address: address.clone(),
            listen,
            resources: h.resources.clone(),
            labels: h.labels.clone(),
            alive: true,
            last_heard: Instant::now(),
        },
    );
    state.by_peer.insert(from.clone(), h.node.clone());
    // Its replicas log by the head's settings from their start.
    crate::nodes::log_export::welcome(&shared, &from);
    shared
        .pool()
        .add(NodeSpec::new(h.node.clone(), h.resources.clone()));
    shared.joined.fetch_add(1, Ordering::Relaxed);
    let reattach = h.last_head.is_some_and(|e| e != shared.epoch);
    info!(node = %h.node, peer = %from, %address, cpus = h.resources.cpus,
        replicas = h.replicas.len(), more = h.more, reattach, "node joined");
    Box::pin(take_reports(state, &from, &h.node, reattach, h.replicas)).await;
    if h.more {
        // The join ends with its last `Replicas` frame: a restarted head's
        // wait for its nodes must not end before every replica is adopted,
        // even if another node that knew this one joins meanwhile.
        if reattach {
            state.expected.insert(h.node.clone());
        }
        let joining = Joining {
            node: h.node,
            reattach,
            peers: h.peers,
        };
        state.joining.insert(from, joining);
        return;
    }
    join_done(state, &from, &h.node, reattach, h.peers);
}

/// Replicas a joining node reported: adopted if it re-attaches; else they
/// are of this head's own epoch on a node it does not know: nobody counts
/// them, so they must not run.
pub(super) async fn take_reports(
    state: &RegistryState,
    from: &str,
    node: &str,
    reattach: bool,
    reports: Vec<ReplicaReport>,
) {
    for r in reports {
        if reattach {
            Box::pin(adopt(state, from, node, r)).await;
        } else {
            let stop = Control::Stop {
                replica: r.id,
                graceful: false,
            };
            send(state, from, stop);
        }
    }
}

/// The end of node `node`'s join, once every replica it reported is taken:
/// a restarted head's wait hears of it, and the node gets every route.
pub(super) fn join_done(
    state: &mut RegistryState,
    from: &str,
    node: &str,
    reattach: bool,
    peers: Vec<String>,
) {
    let shared = state.shared.clone();
    if reattach {
        let joined: HashSet<String> = shared.alive().into_iter().map(|(id, _)| id).collect();
        state
            .expected
            .extend(peers.into_iter().filter(|p| !joined.contains(p)));
        state.reattached = true;
    }
    state.expected.remove(node);
    // Kept even while nobody waits (`send` would drop it): the head's wait
    // may subscribe after this node is back.
    shared
        .reattach
        .send_replace((state.reattached, state.expected.len()));
    crate::nodes::export::full_copy(&shared, from);
    nodes_changed(state);
    shared.announce(ClusterEvent::CapacityFreed);
}

/// A replica a re-attaching node (`node`, session `from`) runs: reserve its
/// resources there again and make its proxy, which its DeploymentActor
/// adopts. One that cannot be adopted is stopped on its node: nothing here
/// would own it, count it, or ever stop it.
async fn adopt(state: &RegistryState, from: &str, node: &str, r: ReplicaReport) {
    let shared = &state.shared;
    let id = ReplicaId(r.id);
    ReplicaId::seed(r.id.saturating_add(1));
    let spec = Arc::new(*r.spec);
    let dep = spec.name.clone();
    let ns = &shared.ns;
    let name = actor_names::replica(ns, &r.app, &dep, id.0);
    let stop = || {
        send(
            state,
            from,
            Control::Stop {
                replica: r.id,
                graceful: true,
            },
        );
    };
    // Ids are unique per head (the clock's milliseconds, then past every id
    // re-attached), but a clock that went back, or a head moved to another
    // machine, can give one of this head's own replicas the id of a
    // re-attached one. Reserving it would take (and its exit free) the other
    // replica's reservation, and its proxy could not take the name. A
    // reservation on this very node counts too: a node re-attaches once, so
    // it is another replica's, placed there since the node's hello.
    let taken = match shared.pool().node_of(id) {
        Some(n) => Some(format!("reserved on node '{}'", n.name())),
        None => ractor::registry::where_is(name.clone()).map(|_| "its name in use".to_owned()),
    };
    if let Some(taken) = taken {
        warn!(app = %r.app, deployment = %dep, replica = %id, node, %taken,
            "re-attached replica's id is another replica's here (a clock that went back?): stopping it");
        stop();
        return;
    }
    {
        let mut pool = shared.pool();
        let req = PlacementRequest::for_config(id, &r.app, &dep, &spec.config);
        match pool.place(&req, |_, n, _| n.name() != node) {
            Ok(at) if at == node => {}
            Ok(at) => {
                pool.release(id);
                warn!(app = %r.app, deployment = %dep, replica = %id, node, elsewhere = %at,
                    "re-attached replica's resources do not fit its node again: not reserved");
            }
            Err(refusal) => warn!(app = %r.app, deployment = %dep, replica = %id, node, %refusal,
                "re-attached replica's resources do not fit: not reserved"),
        }
    }
    let args = RemoteReplicaArgs::adopted(
        id,
        r.app.clone(),
        spec,
        r.version,
        shared.directory.route(&r.app, &dep),
        (shared.reporter)(ns, &r.app, &dep),
        actor_names::replica_group(ns, &r.app, &dep),
        RemoteHost {
            shared: shared.clone(),
            node: node.to_owned(),
        },
        Adopted {
            phase: r.phase.into(),
            condemned: r.condemned,
            models: r.models,
        },
        {
            let shared = shared.clone();
            OnExit::new(move || shared.release(id))
        },
    );
    match Actor::spawn(Some(name), RemoteReplica, args).await {
        Ok(_) => info!(app = %r.app, deployment = %dep, replica = %id, node,
            "re-attached replica adopted"),
        Err(e) => {
            // Its reservation went with the args (their `OnExit`).
            warn!(app = %r.app, deployment = %dep, replica = %id, node, error = %e,
                "re-attached replica could not be adopted: stopping it");
            stop();
        }
    }
}
