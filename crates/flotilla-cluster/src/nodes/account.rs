//! A replica's account as the node layer keeps it on both sides of a link:
//! the node's agent for each replica it runs, the head's proxy for each
//! replica on a node. Its events move it here, in one place, so that both
//! sides tell a re-adopting DeploymentActor the same thing.

use flotilla_core::DeploymentVersion;
use flotilla_replica::ReplicaPhase;

use super::wire::WireEvent;

/// What a replica's events say of it: its phase, the version it runs, and
/// why it is condemned (its start failed, it turned unhealthy, a
/// reconfigure failed), the first reason kept.
#[derive(Debug, Clone)]
pub(crate) struct Account {
    pub(crate) phase: ReplicaPhase,
    pub(crate) version: DeploymentVersion,
    pub(crate) condemned: Option<String>,
}

impl Account {
    /// A replica whose constructor is about to run.
    pub(crate) fn starting(version: DeploymentVersion) -> Account {
        Account {
            phase: ReplicaPhase::Starting,
            version,
            condemned: None,
        }
    }

    /// Take one of the replica's events.
    pub(crate) fn apply(&mut self, event: &WireEvent) {
        match event {
            WireEvent::Ready { version } => {
                self.phase = ReplicaPhase::Running;
                self.version = version.clone();
            }
            WireEvent::Reconfigured { version } => {
                // A reconfigure that ends while the replica drains leaves it
                // draining.
                if self.phase != ReplicaPhase::Stopping {
                    self.phase = ReplicaPhase::Running;
                }
                self.version = version.clone();
            }
            WireEvent::StartFailed { error } => {
                self.phase = ReplicaPhase::StartFailed;
                self.condemned = Some(error.clone());
            }
            WireEvent::Unhealthy { reason } => {
                self.condemned.get_or_insert_with(|| reason.clone());
            }
            WireEvent::ReconfigureFailed { error } => {
                self.condemned.get_or_insert_with(|| error.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_move_the_phase_and_the_first_reason_is_kept() {
        let v1 = DeploymentVersion {
            code: flotilla_core::CodeVersion::explicit("v1"),
            config: flotilla_core::ConfigVersion(1),
        };
        let mut a = Account::starting(v1.clone());
        a.apply(&WireEvent::Ready {
            version: v1.clone(),
        });
        assert_eq!(a.phase, ReplicaPhase::Running);
        a.apply(&WireEvent::Unhealthy {
            reason: "first".into(),
        });
        a.apply(&WireEvent::ReconfigureFailed {
            error: "second".into(),
        });
        assert_eq!(a.condemned.as_deref(), Some("first"));
        // Draining stays draining when a reconfigure ends.
        a.phase = ReplicaPhase::Stopping;
        a.apply(&WireEvent::Reconfigured { version: v1 });
        assert_eq!(a.phase, ReplicaPhase::Stopping);
        let mut b = Account::starting(a.version.clone());
        b.apply(&WireEvent::StartFailed {
            error: "boom".into(),
        });
        assert_eq!(
            (b.phase, b.condemned.as_deref()),
            (ReplicaPhase::StartFailed, Some("boom"))
        );
    }
}
