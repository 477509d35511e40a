//! `Serve`'s fault injection and orphan checks: what the tests, the
//! simulator and the benchmarks crash, fail and count, apart from the
//! embedding API they exercise.

use flotilla_controller::SupervisorMsg;
use flotilla_core::{AppName, Faults, actor_names};
use flotilla_replica::ReplicaId;
use flotilla_supervision::groups;

use super::Serve;

/// One living replica actor, as [`Serve::living_replicas`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LivingReplica {
    /// Its application.
    pub app: AppName,
    /// Its deployment.
    pub deployment: flotilla_core::DeploymentName,
    /// Its id (for [`Serve::crash_replica`]).
    pub id: ReplicaId,
}

impl Serve {
    /// Drop the connection to node `id` as a network failure would (fault
    /// injection): it is lost at once, its replicas are replaced, and when it
    /// dials again it is fenced and joins as a new node. Returns whether it was
    /// alive.
    pub async fn drop_node_connection(&self, id: &str) -> bool {
        match &self.inner.head {
            Some(head) => head.drop_node(id).await,
            None => false,
        }
    }

    /// Crash the Controller (fault injection); the Supervisor restarts it.
    pub fn crash_controller(&self) {
        let _ = self.inner.supervisor.cast(SupervisorMsg::CrashController);
    }

    /// Kill an application's ApplicationActor (fault injection); the Controller
    /// restarts it. Returns whether it was alive.
    pub fn crash_application(&self, app: &str) -> bool {
        let Ok(app) = AppName::new(app) else {
            return false;
        };
        self.kill(actor_names::application(&self.inner.ns, &app))
    }

    /// Kill a DeploymentActor (fault injection); its ApplicationActor restarts it.
    /// Returns whether it was alive.
    pub fn crash_deployment(&self, app: &str, deployment: &str) -> bool {
        let (Ok(app), Ok(dep)) = (
            AppName::new(app),
            flotilla_core::DeploymentName::new(deployment),
        ) else {
            return false;
        };
        self.kill(actor_names::deployment(&self.inner.ns, &app, &dep))
    }

    /// Kill one replica (fault injection), as if its process died: requests it
    /// runs fail with `CallError::Killed`, and its DeploymentActor replaces it.
    /// `replica` is an id from [`deployment_snapshot`](Self::deployment_snapshot).
    /// Returns whether it was alive.
    pub fn crash_replica(&self, app: &str, deployment: &str, replica: ReplicaId) -> bool {
        let (Ok(app), Ok(dep)) = (
            AppName::new(app),
            flotilla_core::DeploymentName::new(deployment),
        ) else {
            return false;
        };
        self.kill(actor_names::replica(&self.inner.ns, &app, &dep, replica.0))
    }

    fn kill(&self, name: String) -> bool {
        match ractor::registry::where_is(name) {
            Some(cell) => {
                cell.kill();
                true
            }
            None => false,
        }
    }

    /// Kill every actor of this instance at once, without draining, and close the
    /// store: what a process crash leaves behind (fault injection). This handle is
    /// unusable afterwards (its calls, and those of every handle, are
    /// `Unavailable`); `Serve::start` on the same file recovers everything
    /// acknowledged.
    pub async fn crash_process(&self) {
        let cells = self.inner.kill_all();
        let _ = self.inner.supervisor.wait(None).await;
        for cell in cells {
            let _ = cell.wait(None).await;
        }
        self.inner.release_namespace();
    }

    /// Every living replica of this instance, sorted (for fault injection with
    /// [`crash_replica`](Self::crash_replica), and orphan checks).
    pub fn living_replicas(&self) -> Vec<LivingReplica> {
        let ns = &self.inner.ns;
        let mut found: Vec<LivingReplica> = groups::with_prefix(&actor_names::namespace_prefix(ns))
            .into_iter()
            .flat_map(|(_, members)| members)
            .filter_map(|cell| {
                let (app, deployment, id) = actor_names::parse_replica(ns, &cell.get_name()?)?;
                Some(LivingReplica {
                    app,
                    deployment,
                    id: ReplicaId(id),
                })
            })
            .collect();
        found.sort();
        found
    }

    /// Actors of this instance still alive in process groups (deployment actors and
    /// replicas), by group: for orphan checks.
    pub fn living_groups(&self) -> Vec<(String, usize)> {
        groups::with_prefix(&actor_names::namespace_prefix(&self.inner.ns))
            .into_iter()
            .map(|(g, members)| (g, members.len()))
            .collect()
    }

    /// The fault points of this instance, to arm (fault injection).
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Make the next checkpoint commit fail (fault injection): the call that
    /// needed it answers the store's error, and nothing of it is written.
    pub fn fail_next_commit(&self) {
        self.inner
            .faults
            .arm(flotilla_core::FaultPoint::CommitFails, 1);
    }
}
