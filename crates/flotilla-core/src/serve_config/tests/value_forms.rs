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
