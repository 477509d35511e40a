//! The registry's rules, driven through its state and its mailbox.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flotilla_core::{DeploymentSpec, Resources, actor_names};
use flotilla_replica::{Directory, OnExit, ReplicaMsg};
use tokio::sync::mpsc;

use super::joins::{Refusal, admission};
use super::*;
use crate::{
    PlacementRequest,
    nodes::{
        Head,
        proxy::{RemoteReplica, RemoteReplicaArgs},
        wire::{Hello, REPORTS_PART, ReplicaReport, WirePhase, in_parts},
    },
};

#[test]
fn a_hello_with_the_heads_id_a_bad_id_a_joined_or_a_lost_id_is_refused() {
    let cpus = Resources::none().with_cpus(2.0);
    assert_eq!(
        admission("node-a1b2c3", &cpus, "head", false, false),
        Ok(())
    );
    let refused = |node: &str, lost, joined| match admission(node, &cpus, "head", lost, joined) {
        Err(reason) => reason,
        Ok(()) => panic!("{node} was admitted"),
    };
    let head = refused("head", false, false);
    assert!(matches!(head, Refusal::HeadsOwn { .. }), "{head:?}");
    assert!(head.to_string().contains("the head's own"));
    for bad in ["", "a/b", &"n".repeat(65)] {
        let id = refused(bad, false, false);
        assert!(matches!(id, Refusal::BadId(_)), "{id:?}");
        assert!(id.to_string().contains("1 to 64"), "{id}");
    }
    let lost = refused("node-1", true, false);
    assert!(matches!(lost, Refusal::Lost { .. }), "{lost:?}");
    assert!(lost.to_string().contains("declared lost"));
    let joined = refused("node-1", false, true);
    assert!(matches!(joined, Refusal::Joined { .. }), "{joined:?}");
    assert!(joined.to_string().contains("already joined"));
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        let r = Resources::none().with_cpus(bad);
        let refused = admission("node-1", &r, "head", false, false);
        assert!(matches!(refused, Err(Refusal::BadResources(_))), "{bad}");
    }
}

const PEER: &str = "node-test@127.0.0.1";

async fn head(ns: &str) -> Head {
    crate::nodes::export::tests::head(ns).await.0
}

fn report(id: u64) -> ReplicaReport {
    let spec = DeploymentSpec::builder("d", "test::D").build().unwrap();
    ReplicaReport {
        id,
        app: AppName::new("a").unwrap(),
        version: spec.version(),
        spec: Box::new(spec),
        phase: WirePhase::Running,
        condemned: None,
        models: None,
    }
}

/// Deliver `control` from `from`, and wait until the registry has read it.
async fn deliver(head: &Head, from: &str, control: Control) {
    let env = Envelope {
        from: from.to_owned(),
        control,
    };
    head.registry
        .cast(RegistryMsg::Inbound(Inbound::Control(env)))
        .unwrap();
    let barrier = ractor::call!(head.registry, |r| RegistryMsg::DropNode("nobody".into(), r));
    assert!(!barrier.unwrap(), "no node is called nobody");
}

fn proxies(head: &Head) -> Vec<u64> {
    let mut ids: Vec<u64> = lock(&head.shared.proxies).keys().map(|r| r.0).collect();
    ids.sort_unstable();
    ids
}

fn joining(node: &str) -> Control {
    Control::Hello(Hello {
        node: node.into(),
        resources: Resources::none().with_cpus(4.0),
        labels: Vec::new(),
        last_head: None,
        peers: Vec::new(),
        replicas: Vec::new(),
        more: false,
    })
}

/// Callers waiting on each node are summed on the head's route, each
/// node's report taking the place of its last; a lost node's go with it.
#[tokio::test]
async fn queued_load_is_summed_over_nodes_and_forgotten_with_a_lost_node() {
    let head = head("registry-load").await;
    let (app, dep) = (
        AppName::new("a").unwrap(),
        DeploymentName::new("d").unwrap(),
    );
    let route = head.shared.directory.route(&app, &dep);
    let load = |n: u32| {
        Control::Load(WireLoad {
            running: Vec::new(),
            queued: vec![(app.clone(), dep.clone(), n)],
        })
    };
    let (p1, p2) = ("node-1@127.0.0.1", "node-2@127.0.0.1");
    deliver(&head, p1, joining("n-1")).await;
    deliver(&head, p2, joining("n-2")).await;
    deliver(&head, p1, load(3)).await;
    deliver(&head, p2, load(4)).await;
    assert_eq!(route.queued_elsewhere(), 7);
    deliver(&head, p1, load(1)).await;
    assert_eq!(route.queued_elsewhere(), 5);
    // Nothing waits on n-2 any more: it says so with an empty report.
    deliver(&head, p2, Control::Load(WireLoad::default())).await;
    assert_eq!(route.queued_elsewhere(), 1);
    // From a peer that never joined: not counted.
    deliver(&head, "node-9@127.0.0.1", load(50)).await;
    assert_eq!(route.queued_elsewhere(), 1);
    let dropped = ractor::call!(head.registry, |r| RegistryMsg::DropNode("n-1".into(), r));
    assert!(dropped.unwrap());
    assert_eq!(
        route.queued_elsewhere(),
        0,
        "n-1's callers are gone with it"
    );
    head.stop().await;
}

/// The requests running on a node's replica, as its node reports them,
/// reach that replica's mirror endpoint (where the deployment's autoscaler
/// reads a replica's load), and a report that leaves the replica out puts
/// it back to 0.
#[tokio::test]
async fn running_load_reaches_the_mirror_of_the_reporting_nodes_replica() {
    let head = head("registry-running").await;
    deliver(&head, PEER, reattaching("n-1", &head, &[], 1, false)).await;
    assert_eq!(proxies(&head), [1]);
    let (app, dep) = (
        AppName::new("a").unwrap(),
        DeploymentName::new("d").unwrap(),
    );
    let name = actor_names::replica("registry-running", &app, &dep, 1);
    let proxy: ActorRef<ReplicaMsg> = ractor::registry::where_is(name).unwrap().into();
    let endpoint = ractor::call!(proxy, ReplicaMsg::Observe)
        .unwrap()
        .endpoint
        .unwrap();
    assert_eq!(endpoint.load(), 0);
    // The mirror takes its report in a task of its own: wait for it.
    let settles = |n: u32| {
        let endpoint = endpoint.clone();
        async move {
            while endpoint.load() != n {
                tokio::task::yield_now().await;
            }
        }
    };
    let running = |replicas: Vec<(u64, u32)>| {
        Control::Load(WireLoad {
            running: replicas,
            queued: Vec::new(),
        })
    };
    deliver(&head, PEER, running(vec![(1, 5)])).await;
    tokio::time::timeout(Duration::from_secs(10), settles(5))
        .await
        .unwrap();
    deliver(&head, PEER, running(vec![(1, 2)])).await;
    tokio::time::timeout(Duration::from_secs(10), settles(2))
        .await
        .unwrap();
    // Nothing runs there any more: left out of the next report.
    deliver(&head, PEER, running(Vec::new())).await;
    tokio::time::timeout(Duration::from_secs(10), settles(0))
        .await
        .unwrap();
    head.stop().await;
}

/// Time the head did not run (its process stopped, as a paused VM is)
/// is not held against its nodes: a node it joined is still alive after
/// a stall longer than the heartbeat timeout, and is declared lost one
/// timeout of the head's own running time after it resumed.
#[tokio::test(start_paused = true)]
async fn a_head_that_did_not_run_holds_its_nodes_silence_meanwhile_against_none() {
    let timeout = Duration::from_secs(2);
    let (head, _) = crate::nodes::export::tests::head_with("registry-stall", |o| {
        o.reattach_grace(Duration::from_secs(3_600))
            .heartbeat(Duration::from_millis(500), timeout)
    })
    .await;
    deliver(&head, "node-s@127.0.0.1", joining("s")).await;
    let alive = || head.nodes().iter().any(|n| n.id == "s" && n.alive);
    assert!(alive());
    // The head's process stops for 3 s: its clock moves on while none of
    // its ticks runs (`advance` jumps at once; the ticks then come late).
    tokio::time::advance(timeout + Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(alive(), "a head that did not run declared its node lost");
    // Running again, and the node still silent: lost within one timeout
    // and one check period.
    tokio::time::sleep(timeout - Duration::from_millis(300)).await;
    assert!(
        alive(),
        "lost before a timeout of the head's own running time"
    );
    tokio::time::sleep(Duration::from_millis(300) + CHECK_PERIOD * 2).await;
    assert!(!alive(), "a silent node was never declared lost");
    head.stop().await;
}

/// Every incarnation of a node has an id of its own: the head forgets
/// dead ones beyond the most recent [`DEAD_NODES_KEPT`], and its pool
/// keeps none, while every lost id stays fenced.
#[tokio::test]
async fn a_head_keeps_a_bounded_list_of_dead_nodes_and_fences_every_lost_id() {
    let head = head("registry-dead").await;
    let incarnations = DEAD_NODES_KEPT + 3;
    for i in 0..incarnations {
        let (node, peer) = (format!("n-{i}"), format!("node-{i}@127.0.0.1"));
        deliver(&head, &peer, joining(&node)).await;
        let dropped = ractor::call!(head.registry, |r| RegistryMsg::DropNode(node.clone(), r));
        assert!(dropped.unwrap(), "{node} had joined");
    }
    let listed = head.nodes();
    assert_eq!(listed.len(), DEAD_NODES_KEPT);
    assert!(listed.iter().all(|n| !n.alive));
    assert!(!listed.iter().any(|n| n.id == "n-0" || n.id == "n-2"));
    assert!(listed.iter().any(|n| n.id == "n-3"));
    // The pool holds the head's own node alone.
    assert_eq!(head.shared.pool().nodes().len(), 1);
    assert_eq!(lock(&head.shared.lost).len(), incarnations);
    // A forgotten id is still refused.
    deliver(&head, "node-0@127.0.0.1", joining("n-0")).await;
    assert!(!head.nodes().iter().any(|n| n.id == "n-0"));
    assert_eq!(head.shared.pool().nodes().len(), 1);
    head.stop().await;
}

/// The joins a wave brings at once share one `Nodes` broadcast: each
/// node hears the new list once, not once per join (a wave of N joins
/// cost N broadcasts of N frames of N names each).
#[tokio::test]
async fn a_wave_of_joins_is_told_in_one_nodes_broadcast() {
    // Nothing else changes the node list meanwhile, however slow the
    // machine: the test head's grace and silences last an hour.
    let head = head("registry-wave").await;
    let broadcasts = || head.shared.nodes_broadcasts.load(Ordering::Relaxed);
    for i in 0..20 {
        let env = Envelope {
            from: format!("node-{i}@127.0.0.1"),
            control: joining(&format!("n-{i}")),
        };
        head.registry
            .cast(RegistryMsg::Inbound(Inbound::Control(env)))
            .unwrap();
    }
    // Two barriers: the broadcast the first join queued comes after the
    // first (behind the other joins), and before the second.
    for _ in 0..2 {
        let barrier = ractor::call!(head.registry, |r| RegistryMsg::DropNode("nobody".into(), r));
        assert!(!barrier.unwrap());
    }
    assert_eq!(head.nodes().iter().filter(|n| n.alive).count(), 20);
    assert_eq!(broadcasts(), 1);
    // A later change is told again.
    deliver(&head, "node-20@127.0.0.1", joining("n-20")).await;
    let barrier = ractor::call!(head.registry, |r| RegistryMsg::DropNode("nobody".into(), r));
    assert!(!barrier.unwrap());
    assert_eq!(broadcasts(), 2);
    head.stop().await;
}

/// A re-attach whose reports come in parts: every replica is adopted, and
/// a restarted head's wait ends only with the last part.
#[tokio::test]
async fn a_reattach_in_parts_ends_with_its_last_part() {
    let head = head("registry-parts").await;
    let reattach = || *head.shared.reattach.borrow();
    // Parts from a peer that has not said hello are not a join.
    let stray = Control::Replicas {
        reports: vec![report(9)],
        more: false,
    };
    deliver(&head, PEER, stray).await;
    assert!(proxies(&head).is_empty());
    let hello = Hello {
        node: "n-1".into(),
        resources: Resources::none().with_cpus(4.0),
        labels: Vec::new(),
        last_head: Some(head.shared.epoch ^ 1),
        peers: Vec::new(),
        replicas: vec![report(1)],
        more: true,
    };
    deliver(&head, PEER, Control::Hello(hello)).await;
    assert_eq!(proxies(&head), [1]);
    assert_eq!(
        reattach(),
        (false, 0),
        "the wait ended before every replica came"
    );
    let middle = Control::Replicas {
        reports: vec![report(2)],
        more: true,
    };
    deliver(&head, PEER, middle).await;
    assert_eq!(reattach(), (false, 0));
    let last = Control::Replicas {
        reports: vec![report(3)],
        more: false,
    };
    deliver(&head, PEER, last).await;
    assert_eq!(proxies(&head), [1, 2, 3]);
    assert_eq!(reattach(), (true, 0));
    head.stop().await;
}

fn reattaching(node: &str, head: &Head, peers: &[&str], first: u64, more: bool) -> Control {
    Control::Hello(Hello {
        node: node.into(),
        resources: Resources::none().with_cpus(4.0),
        labels: Vec::new(),
        last_head: Some(head.shared.epoch ^ 1),
        peers: peers.iter().map(|p| (*p).to_owned()).collect(),
        replicas: vec![report(first)],
        more,
    })
}

/// A node that knew one still mid-join joins whole: the head's wait
/// goes on until the other's last part.
#[tokio::test]
async fn a_node_joining_whole_does_not_end_the_wait_for_one_mid_join() {
    let head = head("registry-two").await;
    let reattach = || *head.shared.reattach.borrow();
    let (a, b) = ("node-a@127.0.0.1", "node-b@127.0.0.1");
    deliver(&head, a, reattaching("n-a", &head, &["n-b"], 1, true)).await;
    deliver(&head, b, reattaching("n-b", &head, &["n-a"], 2, false)).await;
    assert_eq!(reattach(), (true, 1), "the wait ended with n-a mid-join");
    let last = Control::Replicas {
        reports: vec![report(3)],
        more: false,
    };
    deliver(&head, a, last).await;
    assert_eq!(reattach(), (true, 0));
    assert_eq!(proxies(&head), [1, 2, 3]);
    head.stop().await;
}

/// A node declared lost mid-join: its later parts are not taken (their
/// replicas are being replaced), its join never ends, and the wait no
/// longer expects it.
#[tokio::test]
async fn the_parts_of_a_node_lost_mid_join_are_not_adopted() {
    let head = head("registry-lost").await;
    deliver(&head, PEER, reattaching("n-1", &head, &[], 1, true)).await;
    let lost = ractor::call!(head.registry, |r| RegistryMsg::DropNode("n-1".into(), r));
    assert!(lost.unwrap(), "n-1 was not alive");
    assert_eq!(*head.shared.reattach.borrow(), (false, 0));
    let late = Control::Replicas {
        reports: vec![report(2)],
        more: false,
    };
    deliver(&head, PEER, late).await;
    assert!(
        !proxies(&head).contains(&2),
        "a lost node's replica adopted"
    );
    assert_eq!(
        *head.shared.reattach.borrow(),
        (false, 0),
        "the join of a lost node ended"
    );
    head.stop().await;
}

/// A re-attached replica whose id this head already gave another replica
/// (a clock that went back) is not adopted, and the other's reservation
/// stays where it is.
#[tokio::test]
async fn a_reattached_replica_whose_id_is_taken_here_is_not_adopted() {
    let head = head("registry-taken").await;
    deliver(&head, "node-x@127.0.0.1", joining("n-x")).await;
    let spec = DeploymentSpec::builder("d", "test::D").build().unwrap();
    let app = AppName::new("a").unwrap();
    {
        let req = PlacementRequest::for_config(ReplicaId(1), &app, &spec.name, &spec.config);
        let at = head
            .shared
            .pool()
            .place(&req, |_, n, _| n.name() != "n-x")
            .unwrap();
        assert_eq!(at, "n-x");
    }
    deliver(&head, PEER, reattaching("n-1", &head, &[], 1, false)).await;
    assert!(proxies(&head).is_empty(), "adopted under a taken id");
    let holder = head
        .shared
        .pool()
        .node_of(ReplicaId(1))
        .map(|n| n.name().to_owned());
    assert_eq!(
        holder.as_deref(),
        Some("n-x"),
        "the other replica's reservation moved"
    );
    head.stop().await;
}

/// Hears how its children stopped.
struct Watcher;

impl Actor for Watcher {
    type Msg = ();
    type State = mpsc::UnboundedSender<Option<String>>;
    type Arguments = mpsc::UnboundedSender<Option<String>>;

    async fn pre_start(
        &self,
        _: ActorRef<()>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<()>,
        event: ractor::SupervisionEvent,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let ractor::SupervisionEvent::ActorTerminated(_, _, why) = event {
            let _ = tx.send(why);
        }
        Ok(())
    }
}

/// A stand-in made for a node the head has just declared lost (its
/// DeploymentActor placed the replica a moment before) is not in the
/// loss's sweep: it stops for the node's loss instead of waiting for ever.
#[tokio::test]
async fn a_stand_in_made_after_its_node_was_lost_stops_as_lost() {
    let head = head("registry-late-stand-in").await;
    deliver(&head, PEER, joining("n-1")).await;
    let host = head.cluster().host("n-1").unwrap();
    let lost = ractor::call!(head.registry, |r| RegistryMsg::DropNode("n-1".into(), r));
    assert!(lost.unwrap());
    let spec = Arc::new(DeploymentSpec::builder("d", "test::D").build().unwrap());
    let (app, dep) = (AppName::new("a").unwrap(), spec.name.clone());
    let directory = Directory::new();
    let args = flotilla_replica::ReplicaArgs {
        id: ReplicaId(77),
        version: spec.version(),
        spec,
        registry: flotilla_replica::Registry::new(),
        directory: directory.clone(),
        route: directory.route(&app, &dep),
        reporter: Arc::new(|_, _| {}),
        group: actor_names::replica_group("registry-late-stand-in", &app, &dep),
        node: "n-1".into(),
        faults: flotilla_core::Faults::new(),
        on_exit: OnExit::none(),
        app,
        deployment: dep,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (watcher, _) = Actor::spawn(None, Watcher, tx).await.unwrap();
    let args = RemoteReplicaArgs::new(args, host);
    Actor::spawn_linked(None, RemoteReplica, args, watcher.get_cell())
        .await
        .unwrap();
    let why = tokio::time::timeout(std::time::Duration::from_secs(30), rx.recv())
        .await
        .expect("the stand-in stopped")
        .unwrap();
    assert_eq!(why.as_deref(), Some("its node 'n-1' was lost"));
    watcher.stop(None);
    head.stop().await;
}

#[test]
fn reports_go_in_parts_under_the_budget_in_order() {
    let one = rmp_serde::to_vec_named(&report(1)).unwrap().len();
    let ids = |parts: &[Vec<ReplicaReport>]| -> Vec<Vec<u64>> {
        parts
            .iter()
            .map(|p| p.iter().map(|r| r.id).collect())
            .collect()
    };
    let reports = || (1..=5).map(report).collect::<Vec<_>>();
    assert_eq!(
        ids(&in_parts(reports(), 2 * one)),
        [vec![1, 2], vec![3, 4], vec![5]]
    );
    assert_eq!(
        ids(&in_parts(reports(), REPORTS_PART)),
        [vec![1, 2, 3, 4, 5]]
    );
    // A report larger than the budget goes alone; nothing is dropped.
    assert_eq!(ids(&in_parts(reports(), 1)), [[1], [2], [3], [4], [5]]);
    assert_eq!(ids(&in_parts(Vec::new(), 1)), [Vec::<u64>::new()]);
}
