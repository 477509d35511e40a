//! DeploymentActor tests without the rest of the tree: re-adoption of living
//! replicas (RECOVERING), and placement retries on a cluster that announces
//! nothing. Paused tokio time throughout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use flotilla_cluster::{Cluster, LocalCluster, NodeId, PLACEMENT_RETRY, PlacementRequest, Refusal};
use flotilla_core::{
    AppName, DeploymentName, DeploymentSpec, DeploymentStatus, DeploymentVersion, ReplicaState,
    actor_names,
};
use flotilla_deployment::{
    DeploymentActor, DeploymentArgs, DeploymentMsg, DeploymentSnapshot, DeploymentTarget,
    RECOVER_TIMEOUT,
};
use flotilla_replica::{
    Deployment, Directory, Registry, ReplicaId, ReplicaMsg, ReplicaPhase, ReplicaSnapshot,
    UserError,
};
use flotilla_supervision::groups;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, rpc::CallResult};

struct Echo;

impl Deployment for Echo {
    type Request = String;
    type Response = String;
    // Batched through the default handle_batch by a test.
    const BATCHED: bool = true;
    async fn handle(&self, r: String) -> Result<String, UserError> {
        Ok(r)
    }
}

fn names(ns: &str) -> (String, AppName, DeploymentName) {
    (
        ns.to_owned(),
        AppName::new("app").unwrap(),
        DeploymentName::new("d").unwrap(),
    )
}

fn target(replicas: u32) -> DeploymentTarget {
    DeploymentTarget {
        spec: DeploymentSpec::builder("d", "t::Echo")
            .replicas(replicas)
            .build()
            .unwrap()
            .into(),
        replicas,
        deleting: false,
        generation: 1,
    }
}

async fn spawn_deployment(
    ns: &str,
    replicas: u32,
    cluster: Arc<dyn Cluster>,
) -> ActorRef<DeploymentMsg> {
    spawn_reporting(ns, replicas, cluster, Arc::new(|_| {})).await
}

/// [`spawn_deployment`], its events to `reporter`.
async fn spawn_reporting(
    ns: &str,
    replicas: u32,
    cluster: Arc<dyn Cluster>,
    reporter: flotilla_deployment::DeploymentReporter,
) -> ActorRef<DeploymentMsg> {
    let (ns, app, _) = names(ns);
    let target = target(replicas);
    let args = DeploymentArgs {
        ns: ns.clone(),
        app: app.clone(),
        registry: Registry::new()
            .register("t::Echo", |_| async { Ok(Echo) })
            .unwrap(),
        directory: Directory::new(),
        cluster,
        reporter,
        target: target.clone(),
        faults: flotilla_core::Faults::new(),
    };
    let name = actor_names::deployment(&ns, &app, &target.spec.name);
    Actor::spawn(Some(name), DeploymentActor, args)
        .await
        .unwrap()
        .0
}

async fn observe(actor: &ActorRef<DeploymentMsg>) -> DeploymentSnapshot {
    match actor.call(DeploymentMsg::Observe, None).await.unwrap() {
        CallResult::Success(s) => s,
        other => panic!("no snapshot: {other:?}"),
    }
}

/// A stand-in for a replica left alive by a crashed DeploymentActor: it answers
/// `Observe` after `answer_after` (never if `None`) and stops when told to.
struct FakeReplica;

struct FakeArgs {
    id: ReplicaId,
    version: DeploymentVersion,
    group: String,
    answer_after: Option<Duration>,
    /// It had reported itself unhealthy (to a predecessor), and says so.
    condemned: Option<String>,
}

impl Actor for FakeReplica {
    type Msg = ReplicaMsg;
    type State = (
        FakeArgs,
        Vec<RpcReplyPort<ReplicaSnapshot>>,
        groups::Membership,
    );
    type Arguments = FakeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ReplicaMsg>,
        args: FakeArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let membership = groups::join(args.group.clone(), myself.get_cell());
        Ok((args, Vec::new(), membership))
    }

    async fn handle(
        &self,
        myself: ActorRef<ReplicaMsg>,
        msg: ReplicaMsg,
        (args, held, _): &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReplicaMsg::Observe(reply) => {
                let snap = ReplicaSnapshot {
                    id: args.id,
                    version: args.version.clone(),
                    phase: ReplicaPhase::Running,
                    endpoint: None,
                    node: "local".into(),
                    condemned: args.condemned.clone(),
                    model_ids: Vec::new(),
                };
                match args.answer_after {
                    Some(d) => {
                        tokio::spawn(async move {
                            tokio::time::sleep(d).await;
                            let _ = reply.send(snap);
                        });
                    }
                    None => held.push(reply),
                }
            }
            ReplicaMsg::Stop { .. } => myself.stop(None),
            _ => {}
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn living_replicas_are_recovering_until_they_describe_themselves() {
    let (ns, app, dep) = names("actor-test-recover");
    let version = target(2).spec.version();
    let mut fakes = Vec::new();
    for (id, answer_after) in [(1_000_001, Some(Duration::from_secs(1))), (1_000_002, None)] {
        let args = FakeArgs {
            id: ReplicaId(id),
            version: version.clone(),
            group: actor_names::replica_group(&ns, &app, &dep),
            answer_after,
            condemned: None,
        };
        let name = actor_names::replica(&ns, &app, &dep, id);
        fakes.push(Actor::spawn(Some(name), FakeReplica, args).await.unwrap());
    }

    let actor = spawn_deployment(&ns, 2, Arc::new(LocalCluster::new())).await;
    let s = observe(&actor).await;
    assert_eq!(s.count_at(ReplicaState::Recovering, &version), 2);
    assert_eq!(s.live(), 2, "recovering replicas count: nothing new starts");

    // One answers (RUNNING), the other stays RECOVERING...
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let s = observe(&actor).await;
    assert_eq!(s.count(ReplicaState::Running), 1);
    assert_eq!(s.count(ReplicaState::Recovering), 1);
    assert_ne!(s.status.status, DeploymentStatus::Healthy);

    // ...until it misses the deadline: stopped and replaced by a real replica.
    tokio::time::sleep(RECOVER_TIMEOUT).await;
    let s = observe(&actor).await;
    assert_eq!(s.count_at(ReplicaState::Running, &version), 2, "{s:#?}");
    let ids: Vec<u64> = s.replicas.iter().map(|r| r.id.0).collect();
    assert!(
        ids.contains(&1_000_001) && !ids.contains(&1_000_002),
        "{ids:?}"
    );
    assert_eq!(s.status.status, DeploymentStatus::Healthy);
    actor.stop(None);
    for (f, _) in fakes {
        f.stop(None);
    }
}

/// Refuses the first `refusals` placements and announces nothing.
struct Stingy {
    refusals: AtomicU32,
}

impl Cluster for Stingy {
    fn place(&self, _request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        match self
            .refusals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        {
            Ok(_) => Err(Refusal {
                missing: "widgets: need 1, most free 0".into(),
            }),
            Err(_) => Ok("only".into()),
        }
    }

    fn release(&self, _replica: ReplicaId) {}
}

#[tokio::test(start_paused = true)]
async fn a_cluster_without_events_is_retried_on_a_timer() {
    let cluster = Arc::new(Stingy {
        refusals: AtomicU32::new(2),
    });
    let actor = spawn_deployment("actor-test-stingy", 1, cluster).await;
    let s = observe(&actor).await;
    assert_eq!(s.pending, 1);
    assert!(s.status.message.contains("widgets"), "{}", s.status.message);
    tokio::time::sleep(PLACEMENT_RETRY + Duration::from_millis(10)).await;
    assert_eq!(observe(&actor).await.pending, 1, "refused a second time");
    tokio::time::sleep(PLACEMENT_RETRY).await;
    let s = observe(&actor).await;
    assert_eq!((s.pending, s.count(ReplicaState::Running)), (0, 1));
    assert_eq!(s.replicas[0].node, "only");
    assert_eq!(s.status.status, DeploymentStatus::Healthy);
    actor.stop(None);
}

/// What a route carried when the cluster was told it changed: its batching
/// and its replicas' limits.
type Exported = (Option<flotilla_core::BatchConfig>, Vec<u32>);

/// Places everything on one node and records the routes it is told changed.
#[derive(Default)]
struct Recording {
    changed: std::sync::Mutex<Vec<Exported>>,
}

impl Cluster for Recording {
    fn place(&self, _request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        Ok("only".into())
    }

    fn release(&self, _replica: ReplicaId) {}

    fn route_changed(&self, route: &Arc<flotilla_replica::DeploymentRoute>) {
        let limits = route
            .replicas()
            .iter()
            .map(|e| e.max_ongoing_requests())
            .collect();
        self.changed
            .lock()
            .unwrap()
            .push((route.batching(), limits));
    }
}

#[tokio::test(start_paused = true)]
async fn a_config_only_change_of_what_nodes_copy_is_exported() {
    let cluster = Arc::new(Recording::default());
    let actor = spawn_deployment("actor-test-export", 1, cluster.clone()).await;
    while observe(&actor).await.count(ReplicaState::Running) < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = observe(&actor).await.replicas[0].id;
    let seen = || cluster.changed.lock().unwrap().clone();
    // The replica set's publish: settings as deployed (no batching).
    let limit = DeploymentSpec::builder("d", "t::Echo")
        .build()
        .unwrap()
        .config
        .max_ongoing_requests;
    assert_eq!(seen(), vec![(None, vec![limit])]);

    let batching = flotilla_core::BatchConfig::new(4, Duration::from_millis(50));
    let mut changed = target(1);
    changed.spec = DeploymentSpec::builder("d", "t::Echo")
        .replicas(1)
        .with_config(|c| c.with_batching(batching))
        .build()
        .unwrap()
        .into();
    actor
        .cast(DeploymentMsg::SetTarget(Box::new(changed.clone())))
        .unwrap();
    observe(&actor).await;
    let batched = (Some(batching), vec![limit]);
    assert_eq!(seen(), vec![(None, vec![limit]), batched.clone()]);
    while observe(&actor).await.count(ReplicaState::Running) < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = observe(&actor).await;
    assert_eq!(s.replicas.len(), 1);
    assert_eq!(s.replicas[0].id, before, "changed in place, not replaced");

    // The same target again changes nothing, and tells nobody.
    actor
        .cast(DeploymentMsg::SetTarget(Box::new(changed.clone())))
        .unwrap();
    observe(&actor).await;
    assert_eq!(seen(), vec![(None, vec![limit]), batched.clone()]);

    // A new limit is told once the replica has taken it in place.
    let mut limited = changed;
    limited.spec = DeploymentSpec::builder("d", "t::Echo")
        .replicas(1)
        .with_config(|c| c.with_batching(batching).with_max_ongoing_requests(7))
        .build()
        .unwrap()
        .into();
    actor
        .cast(DeploymentMsg::SetTarget(Box::new(limited)))
        .unwrap();
    while observe(&actor).await.count(ReplicaState::Running) < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        seen(),
        vec![(None, vec![limit]), batched, (Some(batching), vec![7])]
    );
    assert_eq!(observe(&actor).await.replicas[0].id, before);
    actor.stop(None);
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_exits_while_its_deployment_actor_is_down_gives_its_place_back() {
    let (ns, app, dep) = names("actor-test-exit-unwatched");
    // One place in all: a leaked reservation would leave the deployment pending
    // for ever.
    let cluster = Arc::new(LocalCluster::with_capacity(1));
    let actor = spawn_deployment(&ns, 1, cluster.clone()).await;
    while observe(&actor).await.count(ReplicaState::Running) < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = observe(&actor).await.replicas[0].id;
    assert_eq!(cluster.placed(), 1);

    // The DeploymentActor dies; its replica stops while nothing watches it.
    actor.kill();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let replica =
        ActorRef::<ReplicaMsg>::where_is(actor_names::replica(&ns, &app, &dep, first.0)).unwrap();
    replica.cast(ReplicaMsg::Stop { graceful: false }).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        ActorRef::<ReplicaMsg>::where_is(actor_names::replica(&ns, &app, &dep, first.0)).is_none()
    );
    assert_eq!(cluster.placed(), 0, "the gone replica's place is free");

    // Its successor finds nothing to adopt and starts a replica in that place.
    let actor = spawn_deployment(&ns, 1, cluster.clone()).await;
    for _ in 0..100 {
        if observe(&actor).await.count(ReplicaState::Running) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = observe(&actor).await;
    assert_eq!(
        (s.pending, s.count(ReplicaState::Running)),
        (0, 1),
        "{s:#?}"
    );
    assert_ne!(s.replicas[0].id, first);
    assert_eq!(cluster.placed(), 1);
    actor.stop(None);
}

/// A replica that had failed its health checks while its DeploymentActor was
/// down (its report lost with the actor) is found condemned by the successor,
/// whose status starts UPDATING: as Ray's RECOVERING replica that fails, that
/// is a startup failure (replaced), not a health-check failure, which from
/// UPDATING would be DEPLOY_FAILED.
#[tokio::test(start_paused = true)]
async fn a_replica_recovered_condemned_is_replaced_without_failing_the_deployment() {
    let (ns, app, dep) = names("actor-test-condemned");
    let version = target(2).spec.version();
    let mut fakes = Vec::new();
    for (id, condemned) in [
        (1_000_011, None),
        (
            1_000_012,
            Some("failed 3 consecutive health checks".to_owned()),
        ),
    ] {
        let args = FakeArgs {
            id: ReplicaId(id),
            version: version.clone(),
            group: actor_names::replica_group(&ns, &app, &dep),
            answer_after: Some(Duration::ZERO),
            condemned,
        };
        let name = actor_names::replica(&ns, &app, &dep, id);
        fakes.push(Actor::spawn(Some(name), FakeReplica, args).await.unwrap());
    }
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let reporter: flotilla_deployment::DeploymentReporter = {
        let seen = seen.clone();
        Arc::new(move |e| {
            if let flotilla_deployment::DeploymentEvent::Status { status, .. } = e {
                seen.lock().unwrap().push(status.status);
            }
        })
    };
    let actor = spawn_reporting(&ns, 2, Arc::new(LocalCluster::new()), reporter).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let s = observe(&actor).await;
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.contains(&DeploymentStatus::DeployFailed), "{seen:?}");
    let ids: Vec<u64> = s.replicas.iter().map(|r| r.id.0).collect();
    assert!(
        !ids.contains(&1_000_012),
        "the condemned one is gone: {ids:?}"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let s = observe(&actor).await;
    assert_eq!(s.status.status, DeploymentStatus::Healthy, "{s:#?}");
    assert_eq!(s.count_at(ReplicaState::Running, &version), 2, "{s:#?}");
    actor.stop(None);
    for (f, _) in fakes {
        f.stop(None);
    }
}
