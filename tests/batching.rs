//! Request batching (Ray's `@serve.batch`) through the public API, on paused
//! time: batches form by size and by deadline, `max_concurrent_batches`
//! bounds the batches running at once, the settings change in place,
//! a failure or a wrong-length answer fails the whole batch, a caller that
//! gives up leaves its batch, and `max_ongoing_requests` and autoscaling see
//! the requests waiting for a batch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use flotilla::{
    ApplicationSpec, AutoscalingConfig, BatchConfig, CallError, Deployment, DeploymentHandle,
    DeploymentSpec, Registry, ReplicaState, Serve, UserError,
};
use tokio::time::Instant;

/// A request that fails its batch.
const FAIL: u32 = 999;
/// A request that makes the batch answer one response too few.
const SHORT: u32 = 998;
/// What each batch costs (virtual time).
const COST: Duration = Duration::from_millis(10);

/// Records every batch it is handed, with its virtual start time.
#[derive(Default)]
struct Log {
    batches: Mutex<Vec<(Instant, Vec<u32>)>>,
    singles: Mutex<Vec<u32>>,
}

impl Log {
    fn batches(&self) -> Vec<Vec<u32>> {
        self.batches
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }

    fn sizes(&self) -> Vec<usize> {
        self.batches().iter().map(Vec::len).collect()
    }
}

struct Batched(Arc<Log>);

impl Deployment for Batched {
    type Request = u32;
    type Response = u32;
    const BATCHED: bool = true;

    async fn handle(&self, x: u32) -> Result<u32, UserError> {
        self.0.singles.lock().unwrap().push(x);
        Ok(x + 1000)
    }

    async fn handle_batch(&self, xs: Vec<u32>) -> Result<Vec<u32>, UserError> {
        self.0
            .batches
            .lock()
            .unwrap()
            .push((Instant::now(), xs.clone()));
        tokio::time::sleep(COST).await;
        if xs.contains(&FAIL) {
            return Err(UserError::new("the batch failed"));
        }
        if xs.contains(&SHORT) {
            return Ok(xs[1..].iter().map(|x| x + 1000).collect());
        }
        Ok(xs.into_iter().map(|x| x + 1000).collect())
    }
}

async fn start() -> (tempfile::TempDir, Arc<Log>, Serve) {
    start_registering(|log| {
        Registry::new()
            .register("batch::Batched", move |_ctx| {
                let l = log.clone();
                async move { Ok(Batched(l)) }
            })
            .unwrap()
    })
    .await
}

/// A Serve with the registry `code` makes, its code sharing one log.
async fn start_registering(
    code: impl FnOnce(Arc<Log>) -> Registry,
) -> (tempfile::TempDir, Arc<Log>, Serve) {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::default());
    let serve = support::start_with(&dir, code(log.clone())).await;
    (dir, log, serve)
}

fn app(replicas: u32, max_ongoing: u32, batching: Option<BatchConfig>) -> ApplicationSpec {
    ApplicationSpec::builder("b")
        .deployment(
            DeploymentSpec::builder("batched", "batch::Batched")
                .replicas(replicas)
                .with_config(|c| {
                    c.with_max_ongoing_requests(max_ongoing)
                        .with_batching(batching)
                }),
        )
        .build()
        .unwrap()
}

fn call(h: &DeploymentHandle, x: u32) -> tokio::task::JoinHandle<Result<u32, CallError>> {
    let h = h.clone();
    tokio::spawn(async move { h.call(&x).await })
}

/// Let spawned calls reach their replica (no virtual time passes).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_goes_as_soon_as_max_batch_size_requests_wait() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(4, Duration::from_secs(60))),
        ))
        .await
        .unwrap();
    let t0 = Instant::now();
    let calls: Vec<_> = (0..8).map(|x| call(&h, x)).collect();
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap().unwrap());
    }
    // Each caller got its own response, by position.
    assert_eq!(out, (1000..1008).collect::<Vec<_>>());
    assert_eq!(log.sizes(), [4, 4]);
    let mut all: Vec<u32> = log.batches().concat();
    all.sort_unstable();
    assert_eq!(all, (0..8).collect::<Vec<_>>());
    // Full batches never waited for the 60 s deadline.
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(log.singles.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_batch_that_does_not_fill_goes_at_its_deadline_from_its_first_request() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(10, Duration::from_millis(50))),
        ))
        .await
        .unwrap();
    let t0 = Instant::now();
    let first = call(&h, 1);
    tokio::time::sleep(Duration::from_millis(30)).await;
    // A later arrival joins the batch; the deadline is not extended.
    let second = call(&h, 2);
    assert_eq!(first.await.unwrap().unwrap(), 1001);
    assert_eq!(second.await.unwrap().unwrap(), 1002);
    let batches = log.batches.lock().unwrap().clone();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].1, [1, 2]);
    let started = batches[0].0 - t0;
    assert!(
        started >= Duration::from_millis(50) && started < Duration::from_millis(52),
        "{started:?}"
    );
    // A zero timeout hands over whatever waits, at once.
    serve
        .run(app(1, 16, Some(BatchConfig::new(10, Duration::ZERO))))
        .await
        .unwrap();
    let t1 = Instant::now();
    assert_eq!(call(&h, 3).await.unwrap().unwrap(), 1003);
    assert!(
        t1.elapsed() < Duration::from_millis(15),
        "{:?}",
        t1.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn batch_settings_change_in_place_from_the_next_batch() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(2, Duration::from_secs(60))),
        ))
        .await
        .unwrap();
    let before = support::observe(&serve, "b", "batched").await;
    let ids: Vec<_> = before.replicas.iter().map(|r| r.id).collect();
    let calls: Vec<_> = (0..4).map(|x| call(&h, x)).collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(log.sizes(), [2, 2]);
    log.batches.lock().unwrap().clear();
    // A config-only change: the same replica takes the new settings.
    serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(4, Duration::from_millis(20))),
        ))
        .await
        .unwrap();
    let after = support::wait_snapshot(&serve, "b", "batched", |s| {
        s.count(ReplicaState::Running) == 1 && s.version != before.version
    })
    .await;
    assert_eq!(after.version.code, before.version.code);
    assert_eq!(after.replicas.iter().map(|r| r.id).collect::<Vec<_>>(), ids);
    let t0 = Instant::now();
    let calls: Vec<_> = (10..16).map(|x| call(&h, x)).collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    // Four at once, then the other two at the new 20 ms deadline.
    assert_eq!(log.sizes(), [4, 2]);
    assert!(
        t0.elapsed() < Duration::from_millis(60),
        "{:?}",
        t0.elapsed()
    );
    // Turned off in place: each request on its own, through `handle`.
    serve.run(app(1, 16, None)).await.unwrap();
    assert_eq!(call(&h, 20).await.unwrap().unwrap(), 1020);
    assert_eq!(*log.singles.lock().unwrap(), [20]);
    assert_eq!(
        support::observe(&serve, "b", "batched")
            .await
            .replicas
            .iter()
            .map(|r| r.id)
            .collect::<Vec<_>>(),
        ids
    );
}

/// Batching turned off in place while a batch forms: no request can join
/// that batch any more (they are served one by one), so it goes at once
/// instead of waiting out its old timeout.
#[tokio::test(start_paused = true)]
async fn a_forming_batch_goes_at_once_when_batching_is_turned_off_in_place() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(4, Duration::from_secs(600))),
        ))
        .await
        .unwrap();
    let forming = call(&h, 1);
    settle().await;
    serve.run(app(1, 16, None)).await.unwrap();
    let t0 = Instant::now();
    assert_eq!(call(&h, 2).await.unwrap(), Ok(1002));
    assert_eq!(forming.await.unwrap(), Ok(1001));
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "the batch was held {:?} after batching was turned off",
        t0.elapsed()
    );
    assert_eq!(log.batches(), [vec![1]], "it went as the batch it was");
    assert_eq!(*log.singles.lock().unwrap(), [2]);
}

#[tokio::test(start_paused = true)]
async fn max_concurrent_batches_from_the_config_bounds_the_batches_running_at_once() {
    let (_dir, log, serve) = start().await;
    let batching = BatchConfig::new(2, Duration::from_secs(1)).with_max_concurrent_batches(2);
    let h = serve.run(app(1, 16, Some(batching))).await.unwrap();
    let t0 = Instant::now();
    let calls: Vec<_> = (0..8).map(|x| call(&h, x)).collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(log.sizes(), [2, 2, 2, 2]);
    // Two batches at a time, each taking COST: two start at once, two after.
    let starts: Vec<Duration> = log
        .batches
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _)| *t - t0)
        .collect();
    assert_eq!(starts, [Duration::ZERO, Duration::ZERO, COST, COST]);
}

#[tokio::test(start_paused = true)]
async fn a_failing_batch_fails_every_request_of_it_with_the_error() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(3, Duration::from_secs(1))),
        ))
        .await
        .unwrap();
    let calls: Vec<_> = [1, FAIL, 2].into_iter().map(|x| call(&h, x)).collect();
    for c in calls {
        assert_eq!(
            c.await.unwrap().unwrap_err(),
            CallError::User("the batch failed".into())
        );
    }
    // The next batch is served.
    let calls: Vec<_> = [3, 4, 5].into_iter().map(|x| call(&h, x)).collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(log.sizes(), [3, 3]);
}

#[tokio::test(start_paused = true)]
async fn a_wrong_number_of_responses_fails_the_batch_naming_the_deployment() {
    let (_dir, _log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(3, Duration::from_secs(1))),
        ))
        .await
        .unwrap();
    let calls: Vec<_> = [1, SHORT, 2].into_iter().map(|x| call(&h, x)).collect();
    for c in calls {
        let e = c.await.unwrap().unwrap_err();
        match &e {
            CallError::BatchSize {
                app,
                deployment,
                requests,
                responses,
            } => {
                assert_eq!(
                    (app.as_str(), deployment.as_str(), *requests, *responses),
                    ("b", "batched", 3, 2)
                );
            }
            other => panic!("expected BatchSize, got {other}"),
        }
        let shown = e.to_string();
        assert!(
            shown.contains("deployment 'batched' of application 'b'"),
            "{shown}"
        );
        assert!(
            shown.contains("the input list has length 3 but the returned list has length 2"),
            "{shown}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_gives_up_is_removed_from_a_batch_that_has_not_started() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(5, Duration::from_millis(100))),
        ))
        .await
        .unwrap();
    // One times out, one is dropped, one stays.
    let impatient = {
        let h = h.clone().with_timeout(Duration::from_millis(20));
        tokio::spawn(async move { h.call::<_, u32>(&1u32).await })
    };
    let dropped = call(&h, 2);
    let stays = call(&h, 3);
    tokio::time::sleep(Duration::from_millis(10)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    assert!(matches!(
        impatient.await.unwrap(),
        Err(CallError::Timeout { .. })
    ));
    // Both left before the batch started: they freed their slots at once.
    assert_eq!(h.replicas()[0].in_flight(), 1);
    assert_eq!(stays.await.unwrap().unwrap(), 1003);
    assert_eq!(log.batches(), [vec![3]]);
    // A caller that leaves while its batch runs only loses its response.
    let leaves = call(&h, 4);
    let other = call(&h, 5);
    tokio::time::sleep(Duration::from_millis(105)).await;
    leaves.abort();
    assert_eq!(other.await.unwrap().unwrap(), 1005);
    assert_eq!(log.batches()[1], [4, 5]);
}

#[tokio::test(start_paused = true)]
async fn max_ongoing_requests_bounds_batched_requests_and_waiting_ones_are_in_flight() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            3,
            Some(BatchConfig::new(10, Duration::from_millis(100))),
        ))
        .await
        .unwrap();
    let calls: Vec<_> = (0..5).map(|x| call(&h, x)).collect();
    settle().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Three hold the replica's slots while they wait for their batch; two
    // wait in the handle's queue.
    assert_eq!(h.replicas()[0].in_flight(), 3);
    assert_eq!(h.route().queued(), 2);
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(log.sizes(), [3, 2]);
}

#[tokio::test(start_paused = true)]
async fn autoscaling_counts_requests_waiting_for_a_batch_as_load() {
    let (_dir, _log, serve) = start().await;
    let config = AutoscalingConfig {
        min_replicas: 1,
        initial_replicas: Some(1),
        max_replicas: 4,
        target_ongoing_requests: 1.0,
        upscale_delay: Duration::from_secs(5),
        look_back_period: Duration::from_secs(5),
        ..Default::default()
    };
    let spec = ApplicationSpec::builder("b")
        .deployment(
            DeploymentSpec::builder("batched", "batch::Batched").with_config(|c| {
                c.with_autoscaling(config)
                    .with_max_ongoing_requests(100)
                    // Requests wait a long time for a batch that never fills.
                    .with_batching(BatchConfig::new(1_000, Duration::from_secs(3_600)))
            }),
        )
        .build()
        .unwrap();
    let h = serve.run(spec).await.unwrap();
    let calls: Vec<_> = (0..4).map(|x| call(&h, x)).collect();
    support::wait_snapshot(&serve, "b", "batched", |s| s.target.replicas == 4).await;
    assert!(
        calls.iter().all(|c| !c.is_finished()),
        "the load was requests still waiting for their batch"
    );
    for c in calls {
        c.abort();
    }
}

/// A replica that stops with a batch forming (its application deleted) sends
/// that batch at once: its callers are answered, and the stop does not wait
/// out the batch's timeout (longer here than the graceful shutdown's, which
/// would kill the replica with the batch unsent).
#[tokio::test(start_paused = true)]
async fn a_stopping_replica_sends_its_forming_batch_without_waiting_out_its_timeout() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app(
            1,
            16,
            Some(BatchConfig::new(8, Duration::from_secs(600))),
        ))
        .await
        .unwrap();
    let calls: Vec<_> = (1..=2).map(|x| call(&h, x)).collect();
    settle().await;
    assert!(log.batches().is_empty(), "still forming");
    let t0 = Instant::now();
    serve.delete_apps(["b"], true).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(log.batches(), [vec![1, 2]]);
}

/// Code without `BATCHED`: it serves one request at a time, and fails those
/// naming a caller's secret.
struct Plain(Arc<Log>);

impl Deployment for Plain {
    type Request = u32;
    type Response = u32;

    async fn handle(&self, x: u32) -> Result<u32, UserError> {
        self.0.singles.lock().unwrap().push(x);
        if x == FAIL {
            return Err(UserError::new("the secret of caller 999"));
        }
        Ok(x + 1000)
    }
}

/// Builds an application of one `Plain` deployment, "plain".
async fn build_plain(_args: flotilla::Args) -> Result<ApplicationSpec, UserError> {
    ApplicationSpec::builder("ignored")
        .deployment(DeploymentSpec::builder("plain", "batch::Plain"))
        .build()
        .map_err(|e| UserError::new(e.to_string()))
}

async fn start_plain() -> (tempfile::TempDir, Arc<Log>, Serve) {
    start_registering(|log| {
        Registry::new()
            .register("batch::Plain", move |_ctx| {
                let l = log.clone();
                async move { Ok(Plain(l)) }
            })
            .unwrap()
            .register_app("batch::plain_app", build_plain)
            .unwrap()
    })
    .await
}

fn plain_app(batching: Option<BatchConfig>) -> ApplicationSpec {
    ApplicationSpec::builder("p")
        .deployment(
            DeploymentSpec::builder("plain", "batch::Plain")
                .with_config(|c| c.with_batching(batching)),
        )
        .build()
        .unwrap()
}

/// Three concurrent calls to `Plain` code, the middle one failing: the
/// others are served, never seeing its error.
async fn each_caller_gets_its_own_answer(h: &DeploymentHandle) {
    let calls: Vec<_> = [1, FAIL, 2].into_iter().map(|x| call(h, x)).collect();
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    assert_eq!(out[0], Ok(1001));
    assert!(matches!(&out[1], Err(CallError::User(m)) if m.contains("999")));
    assert_eq!(out[2], Ok(1002), "a caller never sees another's error");
}

/// As Ray refused `max_batch_size` on a method not marked
/// `@serve.accept_batch`: batching code that does not accept batches would
/// hand each batch to the default `handle_batch`, where one caller's error
/// fails every request of its batch and its text reaches their callers.
#[tokio::test(start_paused = true)]
async fn batching_code_that_does_not_accept_batches_is_refused_and_changes_nothing() {
    let (_dir, log, serve) = start_plain().await;
    let batching = Some(BatchConfig::new(4, Duration::from_millis(50)));
    let e = serve.run(plain_app(batching)).await.unwrap_err();
    assert!(
        matches!(&e, flotilla::ServeError::NotBatched { app, deployment, import_path }
            if app == "p" && deployment == "plain" && import_path == "batch::Plain"),
        "{e}"
    );
    assert!(e.to_string().contains("BATCHED"), "{e}");
    assert!(
        serve.status().is_empty(),
        "a refused deploy leaves no trace"
    );

    // Running unbatched, a change that turns batching on is refused too: the
    // application stays at its generation, serving one request at a time.
    let h = serve.run(plain_app(None)).await.unwrap();
    let generation = serve.app_status("p").observed_generation;
    let e = serve.run(plain_app(batching)).await.unwrap_err();
    assert!(matches!(e, flotilla::ServeError::NotBatched { .. }), "{e}");
    assert_eq!(serve.app_status("p").observed_generation, generation);
    each_caller_gets_its_own_answer(&h).await;
    assert_eq!(log.singles.lock().unwrap().len(), 3);
}

/// A config that adds batching settings to a deployment whose code does not
/// accept batches: its application ends DEPLOY_FAILED saying why, and what
/// ran keeps running unbatched.
#[tokio::test(start_paused = true)]
async fn a_config_that_batches_code_that_does_not_accept_batches_fails_that_application() {
    let (_dir, _log, serve) = start_plain().await;
    let yaml = |extra: &str| {
        flotilla::ServeConfig::from_yaml(&format!(
            "applications:\n- name: p\n  import_path: batch::plain_app\n  route_prefix: null\n  \
             deployments:\n  - name: plain\n{extra}"
        ))
        .unwrap()
    };
    serve
        .apply_config(yaml("    num_replicas: 1\n"))
        .await
        .unwrap();
    support::wait_status(&serve, "p", flotilla::ApplicationStatus::Running).await;
    let h = serve.app_handle("p").unwrap();
    serve
        .apply_config(yaml("    num_replicas: 1\n    max_batch_size: 4\n"))
        .await
        .unwrap();
    support::wait_status(&serve, "p", flotilla::ApplicationStatus::DeployFailed).await;
    let s = serve.app_status("p");
    // The build's refusal (the deployment keeps its old target), not the
    // deployment's own check of what it runs (below).
    assert!(
        s.message.contains("does not accept batches")
            && s.message.contains("remove the batching settings"),
        "{}",
        s.message
    );
    assert_eq!(h.call::<u32, u32>(&5).await, Ok(1005));
}

/// A checkpoint recovered by a program whose code under the same path no
/// longer accepts batches (DESIGN.md, "Bad input": recovered records naming
/// code that is not there end DEPLOY_FAILED naming it): the deployment says
/// so, and its replicas serve their requests one by one, never through the
/// default `handle_batch`.
#[tokio::test(start_paused = true)]
async fn a_recovered_batching_deployment_whose_code_no_longer_batches_serves_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::default());
    let code = |batched: bool| {
        let l = log.clone();
        let registry = Registry::new();
        if batched {
            registry.register("batch::Code", move |_ctx| {
                let l = l.clone();
                async move { Ok(Batched(l)) }
            })
        } else {
            registry.register("batch::Code", move |_ctx| {
                let l = l.clone();
                async move { Ok(Plain(l)) }
            })
        }
        .unwrap()
    };
    let spec = ApplicationSpec::builder("r")
        .deployment(
            DeploymentSpec::builder("code", "batch::Code")
                .with_config(|c| c.with_batching(BatchConfig::new(4, Duration::from_millis(50)))),
        )
        .build()
        .unwrap();
    let serve = support::start_with(&dir, code(true)).await;
    serve.run(spec).await.unwrap();
    serve.shutdown().await.unwrap();
    drop(serve);

    let serve = support::start_with(&dir, code(false)).await;
    let s = support::wait_status(&serve, "r", flotilla::ApplicationStatus::DeployFailed).await;
    assert!(
        s.message.contains("does not accept batches") && s.message.contains("one by one"),
        "{}",
        s.message
    );
    let h = serve.app_handle("r").unwrap();
    each_caller_gets_its_own_answer(&h).await;
    assert!(log.batches().is_empty());
}
