//! The timeline: the sampler that reads the system every `sample_every` of
//! virtual time (statuses against the model, replicas, request rates, live
//! nodes), decides convergence, follows each event until the system converged
//! after it, and drives the progress bar.

use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::Ordering},
};

use flotilla::ApplicationStatus;
use serde::Serialize;

use super::{
    model::{Expect, Slot},
    round3,
    shared::{Shared, record_metrics},
    watchdog::Heartbeat,
};
use crate::faults::Level;

/// One timeline sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Virtual seconds from the start.
    pub t: f64,
    /// Replicas serving (published to routes).
    pub running: usize,
    /// Replica constructors running.
    pub starting: u64,
    /// Replicas holding a cluster reservation (starting, running or stopping).
    pub placed: usize,
    /// Applications by status.
    pub apps: BTreeMap<String, usize>,
    /// Applications as expected.
    pub as_expected: usize,
    /// Applications deployed so far (expected somewhere).
    pub known: usize,
    /// Requests served per second over the last interval.
    pub served_per_s: f64,
    /// Requests failed per second over the last interval.
    pub failed_per_s: f64,
    /// Retry attempts per second over the last interval.
    pub retried_per_s: f64,
    /// Live nodes.
    pub live_nodes: usize,
    /// CPUs the live nodes offer.
    pub cpus: f64,
    /// CPUs reserved by replicas.
    pub cpus_used: f64,
}

/// An event on the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mark {
    /// Virtual seconds from the start.
    pub t: f64,
    /// Short label.
    pub label: String,
    /// What it hit.
    pub level: Level,
}

/// The run over virtual time, for the report's picture.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// Samples, in time order.
    pub samples: Vec<Sample>,
    /// Events, in time order.
    pub marks: Vec<Mark>,
    /// When the event schedule ended (virtual seconds).
    pub run_end: f64,
}

/// Sample every `sample_every` of virtual time until told to stop.
pub(super) async fn sample_loop(shared: Arc<Shared>, beat: Arc<Heartbeat>) {
    let every = shared.scenario.sample_every;
    let mut next = shared.start;
    loop {
        next += every;
        tokio::time::sleep_until(next).await;
        if shared.stop_sampler.load(Ordering::Acquire) {
            return;
        }
        beat.sampled(shared.start.elapsed().as_millis() as u64);
        sample(&shared, every.as_secs_f64()).await;
    }
}

/// Take one sample (`interval`: virtual seconds since the last).
async fn sample(shared: &Shared, interval: f64) {
    let t = shared.now();
    let serve = shared.handles().serve();
    let (statuses, running) = match &serve {
        Some(s) => (s.status(), record_metrics(shared, s).await),
        None => (Vec::new(), Some(0)),
    };
    let mut apps: BTreeMap<String, usize> = BTreeMap::new();
    let (as_expected, known, not_as_expected) = {
        let m = shared.model();
        let names = shared.world.names();
        let mut absent_listed = 0usize;
        let mut matched = 0usize;
        for (name, info) in &statuses {
            *apps.entry(info.status.to_string()).or_insert(0) += 1;
            let Some(idx) = names.index(name.as_str()) else {
                continue;
            };
            let expect = m.expect(idx);
            match (expect, info.status) {
                (Expect::Running, ApplicationStatus::Running) => {
                    matched += 1;
                    if matches!(m.slot(idx), Slot::Present(_)) {
                        shared.ready().set(idx, true);
                    }
                }
                (Expect::DeployFailed, ApplicationStatus::DeployFailed) => matched += 1,
                (Expect::Absent, _) => absent_listed += 1,
                _ => {}
            }
        }
        let absent = m.deleted();
        let ok = matched + absent.saturating_sub(absent_listed);
        let known = m.known();
        (ok, known, known.saturating_sub(ok))
    };
    let converged = known > 0 && not_as_expected == 0;
    let (served, failed, retried) = shared.traffic.stats.take_bucket();
    let view = shared.cluster.view();
    let wall = shared.wall0.elapsed().as_secs_f64();
    let mut o = shared.observed();
    let running = running.unwrap_or(o.last_running);
    o.last_running = running;
    o.samples.push(Sample {
        t: round3(t),
        running,
        starting: shared.world.constructing(),
        placed: view.reserved,
        apps,
        as_expected,
        known,
        served_per_s: served as f64 / interval,
        failed_per_s: failed as f64 / interval,
        retried_per_s: retried as f64 / interval,
        live_nodes: view.live_nodes,
        // Rounded: float sums of reservations differ in their last bits with the
        // order replicas were placed and released in.
        cpus: round3(view.cpus),
        cpus_used: round3(view.cpus_used),
    });
    if converged {
        shared.windows().converged(t);
        if o.initial_acked && o.initial_at.is_none() {
            o.initial_at = Some((round3(t), wall));
        }
        if let (Some((_, from)), None) = (o.settle_from, o.final_at) {
            o.final_at = Some((round3(t), wall - from));
        }
    }
    // Follow each event until everything converged after it.
    let mut follows = std::mem::take(&mut o.follows);
    follows.retain_mut(|f| {
        let Some(rec) = o.records.get_mut(f.record) else {
            return false;
        };
        if !converged {
            f.disturbed = true;
            rec.disturbed_apps = rec.disturbed_apps.max(not_as_expected);
            return true;
        }
        if f.disturbed {
            rec.converged_after_s = Some(round3(t - f.at));
            return false;
        }
        if t >= f.quiet_until {
            rec.converged_after_s = Some(0.0);
            return false;
        }
        true
    });
    o.follows = follows;
    let initial_done = o.initial_at.is_some();
    let settling = o.settle_from.is_some();
    drop(o);
    if let Some(p) = &shared.progress {
        if initial_done && !settling {
            // During the event schedule: virtual seconds of it.
            if p.length() != Some(shared.scenario.duration.as_secs()) {
                p.set_prefix("faults");
                p.set_length(shared.scenario.duration.as_secs());
            }
            p.set_position(t as u64);
        } else {
            // Deploying or settling: applications as expected.
            p.set_length(known.max(1) as u64);
            p.set_position(as_expected as u64);
        }
    }
}
