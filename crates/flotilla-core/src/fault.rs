//! Named fault points: compiled in, costing one relaxed atomic load when unarmed.
//!
//! Tests and the simulator arm a point with a count; the next `count` passes through
//! it fire (crash the actor, fail the call). A seeded plan arms points from a seed.

use std::sync::{
    Arc,
    atomic::{AtomicU32, Ordering},
};

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultPoint {
    /// The Controller crashes after validating a mutating message, before its commit.
    ControllerBeforeCommit,
    /// The Controller crashes after the commit, before it replies.
    ControllerAfterCommit,
    /// The Controller crashes after replying, before it commands its children.
    ControllerAfterReply,
    /// An ApplicationActor crashes inside a reconcile step.
    ApplicationReconcile,
    /// A DeploymentActor crashes inside a reconcile step.
    DeploymentReconcile,
    /// A replica constructor fails (whatever the user code would do).
    ReplicaConstructor,
    /// A request handler panics; the replica is replaced.
    ReplicaHandler,
    /// A health check fails.
    ReplicaHealthCheck,
    /// The next checkpoint commit fails (nothing is written; the call that
    /// needed it answers the store's error).
    CommitFails,
    /// The next checkpoint commit is written, then fails as it ended, its
    /// outcome unknown to the Controller: it crashes, and its successor reads
    /// what the file holds.
    CommitUnsettled,
}

impl FaultPoint {
    /// Every fault point.
    pub const ALL: [FaultPoint; 10] = [
        FaultPoint::ControllerBeforeCommit,
        FaultPoint::ControllerAfterCommit,
        FaultPoint::ControllerAfterReply,
        FaultPoint::ApplicationReconcile,
        FaultPoint::DeploymentReconcile,
        FaultPoint::ReplicaConstructor,
        FaultPoint::ReplicaHandler,
        FaultPoint::ReplicaHealthCheck,
        FaultPoint::CommitFails,
        FaultPoint::CommitUnsettled,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// The armed fault points of one Serve instance; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    armed: Arc<[AtomicU32; FaultPoint::ALL.len()]>,
}

impl Faults {
    /// Nothing armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Make the next `times` passes through `point` fire.
    pub fn arm(&self, point: FaultPoint, times: u32) {
        self.armed[point.index()].store(times, Ordering::Release);
    }

    /// Disarm every point.
    pub fn clear(&self) {
        for a in self.armed.iter() {
            a.store(0, Ordering::Release);
        }
    }

    /// Pass through `point`: true if it fires (and uses up one arming).
    pub fn hit(&self, point: FaultPoint) -> bool {
        let a = &self.armed[point.index()];
        if a.load(Ordering::Relaxed) == 0 {
            return false;
        }
        a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Passes still armed at `point`.
    pub fn remaining(&self, point: FaultPoint) -> u32 {
        self.armed[point.index()].load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_exactly_as_often_as_armed() {
        let f = Faults::new();
        assert!(!f.hit(FaultPoint::ControllerAfterCommit));
        f.arm(FaultPoint::ControllerAfterCommit, 2);
        assert!(!f.hit(FaultPoint::ControllerBeforeCommit));
        assert!(f.hit(FaultPoint::ControllerAfterCommit));
        assert!(f.clone().hit(FaultPoint::ControllerAfterCommit));
        assert!(!f.hit(FaultPoint::ControllerAfterCommit));
        f.arm(FaultPoint::ApplicationReconcile, 5);
        f.clear();
        assert_eq!(f.remaining(FaultPoint::ApplicationReconcile), 0);
    }
}
