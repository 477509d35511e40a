//! The proxy over real sockets: routing, Ray's status codes, streaming,
//! cancellation, timeouts, limits, malformed requests, keep-alive and HTTP/2.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::atomic::Ordering, time::Duration};

use bytes::Bytes;
use flotilla::{ApplicationSpec, ApplicationStatus, DeploymentSpec};
use http_body_util::{BodyExt, Full};
use support::{echo_app, get, send, start, start_with, test_options, wait_routes, wait_status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_longest_prefix_on_segment_boundaries_with_root_catching_the_rest() {
    let f = start().await;
    let c = support::client();
    // Before any route: healthz says so (Ray's "not populated"), and 404s.
    let h = get(&c, &f.url("/-/healthz")).await;
    assert_eq!(
        (h.status, h.body.as_str()),
        (503, "Route table is not populated yet.")
    );
    let nf = get(&c, &f.url("/nothing")).await;
    assert_eq!(nf.status, 404);
    assert_eq!(
        nf.body,
        "Path '/nothing' not found. Ping http://.../-/routes for available routes."
    );
    assert!(
        nf.header("x-request-id").is_some_and(|id| id.len() == 36),
        "{:?}",
        nf.headers
    );

    f.serve
        .run_many(
            vec![
                echo_app("api", "/api", "api"),
                echo_app("apiv2", "/api/v2", "v2"),
                echo_app("root", "/", "root"),
            ],
            Default::default(),
        )
        .await
        .unwrap();
    let tag = |r: &support::Reply| r.json()["tag"].as_str().unwrap_or_default().to_owned();
    for (path, want) in [
        ("/api", "api"),
        ("/api/", "api"),
        ("/api/x", "api"),
        ("/api/v2", "v2"),
        ("/api/v2/deep/er", "v2"),
        ("/api/v20", "api"),
        ("/apix", "root"),
        ("/", "root"),
        ("/other/path", "root"),
    ] {
        let r = get(&c, &f.url(path)).await;
        assert_eq!(
            (r.status, tag(&r)),
            (200, want.to_owned()),
            "{path}: {}",
            r.body
        );
    }
    // What the ingress sees: Ray's ASGI root_path and path.
    let r = get(&c, &f.url("/api/v2/items/3?x=1&y=%20")).await.json();
    assert_eq!(r["path"], "/api/v2/items/3");
    assert_eq!(r["root_path"], "/api/v2");
    assert_eq!(r["route_path"], "/items/3");
    assert_eq!(r["route_prefix"], "/api/v2");
    assert_eq!(r["query"], "x=1&y=%20");
    assert_eq!(get(&c, &f.url("/api")).await.json()["route_path"], "");
    // The path is percent-decoded before matching.
    assert_eq!(tag(&get(&c, &f.url("/api%2Fv2/x")).await), "v2");

    // /-/routes and /-/healthz, now populated.
    let routes = get(&c, &f.url("/-/routes")).await;
    assert_eq!(routes.status, 200);
    assert_eq!(
        routes.json(),
        serde_json::json!({"/": "root", "/api": "api", "/api/v2": "v2".replace("v2", "apiv2")})
    );
    let h = get(&c, &f.url("/-/healthz")).await;
    assert_eq!((h.status, h.body.as_str()), (200, "success"));

    // A redeploy moves a prefix; a delete 404s: the proxy follows without restarting.
    f.serve.run(echo_app("api", "/moved", "api")).await.unwrap();
    wait_routes(&f.serve, |r| {
        r.iter().any(|r| r.prefix.as_str() == "/moved")
    })
    .await;
    assert_eq!(tag(&get(&c, &f.url("/moved/x")).await), "api");
    assert_eq!(tag(&get(&c, &f.url("/api/x")).await), "root");
    f.serve.delete_apps(["root", "apiv2"], true).await.unwrap();
    wait_routes(&f.serve, |r| r.len() == 1).await;
    let gone = get(&c, &f.url("/api/v2/x")).await;
    assert_eq!(gone.status, 404, "{}", gone.body);
    assert!(gone.body.starts_with("Path '/api/v2/x' not found."));
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_kept_or_made_and_sent_back() {
    let f = start().await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    let c = support::client();
    let r = send(
        &c,
        "POST",
        &f.url("/e"),
        &[("x-request-id", "abc-123")],
        "hello",
    )
    .await;
    assert_eq!(r.header("x-request-id"), Some("abc-123"));
    let j = r.json();
    assert_eq!(
        (j["request_id"].as_str(), j["body"].as_str()),
        (Some("abc-123"), Some("hello"))
    );
    assert_eq!(j["method"], "POST");
    assert_eq!(r.header("x-echo-tag"), Some("e"));
    let r = get(&c, &f.url("/e")).await;
    let made = r.header("x-request-id").unwrap().to_owned();
    assert_eq!(r.json()["request_id"].as_str(), Some(made.as_str()));
    assert_eq!(&made[14..15], "4", "a UUIDv4: {made}");
    // An empty or unreadable id is replaced, for the ingress too: it sees
    // the id the response carries.
    for bad in [&b""[..], b"caf\xe9"] {
        let mut req = http::Request::get(f.url("/e"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        req.headers_mut()
            .insert("x-request-id", http::HeaderValue::from_bytes(bad).unwrap());
        let resp = c.request(req).await.unwrap();
        let made = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_eq!(made.len(), 36, "{made}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let j: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(j["request_id"].as_str(), Some(made.as_str()), "{bad:?}");
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_errors_are_500_with_the_users_message_and_wrong_types_name_the_app() {
    let f = start().await;
    let plain = ApplicationSpec::builder("plain")
        .route_prefix("/plain")
        .deployment(DeploymentSpec::builder("words", "t::Plain"))
        .build()
        .unwrap();
    f.serve
        .run_many(vec![echo_app("e", "/e", "e"), plain], Default::default())
        .await
        .unwrap();
    let c = support::client();
    let r = get(&c, &f.url("/e/fail")).await;
    assert_eq!((r.status, r.body.as_str()), (500, "echo asked to fail"));
    let r = get(&c, &f.url("/plain")).await;
    assert_eq!(r.status, 500);
    assert!(
        r.body.contains("Application 'plain'")
            && r.body.contains("'words'")
            && r.body.contains("HttpRequest"),
        "{}",
        r.body
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_replica_is_503_at_once_when_none_can_come_and_back_pressure_is_503() {
    let f = start().await;
    let broken = ApplicationSpec::builder("broken")
        .route_prefix("/broken")
        .deployment(DeploymentSpec::builder("ingress", "t::Broken"))
        .build()
        .unwrap();
    let zero = ApplicationSpec::builder("zero")
        .route_prefix("/zero")
        .deployment(
            DeploymentSpec::builder("ingress", "t::Echo")
                .init_args(&"z")
                .replicas(0),
        )
        .build()
        .unwrap();
    let tight = ApplicationSpec::builder("tight")
        .route_prefix("/tight")
        .deployment(
            DeploymentSpec::builder("ingress", "t::Echo")
                .init_args(&"t")
                .with_config(|c| {
                    c.with_max_ongoing_requests(1)
                        .with_max_queued_requests(Some(1))
                }),
        )
        .build()
        .unwrap();
    f.serve
        .run_many(vec![broken, zero, tight], support::no_wait())
        .await
        .unwrap();
    wait_status(&f.serve, "broken", ApplicationStatus::DeployFailed).await;
    wait_status(&f.serve, "tight", ApplicationStatus::Running).await;
    let c = support::client();
    let r = get(&c, &f.url("/broken")).await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.body,
        "Deployment(name='ingress', app='broken') is unavailable because it failed to deploy."
    );
    let r = get(&c, &f.url("/zero/x")).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("0 replicas"), "{}", r.body);

    // One running (hangs), one queued, the next rejected.
    let started = f.probe.started.notified();
    let hang = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/tight/hang"));
        async move { get(&c, &u).await }
    });
    started.await;
    let queued = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/tight/q"));
        async move { get(&c, &u).await }
    });
    let route = f
        .serve
        .deployment_handle("tight", "ingress")
        .unwrap()
        .route();
    // The queued request reaches the handle's queue on the server's side
    queues(&route, 1, || false).await;
    let r = get(&c, &f.url("/tight/x")).await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.body,
        "Request dropped due to backpressure (num_queued_requests=1, max_queued_requests=1)."
    );
    hang.abort();
    f.probe.wait_dropped(1).await;
    let q = queued.await.unwrap();
    assert_eq!(q.status, 200, "the queued request ran once the slot freed");
    f.stop().await;
}

/// A request waiting for a replica when its application is deleted gets the
/// 503 at once (the module's table), not the end of the replicas' drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_a_replica_as_its_application_goes_is_a_503_at_once() {
    let f = start().await;
    let app = ApplicationSpec::builder("q")
        .route_prefix("/q")
        .deployment(support::quick(
            DeploymentSpec::builder("ingress", "t::Echo")
                .init_args(&"q")
                .with_config(|mut c| {
                    // The hanging request holds its replica for the hour.
                    c.graceful_shutdown_timeout = Duration::from_secs(3600);
                    c.with_max_ongoing_requests(1)
                }),
        ))
        .build()
        .unwrap();
    f.serve.run(app).await.unwrap();
    let c = support::client();
    let started = f.probe.started.notified();
    let hang = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/q/hang"));
        async move { get(&c, &u).await }
    });
    started.await;
    let queued = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/q/waits"));
        async move { get(&c, &u).await }
    });
    let route = f.serve.deployment_handle("q", "ingress").unwrap().route();
    queues(&route, 1, || false).await;
    f.serve.delete_apps(["q"], false).await.unwrap();
    let q = within("the waiting request's answer", queued)
        .await
        .unwrap();
    assert_eq!(
        (q.status, q.body.as_str()),
        (
            503,
            "Deployment(name='ingress', app='q') is unavailable because its application is being deleted."
        )
    );
    hang.abort();
    f.stop().await;
}

/// A request that waits for a busy replica of an ingress whose update
/// failed for good is not given up: the old replica serves on (the handle
/// fails a call only once its ingress has none), so it runs once the slot
/// frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_behind_the_old_replica_of_a_failed_update_is_served() {
    let f = start().await;
    let spec = |code: &str| {
        ApplicationSpec::builder("roll")
            .route_prefix("/roll")
            .deployment(
                DeploymentSpec::builder("ingress", code)
                    .init_args(&"old")
                    .with_config(|c| c.with_max_ongoing_requests(1)),
            )
            .build()
            .unwrap()
    };
    f.serve.run(spec("t::Echo")).await.unwrap();
    let c = support::client();
    let started = f.probe.started.notified();
    let hang = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/roll/hang"));
        async move { get(&c, &u).await }
    });
    started.await;
    f.serve
        .run_many(vec![spec("t::Broken")], support::no_wait())
        .await
        .unwrap();
    wait_status(&f.serve, "roll", ApplicationStatus::DeployFailed).await;
    let route = f
        .serve
        .deployment_handle("roll", "ingress")
        .unwrap()
        .route();
    assert!(route.is_deploy_failed(), "failed for good");
    let queued = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/roll/x"));
        async move { get(&c, &u).await }
    });
    queues(&route, 1, || queued.is_finished()).await;
    hang.abort();
    f.probe.wait_dropped(1).await;
    let r = within("the queued request's answer", queued).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    f.stop().await;
}

/// As Ray's router, the proxy gives up on a request waiting for a replica
/// only when the ingress deployment itself failed to deploy, and never once a
/// replica holds the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_ingress_failing_gives_up_a_waiting_request_and_a_running_one_is_kept() {
    let f = start().await;
    let pair = ApplicationSpec::builder("pair")
        .route_prefix("/pair")
        .deployment(
            DeploymentSpec::builder("ingress", "t::Gated")
                .init_args(&"p")
                .with_config(|c| {
                    c.with_graceful_shutdown(Duration::from_millis(10), Duration::from_millis(200))
                }),
        )
        .deployment(DeploymentSpec::builder("side", "t::Broken"))
        .build()
        .unwrap();
    f.serve
        .run_many(vec![pair], support::no_wait())
        .await
        .unwrap();
    // The other deployment failed, so the application did; its ingress is
    // still starting (its constructor waits for the gate).
    wait_status(&f.serve, "pair", ApplicationStatus::DeployFailed).await;
    let c = support::client();
    let waiting = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/pair/x"));
        async move { get(&c, &u).await }
    });
    let hanging = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/pair/hang"));
        async move { get(&c, &u).await }
    });
    // Both wait in the ingress's queue (or were answered at once).
    let route = f
        .serve
        .deployment_handle("pair", "ingress")
        .unwrap()
        .route();
    queues(&route, 2, || waiting.is_finished() || hanging.is_finished()).await;
    let started = f.probe.started.notified();
    f.probe.constructor_gate.add_permits(1);
    let r = waiting.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    started.await;
    // The request a replica runs is not abandoned as its application goes:
    // it runs until its replica stops (killed after the graceful timeout).
    f.serve.delete_apps(["pair"], false).await.unwrap();
    let r = hanging.await.unwrap();
    assert_eq!(r.status, 500, "{}", r.body);
    assert!(r.body.contains("killed"), "{}", r.body);
    f.stop().await;
}

/// A DEPLOY_FAILED ingress that is not failed for good (its new replica ran,
/// and was lost while the roll was still UPDATING) keeps a request waiting
/// for the replacement, as a handle call waits: only a terminally failed
/// ingress (its route's flag, Ray's `is_available`) is answered 503 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_an_ingress_that_failed_mid_roll_after_its_replica_ran() {
    use flotilla::ReplicaState::{Running, Stopping};
    let f = start().await;
    let version = |tag: &str| {
        ApplicationSpec::builder("roll")
            .route_prefix("/roll")
            .deployment(
                DeploymentSpec::builder("ingress", "t::Gated")
                    .init_args(&tag)
                    // The old replica drains for 5 s once replaced: the roll
                    // stays UPDATING meanwhile.
                    .with_config(|c| {
                        c.with_graceful_shutdown(Duration::from_secs(5), Duration::from_secs(5))
                    }),
            )
            .build()
            .unwrap()
    };
    f.probe.constructor_gate.add_permits(1);
    f.serve.run(version("v1")).await.unwrap();
    f.serve
        .run_many(vec![version("v2")], support::no_wait())
        .await
        .unwrap();
    f.probe.constructor_gate.add_permits(1);
    let new = loop {
        let s = f
            .serve
            .deployment_snapshot("roll", "ingress")
            .await
            .unwrap();
        if let Some(s) = s
            && s.count_at(Running, &s.version) == 1
            && s.count(Stopping) == 1
        {
            break s.replicas.iter().find(|r| r.state == Running).unwrap().id;
        }
        tokio::task::yield_now().await;
    };
    assert!(f.serve.crash_replica("roll", "ingress", new));
    wait_status(&f.serve, "roll", ApplicationStatus::DeployFailed).await;
    let c = support::client();
    let waiting = tokio::spawn({
        let (c, u) = (c.clone(), f.url("/roll/x"));
        async move { get(&c, &u).await }
    });
    let route = f
        .serve
        .deployment_handle("roll", "ingress")
        .unwrap()
        .route();
    queues(&route, 1, || waiting.is_finished()).await;
    assert!(!waiting.is_finished(), "answered at once");
    // The replacement's constructor may finish: it serves the request.
    f.probe.constructor_gate.add_permits(1);
    let r = waiting.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["tag"], "v2");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_is_408_cancels_the_handler_and_frees_its_slot() {
    let f = start_with(
        test_options()
            .request_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    let c = support::client();
    let r = send(
        &c,
        "GET",
        &f.url("/e/hang"),
        &[("x-request-id", "rid-1")],
        Bytes::new(),
    )
    .await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (408, "Request rid-1 timed out after 0.3s.")
    );
    f.probe.wait_dropped(1).await;
    let h = f.serve.deployment_handle("e", "ingress").unwrap();
    assert_eq!(h.replicas()[0].in_flight(), 0);
    // The per-request header overrides the server's timeout.
    let r = send(
        &c,
        "GET",
        &f.url("/e/hang"),
        &[
            ("x-request-id", "rid-2"),
            ("x-request-timeout-seconds", "0.1"),
        ],
        Bytes::new(),
    )
    .await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (408, "Request rid-2 timed out after 0.1s.")
    );
    assert_eq!(get(&c, &f.url("/e/ok")).await.status, 200);
    // A header too long for the clock is no timeout: served, not a panic that
    // drops the connection (1e20 s overflows a Duration, 1e19 s an Instant).
    for huge in ["1e20", "1e19", "inf"] {
        let r = send(
            &c,
            "GET",
            &f.url("/e/ok"),
            &[("x-request-timeout-seconds", huge)],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, 200, "timeout header {huge}: {}", r.body);
    }
    // A body that never finishes arriving times the request out too: 5 of its
    // 10 bytes, then nothing (the connection stays open).
    let handled = f.probe.handled.load(Ordering::SeqCst);
    let answer = stalled_body(
        f.proxy,
        "POST /e/ok HTTP/1.1\r\nHost: x\r\nx-request-id: rid-3\r\nContent-Length: 10\r\n\r\nhello",
        "timed out after 0.3s.",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.ends_with("Request rid-3 timed out after 0.3s."),
        "{answer}"
    );
    assert_eq!(f.probe.handled.load(Ordering::SeqCst), handled);
    f.stop().await;
}

/// Send `head` (a request head and part of its body) on a new connection to
/// `addr`, then nothing more, and read until the answer ends in `until` or the
/// server closes.
async fn stalled_body(addr: std::net::SocketAddr, head: &str, until: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 1024];
        while !out.ends_with(until.as_bytes()) {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    within("an answer to a stalled body", read).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_cut_after_the_keep_alive_timeout() {
    // No request timeout: only the keep-alive bound stands between a client
    // that stops sending mid-body and a connection held for ever.
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    wait_routes(&f.serve, |r| r.len() == 1).await;
    let handled = f.probe.handled.load(Ordering::SeqCst);
    let until = "nothing arrived for 1s.";
    let answer = stalled_body(
        f.proxy,
        "POST /e/ok HTTP/1.1\r\nHost: x\r\nx-request-id: rid-9\r\nContent-Length: 10\r\n\r\nhello",
        until,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.ends_with("Request rid-9's body stalled: nothing arrived for 1s."),
        "{answer}"
    );
    assert_eq!(f.probe.handled.load(Ordering::SeqCst), handled);
    // The REST API's bodies alike.
    let answer = stalled_body(
        f.rest.unwrap(),
        "PUT /api/serve/applications/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\nappl",
        until,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.ends_with(until), "{answer}");
    f.stop().await;
}

/// `step`'s output, or a failure naming `what` if it has not come after 30 s:
/// a watchdog over a step that waits on an event, so that a lost event fails
/// the test and says where instead of holding the run (one such hang was seen
/// in ~90 runs, and not again).
/// Wait (at most 30 s) until `route` holds `n` callers in its queue, or
/// `answered` holds (a request answered without waiting). The route has no
/// queue notification: it looks again after each yield.
async fn queues(route: &flotilla::DeploymentRoute, n: usize, answered: impl Fn() -> bool) {
    within("requests to queue", async {
        while route.queued() < n && !answered() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

async fn within<T>(what: &str, step: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), step).await {
        Ok(out) => out,
        Err(_) => panic!("stuck for 30 s: {what}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_its_request() {
    let f = start().await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    for http2 in [false, true] {
        let before = f.probe.dropped.load(Ordering::SeqCst);
        let started = f.probe.started.notified();
        let c = if http2 {
            support::h2_client()
        } else {
            support::client()
        };
        let url = f.url("/e/hang");
        let call = tokio::spawn(async move { get(&c, &url).await });
        let version = if http2 { "HTTP/2" } else { "HTTP/1.1" };
        within(&format!("the handler starts ({version})"), started).await;
        let h = f.serve.deployment_handle("e", "ingress").unwrap();
        assert_eq!(h.replicas()[0].in_flight(), 1);
        call.abort(); // drops the client and its connection
        within(
            &format!("the disconnect drops the handler ({version})"),
            f.probe.wait_dropped(before + 1),
        )
        .await;
        // The handler's future is dropped a moment before its slot is freed.
        support::until(|| h.replicas()[0].in_flight() == 0).await;
    }
    f.stop().await;
}

/// A GET of `path` over an HTTP/2 connection of its own whose client takes
/// nothing (its window is 0): the response's head (200), held unread, and
/// the client's connection task, which ends when the connection does.
async fn unread_h2(
    f: &support::Fixture,
    path: &str,
) -> (
    http::Response<hyper::body::Incoming>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let tcp = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get(f.url(path))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    (resp, conn)
}

/// A client that takes nothing of a streamed response does not hold its
/// handler, and the replica's slot, for as long as it keeps the stream open:
/// hyper stops polling a body its client does not read (here an HTTP/2
/// window of 0), and the connection is dropped, its stream with it, once
/// nothing was taken for the keep-alive timeout, as a request body that
/// stalls is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_nobody_reads_frees_its_replica() {
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("s", "/s", "s")).await.unwrap();
    let before = f.probe.dropped.load(Ordering::SeqCst);
    let (resp, conn) = unread_h2(&f, "/s/stream-free/100000").await;
    // Read nothing, hold the response.
    within("the unread stream is cut", f.probe.wait_dropped(before + 1)).await;
    let h = f.serve.deployment_handle("s", "ingress").unwrap();
    support::until(|| h.replicas()[0].in_flight() == 0).await;
    let _ = within("the server drops the connection", conn).await;
    drop(resp);
    f.stop().await;
}

/// A client that reads nothing of a response holds neither its connection
/// nor its place under `max_connections` beyond the keep-alive timeout,
/// whatever hyper is stuck on: a streamed response over HTTP/1 once the
/// sockets' buffers are full, a whole one over HTTP/2 with a window of 0
/// (hyper never polls its body). Each held its connection for as long as
/// the client kept it open, so a few such clients locked everyone else out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_loses_its_connection_and_its_place() {
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_millis(500))
            .max_connections(1)
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("s", "/s", "s")).await.unwrap();
    let before = f.probe.dropped.load(Ordering::SeqCst);
    // HTTP/1: a small receive buffer, and a stream far larger than any
    // socket buffer (256 MiB, made only as it is taken), read not at all.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut unread = socket.connect(f.proxy).await.unwrap();
    unread
        .write_all(b"GET /s/stream-big/4096 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    within(
        "the connection is dropped, its stream with it",
        f.probe.wait_dropped(before + 1),
    )
    .await;
    // The only place is free: the next client is served.
    let r = within(
        "a new connection is served",
        get(&support::client(), &f.url("/s/x")),
    )
    .await;
    assert_eq!(r.status, 200);
    // HTTP/2: a whole response (1 MiB) whose body hyper never polls.
    let (resp, conn) = unread_h2(&f, "/s/big").await;
    let _ = within("the server drops the connection", conn).await;
    drop(resp);
    let r = within(
        "a new connection is served",
        get(&support::client(), &f.url("/s/x")),
    )
    .await;
    assert_eq!(r.status, 200);
    drop(unread);
    f.stop().await;
}

/// A whole response is in flight until its client has taken it (its last
/// frame handed to hyper), as a stream is: a client that stops reading a
/// 16 MiB response (more than any socket buffer holds) is counted as gone
/// (499) once it stalls. Handed to hyper in one frame, the request ended at
/// once, counted as served (200) with megabytes still to write, and its
/// connection, idle by then, was closed under its client at twice
/// `keep_alive_timeout`: a client reading steadily but slowly got a
/// truncated body (4 of 16 MiB at a 1 s timeout), where Ray's uvicorn sends
/// it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_response_is_in_flight_until_its_client_takes_it() {
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("w", "/w", "w")).await.unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut unread = socket.connect(f.proxy).await.unwrap();
    unread
        .write_all(b"GET /w/huge HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let counted = f
        .metrics_when(|m| {
            m.contains(r#"ray_serve_num_http_requests_total{route="/w",method="GET""#)
        })
        .await;
    let series = |code: &str| {
        format!(
            r#"ray_serve_num_http_requests_total{{route="/w",method="GET",application="w",status_code="{code}"}} 1"#
        )
    };
    assert!(counted.contains(&series("499")), "{counted}");
    assert!(!counted.contains(&series("200")), "{counted}");
    drop(unread);
    f.stop().await;
}

/// At `max_connections`, a newcomer makes room by closing the connection
/// idle longest (here one that never finished its request head, as a flood
/// of half-open connections holds them), never one with a request in
/// flight, even an older one; it waited for the idle one's timeout before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_a_newcomer_closes_the_idlest_connection_not_a_busy_one() {
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_secs(60))
            .max_connections(2)
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    let h = f.serve.deployment_handle("e", "ingress").unwrap();
    // The older connection is busy: a request its handler holds.
    let mut busy = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    busy.write_all(b"GET /e/hang HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    support::until(|| h.replicas()[0].in_flight() == 1).await;
    // The newer one never finishes its request's head.
    let mut idle = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    idle.write_all(b"GET /e HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let r = within(
        "the newcomer is served",
        get(&support::client(), &f.url("/e/x")),
    )
    .await;
    assert_eq!(r.status, 200);
    let mut buf = [0u8; 64];
    let n = within("the idle connection is closed", idle.read(&mut buf)).await;
    assert!(matches!(n, Err(_) | Ok(0)), "{n:?}");
    assert_eq!(h.replicas()[0].in_flight(), 1, "the busy request was cut");
    drop(busy);
    f.stop().await;
}

/// A streamed response past its request's deadline whose client reads
/// nothing is cut at the deadline (not at the stall bound, nor when the
/// client goes), and recorded as a timeout then, though hyper never polls
/// its body again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_stream_past_its_deadline_is_cut_and_counted_408() {
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_secs(60))
            .request_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("s", "/s", "s")).await.unwrap();
    let before = f.probe.dropped.load(Ordering::SeqCst);
    let (resp, _conn) = unread_h2(&f, "/s/stream-free/100000").await;
    within("the deadline cuts it", f.probe.wait_dropped(before + 1)).await;
    let c = support::client();
    let url = f.rest_url("/metrics");
    let series = r#"ray_serve_num_http_requests_total{route="/s",method="GET",application="s",status_code="408"} 1"#;
    within(
        "the 408 is recorded while the client holds the stream",
        async {
            while !get(&c, &url).await.body.contains(series) {
                tokio::task::yield_now().await;
            }
        },
    )
    .await;
    drop(resp);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chunks_arrive_before_the_handler_ends_over_http1_and_http2() {
    let f = start().await;
    f.serve.run(echo_app("s", "/s", "s")).await.unwrap();
    for (c, version) in [
        (support::client(), http::Version::HTTP_11),
        (support::h2_client(), http::Version::HTTP_2),
    ] {
        let req = http::Request::get(f.url("/s/stream/3"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = c.request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), version);
        assert_eq!(resp.headers()["x-stream"], "yes");
        assert!(resp.headers().get("content-length").is_none(), "streamed");
        let mut body = resp.into_body();
        let mut got = Vec::new();
        for i in 0..3 {
            // The handler waits at the gate before each chunk: this chunk arrives
            // while the handler has not finished (it still holds its slot).
            f.probe.gate.add_permits(1);
            let chunk = loop {
                let frame = body.frame().await.unwrap().unwrap();
                if let Ok(d) = frame.into_data()
                    && !d.is_empty()
                {
                    break d;
                }
            };
            got.push(String::from_utf8_lossy(&chunk).into_owned());
            let h = f.serve.deployment_handle("s", "ingress").unwrap();
            if i < 2 {
                assert_eq!(h.replicas()[0].in_flight(), 1, "handler still running");
            }
        }
        assert_eq!(got.concat(), "token0 token1 token2 ");
        // Then the end (the client's decoder may hand out an empty frame first).
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap_or_default();
            assert!(data.is_empty(), "nothing after the last chunk: {data:?}");
        }
    }
    // A non-streaming answer has a content-length.
    let r = get(&support::client(), &f.url("/s/x")).await;
    assert!(r.header("content-length").is_some());
    // Dropping a streamed response mid-way cancels the handler.
    let before = f.probe.dropped.load(Ordering::SeqCst);
    let c = support::client();
    let resp = c
        .request(
            http::Request::get(f.url("/s/stream/5"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    drop(resp);
    drop(c);
    f.probe.wait_dropped(before + 1).await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_above_the_limit_is_413_and_never_reaches_user_code() {
    let f = start_with(test_options().max_request_body_bytes(1024).build().unwrap()).await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    let c = support::client();
    let handled = f.probe.handled.load(Ordering::SeqCst);
    let r = send(&c, "POST", &f.url("/e"), &[], vec![b'a'; 2048]).await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(
        r.body,
        "Request body is larger than the limit of 1024 bytes."
    );
    // Without a content-length (chunked), the limit holds as the body is read.
    let chunks = futures::stream::iter((0..4).map(|_| {
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(vec![b'b'; 512])))
    }));
    let body = http_body_util::StreamBody::new(chunks);
    let c2: hyper_util::client::legacy::Client<_, http_body_util::StreamBody<_>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let resp = c2
        .request(http::Request::post(f.url("/e")).body(body).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(
        f.probe.handled.load(Ordering::SeqCst),
        handled,
        "user code never ran"
    );
    assert_eq!(
        send(&c, "POST", &f.url("/e"), &[], vec![b'a'; 1024])
            .await
            .status,
        200
    );
    f.stop().await;
}

/// Send raw bytes on a fresh connection and read until the server closes it.
async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A client that goes away before its body is whole is counted as Ray
/// counts a client that went away (499), not as a bad request (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_body_is_counted_499_not_400() {
    let f = start().await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    let handled = f.probe.handled.load(Ordering::SeqCst);
    let mut s = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    s.write_all(b"POST /e HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    drop(s);
    let series = |code: &str| {
        format!(
            r#"ray_serve_num_http_requests_total{{route="/e",method="POST",application="e",status_code="{code}"}} 1"#
        )
    };
    // Waited for by the proxy's own series (the replicas' carry the route
    // too, from the start: a wait on the route alone could end before the
    // request was counted).
    let counted = f
        .metrics_when(|m| m.contains("ray_serve_num_http_requests_total{route=\"/e\""))
        .await;
    assert!(counted.contains(&series("499")), "{counted}");
    assert!(!counted.contains(&series("400")), "{counted}");
    assert_eq!(f.probe.handled.load(Ordering::SeqCst), handled);
    f.stop().await;
}

/// A HEAD's response carries the length the ingress declares (no body
/// follows to contradict it), and a streamed one, whose body hyper never
/// reads, is counted with the status it was sent with, not as a client that
/// went away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_response_keeps_its_declared_length_and_counts_as_sent() {
    let f = start().await;
    f.serve.run(echo_app("h", "/h", "h")).await.unwrap();
    let c = support::client();
    let r = send(&c, "HEAD", &f.url("/h/framing"), &[], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers[http::header::CONTENT_LENGTH], "5");
    assert!(r.body.is_empty());
    // Without a declared length, the body's (which is not sent).
    let r = send(&c, "HEAD", &f.url("/h/big"), &[], "").await;
    assert_eq!((r.status, r.body.as_str()), (200, ""));
    assert_eq!(r.headers[http::header::CONTENT_LENGTH], "1048576");
    let r = send(&c, "HEAD", &f.url("/h/stream-free/2"), &[], "").await;
    assert_eq!(r.status, 200);
    let series = |code: &str| {
        format!(
            r#"ray_serve_num_http_requests_total{{route="/h",method="HEAD",application="h",status_code="{code}"}} 3"#
        )
    };
    let counted = f
        .metrics_when(|m| {
            m.contains(r#"method="HEAD""#) && m.contains(&series("200"))
                || m.contains(r#"status_code="499""#)
        })
        .await;
    assert!(counted.contains(&series("200")), "{counted}");
    assert!(!counted.contains(r#"status_code="499""#), "{counted}");
    f.stop().await;
}

/// The ingress cannot set the response's framing or its request id: two
/// pipelined requests on one connection get two whole responses, each with
/// the proxy's one request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_cannot_set_the_framing_or_the_request_id() {
    let f = start().await;
    f.serve.run(echo_app("root", "/", "r")).await.unwrap();
    let got = raw(
        f.proxy,
        b"GET /framing HTTP/1.1\r\nHost: x\r\nx-request-id: one\r\n\r\n\
          GET /framing HTTP/1.1\r\nHost: x\r\nx-request-id: two\r\nConnection: close\r\n\r\n",
    )
    .await;
    let responses: Vec<&str> = got.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(responses.len(), 2, "{got}");
    for (r, id) in responses.iter().zip(["one", "two"]) {
        assert!(r.starts_with("200"), "{got}");
        assert!(r.ends_with("\r\n\r\nhello world"), "{got}");
        let lower = r.to_ascii_lowercase();
        assert_eq!(lower.matches("content-length: 11\r\n").count(), 1, "{got}");
        assert!(!lower.contains("transfer-encoding"), "{got}");
        assert_eq!(lower.matches("x-request-id").count(), 1, "{got}");
        assert!(lower.contains(&format!("x-request-id: {id}\r\n")), "{got}");
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_http_is_400_and_never_reaches_user_code() {
    let f = start().await;
    f.serve.run(echo_app("root", "/", "r")).await.unwrap();
    let handled = f.probe.handled.load(Ordering::SeqCst);
    let bad = raw(
        f.proxy,
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    )
    .await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    let bad = raw(f.proxy, b"NOT A REQUEST\r\n\r\n").await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    let bad = raw(
        f.proxy,
        b"GET /%FF HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    assert!(bad.ends_with("Invalid request path."), "{bad}");
    assert_eq!(f.probe.handled.load(Ordering::SeqCst), handled);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_serves_many_requests_on_one_connection_and_idles_out() {
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    let stream = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    for i in 0..5 {
        send.ready().await.unwrap();
        let req = http::Request::post(format!("/e/{i}"))
            .header("host", "x")
            .body(Full::new(Bytes::from(format!("n{i}"))))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains(&format!("n{i}")));
    }
    // Idle past keep_alive_timeout: the server closes the connection.
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(
        ended.is_ok(),
        "the idle connection was closed by the server"
    );

    // HTTP/2: many concurrent streams on one connection.
    let (send2, _conn2) = support::h2_connection(f.proxy).await;
    let calls = (0..20).map(|i| {
        let mut s = send2.clone();
        let url = f.url(&format!("/e/{i}"));
        async move {
            let resp = s
                .send_request(
                    http::Request::get(url)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(resp.version(), http::Version::HTTP_2);
            resp.status().as_u16()
        }
    });
    let statuses = futures::future::join_all(calls).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_is_kept_while_a_stream_runs_and_closed_once_idle() {
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("s", "/s", "s")).await.unwrap();
    let (mut send, mut conn) = support::h2_connection(f.proxy).await;
    let resp = send
        .send_request(
            http::Request::get(f.url("/s/stream/2"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The handler waits at the gate for its first chunk. A silent connection
    // is closed keep_alive_timeout after it opens: once three in a row are,
    // the stream has run for over three times that (past an idle close and
    // its goodbye period), and must still be open.
    for _ in 0..3 {
        let mut silent = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "the silent connection was closed"
        );
    }
    f.probe.gate.add_permits(2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"token0 token1 ", "the whole stream, uncut");
    // Its stream over, the connection is idle: the server closes it.
    let ended = tokio::time::timeout(Duration::from_secs(10), &mut conn).await;
    assert!(
        ended.is_ok(),
        "the idle HTTP/2 connection was closed by the server"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_a_connection_still_busy_after_the_grace_period() {
    let mut f = start_with(
        test_options()
            .shutdown_grace(Duration::from_millis(200))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    let probe = f.probe.clone();
    let started = probe.started.notified();
    tokio::pin!(started);
    started.as_mut().enable();
    let hang = tokio::spawn({
        let (c, url) = (support::client(), f.url("/e/hang"));
        async move {
            c.request(
                http::Request::get(url)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
        }
    });
    started.await;
    f.http.take().unwrap().shutdown().await;
    // The grace period over, the connection is closed: the client sees it end
    // without an answer, and the handler is cancelled (the Serve still runs).
    let ended = tokio::time::timeout(Duration::from_secs(10), hang).await;
    assert!(
        matches!(ended, Ok(Ok(Err(_)))),
        "the busy connection was closed at the end of the grace period: {ended:?}"
    );
    f.probe.wait_dropped(1).await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_starts_no_request_is_closed_after_keep_alive_timeout() {
    let f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_millis(200))
            .rest(true)
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("e", "/e", "e")).await.unwrap();
    let rest = f.rest.unwrap();
    // Silent, a partial HTTP/2 preface (hyper-util waits for the rest of it
    // with no timeout of its own), and a partial HTTP/1.1 request head.
    for (addr, sent) in [
        (f.proxy, &b""[..]),
        (f.proxy, b"PRI * HTTP/2"),
        (rest, b""),
        (rest, b"GET /api/serve/applications/ HTTP/1.1\r\nho"),
    ] {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(sent).await.unwrap();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await;
        match read {
            Ok(Ok(n)) => assert!(
                n == 0 || String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
                "{addr} after {sent:?}: {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
            Ok(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Err(_) => panic!("{addr} after {sent:?}: the connection stayed open"),
        }
    }
    // A connection that does send its request in time is served as before.
    let resp = get(&support::client(), &f.url("/e/x")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_path_is_applied_as_ray_applies_it() {
    let f = start_with(test_options().root_path("/serve").build().unwrap()).await;
    f.serve
        .run_many(
            vec![echo_app("a", "/a", "a"), echo_app("r", "/", "r")],
            Default::default(),
        )
        .await
        .unwrap();
    let c = support::client();
    let j = get(&c, &f.url("/a/x")).await.json();
    assert_eq!(
        (
            j["path"].as_str(),
            j["root_path"].as_str(),
            j["route_path"].as_str()
        ),
        (Some("/serve/a/x"), Some("/serve/a"), Some("/x"))
    );
    let j = get(&c, &f.url("/y")).await.json();
    assert_eq!(
        (
            j["path"].as_str(),
            j["root_path"].as_str(),
            j["route_path"].as_str()
        ),
        (Some("/serve/y"), Some("/serve"), Some("/y"))
    );
    f.serve.delete_apps(["r"], true).await.unwrap();
    wait_routes(&f.serve, |r| r.len() == 1).await;
    let nf = get(&c, &f.url("/zzz")).await;
    assert_eq!(
        nf.body,
        "Path '/serve/zzz' not found. Ping http://.../-/routes for available routes."
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_multiplexed_model_id_header_is_the_calls_model_id() {
    let f = start().await;
    let app = ApplicationSpec::builder("mx")
        .route_prefix("/mx")
        .deployment(support::quick(DeploymentSpec::builder(
            "models",
            "t::Models",
        )))
        .build()
        .unwrap();
    f.serve.run(app).await.unwrap();
    let c = support::client();
    // Any case (header names are); '-' for '_' too (Flotilla's own).
    for name in [
        "serve_multiplexed_model_id",
        "Serve-Multiplexed-Model-Id",
        "SERVE_MULTIPLEXED_MODEL_ID",
    ] {
        let r = send(&c, "GET", &f.url("/mx/x"), &[(name, "m1")], "").await;
        assert_eq!((r.status, r.body.as_str()), (200, "model m1: /x"), "{name}");
    }
    // Of two, the last wins, as in Ray's proxy.
    let r = send(
        &c,
        "GET",
        &f.url("/mx/x"),
        &[
            ("serve_multiplexed_model_id", "m1"),
            ("serve-multiplexed-model-id", "m2"),
        ],
        "",
    )
    .await;
    assert_eq!((r.status, r.body.as_str()), (200, "model m2: /x"));
    // None (or an empty one): Ray's empty model id, a 500 from the deployment.
    for headers in [&[][..], &[("serve_multiplexed_model_id", "")][..]] {
        let r = send(&c, "GET", &f.url("/mx/x"), headers, "").await;
        assert_eq!(r.status, 500, "{}", r.body);
        assert!(r.body.contains("cannot be empty"), "{}", r.body);
    }
    // Not a valid model id: 400, never reaching user code.
    let long = "m".repeat(flotilla::MAX_MODEL_ID_LEN + 1);
    let r = send(
        &c,
        "GET",
        &f.url("/mx/x"),
        &[("serve_multiplexed_model_id", &long)],
        "",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body
            .starts_with("Invalid serve_multiplexed_model_id header: the model ID is"),
        "{}",
        r.body
    );
    // The replica's loaded ids are in the REST details.
    let d = get(&c, &f.rest_url("/api/serve/applications/"))
        .await
        .json();
    let replicas = &d["applications"]["mx"]["deployments"]["models"]["replicas"];
    assert_eq!(
        replicas[0]["multiplexed_model_ids"],
        serde_json::json!(["m1", "m2"])
    );
    // UTF-8 text, as Ray's proxy decodes it and as a handle takes it.
    let r = send(
        &c,
        "GET",
        &f.url("/mx/x"),
        &[("serve_multiplexed_model_id", "modèle-ü")],
        "",
    )
    .await;
    assert_eq!((r.status, r.body.as_str()), (200, "model modèle-ü: /x"));
    // Bytes that are not UTF-8: 400.
    let r = raw(
        f.proxy,
        b"GET /mx/x HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\
          serve_multiplexed_model_id: m\xff\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    assert!(r.contains("it is not UTF-8 text"), "{r}");
    f.stop().await;
}

/// The value of the first sample of `name` whose labels include every one
/// of `labels` (`key="value"` fragments).
fn sample(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Ray's batching and multiplexing series, per replica: batch sizes, waits,
/// runs and queue, and the models loaded, with their loads and unloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_and_multiplexing_have_rays_series() {
    let f = start().await;
    let batching = flotilla::BatchConfig::new(4, Duration::from_millis(50));
    let app = ApplicationSpec::builder("mx")
        .route_prefix("/mx")
        .deployment(
            support::quick(DeploymentSpec::builder("models", "t::Models")).with_config(|c| {
                c.with_batching(batching)
                    .with_max_num_models_per_replica(Some(1))
            }),
        )
        .build()
        .unwrap();
    f.serve.run(app).await.unwrap();
    let c = support::client();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let (c, url) = (c.clone(), f.url("/mx/x"));
            tokio::spawn(async move {
                send(&c, "GET", &url, &[("serve_multiplexed_model_id", "m1")], "").await
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().status, 200);
    }
    // A second model takes the one place: m1 is unloaded.
    let r = send(
        &c,
        "GET",
        &f.url("/mx/x"),
        &[("serve_multiplexed_model_id", "m2")],
        "",
    )
    .await;
    assert_eq!((r.status, r.body.as_str()), (200, "model m2: /x"));

    let m = get(&c, &f.rest_url("/metrics")).await.body;
    let of = |name: &str, labels: &[&str]| {
        let mut all = vec![r#"application="mx""#, r#"deployment="models""#];
        all.extend_from_slice(labels);
        sample(&m, name, &all).unwrap_or_else(|| panic!("no {name} {all:?} in:\n{m}"))
    };
    let batch = [r#"function_name="handle_batch""#];
    // Five requests, in at least two batches (one per model).
    assert_eq!(of("ray_serve_actual_batch_size_sum", &batch), 5.0);
    let batches = of("ray_serve_batches_processed_total", &batch);
    assert!(batches >= 2.0, "{batches}");
    assert_eq!(of("ray_serve_actual_batch_size_count", &batch), batches);
    assert_eq!(
        of("ray_serve_batch_execution_time_ms_count", &batch),
        batches
    );
    assert_eq!(
        of("ray_serve_batch_utilization_percent_count", &batch),
        batches
    );
    assert!(of("ray_serve_batch_wait_time_ms_count", &batch) >= batches);
    assert_eq!(of("ray_serve_batch_queue_length", &batch), 0.0);
    // The models: m2 loaded, m1 loaded then unloaded for it.
    assert_eq!(of("ray_serve_num_multiplexed_models", &[]), 1.0);
    assert_eq!(
        of(
            "ray_serve_registered_multiplexed_model_id",
            &[r#"model_id="m2""#]
        ),
        1.0
    );
    assert!(
        sample(
            &m,
            "ray_serve_registered_multiplexed_model_id",
            &[r#"model_id="m1""#]
        )
        .is_none()
    );
    assert_eq!(
        of("ray_serve_multiplexed_models_load_counter_total", &[]),
        2.0
    );
    assert_eq!(
        of("ray_serve_multiplexed_models_unload_counter_total", &[]),
        1.0
    );
    assert_eq!(
        of("ray_serve_multiplexed_model_load_latency_ms_count", &[]),
        2.0
    );
    assert_eq!(
        of("ray_serve_multiplexed_model_unload_latency_ms_count", &[]),
        1.0
    );
    assert!(
        of(
            "ray_serve_multiplexed_get_model_requests_counter_total",
            &[]
        ) >= batches
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_at_max_connections_accepts_no_more_until_one_closes() {
    let f = start_with(
        test_options()
            .max_connections(1)
            .keep_alive_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    )
    .await;
    f.serve.run(echo_app("s", "/s", "s")).await.unwrap();
    // The proxy's one place: a connection whose stream waits at the gate.
    let (mut send, conn) = support::h2_connection(f.proxy).await;
    let resp = send
        .send_request(
            http::Request::get(f.url("/s/stream/1"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // A second connection: the kernel takes it into the backlog, and its
    // request waits there.
    let mut waiting = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    waiting
        .write_all(b"GET /s/x HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // The REST listener has places of its own; a silent connection there is
    // closed keep_alive_timeout after it opens. Once three in a row are, the
    // waiting request has had three times that to be answered, had its
    // connection been accepted.
    for _ in 0..3 {
        let mut silent = tokio::net::TcpStream::connect(f.rest.unwrap())
            .await
            .unwrap();
        let mut buf = [0u8; 8];
        let closed = within("the silent connection is closed", silent.read(&mut buf)).await;
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    }
    let mut buf = [0u8; 256];
    let unanswered = waiting.try_read(&mut buf);
    assert!(
        matches!(&unanswered, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a connection past the limit was served: {unanswered:?}"
    );
    let c = support::client();
    let metrics = get(&c, &f.rest_url("/metrics")).await.body;
    for series in [
        r#"flotilla_http_connections{listener="proxy"} 1"#,
        r#"flotilla_http_max_connections{listener="proxy"} 1"#,
        r#"flotilla_http_connection_limit_reached_total{listener="proxy"} 1"#,
        r#"flotilla_http_max_connections{listener="rest"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    // The stream ends and its connection closes: the waiting one takes the
    // place and is answered.
    f.probe.gate.add_permits(1);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"token0 ");
    drop(send);
    within("the first connection closes", conn)
        .await
        .unwrap()
        .unwrap();
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = within("the waiting request is answered", waiting.read(&mut buf))
            .await
            .unwrap();
        assert!(
            n > 0,
            "closed unanswered: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&buf[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
    f.stop().await;
}

/// A shutdown cuts short a connection already saying goodbye after idling:
/// an HTTP/2 client that never answers the goodbye's PING is closed within
/// the shutdown grace, not at the end of its idle goodbye
/// (keep_alive_timeout) after the server stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_cuts_short_an_idle_connections_goodbye() {
    let mut f = start_with(
        test_options()
            .keep_alive_timeout(Duration::from_secs(10))
            .shutdown_grace(Duration::from_millis(100))
            .build()
            .unwrap(),
    )
    .await;
    let mut sock = tokio::net::TcpStream::connect(f.proxy).await.unwrap();
    // The preface, empty SETTINGS, and one GET / (HPACK: :method GET,
    // :scheme http, :path /, :authority "localhost") ending its stream.
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let block: Vec<u8> = [&[0x82, 0x86, 0x84, 0x41, 9][..], b"localhost"].concat();
    out.extend_from_slice(&[0, 0, block.len() as u8, 1, 0x05, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    sock.write_all(&out).await.unwrap();
    // Read frames (acknowledging nothing) until the idle goodbye's GOAWAY.
    loop {
        let mut head = [0u8; 9];
        sock.read_exact(&mut head).await.unwrap();
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        sock.read_exact(&mut payload).await.unwrap();
        if head[3] == 7 {
            break;
        }
    }
    let http = f.http.take().unwrap();
    let stopping = tokio::spawn(http.shutdown());
    // Closed within the grace (100 ms), not when the goodbye's own bound
    // (keep_alive_timeout, 10 s) runs out: the margin between is wide enough
    // that a loaded machine cannot blur them (this is the wall clock: the
    // connection is a real socket).
    let closed = tokio::time::timeout(Duration::from_secs(7), async {
        let mut buf = [0u8; 1024];
        while sock.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    assert!(
        closed.is_ok(),
        "the connection outlived the shutdown's grace"
    );
    stopping.await.unwrap();
    f.stop().await;
}
