//! Ray Serve's default autoscaling policy, as a pure state machine over virtual time.
//!
//! The DeploymentActor samples load (ongoing requests on its replicas plus requests
//! queued in handles) on a per-deployment timer and asks [`Autoscaler::decide`] for a
//! new target. The decision is made durable by the Controller before any replica
//! changes.

use std::{collections::VecDeque, time::Duration};

use flotilla_core::{AutoscalingConfig, ReplicaCount, ReplicaState};
use ractor::ActorRef;
use tokio::time::Instant;

use crate::{DeploymentEvent, DeploymentMsg, messages::InternalMsg, state::DeploymentState};

/// How often an autoscaled deployment samples its load.
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// Load samples over the look-back window and the pending decision's age.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    config: AutoscalingConfig,
    samples: VecDeque<(Instant, f64)>,
    /// The direction wanted and since when (the delay runs from there).
    pending: Option<(Direction, Instant)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Up,
    Down,
}

impl Autoscaler {
    /// A new autoscaler for `config`.
    pub fn new(config: AutoscalingConfig) -> Self {
        Autoscaler {
            config,
            samples: VecDeque::new(),
            pending: None,
        }
    }

    /// Take a new config (bounds, delays); samples are kept.
    pub fn set_config(&mut self, config: AutoscalingConfig) {
        self.config = config;
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

    fn average(&self) -> f64 {
        if self.samples.is_empty() {
            return 0.0;
        }
        self.samples.iter().map(|(_, l)| l).sum::<f64>() / self.samples.len() as f64
    }

    /// The target the policy wants now, or `None` to keep `current`.
    ///
    /// Cold start (no replica running, requests waiting) scales up at once; otherwise
    /// `desired = ceil(load / target_ongoing_requests)`, moved by the scaling
    /// factor, clamped to [min, max], and acted on only after the up- or downscale
    /// delay has passed with the same direction. Reaching zero goes through one.
    pub fn decide(
        &mut self,
        now: Instant,
        current: u32,
        running: u32,
        queued_now: f64,
    ) -> Option<u32> {
        let c = &self.config;
        if running == 0 && current == 0 && queued_now > 0.0 {
            self.pending = None;
            let up = (c.upscaling_factor.unwrap_or(1.0)).ceil().max(1.0) as u32;
            return Some(up.clamp(c.min_replicas.max(1), c.max_replicas));
        }
        let load = self.average();
        let raw = load / c.target_ongoing_requests;
        let factor = if raw > f64::from(current) {
            c.upscaling_factor.unwrap_or(1.0)
        } else {
            c.downscaling_factor.unwrap_or(1.0)
        };
        let cur = f64::from(current);
        let mut desired = (cur + factor * (raw - cur)).ceil();
        if desired >= cur && raw < cur {
            desired = cur - 1.0;
        }
        let mut desired = desired.max(0.0) as u32;
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
            Some((d, t)) if d == direction => t,
            _ => {
                self.pending = Some((direction, now));
                now
            }
        };
        let delay = match direction {
            Direction::Up => c.upscale_delay,
            Direction::Down => c.downscale_delay,
        };
        if now.duration_since(since) >= delay {
            self.pending = None;
            Some(desired)
        } else {
            None
        }
    }
}

/// Start, update or stop the autoscaler as the spec says (called on every new
/// target and at start). Only autoscaled deployments run a sampling timer.
pub(crate) fn arm(myself: &ActorRef<DeploymentMsg>, state: &mut DeploymentState) {
    match &state.args.target.spec.config.num_replicas {
        ReplicaCount::Auto(config) if !state.args.target.deleting => match &mut state.autoscaler {
            Some((a, _)) => a.set_config(config.clone()),
            None => {
                let timer =
                    myself.send_interval(SAMPLE_PERIOD, || InternalMsg::AutoscaleTick.into());
                state.autoscaler = Some((Autoscaler::new(config.clone()), timer));
            }
        },
        _ => {
            if let Some((_, timer)) = state.autoscaler.take() {
                timer.abort();
            }
        }
    }
}

/// Sample the load (ongoing requests on the published replicas plus requests
/// queued in handles, from the same counters the router uses) and report a new
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
    let queued = state.route.queued() as f64;
    let ongoing: f64 = state
        .route
        .replicas()
        .iter()
        .map(|r| f64::from(r.in_flight()))
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
        });
    }
}

#[cfg(test)]
mod tests {
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
    async fn cold_start_scales_from_zero_at_once() {
        let mut a = Autoscaler::new(config(0, 10));
        let now = Instant::now();
        assert_eq!(a.decide(now, 0, 0, 3.0), Some(1));
        assert_eq!(a.decide(now, 0, 0, 0.0), None);
    }
}
