//! Code and config versions (DESIGN.md, "Versions").
//!
//! A deployment's **code version** is the user's explicit version, or else a stable
//! hash of its import path, init args and resources: redeploying an unchanged spec
//! yields the same version and restarts nothing. Its **config version** hashes the
//! lightweight part that live replicas can take in place.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{
    BackpressureConfig, DEFAULT_MAX_NUM_MODELS_PER_REPLICA, DeploymentConfig, ReplicaCount,
    RequestRouterConfig,
};

/// 64-bit FNV-1a over `bytes`: the same output on every machine, process and Rust
/// version (unlike `DefaultHasher`, whose algorithm is unspecified).
///
/// ```
/// assert_eq!(flotilla_core::stable_hash(b""), 0xcbf2_9ce4_8422_2325);
/// assert_eq!(flotilla_core::stable_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
/// ```
pub fn stable_hash(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// Hash any serde value through its MessagePack encoding. Encoding plain data into
/// a `Vec` cannot fail for the types of this crate; should it ever, the empty
/// encoding is hashed, which still yields a deterministic version.
pub(crate) fn hash_value<T: Serialize>(value: &T) -> u64 {
    stable_hash(&rmp_serde::to_vec(value).unwrap_or_default())
}

/// The identity of a deployment's code: replicas of different code versions are
/// never mixed once a roll finishes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CodeVersion(String);

impl CodeVersion {
    /// An explicit, user-given version.
    pub fn explicit(v: impl Into<String>) -> Self {
        CodeVersion(v.into())
    }

    /// A version derived from a stable hash.
    pub fn hashed(h: u64) -> Self {
        CodeVersion(format!("h{h:016x}"))
    }

    /// The version as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CodeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CodeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CodeVersion({})", self.0)
    }
}

/// A stable hash of the part of a config that live replicas take in place: user
/// config, request limits, health check and graceful shutdown settings, the
/// autoscaling config, and the request router, back-pressure answer and
/// deployment logging (Ray's "reconfigure" options), and the batching and
/// model-multiplexing settings (Flotilla's extension). The replica count,
/// resources, placement group and `max_replicas_per_node` are not in it (the
/// latter three are code: see `DeploymentSpec::code_version`), nor is the
/// rollout pace.
///
/// Settings added after the first release are hashed only when they differ from
/// their defaults, so a config that does not use them keeps the version it always
/// had: upgrading Flotilla reconfigures nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConfigVersion(pub u64);

impl ConfigVersion {
    /// The config version of `config`.
    pub fn of(config: &DeploymentConfig) -> Self {
        let autoscaling = match &config.num_replicas {
            ReplicaCount::Fixed(_) => None,
            ReplicaCount::Auto(a) => Some(a),
        };
        let first = (
            &config.user_config,
            config.max_ongoing_requests,
            config.max_queued_requests,
            config.health_check_period,
            config.health_check_timeout,
            config.graceful_shutdown_wait_loop,
            config.graceful_shutdown_timeout,
            autoscaling.map(|a| a.legacy_view()),
        );
        let autoscaling_ext = autoscaling.and_then(|a| a.extension_view());
        let router = (config.request_router != RequestRouterConfig::default())
            .then_some(&config.request_router);
        let backpressure =
            (config.backpressure != BackpressureConfig::default()).then_some(&config.backpressure);
        let max_models = (config.max_num_models_per_replica
            != Some(DEFAULT_MAX_NUM_MODELS_PER_REPLICA))
        .then_some(config.max_num_models_per_replica);
        if autoscaling_ext.is_none()
            && router.is_none()
            && backpressure.is_none()
            && config.logging.is_none()
            && config.batching.is_none()
            && max_models.is_none()
        {
            ConfigVersion(hash_value(&first))
        } else if config.batching.is_none() && max_models.is_none() {
            ConfigVersion(hash_value(&(
                first,
                autoscaling_ext,
                router,
                backpressure,
                &config.logging,
            )))
        } else {
            ConfigVersion(hash_value(&(
                (
                    first,
                    autoscaling_ext,
                    router,
                    backpressure,
                    &config.logging,
                ),
                &config.batching,
                max_models,
            )))
        }
    }
}

impl fmt::Debug for ConfigVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfigVersion({:016x})", self.0)
    }
}

/// Both versions of a deployment: a code change replaces replicas, a config change
/// reconfigures them in place.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeploymentVersion {
    /// Replaced on change.
    pub code: CodeVersion,
    /// Applied in place on change.
    pub config: ConfigVersion,
}

impl fmt::Display for DeploymentVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:08x}", self.code, self.config.0 >> 32)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        AggregationFunction, AutoscalingConfig, AutoscalingPolicy, ImportPath, LoggingConfig,
    };

    /// Pinned before the settings added for Ray's full schema existed: a config
    /// that leaves them at their defaults keeps its version across the upgrade.
    #[test]
    fn versions_of_configs_without_the_newer_settings_are_unchanged() {
        assert_eq!(
            ConfigVersion::of(&DeploymentConfig::default()).0,
            0x2364_b533_e859_7746
        );
        let auto = DeploymentConfig::default().with_autoscaling(AutoscalingConfig {
            max_replicas: 7,
            upscaling_factor: Some(1.5),
            ..AutoscalingConfig::default()
        });
        assert_eq!(ConfigVersion::of(&auto).0, 0xe27f_d135_06ab_929b);
    }

    #[test]
    fn every_newer_reconfigure_setting_changes_the_config_version() {
        let auto = |a: AutoscalingConfig| DeploymentConfig::default().with_autoscaling(a);
        let base = ConfigVersion::of(&auto(AutoscalingConfig::default()));
        for changed in [
            auto(AutoscalingConfig {
                downscale_to_zero_delay: Some(Duration::from_secs(1)),
                ..AutoscalingConfig::default()
            }),
            auto(AutoscalingConfig {
                aggregation_function: AggregationFunction::Max,
                ..AutoscalingConfig::default()
            }),
            auto(
                AutoscalingConfig::default().with_policy(AutoscalingPolicy::named(
                    ImportPath::new("mine:policy").unwrap(),
                )),
            ),
            auto(AutoscalingConfig::default()).with_request_router(RequestRouterConfig {
                max_backoff: Duration::from_secs(1),
                ..RequestRouterConfig::default()
            }),
            auto(AutoscalingConfig::default()).with_backpressure(BackpressureConfig {
                retry_after: Some(Duration::from_secs(5)),
                ..BackpressureConfig::default()
            }),
            auto(AutoscalingConfig::default()).with_logging(LoggingConfig::default()),
            auto(AutoscalingConfig::default())
                .with_batching(crate::BatchConfig::new(8, Duration::from_millis(1))),
            auto(AutoscalingConfig::default()).with_max_num_models_per_replica(None),
            auto(AutoscalingConfig::default()).with_max_num_models_per_replica(Some(4)),
        ] {
            assert_ne!(ConfigVersion::of(&changed), base, "{changed:?}");
        }
    }
}
