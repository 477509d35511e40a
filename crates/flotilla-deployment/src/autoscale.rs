//! Ray Serve's autoscaling, as a pure state machine over virtual time.
//!
//! The DeploymentActor samples load (ongoing requests on its replicas plus requests
//! queued in handles) on a per-deployment timer and asks [`Autoscaler::decide`] for a
//! new target. The decision is made durable by the Controller before any replica
//! changes.
//!
//! The load of the look-back window is reduced by the config's
//! `aggregation_function` (mean, max or min). The built-in policy (Ray's default,
//! named by any of Ray's default policy paths) wants `load / target` replicas; a
//! custom policy is a function registered in the `Registry` under the path the
//! config names, called with a [`PolicyContext`]. Either way, as Ray wraps custom
//! policies, the scaling factors, the bounds, the two-step scale to zero and the
//! delays are applied to what the policy wants; the last replica goes away only
//! after `downscale_to_zero_delay` (Ray's `downscale_to_zero_delay_s`, by default
//! the downscale delay). Ray's `metrics_interval_s` has no effect: sampling is
//! every [`SAMPLE_PERIOD`].

use std::{
    collections::VecDeque,
    panic::{AssertUnwindSafe, catch_unwind},
    time::Duration,
};

use flotilla_core::{
    AppName, AutoscalingConfig, AutoscalingPolicy, DeploymentName, ImportPath, ReplicaCount,
    ReplicaState,
};
use flotilla_replica::{AutoscalingPolicyFn, PolicyContext, Registry};
use ractor::ActorRef;
use tokio::time::Instant;

use crate::{DeploymentEvent, DeploymentMsg, messages::InternalMsg, state::DeploymentState};

/// How often an autoscaled deployment samples its load.
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// Which policy turns load into a wanted replica count.
#[derive(Clone)]
pub enum Policy {
    /// Ray's default policy: `load / target_ongoing_requests`.
    Builtin,
    /// A policy registered in the `Registry`.
    Custom {
        /// The function.
        policy: AutoscalingPolicyFn,
        /// The application, for the policy's context.
        app: AppName,
        /// The deployment, for the policy's context.
        deployment: DeploymentName,
    },
    /// The config names a policy the `Registry` does not have (a checkpoint
    /// recovered by a program that no longer registers it): no decision is made
    /// and the replica target holds.
    Missing(ImportPath),
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Policy::Builtin => f.write_str("Builtin"),
            Policy::Custom {
                app, deployment, ..
            } => write!(f, "Custom({app}/{deployment})"),
            Policy::Missing(p) => write!(f, "Missing({p})"),
        }
    }
}

/// The policy `policy` names for deployment `deployment` of `app`: the built-in
/// one for Ray's default paths, else the one registered under the path.
pub fn resolve_policy(
    registry: &Registry,
    app: &AppName,
    deployment: &DeploymentName,
    policy: &AutoscalingPolicy,
) -> Policy {
    if policy.is_builtin() {
        return Policy::Builtin;
    }
    match registry.autoscaling_policy(policy.policy_function.as_str()) {
        Some(f) => Policy::Custom {
            policy: f,
            app: app.clone(),
            deployment: deployment.clone(),
        },
        None => Policy::Missing(policy.policy_function.clone()),
    }
}

/// Load samples over the look-back window and the pending decision's age.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    config: AutoscalingConfig,
    policy: Policy,
    samples: VecDeque<(Instant, f64)>,
    /// The way the wanted count has pointed since when (the delay runs from
    /// there), from which target:
    /// kept after a decision is sent, until the target moves (a decision
    /// lost on its way, as a failed commit, is sent again at the next tick,
    /// not after another whole delay).
    pending: Option<(Direction, Instant, u32)>,
    /// A custom policy's failure (a panic, a count that is not a number) was
    /// logged already.
    warned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Up,
    Down,
}

impl Autoscaler {
    /// A new autoscaler for `config`, with the built-in policy.
    pub fn new(config: AutoscalingConfig) -> Self {
        Self::with_policy(config, Policy::Builtin)
    }

    /// A new autoscaler for `config` deciding with `policy`.
    pub fn with_policy(config: AutoscalingConfig, policy: Policy) -> Self {
        Autoscaler {
            config,
            policy,
            samples: VecDeque::new(),
            pending: None,
            warned: false,
        }
    }

    /// Take a new config (bounds, delays); samples are kept.
    pub fn set_config(&mut self, config: AutoscalingConfig) {
        self.config = config;
    }

    /// Forget a decision still in its delay: the deployment was deployed again
    /// with new settings or code, and the delay starts over (Ray's `register`
    /// empties the policy state, where its decision counter is). Samples are
    /// kept.
    pub fn restart_delay(&mut self) {
        self.pending = None;
    }

    /// Take a new policy; samples are kept.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.warned = false;
    }

    /// Record the total load (ongoing + queued requests) seen `now`.
    pub fn record(&mut self, now: Instant, load: f64) {
        self.samples.push_back((now, load));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > self.config.look_back_period)
        {
            self.samples.pop_front();
        }
    }

    /// The window's load, reduced by the config's aggregation function.
    fn aggregate(&self) -> f64 {
        self.config
            .aggregation_function
            .apply(self.samples.iter().map(|(_, l)| *l))
    }

    /// The replica count the policy wants (fractions allowed), or `None` to make
    /// no decision.
    fn wanted(&mut self, current: u32, running: u32, queued_now: f64) -> Option<f64> {
        let load = self.aggregate();
        let (policy, app, deployment) = match &self.policy {
            Policy::Builtin => return Some(load / self.config.target_ongoing_requests),
            Policy::Missing(_) => return None,
            Policy::Custom {
                policy,
                app,
                deployment,
            } => (policy, app, deployment),
        };
        let samples: Vec<f64> = self.samples.iter().map(|(_, l)| *l).collect();
        let ctx = PolicyContext {
            app,
            deployment,
            current_replicas: current,
            running_replicas: running,
            total_requests: load,
            queued_requests: queued_now,
            samples: &samples,
            config: &self.config,
            kwargs: &self.config.policy.policy_kwargs,
        };
        let wanted = catch_unwind(AssertUnwindSafe(|| policy(&ctx)));
        match wanted {
            Ok(w) if w.is_finite() => Some(w.max(0.0)),
            outcome => {
                if !self.warned {
                    self.warned = true;
                    let why = match outcome {
                        Ok(w) => format!("it returned {w}"),
                        Err(_) => "it panicked".to_owned(),
                    };
                    tracing::warn!(app = %app, deployment = %deployment,
                        policy = %self.config.policy.policy_function,
                        "the custom autoscaling policy made no decision ({why}); the replica \
                         target holds");
                }
                None
            }
        }
    }

    /// The target the policy wants now, or `None` to keep `current`.
    ///
    /// While no replica runs, the policy is not asked (Ray's cold-start rule):
    /// requests waiting raise the target at once to `ceil(upscaling_factor)` (at
    /// least one, within the bounds) if it is lower, and otherwise it holds.
    /// With replicas running, the policy's wanted count (built-in:
    /// `load / target_ongoing_requests`) is reached from the running count by the
    /// scaling factor and rounded up, clamped to [min, max], and acted on (if
    /// it differs from `current`, the target) only after the up- or downscale
    /// delay has passed with the same direction. A downscale the factor would
    /// round away still takes one step. Reaching zero goes through one, and the
    /// last step waits `downscale_to_zero_delay`.
    pub fn decide(
        &mut self,
        now: Instant,
        current: u32,
        running: u32,
        queued_now: f64,
    ) -> Option<u32> {
        if running == 0 {
            let c = &self.config;
            self.pending = None;
            if queued_now <= 0.0 {
                return None;
            }
            let up = (c.upscaling_factor()).ceil().max(1.0) as u32;
            let up = up.clamp(c.min_replicas.max(1), c.max_replicas);
            return (up > current).then_some(up);
        }
        let Some(raw) = self.wanted(current, running, queued_now) else {
            self.pending = None;
            return None;
        };
        let c = &self.config;
        // The factor moves the running count toward the wanted one (Ray's
        // `_apply_scaling_factors` on `current_num_replicas`, the running
        // replicas); the delays compare the result with the target.
        let base = f64::from(running);
        let factor = if raw > base {
            c.upscaling_factor()
        } else {
            c.downscaling_factor()
        };
        let mut desired = (base + factor * (raw - base)).ceil();
        // Ray's "stuck" rule: the factor rounded a real downscale (one that still
        // wants fewer whole replicas) back to the running count.
        if desired == base && raw.ceil() < base {
            desired = base - 1.0;
        }
        let mut desired = desired.max(0.0).min(f64::from(u32::MAX)) as u32;
        desired = desired.clamp(c.min_replicas, c.max_replicas);
        // Zero only from one: N -> 1 -> 0 in two stages.
        if desired == 0 && current > 1 {
            desired = 1;
        }
        let direction = match desired.cmp(&current) {
            std::cmp::Ordering::Greater => Direction::Up,
            std::cmp::Ordering::Less => Direction::Down,
            std::cmp::Ordering::Equal => {
                self.pending = None;
                return None;
            }
        };
        let since = match self.pending {
            Some((d, t, from)) if d == direction && from == current => t,
            _ => {
                self.pending = Some((direction, now, current));
                now
            }
        };
        let delay = match direction {
            Direction::Up => c.upscale_delay,
            Direction::Down if desired == 0 => c.downscale_to_zero_delay(),
            Direction::Down => c.downscale_delay,
        };
        (now.duration_since(since) >= delay).then_some(desired)
    }
}

/// Start, update or stop the autoscaler as the spec says (called on every new
/// target and at start). Only autoscaled deployments run a sampling timer. The
/// policy is looked up in the Registry each time.
pub(crate) fn arm(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
    match &state.args.target.spec.config.num_replicas {
        ReplicaCount::Auto(config) if !state.args.target.deleting => {
            let policy = resolve_policy(
                &state.args.registry,
                &state.args.app,
                &state.args.target.spec.name,
                &config.policy,
            );
            if let Policy::Missing(path) = &policy {
                tracing::error!(app = %state.args.app, deployment = %state.args.target.spec.name,
                    policy = %path, "no autoscaling policy is registered under this path; the \
                    replica target holds until it is registered");
            }
            match &mut state.autoscaler {
                Some((a, _)) => {
                    a.set_config(config.clone());
                    a.set_policy(policy);
                }
                None => {
                    let timer =
                        myself.send_interval(SAMPLE_PERIOD, || InternalMsg::AutoscaleTick.into());
                    state.autoscaler =
                        Some((Autoscaler::with_policy(config.clone(), policy), timer));
                }
            }
        }
        _ => {
            if let Some((_, timer)) = state.autoscaler.take() {
                timer.abort();
            }
        }
    }
}

/// Sample the load (ongoing requests on the published replicas plus requests
/// queued in handles, every process's: see docs/nodes.md) and report a new
/// target if the policy decides one.
pub(crate) fn tick(state: &mut DeploymentState) {
    if state.args.target.deleting || !state.shutdown.is_empty() {
        return;
    }
    let current = state.args.target.replicas;
    let running = state
        .replicas
        .values()
        .filter(|r| r.state == ReplicaState::Running)
        .count() as u32;
    // Callers of every process: a node's wait in its copy of the route, and
    // its replicas count every caller's requests (docs/nodes.md).
    let queued = state.route.queued() as f64 + state.route.queued_elsewhere() as f64;
    let ongoing: f64 = state
        .route
        .replicas()
        .iter()
        .map(|r| f64::from(r.load()))
        .sum();
    let Some((a, _)) = &mut state.autoscaler else {
        return;
    };
    let now = Instant::now();
    a.record(now, ongoing + queued);
    if let Some(replicas) = a.decide(now, current, running, queued) {
        tracing::info!(app = %state.args.app, deployment = %state.args.target.spec.name,
            from = current, to = replicas, "autoscaling decision");
        (state.args.reporter)(DeploymentEvent::Autoscale {
            name: state.args.target.spec.name.clone(),
            replicas,
            generation: state.args.target.generation,
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn config(min: u32, max: u32) -> AutoscalingConfig {
        AutoscalingConfig {
            min_replicas: min,
            max_replicas: max,
            target_ongoing_requests: 1.0,
            upscale_delay: Duration::from_secs(30),
            downscale_delay: Duration::from_secs(600),
            look_back_period: Duration::from_secs(30),
            ..Default::default()
        }
    }

    /// Feed `load` every second for `secs`, returning the first decision.
    fn run(
        a: &mut Autoscaler,
        start: Instant,
        secs: u64,
        load: f64,
        current: u32,
    ) -> Option<(u64, u32)> {
        for s in 0..secs {
            let now = start + Duration::from_secs(s);
            a.record(now, load);
            if let Some(n) = a.decide(now, current, current, 0.0) {
                return Some((s, n));
            }
        }
        None
    }

    #[tokio::test(start_paused = true)]
    async fn double_load_doubles_after_the_upscale_delay() {
        let mut a = Autoscaler::new(config(1, 10));
        let t = Instant::now();
        // 2 replicas, 2 ongoing each = 4, target 1: wants 4 after 30 s of it.
        let (at, n) = run(&mut a, t, 100, 4.0, 2).unwrap();
        assert_eq!(n, 4);
        assert_eq!(at, 30);
    }

    /// A decision whose target never came (its commit failed, say) is sent
    /// again at the next tick, not after another whole delay; once the
    /// target moves, the next decision waits its delay again.
    #[tokio::test(start_paused = true)]
    async fn a_decision_lost_on_its_way_is_sent_again_at_once() {
        let mut a = Autoscaler::new(config(1, 10));
        let t = Instant::now();
        assert_eq!(run(&mut a, t, 100, 4.0, 2), Some((30, 4)));
        let next = t + Duration::from_secs(31);
        a.record(next, 4.0);
        assert_eq!(a.decide(next, 2, 2, 0.0), Some(4), "the target is still 2");
        // Applied: more load waits its own delay from the new target.
        let (at, n) = run(&mut a, t + Duration::from_secs(32), 100, 8.0, 4).unwrap();
        assert_eq!((at, n), (30, 8));
    }

    #[tokio::test(start_paused = true)]
    async fn bounds_hold_under_heavy_load() {
        let mut a = Autoscaler::new(config(3, 3));
        assert_eq!(run(&mut a, Instant::now(), 700, 1_000.0, 3), None);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_scales_down_after_the_delay_and_to_zero_in_two_stages() {
        let mut a = Autoscaler::new(config(0, 10));
        let t = Instant::now();
        let (at, n) = run(&mut a, t, 2_000, 0.0, 5).unwrap();
        assert_eq!((at, n), (600, 1));
        let (at, n) = run(&mut a, t + Duration::from_secs(1_000), 2_000, 0.0, 1).unwrap();
        assert_eq!((at, n), (600, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fractional_load_keeps_the_replica_that_serves_part_of_it() {
        // As Ray, the wanted count rounds up: half a replica's load keeps the one
        // replica, four and a half keep five (no flapping between four and five).
        let t = Instant::now();
        assert_eq!(
            run(&mut Autoscaler::new(config(0, 10)), t, 2_000, 0.5, 1),
            None
        );
        assert_eq!(
            run(&mut Autoscaler::new(config(1, 10)), t, 2_000, 4.5, 5),
            None
        );
        // A load that wants fewer whole replicas still scales down.
        assert_eq!(
            run(&mut Autoscaler::new(config(1, 10)), t, 2_000, 3.5, 5),
            Some((600, 4))
        );
        // A downscaling factor that would round back to the current count still
        // takes one step, as Ray's "stuck" rule does.
        let slow = AutoscalingConfig {
            downscaling_factor: Some(0.1),
            ..config(1, 10)
        };
        assert_eq!(
            run(&mut Autoscaler::new(slow), t, 2_000, 3.0, 5),
            Some((600, 4))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_replica_running_the_target_holds() {
        // Replicas wanted but none running yet (slow or failing constructors): as
        // Ray's cold-start rule, the policy is not asked, so the target neither
        // grows toward the queue nor shrinks for want of load.
        let t = Instant::now();
        for load in [0.0, 50.0] {
            let mut a = Autoscaler::new(config(0, 10));
            for s in 0..2_000 {
                let now = t + Duration::from_secs(s);
                a.record(now, load);
                assert_eq!(a.decide(now, 1, 0, load), None, "load {load} at {s} s");
            }
        }
        // A scaling factor above one still raises a starting target at once.
        let eager = AutoscalingConfig {
            upscaling_factor: Some(3.0),
            ..config(0, 10)
        };
        let mut a = Autoscaler::new(eager);
        assert_eq!(a.decide(t, 1, 0, 5.0), Some(3));
        assert_eq!(a.decide(t, 3, 0, 5.0), None);
    }

    /// The scaling factor moves the running count, not the target, toward
    /// the wanted count (Ray's `_apply_scaling_factors(desired,
    /// ctx.current_num_replicas)`).
    #[tokio::test(start_paused = true)]
    async fn the_scaling_factor_moves_the_running_count() {
        let halves = AutoscalingConfig {
            upscaling_factor: Some(0.5),
            downscaling_factor: Some(0.5),
            ..config(1, 100)
        };
        let t = Instant::now();
        let decide = |load: f64, current: u32, running: u32| {
            let mut a = Autoscaler::new(halves.clone());
            (0..700).find_map(|s| {
                let now = t + Duration::from_secs(s);
                a.record(now, load);
                a.decide(now, current, running, 0.0)
            })
        };
        // Target 10, 4 running, 20 wanted: 4 + (20 - 4) / 2 = 12 (not 15).
        assert_eq!(decide(20.0, 10, 4), Some(12));
        // Target 10, 8 running, 2 wanted: 8 - (8 - 2) / 2 = 5 (not 6).
        assert_eq!(decide(2.0, 10, 8), Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn cold_start_scales_from_zero_at_once() {
        let mut a = Autoscaler::new(config(0, 10));
        let now = Instant::now();
        assert_eq!(a.decide(now, 0, 0, 3.0), Some(1));
        assert_eq!(a.decide(now, 0, 0, 0.0), None);
    }

    /// Feed one load per second from `loads` (cycled) for `secs`, returning the
    /// first decision.
    fn run_pattern(
        a: &mut Autoscaler,
        start: Instant,
        secs: u64,
        loads: &[f64],
        current: u32,
    ) -> Option<(u64, u32)> {
        for s in 0..secs {
            let now = start + Duration::from_secs(s);
            a.record(now, loads[s as usize % loads.len()]);
            if let Some(n) = a.decide(now, current, current, 0.0) {
                return Some((s, n));
            }
        }
        None
    }

    #[tokio::test(start_paused = true)]
    async fn the_aggregation_function_reduces_the_look_back_window() {
        use flotilla_core::AggregationFunction::{Max, Mean, Min};
        // A spike of 30 every 10 s, idle otherwise, on 3 replicas (target 1).
        let mut spikes = vec![0.0; 10];
        spikes[0] = 30.0;
        let with = |f| AutoscalingConfig {
            aggregation_function: f,
            downscale_delay: Duration::from_secs(30),
            ..config(1, 10)
        };
        let t = Instant::now();
        // Mean: about 3 requests over the window, what 3 replicas serve: no change.
        assert_eq!(
            run_pattern(&mut Autoscaler::new(with(Mean)), t, 200, &spikes, 3),
            None
        );
        // Max: the window's peak, 30, after the upscale delay (capped at 10).
        assert_eq!(
            run_pattern(&mut Autoscaler::new(with(Max)), t, 200, &spikes, 3),
            Some((30, 10))
        );
        // Min: the trough, 0, after the downscale delay (floored at 1).
        assert_eq!(
            run_pattern(&mut Autoscaler::new(with(Min)), t, 200, &spikes, 3),
            Some((31, 1))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_replica_waits_the_downscale_to_zero_delay() {
        let c = AutoscalingConfig {
            downscale_to_zero_delay: Some(Duration::from_secs(60)),
            ..config(0, 10)
        };
        let t = Instant::now();
        // From five, the downscale delay (600 s) still applies down to one ...
        let (at, n) = run(&mut Autoscaler::new(c.clone()), t, 2_000, 0.0, 5).unwrap();
        assert_eq!((at, n), (600, 1));
        // ... and from one to none, the shorter delay.
        let (at, n) = run(&mut Autoscaler::new(c.clone()), t, 2_000, 0.0, 1).unwrap();
        assert_eq!((at, n), (60, 0));
        // A longer one holds the last replica longer than the downscale delay.
        let long = AutoscalingConfig {
            downscale_to_zero_delay: Some(Duration::from_secs(900)),
            ..config(0, 10)
        };
        let (at, n) = run(&mut Autoscaler::new(long), t, 2_000, 0.0, 1).unwrap();
        assert_eq!((at, n), (900, 0));
    }

    fn custom(f: impl Fn(&PolicyContext<'_>) -> f64 + Send + Sync + 'static) -> Policy {
        Policy::Custom {
            policy: std::sync::Arc::new(f),
            app: AppName::new("a").unwrap(),
            deployment: DeploymentName::new("d").unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_custom_policy_decides_within_the_bounds_and_delays() {
        // Wants 7 whatever the load: up after the upscale delay, clamped to 5.
        let mut a = Autoscaler::with_policy(config(1, 5), custom(|_| 7.0));
        let (at, n) = run(&mut a, Instant::now(), 100, 0.0, 2).unwrap();
        assert_eq!((at, n), (30, 5));
        // The policy sees the aggregated load, the window, the config and its kwargs.
        let kwargs = flotilla_core::Args::encode(&("scale", 3u32)).unwrap();
        let mut c = config(1, 100);
        c.policy = AutoscalingPolicy::named(ImportPath::new("p:q").unwrap()).with_kwargs(kwargs);
        let mut a = Autoscaler::with_policy(
            c,
            custom(|ctx| {
                let (_, k): (String, u32) = ctx.kwargs.decode().unwrap();
                assert_eq!(
                    ctx.samples.len() as f64 * 2.0,
                    ctx.samples.iter().sum::<f64>()
                );
                assert_eq!((ctx.current_replicas, ctx.running_replicas), (2, 2));
                f64::from(k) * ctx.total_requests
            }),
        );
        let (at, n) = run(&mut a, Instant::now(), 100, 2.0, 2).unwrap();
        assert_eq!((at, n), (30, 6));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_custom_policy_holds_the_target() {
        for policy in [custom(|_| f64::NAN), custom(|_| panic!("policy bug"))] {
            let mut a = Autoscaler::with_policy(config(1, 10), policy);
            assert_eq!(run(&mut a, Instant::now(), 1_000, 50.0, 2), None);
        }
        let mut missing = Autoscaler::with_policy(
            config(1, 10),
            Policy::Missing(ImportPath::new("x:y").unwrap()),
        );
        assert_eq!(run(&mut missing, Instant::now(), 1_000, 50.0, 2), None);
        // Cold start still wakes a deployment at zero, whatever its policy.
        let mut cold = Autoscaler::with_policy(config(0, 10), custom(|_| f64::NAN));
        assert_eq!(cold.decide(Instant::now(), 0, 0, 3.0), Some(1));
    }

    #[test]
    fn policies_resolve_through_the_registry() {
        let registry = Registry::new()
            .register_autoscaling_policy("shop.policies:eager", |_| 1.0)
            .unwrap();
        let (app, dep) = (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
        );
        let resolve = |path: &str| {
            resolve_policy(
                &registry,
                &app,
                &dep,
                &AutoscalingPolicy::named(ImportPath::new(path).unwrap()),
            )
        };
        assert!(matches!(
            resolve("ray.serve.autoscaling_policy:default_autoscaling_policy"),
            Policy::Builtin
        ));
        assert!(matches!(
            resolve("shop.policies:eager"),
            Policy::Custom { .. }
        ));
        assert!(matches!(resolve("shop.policies:gone"), Policy::Missing(_)));
    }
}
