//! Routes reach every node by subscription (`docs/nodes.md`): a
//! DeploymentActor's publish (of a changed replica set, or of a changed queue
//! limit, batching, model limit, request router or replica limit) marks its
//! route dirty here, and one exporter task
//! sends every dirty route to every live node in one frame (bursts coalesce).
//! A joining node gets every route. Head-local replicas in exported routes are
//! served to the nodes.
//!
//! Once the Controller has recovered (`recovered`), the head knows every live
//! route: each node is then told which routes it may keep (`Prune`, after the
//! changes or full copy it was sent before), and drops a copy of any other (a
//! deployment deleted while it was away, or unknown to a head restarted on
//! another store). A joining node gets the same after its full copy.
//!
//! An entry carries each multiplexed replica's model ids, so that routers on
//! every node prefer the replica holding a request's model wherever it runs.
//! A replica on a node reports its ids to the head (its proxy marks the route
//! dirty); a head-local one is watched, by subscription to its ids, while it
//! is served.

use std::{collections::HashSet, sync::Arc};

use flotilla_core::{AppName, DeploymentName};
use flotilla_replica::{DeploymentRoute, ReplicaEndpoint, ReplicaId};

use flotilla_supervision::AbortOnDrop;

use super::{
    head::{Export, HeadShared, lock},
    on_model_changes,
    wire::{Control, RouteEntry, RouteReplica, WireModels},
};

/// Routes per `Routes` frame of a full copy.
const CHUNK: usize = 512;

/// Names per `Prune` part: a part stays under 2.2 MB even with the longest
/// names (128 bytes each), far from the 64 MiB frame limit.
const PRUNE_PART: usize = 8192;

/// A DeploymentActor changed `route`'s replica set or copied settings, or
/// deleted it (closed): the nodes are sent its closed entry once, and then
/// it is forgotten.
pub(crate) fn changed(shared: &HeadShared, route: &Arc<DeploymentRoute>) {
    let key = (route.app().clone(), route.deployment().clone());
    let mut ex = lock(&shared.export);
    // Read under the lock a joining node's full copy takes: a node alive
    // now is sent this change; one that joins after gets the copy.
    let wake = shared.any_alive();
    if route.is_closed() {
        // A deployment of the same name deployed again since has its own
        // route here: that one stays, and is what the nodes are sent.
        if ex.known.get(&key).is_some_and(|r| !Arc::ptr_eq(r, route)) {
            return;
        }
        if let Some(live) = ex.recovered.as_mut() {
            live.remove(&key);
        }
        if !wake {
            // No node to tell: forgotten now, and its head-local replicas are
            // no longer served (no full copy will come to unserve them).
            ex.known.remove(&key);
            for id in ex.served.remove(&key).unwrap_or_default() {
                unserve(shared, &mut ex, id);
            }
            return;
        }
    }
    if wake {
        ex.dirty.insert(key.clone());
    }
    ex.known.insert(key, route.clone());
    drop(ex);
    if wake {
        shared.export_wake.notify_one();
    }
}

/// A replica of `route` on a node reported its models: export the route
/// again, if its DeploymentActor exported it already (else its first
/// export carries them). A stand-in's route that no DeploymentActor has
/// published (the head waits for its nodes before it recovers) is not sent:
/// empty and unconfigured, it would empty the nodes' copies, and a route no
/// deployment owns would be kept for good.
/// A closed route is not sent again for it: its deletion sent it once
/// ([`changed`]).
pub(crate) fn models_changed(shared: &HeadShared, route: &Arc<DeploymentRoute>) {
    let key = (route.app().clone(), route.deployment().clone());
    let mut ex = lock(&shared.export);
    let known = ex.known.get(&key).is_some_and(|r| Arc::ptr_eq(r, route));
    // As `changed`, under the same lock: a node alive now is sent it.
    if known && !route.is_closed() && shared.any_alive() {
        ex.dirty.insert(key);
        drop(ex);
        shared.export_wake.notify_one();
    }
}

/// Stop serving head-local replica `id` to nodes; its model watcher ends
/// with its guard.
fn unserve(shared: &HeadShared, ex: &mut Export, id: ReplicaId) {
    shared.link.shared.unserve(id);
    ex.watched.remove(&id);
}

/// `route` as nodes copy it; head-local replicas in it are served to nodes
/// (and watched for their model ids, if multiplexed).
fn entry(
    shared: &Arc<HeadShared>,
    ex: &mut Export,
    key: &(AppName, DeploymentName),
    route: &Arc<DeploymentRoute>,
) -> RouteEntry {
    let set = if route.is_closed() {
        Arc::from(Vec::new())
    } else {
        route.replicas()
    };
    let me = &shared.link.shared.me;
    let mut local = Vec::new();
    let mut replicas = Vec::with_capacity(set.len());
    for ep in set.iter() {
        let peer = if ep.is_remote() {
            match shared.peer_of(ep.node()) {
                Some(p) => p,
                None => continue,
            }
        } else {
            shared.link.shared.serve(ep.clone());
            local.push(ep.id());
            if !ex.watched.contains_key(&ep.id())
                && let Some(watcher) = watch_models(shared, key, route, ep)
            {
                ex.watched.insert(ep.id(), watcher);
            }
            me.clone()
        };
        replicas.push(RouteReplica {
            id: ep.id().0,
            node: ep.node().to_owned(),
            peer,
            max_ongoing: ep.max_ongoing_requests(),
            models: ep.models().map(|m| WireModels::from(&m)),
        });
    }
    let old = ex
        .served
        .insert(key.clone(), local.clone())
        .unwrap_or_default();
    let keep: HashSet<ReplicaId> = local.into_iter().collect();
    for id in old.into_iter().filter(|id| !keep.contains(id)) {
        unserve(shared, ex, id);
    }
    let closed = route.is_closed();
    if closed {
        // Sent once: forgotten here from now on.
        ex.known.remove(key);
        ex.served.remove(key);
    }
    RouteEntry {
        app: key.0.clone(),
        deployment: key.1.clone(),
        max_queued: route.max_queued(),
        batching: route.batching(),
        max_models: route.max_models_per_replica(),
        router: route.router_config(),
        replicas,
        closed,
        deploy_failed: route.is_deploy_failed(),
    }
}

/// Export `route` again whenever head-local `ep` loads or evicts a model
/// (`None` unless it is multiplexed). Ends when the replica is no longer
/// served (the guard is dropped), when it ends, or with the head.
fn watch_models(
    shared: &Arc<HeadShared>,
    key: &(AppName, DeploymentName),
    route: &Arc<DeploymentRoute>,
    ep: &ReplicaEndpoint,
) -> Option<AbortOnDrop<()>> {
    let (shared, route) = (Arc::downgrade(shared), route.clone());
    let span = tracing::debug_span!("export_models", app = %key.0, deployment = %key.1,
        replica = %ep.id());
    on_model_changes(ep, span, move || match shared.upgrade() {
        Some(shared) => {
            changed(&shared, &route);
            true
        }
        None => false,
    })
}

/// The exporter: wakes on changes, sends the dirty routes to every live node.
pub(crate) async fn run(shared: Arc<HeadShared>) {
    loop {
        shared.export_wake.notified().await;
        // Let a burst of publishes land in this one frame.
        tokio::task::yield_now().await;
        // Read and sent under the send lock, as a full copy is: an entry never
        // reaches a node after a copy that read the route later.
        let _sending = lock(&shared.export_send);
        let entries: Vec<RouteEntry> = {
            let mut ex = lock(&shared.export);
            let dirty: Vec<_> = ex.dirty.drain().collect();
            dirty
                .iter()
                .filter_map(|k| {
                    let route = ex.known.get(k)?.clone();
                    Some(entry(&shared, &mut ex, k, &route))
                })
                .collect()
        };
        if entries.is_empty() {
            continue;
        }
        for (_, peer) in shared.alive() {
            for chunk in entries.chunks(CHUNK) {
                shared
                    .link
                    .shared
                    .send_control(&peer, Control::Routes(chunk.to_vec()));
            }
        }
    }
}

/// Send every known route to `peer` (a node that just joined). Read and sent
/// under the send lock, so that an exported change comes before or after the
/// copy, never inside it: before, an entry read before the copy could reach
/// the node after it, leaving it an older state until the next change.
pub(crate) fn full_copy(shared: &Arc<HeadShared>, peer: &str) {
    let _sending = lock(&shared.export_send);
    let (entries, keep): (Vec<RouteEntry>, _) = {
        let mut ex = lock(&shared.export);
        // A closed route not yet exported is left to the exporter: a new
        // node never had a copy to close, and a re-attaching one is sent the
        // close with the other nodes.
        let known: Vec<_> = ex
            .known
            .iter()
            .filter(|(_, r)| !r.is_closed())
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        let entries = known
            .iter()
            .map(|(k, r)| entry(shared, &mut ex, k, r))
            .collect();
        (entries, to_keep(&ex))
    };
    for chunk in entries.chunks(CHUNK) {
        shared
            .link
            .shared
            .send_control(peer, Control::Routes(chunk.to_vec()));
    }
    if let Some(keep) = keep {
        prune(shared, peer, &keep);
    }
}

/// Send `peer` the live routes in `keep`, part by part.
fn prune(shared: &HeadShared, peer: &str, keep: &[(AppName, DeploymentName)]) {
    for frame in prune_frames(keep) {
        shared.link.shared.send_control(peer, frame);
    }
}

/// The `Prune` frames of `keep`: at least one (an empty set prunes all).
fn prune_frames(keep: &[(AppName, DeploymentName)]) -> Vec<Control> {
    let mut parts: Vec<&[(AppName, DeploymentName)]> = keep.chunks(PRUNE_PART).collect();
    if parts.is_empty() {
        parts.push(&[]);
    }
    let last = parts.len() - 1;
    (parts.into_iter().enumerate())
        .map(|(part, names)| Control::Prune {
            keep: names.to_vec(),
            part: u32::try_from(part).unwrap_or(u32::MAX),
            more: part < last,
        })
        .collect()
}

/// The Controller recovered: `live` is every deployment it runs. From now on
/// the head knows every live route, and every live node is told to drop its
/// copies of any other. Sent under the send lock, as the changes are, so a
/// node has every change sent before it and none sent after.
pub(crate) fn recovered(shared: &HeadShared, live: HashSet<(AppName, DeploymentName)>) {
    let _sending = lock(&shared.export_send);
    let keep = {
        let mut ex = lock(&shared.export);
        ex.recovered = Some(live);
        to_keep(&ex)
    };
    if let Some(keep) = keep {
        for (_, peer) in shared.alive() {
            prune(shared, &peer, &keep);
        }
    }
    // The Controller filled the logging settings from the checkpoint.
    super::log_export::send_all(shared);
}

/// Every live route, once the Controller has recovered: the ones it
/// recovered that have not closed since, and every one published and open.
fn to_keep(ex: &Export) -> Option<Vec<(AppName, DeploymentName)>> {
    let recovered = ex.recovered.as_ref()?;
    let open = (ex.known.iter())
        .filter(|(k, r)| !r.is_closed() && !recovered.contains(*k))
        .map(|(k, _)| k);
    Some(recovered.iter().chain(open).cloned().collect())
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use flotilla_replica::Directory;

    use super::*;
    use crate::nodes::{Cookie, Head, HeadOptions};

    /// A head of namespace `name` on loopback, with no node, and its
    /// directory. (Its proxies' names are in the namespace: tests running at
    /// once must not share one.)
    /// Its re-attach grace and its silences last an hour: the fake nodes of
    /// these tests send no heartbeats, and a slow machine must not lose them.
    pub(crate) async fn head(name: &str) -> (Head, Directory) {
        let hour = Duration::from_secs(3_600);
        head_with(name, |o| o.reattach_grace(hour).heartbeat(hour / 2, hour)).await
    }

    /// A head on loopback with `options` laid over the defaults.
    pub(crate) async fn head_with(
        name: &str,
        options: impl FnOnce(HeadOptions) -> HeadOptions,
    ) -> (Head, Directory) {
        let options = options(
            HeadOptions::new(Cookie::new("export-test-cookie").unwrap())
                .listen("127.0.0.1:0".parse().unwrap()),
        );
        let reporter = Arc::new(
            |_: &str, _: &_, _: &_| -> flotilla_replica::ReplicaReporter { Arc::new(|_, _| {}) },
        );
        let directory = Directory::new();
        let head = Head::start(
            options,
            name.into(),
            directory.clone(),
            reporter,
            flotilla_replica::LogSettings::new(),
        )
        .await
        .unwrap();
        (head, directory)
    }

    /// A stand-in's model report exports only a route its DeploymentActor
    /// has published: before that (a restarted head waiting for its nodes),
    /// the empty, unconfigured route would empty the nodes' copies.
    #[tokio::test]
    async fn a_model_report_exports_only_a_route_its_deployment_published() {
        let (head, directory) = head("export-test-models").await;
        let (app, dep) = (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
        );
        let known = || lock(&head.shared.export).known.len();
        let route = directory.route(&app, &dep);
        models_changed(&head.shared, &route);
        assert_eq!(known(), 0);
        head.cluster().route_changed(&route);
        assert_eq!(known(), 1);
        models_changed(&head.shared, &route);
        assert_eq!(known(), 1);
        head.stop().await;
    }

    #[tokio::test]
    async fn a_deleted_route_is_forgotten_and_one_deployed_again_is_kept() {
        let (head, directory) = head("export-test").await;
        let cluster = head.cluster();
        let (app, dep) = (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
        );
        let known = || lock(&head.shared.export).known.len();
        let old = directory.route(&app, &dep);
        cluster.route_changed(&old);
        assert_eq!(known(), 1);
        directory.remove(&app, &dep);
        cluster.route_changed(&old);
        assert_eq!(known(), 0, "the deleted route is kept");

        // Deployed again before the old one's close is told: the new one stays.
        let old = directory.route(&app, &dep);
        cluster.route_changed(&old);
        directory.remove(&app, &dep);
        let new = directory.route(&app, &dep);
        cluster.route_changed(&new);
        cluster.route_changed(&old);
        assert_eq!(known(), 1);
        let kept = lock(&head.shared.export)
            .known
            .values()
            .next()
            .cloned()
            .unwrap();
        assert!(
            Arc::ptr_eq(&kept, &new),
            "the closed route replaced the new one"
        );
        head.stop().await;
    }

    /// What a node's copy is pruned to: nothing before the Controller has
    /// recovered; then what it recovered, less what closed since, and every
    /// open route published.
    #[tokio::test]
    async fn nodes_keep_the_recovered_and_the_published_routes_less_the_closed() {
        let (head, directory) = head("export-keep").await;
        let cluster = head.cluster();
        let key = |a: &str, d: &str| (AppName::new(a).unwrap(), DeploymentName::new(d).unwrap());
        let keep = || {
            let mut k = to_keep(&lock(&head.shared.export))?;
            k.sort();
            Some(k)
        };
        let (a, b, c) = (key("a", "d"), key("b", "d"), key("c", "d"));
        let route_b = directory.route(&b.0, &b.1);
        cluster.route_changed(&route_b);
        assert_eq!(keep(), None, "pruned before the head knows every route");
        cluster.deployments_recovered(&mut [a.clone(), b.clone()].into_iter());
        assert_eq!(keep(), Some(vec![a.clone(), b.clone()]));
        let route_c = directory.route(&c.0, &c.1);
        cluster.route_changed(&route_c);
        assert_eq!(keep(), Some(vec![a.clone(), b.clone(), c.clone()]));
        // b is deleted: neither recovered nor published any more.
        directory.remove(&b.0, &b.1);
        cluster.route_changed(&route_b);
        assert_eq!(keep(), Some(vec![a, c]));
        head.stop().await;
    }

    #[test]
    fn live_routes_go_in_bounded_parts() {
        let key = |i: usize| {
            (
                AppName::new(format!("a{i}")).unwrap(),
                DeploymentName::new("d").unwrap(),
            )
        };
        let shape = |n: usize| -> Vec<(usize, u32, bool)> {
            let keep: Vec<_> = (0..n).map(key).collect();
            prune_frames(&keep)
                .into_iter()
                .map(|f| match f {
                    Control::Prune { keep, part, more } => (keep.len(), part, more),
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(shape(0), [(0, 0, false)], "nothing live still prunes");
        assert_eq!(shape(PRUNE_PART), [(PRUNE_PART, 0, false)]);
        assert_eq!(
            shape(2 * PRUNE_PART + 1),
            [(PRUNE_PART, 0, true), (PRUNE_PART, 1, true), (1, 2, false)]
        );
        // The longest names: a part stays far from the frame limit.
        let long = |c: char| c.to_string().repeat(flotilla_core::MAX_NAME_LEN);
        let keep = vec![
            (
                AppName::new(long('a')).unwrap(),
                DeploymentName::new(long('d')).unwrap()
            );
            PRUNE_PART
        ];
        let frame = crate::nodes::wire::encode("control", &prune_frames(&keep)[0]).unwrap();
        assert!(frame.len() < 4 << 20, "{} bytes", frame.len());
    }

    /// A route deleted while no node is alive is not sent to any, and its
    /// head-local replicas stop being served to other processes then.
    #[tokio::test]
    async fn a_route_deleted_while_no_node_is_alive_stops_serving_its_replicas() {
        let (head, directory) = head("export-unserve").await;
        let cluster = head.cluster();
        let (app, dep) = (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
        );
        let route = directory.route(&app, &dep);
        // As a node that has since left had it: served, with its replica.
        let ep = crate::nodes::link::tests::counter().await;
        let link = &head.shared.link.shared;
        link.serve(ep.clone());
        lock(&head.shared.export)
            .served
            .insert((app.clone(), dep.clone()), vec![ep.id()]);
        cluster.route_changed(&route);
        assert!(link.served(ep.id()).is_some());
        directory.remove(&app, &dep);
        cluster.route_changed(&route);
        assert!(link.served(ep.id()).is_none(), "still served");
        assert!(lock(&head.shared.export).served.is_empty());
        head.stop().await;
    }
}
