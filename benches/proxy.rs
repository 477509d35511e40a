//! The proxy against a bare hyper server that answers the same bytes, side by
//! side in one run, driven by the same in-repo load generator (N keep-alive
//! HTTP/1.1 connections, each sending its next request when the last answer is
//! read), at 1, 64 and 512 connections, for a trivial echo and a streamed
//! response. The two servers alternate (bare, proxy, bare, proxy), and each
//! figure is the better of its two rounds. Then the same again open-loop: a
//! fixed offered rate (`FLOTILLA_BENCH_RATE`, default 4,000 req/s) spread over
//! 1, 64 and 512 connections, each connection on its own schedule, so that `p99_at_512_over_p99_at_1` measures what many connections cost
//! rather than the queue 512 closed-loop callers build (`"load": "open"`).
//!
//! Prints one JSON figure per line, as the project's other benchmarks:
//! `{"scenario": "proxy-echo", "metric": "req_per_s", "value": .., "unit": "req/s",
//! "target": "proxy", "connections": 64}`, then the ratios the targets are
//! stated in (`proxy_over_bare_req_per_s`, `p99_at_512_over_p99_at_1`).
//!
//! ```sh
//! cargo bench -p flotilla-benches --bench proxy            # FLOTILLA_BENCH_SECS=2 per round
//! # the proxy alone, for a profiler: one closed-loop round over 1 connection
//! # (FLOTILLA_BENCH_BARE=1: the bare server instead)
//! FLOTILLA_BENCH_PROFILE=/echo FLOTILLA_BENCH_CONNS=1 cargo bench -p flotilla-benches --bench proxy
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    convert::Infallible,
    net::SocketAddr,
    time::{Duration, Instant},
};

use bytes::Bytes;
use flotilla::{
    ApplicationSpec, Deployment, DeploymentSpec, Registry, Serve, ServeOptions, UserError,
};
use flotilla_http::{HttpOptions, HttpRequest, HttpResponse, HttpServer};
use futures::{Stream, stream};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::TokioIo;

/// The allocator a serving program would choose (the scenario benchmarks' too);
/// both servers run in this one process on it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The echo's answer, byte for byte the same from both servers.
const BODY: &[u8] = b"hello from flotilla\n";
/// The streamed answer: these chunks, each its own frame.
const CHUNKS: [&[u8]; 4] = [b"token0 ", b"token1 ", b"token2 ", b"token3\n"];

struct Echo;

impl Deployment for Echo {
    type Request = HttpRequest;
    type Response = HttpResponse;
    async fn handle(&self, _req: HttpRequest) -> Result<HttpResponse, UserError> {
        Ok(HttpResponse::new(200, Bytes::from_static(BODY))
            .with_header("content-type", "text/plain"))
    }
}

struct Streamer;

impl Deployment for Streamer {
    type Request = HttpRequest;
    type Response = HttpResponse;
    async fn handle(&self, _req: HttpRequest) -> Result<HttpResponse, UserError> {
        Ok(HttpResponse::new(200, Bytes::from_static(BODY)))
    }
    fn handle_stream(
        &self,
        _req: HttpRequest,
    ) -> impl Stream<Item = Result<HttpResponse, UserError>> + Send + '_ {
        let head = HttpResponse::new(200, Bytes::new()).with_header("content-type", "text/plain");
        stream::iter(
            std::iter::once(head)
                .chain(
                    CHUNKS
                        .iter()
                        .map(|c| HttpResponse::chunk(Bytes::from_static(c))),
                )
                .map(Ok)
                .collect::<Vec<_>>(),
        )
    }
}

/// The bare server: hyper, the same bytes, no routing.
async fn bare_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let svc_stream = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let streaming = req.uri().path().starts_with("/stream");
                        let _ = req.into_body().collect().await;
                        type B = http_body_util::combinators::BoxBody<Bytes, Infallible>;
                        let body: B = if streaming {
                            let frames = stream::iter(CHUNKS.iter().map(|c| {
                                Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(c)))
                            }));
                            StreamBody::new(frames).boxed()
                        } else {
                            Full::new(Bytes::from_static(BODY)).boxed()
                        };
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .header("content-type", "text/plain")
                                .body(body)
                                .unwrap(),
                        )
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc_stream)
                    .await;
            });
        }
    });
    addr
}

/// One keep-alive HTTP/1.1 connection to `addr`, its driver spawned.
async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// One GET of `path` on `send` once it is ready: its latency in us (from
/// sending to the whole body), after checking it answered 200 with a body.
async fn get_us(
    send: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
) -> u64 {
    send.ready().await.unwrap();
    let req = http::Request::get(path)
        .header("host", "bench")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let t = Instant::now();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let us = t.elapsed().as_micros() as u64;
    debug_assert!(!body.is_empty());
    us
}

/// One round: `conns` connections for `secs`; returns (req/s, p50 ms, p99 ms).
async fn load(addr: SocketAddr, path: &'static str, conns: usize, secs: f64) -> (f64, f64, f64) {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            tokio::spawn(async move {
                let mut send = connect(addr).await;
                let mut latencies = Vec::with_capacity(4096);
                while Instant::now() < deadline {
                    latencies.push(get_us(&mut send, path).await);
                }
                latencies
            })
        })
        .collect();
    let started = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let q = |p: f64| percentile_ms(&all, p);
    (all.len() as f64 / elapsed, q(0.50), q(0.99))
}

/// One open-loop round: `conns` connections that together offer `rate`
/// requests a second for `secs`, each connection sending on its own fixed
/// schedule (connection `i` at `i / rate`, then every `conns / rate`), whatever
/// the answers do; returns (achieved req/s, p50 ms, p99 ms) of the latencies
/// from each request's scheduled time (so a request held back by a slow
/// predecessor on its connection counts its wait: no coordinated omission).
async fn open_load(
    addr: SocketAddr,
    path: &'static str,
    conns: usize,
    rate: f64,
    secs: f64,
) -> (f64, f64, f64) {
    let period = Duration::from_secs_f64(conns as f64 / rate);
    // Every connection is open before the schedule starts: otherwise those
    // still connecting send their overdue requests in one burst.
    let connected = std::sync::Arc::new(tokio::sync::Barrier::new(conns + 1));
    let (start_tx, start_rx) = tokio::sync::watch::channel(None::<tokio::time::Instant>);
    let tasks: Vec<_> = (0..conns)
        .map(|i| {
            let connected = connected.clone();
            let mut start_rx = start_rx.clone();
            tokio::spawn(async move {
                let mut send = connect(addr).await;
                connected.wait().await;
                let start = start_rx.wait_for(Option::is_some).await.unwrap().unwrap();
                let end = start + Duration::from_secs_f64(secs);
                let mut latencies = Vec::new();
                let mut due = start + Duration::from_secs_f64(i as f64 / rate);
                while due < end {
                    tokio::time::sleep_until(due).await;
                    latencies.push(get_us(&mut send, path).await);
                    due += period;
                }
                latencies
            })
        })
        .collect();
    connected.wait().await;
    start_tx
        .send(Some(
            tokio::time::Instant::now() + Duration::from_millis(10),
        ))
        .unwrap();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let q = |p: f64| percentile_ms(&all, p);
    (all.len() as f64 / secs, q(0.50), q(0.99))
}

/// The `p` quantile of sorted latencies in microseconds, in ms.
fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    sorted_us
        .get(((sorted_us.len() as f64 - 1.0) * p) as usize)
        .copied()
        .unwrap_or(0) as f64
        / 1000.0
}

fn figure(scenario: &str, metric: &str, value: f64, unit: &str, extra: serde_json::Value) {
    let mut v = serde_json::json!({"scenario": scenario, "metric": metric,
        "value": (value * 1000.0).round() / 1000.0, "unit": unit});
    if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    println!("{v}");
}

fn main() {
    let secs: f64 = std::env::var("FLOTILLA_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    // The open-loop rounds' offered rate: well below either server's capacity
    // on 2 cores (~20-35k req/s closed-loop), so neither queues.
    let rate: f64 = std::env::var("FLOTILLA_BENCH_RATE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|r: &f64| *r > 0.0)
        .unwrap_or(4000.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::new()
            .register("bench::Echo", |_| async { Ok(Echo) })
            .unwrap()
            .register("bench::Streamer", |_| async { Ok(Streamer) })
            .unwrap();
        let serve = Serve::start(ServeOptions::new(registry).store_path(dir.path().join("b.redb")))
            .await
            .unwrap();
        let app = |name: &str, prefix: &str, path: &str| {
            ApplicationSpec::builder(name)
                .route_prefix(prefix)
                .deployment(
                    DeploymentSpec::builder("ingress", path)
                        .replicas(2)
                        .with_config(|c| c.with_max_ongoing_requests(1_000)),
                )
                .build()
                .unwrap()
        };
        serve
            .run_many(
                vec![
                    app("echo", "/echo", "bench::Echo"),
                    app("stream", "/stream", "bench::Streamer"),
                ],
                Default::default(),
            )
            .await
            .unwrap();
        let http = HttpServer::start(
            &serve,
            HttpOptions::builder().port(0).rest(false).build().unwrap(),
        )
        .await
        .unwrap();
        let proxy = http.proxy_addr().expect("the proxy listens");
        let bare = bare_server().await;
        // Warm both up.
        load(proxy, "/echo", 8, 0.3).await;
        load(bare, "/echo", 8, 0.3).await;
        if let Ok(only) = std::env::var("FLOTILLA_BENCH_PROFILE") {
            // Load the proxy alone (for a profiler): FLOTILLA_BENCH_PROFILE=/echo,
            // over FLOTILLA_BENCH_CONNS connections (64).
            let only: &'static str = Box::leak(only.into_boxed_str());
            let conns = std::env::var("FLOTILLA_BENCH_CONNS")
                .ok()
                .and_then(|c| c.parse().ok())
                .unwrap_or(64);
            let target = if std::env::var("FLOTILLA_BENCH_BARE").is_ok() {
                bare
            } else {
                proxy
            };
            let (rps, p50, p99) = load(target, only, conns, secs).await;
            figure(
                "proxy-profile",
                "req_per_s",
                rps,
                "req/s",
                serde_json::json!({"p50": p50, "p99": p99, "connections": conns}),
            );
            return;
        }
        for (scenario, path) in [("proxy-echo", "/echo"), ("proxy-stream", "/stream")] {
            let mut p99_proxy = Vec::new();
            let mut p99_bare = Vec::new();
            for conns in [1usize, 64, 512] {
                let mut best = [(0.0f64, f64::MAX, f64::MAX); 2];
                for _round in 0..2 {
                    for (i, addr) in [bare, proxy].into_iter().enumerate() {
                        let (rps, p50, p99) = load(addr, path, conns, secs).await;
                        if rps > best[i].0 {
                            best[i] = (rps, p50, p99);
                        }
                    }
                }
                for (i, target) in ["bare", "proxy"].into_iter().enumerate() {
                    let extra = serde_json::json!({"target": target, "connections": conns});
                    figure(scenario, "req_per_s", best[i].0, "req/s", extra.clone());
                    figure(scenario, "p50", best[i].1, "ms", extra.clone());
                    figure(scenario, "p99", best[i].2, "ms", extra);
                }
                figure(
                    scenario,
                    "proxy_over_bare_req_per_s",
                    best[1].0 / best[0].0,
                    "ratio",
                    serde_json::json!({"connections": conns, "target_at_64": 0.7}),
                );
                p99_proxy.push(best[1].2);
                p99_bare.push(best[0].2);
            }
            figure(
                scenario,
                "p99_at_512_over_p99_at_1",
                p99_proxy[2] / p99_proxy[0],
                "ratio",
                serde_json::json!({"target": "proxy", "at_most": 10.0}),
            );
            // The same ratio of the bare server: the floor a closed-loop load sets
            // (at 512 connections every request queues behind up to 511 others).
            figure(
                scenario,
                "p99_at_512_over_p99_at_1",
                p99_bare[2] / p99_bare[0],
                "ratio",
                serde_json::json!({"target": "bare"}),
            );
            figure(
                scenario,
                "proxy_p99_over_bare_p99_at_512",
                p99_proxy[2] / p99_bare[2],
                "ratio",
                serde_json::json!({"connections": 512}),
            );
        }
        // Open loop: the same offered rate over 1, 64 and 512 connections, so
        // the p99 ratio measures what many connections cost the server, not the
        // queue a closed loop of 512 callers builds on 2 cores.
        for (scenario, path) in [("proxy-echo", "/echo"), ("proxy-stream", "/stream")] {
            let mut p99 = [Vec::new(), Vec::new()];
            for conns in [1usize, 64, 512] {
                let mut best = [(0.0f64, f64::MAX, f64::MAX); 2];
                for _round in 0..2 {
                    for (i, addr) in [bare, proxy].into_iter().enumerate() {
                        let r = open_load(addr, path, conns, rate, secs).await;
                        if r.2 < best[i].2 {
                            best[i] = r;
                        }
                    }
                }
                for (i, target) in ["bare", "proxy"].into_iter().enumerate() {
                    let extra = serde_json::json!({"target": target, "connections": conns,
                        "load": "open", "offered_req_per_s": rate});
                    figure(scenario, "req_per_s", best[i].0, "req/s", extra.clone());
                    figure(scenario, "p50", best[i].1, "ms", extra.clone());
                    figure(scenario, "p99", best[i].2, "ms", extra);
                    p99[i].push(best[i].2);
                }
            }
            for (i, target) in ["bare", "proxy"].into_iter().enumerate() {
                figure(
                    scenario,
                    "p99_at_512_over_p99_at_1",
                    p99[i][2] / p99[i][0],
                    "ratio",
                    serde_json::json!({"target": target, "load": "open",
                        "offered_req_per_s": rate, "at_most": 10.0}),
                );
            }
        }
        http.shutdown().await;
        serve.shutdown().await.unwrap();
    });
}
