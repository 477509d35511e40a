//! The ApplicationActor on its own, for what only its internal messages can
//! set up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use flotilla_cluster::LocalCluster;
use flotilla_core::{
    ApiType, AppRecord, AppStatusInputs, ApplicationSpec, ApplicationStatus, ApplicationStatusInfo,
    DeploymentName, DeploymentSpec, DeploymentStatus, DeploymentStatusInfo, FaultPoint, Faults,
    StatusTrigger, actor_names,
};
use flotilla_deployment::{DeploymentEvent, DeploymentMsg};
use flotilla_replica::{Deployment, Directory, Registry, UserError};
use flotilla_supervision::RestartPolicy;
use ractor::{Actor, ActorRef};
use tokio::sync::watch;

use super::{AppArgs, ApplicationActor};
use crate::{
    AppMsg,
    messages::{Internal, InternalMsg},
};

struct Nop;

impl Deployment for Nop {
    type Request = u8;
    type Response = u8;
    async fn handle(&self, x: u8) -> Result<u8, UserError> {
        Ok(x)
    }
}

/// Wait until the published status is `want`.
async fn until(rx: &mut watch::Receiver<ApplicationStatusInfo>, want: ApplicationStatus) {
    while rx.borrow_and_update().status != want {
        rx.changed().await.unwrap();
    }
}

/// An ApplicationActor of one deployment "d" in namespace `ns`, whose crashed
/// children wait a minute before their restart, RUNNING at generation 1.
async fn running_app(
    ns: &str,
    faults: Faults,
) -> (
    ActorRef<AppMsg>,
    watch::Receiver<ApplicationStatusInfo>,
    AppRecord,
) {
    let registry = Registry::new()
        .register("t::Nop", |_ctx| async { Ok(Nop) })
        .unwrap();
    let spec = ApplicationSpec::builder("a")
        .deployment(DeploymentSpec::builder("d", "t::Nop"))
        .build()
        .unwrap();
    let record = AppRecord {
        spec,
        generation: 1,
        deleting: false,
        api_type: ApiType::Imperative,
        config: None,
        deployed_at: None,
    };
    let accepted = ApplicationStatusInfo::derive(AppStatusInputs {
        record: Some(&record),
        reported: &BTreeMap::new(),
        build_failure: None,
    });
    let (status, mut rx) = watch::channel(accepted);
    let args = AppArgs {
        ns: ns.into(),
        record: record.clone(),
        registry,
        directory: Directory::new(),
        cluster: Arc::new(LocalCluster::new()),
        status,
        reporter: Arc::new(|_| {}),
        // A long backoff: the crashed actor stays down while the test looks.
        restart: RestartPolicy {
            first_backoff: Duration::from_secs(60),
            max_backoff: Duration::from_secs(60),
            ..RestartPolicy::default()
        },
        faults,
        autoscaled: BTreeMap::new(),
        build_failure: None,
    };
    let name = actor_names::application(ns, &record.spec.name);
    let (app, _) = Actor::spawn(Some(name), ApplicationActor, args)
        .await
        .unwrap();
    until(&mut rx, ApplicationStatus::Running).await;
    (app, rx, record)
}

/// ractor handles a child's exit before the messages queued ahead of it, so
/// the last report of a DeploymentActor that crashed right after sending it
/// comes after the crash. It must not undo the "actor crashed" status while
/// the actor waits out its restart backoff (the application showed RUNNING).
#[tokio::test(start_paused = true)]
async fn a_report_sent_before_its_deployment_crashed_does_not_hide_the_crash() {
    let ns = "app-actor-test";
    let (app, mut rx, record) = running_app(ns, Faults::new()).await;

    let d = DeploymentName::new("d").unwrap();
    let dep: ActorRef<DeploymentMsg> =
        ActorRef::where_is(actor_names::deployment(ns, &record.spec.name, &d)).unwrap();
    dep.kill();
    until(&mut rx, ApplicationStatus::Unhealthy).await;
    // Its last report, as if queued before the crash.
    let healthy = DeploymentStatusInfo {
        status: DeploymentStatus::Healthy,
        trigger: StatusTrigger::ConfigUpdateCompleted,
        message: String::new(),
    };
    let stale = DeploymentEvent::Status {
        name: d,
        generation: 1,
        status: healthy,
    };
    app.cast(AppMsg::Internal(Internal(InternalMsg::Deployment(stale))))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now = rx.borrow().clone();
    assert_eq!(now.status, ApplicationStatus::Unhealthy, "{now:?}");
    app.stop(None);
}

/// A DeploymentActor that crashes taking a new target, before it reported on
/// it, is UNHEALTHY over that target while it waits out its backoff (Ray's
/// INTERNAL_ERROR, from any state), not silently DEPLOYING.
#[tokio::test(start_paused = true)]
async fn a_deployment_crashing_on_a_new_target_before_its_report_is_unhealthy() {
    let faults = Faults::new();
    let (app, mut rx, record) = running_app("app-actor-test-new-target", faults.clone()).await;
    faults.arm(FaultPoint::DeploymentReconcile, 1);
    app.cast(AppMsg::SetTarget {
        record: Box::new(AppRecord {
            generation: 2,
            ..record
        }),
        decisions: BTreeMap::new(),
        build_failure: None,
    })
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        until(&mut rx, ApplicationStatus::Unhealthy),
    )
    .await
    .expect("UNHEALTHY during the backoff");
    let now = rx.borrow().clone();
    let d = &now.deployments[&DeploymentName::new("d").unwrap()];
    assert!(d.message.contains("actor crashed"), "{d:?}");
    app.stop(None);
}
