//! `DeploymentHandle`: call a deployment from anywhere in the process.

use std::{
    marker::PhantomData,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};
use tracing::Instrument;

use futures::{Stream, future::BoxFuture};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    CallError, Directory, ModelIdError, ReplicaEndpoint, RoutingRequest,
    access::AccessLine,
    endpoint::Slot,
    home::run_on,
    multiplex::validate_model_id,
    payload::{ItemSender, Payload, PayloadError},
    remote::{Attempt, Refusals},
    route::{DeploymentRoute, ReplicaSet},
    stats::ErrorKind,
    user::Call,
};

/// The target of per-request access log events (one `INFO` event per request a
/// replica took, when it ends, with `app`, `deployment`, `replica`, `status`
/// (Ray's `OK`, `ERROR` or `CANCELLED`: dropped or timed out), `ok`,
/// `stream` and `latency_ms`); filtered per application by its
/// logging config's `enable_access_log`, as is every target under it (the HTTP
/// proxy's is `flotilla::access::http`): see [`is_access_log`].
pub const ACCESS_TARGET: &str = "flotilla::access";

/// Whether events of `target` are access logs: [`ACCESS_TARGET`] or a target
/// under it.
///
/// ```
/// use flotilla_replica::is_access_log;
/// assert!(is_access_log("flotilla::access"));
/// assert!(is_access_log("flotilla::access::http"));
/// assert!(!is_access_log("flotilla::accessor"));
/// ```
pub fn is_access_log(target: &str) -> bool {
    target
        .strip_prefix(ACCESS_TARGET)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

/// A cheap, clonable handle to one deployment. Each call picks a replica with
/// the deployment's request router (by default power-of-two-choices over
/// in-flight counts shared by every handle of the deployment, preferring a
/// replica that holds the call's model), waits in the handle's queue when every
/// replica is at `max_ongoing_requests`, and learns replica-set changes by
/// subscription.
///
/// Calls keep working while control actors crash and restart: the route they
/// read outlives them.
#[derive(Clone)]
pub struct DeploymentHandle {
    directory: Directory,
    route: Arc<DeploymentRoute>,
    timeout: Option<Duration>,
    local_node: Option<Arc<str>>,
    model_id: Option<Arc<str>>,
}

impl std::fmt::Debug for DeploymentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentHandle")
            .field("app", self.route.app())
            .field("deployment", self.route.deployment())
            .field("timeout", &self.timeout)
            .field("model_id", &self.model_id)
            .finish()
    }
}

impl DeploymentHandle {
    pub(crate) fn new(directory: Directory, route: Arc<DeploymentRoute>) -> Self {
        DeploymentHandle {
            directory,
            route,
            timeout: None,
            local_node: None,
            model_id: None,
        }
    }

    /// The same handle, its calls for model `model_id` (Ray's
    /// `handle.options(multiplexed_model_id=...)`): a multiplexed deployment
    /// serves them with that model, and the default router prefers a replica
    /// that has it loaded. Refused if empty, longer than
    /// [`MAX_MODEL_ID_LEN`](crate::MAX_MODEL_ID_LEN) bytes, or holding a control
    /// character. A handle made inside a deployment does not inherit the model
    /// id of the request being served (as in Ray).
    ///
    /// ```no_run
    /// # async fn demo(handle: flotilla_replica::DeploymentHandle) -> Result<(), Box<dyn std::error::Error>> {
    /// let answer: String = handle.with_model_id("org/llama-7b")?.call("hello").await?;
    /// # Ok(()) }
    /// ```
    pub fn with_model_id(mut self, model_id: impl AsRef<str>) -> Result<Self, ModelIdError> {
        let id = model_id.as_ref();
        validate_model_id(id)?;
        self.model_id = Some(Arc::from(id));
        Ok(self)
    }

    /// The model id its calls carry, if any.
    pub fn model_id(&self) -> Option<&str> {
        self.model_id.as_deref()
    }

    /// The same handle, preferring replicas on `node` (the caller's) while one of
    /// them has room; other replicas take the rest.
    pub fn prefer_node(mut self, node: impl Into<String>) -> Self {
        self.local_node = Some(Arc::from(node.into()));
        self
    }

    /// The same handle with a per-call timeout (time spent queued included).
    /// Zero is a deadline already reached, not "no timeout" (leave it unset
    /// for that): a call that does not complete at once fails with
    /// [`CallError::Timeout`]. A call timed out while its handler runs
    /// cancels the handler, as dropping the call does (Ray's timeout leaves
    /// it running).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The application this handle calls into.
    pub fn app(&self) -> &str {
        self.route.app().as_str()
    }

    /// The deployment this handle calls.
    pub fn deployment(&self) -> &str {
        self.route.deployment().as_str()
    }

    /// The replicas this handle can route to now.
    pub fn replicas(&self) -> ReplicaSet {
        self.live_route()
            .map(|r| r.replicas())
            .unwrap_or_else(|_| Arc::from(Vec::new()))
    }

    /// The deployment's route as this handle uses it now: its replica set, queue
    /// length and routing counters ([`DeploymentRoute::stats`]), for exporters.
    pub fn route(&self) -> Arc<DeploymentRoute> {
        self.live_route().unwrap_or_else(|_| self.route.clone())
    }

    /// Send `request` and await the response. Requests and responses cross as
    /// MessagePack, so the deployment decodes into its own types (a response
    /// of the type asked for, from a replica in this process, is moved).
    ///
    /// The handler runs in the task that awaits the call (dropping the call
    /// cancels it), or, awaited on a thread without a tokio runtime (a
    /// synchronous caller's `futures::executor::block_on`), on the runtime
    /// the `Serve` was started on. (A runtime built without timers is not
    /// told apart: user code that uses timers fails there.)
    pub async fn call<Req, Resp>(&self, request: &Req) -> Result<Resp, CallError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned + 'static,
    {
        let payload = Payload::encode(request).map_err(PayloadError::bad_request)?;
        self.call_with(payload).await
    }

    /// [`call`](Self::call), taking the request by value: a replica in this
    /// process whose request type is `Req` gets the value itself, not a
    /// decoded copy (the fastest call; a field that `serde` skips keeps its
    /// value). A replica of another request type, or in another process, gets
    /// it encoded, as from [`call`](Self::call).
    ///
    /// ```no_run
    /// # async fn demo(handle: flotilla_replica::DeploymentHandle) -> Result<(), flotilla_replica::CallError> {
    /// let answer: String = handle.call_owned(String::from("hello")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn call_owned<Req, Resp>(&self, request: Req) -> Result<Resp, CallError>
    where
        Req: Serialize + Send + 'static,
        Resp: DeserializeOwned + 'static,
    {
        self.call_with(Payload::of(request)).await
    }

    async fn call_with<Resp: DeserializeOwned + 'static>(
        &self,
        payload: Payload,
    ) -> Result<Resp, CallError> {
        let out = match self.directory.home().instead_of_none() {
            None => self.timed_call(payload).await?,
            // A thread without a runtime: the call runs on the instance's.
            Some(runtime) => {
                let handle = self.clone();
                let call = async move { handle.timed_call(payload).await };
                run_on(runtime, call)
                    .await
                    .unwrap_or_else(|| Err(self.route.unavailable()))?
            }
        };
        out.take().map_err(PayloadError::bad_response)
    }

    /// The call, within the handle's timeout.
    async fn timed_call(&self, payload: Payload) -> Result<Payload, CallError> {
        match self.timeout {
            None => self.call_payload(payload).await,
            Some(t) => tokio::time::timeout(t, self.call_payload(payload))
                .await
                .map_err(|_| self.timed_out())?,
        }
    }

    /// The error of a call that outlived the handle's timeout.
    fn timed_out(&self) -> CallError {
        CallError::Timeout {
            app: self.app().to_owned(),
            deployment: self.deployment().to_owned(),
        }
    }

    /// The route to use: ours, or the live one if ours was deleted and the
    /// deployment has come back since (a route something serves it on, not
    /// one a later handle made: that one would have nothing behind it).
    fn live_route(&self) -> Result<Arc<DeploymentRoute>, CallError> {
        if !self.route.is_closed() {
            return Ok(self.route.clone());
        }
        match self
            .directory
            .get(self.route.app(), self.route.deployment())
        {
            Some(r) if !r.is_closed() && r.is_claimed() => Ok(r),
            Some(r) if r.is_closed() => Err(r.not_found()),
            // Deleted before its instance stopped: the stop is what a call
            // finds now.
            _ if self.directory.is_shut_down() => Err(self.route.unavailable()),
            _ => Err(self.route.not_found()),
        }
    }

    async fn call_payload(&self, mut payload: Payload) -> Result<Payload, CallError> {
        let mut refusals = Refusals::default();
        loop {
            // Counted once per request, not again for each refusal.
            let (route, slot) = self.acquire(&refusals).await?;
            let replica = slot.0.id();
            let line = AccessLine::new(&route, replica, false);
            let result = match slot.0.remote_call().cloned() {
                None => {
                    let call = Call {
                        payload,
                        model_id: self.model_id.clone(),
                    };
                    run(Some(&route), slot, call).await
                }
                // A replica in another process; one that refused the request
                // before running it leaves it to be routed again.
                Some(remote) => {
                    // Not sent: a request that cannot be encoded fails.
                    let bytes = match encoded_request(payload) {
                        Ok(b) => b,
                        Err(e) => {
                            line.finish(false);
                            return Err(e);
                        }
                    };
                    match crate::remote::run(slot, remote, bytes, self.model_id.clone()).await {
                        Attempt::Ran(result) => result.map(Payload::Encoded),
                        Attempt::Refused { request, full } => {
                            line.refused();
                            payload = Payload::Encoded(request);
                            refusals.refused(replica, full).await;
                            continue;
                        }
                    }
                }
            };
            line.finish(result.is_ok());
            return result;
        }
    }

    /// A slot on a replica, picked by the deployment's router: at once if one is
    /// free and nobody waits, else after waiting in the deployment's queue (up
    /// to `max_queued_requests`), oldest first. A request a remote replica
    /// refused is routed again (`refusals`): uncounted, not held to
    /// `max_queued_requests` (it was admitted), and not to the replicas that
    /// refused it while not full, if another can take it.
    async fn acquire(
        &self,
        refusals: &Refusals,
    ) -> Result<(Arc<DeploymentRoute>, Slot), CallError> {
        let count = refusals.first();
        let route = self.live_route()?;
        let mut rx = route.subscribe();
        if route.queued() == 0 {
            let set = rx.borrow_and_update().clone();
            if let Some(slot) = self.pick(&route, &refusals.candidates(&set)) {
                admitted(&route, count);
                return Ok((route, slot));
            }
        }
        // No replica, and none coming soon: fail now.
        if let Some(e) = unavailable(&route, &rx.borrow()) {
            return Err(e);
        }
        let place = route.enqueue(count)?;
        // Past back-pressure: admitted, whether a replica takes it or it
        // times out or is cancelled while it waits.
        admitted(&route, count);
        let woken = place.woken();
        // Its own reference: `route` leaves with the slot it finds.
        let watched = route.clone();
        loop {
            // Register before taking the turn, so a turn given between the two
            // is not missed.
            let turn = woken.notified();
            tokio::pin!(turn);
            turn.as_mut().enable();
            // Likewise a change of the set: registered before it is read.
            let changed = watched.changes().notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if place.take_turn() {
                let set = rx.borrow_and_update().clone();
                if let Some(slot) = self.pick(&route, &refusals.candidates(&set)) {
                    place.leave_with_slot(set.iter().any(|e| e.has_room()));
                    return Ok((route, slot));
                }
                if set.iter().any(|e| e.has_room()) {
                    place.pass_turn();
                }
            }
            // Checked after the set was seen: a close (flag, then an empty set)
            // that landed before it is seen here, and one after it wakes
            // `changed` below. Checked before, a close on another thread in
            // between would be marked seen and never wake this waiter.
            if route.is_closed() {
                return Err(route.not_found());
            }
            if let Some(e) = unavailable(&route, &rx.borrow()) {
                return Err(e);
            }
            tokio::select! {
                biased;
                () = changed => {}
                () = turn => {}
            }
        }
    }

    /// Send `request` to the deployment's streaming handler
    /// ([`Deployment::handle_stream`](crate::Deployment::handle_stream)) and get its
    /// items as they come, each decoded from MessagePack. A deployment that does
    /// not stream answers with one item.
    ///
    /// The request is routed like [`call`](Self::call) (queue, limits,
    /// power-of-two-choices) when the stream is first polled. It holds its
    /// replica's `max_ongoing_requests` slot until the stream ends or is dropped;
    /// dropping it cancels the handler. The handle's timeout, if any, bounds the
    /// whole stream. A failure is the stream's last item. Works from inside a
    /// deployment too (a streaming deployment forwarding another's stream).
    ///
    /// ```no_run
    /// # async fn demo(handle: flotilla_replica::DeploymentHandle) -> Result<(), flotilla_replica::CallError> {
    /// use futures::StreamExt;
    /// let mut tokens = handle.call_stream::<_, String>("tell me a story");
    /// while let Some(token) = tokens.next().await {
    ///     print!("{}", token?);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn call_stream<Req, Item>(&self, request: &Req) -> CallStream<Item>
    where
        Req: Serialize + ?Sized,
        Item: DeserializeOwned + 'static,
    {
        match Payload::encode(request) {
            Ok(payload) => self.stream_with(payload),
            Err(e) => CallStream::failed(e.bad_request()),
        }
    }

    /// [`call_stream`](Self::call_stream), taking the request by value: a
    /// replica in this process whose request type is `Req` gets the value
    /// itself (see [`call_owned`](Self::call_owned)).
    pub fn call_stream_owned<Req, Item>(&self, request: Req) -> CallStream<Item>
    where
        Req: Serialize + Send + 'static,
        Item: DeserializeOwned + 'static,
    {
        self.stream_with(Payload::of(request))
    }

    fn stream_with<Item>(&self, payload: Payload) -> CallStream<Item> {
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        let tx = ItemSender::local(tx);
        let handle = self.clone();
        let assigned = Assigned::default();
        let flag = assigned.clone();
        let work = async move {
            let (mut payload, mut refusals) = (payload, Refusals::default());
            loop {
                let (route, slot) = handle.acquire(&refusals).await?;
                flag.set(true);
                let replica = slot.0.id();
                let line = AccessLine::new(&route, replica, true);
                let result = match slot.0.remote_call().cloned() {
                    None => {
                        let call = Call {
                            payload,
                            model_id: handle.model_id.clone(),
                        };
                        run_stream(Some(&route), slot, call, tx.clone()).await
                    }
                    // As in `call_payload`: a refused request is routed again.
                    Some(remote) => {
                        let bytes = match encoded_request(payload) {
                            Ok(b) => b,
                            Err(e) => {
                                line.finish(false);
                                return Err(e);
                            }
                        };
                        match crate::remote::run_stream(
                            slot,
                            remote,
                            bytes,
                            handle.model_id.clone(),
                            &tx,
                        )
                        .await
                        {
                            Attempt::Ran(result) => result,
                            Attempt::Refused { request, full } => {
                                line.refused();
                                flag.set(false);
                                payload = Payload::Encoded(request);
                                refusals.refused(replica, full).await;
                                continue;
                            }
                        }
                    }
                };
                line.finish(result.is_ok());
                return result;
            }
        };
        let driver: BoxFuture<'static, Result<(), CallError>> = match self.timeout {
            None => Box::pin(work),
            Some(t) => {
                let timed_out = self.timed_out();
                Box::pin(async move { tokio::time::timeout(t, work).await.map_err(|_| timed_out)? })
            }
        };
        // In the caller's span, wherever it is polled (the HTTP proxy's
        // body is polled by hyper, outside the request's span) and when it
        // is dropped: its access line and the handler's lines belong to the
        // request. Polled from a thread without a runtime, it runs on the
        // instance's (decided at the first poll, as a call is).
        let (home, route) = (self.directory.home().clone(), self.route.clone());
        let driver = tracing::Instrument::in_current_span(async move {
            match home.instead_of_none() {
                None => driver.await,
                Some(runtime) => run_on(runtime, driver)
                    .await
                    .unwrap_or_else(|| Err(route.unavailable())),
            }
        });
        let driver = Box::pin(driver);
        CallStream {
            driver: Some(driver),
            items: rx,
            last: None,
            assigned,
            _item: PhantomData,
        }
    }
}

/// Whether a streaming call holds a replica now: set once it is routed (its
/// handler runs, or waits for its batch), cleared if a replica in another
/// process refused it (it is routed again). Read it beside the stream
/// ([`CallStream::assigned`]), e.g. to give up on a call only while it
/// waits for a replica, as Ray's router does.
#[derive(Debug, Clone)]
pub struct Assigned(tokio::sync::watch::Sender<bool>);

impl Default for Assigned {
    fn default() -> Self {
        Assigned(tokio::sync::watch::Sender::new(false))
    }
}

impl Assigned {
    /// Whether the call holds a replica.
    pub fn get(&self) -> bool {
        *self.0.borrow()
    }

    /// A subscription to it: wakes at each change (a call routed, or routed
    /// again after a refusal).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<bool> {
        self.0.subscribe()
    }

    fn set(&self, on: bool) {
        self.0.send_if_modified(|v| std::mem::replace(v, on) != on);
    }
}

/// A request encoded for a replica in another process.
fn encoded_request(payload: Payload) -> Result<Vec<u8>, CallError> {
    payload.into_bytes().map_err(PayloadError::bad_request)
}

/// Items a streaming call may produce ahead of its consumer: the handler runs
/// at most this far ahead of the caller.
const STREAM_BUFFER: usize = 8;

/// The items of one streaming call ([`DeploymentHandle::call_stream`]): a
/// [`Stream`] of decoded items, ending with the call's error if it failed.
/// It does its work when polled, in the polling task (no task is spawned), and
/// dropping it cancels the handler and frees the replica's slot.
#[must_use = "a stream does nothing unless polled"]
pub struct CallStream<Item> {
    /// Routes the request and runs the handler, sending items; `None` once done.
    driver: Option<BoxFuture<'static, Result<(), CallError>>>,
    items: tokio::sync::mpsc::Receiver<Payload>,
    /// The driver's error, given after the items sent before it.
    last: Option<CallError>,
    assigned: Assigned,
    _item: PhantomData<fn() -> Item>,
}

impl<Item> CallStream<Item> {
    /// A stream of one item, `error`: nothing was sent.
    fn failed(error: CallError) -> Self {
        // No sender: the stream ends after `last`.
        let (_, items) = tokio::sync::mpsc::channel(1);
        CallStream {
            driver: None,
            items,
            last: Some(error),
            assigned: Assigned::default(),
            _item: PhantomData,
        }
    }

    /// Whether the call holds a replica, readable while the stream is
    /// polled elsewhere.
    pub fn assigned(&self) -> Assigned {
        self.assigned.clone()
    }
}

impl<Item> std::fmt::Debug for CallStream<Item> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallStream")
            .field("running", &self.driver.is_some())
            .finish()
    }
}

impl<Item: DeserializeOwned + 'static> Stream for CallStream<Item> {
    type Item = Result<Item, CallError>;

    /// Items are only ever sent while the driver is polled here (the handler,
    /// the batcher's answer and a remote transport all run inside it), so
    /// while the driver lasts the channel is read without registering this
    /// task's waker on it: a send never wakes the task that is sending (a
    /// self-wake would re-poll the task once more and wake an idle worker
    /// to steal it, for every request). The driver's own wakers wake it.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        use tokio::sync::mpsc::error::TryRecvError;
        let this = self.get_mut();
        let decoded =
            |item: Payload| Poll::Ready(Some(item.take().map_err(PayloadError::bad_response)));
        loop {
            match this.items.try_recv() {
                Ok(item) => return decoded(item),
                // Every sender is gone: the driver finished (it owned the sender).
                Err(TryRecvError::Disconnected) => return Poll::Ready(this.last.take().map(Err)),
                Err(TryRecvError::Empty) => {}
            }
            let Some(driver) = this.driver.as_mut() else {
                // Done, but a sender outlives the driver: wait on the channel.
                return match this.items.poll_recv(cx) {
                    Poll::Ready(Some(item)) => decoded(item),
                    Poll::Ready(None) => Poll::Ready(this.last.take().map(Err)),
                    Poll::Pending => Poll::Pending,
                };
            };
            match driver.as_mut().poll(cx) {
                Poll::Ready(result) => {
                    this.driver = None;
                    this.last = result.err();
                    // Its sender is dropped now: drain what it sent, then end.
                }
                Poll::Pending => {
                    // What it sent before it waited, if anything; else its
                    // own wakers wake this task.
                    return match this.items.try_recv() {
                        Ok(item) => decoded(item),
                        Err(TryRecvError::Disconnected) => Poll::Ready(this.last.take().map(Err)),
                        Err(TryRecvError::Empty) => Poll::Pending,
                    };
                }
            }
        }
    }
}

/// How often a router is asked again at once when the replica it chose had no
/// room left (another caller took the slot between the look and the take)
/// before the request waits for a slot.
const RACE_RETRIES: usize = 4;

impl DeploymentHandle {
    /// A slot on the replica the deployment's router picks, if it picks one
    /// that has room.
    fn pick(&self, route: &DeploymentRoute, set: &[Arc<ReplicaEndpoint>]) -> Option<Slot> {
        for _ in 0..RACE_RETRIES.min(set.len() + 1) {
            let request = RoutingRequest::new(route.next_random())
                .with_model_id(self.model_id.as_deref())
                .with_preferred_node(self.local_node.as_deref());
            let i = route.choose(&request, set)?;
            if let Some(slot) = set[i].try_acquire() {
                return Some(slot);
            }
            if !set.iter().any(|e| e.has_room()) {
                return None;
            }
        }
        None
    }
}

/// Count a request admitted to routing (if `count`: once per request), as
/// Ray's router counts it (`inc_num_total_requests`, past back-pressure,
/// before a replica is found).
fn admitted(route: &DeploymentRoute, count: bool) {
    if count {
        route
            .stats()
            .assigned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A request running on a replica: holds its slot, and records its outcome and
/// latency on the replica's counters once, when it finishes or is dropped
/// (its caller went away: cancelled).
struct Running {
    slot: Slot,
    started: Instant,
    recorded: bool,
}

impl Running {
    fn new(slot: Slot) -> Self {
        Running {
            slot,
            started: Instant::now(),
            recorded: false,
        }
    }

    fn finish<T>(mut self, result: &Result<T, CallError>) {
        self.recorded = true;
        let outcome = match result {
            Ok(_) => Ok(()),
            Err(e) => Err(ErrorKind::of(e).unwrap_or(ErrorKind::User)),
        };
        self.slot.0.stats().record(outcome, self.started.elapsed());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.recorded {
            self.slot.0.stats().record_cancelled(self.started.elapsed());
        }
    }
}

/// The error of a call to a deployment that failed to deploy and has no
/// replica (`set`): it fails now, as Ray's router raises for a deployment
/// that is not available, instead of waiting for a replica none will start.
fn unavailable(route: &DeploymentRoute, set: &ReplicaSet) -> Option<CallError> {
    (route.is_deploy_failed() && set.is_empty()).then(|| route.deploy_failed_error())
}

/// The `ReplicaHandler` fault point, if armed: the request fails as a panic.
fn injected(ep: &ReplicaEndpoint) -> Option<CallError> {
    if ep.faults.hit(flotilla_core::FaultPoint::ReplicaHandler) {
        let m = "injected fault: ReplicaHandler".to_owned();
        ep.report_panic(m.clone());
        return Some(CallError::Panicked(m));
    }
    None
}

/// Run `call` on the replica holding `slot`: through its batcher when its
/// `route` batches, else its handler. `route` is `None` only when the
/// deployment's route in this process is gone (a request from another
/// process arriving as its deployment is deleted): it runs unbatched.
pub(crate) async fn run(
    route: Option<&DeploymentRoute>,
    slot: Slot,
    call: Call,
) -> Result<Payload, CallError> {
    on_replica(slot, |ep| async move {
        if let Some(route) = route.filter(|r| batches(r, &ep)) {
            // Waits for its batch holding its slot: it counts as load.
            let bytes = encoded_request(call.payload)?;
            ep.batcher(route)
                .submit(bytes, call.model_id)
                .await
                .map(Payload::Encoded)
        } else {
            ep.user.handle(call).instrument(user_span(route, &ep)).await
        }
    })
    .await
}

/// Whether `ep` serves its requests of `route` through its batcher: the
/// route batches and the code accepts batches. Code that does not (a
/// recovered record over a program that changed: deploys refuse it) serves
/// them one by one; its deployment says so.
fn batches(route: &DeploymentRoute, ep: &ReplicaEndpoint) -> bool {
    route.settings().batching_enabled() && ep.user.batched()
}

/// The span a request's user code runs in, under its caller's: its
/// application, deployment and replica, which is what the per-application
/// logging config goes by (a caller's span may name another deployment: the
/// HTTP proxy's names the ingress).
fn user_span(route: Option<&DeploymentRoute>, ep: &ReplicaEndpoint) -> tracing::Span {
    match route {
        Some(r) => tracing::info_span!("replica_call", app = %r.app(),
            deployment = %r.deployment(), replica = %ep.id()),
        None => tracing::Span::none(),
    }
}

/// [`run`] for the streaming handler.
pub(crate) async fn run_stream(
    route: Option<&DeploymentRoute>,
    slot: Slot,
    call: Call,
    items: ItemSender,
) -> Result<(), CallError> {
    on_replica(slot, |ep| async move {
        if let Some(route) = route.filter(|r| batches(r, &ep)) {
            // Batched deployments answer a stream with their one batch response.
            let bytes = encoded_request(call.payload)?;
            let item = ep.batcher(route).submit(bytes, call.model_id).await?;
            let _ = items.send_encoded(item).await;
            Ok(())
        } else {
            ep.user
                .handle_stream(call, items)
                .instrument(user_span(route, &ep))
                .await
        }
    })
    .await
}

/// The frame of every request on a local replica: the `ReplicaHandler` fault
/// point, then `work` holding the slot until it ends or the replica is
/// killed, its outcome recorded on the replica's counters, and a panic
/// reported to the replica.
async fn on_replica<T, Fut>(
    slot: Slot,
    work: impl FnOnce(Arc<ReplicaEndpoint>) -> Fut,
) -> Result<T, CallError>
where
    Fut: Future<Output = Result<T, CallError>>,
{
    let ep = slot.0.clone();
    if let Some(e) = injected(&ep) {
        drop(slot);
        return Err(e);
    }
    let running = Running::new(slot);
    let result = tokio::select! {
        // A replica killed already runs nothing more.
        biased;
        () = ep.killed() => Err(CallError::Killed {
            replica: ep.id().to_string(),
        }),
        r = work(ep.clone()) => r,
    };
    running.finish(&result);
    if let Err(CallError::Panicked(m)) = &result {
        ep.report_panic(m.clone());
    }
    result
}
