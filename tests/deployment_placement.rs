//! Placement on a `StaticCluster`, slow starts, and node deaths, through the public
//! API on paused tokio time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use flotilla::{ApplicationStatus as A, DeploymentStatus, ReplicaState as R, Resources};
use flotilla::{DeploymentSnapshot, NodeSpec, PlacementGroup, PlacementStrategy, StaticCluster};
use support::{
    ProbeArgs, Switches, app_of, assert_not_deploy_failed, no_wait, observe, probe, start_fresh,
    start_on, tag, wait_snapshot, wait_status,
};
use tokio::time::Instant;

fn cpus(name: &str, n: f64) -> NodeSpec {
    NodeSpec::new(name, Resources::default().with_cpus(n))
}

fn bundles(cpus: &[f64]) -> Vec<Resources> {
    cpus.iter()
        .map(|n| Resources::none().with_cpus(*n))
        .collect()
}

fn free_cpus(cluster: &StaticCluster, node: &str) -> f64 {
    cluster.free(node).unwrap().cpus
}

fn nodes(s: &DeploymentSnapshot) -> Vec<String> {
    let mut v: Vec<String> = s
        .replicas
        .iter()
        .filter(|r| r.state != R::Stopping)
        .map(|r| r.node.clone())
        .collect();
    v.sort();
    v
}

/// A replica that fails to start on one of several nodes is named with its
/// node in the deployment's status: a node whose build lacks the code fails
/// every replica placed there, and is found from the status.
#[tokio::test(start_paused = true)]
async fn a_startup_failure_on_a_node_names_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 1.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    let failing = ProbeArgs {
        fail_constructor: u32::MAX,
        ..tag("f")
    };
    serve
        .run_many(vec![app_of("a", probe(1, &failing))], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        s.status.message.contains("failed to start")
    })
    .await;
    assert!(
        s.status.message.contains("(on node n1)"),
        "{}",
        s.status.message
    );
    serve.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_constructor_slower_than_30s_is_reported_on_the_status_by_a_timer() {
    let (_dir, _, serve) = start_fresh().await;
    let slow = ProbeArgs {
        start_delay_ms: 45_000,
        ..tag("s")
    };
    let t0 = Instant::now();
    serve
        .run_many(vec![app_of("a", probe(2, &slow))], no_wait())
        .await
        .unwrap();
    tokio::time::sleep_until(t0 + Duration::from_millis(29_900)).await;
    let s = observe(&serve, "a", "probe").await;
    assert!(!s.status.message.contains("30s"), "{}", s.status.message);
    tokio::time::sleep_until(t0 + Duration::from_millis(30_100)).await;
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.status.status, DeploymentStatus::Updating);
    assert_eq!(
        s.status.message,
        "Deployment 'probe' in application 'a' has 2 replicas that have taken more than 30s to \
         initialize.\nThis may be caused by a slow constructor or reconfigure method."
    );
    let st = wait_status(&serve, "a", A::Running).await;
    assert_eq!(st.deployments.values().next().unwrap().message, "");
}

#[tokio::test(start_paused = true)]
async fn a_replica_without_room_waits_naming_the_resource_and_starts_when_room_appears() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 2.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    serve.run(app_of("a", probe(2, &tag("a")))).await.unwrap();
    assert_eq!(cluster.replicas_on("n1"), 2);

    let t0 = Instant::now();
    let gpu =
        probe(1, &tag("g")).with_config(|c| c.with_resources(Resources::none().with_gpus(1.0)));
    serve
        .run_many(
            vec![app_of("b", probe(1, &tag("b"))), app_of("c", gpu)],
            no_wait(),
        )
        .await
        .unwrap();
    let b = wait_snapshot(&serve, "b", "probe", |s| s.pending == 1).await;
    assert_eq!(
        b.pending_reason.as_deref(),
        Some("no node has room: cpus: need 1, most free 0")
    );
    assert!(
        b.status.message.contains("cpus: need 1, most free 0"),
        "{}",
        b.status.message
    );
    let c = wait_snapshot(&serve, "c", "probe", |s| s.pending == 1).await;
    assert!(
        c.status.message.contains("gpus: need 1, most free 0"),
        "{}",
        c.status.message
    );
    assert_eq!(serve.app_status("b").status, A::Deploying);

    // Past 30 s the slow-start message says why.
    tokio::time::sleep_until(t0 + Duration::from_millis(30_100)).await;
    let b = observe(&serve, "b", "probe").await;
    assert!(
        b.status
            .message
            .contains("has 1 replicas that have taken more than 30s to be scheduled")
            && b.status.message.contains("No node can take them")
            && b.status.message.contains("cpus: need 1"),
        "{}",
        b.status.message
    );

    // Deleting "a" releases its CPUs: "b" is placed, with no polling involved.
    serve.delete_apps(&["a"], true).await.unwrap();
    wait_status(&serve, "b", A::Running).await;
    assert_eq!(nodes(&observe(&serve, "b", "probe").await), ["n1"]);
    // "c" still waits for a GPU, until a node with one joins.
    assert_eq!(observe(&serve, "c", "probe").await.pending, 1);
    cluster.add_node(NodeSpec::new("g1", Resources::none().with_gpus(1.0)));
    wait_status(&serve, "c", A::Running).await;
    assert_eq!(nodes(&observe(&serve, "c", "probe").await), ["g1"]);
}

#[tokio::test(start_paused = true)]
async fn replicas_spread_and_a_dead_nodes_replicas_are_replaced_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([
        cpus("n1", 2.0),
        cpus("n2", 2.0),
        cpus("n3", 2.0),
    ]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    let slow = ProbeArgs {
        start_delay_ms: 1_000,
        ..tag("d")
    };
    let h = serve.run(app_of("a", probe(3, &slow))).await.unwrap();
    assert_eq!(
        nodes(&observe(&serve, "a", "probe").await),
        ["n1", "n2", "n3"]
    );

    assert!(cluster.kill_node("n2"));
    let st = wait_status(&serve, "a", A::Unhealthy).await;
    let msg = &st.deployments.values().next().unwrap().message;
    assert!(msg.contains("was lost with its node 'n2'"), "{msg}");
    assert_eq!(h.replicas().len(), 2, "the lost replica left the route");
    wait_status(&serve, "a", A::Running).await;
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.count(R::Running), 3);
    assert!(!nodes(&s).contains(&"n2".to_owned()));
    assert_eq!(sw.constructed.load(Ordering::SeqCst), 4);
    assert_eq!(h.replicas().len(), 3);
}

/// A replica lost with its node and waiting for another: the deployment is
/// UNHEALTHY and says why, the wait for a node not taking the place of the
/// cause (Ray: "the issue that caused the deployment to be unhealthy should
/// be prioritized"). The wait's message replaced it at once.
#[tokio::test(start_paused = true)]
async fn an_unhealthy_deployment_waiting_for_a_node_keeps_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 1.0), cpus("n2", 1.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    serve.run(app_of("a", probe(2, &tag("u")))).await.unwrap();
    assert!(cluster.kill_node("n2"));
    let s = wait_snapshot(&serve, "a", "probe", |s| s.pending == 1).await;
    assert_eq!(s.status.status, DeploymentStatus::Unhealthy);
    assert!(
        s.status.message.contains("was lost with its node 'n2'"),
        "{}",
        s.status.message
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let s = observe(&serve, "a", "probe").await;
    assert!(
        s.status.message.contains("was lost with its node 'n2'"),
        "{}",
        s.status.message
    );
    // A node joins: the replica is placed, and the deployment is healthy.
    assert!(cluster.add_node(cpus("n3", 1.0)));
    wait_status(&serve, "a", A::Running).await;
}

#[tokio::test(start_paused = true)]
async fn scale_down_empties_the_node_with_the_fewest_replicas_first() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    // Spread puts the first replica on n1, which is then full; the other two on n2.
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 1.0), cpus("n2", 4.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    serve.run(app_of("a", probe(3, &tag("e")))).await.unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(nodes(&s), ["n1", "n2", "n2"]);
    let oldest = s.replicas[0].id;
    assert_eq!(s.replicas[0].node, "n1");

    // Newest-first alone would stop one on n2; emptying nodes stops n1's (the oldest).
    serve.run(app_of("a", probe(2, &tag("e")))).await.unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.replicas.len() == 2).await;
    assert_eq!(nodes(&s), ["n2", "n2"]);
    assert!(s.replicas.iter().all(|r| r.id != oldest));
    assert_eq!(cluster.replicas_on("n1"), 0);
}

#[tokio::test(start_paused = true)]
async fn max_replicas_per_node_leaves_a_replica_pending_naming_the_limit_until_a_node_joins() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 4.0), cpus("n2", 4.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    let one_per_node = probe(3, &tag("m")).with_config(|c| c.with_max_replicas_per_node(1));
    serve
        .run_many(vec![app_of("a", one_per_node)], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        s.pending == 1 && s.count(R::Running) == 2
    })
    .await;
    assert_eq!(nodes(&s), ["n1", "n2"]);
    let reason = "no node has room: max_replicas_per_node is 1 and every live node with room \
                  already runs 1 replica of this deployment";
    assert_eq!(s.pending_reason.as_deref(), Some(reason));
    assert_eq!(
        s.status.message,
        format!("1 replicas waiting for a node: {reason}")
    );
    // Both nodes have CPUs to spare: it is the limit that holds the third back.
    assert_eq!(
        (free_cpus(&cluster, "n1"), free_cpus(&cluster, "n2")),
        (3.0, 3.0)
    );
    assert_eq!(serve.app_status("a").status, A::Deploying);

    // A node joins: the pending replica is placed there, with no polling.
    assert!(cluster.add_node(cpus("n3", 4.0)));
    wait_status(&serve, "a", A::Running).await;
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(nodes(&s), ["n1", "n2", "n3"]);
    assert_eq!((s.pending, s.pending_reason), (0, None));
}

#[tokio::test(start_paused = true)]
async fn strict_spread_waits_for_a_node_per_bundle_and_releases_every_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 4.0), cpus("n2", 4.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    let group = PlacementGroup::new(bundles(&[1.0, 2.0, 3.0]), PlacementStrategy::StrictSpread);
    let spread = probe(1, &tag("s")).with_config(|c| c.with_placement_group(group));
    serve
        .run_many(vec![app_of("a", spread)], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.pending == 1).await;
    assert_eq!(
        s.pending_reason.as_deref(),
        Some(
            "no node has room: STRICT_SPREAD puts each of its 3 bundles on a different node: \
             it needs 3 nodes with room, and has 2 (of 2 live)"
        )
    );
    assert!(
        s.status.message.contains("STRICT_SPREAD") && s.status.message.contains("needs 3 nodes"),
        "{}",
        s.status.message
    );
    assert_eq!(
        (free_cpus(&cluster, "n1"), free_cpus(&cluster, "n2")),
        (4.0, 4.0)
    );

    assert!(cluster.add_node(cpus("n3", 4.0)));
    wait_status(&serve, "a", A::Running).await;
    let s = observe(&serve, "a", "probe").await;
    // The replica runs in its first bundle; each bundle holds its own node.
    assert_eq!(nodes(&s), ["n1"]);
    let id = s.replicas[0].id;
    let held: Vec<(String, f64)> = cluster
        .reservations_of(id)
        .into_iter()
        .map(|(n, r)| (n, r.cpus))
        .collect();
    assert_eq!(
        held,
        [("n1".into(), 1.0), ("n2".into(), 2.0), ("n3".into(), 3.0)]
    );
    let free: Vec<f64> = ["n1", "n2", "n3"].map(|n| free_cpus(&cluster, n)).to_vec();
    assert_eq!(free, [3.0, 2.0, 1.0]);

    // Deleted, the replica gives every bundle back.
    serve.delete_apps(&["a"], true).await.unwrap();
    let free: Vec<f64> = ["n1", "n2", "n3"].map(|n| free_cpus(&cluster, n)).to_vec();
    assert_eq!(free, [4.0, 4.0, 4.0]);
    assert!(cluster.reservations_of(id).is_empty());
}

#[tokio::test(start_paused = true)]
async fn pack_reserves_the_bundles_sum_on_one_node_or_as_few_as_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    // Only "big" holds both bundles together.
    let cluster = Arc::new(StaticCluster::new([
        cpus("small", 2.0),
        cpus("mid", 2.0),
        cpus("big", 4.0),
    ]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    let group = PlacementGroup::new(bundles(&[1.0, 2.0]), PlacementStrategy::Pack);
    let packed = probe(1, &tag("p")).with_config(|c| c.with_placement_group(group));
    serve.run(app_of("a", packed)).await.unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(nodes(&s), ["big"]);
    assert_eq!(free_cpus(&cluster, "big"), 1.0);
    assert_eq!(free_cpus(&cluster, "small"), 2.0);

    // A second replica's sum fits no node now: its bundles go apart (Ray's
    // best effort), the replica running in its first bundle.
    let group = PlacementGroup::new(bundles(&[1.0, 2.0]), PlacementStrategy::Pack);
    let two = probe(2, &tag("p")).with_config(|c| c.with_placement_group(group.clone()));
    serve.run(app_of("a", two)).await.unwrap();
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(nodes(&s), ["big", "small"]);
    let free = |n| free_cpus(&cluster, n);
    assert_eq!((free("small"), free("mid"), free("big")), (1.0, 0.0, 1.0));

    // A third's second bundle fits no node beside its first: pending, naming
    // the strategy, and holding nothing.
    let three = probe(3, &tag("p")).with_config(|c| c.with_placement_group(group));
    serve
        .run_many(vec![app_of("a", three)], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.pending == 1).await;
    assert_eq!(
        s.pending_reason.as_deref(),
        Some(
            "no node has room: PACK: its 2 bundles fit no node together, and bundle #2 fits \
             none beside the ones before it: cpus: need 2, most free 1"
        )
    );
    assert_eq!((free("small"), free("mid"), free("big")), (1.0, 0.0, 1.0));
}

#[tokio::test(start_paused = true)]
async fn a_roll_at_the_per_node_limit_on_every_node_stops_first_and_completes() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 4.0), cpus("n2", 4.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    let spec = |t: &str| probe(2, &tag(t)).with_config(|c| c.with_max_replicas_per_node(1));
    serve.run(app_of("a", spec("v1"))).await.unwrap();
    // Every node runs its one replica: the new version has no room until an
    // old replica stops, so the roll stops a step first instead of stalling
    // (at once: not when the 30 s slow-start check next wakes the deployment).
    let rolling = tokio::time::Instant::now();
    serve.run(app_of("a", spec("v2"))).await.unwrap();
    let took = rolling.elapsed();
    assert!(took < Duration::from_secs(30), "the roll took {took:?}");
    let s = observe(&serve, "a", "probe").await;
    assert_eq!(s.count_at(R::Running, &s.version), 2);
    assert_eq!(nodes(&s), ["n1", "n2"]);
    let h = serve.app_handle("a").unwrap();
    assert!(h.call::<_, String>("x").await.unwrap().starts_with("v2:"));
}

/// A replica taking its config in place (UPDATING) that is lost with its
/// node had not become ready for the target: a startup failure, replaced,
/// not a health-check failure (which from UPDATING is DEPLOY_FAILED).
#[tokio::test(start_paused = true)]
async fn a_node_lost_under_an_updating_replica_does_not_fail_the_update() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 2.0), cpus("n2", 2.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    let spec = |uc: &str| {
        probe(2, &tag("u")).with_config(|c| c.with_user_config(flotilla::Args::encode(uc).unwrap()))
    };
    serve.run(app_of("a", spec("one"))).await.unwrap();
    sw.reconfigure_delay_ms.store(60_000, Ordering::SeqCst);
    serve
        .run_many(vec![app_of("a", spec("two"))], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.count(R::Updating) >= 1).await;
    let node = s
        .replicas
        .iter()
        .find(|r| r.state == R::Updating)
        .unwrap()
        .node
        .clone();
    // Every status from the loss until the update runs: never DEPLOY_FAILED.
    let statuses = support::spawn_record_statuses(&serve, "a", A::Running);
    assert!(cluster.kill_node(&node));
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        !s.replicas.iter().any(|r| r.node == node)
    })
    .await;
    assert_not_deploy_failed(&s);
    sw.reconfigure_delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(statuses.await.unwrap(), [A::Deploying, A::Running]);
}

/// A replica still constructing (STARTING) that is lost with its node is a
/// startup failure, counted (and backed off), as Ray counts a starting
/// replica whose actor died; replaced on another node.
#[tokio::test(start_paused = true)]
async fn a_node_lost_under_a_starting_replica_counts_a_startup_failure() {
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let cluster = Arc::new(StaticCluster::new([cpus("n1", 2.0), cpus("n2", 2.0)]));
    let serve = start_on(&dir, &sw, cluster.clone()).await;
    let slow = ProbeArgs {
        start_delay_ms: 10_000,
        ..tag("s")
    };
    serve
        .run_many(vec![app_of("a", probe(1, &slow))], no_wait())
        .await
        .unwrap();
    let s = wait_snapshot(&serve, "a", "probe", |s| s.count(R::Starting) == 1).await;
    let node = s.replicas[0].node.clone();
    assert!(cluster.kill_node(&node));
    let s = wait_snapshot(&serve, "a", "probe", |s| {
        !s.replicas.iter().any(|r| r.node == node)
    })
    .await;
    assert_eq!(s.startup_failures, 1, "{s:?}");
    let st = wait_status(&serve, "a", A::Running).await;
    assert_eq!(st.deployments.len(), 1);
}
