//! `ServeDeploySchema`'s own fields.

use super::{assert_at, assert_parse_at, err, parse};
use crate::{
    ConfigWarning, ControllerOptions, ControllerRuntimeEnv, GrpcOptions, HttpOptionError,
    HttpOptions, LogAttr, LoggingConfig, ProxyLocation, TracingConfig,
};

const APPS: &str = "applications:\n  - name: a\n    import_path: a:app\n";

fn with(top: &str) -> String {
    format!("{top}{APPS}")
}

#[test]
fn proxy_location_takes_rays_three_names() {
    for (name, want) in [
        ("Disabled", ProxyLocation::Disabled),
        ("HeadOnly", ProxyLocation::HeadOnly),
        ("EveryNode", ProxyLocation::EveryNode),
    ] {
        assert_eq!(
            parse(&with(&format!("proxy_location: {name}\n"))).proxy_location,
            want
        );
    }
    assert_eq!(parse(APPS).proxy_location, ProxyLocation::EveryNode);
    assert_eq!(
        parse(&with("proxy_location: null\n")).proxy_location,
        ProxyLocation::EveryNode
    );
    // The file takes Ray's exact names; NoServer is the Python API's alias only.
    let text = with("proxy_location: NoServer\n");
    assert_parse_at(&err(&text), &text, "NoServer", "NoServer");
}

#[test]
fn http_options_are_kept_with_rays_defaults_and_checks() {
    let text = with(
        "http_options:\n  host: 0.0.0.0\n  port: 8080\n  root_path: /serve\n  request_timeout_s: 30\n  keep_alive_timeout_s: 5\n  ssl_keyfile: /k.pem\n  ssl_certfile: /c.pem\n  ssl_keyfile_password: pw\n  ssl_ca_certs: /ca.pem\n",
    );
    let h = parse(&text).http_options;
    assert_eq!(
        h,
        HttpOptions {
            host: Some("0.0.0.0".into()),
            port: Some(8080),
            root_path: Some("/serve".into()),
            request_timeout_s: Some(30.0),
            keep_alive_timeout_s: Some(5),
            ssl_keyfile: Some("/k.pem".into()),
            ssl_certfile: Some("/c.pem".into()),
            ssl_keyfile_password: Some("pw".into()),
            ssl_ca_certs: Some("/ca.pem".into()),
        }
    );
    assert!(h.tls());
    let d = parse(APPS).http_options;
    assert_eq!(
        (
            d.host.as_deref(),
            d.port(),
            d.root_path(),
            d.keep_alive_timeout_s()
        ),
        (None, 8000, "", 90)
    );
    // TLS needs both files.
    let cert = with("http_options: {ssl_certfile: /c.pem}\n");
    let e = err(&cert);
    assert_at(
        &e,
        &cert,
        "/c.pem",
        "http_options.ssl_certfile",
        "Both ssl_keyfile and ssl_certfile must be provided together",
    );
    let key = with("http_options:\n  ssl_keyfile: /k.pem\n");
    assert_at(
        &err(&key),
        &key,
        "/k.pem",
        "http_options.ssl_keyfile",
        "provided together",
    );
    let timeout = with("http_options:\n  request_timeout_s: 0\n");
    assert_at(
        &err(&timeout),
        &timeout,
        "0\n",
        "http_options.request_timeout_s",
        "> 0",
    );
    let forever = with("http_options:\n  request_timeout_s: 1e20\n");
    assert_at(
        &err(&forever),
        &forever,
        "1e20\n",
        "http_options.request_timeout_s",
        "at most 1000000000",
    );
    // Infinite is none, as in Ray (float('inf')).
    for inf in [".inf", "'inf'", "\"Infinity\"", "1e400"] {
        let none = parse(&with(&format!(
            "http_options:\n  request_timeout_s: {inf}\n"
        )));
        assert_eq!(
            none.http_options.request_timeout_s,
            Some(f64::INFINITY),
            "{inf}"
        );
    }
    let port = with("http_options: {port: 70000}\n");
    assert_parse_at(&err(&port), &port, "70000", "at most 65535");
    let typo = with("http_options: {hots: x}\n");
    assert!(
        err(&typo).to_string().contains("did you mean `host`?"),
        "{}",
        err(&typo)
    );
    let location = with("http_options: {location: EveryNode}\n");
    assert!(
        err(&location)
            .to_string()
            .contains("top-level proxy_location"),
        "{}",
        err(&location)
    );
}

#[test]
fn grpc_options_are_kept_and_servicer_functions_are_refused() {
    let text = with(
        "grpc_options:\n  port: 9001\n  grpc_servicer_functions: []\n  request_timeout_s: 10\n  enable_reflection: false\n",
    );
    assert_eq!(
        parse(&text).grpc_options,
        GrpcOptions {
            port: Some(9001),
            grpc_servicer_functions: vec![],
            request_timeout_s: Some(10.0),
            enable_reflection: Some(false),
        }
    );
    let servicers =
        with("grpc_options:\n  grpc_servicer_functions:\n    - my.pb2_grpc.add_X_to_server\n");
    let e = err(&servicers);
    assert_at(
        &e,
        &servicers,
        "- my.pb2",
        "grpc_options.grpc_servicer_functions",
        "Flotilla has no gRPC proxy",
    );
}

#[test]
fn http_options_the_http_server_would_refuse_are_refused_at_parse() {
    // Each of these made the HTTP server refuse every start after the config
    // was applied; now the parse refuses it, naming the field.
    for (value, field, says) in [
        (
            "keep_alive_timeout_s: 0",
            "keep_alive_timeout_s",
            "longer than zero",
        ),
        (
            "keep_alive_timeout_s: 2000000000",
            "keep_alive_timeout_s",
            "at most 1000000000 s",
        ),
        ("root_path: serve", "root_path", "start with '/'"),
        ("root_path: /serve/", "root_path", "not end with '/'"),
        ("root_path: /", "root_path", "got \"/\""),
        ("host: ''", "host", "must not be empty"),
        ("host: '  '", "host", "must not be empty"),
    ] {
        let text = with(&format!("http_options:\n  {value}\n"));
        let (key, given) = value.split_once(": ").unwrap();
        assert_eq!(key, field);
        let needle = format!("{given}\n");
        let field = format!("http_options.{field}");
        assert_at(&err(&text), &text, &needle, &field, says);
    }
    let fine = parse(&with(
        "http_options: {host: localhost, root_path: /a/b, keep_alive_timeout_s: 1}\n",
    ));
    assert_eq!(fine.http_options.root_path(), "/a/b");
    let empty = parse(&with(
        "http_options: {root_path: '', keep_alive_timeout_s: 1000000000}\n",
    ));
    assert_eq!(empty.http_options.root_path(), "");
    // The rules are core's, the HTTP server's too: one statement each.
    assert_eq!(
        HttpOptions::check_root_path("/x/"),
        Err(HttpOptionError::RootPath {
            root_path: "/x/".into()
        })
    );
    assert_eq!(
        HttpOptions::request_timeout_from_secs(-1.0),
        Ok(None),
        "negative: no timeout"
    );
    assert_eq!(
        HttpOptions::request_timeout_from_secs(1e20),
        Err(HttpOptionError::TooLong { seconds: 1e20 })
    );
}

#[test]
fn a_negative_request_timeout_is_no_timeout_as_in_ray() {
    // Ray's proxies (HTTP and gRPC alike) read a negative timeout as none.
    for section in ["http_options", "grpc_options"] {
        for t in ["-1", "-0.5", "-.inf", "\"-2\""] {
            let text = with(&format!("{section}:\n  request_timeout_s: {t}\n"));
            let c = parse(&text);
            let kept = match section {
                "http_options" => c.http_options.request_timeout_s,
                _ => c.grpc_options.request_timeout_s,
            };
            assert!(kept.is_some_and(|s| s < 0.0), "{section}: {t}: {kept:?}");
        }
        // Zero would time every request out at once, and NaN is no number of
        // seconds: both still refused.
        for t in ["0", ".nan", "-0.0"] {
            let text = with(&format!("{section}:\n  request_timeout_s: {t}\n"));
            let field = format!("{section}.request_timeout_s");
            assert_at(&err(&text), &text, &format!("{t}\n"), &field, "> 0");
        }
    }
}

#[test]
fn controller_options_are_kept_and_warned_about() {
    let text = with("controller_options:\n  runtime_env:\n    env_vars: {RAY_SERVE_X: \"1\"}\n");
    let c = parse(&text);
    assert_eq!(
        c.controller_options,
        Some(ControllerOptions {
            runtime_env: Some(ControllerRuntimeEnv {
                env_vars: [("RAY_SERVE_X".to_owned(), "1".to_owned())].into(),
            }),
        })
    );
    assert_eq!(
        c.warnings(),
        vec![ConfigWarning::ControllerOptionsNotApplied {
            env_vars: vec!["RAY_SERVE_X".into()],
        }]
    );
    // Only env_vars, as in Ray.
    let pip = with("controller_options:\n  runtime_env: {pip: [x]}\n");
    let e = err(&pip);
    assert_parse_at(&e, &pip, "pip", "takes only env_vars");
}

#[test]
fn tracing_config_is_kept_checked_and_warned_about() {
    let text = with(
        "tracing_config: {enabled: true, exporter_import_path: my.exporter:f, sampling_ratio: 0.5}\n",
    );
    let c = parse(&text);
    assert_eq!(
        c.tracing_config,
        Some(TracingConfig {
            enabled: Some(true),
            exporter_import_path: Some("my.exporter:f".into()),
            sampling_ratio: Some(0.5),
        })
    );
    assert_eq!(c.warnings(), vec![ConfigWarning::TracingNotExported]);
    let off = parse(&with(
        "tracing_config: {enabled: false, sampling_ratio: 0.1}\n",
    ));
    assert!(off.warnings().is_empty());
    let ratio = with("tracing_config:\n  sampling_ratio: 2\n");
    assert_at(
        &err(&ratio),
        &ratio,
        "2\n",
        "tracing_config.sampling_ratio",
        "sampling_ratio must be between 0.0 and 1.0, got 2",
    );
}

#[test]
fn target_capacity_is_refused_unless_full_or_null() {
    assert_eq!(
        parse(&with("target_capacity: 100\n")).target_capacity,
        Some(100.0)
    );
    assert_eq!(
        parse(&with("target_capacity: null\n")).target_capacity,
        None
    );
    let half = with("target_capacity: 50\n");
    assert_at(
        &err(&half),
        &half,
        "50",
        "target_capacity",
        "Flotilla does not scale deployments by a target capacity",
    );
    let over = with("target_capacity: 150\n");
    assert_at(
        &err(&over),
        &over,
        "150",
        "target_capacity",
        "from 0 to 100",
    );
}

#[test]
fn logging_config_takes_logs_dir_and_attributes_with_a_rust_equivalent() {
    let text = with(
        "logging_config:\n  logs_dir: /var/log/shop\n  additional_log_standard_attrs: [threadName, name, lineno, name]\n",
    );
    assert_eq!(
        parse(&text).logging_config,
        Some(
            LoggingConfig::default()
                .with_logs_dir("/var/log/shop")
                .with_additional_log_standard_attrs([
                    LogAttr::Lineno,
                    LogAttr::Name,
                    LogAttr::ThreadName
                ])
        )
    );
    let func = with("logging_config:\n  additional_log_standard_attrs: [name, funcName]\n");
    assert_parse_at(
        &err(&func),
        &func,
        "funcName",
        "Ray's log attribute 'funcName' has no equivalent in Flotilla's logs",
    );
    let bogus = with("logging_config:\n  additional_log_standard_attrs: [bogus]\n");
    assert_parse_at(&err(&bogus), &bogus, "bogus", "Unknown attribute 'bogus'");
    let empty = with("logging_config:\n  logs_dir: ''\n");
    assert_at(
        &err(&empty),
        &empty,
        "''",
        "logging_config.logs_dir",
        "must not be empty",
    );
}

#[test]
fn rays_old_single_application_format_says_to_wrap_it() {
    let text = "import_path: shop:app\nruntime_env: {}\ndeployments:\n  - name: front\n";
    let e = err(text);
    assert_parse_at(
        &e,
        text,
        "shop:app",
        "wrap the application in a list under `applications:`",
    );
    // With `applications:` present, a stray import_path is just an unknown field.
    let both = "import_path: x\napplications: []\n";
    assert!(
        err(both)
            .to_string()
            .contains("unknown field `import_path`")
    );
}
