//! Value forms Ray (pydantic v2, lax mode) accepts: numeric text, integral
//! floats for integers, numeric log levels; and the strict fields.

use super::{applied, assert_at, assert_parse_at, err, front, parse};
use crate::{LogLevel, NumReplicas, ReplicaCount};

#[test]
fn integer_fields_take_numeric_text_and_integral_floats() {
    for v in ["8", "'8'", "\" 8 \"", "8.0", "'8.0'", "8e0", "'+8'"] {
        assert_eq!(
            applied(&format!("        max_ongoing_requests: {v}\n")).max_ongoing_requests,
            8,
            "{v}"
        );
    }
    assert_eq!(
        applied("        max_ongoing_requests: '1_000'\n").max_ongoing_requests,
        1000
    );
    // What pydantic refuses for an integer, Flotilla refuses too.
    for (v, says) in [
        ("2.5", "fractional part"),
        ("'2.5'", "unable to parse the text as an integer"),
        ("'1e3'", "unable to parse the text as an integer"),
        ("'0x10'", "unable to parse the text as an integer"),
        ("many", "unable to parse the text as an integer"),
    ] {
        let text = front(&format!("        max_ongoing_requests: {v}\n"));
        assert_parse_at(&err(&text), &text, v, says);
    }
    // A boolean is not a count (pydantic reads true as 1: a departure).
    let text = front("        max_ongoing_requests: true\n");
    assert_parse_at(&err(&text), &text, "true", "boolean");
}

#[test]
fn plain_numbers_read_as_pyyaml_types_them() {
    // YAML 1.1 (Ray's PyYAML): a plain `0` followed by octal digits is octal;
    // quoted, it is text, which pydantic reads in base 10. A leading zero
    // before a non-octal digit is text too (`09`: 9).
    for (v, want) in [
        ("010", 8),
        ("'010'", 10),
        ("09", 9),
        ("0x10", 16),
        ("0b1000", 8),
        ("1_000", 1000),
    ] {
        assert_eq!(
            applied(&format!("        max_ongoing_requests: {v}\n")).max_ongoing_requests,
            want,
            "{v}"
        );
    }
    let c = parse(
        "applications:\n  - name: a\n    import_path: x\n    args: {mode: 0755, port: 8080}\n",
    );
    let args: std::collections::BTreeMap<String, i64> = c.applications[0].args.decode().unwrap();
    assert_eq!((args["mode"], args["port"]), (0o755, 8080));
}

#[test]
fn a_value_the_reader_refuses_is_named_by_its_path() {
    // Out of range for the field's type, and of the wrong type: refused
    // while reading, before validation, yet named as validation names them.
    for (field, v, says) in [
        ("max_ongoing_requests", "99999999999", "at most 4294967295"),
        (
            "max_ongoing_requests",
            "'many'",
            "unable to parse the text as an integer",
        ),
        (
            "health_check_period_s",
            "soon",
            "unable to parse the text as a number",
        ),
        (
            "ray_actor_options: {num_cpus",
            "x}",
            "unable to parse the text as a number",
        ),
    ] {
        let text = front(&format!("        {field}: {v}\n"));
        let e = err(&text);
        assert_parse_at(&e, &text, v, says);
        let path = field.replace(": {", ".");
        let named = format!("`applications[0].deployments[0].{path}`: ");
        assert!(e.to_string().contains(&named), "{e}");
    }
    // Inside an alias every node starts at the alias: the field holding it
    // is named, not a sibling of the bad value.
    let text = "applications:\n  - name: shop\n    import_path: shop:app\n    args: &o {num_cpus: 1, num_gpus: many}\n    deployments:\n      - name: front\n        ray_actor_options: *o\n";
    let e = err(text).to_string();
    assert!(
        e.contains("`applications[0].deployments[0].ray_actor_options`: "),
        "{e}"
    );
    let text = "applications: []\nhttp_options: {port: 70000}\n";
    assert!(
        err(text)
            .to_string()
            .contains("`http_options.port`: must be at most 65535")
    );
    // An unknown key is not a value: its message names it already.
    let text = front("        max_ongoing_request: 5\n");
    assert!(
        !err(&text).to_string().contains("`applications["),
        "{}",
        err(&text)
    );
}

#[test]
fn memory_takes_an_integral_float() {
    for v in ["1.5e9", "1.5e+9", "1500000000.0", "'1500000000'"] {
        assert_eq!(
            applied(&format!("        ray_actor_options: {{memory: {v}}}\n"))
                .resources
                .memory_bytes,
            1_500_000_000,
            "{v}"
        );
    }
    let text = front("        ray_actor_options:\n          memory: 1.5\n");
    assert_parse_at(&err(&text), &text, "1.5", "fractional part");
}

#[test]
fn float_fields_take_numeric_text() {
    let c = applied(
        "        health_check_period_s: '2.5'\n        ray_actor_options: {num_cpus: '0.5', resources: {tpu: '2'}}\n        autoscaling_config: {max_replicas: '4', target_ongoing_requests: '1.5'}\n",
    );
    assert_eq!(c.health_check_period.as_millis(), 2500);
    assert_eq!(c.resources.cpus, 0.5);
    assert_eq!(c.resources.custom["tpu"], 2.0);
    let ReplicaCount::Auto(a) = c.num_replicas else {
        panic!("autoscaled");
    };
    assert_eq!((a.max_replicas, a.target_ongoing_requests), (4, 1.5));
    let text = front("        health_check_period_s: soon\n");
    assert!(matches!(err(&text), crate::Error::Parse { line: 6, .. }));
}

#[test]
fn float_fields_take_what_pyyaml_and_pydantic_read_as_a_number() {
    // YAML 1.1 (Ray's PyYAML) reads `1_000` and `0x10` as integers, and
    // pydantic reads `"inf"` and `"1_000.5"` text as floats.
    for (v, seconds) in [
        ("1_000", 1000.0),
        ("0x10", 16.0),
        ("'1_000.5'", 1000.5),
        ("\"1e3\"", 1000.0),
    ] {
        let c = applied(&format!("        graceful_shutdown_timeout_s: {v}\n"));
        assert_eq!(c.graceful_shutdown_timeout.as_secs_f64(), seconds, "{v}");
    }
    // Infinite text is refused by the field's own range check, by name, as
    // `.inf` is: not as text that is no number.
    for v in ["'inf'", ".inf", "\"Infinity\""] {
        let text = front(&format!("        graceful_shutdown_timeout_s: {v}\n"));
        let e = err(&text);
        assert_at(
            &e,
            &text,
            &format!("{v}\n"),
            "graceful_shutdown_timeout_s",
            "finite number",
        );
    }
}

#[test]
fn a_free_form_value_holding_a_non_finite_number_is_refused() {
    for (field, v) in [
        ("user_config", "{scale: .inf}"),
        ("user_config", "[1, .nan]"),
        ("user_config", "{big: 1e400}"),
        ("ray_actor_options", "{runtime_env: {x: -.inf}}"),
    ] {
        let text = front(&format!("        {field}: {v}\n"));
        let e = err(&text);
        assert!(matches!(e, crate::Error::Parse { line: 6, .. }), "{e}");
        assert!(e.to_string().contains("cannot hold .inf, .nan"), "{e}");
    }
    let app = "applications:\n  - name: shop\n    import_path: shop:app\n    args: {t: .nan}\n";
    let e = err(app);
    assert!(e.to_string().contains("cannot hold .inf, .nan"), "{e}");
    // Finite floats stay as they are.
    assert!(
        applied("        user_config: {scale: 1.5}\n")
            .user_config
            .is_some()
    );
}

#[test]
fn a_duration_longer_than_the_longest_is_refused_by_name() {
    // 1e19 s fits a Duration, but a timer that far ahead overflows the clock.
    for field in [
        "health_check_period_s",
        "health_check_timeout_s",
        "graceful_shutdown_wait_loop_s",
        "graceful_shutdown_timeout_s",
    ] {
        for v in ["1e19", "1e20"] {
            let text = front(&format!("        {field}: {v}\n"));
            let e = err(&text);
            assert_at(&e, &text, &format!("{v}\n"), field, "at most 1000000000");
        }
    }
    assert_eq!(
        applied("        health_check_period_s: 1e9\n").health_check_period,
        crate::MAX_DURATION
    );
}

#[test]
fn a_positive_duration_below_a_nanosecond_is_a_nanosecond_not_zero() {
    // Ray's `gt=0` takes it; rounded to zero, it was refused as not positive.
    assert_eq!(
        applied("        health_check_period_s: 1e-12\n").health_check_period,
        std::time::Duration::from_nanos(1)
    );
    let text = front("        health_check_period_s: 0\n");
    assert_at(&err(&text), &text, "0\n", "health_check_period_s", "");
}

#[test]
fn num_replicas_takes_numeric_text_and_integral_floats() {
    let with = |v: &str| {
        parse(&front(&format!("        num_replicas: {v}\n"))).applications[0].deployments[0]
            .num_replicas
    };
    for v in ["2", "'2'", "2.0", "'2.0'"] {
        assert_eq!(with(v), Some(NumReplicas::Fixed(2)), "{v}");
    }
    assert_eq!(with("auto"), Some(NumReplicas::Auto));
    for bad in ["2.5", "'two'", "AUTO", "-1", "'-1'"] {
        let text = front(&format!("        num_replicas: {bad}\n"));
        assert!(
            matches!(err(&text), crate::Error::Parse { line: 6, .. }),
            "{bad}"
        );
    }
}

#[test]
fn max_queued_requests_is_strict_as_in_ray() {
    assert_eq!(
        applied("        max_queued_requests: 5\n").max_queued_requests,
        Some(5)
    );
    for bad in ["'5'", "5.0"] {
        let text = front(&format!("        max_queued_requests: {bad}\n"));
        assert_parse_at(&err(&text), &text, bad, "Ray reads this field strictly");
    }
}

#[test]
fn log_levels_take_pythons_names_and_numbers() {
    let level = |v: &str| {
        parse(&format!(
            "logging_config: {{log_level: {v}}}\napplications: []\n"
        ))
        .logging_config
        .unwrap()
        .log_level
    };
    for (v, want) in [
        ("10", LogLevel::Debug),
        ("20", LogLevel::Info),
        ("20.0", LogLevel::Info),
        ("30", LogLevel::Warning),
        ("40", LogLevel::Error),
        ("50", LogLevel::Critical),
        ("0", LogLevel::NotSet),
        ("WARN", LogLevel::Warning),
        ("WARNING", LogLevel::Warning),
        ("FATAL", LogLevel::Critical),
        ("CRITICAL", LogLevel::Critical),
        ("NOTSET", LogLevel::NotSet),
        ("DEBUG", LogLevel::Debug),
    ] {
        assert_eq!(level(v), want, "{v}");
    }
    // Ray refuses these: names are case-sensitive, text is not a number.
    for (v, says) in [
        ("15", "must be one of [50, 40, 30, 20, 10, 0]"),
        ("info", "(case-sensitive)"),
        ("'20'", "Got \"20\" for log_level"),
    ] {
        let text = format!("logging_config:\n  log_level: {v}\napplications: []\n");
        assert_parse_at(&err(&text), &text, v, says);
    }
}

#[test]
fn a_bad_value_is_placed_in_a_document_as_deep_as_the_reader_allows() {
    // The reader allows 64 levels; `args` at 63 (under the root map, the list
    // and the application's map) used to overflow the stack while the value
    // at fault was looked for.
    for depth in [30, 61] {
        let text = format!(
            "applications:\n  - name: a\n    import_path: x\n    args: {}{}\n    deployments:\n      - name: d\n        max_ongoing_requests: {}\n",
            "[".repeat(depth),
            "]".repeat(depth),
            "{bad}"
        );
        let e = err(&text.replace("{bad}", "0"));
        assert_eq!(e.position(), Some((7, 31)), "{depth}: {e}");
        let e = err(&text.replace("{bad}", "99999999999"));
        let named = "`applications[0].deployments[0].max_ongoing_requests`: must be at most";
        assert!(e.to_string().contains(named), "{depth}: {e}");
    }
}

#[test]
fn a_list_or_a_map_as_a_key_in_a_free_form_value_is_refused() {
    for (field, value) in [
        ("args", "{[1, 2]: x}"),
        ("args", "{deep: {{a: 1}: x}}"),
        ("user_config", "[{[1]: x}]"),
    ] {
        let text = if field == "args" {
            format!("applications:\n  - name: shop\n    import_path: shop:app\n    args: {value}\n")
        } else {
            front(&format!("        user_config: {value}\n"))
        };
        let e = err(&text);
        assert!(e.to_string().contains("unhashable"), "{value}: {e}");
    }
    // Scalar keys are kept as they are (the deployment decodes them).
    let c =
        parse("applications:\n  - name: shop\n    import_path: shop:app\n    args: {0: a, ~: b}\n");
    let args: std::collections::BTreeMap<Option<u8>, String> =
        c.applications[0].args.decode().unwrap();
    assert_eq!(args[&Some(0)], "a");
    assert_eq!(args[&None], "b");
}
