//! Nodes on loopback, with real processes: this test binary is the head, and
//! starts node processes of itself (`node_child`). See `docs/nodes.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod node_support;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use flotilla::{ApplicationSpec, CallError, ReplicaState, Resources, RunManyOptions};
use node_support::*;

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
    let (_turn, dir, serve, addr) = setup(cpus(1.0)).await;
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

fn custom(name: &str) -> Resources {
    Resources::none().with_custom(name, 1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_id_crosses_to_a_replica_on_a_node() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(
        addr,
        &NodeSpec::new("a", 0.0).custom("gpu", 1.0),
        dir.path(),
    );
    let a_id = a.id().await;
    let handle = serve.run(models_app("mx", 1)).await.unwrap();
    let nodes = replica_nodes(&serve, "mx", "models").await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].1, a_id, "the replica runs on node a");
    for id in ["m1", "m2"] {
        let answer: String = handle
            .clone()
            .with_model_id(id)
            .unwrap()
            .call("hello")
            .await
            .unwrap();
        assert_eq!(answer, format!("model {id} on {a_id}: hello"));
    }
    // A failed load comes back as what it is, from the other process too.
    let failed = handle
        .clone()
        .with_model_id("broken-1")
        .unwrap()
        .call::<_, String>("hello")
        .await
        .unwrap_err();
    assert_eq!(
        failed,
        CallError::ModelLoad {
            model_id: "broken-1".into(),
            message: "no model broken-1 here".into()
        }
    );
    // Streaming carries it too.
    let mut items = handle
        .clone()
        .with_model_id("m3")
        .unwrap()
        .call_stream::<_, String>("hi");
    let first = futures::StreamExt::next(&mut items).await.unwrap().unwrap();
    assert_eq!(first, format!("model m3 on {a_id}: hi"));
    drop(items);
    // By value: encoded at the transport, as by reference.
    let owned = handle.clone().with_model_id("m1").unwrap();
    let answer: String = owned.call_owned(String::from("owned")).await.unwrap();
    assert_eq!(answer, format!("model m1 on {a_id}: owned"));
    let mut items = owned.call_stream_owned::<_, String>(String::from("streamed"));
    let first = futures::StreamExt::next(&mut items).await.unwrap().unwrap();
    assert_eq!(first, format!("model m1 on {a_id}: streamed"));
    drop(items);
    serve.shutdown().await.unwrap();
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_and_the_model_limit_reach_replicas_on_a_node() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(
        addr,
        &NodeSpec::new("a", 0.0).custom("gpu", 2.0),
        dir.path(),
    );
    let a_id = a.id().await;
    // Batches form by size: the wait is far longer than the test.
    let batching = flotilla::BatchConfig::new(4, Duration::from_secs(600));
    let app = ApplicationSpec::builder("node-data-plane")
        .deployment(
            flotilla::DeploymentSpec::builder("batched", "where::Batched").with_config(|c| {
                c.with_resources(custom("gpu"))
                    .with_max_ongoing_requests(8)
                    .with_batching(batching)
            }),
        )
        .deployment(
            flotilla::DeploymentSpec::builder("counted", "where::Counted").with_config(|c| {
                c.with_resources(custom("gpu"))
                    .with_max_num_models_per_replica(Some(1))
            }),
        )
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    for dep in ["batched", "counted"] {
        let nodes = replica_nodes(&serve, "node-data-plane", dep).await;
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].1, a_id, "{dep} runs on node a");
    }

    // Four calls at once make one batch of four on the node's replica.
    let batched = serve
        .deployment_handle("node-data-plane", "batched")
        .unwrap();
    let calls = (0..4).map(|i| {
        let h = batched.clone();
        async move { h.call::<_, String>(&format!("r{i}")).await.unwrap() }
    });
    let answers = futures::future::join_all(calls).await;
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer, &format!("r{i} in a batch of 4"));
    }

    // One model per replica: the second evicts the first there.
    let counted = serve
        .deployment_handle("node-data-plane", "counted")
        .unwrap();
    for id in ["m1", "m2", "m1"] {
        let held: u32 = counted
            .clone()
            .with_model_id(id)
            .unwrap()
            .call(&())
            .await
            .unwrap();
        assert_eq!(held, 1, "model {id}: the node's replica holds one model");
    }

    // Their batch and model figures reach the head with the node's
    // heartbeats, where /metrics reads them (`ray_serve_batch_*`, the
    // multiplexed load and unload series), as it reads its own replicas'.
    let batcher = batched.replicas()[0].clone();
    eventually(30, "the node's batch figures reach the head", || async {
        batcher.batch_stats().is_some_and(|s| {
            // One batch, of four: in the (2, 4] bucket.
            s.processed() == 1 && s.size().snapshot().buckets[2] == 1 && s.queued() == 0
        })
    })
    .await;
    let cache = counted.replicas()[0].clone();
    eventually(30, "the node's model figures reach the head", || async {
        cache.model_stats().is_some_and(|s| {
            (
                s.requests(),
                s.loads(),
                s.unloads(),
                s.load_latency().snapshot().count,
            ) == (3, 3, 2, 3)
        })
    })
    .await;
    serve.shutdown().await.unwrap();
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_prefers_the_replica_on_a_node_that_holds_the_model() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(addr, &gpu_node("a"), dir.path());
    let b = NodeProc::start(addr, &gpu_node("b"), dir.path());
    let (a_id, b_id) = (a.id().await, b.id().await);
    let handle = serve.run(models_app("mx-route", 2)).await.unwrap();
    let nodes: BTreeSet<String> = replica_nodes(&serve, "mx-route", "models")
        .await
        .into_iter()
        .map(|(_, node, _)| node)
        .collect();
    assert_eq!(nodes, BTreeSet::from([a_id.clone(), b_id.clone()]));

    // m1 loads on one of the two; its answer says which.
    let m1 = || handle.clone().with_model_id("m1").unwrap();
    let first: String = m1().call("x").await.unwrap();
    let holder = [&a_id, &b_id]
        .into_iter()
        .find(|n| first == format!("model m1 on {n}: x"))
        .unwrap_or_else(|| panic!("answer from neither node: {first}"))
        .clone();
    // The head learns it from the node's report, by subscription.
    let replicas = handle.replicas();
    let on_holder = replicas.iter().find(|e| e.node() == holder).unwrap();
    let mut models = on_holder.watch_models().unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        models.wait_for(|m| m.loaded.iter().any(|id| &**id == "m1")),
    )
    .await
    .expect("the holder's report reached the head")
    .unwrap();
    assert!(on_holder.is_multiplexed());

    // From then on every request for m1 goes to the holder (model-blind
    // routing would send about half to the other node).
    for _ in 0..20 {
        let answer: String = m1().call("x").await.unwrap();
        assert_eq!(answer, format!("model m1 on {holder}: x"));
    }
    // Its status details show what it holds.
    let snapshot = serve
        .deployment_snapshot("mx-route", "models")
        .await
        .unwrap()
        .unwrap();
    let held: Vec<(String, Vec<String>)> = snapshot
        .replicas
        .iter()
        .map(|r| (r.node.clone(), r.model_ids.clone()))
        .collect();
    assert!(
        held.contains(&(holder.clone(), vec!["m1".to_owned()])),
        "{held:?}"
    );
    serve.shutdown().await.unwrap();
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_from_a_node_prefer_the_replica_on_another_node_that_holds_the_model() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(addr, &gpu_node("a"), dir.path());
    let b = NodeProc::start(addr, &gpu_node("b"), dir.path());
    let c = NodeProc::start(
        addr,
        &NodeSpec::new("c", 0.0).custom("caller", 1.0),
        dir.path(),
    );
    let (a_id, b_id, c_id) = (a.id().await, b.id().await, c.id().await);
    // The models on a and b, the deployment that calls them on c.
    let app = ApplicationSpec::builder("mx-from-node")
        .deployment(
            flotilla::DeploymentSpec::builder("models", "where::Models")
                .replicas(2)
                .with_config(|cfg| cfg.with_resources(custom("gpu"))),
        )
        .deployment(caller_dep())
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    let nodes: BTreeSet<String> = replica_nodes(&serve, "mx-from-node", "models")
        .await
        .into_iter()
        .map(|(_, node, _)| node)
        .collect();
    assert_eq!(nodes, BTreeSet::from([a_id.clone(), b_id.clone()]));
    let callers = replica_nodes(&serve, "mx-from-node", "caller").await;
    assert_eq!(callers.len(), 1);
    assert_eq!(callers[0].1, c_id, "the caller runs on node c");

    let caller = serve.deployment_handle("mx-from-node", "caller").unwrap();
    // m1 loads on a or b; its answer says which.
    let first: String = caller.call(&CallerRequest::call("m1")).await.unwrap();
    let holder = [&a_id, &b_id]
        .into_iter()
        .find(|n| first == format!("model m1 on {n}: x"))
        .unwrap_or_else(|| panic!("answer from neither node: {first}"))
        .clone();
    // Node c learns who holds it: the holder's node reports to the head,
    // which exports it with the route.
    let seen: String = tokio::time::timeout(
        Duration::from_secs(30),
        caller.call(&CallerRequest::holder("m1")),
    )
    .await
    .expect("the holder's model ids reached node c")
    .unwrap();
    assert_eq!(seen, holder);
    // From then on every call from c for m1 goes to the holder (model-blind
    // routing would send about half to the other node).
    for _ in 0..20 {
        let answer: String = caller.call(&CallerRequest::call("m1")).await.unwrap();
        assert_eq!(answer, format!("model m1 on {holder}: x"));
    }
    serve.shutdown().await.unwrap();
    drop((a, b, c));
}

/// Lines of a node's log that contain `what`.
fn log_lines(node: &NodeProc, what: &str) -> Vec<String> {
    node.log_text()
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_meet_on_one_session_dialed_by_the_name_that_sorts_last() {
    // Joined in the order z, m, a: a node that dials the peers it hears of
    // (ractor_cluster's `Transitive` mode) would have m dial z and a dial
    // both. Both of two nodes that hear of each other at once would dial, and
    // the session ractor_cluster then closes as a duplicate fails the calls
    // in flight on it. The node whose name sorts last dials, the other waits.
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let z = NodeProc::start(addr, &NodeSpec::new("z", 1.0), dir.path());
    z.id().await;
    let m = NodeProc::start(addr, &NodeSpec::new("m", 1.0), dir.path());
    m.id().await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 1.0), dir.path());
    a.id().await;
    eventually(30, "each node connected to both others", || async {
        [&z, &m, &a]
            .iter()
            .all(|n| log_lines(n, "connected to a peer node").len() == 2)
    })
    .await;
    for (node, dialed) in [(&z, 2), (&m, 1), (&a, 0)] {
        let log = node.log_text();
        // ractor_cluster logs each connection this process dialed (its
        // listener logs the accepted ones the same, from another module): the one
        // to the head, and one per peer it dialed.
        let opened = log_lines(node, "node::client: TCP Session opened").len();
        assert_eq!(opened, 1 + dialed, "connections opened; log:\n{log}");
        let dials = log_lines(node, "dialing a peer node");
        let connected = log_lines(node, "connected to a peer node");
        let ours = connected
            .iter()
            .filter(|l| l.contains("dialed=true"))
            .count();
        assert_eq!(dials.len(), dialed, "dials; log:\n{log}");
        assert_eq!(ours, dialed, "sessions it dialed; log:\n{log}");
        assert!(
            log_lines(node, "duplicate").is_empty(),
            "no duplicate session; log:\n{log}"
        );
    }
    // Calls between nodes over these sessions: the tests below
    // (composition, multiplexed routing from a node).
    serve.shutdown().await.unwrap();
    drop((z, m, a));
}

/// A node that binds every interface tells its peers the address its
/// machine reaches the head from, not `0.0.0.0` (which no other machine can
/// dial), and listens on the port it was given (a firewall can be opened
/// for it); a peer meets it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_bound_to_every_interface_advertises_its_route_to_the_head_on_its_port() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let port = restartable_addr().port();
    let every = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    let a = NodeProc::start(addr, &NodeSpec::new("a", 1.0).listen(every), dir.path());
    let id = a.id().await;
    let listen = || {
        (serve.nodes().into_iter())
            .find(|n| n.id == id)
            .map(|n| n.listen)
            .unwrap_or_default()
    };
    eventually(30, "a's listen address is known", || async {
        !listen().is_empty()
    })
    .await;
    assert_eq!(listen(), format!("127.0.0.1:{port}"));
    let b = NodeProc::start(addr, &NodeSpec::new("b", 1.0), dir.path());
    b.id().await;
    eventually(30, "b connected to a", || async {
        log_lines(&b, "connected to a peer node").len() == 1
    })
    .await;
    serve.shutdown().await.unwrap();
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_between_two_nodes_is_dialed_again_by_the_name_that_sorts_last() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let mut a = NodeProc::start(addr, &gpu_node("a"), dir.path());
    let m = NodeProc::start(
        addr,
        &NodeSpec::new("m", 0.0).custom("caller", 1.0),
        dir.path(),
    );
    let (a_id, m_id) = (a.id().await, m.id().await);
    // The model's one replica on a, the deployment that calls it on m: every
    // call goes over the session between them, which m dialed.
    let app = ApplicationSpec::builder("redial")
        .deployment(
            flotilla::DeploymentSpec::builder("models", "where::Models")
                .with_config(|cfg| cfg.with_resources(custom("gpu"))),
        )
        .deployment(caller_dep())
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    let caller = serve.deployment_handle("redial", "caller").unwrap();
    let expected = format!("model m1 on {a_id}: x");
    let answer: String = caller.call(&CallerRequest::call("m1")).await.unwrap();
    assert_eq!(answer, expected);
    assert_eq!(log_lines(&m, "dialing a peer node").len(), 1);
    // a, whose name sorts first, closes the session: m must see it close and
    // dial again, while both nodes stay in the cluster.
    a.drop_peer_session(&m_id);
    eventually(30, "a closed its session to m", || async {
        !log_lines(&a, "stopping the session").is_empty()
    })
    .await;
    eventually(30, "m connected to a again", || async {
        log_lines(&m, "connected to a peer node").len() == 2
    })
    .await;
    let answer: String = caller.call(&CallerRequest::call("m1")).await.unwrap();
    assert_eq!(answer, expected);
    let log = m.log_text();
    assert_eq!(
        log_lines(&m, "dialing a peer node").len(),
        2,
        "m dialed twice; log:\n{log}"
    );
    assert!(
        log_lines(&a, "dialing a peer node").is_empty(),
        "a never dials m"
    );
    assert_eq!(serve.metrics().await.unwrap().nodes.lost, 0);
    serve.shutdown().await.unwrap();
    drop((a, m));
}

/// A partition between two nodes that both still reach the head: the head
/// sees nothing wrong, so the nodes' own heartbeats on the session between
/// them must find it. A call in flight from m to a's replica fails (it may
/// have run) instead of waiting for ever, m dials a again, and its calls
/// reach a once the path is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_between_two_nodes_fails_the_calls_on_it_and_the_session_is_dialed_again() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(addr, &gpu_node("a"), dir.path());
    let a_id = a.id().await;
    let listen = || {
        serve
            .nodes()
            .into_iter()
            .find(|n| n.id == a_id)
            .map(|n| n.listen)
            .unwrap_or_default()
    };
    eventually(30, "a's listener is known", || async {
        !listen().is_empty()
    })
    .await;
    let listen: std::net::SocketAddr = listen().parse().unwrap();
    // m reaches a through the relay (m's name sorts last: it dials a).
    let relay = Relay::start(listen).await;
    let m = NodeProc::start(
        addr,
        &NodeSpec::new("m", 0.0)
            .custom("caller", 1.0)
            .dial_via(listen, relay.addr),
        dir.path(),
    );
    m.id().await;
    // back, slow, on a; front, on m, calls it over the session m dialed.
    let slow = WhereArgs {
        delay_ms: 4_000,
        ..Default::default()
    };
    let calls = WhereArgs {
        downstream: Some("back".into()),
        ..Default::default()
    };
    let app = ApplicationSpec::builder("split")
        .deployment(where_dep("back", 1, custom("gpu"), &slow))
        .deployment(where_dep("front", 1, custom("caller"), &calls))
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    let front = serve.deployment_handle("split", "front").unwrap();
    let here: Here = front.call(&"before".to_owned()).await.unwrap();
    assert_eq!(here.downstream.unwrap().node, a_id);
    assert_eq!(relay.connections(), 1, "m dialed a through the relay");

    // A call in flight from m to a when the path between them goes silent.
    let during = {
        let front = front.clone();
        tokio::spawn(async move { front.call::<_, Here>(&"during".to_owned()).await })
    };
    eventually(30, "a runs the request", || async {
        !log_lines(&a, "where: request during began").is_empty()
    })
    .await;
    relay.partition();
    let err = tokio::time::timeout(Duration::from_secs(60), during)
        .await
        .expect("the call on the silent session ends")
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("was lost with its node"), "{err}");
    assert!(
        !log_lines(&m, "no heartbeat from the peer node").is_empty(),
        "m found the silence; log:\n{}",
        m.log_text()
    );
    eventually(60, "m connected to a again, through the relay", || async {
        relay.connections() >= 2 && log_lines(&m, "connected to a peer node").len() >= 2
    })
    .await;
    let here: Here = front.call(&"after".to_owned()).await.unwrap();
    assert_eq!(here.downstream.unwrap().node, a_id);
    let nodes = serve.metrics().await.unwrap().nodes;
    assert_eq!(
        (nodes.live, nodes.lost),
        (2, 0),
        "the head saw nothing wrong"
    );
    serve.shutdown().await.unwrap();
    drop((a, m, relay));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_local_multiplexed_replicas_models_reach_the_nodes() {
    // The models' one replica on the head, the caller on node c.
    let (_turn, dir, serve, addr) = setup(custom("gpu")).await;
    let c = NodeProc::start(
        addr,
        &NodeSpec::new("c", 0.0).custom("caller", 1.0),
        dir.path(),
    );
    let c_id = c.id().await;
    let app = ApplicationSpec::builder("mx-head")
        .deployment(
            flotilla::DeploymentSpec::builder("models", "where::Models").with_config(|cfg| {
                cfg.with_resources(custom("gpu"))
                    .with_max_num_models_per_replica(Some(1))
            }),
        )
        .deployment(caller_dep())
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    let models = replica_nodes(&serve, "mx-head", "models").await;
    assert_eq!(models.len(), 1);
    let head_id = models[0].1.clone();
    assert_ne!(head_id, c_id);
    assert_eq!(replica_nodes(&serve, "mx-head", "caller").await[0].1, c_id);

    let caller = serve.deployment_handle("mx-head", "caller").unwrap();
    // Each load (and the eviction that makes room for it) on the head reaches
    // node c by subscription.
    for model in ["m1", "m2"] {
        let answer: String = caller.call(&CallerRequest::call(model)).await.unwrap();
        assert_eq!(answer, format!("model {model} on {head_id}: x"));
        let seen: String = tokio::time::timeout(
            Duration::from_secs(30),
            caller.call(&CallerRequest::holder(model)),
        )
        .await
        .unwrap_or_else(|_| panic!("the head's load of {model} reached node c"))
        .unwrap();
        assert_eq!(seen, head_id);
    }
    serve.shutdown().await.unwrap();
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_composition_streams_and_the_limit_across_nodes() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(
        addr,
        // Room for two fronts: shop's and near's.
        &NodeSpec::new("a", 0.0)
            .custom("front", 2.0)
            .custom("near", 1.0),
        dir.path(),
    );
    let b = NodeProc::start(
        addr,
        &NodeSpec::new("b", 0.0)
            .custom("back", 1.0)
            .custom("near", 1.0),
        dir.path(),
    );
    let (a_id, b_id) = (a.id().await, b.id().await);

    // front on a calls back on b: the request crosses node to node.
    let front = WhereArgs {
        downstream: Some("back".into()),
        ..Default::default()
    };
    let back = WhereArgs {
        delay_ms: 50,
        ..Default::default()
    };
    let shop = ApplicationSpec::builder("shop")
        .deployment(where_dep("front", 1, custom("front"), &front))
        .deployment(
            where_dep("back", 1, custom("back"), &back)
                .with_config(|c| c.with_max_ongoing_requests(2)),
        )
        .ingress("front")
        .build()
        .unwrap();
    let handle = serve.run(shop).await.unwrap();
    let here: Here = handle.call("order").await.unwrap();
    assert_eq!(here.node, a_id);
    let down = here.downstream.unwrap();
    assert_eq!(
        (down.node.as_str(), down.echo.as_str()),
        (b_id.as_str(), "order")
    );

    // max_ongoing_requests holds at the replica across callers on two
    // processes: the head calls back directly while front (on a) calls it too.
    let direct = serve.deployment_handle("shop", "back").unwrap();
    let mut calls = Vec::new();
    for i in 0..6 {
        let (h, d) = (handle.clone(), direct.clone());
        calls.push(tokio::spawn(async move {
            let (via, direct) = (format!("via {i}"), format!("direct {i}"));
            let (via, direct) = tokio::join!(h.call::<_, Here>(&via), d.call::<_, Here>(&direct));
            (
                via.unwrap().downstream.unwrap().concurrent,
                direct.unwrap().concurrent,
            )
        }));
    }
    let mut most = 0;
    for c in calls {
        let (x, y) = c.await.unwrap();
        most = most.max(x).max(y);
    }
    // Twelve requests of 50 ms each, two at a time: the limit is reached,
    // never passed.
    assert_eq!(most, 2, "the most the replica ran at once, limit 2");

    // A handle made on a node prefers replicas of its own node.
    let near = ApplicationSpec::builder("near")
        .deployment(where_dep(
            "front",
            1,
            custom("front"),
            &WhereArgs {
                downstream: Some("back".into()),
                ..Default::default()
            },
        ))
        .deployment(
            where_dep("back", 2, custom("near"), &WhereArgs::default())
                .with_config(|c| c.with_max_replicas_per_node(1)),
        )
        .ingress("front")
        .build()
        .unwrap();
    let near = serve.run(near).await.unwrap();
    // The route reaches a's copy by subscription, a moment after `run`
    // returns: once a's back is in it, front keeps to it.
    eventually(10, "a's route copy has its own back", || async {
        let here: Here = near.call("warm").await.unwrap();
        here.downstream.unwrap().node == a_id
    })
    .await;
    for i in 0..20 {
        let here: Here = near.call(&format!("n{i}")).await.unwrap();
        assert_eq!(
            here.downstream.unwrap().node,
            a_id,
            "front on a keeps to the back on a"
        );
    }

    // Streaming to a replica on another node: every item, in order.
    use futures::StreamExt;
    let items: Vec<Here> = direct
        .call_stream::<_, Here>("s")
        .map(|r| r.unwrap())
        .collect()
        .await;
    let echoes: Vec<&str> = items.iter().map(|h| h.echo.as_str()).collect();
    assert_eq!(echoes, ["s#0", "s#1", "s#2"]);
    assert!(items.iter().all(|h| h.node == b_id));
    serve.shutdown().await.unwrap();
    drop((a, b));
}

/// `front` (on node a) calling `back` (three replicas on the head, routed by
/// `Pinned`, at most `limit` requests each, 300 ms a request): each answer's
/// back replica and how many ran there at once.
fn pinned_app(highest: bool, limit: u32) -> ApplicationSpec {
    let front = WhereArgs {
        downstream: Some("back".into()),
        ..Default::default()
    };
    let back = WhereArgs {
        delay_ms: 300,
        ..Default::default()
    };
    ApplicationSpec::builder("pin")
        .deployment(where_dep("front", 1, custom("front"), &front))
        .deployment(where_dep("back", 3, cpus(1.0), &back).with_config(|c| {
            c.with_max_ongoing_requests(limit)
                .with_request_router(pinned(highest))
        }))
        .ingress("front")
        .build()
        .unwrap()
}

/// Three calls at once through `front`: each one's (back replica, concurrent).
async fn three_at_once(handle: &flotilla::DeploymentHandle) -> Vec<(u64, u32)> {
    let calls = (0..3).map(|i| {
        let h = handle.clone();
        async move {
            let here: Here = h.call(&format!("c{i}")).await.unwrap();
            let down = here.downstream.unwrap();
            (down.replica, down.concurrent)
        }
    });
    futures::future::join_all(calls).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_callers_follow_the_request_router_and_the_limit_as_they_change() {
    let (_turn, dir, serve, addr) = setup(cpus(3.0)).await;
    let a = NodeProc::start(
        addr,
        &NodeSpec::new("a", 0.0).custom("front", 1.0),
        dir.path(),
    );
    let a_id = a.id().await;
    let handle = serve.run(pinned_app(false, 1)).await.unwrap();
    let ids: Vec<u64> = replica_nodes(&serve, "pin", "back")
        .await
        .into_iter()
        .map(|(id, node, _)| {
            assert_eq!(node, "head");
            id
        })
        .collect();
    let (lowest, highest) = (*ids.iter().min().unwrap(), *ids.iter().max().unwrap());
    assert_eq!(replica_nodes(&serve, "pin", "front").await[0].1, a_id);

    // The node's copy of back's route carries the custom router with its
    // replicas: every call from a goes to the lowest id, one at a time.
    for (replica, concurrent) in three_at_once(&handle).await {
        assert_eq!((replica, concurrent), (lowest, 1));
    }

    // The limit, raised in place: once the lowest replica has taken it, a's
    // copy lets three run there at once.
    serve.run(pinned_app(false, 3)).await.unwrap();
    eventually(10, "a's copy takes the new limit", || async {
        let answers = three_at_once(&handle).await;
        assert!(answers.iter().all(|(r, _)| *r == lowest), "{answers:?}");
        answers.iter().any(|(_, c)| *c == 3)
    })
    .await;

    // New kwargs, in place: a's router is made again from them.
    serve.run(pinned_app(true, 3)).await.unwrap();
    eventually(10, "a's copy takes the new router", || async {
        let answers = three_at_once(&handle).await;
        answers.iter().all(|(r, _)| *r == highest)
    })
    .await;
    let now: Vec<u64> = replica_nodes(&serve, "pin", "back")
        .await
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    assert_eq!(now, ids, "the changes were made in place");
    serve.shutdown().await.unwrap();
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_shuts_down_drains_and_its_replicas_are_replaced_on_another_node() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    // a joins first, so it ranks first on a tie.
    let mut a = NodeProc::start(addr, &NodeSpec::new("a", 0.0).custom("w", 3.0), dir.path());
    let a_id = a.id().await;
    eventually(30, "a joined", || async {
        serve.metrics().await.unwrap().nodes.live == 1
    })
    .await;
    let b = NodeProc::start(addr, &NodeSpec::new("b", 0.0).custom("w", 4.0), dir.path());
    let b_id = b.id().await;
    eventually(30, "b joined", || async {
        serve.metrics().await.unwrap().nodes.live == 2
    })
    .await;
    // Four replicas, two on each node (a first: it joined first). Every
    // request goes to the lowest id, the first placed: on a.
    let slow = WhereArgs {
        delay_ms: 3_000,
        ..Default::default()
    };
    let app = ApplicationSpec::builder("drain")
        .deployment(
            where_dep("where", 4, custom("w"), &slow)
                .with_config(|c| c.with_request_router(pinned(false))),
        )
        .build()
        .unwrap();
    let handle = serve.run(app).await.unwrap();
    let on = |node: &str, now: &[(u64, String, ReplicaState)]| {
        now.iter().filter(|(_, n, _)| n == node).count()
    };
    let now = replica_nodes(&serve, "drain", "where").await;
    assert_eq!((on(&a_id, &now), on(&b_id, &now)), (2, 2));

    // A request in flight on a when it is told to shut down.
    let held = tokio::spawn({
        let h = handle.clone();
        async move { h.call::<_, Here>("held").await }
    });
    eventually(10, "the request runs on a", || async {
        a.log_text().contains("where: request held began")
    })
    .await;
    a.shutdown();
    // a's idle replica stops at its first drain check, while the other still
    // serves: its replacement goes to b (which then runs fewer of the
    // deployment than a, and would rank after it), not to the leaving node.
    // The request finishes where it began, and the busy replica follows.
    let here = held.await.unwrap().unwrap();
    assert_eq!(here.node, a_id);
    eventually(20, "every replica runs on b", || async {
        let now = replica_nodes(&serve, "drain", "where").await;
        now.len() == 4
            && now
                .iter()
                .all(|(_, n, s)| *n == b_id && *s == ReplicaState::Running)
    })
    .await;
    let (a, code) = tokio::task::spawn_blocking(move || {
        let code = a.wait_exit();
        (a, code)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "a ended by its shutdown");
    assert_eq!(
        a.log_text().matches("replica started").count(),
        2,
        "a started a replica while it was leaving"
    );
    let m = serve.metrics().await.unwrap().nodes;
    assert_eq!(
        (m.left, m.lost, m.replicas_lost, m.live),
        (1, 0, 0, 1),
        "a left, with nothing on it"
    );
    let here: Here = handle.call("after").await.unwrap();
    assert_eq!(here.node, b_id);
    serve.shutdown().await.unwrap();
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_deployment_is_not_found_by_callers_on_a_node() {
    let (_turn, dir, serve, addr) = setup(cpus(1.0)).await;
    let a = NodeProc::start(
        addr,
        &NodeSpec::new("a", 0.0).custom("front", 1.0),
        dir.path(),
    );
    let a_id = a.id().await;
    let back = || {
        ApplicationSpec::builder("back")
            .deployment(where_dep("back", 1, cpus(1.0), &WhereArgs::default()))
            .build()
            .unwrap()
    };
    serve.run(back()).await.unwrap();
    // front, on a, calls back (another application, on the head).
    let handle = serve
        .run(front_calling("back", "back", custom("front")))
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(10));
    let here: Here = handle.call("before").await.unwrap();
    assert_eq!(here.node, a_id);
    assert_eq!(here.downstream.unwrap().node, "head");

    // Deleted: a's copy is closed, so front's call fails as on the head
    // (before, a kept an empty copy and the call waited for a replica).
    serve.delete_apps(["back"], true).await.unwrap();
    match handle.call::<_, Here>("after").await {
        Err(CallError::User(message)) => {
            assert!(message.contains("does not exist"), "{message}");
        }
        other => panic!("front's call to the deleted back: {other:?}"),
    }

    // Deployed again: a's callers find the new one.
    serve.run(back()).await.unwrap();
    eventually(10, "a's callers reach the new back", || async {
        handle.call::<_, Here>("again").await.is_ok()
    })
    .await;
    serve.shutdown().await.unwrap();
    drop(a);
}

/// The head's autoscaler sees the load that starts on a node: front, on a,
/// calls back, autoscaled from zero replicas. front's call waits in a's copy
/// of back's route, where no caller of the head's is; a reports it, and the
/// head scales back up (before, it stayed at zero and the call waited for
/// ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_waiting_on_a_node_scale_a_deployment_up_from_zero() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 2.0), dir.path());
    let a_id = a.id().await;
    let back = ApplicationSpec::builder("back")
        .deployment(
            where_dep("back", 1, cpus(1.0), &WhereArgs::default()).with_config(|c| {
                c.with_autoscaling(flotilla::AutoscalingConfig {
                    min_replicas: 0,
                    initial_replicas: Some(0),
                    max_replicas: 1,
                    upscale_delay: Duration::ZERO,
                    ..Default::default()
                })
            }),
        )
        .build()
        .unwrap();
    serve.run(back).await.unwrap();
    assert!(replica_nodes(&serve, "back", "back").await.is_empty());
    let handle = serve
        .run(front_calling("back", "back", cpus(1.0)))
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let here: Here = handle.call("from zero").await.unwrap();
    assert_eq!(here.node, a_id);
    assert_eq!(here.downstream.unwrap().node, a_id);
    serve.shutdown().await.unwrap();
    drop(a);
}

/// A caller on a node of a deployment that failed to deploy (and has no
/// replica) fails at once, as on the head: the route's copy says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_callers_of_a_deploy_failed_deployment_fail_at_once() {
    let (_turn, dir, serve, addr) = setup(cpus(1.0)).await;
    let a = NodeProc::start(
        addr,
        &NodeSpec::new("a", 0.0).custom("front", 1.0),
        dir.path(),
    );
    let _ = a.id().await;
    let broken = ApplicationSpec::builder("broken")
        .deployment(flotilla::DeploymentSpec::builder("back", "where::Broken"))
        .build()
        .unwrap();
    let no_wait = RunManyOptions {
        wait_for_applications_running: false,
        ..Default::default()
    };
    serve.run_many(vec![broken], no_wait).await.unwrap();
    eventually(60, "broken is DEPLOY_FAILED", || async {
        serve.app_status("broken").status == flotilla::ApplicationStatus::DeployFailed
    })
    .await;
    let handle = serve
        .run(front_calling("broken", "back", custom("front")))
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(20));
    match handle.call::<_, Here>("x").await {
        Err(CallError::User(message)) => {
            assert!(message.contains("failed to deploy"), "{message}");
        }
        other => panic!("front's call to the broken back: {other:?}"),
    }
    serve.shutdown().await.unwrap();
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_caller_gives_up_on_is_cancelled_on_the_node() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 1.0), dir.path());
    let a_id = a.id().await;
    let slow = WhereArgs {
        delay_ms: 2_000,
        ..Default::default()
    };
    let app = ApplicationSpec::builder("slow")
        .deployment(where_dep("slow", 1, cpus(1.0), &slow))
        .build()
        .unwrap();
    let handle = serve.run(app).await.unwrap();
    let first = {
        let h = handle.clone();
        tokio::spawn(async move { h.call::<_, Here>("first").await })
    };
    // Given up on (dropped) once it runs on the node, whatever the machine's
    // speed.
    eventually(10, "the first call runs on the node", || async {
        a.log_text().contains("where: request first began")
    })
    .await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The node drops the first call (it would sleep 2 s more without the
    // Cancel, and never say so); then the next runs alone.
    eventually(10, "the node cancels the call given up on", || async {
        a.log_text().contains("where: request first cancelled")
    })
    .await;
    let here: Here = handle.call("second").await.unwrap();
    assert_eq!(here.node, a_id);
    assert_eq!(
        here.concurrent, 1,
        "the call the caller gave up on still ran on the node"
    );
    serve.shutdown().await.unwrap();
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_load_is_replaced_and_unsent_requests_succeed() {
    let (_turn, dir, serve, addr) = setup(cpus(1.0)).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 3.0), dir.path());
    let mut b = NodeProc::start(addr, &NodeSpec::new("b", 2.0), dir.path());
    let (a_id, b_id) = (a.id().await, b.id().await);
    eventually(30, "both nodes joined", || async {
        serve.metrics().await.unwrap().nodes.live == 2
    })
    .await;
    let app = ApplicationSpec::builder("load")
        .deployment(where_dep(
            "where",
            4,
            cpus(1.0),
            &WhereArgs {
                delay_ms: 5,
                ..Default::default()
            },
        ))
        .build()
        .unwrap();
    let handle = serve.run(app).await.unwrap();
    let on_b = replica_nodes(&serve, "load", "where")
        .await
        .iter()
        .filter(|(_, n, _)| *n == b_id)
        .count();
    assert!(on_b >= 1, "b runs some of the replicas");

    let stop = Arc::new(AtomicBool::new(false));
    let lost_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let served = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut callers = Vec::new();
    for c in 0..16 {
        let (h, stop, lost_at, served) = (
            handle.clone(),
            stop.clone(),
            lost_at.clone(),
            served.clone(),
        );
        callers.push(tokio::spawn(async move {
            let (mut ok, mut lost, mut late_failures) = (0u32, 0u32, Vec::new());
            while !stop.load(Ordering::Acquire) {
                let began = Instant::now();
                match h.call::<_, Here>(&format!("c{c}")).await {
                    Ok(_) => {
                        ok += 1;
                        served.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(CallError::NodeLost { .. }) => {
                        lost += 1;
                        if lost_at.lock().unwrap().is_some_and(|t| began > t) {
                            late_failures.push("NodeLost".to_owned());
                        }
                    }
                    Err(e) => late_failures.push(e.to_string()),
                }
            }
            (ok, lost, late_failures)
        }));
    }
    // Under load: the callers are being served.
    eventually(20, "50 calls served before the kill", || async {
        served.load(Ordering::Acquire) >= 50
    })
    .await;
    let b_replicas: Vec<u64> = replica_nodes(&serve, "load", "where")
        .await
        .into_iter()
        .filter(|(_, n, _)| *n == b_id)
        .map(|(id, _, _)| id)
        .collect();
    b.kill(); // SIGKILL
    let killed = Instant::now();
    eventually(10, "b declared lost", || async {
        serve.metrics().await.unwrap().nodes.lost == 1
    })
    .await;
    // The loss is counted before its replicas leave the route: from then on,
    // no call can be sent to b.
    eventually(10, "b's replicas out of the route", || async {
        !handle
            .replicas()
            .iter()
            .any(|r| b_replicas.contains(&r.id().0))
    })
    .await;
    *lost_at.lock().unwrap() = Some(Instant::now());
    let detected = killed.elapsed();
    eventually(20, "4 running replicas again, none on b", || async {
        let r = replica_nodes(&serve, "load", "where").await;
        r.len() == 4
            && r.iter()
                .all(|(_, n, s)| *n != b_id && *s == ReplicaState::Running)
    })
    .await;
    let replaced = killed.elapsed();
    // And served again after it (a failure of a call begun after the loss is
    // kept by its caller and fails the test below).
    let before = served.load(Ordering::Acquire);
    eventually(20, "50 more calls served after the replacement", || async {
        served.load(Ordering::Acquire) >= before + 50
    })
    .await;
    stop.store(true, Ordering::Release);
    let (mut ok, mut lost) = (0, 0);
    for c in callers {
        let (o, l, late) = c.await.unwrap();
        assert!(
            late.is_empty(),
            "requests that began after the loss failed: {late:?}"
        );
        ok += o;
        lost += l;
    }
    eprintln!(
        "kill under load: {ok} ok, {lost} lost in flight, detected in {detected:?}, replaced in {replaced:?}"
    );
    assert!(
        lost <= 16,
        "at most one request in flight per caller was lost: {lost}"
    );
    let nodes: BTreeSet<String> = replica_nodes(&serve, "load", "where")
        .await
        .into_iter()
        .map(|(_, n, _)| n)
        .collect();
    assert!(nodes.iter().all(|n| n == "head" || *n == a_id), "{nodes:?}");
    serve.shutdown().await.unwrap();
    drop(a);
}

/// A fenced node incarnation lets go of what its replicas held: a call that
/// a replica's task waits on through a handle ends (`Unavailable`) when the
/// incarnation ends. It waited for ever, and with it the incarnation's
/// routes, endpoints and link stayed in memory (a route holds the replica's
/// endpoint, which holds the user's code, which holds a handle to the
/// route's directory): about 74 KB a fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_incarnation_ends_the_calls_its_handles_wait_on() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let node = NodeProc::start(addr, &NodeSpec::new("w", 1.0), dir.path());
    let id = node.id().await;
    let app = ApplicationSpec::builder("w")
        .deployment(
            flotilla::DeploymentSpec::builder("waiter", WAITER)
                .replicas(1)
                .with_config(|c| c.with_resources(cpus(1.0))),
        )
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    let ended = "waiter: the call to deployment missing ended";
    assert!(log_lines(&node, ended).is_empty(), "it waits");
    assert!(serve.drop_node_connection(&id).await);
    eventually(
        30,
        "the waiting call ended with the incarnation",
        || async { !log_lines(&node, ended).is_empty() },
    )
    .await;
    serve.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_fences_the_node_which_joins_as_a_new_node() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 2.0), dir.path());
    let a_id = a.id().await;
    let handle = serve.run(where_app("app", 2, cpus(1.0))).await.unwrap();
    assert!(
        replica_nodes(&serve, "app", "where")
            .await
            .iter()
            .all(|(_, n, _)| *n == a_id)
    );
    let b = NodeProc::start(addr, &NodeSpec::new("b", 2.0), dir.path());
    let b_id = b.id().await;
    eventually(30, "b joined", || async {
        serve.metrics().await.unwrap().nodes.live == 2
    })
    .await;

    assert!(serve.drop_node_connection(&a_id).await);
    // a dials again, is refused (declared lost), stops its replicas, and
    // joins under a new id.
    let new_a = a.nth_id(1).await;
    assert_ne!(new_a, a_id);
    eventually(30, "two running replicas, both on b", || async {
        let r = replica_nodes(&serve, "app", "where").await;
        r.len() == 2
            && r.iter()
                .all(|(_, n, s)| *n == b_id && *s == ReplicaState::Running)
    })
    .await;
    eventually(30, "the new a joined", || async {
        serve.nodes().iter().any(|n| n.id == new_a && n.alive)
    })
    .await;
    eventually(10, "the fenced node runs no replica", || async {
        a.replicas() == 0
    })
    .await;
    let m = serve.metrics().await.unwrap();
    assert_eq!((m.nodes.lost, m.nodes.live), (1, 2));
    assert!(m.nodes.refused >= 1, "the old id was refused");
    let old = serve.nodes().into_iter().find(|n| n.id == a_id).unwrap();
    assert!(!old.alive);
    for i in 0..20 {
        let here: Here = handle.call(&format!("x{i}")).await.unwrap();
        assert_eq!(here.node, b_id);
    }
    serve.shutdown().await.unwrap();
    drop((a, b));
}

/// Captures this process's log lines (the head's side of a refusal).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    /// The process's capture, set as its subscriber (INFO and above) the
    /// first time (a process has one).
    fn global() -> Capture {
        static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();
        CAPTURE
            .get_or_init(|| {
                let capture = Capture::default();
                let writer = capture.clone();
                tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::INFO)
                    .with_writer(move || writer.clone())
                    .try_init()
                    .unwrap_or_else(|e| panic!("a subscriber was set already: {e}"));
                capture
            })
            .clone()
    }

    /// Everything captured so far.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_cookie_is_refused_and_logged_on_both_sides() {
    let _turn = turn().await;
    let capture = Capture::global();
    let dir = tempfile::tempdir().unwrap();
    let serve = head(dir.path(), cpus(1.0)).await;
    let addr = serve.node_address().unwrap();
    let mut bad = NodeProc::start(
        addr,
        &NodeSpec::new("bad", 1.0).cookie("not-the-cookie"),
        dir.path(),
    );
    let code = tokio::task::spawn_blocking(move || {
        let code = bad.wait_exit();
        (code, bad.log_text())
    });
    let (code, log) = code.await.unwrap();
    assert_eq!(code, Some(3), "the node ends with an error; log:\n{log}");
    assert!(
        log.contains("the head refused this node: authentication failed"),
        "{log}"
    );
    // A refusal may be a dropped connection: the node tried three times
    // before it ended.
    eventually(10, "the head counted three refusals", || async {
        serve.metrics().await.unwrap().nodes.refused >= 3
    })
    .await;
    let head_log = capture.text();
    assert!(
        head_log.contains("node connection refused: authentication failed"),
        "{head_log}"
    );
    assert!(
        !head_log.contains(COOKIE) && !log.contains(COOKIE),
        "the cookie is never logged"
    );
    assert_eq!(serve.metrics().await.unwrap().nodes.joined, 0);
    serve.shutdown().await.unwrap();
}

/// A head whose connections must authenticate within `handshake`.
async fn head_with_handshake(dir: &std::path::Path, handshake: Duration) -> flotilla::Serve {
    let cookie = flotilla::Cookie::new(COOKIE).unwrap();
    let options = flotilla::HeadOptions::new(cookie)
        .listen("127.0.0.1:0".parse().unwrap())
        .resources(cpus(1.0))
        .handshake_timeout(handshake);
    flotilla::Serve::start(
        flotilla::ServeOptions::new(registry())
            .store_path(dir.join("flotilla.redb"))
            .nodes(options),
    )
    .await
    .unwrap()
}

/// Whether the server closed `stream` (EOF or reset), waiting at most 10 s.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16];
    match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
        Ok(Ok(0)) => true,
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// 64 connections to `addr` that never authenticate: as many as a listener
/// holds waiting.
async fn hold_handshakes(
    addr: impl tokio::net::ToSocketAddrs + Copy,
) -> Vec<tokio::net::TcpStream> {
    let mut waiting = Vec::new();
    for _ in 0..64 {
        waiting.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    waiting
}

/// Every connection in `conns` is still open (nothing to read, no EOF).
fn assert_all_open(conns: &[tokio::net::TcpStream]) {
    let mut buf = [0u8; 1];
    for w in conns {
        let open =
            matches!(w.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        assert!(open, "a connection within the cap was closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_authenticate_are_closed_at_the_deadline_and_capped() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    // A connection that sends nothing, or half of ractor_cluster's first
    // frame, is closed once the handshake deadline passes.
    let serve = head_with_handshake(dir.path(), Duration::from_millis(200)).await;
    let addr = serve.node_address().unwrap();
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut partial = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut partial, &[0, 0, 0, 64, 1])
        .await
        .unwrap();
    assert!(
        closed_by_server(&mut silent).await,
        "the silent connection stayed open"
    );
    assert!(
        closed_by_server(&mut partial).await,
        "the partial one stayed open"
    );
    serve.shutdown().await.unwrap();

    // With a long deadline: 64 connections may wait to authenticate; the next
    // is closed at once, while those 64 stay open.
    let dir = tempfile::tempdir().unwrap();
    let serve = head_with_handshake(dir.path(), Duration::from_secs(300)).await;
    let addr = serve.node_address().unwrap();
    let waiting = hold_handshakes(addr).await;
    let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut over).await, "the 65th was not closed");
    assert_all_open(&waiting);
    // A node that dials while they hold every place is closed at accept too:
    // that is not a refusal, so it dials again (it ended, as refused, before).
    let node = NodeProc::start(addr, &NodeSpec::new("late", 1.0), dir.path());
    let closed = "the connection to the head ended before the handshake did";
    eventually(30, "the node's dial was closed at accept", || async {
        !log_lines(&node, closed).is_empty()
    })
    .await;
    // Once they close, their places are free: the node joins well before the
    // deadline would have freed them.
    drop(waiting);
    eventually(30, "the node joined", || async {
        serve.metrics().await.unwrap().nodes.joined == 1
    })
    .await;
    assert_eq!(serve.metrics().await.unwrap().nodes.refused, 0);
    serve.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_listener_holds_at_most_64_connections_waiting_to_authenticate() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let serve = head(dir.path(), cpus(1.0)).await;
    let _node = NodeProc::start(
        serve.node_address().unwrap(),
        &NodeSpec::new("capped", 1.0),
        dir.path(),
    );
    eventually(30, "the node joined with its listen address", || async {
        serve.nodes().iter().any(|n| !n.listen.is_empty())
    })
    .await;
    let listen = serve.nodes()[0].listen.clone();
    // The node closes a connection beyond the cap at accept, and keeps the
    // 64 (until its 5 s handshake deadline).
    let waiting = hold_handshakes(&listen).await;
    let mut over = tokio::net::TcpStream::connect(&listen).await.unwrap();
    assert!(closed_by_server(&mut over).await, "the 65th was not closed");
    assert_all_open(&waiting);
    serve.shutdown().await.unwrap();
}

/// A flood of connections that never authenticate is logged at the 1st,
/// 2nd, 4th, 8th... (every one was a warning: a peer without the cookie
/// could fill the log), and all of them are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unauthenticated_connections_is_logged_sparingly() {
    let _turn = turn().await;
    let capture = Capture::global();
    let dir = tempfile::tempdir().unwrap();
    let serve = head_with_handshake(dir.path(), Duration::from_secs(300)).await;
    let addr = serve.node_address().unwrap();
    let waiting = hold_handshakes(addr).await;
    let warning = "too many connections waiting to authenticate";
    let before = capture.text().matches(warning).count();
    for i in 0..200 {
        let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_by_server(&mut over).await,
            "connection {i} was not closed"
        );
    }
    let logged = capture.text().matches(warning).count() - before;
    // The 1st, 2nd, 4th, ... 128th.
    assert_eq!(logged, 8, "{}", capture.text());
    drop(waiting);
    serve.shutdown().await.unwrap();
}

/// Declare a 60 MiB frame to `addr` without authenticating, send up to 4 MiB
/// of it, and say whether the server closed the connection (before its
/// deadline, which the caller sets far off).
async fn closed_mid_frame_before_auth(addr: impl tokio::net::ToSocketAddrs) -> bool {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(&(60u64 << 20).to_be_bytes())
        .await
        .unwrap();
    let chunk = vec![0u8; 64 << 10];
    for _ in 0..64 {
        // A write fails once the server has closed.
        if stream.write_all(&chunk).await.is_err() {
            break;
        }
    }
    closed_by_server(&mut stream).await
}

/// A connection may send 64 KiB before it authenticates, on the head's
/// listener and on a node's: one that declares a 60 MiB frame is closed once
/// it has sent that much, not at its deadline (ractor_cluster read each such
/// frame whole first, so 64 connections waiting to authenticate held 4 GiB,
/// cookie or not). The node's listener here is the one it told the head it
/// listens on: its own, not ractor_cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_connection_sends_before_it_authenticates_is_bounded() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let serve = head_with_handshake(dir.path(), Duration::from_secs(300)).await;
    let addr = serve.node_address().unwrap();
    assert!(
        closed_mid_frame_before_auth(addr).await,
        "the head kept reading a frame before authentication"
    );
    let mut options =
        flotilla::node::NodeOptions::new(addr, flotilla::Cookie::new(COOKIE).unwrap())
            .name("bounded");
    options.handshake_timeout = Duration::from_secs(300);
    let node = flotilla::node::start(registry(), options).await.unwrap();
    eventually(30, "the node joined with its listen address", || async {
        serve.nodes().iter().any(|n| !n.listen.is_empty())
    })
    .await;
    let listen = serve.nodes()[0].listen.clone();
    assert!(
        closed_mid_frame_before_auth(&listen).await,
        "the node kept reading a frame before authentication"
    );
    // Neither closed anything that authenticated.
    assert_eq!(serve.metrics().await.unwrap().nodes.joined, 1);
    assert_eq!(serve.metrics().await.unwrap().nodes.lost, 0);
    node.shutdown().await.unwrap();
    serve.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_whose_handshake_stalls_is_closed_at_the_deadline_and_dialed_again() {
    let _turn = turn().await;
    // Where the head should be, something accepts connections and never
    // answers (a hung head, a half-open connection).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut options =
        flotilla::node::NodeOptions::new(addr, flotilla::Cookie::new(COOKIE).unwrap())
            .name("stalled");
    options.handshake_timeout = Duration::from_millis(200);
    let node = flotilla::node::start(registry(), options).await.unwrap();
    let accept = || async {
        tokio::time::timeout(Duration::from_secs(30), listener.accept())
            .await
            .expect("the node dialed")
            .unwrap()
            .0
    };
    let mut first = accept().await;
    // The node gives up on the silent connection at its deadline (it waited
    // on it for ever before) and dials again.
    let mut sent = Vec::new();
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut first, &mut sent),
    )
    .await;
    assert!(
        matches!(&ended, Ok(Ok(_)))
            || matches!(&ended, Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the node kept the stalled connection: {ended:?}"
    );
    let _second = accept().await;
    node.shutdown().await.unwrap();
}

/// A node whose head is not there dials it again ever less often (up to
/// once a second), logging its failures at the 1st, 2nd, 4th, 8th... (it
/// logged four a second for as long as the head was away), and joins the
/// head once one listens there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_waiting_for_its_head_backs_off_logs_sparingly_and_joins_it() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = restartable_addr();
    let node = NodeProc::start(addr, &NodeSpec::new("early", 1.0), dir.path());
    let unreachable = |node: &NodeProc| log_lines(node, "head not reachable");
    eventually(60, "the node's 8th failed dial logged", || async {
        unreachable(&node)
            .iter()
            .any(|l| l.contains("failed_dials=8"))
    })
    .await;
    let counts: Vec<String> = unreachable(&node)
        .iter()
        .filter_map(|l| l.split("failed_dials=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert_eq!(counts[..4], ["1", "2", "4", "8"], "{counts:?}");
    let serve = head_at(dir.path(), cpus(0.0), addr).await;
    eventually(30, "the node joined", || async {
        serve.metrics().await.unwrap().nodes.live == 1
    })
    .await;
    serve.shutdown().await.unwrap();
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_crash_and_restart_readopts_the_replicas_of_nodes_that_stayed_up() {
    // The restarted head listens where the first one did.
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = restartable_addr();
    let serve = head_at(dir.path(), cpus(0.0), addr).await;
    let a = NodeProc::start(
        addr,
        &NodeSpec::new("a", 2.0).custom("gpu", 1.0),
        dir.path(),
    );
    let b = NodeProc::start(addr, &NodeSpec::new("b", 2.0), dir.path());
    let (a_id, b_id) = (a.id().await, b.id().await);
    eventually(30, "both nodes joined", || async {
        serve.metrics().await.unwrap().nodes.live == 2
    })
    .await;
    // It logs as JSON: its nodes hold that setting across the head's restart.
    let json = flotilla::LoggingConfig {
        encoding: flotilla::LogEncoding::Json,
        ..Default::default()
    };
    let app = ApplicationSpec::builder("app")
        .deployment(where_dep("where", 4, cpus(1.0), &WhereArgs::default()))
        .logging(json)
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    a.wait_logging(|s| s.contains("\"app\"")).await;
    // A multiplexed replica on a, holding a model when the head crashes.
    let answer: String = serve
        .run(models_app("mx", 1))
        .await
        .unwrap()
        .with_model_id("m1")
        .unwrap()
        .call("x")
        .await
        .unwrap();
    assert_eq!(answer, format!("model m1 on {a_id}: x"));
    let before: BTreeSet<(u64, String)> = replica_nodes(&serve, "app", "where")
        .await
        .into_iter()
        .map(|(id, n, _)| (id, n))
        .collect();
    assert_eq!(before.len(), 4);

    let sent_before = a.logging_sent().len();
    serve.crash_process().await;
    drop(serve);
    let serve = head_at(dir.path(), cpus(0.0), addr).await;
    let handle = serve.app_handle("app").unwrap();
    let here: Here = handle.call("back").await.unwrap();
    assert!(here.node == a_id || here.node == b_id);
    // The restarted head sends its settings once its Controller recovered
    // them from the checkpoint, never the empty ones it starts with.
    let since = a
        .wait_printed("the restarted head's logging settings", || {
            let sent = a.logging_sent();
            (sent.len() > sent_before).then(|| sent[sent_before..].to_vec())
        })
        .await;
    assert!(
        since
            .iter()
            .all(|s| s.contains("\"app\"") && s.contains("Json")),
        "a node was sent settings without the application's: {since:#?}"
    );
    eventually(
        20,
        "the recovered deployment runs its 4 replicas",
        || async {
            let r = replica_nodes(&serve, "app", "where").await;
            r.len() == 4 && r.iter().all(|(_, _, s)| *s == ReplicaState::Running)
        },
    )
    .await;
    let after: BTreeSet<(u64, String)> = replica_nodes(&serve, "app", "where")
        .await
        .into_iter()
        .map(|(id, n, _)| (id, n))
        .collect();
    assert_eq!(
        after, before,
        "the same replicas, re-adopted: none restarted"
    );
    assert_eq!(
        (a.ids().len(), b.ids().len()),
        (1, 1),
        "the nodes kept their ids"
    );
    assert_eq!((a.replicas(), b.replicas()), (3, 2));
    // The re-attach told the new head what the multiplexed replica holds.
    eventually(20, "the multiplexed replica re-adopted", || async {
        serve
            .deployment_handle("mx", "models")
            .unwrap()
            .replicas()
            .len()
            == 1
    })
    .await;
    let mx = serve.deployment_handle("mx", "models").unwrap();
    assert_eq!(mx.replicas()[0].model_ids(), ["m1"]);
    serve.shutdown().await.unwrap();
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reattached_replica_no_deployment_adopts_is_stopped_after_the_adopt_timeout() {
    let _turn = turn().await;
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let addr = restartable_addr();
    let serve = head_at(first.path(), cpus(0.0), addr).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 1.0), first.path());
    a.id().await;
    serve.run(where_app("app", 1, cpus(1.0))).await.unwrap();
    eventually(10, "a runs the replica", || async { a.replicas() == 1 }).await;

    // The head comes back on another store: nothing there owns a's replica.
    serve.crash_process().await;
    drop(serve);
    // Long enough that the poll below cannot miss the re-attached replica on
    // a loaded machine before the timeout stops it.
    let serve = head_with(second.path(), cpus(0.0), addr, |o| {
        o.adopt_timeout(Duration::from_secs(5))
    })
    .await;
    eventually(20, "a re-attached", || async {
        serve.metrics().await.unwrap().nodes.replicas_on_nodes == 1
    })
    .await;
    // Stopped at the timeout (it ran, holding its place, for ever before).
    eventually(20, "the unowned replica is stopped", || async {
        a.replicas() == 0 && serve.metrics().await.unwrap().nodes.replicas_on_nodes == 0
    })
    .await;
    assert_eq!(a.ids().len(), 1, "a kept its id");
    assert!(a.log_text().contains("replica ended"));
    // Its place serves this head's own deployments.
    serve.run(where_app("new", 1, cpus(1.0))).await.unwrap();
    assert_eq!(
        replica_nodes(&serve, "new", "where").await[0].1,
        a.id().await
    );
    serve.shutdown().await.unwrap();
    drop(a);
}

/// `front`, whose one replica calls app's `where`.
fn front_calling_where() -> ApplicationSpec {
    front_calling("app", "where", cpus(1.0))
}

/// Application `front`, whose one replica (placed by `resources`) calls
/// deployment `deployment` of application `app`.
fn front_calling(app: &str, deployment: &str, resources: Resources) -> ApplicationSpec {
    let calls = WhereArgs {
        downstream: Some(deployment.into()),
        downstream_app: Some(app.into()),
        ..Default::default()
    };
    ApplicationSpec::builder("front")
        .deployment(where_dep("front", 1, resources, &calls))
        .build()
        .unwrap()
}

/// A head (no room of its own, at a restartable address, storing in `dir`)
/// and node `a`, which runs app's `where` and `front` calling it.
async fn front_and_where_on_a(
    dir: &std::path::Path,
) -> (flotilla::Serve, std::net::SocketAddr, NodeProc, String) {
    let addr = restartable_addr();
    let serve = head_at(dir, cpus(0.0), addr).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 2.0), dir);
    let a_id = a.id().await;
    serve.run(where_app("app", 1, cpus(1.0))).await.unwrap();
    let here: Here = (serve.run(front_calling_where()).await.unwrap())
        .call("before")
        .await
        .unwrap();
    assert_eq!(here.downstream.unwrap().node, a_id);
    (serve, addr, a, a_id)
}

/// A node's callers keep their route copies through a head restart: front,
/// on a, calls app's where (also on a) while the head is down and recovering,
/// and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_callers_keep_their_routes_through_a_head_restart() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let (serve, addr, a, a_id) = front_and_where_on_a(dir.path()).await;

    serve.crash_process().await;
    drop(serve);
    let serve = head_at(dir.path(), cpus(0.0), addr).await;
    let handle = serve
        .app_handle("front")
        .unwrap()
        .with_timeout(Duration::from_secs(10));
    let here: Here = handle.call("during").await.unwrap();
    assert_eq!(here.downstream.unwrap().node, a_id);
    eventually(20, "both deployments recovered", || async {
        let running = |app, dep| {
            let serve = &serve;
            async move {
                let r = replica_nodes(serve, app, dep).await;
                r.len() == 1 && r[0].2 == ReplicaState::Running
            }
        };
        running("app", "where").await && running("front", "front").await
    })
    .await;
    let here: Here = handle.call("after").await.unwrap();
    assert_eq!(here.downstream.unwrap().node, a_id);
    serve.shutdown().await.unwrap();
    drop(a);
}

/// A node forgets the old head's own replicas when the head goes: they went
/// with its process. app's `where` ran on the head alone (the only holder of
/// `h`); the head restarted without `h` cannot place it again, so where's
/// route never changes there and is never sent again. A call from front (on
/// a) to where then waits in a's queue, which the head counts as load (its
/// autoscaler's, its backpressure's), instead of trying the dead replica over
/// and over where nothing counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_forgets_the_old_heads_own_replicas_when_the_head_restarts() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = restartable_addr();
    let serve = head_at(dir.path(), custom("h"), addr).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 2.0), dir.path());
    let a_id = a.id().await;
    serve.run(where_app("app", 1, custom("h"))).await.unwrap();
    let here: Here = (serve.run(front_calling_where()).await.unwrap())
        .call("before")
        .await
        .unwrap();
    assert_eq!(here.node, a_id);
    assert_ne!(
        here.downstream.unwrap().node,
        a_id,
        "where runs on the head"
    );

    serve.crash_process().await;
    drop(serve);
    let serve = head_at(dir.path(), Resources::none(), addr).await;
    eventually(20, "front's replica on a adopted", || async {
        let r = replica_nodes(&serve, "front", "front").await;
        r.len() == 1 && r[0].2 == ReplicaState::Running
    })
    .await;
    let handle = serve
        .app_handle("front")
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    let call = tokio::spawn(async move { handle.call::<_, Here>("after").await });
    let route = serve.deployment_handle("app", "where").unwrap().route();
    eventually(20, "front's call to where waits in a's queue", || {
        let queued = route.queued_elsewhere();
        async move { queued >= 1 }
    })
    .await;
    call.abort();
    serve.shutdown().await.unwrap();
    drop(a);
}

/// A head restarted on another store runs none of the old deployments: a
/// node that re-attaches drops its copies of their routes once the head has
/// recovered, so a caller there hears NotFound instead of reaching a replica
/// no head owns. front (on a) calls app's where (on a); the new head knows
/// front only, deployed again (and adopts its replica on a, by name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_drops_the_routes_a_restarted_head_does_not_run() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let (serve, addr, a, _) = front_and_where_on_a(dir.path()).await;

    serve.crash_process().await;
    drop(serve);
    let other = tempfile::tempdir().unwrap();
    let serve = head_at(other.path(), cpus(0.0), addr).await;
    eventually(30, "the node dropped app's route", || async {
        a.log_text()
            .contains("route dropped: the head runs no such deployment")
    })
    .await;
    let handle = serve
        .run(front_calling_where())
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(10));
    let e = handle
        .call::<_, Here>("after")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("deployment 'where' of application 'app' does not exist"),
        "{e}"
    );
    serve.shutdown().await.unwrap();
    drop(a);
}

/// An application whose deletion a head crash interrupted: the restarted
/// head finishes it without the DeploymentActors that would close its
/// routes, so a node drops its copies by the head's live-route set instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_drops_the_routes_of_a_deletion_a_head_restart_finished() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = restartable_addr();
    let serve = head_at(dir.path(), cpus(0.0), addr).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 2.0), dir.path());
    a.id().await;
    // A request held for a minute keeps its replica draining, and so the
    // deletion unfinished, until the head crashes.
    let slow = WhereArgs {
        delay_ms: 60_000,
        ..Default::default()
    };
    let app = ApplicationSpec::builder("gone")
        .deployment(where_dep("where", 1, cpus(1.0), &slow))
        .build()
        .unwrap();
    let handle = serve.run(app).await.unwrap();
    let held = tokio::spawn(async move { handle.call::<_, Here>("held").await });
    eventually(30, "the request is held on a", || async {
        a.log_text().contains("where: request held began")
    })
    .await;
    serve.delete_apps(["gone"], false).await.unwrap();
    serve.crash_process().await;
    drop(serve);
    held.abort();
    let serve = head_at(dir.path(), cpus(0.0), addr).await;
    // Dropped by the re-attach's prune (the deletion finished first), or by
    // the deletion's own closed route (the node was back first): either way.
    eventually(30, "the node dropped the deleted route", || async {
        let log = a.log_text();
        log.lines()
            .any(|l| l.contains("route dropped: the head") && l.contains("app=gone"))
    })
    .await;
    serve.shutdown().await.unwrap();
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeploy_rolls_replicas_on_several_nodes() {
    let (_turn, dir, serve, addr) = setup(cpus(1.0)).await;
    let a = NodeProc::start(addr, &NodeSpec::new("a", 3.0), dir.path());
    let b = NodeProc::start(addr, &NodeSpec::new("b", 3.0), dir.path());
    let (_a_id, _b_id) = (a.id().await, b.id().await);
    eventually(30, "both nodes joined", || async {
        serve.metrics().await.unwrap().nodes.live == 2
    })
    .await;
    let app = |tag: &str| {
        ApplicationSpec::builder("roll")
            .deployment(where_dep(
                "where",
                4,
                cpus(1.0),
                &WhereArgs {
                    tag: tag.into(),
                    ..Default::default()
                },
            ))
            .build()
            .unwrap()
    };
    let handle = serve.run(app("v1")).await.unwrap();
    let v1: BTreeSet<u64> = replica_nodes(&serve, "roll", "where")
        .await
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    let nodes: BTreeSet<String> = replica_nodes(&serve, "roll", "where")
        .await
        .into_iter()
        .map(|(_, n, _)| n)
        .collect();
    assert_eq!(
        nodes.len(),
        3,
        "spread over the head and both nodes: {nodes:?}"
    );
    serve.run(app("v2")).await.unwrap();
    eventually(20, "4 replicas, none of v1", || async {
        let r = replica_nodes(&serve, "roll", "where").await;
        r.len() == 4
            && r.iter()
                .all(|(id, _, s)| !v1.contains(id) && *s == ReplicaState::Running)
    })
    .await;
    let nodes: BTreeSet<String> = replica_nodes(&serve, "roll", "where")
        .await
        .into_iter()
        .map(|(_, n, _)| n)
        .collect();
    assert!(
        nodes.len() >= 2,
        "the new replicas run on several processes: {nodes:?}"
    );
    for i in 0..40 {
        let here: Here = handle.call(&format!("r{i}")).await.unwrap();
        assert_eq!(here.tag, "v2");
    }
    eventually(10, "the nodes stopped their v1 replicas", || async {
        a.replicas() + b.replicas() <= 3
    })
    .await;
    let _ = RunManyOptions::default();
    serve.shutdown().await.unwrap();
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_metrics_show_each_replicas_node_and_count_nodes() {
    let (_turn, dir, serve, addr) = setup(cpus(1.0)).await;
    let mut a = NodeProc::start(addr, &NodeSpec::new("a", 2.0), dir.path());
    let a_id = a.id().await;
    eventually(30, "a joined", || async {
        serve.metrics().await.unwrap().nodes.live == 1
    })
    .await;
    serve.run(where_app("app", 3, cpus(1.0))).await.unwrap();

    // Each replica's node, in the deployment details (what the REST API's
    // ReplicaDetails.node_id shows) and the node list.
    let details = serve.deployment_details(Duration::from_secs(5)).await;
    let snap = details
        .iter()
        .find(|d| d.app.as_str() == "app")
        .and_then(|d| d.snapshot.clone())
        .unwrap();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for r in &snap.replicas {
        *per_node.entry(r.node.clone()).or_default() += 1;
    }
    let want: BTreeMap<String, usize> = [("head".to_owned(), 1), (a_id.clone(), 2)].into();
    assert_eq!(per_node, want);
    let nodes = serve.nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        (nodes[0].id.as_str(), nodes[0].replicas),
        (a_id.as_str(), 2)
    );
    let m = serve.metrics().await.unwrap().nodes;
    assert_eq!(
        (
            m.joined,
            m.lost,
            m.live,
            m.replicas_on_nodes,
            m.replicas_lost
        ),
        (1, 0, 1, 2, 0)
    );

    // a is killed: lost with its two replicas, which wait for room.
    a.kill();
    eventually(10, "a declared lost", || async {
        serve.metrics().await.unwrap().nodes.lost == 1
    })
    .await;
    let m = serve.metrics().await.unwrap().nodes;
    assert_eq!(
        (
            m.joined,
            m.lost,
            m.live,
            m.replicas_on_nodes,
            m.replicas_lost
        ),
        (1, 1, 0, 0, 2)
    );
    assert!(!serve.nodes()[0].alive);

    // b joins: the two are placed on it.
    let b = NodeProc::start(addr, &NodeSpec::new("b", 2.0), dir.path());
    let b_id = b.id().await;
    eventually(20, "two replicas running on b", || async {
        replica_nodes(&serve, "app", "where")
            .await
            .iter()
            .filter(|(_, n, s)| *n == b_id && *s == ReplicaState::Running)
            .count()
            == 2
    })
    .await;
    let m = serve.metrics().await.unwrap().nodes;
    assert_eq!(
        (
            m.joined,
            m.lost,
            m.live,
            m.replicas_on_nodes,
            m.replicas_lost
        ),
        (2, 1, 1, 2, 2)
    );
    serve.shutdown().await.unwrap();
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_default_heartbeats_keeps_its_session_to_a_slow_beating_head() {
    let _turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    // The head beats every 3 s; the node's default timeout is 2 s. Before,
    // the node only echoed the head's beats, heard nothing for 3 s, dropped
    // the session, was fenced and joined again under a new id, in a loop.
    let serve = head_with(dir.path(), cpus(1.0), "127.0.0.1:0".parse().unwrap(), |o| {
        o.heartbeat(Duration::from_secs(3), Duration::from_secs(10))
    })
    .await;
    let addr = serve.node_address().unwrap();
    let node = NodeProc::start(addr, &NodeSpec::new("steady", 1.0), dir.path());
    node.id().await;
    // What the test is about is a quiet stretch, so it spans real time: 5 s,
    // past two of the node's 2 s timeouts without a head beat (before the fix
    // the node was lost about 2 s in).
    let mut watch = serve.metrics().await.unwrap().nodes;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        watch = serve.metrics().await.unwrap().nodes;
        assert_eq!(
            watch.lost,
            0,
            "the node was lost; log:\n{}",
            node.log_text()
        );
    }
    assert_eq!(
        node.ids().len(),
        1,
        "the node joined again; log:\n{}",
        node.log_text()
    );
    assert_eq!(watch.live, 1);
    serve.shutdown().await.unwrap();
}

/// `app`: one `Where` replica needing the node's `gpu`, logging by `config`.
fn logged_app(app: &str, config: flotilla::LoggingConfig) -> ApplicationSpec {
    ApplicationSpec::builder(app)
        .deployment(where_dep("where", 1, custom("gpu"), &WhereArgs::default()))
        .logging(config)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_on_a_node_logs_by_its_applications_logging_config() {
    let (_turn, dir, serve, addr) = setup(cpus(0.0)).await;
    let json = flotilla::LoggingConfig {
        encoding: flotilla::LogEncoding::Json,
        ..Default::default()
    };
    // Deployed before the node joins (its replica waits for the node's gpu):
    // the node is sent the settings as it is welcomed, before the replica
    // can be placed there.
    let no_wait = RunManyOptions {
        wait_for_ingress_deployment_creation: false,
        wait_for_applications_running: false,
    };
    serve
        .run_many(vec![logged_app("logged", json)], no_wait)
        .await
        .unwrap();
    let a = NodeProc::start(addr, &gpu_node("a"), dir.path());
    a.id().await;
    let mut status = serve.watch_status("logged").unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        status.wait_for(|s| s.status == flotilla::ApplicationStatus::Running),
    )
    .await
    .expect("RUNNING on the node")
    .unwrap();
    let handle = serve.app_handle("logged").unwrap();
    handle.call::<_, Here>("log:first").await.unwrap();
    // Written in the handler, before its answer.
    let text = a.applog_text();
    assert!(
        text.lines()
            .any(|l| l.starts_with('{') && l.contains("first") && l.contains("\"app\":\"logged\"")),
        "the node's replica logs as JSON: {text}"
    );

    // Raised to WARNING: its INFO events are dropped on the node.
    let warning = flotilla::LoggingConfig {
        log_level: flotilla::LogLevel::Warning,
        encoding: flotilla::LogEncoding::Json,
        ..Default::default()
    };
    let handle = serve.run(logged_app("logged", warning)).await.unwrap();
    a.wait_logging(|s| s.contains("\"logged\"") && s.contains("Warning"))
        .await;
    handle.call::<_, Here>("log:second").await.unwrap();
    let text = a.applog_text();
    assert!(
        !text.contains("second"),
        "an INFO event passed the application's WARNING: {text}"
    );
    serve.shutdown().await.unwrap();
    drop(a);
}
