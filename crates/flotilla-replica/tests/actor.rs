//! The ReplicaActor on its own, driven by its messages and heard through its
//! reporter, on paused time: what it reports when it starts, fails to start,
//! fails its health checks, reconfigures and drains.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Duration,
};

use flotilla_core::{AppName, Args, DeploymentName, DeploymentSpec};
use flotilla_replica::{
    CallError, Deployment, Directory, MultiplexedDeployment, OnExit, Registry, ReplicaActor,
    ReplicaEvent, ReplicaMsg, ReplicaPhase, UserError,
};
use ractor::{Actor, ActorRef, rpc::CallResult};
use tokio::sync::mpsc;

/// What the test's user code does.
#[derive(Default)]
struct Knobs {
    fail_start: AtomicBool,
    unhealthy: AtomicBool,
    fail_reconfigure: AtomicBool,
    reconfigured: AtomicU32,
}

struct Sleeper(Arc<Knobs>);

impl Deployment for Sleeper {
    type Request = u64;
    type Response = u64;

    async fn handle(&self, ms: u64) -> Result<u64, UserError> {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(ms)
    }

    async fn reconfigure(&self, config: Args) -> Result<(), UserError> {
        self.0.reconfigured.fetch_add(1, Ordering::SeqCst);
        if config.decode::<String>().is_ok_and(|c| c == "slow") {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        if self.0.fail_reconfigure.load(Ordering::SeqCst) {
            return Err(UserError::new("bad config"));
        }
        Ok(())
    }

    async fn check_health(&self) -> Result<(), UserError> {
        if self.0.unhealthy.load(Ordering::SeqCst) {
            return Err(UserError::new("sick"));
        }
        Ok(())
    }
}

/// Its loader never returns; says when it is dropped.
struct Stuck(Arc<AtomicBool>);

impl Drop for Stuck {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl MultiplexedDeployment for Stuck {
    type Request = ();
    type Response = String;
    type Model = String;
    async fn load_model(&self, _: &str) -> Result<String, UserError> {
        std::future::pending().await
    }
    async fn handle(&self, model: &String, _: ()) -> Result<String, UserError> {
        Ok(model.clone())
    }
}

/// A replica of the multiplexed deployment `registry` registers as
/// `test::Sleeper`, Ready and published on its route: the actor, its end, the
/// route and a handle that asks for model `m`.
async fn multiplexed_replica(
    ns: &str,
    registry: Registry,
    on_exit: OnExit,
) -> (
    ActorRef<ReplicaMsg>,
    tokio::task::JoinHandle<()>,
    Arc<flotilla_replica::DeploymentRoute>,
    flotilla_replica::DeploymentHandle,
) {
    let (tx, mut events) = mpsc::unbounded_channel();
    let directory = Directory::new();
    let args = support::args(ns, spec(None), registry, &directory, tx, on_exit);
    let (app, deployment) = (args.app.clone(), args.deployment.clone());
    let (actor, done) = Actor::spawn(None, ReplicaActor, args).await.unwrap();
    let Some(ReplicaEvent::Ready { endpoint, .. }) = events.recv().await else {
        panic!("not ready");
    };
    let route = directory.route(&app, &deployment);
    route.publish(vec![endpoint]);
    let h = directory
        .handle(&app, &deployment)
        .with_model_id("m")
        .unwrap();
    (actor, done, route, h)
}

/// A loader that never returns does not outlive its replica, stopped (once
/// the graceful shutdown timeout has passed) or killed: the load is
/// cancelled, its caller hears so, and the deployment's value (with whatever
/// it holds, a GPU's memory) is dropped.
#[tokio::test(start_paused = true)]
async fn a_load_that_never_returns_is_cancelled_when_its_replica_goes() {
    for kill in [false, true] {
        let dropped = Arc::new(AtomicBool::new(false));
        let d = dropped.clone();
        let registry = Registry::new()
            .register_multiplexed("test::Sleeper", move |_ctx| {
                let d = d.clone();
                async move { Ok(Stuck(d)) }
            })
            .unwrap();
        let ns = format!("replica-test-stuck-load-{kill}");
        let (actor, done, route, h) = multiplexed_replica(&ns, registry, OnExit::none()).await;
        let call = tokio::spawn(async move { h.call::<_, String>(&()).await });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!call.is_finished(), "the load returned after all");
        if kill {
            actor.kill();
        } else {
            actor.cast(ReplicaMsg::Stop { graceful: false }).unwrap();
        }
        done.await.unwrap();
        route.publish(vec![]);
        let outcome = call.await.unwrap();
        assert!(outcome.is_err(), "kill: {kill}: {outcome:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            dropped.load(Ordering::SeqCst),
            "kill: {kill}: the deployment outlived its replica"
        );
    }
}

struct Rig {
    knobs: Arc<Knobs>,
    actor: ActorRef<ReplicaMsg>,
    /// Ends when the actor has stopped.
    stopped: tokio::task::JoinHandle<()>,
    events: mpsc::UnboundedReceiver<ReplicaEvent>,
    directory: Directory,
    app: AppName,
    deployment: DeploymentName,
}

fn spec(user_config: Option<&str>) -> Arc<DeploymentSpec> {
    Arc::new(
        DeploymentSpec::builder("d", "test::Sleeper")
            .with_config(|c| {
                let c = c.with_graceful_shutdown(Duration::from_secs(1), Duration::from_secs(5));
                match user_config {
                    Some(u) => c.with_user_config(Args::encode(u).unwrap()),
                    None => c,
                }
            })
            .build()
            .unwrap(),
    )
}

/// Replica 1 of deployment `d` of application `a`, reporting to `tx`.
impl Rig {
    async fn start(ns: &str, fail_start: bool) -> Rig {
        Rig::start_with(ns, fail_start, spec(None)).await
    }

    async fn start_with(ns: &str, fail_start: bool, spec: Arc<DeploymentSpec>) -> Rig {
        let knobs = Arc::new(Knobs::default());
        knobs.fail_start.store(fail_start, Ordering::SeqCst);
        let k = knobs.clone();
        let registry = Registry::new()
            .register("test::Sleeper", move |_ctx| {
                let k = k.clone();
                async move {
                    if k.fail_start.load(Ordering::SeqCst) {
                        return Err(UserError::new("no luck"));
                    }
                    Ok(Sleeper(k))
                }
            })
            .unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        let directory = Directory::new();
        let args = support::args(ns, spec, registry, &directory, tx, OnExit::none());
        let (app, deployment) = (args.app.clone(), args.deployment.clone());
        let (actor, stopped) = Actor::spawn(None, ReplicaActor, args).await.unwrap();
        Rig {
            knobs,
            actor,
            stopped,
            events,
            directory,
            app,
            deployment,
        }
    }

    async fn event(&mut self) -> ReplicaEvent {
        tokio::time::timeout(Duration::from_secs(600), self.events.recv())
            .await
            .expect("an event in time")
            .expect("the reporter lives")
    }

    async fn phase(&self) -> ReplicaPhase {
        match self.actor.call(ReplicaMsg::Observe, None).await.unwrap() {
            CallResult::Success(s) => s.phase,
            other => panic!("no snapshot: {other:?}"),
        }
    }

    /// Publish the replica's endpoint on its route, as its DeploymentActor would.
    fn serve(&self, event: &ReplicaEvent) {
        let ReplicaEvent::Ready { endpoint, .. } = event else {
            panic!("not ready: {event:?}");
        };
        self.directory
            .route(&self.app, &self.deployment)
            .publish(vec![endpoint.clone()]);
    }
}

#[tokio::test(start_paused = true)]
async fn it_reports_ready_with_an_endpoint_that_serves() {
    let mut rig = Rig::start("replica-test-ready", false).await;
    let ready = rig.event().await;
    rig.serve(&ready);
    assert_eq!(rig.phase().await, ReplicaPhase::Running);
    let h = rig.directory.handle(&rig.app, &rig.deployment);
    assert_eq!(h.call::<_, u64>(&7u64).await.unwrap(), 7);
}

#[tokio::test(start_paused = true)]
async fn a_failed_start_is_reported_and_waits_to_be_stopped() {
    let mut rig = Rig::start("replica-test-fail", true).await;
    match rig.event().await {
        ReplicaEvent::StartFailed { error } => assert!(error.contains("no luck"), "{error}"),
        other => panic!("expected StartFailed, got {other:?}"),
    }
    // It does not stop itself: its owner decides, and a restarted owner can
    // still learn why from its snapshot.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let snap = match rig.actor.call(ReplicaMsg::Observe, None).await.unwrap() {
        CallResult::Success(s) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!(snap.phase, ReplicaPhase::StartFailed);
    assert!(snap.condemned.unwrap().contains("no luck"));
    assert!(snap.endpoint.is_none());
    rig.actor.cast(ReplicaMsg::Stop { graceful: true }).unwrap();
    tokio::time::timeout(Duration::from_secs(60), rig.stopped)
        .await
        .expect("a failed replica stops when told to")
        .unwrap();
}

/// A spec that does not validate (one from another process: every entry
/// point in this one validates its own) is refused, naming the field: the
/// start fails, or the reconfigure does and the replica serves on with its
/// config. A zero health-check period would make its timer panic.
#[tokio::test(start_paused = true)]
async fn a_spec_that_does_not_validate_fails_the_start_or_the_reconfigure() {
    let invalid = || {
        let mut s = (*spec(None)).clone();
        s.config.health_check_period = Duration::ZERO;
        Arc::new(s)
    };
    let mut rig = Rig::start_with("replica-test-invalid", false, invalid()).await;
    match rig.event().await {
        ReplicaEvent::StartFailed { error } => {
            assert!(error.contains("health_check_period"), "{error}");
        }
        other => panic!("expected StartFailed, got {other:?}"),
    }
    assert_eq!(rig.phase().await, ReplicaPhase::StartFailed);

    let mut rig = Rig::start("replica-test-invalid-reconf", false).await;
    let ready = rig.event().await;
    rig.serve(&ready);
    rig.actor.cast(ReplicaMsg::Reconfigure(invalid())).unwrap();
    match rig.event().await {
        ReplicaEvent::ReconfigureFailed { error } => {
            assert!(error.contains("health_check_period"), "{error}");
        }
        other => panic!("expected ReconfigureFailed, got {other:?}"),
    }
    assert_eq!(rig.phase().await, ReplicaPhase::Running);
    let h = rig.directory.handle(&rig.app, &rig.deployment);
    assert_eq!(h.call::<_, u64>(&7u64).await.unwrap(), 7);
}

#[tokio::test(start_paused = true)]
async fn three_failed_health_checks_in_a_row_make_it_unhealthy() {
    let mut rig = Rig::start("replica-test-health", false).await;
    let _ready = rig.event().await;
    rig.knobs.unhealthy.store(true, Ordering::SeqCst);
    let at = tokio::time::Instant::now();
    match rig.event().await {
        ReplicaEvent::Unhealthy { reason } => {
            assert!(reason.contains("3 consecutive health checks"), "{reason}");
            assert!(reason.contains("sick"), "{reason}");
        }
        other => panic!("expected Unhealthy, got {other:?}"),
    }
    // Three periods of 10 s.
    assert!(
        at.elapsed() >= Duration::from_secs(30),
        "{:?}",
        at.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_user_config_change_reconfigures_in_place_and_a_failing_one_is_reported() {
    let mut rig = Rig::start("replica-test-reconf", false).await;
    let ready = rig.event().await;
    let ReplicaEvent::Ready { version: v1, .. } = &ready else {
        panic!("{ready:?}");
    };
    let two = spec(Some("two"));
    rig.actor
        .cast(ReplicaMsg::Reconfigure(two.clone()))
        .unwrap();
    match rig.event().await {
        ReplicaEvent::Reconfigured { version } => {
            assert_eq!(version, two.version());
            assert_ne!(&version, v1);
        }
        other => panic!("expected Reconfigured, got {other:?}"),
    }
    assert_eq!(rig.knobs.reconfigured.load(Ordering::SeqCst), 1);
    rig.knobs.fail_reconfigure.store(true, Ordering::SeqCst);
    rig.actor
        .cast(ReplicaMsg::Reconfigure(spec(Some("three"))))
        .unwrap();
    match rig.event().await {
        ReplicaEvent::ReconfigureFailed { error } => {
            assert!(error.contains("bad config"), "{error}");
        }
        other => panic!("expected ReconfigureFailed, got {other:?}"),
    }
}

/// Two reconfigures in flight (a restarted deployment actor sends the
/// target again): the later one's result stands. The earlier one, ending
/// after it, applied its older config over it.
#[tokio::test(start_paused = true)]
async fn a_reconfigure_superseded_by_a_later_one_does_not_undo_it() {
    let mut rig = Rig::start("replica-test-reconf-order", false).await;
    let _ready = rig.event().await;
    let (slow, two) = (spec(Some("slow")), spec(Some("two")));
    rig.actor.cast(ReplicaMsg::Reconfigure(slow)).unwrap();
    rig.actor
        .cast(ReplicaMsg::Reconfigure(two.clone()))
        .unwrap();
    match rig.event().await {
        ReplicaEvent::Reconfigured { version } => assert_eq!(version, two.version()),
        other => panic!("expected Reconfigured, got {other:?}"),
    }
    // The slow one ends 10 s later: it changes nothing, and says nothing.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(rig.knobs.reconfigured.load(Ordering::SeqCst), 2);
    assert!(rig.events.try_recv().is_err(), "nothing more reported");
    assert_eq!(rig.phase().await, ReplicaPhase::Running);
}

#[tokio::test(start_paused = true)]
async fn a_graceful_stop_drains_and_the_timeout_kills_what_is_left() {
    let mut rig = Rig::start("replica-test-drain", false).await;
    let ready = rig.event().await;
    rig.serve(&ready);
    let h = rig.directory.handle(&rig.app, &rig.deployment);
    let quick = tokio::spawn({
        let h = h.clone();
        async move { h.call::<_, u64>(&1_500u64).await }
    });
    let slow = tokio::spawn(async move { h.call::<_, u64>(&60_000u64).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    rig.actor.cast(ReplicaMsg::Stop { graceful: true }).unwrap();
    // The quick one finishes inside the drain; the slow one is cut at the
    // graceful timeout (5 s).
    assert_eq!(quick.await.unwrap().unwrap(), 1_500);
    let cut = slow.await.unwrap().unwrap_err();
    assert!(matches!(cut, CallError::Killed { .. }), "{cut}");
}

/// Logs its loads and unloads; an unload takes a second.
struct Models(Arc<std::sync::Mutex<Vec<String>>>);

impl MultiplexedDeployment for Models {
    type Request = ();
    type Response = String;
    type Model = String;
    async fn load_model(&self, id: &str) -> Result<String, UserError> {
        self.0.lock().unwrap().push(format!("load {id}"));
        Ok(id.to_owned())
    }
    async fn unload_model(&self, id: &str, _: Arc<String>) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.0.lock().unwrap().push(format!("unload {id}"));
    }
    async fn handle(&self, model: &String, _: ()) -> Result<String, UserError> {
        Ok(model.clone())
    }
}

/// A stopped or killed replica's models are unloaded, and a stopped one's
/// before it counts as gone (its place, a GPU's memory, is given back then).
#[tokio::test(start_paused = true)]
async fn a_replica_unloads_its_models_before_it_is_gone_stopped_or_killed() {
    for kill in [false, true] {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let l = log.clone();
        let registry = Registry::new()
            .register_multiplexed("test::Sleeper", move |_ctx| {
                let l = l.clone();
                async move { Ok(Models(l)) }
            })
            .unwrap();
        let l = log.clone();
        let on_exit = OnExit::new(move || l.lock().unwrap().push("exit".to_owned()));
        let ns = format!("replica-test-unload-{kill}");
        let (actor, done, _route, h) = multiplexed_replica(&ns, registry, on_exit).await;
        assert_eq!(h.call::<_, String>(&()).await.unwrap(), "m");
        if kill {
            actor.kill();
        } else {
            actor.cast(ReplicaMsg::Stop { graceful: false }).unwrap();
        }
        done.await.unwrap();
        let want: &[&str] = if kill {
            // No post_stop to wait in: the unload goes on after the exit.
            &["load m", "exit"]
        } else {
            &["load m", "unload m", "exit"]
        };
        assert_eq!(*log.lock().unwrap(), want, "kill: {kill}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            log.lock().unwrap().contains(&"unload m".to_owned()),
            "kill: {kill}"
        );
    }
}
