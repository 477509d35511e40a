//! Nodes on loopback, with real processes: this test binary is the head, and
//! starts node processes of itself (`node_child`). See `docs/nodes.md`.

#![allow(clippy::unwrap_used)]

mod node_support;

use std::{collections::BTreeMap, time::Duration};

const _: Duration = Duration::ZERO;

use flotilla::{ReplicaState, Resources};
use node_support::*;

/// The node tests share two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A node process (run by the tests below, with its config in the environment).
#[test]
#[ignore = "a node process of the tests in this file, which run it"]
fn node_child() {
    let line = std::env::var(CHILD_ENV).expect("run by a node test, with its config");
    run_child(&line);
}

fn cpus(n: f64) -> Resources {
    Resources::none().with_cpus(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_by_resources_over_three_processes() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let serve = head(dir.path(), cpus(1.0)).await;
    let addr = serve.node_address().unwrap();
    let a = NodeProc::start(addr, &NodeSpec::new("a", 2.0), dir.path());
    let b = NodeProc::start(addr, &NodeSpec::new("b", 1.0).gpus(1.0), dir.path());
    let (a_id, b_id) = (a.id().await, b.id().await);
    eventually(30, "both nodes joined", || async {
        serve.metrics().await.unwrap().nodes.live == 2
    })
    .await;

    // Four one-CPU replicas: the head holds one, a two, b one.
    let handle = serve.run(where_app("spread", 4, cpus(1.0))).await.unwrap();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for (_, node, state) in replica_nodes(&serve, "spread", "where").await {
        assert_eq!(state, ReplicaState::Running);
        *per_node.entry(node).or_default() += 1;
    }
    let want: BTreeMap<String, usize> =
        [("head".to_owned(), 1), (a_id.clone(), 2), (b_id.clone(), 1)].into();
    assert_eq!(per_node, want);

    // Calls reach every replica, wherever it runs (p2c over 4).
    let mut seen = BTreeMap::new();
    for i in 0..200 {
        let here: Here = handle.call(&format!("hi {i}")).await.unwrap();
        assert_eq!(here.echo, format!("hi {i}"));
        *seen.entry(here.node).or_insert(0) += 1;
    }
    assert_eq!(
        seen.len(),
        3,
        "answers from the head and both nodes: {seen:?}"
    );

    // A GPU replica goes where the GPU is; one needing two GPUs is pending,
    // naming what is missing, until a node with two joins.
    let gpu = flotilla::ApplicationSpec::builder("gpu")
        .deployment(where_dep(
            "where",
            1,
            Resources::none().with_gpus(1.0),
            &WhereArgs::default(),
        ))
        .build()
        .unwrap();
    serve.run(gpu).await.unwrap();
    assert_eq!(replica_nodes(&serve, "gpu", "where").await[0].1, b_id);
    let big = flotilla::ApplicationSpec::builder("big")
        .deployment(where_dep(
            "where",
            1,
            Resources::none().with_gpus(2.0),
            &WhereArgs::default(),
        ))
        .build()
        .unwrap();
    serve
        .run_many(
            vec![big],
            flotilla::RunManyOptions {
                wait_for_applications_running: false,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    eventually(10, "the big replica pending", || async {
        serve
            .deployment_snapshot("big", "where")
            .await
            .unwrap()
            .is_some_and(|s| s.pending == 1)
    })
    .await;
    let s = serve
        .deployment_snapshot("big", "where")
        .await
        .unwrap()
        .unwrap();
    let why = s.pending_reason.unwrap();
    assert!(why.contains("gpus: need 2"), "{why}");
    let c = NodeProc::start(addr, &NodeSpec::new("c", 0.0).gpus(2.0), dir.path());
    let c_id = c.id().await;
    eventually(30, "the big replica placed on c and running", || async {
        replica_nodes(&serve, "big", "where")
            .await
            .iter()
            .any(|(_, n, s)| *n == c_id && *s == ReplicaState::Running)
    })
    .await;

    // Status and metrics show nodes.
    let m = serve.metrics().await.unwrap();
    assert_eq!((m.nodes.joined, m.nodes.live, m.nodes.lost), (3, 3, 0));
    assert_eq!(m.nodes.replicas_on_nodes, 5);
    let nodes = serve.nodes();
    assert!(
        nodes
            .iter()
            .all(|n| n.alive && n.labels == [("test".to_owned(), "yes".to_owned())])
    );
    serve.shutdown().await.unwrap();
    drop((a, b, c));
}
