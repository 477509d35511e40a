//! What the driver shares with the sampler: the scenario, the simulated world,
//! the model, and what the run has observed so far (samples, event records,
//! Flotilla's metrics folded per process).

use std::{
    sync::{Arc, Mutex, MutexGuard, atomic::AtomicBool},
    time::Duration,
};

use flotilla::Serve;
use indicatif::ProgressBar;
use tokio::time::Instant;

use super::{
    model::Model,
    timeline::{Mark, Sample},
};
use crate::{
    cluster::SimCluster,
    scenario::Scenario,
    summary::EventRecord,
    traffic::{Handles, Ready, TrafficCtx, Windows},
    workload::World,
};

/// Per-process (Serve instance) counters read from `metrics()`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ProcessCounters {
    pub(super) controller_restarts: u64,
    pub(super) app_restarts_done: u64,
    pub(super) app_restarts_now: u64,
    pub(super) commits: u64,
    pub(super) keys: u64,
    pub(super) bytes: u64,
}

/// An event record being followed until the system converges again.
#[derive(Debug)]
pub(super) struct Follow {
    pub(super) record: usize,
    pub(super) at: f64,
    /// Counts as absorbed if nothing is disturbed until then.
    pub(super) quiet_until: f64,
    pub(super) disturbed: bool,
}

/// What the run has seen so far.
#[derive(Debug, Default)]
pub(super) struct Observed {
    pub(super) samples: Vec<Sample>,
    pub(super) marks: Vec<Mark>,
    pub(super) records: Vec<EventRecord>,
    pub(super) follows: Vec<Follow>,
    pub(super) processes: Vec<ProcessCounters>,
    pub(super) initial_acked: bool,
    pub(super) initial_at: Option<(f64, f64)>,
    pub(super) settle_from: Option<(f64, f64)>,
    pub(super) final_at: Option<(f64, f64)>,
    pub(super) last_running: usize,
    pub(super) fatal: Vec<String>,
    /// Control-plane faults the schedule armed that never fired (no message
    /// passed their point before the process crashed or the run ended).
    pub(super) unfired: Vec<String>,
}

/// State the driver and the sampler share.
pub(super) struct Shared {
    pub(super) scenario: Scenario,
    pub(super) start: Instant,
    pub(super) wall0: std::time::Instant,
    pub(super) world: Arc<World>,
    pub(super) cluster: Arc<SimCluster>,
    pub(super) traffic: Arc<TrafficCtx>,
    pub(super) model: Mutex<Model>,
    pub(super) observed: Mutex<Observed>,
    pub(super) progress: Option<ProgressBar>,
    pub(super) stop_sampler: AtomicBool,
}

impl Shared {
    /// Virtual seconds since the start.
    pub(super) fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// The model, locked.
    pub(super) fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What was observed, locked.
    pub(super) fn observed(&self) -> MutexGuard<'_, Observed> {
        self.observed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fault windows.
    pub(super) fn windows(&self) -> &Windows {
        &self.traffic.windows
    }

    /// Which applications take traffic.
    pub(super) fn ready(&self) -> &Ready {
        &self.traffic.ready
    }

    /// The live Serve and its handles.
    pub(super) fn handles(&self) -> &Handles {
        &self.traffic.handles
    }

    /// Show `msg` beside the progress bar.
    pub(super) fn say(&self, msg: String) {
        if let Some(p) = &self.progress {
            p.set_message(msg);
        }
    }
}

/// Fold `serve`'s metrics into the counters of the latest process.
pub(super) async fn record_metrics(shared: &Shared, serve: &Serve) -> Option<usize> {
    let m = tokio::time::timeout(Duration::from_secs(5), serve.metrics())
        .await
        .ok()?
        .ok()?;
    let mut o = shared.observed();
    let p = o.processes.last_mut()?;
    p.controller_restarts = p.controller_restarts.max(m.controller_restarts);
    let app_restarts = m.controller.app_restarts;
    if app_restarts < p.app_restarts_now {
        // A new Controller life: its count started again from zero.
        p.app_restarts_done += p.app_restarts_now;
    }
    p.app_restarts_now = app_restarts;
    p.commits = p.commits.max(m.store.commits);
    p.keys = p.keys.max(m.store.keys_written);
    p.bytes = p.bytes.max(m.store.bytes_written);
    Some(m.running_replicas)
}
