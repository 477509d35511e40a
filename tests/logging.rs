//! Per-application logging through `AppLogLayer`, in a test binary of its own:
//! `tracing` caches callsite interest process-wide, so a thread-local subscriber
//! must not share its process with other tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use flotilla::{ApplicationStatus as A, Registry, Serve, ServeConfig};
use support::{Switches, wait_status};

fn registry(sw: &Arc<Switches>) -> Registry {
    support::registry(sw)
        .register_app("test::app", |args: flotilla::Args| async move {
            let tag: String = args
                .decode::<std::collections::BTreeMap<String, String>>()
                .map_err(|e| flotilla::UserError::new(e.to_string()))?
                .remove("tag")
                .unwrap_or_default();
            Ok(support::app(
                "built",
                1,
                support::ProbeArgs {
                    tag,
                    ..Default::default()
                },
            ))
        })
        .unwrap()
}

fn config(yaml: &str) -> ServeConfig {
    ServeConfig::from_yaml(yaml).unwrap()
}

#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

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

#[tokio::test(start_paused = true)]
async fn each_application_logs_by_its_own_logging_config() {
    use tracing_subscriber::layer::SubscriberExt;
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let options = support::options(&dir, registry(&sw));
    let out = Captured::default();
    let layer = flotilla::AppLogLayer::new(options.logging.clone(), out.clone());
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    // The program's own global config: a config file's stands in for it only
    // while that config is applied.
    options.logging.set_global(flotilla::LoggingConfig {
        log_level: flotilla::LogLevel::Error,
        ..Default::default()
    });
    let serve = Serve::start(options).await.unwrap();
    serve
        .apply_config(config(
            "logging_config: {log_level: WARNING, enable_access_log: false}
applications:
  - name: loud
    route_prefix: /loud
    import_path: test::app
    args: {tag: l}
    logging_config: {log_level: INFO, encoding: JSON, enable_access_log: true}
  - {name: quiet, route_prefix: /quiet, import_path: test::app, args: {tag: q}}
  - name: muted
    route_prefix: /muted
    import_path: test::app
    args: {tag: m}
    logging_config: {log_level: INFO, enable_access_log: false}
",
        ))
        .await
        .unwrap();
    wait_status(&serve, "loud", A::Running).await;
    wait_status(&serve, "quiet", A::Running).await;
    wait_status(&serve, "muted", A::Running).await;
    for app in ["loud", "quiet", "muted"] {
        serve
            .app_handle(app)
            .unwrap()
            .call::<_, String>(&format!("log:user-{app}"))
            .await
            .unwrap();
    }
    // A call its timeout cuts is logged too, as Ray's CANCELLED (it wrote
    // no line at all).
    let cut = serve
        .app_handle("loud")
        .unwrap()
        .with_timeout(std::time::Duration::from_secs(1))
        .call::<_, String>("hang")
        .await;
    assert!(
        matches!(cut, Err(flotilla::CallError::Timeout { .. })),
        "{cut:?}"
    );
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The user's own events, which name no application, go by the config of
    // the application whose replica runs them.
    assert!(
        lines.iter().any(|l| l.starts_with('{')
            && l.contains("user-loud")
            && l.contains("\"app\":\"loud\"")
            && l.contains("\"deployment\":\"probe\"")),
        "loud's user code logs at INFO, as JSON: {lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("user-quiet")),
        "quiet's user code is held to the global WARNING: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("user-muted") && l.contains("app=muted")),
        "muted's user code logs at INFO: {lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with('{')
            && l.contains("\"target\":\"flotilla::access\"")
            && l.contains("\"app\":\"loud\"")),
        "an access log line for loud, as JSON: {lines:#?}"
    );
    let access = |status: &str| {
        lines.iter().any(|l| {
            l.contains("\"target\":\"flotilla::access\"")
                && l.contains("\"app\":\"loud\"")
                && l.contains(&format!("\"status\":\"{status}\""))
                && l.contains("\"latency_ms\":")
        })
    };
    assert!(access("OK"), "answered, with its latency: {lines:#?}");
    assert!(access("CANCELLED"), "cut by its timeout: {lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"app\":\"loud\"") && l.contains("application status")),
        "loud INFO events are kept: {lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("app=quiet") || l.contains("\"app\":\"quiet\"")),
        "quiet's INFO events and access logs are filtered by the global WARNING: {lines:#?}"
    );
    // muted logs at INFO, but not its access logs.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("app=muted") && l.contains("application status")),
        "muted INFO events are kept: {lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("app=muted") && l.contains("flotilla::access")),
        "muted's access logs are off: {lines:#?}"
    );

    // Every status transition is logged, also those the Controller publishes
    // itself: a redeploy's DEPLOYING (on accepting the new target) and a
    // deletion's DELETING.
    let transition = |from: &str, to: &str| {
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines().any(|l| {
            l.contains("app=muted")
                && l.contains("application status")
                && l.contains(&format!("from={from}"))
                && l.contains(&format!("to={to}"))
        })
    };
    let muted = |tag: &str| {
        format!(
            "{{name: muted, route_prefix: /muted, import_path: test::app, args: {{tag: {tag}}}, \
             logging_config: {{log_level: INFO, enable_access_log: false}}}}"
        )
    };
    let before = serve.app_status("muted").observed_generation;
    serve
        .apply_config(config(&format!(
            "logging_config: {{log_level: WARNING}}\napplications:\n  - {}\n",
            muted("m2")
        )))
        .await
        .unwrap();
    support::wait_until(&serve, "muted", |s| {
        s.observed_generation > before && s.status == A::Running
    })
    .await;
    assert!(
        transition("RUNNING", "DEPLOYING"),
        "the redeploy's DEPLOYING"
    );
    assert!(transition("DEPLOYING", "RUNNING"), "RUNNING again");
    serve.delete_apps(["muted"], true).await.unwrap();
    assert!(transition("RUNNING", "DELETING"), "the deletion's DELETING");
    // The first (as the config is applied) and the last (the removal).
    assert!(
        transition("NOT_STARTED", "DEPLOYING"),
        "the first DEPLOYING"
    );
    assert!(transition("DELETING", "NOT_STARTED"), "the removal");

    // A config without a top-level logging_config: the program's ERROR holds
    // again for an application without its own, not the default INFO.
    serve
        .apply_config(config("applications: []\n"))
        .await
        .unwrap();
    let h = serve
        .run(support::app("imperative", 1, support::tag("i")))
        .await
        .unwrap();
    h.call::<_, String>("log:user-imperative").await.unwrap();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(
        !text.contains("user-imperative"),
        "an INFO event passed the program's ERROR: {text}"
    );
}
