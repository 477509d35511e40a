//! The data-plane face of one running replica: its user code and in-flight count.

use std::{
    fmt,
    sync::{
        Arc, OnceLock, Weak,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::SystemTime,
};

use flotilla_core::Faults;
use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{
    DeploymentRoute, ModelIds, ReplicaMsg, batching::Batcher, model_cache::ModelHub,
    queue::WaitQueue, stats::ReplicaStats, user::ErasedDeployment,
};

/// A replica's identity, unique in the process for its whole life.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReplicaId(pub u64);

static NEXT_REPLICA: AtomicU64 = AtomicU64::new(1);

impl ReplicaId {
    /// A fresh id, never handed out before in this process.
    pub fn fresh() -> Self {
        ReplicaId(NEXT_REPLICA.fetch_add(1, Ordering::Relaxed))
    }

    /// Make every later [`fresh`](Self::fresh) id at least `floor` (a head with
    /// nodes seeds it from the clock, so ids stay unique across its restarts).
    pub fn seed(floor: u64) {
        NEXT_REPLICA.fetch_max(floor, Ordering::Relaxed);
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replica#{}", self.0)
    }
}

/// One running replica as routers see it. Requests run in the caller's task
/// directly against the user code, so a call costs no actor hop.
pub struct ReplicaEndpoint {
    id: ReplicaId,
    node: String,
    pub(crate) user: Arc<dyn ErasedDeployment>,
    in_flight: AtomicU32,
    /// For a replica in another process: the requests running on it from
    /// every caller, as its process last reported (docs/nodes.md).
    reported: AtomicU32,
    max_ongoing: AtomicU32,
    accepting: AtomicBool,
    /// Set by a forced stop: wakes the requests it cuts, and tells one that
    /// begins listening later.
    killed: std::sync::atomic::AtomicBool,
    /// Wakes the requests waiting in [`killed`](Self::killed), oldest first
    /// (a watch channel wakes its waiters in an order drawn from tokio's
    /// thread RNG, which a paused-time run cannot seed).
    killed_notify: tokio::sync::Notify,
    /// Wakes callers queued on the deployment when a slot frees.
    queue: Arc<WaitQueue>,
    /// Its replica actor; `None` for a replica in another process (and in
    /// this crate's unit tests).
    actor: Option<ActorRef<ReplicaMsg>>,
    /// How requests reach a replica in another process (`crate::remote`).
    remote: Option<Arc<dyn crate::remote::RemoteCall>>,
    /// Where a multiplexed deployment's model ids are published.
    models: Option<Arc<ModelHub>>,
    /// Its batcher, started by the first batched request.
    batcher: OnceLock<Batcher>,
    /// The runtime it was made on: its batcher runs there.
    home: crate::home::Home,
    /// The route of its deployment in this process (weak: the route holds
    /// its endpoints), whose settings requests from other processes run by.
    route: Weak<DeploymentRoute>,
    /// For the `ReplicaHandler` fault point.
    pub(crate) faults: Faults,
    /// Request counters, read at scrape time.
    stats: ReplicaStats,
    /// For a replica in another process: its batcher's figures, as its
    /// process last reported them (none before its first report).
    reported_batches: OnceLock<crate::BatchStats>,
    /// For a replica in another process: its model cache's figures, as its
    /// process last reported them.
    reported_models: OnceLock<crate::ModelStats>,
    /// When it began serving (its endpoint was made).
    started_at: SystemTime,
}

impl fmt::Debug for ReplicaEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaEndpoint")
            .field("id", &self.id)
            .field("node", &self.node)
            .field("in_flight", &self.in_flight())
            .field("accepting", &self.is_accepting())
            .finish()
    }
}

impl ReplicaEndpoint {
    /// A fresh endpoint of `id` on `node` serving `user`, accepting, with no
    /// request in flight: no actor, transport, models or route yet (the
    /// constructors below add theirs).
    fn base(
        id: ReplicaId,
        node: String,
        user: Arc<dyn ErasedDeployment>,
        max_ongoing: u32,
        queue: Arc<WaitQueue>,
    ) -> Self {
        ReplicaEndpoint {
            id,
            node,
            user,
            in_flight: AtomicU32::new(0),
            reported: AtomicU32::new(0),
            max_ongoing: AtomicU32::new(max_ongoing),
            accepting: AtomicBool::new(true),
            killed: std::sync::atomic::AtomicBool::new(false),
            killed_notify: tokio::sync::Notify::new(),
            queue,
            actor: None,
            remote: None,
            models: None,
            batcher: OnceLock::new(),
            home: crate::home::Home::current(),
            route: Weak::new(),
            faults: Faults::new(),
            stats: ReplicaStats::default(),
            reported_batches: OnceLock::new(),
            reported_models: OnceLock::new(),
            started_at: SystemTime::now(),
        }
    }

    pub(crate) fn new(
        id: ReplicaId,
        node: String,
        user: Arc<dyn ErasedDeployment>,
        max_ongoing: u32,
        route: &Arc<DeploymentRoute>,
        actor: ActorRef<ReplicaMsg>,
        faults: Faults,
    ) -> Self {
        ReplicaEndpoint {
            models: user.models().cloned(),
            actor: Some(actor),
            route: Arc::downgrade(route),
            faults,
            ..Self::base(id, node, user, max_ongoing, route.queue.clone())
        }
    }

    /// The endpoint of a replica in another process: requests go through `call`.
    pub(crate) fn new_remote(
        id: ReplicaId,
        node: String,
        call: Arc<dyn crate::remote::RemoteCall>,
        max_ongoing: u32,
        queue: Arc<WaitQueue>,
    ) -> Self {
        ReplicaEndpoint {
            remote: Some(call),
            // A replica elsewhere batches and loads its models there; its
            // process reports its model ids (docs/nodes.md).
            models: Some(Arc::new(ModelHub::mirror())),
            ..Self::base(
                id,
                node,
                Arc::new(crate::remote::Elsewhere),
                max_ongoing,
                queue,
            )
        }
    }

    /// Whether the replica runs in another process (its requests cross the
    /// wire; see `docs/nodes.md`).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    pub(crate) fn remote_call(&self) -> Option<&Arc<dyn crate::remote::RemoteCall>> {
        self.remote.as_ref()
    }

    /// Its request counters: successes, errors by kind and the processing
    /// latency of its user code, recorded by every call with atomic adds only.
    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    /// When it began serving (the wall-clock time its constructor finished).
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// The replica's id.
    pub fn id(&self) -> ReplicaId {
        self.id
    }

    /// The node it runs on.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Requests running now that this process sent: the router's load signal
    /// (and, for a replica of this process, every caller's).
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Requests running on the replica from every caller, the autoscaler's
    /// metric: for a replica of this process its [`in_flight`](Self::in_flight);
    /// for one in another process, what its process last reported, or what
    /// this one sent it if more (a report lags by up to a heartbeat).
    pub fn load(&self) -> u32 {
        self.in_flight().max(self.reported.load(Ordering::Acquire))
    }

    pub(crate) fn set_reported(&self, n: u32) {
        self.reported.store(n, Ordering::Release);
    }

    /// Whether it still takes new requests (false once stopping).
    pub fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    /// Its `max_ongoing_requests` now.
    pub fn max_ongoing_requests(&self) -> u32 {
        self.max_ongoing.load(Ordering::Acquire)
    }

    /// Whether it would take one more request now: accepting, and below
    /// `max_ongoing_requests` (requests waiting for a batch count).
    pub fn has_room(&self) -> bool {
        self.is_accepting() && self.in_flight() < self.max_ongoing_requests()
    }

    /// Whether it runs a multiplexed deployment (one that loads models).
    pub fn is_multiplexed(&self) -> bool {
        self.models.as_ref().is_some_and(|m| m.is_known())
    }

    /// Whether it has model `model_id` loaded, or is loading it; false for a
    /// deployment that is not multiplexed. Reads the replica's published ids
    /// (no message, no allocation).
    pub fn has_model(&self, model_id: &str) -> bool {
        self.models.as_ref().is_some_and(|m| m.contains(model_id))
    }

    /// How many models it has loaded or is loading (0 unless multiplexed).
    /// Reads the replica's published ids (no message, no allocation).
    pub fn model_count(&self) -> usize {
        self.models.as_ref().map_or(0, |m| m.count())
    }

    /// How much its least recently used model has been used lately (its
    /// heat: uses weighted by age, comparable across the deployment's
    /// replicas in this process; `-inf` if it holds none); `None` unless
    /// multiplexed and local. A new model loaded here evicts that one when
    /// the replica is full.
    pub(crate) fn coldest_model_heat(&self) -> Option<f64> {
        self.models.as_ref().and_then(|m| m.coldest())
    }

    /// Set what [`coldest_model_heat`](Self::coldest_model_heat) reports:
    /// a model used at each of `ticks` (router tests).
    #[cfg(test)]
    pub(crate) fn set_coldest_model_uses(&self, ticks: &[u64]) {
        if let Some(m) = &self.models {
            m.set_coldest(crate::model_cache::Heat::of_uses(ticks));
        }
    }

    /// The ids of the models it has loaded, sorted (empty unless multiplexed).
    pub fn model_ids(&self) -> Vec<String> {
        self.models
            .as_ref()
            .map(|m| crate::multiplex::sorted_ids(&m.current()))
            .unwrap_or_default()
    }

    /// A subscription to its model ids, updated as it loads and unloads
    /// models; `None` unless multiplexed (for a replica in another process,
    /// always a subscription, updated as its process reports).
    pub fn watch_models(&self) -> Option<watch::Receiver<ModelIds>> {
        self.models.as_ref().map(|m| m.subscribe())
    }

    /// Its batcher's figures; `None` until its first batched request (for a
    /// replica in another process, which batches there: until its process
    /// first reports them).
    pub fn batch_stats(&self) -> Option<&crate::BatchStats> {
        (self.batcher.get().map(Batcher::stats)).or_else(|| self.reported_batches.get())
    }

    /// Its model cache's figures; `None` unless it runs a multiplexed
    /// deployment (in another process: until its process first reports
    /// them).
    pub fn model_stats(&self) -> Option<&crate::ModelStats> {
        (self.models.as_ref().and_then(|m| m.stats())).or_else(|| self.reported_models.get())
    }

    /// For a replica in another process: take its batch and model figures as
    /// its process reports them, each in place of the last (`None`: not in
    /// this report).
    pub(crate) fn mirror_figures(
        &self,
        batches: Option<&crate::BatchCounts>,
        models: Option<&crate::ModelCounts>,
    ) {
        if let Some(b) = batches {
            self.reported_batches
                .get_or_init(crate::BatchStats::default)
                .set_counts(b);
        }
        if let Some(m) = models {
            self.reported_models
                .get_or_init(crate::ModelStats::default)
                .set_counts(m);
        }
    }

    /// The models it has loaded and is loading now; `None` unless multiplexed.
    pub fn models(&self) -> Option<ModelIds> {
        self.models
            .as_ref()
            .filter(|m| m.is_known())
            .map(|m| m.current())
    }

    /// A replica in another process reported `ids` (see
    /// [`RemoteEndpoint::set_models`](crate::remote::RemoteEndpoint::set_models)).
    pub(crate) fn mirror_models(&self, ids: ModelIds) {
        if let Some(m) = self.models.as_ref().filter(|_| self.is_remote()) {
            m.set(ids);
        }
    }

    /// Its deployment's route in this process, while it lasts (`None` for a
    /// replica in another process).
    pub(crate) fn own_route(&self) -> Option<Arc<DeploymentRoute>> {
        self.route.upgrade()
    }

    /// Its batcher, started on first use.
    pub(crate) fn batcher(&self, route: &DeploymentRoute) -> &Batcher {
        self.batcher.get_or_init(|| {
            Batcher::start(
                &self.home,
                self.user.clone(),
                route.settings().clone(),
                route.app().clone(),
                route.deployment().clone(),
                self.id,
            )
        })
    }

    pub(crate) fn set_max_ongoing(&self, n: u32) {
        self.max_ongoing.store(n, Ordering::Release);
        self.queue.slot_freed();
    }

    /// Resolves once the replica is killed ([`kill`](Self::kill)), at once
    /// if it already was: however late a request holding a slot begins
    /// listening, it does not miss its replica's kill.
    pub(crate) async fn killed(&self) {
        loop {
            let woken = self.killed_notify.notified();
            tokio::pin!(woken);
            // Registered before the flag is read: a kill in between wakes it.
            woken.as_mut().enable();
            if self.killed.load(Ordering::Acquire) {
                return;
            }
            woken.await;
        }
    }

    /// It drains: it takes no new request, and a batch forming on it goes
    /// with what it holds.
    pub(crate) fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Release);
        if let Some(b) = self.batcher.get() {
            b.drain();
        }
    }

    /// Cut every request (its replica stopped or was killed): also ends its
    /// batcher. Its models go with [`unload_models`](Self::unload_models).
    pub(crate) fn kill(&self) {
        self.accepting.store(false, Ordering::Release);
        self.killed.store(true, Ordering::Release);
        self.killed_notify.notify_waiters();
        if let Some(b) = self.batcher.get() {
            b.close();
        }
    }

    /// Unload the models of a multiplexed replica served here, in a task of
    /// their own (the one to wait for, if any). Once they are unloaded (or
    /// going), a second call unloads nothing.
    pub(crate) fn unload_models(&self) -> Option<tokio::task::JoinHandle<()>> {
        if self.models.is_none() || self.is_remote() {
            return None;
        }
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let user = self.user.clone();
        Some(rt.spawn(async move { user.shutdown().await }))
    }

    /// Cancel the model loads of a multiplexed replica served here that are
    /// still running or queued: its stop waits for them no longer (a loader
    /// that never returns would otherwise keep its task, and the deployment's
    /// value with whatever it holds, for good).
    pub(crate) fn abort_model_loads(&self) {
        if self.models.is_some() && !self.is_remote() {
            self.user.abort_loads();
        }
    }

    pub(crate) fn report_panic(&self, message: String) {
        // The replica may already be gone; then there is nobody left to tell. A
        // replica elsewhere reports its own panics.
        if let Some(actor) = &self.actor {
            let _ = actor.cast(crate::actor::InternalMsg::Panicked(message).into());
        }
    }

    /// Take a request slot if the replica accepts and is below its limit.
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<Slot> {
        let max = self.max_ongoing.load(Ordering::Acquire);
        let mut cur = self.in_flight.load(Ordering::Acquire);
        loop {
            if cur >= max || !self.is_accepting() {
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let slot = Slot(self.clone());
                    // It may have begun stopping between the check and the increment:
                    // then give the slot back, and the caller tries another replica.
                    return self.is_accepting().then_some(slot);
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// An endpoint without an actor, for this crate's unit tests: `max_ongoing`
/// slots on `node`, holding `models` (as a multiplexed replica) if any.
#[cfg(test)]
pub(crate) fn test_endpoint(
    id: u64,
    node: &str,
    max_ongoing: u32,
    models: &[&str],
) -> Arc<ReplicaEndpoint> {
    let multiplexed = !models.is_empty();
    test_endpoint_of(id, node, max_ongoing, multiplexed.then_some(models))
}

/// A multiplexed replica's endpoint (see [`test_endpoint`]), holding `models`
/// (perhaps none).
#[cfg(test)]
pub(crate) fn test_multiplexed_endpoint(
    id: u64,
    node: &str,
    max_ongoing: u32,
    models: &[&str],
) -> Arc<ReplicaEndpoint> {
    test_endpoint_of(id, node, max_ongoing, Some(models))
}

#[cfg(test)]
fn test_endpoint_of(
    id: u64,
    node: &str,
    max_ongoing: u32,
    models: Option<&[&str]>,
) -> Arc<ReplicaEndpoint> {
    struct Nothing;
    impl crate::Deployment for Nothing {
        type Request = ();
        type Response = ();
        async fn handle(&self, _: ()) -> Result<(), crate::UserError> {
            Ok(())
        }
    }
    Arc::new(ReplicaEndpoint {
        models: models.map(|m| Arc::new(ModelHub::with_ids(m))),
        ..ReplicaEndpoint::base(
            ReplicaId(id),
            node.to_owned(),
            Arc::new(crate::user::Erased(Nothing)),
            max_ongoing,
            Arc::default(),
        )
    })
}

/// One in-flight request on a replica; dropping it (completion, error or a dropped
/// caller future) frees the slot.
pub(crate) struct Slot(pub(crate) Arc<ReplicaEndpoint>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.queue.slot_freed();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::{CallError, payload::Payload, user::Call};

    #[tokio::test]
    async fn a_request_that_got_its_slot_before_a_kill_and_starts_after_it_is_cut() {
        let ep = test_endpoint(1, "n1", 2, &[]);
        let slot = ep.try_acquire().unwrap();
        ep.kill();
        let call = Call {
            payload: Payload::of(()),
            model_id: None,
        };
        let err = crate::handle::run(None, slot, call).await.err();
        assert_eq!(
            err,
            Some(CallError::Killed {
                replica: ep.id().to_string()
            })
        );
        assert_eq!(ep.in_flight(), 0);
    }
}
