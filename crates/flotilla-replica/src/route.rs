//! Routes: per deployment, the set of running replicas, published by subscription.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
};

use flotilla_core::{
    AppName, BackpressureConfig, BatchConfig, DeploymentConfig, DeploymentName,
    RequestRouterConfig, is_builtin_router,
};
use tokio::sync::watch;

use crate::{
    CallError, DeploymentHandle, Registry, ReplicaEndpoint, RequestRouter, RoutingRequest,
    home::Home,
    queue::{Place, WaitQueue},
    router::default_router,
    settings::Settings,
};

/// The running replicas of one deployment, as routers see them.
pub type ReplicaSet = Arc<[Arc<ReplicaEndpoint>]>;

/// One deployment's route: its published replica set and its request queue.
/// It outlives DeploymentActor restarts, so handles keep working through them.
pub struct DeploymentRoute {
    app: AppName,
    deployment: DeploymentName,
    tx: watch::Sender<ReplicaSet>,
    /// Wakes the callers queued here at each send on `tx`, oldest first (a
    /// watch channel wakes its waiters in an order drawn from tokio's thread
    /// RNG, which a paused-time run cannot seed).
    changes: tokio::sync::Notify,
    closed: AtomicBool,
    /// Closed because its Serve instance stopped (not because it was deleted).
    shut: AtomicBool,
    /// Something that serves the deployment made it or took it
    /// ([`Directory::route`]), not only a handle: a handle whose own route
    /// was deleted moves to this one only then.
    claimed: AtomicBool,
    /// Callers in this process waiting for a slot, oldest first; shared with
    /// the replicas' endpoints, whose freed slots wake it.
    pub(crate) queue: Arc<WaitQueue>,
    /// `u32::MAX` means unbounded.
    max_queued: AtomicU32,
    /// Its target is a fixed 0 replicas (no replica is coming).
    zero_target: AtomicBool,
    /// The `(max_ongoing_requests, target_ongoing_requests)` last warned
    /// about ([`configure`](Self::configure)'s autoscaling warning).
    autoscaling_warned: std::sync::Mutex<Option<(u32, u64)>>,
    /// Callers waiting in other processes (see `queued_elsewhere`).
    queued_elsewhere: AtomicU64,
    /// The deployment failed to deploy for good (see `set_deploy_failed`).
    deploy_failed: AtomicBool,
    /// How a rejection for a full queue is answered over HTTP (read only then).
    backpressure: std::sync::Mutex<BackpressureConfig>,
    rng: AtomicU64,
    stats: RouteStats,
    /// Batching and model limit, shared with the replicas' batchers and caches.
    settings: Arc<Settings>,
    /// The deployment's request router and the config it was made from.
    router: RwLock<RouterSlot>,
    /// The built-in router, read without a lock while `custom_router` is false
    /// (every request asks a router: the common case takes no lock).
    builtin: Arc<dyn RequestRouter>,
    /// Whether `router` holds a router other than the built-in one.
    custom_router: AtomicBool,
}

/// A route's router, and the class and kwargs it was made from (`None`: set
/// directly, or the built-in default).
struct RouterSlot {
    made_from: Option<RequestRouterConfig>,
    router: Arc<dyn RequestRouter>,
}

impl std::fmt::Debug for DeploymentRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentRoute")
            .field("app", &self.app)
            .field("deployment", &self.deployment)
            .field("replicas", &self.tx.borrow().len())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl DeploymentRoute {
    fn new(app: AppName, deployment: DeploymentName) -> Self {
        let empty: ReplicaSet = Arc::from(Vec::new());
        DeploymentRoute {
            app,
            deployment,
            tx: watch::Sender::new(empty),
            changes: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            shut: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            queue: Arc::default(),
            max_queued: AtomicU32::new(u32::MAX),
            zero_target: AtomicBool::new(false),
            autoscaling_warned: std::sync::Mutex::new(None),
            queued_elsewhere: AtomicU64::new(0),
            deploy_failed: AtomicBool::new(false),
            backpressure: std::sync::Mutex::new(BackpressureConfig::default()),
            rng: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
            stats: RouteStats::default(),
            settings: Arc::new(Settings::default()),
            router: RwLock::new(RouterSlot {
                made_from: None,
                router: default_router(),
            }),
            builtin: default_router(),
            custom_router: AtomicBool::new(false),
        }
    }

    /// Take the data-plane part of a deployment's config, in place: the queue
    /// limit and its HTTP answer (`backpressure_config`), batching (from each
    /// replica's next batch), the model limit (a lower one evicts at once)
    /// and the request router ([`set_router_config`](Self::set_router_config)).
    /// The DeploymentActor calls this whenever the deployment's target changes.
    ///
    /// Returns whether the part that other processes copy (the queue limit,
    /// batching, the model limit, the router: see `docs/nodes.md`) changed.
    pub fn configure(&self, config: &DeploymentConfig, registry: &Registry) -> bool {
        if let Some(b) = &config.batching
            && self.settings.batching() != Some(*b)
            && let Some(warning) = b.max_ongoing_warning(config.max_ongoing_requests)
        {
            tracing::warn!(app = %self.app, deployment = %self.deployment, "{warning}");
        }
        self.warn_if_autoscaling_cannot_scale(config);
        let copied = self.max_queued() != config.max_queued_requests
            || self.batching() != config.batching
            || self.max_models_per_replica() != config.max_num_models_per_replica;
        self.set_max_queued(config.max_queued_requests);
        self.set_backpressure(config.backpressure);
        self.zero_target.store(
            matches!(config.num_replicas, flotilla_core::ReplicaCount::Fixed(0)),
            Ordering::Release,
        );
        self.set_batching(config.batching);
        self.set_max_models_per_replica(config.max_num_models_per_replica);
        let router_changed = self.set_router_config(&config.request_router, registry);
        copied || router_changed
    }

    /// Ray's "autoscaling will never happen" warning, said once for each
    /// config that comes to earn it (a target set again, a scaling decision,
    /// a DeploymentActor's restart do not repeat it; a config that mends it
    /// and one that breaks it again do).
    /// Whether it warned.
    fn warn_if_autoscaling_cannot_scale(&self, config: &DeploymentConfig) -> bool {
        let mut warned = self
            .autoscaling_warned
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let flotilla_core::ReplicaCount::Auto(a) = &config.num_replicas else {
            *warned = None;
            return false;
        };
        let Some(warning) = a.max_ongoing_warning(config.max_ongoing_requests) else {
            *warned = None;
            return false;
        };
        let pair = (
            config.max_ongoing_requests,
            a.target_ongoing_requests.to_bits(),
        );
        if *warned == Some(pair) {
            return false;
        }
        *warned = Some(pair);
        tracing::warn!(app = %self.app, deployment = %self.deployment, "{warning}");
        true
    }

    /// Route with the router `wanted` names, made by `registry`, from now on:
    /// made again only when its class or kwargs changed (returns whether they
    /// did). [`configure`](Self::configure) sets it from the deployment's
    /// config; a node sets it on its copy of the route.
    ///
    /// A router class the registry cannot make (the controller refuses such a
    /// config before it gets here; a node may lack the registration) leaves
    /// the built-in router in place, with an error logged.
    pub fn set_router_config(&self, wanted: &RequestRouterConfig, registry: &Registry) -> bool {
        let same = match &self
            .router
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .made_from
        {
            Some(made) => {
                made.request_router_class == wanted.request_router_class
                    && made.request_router_kwargs == wanted.request_router_kwargs
            }
            // The route's first router: the built-in one, unless one was set.
            None => {
                !self.custom_router.load(Ordering::Acquire)
                    && is_builtin_router(wanted.request_router_class.as_str())
            }
        };
        if same {
            return false;
        }
        let (router, custom) = match registry.request_router(wanted) {
            Ok(r) => (r, !is_builtin_router(wanted.request_router_class.as_str())),
            Err(e) => {
                tracing::error!(app = %self.app, deployment = %self.deployment, error = %e,
                    "request router not made; routing with the built-in one");
                (default_router(), false)
            }
        };
        let mut slot = self.router.write().unwrap_or_else(|p| p.into_inner());
        *slot = RouterSlot {
            made_from: Some(wanted.clone()),
            router,
        };
        self.custom_router.store(custom, Ordering::Release);
        true
    }

    /// The config the route's router was made from, when that is not the
    /// built-in router (`None`: the built-in one, or a router given directly
    /// with [`set_router`](Self::set_router)).
    pub fn router_config(&self) -> Option<RequestRouterConfig> {
        let slot = self.router.read().unwrap_or_else(|p| p.into_inner());
        slot.made_from
            .as_ref()
            .filter(|m| !is_builtin_router(m.request_router_class.as_str()))
            .cloned()
    }

    /// Batch requests with `batching` from each replica's next batch (`None`:
    /// off). [`configure`](Self::configure) sets it from the deployment's
    /// config; a node sets it on its copy of the route.
    pub fn set_batching(&self, batching: Option<BatchConfig>) {
        self.settings.set_batching(batching);
    }

    /// The batching settings replicas use now (`None`: off).
    pub fn batching(&self) -> Option<BatchConfig> {
        self.settings.batching()
    }

    /// Keep at most `limit` models per replica (`None`: no limit): a lower
    /// limit than before evicts each replica's least recently used models
    /// down to it as soon as the load or eviction under way there, if any,
    /// is done (in the turn of its loads). Set as
    /// [`set_batching`](Self::set_batching) is.
    pub fn set_max_models_per_replica(&self, limit: Option<u32>) {
        self.settings.set_max_models(limit);
    }

    /// The model limit per replica now (`None`: no limit).
    pub fn max_models_per_replica(&self) -> Option<u32> {
        self.settings.max_models()
    }

    /// Route with `router` from now on (until the next
    /// [`configure`](Self::configure)).
    pub fn set_router(&self, router: Arc<dyn RequestRouter>) {
        let mut slot = self.router.write().unwrap_or_else(|p| p.into_inner());
        *slot = RouterSlot {
            made_from: None,
            router,
        };
        self.custom_router.store(true, Ordering::Release);
    }

    /// Ask the router for a replica of `set`. A router that panics is user
    /// code gone wrong: the request is routed by power of two choices instead.
    pub(crate) fn choose(
        &self,
        request: &RoutingRequest<'_>,
        set: &[Arc<ReplicaEndpoint>],
    ) -> Option<usize> {
        if set.is_empty() {
            return None;
        }
        let chosen = if self.custom_router.load(Ordering::Acquire) {
            let slot = self.router.read().unwrap_or_else(|p| p.into_inner());
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                slot.router.choose(request, set)
            }))
        } else {
            Ok(self.builtin.choose(request, set))
        };
        match chosen {
            Ok(i) => i.filter(|&i| i < set.len()),
            Err(p) => {
                tracing::error!(app = %self.app, deployment = %self.deployment,
                    panic = %crate::user::panic_message(p), "the request router panicked");
                crate::router::PowerOfTwoChoicesRouter.choose(request, set)
            }
        }
    }

    pub(crate) fn settings(&self) -> &Arc<Settings> {
        &self.settings
    }

    /// The application.
    pub fn app(&self) -> &AppName {
        &self.app
    }

    /// The deployment.
    pub fn deployment(&self) -> &DeploymentName {
        &self.deployment
    }

    /// Publish the replicas routers may use (only running, accepting ones). Sends
    /// only when the set of ids changed.
    pub fn publish(&self, replicas: Vec<Arc<ReplicaEndpoint>>) {
        let changed = self.tx.send_if_modified(|cur| {
            let same = cur.len() == replicas.len()
                && cur.iter().zip(&replicas).all(|(a, b)| Arc::ptr_eq(a, b));
            if !same {
                *cur = Arc::from(replicas);
            }
            !same
        });
        // A new replica is free slots: the oldest queued caller looks (the
        // others watch the set only to see the route close).
        if changed {
            self.changes.notify_waiters();
            self.queue.slot_freed();
        }
    }

    /// The replicas published now.
    pub fn replicas(&self) -> ReplicaSet {
        self.tx.borrow().clone()
    }

    /// Set the queue limit (`None` = unbounded).
    pub fn set_max_queued(&self, max: Option<u32>) {
        self.max_queued
            .store(max.unwrap_or(u32::MAX), Ordering::Release);
    }

    /// Set how a back-pressure rejection is answered (the deployment's
    /// `backpressure_config`).
    pub fn set_backpressure(&self, config: BackpressureConfig) {
        *self
            .backpressure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = config;
    }

    /// How a back-pressure rejection is answered: status code and `Retry-After`.
    pub fn backpressure(&self) -> BackpressureConfig {
        *self
            .backpressure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the deployment's target, as last configured here, is a fixed
    /// 0 replicas: a caller waiting for a replica would wait for ever (an
    /// autoscaled deployment at 0 is not: a request scales it up).
    pub fn zero_target(&self) -> bool {
        self.zero_target.load(Ordering::Acquire)
    }

    /// The queue limit (`None` = unbounded).
    pub fn max_queued(&self) -> Option<u32> {
        match self.max_queued.load(Ordering::Acquire) {
            u32::MAX => None,
            n => Some(n),
        }
    }

    /// Requests waiting in this process's handles for a slot now.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether the deployment failed to deploy: a call that finds no replica
    /// then fails at once ([`CallError::DeployFailed`]) instead of waiting.
    pub fn is_deploy_failed(&self) -> bool {
        self.deploy_failed.load(Ordering::Acquire)
    }

    /// Say whether the deployment failed to deploy for good (Ray's
    /// `_terminally_failed`: no replica of its target ever ran and its
    /// startup failures reached the retry limit), as its DeploymentActor
    /// judges it, or a node's agent from the head's copy. A DEPLOY_FAILED
    /// deployment whose target did run is not: its callers wait for a
    /// replica. Returns whether that changed; the callers waiting for a
    /// replica look again.
    pub fn set_deploy_failed(&self, failed: bool) -> bool {
        if self.deploy_failed.swap(failed, Ordering::AcqRel) == failed {
            return false;
        }
        // Every waiter watches the set: a no-op change wakes them to look.
        self.tx.send_modify(|_| {});
        self.changes.notify_waiters();
        true
    }

    /// What a call that finds no replica of a DEPLOY_FAILED deployment gets.
    pub(crate) fn deploy_failed_error(&self) -> CallError {
        CallError::DeployFailed {
            app: self.app.to_string(),
            deployment: self.deployment.to_string(),
        }
    }

    /// Requests waiting in other processes' handles, as they last reported
    /// (set by the node transport, docs/nodes.md): with
    /// [`queued`](Self::queued), the autoscaler's queued load.
    pub fn queued_elsewhere(&self) -> u64 {
        self.queued_elsewhere.load(Ordering::Acquire)
    }

    /// Set what [`queued_elsewhere`](Self::queued_elsewhere) reads: the sum
    /// over the other processes' latest reports.
    pub fn set_queued_elsewhere(&self, n: u64) {
        self.queued_elsewhere.store(n, Ordering::Release);
    }

    /// The deployment's routing counters (requests assigned, rejected, replica
    /// starts), recorded with atomic adds and read at scrape time.
    pub fn stats(&self) -> &RouteStats {
        &self.stats
    }

    /// Whether the deployment was deleted.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether something that serves the deployment made or took this route
    /// (see [`Directory::route`]); a route only a handle made is not.
    pub fn is_claimed(&self) -> bool {
        self.claimed.load(Ordering::Acquire)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<ReplicaSet> {
        self.tx.subscribe()
    }

    /// Notified at each change of the set (or of what a waiter checks
    /// beside it: closed, failed to deploy), waiters woken oldest first.
    pub(crate) fn changes(&self) -> &tokio::sync::Notify {
        &self.changes
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // Every waiter watches the set: emptying it wakes them all to see the
        // route closed.
        self.tx.send_modify(|set| *set = Arc::from(Vec::new()));
        self.changes.notify_waiters();
    }

    /// Close because the instance stopped: callers get `Unavailable`.
    fn shut_down(&self) {
        self.shut.store(true, Ordering::Release);
        self.close();
    }

    pub(crate) fn next_random(&self) -> u64 {
        // xorshift64*, shared by the route's callers; determinism per sequence of calls.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Join this route's queue (oldest first), or, for a request's first
    /// routing (`admit`), be refused at once beyond `max_queued_requests`; a
    /// request routed again after a refusal was admitted once, and joins.
    pub(crate) fn enqueue(&self, admit: bool) -> Result<Place, CallError> {
        let max = match admit {
            true => self.max_queued.load(Ordering::Acquire) as usize,
            false => usize::MAX,
        };
        self.queue.join(max).map_err(|full| {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            CallError::BackPressure {
                app: self.app.to_string(),
                deployment: self.deployment.to_string(),
                queued: full.waiting,
            }
        })
    }

    /// What a call through this closed route gets: `Unavailable` once its
    /// instance stopped, `NotFound` once its deployment was deleted.
    pub(crate) fn not_found(&self) -> CallError {
        if self.shut.load(Ordering::Acquire) {
            return self.unavailable();
        }
        CallError::NotFound {
            app: self.app.to_string(),
            deployment: self.deployment.to_string(),
        }
    }

    /// What a call gets whose instance stopped under it.
    pub(crate) fn unavailable(&self) -> CallError {
        CallError::Unavailable {
            app: self.app.to_string(),
            deployment: self.deployment.to_string(),
        }
    }
}

/// One deployment's routing counters, kept on its [`DeploymentRoute`] (so they
/// outlive DeploymentActor restarts) and shared by every handle to it.
#[derive(Debug, Default)]
pub struct RouteStats {
    pub(crate) assigned: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) replica_starts: AtomicU64,
}

impl RouteStats {
    /// Requests admitted to routing (Ray's `serve_num_router_requests`):
    /// handed to a replica at once, or let into the queue past back-pressure
    /// (counted then, as Ray counts them, whether a replica takes them or
    /// they time out or are cancelled while they wait). A request routed
    /// again after a remote replica refused it is not counted again.
    pub fn assigned(&self) -> u64 {
        self.assigned.load(Ordering::Relaxed)
    }

    /// Requests refused by back-pressure (`max_queued_requests`).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Replicas that began serving (published the first time): Ray's
    /// `serve_deployment_replica_starts`.
    pub fn replica_starts(&self) -> u64 {
        self.replica_starts.load(Ordering::Relaxed)
    }

    /// Count a replica started (its actor spawned, before its constructor
    /// runs, as Ray's counter: a constructor that fails every time counts
    /// every try). The DeploymentActor calls it.
    pub fn record_start(&self) {
        self.replica_starts.fetch_add(1, Ordering::Relaxed);
    }
}

type Key = (AppName, DeploymentName);

/// The routes, and the deployments of each application that have one (so a
/// restarted ApplicationActor finds its deployments without a scan of all).
#[derive(Default)]
struct Routes {
    by_key: HashMap<Key, Arc<DeploymentRoute>>,
    by_app: HashMap<AppName, Vec<DeploymentName>>,
}

/// Every deployment's route in one Serve instance. Cheap to clone; shared by the
/// control actors (which publish) and handles (which subscribe), and outliving both.
#[derive(Clone)]
pub struct Directory {
    routes: Arc<RwLock<Routes>>,
    /// Set once its instance stopped: new routes are born closed.
    shut: Arc<AtomicBool>,
    /// The runtime it was made on (its instance's): where a handle's call
    /// from a thread without one runs.
    home: Home,
}

impl Default for Directory {
    fn default() -> Self {
        Directory {
            routes: Arc::default(),
            shut: Arc::default(),
            home: Home::current(),
        }
    }
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("routes", &self.len())
            .finish()
    }
}

impl Directory {
    /// An empty directory, of the runtime it is made on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Its instance's runtime.
    pub(crate) fn home(&self) -> &Home {
        &self.home
    }

    /// The route of a deployment, created if it has none, and claimed: what
    /// serves the deployment calls this (its DeploymentActor as it comes to
    /// life, a node's agent for its replicas), and the handles whose route
    /// was deleted move to it.
    pub fn route(&self, app: &AppName, deployment: &DeploymentName) -> Arc<DeploymentRoute> {
        self.route_claimed(app, deployment, true)
    }

    /// The route of a deployment, created if it has none; claimed if `claim`
    /// (a route made so is claimed before any handle can see it).
    fn route_claimed(
        &self,
        app: &AppName,
        deployment: &DeploymentName,
        claim: bool,
    ) -> Arc<DeploymentRoute> {
        let key = (app.clone(), deployment.clone());
        // A claim of a route not claimed yet is made under the write lock:
        // `remove_unclaimed` (which holds it) must not drop a route between
        // its lookup here and its claim.
        if let Some(r) = self.get_key(&key)
            && (!claim || r.is_claimed())
        {
            return r;
        }
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        let Routes { by_key, by_app } = &mut *routes;
        let route = by_key
            .entry(key)
            .or_insert_with(|| {
                by_app
                    .entry(app.clone())
                    .or_default()
                    .push(deployment.clone());
                let route = DeploymentRoute::new(app.clone(), deployment.clone());
                if self.shut.load(Ordering::Acquire) {
                    route.shut_down();
                }
                Arc::new(route)
            })
            .clone();
        if claim {
            route.claimed.store(true, Ordering::Release);
        }
        route
    }

    /// The instance stopped (shut down or crashed): close every route, so each
    /// call waiting in a handle and every later call fails with
    /// [`CallError::Unavailable`] instead of waiting for a replica forever.
    pub fn shut_down(&self) {
        self.shut.store(true, Ordering::Release);
        let routes: Vec<_> = self
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_key
            .values()
            .cloned()
            .collect();
        for r in routes {
            r.shut_down();
        }
    }

    /// Whether [`shut_down`](Self::shut_down) was called.
    pub fn is_shut_down(&self) -> bool {
        self.shut.load(Ordering::Acquire)
    }

    /// The route of a live deployment, if it has one.
    pub fn get(&self, app: &AppName, deployment: &DeploymentName) -> Option<Arc<DeploymentRoute>> {
        self.get_key(&(app.clone(), deployment.clone()))
    }

    fn get_key(&self, key: &Key) -> Option<Arc<DeploymentRoute>> {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        routes.by_key.get(key).cloned()
    }

    /// The deployments of `app` that have a route now: every one whose
    /// DeploymentActor ever started in this process and was not deleted since
    /// (and any a handle was made for).
    pub fn deployments_of(&self, app: &AppName) -> Vec<DeploymentName> {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        routes.by_app.get(app).cloned().unwrap_or_default()
    }

    /// Remove a deleted deployment's route: its handles fail with `NotFound`.
    pub fn remove(&self, app: &AppName, deployment: &DeploymentName) {
        let key = (app.clone(), deployment.clone());
        let removed = {
            let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
            let removed = routes.by_key.remove(&key);
            if removed.is_some()
                && let Some(deps) = routes.by_app.get_mut(app)
            {
                deps.retain(|d| d != deployment);
                if deps.is_empty() {
                    routes.by_app.remove(app);
                }
            }
            removed
        };
        if let Some(r) = removed {
            r.close();
        }
    }

    /// `app` is gone: remove the routes of it that nothing serving claimed,
    /// made by handles alone (a replica's `InitContext::handle` to a
    /// deployment its application never had, say), which no DeploymentActor
    /// will ever remove; their callers fail with `NotFound`. Claimed routes
    /// are their DeploymentActors' to remove. Returns how many went.
    pub fn remove_unclaimed(&self, app: &AppName) -> usize {
        let removed: Vec<Arc<DeploymentRoute>> = {
            let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
            let Routes { by_key, by_app } = &mut *routes;
            let Some(deps) = by_app.get_mut(app) else {
                return 0;
            };
            let mut removed = Vec::new();
            deps.retain(|d| {
                let key = (app.clone(), d.clone());
                match by_key.get(&key) {
                    Some(r) if !r.is_claimed() => {
                        removed.extend(by_key.remove(&key));
                        false
                    }
                    _ => true,
                }
            });
            if deps.is_empty() {
                by_app.remove(app);
            }
            removed
        };
        for r in &removed {
            r.close();
        }
        removed.len()
    }

    /// The deployments whose routes have callers waiting in this process's
    /// handles now, and how many (a load report, `docs/nodes.md`).
    pub fn waiting(&self) -> Vec<(AppName, DeploymentName, usize)> {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        (routes.by_key.iter())
            .filter_map(|((app, dep), r)| {
                let n = r.queued();
                (n > 0).then(|| (app.clone(), dep.clone(), n))
            })
            .collect()
    }

    /// How many deployments have a route.
    pub fn len(&self) -> usize {
        self.routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_key
            .len()
    }

    /// Whether no deployment has a route.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A handle to a deployment. Its calls wait for a replica if none runs yet, and
    /// fail with `NotFound` once the deployment is deleted (until it is
    /// deployed again: a route only handles made since does not bring back
    /// the handles made before).
    pub fn handle(&self, app: &AppName, deployment: &DeploymentName) -> DeploymentHandle {
        DeploymentHandle::new(self.clone(), self.route_claimed(app, deployment, false))
    }

    /// A handle to a deployment that has a route now, making none: for a
    /// deployment being deleted, whose route goes when it ends (one made after
    /// that would have nothing behind it, and its calls would wait for ever).
    pub fn existing_handle(
        &self,
        app: &AppName,
        deployment: &DeploymentName,
    ) -> Option<DeploymentHandle> {
        // Claimed: one only a later handle made has nothing behind it.
        let route = self
            .get(app, deployment)
            .filter(|r| !r.is_closed() && r.is_claimed())?;
        Some(DeploymentHandle::new(self.clone(), route))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use flotilla_core::{AppName, AutoscalingConfig, DeploymentConfig, DeploymentName};

    /// A removed application's routes that only handles made go with it
    /// (closed: their callers stop waiting); a claimed one stays for its
    /// DeploymentActor to remove, and another application's are untouched.
    #[test]
    fn a_removed_applications_unclaimed_routes_go_and_claimed_ones_stay() {
        let d = super::Directory::new();
        let (a, b) = (AppName::new("a").unwrap(), AppName::new("b").unwrap());
        let dep = |n: &str| DeploymentName::new(n).unwrap();
        let served = d.route(&a, &dep("back"));
        let stray = d.route_claimed(&a, &dep("typo"), false);
        let elsewhere = d.route_claimed(&b, &dep("typo"), false);
        assert_eq!(d.remove_unclaimed(&a), 1);
        assert!(stray.is_closed() && !served.is_closed() && !elsewhere.is_closed());
        assert!(d.get(&a, &dep("typo")).is_none());
        assert_eq!(d.deployments_of(&a), [dep("back")]);
        assert_eq!(d.deployments_of(&b), [dep("typo")]);
        d.remove(&a, &dep("back"));
        assert_eq!(d.remove_unclaimed(&a), 0);
        assert!(d.deployments_of(&a).is_empty());
        assert_eq!(d.len(), 1);
    }

    /// Ray's "autoscaling will never happen" is said when a config earns it,
    /// once per pair of limits: a target set again does not repeat it.
    #[test]
    fn the_autoscaling_warning_is_said_once_per_pair_of_limits() {
        let directory = crate::Directory::new();
        let route = directory.route(
            &AppName::new("a").unwrap(),
            &DeploymentName::new("d").unwrap(),
        );
        let auto = |max_ongoing, target| {
            DeploymentConfig::default()
                .with_max_ongoing_requests(max_ongoing)
                .with_autoscaling(AutoscalingConfig {
                    target_ongoing_requests: target,
                    ..Default::default()
                })
        };
        assert!(!route.warn_if_autoscaling_cannot_scale(&auto(5, 2.0)));
        assert!(!route.warn_if_autoscaling_cannot_scale(&DeploymentConfig::default()));
        assert!(route.warn_if_autoscaling_cannot_scale(&auto(4, 5.0)));
        assert!(!route.warn_if_autoscaling_cannot_scale(&auto(4, 5.0)));
        assert!(route.warn_if_autoscaling_cannot_scale(&auto(3, 5.0)));
        // Mended, then broken again the same way: said again.
        assert!(!route.warn_if_autoscaling_cannot_scale(&auto(8, 5.0)));
        assert!(route.warn_if_autoscaling_cannot_scale(&auto(3, 5.0)));
    }
}
