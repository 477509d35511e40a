//! Test support: HTTP ingresses whose behaviour the test steers, a Serve and an
//! HttpServer on loopback port 0, and a real HTTP client (hyper-util's, over
//! HTTP/1.1 or h2c). Tests wait on events (notifications, status watches),
//! never on the wall clock.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use flotilla::{
    ApplicationSpec, ApplicationStatus, Deployment, DeploymentSpec, MultiplexedDeployment,
    Registry, Serve, ServeOptions, UserError,
};
use flotilla_http::{HttpOptions, HttpRequest, HttpResponse, HttpServer};
use futures::{Stream, stream};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tokio::sync::{Notify, Semaphore};

/// What the test holds of its ingresses.
pub struct Probe {
    /// Notified when a `/hang` or `/gated` request starts in user code.
    pub started: Notify,
    /// Handlers dropped before they finished (cancelled).
    pub dropped: AtomicU32,
    /// Notified whenever one is.
    pub dropped_notify: Notify,
    /// Each streamed chunk after the head takes one permit.
    pub gate: Semaphore,
    /// Requests handled.
    pub handled: AtomicU32,
    /// A `t::Gated` constructor stores a permit here when it begins.
    pub constructing: Notify,
    /// Each `t::Gated` constructor takes one permit before it finishes.
    pub constructor_gate: Semaphore,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            started: Notify::new(),
            dropped: AtomicU32::new(0),
            dropped_notify: Notify::new(),
            gate: Semaphore::new(0),
            handled: AtomicU32::new(0),
            constructing: Notify::new(),
            constructor_gate: Semaphore::new(0),
        }
    }
}

impl Probe {
    /// Wait until `n` handlers were cancelled.
    pub async fn wait_dropped(&self, n: u32) {
        loop {
            let notified = self.dropped_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.dropped.load(Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }
}

/// Counts a handler cancelled before it finished.
pub struct DropGuard {
    probe: Arc<Probe>,
    finished: bool,
}

impl DropGuard {
    pub fn new(probe: &Arc<Probe>) -> Self {
        DropGuard {
            probe: probe.clone(),
            finished: false,
        }
    }
    pub fn done(mut self) {
        self.finished = true;
    }
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.probe.dropped.fetch_add(1, Ordering::SeqCst);
            self.probe.dropped_notify.notify_waiters();
        }
    }
}

/// Echoes the request as JSON; `/fail` fails, `/hang` never answers (until
/// cancelled), `/big` answers 1 MiB (`/huge`: 16 MiB), `/bad-header` answers a header whose name
/// is not one; `/stream/N` streams N chunks, each after a
/// gate permit (`/stream-free/N`: without the gate; `/stream-big/N`: without
/// the gate, each chunk 64 KiB).
pub struct Echo {
    tag: String,
    probe: Arc<Probe>,
}

impl Deployment for Echo {
    type Request = HttpRequest;
    type Response = HttpResponse;

    async fn handle(&self, req: HttpRequest) -> Result<HttpResponse, UserError> {
        self.probe.handled.fetch_add(1, Ordering::SeqCst);
        match req.route_path() {
            "/fail" => return Err(UserError::new("echo asked to fail")),
            "/hang" => {
                let guard = DropGuard::new(&self.probe);
                self.probe.started.notify_waiters();
                std::future::pending::<()>().await;
                guard.done();
            }
            "/big" => return Ok(HttpResponse::new(200, vec![b'x'; 1 << 20])),
            "/huge" => return Ok(HttpResponse::new(200, vec![b'x'; 16 << 20])),
            "/framing" => {
                // Headers the proxy sets itself, and a length that is wrong.
                return Ok(HttpResponse::text(200, "hello world")
                    .with_header("Content-Length", "5")
                    .with_header("transfer-encoding", "chunked")
                    .with_header("x-request-id", "the ingress's own"));
            }
            "/bad-header" => {
                return Ok(HttpResponse::text(200, "x").with_header("not a name", "v"));
            }
            _ => {}
        }
        let body = serde_json::json!({
            "tag": self.tag,
            "method": req.method,
            "path": req.path,
            "root_path": req.root_path,
            "route_prefix": req.route_prefix,
            "route_path": req.route_path(),
            "query": req.query,
            "body": String::from_utf8_lossy(&req.body),
            "request_id": req.request_id(),
        });
        Ok(HttpResponse::json(200, &body).with_header("x-echo-tag", self.tag.clone()))
    }

    fn handle_stream(
        &self,
        req: HttpRequest,
    ) -> impl Stream<Item = Result<HttpResponse, UserError>> + Send + '_ {
        let route = req.route_path().to_owned();
        let (gated, big, n) = match (
            route.strip_prefix("/stream/"),
            route.strip_prefix("/stream-free/"),
            route.strip_prefix("/stream-big/"),
        ) {
            (Some(n), _, _) => (true, false, n.parse::<u32>().unwrap_or(0)),
            (_, Some(n), _) => (false, false, n.parse::<u32>().unwrap_or(0)),
            (_, _, Some(n)) => (false, true, n.parse::<u32>().unwrap_or(0)),
            _ => {
                return futures::future::Either::Left(stream::once(self.handle(req)));
            }
        };
        let head = HttpResponse::text(200, "").with_header("x-stream", "yes");
        let guard = DropGuard::new(&self.probe);
        futures::future::Either::Right(stream::unfold(
            (0u32, Some(guard), Some(head)),
            move |(i, guard, head)| async move {
                if let Some(h) = head {
                    return Some((Ok(h), (i, guard, None)));
                }
                if i == n {
                    if let Some(g) = guard {
                        g.done();
                    }
                    return None;
                }
                if gated {
                    self.probe.started.notify_waiters();
                    let permit = self.probe.gate.acquire().await.ok()?;
                    permit.forget();
                }
                let chunk = if big {
                    HttpResponse::chunk(vec![b'x'; 64 << 10])
                } else {
                    HttpResponse::chunk(format!("token{i} "))
                };
                Some((Ok(chunk), (i + 1, guard, None)))
            },
        ))
    }
}

/// Not an HTTP ingress: takes and answers strings.
pub struct Plain;

impl Deployment for Plain {
    type Request = String;
    type Response = String;
    async fn handle(&self, r: String) -> Result<String, UserError> {
        Ok(r)
    }
}

/// A multiplexed HTTP ingress: answers `model <id>: <route path>`.
pub struct Models;

impl MultiplexedDeployment for Models {
    type Request = HttpRequest;
    type Response = HttpResponse;
    type Model = String;
    // Batched through the default handle_batch by a test.
    const BATCHED: bool = true;
    async fn load_model(&self, model_id: &str) -> Result<String, UserError> {
        Ok(model_id.to_owned())
    }
    async fn handle(&self, model: &String, req: HttpRequest) -> Result<HttpResponse, UserError> {
        Ok(HttpResponse::text(
            200,
            format!("model {model}: {}", req.route_path()),
        ))
    }
}

/// The test registry: `t::Echo` (init args: its tag), `t::Gated` (an Echo
/// whose constructor waits for a `constructor_gate` permit), `t::Plain`,
/// `t::Models` (multiplexed), `t::Broken`
/// (its constructor always fails), and the config builder `t.echo:app` (args:
/// `{tag}`; one `ingress` deployment of `t::Echo`).
pub fn registry(probe: &Arc<Probe>) -> Registry {
    let p = probe.clone();
    Registry::new()
        .register("t::Echo", move |ctx| {
            let probe = p.clone();
            async move {
                Ok(Echo {
                    tag: ctx.args()?,
                    probe,
                })
            }
        })
        .unwrap()
        .register("t::Gated", {
            let p = probe.clone();
            move |ctx| {
                let probe = p.clone();
                async move {
                    probe.constructing.notify_one();
                    let permit = probe
                        .constructor_gate
                        .acquire()
                        .await
                        .map_err(|e| UserError::new(e.to_string()))?;
                    permit.forget();
                    Ok(Echo {
                        tag: ctx.args()?,
                        probe,
                    })
                }
            }
        })
        .unwrap()
        .register("t::Plain", |_ctx| async { Ok(Plain) })
        .unwrap()
        .register_multiplexed("t::Models", |_ctx| async { Ok(Models) })
        .unwrap()
        .register("t::Broken", |_ctx| async {
            Err::<Plain, _>(UserError::new("broken on purpose"))
        })
        .unwrap()
        .register_app("t.echo:app", |args: flotilla::Args| async move {
            #[derive(serde::Deserialize)]
            struct A {
                tag: String,
            }
            let a: A = args.decode().map_err(|e| UserError::new(e.to_string()))?;
            ApplicationSpec::builder("unnamed")
                .deployment(DeploymentSpec::builder("ingress", "t::Echo").init_args(&a.tag))
                .build()
                .map_err(|e| UserError::new(e.to_string()))
        })
        .unwrap()
}

/// An application `name` at `prefix` whose ingress echoes with `tag`.
pub fn echo_app(name: &str, prefix: &str, tag: &str) -> ApplicationSpec {
    ApplicationSpec::builder(name)
        .route_prefix(prefix)
        .deployment(quick(
            DeploymentSpec::builder("ingress", "t::Echo").init_args(&tag),
        ))
        .build()
        .unwrap()
}

/// Stopping replicas check for idleness every 10 ms (not Ray's 2 s), so
/// shutdowns and redeploys in tests are quick.
pub fn quick(d: flotilla::DeploymentSpecBuilder) -> flotilla::DeploymentSpecBuilder {
    d.with_config(|mut c| {
        c.graceful_shutdown_wait_loop = Duration::from_millis(10);
        c
    })
}

/// A Serve, its HttpServer (both listeners on 127.0.0.1:0) and the probe.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub serve: Serve,
    pub http: Option<HttpServer>,
    pub probe: Arc<Probe>,
    pub proxy: SocketAddr,
    pub rest: Option<SocketAddr>,
}

impl Fixture {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy)
    }
    pub fn rest_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.rest.expect("REST listener on"))
    }
    /// `/metrics` once `done` holds of it, within 10 s (read again until
    /// then: the proxy records a request when its body ends, which may be
    /// after its client has the answer).
    pub async fn metrics_when(&self, done: impl Fn(&str) -> bool) -> String {
        let (c, url) = (client(), self.rest_url("/metrics"));
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let body = get(&c, &url).await.body;
                if done(&body) {
                    break body;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("/metrics never showed what the test waits for")
    }
    pub async fn stop(mut self) {
        if let Some(h) = self.http.take() {
            h.shutdown().await;
        }
        self.serve.shutdown().await.unwrap();
    }
}

/// Options with both listeners on loopback port 0.
pub fn test_options() -> flotilla_http::HttpOptionsBuilder {
    HttpOptions::builder()
        .port(0)
        .rest_port(0)
        .shutdown_grace(Duration::from_secs(1))
}

/// A `Serve` of the test registry on a fresh store, and no HTTP server.
pub async fn bare_serve() -> (tempfile::TempDir, Serve, Arc<Probe>) {
    let dir = tempfile::tempdir().unwrap();
    let probe = Arc::new(Probe::default());
    let serve =
        Serve::start(ServeOptions::new(registry(&probe)).store_path(dir.path().join("f.redb")))
            .await
            .unwrap();
    (dir, serve, probe)
}

pub async fn start_with(options: HttpOptions) -> Fixture {
    let (dir, serve, probe) = bare_serve().await;
    let http = HttpServer::start(&serve, options).await.unwrap();
    let (proxy, rest) = (
        http.proxy_addr().expect("the proxy listens"),
        http.rest_addr(),
    );
    Fixture {
        dir,
        serve,
        http: Some(http),
        probe,
        proxy,
        rest,
    }
}

pub async fn start() -> Fixture {
    start_with(test_options().build().unwrap()).await
}

/// Wait (on the status watch) until `app` has `status`.
pub async fn wait_status(serve: &Serve, app: &str, status: ApplicationStatus) {
    let mut rx = serve.watch_status(app).expect("app exists");
    tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|s| s.status == status))
        .await
        .expect("status reached in time")
        .expect("app still there");
}

/// Wait (on the route index's subscription) until `pred` holds of it.
pub async fn wait_routes(serve: &Serve, pred: impl Fn(&[flotilla::Route]) -> bool) {
    let mut rx = serve.routes().subscribe();
    let fut = async {
        loop {
            if pred(&serve.routes().routes()) {
                return;
            }
            rx.changed().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .expect("routes in time");
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// An HTTP/1.1 client (keep-alive pool).
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One h2c connection to `addr` of its own (not pooled): its sender, and the
/// task driving it, which ends when the connection closes.
pub async fn h2_connection(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    (send, tokio::spawn(conn))
}

/// An h2c client (HTTP/2 with prior knowledge).
pub fn h2_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
    pub version: http::Version,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Send one request and read the whole response.
pub async fn send(
    client: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    let mut req = http::Request::builder().method(method).uri(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = client
        .request(req.body(Full::new(body.into())).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e:?}"));
    let status = resp.status().as_u16();
    let version = resp.version();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        version,
    }
}

pub async fn get(client: &HttpClient, url: &str) -> Reply {
    send(client, "GET", url, &[], Bytes::new()).await
}

/// `run_many` options that wait for nothing.
pub fn no_wait() -> flotilla::RunManyOptions {
    flotilla::RunManyOptions {
        wait_for_ingress_deployment_creation: false,
        wait_for_applications_running: false,
    }
}

/// Yield until `cond` holds: for the last step of an event another thread is
/// finishing (at most 10 s of wall time, then a failure).
pub async fn until(cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "condition never held");
        tokio::task::yield_now().await;
    }
}
