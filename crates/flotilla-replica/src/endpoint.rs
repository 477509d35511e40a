//! The data-plane face of one running replica: its user code and in-flight count.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
};

use flotilla_core::Faults;
use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::{ReplicaMsg, user::ErasedDeployment};

/// A replica's identity, unique in the process for its whole life.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReplicaId(pub u64);

static NEXT_REPLICA: AtomicU64 = AtomicU64::new(1);

impl ReplicaId {
    /// A fresh id, never handed out before in this process.
    pub fn fresh() -> Self {
        ReplicaId(NEXT_REPLICA.fetch_add(1, Ordering::Relaxed))
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
    max_ongoing: AtomicU32,
    accepting: AtomicBool,
    /// Wakes requests cut by a forced stop.
    pub(crate) kill_signal: Notify,
    /// Wakes callers queued on the deployment when a slot frees.
    slot_freed: Arc<Notify>,
    actor: ActorRef<ReplicaMsg>,
    /// For the `ReplicaHandler` fault point.
    pub(crate) faults: Faults,
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
    pub(crate) fn new(
        id: ReplicaId,
        node: String,
        user: Arc<dyn ErasedDeployment>,
        max_ongoing: u32,
        slot_freed: Arc<Notify>,
        actor: ActorRef<ReplicaMsg>,
        faults: Faults,
    ) -> Self {
        ReplicaEndpoint {
            id,
            node,
            user,
            in_flight: AtomicU32::new(0),
            max_ongoing: AtomicU32::new(max_ongoing),
            accepting: AtomicBool::new(true),
            kill_signal: Notify::new(),
            slot_freed,
            actor,
            faults,
        }
    }

    /// The replica's id.
    pub fn id(&self) -> ReplicaId {
        self.id
    }

    /// The node it runs on.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Requests running now: the router's load signal and the autoscaler's metric.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Whether it still takes new requests (false once stopping).
    pub fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    pub(crate) fn set_max_ongoing(&self, n: u32) {
        self.max_ongoing.store(n, Ordering::Release);
        self.slot_freed.notify_waiters();
    }

    pub(crate) fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Release);
    }

    pub(crate) fn kill(&self) {
        self.accepting.store(false, Ordering::Release);
        self.kill_signal.notify_waiters();
    }

    pub(crate) fn report_panic(&self, message: String) {
        // The replica may already be gone; then there is nobody left to tell.
        let _ = self
            .actor
            .cast(crate::actor::InternalMsg::Panicked(message).into());
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

/// One in-flight request on a replica; dropping it (completion, error or a dropped
/// caller future) frees the slot.
pub(crate) struct Slot(pub(crate) Arc<ReplicaEndpoint>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.slot_freed.notify_one();
    }
}
