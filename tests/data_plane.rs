//! The data plane through handles: limits, back-pressure, queueing, timeouts,
//! cancellation, routing, errors and composition, on paused tokio time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use flotilla::{
    ApplicationSpec, CallError, Deployment, DeploymentHandle, DeploymentSpec, Registry, Serve,
    UserError,
};

/// Sleeps the requested milliseconds, then answers with its replica id; tracks
/// the most requests it ever ran at once.
struct Sleeper {
    id: u64,
    now: AtomicU32,
    peak: Arc<AtomicU32>,
}

impl Deployment for Sleeper {
    type Request = u64;
    type Response = u64;
    async fn handle(&self, ms: u64) -> Result<u64, UserError> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        Ok(self.id)
    }
}

/// A Serve of sleepers on a store in a new directory, and the peak they share.
async fn start_sleepers() -> (tempfile::TempDir, Arc<AtomicU32>, Serve) {
    let dir = tempfile::tempdir().unwrap();
    let peak = Arc::new(AtomicU32::new(0));
    let p = peak.clone();
    let registry = Registry::new()
        .register("dp::Sleeper", move |ctx| {
            let peak = p.clone();
            async move {
                let delay: u64 = ctx.args()?;
                tokio::time::sleep(Duration::from_millis(delay)).await;
                Ok(Sleeper {
                    id: ctx.replica.0,
                    now: AtomicU32::new(0),
                    peak,
                })
            }
        })
        .unwrap();
    let serve = support::start_with(&dir, registry).await;
    (dir, peak, serve)
}

fn sleeper(
    name: &str,
    replicas: u32,
    max_ongoing: u32,
    max_queued: Option<u32>,
) -> ApplicationSpec {
    ApplicationSpec::builder(name)
        .deployment(
            DeploymentSpec::builder("sleeper", "dp::Sleeper")
                .init_args(&0u64)
                .replicas(replicas)
                .with_config(|c| {
                    c.with_max_ongoing_requests(max_ongoing)
                        .with_max_queued_requests(max_queued)
                }),
        )
        .build()
        .unwrap()
}

fn spawn_call(h: &DeploymentHandle, ms: u64) -> tokio::task::JoinHandle<Result<u64, CallError>> {
    let h = h.clone();
    tokio::spawn(async move { h.call(&ms).await })
}

#[tokio::test(start_paused = true)]
async fn back_pressure_rejects_at_once_beyond_max_queued_naming_the_deployment() {
    let (_dir, peak, serve) = start_sleepers().await;
    let h = serve.run(sleeper("bp", 1, 1, Some(1))).await.unwrap();
    let running = spawn_call(&h, 1_000);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let queued = spawn_call(&h, 1);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let err = h.call::<_, u64>(&1u64).await.unwrap_err();
    match &err {
        CallError::BackPressure {
            app,
            deployment,
            queued,
        } => {
            assert_eq!(
                (app.as_str(), deployment.as_str(), *queued),
                ("bp", "sleeper", 1)
            );
        }
        other => panic!("expected back-pressure, got {other}"),
    }
    assert!(err.to_string().contains("'sleeper'"));
    running.await.unwrap().unwrap();
    queued.await.unwrap().unwrap();
    assert_eq!(peak.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_replica_never_runs_more_than_max_ongoing_requests() {
    let (_dir, peak, serve) = start_sleepers().await;
    let h = serve.run(sleeper("lim", 2, 2, None)).await.unwrap();
    let calls: Vec<_> = (0..20).map(|_| spawn_call(&h, 100)).collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), 2);
    assert!(h.replicas().iter().all(|r| r.in_flight() == 0));
}

#[tokio::test(start_paused = true)]
async fn power_of_two_choices_spreads_load_over_every_replica() {
    let (_dir, _, serve) = start_sleepers().await;
    let h = serve.run(sleeper("p2c", 4, 100, None)).await.unwrap();
    let calls: Vec<_> = (0..40).map(|_| spawn_call(&h, 1_000)).collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let loads: Vec<u32> = h.replicas().iter().map(|r| r.in_flight()).collect();
    assert_eq!(loads.iter().sum::<u32>(), 40);
    // The less loaded of two samples always wins, so no replica runs away.
    assert!(loads.iter().all(|l| (7..=13).contains(l)), "{loads:?}");
    for c in calls {
        c.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_caller_releases_its_slot_and_a_timeout_fails_cleanly() {
    let (_dir, _, serve) = start_sleepers().await;
    let h = serve.run(sleeper("drop", 1, 1, None)).await.unwrap();
    let abandoned = spawn_call(&h, 60_000);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(h.replicas()[0].in_flight(), 1);
    abandoned.abort();
    let _ = abandoned.await;
    assert_eq!(h.replicas()[0].in_flight(), 0, "no leaked in-flight count");
    assert!(h.call::<_, u64>(&1u64).await.is_ok());

    let t = h.clone().with_timeout(Duration::from_millis(100));
    let err = t.call::<_, u64>(&10_000u64).await.unwrap_err();
    assert!(matches!(err, CallError::Timeout { .. }), "{err}");
    assert_eq!(h.replicas()[0].in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn requests_wait_in_the_queue_for_the_first_replica() {
    let (_dir, _, serve) = start_sleepers().await;
    let mut slow = sleeper("q", 1, 5, None);
    slow.deployments[0].init_args = flotilla::Args::encode(&5_000u64).unwrap();
    let h = serve
        .run_many(vec![slow], support::no_wait())
        .await
        .unwrap()
        .remove(0);
    assert!(h.replicas().is_empty());
    let started = tokio::time::Instant::now();
    h.call::<_, u64>(&1u64).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn user_errors_return_once_and_composition_calls_through_handles() {
    let (_dir, sw, serve) = support::start_fresh().await;
    let composed = ApplicationSpec::builder("c")
        .deployment(DeploymentSpec::builder("front", "test::Probe").init_args(
            &support::ProbeArgs {
                tag: "front".into(),
                downstream: Some("back".into()),
                ..Default::default()
            },
        ))
        .deployment(DeploymentSpec::builder("back", "test::Probe").init_args(&support::tag("back")))
        .ingress("front")
        .build()
        .unwrap();
    let h = serve.run(composed).await.unwrap();
    assert_eq!(h.call::<_, String>("x").await.unwrap(), "front:x|back:x");
    let before = sw.handled.load(Ordering::SeqCst);
    let err = h.call::<_, String>("fail").await.unwrap_err();
    assert_eq!(err, CallError::User("asked to fail".into()));
    assert_eq!(
        sw.handled.load(Ordering::SeqCst),
        before + 1,
        "not re-executed"
    );
    let bad = h.call::<_, String>(&42u32).await.unwrap_err();
    assert!(matches!(bad, CallError::BadRequest(_)), "{bad}");
}

#[tokio::test(start_paused = true)]
async fn a_handle_prefers_replicas_on_its_own_node_while_they_have_room() {
    let dir = tempfile::tempdir().unwrap();
    let peak = Arc::new(AtomicU32::new(0));
    let p = peak.clone();
    let registry = Registry::new()
        .register("dp::Sleeper", move |ctx| {
            let peak = p.clone();
            async move {
                Ok(Sleeper {
                    id: ctx.replica.0,
                    now: AtomicU32::new(0),
                    peak,
                })
            }
        })
        .unwrap();
    let node = |n: &str| flotilla::NodeSpec::new(n, flotilla::Resources::default().with_cpus(8.0));
    let cluster = Arc::new(flotilla::StaticCluster::new([node("n1"), node("n2")]));
    let serve = Serve::start(support::options(&dir, registry).cluster(cluster))
        .await
        .unwrap();
    let h = serve.run(sleeper("local", 2, 1, None)).await.unwrap();
    let replicas = h.replicas();
    let nodes: Vec<&str> = replicas.iter().map(|r| r.node()).collect();
    assert_ne!(nodes[0], nodes[1], "spread over both nodes");
    let here = replicas[0].clone();
    let local = h.clone().prefer_node(here.node());
    for _ in 0..20 {
        assert_eq!(local.call::<_, u64>(&1u64).await.unwrap(), here.id().0);
    }
    // The local replica is full: the next request goes to the other node.
    let busy = {
        let l = local.clone();
        tokio::spawn(async move { l.call::<_, u64>(&10_000u64).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        local.call::<_, u64>(&1u64).await.unwrap(),
        replicas[1].id().0
    );
    assert_eq!(busy.await.unwrap().unwrap(), here.id().0);
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_never_lands_on_a_replica_that_began_stopping() {
    let (_dir, _, serve) = start_sleepers().await;
    let h = serve.run(sleeper("stop", 2, 1, None)).await.unwrap();
    let ids: Vec<u64> = h.replicas().iter().map(|r| r.id().0).collect();
    let long: Vec<_> = (0..2).map(|_| spawn_call(&h, 3_000)).collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let queued = spawn_call(&h, 1);
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Scale down: the newest replica stops; it finishes its request but takes no more.
    serve
        .run_many(vec![sleeper("stop", 1, 1, None)], support::no_wait())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let survivor = h.replicas()[0].id().0;
    assert_eq!(h.replicas().len(), 1);
    for c in long {
        assert!(
            ids.contains(&c.await.unwrap().unwrap()),
            "in-flight requests finished"
        );
    }
    assert_eq!(queued.await.unwrap().unwrap(), survivor);
}

#[tokio::test(start_paused = true)]
async fn queued_requests_run_oldest_first_while_newcomers_keep_arriving() {
    let (_dir, _, serve) = start_sleepers().await;
    let h = serve.run(sleeper("fifo", 1, 1, None)).await.unwrap();
    // One slot, a request every millisecond, each holding it for 3: the queue
    // grows, and a slot frees just as the next request arrives. Requests must
    // still run in the order they were made (Ray serves its pending requests
    // oldest first), so with one slot they finish in that order.
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut calls = Vec::new();
    for i in 0..30u32 {
        let (h, finished) = (h.clone(), finished.clone());
        calls.push(tokio::spawn(async move {
            h.call::<_, u64>(&3u64).await.unwrap();
            finished.lock().unwrap().push(i);
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for c in calls {
        c.await.unwrap();
    }
    let order = finished.lock().unwrap().clone();
    assert_eq!(order, (0..30).collect::<Vec<_>>());
}

/// A replica whose constructor took a handle to a deployment its
/// application does not have, and called through it.
struct Typo;

impl Deployment for Typo {
    type Request = u32;
    type Response = u32;

    async fn handle(&self, x: u32) -> Result<u32, UserError> {
        Ok(x)
    }
}

/// A handle to a deployment the application never had waits for it to
/// come; once the application is deleted it never can, so its callers fail
/// with `NotFound` (they waited for ever, and its route stayed in the
/// directory for the life of the process, one per deleted application).
#[tokio::test(start_paused = true)]
async fn a_handle_to_a_deployment_the_application_never_had_ends_with_the_application() {
    let dir = tempfile::tempdir().unwrap();
    type Outcome = Arc<std::sync::Mutex<Option<Result<u32, CallError>>>>;
    let outcome: Outcome = Arc::default();
    let o = outcome.clone();
    let registry = Registry::new()
        .register("dp::Typo", move |ctx| {
            let o = o.clone();
            async move {
                let h = ctx.handle("no_such_deployment")?;
                tokio::spawn(async move {
                    let r = h.call::<u32, u32>(&1).await;
                    *o.lock().unwrap() = Some(r);
                });
                Ok(Typo)
            }
        })
        .unwrap();
    let serve = support::start_with(&dir, registry).await;
    let app = ApplicationSpec::builder("typo")
        .deployment(DeploymentSpec::builder("front", "dp::Typo"))
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        outcome.lock().unwrap().is_none(),
        "it waits while the application lives"
    );
    serve.delete_apps(&["typo"], true).await.unwrap();
    support::eventually("the call through the stray handle ended", || {
        outcome.lock().unwrap().is_some()
    })
    .await;
    let ended = outcome.lock().unwrap().take().unwrap();
    assert!(
        matches!(ended, Err(CallError::NotFound { .. })),
        "{ended:?}"
    );
}

/// A call awaited on a thread without a tokio runtime (a synchronous
/// caller's `futures::executor::block_on`) runs on the instance's runtime:
/// user code there may use timers and I/O. It ran in the calling thread,
/// where the code's first timer panicked ("no reactor running"), and the
/// panic replaced a healthy replica.
#[tokio::test(start_paused = true)]
async fn a_call_from_a_thread_without_a_runtime_runs_and_replaces_nothing() {
    let (_dir, _, serve) = start_sleepers().await;
    let h = serve.run(sleeper("sync", 1, 1, None)).await.unwrap();
    let id = h.replicas()[0].id();
    let caller = h.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(futures::executor::block_on(
            caller.call::<_, u64>(&1_000u64),
        ));
    });
    assert_eq!(rx.await.unwrap().unwrap(), id.0);
    // With a timeout too (the timer is the instance runtime's).
    let caller = h.clone().with_timeout(Duration::from_millis(100));
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(futures::executor::block_on(
            caller.call::<_, u64>(&1_000u64),
        ));
    });
    let e = rx.await.unwrap().unwrap_err();
    assert!(matches!(e, CallError::Timeout { .. }), "{e}");
    assert_eq!(h.replicas()[0].id(), id, "the replica was not replaced");
    assert_eq!(h.replicas()[0].in_flight(), 0);
}
