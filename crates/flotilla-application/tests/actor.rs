//! The ApplicationActor on its own (with real DeploymentActors and replicas
//! below it, no Controller above): its own decisions, heard through its status
//! channel and its reporter, on paused time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use flotilla_application::{AppArgs, AppEvent, AppMsg, ApplicationActor};
use flotilla_cluster::LocalCluster;
use flotilla_core::{
    ApiType, AppName, AppRecord, ApplicationSpec, ApplicationStatus as A, ApplicationStatusInfo,
    DeploymentName, DeploymentSpec, DeploymentStatus, Faults, StatusTrigger, actor_names,
};
use flotilla_deployment::DeploymentMsg;
use flotilla_replica::{Deployment, Directory, Registry, UserError};
use flotilla_supervision::RestartPolicy;
use ractor::{Actor, ActorRef, ActorStatus};
use tokio::sync::{mpsc, watch};

struct Echo;

impl Deployment for Echo {
    type Request = String;
    type Response = String;
    async fn handle(&self, r: String) -> Result<String, UserError> {
        Ok(r)
    }
}

fn record(generation: u64, deployments: &[&str], deleting: bool) -> AppRecord {
    let mut b = ApplicationSpec::builder("app");
    for d in deployments {
        b = b.deployment(DeploymentSpec::builder(*d, "test::Echo"));
    }
    AppRecord {
        spec: b.build().unwrap(),
        generation,
        deleting,
        api_type: ApiType::Imperative,
        config: None,
        deployed_at: None,
    }
}

struct Rig {
    ns: String,
    args: AppArgs,
    status: watch::Receiver<ApplicationStatusInfo>,
    events: mpsc::UnboundedReceiver<AppEvent>,
}

impl Rig {
    fn new(ns: &str, record: AppRecord, restart: RestartPolicy) -> Rig {
        let registry = Registry::new()
            .register("test::Echo", |_ctx| async { Ok(Echo) })
            .unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        let status = watch::Sender::new(ApplicationStatusInfo::not_started("app"));
        let rx = status.subscribe();
        Rig {
            ns: ns.to_owned(),
            args: AppArgs {
                ns: ns.to_owned(),
                record,
                registry,
                directory: Directory::new(),
                cluster: Arc::new(LocalCluster::new()),
                status,
                reporter: Arc::new(move |e| {
                    let _ = tx.send(e);
                }),
                restart,
                faults: Faults::new(),
                autoscaled: BTreeMap::new(),
                build_failure: None,
            },
            status: rx,
            events,
        }
    }

    async fn spawn(&self) -> ActorRef<AppMsg> {
        self.spawn_watched().await.0
    }

    /// The actor, and a handle that ends when it has stopped.
    async fn spawn_watched(&self) -> (ActorRef<AppMsg>, tokio::task::JoinHandle<()>) {
        let name = actor_names::application(&self.ns, &AppName::new("app").unwrap());
        Actor::spawn(Some(name), ApplicationActor, self.args.clone())
            .await
            .unwrap()
    }

    async fn wait(
        &mut self,
        pred: impl Fn(&ApplicationStatusInfo) -> bool,
    ) -> ApplicationStatusInfo {
        let rx = &mut self.status;
        tokio::time::timeout(Duration::from_secs(600), async {
            loop {
                {
                    let s = rx.borrow_and_update();
                    if pred(&s) {
                        return s.clone();
                    }
                }
                rx.changed().await.unwrap();
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out: {:?}", self.status.borrow()))
    }

    fn deployment(&self, name: &str) -> Option<ActorRef<DeploymentMsg>> {
        ActorRef::where_is(actor_names::deployment(
            &self.ns,
            &AppName::new("app").unwrap(),
            &DeploymentName::new(name).unwrap(),
        ))
    }
}

fn running(generation: u64) -> impl Fn(&ApplicationStatusInfo) -> bool {
    move |s| s.observed_generation == generation && s.status == A::Running
}

#[tokio::test(start_paused = true)]
async fn it_starts_a_deployment_actor_per_target_deployment_and_runs() {
    let mut rig = Rig::new(
        "app-test-run",
        record(1, &["a", "b"], false),
        RestartPolicy::default(),
    );
    let _app = rig.spawn().await;
    let s = rig.wait(running(1)).await;
    assert_eq!(s.deployments.len(), 2);
    assert!(rig.deployment("a").is_some() && rig.deployment("b").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_deployment_dropped_from_the_target_is_deleted_and_a_deletion_is_reported() {
    let mut rig = Rig::new(
        "app-test-drop",
        record(1, &["a", "b"], false),
        RestartPolicy::default(),
    );
    let (app, stopped) = rig.spawn_watched().await;
    rig.wait(running(1)).await;
    app.cast(AppMsg::SetTarget {
        record: Box::new(record(2, &["a"], false)),
        decisions: BTreeMap::new(),
        build_failure: None,
    })
    .unwrap();
    let s = rig.wait(running(2)).await;
    assert_eq!(
        s.deployments.keys().map(|d| d.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(rig.deployment("b").is_none(), "b was deleted");
    app.cast(AppMsg::SetTarget {
        record: Box::new(record(3, &["a"], true)),
        decisions: BTreeMap::new(),
        build_failure: None,
    })
    .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(600), rig.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(event, AppEvent::Deleted { generation: 3, .. }),
        "{event:?}"
    );
    tokio::time::timeout(Duration::from_secs(60), stopped)
        .await
        .expect("it stops once deleted")
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_crashed_deployment_actor_is_restarted_and_unhealthy_until_it_reports() {
    let mut rig = Rig::new(
        "app-test-crash",
        record(1, &["a"], false),
        RestartPolicy::default(),
    );
    let _app = rig.spawn().await;
    rig.wait(running(1)).await;
    let first = rig.deployment("a").unwrap();
    first.kill();
    let s = rig.wait(|s| s.status == A::Unhealthy).await;
    assert_eq!(
        s.deployments.values().next().unwrap().trigger,
        StatusTrigger::InternalError
    );
    rig.wait(running(1)).await;
    let second = rig.deployment("a").unwrap();
    assert_ne!(first.get_id(), second.get_id(), "a new DeploymentActor");
}

#[tokio::test(start_paused = true)]
async fn deployments_that_crash_too_often_escalate() {
    let policy = RestartPolicy {
        max_restarts: 1,
        window: Duration::from_secs(600),
        ..RestartPolicy::default()
    };
    let mut rig = Rig::new("app-test-escalate", record(1, &["a"], false), policy);
    let (app, mut stopped) = rig.spawn_watched().await;
    rig.wait(running(1)).await;
    rig.deployment("a").unwrap().kill();
    rig.wait(running(1)).await;
    // One crash is within the policy: the deployment was restarted, and the
    // application actor lives on.
    assert!(
        tokio::time::timeout(Duration::from_secs(10), &mut stopped)
            .await
            .is_err(),
        "one crash does not escalate"
    );
    assert_eq!(app.get_status(), ActorStatus::Running);
    rig.deployment("a").unwrap().kill();
    tokio::time::timeout(Duration::from_secs(60), stopped)
        .await
        .expect("the application actor fails (escalates) on the second crash")
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_build_stands_over_the_target_until_cleared() {
    let mut rig = Rig::new(
        "app-test-build",
        record(1, &["a"], false),
        RestartPolicy::default(),
    );
    let app = rig.spawn().await;
    rig.wait(running(1)).await;
    let target = |generation, failure: Option<&str>| AppMsg::SetTarget {
        record: Box::new(record(generation, &["a"], false)),
        decisions: BTreeMap::new(),
        build_failure: failure.map(str::to_owned),
    };
    // The same target, told again with a failed build over it.
    app.cast(target(1, Some("the builder broke"))).unwrap();
    let s = rig.wait(|s| s.status == A::DeployFailed).await;
    assert_eq!(s.message, "the builder broke");
    // A new target voids it.
    app.cast(target(2, None)).unwrap();
    rig.wait(running(2)).await;
    app.cast(target(2, Some("again"))).unwrap();
    rig.wait(|s| s.status == A::DeployFailed).await;
    // Cleared: the application's own status holds again.
    app.cast(target(2, None)).unwrap();
    rig.wait(running(2)).await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_application_actor_adopts_the_living_deployment_actors() {
    let mut rig = Rig::new(
        "app-test-adopt",
        record(1, &["a", "b"], false),
        RestartPolicy::default(),
    );
    let first = rig.spawn().await;
    rig.wait(running(1)).await;
    let (a, b) = (rig.deployment("a").unwrap(), rig.deployment("b").unwrap());
    first.kill();
    first.drain_and_wait(None).await.ok();
    let _second = rig.spawn().await;
    rig.wait(running(1)).await;
    assert_eq!(rig.deployment("a").unwrap().get_id(), a.get_id());
    assert_eq!(rig.deployment("b").unwrap().get_id(), b.get_id());
    let s = rig.status.borrow().clone();
    assert!(
        s.deployments
            .values()
            .all(|d| d.status == DeploymentStatus::Healthy)
    );
}

#[tokio::test(start_paused = true)]
async fn a_restart_stops_the_replicas_of_a_dropped_deployment_whose_actor_was_down() {
    let mut rig = Rig::new(
        "app-test-orphan",
        record(1, &["a", "b"], false),
        RestartPolicy::default(),
    );
    let first = rig.spawn().await;
    rig.wait(running(1)).await;
    let (app, b) = (
        AppName::new("app").unwrap(),
        DeploymentName::new("b").unwrap(),
    );
    let b_replicas = actor_names::replica_group(&rig.ns, &app, &b);
    assert_eq!(flotilla_supervision::groups::members(&b_replicas).len(), 1);
    // b's DeploymentActor dies (its replica lives on), and before it is
    // restarted the ApplicationActor dies too; its successor's target no
    // longer has b.
    rig.deployment("b").unwrap().kill();
    first.kill();
    first.drain_and_wait(None).await.ok();
    rig.args.record = record(2, &["a"], false);
    let _second = rig.spawn().await;
    rig.wait(running(2)).await;
    tokio::time::timeout(Duration::from_secs(600), async {
        while !flotilla_supervision::groups::members(&b_replicas).is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("b's replica was stopped, not left running");
    assert!(
        rig.args.directory.get(&app, &b).is_none(),
        "b's route is gone"
    );
    assert!(rig.deployment("b").is_none());
}
