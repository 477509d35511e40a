//! `ServeApplicationSchema`'s fields.

use std::collections::BTreeMap;

use super::{assert_at, assert_parse_at, built, err, parse};
use crate::{
    Args, AutoscalingPolicy, ConfigWarning, ReplicaCount, apply_overrides,
    serve_config::value::map_keys,
};

fn app(fields: &str) -> String {
    format!("applications:\n  - name: shop\n    import_path: shop:app\n{fields}")
}

#[test]
fn name_defaults_to_default_as_in_ray() {
    let c = parse("applications:\n  - import_path: shop:app\n");
    assert_eq!(c.applications[0].name.as_str(), "default");
}

#[test]
fn runtime_env_is_kept_applies_nothing_and_is_warned_about_once() {
    let text = app(
        "    runtime_env:\n      working_dir: s3://bucket/app.zip\n      pip: [requests]\n      env_vars: {A: '1'}\n    deployments:\n      - name: front\n        ray_actor_options:\n          runtime_env: {py_modules: [s3://b/m.zip], pip: [numpy]}\n",
    );
    let c = parse(&text);
    let a = &c.applications[0];
    assert_eq!(map_keys(&a.runtime_env), ["env_vars", "pip", "working_dir"]);
    #[derive(serde::Deserialize, PartialEq, Debug)]
    struct Env {
        working_dir: String,
        pip: Vec<String>,
        env_vars: BTreeMap<String, String>,
    }
    assert_eq!(
        a.runtime_env.decode::<Env>().unwrap(),
        Env {
            working_dir: "s3://bucket/app.zip".into(),
            pip: vec!["requests".into()],
            env_vars: [("A".to_owned(), "1".to_owned())].into(),
        }
    );
    // One warning for the application, naming every key that does not apply.
    assert_eq!(
        c.warnings(),
        vec![ConfigWarning::RuntimeEnvNotApplied {
            app: "shop".try_into().unwrap(),
            keys: vec![
                "env_vars".into(),
                "pip".into(),
                "py_modules".into(),
                "working_dir".into()
            ],
        }]
    );
    let shown = c.warnings()[0].to_string();
    assert!(
        shown.contains("application 'shop'") && shown.contains("working_dir"),
        "{shown}"
    );
    // Applied, it changes nothing about the deployments.
    let spec = apply_overrides(built(), a).unwrap();
    assert_eq!(
        spec.deployments[0].config.resources,
        crate::Resources::default()
    );
    // An empty runtime_env (6 of Ray's 14 real-world uses) warns about nothing.
    let empty = parse(&app("    runtime_env: {}\n"));
    assert!(empty.warnings().is_empty());
    assert_eq!(empty.applications[0].runtime_env, Args::empty_map());
    let list = app("    runtime_env: [pip]\n");
    assert_parse_at(&err(&list), &list, "[pip]", "expected a mapping");
}

#[test]
fn null_args_are_the_empty_map_as_omitted_args_are() {
    let omitted = parse(&app(""));
    let omitted = &omitted.applications[0];
    assert_eq!(omitted.args, Args::empty_map());
    // `args: null`, `args: ~`, and an `args:` key whose lines are all
    // commented out: each is the omitted args, with the same code version.
    for fields in [
        "    args: null\n",
        "    args: ~\n",
        "    args:\n    #  greeting: hello\n    #  n: 3\n",
    ] {
        let c = parse(&app(fields));
        let a = &c.applications[0];
        assert_eq!(a.args, Args::empty_map(), "{fields}");
        assert_eq!(a.code_version(), omitted.code_version(), "{fields}");
        // A builder decoding a map gets one.
        let map: BTreeMap<String, u32> = a.args.decode().unwrap();
        assert!(map.is_empty());
        // And so does a checkpoint's round trip.
        let back: crate::ServeConfig =
            rmp_serde::from_slice(&rmp_serde::to_vec_named(&c).unwrap()).unwrap();
        assert_eq!(back.applications[0].args, Args::empty_map());
    }
    // A checkpoint written before this rule, holding nil, reads as the map too.
    let mut nil = parse(&app(""));
    nil.applications[0].args = Args::unit();
    let back: crate::ServeConfig =
        rmp_serde::from_slice(&rmp_serde::to_vec_named(&nil).unwrap()).unwrap();
    assert_eq!(back.applications[0].args, Args::empty_map());
    // Any other value is kept: null inside a map is a value.
    let inner = parse(&app("    args: {a: null}\n"));
    assert_ne!(inner.applications[0].args, Args::empty_map());
}

#[test]
fn host_and_port_are_refused_per_application() {
    for (field, value) in [("host", "1.2.3.4"), ("port", "8001")] {
        let text = app(&format!("    {field}: {value}\n"));
        let e = err(&text);
        assert_at(
            &e,
            &text,
            value,
            field,
            &format!("set http_options.{field} at the top level"),
        );
        assert_eq!(e.app(), Some("shop"));
    }
}

#[test]
fn external_scaler_enabled_is_applied_and_refuses_autoscaling() {
    let c = parse(&app(
        "    external_scaler_enabled: true\n    deployments:\n      - name: front\n        num_replicas: 1\n",
    ));
    assert!(c.applications[0].external_scaler_enabled);
    // The builder's `back` autoscales: built-in autoscaling is refused for the
    // whole application, the code's included.
    let e = apply_overrides(built(), &c.applications[0]).unwrap_err();
    assert_eq!((e.app(), e.deployment()), (Some("shop"), Some("back")));
    assert!(e.to_string().contains("external scaler"), "{e}");
    let fixed = parse(&app(
        "    external_scaler_enabled: true\n    deployments:\n      - name: back\n        num_replicas: 3\n",
    ));
    let spec = apply_overrides(built(), &fixed.applications[0]).unwrap();
    assert!(spec.external_scaler_enabled);
    // Autoscaling in the config is Ray's own error, at parse.
    let text = app(
        "    external_scaler_enabled: true\n    deployments:\n      - name: front\n        num_replicas: auto\n      - name: back\n        autoscaling_config: {max_replicas: 3}\n",
    );
    assert_at(
        &err(&text),
        &text,
        "true",
        "external_scaler_enabled",
        "the following deployment(s) have autoscaling configured: \"front\", \"back\"",
    );
}

#[test]
fn autoscaling_policy_replaces_the_policy_of_every_autoscaled_deployment() {
    let text = app(
        "    autoscaling_policy:\n      policy_function: shop.policies:coordinated\n      policy_kwargs: {weight: 2}\n    deployments:\n      - name: back\n        autoscaling_config:\n          max_replicas: 4\n          policy: {policy_function: shop.policies:own}\n",
    );
    let c = parse(&text);
    let want = AutoscalingPolicy::named("shop.policies:coordinated".try_into().unwrap())
        .with_kwargs(Args::encode(&BTreeMap::from([("weight", 2)])).unwrap());
    assert_eq!(c.applications[0].autoscaling_policy, Some(want.clone()));
    let spec = apply_overrides(built(), &c.applications[0]).unwrap();
    let ReplicaCount::Auto(a) = &spec.deployment("back").unwrap().config.num_replicas else {
        panic!("back autoscales");
    };
    assert_eq!(a.policy, want);
    // A fixed deployment has no policy to replace.
    assert!(matches!(
        spec.deployment("front").unwrap().config.num_replicas,
        ReplicaCount::Fixed(2)
    ));
    assert_eq!(
        c.warnings(),
        vec![ConfigWarning::ApplicationPolicyWins {
            app: "shop".try_into().unwrap(),
            deployment: "back".try_into().unwrap(),
        }]
    );
    // Ray's default path is the built-in policy; a string is not a policy.
    let default = parse(&app(
        "    autoscaling_policy: {policy_function: ray.serve.autoscaling_policy:default_autoscaling_policy}\n",
    ));
    assert!(
        default.applications[0]
            .autoscaling_policy
            .as_ref()
            .unwrap()
            .is_builtin()
    );
    let string = app("    autoscaling_policy: shop.policies:coordinated\n");
    assert_parse_at(&err(&string), &string, "shop.policies", "expected mapping");
}
