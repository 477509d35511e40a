//! The HTTP proxy: one request in, routed by longest prefix to its
//! application's ingress through a [`DeploymentHandle`]
//! (so power-of-two-choices, `max_ongoing_requests`, the queue limit and retries
//! all apply), answered with Ray's status codes and bodies (`proxy.py`).
//!
//! | case | status | body |
//! |---|---|---|
//! | no route matches | 404 | `Path '{path}' not found. Ping http://.../-/routes for available routes.` |
//! | queue full (`max_queued_requests`) | 503 | `Request dropped due to backpressure (num_queued_requests={n}, max_queued_requests={m}).` |
//! | no replica, and none coming soon (the ingress DEPLOY_FAILED, the application DELETING, or a fixed target of 0) | 503 | `Deployment(name='{d}', app='{a}') is unavailable because it failed to deploy.` (or `... because its application is being deleted.`, `... because it has 0 replicas.`) |
//! | `request_timeout` passed before the response started | 408 | `Request {id} timed out after {t}s.` |
//! | the handler failed | 500 | the user error's message (no stack) |
//! | the ingress does not take `HttpRequest` / answer `HttpResponse` | 500 | a message naming the application and the deployment |
//! | body above the limit | 413 | `Request body is larger than the limit of {n} bytes.` |
//! | a path that is not valid percent-encoded UTF-8 | 400 | `Invalid request path.` |
//! | a `serve_multiplexed_model_id` header that is not a valid model id | 400 | `Invalid serve_multiplexed_model_id header: {why}.` |
//! | malformed HTTP | 400 | (hyper's; the request never reaches user code) |
//!
//! Without a replica while the ingress can still get one (DEPLOYING, UNHEALTHY,
//! another deployment failed, or autoscaled to zero: a request wakes it) the
//! request waits in the handle's queue until its timeout; if the ingress turns
//! DEPLOY_FAILED or the application DELETING while it still waits for a
//! replica, it gets the 503 at once (never once a replica holds it). A HEAD's
//! response keeps the length the ingress declares. A client that goes away
//! drops its request's future, which cancels the handler and frees its slot
//! (recorded as 499, as Ray).
//!
//! A request's `serve_multiplexed_model_id` header (its name in any case, as
//! Ray's; `serve-multiplexed-model-id` too, which is Flotilla's own; the last
//! such header wins, as in Ray; an empty one is no model id) is the model id
//! of its call ([`DeploymentHandle::with_model_id`](flotilla::DeploymentHandle::with_model_id)).

use std::{
    borrow::Cow,
    convert::Infallible,
    hash::BuildHasher,
    sync::{Arc, atomic::AtomicU64},
    time::{Duration, Instant},
};

use bytes::Bytes;
use flotilla::{
    ApplicationStatus, ApplicationStatusInfo, Assigned, CallError, CallStream, DeploymentHandle,
    Serve,
};
use futures::{FutureExt, StreamExt};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use tracing::Instrument;

use crate::{
    HttpOptions, HttpRequest, HttpResponse, REQUEST_ID_HEADER,
    body::{CLIENT_CLOSED, Done, ProxyBody},
    metrics::{ProxyMetrics, method_index},
    request_body::{BodyReadError, read_whole},
    table::{RouteEntry, RouteFollower, RouteSnapshot},
};

/// The per-request timeout header (Ray's `SERVE_HTTP_REQUEST_TIMEOUT_S_HEADER`):
/// a value > 0 overrides `request_timeout` (one beyond
/// [`flotilla::MAX_DURATION`], or `inf`, disables it, as an infinite one), <= 0
/// disables it, anything else is ignored.
pub const REQUEST_TIMEOUT_HEADER: &str = "x-request-timeout-seconds";

/// Ray's status for a request timeout.
pub(crate) const TIMEOUT_STATUS: u16 = 408;

/// Ray's header for a request's multiplexed model id
/// (`SERVE_MULTIPLEXED_MODEL_ID`), matched after lower-casing and `-` to `_`.
pub const MULTIPLEXED_MODEL_ID_HEADER: &str = "serve_multiplexed_model_id";

/// The last header that names the request's model id: Ray's proxy reads
/// every header and the last `serve_multiplexed_model_id` wins
/// (`setup_request_context_and_handle`); header names are lower case
/// already. The `serve-multiplexed-model-id` spelling is Flotilla's own
/// (proxies in front rewrite `_` to `-`, or drop such names).
fn model_id_header(headers: &http::HeaderMap) -> Option<&HeaderValue> {
    let want = MULTIPLEXED_MODEL_ID_HEADER.as_bytes();
    headers
        .iter()
        .filter(|(name, _)| {
            let n = name.as_str().as_bytes();
            n.len() == want.len()
                && n.iter()
                    .zip(want)
                    .all(|(a, b)| a == b || (*a == b'-' && *b == b'_'))
        })
        .map(|(_, v)| v)
        .last()
}

const TEXT_UTF8: &str = "text/plain; charset=utf-8";

/// Whether an ingress's response header `name` is one the proxy sets itself:
/// the body's framing (`content-length`, `transfer-encoding`) and the request
/// id.
fn is_proxys_own(name: &str) -> bool {
    ["content-length", "transfer-encoding", REQUEST_ID_HEADER]
        .iter()
        .any(|own| name.eq_ignore_ascii_case(own))
}

/// The proxy's shared state.
pub(crate) struct Proxy {
    pub(crate) serve: Serve,
    pub(crate) routes: Arc<RouteFollower>,
    pub(crate) options: Arc<HttpOptions>,
    pub(crate) metrics: Arc<ProxyMetrics>,
    pub(crate) ids: RequestIds,
    /// Set when the server begins to shut down: health checks turn 503.
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// Cuts streamed responses whose clients take nothing.
    pub(crate) reaper: Arc<crate::reaper::Reaper>,
}

/// Ray-shaped request ids (random UUIDv4 text), from a per-process random key.
pub(crate) struct RequestIds {
    key: std::hash::RandomState,
    counter: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds {
            key: std::hash::RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }
}

impl RequestIds {
    pub(crate) fn next(&self) -> String {
        let n = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let hi = self.key.hash_one(n);
        let lo = self.key.hash_one(!n);
        let v = (u128::from(hi) << 64 | u128::from(lo)) & !(0xF << 76) | (0x4 << 76);
        let v = v & !(0x3 << 62) | (0x2 << 62);
        // 8-4-4-4-12 hex digits, written into one allocation.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut id = String::with_capacity(36);
        for i in 0..32 {
            if matches!(i, 8 | 12 | 16 | 20) {
                id.push('-');
            }
            id.push(char::from(HEX[((v >> (124 - 4 * i)) & 0xF) as usize]));
        }
        id
    }
}

/// A response the proxy itself makes: text, with `x-request-id`.
fn text(
    status: u16,
    body: impl Into<Bytes>,
    request_id: &str,
    done: Option<Done>,
) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::full(status, body, done));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_UTF8));
    if let Ok(id) = HeaderValue::from_str(request_id) {
        h.append(HeaderName::from_static(REQUEST_ID_HEADER), id);
    }
    r
}

/// Ray's 408 text: the timeout as a Python float (`5.0`, `0.25`).
fn timeout_text(request_id: &str, timeout: Option<Duration>) -> String {
    match timeout {
        Some(t) => {
            let s = t.as_secs_f64();
            let shown = if s.fract() == 0.0 {
                format!("{s:.1}")
            } else {
                format!("{s}")
            };
            format!("Request {request_id} timed out after {shown}s.")
        }
        None => format!("Request {request_id} timed out."),
    }
}

/// Percent-decode a path as uvicorn does for `scope["path"]` (borrowed when
/// it has nothing to decode).
fn decode_path(raw: &str) -> Option<Cow<'_, str>> {
    percent_encoding::percent_decode_str(raw).decode_utf8().ok()
}

/// The request's timeout: the header's if it has a valid one, else the server's.
/// A header of zero or less, or longer than [`flotilla::MAX_DURATION`], is no
/// timeout (as an infinite one).
fn request_timeout(headers: &http::HeaderMap, default: Option<Duration>) -> Option<Duration> {
    let parsed = headers
        .get(REQUEST_TIMEOUT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| !v.is_nan());
    match parsed {
        Some(s) if s > 0.0 => Duration::try_from_secs_f64(s)
            .ok()
            .filter(|t| *t <= flotilla::MAX_DURATION),
        Some(_) => None,
        None => default,
    }
}

impl Proxy {
    /// Serve one request (never fails: every error is a response).
    pub(crate) async fn handle(
        self: Arc<Self>,
        req: Request<hyper::body::Incoming>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let started = Instant::now();
        let request_id = match req
            .headers()
            .get(REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
        {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ => self.ids.next(),
        };
        let method = method_index(req.method());
        let Some(path) = decode_path(req.uri().path()) else {
            let done = self.unmatched(method, started);
            return Ok(text(400, "Invalid request path.", &request_id, Some(done)));
        };
        let snapshot = self.routes.fresh().await;
        if path == "/-/healthz" || path == "/-/routes" {
            return Ok(self.health_or_routes(&snapshot, &path, method, started, &request_id));
        }
        let Some((_, entry)) = snapshot.router.route(&path) else {
            let done = self.unmatched(method, started);
            let body = not_found(&self.options.root_path, &path);
            return Ok(text(404, body, &request_id, Some(done)));
        };
        let entry = entry.clone();
        drop(snapshot);
        // The path the handler sees: under the server's root path, if any.
        let path = if self.options.root_path.is_empty() {
            path.into_owned()
        } else {
            format!("{}{path}", self.options.root_path)
        };
        let span = tracing::info_span!("http_request", app = %entry.app,
            deployment = %entry.ingress, route = %entry.prefix, request_id = %request_id);
        let done = Done::new(
            entry.stats.clone(),
            method,
            started,
            Some(self.metrics.clone()),
            span.clone(),
        );
        Ok(self
            .forward(req, path, entry, request_id, done)
            .instrument(span)
            .await)
    }

    /// The record of a request no application takes (a 404, a bad path).
    fn unmatched(&self, method: u8, started: Instant) -> Done {
        Done::new(
            self.metrics.unmatched.clone(),
            method,
            started,
            None,
            tracing::Span::none(),
        )
    }

    fn health_or_routes(
        &self,
        snapshot: &RouteSnapshot,
        path: &str,
        method: u8,
        started: Instant,
        request_id: &str,
    ) -> Response<ProxyBody> {
        let routes = path == "/-/routes";
        let stats = if routes {
            &self.metrics.routes
        } else {
            &self.metrics.healthz
        };
        let done = Some(Done::new(
            stats.clone(),
            method,
            started,
            None,
            tracing::Span::none(),
        ));
        let unhealthy = if self.draining.load(std::sync::atomic::Ordering::Acquire) {
            Some("This node is being drained.")
        } else if !self.routes.populated() {
            Some("Route table is not populated yet.")
        } else {
            None
        };
        match (unhealthy, routes) {
            (Some(why), _) => text(503, why, request_id, done),
            (None, false) => text(200, "success", request_id, done),
            (None, true) => {
                let body = snapshot.routes_json.clone();
                let mut r = text(200, body, request_id, done);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                r
            }
        }
    }

    async fn forward(
        &self,
        req: Request<hyper::body::Incoming>,
        path: String,
        entry: Arc<RouteEntry>,
        request_id: String,
        mut done: Done,
    ) -> Response<ProxyBody> {
        // A HEAD's response has no body: what the ingress says its length is
        // is all the client gets (and hyper never reads a body it would drop).
        let is_head = req.method() == http::Method::HEAD;
        let (parts, body) = req.into_parts();
        let limit = self.options.max_request_body_bytes;
        let too_large = || format!("Request body is larger than the limit of {limit} bytes.");
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return text(413, too_large(), &request_id, Some(done));
        }
        // The request's timeout runs from its arrival: a body that comes too
        // slowly times it out too.
        let timeout = request_timeout(&parts.headers, self.options.request_timeout);
        let deadline = timeout
            .and_then(|t| done.started().checked_add(t))
            .map(tokio::time::Instant::from_std);
        let read = read_whole(body, limit, self.options.keep_alive_timeout);
        let read = match deadline {
            Some(d) => tokio::time::timeout_at(d, read).await.ok(),
            None => Some(read.await),
        };
        let Some(read) = read else {
            done.status = TIMEOUT_STATUS;
            let body = timeout_text(&request_id, timeout);
            return text(TIMEOUT_STATUS, body, &request_id, Some(done));
        };
        let body = match read {
            Ok(b) => b,
            Err(BodyReadError::TooLarge { .. }) => {
                return text(413, too_large(), &request_id, Some(done));
            }
            Err(e @ (BodyReadError::Stalled { .. } | BodyReadError::TooSlow { .. })) => {
                done.status = TIMEOUT_STATUS;
                let body = format!("Request {request_id}'s body stalled: {e}.");
                return text(TIMEOUT_STATUS, body, &request_id, Some(done));
            }
            Err(e @ BodyReadError::ClientGone(_)) => {
                // Nobody reads the answer: counted as Ray counts a client
                // that went away.
                tracing::debug!(error = %e, "the client went away mid-body");
                return text(
                    CLIENT_CLOSED,
                    "Client disconnected.",
                    &request_id,
                    Some(done),
                );
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the request body failed");
                return text(
                    400,
                    "The request body could not be read.",
                    &request_id,
                    Some(done),
                );
            }
        };
        // The ingress sees one `x-request-id`, the response's: the client's
        // when the proxy took it, else the one the proxy made (never an empty
        // or unreadable one beside it).
        let mut headers: Vec<(String, String)> = Vec::with_capacity(parts.headers.len() + 1);
        headers.extend(
            parts
                .headers
                .iter()
                .filter(|(n, _)| n.as_str() != REQUEST_ID_HEADER)
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                }),
        );
        headers.push((REQUEST_ID_HEADER.to_owned(), request_id.clone()));
        let request = HttpRequest {
            method: parts.method.as_str().to_owned(),
            path,
            root_path: entry.root_path.clone(),
            route_prefix: entry.prefix.clone(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            headers,
            body,
        };
        let handle = match entry.handle(&self.serve) {
            Ok(h) => h.clone(),
            Err(e) => {
                tracing::warn!(error = %e, "no handle for the route's ingress");
                return text(
                    503,
                    unavailable(&entry, "its application is being deleted"),
                    &request_id,
                    Some(done),
                );
            }
        };
        // UTF-8, as Ray's proxy decodes it (`value.decode()`): the ids a
        // handle takes, not only visible ASCII.
        let model_id = model_id_header(&parts.headers).map(|v| std::str::from_utf8(v.as_bytes()));
        let handle = match model_id {
            None => handle,
            Some(Ok("")) => handle,
            Some(Ok(id)) => match handle.with_model_id(id) {
                Ok(h) => h,
                Err(e) => {
                    let body = format!("Invalid {MULTIPLEXED_MODEL_ID_HEADER} header: {e}.");
                    return text(400, body, &request_id, Some(done));
                }
            },
            Some(Err(_)) => {
                let body =
                    format!("Invalid {MULTIPLEXED_MODEL_ID_HEADER} header: it is not UTF-8 text.");
                return text(400, body, &request_id, Some(done));
            }
        };
        // No replica now: answer at once if none can come soon; else wait (in the
        // handle's queue) but give up if the ingress fails before the request
        // holds a replica (as Ray's router, which checks when it assigns: a
        // request a replica runs is never abandoned for a status).
        let no_replica = handle.replicas().is_empty();
        if no_replica && let Some(why) = self.unavailable_now(&entry, &handle) {
            return text(503, why, &request_id, Some(done));
        }
        // By value: an ingress of this process that takes `HttpRequest` gets it
        // without encoding.
        let mut stream: CallStream<HttpResponse> = handle.call_stream_owned(request);
        let assigned = stream.assigned();
        let gave_up = async {
            // Polled after the stream (biased, below): a request that holds a
            // replica from its first poll (most do) never watches anything,
            // so one that a replica of another process then refuses waits for
            // the next without giving up, as every request did before (a
            // watch per request cost about 4% of the proxy's throughput).
            if assigned.get() {
                return std::future::pending().await;
            }
            self.became_unavailable(&entry, &handle, &assigned).await
        };
        let expired = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        // The stream first: a request that gets a replica at once holds it
        // before its give-up is first polled.
        let first = tokio::select! {
            biased;
            first = stream.next() => first,
            why = gave_up => return text(503, why, &request_id, Some(done)),
            () = expired => {
                done.status = TIMEOUT_STATUS;
                return text(TIMEOUT_STATUS, timeout_text(&request_id, timeout), &request_id, Some(done));
            }
        };
        let head = match first {
            Some(Ok(head)) => head,
            Some(Err(e)) => {
                return self.refuse(&entry, &handle, e, parts.uri.path(), &request_id, done);
            }
            None => {
                let body = format!(
                    "The ingress deployment '{}' of application '{}' answered with an empty stream.",
                    entry.ingress, entry.app
                );
                return text(500, body, &request_id, Some(done));
            }
        };
        // One item and done (every deployment that does not stream): send it whole.
        let (whole, pending) = match stream.next().now_or_never() {
            Some(None) => (true, vec![head.body.clone()]),
            Some(Some(Ok(next))) => (false, vec![head.body.clone(), next.body]),
            Some(Some(Err(e))) => {
                return self.refuse(&entry, &handle, e, parts.uri.path(), &request_id, done);
            }
            None => (false, vec![head.body.clone()]),
        };
        // The head is checked before the body takes `done`: a head that cannot
        // be sent is answered, and recorded, as the 500 it becomes.
        let mut builder = Response::builder().status(head.status);
        // No body follows (a HEAD's response, a 1xx, 204 or 304): the body is
        // never read, and a length the ingress gives is only what it says.
        let bodyless = is_head || matches!(head.status, 100..=199 | 204 | 304);
        for (name, value) in &head.headers {
            // The framing is the server's: a length the ingress declares
            // that its body does not have would corrupt a kept-alive
            // connection. The request id is the proxy's, sent once, below.
            let declared_length = is_head && name.eq_ignore_ascii_case("content-length");
            if is_proxys_own(name) && !declared_length {
                tracing::debug!(header = %name, app = %entry.app,
                    "an ingress's response header the proxy sets itself: dropped");
                continue;
            }
            builder = builder.header(name.as_str(), value.as_str());
        }
        let mut parts = match builder.body(()) {
            Ok(r) => r.into_parts().0,
            Err(e) => {
                let why = format!(
                    "The ingress deployment '{}' of application '{}' answered with an invalid status or header: {e}",
                    entry.ingress, entry.app
                );
                tracing::warn!(%why);
                return text(500, why, &request_id, Some(done));
            }
        };
        if let Ok(id) = HeaderValue::from_str(&request_id) {
            parts
                .headers
                .append(HeaderName::from_static(REQUEST_ID_HEADER), id);
        }
        let body = if whole {
            let mut pending = pending;
            // A HEAD's response whose length the ingress declared goes with
            // that header and no body (hyper takes an empty body's 0 for the
            // HEAD's); without one, hyper gives the body's length and sends
            // no body.
            let declared = head
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
            let bytes = if is_head && declared {
                Bytes::new()
            } else {
                pending.pop().unwrap_or_default()
            };
            ProxyBody::full(head.status, bytes, Some(done))
        } else {
            let pending = pending.into_iter().filter(|b| !b.is_empty()).collect();
            let stream = (stream, &*self.reaper);
            ProxyBody::stream(head.status, pending, stream, deadline, done, bodyless)
        };
        Response::from_parts(parts, body)
    }

    /// Why the ingress cannot get a replica soon, if it cannot: read from
    /// state at hand (the status board, the route), never by asking an actor,
    /// so a burst of requests to a deployment without replicas costs its
    /// DeploymentActor nothing.
    fn unavailable_now(&self, entry: &RouteEntry, handle: &DeploymentHandle) -> Option<String> {
        let status = self.serve.app_status(&entry.app);
        if let Some(why) = hopeless(entry, &status, handle) {
            return Some(why);
        }
        handle
            .route()
            .zero_target()
            .then(|| unavailable(entry, "it has 0 replicas"))
    }

    /// Resolves once the ingress can no longer get a replica soon while the
    /// request (`assigned`) holds none; never once it holds one. The status
    /// is looked up from the first moment the request waits.
    async fn became_unavailable(
        &self,
        entry: &RouteEntry,
        handle: &DeploymentHandle,
        assigned: &Assigned,
    ) -> String {
        // Both watched: the status may turn hopeless while the request holds
        // a replica, and the request lose it again (a refusal elsewhere).
        let mut held = assigned.subscribe();
        let mut status: Option<tokio::sync::watch::Receiver<ApplicationStatusInfo>> = None;
        let mut status_gone = false;
        loop {
            let holds = *held.borrow_and_update();
            if !holds && status.is_none() && !status_gone {
                status = self.serve.watch_status(&entry.app);
                status_gone = status.is_none();
            }
            let why = match &mut status {
                _ if status_gone => Some(unavailable(entry, "its application is being deleted")),
                // The route's flag and replicas are read as the status
                // changes; a flag set while the request waits fails its
                // call itself.
                Some(rx) => hopeless(entry, &rx.borrow_and_update(), handle),
                None => None,
            };
            if let Some(why) = why.filter(|_| !holds) {
                return why;
            }
            let status_changed = async {
                match &mut status {
                    Some(rx) => rx.changed().await.is_err(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                gone = status_changed, if !status_gone => status_gone = gone,
                // The call's own sender lives as long as its stream.
                _ = held.changed() => {}
            }
        }
    }

    /// The answer to a call that failed before its response started: its status
    /// and text, and for a back-pressure rejection the deployment's
    /// `backpressure_config` (503 or 429, and `Retry-After` when set).
    fn refuse(
        &self,
        entry: &RouteEntry,
        handle: &DeploymentHandle,
        e: CallError,
        raw_path: &str,
        request_id: &str,
        mut done: Done,
    ) -> Response<ProxyBody> {
        let backpressure =
            matches!(e, CallError::BackPressure { .. }).then(|| handle.route().backpressure());
        let (mut status, body) = self.error_response(entry, handle, e, raw_path);
        if let Some(b) = backpressure {
            status = b.status_code.code();
        }
        done.status = status;
        let mut r = text(status, body, request_id, Some(done));
        if let Some(after) = backpressure.and_then(|b| b.retry_after) {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }

    /// The status and body of a failed call, before the response started
    /// (`raw_path`: the request's path as it came, for a 404).
    fn error_response(
        &self,
        entry: &RouteEntry,
        handle: &DeploymentHandle,
        e: CallError,
        raw_path: &str,
    ) -> (u16, String) {
        match e {
            CallError::User(m) | CallError::Panicked(m) => (500, m),
            CallError::Killed { .. }
            | CallError::NodeLost { .. }
            | CallError::BatchSize { .. }
            | CallError::ModelLoad { .. } => (500, e.to_string()),
            // Its request type is not an HttpRequest, or that type's own
            // serde code failed (or panicked) on this request.
            CallError::BadRequest(m) => (
                500,
                format!(
                    "Application '{}': its ingress deployment '{}' could not take the request as an HttpRequest ({m}).",
                    entry.app, entry.ingress
                ),
            ),
            CallError::BadResponse(m) => (
                500,
                format!(
                    "Application '{}': its ingress deployment '{}' did not answer with an HttpResponse ({m}).",
                    entry.app, entry.ingress
                ),
            ),
            CallError::BackPressure { queued, .. } => {
                let max = handle.route().max_queued().map_or(queued as u64, u64::from);
                (
                    503,
                    format!(
                        "Request dropped due to backpressure (num_queued_requests={queued}, max_queued_requests={max})."
                    ),
                )
            }
            // Its application was deleted while the request waited: the
            // same answer as a path no route matches.
            CallError::NotFound { .. } => (
                404,
                not_found(
                    &self.options.root_path,
                    &decode_path(raw_path).unwrap_or(Cow::Borrowed(raw_path)),
                ),
            ),
            CallError::Unavailable { .. } => (503, unavailable(entry, "Flotilla is shutting down")),
            // The ingress failed to deploy as the request came (answered
            // before the call when it already had).
            CallError::DeployFailed { .. } => (503, unavailable(entry, "it failed to deploy")),
            CallError::Timeout { .. } => (TIMEOUT_STATUS, e.to_string()),
        }
    }
}

/// Ray's 404 text for `path` (decoded) under the server's `root_path`.
fn not_found(root_path: &str, path: &str) -> String {
    format!("Path '{root_path}{path}' not found. Ping http://.../-/routes for available routes.")
}

/// Ray's `DeploymentUnavailableError` text, with Flotilla's reason.
fn unavailable(entry: &RouteEntry, reason: &str) -> String {
    format!(
        "Deployment(name='{}', app='{}') is unavailable because {reason}.",
        entry.ingress, entry.app
    )
}

/// Why the ingress (`handle`) of an application in `status` cannot get a
/// replica soon, if it cannot: the application is going, or the ingress
/// deployment itself failed to deploy for good and has no replica left (its
/// route's flag: Ray's `is_available`, which only a terminally failed
/// deployment loses; a DEPLOY_FAILED ingress whose new replica ran still gets
/// replicas, and so does one whose application failed through another
/// deployment, or that is unhealthy; one whose update failed serves on with
/// its old replicas, and the handle fails a call itself once it has none).
/// An ingress the status does not list goes by the application's status.
fn hopeless(
    entry: &RouteEntry,
    status: &ApplicationStatusInfo,
    handle: &DeploymentHandle,
) -> Option<String> {
    let failed = || Some(unavailable(entry, "it failed to deploy"));
    match status.status {
        ApplicationStatus::Deleting | ApplicationStatus::NotStarted => {
            return Some(unavailable(entry, "its application is being deleted"));
        }
        ApplicationStatus::Deploying | ApplicationStatus::Running => return None,
        ApplicationStatus::DeployFailed | ApplicationStatus::Unhealthy => {}
    }
    if !handle.replicas().is_empty() {
        return None;
    }
    match status.deployments.get(entry.ingress.as_str()) {
        Some(_) if handle.route().is_deploy_failed() => failed(),
        Some(_) => None,
        None => failed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_distinct_uuid_v4_text() {
        let ids = RequestIds::default();
        let a = ids.next();
        let b = ids.next();
        assert_ne!(a, b);
        for id in [a, b] {
            let groups: Vec<&str> = id.split('-').collect();
            let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
            assert_eq!(lens, [8, 4, 4, 4, 12], "{id}");
            assert!(
                id.chars()
                    .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            );
            assert!(groups[2].starts_with('4'), "version 4: {id}");
            assert!(
                matches!(&groups[3][..1], "8" | "9" | "a" | "b"),
                "variant: {id}"
            );
        }
    }

    #[test]
    fn a_timeout_header_beyond_the_longest_duration_is_no_timeout() {
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(REQUEST_TIMEOUT_HEADER, v.parse().unwrap());
            request_timeout(&h, Some(Duration::from_secs(7)))
        };
        assert_eq!(with("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(with("1e9"), Some(flotilla::MAX_DURATION));
        for none in ["1e20", "1e10", "inf", "0", "-1"] {
            assert_eq!(with(none), None, "{none}");
        }
        // Not a number: the server's.
        for default in ["soon", "NaN"] {
            assert_eq!(with(default), Some(Duration::from_secs(7)), "{default}");
        }
    }

    #[test]
    fn a_path_without_escapes_is_borrowed() {
        assert!(matches!(decode_path("/a/b"), Some(Cow::Borrowed("/a/b"))));
        assert_eq!(decode_path("/a%20b").as_deref(), Some("/a b"));
        assert_eq!(decode_path("/%ff"), None);
    }
}
