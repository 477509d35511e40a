//! Control-plane faults: crash the Controller (now or at a fault point), kill
//! ApplicationActors and DeploymentActors, fail a checkpoint commit, crash the
//! whole process. Requests through handles must not fail for the first four.

use flotilla::FaultPoint;

use super::{
    events::{CONTROL_WINDOW, DATA_WINDOW},
    model::Target,
    setup::Sim,
};
use crate::{Result, traffic::Cause, workload::deployment_name};

impl Sim {
    /// Crash the Controller now (the Supervisor restarts it).
    pub(super) async fn crash_controller(&mut self, now: f64) -> Result<String> {
        self.read_metrics().await;
        self.serve()?.crash_controller();
        self.restarts.controller_crashes += 1;
        self.shared
            .windows()
            .open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
        Ok("crashed the Controller".to_owned())
    }

    /// Crash the Controller at `point` of its next mutating message.
    pub(super) fn arm_controller_crash(&mut self, point: FaultPoint, now: f64) -> Result<String> {
        self.serve()?.faults().arm(point, 1);
        // It fires (an invariant checks that every armed fault did).
        self.restarts.controller_crashes += 1;
        self.shared
            .windows()
            .open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
        Ok("armed a Controller crash for the next operation".to_owned())
    }

    /// Kill `n` ApplicationActors.
    pub(super) fn kill_applications(&mut self, n: usize, now: f64) -> Result<String> {
        let present = self.shared.model().present(false);
        let serve = self.serve()?;
        let picked = self.pick(&present, n);
        let names = self.shared.world.names().clone();
        let killed = picked
            .iter()
            .filter(|i| serve.crash_application(&names.name(**i)))
            .count();
        self.restarts.applications_killed += killed as u64;
        self.shared
            .windows()
            .open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
        Ok(format!("killed {killed} ApplicationActors"))
    }

    /// Kill one DeploymentActor in each of `n` applications.
    pub(super) fn kill_deployments(&mut self, n: usize, now: f64) -> Result<String> {
        let present = self.shared.model().present(false);
        let serve = self.serve()?;
        let picked = self.pick(&present, n);
        let names = self.shared.world.names().clone();
        let mut killed = 0;
        for i in picked {
            let deps = self.deployments_of(i);
            if deps.is_empty() {
                continue;
            }
            let d = self.rng.below(deps.len() as u64) as usize;
            if serve.crash_deployment(&names.name(i), &deps[d]) {
                killed += 1;
            }
        }
        self.restarts.deployment_actors_killed += killed;
        self.shared
            .windows()
            .open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
        Ok(format!("killed {killed} DeploymentActors"))
    }

    /// The names of application `idx`'s deployments, as its target says.
    fn deployments_of(&self, idx: u32) -> Vec<String> {
        let m = self.shared.model();
        match m.target(idx) {
            Some(Target::Imperative(_)) => (0..self.sc().workload.deployments as u32)
                .map(deployment_name)
                .collect(),
            Some(Target::Declared(d)) => d
                .runs
                .as_ref()
                .and_then(|r| r.built.spec())
                .map(|spec| {
                    spec.deployments
                        .iter()
                        .map(|d| d.name.to_string())
                        .collect()
                })
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// Make the next checkpoint commit fail.
    pub(super) fn fail_next_commit(&mut self, now: f64) -> Result<String> {
        self.serve()?.fail_next_commit();
        self.shared
            .windows()
            .open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
        Ok("the next checkpoint commit fails".to_owned())
    }

    /// Crash the process and start again on the same store.
    pub(super) async fn crash_process(&mut self, now: f64) -> Result<String> {
        self.restart_process().await?;
        self.shared
            .windows()
            .open(now, DATA_WINDOW, None, Cause::Process);
        Ok("crashed the process; started again on the same store".to_owned())
    }
}
