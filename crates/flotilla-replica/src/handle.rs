//! `DeploymentHandle`: call a deployment from anywhere in the process.

use std::{sync::Arc, time::Duration};

use serde::{Serialize, de::DeserializeOwned};

use crate::{
    CallError, Directory, ReplicaEndpoint,
    endpoint::Slot,
    route::{DeploymentRoute, ReplicaSet},
};

/// The target of per-request access log events (one `INFO` event per call, with
/// `app`, `deployment`, `replica` and `ok`); filtered per application by its
/// logging config's `enable_access_log`.
pub const ACCESS_TARGET: &str = "flotilla::access";

/// A cheap, clonable handle to one deployment. Each call picks a replica by
/// power-of-two-choices over in-flight counts shared by every handle of the
/// deployment, waits in the handle's queue when every replica is at
/// `max_ongoing_requests`, and learns replica-set changes by subscription.
///
/// Calls keep working while control actors crash and restart: the route they
/// read outlives them.
#[derive(Clone)]
pub struct DeploymentHandle {
    directory: Directory,
    route: Arc<DeploymentRoute>,
    timeout: Option<Duration>,
    local_node: Option<Arc<str>>,
}

impl std::fmt::Debug for DeploymentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentHandle")
            .field("app", self.route.app())
            .field("deployment", self.route.deployment())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl DeploymentHandle {
    pub(crate) fn new(directory: Directory, route: Arc<DeploymentRoute>) -> Self {
        DeploymentHandle {
            directory,
            route,
            timeout: None,
            local_node: None,
        }
    }

    /// The same handle, preferring replicas on `node` (the caller's) while one of
    /// them has room; other replicas take the rest.
    pub fn prefer_node(mut self, node: impl Into<String>) -> Self {
        self.local_node = Some(Arc::from(node.into()));
        self
    }

    /// The same handle with a per-call timeout (time spent queued included).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The application this handle calls into.
    pub fn app(&self) -> &str {
        self.route.app().as_str()
    }

    /// The deployment this handle calls.
    pub fn deployment(&self) -> &str {
        self.route.deployment().as_str()
    }

    /// The replicas this handle can route to now.
    pub fn replicas(&self) -> ReplicaSet {
        self.live_route()
            .map(|r| r.replicas())
            .unwrap_or_else(|_| Arc::from(Vec::new()))
    }

    /// Send `request` and await the response. Requests and responses cross as
    /// MessagePack, so the deployment decodes into its own types.
    pub async fn call<Req, Resp>(&self, request: &Req) -> Result<Resp, CallError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        let bytes =
            rmp_serde::to_vec_named(request).map_err(|e| CallError::BadRequest(e.to_string()))?;
        let out = match self.timeout {
            None => self.call_bytes(bytes).await?,
            Some(t) => tokio::time::timeout(t, self.call_bytes(bytes))
                .await
                .map_err(|_| CallError::Timeout {
                    app: self.app().to_owned(),
                    deployment: self.deployment().to_owned(),
                })??,
        };
        rmp_serde::from_slice(&out).map_err(|e| CallError::BadResponse(e.to_string()))
    }

    /// The route to use: ours, or the live one if ours was deleted and the
    /// deployment has come back since.
    fn live_route(&self) -> Result<Arc<DeploymentRoute>, CallError> {
        if !self.route.is_closed() {
            return Ok(self.route.clone());
        }
        match self
            .directory
            .get(self.route.app(), self.route.deployment())
        {
            Some(r) if !r.is_closed() => Ok(r),
            Some(r) => Err(r.not_found()),
            None => Err(self.route.not_found()),
        }
    }

    async fn call_bytes(&self, bytes: Vec<u8>) -> Result<Vec<u8>, CallError> {
        let route = self.live_route()?;
        let mut rx = route.subscribe();
        let mut queued = None;
        loop {
            if route.is_closed() {
                return Err(route.not_found());
            }
            // Register for a freed slot before looking, so a slot freed between the
            // look and the wait is not missed.
            let freed = route.slot_freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let set = rx.borrow_and_update().clone();
            if let Some(slot) = self.pick_local(&route, &set).or_else(|| pick(&route, &set)) {
                drop(queued);
                let replica = slot.0.id();
                let result = run(slot, bytes).await;
                tracing::info!(target: ACCESS_TARGET, app = %route.app(),
                    deployment = %route.deployment(), replica = %replica, ok = result.is_ok(),
                    "request");
                return result;
            }
            if queued.is_none() {
                queued = Some(route.enqueue()?);
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return Err(route.not_found()) },
                _ = freed => {}
            }
        }
    }
}

impl DeploymentHandle {
    /// Power of two choices among the replicas on the preferred node, if any.
    fn pick_local(&self, route: &DeploymentRoute, set: &[Arc<ReplicaEndpoint>]) -> Option<Slot> {
        let node = self.local_node.as_deref()?;
        let local: Vec<Arc<ReplicaEndpoint>> =
            set.iter().filter(|e| e.node() == node).cloned().collect();
        pick(route, &local)
    }
}

/// Power of two choices: sample two replicas, try the less loaded first; if both
/// are full, take any replica with room so a free slot is never missed.
fn pick(route: &DeploymentRoute, set: &[Arc<ReplicaEndpoint>]) -> Option<Slot> {
    match set.len() {
        0 => None,
        1 => set[0].try_acquire(),
        n => {
            let r = route.next_random();
            let i = (r % n as u64) as usize;
            let mut j = ((r >> 32) % (n as u64 - 1)) as usize;
            if j >= i {
                j += 1;
            }
            let (a, b) = if set[i].in_flight() <= set[j].in_flight() {
                (i, j)
            } else {
                (j, i)
            };
            set[a]
                .try_acquire()
                .or_else(|| set[b].try_acquire())
                .or_else(|| set.iter().find_map(|e| e.try_acquire()))
        }
    }
}

async fn run(slot: Slot, bytes: Vec<u8>) -> Result<Vec<u8>, CallError> {
    let ep = slot.0.clone();
    if ep.faults.hit(flotilla_core::FaultPoint::ReplicaHandler) {
        drop(slot);
        let m = "injected fault: ReplicaHandler".to_owned();
        ep.report_panic(m.clone());
        return Err(CallError::Panicked(m));
    }
    let killed = ep.kill_signal.notified();
    let result = tokio::select! {
        r = ep.user.handle(bytes) => r,
        _ = killed => Err(CallError::Killed {
            replica: ep.id().to_string(),
        }),
    };
    drop(slot);
    if let Err(CallError::Panicked(m)) = &result {
        ep.report_panic(m.clone());
    }
    result
}
