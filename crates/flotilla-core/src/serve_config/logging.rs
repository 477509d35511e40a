//! `logging_config` in a config file (Ray's `LoggingConfig`, which forbids
//! unknown fields): every field optional, Ray's defaults for the missing ones.
//! A config gives it at the top level, per application and per deployment; each
//! level replaces the one above whole (Ray does not merge fields).

use serde::{Deserialize, Deserializer};

use crate::{LogAttr, LogEncoding, LogLevel, LoggingConfig};

use super::null_as_empty;

/// `logging_config` with every field optional and unknown fields rejected.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PartialLogging {
    /// A name or Python's number (see [`LogLevel`]).
    #[serde(default)]
    log_level: Option<LogLevel>,
    #[serde(default)]
    encoding: Option<LogEncoding>,
    #[serde(default)]
    enable_access_log: Option<bool>,
    #[serde(default)]
    logs_dir: Option<String>,
    /// Ray's attribute names; those without a Rust equivalent are refused by
    /// name (see [`LogAttr::parse`]).
    #[serde(default, deserialize_with = "null_as_empty")]
    additional_log_standard_attrs: Vec<LogAttr>,
}

/// Read an optional `logging_config`: `null` is none, a given one is completed
/// with Ray's defaults; the attributes are sorted and de-duplicated (Ray
/// de-duplicates them too). A checkpoint's full [`LoggingConfig`] reads the same
/// way.
pub(super) fn logging_option<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<LoggingConfig>, D::Error> {
    Ok(Option::<PartialLogging>::deserialize(d)?.map(|p| {
        let def = LoggingConfig::default();
        LoggingConfig {
            log_level: p.log_level.unwrap_or(def.log_level),
            encoding: p.encoding.unwrap_or(def.encoding),
            enable_access_log: p.enable_access_log.unwrap_or(def.enable_access_log),
            logs_dir: p.logs_dir,
            additional_log_standard_attrs: Vec::new(),
        }
        .with_additional_log_standard_attrs(p.additional_log_standard_attrs)
    }))
}
