//! Dynamic request batching and model multiplexing settings: Ray's
//! `@serve.batch` and `@serve.multiplexed` arguments, kept in the deployment
//! config.
//!
//! Ray keeps these on the decorated Python function (and changes them with the
//! function's setters); Flotilla keeps them in [`DeploymentConfig`], in the
//! config version, so a change reconfigures live replicas in place (a replica's
//! batcher takes the new settings for its next batch, as Ray's setters do) and a
//! ServeConfig can set them under the decorator's argument names. That is
//! Flotilla's extension of Ray's schema.
//!
//! [`DeploymentConfig`]: crate::DeploymentConfig

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Ray's `@serve.multiplexed` default `max_num_models_per_replica`.
pub const DEFAULT_MAX_NUM_MODELS_PER_REPLICA: u32 = 3;

/// How a replica gathers requests into batches for its batch handler (Ray's
/// `@serve.batch(max_batch_size, batch_wait_timeout_s, max_concurrent_batches)`,
/// with Ray's defaults).
///
/// A batch is handed to the handler once `max_batch_size` requests wait, or
/// `batch_wait_timeout` after its first request was taken, whichever comes
/// first; at most `max_concurrent_batches` batches run at once per replica
/// (further batches keep forming and wait their turn, as in Ray).
///
/// ```
/// use std::time::Duration;
/// use flotilla_core::BatchConfig;
/// let b = BatchConfig::new(32, Duration::from_millis(5));
/// assert_eq!((b.max_batch_size, b.max_concurrent_batches), (32, 1));
/// b.validate().unwrap();
/// assert!(BatchConfig::new(0, Duration::ZERO).validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BatchConfig {
    /// Most requests in one batch (at least 1; Ray's default 10).
    pub max_batch_size: u32,
    /// How long a batch waits for more requests after its first (Ray's
    /// `batch_wait_timeout_s`, default 0.01 s); zero hands over whatever is
    /// queued at once. Tokio's timer counts whole milliseconds and rounds a
    /// deadline up: a partial batch goes up to about 1 ms after this (with
    /// 0.0002 s, after 1-2 ms), where asyncio's timers are near exact.
    pub batch_wait_timeout: Duration,
    /// Most batches running at once on one replica (at least 1; default 1).
    pub max_concurrent_batches: u32,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_batch_size: 10,
            batch_wait_timeout: Duration::from_millis(10),
            max_concurrent_batches: 1,
        }
    }
}

impl BatchConfig {
    /// Batches of at most `max_batch_size`, waiting at most `batch_wait_timeout`,
    /// one at a time.
    pub const fn new(max_batch_size: u32, batch_wait_timeout: Duration) -> Self {
        BatchConfig {
            max_batch_size,
            batch_wait_timeout,
            max_concurrent_batches: 1,
        }
    }

    /// The same, with at most `n` batches running at once.
    pub const fn with_max_concurrent_batches(mut self, n: u32) -> Self {
        self.max_concurrent_batches = n;
        self
    }

    /// Ray's checks: `max_batch_size` and `max_concurrent_batches` at least 1
    /// (a duration is never negative), and `batch_wait_timeout` at most
    /// [`MAX_DURATION`](crate::MAX_DURATION), as every duration of a config.
    /// Errors name the field as a config file does.
    pub fn validate(&self) -> Result<(), Error> {
        crate::config::check_max_duration("batch_wait_timeout_s", self.batch_wait_timeout)?;
        if self.max_batch_size < 1 {
            return Err(Error::field(
                "max_batch_size",
                format!("must be an integer >= 1, got {}", self.max_batch_size),
            ));
        }
        if self.max_concurrent_batches < 1 {
            return Err(Error::field(
                "max_concurrent_batches",
                format!(
                    "must be an integer >= 1, got {}",
                    self.max_concurrent_batches
                ),
            ));
        }
        Ok(())
    }

    /// Ray's warning when a replica can never fill its batches
    /// (`max_ongoing_requests < max_batch_size * max_concurrent_batches`), in
    /// Ray's words; `None` when it can.
    pub fn max_ongoing_warning(&self, max_ongoing_requests: u32) -> Option<String> {
        let wanted = u64::from(self.max_batch_size) * u64::from(self.max_concurrent_batches);
        (u64::from(max_ongoing_requests) < wanted).then(|| {
            format!(
                "`max_batch_size` ({}) * `max_concurrent_batches` ({}) is larger than \
                 `max_ongoing_requests` ({max_ongoing_requests}). This means the replica will \
                 never achieve the configured `max_batch_size` concurrently. Please update \
                 `max_ongoing_requests` to be >= `max_batch_size` * `max_concurrent_batches`.",
                self.max_batch_size, self.max_concurrent_batches
            )
        })
    }
}

/// Ray's check of `max_num_models_per_replica` (`None` is Ray's -1,
/// unlimited): a limit must be positive.
pub(crate) fn validate_max_models(limit: Option<u32>) -> Result<(), Error> {
    match limit {
        Some(0) => Err(Error::field(
            "max_num_models_per_replica",
            "must be positive (or -1, unlimited), got 0",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rays_defaults_and_checks() {
        let d = BatchConfig::default();
        assert_eq!(d.max_batch_size, 10);
        assert_eq!(d.batch_wait_timeout, Duration::from_millis(10));
        assert_eq!(d.max_concurrent_batches, 1);
        d.validate().unwrap();
        BatchConfig::new(1, Duration::ZERO).validate().unwrap();
        let field = |b: BatchConfig| b.validate().unwrap_err().field_name();
        assert_eq!(
            field(BatchConfig::new(0, Duration::ZERO)),
            Some("max_batch_size")
        );
        assert_eq!(
            field(BatchConfig::new(4, Duration::ZERO).with_max_concurrent_batches(0)),
            Some("max_concurrent_batches")
        );
        assert_eq!(
            field(BatchConfig::new(4, Duration::MAX)),
            Some("batch_wait_timeout_s")
        );
        BatchConfig::new(4, crate::MAX_DURATION).validate().unwrap();
        assert!(validate_max_models(Some(0)).is_err());
        validate_max_models(None).unwrap();
        validate_max_models(Some(1)).unwrap();
    }

    #[test]
    fn the_max_ongoing_warning_is_rays() {
        let b = BatchConfig::new(4, Duration::ZERO).with_max_concurrent_batches(2);
        assert_eq!(b.max_ongoing_warning(8), None);
        let w = b.max_ongoing_warning(5).unwrap();
        assert!(w.starts_with("`max_batch_size` (4) * `max_concurrent_batches` (2) is larger than `max_ongoing_requests` (5)."), "{w}");
    }
}
