//! Tests of the whole format, by schema: a test per field and per value form
//! (applied, or the exact error with its line and column), on configs written
//! for these tests; `realistic` holds multi-application configs that use many
//! fields together, and the round trip of one that uses every field.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod application;
mod autoscaling;
mod deployment;
mod realistic;
mod top_level;
mod value_forms;

use crate::{
    ApplicationSpec, AutoscalingConfig, DeploymentConfig, DeploymentSpec, Error, ServeConfig,
    apply_overrides,
};

/// Parse `text`, which must be valid.
pub(super) fn parse(text: &str) -> ServeConfig {
    match ServeConfig::from_yaml(text) {
        Ok(c) => c,
        Err(e) => panic!("{e}\n---\n{text}"),
    }
}

/// Parse `text`, which must be refused.
pub(super) fn err(text: &str) -> Error {
    match ServeConfig::from_yaml(text) {
        Ok(c) => panic!("the config should be refused: {c:?}\n---\n{text}"),
        Err(e) => e,
    }
}

/// A config of one application `shop` with one deployment override `front`
/// whose fields are `fields` (each line indented by 8 spaces, newline-ended).
/// The first field is on line 6.
pub(super) fn front(fields: &str) -> String {
    format!(
        "applications:\n  - name: shop\n    import_path: shop:app\n    deployments:\n      - name: front\n{fields}"
    )
}

/// The builder's spec the overrides are laid over: `front` (fixed, 2 replicas)
/// and `back` (autoscaled 1..4).
pub(super) fn built() -> ApplicationSpec {
    ApplicationSpec::builder("shop")
        .deployment(DeploymentSpec::builder("front", "shop::Front").replicas(2))
        .deployment(
            DeploymentSpec::builder("back", "shop::Back").with_config(|c| {
                c.with_autoscaling(AutoscalingConfig {
                    max_replicas: 4,
                    ..AutoscalingConfig::default()
                })
            }),
        )
        .build()
        .unwrap()
}

/// `front`'s config after the overrides `fields` (see [`front`]) are applied to
/// [`built`].
pub(super) fn applied(fields: &str) -> DeploymentConfig {
    let c = parse(&front(fields));
    let spec = match apply_overrides(built(), &c.applications[0]) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    spec.deployment("front").unwrap().config.clone()
}

/// Where `needle` first starts in `text`: 1-based line and column (in
/// characters). A needle ending in `\n` must end its line.
pub(super) fn position_of(text: &str, needle: &str) -> (u64, u64) {
    for (i, line) in text.lines().enumerate() {
        let byte = match needle.strip_suffix('\n') {
            Some(tail) => line.ends_with(tail).then(|| line.len() - tail.len()),
            None => line.find(needle),
        };
        if let Some(byte) = byte {
            return (i as u64 + 1, line[..byte].chars().count() as u64 + 1);
        }
    }
    panic!("{needle:?} is not in the text");
}

/// Assert `e` is a located validation error on `field` at `needle`'s position in
/// `text`, whose message contains `says`; names are checked by the caller.
pub(super) fn assert_at(e: &Error, text: &str, needle: &str, field: &str, says: &str) {
    assert!(matches!(e, Error::InConfig { .. }), "{e}");
    assert_eq!(e.field_name(), Some(field), "{e}");
    assert_eq!(e.position(), Some(position_of(text, needle)), "{e}");
    assert!(e.to_string().contains(says), "{e}");
}

/// Assert `e` is a parse error at `needle`'s position in `text` whose message
/// contains `says`.
pub(super) fn assert_parse_at(e: &Error, text: &str, needle: &str, says: &str) {
    assert!(matches!(e, Error::Parse { .. }), "{e}");
    assert_eq!(e.position(), Some(position_of(text, needle)), "{e}");
    assert!(e.to_string().contains(says), "{e}");
}
