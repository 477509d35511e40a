//! The Controller and the Supervisor on their own, driven by their messages
//! (no facade): the checkpoint protocol's commits, the route index and the
//! status board, restarting ApplicationActors, and refusing work after
//! shutdown; on paused time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use flotilla_cluster::LocalCluster;
use flotilla_controller::{
    Checkpoint, ControllerArgs, ControllerMsg, ControllerSnapshot, LogSettings, Preloaded,
    RouteTable, ServeError, StatusBoard, Supervisor, SupervisorArgs, SupervisorMsg,
};
use flotilla_core::{
    ApiType, AppName, ApplicationSpec, ApplicationStatus as A, DeploymentSpec, FaultPoint, Faults,
    actor_names,
};
use flotilla_replica::{Deployment, Directory, Registry, UserError};
use ractor::{Actor, ActorRef, RpcReplyPort, rpc::CallResult};
use tokio::sync::watch;

struct Echo;

impl Deployment for Echo {
    type Request = String;
    type Response = String;
    async fn handle(&self, r: String) -> Result<String, UserError> {
        Ok(r)
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    ns: String,
    supervisor: ActorRef<SupervisorMsg>,
    board: StatusBoard,
    routes: RouteTable,
    faults: Faults,
}

impl Rig {
    async fn start(ns: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (checkpoint, snapshot) = Checkpoint::open(dir.path().join("f.redb")).unwrap();
        let registry = Registry::new()
            .register("test::Echo", |_ctx| async { Ok(Echo) })
            .unwrap();
        let (board, routes) = (StatusBoard::new(), RouteTable::new());
        let faults = Faults::new();
        let args = SupervisorArgs {
            controller: ControllerArgs {
                ns: ns.to_owned(),
                checkpoint,
                registry,
                directory: Directory::new(),
                cluster: Arc::new(LocalCluster::new()),
                board: board.clone(),
                restart: Default::default(),
                faults: faults.clone(),
                logging: LogSettings::new(),
                preloaded: Preloaded::new(snapshot),
                clock: Arc::new(std::time::SystemTime::now),
                route_table: routes.clone(),
                app_restarts: Default::default(),
                shutdown: Default::default(),
            },
            fatal: watch::channel(None).0,
        };
        let (supervisor, _) = Actor::spawn(None, Supervisor, args).await.unwrap();
        Rig {
            _dir: dir,
            ns: ns.to_owned(),
            supervisor,
            board,
            routes,
            faults,
        }
    }

    async fn ask<T: Send + 'static>(
        &self,
        msg: impl FnOnce(RpcReplyPort<T>) -> ControllerMsg,
    ) -> T {
        let (tx, rx) = ractor::concurrency::oneshot();
        self.supervisor
            .cast(SupervisorMsg::Forward(msg(tx.into())))
            .unwrap();
        tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .expect("answered in time")
            .expect("answered")
    }

    async fn deploy(&self, apps: Vec<ApplicationSpec>) -> Result<Vec<u64>, ServeError> {
        let deployed = self
            .ask(|reply| ControllerMsg::Deploy {
                apps,
                api_type: ApiType::Imperative,
                reply,
            })
            .await?;
        Ok(deployed.into_iter().map(|d| d.generation).collect())
    }

    async fn observe(&self) -> ControllerSnapshot {
        self.ask(ControllerMsg::Observe).await
    }

    async fn wait(&self, app: &str, status: A) {
        let mut rx = self.board.subscribe(app).expect("on the board");
        tokio::time::timeout(Duration::from_secs(600), async {
            while rx.borrow_and_update().status != status {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        })
        .await
        .expect("reached in time");
    }
}

fn app(name: &str, prefix: &str) -> ApplicationSpec {
    ApplicationSpec::builder(name)
        .route_prefix(prefix)
        .deployment(DeploymentSpec::builder("d", "test::Echo"))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_one_commit_and_a_refused_one_commits_nothing() {
    let rig = Rig::start("ctl-test-batch").await;
    let before = rig.observe().await.store.commits;
    let generations = rig
        .deploy(vec![app("a", "/a"), app("b", "/b")])
        .await
        .unwrap();
    assert_eq!(generations, [1, 1]);
    let after = rig.observe().await;
    assert_eq!(after.store.commits, before + 1);
    assert_eq!(after.apps, 2);
    assert_eq!(
        rig.routes.get("/a").map(|r| r.app.to_string()),
        Some("a".into())
    );
    // The prefix is taken: the whole batch is refused, nothing is written.
    let err = rig
        .deploy(vec![app("c", "/c"), app("d", "/a")])
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::RouteTaken { .. }), "{err}");
    assert_eq!(rig.observe().await.store.commits, before + 1);
    assert!(rig.routes.get("/c").is_none());
    rig.wait("a", A::Running).await;
}

#[tokio::test(start_paused = true)]
async fn a_deletion_releases_its_prefix_at_once_and_its_record_when_done() {
    let rig = Rig::start("ctl-test-delete").await;
    rig.deploy(vec![app("a", "/a")]).await.unwrap();
    rig.wait("a", A::Running).await;
    let mut deletions = rig
        .ask(|reply| ControllerMsg::Delete {
            names: vec![AppName::new("a").unwrap(), AppName::new("ghost").unwrap()],
            reply,
        })
        .await
        .unwrap();
    let generations: Vec<_> = deletions
        .iter()
        .map(|d| d.as_ref().map(|d| d.generation))
        .collect();
    assert_eq!(generations, [Some(2), None]);
    assert!(rig.routes.is_empty(), "released in the deletion's commit");
    let mut rx = deletions.swap_remove(0).unwrap().status;
    tokio::time::timeout(Duration::from_secs(600), async {
        while rx.changed().await.is_ok() {}
    })
    .await
    .expect("the board drops the application");
    assert_eq!(rig.observe().await.apps, 0, "the record is gone");
}

#[tokio::test(start_paused = true)]
async fn a_removal_whose_commit_keeps_failing_backs_off_and_lands_once_the_store_recovers() {
    let rig = Rig::start("ctl-test-removal-retry").await;
    rig.deploy(vec![app("a", "/a")]).await.unwrap();
    rig.wait("a", A::Running).await;
    rig.ask(|reply| ControllerMsg::Delete {
        names: vec![AppName::new("a").unwrap()],
        reply,
    })
    .await
    .unwrap();
    // The deletion is committed; every commit of its record's removal fails.
    rig.faults.arm(FaultPoint::CommitFails, 1_000);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let tries = 1_000 - rig.faults.remaining(FaultPoint::CommitFails);
    assert!((1..=12).contains(&tries), "{tries} tries in 20 s");
    let snap = rig.observe().await;
    assert_eq!(
        (snap.apps, snap.app_actors),
        (1, 0),
        "waiting, no actor respawned"
    );
    // The store recovers: the next try lands.
    rig.faults.arm(FaultPoint::CommitFails, 0);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(rig.observe().await.apps, 0, "the record is gone");
}

#[tokio::test(start_paused = true)]
async fn a_removal_retry_that_finds_nothing_left_does_not_hold_up_later_removals() {
    let rig = Rig::start("ctl-test-removal-cancelled").await;
    rig.deploy(vec![app("x", "/x"), app("y", "/y")])
        .await
        .unwrap();
    rig.wait("y", A::Running).await;
    let delete = |name: &str| {
        let names = vec![AppName::new(name).unwrap()];
        rig.ask(move |reply| ControllerMsg::Delete { names, reply })
    };
    // x's removal commit fails, and x is deployed again before the retry: the
    // retry finds nothing to remove.
    delete("x").await.unwrap();
    rig.faults.arm(FaultPoint::CommitFails, 1);
    while rig.faults.remaining(FaultPoint::CommitFails) > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    rig.deploy(vec![app("x", "/x")]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A later deletion is still removed.
    delete("y").await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    // One record, not being deleted: x's (had the retry removed x's new
    // record instead, y's would stay, being deleted).
    let snap = rig.observe().await;
    assert_eq!(
        (snap.apps, snap.deleting),
        (1, 0),
        "y's record is gone, x's stays"
    );
    assert_eq!(rig.board.status("x").status, A::Running);
    assert_eq!(rig.board.status("y").status, A::NotStarted);
}

#[tokio::test(start_paused = true)]
async fn a_crashed_application_actor_is_restarted() {
    let rig = Rig::start("ctl-test-restart").await;
    rig.deploy(vec![app("a", "/a")]).await.unwrap();
    rig.wait("a", A::Running).await;
    let name = actor_names::application(&rig.ns, &AppName::new("a").unwrap());
    let first = ractor::registry::where_is(name.clone()).unwrap();
    first.kill();
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let snap = rig.observe().await;
            if snap.app_restarts == 1 && snap.app_actors == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("restarted");
    let second = ractor::registry::where_is(name).unwrap();
    assert_ne!(first.get_id(), second.get_id());

    // The count is a metric's counter: the Controller's successor counts on
    // from it (a drop would read as a counter reset).
    rig.supervisor.cast(SupervisorMsg::CrashController).unwrap();
    while !matches!(
        rig.supervisor.call(SupervisorMsg::Restarts, None).await,
        Ok(CallResult::Success(1))
    ) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(rig.observe().await.app_restarts, 1);
}

#[tokio::test(start_paused = true)]
async fn calls_queued_while_the_controller_restarts_are_answered_by_its_successor() {
    let rig = Rig::start("ctl-test-queue").await;
    rig.supervisor.cast(SupervisorMsg::CrashController).unwrap();
    // Sent while no Controller runs (its restart backs off 10 ms): queued, then
    // answered by the restarted Controller from the checkpoint. (A call sent to
    // the dying Controller itself is lost with it: the caller hears that the
    // Controller crashed.)
    tokio::time::sleep(Duration::from_millis(1)).await;
    let generations = rig.deploy(vec![app("a", "/a")]).await.unwrap();
    assert_eq!(generations, [1]);
    rig.wait("a", A::Running).await;
    let restarts = match rig
        .supervisor
        .call(SupervisorMsg::Restarts, None)
        .await
        .unwrap()
    {
        CallResult::Success(n) => n,
        other => panic!("{other:?}"),
    };
    assert_eq!(restarts, 1);
}

#[tokio::test(start_paused = true)]
async fn after_shutdown_mutating_calls_are_refused_and_observe_tells_the_truth() {
    let rig = Rig::start("ctl-test-shutdown").await;
    rig.deploy(vec![app("a", "/a")]).await.unwrap();
    rig.wait("a", A::Running).await;
    rig.ask(ControllerMsg::Shutdown).await;
    let err = rig.deploy(vec![app("b", "/b")]).await.unwrap_err();
    assert!(matches!(err, ServeError::Unavailable(_)), "{err}");
    let snap = rig.observe().await;
    assert_eq!(snap.apps, 1, "records stay: a later start brings them back");
}
