//! What a ServeConfig says about HTTP, applied: `http_options` and
//! `proxy_location` taken when the server starts, the deployments'
//! `backpressure_config` on rejections, and Ray's external-scaler route.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::Arc, time::Duration};

use flotilla::{
    ApplicationSpec, ApplicationStatus, DeploymentSpec, Serve, ServeConfig, ServeOptions,
};
use flotilla_http::{HttpError, HttpServer};
use http_body_util::BodyExt;
use support::{Probe, get, send, test_options, wait_routes, wait_status};

async fn serve_with(yaml: &str) -> (tempfile::TempDir, Serve, Arc<Probe>) {
    let (dir, serve, probe) = support::bare_serve().await;
    serve
        .apply_config(ServeConfig::from_yaml(yaml).unwrap())
        .await
        .unwrap();
    (dir, serve, probe)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configs_http_options_are_the_servers_when_it_starts() {
    let (_dir, serve, _probe) = serve_with(
        "http_options: {root_path: /serve, request_timeout_s: 0.5, port: 0}
applications:
  - {name: one, route_prefix: /one, import_path: t.echo:app, args: {tag: first}}
",
    )
    .await;
    wait_status(&serve, "one", ApplicationStatus::Running).await;
    // The program asks port 8123 and no timeout; the config's port 0, root_path
    // and timeout win.
    let http = HttpServer::start(&serve, test_options().port(8123).build().unwrap())
        .await
        .unwrap();
    let proxy = http.proxy_addr().unwrap();
    assert_ne!(proxy.port(), 8123);
    wait_routes(&serve, |r| r.len() == 1).await;
    let c = support::client();
    let r = get(&c, &format!("http://{proxy}/one/x")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["root_path"], "/serve/one");
    let slow = get(&c, &format!("http://{proxy}/one/hang")).await;
    assert_eq!(slow.status, 408, "{}", slow.body);
    assert!(
        slow.body.ends_with("timed out after 0.5s."),
        "{}",
        slow.body
    );
    http.shutdown().await;
    serve.shutdown().await.unwrap();
}

/// A checkpoint whose applied config an earlier Flotilla accepted with
/// `http_options` a rule tightened since refuses (`root_path` ending in `/`):
/// the server does not start on them, and says the applied config is why (not
/// the program's own options); a valid config applied lets it start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_http_options_that_break_a_newer_rule_are_named_as_the_applied_configs() {
    let (dir, serve, probe) = support::bare_serve().await;
    serve.shutdown().await.unwrap();
    let mut older = ServeConfig::from_yaml("applications: []\n").unwrap();
    older.http_options.root_path = Some("/serve/".to_owned());
    assert!(older.validate().is_err(), "the rule this test stands on");
    let path = dir.path().join("f.redb");
    let (store, _) = flotilla_store::Store::open(&path).unwrap();
    let mut batch = flotilla_store::Batch::new();
    batch.put_config(&older).unwrap();
    store.commit(&batch).unwrap();
    store.close();

    let serve = Serve::start(ServeOptions::new(support::registry(&probe)).store_path(&path))
        .await
        .unwrap();
    let Err(e) = HttpServer::start(&serve, test_options().build().unwrap()).await else {
        panic!("started on the applied config's invalid http_options");
    };
    assert!(matches!(e, HttpError::AppliedConfigOptions(_)), "{e:?}");
    assert!(
        e.to_string().contains("root_path") && e.to_string().contains("applied config"),
        "{e}"
    );
    serve
        .apply_config(ServeConfig::from_yaml("applications: []\n").unwrap())
        .await
        .unwrap();
    let http = HttpServer::start(&serve, test_options().build().unwrap())
        .await
        .unwrap();
    http.shutdown().await;
    serve.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_that_names_no_proxy_location_leaves_a_disabled_proxy_off() {
    // The program turns its proxy off; a config that does not say
    // `proxy_location` (here: no http_options at all) does not turn it back on.
    let (_dir, serve, _probe) = serve_with("applications: []\n").await;
    let http = HttpServer::start(&serve, test_options().proxy(false).build().unwrap())
        .await
        .unwrap();
    assert_eq!(http.proxy_addr(), None);
    http.shutdown().await;
    // Off loopback with no token: nothing listens there, so it starts.
    let http = HttpServer::start(
        &serve,
        test_options().host("0.0.0.0").proxy(false).build().unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(http.proxy_addr(), None);
    http.shutdown().await;
    serve.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_location_disabled_starts_no_proxy_and_tls_is_refused() {
    let (_dir, serve, _probe) = serve_with("proxy_location: Disabled\napplications: []\n").await;
    let http = HttpServer::start(&serve, test_options().build().unwrap())
        .await
        .unwrap();
    assert_eq!(http.proxy_addr(), None);
    let rest = http.rest_addr().unwrap();
    let c = support::client();
    assert_eq!(
        get(&c, &format!("http://{rest}/api/ray/version"))
            .await
            .status,
        200
    );
    http.shutdown().await;
    // A disabled proxy binds nothing, so its host needs no token (nothing
    // listens off loopback).
    let http = HttpServer::start(&serve, test_options().host("0.0.0.0").build().unwrap())
        .await
        .unwrap();
    assert_eq!(http.proxy_addr(), None);
    http.shutdown().await;
    // Any ssl_* field asks for TLS: a CA bundle alone (client certificates) too.
    for (http_options, field) in [
        (
            "{ssl_keyfile: /k.pem, ssl_certfile: /c.pem}",
            "http_options.ssl_certfile",
        ),
        ("{ssl_ca_certs: /ca.pem}", "http_options.ssl_ca_certs"),
    ] {
        let yaml = format!("http_options: {http_options}\napplications: []\n");
        serve
            .apply_config(ServeConfig::from_yaml(&yaml).unwrap())
            .await
            .unwrap();
        let err = HttpServer::start(&serve, test_options().build().unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, HttpError::AppliedConfigOptions(inner)
                if matches!(**inner, HttpError::InvalidOption { field: f, .. } if f == field)),
            "{err}"
        );
    }
    serve.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backpressure_config_answers_429_with_retry_after() {
    let (_dir, serve, probe) = serve_with("applications: []\n").await;
    let app = ApplicationSpec::builder("bp")
        .route_prefix("/bp")
        .deployment(support::quick(
            DeploymentSpec::builder("ingress", "t::Echo")
                .init_args(&"bp")
                .with_config(|c| {
                    c.with_max_ongoing_requests(1)
                        .with_max_queued_requests(Some(1))
                        .with_backpressure(flotilla::BackpressureConfig {
                            status_code: flotilla::BackpressureStatus::TooManyRequests,
                            retry_after: Some(Duration::from_millis(1500)),
                        })
                }),
        ))
        .build()
        .unwrap();
    serve.run(app).await.unwrap();
    let http = HttpServer::start(&serve, test_options().build().unwrap())
        .await
        .unwrap();
    let proxy = http.proxy_addr().unwrap();
    wait_routes(&serve, |r| r.len() == 1).await;
    let c = support::client();
    // One running, one queued: the third is rejected.
    let url = format!("http://{proxy}/bp/hang");
    let (c1, u1) = (c.clone(), url.clone());
    let running = tokio::spawn(async move { get(&c1, &u1).await });
    support::until(|| probe.handled.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    let (c2, u2) = (c.clone(), url.clone());
    let queued = tokio::spawn(async move { get(&c2, &u2).await });
    support::until(|| serve.app_handle("bp").unwrap().route().queued() == 1).await;
    let rejected = get(&c, &url).await;
    assert_eq!(rejected.status, 429, "{}", rejected.body);
    assert_eq!(rejected.header("retry-after"), Some("2"));
    assert!(rejected.body.contains("backpressure"), "{}", rejected.body);
    running.abort();
    queued.abort();
    http.shutdown().await;
    serve.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rays_scale_route_sets_an_external_scalers_count() {
    let (_dir, serve, probe) = serve_with("applications: []\n").await;
    let scaled = ApplicationSpec::builder("ext")
        .route_prefix("/ext")
        .external_scaler_enabled(true)
        .deployment(support::quick(
            DeploymentSpec::builder("ingress", "t::Echo").init_args(&"x"),
        ))
        .build()
        .unwrap();
    serve
        .run_many(
            vec![scaled, support::echo_app("plain", "/plain", "p")],
            Default::default(),
        )
        .await
        .unwrap();
    let http = HttpServer::start(&serve, test_options().build().unwrap())
        .await
        .unwrap();
    let rest = http.rest_addr().unwrap();
    let c = support::client();
    let post = |path: &str, body: &'static str| {
        let c = c.clone();
        let url = format!("http://{rest}{path}");
        async move {
            send(
                &c,
                "POST",
                &url,
                &[("content-type", "application/json")],
                body,
            )
            .await
        }
    };
    let ok = post(
        "/api/v1/applications/ext/deployments/ingress/scale",
        r#"{"target_num_replicas": 3}"#,
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert!(
        ok.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("Scaling request received")
    );
    support::until(|| serve.app_handle("ext").unwrap().replicas().len() == 3).await;
    let off = post(
        "/api/v1/applications/plain/deployments/ingress/scale",
        r#"{"target_num_replicas": 3}"#,
    )
    .await;
    assert_eq!(off.status, 412, "{}", off.body);
    let missing = post(
        "/api/v1/applications/ext/deployments/nope/scale",
        r#"{"target_num_replicas": 3}"#,
    )
    .await;
    // Ray's answer to an unknown application or deployment: 400.
    assert_eq!(missing.status, 400, "{}", missing.body);
    assert_eq!(
        missing.json()["error"],
        "Application or Deployment not found"
    );
    let unknown_app = post(
        "/api/v1/applications/nope/deployments/ingress/scale",
        r#"{"target_num_replicas": 3}"#,
    )
    .await;
    assert_eq!(unknown_app.status, 400, "{}", unknown_app.body);
    // Ray's request model ignores keys it does not know.
    let extra = post(
        "/api/v1/applications/ext/deployments/ingress/scale",
        r#"{"target_num_replicas": 2, "reason": "load"}"#,
    )
    .await;
    assert_eq!(extra.status, 200, "{}", extra.body);
    // And takes what pydantic takes for an integer; a fraction or a
    // negative count is refused, naming the field.
    for (body, status) in [
        (r#"{"target_num_replicas": "2"}"#, 200),
        (r#"{"target_num_replicas": 2.0}"#, 200),
        (r#"{"target_num_replicas": 2.5}"#, 400),
        (r#"{"target_num_replicas": -1}"#, 400),
        (r#"{"target_num_replicas": "two"}"#, 400),
        (r#"{"target_num_replicas": null}"#, 400),
    ] {
        let r = post("/api/v1/applications/ext/deployments/ingress/scale", body).await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
        if status == 400 {
            assert!(r.body.contains("target_num_replicas"), "{body}: {}", r.body);
        }
    }
    // A failure of the server's own (its checkpoint commit failed) is not
    // the client's: Ray's 503, which a scaler retries.
    serve.fail_next_commit();
    let failed = post(
        "/api/v1/applications/ext/deployments/ingress/scale",
        r#"{"target_num_replicas": 3}"#,
    )
    .await;
    assert_eq!(failed.status, 503, "{}", failed.body);
    assert!(
        failed.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("Internal Server Error"),
        "{}",
        failed.body
    );
    let bad = post(
        "/api/v1/applications/ext/deployments/ingress/scale",
        r#"{"replicas": 3}"#,
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(
        bad.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("Invalid request body")
    );
    // The details say which application an external scaler may scale.
    let details = get(&c, &format!("http://{rest}/api/serve/applications/"))
        .await
        .json();
    assert_eq!(
        details["applications"]["ext"]["external_scaler_enabled"],
        true
    );
    assert_eq!(
        details["applications"]["plain"]["external_scaler_enabled"],
        false
    );
    // An application being deleted (a replica still streams a response, so
    // it stays DELETING until the test lets the stream end): Ray's 412.
    let proxy = http.proxy_addr().unwrap();
    let streaming = c
        .request(
            http::Request::get(format!("http://{proxy}/ext/stream/1"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(streaming.status(), 200);
    serve.delete_apps(["ext"], false).await.unwrap();
    wait_status(&serve, "ext", ApplicationStatus::Deleting).await;
    let deleting = post(
        "/api/v1/applications/ext/deployments/ingress/scale",
        r#"{"target_num_replicas": 3}"#,
    )
    .await;
    assert_eq!(deleting.status, 412, "{}", deleting.body);
    assert_eq!(deleting.json()["error"], "Deployment is deleted");
    probe.gate.add_permits(1);
    let rest_of_stream = streaming.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&rest_of_stream[..], b"token0 ");
    http.shutdown().await;
    serve.shutdown().await.unwrap();
}

/// A log sink the test reads.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    fn lines_with(&self, what: &[&str]) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| what.iter().all(|w| l.contains(w)))
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applications_enable_access_log_governs_the_proxys_access_log() {
    use tracing_subscriber::layer::SubscriberExt;
    let dir = tempfile::tempdir().unwrap();
    let probe = Arc::new(Probe::default());
    let options =
        ServeOptions::new(support::registry(&probe)).store_path(dir.path().join("f.redb"));
    let out = Captured::default();
    // The proxy logs on its own tasks, on every worker thread: the one
    // subscriber of this test binary.
    let layer = flotilla::AppLogLayer::new(options.logging.clone(), out.clone());
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let serve = Serve::start(options).await.unwrap();
    serve
        .apply_config(
            ServeConfig::from_yaml(
                "applications:
  - {name: log-on, route_prefix: /on, import_path: t.echo:app, args: {tag: on}}
  - name: log-off
    route_prefix: /off
    import_path: t.echo:app
    args: {tag: off}
    logging_config: {enable_access_log: false}
",
            )
            .unwrap(),
        )
        .await
        .unwrap();
    wait_status(&serve, "log-on", ApplicationStatus::Running).await;
    wait_status(&serve, "log-off", ApplicationStatus::Running).await;
    let http = HttpServer::start(&serve, test_options().build().unwrap())
        .await
        .unwrap();
    let (proxy, rest) = (http.proxy_addr().unwrap(), http.rest_addr().unwrap());
    wait_routes(&serve, |r| r.len() == 2).await;
    let c = support::client();
    // log-on's is streamed: hyper polls its body, the ingress's stream.
    for path in ["off/x", "on/stream-big/32"] {
        let r = get(&c, &format!("http://{proxy}/{path}")).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // A request's access event comes before it is counted (both as its body
    // is dropped): once /metrics counts both, each was logged or dropped.
    let counted = |app: &str| {
        let (c, url) = (c.clone(), format!("http://{rest}/metrics"));
        let label = format!(r#"application="{app}""#);
        async move {
            get(&c, &url).await.body.lines().any(|l| {
                l.starts_with("ray_serve_num_http_requests_total{")
                    && l.contains(&label)
                    && l.ends_with(" 1")
            })
        }
    };
    for app in ["log-off", "log-on"] {
        let counted_soon = tokio::time::timeout(Duration::from_secs(10), async {
            while !counted(app).await {
                tokio::task::yield_now().await;
            }
        });
        assert!(counted_soon.await.is_ok(), "{app}'s request never counted");
    }
    let target = flotilla_http::ACCESS_LOG_TARGET;
    assert_eq!(
        out.lines_with(&[target, "app=log-on"]).len(),
        1,
        "log-on's request is logged"
    );
    // With Ray's fields: the method too (it was left out), and the request's
    // id, on the proxy's line and on the ingress call's (hyper writes the
    // first, and polls the second, outside the request's span).
    assert_eq!(
        out.lines_with(&[
            "flotilla::access: ",
            "app=log-on",
            "status=OK",
            "request_id="
        ])
        .len(),
        1,
        "{:?}",
        out.lines_with(&["flotilla::access"])
    );
    assert_eq!(
        out.lines_with(&[
            target,
            "app=log-on",
            "method=GET",
            "route=/on",
            "status_code=200",
            "request_id="
        ])
        .len(),
        1,
        "{:?}",
        out.lines_with(&[target])
    );
    assert_eq!(
        out.lines_with(&[target, "app=log-off"]),
        Vec::<String>::new(),
        "log-off's access log is off"
    );
    // Its other events still are.
    assert!(!out.lines_with(&["app=log-off"]).is_empty());
    http.shutdown().await;
    serve.shutdown().await.unwrap();
}
