//! The data-plane settings a deployment's config gives its replicas in place:
//! batching and the model limit. Kept on the route (set by the DeploymentActor
//! whenever the target changes) and shared, as atomics, with every replica's
//! batcher and model cache, which read them when a batch forms or a model
//! loads: a config-only change needs no message to any replica.

use std::{
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::Duration,
};

use flotilla_core::{BatchConfig, DEFAULT_MAX_NUM_MODELS_PER_REPLICA};

/// One deployment's batching and multiplexing settings.
#[derive(Debug)]
pub(crate) struct Settings {
    /// 0: batching off.
    max_batch_size: AtomicU32,
    batch_wait_timeout_ns: AtomicU64,
    max_concurrent_batches: AtomicU32,
    /// 0: no limit.
    max_models: AtomicU32,
    /// Model uses so far on every replica of this process: a logical clock
    /// that orders the replicas' least recently used models.
    uses: AtomicU64,
    /// Marked at every batching change, for batchers idle meanwhile (a raised
    /// `max_concurrent_batches` has room for a waiting batch at once).
    batching_changed: tokio::sync::watch::Sender<()>,
    /// Marked when the model limit changes, for model caches holding more
    /// than a lowered limit (they evict down to it at once).
    models_changed: tokio::sync::watch::Sender<()>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_batch_size: AtomicU32::new(0),
            batch_wait_timeout_ns: AtomicU64::new(0),
            max_concurrent_batches: AtomicU32::new(1),
            max_models: AtomicU32::new(DEFAULT_MAX_NUM_MODELS_PER_REPLICA),
            uses: AtomicU64::new(0),
            batching_changed: tokio::sync::watch::Sender::new(()),
            models_changed: tokio::sync::watch::Sender::new(()),
        }
    }
}

impl Settings {
    /// Take `batching` (`None`: off) for the next batches.
    pub(crate) fn set_batching(&self, batching: Option<BatchConfig>) {
        match batching {
            None => self.max_batch_size.store(0, Ordering::Release),
            Some(b) => {
                let ns = u64::try_from(b.batch_wait_timeout.as_nanos()).unwrap_or(u64::MAX);
                self.batch_wait_timeout_ns.store(ns, Ordering::Release);
                self.max_concurrent_batches
                    .store(b.max_concurrent_batches.max(1), Ordering::Release);
                self.max_batch_size
                    .store(b.max_batch_size.max(1), Ordering::Release);
            }
        }
        self.batching_changed.send_replace(());
    }

    /// Changes when the batching settings are set (every call, changed or
    /// not: a batcher only rechecks its limit).
    pub(crate) fn watch_batching(&self) -> tokio::sync::watch::Receiver<()> {
        self.batching_changed.subscribe()
    }

    /// Whether requests go through the batcher.
    pub(crate) fn batching_enabled(&self) -> bool {
        self.max_batch_size.load(Ordering::Acquire) > 0
    }

    /// The batching settings now (`None`: off). The three are read one by one:
    /// a batch forming during a change may mix old and new, as it may in Ray.
    pub(crate) fn batching(&self) -> Option<BatchConfig> {
        let size = self.max_batch_size.load(Ordering::Acquire);
        (size > 0).then(|| BatchConfig {
            max_batch_size: size,
            batch_wait_timeout: Duration::from_nanos(
                self.batch_wait_timeout_ns.load(Ordering::Acquire),
            ),
            max_concurrent_batches: self.max_concurrent_batches(),
        })
    }

    /// Most batches running at once per replica (at least 1).
    pub(crate) fn max_concurrent_batches(&self) -> u32 {
        self.max_concurrent_batches.load(Ordering::Acquire).max(1)
    }

    /// The next tick of the model-use clock (at least 1).
    pub(crate) fn next_use(&self) -> u64 {
        self.uses.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Keep at most `limit` models per replica (`None`: no limit).
    pub(crate) fn set_max_models(&self, limit: Option<u32>) {
        let was = self.max_models.swap(limit.unwrap_or(0), Ordering::AcqRel);
        if was != limit.unwrap_or(0) {
            self.models_changed.send_replace(());
        }
    }

    /// Changes when the model limit does.
    pub(crate) fn watch_max_models(&self) -> tokio::sync::watch::Receiver<()> {
        self.models_changed.subscribe()
    }

    /// How many follow the model limit (tests).
    #[cfg(test)]
    pub(crate) fn max_models_followers(&self) -> usize {
        self.models_changed.receiver_count()
    }

    /// The model limit (`None`: no limit).
    pub(crate) fn max_models(&self) -> Option<u32> {
        match self.max_models.load(Ordering::Acquire) {
            0 => None,
            n => Some(n),
        }
    }
}
