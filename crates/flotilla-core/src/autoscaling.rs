//! Autoscaling settings, with Ray Serve's fields and defaults (`AutoscalingConfig`,
//! `AutoscalingPolicy`, `AggregationFunction`).

use std::{fmt, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::{Args, ImportPath, MAX_REPLICAS, error::Error};

/// Ray's default autoscaling policy's import path: Flotilla's built-in policy.
pub const DEFAULT_AUTOSCALING_POLICY: &str =
    "ray.serve.autoscaling_policy:default_autoscaling_policy";

/// Every import path that names Ray's default policy (Ray's default path, the
/// function it aliases, and both in dotted form, which Ray's importer also
/// takes): they all mean Flotilla's built-in policy.
pub const BUILTIN_AUTOSCALING_POLICIES: [&str; 4] = [
    DEFAULT_AUTOSCALING_POLICY,
    "ray.serve.autoscaling_policy:replica_queue_length_autoscaling_policy",
    "ray.serve.autoscaling_policy.default_autoscaling_policy",
    "ray.serve.autoscaling_policy.replica_queue_length_autoscaling_policy",
];

/// How the load samples of the look-back window are reduced to one number
/// (Ray's `AggregationFunction`). A config file's value is lower-cased first, as
/// Ray does (`MAX` is `max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AggregationFunction {
    /// The average over the window (the default).
    #[default]
    Mean,
    /// The window's peak.
    Max,
    /// The window's trough.
    Min,
}

impl AggregationFunction {
    /// Ray's name (`mean`, `max`, `min`).
    pub fn name(self) -> &'static str {
        match self {
            AggregationFunction::Mean => "mean",
            AggregationFunction::Max => "max",
            AggregationFunction::Min => "min",
        }
    }

    /// Reduce `samples`; the empty window is 0.
    pub fn apply(self, samples: impl IntoIterator<Item = f64>) -> f64 {
        let mut n = 0usize;
        let mut acc: Option<f64> = None;
        for s in samples {
            n += 1;
            acc = Some(match (self, acc) {
                (_, None) => s,
                (AggregationFunction::Mean, Some(a)) => a + s,
                (AggregationFunction::Max, Some(a)) => a.max(s),
                (AggregationFunction::Min, Some(a)) => a.min(s),
            });
        }
        match (self, acc) {
            (_, None) => 0.0,
            (AggregationFunction::Mean, Some(sum)) => sum / n as f64,
            (_, Some(v)) => v,
        }
    }
}

impl fmt::Display for AggregationFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for AggregationFunction {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for AggregationFunction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = String::deserialize(d)?;
        match v.to_lowercase().as_str() {
            "mean" => Ok(AggregationFunction::Mean),
            "max" => Ok(AggregationFunction::Max),
            "min" => Ok(AggregationFunction::Min),
            _ => Err(de::Error::custom(format!(
                "'{}' is not a valid AggregationFunction: write mean, max or min",
                crate::shown(&v)
            ))),
        }
    }
}

/// Which policy turns load into a replica count (Ray's `AutoscalingPolicy`): a
/// function registered in the `Registry` under `policy_function`, called with
/// `policy_kwargs` among its inputs. A path in [`BUILTIN_AUTOSCALING_POLICIES`]
/// is the built-in policy (Ray's default), which takes no kwargs.
///
/// Whatever the policy, the autoscaler applies the scaling factors, the
/// `[min, max]` bounds and the up/down delays to the count it returns, as Ray
/// wraps custom policies.
///
/// In a config file (`autoscaling_config.policy`, or an application's
/// `autoscaling_policy`) it is Ray's dictionary: `{policy_function: path,
/// policy_kwargs: {...}}`, both optional (the default path, the empty map);
/// `policy_kwargs` must be a mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalingPolicy {
    /// The policy's import path (a Registry name).
    #[serde(default = "default_policy_path")]
    pub policy_function: ImportPath,
    /// Given to the policy with every decision: a mapping, as canonical
    /// MessagePack (Ray's default: the empty map).
    #[serde(
        default = "Args::empty_map",
        with = "crate::serve_config::value::map_field"
    )]
    pub policy_kwargs: Args,
}

fn default_policy_path() -> ImportPath {
    ImportPath::known(DEFAULT_AUTOSCALING_POLICY)
}

impl Default for AutoscalingPolicy {
    fn default() -> Self {
        AutoscalingPolicy {
            policy_function: default_policy_path(),
            policy_kwargs: Args::empty_map(),
        }
    }
}

impl AutoscalingPolicy {
    /// The policy registered under `path`, with no kwargs.
    pub fn named(path: ImportPath) -> Self {
        AutoscalingPolicy {
            policy_function: path,
            policy_kwargs: Args::empty_map(),
        }
    }

    /// The same policy with `kwargs`.
    pub fn with_kwargs(mut self, kwargs: Args) -> Self {
        self.policy_kwargs = kwargs;
        self
    }

    /// Whether this is the built-in policy (any of Ray's names for its default).
    pub fn is_builtin(&self) -> bool {
        is_builtin_policy(self.policy_function.as_str())
    }
}

/// Whether `path` names the built-in policy (see [`BUILTIN_AUTOSCALING_POLICIES`]).
pub fn is_builtin_policy(path: &str) -> bool {
    BUILTIN_AUTOSCALING_POLICIES.contains(&path)
}

/// Ray Serve's autoscaling settings and defaults (`ray.serve.config.AutoscalingConfig`).
///
/// Ray's deprecated fields are not here: `metrics_interval_s` (Flotilla samples
/// load on its own period), and `smoothing_factor`, `upscale_smoothing_factor`,
/// `downscale_smoothing_factor`, which a config file may give and which are
/// folded into the factors below with Ray's precedence
/// ([`AutoscalingOverride`](crate::AutoscalingOverride)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoscalingConfig {
    /// Fewest replicas (1). Zero allows scale to zero.
    pub min_replicas: u32,
    /// Replicas at first deploy, and again whenever the deployment is
    /// deployed with other settings or code (as Ray's `register`); `None`
    /// starts at `min_replicas` and keeps the standing decision on a redeploy.
    pub initial_replicas: Option<u32>,
    /// Most replicas (1).
    pub max_replicas: u32,
    /// Ongoing requests per replica the policy aims for (2.0).
    pub target_ongoing_requests: f64,
    /// How long upscale decisions must persist before they act (30 s).
    pub upscale_delay: Duration,
    /// How long downscale decisions must persist before they act (600 s).
    pub downscale_delay: Duration,
    /// Multiplier on each upscale step (`None` = 1.0).
    pub upscaling_factor: Option<f64>,
    /// Multiplier on each downscale step (`None` = 1.0).
    pub downscaling_factor: Option<f64>,
    /// Window over which load is aggregated (30 s).
    pub look_back_period: Duration,
    /// How long a decision to go from one replica to none must persist; `None`
    /// is `downscale_delay` (Ray's `downscale_to_zero_delay_s`).
    #[serde(default)]
    pub downscale_to_zero_delay: Option<Duration>,
    /// How the look-back window's samples are reduced (mean).
    #[serde(default)]
    pub aggregation_function: AggregationFunction,
    /// The policy (Ray's default: the built-in one).
    #[serde(default)]
    pub policy: AutoscalingPolicy,
}

impl Default for AutoscalingConfig {
    fn default() -> Self {
        AutoscalingConfig {
            min_replicas: 1,
            initial_replicas: None,
            max_replicas: 1,
            target_ongoing_requests: 2.0,
            upscale_delay: Duration::from_secs(30),
            downscale_delay: Duration::from_secs(600),
            upscaling_factor: None,
            downscaling_factor: None,
            look_back_period: Duration::from_secs(30),
            downscale_to_zero_delay: None,
            aggregation_function: AggregationFunction::Mean,
            policy: AutoscalingPolicy::default(),
        }
    }
}

impl AutoscalingConfig {
    /// Ray's warning when autoscaling can never scale up: a replica takes at
    /// most `max_ongoing_requests`, so its load never exceeds a larger
    /// `target_ongoing_requests`. In Ray's words; `None` when it can.
    pub fn max_ongoing_warning(&self, max_ongoing_requests: u32) -> Option<String> {
        (f64::from(max_ongoing_requests) < self.target_ongoing_requests).then(|| {
            "Autoscaling will never happen, because 'max_ongoing_requests' is less than \
                 'target_ongoing_requests' now."
                .to_owned()
        })
    }

    /// Bounds in order, factors and target positive.
    pub fn validate(&self) -> Result<(), Error> {
        // max_replicas first: with min_replicas left at its default of 1, a
        // max_replicas of 0 is max_replicas's fault.
        if self.max_replicas == 0 || self.max_replicas > MAX_REPLICAS {
            return Err(Error::field(
                "autoscaling_config.max_replicas",
                format!(
                    "must be from 1 to {MAX_REPLICAS}, got {}",
                    self.max_replicas
                ),
            ));
        }
        if self.min_replicas > self.max_replicas {
            return Err(Error::field(
                "autoscaling_config.min_replicas",
                format!(
                    "min_replicas ({}) must not exceed max_replicas ({})",
                    self.min_replicas, self.max_replicas
                ),
            ));
        }
        if let Some(init) = self.initial_replicas
            && (init < self.min_replicas || init > self.max_replicas)
        {
            return Err(Error::field(
                "autoscaling_config.initial_replicas",
                format!(
                    "{init} is outside [min_replicas, max_replicas] = [{}, {}]",
                    self.min_replicas, self.max_replicas
                ),
            ));
        }
        if !(self.target_ongoing_requests.is_finite() && self.target_ongoing_requests > 0.0) {
            return Err(Error::field(
                "autoscaling_config.target_ongoing_requests",
                format!("must be > 0, got {}", self.target_ongoing_requests),
            ));
        }
        for (field, f) in [
            ("autoscaling_config.upscaling_factor", self.upscaling_factor),
            (
                "autoscaling_config.downscaling_factor",
                self.downscaling_factor,
            ),
        ] {
            if let Some(f) = f
                && !(f.is_finite() && f > 0.0)
            {
                return Err(Error::field(field, format!("must be > 0, got {f}")));
            }
        }
        if self.look_back_period.is_zero() {
            return Err(Error::field(
                "autoscaling_config.look_back_period",
                "must be longer than zero",
            ));
        }
        // Every duration, as a config file's (its seconds are held to it).
        for (field, d) in [
            ("autoscaling_config.upscale_delay", Some(self.upscale_delay)),
            (
                "autoscaling_config.downscale_delay",
                Some(self.downscale_delay),
            ),
            (
                "autoscaling_config.downscale_to_zero_delay",
                self.downscale_to_zero_delay,
            ),
            (
                "autoscaling_config.look_back_period",
                Some(self.look_back_period),
            ),
        ] {
            if let Some(d) = d {
                crate::config::check_max_duration(field, d)?;
            }
        }
        Ok(())
    }

    /// The replica count with no autoscaling decision standing: at first
    /// deploy, or after a redeploy that dropped the decision.
    pub fn initial(&self) -> u32 {
        self.initial_replicas.unwrap_or(self.min_replicas)
    }

    /// The factor on upscale steps (1.0 when unset).
    pub fn upscaling_factor(&self) -> f64 {
        self.upscaling_factor.unwrap_or(1.0)
    }

    /// The factor on downscale steps (1.0 when unset).
    pub fn downscaling_factor(&self) -> f64 {
        self.downscaling_factor.unwrap_or(1.0)
    }

    /// How long a decision to go from one replica to none must persist.
    pub fn downscale_to_zero_delay(&self) -> Duration {
        self.downscale_to_zero_delay.unwrap_or(self.downscale_delay)
    }

    /// The same config with `policy`.
    pub fn with_policy(mut self, policy: AutoscalingPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The fields Ray's first version had, laid out as this struct once was:
    /// what [`ConfigVersion`](crate::ConfigVersion) hashes, so versions of
    /// configs that leave the newer fields at their defaults do not change.
    pub(crate) fn legacy_view(&self) -> impl Serialize + '_ {
        (
            self.min_replicas,
            self.initial_replicas,
            self.max_replicas,
            self.target_ongoing_requests,
            self.upscale_delay,
            self.downscale_delay,
            self.upscaling_factor,
            self.downscaling_factor,
            self.look_back_period,
        )
    }

    /// The newer fields, `None` while all are at their defaults.
    pub(crate) fn extension_view(&self) -> Option<impl Serialize + '_> {
        let default = self.downscale_to_zero_delay.is_none()
            && self.aggregation_function == AggregationFunction::Mean
            && self.policy == AutoscalingPolicy::default();
        (!default).then_some((
            self.downscale_to_zero_delay,
            self.aggregation_function,
            &self.policy,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_max_ongoing_warning_is_rays() {
        let a = AutoscalingConfig {
            target_ongoing_requests: 5.0,
            ..Default::default()
        };
        assert_eq!(a.max_ongoing_warning(5), None);
        assert_eq!(
            a.max_ongoing_warning(4).as_deref(),
            Some(
                "Autoscaling will never happen, because 'max_ongoing_requests' is less than \
                 'target_ongoing_requests' now."
            )
        );
    }

    #[test]
    fn aggregation_reduces_the_window() {
        let w = [1.0, 4.0, 2.0, 5.0];
        assert_eq!(AggregationFunction::Mean.apply(w), 3.0);
        assert_eq!(AggregationFunction::Max.apply(w), 5.0);
        assert_eq!(AggregationFunction::Min.apply(w), 1.0);
        for f in [
            AggregationFunction::Mean,
            AggregationFunction::Max,
            AggregationFunction::Min,
        ] {
            assert_eq!(f.apply([]), 0.0);
        }
    }

    /// A max_replicas of 0 is its own fault, not min_replicas's (which the
    /// file may not give: its default is 1).
    #[test]
    fn a_zero_max_replicas_is_named_before_the_bounds_order() {
        let a = AutoscalingConfig {
            max_replicas: 0,
            ..AutoscalingConfig::default()
        };
        let e = a.validate().unwrap_err().to_string();
        assert!(e.contains("autoscaling_config.max_replicas"), "{e}");
    }

    /// Every duration is held to `MAX_DURATION` through the Rust API, as a
    /// config file's seconds are.
    #[test]
    fn durations_longer_than_the_longest_are_refused_naming_the_field() {
        let long = crate::MAX_DURATION + Duration::from_secs(1);
        type Set = fn(&mut AutoscalingConfig, Duration);
        let cases: [(Set, &str); 4] = [
            (|a, d| a.upscale_delay = d, "upscale_delay"),
            (|a, d| a.downscale_delay = d, "downscale_delay"),
            (
                |a, d| a.downscale_to_zero_delay = Some(d),
                "downscale_to_zero_delay",
            ),
            (|a, d| a.look_back_period = d, "look_back_period"),
        ];
        for (set, field) in cases {
            let mut a = AutoscalingConfig::default();
            set(&mut a, crate::MAX_DURATION);
            assert!(a.validate().is_ok(), "{field}");
            set(&mut a, long);
            let e = a.validate().unwrap_err();
            let name = e.field_name().map(str::to_owned);
            assert_eq!(name, Some(format!("autoscaling_config.{field}")), "{e}");
        }
    }

    #[test]
    fn the_default_policy_is_rays_default_path() {
        let p = AutoscalingPolicy::default();
        assert_eq!(p.policy_function.as_str(), DEFAULT_AUTOSCALING_POLICY);
        assert!(p.is_builtin());
        for path in BUILTIN_AUTOSCALING_POLICIES {
            assert!(is_builtin_policy(path), "{path}");
        }
        assert!(!AutoscalingPolicy::named(ImportPath::new("mine:policy").unwrap()).is_builtin());
    }

    #[test]
    fn downscale_to_zero_delay_defaults_to_the_downscale_delay() {
        let a = AutoscalingConfig::default();
        assert_eq!(a.downscale_to_zero_delay(), a.downscale_delay);
        let b = AutoscalingConfig {
            downscale_to_zero_delay: Some(Duration::from_secs(5)),
            ..a
        };
        assert_eq!(b.downscale_to_zero_delay(), Duration::from_secs(5));
    }

    #[test]
    fn old_records_without_the_new_fields_decode() {
        #[derive(Serialize)]
        struct Old {
            min_replicas: u32,
            initial_replicas: Option<u32>,
            max_replicas: u32,
            target_ongoing_requests: f64,
            upscale_delay: Duration,
            downscale_delay: Duration,
            upscaling_factor: Option<f64>,
            downscaling_factor: Option<f64>,
            look_back_period: Duration,
        }
        let d = AutoscalingConfig::default();
        let old = Old {
            min_replicas: 0,
            initial_replicas: None,
            max_replicas: 4,
            target_ongoing_requests: 2.0,
            upscale_delay: d.upscale_delay,
            downscale_delay: d.downscale_delay,
            upscaling_factor: None,
            downscaling_factor: None,
            look_back_period: d.look_back_period,
        };
        for bytes in [
            rmp_serde::to_vec(&old).unwrap(),
            rmp_serde::to_vec_named(&old).unwrap(),
        ] {
            let back: AutoscalingConfig = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(
                back,
                AutoscalingConfig {
                    min_replicas: 0,
                    max_replicas: 4,
                    ..AutoscalingConfig::default()
                }
            );
        }
    }
}
