//! Traffic: a steady request rate through `DeploymentHandle`s to every
//! application that has come up, round-robin, with a seeded mix of latencies, a
//! per-attempt timeout and retries; and the bookkeeping that says whether a
//! failed request is excused (its application was hit by a data-plane fault, or
//! the process died) or a violation (it failed while only the control plane was
//! crashing, or with no fault at all to explain it).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

use flotilla::{CallError, DeploymentHandle, Serve};
use serde::Serialize;
use tokio::time::Instant;

use crate::{
    names::AppNames,
    rng::{self, Rng},
    scenario::TrafficSpec,
    workload::Work,
};

/// Why requests to some applications may fail for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A node died with replicas of the application on it.
    NodeLoss,
    /// Replica actors of the application were killed.
    ReplicaKill,
    /// The application's health checks flapped.
    Flap,
    /// The whole process crashed.
    Process,
    /// The application was deleted.
    Deleted,
    /// A control actor crashed or a commit failed: requests must not fail.
    ControlPlane,
}

impl Cause {
    fn excuses(self) -> bool {
        self != Cause::ControlPlane
    }
}

/// A span of virtual time in which requests to some applications (all, if
/// `apps` is `None`) may fail for `cause`. Open until the system converges again.
#[derive(Debug, Clone)]
pub struct Window {
    /// Opened at (virtual seconds).
    pub start: f64,
    /// Closed at, once everything converged after it (and not before `min_end`).
    pub end: Option<f64>,
    /// Stays open at least until then.
    pub min_end: f64,
    /// Applications concerned; `None` for all.
    pub apps: Option<BTreeSet<u32>>,
    /// Why.
    pub cause: Cause,
}

impl Window {
    fn covers(&self, app: u32, from: f64, to: f64) -> bool {
        self.start <= to
            && self.end.is_none_or(|e| e >= from)
            && self.apps.as_ref().is_none_or(|a| a.contains(&app))
    }
}

/// Grace after convergence before a window closes.
const GRACE: f64 = 5.0;

/// Open windows, closed when the sampler sees the system converged.
#[derive(Debug, Default)]
pub struct Windows(Mutex<Vec<Window>>);

impl Windows {
    /// Open a window at `start` for at least `min_len` seconds.
    pub fn open(&self, start: f64, min_len: f64, apps: Option<BTreeSet<u32>>, cause: Cause) {
        self.lock().push(Window {
            start,
            end: None,
            min_end: start + min_len,
            apps,
            cause,
        });
    }

    /// Everything converged at `now`: close the open windows (after a grace, and
    /// not before their minimum length).
    pub fn converged(&self, now: f64) {
        for w in self.lock().iter_mut().filter(|w| w.end.is_none()) {
            if now >= w.min_end {
                w.end = Some(now + GRACE);
            }
        }
    }

    /// Whether any window is still open.
    pub fn any_open(&self) -> bool {
        self.lock().iter().any(|w| w.end.is_none())
    }

    fn classify(&self, app: u32, from: f64, to: f64) -> Option<Cause> {
        let ws = self.lock();
        let hits = ws.iter().filter(|w| w.covers(app, from, to));
        let mut control = false;
        let mut best: Option<Cause> = None;
        for w in hits {
            if w.cause.excuses() {
                best = Some(best.map_or(w.cause, |b| b.min(w.cause)));
            } else {
                control = true;
            }
        }
        best.or(control.then_some(Cause::ControlPlane))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Window>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Request counters (cumulative), plus the per-sample buckets the timeline reads.
#[derive(Debug, Default)]
pub struct TrafficStats {
    sent: AtomicU64,
    served: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    in_flight: AtomicI64,
    bucket_served: AtomicU64,
    bucket_failed: AtomicU64,
    bucket_retried: AtomicU64,
    detail: Mutex<FailureDetail>,
}

#[derive(Debug, Default, Clone)]
struct FailureDetail {
    excused: BTreeMap<Cause, u64>,
    control_plane: u64,
    unexplained: u64,
    by_error: BTreeMap<String, u64>,
    examples: Vec<String>,
}

/// What the summary reports about requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequestCounts {
    /// Requests sent.
    pub sent: u64,
    /// Answered (possibly after retries).
    pub served: u64,
    /// Failed after every attempt.
    pub failed: u64,
    /// Retry attempts made.
    pub retried: u64,
    /// Failures excused by a fault that hit their application, by cause.
    pub failed_excused: BTreeMap<Cause, u64>,
    /// Failures while only the control plane was crashing (must be 0).
    pub failed_during_control_plane_crashes: u64,
    /// Failures with no fault to explain them (must be 0).
    pub failed_unexplained: u64,
    /// Failures by the last error's kind.
    pub failed_by_error: BTreeMap<String, u64>,
    /// A few failures not excused by a data-plane fault, for diagnosis.
    pub unexcused_examples: Vec<String>,
}

impl TrafficStats {
    /// The counts so far.
    pub fn counts(&self) -> RequestCounts {
        let d = self
            .detail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        RequestCounts {
            sent: self.sent.load(Ordering::Relaxed),
            served: self.served.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            failed_excused: d.excused,
            failed_during_control_plane_crashes: d.control_plane,
            failed_unexplained: d.unexplained,
            failed_by_error: d.by_error,
            unexcused_examples: d.examples,
        }
    }

    /// Served, failed and retried since the last call (for rates per second).
    pub fn take_bucket(&self) -> (u64, u64, u64) {
        (
            self.bucket_served.swap(0, Ordering::Relaxed),
            self.bucket_failed.swap(0, Ordering::Relaxed),
            self.bucket_retried.swap(0, Ordering::Relaxed),
        )
    }

    /// Requests still running.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// Where requests get their handles: the live Serve (none while the process
/// restarts), handles cached per application and dropped when Serve changes.
#[derive(Debug, Default)]
pub struct Handles {
    inner: Mutex<HandleCache>,
}

#[derive(Debug, Default)]
struct HandleCache {
    serve: Option<Serve>,
    handles: HashMap<u32, DeploymentHandle>,
}

impl Handles {
    /// Route through `serve` from now on (`None`: the process is down).
    pub fn set_serve(&self, serve: Option<Serve>) {
        let mut c = self.lock();
        c.serve = serve;
        c.handles.clear();
    }

    /// The live Serve, if any.
    pub fn serve(&self) -> Option<Serve> {
        self.lock().serve.clone()
    }

    fn handle(&self, app: u32, names: &AppNames) -> Option<DeploymentHandle> {
        let mut c = self.lock();
        if let Some(h) = c.handles.get(&app) {
            return Some(h.clone());
        }
        let h = c.serve.as_ref()?.app_handle(&names.name(app)).ok()?;
        c.handles.insert(app, h.clone());
        Some(h)
    }

    fn forget(&self, app: u32) {
        self.lock().handles.remove(&app);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HandleCache> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Which applications take traffic: those that have been RUNNING once and are
/// not deleted.
#[derive(Debug, Default)]
pub struct Ready(Mutex<Vec<bool>>);

impl Ready {
    /// Set whether `app` takes traffic.
    pub fn set(&self, app: u32, ready: bool) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let i = app as usize;
        if v.len() <= i {
            v.resize(i + 1, false);
        }
        v[i] = ready;
    }

    /// The next ready application at or after `from` (cyclic).
    fn next(&self, from: usize) -> Option<usize> {
        let v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = v.len();
        (0..n).map(|k| (from + k) % n).find(|i| v[*i])
    }
}

/// Everything a request task needs.
#[derive(Debug)]
pub struct TrafficCtx {
    /// The traffic shape.
    pub spec: TrafficSpec,
    /// The run's seed.
    pub seed: u64,
    /// When the run started (virtual).
    pub start: Instant,
    /// Counters.
    pub stats: TrafficStats,
    /// Handles.
    pub handles: Handles,
    /// Applications taking traffic.
    pub ready: Ready,
    /// Fault windows.
    pub windows: Windows,
    /// Application names by index.
    pub names: Arc<AppNames>,
}

impl TrafficCtx {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

fn error_kind(e: &CallError) -> &'static str {
    match e {
        CallError::User(_) => "user",
        CallError::Panicked(_) => "panicked",
        CallError::Killed { .. } => "killed",
        CallError::NodeLost { .. } => "node_lost",
        CallError::BadRequest(_) => "bad_request",
        CallError::BadResponse(_) => "bad_response",
        CallError::BackPressure { .. } => "back_pressure",
        CallError::NotFound { .. } => "not_found",
        CallError::Unavailable { .. } => "unavailable",
        CallError::DeployFailed { .. } => "deploy_failed",
        CallError::Timeout { .. } => "timeout",
        CallError::BatchSize { .. } => "batch_size",
        CallError::ModelLoad { .. } => "model_load",
    }
}

/// Send requests at the spec's rate until `until`, round-robin over the ready
/// applications; returns once every request has finished.
pub async fn generate(ctx: Arc<TrafficCtx>, until: Instant) {
    let tick = Duration::from_millis(100);
    let per_tick = ctx.spec.rate * tick.as_secs_f64();
    let total_weight: f64 = ctx.spec.latencies.iter().map(|c| c.weight).sum();
    let mut carry = 0.0;
    let mut next_app = 0usize;
    let mut req: u64 = 0;
    let mut at = Instant::now();
    while at < until {
        carry += per_tick;
        let n = carry.floor();
        carry -= n;
        for _ in 0..n as u64 {
            let Some(app) = ctx.ready.next(next_app) else {
                break;
            };
            next_app = app + 1;
            req += 1;
            let mut r = Rng::keyed(ctx.seed, &[rng::label("request"), req]);
            let mut x = r.unit() * total_weight;
            let mut ms = 0;
            for c in &ctx.spec.latencies {
                ms = c.latency.as_millis() as u64;
                if x < c.weight {
                    break;
                }
                x -= c.weight;
            }
            ctx.stats.sent.fetch_add(1, Ordering::Relaxed);
            ctx.stats.in_flight.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(request(ctx.clone(), app as u32, ms));
        }
        at += tick;
        tokio::time::sleep_until(at).await;
    }
    while ctx.stats.in_flight() > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn request(ctx: Arc<TrafficCtx>, app: u32, ms: u64) {
    let issued = ctx.now();
    // The last attempt's error: its kind, and the whole of it.
    let (mut kind, mut last) = ("unavailable", String::from("unavailable"));
    for attempt in 0..ctx.spec.attempts {
        if attempt > 0 {
            ctx.stats.retried.fetch_add(1, Ordering::Relaxed);
            ctx.stats.bucket_retried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(ctx.spec.retry_backoff).await;
        }
        let Some(h) = ctx.handles.handle(app, &ctx.names) else {
            (kind, last) = ("unavailable", "unavailable".into());
            continue;
        };
        match h
            .with_timeout(ctx.spec.timeout)
            .call::<_, u64>(&Work { ms })
            .await
        {
            Ok(_) => {
                ctx.stats.served.fetch_add(1, Ordering::Relaxed);
                ctx.stats.bucket_served.fetch_add(1, Ordering::Relaxed);
                ctx.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
                return;
            }
            Err(e) => {
                if matches!(e, CallError::NotFound { .. }) {
                    ctx.handles.forget(app);
                }
                kind = error_kind(&e);
                last = format!("{kind}: {e}");
            }
        }
    }
    let done = ctx.now();
    ctx.stats.failed.fetch_add(1, Ordering::Relaxed);
    ctx.stats.bucket_failed.fetch_add(1, Ordering::Relaxed);
    let cause = ctx.windows.classify(app, issued, done);
    {
        let mut d = ctx.stats.detail.lock().unwrap_or_else(|p| p.into_inner());
        *d.by_error.entry(kind.to_owned()).or_insert(0) += 1;
        match cause {
            Some(Cause::ControlPlane) => d.control_plane += 1,
            Some(c) => *d.excused.entry(c).or_insert(0) += 1,
            None => d.unexplained += 1,
        }
        if !matches!(cause, Some(c) if c.excuses()) && d.examples.len() < 5 {
            d.examples.push(format!(
                "{} issued at {issued:.1}s, failed at {done:.1}s: {last}",
                ctx.names.name(app)
            ));
        }
    }
    ctx.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_excuse_data_plane_faults_and_flag_control_plane_ones() {
        let w = Windows::default();
        w.open(10.0, 30.0, Some([1].into()), Cause::NodeLoss);
        w.open(12.0, 30.0, None, Cause::ControlPlane);
        assert_eq!(w.classify(1, 11.0, 15.0), Some(Cause::NodeLoss));
        assert_eq!(w.classify(2, 11.0, 15.0), Some(Cause::ControlPlane));
        assert_eq!(w.classify(2, 1.0, 5.0), None);
        w.converged(20.0);
        assert!(w.any_open(), "not before the minimum length");
        w.converged(50.0);
        assert!(!w.any_open());
        assert_eq!(w.classify(2, 60.0, 61.0), None);
        assert_eq!(w.classify(1, 54.0, 61.0), Some(Cause::NodeLoss));
    }
}
