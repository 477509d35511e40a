//! `DeploymentSchema`'s and `RayActorOptionsSchema`'s fields.

use std::time::Duration;

use super::{applied, assert_at, assert_parse_at, built, err, front, parse};
use crate::{
    Args, BackpressureConfig, BackpressureStatus, ConfigWarning, DeploymentSpec, LogLevel,
    LoggingConfig, PlacementGroup, PlacementStrategy, RequestRouterConfig, Resources,
    apply_overrides,
};

#[test]
fn max_concurrent_queries_is_the_old_name_of_max_ongoing_requests() {
    let text = front("        max_concurrent_queries: 12\n");
    assert_eq!(
        applied("        max_concurrent_queries: 12\n").max_ongoing_requests,
        12
    );
    assert_eq!(
        parse(&text).warnings(),
        vec![ConfigWarning::DeprecatedField {
            app: "shop".try_into().unwrap(),
            deployment: "front".try_into().unwrap(),
            field: "max_concurrent_queries",
            instead: "max_ongoing_requests",
        }]
    );
    let both = front("        max_ongoing_requests: 8\n        max_concurrent_queries: 12\n");
    let e = err(&both);
    assert_at(
        &e,
        &both,
        "12",
        "max_concurrent_queries",
        "give only max_ongoing_requests",
    );
    assert_eq!((e.app(), e.deployment()), (Some("shop"), Some("front")));
}

#[test]
fn a_bad_value_under_an_old_name_is_named_as_the_file_names_it() {
    let text = front("        max_concurrent_queries: 0\n");
    assert_at(
        &err(&text),
        &text,
        "0\n",
        "max_concurrent_queries",
        "at least 1",
    );
    for old in [
        "target_num_ongoing_requests_per_replica: 0",
        "smoothing_factor: 0",
        "upscale_smoothing_factor: 0",
        "downscale_smoothing_factor: 0",
    ] {
        let text = front(&format!(
            "        autoscaling_config:\n          max_replicas: 4\n          {old}\n"
        ));
        let field = format!("autoscaling_config.{}", old.split_once(':').unwrap().0);
        assert_at(&err(&text), &text, "0\n", &field, "");
    }
}

#[test]
fn backpressure_config_is_kept_for_the_proxy() {
    let c = applied("        backpressure_config: {status_code: 429, retry_after_s: 2.5}\n");
    assert_eq!(
        c.backpressure,
        BackpressureConfig {
            status_code: BackpressureStatus::TooManyRequests,
            retry_after: Some(Duration::from_millis(2500)),
        }
    );
    // Given, it replaces the builder's whole: Ray's defaults for the rest.
    assert_eq!(
        applied("        backpressure_config: {}\n").backpressure,
        BackpressureConfig::default()
    );
    // The status code is Ray's Literal[503, 429]: exactly these integers.
    for bad in ["500", "'429'", "429.0"] {
        let text = front(&format!(
            "        backpressure_config:\n          status_code: {bad}\n"
        ));
        assert_parse_at(&err(&text), &text, bad, "503 or 429");
    }
    let typo = front("        backpressure_config: {retry_after: 5}\n");
    assert!(
        err(&typo)
            .to_string()
            .contains("did you mean `retry_after_s`?")
    );
    let negative = front("        backpressure_config:\n          retry_after_s: -1\n");
    assert_at(
        &err(&negative),
        &negative,
        "-1",
        "backpressure_config.retry_after_s",
        ">= 0",
    );
}

#[test]
fn placement_group_bundles_and_strategy_are_applied_as_a_placement_group() {
    let c = applied(
        "        placement_group_bundles: [{CPU: 1, GPU: 1}, {CPU: 2, memory: 1.5e9, disk: 1}]\n        placement_group_strategy: STRICT_SPREAD\n",
    );
    assert_eq!(
        c.placement_group,
        Some(PlacementGroup::new(
            vec![
                Resources::none().with_cpus(1.0).with_gpus(1.0),
                Resources::none()
                    .with_cpus(2.0)
                    .with_memory(1_500_000_000)
                    .with_custom("disk", 1.0),
            ],
            PlacementStrategy::StrictSpread
        ))
    );
    // Bundles alone are PACK.
    let pack = applied("        placement_group_bundles: [{CPU: 1}]\n");
    assert_eq!(
        pack.placement_group.unwrap().strategy,
        PlacementStrategy::Pack
    );
    for (name, s) in [
        ("PACK", PlacementStrategy::Pack),
        ("SPREAD", PlacementStrategy::Spread),
        ("STRICT_PACK", PlacementStrategy::StrictPack),
    ] {
        let c = applied(&format!(
            "        placement_group_bundles: [{{CPU: 1}}]\n        placement_group_strategy: {name}\n"
        ));
        assert_eq!(c.placement_group.unwrap().strategy, s);
    }
    let bogus = front(
        "        placement_group_bundles: [{CPU: 1}]\n        placement_group_strategy: BOGUS\n",
    );
    assert_parse_at(&err(&bogus), &bogus, "BOGUS", "BOGUS");
    // The replica runs in the first bundle (Ray's rule). The replica is the
    // builder's unless ray_actor_options are given: this one needs 1 CPU (the
    // default), so a GPU-only first bundle is refused as the overrides apply.
    let gpu_only = parse(&front(
        "        placement_group_bundles:\n          - {GPU: 1}\n",
    ));
    let e = apply_overrides(built(), &gpu_only.applications[0]).unwrap_err();
    assert_eq!(e.field_name(), Some("placement_group_bundles"));
    assert!(
        e.to_string()
            .contains("it needs 1 CPU, but the first bundle has 0"),
        "{e}"
    );
    // A builder whose replica needs half a CPU and a GPU fits the bundles that
    // say so, though the default replica (1 CPU) would not.
    let bundles = parse(&front(
        "        placement_group_bundles: [{CPU: 0.5, GPU: 1}, {GPU: 1}]\n",
    ));
    let mut small = built();
    small.deployments[0].config.resources = Resources::none().with_cpus(0.5).with_gpus(1.0);
    let spec = apply_overrides(small, &bundles.applications[0]).unwrap();
    assert_eq!(
        spec.deployment("front").unwrap().config.placement_group,
        Some(PlacementGroup::new(
            vec![
                Resources::none().with_cpus(0.5).with_gpus(1.0),
                Resources::none().with_gpus(1.0)
            ],
            PlacementStrategy::Pack
        ))
    );
    // Given ray_actor_options, the replica is known at once: refused at parse.
    let gpu_only = front(
        "        ray_actor_options: {num_cpus: 1}\n        placement_group_bundles:\n          - {GPU: 1}\n",
    );
    assert_at(
        &err(&gpu_only),
        &gpu_only,
        "- {GPU",
        "placement_group_bundles",
        "it needs 1 CPU, but the first bundle has 0",
    );
    let empty = front("        placement_group_bundles: []\n");
    assert_at(
        &err(&empty),
        &empty,
        "[]",
        "placement_group_bundles",
        "non-empty list",
    );
    // A strategy alone re-places the builder's bundles; without any, Ray's error.
    let text = front("        placement_group_strategy: SPREAD\n");
    let c = parse(&text);
    let e = apply_overrides(built(), &c.applications[0]).unwrap_err();
    assert_eq!(e.field_name(), Some("placement_group_strategy"));
    assert_eq!((e.app(), e.deployment()), (Some("shop"), Some("front")));
    let mut with_bundles = built();
    with_bundles.deployments[0].config.placement_group = Some(PlacementGroup::new(
        vec![Resources::default()],
        PlacementStrategy::Pack,
    ));
    let spec = apply_overrides(with_bundles, &c.applications[0]).unwrap();
    assert_eq!(
        spec.deployments[0]
            .config
            .placement_group
            .as_ref()
            .unwrap()
            .strategy,
        PlacementStrategy::Spread
    );
}

#[test]
fn a_placement_group_is_part_of_the_code_version() {
    let d = built().deployments[0].clone();
    let pg = DeploymentSpec {
        config: applied("        placement_group_bundles: [{CPU: 1}]\n"),
        ..d.clone()
    };
    assert_ne!(pg.code_version(), d.code_version());
    assert_eq!(pg.config_version(), d.config_version());
    let spread = DeploymentSpec {
        config: applied(
            "        placement_group_bundles: [{CPU: 1}]\n        placement_group_strategy: SPREAD\n",
        ),
        ..d.clone()
    };
    assert_ne!(spread.code_version(), pg.code_version());
}

#[test]
fn max_replicas_per_node_is_applied_and_excludes_bundles() {
    let c = applied("        max_replicas_per_node: 2\n");
    assert_eq!(c.max_replicas_per_node, Some(2));
    let d = built().deployments[0].clone();
    let limited = DeploymentSpec {
        config: c,
        ..d.clone()
    };
    assert_ne!(limited.code_version(), d.code_version());
    for bad in ["0", "101"] {
        let text = front(&format!("        max_replicas_per_node: {bad}\n"));
        assert_at(
            &err(&text),
            &text,
            bad,
            "max_replicas_per_node",
            "the range of [1, 100]",
        );
    }
    let both =
        front("        max_replicas_per_node: 2\n        placement_group_bundles: [{CPU: 1}]\n");
    assert_at(
        &err(&both),
        &both,
        "2\n",
        "max_replicas_per_node",
        "not allowed when placement_group_bundles is provided",
    );
}

#[test]
fn a_deployments_logging_config_is_kept() {
    let c = applied("        logging_config: {log_level: DEBUG, logs_dir: /tmp/front}\n");
    assert_eq!(
        c.logging,
        Some(LoggingConfig {
            log_level: LogLevel::Debug,
            ..LoggingConfig::default().with_logs_dir("/tmp/front")
        })
    );
}

#[test]
fn request_router_config_takes_the_default_router_and_its_settings() {
    let c = applied(
        "        request_router_config:\n          request_router_class: ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter\n          request_routing_stats_period_s: 5\n          request_routing_stats_timeout_s: 15\n          initial_backoff_s: 0.05\n          backoff_multiplier: 3\n          max_backoff_s: 1\n",
    );
    assert_eq!(
        c.request_router,
        RequestRouterConfig {
            request_routing_stats_period: Duration::from_secs(5),
            request_routing_stats_timeout: Duration::from_secs(15),
            initial_backoff: Duration::from_millis(50),
            backoff_multiplier: 3.0,
            max_backoff: Duration::from_secs(1),
            ..RequestRouterConfig::default()
        }
    );
    assert!(c.request_router.is_builtin());
    // Kept, and said to change nothing.
    let with_stats = parse(&front(
        "        request_router_config:\n          initial_backoff_s: 0.05\n          request_routing_stats_period_s: 5\n",
    ));
    let warnings = with_stats.warnings();
    assert_eq!(
        warnings,
        vec![ConfigWarning::RouterSettingsWithoutEffect {
            app: crate::AppName::new("shop").unwrap(),
            deployment: crate::DeploymentName::new("front").unwrap(),
            fields: vec![
                "request_router_config.request_routing_stats_period_s",
                "request_router_config.initial_backoff_s",
            ],
        }]
    );
    assert!(
        warnings[0].to_string().contains("(no effect)"),
        "{}",
        warnings[0]
    );
    // The class and its kwargs alone are no warning.
    let class_only = parse(&front(
        "        request_router_config:\n          request_router_class: shop.routers.Uniform\n",
    ));
    assert_eq!(class_only.warnings(), vec![]);
    // Another class is kept: whether the Registry has it is checked when the
    // config is applied.
    let custom = applied(
        "        request_router_config:\n          request_router_class: shop.routers.Uniform\n          request_router_kwargs: {spread: 2}\n",
    );
    assert_eq!(
        custom.request_router.request_router_class.as_str(),
        "shop.routers.Uniform"
    );
    assert!(!custom.request_router.is_builtin());
    let zero =
        front("        request_router_config:\n          request_routing_stats_period_s: 0\n");
    assert_at(
        &err(&zero),
        &zero,
        "0\n",
        "request_router_config.request_routing_stats_period_s",
        "> 0",
    );
    let kwargs = front("        request_router_config:\n          request_router_kwargs: [1]\n");
    assert_parse_at(&err(&kwargs), &kwargs, "[1]", "expected a mapping");
}

/// Ray's default router takes no kwargs (its `initialize_state` ignores them):
/// given to the built-in router, by its path or with the class left out,
/// they are warned about; given to another router, or empty, they are not.
#[test]
fn router_kwargs_given_to_the_built_in_router_are_warned_about() {
    for class in [
        "",
        "          request_router_class: ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter\n",
    ] {
        let c = parse(&front(&format!(
            "        request_router_config:\n{class}          request_router_kwargs: {{spread: 2, bias: 1}}\n"
        )));
        let warnings = c.warnings();
        assert_eq!(
            warnings,
            vec![ConfigWarning::RouterKwargsWithoutEffect {
                app: crate::AppName::new("shop").unwrap(),
                deployment: crate::DeploymentName::new("front").unwrap(),
                keys: vec!["bias".into(), "spread".into()],
            }],
            "{class}"
        );
        let shown = warnings[0].to_string();
        assert!(
            shown.contains("deployment 'front'")
                && shown.contains("request_router_kwargs (bias, spread)")
                && shown.contains("change nothing"),
            "{shown}"
        );
    }
    for quiet in [
        "          request_router_class: shop.routers.Uniform\n          request_router_kwargs: {spread: 2}\n",
        "          request_router_kwargs: {}\n",
        "          request_router_kwargs: null\n",
    ] {
        let c = parse(&front(&format!("        request_router_config:\n{quiet}")));
        assert_eq!(c.warnings(), vec![], "{quiet}");
    }
}

#[test]
fn gang_scheduling_deployment_actors_and_label_selectors_are_refused_with_why() {
    for (fields, needle, field, why) in [
        (
            "        gang_scheduling_config:\n          gang_size: 2\n",
            "gang_size",
            "gang_scheduling_config",
            "no gang scheduling",
        ),
        (
            "        deployment_actors:\n          - {name: counter, actor_class: shop:Counter}\n",
            "- {name",
            "deployment_actors",
            "no deployment-scoped actors",
        ),
        (
            "        placement_group_bundles: [{CPU: 1}]\n        placement_group_bundle_label_selector:\n          - {zone: a}\n",
            "- {zone",
            "placement_group_bundle_label_selector",
            "nodes carry no labels",
        ),
        (
            "        ray_actor_options:\n          label_selector:\n            zone: a\n",
            "zone",
            "ray_actor_options.label_selector",
            "nodes carry no labels",
        ),
        (
            "        ray_actor_options:\n          fallback_strategy:\n            - label_selector: {zone: a}\n",
            "- label",
            "ray_actor_options.fallback_strategy",
            "label selectors",
        ),
    ] {
        let text = front(fields);
        let e = err(&text);
        assert_at(&e, &text, needle, field, why);
        assert_eq!((e.app(), e.deployment()), (Some("shop"), Some("front")));
    }
    // Null, or empty, they ask for nothing and are accepted.
    applied(
        "        gang_scheduling_config: null\n        deployment_actors: []\n        ray_actor_options: {label_selector: {}, fallback_strategy: []}\n",
    );
}

#[test]
fn rolling_update_percentage_and_max_surge_percent_set_the_rollout() {
    let c = applied("        rolling_update_percentage: 0.5\n        max_surge_percent: 25\n");
    assert_eq!(c.rollout.max_changing_fraction, 0.5);
    assert_eq!(c.rollout.max_surge_percent, Some(25));
    assert_eq!(c.rollout.step(10), 5);
    for bad in ["0", "1.5"] {
        let text = front(&format!("        rolling_update_percentage: {bad}\n"));
        assert_at(
            &err(&text),
            &text,
            bad,
            "rolling_update_percentage",
            "(0, 1]",
        );
    }
    let surge = front("        max_surge_percent: 101\n");
    assert_at(
        &err(&surge),
        &surge,
        "101",
        "max_surge_percent",
        "from 0 to 100",
    );
}

/// Ray refuses an amount finer than its resource unit (1/10,000), which it
/// would count as nothing.
#[test]
fn a_resource_amount_finer_than_rays_unit_is_refused() {
    for (fields, field) in [
        (
            "ray_actor_options: {resources: {tpu: 0.00001}}",
            "ray_actor_options.resources",
        ),
        (
            "ray_actor_options: {num_gpus: 0.00005}",
            "ray_actor_options.num_gpus",
        ),
        (
            "ray_actor_options: {num_cpus: 1}\n        placement_group_bundles: [{CPU: 0.00001}]",
            "placement_group_bundles",
        ),
    ] {
        let text = front(&format!("        {fields}\n"));
        let e = err(&text);
        assert_eq!(e.field_name(), Some(field), "{e}");
        assert!(e.to_string().contains("0.0001"), "{e}");
    }
    applied("        ray_actor_options: {num_cpus: 0.0001, resources: {tpu: 0}}\n");
    // A config stored before the rule still rebuilds: its overrides are laid
    // over the builder again without it.
    let mut app = parse(&front("        ray_actor_options: {num_cpus: 1}\n"))
        .applications
        .remove(0);
    let actor = app.deployments[0].ray_actor_options.as_mut().unwrap();
    actor.resources = Some([("tpu".to_owned(), 0.00001)].into());
    crate::apply_overrides(built(), &app).unwrap();
}

#[test]
fn ray_actor_options_accelerator_type_is_rays_custom_resource() {
    let c = applied("        ray_actor_options: {num_cpus: 1, accelerator_type: A10G}\n");
    assert_eq!(
        c.resources,
        Resources::default().with_custom("accelerator_type:A10G", 0.001)
    );
    let cpu = front("        ray_actor_options:\n          resources: {CPU: 2}\n");
    assert_at(
        &err(&cpu),
        &cpu,
        "{CPU",
        "ray_actor_options.resources",
        "Use the 'num_cpus' and 'num_gpus' keyword",
    );
    // Memory is its own option, and 'bundle' is reserved, as in Ray (as
    // custom resources no node would offer them: never placed).
    for (key, says) in [
        ("memory", "must not contain the key 'memory'"),
        ("object_store_memory", "must not contain the key 'memory'"),
        ("bundle", "reserved"),
    ] {
        let text = front(&format!(
            "        ray_actor_options:\n          resources: {{{key}: 2}}\n"
        ));
        assert_at(
            &err(&text),
            &text,
            &format!("{{{key}"),
            "ray_actor_options.resources",
            says,
        );
    }
}

#[test]
fn ray_actor_options_runtime_env_joins_the_applications_warning() {
    let text =
        front("        ray_actor_options:\n          runtime_env: {working_dir: s3://b/x.zip}\n");
    let c = parse(&text);
    assert_eq!(
        c.applications[0].deployments[0]
            .ray_actor_options
            .as_ref()
            .and_then(|r| r.runtime_env.clone())
            .map(|e| crate::serve_config::value::map_keys(&e)),
        Some(vec!["working_dir".to_owned()])
    );
    assert!(matches!(
        &c.warnings()[..],
        [ConfigWarning::RuntimeEnvNotApplied { keys, .. }] if keys == &["working_dir"]
    ));
}

#[test]
fn removed_deployment_fields_are_unknown_with_a_hint() {
    let text = front("        route_prefix: /front\n");
    assert_parse_at(
        &err(&text),
        &text,
        "route_prefix",
        "set route_prefix on the application",
    );
    let osm = front("        ray_actor_options: {object_store_memory: 1}\n");
    assert!(err(&osm).to_string().contains("no object store"));
    // An unknown field far from every known one lists the known ones.
    let far = front("        zzz: 1\n");
    assert!(
        err(&far)
            .to_string()
            .contains("known fields here: name, num_replicas")
    );
}

#[test]
fn a_user_config_is_still_any_value() {
    assert_eq!(
        applied("        user_config: [1, 2]\n").user_config,
        Some(Args::encode(&[1u8, 2]).unwrap())
    );
}

#[test]
fn batching_fields_turn_batching_on_with_rays_defaults_for_the_rest() {
    use crate::BatchConfig;
    // Not given: no batching (the builder's).
    assert_eq!(applied("").batching, None);
    let c = applied("        max_batch_size: 32\n");
    assert_eq!(
        c.batching,
        Some(BatchConfig {
            max_batch_size: 32,
            ..BatchConfig::default()
        })
    );
    let c = applied(
        "        max_batch_size: 8.0\n        batch_wait_timeout_s: 0.25\n        max_concurrent_batches: '2'\n",
    );
    assert_eq!(
        c.batching,
        Some(BatchConfig::new(8, Duration::from_millis(250)).with_max_concurrent_batches(2))
    );
    // A zero timeout is valid (Ray's 0 and 0.0).
    assert_eq!(
        applied("        batch_wait_timeout_s: 0\n")
            .batching
            .map(|b| b.batch_wait_timeout),
        Some(Duration::ZERO)
    );
    // Given fields replace the builder's batching settings, the others stay.
    let c = front("        max_concurrent_batches: 3\n");
    let mut built = super::built();
    built.deployments[0].config.batching = Some(BatchConfig::new(16, Duration::from_millis(2)));
    let spec = apply_overrides(built, &parse(&c).applications[0]).unwrap();
    assert_eq!(
        spec.deployment("front").unwrap().config.batching,
        Some(BatchConfig::new(16, Duration::from_millis(2)).with_max_concurrent_batches(3))
    );
    for (field, bad, says) in [
        ("max_batch_size", "0", ">= 1"),
        ("max_concurrent_batches", "0", ">= 1"),
        ("batch_wait_timeout_s", "-0.5", ">= 0"),
    ] {
        let text = front(&format!("        {field}: {bad}\n"));
        assert_at(&err(&text), &text, bad, field, says);
    }
    let text = front("        max_batch_size: 1.5\n");
    assert_parse_at(&err(&text), &text, "1.5", "fractional part");
}

#[test]
fn max_num_models_per_replica_is_rays_with_minus_one_unlimited() {
    assert_eq!(applied("").max_num_models_per_replica, Some(3));
    assert_eq!(
        applied("        max_num_models_per_replica: 5\n").max_num_models_per_replica,
        Some(5)
    );
    assert_eq!(
        applied("        max_num_models_per_replica: -1\n").max_num_models_per_replica,
        None
    );
    for bad in ["0", "-2"] {
        let text = front(&format!("        max_num_models_per_replica: {bad}\n"));
        assert_at(
            &err(&text),
            &text,
            bad,
            "max_num_models_per_replica",
            "must be positive",
        );
    }
    // An integer written as one (Ray's isinstance(int)).
    let text = front("        max_num_models_per_replica: '3'\n");
    assert_parse_at(&err(&text), &text, "'3'", "written as one");
}
