//! The REST API and /metrics over real sockets: PUT/GET/DELETE round trips,
//! invalid configs that change nothing, the token rule, and a scrape checked
//! against the traffic sent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use flotilla::ApplicationStatus;
use flotilla_http::{HttpError, HttpOptions, HttpServer};
use support::{get, send, start, start_with, test_options, wait_routes, wait_status};

const CONFIG_YAML: &str = "\
applications:
  - name: one
    route_prefix: /one
    import_path: t.echo:app
    args: {tag: first}
    deployments:
      - name: ingress
        num_replicas: 2
        graceful_shutdown_wait_loop_s: 0.01
  - name: two
    route_prefix: /two
    import_path: t.echo:app
    args: {tag: second}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_delete_round_trip_in_rays_shapes() {
    let f = start().await;
    let c = support::client();
    let v = get(&c, &f.rest_url("/api/ray/version")).await;
    assert_eq!(v.status, 200);
    assert_eq!(v.json()["ray_version"], flotilla_http::RAY_VERSION);

    let empty = get(&c, &f.rest_url("/api/serve/applications/")).await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.json()["applications"], serde_json::json!({}));

    let put = send(
        &c,
        "PUT",
        &f.rest_url("/api/serve/applications/"),
        &[("content-type", "application/yaml")],
        CONFIG_YAML,
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    // Durable when answered: the applied config is the Controller's now.
    assert_eq!(
        f.serve
            .applied_config()
            .await
            .unwrap()
            .unwrap()
            .applications
            .len(),
        2
    );
    wait_status(&f.serve, "one", ApplicationStatus::Running).await;
    wait_status(&f.serve, "two", ApplicationStatus::Running).await;
    wait_routes(&f.serve, |r| r.len() == 2).await;
    assert_eq!(get(&c, &f.url("/two/x")).await.json()["tag"], "second");

    let d = get(&c, &f.rest_url("/api/serve/applications/"))
        .await
        .json();
    let one = &d["applications"]["one"];
    assert_eq!(one["name"], "one");
    assert_eq!(one["status"], "RUNNING");
    assert_eq!(one["route_prefix"], "/one");
    assert_eq!(one["source"], "declarative");
    assert!(one["last_deployed_time_s"].as_f64().unwrap() > 1.6e9);
    assert_eq!(one["deployed_app_config"]["import_path"], "t.echo:app");
    assert_eq!(one["deployed_app_config"]["args"]["tag"], "first");
    // What the config leaves at its default is left out, as Ray dumps with
    // `exclude_unset` (and Flotilla's own `take_over` with it).
    let two = d["applications"]["two"]["deployed_app_config"]
        .as_object()
        .unwrap();
    let mut keys: Vec<&str> = two.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["args", "import_path", "name", "route_prefix"],
        "{two:?}"
    );
    let ingress = &one["deployments"]["ingress"];
    assert_eq!(ingress["status"], "HEALTHY");
    assert_eq!(ingress["status_trigger"], "CONFIG_UPDATE_COMPLETED");
    assert_eq!(ingress["target_num_replicas"], 2);
    assert_eq!(ingress["deployment_config"]["num_replicas"], 2);
    assert_eq!(ingress["deployment_config"]["max_ongoing_requests"], 5);
    let replicas = ingress["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2);
    for r in replicas {
        assert_eq!(r["state"], "RUNNING");
        assert_eq!(r["node_id"], "local");
        assert!(r["replica_id"].as_str().is_some());
        assert!(r["start_time_s"].as_f64().unwrap() > 1.6e9);
    }
    assert_eq!(one["deployment_topology"]["ingress_deployment"], "ingress");
    assert_eq!(d["proxies"]["local"]["status"], "HEALTHY");
    assert_eq!(d["http_options"]["host"], "127.0.0.1");
    assert!(d["target_capacity"].is_null());
    // Ray's api_type filter.
    let imperative = get(
        &c,
        &f.rest_url("/api/serve/applications/?api_type=imperative"),
    )
    .await;
    assert_eq!(imperative.json()["applications"], serde_json::json!({}));
    let bad = get(&c, &f.rest_url("/api/serve/applications/?api_type=nope")).await;
    assert_eq!(bad.status, 400);
    // As Ray reads it: any case, percent-decoded, and empty is no filter.
    for (query, apps) in [
        ("api_type=DECLARATIVE", 2),
        ("api_type=%64eclarative", 2),
        ("api_type=Imperative", 0),
        ("api_type=", 2),
    ] {
        let r = get(
            &c,
            &f.rest_url(&format!("/api/serve/applications/?{query}")),
        )
        .await;
        assert_eq!(r.status, 200, "{query}: {}", r.body);
        assert_eq!(
            r.json()["applications"].as_object().unwrap().len(),
            apps,
            "{query}"
        );
    }

    // The same config as JSON, one application dropped: declarative, so it goes.
    let json = serde_json::json!({"applications": [
        {"name": "one", "route_prefix": "/one", "import_path": "t.echo:app", "args": {"tag": "first"},
         "deployments": [{"name": "ingress", "num_replicas": 2, "graceful_shutdown_wait_loop_s": 0.01}]}
    ]});
    let put = send(
        &c,
        "PUT",
        &f.rest_url("/api/serve/applications/"),
        &[("content-type", "application/json")],
        json.to_string(),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    wait_routes(&f.serve, |r| r.len() == 1).await;
    assert_eq!(get(&c, &f.url("/two/x")).await.status, 404);

    // A deletion its commit refused is an error, and deletes nothing.
    let before = f.serve.status().len();
    assert!(before > 0);
    let apps = f.rest_url("/api/serve/applications/");
    f.serve.fail_next_commit();
    let refused = send(&c, "DELETE", &apps, &[], "").await;
    assert_eq!(refused.status, 500, "{}", refused.body);
    assert_eq!(f.serve.status().len(), before, "nothing was deleted");

    let del = send(&c, "DELETE", &apps, &[], "").await;
    assert_eq!(del.status, 200, "{}", del.body);
    // As Ray's (`serve.shutdown()` waits for the controller): answered once
    // the applications are gone.
    let after = get(&c, &f.rest_url("/api/serve/applications/")).await;
    assert_eq!(
        after.json()["applications"],
        serde_json::json!({}),
        "{}",
        after.body
    );
    assert!(f.serve.status().is_empty());
    wait_routes(&f.serve, |r| r.is_empty()).await;
    let cfg = f.serve.applied_config().await.unwrap();
    assert!(
        cfg.as_ref().is_none_or(|c| c.applications.is_empty()),
        "{cfg:?}"
    );
    f.stop().await;
}

/// With nodes, the proxy, the controller and the head's own replicas are
/// on one node, named alike everywhere: the head's id (it was `local` for
/// the proxy and the controller, the head's for its replicas, so a join of
/// replicas to proxies by node found nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nodes_the_proxy_controller_and_replicas_name_the_heads_node() {
    let dir = tempfile::tempdir().unwrap();
    let probe = std::sync::Arc::new(support::Probe::default());
    let head = flotilla::HeadOptions::new(flotilla::Cookie::new("c").unwrap())
        .listen("127.0.0.1:0".parse().unwrap())
        .node_id("the-head");
    let serve = flotilla::Serve::start(
        flotilla::ServeOptions::new(support::registry(&probe))
            .store_path(dir.path().join("f.redb"))
            .nodes(head),
    )
    .await
    .unwrap();
    assert_eq!(serve.node_id(), "the-head");
    let http = HttpServer::start(&serve, test_options().build().unwrap())
        .await
        .unwrap();
    serve.run(support::echo_app("e", "/e", "e")).await.unwrap();
    let c = support::client();
    let rest = http.rest_addr().unwrap();
    let d: serde_json::Value = serde_json::from_str(
        &get(&c, &format!("http://{rest}/api/serve/applications/"))
            .await
            .body,
    )
    .unwrap();
    assert_eq!(d["controller_info"]["node_id"], "the-head", "{d}");
    assert_eq!(d["proxies"]["the-head"]["status"], "HEALTHY", "{d}");
    let replicas = d["applications"]["e"]["deployments"]["ingress"]["replicas"]
        .as_array()
        .unwrap();
    assert!(!replicas.is_empty());
    assert!(replicas.iter().all(|r| r["node_id"] == "the-head"), "{d}");
    let metrics = get(&c, &format!("http://{rest}/metrics")).await.body;
    assert!(
        metrics.contains(r#"ray_serve_num_ongoing_http_requests{node_id="the-head""#),
        "{metrics}"
    );
    // The node series, with no node process joined yet.
    for line in [
        "flotilla_nodes_live 0",
        r#"flotilla_node_changes_total{change="joined"} 0"#,
        r#"flotilla_node_changes_total{change="lost"} 0"#,
        "flotilla_node_replicas_lost_total 0",
        "# TYPE flotilla_node_replicas gauge",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
    http.shutdown().await;
    serve.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_is_400_naming_where_and_changes_nothing() {
    let f = start().await;
    let c = support::client();
    let put = send(
        &c,
        "PUT",
        &f.rest_url("/api/serve/applications/"),
        &[],
        CONFIG_YAML,
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    // Built and running: the builds' own commits are behind us.
    wait_status(&f.serve, "one", ApplicationStatus::Running).await;
    wait_status(&f.serve, "two", ApplicationStatus::Running).await;
    let before = f.serve.applied_config().await.unwrap();
    let commits = f.serve.metrics().await.unwrap().store.commits;
    let cases = [
        // A typo: unknown field, with its line.
        (
            "applications:\n  - name: one\n    import_path: t.echo:app\n    route_prefx: /x\n",
            "route_prefx",
        ),
        // A bad value naming the application and field.
        (
            "applications:\n  - name: bad\n    import_path: t.echo:app\n    deployments:\n      - name: ingress\n        max_ongoing_requests: 0\n",
            "bad",
        ),
        // Duplicate applications.
        (
            "applications:\n  - {name: a, import_path: t.echo:app}\n  - {name: a, import_path: t.echo:app}\n",
            "a",
        ),
        // An unknown builder.
        (
            "applications:\n  - {name: u, route_prefix: /u, import_path: nope:app}\n",
            "nope:app",
        ),
        // Not even YAML.
        ("applications: [", "line"),
        // http_options the HTTP server's next start would refuse: TLS, no host.
        (
            "http_options: {ssl_ca_certs: /ca.pem}\napplications: []\n",
            "http_options.ssl_ca_certs",
        ),
        ("http_options: {host: ' '}\napplications: []\n", "host"),
        // Refused by the parse itself (core's rules, the server's too).
        (
            "http_options: {keep_alive_timeout_s: 0}\napplications: []\n",
            "http_options.keep_alive_timeout_s",
        ),
        (
            "http_options: {root_path: /serve/}\napplications: []\n",
            "http_options.root_path",
        ),
        // Off loopback without a token (the bind rule), where an address
        // literal decides it.
        (
            "http_options: {host: 0.0.0.0}\napplications: []\n",
            "http_options.host",
        ),
        (
            "http_options: {host: '::'}\napplications: []\n",
            "bearer token",
        ),
    ];
    for (body, needle) in cases {
        let r = send(
            &c,
            "PUT",
            &f.rest_url("/api/serve/applications/"),
            &[("content-type", "text/yaml")],
            body,
        )
        .await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body.contains(needle), "{needle} in {}", r.body);
    }
    let r = send(
        &c,
        "PUT",
        &f.rest_url("/api/serve/applications/"),
        &[("content-type", "application/json")],
        "{\"applications\": [{\"name\": \"x\"}]}",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("import_path"), "{}", r.body);
    assert_eq!(
        f.serve.applied_config().await.unwrap(),
        before,
        "nothing changed"
    );
    assert_eq!(
        f.serve.metrics().await.unwrap().store.commits,
        commits,
        "nothing committed"
    );
    // A disabled proxy binds nothing: its host needs no token.
    let r = send(
        &c,
        "PUT",
        &f.rest_url("/api/serve/applications/"),
        &[],
        "proxy_location: Disabled\nhttp_options: {host: 0.0.0.0}\napplications: []\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_bind_needs_a_token_and_mutations_need_it_once_configured() {
    let (dir, serve, _probe) = support::bare_serve().await;
    for (proxy_host, rest_host) in [("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "0.0.0.0")] {
        let opts = test_options()
            .host(proxy_host)
            .rest_host(rest_host)
            .build()
            .unwrap();
        let err = HttpServer::start(&serve, opts).await.unwrap_err();
        assert!(matches!(err, HttpError::TokenRequired { .. }), "{err}");
        assert!(err.to_string().contains("bearer token"), "{err}");
    }
    // Without a REST listener there is nothing to protect: server.rs's unit
    // test (starting one here would listen off loopback).
    // An empty token source is an error naming the source, not the token.
    let err = HttpServer::start(
        &serve,
        test_options()
            .token_env("FLOTILLA_HTTP_TEST_NO_SUCH_VAR")
            .build()
            .unwrap(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("FLOTILLA_HTTP_TEST_NO_SUCH_VAR"),
        "{err}"
    );
    serve.shutdown().await.unwrap();

    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token-0123\n").unwrap();
    let f = start_with(test_options().token_file(&token_file).build().unwrap()).await;
    let c = support::client();
    let url = f.rest_url("/api/serve/applications/");
    let r = send(&c, "PUT", &url, &[], CONFIG_YAML).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    assert!(!r.body.contains("s3cret"));
    // A wrong token is Ray's 403, not 401 (which says none was given).
    let r = send(
        &c,
        "PUT",
        &url,
        &[("authorization", "Bearer wrong")],
        CONFIG_YAML,
    )
    .await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (403, "Forbidden: Invalid authentication token")
    );
    let r = send(&c, "DELETE", &url, &[], "").await;
    assert_eq!(r.status, 401);
    assert!(
        r.body
            .starts_with("Unauthorized: Missing authentication token"),
        "{}",
        r.body
    );
    assert!(
        f.serve.applied_config().await.unwrap().is_none(),
        "nothing applied"
    );
    // Reads need no token.
    assert_eq!(get(&c, &url).await.status, 200);
    assert_eq!(get(&c, &f.rest_url("/metrics")).await.status, 200);
    let r = send(
        &c,
        "PUT",
        &url,
        &[("authorization", "Bearer s3cret-token-0123")],
        CONFIG_YAML,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // With a token, http_options may move the proxy off loopback.
    let r = send(
        &c,
        "PUT",
        &url,
        &[("authorization", "Bearer s3cret-token-0123")],
        "http_options: {host: 0.0.0.0}\napplications: []\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Ray's fallback header, which proxies and KubeRay set, is taken too.
    let r = send(
        &c,
        "DELETE",
        &url,
        &[("x-ray-authorization", "Bearer s3cret-token-0123")],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutation_a_browser_sends_is_refused_as_ray_refuses_it_token_or_not() {
    let f = start().await;
    let c = support::client();
    let url = f.rest_url("/api/serve/applications/");
    let scale = f.rest_url("/api/v1/applications/app1/deployments/d/scale");
    let browser_like: [(&str, &str); 5] = [
        ("origin", "http://evil.example"),
        ("referer", "http://evil.example/page"),
        ("sec-fetch-site", "cross-site"),
        ("user-agent", "Mozilla/5.0 (X11; Linux x86_64)"),
        ("access-control-request-method", "PUT"),
    ];
    for header in browser_like {
        let r = send(&c, "PUT", &url, &[header], CONFIG_YAML).await;
        assert_eq!(r.status, 405, "{header:?}: {}", r.body);
        assert_eq!(r.body, "'PUT' method not allowed for browser traffic.");
        let r = send(&c, "DELETE", &url, &[header], "").await;
        assert_eq!((r.status, header), (405, header), "{}", r.body);
        let r = send(
            &c,
            "POST",
            &scale,
            &[header],
            r#"{"target_num_replicas": 2}"#,
        )
        .await;
        assert_eq!((r.status, header), (405, header), "{}", r.body);
        // Reads are served to browsers, as Ray's dashboard serves them.
        let r = send(&c, "GET", &url, &[header], "").await;
        assert_eq!((r.status, header), (200, header), "{}", r.body);
    }
    // But not to a page of another name that resolves here (DNS
    // rebinding): a loopback listener answers localhost and IP addresses.
    let rebound = [("host", "evil.example:52365")];
    for path in ["/api/serve/applications/", "/metrics", "/api/ray/version"] {
        let r = send(&c, "GET", &f.rest_url(path), &rebound, "").await;
        assert_eq!(r.status, 403, "{path}: {}", r.body);
        assert!(r.body.contains("'evil.example:52365'"), "{}", r.body);
    }
    let r = send(&c, "GET", &url, &[("host", "localhost:52365")], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        f.serve.applied_config().await.unwrap().is_none(),
        "nothing applied"
    );
    // A program's request (no browser headers, its own user agent) is served.
    let r = send(
        &c,
        "PUT",
        &url,
        &[("user-agent", "python-requests/2.32")],
        CONFIG_YAML,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    f.stop().await;

    // With a token, the right token does not let a browser's request through.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let f = start_with(test_options().token_file(&token_file).build().unwrap()).await;
    let url = f.rest_url("/api/serve/applications/");
    let bearer = ("authorization", "Bearer s3cret-token");
    let r = send(
        &c,
        "PUT",
        &url,
        &[bearer, ("origin", "http://evil.example")],
        CONFIG_YAML,
    )
    .await;
    assert_eq!(r.status, 405, "{}", r.body);
    let r = send(&c, "PUT", &url, &[bearer], CONFIG_YAML).await;
    assert_eq!(r.status, 200, "{}", r.body);
    f.stop().await;
}

/// Parse Prometheus text into `name{labels} -> value` (labels sorted).
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let mut ls: Vec<&str> = rest
                    .trim_end_matches('}')
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .collect();
                ls.sort_unstable();
                (n, ls.join(","))
            }
            None => (series, String::new()),
        };
        out.insert(format!("{name}{{{labels}}}"), value.parse().unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_counts_the_traffic_sent_under_rays_names() {
    let f = start().await;
    f.serve
        .run_many(vec![support::echo_app("m", "/m", "m")], Default::default())
        .await
        .unwrap();
    let c = support::client();
    for _ in 0..7 {
        assert_eq!(get(&c, &f.url("/m/x")).await.status, 200);
    }
    for _ in 0..3 {
        assert_eq!(
            send(&c, "POST", &f.url("/m/fail"), &[], "x").await.status,
            500
        );
    }
    for _ in 0..2 {
        assert_eq!(get(&c, &f.url("/nowhere")).await.status, 404);
    }
    // An answer the proxy cannot send (an invalid header) is a 500, and
    // counted as one.
    assert_eq!(get(&c, &f.url("/m/bad-header")).await.status, 500);
    assert_eq!(get(&c, &f.url("/-/healthz")).await.status, 200);
    let r = get(&c, &f.rest_url("/metrics")).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some(flotilla_http::METRICS_CONTENT_TYPE)
    );
    let m = parse(&r.body);
    let at = |k: &str| {
        let key = parse(&format!("{k} 0")).into_keys().next().unwrap();
        *m.get(&key)
            .unwrap_or_else(|| panic!("no {key} in\n{}", r.body))
    };
    assert_eq!(
        at(
            r#"ray_serve_num_http_requests_total{application="m",method="GET",route="/m",status_code="200"}"#
        ),
        7.0
    );
    assert_eq!(
        at(
            r#"ray_serve_num_http_requests_total{application="m",method="POST",route="/m",status_code="500"}"#
        ),
        3.0
    );
    assert_eq!(
        at(
            r#"ray_serve_num_http_requests_total{application="m",method="GET",route="/m",status_code="500"}"#
        ),
        1.0
    );
    assert_eq!(
        at(
            r#"ray_serve_num_http_requests_total{application="",method="GET",route="",status_code="404"}"#
        ),
        2.0
    );
    assert_eq!(
        at(
            r#"ray_serve_num_http_requests_total{application="",method="GET",route="/-/healthz",status_code="200"}"#
        ),
        1.0
    );
    assert_eq!(
        at(
            r#"ray_serve_num_http_error_requests_total{application="m",error_code="500",method="POST",route="/m"}"#
        ),
        3.0
    );
    assert_eq!(
        at(
            r#"ray_serve_num_deployment_http_error_requests_total{application="m",deployment="ingress",error_code="500",method="POST",route="/m"}"#
        ),
        3.0
    );
    assert_eq!(
        at(
            r#"ray_serve_http_request_latency_ms_count{application="m",method="GET",route="/m",status_code="200"}"#
        ),
        7.0
    );
    assert_eq!(
        at(
            r#"ray_serve_http_request_latency_ms_bucket{application="m",le="+Inf",method="GET",route="/m",status_code="200"}"#
        ),
        7.0
    );
    let replica = f
        .serve
        .deployment_handle("m", "ingress")
        .unwrap()
        .replicas()[0]
        .id()
        .to_string();
    let rl = format!(r#"application="m",deployment="ingress",replica="{replica}""#);
    assert_eq!(
        at(&format!(
            r#"ray_serve_deployment_request_counter_total{{{rl},route="/m"}}"#
        )),
        // The replica served /bad-header: its failure is the proxy's.
        8.0
    );
    assert_eq!(
        at(&format!(
            r#"ray_serve_deployment_error_counter_total{{{rl},exception_type="UserError",route="/m"}}"#
        )),
        3.0
    );
    assert_eq!(
        at(&format!(
            r#"ray_serve_deployment_processing_latency_ms_count{{{rl},route="/m"}}"#
        )),
        11.0
    );
    assert_eq!(
        at(&format!(r#"ray_serve_replica_processing_queries{{{rl}}}"#)),
        0.0
    );
    assert_eq!(
        at(&format!(r#"ray_serve_deployment_replica_healthy{{{rl}}}"#)),
        1.0
    );
    assert_eq!(
        at(r#"ray_serve_deployment_replica_starts_total{application="m",deployment="ingress"}"#),
        1.0
    );
    assert_eq!(
        at(r#"ray_serve_num_router_requests_total{application="m",deployment="ingress"}"#),
        11.0
    );
    assert_eq!(at(r#"ray_serve_application_status{application="m"}"#), 6.0);
    assert_eq!(
        at(r#"ray_serve_deployment_status{application="m",deployment="ingress"}"#),
        6.0
    );
    assert_eq!(
        at(r#"flotilla_replicas{application="m",deployment="ingress",state="RUNNING"}"#),
        1.0
    );
    assert!(at("flotilla_checkpoint_commits_total{}") >= 1.0);
    assert!(at("flotilla_checkpoint_bytes_written_total{}") > 0.0);
    assert_eq!(at(r#"flotilla_restarts_total{level="controller"}"#), 0.0);
    assert_eq!(
        at(r#"ray_serve_num_ongoing_http_requests{node_id="local",node_ip_address="127.0.0.1"}"#),
        0.0
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_the_controller_cannot_give_are_left_out_not_reported_as_zero() {
    let f = start().await;
    let c = support::client();
    f.serve
        .apply_config(flotilla::ServeConfig::from_yaml("applications: []\n").unwrap())
        .await
        .unwrap();
    let r = get(&c, &f.rest_url("/metrics")).await;
    assert!(
        r.body.contains("flotilla_checkpoint_commits_total"),
        "{}",
        r.body
    );
    // The Controller is gone: a counter read as 0 would look like a reset to
    // Prometheus (and `increase()` would count it all again).
    f.serve.shutdown().await.unwrap();
    let r = get(&c, &f.rest_url("/metrics")).await;
    assert_eq!(r.status, 200);
    for family in [
        "flotilla_checkpoint_commits_total",
        "flotilla_checkpoint_keys_written_total",
        "flotilla_checkpoint_bytes_written_total",
        "flotilla_restarts_total",
    ] {
        assert!(!r.body.contains(family), "{family} in\n{}", r.body);
    }
    f.stop().await;
}

/// A PUT is checked against what the server's next start lays it over: the
/// program's own options, not the running ones, which carry the config
/// applied before. A server started under a config that turned the proxy
/// off must still refuse one that turns it back on at a host the start
/// would refuse (off loopback, no token): stored, it would stop the REST API
/// at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_is_checked_against_the_programs_options_not_the_running_ones() {
    let (_dir, serve, _probe) = support::bare_serve().await;
    serve
        .apply_config(
            flotilla::ServeConfig::from_yaml("proxy_location: Disabled\napplications: []\n")
                .unwrap(),
        )
        .await
        .unwrap();
    let http = flotilla_http::HttpServer::start(&serve, test_options().build().unwrap())
        .await
        .unwrap();
    assert!(
        http.proxy_addr().is_none(),
        "the applied config turned it off"
    );
    let rest = http.rest_addr().unwrap();
    let r = send(
        &support::client(),
        "PUT",
        &format!("http://{rest}/api/serve/applications/"),
        &[("content-type", "text/yaml")],
        "proxy_location: EveryNode\nhttp_options: {host: 0.0.0.0}\napplications: []\n",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("http_options.host"), "{}", r.body);
    // What to do, in the config's own terms.
    assert!(
        r.body.contains("set http_options.host to 127.0.0.1"),
        "{}",
        r.body
    );
    http.shutdown().await;
    serve.shutdown().await.unwrap();
}

/// A PUT whose proxy could not bind at the next start (a port another
/// process holds, a host that is not this machine's) is refused naming the
/// field: stored, it would fail that start, and with it the REST API that
/// could mend it. A free port is taken (for the next start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_whose_proxy_could_not_bind_is_refused_naming_the_field() {
    let f = start_with(test_options().token("t0ken-long-enough").build().unwrap()).await;
    let c = support::client();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().port();
    let put = |http_options: String| {
        let (c, url) = (c.clone(), f.rest_url("/api/serve/applications/"));
        async move {
            send(
                &c,
                "PUT",
                &url,
                &[
                    ("content-type", "text/yaml"),
                    ("authorization", "Bearer t0ken-long-enough"),
                ],
                format!("http_options: {http_options}\napplications: []\n"),
            )
            .await
        }
    };
    let r = put(format!("{{port: {taken}}}")).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("http_options.port"), "{}", r.body);
    // TEST-NET-1: an address, but not this machine's (the token allows
    // binding off loopback).
    let r = put("{host: 192.0.2.1, port: 0}".to_owned()).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("http_options.host"), "{}", r.body);
    assert!(f.serve.applied_config().await.unwrap().is_none());
    drop(held);
    let r = put(format!("{{port: {taken}}}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    f.stop().await;
}

#[test]
fn options_are_validated_by_the_builder() {
    assert!(HttpOptions::builder().root_path("/a/").build().is_err());
    assert!(
        HttpOptions::builder()
            .max_request_body_bytes(0)
            .build()
            .is_err()
    );
    let o = HttpOptions::builder()
        .request_timeout_s(Some(-1.0))
        .build()
        .unwrap();
    assert_eq!(o.request_timeout, None, "negative is none, as Ray");
    let d = HttpOptions::default();
    assert_eq!(
        (d.host.as_str(), d.port, d.rest_port),
        ("127.0.0.1", 8000, 8265)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_values_come_back_as_given_nulls_included() {
    let f = start().await;
    let c = support::client();
    let config = "\
applications:
  - name: one
    route_prefix: /one
    import_path: t.echo:app
    args: {tag: first, lora: null, deep: {x: null}, 7: seven}
    runtime_env: {env_vars: {X: null}}
    deployments:
      - name: ingress
        user_config: {a: null, b: {c: null}, 2: two, ~: null-key}
";
    let put = send(
        &c,
        "PUT",
        &f.rest_url("/api/serve/applications/"),
        &[],
        config,
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    // The runtime_env is kept, but not applied: the answer says so.
    assert!(
        put.body.starts_with("Warning: ") && put.body.contains("runtime_env"),
        "{}",
        put.body
    );
    wait_status(&f.serve, "one", ApplicationStatus::Running).await;
    let d = get(&c, &f.rest_url("/api/serve/applications/"))
        .await
        .json();
    let one = &d["applications"]["one"];
    let app = &one["deployed_app_config"];
    // Keys that are not text come back as text, as Ray's JSON writes a
    // Python dict's.
    assert_eq!(
        app["args"],
        serde_json::json!({"tag": "first", "lora": null, "deep": {"x": null}, "7": "seven"})
    );
    assert_eq!(
        app["runtime_env"],
        serde_json::json!({"env_vars": {"X": null}})
    );
    let user_config =
        serde_json::json!({"a": null, "b": {"c": null}, "2": "two", "null": "null-key"});
    assert_eq!(app["deployments"][0]["user_config"], user_config);
    assert_eq!(
        one["deployments"]["ingress"]["deployment_config"]["user_config"],
        user_config
    );
    // Model fields the config leaves unset are still left out.
    assert!(app.get("route_prefix").is_some());
    assert!(app["deployments"][0].get("num_replicas").is_none(), "{app}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_starts_count_every_try_of_a_constructor_that_always_fails() {
    let f = start().await;
    let broken = flotilla::ApplicationSpec::builder("broken")
        .route_prefix("/broken")
        .deployment(flotilla::DeploymentSpec::builder("ingress", "t::Broken"))
        .build()
        .unwrap();
    f.serve
        .run_many(vec![broken], support::no_wait())
        .await
        .unwrap();
    // One replica: three failed tries before DEPLOY_FAILED.
    wait_status(&f.serve, "broken", ApplicationStatus::DeployFailed).await;
    let c = support::client();
    let metrics = parse(&get(&c, &f.rest_url("/metrics")).await.body);
    let series =
        r#"ray_serve_deployment_replica_starts_total{application="broken",deployment="ingress"}"#;
    let starts = metrics[series];
    assert!(starts >= 3.0, "{starts}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_and_a_starting_replica_carry_every_field_ray_requires() {
    let f = start().await;
    let c = support::client();
    let gated = flotilla::ApplicationSpec::builder("g")
        .route_prefix("/g")
        .deployment(support::quick(
            flotilla::DeploymentSpec::builder("ingress", "t::Gated").init_args(&"g"),
        ))
        .build()
        .unwrap();
    f.serve
        .run_many(vec![gated], support::no_wait())
        .await
        .unwrap();
    // Its constructor runs: the replica is starting.
    f.probe.constructing.notified().await;
    let d = get(&c, &f.rest_url("/api/serve/applications/"))
        .await
        .json();
    let ingress = &d["applications"]["g"]["deployments"]["ingress"];
    assert_eq!(ingress["target_num_replicas"], 1, "{ingress}");
    assert_eq!(ingress["deployment_config"]["name"], "ingress");
    assert_eq!(ingress["required_resources"]["CPU"], 1.0);
    let replica = &ingress["replicas"][0];
    assert_eq!(replica["state"], "STARTING", "{ingress}");
    // Ray's ReplicaDetails.start_time_s is required: 0.0 while not known.
    assert_eq!(replica["start_time_s"], 0.0, "{replica}");
    // Its metrics, as Ray's: counted as started, no health series yet.
    let metrics = parse(&get(&c, &f.rest_url("/metrics")).await.body);
    assert_eq!(
        metrics.get(
            r#"ray_serve_deployment_replica_starts_total{application="g",deployment="ingress"}"#
        ),
        Some(&1.0),
        "{metrics:?}"
    );
    assert!(
        !metrics
            .keys()
            .any(|k| k.starts_with("ray_serve_deployment_replica_healthy{")
                && k.contains(r#"application="g""#)),
        "{metrics:?}"
    );
    f.probe.constructor_gate.add_permits(1);
    wait_status(&f.serve, "g", ApplicationStatus::Running).await;
    let d = get(&c, &f.rest_url("/api/serve/applications/"))
        .await
        .json();
    let replica = &d["applications"]["g"]["deployments"]["ingress"]["replicas"][0];
    assert_eq!(replica["state"], "RUNNING");
    assert!(
        replica["start_time_s"].as_f64().unwrap() > 1.6e9,
        "{replica}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_set_to_null_are_shown_as_set_to_null() {
    let f = start().await;
    let c = support::client();
    let yaml = "applications:\n  - {name: plain, route_prefix: null, import_path: t.echo:app, args: {tag: p}, \
                deployments: [{name: ingress, autoscaling_config: null, user_config: null}]}\n";
    let put = send(
        &c,
        "PUT",
        &f.rest_url("/api/serve/applications/"),
        &[("content-type", "application/yaml")],
        yaml,
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    wait_status(&f.serve, "plain", ApplicationStatus::Running).await;
    let d = get(&c, &f.rest_url("/api/serve/applications/"))
        .await
        .json();
    let plain = &d["applications"]["plain"];
    assert!(plain["route_prefix"].is_null(), "no HTTP route: {plain}");
    let config = plain["deployed_app_config"].as_object().unwrap();
    assert_eq!(
        config.get("route_prefix"),
        Some(&serde_json::Value::Null),
        "set, to null, as Ray shows a set field: {config:?}"
    );
    assert_eq!(
        config["deployments"],
        serde_json::json!([{"name": "ingress", "autoscaling_config": null, "user_config": null}]),
        "{config:?}"
    );
}
