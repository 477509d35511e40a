//! Placement: where a replica (or each bundle of its placement group) goes
//! among the nodes that fit, by the owner's ranking and the rules every
//! pool applies the same way (`max_replicas_per_node`, the placement group
//! strategies), and why a request fits nowhere.

use std::{collections::VecDeque, fmt::Write as _};

use flotilla_core::{PlacementGroup, PlacementStrategy, Resources};
use flotilla_replica::ReplicaId;

use super::{DeploymentKey, NodePool, PoolNode, Reservation, resources::add};
use crate::{NodeId, PlacementRequest, Refusal, cluster::limit_refusal};

impl NodePool {
    /// Place `request` (see the type's rules) and return the node where the
    /// replica runs, or refuse saying why. Among the live nodes that fit (a
    /// replica, a bundle, or a group's sum), the one with the lowest
    /// `rank(index, node, deployment)` is taken, the first declared on a tie;
    /// a spread group ranks once per bundle, with its earlier bundles already
    /// held. A replica that holds reservations already gets its node back and
    /// nothing more is reserved.
    ///
    /// Without a placement group nothing is allocated beyond the reservation's
    /// own record.
    pub fn place<K: PartialOrd>(
        &mut self,
        request: &PlacementRequest<'_>,
        mut rank: impl FnMut(usize, &PoolNode, &DeploymentKey) -> K,
    ) -> Result<NodeId, Refusal> {
        if let Some(node) = self.node_of(request.replica) {
            return Ok(node.spec.name.clone());
        }
        let key = (request.app.clone(), request.deployment.clone());
        let limit = request.max_replicas_per_node;
        let Some(group) = request.placement_group else {
            return match self.best(request.resources, &key, limit, &[], &mut rank) {
                Some(node) => {
                    add(&mut self.nodes[node].used, request.resources, 1.0);
                    Ok(self.record(
                        request.replica,
                        node,
                        request.resources.clone(),
                        key,
                        Vec::new(),
                    ))
                }
                None => Err(self.no_room(request.resources, limit)),
            };
        };
        if group.bundles.is_empty() {
            return Err(Refusal {
                missing: "its placement group has no bundle".to_owned(),
            });
        }
        match group.strategy {
            PlacementStrategy::Pack | PlacementStrategy::StrictPack => {
                let sum = group.total();
                match self.best(&sum, &key, limit, &[], &mut rank) {
                    Some(node) => {
                        add(&mut self.nodes[node].used, &sum, 1.0);
                        Ok(self.record(request.replica, node, sum, key, Vec::new()))
                    }
                    None if group.strategy == PlacementStrategy::Pack => {
                        self.pack_apart(request.replica, group, key, limit, rank)
                    }
                    None => Err(Refusal {
                        missing: format!(
                            "{} puts its {} on one node: {}",
                            group.strategy.name(),
                            bundles(group.bundles.len()),
                            self.no_room(&sum, limit).missing
                        ),
                    }),
                }
            }
            PlacementStrategy::Spread => {
                self.spread(request.replica, group, key, limit, false, rank)
            }
            PlacementStrategy::StrictSpread => {
                self.spread(request.replica, group, key, limit, true, rank)
            }
        }
    }

    /// The live node with room for `need` (and under `limit` replicas of `key`),
    /// not in `exclude`, that `rank` puts lowest; the first declared on a tie.
    fn best<K: PartialOrd>(
        &self,
        need: &Resources,
        key: &DeploymentKey,
        limit: Option<u32>,
        exclude: &[usize],
        rank: &mut impl FnMut(usize, &PoolNode, &DeploymentKey) -> K,
    ) -> Option<usize> {
        let mut best: Option<(K, usize)> = None;
        for (i, n) in self.nodes.iter().enumerate() {
            if !self.takes(i, need, key, limit) || exclude.contains(&i) {
                continue;
            }
            let k = rank(i, n, key);
            if best.as_ref().is_none_or(|(b, _)| k < *b) {
                best = Some((k, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Whether node `i` is alive, has room for `need` and runs fewer than
    /// `limit` replicas of `key`.
    fn takes(&self, i: usize, need: &Resources, key: &DeploymentKey, limit: Option<u32>) -> bool {
        self.nodes.get(i).is_some_and(|n| {
            n.open() && n.fits(need) && limit.is_none_or(|l| n.replicas_of(key) < l as usize)
        })
    }

    /// `SPREAD` (`strict` false) and `STRICT_SPREAD` (`strict` true): each bundle
    /// on a node none of the replica's other bundles took, in bundle order by
    /// `rank`; under `SPREAD` a bundle with no such node shares one. Where that
    /// greedy pass fails, any assignment to distinct nodes is looked for before
    /// refusing.
    fn spread<K: PartialOrd>(
        &mut self,
        replica: ReplicaId,
        group: &PlacementGroup,
        key: DeploymentKey,
        limit: Option<u32>,
        strict: bool,
        mut rank: impl FnMut(usize, &PoolNode, &DeploymentKey) -> K,
    ) -> Result<NodeId, Refusal> {
        let n = group.bundles.len();
        let greedy = self.hold_bundles(group, limit, |pool, bundle, lim, taken| {
            let pick = pool.best(bundle, &key, lim, taken, &mut rank);
            if pick.is_none() && !strict {
                return pool.best(bundle, &key, lim, &[], &mut rank);
            }
            pick
        });
        let taken = match greedy {
            Ok(taken) => taken,
            Err((b, why)) => {
                // The greedy pass can miss an assignment to distinct nodes (an
                // early bundle taking the only node a later one fits).
                let distinct = self.distinct_nodes(&group.bundles, &key, limit);
                if distinct.len() < n {
                    return Err(if strict {
                        self.strict_spread_refusal(group, &key, limit, distinct.len())
                    } else {
                        Refusal {
                            missing: format!(
                                "SPREAD: no room for bundle #{} of {n} beside the ones before \
                                 it: {}",
                                b + 1,
                                why.missing
                            ),
                        }
                    });
                }
                for (node, bundle) in distinct.iter().zip(&group.bundles) {
                    add(&mut self.nodes[*node].used, bundle, 1.0);
                }
                distinct
            }
        };
        Ok(self.record_bundles(replica, &taken, group, key))
    }

    /// `PACK` when no node has room for the bundles' sum (Ray's best effort):
    /// each bundle, in order, on a node an earlier bundle of the replica took
    /// if one has room, else on the node `rank` puts lowest; pending only
    /// when some bundle fits nowhere. Greedy, in bundle order: it does not
    /// look for the fewest nodes (bin packing), as Ray's does not.
    fn pack_apart<K: PartialOrd>(
        &mut self,
        replica: ReplicaId,
        group: &PlacementGroup,
        key: DeploymentKey,
        limit: Option<u32>,
        mut rank: impl FnMut(usize, &PoolNode, &DeploymentKey) -> K,
    ) -> Result<NodeId, Refusal> {
        let held = self.hold_bundles(group, limit, |pool, bundle, lim, taken| {
            taken
                .iter()
                .copied()
                .find(|&i| pool.takes(i, bundle, &key, lim))
                .or_else(|| pool.best(bundle, &key, lim, &[], &mut rank))
        });
        match held {
            Ok(taken) => Ok(self.record_bundles(replica, &taken, group, key)),
            Err((b, why)) => Err(Refusal {
                missing: format!(
                    "PACK: its {} fit no node together, and bundle #{} fits none{}: {}",
                    bundles(group.bundles.len()),
                    b + 1,
                    if b == 0 {
                        ""
                    } else {
                        " beside the ones before it"
                    },
                    why.missing
                ),
            }),
        }
    }

    /// Hold each of `group`'s bundles, in order, on the node `choose` picks
    /// for it (given the nodes the bundles before it took); the replica runs
    /// in its first bundle, so `limit` is that node's. The nodes taken, one
    /// per bundle; or the first bundle `choose` found no node for and why,
    /// with every node as it was before (restored exactly, no drift from
    /// adding and subtracting fractions).
    fn hold_bundles(
        &mut self,
        group: &PlacementGroup,
        limit: Option<u32>,
        mut choose: impl FnMut(&Self, &Resources, Option<u32>, &[usize]) -> Option<usize>,
    ) -> Result<Vec<usize>, (usize, Refusal)> {
        let n = group.bundles.len();
        let mut taken: Vec<usize> = Vec::with_capacity(n);
        let mut before: Vec<(usize, Resources)> = Vec::with_capacity(n);
        for (b, bundle) in group.bundles.iter().enumerate() {
            let lim = if b == 0 { limit } else { None };
            let Some(node) = choose(self, bundle, lim, &taken) else {
                // Why, while the bundles before it are still held.
                let why = self.no_room(bundle, lim);
                for (node, used) in before {
                    self.nodes[node].used = used;
                }
                return Err((b, why));
            };
            if !taken.contains(&node) {
                before.push((node, self.nodes[node].used.clone()));
            }
            add(&mut self.nodes[node].used, bundle, 1.0);
            taken.push(node);
        }
        Ok(taken)
    }

    /// Record `replica` as running in its first bundle on `taken[0]`, with
    /// bundle `b` held on `taken[b]` (each already added to its node's use).
    fn record_bundles(
        &mut self,
        replica: ReplicaId,
        taken: &[usize],
        group: &PlacementGroup,
        key: DeploymentKey,
    ) -> NodeId {
        let mut bundles = group.bundles.iter().cloned();
        let first = bundles.next().unwrap_or_else(Resources::none);
        let more = taken.iter().skip(1).copied().zip(bundles).collect();
        // Every bundle has a node here, and there is at least one bundle.
        let node = taken.first().copied().unwrap_or(0);
        self.record(replica, node, first, key, more)
    }

    /// Why `STRICT_SPREAD` cannot place `group` when at most `placed` of its
    /// bundles fit on distinct nodes: how many nodes it needs and how many have
    /// room, and any bundle that fits no node at all.
    fn strict_spread_refusal(
        &self,
        group: &PlacementGroup,
        key: &DeploymentKey,
        limit: Option<u32>,
        placed: usize,
    ) -> Refusal {
        let live = self.live().count();
        if live == 0 {
            return Refusal {
                missing: "the cluster has no live node".to_owned(),
            };
        }
        let mut missing = format!(
            "STRICT_SPREAD puts each of its {} on a different node: it needs {} nodes with \
             room, and has {placed} (of {live} live)",
            bundles(group.bundles.len()),
            group.bundles.len(),
        );
        for (b, bundle) in group.bundles.iter().enumerate() {
            let lim = if b == 0 { limit } else { None };
            if !(0..self.nodes.len()).any(|i| self.takes(i, bundle, key, lim)) {
                let _ = write!(
                    missing,
                    "; bundle #{}: {}",
                    b + 1,
                    self.no_room(bundle, lim).missing
                );
            }
        }
        Refusal { missing }
    }

    /// A node for each of `bundles`, all different, if there is such an
    /// assignment (bundle `b` on node `out[b]`); otherwise the most bundles
    /// that fit on distinct nodes, as nodes in no bundle order (only the
    /// length means anything then). Bipartite matching by breadth-first
    /// augmenting paths, without recursion; run only when the greedy pass
    /// failed.
    fn distinct_nodes(
        &self,
        bundles: &[Resources],
        key: &DeploymentKey,
        limit: Option<u32>,
    ) -> Vec<usize> {
        let fits: Vec<Vec<usize>> = bundles
            .iter()
            .enumerate()
            .map(|(b, bundle)| {
                let lim = if b == 0 { limit } else { None };
                (0..self.nodes.len())
                    .filter(|i| self.takes(*i, bundle, key, lim))
                    .collect()
            })
            .collect();
        let nodes = self.nodes.len();
        let mut holder: Vec<Option<usize>> = vec![None; nodes];
        let mut node_of: Vec<Option<usize>> = vec![None; bundles.len()];
        for b in 0..bundles.len() {
            // Breadth first over alternating paths from bundle b.
            let mut via: Vec<Option<usize>> = vec![None; nodes];
            let mut queue = VecDeque::from([b]);
            let mut free = None;
            'search: while let Some(x) = queue.pop_front() {
                for &j in &fits[x] {
                    if via[j].is_some() {
                        continue;
                    }
                    via[j] = Some(x);
                    match holder[j] {
                        None => {
                            free = Some(j);
                            break 'search;
                        }
                        Some(y) => queue.push_back(y),
                    }
                }
            }
            // Flip the path: each node on it goes to the bundle that reached it.
            let mut at = free;
            while let Some(j) = at {
                let Some(x) = via[j] else { break };
                holder[j] = Some(x);
                at = node_of[x].replace(j);
            }
        }
        // Complete, this is in bundle order; otherwise only its length counts.
        node_of.into_iter().flatten().collect()
    }

    /// Record what `replica` holds (already added to the nodes' use) and
    /// return the name of the node it runs on.
    fn record(
        &mut self,
        replica: ReplicaId,
        node: usize,
        resources: Resources,
        key: DeploymentKey,
        more: Vec<(usize, Resources)>,
    ) -> NodeId {
        let n = &mut self.nodes[node];
        n.replicas += 1;
        // No key allocated for a deployment the node already counts.
        match n.per_deployment.get_mut(&key) {
            Some(count) => *count += 1,
            None => {
                n.per_deployment.insert(key.clone(), 1);
            }
        }
        let name = n.spec.name.clone();
        self.reservations.insert(
            replica,
            Reservation {
                node,
                resources,
                key,
                more,
            },
        );
        name
    }

    /// Why `need` fits no live node once `limit` replicas of the deployment
    /// per node are counted: the limit where some node has the room (so every
    /// such node is at the limit), else [`refusal`](Self::refusal).
    fn no_room(&self, need: &Resources, limit: Option<u32>) -> Refusal {
        if let Some(l) = limit
            && self.fitting(need).next().is_some()
        {
            return limit_refusal(l, "every live node with room");
        }
        self.refusal(need)
    }
}

/// "1 bundle", "3 bundles".
fn bundles(n: usize) -> String {
    if n == 1 {
        "1 bundle".to_owned()
    } else {
        format!("{n} bundles")
    }
}
