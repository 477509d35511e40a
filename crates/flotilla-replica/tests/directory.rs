//! Routes: which one a handle's calls use as deployments are deleted and
//! come back, what they get when there is none, and what a route counts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use flotilla_core::{AppName, DeploymentName};
use flotilla_replica::{
    CallError, Directory, ItemSender, ReplicaId,
    remote::{Attempt, RemoteCall, RemoteEndpoint},
};
use futures::future::BoxFuture;

fn key() -> (AppName, DeploymentName) {
    (
        AppName::new("a").unwrap(),
        DeploymentName::new("d").unwrap(),
    )
}

/// `h`'s call with `n`, in a task of its own.
fn spawn_call(
    h: &flotilla_replica::DeploymentHandle,
    n: u8,
) -> tokio::task::JoinHandle<Result<u8, CallError>> {
    let h = h.clone();
    tokio::spawn(async move { h.call::<u8, u8>(&n).await })
}

/// Yield until `ready` holds (other tasks run meanwhile; paused time does
/// not move).
async fn until(ready: impl Fn() -> bool) {
    while !ready() {
        tokio::task::yield_now().await;
    }
}

/// A call that must answer (paused time: one that waits fails the test).
async fn answer(h: &flotilla_replica::DeploymentHandle) -> CallError {
    tokio::time::timeout(Duration::from_secs(3600), h.call::<u8, u8>(&1))
        .await
        .expect("the call answers instead of waiting")
        .unwrap_err()
}

/// A handle made after the deployment was deleted makes a route nothing
/// serves: it must not pull the handles made before onto it (they would wait
/// for ever instead of failing with `NotFound`). A redeploy does.
#[tokio::test(start_paused = true)]
async fn a_handle_made_after_a_deletion_does_not_bring_back_the_older_ones() {
    let dir = Directory::new();
    let (a, d) = key();
    let served = dir.route(&a, &d);
    assert!(served.is_claimed());
    let old = dir.handle(&a, &d);
    dir.remove(&a, &d);
    assert!(matches!(answer(&old).await, CallError::NotFound { .. }));

    let late = dir.handle(&a, &d);
    assert!(!dir.get(&a, &d).unwrap().is_claimed());
    assert!(matches!(answer(&old).await, CallError::NotFound { .. }));
    // Nor is it a route a handle for a deleting application may take.
    assert!(dir.existing_handle(&a, &d).is_none());

    // Deployed again: the old handle's calls go to the new route (and wait
    // there for a replica, as the late handle's do).
    let again = dir.route(&a, &d);
    assert!(again.is_claimed());
    let waits = tokio::time::timeout(Duration::from_secs(60), old.call::<u8, u8>(&1)).await;
    assert!(waits.is_err(), "{waits:?}");
    drop(late);
}

/// After the instance stopped, a handle whose deployment was deleted before
/// answers as every other call then does: `Unavailable`.
#[tokio::test(start_paused = true)]
async fn a_deleted_deployments_handle_is_unavailable_once_the_instance_stopped() {
    let dir = Directory::new();
    let (a, d) = key();
    dir.route(&a, &d);
    let old = dir.handle(&a, &d);
    dir.remove(&a, &d);
    dir.shut_down();
    assert!(matches!(answer(&old).await, CallError::Unavailable { .. }));
    let late = dir.handle(&a, &d);
    assert!(matches!(answer(&late).await, CallError::Unavailable { .. }));
    assert!(matches!(answer(&old).await, CallError::Unavailable { .. }));
}

/// A request routed again after a remote replica refused it is still one
/// request routed (Ray's `serve_num_router_requests`).
#[tokio::test(start_paused = true)]
async fn a_request_routed_again_after_a_refusal_is_counted_once() {
    let dir = Directory::new();
    let (a, d) = key();
    let route = dir.route(&a, &d);
    // A replica in another process that refuses the request once (at its
    // limit there), then runs it.
    let refuses_once = Arc::new(Scripted::default());
    refuses_once.script().send(true).unwrap();
    let remote = RemoteEndpoint::new(ReplicaId(1), "node-1", refuses_once, 4, &route);
    route.publish(vec![remote.endpoint().clone()]);
    let out: u8 = dir.handle(&a, &d).call(&7u8).await.unwrap();
    assert_eq!(out, 7);
    assert_eq!(route.stats().assigned(), 1);
}

/// A deployment that failed to deploy and has no replica fails its calls at
/// once (Ray's DeploymentUnavailableError), those already waiting too, and
/// calls wait again once it no longer is.
#[tokio::test(start_paused = true)]
async fn calls_to_a_deploy_failed_deployment_without_replicas_fail_at_once() {
    let dir = Directory::new();
    let (a, d) = key();
    let route = dir.route(&a, &d);
    let h = dir.handle(&a, &d);
    let waiting = spawn_call(&h, 1);
    tokio::task::yield_now().await;
    assert_eq!(route.queued(), 1);
    assert!(route.set_deploy_failed(true));
    assert!(!route.set_deploy_failed(true), "no change");
    assert!(matches!(
        waiting.await.unwrap(),
        Err(CallError::DeployFailed { .. })
    ));
    assert!(matches!(answer(&h).await, CallError::DeployFailed { .. }));
    route.set_deploy_failed(false);
    let waits = tokio::time::timeout(Duration::from_secs(60), h.call::<u8, u8>(&1)).await;
    assert!(waits.is_err(), "{waits:?}");
}

/// A replica in another process that never answers.
struct Hangs;

impl RemoteCall for Hangs {
    fn call(
        &self,
        _: ReplicaId,
        _: Vec<u8>,
        _: Option<Arc<str>>,
    ) -> BoxFuture<'static, Attempt<Vec<u8>>> {
        Box::pin(std::future::pending())
    }

    fn call_stream(
        &self,
        _: ReplicaId,
        _: Vec<u8>,
        _: Option<Arc<str>>,
        _: ItemSender,
    ) -> BoxFuture<'static, Attempt<()>> {
        Box::pin(std::future::pending())
    }
}

/// A call to a replica in another process that its caller drops is counted
/// as cancelled on the caller's endpoint of it, as a local call is.
#[tokio::test(start_paused = true)]
async fn a_remote_call_its_caller_drops_counts_as_cancelled() {
    let dir = Directory::new();
    let (a, d) = key();
    let route = dir.route(&a, &d);
    let remote = RemoteEndpoint::new(ReplicaId(2), "node-1", Arc::new(Hangs), 4, &route);
    let ep = remote.endpoint().clone();
    route.publish(vec![ep.clone()]);
    let h = dir.handle(&a, &d);
    let gone = tokio::time::timeout(Duration::from_secs(1), h.call::<u8, u8>(&7)).await;
    assert!(gone.is_err());
    assert_eq!((ep.stats().cancelled(), ep.in_flight()), (1, 0));
}

/// A replica in another process that answers each call as the test says:
/// the n-th call waits for the n-th script entry (`true`: refused, at its
/// limit; `false`: run), and a call past the scripts runs at once. Calls are
/// counted.
#[derive(Default)]
struct Scripted {
    scripts: std::sync::Mutex<std::collections::VecDeque<tokio::sync::oneshot::Receiver<bool>>>,
    calls: std::sync::atomic::AtomicU32,
}

impl Scripted {
    fn script(&self) -> tokio::sync::oneshot::Sender<bool> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.scripts.lock().unwrap().push_back(rx);
        tx
    }
}

impl RemoteCall for Scripted {
    fn call(
        &self,
        _: ReplicaId,
        request: Vec<u8>,
        _: Option<Arc<str>>,
    ) -> BoxFuture<'static, Attempt<Vec<u8>>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let script = self.scripts.lock().unwrap().pop_front();
        Box::pin(async move {
            let refuse = match script {
                Some(rx) => rx.await.unwrap_or(false),
                None => false,
            };
            if refuse {
                Attempt::Refused {
                    request,
                    full: true,
                }
            } else {
                Attempt::Ran(Ok(request))
            }
        })
    }

    fn call_stream(
        &self,
        _: ReplicaId,
        _: Vec<u8>,
        _: Option<Arc<str>>,
        _: ItemSender,
    ) -> BoxFuture<'static, Attempt<()>> {
        Box::pin(async { Attempt::Ran(Ok(())) })
    }
}

/// A replica in another process this one cannot reach now: it refuses every
/// call, not being full (its session is down).
#[derive(Default)]
struct Unreachable(std::sync::atomic::AtomicU32);

impl RemoteCall for Unreachable {
    fn call(
        &self,
        _: ReplicaId,
        request: Vec<u8>,
        _: Option<Arc<str>>,
    ) -> BoxFuture<'static, Attempt<Vec<u8>>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Attempt::Refused {
                request,
                full: false,
            }
        })
    }

    fn call_stream(
        &self,
        _: ReplicaId,
        _: Vec<u8>,
        _: Option<Arc<str>>,
        _: ItemSender,
    ) -> BoxFuture<'static, Attempt<()>> {
        Box::pin(async {
            Attempt::Refused {
                request: Vec::new(),
                full: false,
            }
        })
    }
}

/// A replica that refuses a request without being full (its process is not
/// reachable) is not picked again for it while another can take it: it
/// would win every pick (its slot is always free) and the request would
/// never reach the busy, healthy one.
#[tokio::test(start_paused = true)]
async fn a_replica_that_refuses_while_not_full_is_left_out_of_the_requests_next_picks() {
    let dir = Directory::new();
    let (a, d) = key();
    let route = dir.route(&a, &d);
    let healthy = Arc::new(Scripted::default());
    let _busy = healthy.script();
    let g = RemoteEndpoint::new(ReplicaId(1), "node-1", healthy.clone(), 4, &route);
    route.publish(vec![g.endpoint().clone()]);
    let h = dir.handle(&a, &d);
    let first = spawn_call(&h, 1);
    until(|| g.endpoint().in_flight() > 0).await;
    let unreachable = Arc::new(Unreachable::default());
    let b = RemoteEndpoint::new(ReplicaId(2), "node-2", unreachable.clone(), 4, &route);
    route.publish(vec![b.endpoint().clone(), g.endpoint().clone()]);
    let out = tokio::time::timeout(Duration::from_secs(5), h.call::<u8, u8>(&7)).await;
    assert_eq!(out.expect("answered").unwrap(), 7);
    assert_eq!(unreachable.0.load(Ordering::SeqCst), 1, "tried once");
    first.abort();
}

/// A request a remote replica refused (at its limit there) is routed again
/// as a request already admitted: a queue that filled meanwhile does not
/// refuse it for back-pressure.
#[tokio::test(start_paused = true)]
async fn a_refused_request_routed_again_is_not_refused_for_back_pressure() {
    let dir = Directory::new();
    let (a, d) = key();
    let route = dir.route(&a, &d);
    route.set_max_queued(Some(1));
    let remote = Arc::new(Scripted::default());
    let first_answer = remote.script();
    let second_answer = remote.script();
    let r = RemoteEndpoint::new(ReplicaId(1), "node-1", remote.clone(), 1, &route);
    route.publish(vec![r.endpoint().clone()]);
    let h = dir.handle(&a, &d);
    // A runs there, B waits here.
    let a_call = spawn_call(&h, 1);
    until(|| r.endpoint().in_flight() > 0).await;
    let b_call = spawn_call(&h, 2);
    until(|| route.queued() > 0).await;
    // The replica refuses A: B takes the slot, and C fills the queue while A
    // waits to be routed again.
    first_answer.send(true).unwrap();
    until(|| remote.calls.load(Ordering::SeqCst) >= 2).await;
    let c_call = spawn_call(&h, 3);
    until(|| route.queued() > 0).await;
    // A's backoff ends while the queue is full: it joins, behind C.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(route.queued(), 2);
    second_answer.send(false).unwrap();
    assert_eq!(a_call.await.unwrap().unwrap(), 1);
    assert_eq!(b_call.await.unwrap().unwrap(), 2);
    assert_eq!(c_call.await.unwrap().unwrap(), 3);
    assert_eq!(route.stats().rejected(), 0);
    assert_eq!(route.stats().assigned(), 3);
}

/// A request that waited in the queue and timed out is still one request
/// routed: Ray counts a request once it is past back-pressure, before a
/// replica takes it.
#[tokio::test(start_paused = true)]
async fn a_request_that_times_out_in_the_queue_is_counted() {
    let dir = Directory::new();
    let (a, d) = key();
    let route = dir.route(&a, &d);
    let remote = RemoteEndpoint::new(ReplicaId(1), "node-1", Arc::new(Hangs), 1, &route);
    route.publish(vec![remote.endpoint().clone()]);
    let h = dir.handle(&a, &d);
    let first = spawn_call(&h, 1);
    until(|| remote.endpoint().in_flight() > 0).await;
    let late = h
        .with_timeout(Duration::from_secs(1))
        .call::<u8, u8>(&2)
        .await;
    assert!(matches!(late, Err(CallError::Timeout { .. })), "{late:?}");
    assert_eq!(route.stats().assigned(), 2);
    first.abort();
}
