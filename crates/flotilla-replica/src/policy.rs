//! Custom autoscaling policies: Rust functions registered in the [`Registry`]
//! under the import path a config names (Ray's `policy_function`).
//!
//! [`Registry`]: crate::Registry

use std::sync::Arc;

use flotilla_core::{AppName, Args, AutoscalingConfig, DeploymentName};

/// What a policy sees at each decision (Ray's `AutoscalingContext`, in the part
/// Flotilla measures).
#[derive(Debug, Clone, Copy)]
pub struct PolicyContext<'a> {
    /// The application.
    pub app: &'a AppName,
    /// The deployment.
    pub deployment: &'a DeploymentName,
    /// The replica target now (what the autoscaler decided last).
    pub current_replicas: u32,
    /// Replicas running now.
    pub running_replicas: u32,
    /// Ongoing plus queued requests over the look-back window, reduced by the
    /// config's `aggregation_function` (mean, max or min).
    pub total_requests: f64,
    /// Requests queued in handles now.
    pub queued_requests: f64,
    /// The window's samples of ongoing plus queued requests, oldest first, one
    /// per sampling period.
    pub samples: &'a [f64],
    /// The deployment's autoscaling config (bounds, target, delays).
    pub config: &'a AutoscalingConfig,
    /// The policy's `policy_kwargs` from the config (canonical MessagePack:
    /// decode with [`Args::decode`]).
    pub kwargs: &'a Args,
}

/// A custom autoscaling policy: from what the autoscaler sees to the replica
/// count it wants, fractions allowed (Ray's policy returns
/// `desired_num_replicas`). As Ray wraps custom policies, the autoscaler then
/// applies the scaling factors, the `[min_replicas, max_replicas]` bounds, the
/// two-step scale to zero and the up/down delays to it; a count that is not a
/// finite number keeps the current target, and so does a policy that panics.
pub type AutoscalingPolicyFn = Arc<dyn Fn(&PolicyContext<'_>) -> f64 + Send + Sync>;
