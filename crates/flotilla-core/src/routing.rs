//! How handles route requests to a deployment's replicas and answer when its
//! queue is full: Ray's `RequestRouterConfig` and `BackpressureConfig`.
//!
//! This module holds and validates the settings; the data plane and the HTTP
//! proxy apply them. Both are part of the config version (Ray reconfigures
//! replicas in place when they change).

use std::{fmt, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::{Args, ImportPath, error::Error};

/// Ray's default request router: power of two choices, Flotilla's router.
pub const DEFAULT_REQUEST_ROUTER: &str =
    "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter";

/// Every import path that names Ray's default router (its default path, the
/// module that defines it, and both in dotted form): they all mean Flotilla's
/// power-of-two-choices router.
pub const BUILTIN_REQUEST_ROUTERS: [&str; 4] = [
    DEFAULT_REQUEST_ROUTER,
    "ray.serve._private.request_router.pow_2_router:PowerOfTwoChoicesRequestRouter",
    "ray.serve._private.request_router.PowerOfTwoChoicesRequestRouter",
    "ray.serve._private.request_router.pow_2_router.PowerOfTwoChoicesRequestRouter",
];

/// Whether `path` names the built-in router (see [`BUILTIN_REQUEST_ROUTERS`]).
pub fn is_builtin_router(path: &str) -> bool {
    BUILTIN_REQUEST_ROUTERS.contains(&path)
}

/// The request router of a deployment and its settings (Ray's
/// `RequestRouterConfig`, with Ray's defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRouterConfig {
    /// The router's import path: one of [`BUILTIN_REQUEST_ROUTERS`], or a router
    /// registered in the `Registry`.
    pub request_router_class: ImportPath,
    /// Given to the router when it starts: a mapping, as canonical MessagePack
    /// (default: the empty map).
    #[serde(with = "crate::serve_config::value::map_field")]
    pub request_router_kwargs: Args,
    /// How often a replica's routing stats are recorded (10 s). Accepted and
    /// checked as Ray does, but it has no effect: Flotilla's replicas have no
    /// `record_routing_stats` hook, and routers read replicas' live counters.
    /// A config file that sets it, or any of the four below, is warned
    /// about ([`ConfigWarning::RouterSettingsWithoutEffect`](crate::ConfigWarning::RouterSettingsWithoutEffect)).
    pub request_routing_stats_period: Duration,
    /// How long recording routing stats may take before it fails (30 s).
    /// Accepted and checked, without effect (see
    /// [`request_routing_stats_period`](Self::request_routing_stats_period)).
    pub request_routing_stats_timeout: Duration,
    /// The first wait before routing a request again after no replica could
    /// take it (25 ms). Accepted and checked, without effect: a Flotilla
    /// handle with no replica to take a request waits for a slot to free or
    /// the replica set to change (by notification), then asks the router
    /// again, so it never backs off.
    pub initial_backoff: Duration,
    /// What each further wait is multiplied by (2). Accepted and checked,
    /// without effect (see [`initial_backoff`](Self::initial_backoff)).
    pub backoff_multiplier: f64,
    /// The longest wait (500 ms). Accepted and checked, without effect (see
    /// [`initial_backoff`](Self::initial_backoff)).
    pub max_backoff: Duration,
}

impl Default for RequestRouterConfig {
    fn default() -> Self {
        RequestRouterConfig {
            request_router_class: ImportPath::known(DEFAULT_REQUEST_ROUTER),
            request_router_kwargs: Args::empty_map(),
            request_routing_stats_period: Duration::from_secs(10),
            request_routing_stats_timeout: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(25),
            backoff_multiplier: 2.0,
            max_backoff: Duration::from_millis(500),
        }
    }
}

impl RequestRouterConfig {
    /// Whether the router is the built-in one (power of two choices).
    pub fn is_builtin(&self) -> bool {
        is_builtin_router(self.request_router_class.as_str())
    }

    /// Every duration longer than zero and at most
    /// [`MAX_DURATION`](crate::MAX_DURATION), as every other duration, and the
    /// multiplier finite and > 0 (Ray's `PositiveFloat`s). Errors name the
    /// config file's field.
    pub fn validate(&self) -> Result<(), Error> {
        for (field, d) in [
            (
                "request_router_config.request_routing_stats_period_s",
                self.request_routing_stats_period,
            ),
            (
                "request_router_config.request_routing_stats_timeout_s",
                self.request_routing_stats_timeout,
            ),
            (
                "request_router_config.initial_backoff_s",
                self.initial_backoff,
            ),
            ("request_router_config.max_backoff_s", self.max_backoff),
        ] {
            if d.is_zero() {
                return Err(Error::field(field, "must be longer than zero"));
            }
            crate::config::check_max_duration(field, d)?;
        }
        let m = self.backoff_multiplier;
        if !(m.is_finite() && m > 0.0) {
            return Err(Error::field(
                "request_router_config.backoff_multiplier",
                format!("must be a finite number > 0, got {m}"),
            ));
        }
        Ok(())
    }
}

/// The HTTP status of a request refused because the deployment's queue is full
/// (Ray's `backpressure_config.status_code`: 503 or 429, exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackpressureStatus {
    /// 503 Service Unavailable (the default).
    #[default]
    ServiceUnavailable,
    /// 429 Too Many Requests.
    TooManyRequests,
}

impl BackpressureStatus {
    /// The status code.
    pub fn code(self) -> u16 {
        match self {
            BackpressureStatus::ServiceUnavailable => 503,
            BackpressureStatus::TooManyRequests => 429,
        }
    }
}

impl fmt::Display for BackpressureStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code())
    }
}

impl Serialize for BackpressureStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u16(self.code())
    }
}

impl<'de> Deserialize<'de> for BackpressureStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = BackpressureStatus;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("503 or 429 (an integer, as Ray's Literal[503, 429])")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<BackpressureStatus, E> {
                match v {
                    503 => Ok(BackpressureStatus::ServiceUnavailable),
                    429 => Ok(BackpressureStatus::TooManyRequests),
                    _ => Err(E::custom(format!("Input should be 503 or 429, got {v}"))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<BackpressureStatus, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!("Input should be 503 or 429, got {v}"))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<BackpressureStatus, E> {
                Err(E::custom(format!(
                    "Input should be 503 or 429 (an integer, as Ray's Literal[503, 429]), got {v}"
                )))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<BackpressureStatus, E> {
                Err(E::custom(format!(
                    "Input should be 503 or 429 (an integer, as Ray's Literal[503, 429]), got \
                     the text {:?}",
                    crate::shown(v)
                )))
            }
        }
        d.deserialize_any(V)
    }
}

/// What a request refused by a full queue is answered with over HTTP (Ray's
/// `BackpressureConfig`). Handles always get the back-pressure error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct BackpressureConfig {
    /// The status code (503).
    pub status_code: BackpressureStatus,
    /// When set, the answer carries a `Retry-After` header of this many seconds,
    /// rounded up (none by default).
    pub retry_after: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rays_defaults() {
        let r = RequestRouterConfig::default();
        assert!(r.is_builtin());
        assert_eq!(r.request_routing_stats_period, Duration::from_secs(10));
        assert_eq!(r.request_routing_stats_timeout, Duration::from_secs(30));
        assert_eq!(r.initial_backoff, Duration::from_millis(25));
        assert_eq!(r.backoff_multiplier, 2.0);
        assert_eq!(r.max_backoff, Duration::from_millis(500));
        r.validate().unwrap();
        for p in BUILTIN_REQUEST_ROUTERS {
            assert!(is_builtin_router(p), "{p}");
        }
        assert_eq!(BackpressureConfig::default().status_code.code(), 503);
    }

    #[test]
    fn validate_names_the_field() {
        let d = RequestRouterConfig::default;
        for (bad, field) in [
            (
                RequestRouterConfig {
                    max_backoff: Duration::ZERO,
                    ..d()
                },
                "request_router_config.max_backoff_s",
            ),
            (
                RequestRouterConfig {
                    request_routing_stats_timeout: Duration::MAX,
                    ..d()
                },
                "request_router_config.request_routing_stats_timeout_s",
            ),
            (
                RequestRouterConfig {
                    backoff_multiplier: f64::NAN,
                    ..d()
                },
                "request_router_config.backoff_multiplier",
            ),
        ] {
            assert_eq!(bad.validate().unwrap_err().field_name(), Some(field));
        }
    }

    #[test]
    fn status_codes_round_trip() {
        for s in [
            BackpressureStatus::ServiceUnavailable,
            BackpressureStatus::TooManyRequests,
        ] {
            let bytes = rmp_serde::to_vec(&s).unwrap();
            assert_eq!(
                rmp_serde::from_slice::<BackpressureStatus>(&bytes).unwrap(),
                s
            );
        }
    }
}
