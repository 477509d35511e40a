//! How replica events move the deployment status, and the messages it carries.
//! The transitions themselves are `DeploymentStatusInfo::handle`'s (Ray's table).

use std::time::Duration;

use flotilla_cluster::LOCAL_NODE;
use flotilla_core::{DeploymentStatus, DeploymentTrigger, ReplicaState};
use flotilla_replica::ReplicaId;
use flotilla_supervision::Backoff;
use tokio::time::Instant;

use crate::state::DeploymentState;

/// Most constructor retries before DEPLOY_FAILED (Ray's
/// `MAX_DEPLOYMENT_CONSTRUCTOR_RETRY_COUNT`); the limit is min(this, 3 x target).
pub const MAX_CONSTRUCTOR_RETRIES: u32 = 20;
/// First constructor retry delay; doubles per failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest retry delay below the retry limit.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Retry delay once DEPLOY_FAILED ("keeps retrying slowly").
pub const FAILED_BACKOFF: Duration = Duration::from_secs(30);
/// A replica starting for longer than this is reported on the status (Ray's
/// `SLOW_STARTUP_WARNING_S`), at most once per this period.
pub const SLOW_START: Duration = Duration::from_secs(30);

/// The constructor retry delay after `failures` consecutive failures below the
/// limit: 100 ms, doubling, at most 5 s.
pub fn backoff(failures: u32) -> Duration {
    Backoff::new(FIRST_BACKOFF, MAX_BACKOFF).after(failures)
}

impl DeploymentState {
    /// Startup failures tolerated before DEPLOY_FAILED: min(20, 3 x target).
    pub(crate) fn retry_limit(&self) -> u32 {
        MAX_CONSTRUCTOR_RETRIES.min(3 * self.args.target.replicas.max(1))
    }

    /// Ray's `_terminally_failed` (what its routers hear as the deployment
    /// not being available): no replica of the target ever ran, and startup
    /// failures reached the retry limit. Not every DEPLOY_FAILED is: one
    /// whose replica ran and was then lost (a failed health check while
    /// UPDATING), or one naming code the registry lacks, still starts
    /// replicas, and its callers wait for them, as Ray's do.
    pub(crate) fn terminally_failed(&self) -> bool {
        !self.has_started && self.failures >= self.retry_limit()
    }

    fn name(&self) -> String {
        self.args.target.spec.name.to_string()
    }

    /// HEALTHY once exactly the target count runs at the target version, no other
    /// replica exists (starting, updating, recovering or still stopping) and
    /// nothing waits for a node.
    pub(crate) fn update_status(&mut self) {
        if self.args.target.deleting || !self.shutdown.is_empty() {
            return;
        }
        let at_target = self
            .replicas
            .values()
            .filter(|r| r.state == ReplicaState::Running && r.version == self.version)
            .count() as u32;
        // Every replica counts, STOPPING ones too: a scale-down (or a roll) is not
        // done while a replica it stops still drains (Ray's S42).
        let all = self.replicas.len() as u32;
        if at_target > 0 {
            self.has_started = true;
        }
        if self.missing_code.is_some() {
            // DEPLOY_FAILED naming the missing code, however the replicas do.
            return;
        }
        if at_target == self.args.target.replicas && all == at_target && self.pending.count == 0 {
            self.failures = 0;
            self.transition(DeploymentTrigger::Healthy, String::new(), None);
        }
    }

    /// Look up the code the target names beside its replicas' (its request
    /// router class and autoscaling policy), and whether its replicas' code
    /// accepts the batches its config asks for. Missing (a checkpoint
    /// recovered by a program that no longer registers it, or no longer
    /// batches): DEPLOY_FAILED naming it, as an unregistered import path ends
    /// (DESIGN.md, "Bad input"), kept until a target whose code is
    /// registered. The deployment goes on serving meanwhile, with the
    /// built-in router, its replica target held, or its requests one by one.
    pub(crate) fn check_code(&mut self) {
        let registry = &self.args.registry;
        let config = &self.args.target.spec.config;
        let class = config.request_router.request_router_class.as_str();
        let policy = match &config.num_replicas {
            flotilla_core::ReplicaCount::Auto(a) => Some(a.policy.policy_function.as_str()),
            flotilla_core::ReplicaCount::Fixed(_) => None,
        };
        let name = self.name();
        let code = self.args.target.spec.import_path.as_str();
        let mut missing = Vec::new();
        if config.batching.is_some() && registry.contains(code) && !registry.accepts_batches(code) {
            missing.push(format!(
                "The deployment '{name}' batches requests (max_batch_size), but its code \
                 under '{code}' does not accept batches (BATCHED); serving its requests one by \
                 one"
            ));
        }
        if !registry.contains_request_router(class) {
            missing.push(format!(
                "The deployment '{name}' names request_router_config.request_router_class \
                 '{class}', which is not registered; routing with the built-in router"
            ));
        }
        if let Some(p) = policy.filter(|p| !registry.contains_autoscaling_policy(p)) {
            missing.push(format!(
                "The deployment '{name}' names autoscaling_config.policy.policy_function \
                 '{p}', which is not registered; its replica target holds"
            ));
        }
        self.missing_code = (!missing.is_empty()).then(|| missing.join(". "));
        if let Some(message) = self.missing_code.clone()
            && !self.args.target.deleting
        {
            self.transition(DeploymentTrigger::ReplicaStartupFailed, message, None);
        }
    }

    /// `error` of replica `id`, naming the node it ran on when that is one
    /// of several (not the one process of a [`LOCAL_NODE`] cluster): a node
    /// that fails every replica placed there (one built without the
    /// deployment's code) is found from the status, not only from its logs.
    pub(crate) fn naming_node(&self, id: ReplicaId, error: String) -> String {
        match self.replicas.get(&id).map(|r| r.node.as_str()) {
            Some(node) if !node.is_empty() && node != LOCAL_NODE => {
                format!("{error} (on node {node})")
            }
            _ => error,
        }
    }

    /// Count one startup failure (a constructor, first health check or reconfigure
    /// that failed) and return how long to wait before starting again. Past the
    /// retry limit with no replica of this version running: REPLICA_STARTUP_FAILED
    /// (Ray's `check_curr_status`: DEPLOY_FAILED while updating, UNHEALTHY while
    /// scaling, ignored while HEALTHY). Before any replica of this version ever
    /// ran, it retries every [`FAILED_BACKOFF`]; after (a version that ran, now
    /// failing as it scales up again), at the usual backoff, as Ray keeps
    /// starting replicas of a version that is not terminally failed.
    pub(crate) fn record_startup_failure(&mut self, replica: ReplicaId, error: &str) -> Duration {
        self.failures += 1;
        let limit = self.retry_limit();
        let n = self.failures;
        let running_at_target = self
            .replicas
            .values()
            .any(|r| r.state == ReplicaState::Running && r.version == self.version);
        if n >= limit && !running_at_target {
            // Ray's opening words first (its tests and users look for them),
            // then what only Flotilla's status says.
            let (message, delay) = if self.has_started {
                let delay = backoff(n);
                (
                    format!(
                        "The deployment failed to start {n} times in a row. This may be due \
                         to a problem with its constructor or initial health check failing. \
                         Error:\n{error}\n(deployment '{}', retry limit {limit}; none is \
                         running; retrying in {delay:?})",
                        self.name()
                    ),
                    delay,
                )
            } else {
                (
                    format!(
                        "The deployment failed to start {n} times in a row. This may be due \
                         to a problem with its constructor or initial health check failing. \
                         Error:\n{error}\n(deployment '{}', retry limit {limit}; still \
                         retrying every {}s)",
                        self.name(),
                        FAILED_BACKOFF.as_secs()
                    ),
                    FAILED_BACKOFF,
                )
            };
            self.transition(
                DeploymentTrigger::ReplicaStartupFailed,
                message,
                Some(replica),
            );
            delay
        } else {
            // Every failure says so, whatever the status (Ray's
            // `update_message`): an UNHEALTHY deployment whose replacement
            // keeps failing must not go on showing only the old cause. Not
            // over a DEPLOY_FAILED for code the registry lacks: that cause
            // stands until the next target.
            let delay = backoff(n);
            if self.missing_code.is_some() {
                return delay;
            }
            let more = if self.has_started {
                String::new()
            } else {
                format!(" {} more time(s)", limit.saturating_sub(n))
            };
            let tries = if n <= limit {
                format!("{n} of {limit} tries used")
            } else {
                format!("{n} failures in a row")
            };
            self.set_message(format!(
                "A replica failed to start with exception. Retrying{more}. Error:\n{error}\n\
                 (replica {replica}: {tries}; next try in {delay:?})"
            ));
            delay
        }
    }

    /// A replica was lost while serving (failed health checks, panicked,
    /// crashed, or its node died): if it was at the target version
    /// (`at_target`, config included), UNHEALTHY until replaced. An outdated
    /// one's loss leaves the status alone, as Ray's.
    pub(crate) fn replica_lost(&mut self, replica: ReplicaId, at_target: bool, reason: &str) {
        if at_target && self.target_count() > 0 {
            self.transition(
                DeploymentTrigger::HealthCheckFailed,
                // Ray's text, which tooling may match, then why.
                format!(
                    "A replica's health check failed. This deployment will be UNHEALTHY until \
                     the replica recovers or a new deploy happens. {reason}."
                ),
                Some(replica),
            );
        }
    }

    /// Note replicas the cluster refused (`count` of them, for `reason`).
    pub(crate) fn set_pending(&mut self, count: u32, reason: String) {
        let changed = self.pending.count != count || self.pending.reason != reason;
        if count == 0 {
            self.pending = Default::default();
            self.set_wants_capacity(false);
            return;
        }
        self.pending.since.get_or_insert_with(Instant::now);
        self.pending.count = count;
        self.pending.reason = reason;
        self.set_wants_capacity(true);
        // What made the deployment UNHEALTHY or DEPLOY_FAILED says more
        // than the wait does (Ray: "the issue that caused the deployment to
        // be unhealthy should be prioritized").
        if changed
            && !matches!(
                self.status.status,
                DeploymentStatus::Unhealthy | DeploymentStatus::DeployFailed
            )
        {
            self.set_message(format!(
                "{count} replicas waiting for a node: {}",
                self.pending.reason
            ));
        }
    }

    /// The slow-start warning for `now`, if any replica has been starting,
    /// taking its config in place (UPDATING), or waiting for a node for at
    /// least [`SLOW_START`]: Ray's two messages, the one for replicas that
    /// initialize slowly taking the place of the one for replicas not
    /// scheduled, as Ray sets them one after the other. Ray's "slow __init__"
    /// is the constructor here, and where Ray points at `ray status`, the
    /// pool's reason says what no node has.
    pub(crate) fn slow_start_message(&self, now: Instant) -> Option<String> {
        let slow = |since: Instant| now.saturating_duration_since(since) >= SLOW_START;
        let initializing = self
            .replicas
            .values()
            .filter(|r| {
                matches!(r.state, ReplicaState::Starting | ReplicaState::Updating) && slow(r.since)
            })
            .count();
        let unplaced = if self.pending.since.is_some_and(slow) {
            self.pending.count
        } else {
            0
        };
        let (secs, d, a) = (SLOW_START.as_secs(), self.name(), &self.args.app);
        if initializing > 0 {
            Some(format!(
                "Deployment '{d}' in application '{a}' has {initializing} replicas that have \
                 taken more than {secs}s to initialize.\nThis may be caused by a slow \
                 constructor or reconfigure method."
            ))
        } else if unplaced > 0 {
            Some(format!(
                "Deployment '{d}' in application '{a}' has {unplaced} replicas that have \
                 taken more than {secs}s to be scheduled. No node can take them: {}.",
                self.pending.reason
            ))
        } else {
            None
        }
    }

    /// When the slow-start check must run next: 30 s after the oldest start (or
    /// pending placement), and at most once per 30 s. `None`: nothing is starting.
    pub(crate) fn slow_start_due(&self) -> Option<Instant> {
        let oldest = self
            .replicas
            .values()
            .filter(|r| matches!(r.state, ReplicaState::Starting | ReplicaState::Updating))
            .map(|r| r.since)
            .chain(self.pending.since.filter(|_| self.pending.count > 0))
            .min()?;
        let due = oldest + SLOW_START;
        Some(match self.slow.last_warned {
            Some(w) => due.max(w + SLOW_START),
            None => due,
        })
    }

    /// The slow-start timer fired at `now`: warn (unless the status already tells
    /// of a failure) or clear a warning that no longer holds.
    pub(crate) fn check_slow_start(&mut self, now: Instant) {
        match self.slow_start_message(now) {
            Some(message) => {
                self.slow.last_warned = Some(now);
                if !matches!(
                    self.status.status,
                    DeploymentStatus::Unhealthy | DeploymentStatus::DeployFailed
                ) {
                    self.set_message(message.clone());
                    self.slow.message = Some(message);
                }
            }
            None => self.clear_slow_message(),
        }
    }

    /// Remove the slow-start warning from the status if it is still there.
    pub(crate) fn clear_slow_message(&mut self) {
        if let Some(m) = self.slow.message.take()
            && self.status.message == m
        {
            self.set_message(String::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_100ms_up_to_5s() {
        let ms: Vec<u128> = (1..=8).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }
}
