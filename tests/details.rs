//! The facade's read-only details for the HTTP layer: the applied config (held
//! by the Controller, surviving its crash) and every deployment's snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use flotilla::{ApplicationSpec, ApplicationStatus, DeploymentSpec, ServeConfig};

fn registry(switches: &std::sync::Arc<support::Switches>) -> flotilla::Registry {
    support::registry(switches)
        .register_app("test.probe:app", |_args| async {
            ApplicationSpec::builder("cfg")
                .route_prefix("/cfg")
                .deployment(
                    DeploymentSpec::builder("probe", "test::Probe").init_args(&support::tag("c")),
                )
                .build()
                .map_err(|e| flotilla::UserError::new(e.to_string()))
        })
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_applied_config_is_read_back_through_a_controller_crash() {
    let (_dir, _sw, serve) = support::start_fresh_with(registry).await;
    assert_eq!(serve.applied_config().await.unwrap(), None);
    let config = ServeConfig::from_yaml(
        "applications:\n  - name: cfg\n    route_prefix: /cfg\n    import_path: test.probe:app\n",
    )
    .unwrap();
    serve.apply_config(config.clone()).await.unwrap();
    support::wait_status(&serve, "cfg", ApplicationStatus::Running).await;
    assert_eq!(serve.applied_config().await.unwrap(), Some(config.clone()));
    serve.crash_controller();
    assert_eq!(serve.applied_config().await.unwrap(), Some(config));
    let (name, _) = serve.controller_actor();
    assert!(name.ends_with("/controller"), "{name}");

    serve
        .run(support::app("imp", 2, support::tag("i")))
        .await
        .unwrap();
    let details = serve.deployment_details(Duration::from_secs(1)).await;
    let found: Vec<(String, String, usize)> = details
        .iter()
        .map(|d| {
            (
                d.app.to_string(),
                d.deployment.to_string(),
                d.snapshot.as_ref().map_or(0, |s| s.replicas.len()),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("cfg".into(), "probe".into(), 1),
            ("imp".into(), "probe".into(), 2)
        ]
    );
    serve.shutdown().await.unwrap();
    assert!(
        serve.applied_config().await.is_err(),
        "Unavailable after shutdown"
    );
}
