//! The data plane's seam for replicas in other processes (`docs/nodes.md`).
//!
//! A route holds endpoints; a replica in another process has a *remote*
//! endpoint ([`RemoteEndpoint`]), whose requests go through a [`RemoteCall`]
//! (the node transport, in `flotilla-cluster`) instead of running against user
//! code. Routers treat both alike: the caller's in-flight count per replica is
//! its power-of-two-choices signal and its own `max_ongoing_requests` bound. The
//! replica's process is authoritative for the limit across every caller: it
//! serves a request with [`serve`] (or [`serve_stream`]), which takes a slot on
//! the replica's own endpoint or refuses; a refused request has not started,
//! and the handle routes it again ([`Attempt::Refused`]).

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;

use crate::{
    CallError, DeploymentRoute, ReplicaEndpoint, ReplicaId,
    endpoint::Slot,
    payload::{ItemSender, Payload, PayloadError},
    stats::ErrorKind,
    user::ErasedDeployment,
};

/// How one request to a replica in another process went.
#[derive(Debug)]
pub enum Attempt<T> {
    /// It was sent, and this is its outcome (a failure of its node after it
    /// was sent is [`CallError::NodeLost`]).
    Ran(Result<T, CallError>),
    /// It did not start: the replica was at its limit (`full`), stopping,
    /// unknown there, or its process could not be reached. The request comes
    /// back to be routed again.
    Refused {
        /// The request, unchanged.
        request: Vec<u8>,
        /// The replica refused because it was at `max_ongoing_requests`.
        full: bool,
    },
}

/// How requests reach replicas of another process: implemented by the node
/// transport. The futures are `'static` (they own what they need) and are
/// dropped when the caller goes away (the transport then cancels the call).
pub trait RemoteCall: Send + Sync + 'static {
    /// Send `request` (for model `model_id`, if it has one) to `replica` and
    /// await its response.
    fn call(
        &self,
        replica: ReplicaId,
        request: Vec<u8>,
        model_id: Option<Arc<str>>,
    ) -> BoxFuture<'static, Attempt<Vec<u8>>>;

    /// Send `request` to `replica`'s streaming handler; each item it produces
    /// goes to `items` ([`ItemSender::send_encoded`]), and the result says how
    /// the stream ended.
    fn call_stream(
        &self,
        replica: ReplicaId,
        request: Vec<u8>,
        model_id: Option<Arc<str>>,
        items: ItemSender,
    ) -> BoxFuture<'static, Attempt<()>>;
}

/// The endpoint of a replica in another process, as its transport holds it:
/// the [`ReplicaEndpoint`] routes publish, and the controls only the transport
/// uses.
#[derive(Debug, Clone)]
pub struct RemoteEndpoint(Arc<ReplicaEndpoint>);

impl RemoteEndpoint {
    /// The endpoint of `id`, running on `node`, reached through `call`, whose
    /// callers here send it at most `max_ongoing` requests at once; freed slots
    /// wake the callers queued on `route`.
    pub fn new(
        id: ReplicaId,
        node: impl Into<String>,
        call: Arc<dyn RemoteCall>,
        max_ongoing: u32,
        route: &DeploymentRoute,
    ) -> Self {
        RemoteEndpoint(Arc::new(ReplicaEndpoint::new_remote(
            id,
            node.into(),
            call,
            max_ongoing,
            route.queue.clone(),
        )))
    }

    /// The endpoint to publish.
    pub fn endpoint(&self) -> &Arc<ReplicaEndpoint> {
        &self.0
    }

    /// The replica's limit changed.
    pub fn set_max_ongoing(&self, n: u32) {
        self.0.set_max_ongoing(n);
    }

    /// Its process reports `n` requests running on it, from every caller
    /// ([`ReplicaEndpoint::load`]).
    pub fn set_reported_load(&self, n: u32) {
        self.0.set_reported(n);
    }

    /// Its replica reported the models it holds (a multiplexed deployment's):
    /// routers here prefer it for those from now on.
    pub fn set_models(&self, ids: crate::ModelIds) {
        self.0.mirror_models(ids);
    }

    /// Its process reports its batch and model figures (`None`: not in this
    /// report), each whole: `/metrics` here exports them
    /// ([`ReplicaEndpoint::batch_stats`], [`ReplicaEndpoint::model_stats`]).
    pub fn set_reported_figures(
        &self,
        batches: Option<&crate::BatchCounts>,
        models: Option<&crate::ModelCounts>,
    ) {
        self.0.mirror_figures(batches, models);
    }

    /// Route nothing more to it (it is stopping, or its node is lost).
    pub fn stop_accepting(&self) {
        self.0.stop_accepting();
    }
}

/// What the replica's process did with a request from another process.
#[derive(Debug)]
pub enum Served<T> {
    /// It ran; this is its outcome.
    Ran(Result<T, CallError>),
    /// It did not start: `full` if the replica was at its limit, else it was
    /// stopping (or not serving yet). The request comes back, to return to
    /// its caller, who routes it again.
    Refused {
        /// At `max_ongoing_requests`.
        full: bool,
        /// The request, unchanged.
        request: Vec<u8>,
    },
}

/// Serve a request from another process on the local replica `ep`: take a slot
/// on its own endpoint (the limit shared by every caller everywhere) and run
/// it as a local call runs (batched by its deployment's route in this
/// process, which follows the head's: docs/nodes.md), or refuse without
/// running it.
pub async fn serve(
    ep: &Arc<ReplicaEndpoint>,
    request: Vec<u8>,
    model_id: Option<Arc<str>>,
) -> Served<Vec<u8>> {
    match ep.try_acquire() {
        Some(slot) => {
            let route = ep.own_route();
            let call = crate::user::Call {
                payload: Payload::Encoded(request),
                model_id,
            };
            let result = crate::handle::run(route.as_deref(), slot, call).await;
            Served::Ran(result.and_then(|out| out.into_bytes().map_err(PayloadError::bad_response)))
        }
        None => Served::Refused {
            full: ep.is_accepting(),
            request,
        },
    }
}

/// [`serve`] for the streaming handler: items go to `items` as produced.
pub async fn serve_stream(
    ep: &Arc<ReplicaEndpoint>,
    request: Vec<u8>,
    model_id: Option<Arc<str>>,
    items: tokio::sync::mpsc::Sender<Vec<u8>>,
) -> Served<()> {
    match ep.try_acquire() {
        Some(slot) => {
            let route = ep.own_route();
            let call = crate::user::Call {
                payload: Payload::Encoded(request),
                model_id,
            };
            let items = ItemSender::encoded(items);
            Served::Ran(crate::handle::run_stream(route.as_deref(), slot, call, items).await)
        }
        None => Served::Refused {
            full: ep.is_accepting(),
            request,
        },
    }
}

/// Run one request through a remote endpoint's transport, holding the
/// caller's slot on it meanwhile, and record the outcome on its counters.
pub(crate) async fn run(
    slot: Slot,
    remote: Arc<dyn RemoteCall>,
    request: Vec<u8>,
    model_id: Option<Arc<str>>,
) -> Attempt<Vec<u8>> {
    let mut outcome = Outcome::new(&slot);
    let attempt = remote.call(slot.0.id(), request, model_id).await;
    outcome.record(&attempt);
    attempt
}

/// [`run`] for a streaming call.
pub(crate) async fn run_stream(
    slot: Slot,
    remote: Arc<dyn RemoteCall>,
    request: Vec<u8>,
    model_id: Option<Arc<str>>,
    items: &ItemSender,
) -> Attempt<()> {
    let mut outcome = Outcome::new(&slot);
    let attempt = remote
        .call_stream(slot.0.id(), request, model_id, items.clone())
        .await;
    outcome.record(&attempt);
    attempt
}

/// A call's outcome on the remote endpoint's counters, recorded once: as it
/// ran, or as cancelled when its caller drops it first (as a local call's
/// `Running`). A refused call ran nowhere and records nothing.
struct Outcome<'a> {
    slot: &'a Slot,
    started: std::time::Instant,
    recorded: bool,
}

impl<'a> Outcome<'a> {
    fn new(slot: &'a Slot) -> Self {
        Outcome {
            slot,
            started: std::time::Instant::now(),
            recorded: false,
        }
    }

    fn record<T>(&mut self, attempt: &Attempt<T>) {
        self.recorded = true;
        if let Attempt::Ran(result) = attempt {
            let outcome = match result {
                Ok(_) => Ok(()),
                Err(e) => Err(ErrorKind::of(e).unwrap_or(ErrorKind::User)),
            };
            self.slot.0.stats().record(outcome, self.started.elapsed());
        }
    }
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            self.slot.0.stats().record_cancelled(self.started.elapsed());
        }
    }
}

/// Refusals in a row after which the backoff stops growing.
const MAX_BACKOFF_STEP: u32 = 7;

/// A request's refusals by replicas in other processes, while it is routed
/// again: how many in a row (its backoff), and which replicas refused it
/// without being full (their process is not reachable from here now: one
/// that keeps refusing so would otherwise win every pick, its slot always
/// free). Those are not picked again for it while another replica can be,
/// as Ray's router stops sending to a replica whose actor is unavailable.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    count: u32,
    unreachable: Vec<ReplicaId>,
}

impl Refusals {
    /// Whether the request has not been refused yet: its first routing,
    /// counted and held to `max_queued_requests` (a retry was admitted once).
    pub(crate) fn first(&self) -> bool {
        self.count == 0
    }

    /// `replica` refused the request (`full`: at its limit there). Wait
    /// before routing it again: nothing after a replica that was not full
    /// (it is left out now), else 100 µs doubling to 12.8 ms, so callers held
    /// back by other processes' load wait for slots instead of spinning.
    pub(crate) async fn refused(&mut self, replica: ReplicaId, full: bool) {
        let n = self.count;
        self.count = n.saturating_add(1);
        if !full && !self.unreachable.contains(&replica) {
            self.unreachable.push(replica);
            tokio::task::yield_now().await;
            return;
        }
        let step = n.min(MAX_BACKOFF_STEP);
        tokio::time::sleep(Duration::from_micros(100) * (1 << step)).await;
    }

    /// The replicas of `set` to pick from: all but those that refused while
    /// not full, unless that leaves none (then every one is tried again).
    pub(crate) fn candidates<'a>(
        &self,
        set: &'a [Arc<ReplicaEndpoint>],
    ) -> std::borrow::Cow<'a, [Arc<ReplicaEndpoint>]> {
        if self.unreachable.is_empty() {
            return std::borrow::Cow::Borrowed(set);
        }
        let rest: Vec<Arc<ReplicaEndpoint>> = set
            .iter()
            .filter(|e| !self.unreachable.contains(&e.id()))
            .cloned()
            .collect();
        if rest.is_empty() {
            std::borrow::Cow::Borrowed(set)
        } else {
            std::borrow::Cow::Owned(rest)
        }
    }
}

/// The user code of a remote endpoint: requests never reach it (the handle
/// sends them through the endpoint's [`RemoteCall`]), so it only says so.
pub(crate) struct Elsewhere;

impl ErasedDeployment for Elsewhere {
    fn handle(&self, _call: crate::user::Call) -> BoxFuture<'_, Result<Payload, CallError>> {
        Box::pin(std::future::ready(Err(CallError::BadRequest(
            "a replica in another process is called through its transport".to_owned(),
        ))))
    }

    fn batched(&self) -> bool {
        // Its process decides, by its own code.
        false
    }

    fn handle_batch(
        &self,
        _model_id: Option<Arc<str>>,
        _requests: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, crate::user::BatchResult> {
        // Never reached: `run` batches only with a route, and a remote
        // endpoint's requests go through its transport.
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    fn handle_stream(
        &self,
        _call: crate::user::Call,
        _items: ItemSender,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        Box::pin(std::future::ready(Err(CallError::BadRequest(
            "a replica in another process is called through its transport".to_owned(),
        ))))
    }

    fn reconfigure(
        &self,
        _user_config: flotilla_core::Args,
    ) -> BoxFuture<'_, Result<(), crate::UserError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn check_health(&self) -> BoxFuture<'_, Result<(), crate::UserError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}
