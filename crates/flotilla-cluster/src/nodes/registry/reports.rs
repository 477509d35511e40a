//! What nodes report on their replicas and their load: each report goes to
//! its replica's proxy on the head, if the node that sent it runs the replica.

use std::collections::HashSet;

use flotilla_replica::ReplicaId;
use tracing::warn;

use super::RegistryState;
use crate::nodes::{head::lock, proxy::ProxyReport, wire::WireLoad};

/// Why a node's report on a replica went to no proxy.
pub(super) enum Undelivered {
    /// The replica runs on this other node.
    OtherNode(String),
    /// The head has no proxy of the replica (it never placed it, or it ended).
    NoProxy,
}

/// Pass a node's report on `replica` to its proxy, if the node that sent it
/// (`from`) is the one the replica runs on; else the report back, and why.
pub(super) fn deliver(
    state: &RegistryState,
    from: &str,
    replica: u64,
    report: ProxyReport,
) -> Result<(), (ProxyReport, Undelivered)> {
    let sender = state.by_peer.get(from);
    let proxies = lock(&state.shared.proxies);
    match proxies.get(&ReplicaId(replica)) {
        Some((node, tx)) if sender == Some(node) => {
            let _ = tx.send(report);
            Ok(())
        }
        Some((node, _)) => Err((report, Undelivered::OtherNode(node.clone()))),
        None => Err((report, Undelivered::NoProxy)),
    }
}

/// [`deliver`], with a warning when the report goes nowhere (returns whether
/// it was delivered).
pub(super) fn report(state: &RegistryState, from: &str, replica: u64, report: ProxyReport) -> bool {
    match deliver(state, from, replica, report) {
        Ok(()) => return true,
        Err((report, Undelivered::OtherNode(node))) => warn!(
            replica,
            %node,
            peer = %from,
            ?report,
            "report on a replica from a peer other than its node: ignored"
        ),
        Err((report, Undelivered::NoProxy)) => warn!(
            replica,
            ?report,
            "report for a replica the head has no proxy of"
        ),
    }
    false
}

/// Take `node`'s load report in place of its last (`None`: it is gone, and
/// its load with it): each of its replicas' running requests goes to its
/// mirror's endpoint, and each route's callers waiting on any node are summed
/// on the head's route, where the deployment's autoscaler reads them.
pub(super) fn take_load(state: &mut RegistryState, node: &str, load: Option<WireLoad>) {
    let old = match load {
        Some(new) => state.loads.insert(node.to_owned(), new),
        None => state.loads.remove(node),
    }
    .unwrap_or_default();
    let none = WireLoad::default();
    let new = state.loads.get(node).unwrap_or(&none);
    // Only to the node's own replicas' mirrors; quietly (a replica may have
    // ended since the node counted it).
    let proxies = lock(&state.shared.proxies);
    let tell = |replica: u64, n: u32| {
        if let Some((at, tx)) = proxies.get(&ReplicaId(replica))
            && at == node
        {
            let _ = tx.send(ProxyReport::Load(n));
        }
    };
    let still: HashSet<u64> = new.running.iter().map(|(r, _)| *r).collect();
    for (replica, _) in &old.running {
        if !still.contains(replica) {
            tell(*replica, 0);
        }
    }
    for (replica, n) in &new.running {
        tell(*replica, *n);
    }
    drop(proxies);
    // The totals change by this node's difference alone: O(its routes), not
    // O(nodes x routes) per report.
    let mut touched = HashSet::new();
    for (queued, sign) in [(&old.queued, -1i64), (&new.queued, 1)] {
        for (app, dep, n) in queued {
            let key = (app.clone(), dep.clone());
            let total = state.queued.entry(key.clone()).or_default();
            *total = total.saturating_add_signed(sign * i64::from(*n));
            touched.insert(key);
        }
    }
    for key in touched {
        let total = state.queued.get(&key).copied().unwrap_or_default();
        if total == 0 {
            state.queued.remove(&key);
        }
        if let Some(route) = state.shared.directory.get(&key.0, &key.1) {
            route.set_queued_elsewhere(total);
        }
    }
}
