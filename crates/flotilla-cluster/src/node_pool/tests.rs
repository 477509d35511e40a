//! Placement and bookkeeping rules of [`NodePool`](super::NodePool).

use flotilla_core::{AppName, DeploymentName, PlacementGroup, PlacementStrategy as S};

use super::*;
use crate::PlacementRequest;

fn names() -> (AppName, DeploymentName, DeploymentName) {
    (
        AppName::new("a").unwrap(),
        DeploymentName::new("d").unwrap(),
        DeploymentName::new("e").unwrap(),
    )
}

fn cpus(n: f64) -> Resources {
    Resources::none().with_cpus(n)
}

fn pool(nodes: &[(&str, Resources)]) -> NodePool {
    NodePool::new(nodes.iter().map(|(n, r)| NodeSpec::new(*n, r.clone())))
}

/// The first declared node that fits wins (rank ties everywhere).
fn first(pool: &mut NodePool, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
    pool.place(request, |_, _, _| 0)
}

/// Spread by replicas of the deployment, as StaticCluster does.
fn spread(pool: &mut NodePool, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
    pool.place(request, |i, n, key| (n.replicas_of(key), n.replicas(), i))
}

fn free(pool: &NodePool, node: &str) -> f64 {
    pool.node(node).unwrap().free().cpus
}

fn held(pool: &NodePool, id: u64) -> Vec<(String, f64)> {
    pool.reservations_of(ReplicaId(id))
        .map(|(n, r)| (n.name().to_owned(), r.cpus))
        .collect()
}

#[test]
fn a_draining_node_keeps_its_replicas_and_takes_no_new_one() {
    let mut p = pool(&[("n1", cpus(2.0)), ("n2", cpus(1.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    let req = |id| PlacementRequest::new(ReplicaId(id), &a, &d, &one);
    assert_eq!(first(&mut p, &req(1)).unwrap(), "n1");
    assert!(p.drain("n1"));
    assert!(p.node("n1").unwrap().is_draining() && p.is_alive("n1"));
    assert_eq!(
        held(&p, 1),
        [("n1".to_owned(), 1.0)],
        "its replica keeps its place"
    );
    // n1 has room for one more, but it is leaving.
    assert_eq!(first(&mut p, &req(2)).unwrap(), "n2");
    let refusal = first(&mut p, &req(3)).unwrap_err();
    assert_eq!(refusal.missing, "cpus: need 1, most free 0");
    assert!(p.drain("n2"));
    assert_eq!(
        first(&mut p, &req(3)).unwrap_err().missing,
        "every live node is leaving the cluster"
    );
    // A drained node that dies and comes back takes replicas again.
    assert!(p.kill("n1").is_some());
    assert!(!p.drain("n1"), "a dead node does not drain");
    assert!(p.add(NodeSpec::new("n1", cpus(2.0))));
    assert_eq!(first(&mut p, &req(3)).unwrap(), "n1");
}

#[test]
fn a_node_at_max_replicas_per_node_takes_no_more_of_that_deployment() {
    let mut p = pool(&[("n1", cpus(4.0)), ("n2", cpus(4.0))]);
    let (a, d, e) = names();
    let one = cpus(1.0);
    let req = |id, dep| PlacementRequest::new(ReplicaId(id), &a, dep, &one);
    // With the first node always preferred, the limit alone spreads them.
    assert_eq!(
        first(&mut p, &req(1, &d).with_max_replicas_per_node(1)).unwrap(),
        "n1"
    );
    assert_eq!(
        first(&mut p, &req(2, &d).with_max_replicas_per_node(1)).unwrap(),
        "n2"
    );
    let refusal = first(&mut p, &req(3, &d).with_max_replicas_per_node(1)).unwrap_err();
    assert_eq!(
        refusal.missing,
        "max_replicas_per_node is 1 and every live node with room already runs 1 replica \
         of this deployment"
    );
    // Another deployment is not counted, nor is a request without the limit.
    assert_eq!(
        first(&mut p, &req(4, &e).with_max_replicas_per_node(1)).unwrap(),
        "n1"
    );
    assert_eq!(first(&mut p, &req(5, &d)).unwrap(), "n1");
    // A limit of 2: n1 runs two of d's replicas, n2 one.
    assert_eq!(
        p.node("n1").unwrap().replicas_of(&(a.clone(), d.clone())),
        2
    );
    assert_eq!(
        first(&mut p, &req(6, &d).with_max_replicas_per_node(2)).unwrap(),
        "n2"
    );
    let refusal = first(&mut p, &req(7, &d).with_max_replicas_per_node(2)).unwrap_err();
    assert!(
        refusal.missing.contains("already runs 2 replicas"),
        "{refusal}"
    );
    // Released, a replica's place is free again.
    assert!(p.release(ReplicaId(2)));
    assert_eq!(
        first(&mut p, &req(7, &d).with_max_replicas_per_node(2)).unwrap(),
        "n2"
    );
}

#[test]
fn without_room_anywhere_the_refusal_names_the_resource_not_the_limit() {
    let mut p = pool(&[("n1", cpus(1.0)), ("n2", cpus(4.0))]);
    let (a, d, _) = names();
    let (one, three) = (cpus(1.0), cpus(3.0));
    let req = |id, r| PlacementRequest::new(ReplicaId(id), &a, &d, r).with_max_replicas_per_node(1);
    assert_eq!(first(&mut p, &req(1, &one)).unwrap(), "n1");
    assert_eq!(first(&mut p, &req(2, &three)).unwrap(), "n2");
    // n1 is full; n2 has room for one CPU but runs d's one replica.
    let refusal = first(&mut p, &req(3, &one)).unwrap_err();
    assert!(
        refusal.missing.starts_with("max_replicas_per_node is 1"),
        "{refusal}"
    );
    // Room for three CPUs is nowhere: that is said, not the limit.
    let refusal = first(&mut p, &req(4, &three)).unwrap_err();
    assert_eq!(refusal.missing, "cpus: need 3, most free 1");
}

#[test]
fn pack_and_strict_pack_reserve_the_bundles_sum_on_one_node() {
    let mut p = pool(&[("small", cpus(2.0)), ("big", cpus(4.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    for (id, strategy) in [(1, S::Pack), (2, S::StrictPack)] {
        let group = PlacementGroup::new(vec![cpus(1.0), cpus(2.0)], strategy);
        let req = PlacementRequest::new(ReplicaId(id), &a, &d, &one).with_placement_group(&group);
        assert_eq!(first(&mut p, &req).unwrap(), "big", "{strategy:?}");
        assert_eq!(held(&p, id), [("big".to_owned(), 3.0)]);
        assert_eq!(free(&p, "big"), 1.0);
        assert_eq!(free(&p, "small"), 2.0);
        // A pack's bundles are one replica on one node.
        assert_eq!(p.node("big").unwrap().replicas(), 1);
        assert!(p.release(ReplicaId(id)));
        assert_eq!(free(&p, "big"), 4.0);
    }
    let group = PlacementGroup::new(vec![cpus(3.0), cpus(2.0)], S::StrictPack);
    let req = PlacementRequest::new(ReplicaId(3), &a, &d, &one).with_placement_group(&group);
    let refusal = first(&mut p, &req).unwrap_err();
    assert_eq!(
        refusal.missing,
        "STRICT_PACK puts its 2 bundles on one node: cpus: need 5, most free 4"
    );
    assert_eq!(p.reserved(), 0);
}

#[test]
fn pack_spills_bundles_no_node_holds_together_onto_as_few_nodes_as_it_can() {
    let mut p = pool(&[("n1", cpus(2.0)), ("n2", cpus(3.0)), ("n3", cpus(3.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    // 5 CPUs fit no node: bundle 1 (2) where rank puts it (n1), bundle 2
    // (1) no longer fits n1, so n2, and bundle 3 (2) joins bundle 2 on n2
    // rather than open n3.
    let group = PlacementGroup::new(vec![cpus(2.0), cpus(1.0), cpus(2.0)], S::Pack);
    let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
    assert_eq!(
        first(&mut p, &req).unwrap(),
        "n1",
        "runs in its first bundle"
    );
    assert_eq!(
        held(&p, 1),
        [
            ("n1".to_owned(), 2.0),
            ("n2".to_owned(), 1.0),
            ("n2".to_owned(), 2.0)
        ]
    );
    assert_eq!((free(&p, "n2"), free(&p, "n3")), (0.0, 3.0));
    // A bundle that fits no node leaves the replica pending, and nothing held.
    let group = PlacementGroup::new(vec![cpus(1.0), cpus(4.0)], S::Pack);
    let req = PlacementRequest::new(ReplicaId(2), &a, &d, &one).with_placement_group(&group);
    assert_eq!(
        first(&mut p, &req).unwrap_err().missing,
        "PACK: its 2 bundles fit no node together, and bundle #2 fits none beside the \
         ones before it: cpus: need 4, most free 2"
    );
    assert_eq!(free(&p, "n3"), 3.0, "bundle #1's hold was given back");
    assert!(p.release(ReplicaId(1)));
    assert_eq!(p.reserved(), 0);
}

#[test]
fn strict_spread_puts_each_bundle_on_a_different_node_or_refuses_counting_nodes() {
    let mut p = pool(&[("n1", cpus(8.0)), ("n2", cpus(8.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    let group = PlacementGroup::new(vec![cpus(1.0), cpus(2.0), cpus(3.0)], S::StrictSpread);
    let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
    let refusal = spread(&mut p, &req).unwrap_err();
    assert_eq!(
        refusal.missing,
        "STRICT_SPREAD puts each of its 3 bundles on a different node: it needs 3 nodes \
         with room, and has 2 (of 2 live)"
    );
    // Nothing stays held after a refusal.
    assert_eq!(
        (free(&p, "n1"), free(&p, "n2"), p.reserved()),
        (8.0, 8.0, 0)
    );

    assert!(p.add(NodeSpec::new("n3", cpus(8.0))));
    // The replica runs where its first bundle is.
    assert_eq!(spread(&mut p, &req).unwrap(), "n1");
    assert_eq!(
        held(&p, 1),
        [
            ("n1".to_owned(), 1.0),
            ("n2".to_owned(), 2.0),
            ("n3".to_owned(), 3.0)
        ]
    );
    // Replicas, not bundles, are counted per node.
    let replicas: Vec<usize> = p.nodes().iter().map(PoolNode::replicas).collect();
    assert_eq!(replicas, [1, 0, 0]);
    // Placing again is idempotent; releasing gives every bundle back.
    assert_eq!(spread(&mut p, &req).unwrap(), "n1");
    assert!(p.release(ReplicaId(1)));
    assert_eq!(
        (free(&p, "n1"), free(&p, "n2"), free(&p, "n3")),
        (8.0, 8.0, 8.0)
    );
    assert_eq!(held(&p, 1), []);
}

#[test]
fn strict_spread_finds_distinct_nodes_the_greedy_pass_misses_and_names_a_bundle_that_fits_nowhere()
{
    // n1 is preferred, but the GPU bundle fits only there.
    let mut p = pool(&[("n1", cpus(1.0).with_gpus(1.0)), ("n2", cpus(1.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    let group = PlacementGroup::new(
        vec![cpus(1.0), Resources::none().with_gpus(1.0)],
        S::StrictSpread,
    );
    let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
    assert_eq!(first(&mut p, &req).unwrap(), "n2");
    assert_eq!(
        held(&p, 1),
        [("n2".to_owned(), 1.0), ("n1".to_owned(), 0.0)]
    );
    assert_eq!(p.node("n1").unwrap().free().gpus, 0.0);

    let tpu = PlacementGroup::new(
        vec![cpus(0.5), Resources::none().with_custom("tpu", 1.0)],
        S::StrictSpread,
    );
    let half = cpus(0.5);
    let req = PlacementRequest::new(ReplicaId(2), &a, &d, &half).with_placement_group(&tpu);
    let refusal = first(&mut p, &req).unwrap_err();
    assert_eq!(
        refusal.missing,
        "STRICT_SPREAD puts each of its 2 bundles on a different node: it needs 2 nodes \
         with room, and has 1 (of 2 live); bundle #2: tpu: need 1, most free 0"
    );
}

#[test]
fn spread_uses_distinct_nodes_where_it_can_and_shares_where_it_cannot() {
    let mut p = pool(&[("n1", cpus(4.0)), ("n2", cpus(4.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    let group = PlacementGroup::new(vec![cpus(1.0), cpus(1.0), cpus(2.0)], S::Spread);
    let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
    assert_eq!(first(&mut p, &req).unwrap(), "n1");
    // The third bundle has no node of its own: it shares the first one that fits.
    assert_eq!(
        held(&p, 1),
        [
            ("n1".to_owned(), 1.0),
            ("n2".to_owned(), 1.0),
            ("n1".to_owned(), 2.0)
        ]
    );
    assert_eq!((free(&p, "n1"), free(&p, "n2")), (1.0, 3.0));
    let big = PlacementGroup::new(vec![cpus(1.0), cpus(3.5)], S::Spread);
    let req = PlacementRequest::new(ReplicaId(2), &a, &d, &one).with_placement_group(&big);
    let refusal = first(&mut p, &req).unwrap_err();
    assert_eq!(
        refusal.missing,
        "SPREAD: no room for bundle #2 of 2 beside the ones before it: cpus: need 3.5, \
         most free 3"
    );
    assert_eq!(
        (free(&p, "n1"), free(&p, "n2")),
        (1.0, 3.0),
        "nothing left held"
    );
    assert!(p.release(ReplicaId(1)));
    assert_eq!((free(&p, "n1"), free(&p, "n2")), (4.0, 4.0));
}

#[test]
fn a_dead_node_takes_its_replicas_whole_and_its_bundles_of_others_with_it() {
    let mut p = pool(&[("n1", cpus(4.0)), ("n2", cpus(4.0)), ("n3", cpus(4.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    let group = PlacementGroup::new(vec![cpus(1.0), cpus(2.0)], S::StrictSpread);
    let req = |id| PlacementRequest::new(ReplicaId(id), &a, &d, &one).with_placement_group(&group);
    assert_eq!(spread(&mut p, &req(1)).unwrap(), "n1");
    assert_eq!(spread(&mut p, &req(2)).unwrap(), "n2");
    assert_eq!(
        held(&p, 1),
        [("n1".to_owned(), 1.0), ("n2".to_owned(), 2.0)]
    );
    assert_eq!(
        held(&p, 2),
        [("n2".to_owned(), 1.0), ("n3".to_owned(), 2.0)]
    );
    // n2 dies: replica 2 ran there and is lost, with its bundle on n3;
    // replica 1 runs on, without its bundle on n2.
    assert_eq!(p.kill("n2").unwrap(), [(a.clone(), d.clone())]);
    assert_eq!(held(&p, 1), [("n1".to_owned(), 1.0)]);
    assert_eq!(held(&p, 2), []);
    assert_eq!((free(&p, "n1"), free(&p, "n3")), (3.0, 4.0));
    assert_eq!(p.node_of(ReplicaId(1)).unwrap().name(), "n1");
    assert!(p.release(ReplicaId(1)));
    assert_eq!(free(&p, "n1"), 4.0);
    // Back, the node is empty.
    assert!(p.add(NodeSpec::new("n2", cpus(4.0))));
    assert_eq!(free(&p, "n2"), 4.0);
}

#[test]
fn a_forgotten_dead_node_leaves_the_others_reservations_where_they_were() {
    let mut p = pool(&[("n1", cpus(4.0)), ("n2", cpus(4.0)), ("n3", cpus(4.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    let group = PlacementGroup::new(vec![cpus(1.0), cpus(2.0)], S::StrictSpread);
    let req = |id| PlacementRequest::new(ReplicaId(id), &a, &d, &one).with_placement_group(&group);
    assert_eq!(spread(&mut p, &req(1)).unwrap(), "n1");
    assert_eq!(spread(&mut p, &req(2)).unwrap(), "n2");
    assert_eq!(spread(&mut p, &req(3)).unwrap(), "n3");
    assert!(!p.forget("n1"), "a live node is not forgotten");
    assert!(!p.forget("n9"));
    p.kill("n2").unwrap();
    assert!(p.forget("n2"));
    assert!(!p.forget("n2"));
    let names: Vec<&str> = p.nodes().iter().map(PoolNode::name).collect();
    assert_eq!(names, ["n1", "n3"]);
    // Replica 3 runs on n3 with its bundle on n1; replica 1 on n1.
    assert_eq!(held(&p, 1), [("n1".to_owned(), 1.0)]);
    assert_eq!(
        held(&p, 3),
        [("n3".to_owned(), 1.0), ("n1".to_owned(), 2.0)]
    );
    assert_eq!((free(&p, "n1"), free(&p, "n3")), (1.0, 3.0));
    assert!(p.release(ReplicaId(3)));
    assert_eq!((free(&p, "n1"), free(&p, "n3")), (3.0, 4.0));
    assert_eq!(p.node("n3").unwrap().replicas(), 0);
    // The order still breaks ties: n1 before n3.
    let plain = PlacementRequest::new(ReplicaId(4), &a, &d, &one);
    assert_eq!(first(&mut p, &plain).unwrap(), "n1");
}

#[test]
fn a_placement_group_without_bundles_is_refused() {
    let mut p = pool(&[("n1", cpus(4.0))]);
    let (a, d, _) = names();
    let one = cpus(1.0);
    let group = PlacementGroup::new(vec![], S::StrictSpread);
    let req = PlacementRequest::new(ReplicaId(1), &a, &d, &one).with_placement_group(&group);
    assert_eq!(
        first(&mut p, &req).unwrap_err().missing,
        "its placement group has no bundle"
    );
}
