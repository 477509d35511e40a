//! Whole configs using many fields together (fixtures/, written for these
//! tests), and the round trip of one that uses every field Flotilla accepts.

use std::time::Duration;

use super::parse;
use crate::{
    AggregationFunction, ApplicationSpec, Args, AutoscalingConfig, AutoscalingPolicy,
    BackpressureConfig, BackpressureStatus, ConfigWarning, DeploymentSpec, LogAttr, LogEncoding,
    LogLevel, LoggingConfig, PlacementGroup, PlacementStrategy, ProxyLocation, ReplicaCount,
    RequestRouterConfig, Resources, RolloutConfig, ServeConfig, apply_overrides,
};

const EVERY_FIELD: &str = include_str!("fixtures/every_field.yaml");
const STOREFRONT: &str = include_str!("fixtures/storefront.yaml");
const ROUTER_AND_POLICIES: &str = include_str!("fixtures/router_and_policies.yaml");

/// A builder's spec with fixed one-replica deployments `names`.
fn built(app: &str, names: &[&str]) -> ApplicationSpec {
    names
        .iter()
        .fold(ApplicationSpec::builder(app), |b, n| {
            b.deployment(DeploymentSpec::builder(*n, format!("{app}::{n}")))
        })
        .build()
        .unwrap()
}

fn kwargs<const N: usize>(pairs: [(&str, &str); N]) -> Args {
    Args::encode(&std::collections::BTreeMap::from(pairs)).unwrap()
}

#[test]
fn a_config_with_every_field_round_trips_through_msgpack_unchanged() {
    // Named, as the checkpoint stores it (a positional encoding cannot
    // leave out a field left out, see `Nullable`).
    let c = parse(EVERY_FIELD);
    let bytes = rmp_serde::to_vec_named(&c).unwrap();
    let back: ServeConfig = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(back, c);
    back.validate().unwrap();
    assert_eq!(back.warnings(), c.warnings());
    // The restored config applies exactly as the parsed one.
    for (a, b) in back.applications.iter().zip(&c.applications) {
        let names = ["search", "index"];
        assert_eq!(
            apply_overrides(built("catalog", &names), a).unwrap(),
            apply_overrides(built("catalog", &names), b).unwrap()
        );
    }
}

#[test]
fn a_config_with_every_field_lands_in_the_model() {
    let c = parse(EVERY_FIELD);
    assert_eq!(c.proxy_location, ProxyLocation::HeadOnly);
    assert_eq!(c.http_options.port(), 8080);
    assert_eq!(c.http_options.keep_alive_timeout_s(), 60);
    assert!(c.http_options.tls());
    assert_eq!(c.grpc_options.port, Some(9100));
    assert_eq!(c.target_capacity, Some(100.0));
    assert_eq!(
        c.logging_config,
        Some(LoggingConfig {
            log_level: LogLevel::Warning,
            encoding: LogEncoding::Json,
            enable_access_log: false,
            ..LoggingConfig::default()
                .with_logs_dir("/var/log/flotilla")
                .with_additional_log_standard_attrs([
                    LogAttr::Name,
                    LogAttr::Lineno,
                    LogAttr::Process
                ])
        })
    );
    let app = &c.applications[0];
    assert!(app.take_over);
    let spec = apply_overrides(built("catalog", &["search", "index"]), app).unwrap();
    assert_eq!(spec.route_prefix.as_ref().unwrap().as_str(), "/catalog");
    assert_eq!(spec.logging.as_ref().unwrap().log_level, LogLevel::Warning);
    assert!(!spec.external_scaler_enabled);
    let search = &spec.deployment("search").unwrap().config;
    // The application's policy wins over the deployment's own.
    let app_policy = AutoscalingPolicy::named("catalog.policies:queue_depth".try_into().unwrap())
        .with_kwargs(kwargs([("queue", "catalog")]));
    assert_eq!(
        search.num_replicas,
        ReplicaCount::Auto(AutoscalingConfig {
            min_replicas: 0,
            initial_replicas: Some(1),
            max_replicas: 8,
            target_ongoing_requests: 4.0,
            upscale_delay: Duration::from_secs(10),
            downscale_delay: Duration::from_secs(120),
            upscaling_factor: Some(1.2),
            downscaling_factor: Some(0.5),
            look_back_period: Duration::from_secs(20),
            downscale_to_zero_delay: Some(Duration::from_secs(900)),
            aggregation_function: AggregationFunction::Max,
            policy: app_policy,
        })
    );
    assert_eq!(search.max_ongoing_requests, 16);
    assert_eq!(search.max_queued_requests, Some(64));
    assert_eq!(
        search.backpressure,
        BackpressureConfig {
            status_code: BackpressureStatus::TooManyRequests,
            retry_after: Some(Duration::from_secs(3)),
        }
    );
    assert_eq!(search.health_check_period, Duration::from_secs(5));
    assert_eq!(search.health_check_timeout, Duration::from_millis(12_500));
    assert_eq!(search.graceful_shutdown_wait_loop, Duration::from_secs(1));
    assert_eq!(search.graceful_shutdown_timeout, Duration::from_secs(15));
    let replica = Resources::default()
        .with_gpus(0.5)
        .with_memory(2_000_000_000)
        .with_custom("ssd", 1.0)
        .with_custom("accelerator_type:A10G", 0.001);
    assert_eq!(search.resources, replica);
    assert_eq!(
        search.placement_group,
        Some(PlacementGroup::new(
            vec![
                Resources::none()
                    .with_cpus(1.0)
                    .with_gpus(0.5)
                    .with_custom("ssd", 1.0)
                    .with_custom("accelerator_type:A10G", 0.001),
                Resources::none().with_cpus(2.0).with_memory(1_000_000_000),
            ],
            PlacementStrategy::StrictPack
        ))
    );
    assert_eq!(
        search.logging,
        Some(LoggingConfig {
            log_level: LogLevel::Debug,
            ..LoggingConfig::default().with_additional_log_standard_attrs([LogAttr::Thread])
        })
    );
    assert_eq!(
        search.request_router,
        RequestRouterConfig {
            request_routing_stats_period: Duration::from_secs(5),
            request_routing_stats_timeout: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(50),
            backoff_multiplier: 1.5,
            max_backoff: Duration::from_secs(2),
            ..RequestRouterConfig::default()
        }
    );
    assert_eq!(
        search.rollout,
        RolloutConfig {
            max_changing_fraction: 0.25,
            max_surge_percent: Some(50),
        }
    );
    let index = &spec.deployment("index").unwrap().config;
    assert_eq!(index.num_replicas, ReplicaCount::Fixed(2));
    assert_eq!(index.max_ongoing_requests, 4);
    assert_eq!(index.max_replicas_per_node, Some(1));
    assert_eq!(
        index.batching,
        Some(crate::BatchConfig::new(16, Duration::from_millis(5)).with_max_concurrent_batches(2))
    );
    assert_eq!(index.max_num_models_per_replica, None);
}

#[test]
fn a_config_with_every_field_warns_about_what_it_does_not_do() {
    let c = parse(EVERY_FIELD);
    let app = || "catalog".try_into().unwrap();
    let dep = |d: &str| d.try_into().unwrap();
    assert_eq!(
        c.warnings(),
        vec![
            ConfigWarning::ControllerOptionsNotApplied {
                env_vars: vec!["RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S".into()],
            },
            ConfigWarning::RuntimeEnvNotApplied {
                app: app(),
                keys: vec!["env_vars".into(), "pip".into(), "working_dir".into()],
            },
            ConfigWarning::DeprecatedField {
                app: app(),
                deployment: dep("search"),
                field: "autoscaling_config.target_num_ongoing_requests_per_replica",
                instead: "autoscaling_config.target_ongoing_requests",
            },
            ConfigWarning::DeprecatedField {
                app: app(),
                deployment: dep("search"),
                field: "autoscaling_config.smoothing_factor",
                instead: "autoscaling_config.upscaling_factor and downscaling_factor",
            },
            ConfigWarning::DeprecatedField {
                app: app(),
                deployment: dep("search"),
                field: "autoscaling_config.upscale_smoothing_factor",
                instead: "autoscaling_config.upscaling_factor",
            },
            ConfigWarning::MetricsIntervalIgnored {
                app: app(),
                deployment: dep("search"),
                seconds: 5.0,
            },
            ConfigWarning::ApplicationPolicyWins {
                app: app(),
                deployment: dep("search"),
            },
            ConfigWarning::RouterSettingsWithoutEffect {
                app: app(),
                deployment: dep("search"),
                fields: vec![
                    "request_router_config.request_routing_stats_period_s",
                    "request_router_config.request_routing_stats_timeout_s",
                    "request_router_config.initial_backoff_s",
                    "request_router_config.backoff_multiplier",
                    "request_router_config.max_backoff_s",
                ],
            },
            ConfigWarning::DeprecatedField {
                app: app(),
                deployment: dep("index"),
                field: "max_concurrent_queries",
                instead: "max_ongoing_requests",
            },
        ]
    );
    for w in c.warnings() {
        assert!(!w.to_string().is_empty());
    }
}

#[test]
fn a_storefront_of_three_applications_loads_and_applies() {
    let c = parse(STOREFRONT).inherit_logging();
    let names: Vec<&str> = c.applications.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["web", "recommender", "batch"]);
    let web = apply_overrides(built("web", &["Frontend"]), &c.applications[0]).unwrap();
    assert_eq!(web.deployments[0].config.resources.cpus, 0.5);
    assert_eq!(web.logging.as_ref().unwrap().log_level, LogLevel::Info);
    let rec = apply_overrides(
        built("recommender", &["Ranker", "Embedder"]),
        &c.applications[1],
    )
    .unwrap();
    let ranker = &rec.deployment("Ranker").unwrap().config;
    assert_eq!(ranker.max_ongoing_requests, 8);
    let ReplicaCount::Auto(a) = &ranker.num_replicas else {
        panic!("Ranker autoscales");
    };
    assert_eq!(
        (a.min_replicas, a.max_replicas, a.target_ongoing_requests),
        (1, 6, 2.0)
    );
    assert_eq!(ranker.resources.memory_bytes, 4_000_000_000);
    let embedder = &rec.deployment("Embedder").unwrap().config;
    assert_eq!(embedder.placement_group.as_ref().unwrap().total().cpus, 5.0);
    let batch = apply_overrides(built("batch", &["Worker"]), &c.applications[2]).unwrap();
    assert!(batch.external_scaler_enabled);
    assert_eq!(batch.deployments[0].config.max_replicas_per_node, Some(1));
    assert_eq!(
        batch.logging.as_ref().unwrap().logs_dir.as_deref(),
        Some("/var/log/batch")
    );
    // web's empty runtime_env warns about nothing; recommender's names its keys.
    let envs: Vec<(String, Vec<String>)> = c
        .warnings()
        .into_iter()
        .filter_map(|w| match w {
            ConfigWarning::RuntimeEnvNotApplied { app, keys } => Some((app.to_string(), keys)),
            _ => None,
        })
        .collect();
    assert_eq!(
        envs,
        [(
            "recommender".to_owned(),
            vec!["pip".to_owned(), "working_dir".to_owned()]
        )]
    );
}

#[test]
fn custom_routers_and_policies_are_named_for_the_registry() {
    let c = parse(ROUTER_AND_POLICIES);
    let spec = apply_overrides(
        built("inference", &["Preprocessor", "Model"]),
        &c.applications[0],
    )
    .unwrap();
    let app_policy = AutoscalingPolicy::named("inference.policies:coordinated".try_into().unwrap());
    for d in &spec.deployments {
        let ReplicaCount::Auto(a) = &d.config.num_replicas else {
            panic!("{} autoscales", d.name);
        };
        assert_eq!(a.policy, app_policy, "{}", d.name);
    }
    let model = &spec.deployment("Model").unwrap().config;
    assert_eq!(
        model.request_router.request_router_class.as_str(),
        "inference.routers.LeastLoaded"
    );
    assert_eq!(
        model.request_router.request_router_kwargs,
        Args::encode(&std::collections::BTreeMap::from([("imbalance", 20)])).unwrap()
    );
    // The deployment's own policy is kept in the config as written.
    let own = c.applications[0].deployments[1]
        .autoscaling_config
        .given()
        .and_then(|a| a.policy.clone())
        .unwrap();
    assert_eq!(
        own.policy_kwargs,
        kwargs([
            ("broker_url", "redis://localhost:6379/0"),
            ("queue_name", "jobs")
        ])
    );
}
