//! Model multiplexing (Ray's `@serve.multiplexed`) through the public API, on
//! paused time: LRU eviction with its unload hook, one load for concurrent
//! requests, routing to the replica that holds the model (learnt by
//! subscription), a failed load, loaded ids in the status details, and
//! batches split by model id.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use flotilla::{
    ApplicationSpec, BatchConfig, CallError, DeploymentHandle, DeploymentSpec, ModelIdError,
    MultiplexedDeployment, Registry, Serve, UserError,
};

/// What every load takes (virtual time).
const LOAD: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Log {
    /// `load m` / `unload m`, with the replica: `r3 load m`.
    events: Mutex<Vec<String>>,
    /// Batches as `(model, requests)`.
    batches: Mutex<Vec<(String, Vec<String>)>>,
}

impl Log {
    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    /// The events without the replica.
    fn plain(&self) -> Vec<String> {
        self.events()
            .iter()
            .map(|e| e.split_once(' ').unwrap().1.to_owned())
            .collect()
    }

    fn loads(&self) -> usize {
        self.plain()
            .iter()
            .filter(|e| e.starts_with("load"))
            .count()
    }
}

/// Models named by their id; loading an id starting with "bad" fails. A
/// request "hold" keeps its slot for 10 s.
struct Models {
    replica: u64,
    log: Arc<Log>,
}

impl MultiplexedDeployment for Models {
    type Request = String;
    /// (replica, "model <id>: <request>")
    type Response = (u64, String);
    type Model = String;
    const BATCHED: bool = true;

    async fn load_model(&self, model_id: &str) -> Result<String, UserError> {
        self.log
            .events
            .lock()
            .unwrap()
            .push(format!("r{} load {model_id}", self.replica));
        tokio::time::sleep(LOAD).await;
        if model_id.starts_with("bad") {
            return Err(UserError::new(format!("no weights for {model_id}")));
        }
        Ok(format!("model {model_id}"))
    }

    async fn unload_model(&self, model_id: &str, model: Arc<String>) {
        assert_eq!(*model, format!("model {model_id}"));
        self.log
            .events
            .lock()
            .unwrap()
            .push(format!("r{} unload {model_id}", self.replica));
    }

    async fn handle(&self, model: &String, request: String) -> Result<(u64, String), UserError> {
        if request == "hold" {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        Ok((self.replica, format!("{model}: {request}")))
    }

    async fn handle_batch(
        &self,
        model: &String,
        requests: Vec<String>,
    ) -> Result<Vec<(u64, String)>, UserError> {
        self.log
            .batches
            .lock()
            .unwrap()
            .push((model.clone(), requests.clone()));
        Ok(requests
            .into_iter()
            .map(|r| (self.replica, format!("{model}: {r}")))
            .collect())
    }
}

async fn start() -> (tempfile::TempDir, Arc<Log>, Serve) {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::default());
    let l = log.clone();
    let registry = Registry::new()
        .register_multiplexed("mx::Models", move |ctx| {
            let log = l.clone();
            async move {
                Ok(Models {
                    replica: ctx.replica.0,
                    log,
                })
            }
        })
        .unwrap();
    let serve = support::start_with(&dir, registry).await;
    (dir, log, serve)
}

fn app(replicas: u32, max_ongoing: u32, max_models: Option<u32>) -> ApplicationSpec {
    app_with(replicas, max_ongoing, max_models, None)
}

fn app_with(
    replicas: u32,
    max_ongoing: u32,
    max_models: Option<u32>,
    batching: Option<BatchConfig>,
) -> ApplicationSpec {
    ApplicationSpec::builder("mx")
        .deployment(
            DeploymentSpec::builder("models", "mx::Models")
                .replicas(replicas)
                .with_config(|c| {
                    let mut c = c
                        .with_max_ongoing_requests(max_ongoing)
                        .with_max_num_models_per_replica(max_models)
                        .with_batching(batching);
                    c.graceful_shutdown_wait_loop = Duration::from_millis(10);
                    c
                }),
        )
        .build()
        .unwrap()
}

async fn call(
    h: &DeploymentHandle,
    model: &str,
    request: &str,
) -> Result<(u64, String), CallError> {
    h.clone().with_model_id(model).unwrap().call(request).await
}

fn spawn_call(
    h: &DeploymentHandle,
    model: &str,
    request: &str,
) -> tokio::task::JoinHandle<Result<(u64, String), CallError>> {
    let h = h.clone().with_model_id(model).unwrap();
    let request = request.to_owned();
    tokio::spawn(async move { h.call(&request).await })
}

#[tokio::test(start_paused = true)]
async fn the_least_recently_used_model_is_unloaded_first_and_loaded_ids_show_in_the_details() {
    let (_dir, log, serve) = start().await;
    let h = serve.run(app(1, 8, Some(2))).await.unwrap();
    for m in ["m1", "m2", "m3"] {
        let (_, out) = call(&h, m, "hi").await.unwrap();
        assert_eq!(out, format!("model {m}: hi"));
    }
    assert_eq!(log.plain(), ["load m1", "load m2", "unload m1", "load m3"]);
    // A hit makes m2 the most recently used: m3 goes next.
    call(&h, "m2", "again").await.unwrap();
    call(&h, "m4", "hi").await.unwrap();
    assert_eq!(log.plain()[4..], ["unload m3", "load m4"]);
    // The replica's loaded ids, in the deployment's snapshot (its status
    // details) and on its endpoint.
    let snap = support::observe(&serve, "mx", "models").await;
    assert_eq!(snap.replicas[0].model_ids, ["m2", "m4"]);
    assert_eq!(h.replicas()[0].model_ids(), ["m2", "m4"]);
    let details = serve.deployment_details(Duration::from_secs(5)).await;
    let replica = &details[0].snapshot.as_ref().unwrap().replicas[0];
    assert_eq!(replica.model_ids, ["m2", "m4"]);
    // A stopping replica unloads what it holds.
    serve.delete_apps(["mx"], true).await.unwrap();
    assert!(support::poll_secs(5, async || log.plain().len() == 8).await);
    let mut tail = log.plain()[6..].to_vec();
    tail.sort();
    assert_eq!(tail, ["unload m2", "unload m4"]);
}

#[tokio::test(start_paused = true)]
async fn unlimited_models_and_a_lower_limit_set_in_place() {
    let (_dir, log, serve) = start().await;
    let h = serve.run(app(1, 8, None)).await.unwrap();
    for m in ["a", "b", "c", "d", "e"] {
        call(&h, m, "x").await.unwrap();
    }
    assert_eq!(h.replicas()[0].model_ids().len(), 5);
    assert!(!log.plain().iter().any(|e| e.starts_with("unload")));
    // A config-only change: the replica evicts down to the new limit at
    // once, least recently used first, and the next load makes room in it.
    serve.run(app(1, 8, Some(2))).await.unwrap();
    let replica = h.replicas()[0].clone();
    support::eventually("the lower limit", || replica.model_ids() == ["d", "e"]).await;
    call(&h, "f", "x").await.unwrap();
    assert_eq!(h.replicas()[0].model_ids(), ["e", "f"]);
    let mut unloaded: Vec<_> = log
        .plain()
        .into_iter()
        .filter(|e| e.starts_with("unload"))
        .collect();
    unloaded.sort();
    assert_eq!(unloaded, ["unload a", "unload b", "unload c", "unload d"]);
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_for_a_loading_model_wait_for_one_load() {
    let (_dir, log, serve) = start().await;
    let h = serve.run(app(1, 16, Some(3))).await.unwrap();
    let calls: Vec<_> = (0..10)
        .map(|i| spawn_call(&h, "big", &format!("q{i}")))
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        assert_eq!(c.await.unwrap().unwrap().1, format!("model big: q{i}"));
    }
    assert_eq!(log.plain(), ["load big"]);
}

#[tokio::test(start_paused = true)]
async fn requests_go_to_the_replica_that_has_the_model_learnt_by_subscription() {
    let (_dir, log, serve) = start().await;
    let h = serve.run(app(4, 2, Some(3))).await.unwrap();
    assert_eq!(h.replicas().len(), 4);
    let mut watches: Vec<_> = h
        .replicas()
        .iter()
        .map(|r| r.watch_models().unwrap())
        .collect();
    let (holder, _) = call(&h, "a", "first").await.unwrap();
    // The holder published it: its subscription changed, the others' did not.
    for (r, w) in h.replicas().iter().zip(&mut watches) {
        assert_eq!(w.has_changed().unwrap(), r.id().0 == holder, "{r:?}");
        assert_eq!(w.borrow_and_update().contains("a"), r.id().0 == holder);
    }
    // Every later request for "a" goes to the holder while it has room...
    for i in 0..20 {
        let (replica, _) = call(&h, "a", &format!("q{i}")).await.unwrap();
        assert_eq!(replica, holder);
    }
    assert_eq!(log.loads(), 1);
    // ...and elsewhere once it is full (max_ongoing_requests 2): power of two
    // choices among the rest, which loads the model there.
    let held: Vec<_> = (0..2).map(|_| spawn_call(&h, "a", "hold")).collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let holder_ep = h
        .replicas()
        .iter()
        .find(|r| r.id().0 == holder)
        .unwrap()
        .clone();
    assert_eq!(holder_ep.in_flight(), 2);
    let (other, _) = call(&h, "a", "overflow").await.unwrap();
    assert_ne!(other, holder);
    assert_eq!(log.loads(), 2);
    let snap = support::observe(&serve, "mx", "models").await;
    let holding: Vec<u64> = snap
        .replicas
        .iter()
        .filter(|r| r.model_ids.contains(&"a".to_owned()))
        .map(|r| r.id.0)
        .collect();
    assert_eq!(holding.len(), 2);
    assert!(holding.contains(&holder) && holding.contains(&other));
    for c in held {
        c.await.unwrap().unwrap();
    }
    // Another model is routed model-blind at first, then sticks where it loaded.
    let (b_holder, _) = call(&h, "b", "x").await.unwrap();
    for _ in 0..10 {
        assert_eq!(call(&h, "b", "x").await.unwrap().0, b_holder);
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_load_fails_its_requests_with_the_loaders_error_and_caches_nothing() {
    let (_dir, log, serve) = start().await;
    let h = serve.run(app(1, 16, Some(3))).await.unwrap();
    let calls: Vec<_> = (0..3).map(|_| spawn_call(&h, "bad-1", "x")).collect();
    for c in calls {
        match c.await.unwrap() {
            Err(CallError::ModelLoad { model_id, message }) => {
                assert_eq!(model_id, "bad-1");
                assert_eq!(message, "no weights for bad-1");
            }
            other => panic!("expected ModelLoad, got {other:?}"),
        }
    }
    assert_eq!(log.loads(), 1);
    assert!(h.replicas()[0].model_ids().is_empty());
    assert!(!h.replicas()[0].has_model("bad-1"));
    // Nothing cached: the next request tries again; the replica still serves.
    assert!(call(&h, "bad-1", "x").await.is_err());
    assert_eq!(log.loads(), 2);
    assert_eq!(call(&h, "good", "x").await.unwrap().1, "model good: x");
    // Requests without a model id fail as Ray's empty id does.
    let e = h.call::<_, (u64, String)>("x").await.unwrap_err();
    assert!(
        matches!(&e, CallError::ModelLoad { model_id, message }
            if model_id.is_empty() && message.contains("cannot be empty")),
        "{e}"
    );
    // Ids are checked on the handle.
    assert_eq!(
        h.clone().with_model_id("").unwrap_err(),
        ModelIdError::Empty
    );
    assert!(matches!(
        h.clone()
            .with_model_id("x".repeat(flotilla::MAX_MODEL_ID_LEN + 1)),
        Err(ModelIdError::TooLong { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_batch_of_a_multiplexed_deployment_is_split_by_model_id() {
    let (_dir, log, serve) = start().await;
    let h = serve
        .run(app_with(
            1,
            16,
            Some(3),
            Some(BatchConfig::new(8, Duration::from_millis(500))),
        ))
        .await
        .unwrap();
    // Load both models first, so the batch below forms in one go.
    call(&h, "a", "warm").await.unwrap();
    call(&h, "b", "warm").await.unwrap();
    log.batches.lock().unwrap().clear();
    let calls: Vec<_> = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("b", "b2")]
        .into_iter()
        .map(|(m, r)| spawn_call(&h, m, r))
        .collect();
    let outs: Vec<_> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap().1)
        .collect();
    assert_eq!(
        outs,
        ["model a: a1", "model b: b1", "model a: a2", "model b: b2"]
    );
    let mut batches = log.batches.lock().unwrap().clone();
    batches.sort();
    assert_eq!(
        batches,
        [
            ("model a".to_owned(), vec!["a1".to_owned(), "a2".to_owned()]),
            ("model b".to_owned(), vec!["b1".to_owned(), "b2".to_owned()]),
        ]
    );
}

/// Code that is not multiplexed.
struct Plain;

impl flotilla::Deployment for Plain {
    type Request = u32;
    type Response = u32;

    async fn handle(&self, x: u32) -> Result<u32, UserError> {
        Ok(x + 1)
    }
}

async fn build_plain(_args: flotilla::Args) -> Result<ApplicationSpec, UserError> {
    ApplicationSpec::builder("ignored")
        .deployment(DeploymentSpec::builder("plain", "mx::Plain"))
        .build()
        .map_err(|e| UserError::new(e.to_string()))
}

/// In Ray the model limit is `@serve.multiplexed`'s argument, so it exists
/// only on multiplexed code. A limit set on other code would bound nothing:
/// a deploy that sets it is refused and leaves no trace, and a config that
/// sets it ends its application DEPLOY_FAILED saying why, what ran running on.
#[tokio::test(start_paused = true)]
async fn a_model_limit_on_code_that_is_not_multiplexed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new()
        .register("mx::Plain", |_ctx| async { Ok(Plain) })
        .unwrap()
        .register_app("mx::plain_app", build_plain)
        .unwrap();
    let serve = support::start_with(&dir, registry).await;
    let plain = |max_models: Option<u32>| {
        ApplicationSpec::builder("p")
            .deployment(
                DeploymentSpec::builder("plain", "mx::Plain")
                    .with_config(|c| c.with_max_num_models_per_replica(max_models)),
            )
            .build()
            .unwrap()
    };
    for limit in [Some(5), None] {
        let e = serve.run(plain(limit)).await.unwrap_err();
        assert!(
            matches!(&e, flotilla::ServeError::NotMultiplexed { app, deployment, import_path }
                if app == "p" && deployment == "plain" && import_path == "mx::Plain"),
            "{e}"
        );
        assert!(e.to_string().contains("register_multiplexed"), "{e}");
        assert!(
            serve.status().is_empty(),
            "a refused deploy leaves no trace"
        );
    }

    let yaml = |extra: &str| {
        flotilla::ServeConfig::from_yaml(&format!(
            "applications:\n- name: p\n  import_path: mx::plain_app\n  route_prefix: null\n  \
             deployments:\n  - name: plain\n    num_replicas: 1\n{extra}"
        ))
        .unwrap()
    };
    serve.apply_config(yaml("")).await.unwrap();
    support::wait_status(&serve, "p", flotilla::ApplicationStatus::Running).await;
    let h = serve.app_handle("p").unwrap();
    serve
        .apply_config(yaml("    max_num_models_per_replica: 2\n"))
        .await
        .unwrap();
    support::wait_status(&serve, "p", flotilla::ApplicationStatus::DeployFailed).await;
    let message = serve.app_status("p").message;
    assert!(
        message.contains("max_num_models_per_replica") && message.contains("not multiplexed"),
        "{message}"
    );
    assert_eq!(h.call::<u32, u32>(&5).await, Ok(6));
}
