//! Streaming calls through handles (`DeploymentHandle::call_stream`): items
//! arrive as they are produced, the replica's slot is held until the stream ends
//! or is dropped, dropping cancels the handler, errors end the stream, a
//! streaming deployment can forward another's stream, and a stream answered
//! at once never wakes its own task. Paused tokio time.

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
    ApplicationSpec, CallError, Deployment, DeploymentHandle, DeploymentSpec, Registry, UserError,
};
use futures::{Stream, StreamExt, stream};
use tokio::sync::Notify;

/// Counts its handlers that were dropped before they finished.
struct DropGuard {
    finished: bool,
    dropped_early: Arc<AtomicU32>,
}

impl DropGuard {
    /// The handler ran to its end.
    fn done(mut self) {
        self.finished = true;
    }
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.dropped_early.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Streams `n` tokens of the request, one per `gate` notification when the
/// request starts with "gated", else one per virtual millisecond; "fail" fails
/// after the first token; `downstream` forwards another deployment's stream.
struct Tokens {
    gate: Arc<Notify>,
    dropped_early: Arc<AtomicU32>,
    downstream: Option<DeploymentHandle>,
}

impl Deployment for Tokens {
    type Request = String;
    type Response = String;

    async fn handle(&self, request: String) -> Result<String, UserError> {
        Ok(format!("whole:{request}"))
    }

    fn handle_stream(
        &self,
        request: String,
    ) -> impl Stream<Item = Result<String, UserError>> + Send + '_ {
        let gated = request.starts_with("gated");
        let fail = request == "fail";
        let forward = self.downstream.clone();
        stream::unfold(
            (
                0u32,
                DropGuard {
                    finished: false,
                    dropped_early: self.dropped_early.clone(),
                },
                forward.map(|h| h.call_stream::<_, String>(&request)),
            ),
            move |(i, guard, mut inner)| async move {
                if let Some(s) = inner.as_mut() {
                    return match s.next().await {
                        Some(item) => Some((
                            item.map(|t| format!("fwd:{t}"))
                                .map_err(|e| UserError::new(e.to_string())),
                            (i + 1, guard, inner),
                        )),
                        None => {
                            guard.done();
                            None
                        }
                    };
                }
                if i == 3 {
                    guard.done();
                    return None;
                }
                if fail && i == 1 {
                    // The error ends the stream: the caller stops polling it.
                    return Some((Err(UserError::new("token 1 failed")), (3, guard, None)));
                }
                if gated {
                    self.gate.notified().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Some((Ok(format!("t{i}")), (i + 1, guard, None)))
            },
        )
    }
}

/// Answers its request doubled; does not stream.
struct Plain;

impl Deployment for Plain {
    type Request = u32;
    type Response = u32;
    async fn handle(&self, n: u32) -> Result<u32, UserError> {
        Ok(n * 2)
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    serve: flotilla::Serve,
    gate: Arc<Notify>,
    dropped_early: Arc<AtomicU32>,
}

async fn start() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Notify::new());
    let dropped_early = Arc::new(AtomicU32::new(0));
    let (g, d) = (gate.clone(), dropped_early.clone());
    let registry = Registry::new()
        .register("st::Tokens", move |ctx| {
            let (gate, dropped_early) = (g.clone(), d.clone());
            async move {
                let downstream: Option<String> = ctx.args()?;
                let downstream = match downstream {
                    Some(d) => Some(ctx.handle(&d)?),
                    None => None,
                };
                Ok(Tokens {
                    gate,
                    dropped_early,
                    downstream,
                })
            }
        })
        .unwrap()
        .register("st::Plain", |_ctx| async { Ok(Plain) })
        .unwrap();
    let serve = support::start_with(&dir, registry).await;
    Fixture {
        _dir: dir,
        serve,
        gate,
        dropped_early,
    }
}

fn tokens_app(name: &str, max_ongoing: u32) -> ApplicationSpec {
    ApplicationSpec::builder(name)
        .deployment(
            DeploymentSpec::builder("tokens", "st::Tokens")
                .init_args(&None::<String>)
                .with_config(|c| c.with_max_ongoing_requests(max_ongoing)),
        )
        .build()
        .unwrap()
}

/// An application of one `st::Plain` deployment (it does not stream).
fn plain_app() -> ApplicationSpec {
    ApplicationSpec::builder("plain")
        .deployment(DeploymentSpec::builder("plain", "st::Plain"))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_deployment_that_does_not_stream_answers_with_one_item() {
    let f = start().await;
    let h = f.serve.run(plain_app()).await.unwrap();
    let items: Vec<Result<u32, CallError>> = h.call_stream(&21u32).collect().await;
    assert_eq!(items, vec![Ok(42)]);
    let bad: Vec<Result<u32, CallError>> = h.call_stream("not a number").collect().await;
    assert!(
        matches!(bad.as_slice(), [Err(CallError::BadRequest(_))]),
        "{bad:?}"
    );
    assert_eq!(h.replicas()[0].stats().succeeded(), 1);
    assert_eq!(
        h.replicas()[0]
            .stats()
            .failed(flotilla::ErrorKind::BadRequest),
        1
    );
}

/// Counts the wakes of the task that polls a stream.
#[derive(Default)]
struct Wakes(AtomicU32);

impl futures::task::ArcWake for Wakes {
    fn wake_by_ref(me: &Arc<Self>) {
        me.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_answered_at_once_never_wakes_its_own_task() {
    // The handler runs in the polling task and sends its item there: a wake
    // of that task would only poll it again (and, on a busy runtime, wake an
    // idle worker to steal it), for every request.
    let f = start().await;
    let h = f.serve.run(plain_app()).await.unwrap();
    let wakes = Arc::new(Wakes::default());
    let waker = futures::task::waker(wakes.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let mut s = std::pin::pin!(h.call_stream::<_, u32>(&21u32));
    assert!(matches!(
        s.as_mut().poll_next(&mut cx),
        std::task::Poll::Ready(Some(Ok(42)))
    ));
    assert!(matches!(
        s.as_mut().poll_next(&mut cx),
        std::task::Poll::Ready(None)
    ));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "the stream woke itself");
}

#[tokio::test(start_paused = true)]
async fn items_arrive_before_the_handler_ends_and_the_slot_is_held_until_it_does() {
    let f = start().await;
    let h = f.serve.run(tokens_app("gated", 1)).await.unwrap();
    let mut s = h.call_stream::<_, String>("gated");
    // The first poll routes the request; the handler waits at the gate.
    let next = tokio::time::timeout(Duration::from_millis(10), s.next()).await;
    assert!(next.is_err(), "no token before the gate opens");
    assert_eq!(h.replicas()[0].in_flight(), 1);
    f.gate.notify_one();
    assert_eq!(s.next().await.unwrap().unwrap(), "t0");
    // The handler has not finished (it waits for the gate again), and the slot
    // is still held: a second request queues behind it.
    assert_eq!(h.replicas()[0].in_flight(), 1);
    let queued = {
        let h = h.clone();
        tokio::spawn(async move { h.call::<_, String>("x").await })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(
        !queued.is_finished(),
        "max_ongoing_requests 1 holds it back"
    );
    f.gate.notify_one();
    assert_eq!(s.next().await.unwrap().unwrap(), "t1");
    f.gate.notify_one();
    assert_eq!(s.next().await.unwrap().unwrap(), "t2");
    assert!(s.next().await.is_none());
    assert_eq!(queued.await.unwrap().unwrap(), "whole:x");
    assert_eq!(h.replicas()[0].in_flight(), 0);
    assert_eq!(f.dropped_early.load(Ordering::SeqCst), 0);
    assert_eq!(h.replicas()[0].stats().succeeded(), 2);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_stream_cancels_the_handler_and_frees_its_slot() {
    let f = start().await;
    let h = f.serve.run(tokens_app("drop", 1)).await.unwrap();
    let mut s = h.call_stream::<_, String>("gated");
    f.gate.notify_one();
    assert_eq!(s.next().await.unwrap().unwrap(), "t0");
    assert_eq!(h.replicas()[0].in_flight(), 1);
    drop(s);
    assert_eq!(h.replicas()[0].in_flight(), 0, "slot freed at once");
    assert_eq!(
        f.dropped_early.load(Ordering::SeqCst),
        1,
        "handler cancelled"
    );
    assert_eq!(h.replicas()[0].stats().cancelled(), 1);
    // A stream dropped before its first poll never reached a replica.
    drop(h.call_stream::<_, String>("gated"));
    assert_eq!(h.replicas()[0].stats().cancelled(), 1);
    let items: Vec<String> = h
        .call_stream::<_, String>("free")
        .map(|i| i.unwrap())
        .collect()
        .await;
    assert_eq!(items, ["t0", "t1", "t2"]);
}

#[tokio::test(start_paused = true)]
async fn an_error_ends_the_stream_as_its_last_item() {
    let f = start().await;
    let h = f.serve.run(tokens_app("err", 2)).await.unwrap();
    let items: Vec<Result<String, CallError>> = h.call_stream("fail").collect().await;
    assert_eq!(
        items,
        vec![
            Ok("t0".to_owned()),
            Err(CallError::User("token 1 failed".into()))
        ]
    );
    assert_eq!(h.replicas()[0].in_flight(), 0);
    assert_eq!(h.replicas()[0].stats().failed(flotilla::ErrorKind::User), 1);
    let timed = h.clone().with_timeout(Duration::from_millis(50));
    let items: Vec<Result<String, CallError>> = timed.call_stream("gated").collect().await;
    assert!(
        matches!(items.as_slice(), [Err(CallError::Timeout { .. })]),
        "{items:?}"
    );
    assert_eq!(
        h.replicas()[0].in_flight(),
        0,
        "a timed-out stream frees its slot"
    );
}

#[tokio::test(start_paused = true)]
async fn a_streaming_deployment_forwards_another_deployments_stream() {
    let f = start().await;
    let app = ApplicationSpec::builder("chain")
        .deployment(DeploymentSpec::builder("front", "st::Tokens").init_args(&Some("back")))
        .deployment(DeploymentSpec::builder("back", "st::Tokens").init_args(&None::<String>))
        .ingress("front")
        .build()
        .unwrap();
    let h = f.serve.run(app).await.unwrap();
    let items: Vec<String> = h
        .call_stream::<_, String>("x")
        .map(|i| i.unwrap())
        .collect()
        .await;
    assert_eq!(items, ["fwd:t0", "fwd:t1", "fwd:t2"]);
    // Dropping the outer stream cancels both handlers.
    let mut s = h.call_stream::<_, String>("gated");
    f.gate.notify_one();
    assert_eq!(s.next().await.unwrap().unwrap(), "fwd:t0");
    drop(s);
    assert_eq!(f.dropped_early.load(Ordering::SeqCst), 2);
    let back = f.serve.deployment_handle("chain", "back").unwrap();
    assert_eq!(back.replicas()[0].in_flight(), 0);
}

/// A stream read on a thread without a tokio runtime (a synchronous
/// caller's `futures::executor::block_on`) runs on the instance's runtime,
/// whose timers the handler uses; it ran in the reading thread and failed.
#[tokio::test(start_paused = true)]
async fn a_stream_read_on_a_thread_without_a_runtime_runs() {
    let f = start().await;
    let h = f.serve.run(tokens_app("sync", 1)).await.unwrap();
    let id = h.replicas()[0].id();
    let caller = h.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let items: Vec<Result<String, CallError>> =
            futures::executor::block_on(caller.call_stream::<_, String>("s").collect());
        let _ = tx.send(items);
    });
    let items: Vec<String> = rx.await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_eq!(items, ["t0", "t1", "t2"]);
    assert_eq!(h.replicas()[0].id(), id, "the replica was not replaced");
}
