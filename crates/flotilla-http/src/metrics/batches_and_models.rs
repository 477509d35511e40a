//! The batching and multiplexing series of one scrape (Ray's `_BatchQueue`
//! and `_ModelMultiplexWrapper` metrics), per replica: read from each
//! replica's batcher and model cache in this process. A replica on a node
//! batches and loads there: its loaded model ids are mirrored here by
//! subscription, and its batch and load figures as its node last reported
//! them (with its heartbeats, when they change).

use flotilla::{HistogramSnapshot, ReplicaEndpoint};
use prometheus_client::{encoding::DescriptorEncoder, metrics::MetricType};

use super::{DeploymentFigures, family, replica_labels};

/// Ray's `function_name` label: the one batch handler a deployment has.
const BATCH_FUNCTION: &str = "handle_batch";

/// One replica's batch figures, read at scrape time.
pub(super) struct BatchFigures {
    wait: HistogramSnapshot,
    execution: HistogramSnapshot,
    size: HistogramSnapshot,
    utilization: HistogramSnapshot,
    processed: u64,
    queued: u64,
}

impl BatchFigures {
    /// The figures of `ep`'s batcher; `None` before its first batched request.
    pub(super) fn of(ep: &ReplicaEndpoint) -> Option<BatchFigures> {
        let s = ep.batch_stats()?;
        Some(BatchFigures {
            wait: s.wait().snapshot(),
            execution: s.execution().snapshot(),
            size: s.size().snapshot(),
            utilization: s.utilization().snapshot(),
            processed: s.processed(),
            queued: s.queued(),
        })
    }
}

/// One multiplexed replica's models, read at scrape time.
pub(super) struct ModelFigures {
    /// Its loaded model ids, sorted.
    loaded: Vec<String>,
    /// Its cache's counters; `None` for a replica on a node that has not
    /// reported them yet.
    counts: Option<ModelCounts>,
}

struct ModelCounts {
    requests: u64,
    loads: u64,
    unloads: u64,
    load_latency: HistogramSnapshot,
    unload_latency: HistogramSnapshot,
}

impl ModelFigures {
    /// The models of `ep`; `None` unless it is multiplexed.
    pub(super) fn of(ep: &ReplicaEndpoint) -> Option<ModelFigures> {
        if !ep.is_multiplexed() {
            return None;
        }
        Some(ModelFigures {
            loaded: ep.model_ids(),
            counts: ep.model_stats().map(|s| ModelCounts {
                requests: s.requests(),
                loads: s.loads(),
                unloads: s.unloads(),
                load_latency: s.load_latency().snapshot(),
                unload_latency: s.unload_latency().snapshot(),
            }),
        })
    }
}

/// Write the batching and multiplexing families.
pub(super) fn encode(
    e: &mut DescriptorEncoder,
    deployments: &[DeploymentFigures],
) -> Result<(), std::fmt::Error> {
    use MetricType::{Counter, Gauge, Histogram};
    let batched = || {
        deployments.iter().flat_map(|d| {
            d.replicas.iter().filter_map(move |r| {
                let mut l = replica_labels(d, r, false);
                l.push(("function_name", BATCH_FUNCTION));
                r.batch.as_ref().map(|b| (l, b))
            })
        })
    };
    type Hist = fn(&BatchFigures) -> &HistogramSnapshot;
    let histograms: [(&str, &str, Hist); 4] = [
        (
            "ray_serve_batch_wait_time_ms",
            "Time requests waited for batch to fill (in milliseconds).",
            |b| &b.wait,
        ),
        (
            "ray_serve_batch_execution_time_ms",
            "Time to execute the batch function (in milliseconds).",
            |b| &b.execution,
        ),
        (
            "ray_serve_batch_utilization_percent",
            "Batch utilization as percentage (actual_batch_size / max_batch_size * 100).",
            |b| &b.utilization,
        ),
        (
            "ray_serve_actual_batch_size",
            "The actual number of requests in each batch.",
            |b| &b.size,
        ),
    ];
    for (name, help, of) in histograms {
        let mut f = family(e, name, help, Histogram)?;
        for (l, b) in batched() {
            f.histogram(&l, of(b))?;
        }
    }
    let mut f = family(
        e,
        "ray_serve_batch_queue_length",
        "Number of requests waiting in the batch queue.",
        Gauge,
    )?;
    for (l, b) in batched() {
        f.gauge(&l, i64::try_from(b.queued).unwrap_or(i64::MAX))?;
    }
    let mut f = family(
        e,
        "ray_serve_batches_processed",
        "Counter of batches executed.",
        Counter,
    )?;
    for (l, b) in batched() {
        f.counter(&l, b.processed)?;
    }

    let multiplexed = || {
        deployments.iter().flat_map(|d| {
            d.replicas
                .iter()
                .filter_map(move |r| r.models.as_ref().map(|m| (replica_labels(d, r, false), m)))
        })
    };
    let mut f = family(
        e,
        "ray_serve_num_multiplexed_models",
        "The number of models loaded on the current replica.",
        Gauge,
    )?;
    for (l, m) in multiplexed() {
        f.gauge(&l, i64::try_from(m.loaded.len()).unwrap_or(i64::MAX))?;
    }
    let mut f = family(
        e,
        "ray_serve_registered_multiplexed_model_id",
        "The model id registered on the current replica.",
        Gauge,
    )?;
    for (l, m) in multiplexed() {
        for id in &m.loaded {
            let mut l = l.clone();
            l.push(("model_id", id.as_str()));
            f.gauge(&l, 1)?;
        }
    }
    let counted = || multiplexed().filter_map(|(l, m)| m.counts.as_ref().map(|c| (l, c)));
    type Count = fn(&ModelCounts) -> u64;
    let counters: [(&str, &str, Count); 3] = [
        (
            "ray_serve_multiplexed_get_model_requests_counter",
            "The counter for get model requests on the current replica.",
            |c| c.requests,
        ),
        (
            "ray_serve_multiplexed_models_load_counter",
            "The counter for loaded models on the current replica.",
            |c| c.loads,
        ),
        (
            "ray_serve_multiplexed_models_unload_counter",
            "The counter for unloaded models on the current replica.",
            |c| c.unloads,
        ),
    ];
    for (name, help, of) in counters {
        let mut f = family(e, name, help, Counter)?;
        for (l, c) in counted() {
            f.counter(&l, of(c))?;
        }
    }
    type Latency = fn(&ModelCounts) -> &HistogramSnapshot;
    let latencies: [(&str, &str, Latency); 2] = [
        (
            "ray_serve_multiplexed_model_load_latency_ms",
            "The time it takes to load a model.",
            |c| &c.load_latency,
        ),
        (
            "ray_serve_multiplexed_model_unload_latency_ms",
            "The time it takes to unload a model.",
            |c| &c.unload_latency,
        ),
    ];
    for (name, help, of) in latencies {
        let mut f = family(e, name, help, Histogram)?;
        for (l, c) in counted() {
            f.histogram(&l, of(c))?;
        }
    }
    Ok(())
}
