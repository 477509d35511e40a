//! What a replica's data plane counts, for `/metrics` (Ray's replica,
//! batching and multiplexing series): request counters, batch figures and
//! model loads, each recorded with relaxed atomic adds on the path it
//! measures (no message, no lock) and read at scrape time. A replica in
//! another process has its batch and model figures reported by its process
//! as counts ([`BatchCounts`], [`ModelCounts`]), which its endpoint here
//! mirrors.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use serde::{Deserialize, Serialize};

/// Ray Serve's request latency buckets in milliseconds
/// (`REQUEST_LATENCY_BUCKETS_MS`, `serve/_private/constants.py`); every latency
/// histogram of the data plane uses them, plus `+Inf`.
pub const LATENCY_BUCKETS_MS: [f64; 19] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 300.0, 400.0, 500.0, 1_000.0, 2_000.0, 5_000.0,
    10_000.0, 60_000.0, 120_000.0, 300_000.0, 600_000.0,
];

/// The buckets of `ray_serve_actual_batch_size`: powers of two (Ray's
/// `BATCH_SIZE_BUCKETS` are configurable; these are Flotilla's).
pub const BATCH_SIZE_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1_024.0,
];

/// The buckets of `ray_serve_batch_utilization_percent` (a batch's size over
/// its `max_batch_size`, in percent).
pub const BATCH_UTILIZATION_BUCKETS_PERCENT: [f64; 12] = [
    5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 100.0,
];

/// A histogram over fixed bucket bounds made of atomics: recording is a
/// handful of relaxed atomic adds, never a lock, so it sits on the request
/// path. Exporters read it at scrape time with [`snapshot`](Self::snapshot).
///
/// ```
/// use flotilla_replica::{BATCH_SIZE_BUCKETS, Histogram};
/// let h = Histogram::new(&BATCH_SIZE_BUCKETS);
/// h.observe(3.0);
/// let s = h.snapshot();
/// assert_eq!((s.count, s.buckets[2], s.sum), (1, 1, 3.0)); // in the (2, 4] bucket
/// ```
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per-bucket (not cumulative) counts, one per bound and a last for `+Inf`.
    buckets: Box<[AtomicU64]>,
    /// The sum of every observation, in millionths.
    sum_micros: AtomicU64,
}

/// What a [`Histogram`] holds at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// The buckets' upper bounds (`+Inf` left out).
    pub bounds: &'static [f64],
    /// Per-bucket counts (not cumulative), one per bound and a last one for
    /// `+Inf`.
    pub buckets: Vec<u64>,
    /// The number of observations.
    pub count: u64,
    /// The sum of the observations.
    pub sum: f64,
}

impl HistogramSnapshot {
    /// `(upper bound, per-bucket count)` pairs, `+Inf` last: the shape
    /// Prometheus exporters take.
    pub fn pairs(&self) -> Vec<(f64, u64)> {
        (self.bounds.iter().copied())
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.buckets.iter().copied())
            .collect()
    }
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Record one observation (a negative or NaN one counts as 0; an
    /// infinite one goes to the `+Inf` bucket and adds nothing to the sum).
    pub fn observe(&self, value: f64) {
        let value = if value.is_nan() { 0.0 } else { value.max(0.0) };
        let i = self.bounds.partition_point(|b| *b < value);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        if value.is_finite() {
            // The cast saturates; the sum wraps only past 2^64 millionths
            // (584 years of latencies in milliseconds).
            self.sum_micros
                .fetch_add((value * 1e6) as u64, Ordering::Relaxed);
        }
    }

    /// Read every bucket (each read is atomic; the set is not a transaction,
    /// which a scrape tolerates: the next scrape is consistent again).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        HistogramSnapshot {
            bounds: self.bounds,
            count: buckets.iter().sum(),
            buckets,
            sum: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

/// A [`Histogram`]'s counts as they cross between processes (its bounds are
/// the histogram's own, which both sides know).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramCounts {
    /// Per-bucket counts (not cumulative), `+Inf` last.
    pub buckets: Vec<u64>,
    /// The sum of the observations, in millionths.
    pub sum_micros: u64,
}

impl Histogram {
    /// Its counts, to report to another process.
    pub fn counts(&self) -> HistogramCounts {
        HistogramCounts {
            buckets: (self.buckets.iter())
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }

    /// Hold `counts` in place of its own: the mirror of a histogram in
    /// another process. Counts of another shape (more or fewer buckets) are
    /// not this histogram's: they are ignored.
    pub(crate) fn set_counts(&self, counts: &HistogramCounts) {
        if counts.buckets.len() != self.buckets.len() {
            return;
        }
        for (b, n) in self.buckets.iter().zip(&counts.buckets) {
            b.store(*n, Ordering::Relaxed);
        }
        self.sum_micros.store(counts.sum_micros, Ordering::Relaxed);
    }
}

/// A latency [`Histogram`] over [`LATENCY_BUCKETS_MS`], in milliseconds.
///
/// ```
/// use std::time::Duration;
/// use flotilla_replica::LatencyHistogram;
/// let h = LatencyHistogram::default();
/// h.record(Duration::from_micros(1_500));
/// let s = h.snapshot();
/// assert_eq!((s.count, s.buckets[1]), (1, 1)); // in the (1 ms, 2 ms] bucket
/// ```
#[derive(Debug)]
pub struct LatencyHistogram(Histogram);

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram(Histogram::new(&LATENCY_BUCKETS_MS))
    }
}

impl LatencyHistogram {
    /// Record one latency.
    pub fn record(&self, latency: Duration) {
        self.0.observe(latency.as_secs_f64() * 1_000.0);
    }

    /// Read every bucket (the sum in milliseconds).
    pub fn snapshot(&self) -> HistogramSnapshot {
        self.0.snapshot()
    }

    fn counts(&self) -> HistogramCounts {
        self.0.counts()
    }

    fn set_counts(&self, counts: &HistogramCounts) {
        self.0.set_counts(counts);
    }
}

/// How a request on a replica failed, for the error counter's `exception_type`
/// label (Ray labels it with the Python exception's class name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The user's handler returned an error (`UserError`).
    User,
    /// The user's handler panicked (`Panicked`).
    Panicked,
    /// The replica was killed while the request ran (`Killed`).
    Killed,
    /// The request could not be decoded (`BadRequest`).
    BadRequest,
    /// The response could not be encoded (`BadResponse`).
    BadResponse,
}

impl ErrorKind {
    /// Every kind, in label order.
    pub const ALL: [ErrorKind; 5] = [
        ErrorKind::User,
        ErrorKind::Panicked,
        ErrorKind::Killed,
        ErrorKind::BadRequest,
        ErrorKind::BadResponse,
    ];

    /// The `exception_type` label value.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::User => "UserError",
            ErrorKind::Panicked => "Panicked",
            ErrorKind::Killed => "Killed",
            ErrorKind::BadRequest => "BadRequest",
            ErrorKind::BadResponse => "BadResponse",
        }
    }

    /// The kind of a failed call that ran on a replica; `None` for failures
    /// that never reached one (queueing, routing, timeouts).
    pub fn of(error: &crate::CallError) -> Option<ErrorKind> {
        use crate::CallError as E;
        match error {
            E::User(_) => Some(ErrorKind::User),
            E::Panicked(_) => Some(ErrorKind::Panicked),
            E::Killed { .. } | E::NodeLost { .. } => Some(ErrorKind::Killed),
            E::BadRequest(_) => Some(ErrorKind::BadRequest),
            E::BadResponse(_) => Some(ErrorKind::BadResponse),
            // User code's doing: a batch handler's wrong length, a failed loader.
            E::BatchSize { .. } | E::ModelLoad { .. } => Some(ErrorKind::User),
            E::BackPressure { .. }
            | E::NotFound { .. }
            | E::Unavailable { .. }
            | E::DeployFailed { .. }
            | E::Timeout { .. } => None,
        }
    }
}

/// One replica's request counters (Ray's `serve_deployment_request_counter`,
/// `serve_deployment_error_counter` and `serve_deployment_processing_latency_ms`),
/// kept on its [`ReplicaEndpoint`](crate::ReplicaEndpoint) and recorded by
/// the caller's task with atomic adds: no message and no lock per request.
#[derive(Debug, Default)]
pub struct ReplicaStats {
    ok: AtomicU64,
    errors: [AtomicU64; ErrorKind::ALL.len()],
    /// Requests cancelled by their caller (a dropped future or stream).
    cancelled: AtomicU64,
    latency: LatencyHistogram,
}

impl ReplicaStats {
    /// Record one finished request that ran for `elapsed`.
    pub(crate) fn record(&self, result: Result<(), ErrorKind>, elapsed: Duration) {
        match result {
            Ok(()) => self.ok.fetch_add(1, Ordering::Relaxed),
            Err(kind) => self.errors[kind as usize].fetch_add(1, Ordering::Relaxed),
        };
        self.latency.record(elapsed);
    }

    /// Record a request its caller dropped after `elapsed`.
    pub(crate) fn record_cancelled(&self, elapsed: Duration) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
        self.latency.record(elapsed);
    }

    /// Requests that succeeded.
    pub fn succeeded(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Requests that failed with `kind`.
    pub fn failed(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    /// Requests whose caller went away before they finished (their handler was
    /// cancelled).
    pub fn cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// The processing latency of every finished or cancelled request.
    pub fn latency(&self) -> &LatencyHistogram {
        &self.latency
    }
}

/// One replica's batch figures (Ray's `_BatchQueue` metrics), kept by its
/// batcher.
#[derive(Debug)]
pub struct BatchStats {
    /// How long each batch waited to fill, from its first request.
    wait: LatencyHistogram,
    /// How long each batch's handler ran.
    execution: LatencyHistogram,
    /// How many requests each batch handed over.
    size: Histogram,
    /// Each batch's size over its `max_batch_size`, in percent.
    utilization: Histogram,
    /// Batches handed to the handler.
    processed: AtomicU64,
    /// Requests waiting in the batcher's queue, not yet taken into a batch.
    queued: AtomicU64,
}

impl Default for BatchStats {
    fn default() -> Self {
        BatchStats {
            wait: LatencyHistogram::default(),
            execution: LatencyHistogram::default(),
            size: Histogram::new(&BATCH_SIZE_BUCKETS),
            utilization: Histogram::new(&BATCH_UTILIZATION_BUCKETS_PERCENT),
            processed: AtomicU64::new(0),
            queued: AtomicU64::new(0),
        }
    }
}

impl BatchStats {
    /// A batch formed after waiting `waited` for requests.
    pub(crate) fn formed(&self, waited: Duration) {
        self.wait.record(waited);
    }

    /// A batch of `size` requests (of at most `max`) starts.
    pub(crate) fn started(&self, size: usize, max: u32) {
        self.size.observe(size as f64);
        self.utilization
            .observe(size as f64 * 100.0 / f64::from(max.max(1)));
        self.processed.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch's handler ran for `ran` (to its end, or until it was cut).
    pub(crate) fn ran(&self, ran: Duration) {
        self.execution.record(ran);
    }

    /// One more request waits in the batcher.
    pub(crate) fn queue(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }

    /// A request left the queue (taken into a batch, or dropped).
    pub(crate) fn dequeue(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }

    /// How long batches waited to fill (`ray_serve_batch_wait_time_ms`).
    pub fn wait(&self) -> &LatencyHistogram {
        &self.wait
    }

    /// How long batch handlers ran (`ray_serve_batch_execution_time_ms`).
    pub fn execution(&self) -> &LatencyHistogram {
        &self.execution
    }

    /// The batches' sizes (`ray_serve_actual_batch_size`).
    pub fn size(&self) -> &Histogram {
        &self.size
    }

    /// The batches' sizes over `max_batch_size`, in percent
    /// (`ray_serve_batch_utilization_percent`).
    pub fn utilization(&self) -> &Histogram {
        &self.utilization
    }

    /// Batches handed to the handler (`ray_serve_batches_processed`).
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Requests waiting in the batcher's queue now, not yet taken into a
    /// batch (`ray_serve_batch_queue_length`, Ray's `qsize`).
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }
}

/// A [`BatchStats`]'s figures as they cross between processes: a node
/// reports its replicas' to the head, whose `/metrics` exports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCounts {
    /// [`BatchStats::wait`].
    pub wait: HistogramCounts,
    /// [`BatchStats::execution`].
    pub execution: HistogramCounts,
    /// [`BatchStats::size`].
    pub size: HistogramCounts,
    /// [`BatchStats::utilization`].
    pub utilization: HistogramCounts,
    /// [`BatchStats::processed`].
    pub processed: u64,
    /// [`BatchStats::queued`].
    pub queued: u64,
}

impl BatchStats {
    /// Its figures, to report to another process.
    pub fn counts(&self) -> BatchCounts {
        BatchCounts {
            wait: self.wait.counts(),
            execution: self.execution.counts(),
            size: self.size.counts(),
            utilization: self.utilization.counts(),
            processed: self.processed(),
            queued: self.queued(),
        }
    }

    /// Hold `counts` in place of its own: the mirror of a batcher in another
    /// process.
    pub(crate) fn set_counts(&self, counts: &BatchCounts) {
        self.wait.set_counts(&counts.wait);
        self.execution.set_counts(&counts.execution);
        self.size.set_counts(&counts.size);
        self.utilization.set_counts(&counts.utilization);
        self.processed.store(counts.processed, Ordering::Relaxed);
        self.queued.store(counts.queued, Ordering::Relaxed);
    }
}

/// A [`ModelStats`]'s figures as they cross between processes (see
/// [`BatchCounts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCounts {
    /// [`ModelStats::requests`].
    pub requests: u64,
    /// [`ModelStats::loads`].
    pub loads: u64,
    /// [`ModelStats::unloads`].
    pub unloads: u64,
    /// [`ModelStats::load_latency`].
    pub load_latency: HistogramCounts,
    /// [`ModelStats::unload_latency`].
    pub unload_latency: HistogramCounts,
}

impl ModelStats {
    /// Its figures, to report to another process.
    pub fn counts(&self) -> ModelCounts {
        ModelCounts {
            requests: self.requests(),
            loads: self.loads(),
            unloads: self.unloads(),
            load_latency: self.load_latency.counts(),
            unload_latency: self.unload_latency.counts(),
        }
    }

    /// Hold `counts` in place of its own: the mirror of a model cache in
    /// another process.
    pub(crate) fn set_counts(&self, counts: &ModelCounts) {
        self.requests.store(counts.requests, Ordering::Relaxed);
        self.loads.store(counts.loads, Ordering::Relaxed);
        self.unloads.store(counts.unloads, Ordering::Relaxed);
        self.load_latency.set_counts(&counts.load_latency);
        self.unload_latency.set_counts(&counts.unload_latency);
    }
}

/// One replica's model figures (Ray's `_ModelMultiplexWrapper` metrics),
/// kept by its model cache.
#[derive(Debug, Default)]
pub struct ModelStats {
    /// Requests that asked the cache for their model.
    requests: AtomicU64,
    /// Models loaded.
    loads: AtomicU64,
    /// Models unloaded.
    unloads: AtomicU64,
    /// How long each load took.
    load_latency: LatencyHistogram,
    /// How long each unload took.
    unload_latency: LatencyHistogram,
}

impl ModelStats {
    /// A request asked for its model.
    pub(crate) fn asked(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A load starts (counted whatever its outcome, as Ray's).
    pub(crate) fn loading(&self) {
        self.loads.fetch_add(1, Ordering::Relaxed);
    }

    /// A model loaded in `took`.
    pub(crate) fn loaded(&self, took: Duration) {
        self.load_latency.record(took);
    }

    /// An unload starts (counted whatever its outcome, as Ray's).
    pub(crate) fn unloading(&self) {
        self.unloads.fetch_add(1, Ordering::Relaxed);
    }

    /// A model unloaded in `took`.
    pub(crate) fn unloaded(&self, took: Duration) {
        self.unload_latency.record(took);
    }

    /// Requests that asked for their model
    /// (`ray_serve_multiplexed_get_model_requests_counter`).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Loads started, failed ones too (`ray_serve_multiplexed_models_load_counter`).
    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }

    /// Unloads started (`ray_serve_multiplexed_models_unload_counter`).
    pub fn unloads(&self) -> u64 {
        self.unloads.load(Ordering::Relaxed)
    }

    /// How long successful loads took
    /// (`ray_serve_multiplexed_model_load_latency_ms`).
    pub fn load_latency(&self) -> &LatencyHistogram {
        &self.load_latency
    }

    /// How long successful unloads took
    /// (`ray_serve_multiplexed_model_unload_latency_ms`).
    pub fn unload_latency(&self) -> &LatencyHistogram {
        &self.unload_latency
    }
}
