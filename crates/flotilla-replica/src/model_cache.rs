//! One replica's models (Ray's `_ModelMultiplexWrapper`): loaded by id through
//! the user's loader, at most the deployment's `max_num_models_per_replica`
//! kept, the least recently used unloaded first, and every change published by
//! subscription for routers.
//!
//! - A hit moves the model to the most recently used end and takes no lock
//!   beyond the cache's own short one. Each model also keeps its [`Heat`]
//!   (its uses weighted by age), and the cache publishes the heat of the
//!   model it would evict next, so that routers send a new model where it
//!   evicts the least used one.
//! - A miss starts one load per id: requests for a model that is loading wait
//!   for that load (they are not a second load), and all get its outcome. A
//!   failed load fails every waiting request with the loader's error and
//!   leaves nothing cached (Ray's waiters would each retry the load).
//! - Loads (with the unloads that make room for them) run one at a time per
//!   replica, in a task of their own, as Ray's single lock orders them: the
//!   limit is never exceeded, even while a load runs (a limit lowered in
//!   place is reached once the load or eviction under way gives up its
//!   turn). A load that has begun finishes (and its model is cached) even if
//!   every caller waiting for it gave up; one still waiting for its turn then
//!   does not run. When the replica gives up on its loads (its graceful
//!   shutdown timeout passed, or it was killed), the loaders still running
//!   are cancelled; unload hooks are never cut.
//! - The published ids include models still loading, as Ray's do, so routers
//!   send more requests for a model to the replica already loading it.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use tokio::sync::watch;
use tracing::Instrument;

use crate::{
    CallError, ModelStats, MultiplexedDeployment, UserError, settings::Settings, user::guarded,
};

/// The models one replica of a multiplexed deployment holds, as published to
/// routers (see [`ReplicaEndpoint::watch_models`](crate::ReplicaEndpoint::watch_models)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelIds {
    /// Loaded models, least recently loaded first.
    pub loaded: Vec<Arc<str>>,
    /// Models being loaded now (or waiting for their turn to load).
    pub loading: Vec<Arc<str>>,
}

impl ModelIds {
    /// Whether `model_id` is loaded or loading.
    pub fn contains(&self, model_id: &str) -> bool {
        self.loaded
            .iter()
            .chain(&self.loading)
            .any(|m| &**m == model_id)
    }

    /// Whether no model is loaded or loading.
    pub fn is_empty(&self) -> bool {
        self.loaded.is_empty() && self.loading.is_empty()
    }
}

/// Where one replica's model ids are published: the cache writes, routers read.
/// A replica in another process has a mirror hub, written from its reports.
#[derive(Debug)]
pub(crate) struct ModelHub {
    ids: watch::Sender<ModelIds>,
    /// Whether the replica is known to be multiplexed: always for a local
    /// replica's cache; for a mirror, from its first report.
    known: AtomicBool,
    /// The [`Heat`] of its least recently used loaded model, as `f64` bits
    /// (`-inf`: none loaded; [`UNKNOWN`]: not known, a mirror).
    coldest: AtomicU64,
    /// The cache's loads and unloads; `None` for a mirror (its process
    /// counts them).
    stats: Option<ModelStats>,
}

/// [`ModelHub::coldest`] of a mirror: its process keeps that to itself.
const UNKNOWN: u64 = u64::MAX;

/// How fast a use's weight in a model's [`Heat`] fades, in ticks of the
/// deployment's use clock ([`Settings::next_use`]): `HEAT_WINDOW` uses later
/// it weighs `1/e` of a new use (half after about 0.7 windows).
const HEAT_WINDOW: f64 = 4096.0;

/// How much a model has been used lately: `ln Σ e^(t / HEAT_WINDOW)` over
/// its uses `t` on its deployment's use clock, so that models compare by
/// their uses weighted by age without any value changing as the clock runs
/// (the common factor `e^(-now / HEAT_WINDOW)` cancels out). A model used
/// often outranks one used once more recently; of two used equally often,
/// the one used later is hotter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heat(f64);

impl Heat {
    /// A model first used (loaded) at `tick`.
    pub(crate) fn first(tick: u64) -> Heat {
        Heat(tick as f64 / HEAT_WINDOW)
    }

    /// The same model used again at `tick`.
    pub(crate) fn used(self, tick: u64) -> Heat {
        let (a, b) = (self.0, tick as f64 / HEAT_WINDOW);
        let (hi, lo) = if a > b { (a, b) } else { (b, a) };
        Heat(hi + (lo - hi).exp().ln_1p())
    }

    /// Its value, for comparisons.
    pub(crate) fn value(self) -> f64 {
        self.0
    }

    /// A model used at each of `ticks`, in order (`None`: never; tests).
    #[cfg(test)]
    pub(crate) fn of_uses(ticks: &[u64]) -> Option<Heat> {
        let (first, rest) = ticks.split_first()?;
        Some(rest.iter().fold(Heat::first(*first), |h, &t| h.used(t)))
    }
}

impl ModelHub {
    /// The hub of a local replica's cache.
    pub(crate) fn local() -> Self {
        ModelHub {
            ids: watch::Sender::new(ModelIds::default()),
            known: AtomicBool::new(true),
            coldest: AtomicU64::new(f64::NEG_INFINITY.to_bits()),
            stats: Some(ModelStats::default()),
        }
    }

    /// The mirror of a replica in another process, empty and not known to be
    /// multiplexed until it reports.
    pub(crate) fn mirror() -> Self {
        ModelHub {
            ids: watch::Sender::new(ModelIds::default()),
            known: AtomicBool::new(false),
            coldest: AtomicU64::new(UNKNOWN),
            stats: None,
        }
    }

    /// Take a mirrored replica's report: it is multiplexed, and holds `ids`.
    pub(crate) fn set(&self, ids: ModelIds) {
        self.known.store(true, Ordering::Release);
        self.ids.send_if_modified(|cur| {
            let changed = *cur != ids;
            if changed {
                *cur = ids;
            }
            changed
        });
    }

    /// The [`Heat`] of the least recently used of its loaded models, the
    /// one a new model would evict there (`-inf` if it holds none; `None`
    /// for a mirror, whose process keeps that to itself).
    pub(crate) fn coldest(&self) -> Option<f64> {
        match self.coldest.load(Ordering::Relaxed) {
            UNKNOWN => None,
            bits => Some(f64::from_bits(bits)),
        }
    }

    /// Publish the heat of its least recently used model (`None`: none).
    pub(crate) fn set_coldest(&self, heat: Option<Heat>) {
        self.set_coldest_heat(heat.map_or(f64::NEG_INFINITY, Heat::value));
    }

    /// Publish `heat` as that of the model it would evict next.
    fn set_coldest_heat(&self, heat: f64) {
        self.coldest.store(heat.to_bits(), Ordering::Relaxed);
    }

    /// Whether its replica is multiplexed (a mirror: once it reported).
    pub(crate) fn is_known(&self) -> bool {
        self.known.load(Ordering::Acquire)
    }

    /// Whether `model_id` is loaded or loading (no allocation).
    pub(crate) fn contains(&self, model_id: &str) -> bool {
        self.ids.borrow().contains(model_id)
    }

    /// How many models are loaded or loading (no allocation).
    pub(crate) fn count(&self) -> usize {
        let ids = self.ids.borrow();
        ids.loaded.len() + ids.loading.len()
    }

    /// The ids now.
    pub(crate) fn current(&self) -> ModelIds {
        self.ids.borrow().clone()
    }

    /// A subscription to every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<ModelIds> {
        self.ids.subscribe()
    }

    /// Its cache's figures; `None` for a mirror.
    pub(crate) fn stats(&self) -> Option<&ModelStats> {
        self.stats.as_ref()
    }

    /// Record on its cache's figures (a local hub's; a mirror has none).
    fn record(&self, f: impl FnOnce(&ModelStats)) {
        if let Some(s) = &self.stats {
            f(s);
        }
    }

    /// A hub that shows `ids` loaded (unit tests of routers).
    #[cfg(test)]
    pub(crate) fn with_ids(ids: &[&str]) -> Self {
        let hub = ModelHub::local();
        hub.ids.send_replace(ModelIds {
            loaded: ids.iter().map(|m| Arc::from(*m)).collect(),
            loading: Vec::new(),
        });
        hub
    }
}

/// The outcome of one load, shared by every request that waited for it.
type Outcome<T> = Option<Result<Arc<T>, CallError>>;

struct Loading<T> {
    id: Arc<str>,
    outcome: watch::Receiver<Outcome<T>>,
}

struct State<T> {
    /// Least recently used first, each with its [`Heat`].
    loaded: VecDeque<(Arc<str>, Arc<T>, Heat)>,
    loading: Vec<Loading<T>>,
    /// The replica stopped: no more loads.
    closed: bool,
    /// The replica gave up on its loads ([`ModelCache::abort_loads`]): no
    /// more loads, and those running are cancelled.
    aborted: bool,
}

/// The model cache of one replica of `M`.
pub(crate) struct ModelCache<M: MultiplexedDeployment> {
    source: Arc<M>,
    state: Mutex<State<M::Model>>,
    /// One load (with its evictions) at a time.
    turn: tokio::sync::Mutex<()>,
    settings: Arc<Settings>,
    hub: Arc<ModelHub>,
    /// The replica's span: loads and unloads run in `load_model` and
    /// `unload_model` spans under it, not under the request that asked.
    span: tracing::Span,
    /// The runtime it was made on: loads run there.
    home: crate::home::Home,
    /// Turns true when the replica gives up on its loads
    /// ([`abort_loads`](Self::abort_loads)): each load's loader (only the
    /// loader, never an unload hook) is cancelled then.
    abort: watch::Sender<bool>,
    /// The task that follows the deployment's model limit
    /// ([`follow_limit`](Self::follow_limit)), ended with the cache.
    follower: Mutex<Option<tokio::task::AbortHandle>>,
}

impl<M: MultiplexedDeployment> Drop for ModelCache<M> {
    fn drop(&mut self) {
        if let Some(f) = self
            .follower
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            f.abort();
        }
    }
}

impl<M: MultiplexedDeployment> ModelCache<M> {
    /// The cache of one replica of `source`, following `settings`' model
    /// limit: a lower one evicts at once.
    pub(crate) fn new(source: Arc<M>, settings: Arc<Settings>, span: tracing::Span) -> Arc<Self> {
        let cache = Arc::new(ModelCache {
            source,
            state: Mutex::new(State {
                loaded: VecDeque::new(),
                loading: Vec::new(),
                closed: false,
                aborted: false,
            }),
            turn: tokio::sync::Mutex::new(()),
            settings,
            hub: Arc::new(ModelHub::local()),
            span,
            home: crate::home::Home::current(),
            abort: watch::Sender::new(false),
            follower: Mutex::new(None),
        });
        cache.follow_limit();
        cache
    }

    /// Evict down to the deployment's model limit whenever it is lowered, in
    /// the turn of loads (Ray's limit cannot change in place; Flotilla's can,
    /// and "at most" holds then too, not only from the next load). The task
    /// holds the cache weakly and ends with it.
    fn follow_limit(self: &Arc<Self>) {
        let mut changed = self.settings.watch_max_models();
        let cache = Arc::downgrade(self);
        let task = self.home.spawn(async move {
            while changed.changed().await.is_ok() {
                let Some(cache) = cache.upgrade() else { return };
                let _turn = cache.turn.lock().await;
                if cache.lock().closed {
                    return;
                }
                cache.evict_beyond(0).await;
            }
        });
        *self.follower.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
    }

    pub(crate) fn hub(&self) -> &Arc<ModelHub> {
        &self.hub
    }

    fn lock(&self) -> MutexGuard<'_, State<M::Model>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publish the heat of the model it would evict next: its least recently
    /// used loaded one, or, when the models loading fill its limit, one just
    /// loaded (the hottest there is: routers send a new model elsewhere).
    fn publish_coldest(&self, s: &State<M::Model>) {
        match s.loaded.front() {
            Some(e) => self.hub.set_coldest(Some(e.2)),
            None if self
                .settings
                .max_models()
                .is_some_and(|limit| s.loading.len() >= limit as usize) =>
            {
                self.hub.set_coldest_heat(f64::INFINITY);
            }
            None => self.hub.set_coldest(None),
        }
    }

    fn publish(&self, s: &State<M::Model>) {
        self.publish_coldest(s);
        self.hub.ids.send_replace(ModelIds {
            loaded: s.loaded.iter().map(|(id, ..)| id.clone()).collect(),
            loading: s.loading.iter().map(|l| l.id.clone()).collect(),
        });
    }

    /// The model `id`: cached, or loaded (once, however many ask at once).
    pub(crate) async fn get(self: &Arc<Self>, id: &Arc<str>) -> Result<Arc<M::Model>, CallError> {
        self.hub.record(ModelStats::asked);
        let mut outcome = {
            let mut s = self.lock();
            if s.closed || s.aborted {
                return Err(load_error(id, "the replica is stopping"));
            }
            if let Some(pos) = s.loaded.iter().position(|(k, ..)| k == id)
                && let Some(mut entry) = s.loaded.remove(pos)
            {
                let model = entry.1.clone();
                entry.2 = entry.2.used(self.settings.next_use());
                s.loaded.push_back(entry);
                if pos == 0 {
                    self.publish_coldest(&s);
                }
                return Ok(model);
            }
            match s.loading.iter().find(|l| &l.id == id) {
                Some(l) => l.outcome.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    s.loading.push(Loading {
                        id: id.clone(),
                        outcome: rx.clone(),
                    });
                    self.publish(&s);
                    let span =
                        tracing::info_span!(parent: &self.span, "load_model", model_id = %id);
                    self.home
                        .spawn(self.clone().load(id.clone(), tx).instrument(span));
                    rx
                }
            }
        };
        match outcome.wait_for(Option::is_some).await {
            Ok(done) => done
                .clone()
                .unwrap_or_else(|| Err(load_error(id, "the load was abandoned"))),
            Err(_) => Err(load_error(id, "the load was abandoned")),
        }
    }

    /// Load `id` in its turn, unloading the least recently used models first
    /// to make room, and tell every waiter.
    async fn load(self: Arc<Self>, id: Arc<str>, done: watch::Sender<Outcome<M::Model>>) {
        let mut abort = self.abort.subscribe();
        // Not for ever behind an unload hook that never returns, once the
        // replica has given up on its loads.
        let _turn = tokio::select! {
            turn = self.turn.lock() => Some(turn),
            _ = abort.wait_for(|a| *a) => None,
        };
        if self.skipped(&id, &done) {
            return;
        }
        self.make_room().await;
        // Again: the replica may have stopped, or every caller given up,
        // while room was made (an unload hook takes its time).
        if self.skipped(&id, &done) {
            return;
        }
        self.hub.record(ModelStats::loading);
        let began = tokio::time::Instant::now();
        let result = tokio::select! {
            result = guarded(|| self.source.load_model(&id)) => result,
            _ = abort.wait_for(|a| *a) => {
                // The loader is dropped here; `skipped` tells the waiters.
                self.skipped(&id, &done);
                return;
            }
        };
        let (outcome, late) = {
            let mut s = self.lock();
            s.loading.retain(|l| l.id != id);
            let out = match result {
                Ok(model) => {
                    self.hub.record(|m| m.loaded(began.elapsed()));
                    let model = Arc::new(model);
                    if s.closed {
                        (Ok(model.clone()), Some(model))
                    } else {
                        let heat = Heat::first(self.settings.next_use());
                        s.loaded.push_back((id.clone(), model.clone(), heat));
                        (Ok(model), None)
                    }
                }
                Err(g) => {
                    let e = UserError::from(g);
                    tracing::error!(model_id = %id, error = %e, "failed to load model");
                    (Err(load_error(&id, &e.0)), None)
                }
            };
            self.publish(&s);
            out
        };
        done.send_replace(Some(outcome));
        if let Some(model) = late {
            // Loaded after the replica stopped: unload it at once.
            self.unload(id, model).await;
        }
    }

    /// Whether the load of `id` is not to run (and then tell its waiters why):
    /// the replica is stopping, or nobody waits for it any more.
    fn skipped(&self, id: &Arc<str>, done: &watch::Sender<Outcome<M::Model>>) -> bool {
        let mut s = self.lock();
        // Nobody waits any more when only the entry's own receiver is left
        // (each waiter holds one; under this lock no new one comes).
        let abandoned = done.receiver_count() <= 1;
        let why = if s.aborted {
            // The replica gave up on its loads.
            "the load was cancelled: its replica is gone"
        } else if s.closed {
            // The replica stopped while this load waited: load nothing (it
            // would run, evict and unload after the replica's end).
            "the replica is stopping"
        } else if abandoned {
            // Every caller gave up while it waited: evicting a model for it
            // would serve nobody (in Ray, the cancelled request's load never
            // takes the lock).
            "every request waiting for it gave up"
        } else {
            return false;
        };
        s.loading.retain(|l| &l.id != id);
        self.publish(&s);
        drop(s);
        done.send_replace(Some(Err(load_error(id, why))));
        true
    }

    /// Unload least recently used models until one more fits the limit.
    async fn make_room(&self) {
        self.evict_beyond(1).await;
    }

    /// Unload least recently used models until `room` more fit the limit
    /// (in the turn of loads).
    async fn evict_beyond(&self, room: usize) {
        loop {
            let victim = {
                let mut s = self.lock();
                let full = self
                    .settings
                    .max_models()
                    .is_some_and(|limit| s.loaded.len() + room > limit as usize);
                let victim = if full { s.loaded.pop_front() } else { None };
                if victim.is_some() {
                    self.publish(&s);
                }
                victim
            };
            match victim {
                Some((id, model, _)) => self.unload(id, model).await,
                None => return,
            }
        }
    }

    async fn unload(&self, id: Arc<str>, model: Arc<M::Model>) {
        let unloading = || async {
            self.source.unload_model(&id, model).await;
            Ok::<_, UserError>(())
        };
        let span = tracing::info_span!(parent: &self.span, "unload_model", model_id = %id);
        self.hub.record(ModelStats::unloading);
        let began = tokio::time::Instant::now();
        match guarded(unloading).instrument(span).await {
            Ok(()) => self.hub.record(|m| m.unloaded(began.elapsed())),
            Err(g) => tracing::warn!(model_id = %id, error = %UserError::from(g),
                "unloading a model failed"),
        }
    }

    /// The replica will not wait for its loads any more (its graceful
    /// shutdown timeout passed, or it was killed): no load starts from now
    /// on, and the loaders still running are cancelled (their futures
    /// dropped). Their callers get [`CallError::ModelLoad`], nothing they were
    /// loading is cached, and a [`shutdown`](Self::shutdown) waiting for the
    /// turn goes on. An unload hook under way (making room, or a model loaded
    /// after the stop) runs to its end.
    pub(crate) fn abort_loads(&self) {
        self.lock().aborted = true;
        self.abort.send_replace(true);
    }

    /// The replica stopped: unload every model, least recently used first.
    pub(crate) async fn shutdown(&self) {
        let models = {
            let mut s = self.lock();
            if s.closed {
                return;
            }
            s.closed = true;
            let models: Vec<_> = s.loaded.drain(..).collect();
            self.publish(&s);
            models
        };
        for (id, model, _) in models {
            self.unload(id, model).await;
        }
        // A load (or the eviction making room for it, or the limit's
        // follower evicting) still running holds the turn: its model goes
        // before the replica counts as gone, by the load's own late unload,
        // and an eviction's unload hook runs to its end. Loads queued behind
        // it find the replica closed and load nothing. Holding the turn, the
        // follower is idle or queued: it can go now without cutting a hook.
        let turn = self.turn.lock().await;
        let follower = self
            .follower
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(f) = follower {
            f.abort();
        }
        drop(turn);
    }
}

fn load_error(id: &str, message: &str) -> CallError {
    CallError::ModelLoad {
        model_id: id.to_owned(),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::{
        sync::atomic::{AtomicU32, Ordering},
        time::Duration,
    };

    use super::*;

    /// Loads take 10 ms; loading "bad" fails; loading "never" never ends;
    /// the first load of "boom" panics before the loader returns its future;
    /// unloading "slow" takes 100 ms; every load and unload is logged.
    #[derive(Default)]
    struct Zoo {
        loads: AtomicU32,
        /// Unload hooks that ran to their end.
        unloaded: AtomicU32,
        boomed: std::sync::atomic::AtomicBool,
        log: Mutex<Vec<String>>,
    }

    impl Zoo {
        fn log(&self) -> Vec<String> {
            self.log.lock().unwrap().clone()
        }
    }

    impl MultiplexedDeployment for Zoo {
        type Request = ();
        type Response = String;
        type Model = String;
        #[allow(clippy::manual_async_fn)]
        fn load_model(&self, id: &str) -> impl Future<Output = Result<String, UserError>> + Send {
            self.loads.fetch_add(1, Ordering::SeqCst);
            self.log.lock().unwrap().push(format!("load {id}"));
            assert!(
                id != "boom" || self.boomed.swap(true, Ordering::SeqCst),
                "boom"
            );
            let id = id.to_owned();
            async move {
                if id == "never" {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                if id == "bad" {
                    return Err(UserError::new("no such model"));
                }
                Ok(format!("model {id}"))
            }
        }
        async fn unload_model(&self, id: &str, model: Arc<String>) {
            assert_eq!(*model, format!("model {id}"));
            self.log.lock().unwrap().push(format!("unload {id}"));
            if id == "slow" {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.unloaded.fetch_add(1, Ordering::SeqCst);
        }
        async fn handle(&self, model: &String, _: ()) -> Result<String, UserError> {
            Ok(model.clone())
        }
    }

    fn cache(limit: Option<u32>) -> (Arc<Zoo>, Arc<ModelCache<Zoo>>) {
        let zoo = Arc::new(Zoo::default());
        let settings = Arc::new(Settings::default());
        settings.set_max_models(limit);
        let span = tracing::Span::none();
        (zoo.clone(), ModelCache::new(zoo, settings, span))
    }

    fn id(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    fn loaded(c: &ModelCache<Zoo>) -> Vec<String> {
        c.hub()
            .current()
            .loaded
            .iter()
            .map(|m| m.to_string())
            .collect()
    }

    /// A load still waiting for its turn when every caller waiting for it
    /// has given up does not run: it would evict a model for nobody.
    #[tokio::test(start_paused = true)]
    async fn a_queued_load_whose_callers_all_left_does_not_run() {
        let (zoo, c) = cache(Some(1));
        c.get(&id("a")).await.unwrap();
        let b = {
            let c = c.clone();
            tokio::spawn(async move { c.get(&id("b")).await })
        };
        let gave_up = {
            let c = c.clone();
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(5), c.get(&id("c"))).await
            })
        };
        assert!(gave_up.await.unwrap().is_err(), "c waits behind b");
        assert_eq!(*b.await.unwrap().unwrap(), "model b");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(zoo.log(), ["load a", "unload a", "load b"]);
        assert_eq!(loaded(&c), ["b"]);
        assert!(c.hub().current().loading.is_empty());
        // Asked for again, it loads.
        assert_eq!(*c.get(&id("c")).await.unwrap(), "model c");
    }

    #[tokio::test(start_paused = true)]
    async fn evicts_the_least_recently_used_and_unloads_it_first() {
        // Ray's test_multiplex_wrapper, cap 2.
        let (zoo, c) = cache(Some(2));
        let heat = |tick| Some(Heat::first(tick).value());
        assert_eq!(c.hub().coldest(), Some(f64::NEG_INFINITY), "nothing loaded");
        c.get(&id("1")).await.unwrap();
        c.get(&id("2")).await.unwrap();
        assert_eq!(loaded(&c), ["1", "2"]);
        // The uses so far: load 1 (1), load 2 (2); "1" is the coldest.
        assert_eq!(c.hub().coldest(), heat(1));
        c.get(&id("3")).await.unwrap();
        assert_eq!(loaded(&c), ["2", "3"]);
        assert_eq!(c.hub().coldest(), heat(2));
        // A hit makes "2" the most recently used, so "3" goes next.
        assert_eq!(*c.get(&id("2")).await.unwrap(), "model 2");
        assert_eq!(c.hub().coldest(), heat(3), "\"3\", loaded third");
        c.get(&id("4")).await.unwrap();
        let mut now: Vec<String> = c
            .lock()
            .loaded
            .iter()
            .map(|(k, ..)| k.to_string())
            .collect();
        now.sort();
        assert_eq!(now, ["2", "4"]);
        assert_eq!(
            zoo.log(),
            [
                "load 1", "load 2", "unload 1", "load 3", "unload 3", "load 4"
            ]
        );
        c.shutdown().await;
        assert!(c.hub().current().is_empty());
        assert_eq!(zoo.log().len(), 8);
        assert!(c.get(&id("1")).await.is_err());
    }

    #[test]
    fn heat_weighs_uses_by_their_age() {
        let used = |ticks: &[u64]| Heat::of_uses(ticks).map_or(f64::NEG_INFINITY, Heat::value);
        // Used often outranks used once more recently.
        assert!(used(&[100, 200, 300, 400]) > used(&[500]));
        // As often, the later is hotter.
        assert!(used(&[100, 200]) > used(&[50, 150]));
        // Uses long ago weigh almost nothing: ten uses ten windows back lose to
        // two uses now.
        let now = 20 * HEAT_WINDOW as u64;
        let old: Vec<u64> = (1..=10).collect();
        assert!(used(&[now, now + 1]) > used(&old));
        // Adding one use to a huge total is exact enough to keep ordering.
        let big = used(&(0..5000).map(|t| t * 1000).collect::<Vec<_>>());
        assert!(Heat(big).used(5_000_001).value() > big);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_for_a_loading_model_share_one_load() {
        let (zoo, c) = cache(Some(3));
        let mut rx = c.hub().subscribe();
        let gets: Vec<_> = (0..5)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { c.get(&id("m")).await })
            })
            .collect();
        // The load is published as loading before it finishes.
        rx.wait_for(|ids| ids.loading.iter().any(|m| &**m == "m"))
            .await
            .unwrap();
        for g in gets {
            assert_eq!(*g.await.unwrap().unwrap(), "model m");
        }
        assert_eq!(zoo.loads.load(Ordering::SeqCst), 1);
        assert_eq!(loaded(&c), ["m"]);
        assert!(c.hub().contains("m"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_load_fails_its_waiters_and_caches_nothing() {
        let (zoo, c) = cache(Some(3));
        let a = {
            let c = c.clone();
            tokio::spawn(async move { c.get(&id("bad")).await })
        };
        let b = {
            let c = c.clone();
            tokio::spawn(async move { c.get(&id("bad")).await })
        };
        for r in [a.await.unwrap(), b.await.unwrap()] {
            match r {
                Err(CallError::ModelLoad { model_id, message }) => {
                    assert_eq!(
                        (model_id.as_str(), message.as_str()),
                        ("bad", "no such model")
                    );
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(zoo.loads.load(Ordering::SeqCst), 1);
        assert!(c.hub().current().is_empty());
        // Nothing was cached: the next request loads again.
        assert!(c.get(&id("bad")).await.is_err());
        assert_eq!(zoo.loads.load(Ordering::SeqCst), 2);
        // Ray's figures: three asked, two loads started (failed ones count),
        // no load latency (only a success's is timed).
        let stats = c.hub().stats().unwrap();
        assert_eq!((stats.requests(), stats.loads()), (3, 2));
        assert_eq!(stats.load_latency().snapshot().count, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_loader_that_panics_before_its_future_fails_that_load_only() {
        let (zoo, c) = cache(Some(3));
        match c.get(&id("boom")).await {
            Err(CallError::ModelLoad { model_id, message }) => {
                assert_eq!(
                    (model_id.as_str(), message.as_str()),
                    ("boom", "panicked: boom")
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        // Nothing is left loading (the entry stayed, and every later request
        // for the model failed at once, "abandoned"): the next one loads.
        assert!(c.hub().current().is_empty());
        assert_eq!(*c.get(&id("boom")).await.unwrap(), "model boom");
        assert_eq!(zoo.loads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn loads_queued_when_the_replica_stops_do_not_run() {
        let (zoo, c) = cache(Some(1));
        let mut rx = c.hub().subscribe();
        let gets: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|m| {
                let c = c.clone();
                tokio::spawn(async move { c.get(&id(m)).await })
            })
            .collect();
        // "a" loads; "b" and "c" wait for their turn.
        rx.wait_for(|ids| ids.loading.len() == 3).await.unwrap();
        c.shutdown().await;
        let outcomes: Vec<_> = futures::future::join_all(gets)
            .await
            .into_iter()
            .map(|g| g.unwrap().is_ok())
            .collect();
        // "a" was loading already: its caller gets it, and it is unloaded at
        // once; "b" and "c" are never loaded.
        assert_eq!(outcomes, [true, false, false]);
        assert_eq!(zoo.loads.load(Ordering::SeqCst), 1);
        assert_eq!(zoo.log(), ["load a", "unload a"]);
        assert!(c.hub().current().is_empty());
    }

    /// A cache holding one model, "slow", and a load of "b" that has its
    /// turn and is making room: unloading "slow" (100 ms, 10 ms in).
    async fn b_making_room() -> (
        Arc<Zoo>,
        Arc<ModelCache<Zoo>>,
        tokio::task::JoinHandle<Result<Arc<String>, CallError>>,
    ) {
        let (zoo, c) = cache(Some(1));
        c.get(&id("slow")).await.unwrap();
        let b = {
            let c = c.clone();
            tokio::spawn(async move { c.get(&id("b")).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(zoo.log(), ["load slow", "unload slow"]);
        (zoo, c, b)
    }

    /// A load whose turn came before the replica stopped, and that was
    /// still making room when it did, does not run either.
    #[tokio::test(start_paused = true)]
    async fn a_load_making_room_when_the_replica_stops_does_not_run() {
        let (zoo, c, b) = b_making_room().await;
        c.shutdown().await;
        assert!(b.await.unwrap().is_err());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(zoo.log(), ["load slow", "unload slow"]);
        assert!(c.hub().current().is_empty());
    }

    /// A loader that never returns keeps a stopping replica's shutdown
    /// waiting for its turn until the loads are cancelled; then the shutdown
    /// ends, the caller hears the load was abandoned, and nothing is cached.
    #[tokio::test(start_paused = true)]
    async fn cancelled_loads_free_a_shutdown_stuck_behind_a_loader_that_never_returns() {
        let (zoo, c) = cache(Some(2));
        let stuck = {
            let c = c.clone();
            tokio::spawn(async move { c.get(&id("never")).await })
        };
        let mut rx = c.hub().subscribe();
        rx.wait_for(|ids| ids.loading.len() == 1).await.unwrap();
        let shutdown = {
            let c = c.clone();
            tokio::spawn(async move { c.shutdown().await })
        };
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!shutdown.is_finished(), "the loader returned after all");
        c.abort_loads();
        tokio::time::timeout(Duration::from_secs(1), shutdown)
            .await
            .expect("the shutdown ended once the loads were cancelled")
            .unwrap();
        match stuck.await.unwrap() {
            Err(CallError::ModelLoad { model_id, message }) => {
                assert_eq!(
                    (model_id.as_str(), message.as_str()),
                    ("never", "the load was cancelled: its replica is gone")
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(zoo.log(), ["load never"]);
        assert!(c.hub().current().is_empty());
    }

    /// Giving up on the loads cuts loaders only: an unload hook making room
    /// for a load runs to its end, and the load it made room for does not
    /// run.
    #[tokio::test(start_paused = true)]
    async fn cancelled_loads_leave_an_unload_hook_under_way_to_finish() {
        let (zoo, c, b) = b_making_room().await;
        c.abort_loads();
        assert!(b.await.unwrap().is_err());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(zoo.unloaded.load(Ordering::SeqCst), 1, "the hook was cut");
        assert_eq!(zoo.log(), ["load slow", "unload slow"]);
        assert!(c.hub().current().is_empty());
        // No load starts any more.
        assert!(c.get(&id("c")).await.is_err());
        assert_eq!(zoo.loads.load(Ordering::SeqCst), 1);
    }

    /// A stop waits for the limit's follower to finish the unload hook it
    /// runs, and only then ends it.
    #[tokio::test(start_paused = true)]
    async fn a_stop_lets_the_limit_follower_finish_its_unload() {
        let (zoo, c) = cache(Some(2));
        c.get(&id("slow")).await.unwrap();
        c.get(&id("a")).await.unwrap();
        c.settings.set_max_models(Some(1));
        // The follower evicts "slow", the least recently used (100 ms).
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(&zoo.log()[2..], ["unload slow"]);
        c.shutdown().await;
        assert_eq!(&zoo.log()[2..], ["unload slow", "unload a"]);
        assert_eq!(zoo.unloaded.load(Ordering::SeqCst), 2, "a hook was cut");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(c.settings.max_models_followers(), 0);
    }

    /// A replica stopping while a load runs returns once that model, loaded
    /// after the stop, is unloaded again: its memory is free when the
    /// replica counts as gone.
    #[tokio::test(start_paused = true)]
    async fn a_replica_stopping_mid_load_returns_after_that_model_is_unloaded() {
        let (zoo, c) = cache(Some(2));
        let a = {
            let c = c.clone();
            tokio::spawn(async move { c.get(&id("a")).await })
        };
        // "a" loads (10 ms).
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(zoo.log(), ["load a"]);
        c.shutdown().await;
        assert_eq!(zoo.log(), ["load a", "unload a"]);
        assert!(c.hub().current().is_empty());
        let _ = a.await;
    }

    /// A replica whose models loading fill its limit would evict one just
    /// loaded: it says so (the hottest heat), so a new model goes elsewhere.
    #[tokio::test(start_paused = true)]
    async fn models_loading_up_to_the_limit_publish_the_hottest_victim() {
        let (_zoo, c) = cache(Some(1));
        assert_eq!(
            c.hub().coldest(),
            Some(f64::NEG_INFINITY),
            "room: nothing evicted"
        );
        let a = {
            let c = c.clone();
            tokio::spawn(async move { c.get(&id("a")).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(c.hub().coldest(), Some(f64::INFINITY));
        a.await.unwrap().unwrap();
        let loaded = c.hub().coldest().unwrap();
        assert!(loaded.is_finite(), "{loaded}");
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_keeps_everything_and_a_lower_limit_evicts_at_once() {
        let (zoo, c) = cache(None);
        for m in ["a", "b", "c", "d"] {
            c.get(&id(m)).await.unwrap();
        }
        assert_eq!(loaded(&c), ["a", "b", "c", "d"]);
        // "b" used again: "a" and "c" are the least recently used.
        c.get(&id("b")).await.unwrap();
        let mut rx = c.hub().subscribe();
        c.settings.set_max_models(Some(2));
        tokio::time::timeout(
            Duration::from_secs(1),
            rx.wait_for(|ids| ids.loaded.len() == 2),
        )
        .await
        .expect("evicted down to the lower limit")
        .unwrap();
        assert_eq!(loaded(&c), ["d", "b"]);
        assert_eq!(&zoo.log()[4..], ["unload a", "unload c"]);
        // A raised limit evicts nothing; the next load fills it.
        c.settings.set_max_models(Some(3));
        c.get(&id("e")).await.unwrap();
        assert_eq!(loaded(&c), ["d", "b", "e"]);
    }

    /// The task following the limit ends with its replica (stopped) or its
    /// cache (dropped): a replica leaves no task behind on a route that lives
    /// on.
    #[tokio::test(start_paused = true)]
    async fn the_limit_follower_ends_with_its_replica() {
        let (_zoo, stopped) = cache(Some(2));
        let settings = stopped.settings.clone();
        let dropped = ModelCache::new(
            Arc::new(Zoo::default()),
            settings.clone(),
            tracing::Span::none(),
        );
        assert_eq!(settings.max_models_followers(), 2);
        stopped.shutdown().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            settings.max_models_followers(),
            1,
            "a stopped replica's follower waits on"
        );
        drop(dropped);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            settings.max_models_followers(),
            0,
            "a dropped cache's follower waits on"
        );
    }
}
