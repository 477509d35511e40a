//! The node's copies of the head's routes: kept as the head sends them,
//! pruned to the live set, published to this node's callers (its own
//! replicas' endpoints, remote endpoints for the rest), and rid of a lost
//! head's own replicas.

use std::collections::{HashMap, HashSet};

use flotilla_core::{AppName, DeploymentName, RequestRouterConfig};
use flotilla_replica::{ReplicaId, remote::RemoteEndpoint};
use tracing::info;

use super::{super::transport::PeerCall, super::wire::RouteEntry, AgentState};

/// The head's `Routes`: each route's copy replaced, or dropped if closed.
pub(super) fn routes_changed(state: &mut AgentState, entries: Vec<RouteEntry>) {
    for e in entries {
        let key = (e.app.clone(), e.deployment.clone());
        if e.closed {
            if state.routes.contains_key(&key) {
                info!(node = %state.args.id, app = %key.0, deployment = %key.1,
                    "route dropped: the head deleted the deployment");
            }
            drop_route(state, &key);
            continue;
        }
        state.routes.insert(key.clone(), e);
        publish(state, &key);
    }
}

/// A part of the head's `Prune`: once the last is in, every route copy not
/// in the live set is dropped.
pub(super) fn prune(
    state: &mut AgentState,
    keep: Vec<(AppName, DeploymentName)>,
    part: u32,
    more: bool,
) {
    let Some(live) = gather(&mut state.pruning, keep, part, more) else {
        return;
    };
    let stale: Vec<_> = (state.routes.keys())
        .filter(|k| !live.contains(*k))
        .cloned()
        .collect();
    for key in stale {
        info!(node = %state.args.id, app = %key.0, deployment = %key.1,
            "route dropped: the head runs no such deployment");
        drop_route(state, &key);
    }
}

/// A `Prune` being gathered: the part expected next, and the names so far.
pub(super) type Pruning = (u32, HashSet<(AppName, DeploymentName)>);

/// Add a `Prune` part to the set being gathered in `pending`: the whole set
/// once `more` is false. A part that is not the one expected next (a part
/// went missing, or the session changed mid-way) drops the set: pruning by
/// an incomplete one would drop live routes. The next set starts at part 0.
fn gather(
    pending: &mut Option<Pruning>,
    keep: Vec<(AppName, DeploymentName)>,
    part: u32,
    more: bool,
) -> Option<HashSet<(AppName, DeploymentName)>> {
    let mut live = match (part, pending.take()) {
        (0, _) => HashSet::new(),
        (_, Some((next, live))) if next == part => live,
        _ => return None,
    };
    live.extend(keep);
    if more {
        *pending = Some((part.saturating_add(1), live));
        return None;
    }
    Some(live)
}

/// Drop the copy of a deleted route: callers here hear so, as on the head.
fn drop_route(state: &mut AgentState, key: &(AppName, DeploymentName)) {
    state.routes.remove(key);
    state.mirrors.retain(|_, (k, _)| k != key);
    state.directory.remove(&key.0, &key.1);
}

/// The head `peer` is gone: its own replicas (those in its process) go from
/// every route copy, and the routes they leave are published again.
///
/// Nothing else would take them out. A head that comes back after a crash is
/// a new process under a new name, and it sends a route again only when the
/// route changes there; one whose replicas it cannot place soon (or ever)
/// never changes. Callers here would meanwhile try the dead replicas over and
/// over (no session reaches them), never waiting in the queue that the head
/// counts as load. If the same head answers again, its welcome sends every
/// route, its own replicas in them.
pub(super) fn forget_replicas_of(state: &mut AgentState, peer: &str) {
    let changed = drop_replicas_of(&mut state.routes, peer);
    if !changed.is_empty() {
        info!(node = %state.args.id, head = %peer, routes = changed.len(),
            "the head's own replicas left this node's routes with it");
    }
    for key in changed {
        publish(state, &key);
    }
}

/// Take `peer`'s replicas out of `routes`; the keys of the routes they left.
fn drop_replicas_of(
    routes: &mut HashMap<(AppName, DeploymentName), RouteEntry>,
    peer: &str,
) -> Vec<(AppName, DeploymentName)> {
    routes
        .iter_mut()
        .filter_map(|(key, entry)| {
            let before = entry.replicas.len();
            entry.replicas.retain(|r| r.peer != peer);
            (entry.replicas.len() != before).then(|| key.clone())
        })
        .collect()
}

/// Publish the node's copy of a route: its own replicas' endpoints, and remote
/// endpoints (kept per replica) for the rest.
pub(super) fn publish(state: &mut AgentState, key: &(AppName, DeploymentName)) {
    let Some(entry) = state.routes.get(key) else {
        return;
    };
    let route = state.directory.route(&key.0, &key.1);
    route.set_deploy_failed(entry.deploy_failed);
    route.set_max_queued(entry.max_queued);
    route.set_batching(entry.batching);
    route.set_max_models_per_replica(entry.max_models);
    let builtin = RequestRouterConfig::default();
    route.set_router_config(
        entry.router.as_ref().unwrap_or(&builtin),
        &state.args.registry,
    );
    let me = state.args.link.shared.me.clone();
    let mut set = Vec::with_capacity(entry.replicas.len());
    let mut ids = Vec::with_capacity(entry.replicas.len());
    for r in &entry.replicas {
        let id = ReplicaId(r.id);
        ids.push(id);
        if r.peer == me {
            if let Some(ep) = state.replicas.get(&id).and_then(|l| l.endpoint.clone()) {
                set.push(ep);
            }
            continue;
        }
        let (_, remote) = state.mirrors.entry(id).or_insert_with(|| {
            let call = PeerCall::boxed(
                state.args.link.shared.clone(),
                r.peer.clone(),
                r.node.clone(),
            );
            (
                key.clone(),
                RemoteEndpoint::new(id, r.node.clone(), call, r.max_ongoing, &route),
            )
        });
        remote.set_max_ongoing(r.max_ongoing);
        if let Some(models) = &r.models {
            remote.set_models(models.clone().into());
        }
        set.push(remote.endpoint().clone());
    }
    state
        .mirrors
        .retain(|id, (k, _)| k != key || ids.contains(id));
    route.publish(set);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::nodes::wire::RouteReplica;

    fn keys(names: &[&str]) -> Vec<(AppName, DeploymentName)> {
        names
            .iter()
            .map(|n| (AppName::new(*n).unwrap(), DeploymentName::new("d").unwrap()))
            .collect()
    }

    #[test]
    fn a_lost_heads_replicas_leave_every_route_and_only_theirs() {
        let replica = |id, peer: &str| RouteReplica {
            id,
            node: peer.to_owned(),
            peer: peer.to_owned(),
            max_ongoing: 5,
            models: None,
        };
        let entry = |key: &(AppName, DeploymentName), replicas| RouteEntry {
            app: key.0.clone(),
            deployment: key.1.clone(),
            max_queued: None,
            batching: None,
            max_models: None,
            router: None,
            replicas,
            closed: false,
            deploy_failed: false,
        };
        let k = keys(&["mixed", "nodes", "head"]);
        let mut routes: HashMap<_, _> = [
            (
                k[0].clone(),
                vec![replica(1, "head-1"), replica(2, "node-b")],
            ),
            (k[1].clone(), vec![replica(3, "node-b")]),
            (k[2].clone(), vec![replica(4, "head-1")]),
        ]
        .into_iter()
        .map(|(key, replicas)| (key.clone(), entry(&key, replicas)))
        .collect();
        let mut changed = drop_replicas_of(&mut routes, "head-1");
        changed.sort();
        let mut expected = vec![k[0].clone(), k[2].clone()];
        expected.sort();
        assert_eq!(changed, expected);
        let ids = |key: &(AppName, DeploymentName)| -> Vec<u64> {
            routes[key].replicas.iter().map(|r| r.id).collect()
        };
        assert_eq!(
            (ids(&k[0]), ids(&k[1]), ids(&k[2])),
            (vec![2], vec![3], vec![])
        );
        // The route stays (its callers wait for a replica); a second loss of
        // the same head changes nothing.
        assert!(drop_replicas_of(&mut routes, "head-1").is_empty());
    }

    #[test]
    fn prune_parts_gather_into_one_set_and_a_stray_part_prunes_nothing() {
        let mut pending = None;
        assert_eq!(gather(&mut pending, keys(&["a"]), 0, true), None);
        assert_eq!(gather(&mut pending, keys(&["b"]), 1, true), None);
        let all = gather(&mut pending, keys(&["c"]), 2, false).unwrap();
        assert_eq!(all, keys(&["a", "b", "c"]).into_iter().collect());
        assert!(pending.is_none());
        // One part alone is a whole set.
        let one = gather(&mut pending, keys(&["x"]), 0, false).unwrap();
        assert_eq!(one, keys(&["x"]).into_iter().collect());
        // A set begun on a session that closed mid-way: the next starts anew.
        assert_eq!(gather(&mut pending, keys(&["old"]), 0, true), None);
        let fresh = gather(&mut pending, keys(&["new"]), 0, false).unwrap();
        assert_eq!(fresh, keys(&["new"]).into_iter().collect());
        // The tail of a set whose first part this node never saw: nothing is
        // pruned by it (that would drop the routes of the missing parts).
        assert_eq!(gather(&mut pending, keys(&["tail"]), 1, false), None);
        assert!(pending.is_none());
        // A part missing in the middle: the set is dropped, not used.
        assert_eq!(gather(&mut pending, keys(&["a"]), 0, true), None);
        assert_eq!(gather(&mut pending, keys(&["c"]), 2, false), None);
        assert!(pending.is_none());
        assert_eq!(gather(&mut pending, keys(&["c"]), 1, false), None);
    }
}
