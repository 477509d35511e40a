//! `AutoscalingConfig`'s and `AutoscalingPolicy`'s fields.

use std::time::Duration;

use super::{applied, assert_at, assert_parse_at, err, front, parse};
use crate::{
    AggregationFunction, Args, AutoscalingConfig, AutoscalingPolicy, ConfigWarning, ReplicaCount,
};

/// `front`'s autoscaling config after `autoscaling_config: {fields}`.
fn auto(fields: &str) -> AutoscalingConfig {
    match applied(&format!("        autoscaling_config: {{{fields}}}\n")).num_replicas {
        ReplicaCount::Auto(a) => a,
        other => panic!("not autoscaled: {other:?}"),
    }
}

fn block(field: &str, value: &str) -> String {
    front(&format!(
        "        autoscaling_config:\n          max_replicas: 4\n          {field}: {value}\n"
    ))
}

/// `serve build` writes every autoscaling field out, the deprecated ones at
/// their defaults: those change nothing and are not warned about (Ray warns
/// of `metrics_interval_s` only off 10 s, and never of `smoothing_factor`).
#[test]
fn deprecated_fields_at_their_defaults_are_not_warned_about() {
    let text = front(
        "        autoscaling_config:\n          max_replicas: 4\n          metrics_interval_s: 10.0\n          smoothing_factor: 1.0\n",
    );
    assert_eq!(parse(&text).warnings(), vec![]);
    let text = front(
        "        autoscaling_config:\n          max_replicas: 4\n          smoothing_factor: 2.0\n",
    );
    assert!(
        matches!(
            parse(&text).warnings()[..],
            [ConfigWarning::DeprecatedField {
                field: "autoscaling_config.smoothing_factor",
                ..
            }]
        ),
        "{:?}",
        parse(&text).warnings()
    );
}

#[test]
fn metrics_interval_s_is_accepted_validated_and_warned_about() {
    let text = block("metrics_interval_s", "2");
    let c = parse(&text);
    assert_eq!(
        c.applications[0].deployments[0]
            .autoscaling_config
            .given()
            .unwrap()
            .metrics_interval_s,
        Some(2.0)
    );
    assert_eq!(auto("metrics_interval_s: 2"), auto(""));
    assert_eq!(
        c.warnings(),
        vec![ConfigWarning::MetricsIntervalIgnored {
            app: "shop".try_into().unwrap(),
            deployment: "front".try_into().unwrap(),
            seconds: 2.0,
        }]
    );
    assert!(
        c.warnings()[0]
            .to_string()
            .contains("Flotilla samples load on its own period")
    );
    for bad in ["0", "-1"] {
        let text = block("metrics_interval_s", bad);
        assert_at(
            &err(&text),
            &text,
            &format!("{bad}\n"),
            "autoscaling_config.metrics_interval_s",
            "> 0",
        );
    }
}

#[test]
fn smoothing_factors_are_aliases_of_the_factors_with_rays_precedence() {
    // Ray's own cases (AutoscalingConfig.get_upscaling_factor and friends).
    let a = auto("smoothing_factor: 0.5");
    assert_eq!(
        (a.upscaling_factor, a.downscaling_factor),
        (Some(0.5), Some(0.5))
    );
    let a = auto("smoothing_factor: 0.5, upscale_smoothing_factor: 0.7");
    assert_eq!(
        (a.upscaling_factor, a.downscaling_factor),
        (Some(0.7), Some(0.5))
    );
    let a = auto("smoothing_factor: 0.5, upscale_smoothing_factor: 0.7, upscaling_factor: 0.9");
    assert_eq!(
        (a.upscaling_factor, a.downscaling_factor),
        (Some(0.9), Some(0.5))
    );
    let a = auto("downscale_smoothing_factor: 0.3, downscaling_factor: 0.2");
    assert_eq!(
        (a.upscaling_factor, a.downscaling_factor),
        (None, Some(0.2))
    );
    let c = parse(&front(
        "        autoscaling_config: {smoothing_factor: 0.5, upscale_smoothing_factor: 0.7}\n",
    ));
    let fields: Vec<&str> = c
        .warnings()
        .iter()
        .filter_map(|w| match w {
            ConfigWarning::DeprecatedField { field, .. } => Some(*field),
            _ => None,
        })
        .collect();
    assert_eq!(
        fields,
        [
            "autoscaling_config.smoothing_factor",
            "autoscaling_config.upscale_smoothing_factor"
        ]
    );
    let zero = block("smoothing_factor", "0");
    assert_at(
        &err(&zero),
        &zero,
        "0\n",
        "autoscaling_config.smoothing_factor",
        "> 0",
    );
}

#[test]
fn downscale_to_zero_delay_s_is_applied() {
    let a = auto("min_replicas: 0, downscale_delay_s: 60, downscale_to_zero_delay_s: 600");
    assert_eq!(a.downscale_to_zero_delay, Some(Duration::from_secs(600)));
    assert_eq!(a.downscale_to_zero_delay(), Duration::from_secs(600));
    assert_eq!(
        auto("downscale_delay_s: 60").downscale_to_zero_delay(),
        Duration::from_secs(60)
    );
    let bad = block("downscale_to_zero_delay_s", "-1");
    assert_at(
        &err(&bad),
        &bad,
        "-1",
        "autoscaling_config.downscale_to_zero_delay_s",
        ">= 0",
    );
}

#[test]
fn aggregation_function_is_mean_max_or_min_in_any_case() {
    for (v, want) in [
        ("mean", AggregationFunction::Mean),
        ("max", AggregationFunction::Max),
        ("MIN", AggregationFunction::Min),
    ] {
        assert_eq!(
            auto(&format!("aggregation_function: {v}")).aggregation_function,
            want
        );
    }
    assert_eq!(auto("").aggregation_function, AggregationFunction::Mean);
    let median = block("aggregation_function", "median");
    assert_parse_at(
        &err(&median),
        &median,
        "median",
        "'median' is not a valid AggregationFunction",
    );
}

#[test]
fn policy_is_rays_dictionary() {
    let a = auto("policy: {policy_function: shop.policies:queue, policy_kwargs: {queue: q}}");
    assert_eq!(
        a.policy,
        AutoscalingPolicy::named("shop.policies:queue".try_into().unwrap()).with_kwargs(
            Args::encode(&std::collections::BTreeMap::from([("queue", "q")])).unwrap()
        )
    );
    assert!(!a.policy.is_builtin());
    assert!(auto("policy: {}").policy.is_builtin());
    assert!(auto("").policy.is_builtin());
    // Ray's old shape `{name: ...}` (which Ray silently ignores) is refused.
    let old = block("policy", "{name: shop.policies.queue}");
    assert_parse_at(
        &err(&old),
        &old,
        "name: shop.policies",
        "the old shape of `policy`",
    );
    let string = block("policy", "shop.policies:queue");
    assert_parse_at(&err(&string), &string, "shop.policies", "expected mapping");
}

#[test]
fn policy_kwargs_given_to_the_built_in_policy_are_warned_about() {
    let app: crate::AppName = "shop".try_into().unwrap();
    // A deployment's policy: Ray's default path, and an alias of it.
    for path in [
        "ray.serve.autoscaling_policy:default_autoscaling_policy",
        "ray.serve.autoscaling_policy.replica_queue_length_autoscaling_policy",
    ] {
        let text = block(
            "policy",
            &format!("{{policy_function: {path}, policy_kwargs: {{window: 3, floor: 1}}}}"),
        );
        let c = parse(&text);
        assert_eq!(
            c.warnings(),
            vec![ConfigWarning::PolicyKwargsWithoutEffect {
                app: app.clone(),
                deployment: Some("front".try_into().unwrap()),
                keys: vec!["floor".into(), "window".into()],
            }],
            "{path}"
        );
        let shown = c.warnings()[0].to_string();
        assert!(
            shown.contains("deployment 'front'")
                && shown.contains("autoscaling_config.policy.policy_kwargs (floor, window)")
                && shown.contains("change nothing"),
            "{shown}"
        );
    }
    // The path left out is the built-in policy too.
    let implicit = parse(&block("policy", "{policy_kwargs: {window: 3}}"));
    assert_eq!(implicit.warnings().len(), 1, "{:?}", implicit.warnings());
    // The application-level policy.
    let text = "applications:\n  - name: shop\n    import_path: shop:app\n    autoscaling_policy: {policy_kwargs: {weight: 2}}\n";
    let c = parse(text);
    assert_eq!(
        c.warnings(),
        vec![ConfigWarning::PolicyKwargsWithoutEffect {
            app,
            deployment: None,
            keys: vec!["weight".into()],
        }]
    );
    assert_eq!(c.warnings()[0].deployment(), None);
    assert!(
        c.warnings()[0]
            .to_string()
            .starts_with("application 'shop': autoscaling_policy.policy_kwargs (weight)"),
        "{}",
        c.warnings()[0]
    );
    // No warning: the built-in policy without kwargs (or with empty or null
    // ones), or a registered policy with kwargs.
    for quiet in [
        "{policy_function: ray.serve.autoscaling_policy:default_autoscaling_policy}",
        "{policy_kwargs: {}}",
        "{policy_kwargs: null}",
        "{policy_function: shop.policies:queue, policy_kwargs: {queue: q}}",
    ] {
        let c = parse(&block("policy", quiet));
        assert_eq!(c.warnings(), vec![], "{quiet}");
    }
}

#[test]
fn target_num_ongoing_requests_per_replica_is_the_old_name_of_the_target() {
    assert_eq!(
        auto("target_num_ongoing_requests_per_replica: 7").target_ongoing_requests,
        7.0
    );
    let c = parse(&block("target_num_ongoing_requests_per_replica", "7"));
    assert!(matches!(
        &c.warnings()[..],
        [ConfigWarning::DeprecatedField {
            field: "autoscaling_config.target_num_ongoing_requests_per_replica",
            instead: "autoscaling_config.target_ongoing_requests",
            ..
        }]
    ));
    let both = front(
        "        autoscaling_config:\n          target_ongoing_requests: 2\n          target_num_ongoing_requests_per_replica: 7\n",
    );
    assert_at(
        &err(&both),
        &both,
        "7",
        "autoscaling_config.target_num_ongoing_requests_per_replica",
        "give only target_ongoing_requests",
    );
}
