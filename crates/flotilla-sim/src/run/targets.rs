//! The per-application verdicts: every application of the model is checked
//! against Flotilla's statuses and its DeploymentActors' snapshots. Deleted
//! applications must be gone; present ones must be in their expected status,
//! and each of their deployments must run its acknowledged version, with its
//! declared number of replicas (or, autoscaled, a number within its bounds) all
//! RUNNING at that version and routed. Meanwhile it tallies the actor groups and
//! replicas that must exist, for the orphan check.

use std::collections::BTreeMap;

use flotilla::{ApplicationStatus, DeploymentSpec, ReplicaCount, ReplicaState, Serve};

use super::{
    invariants::Offenders,
    model::{Slot, Target},
    setup::Sim,
};
use crate::summary::{Invariant, Operations};

/// What the per-application pass found.
#[derive(Debug, Default)]
pub(super) struct TargetsPass {
    reflected: Offenders,
    statuses: Offenders,
    counts: Offenders,
    /// Actor groups that must exist: members wanted, and whether fewer will do.
    pub(super) expected_groups: BTreeMap<String, (usize, bool)>,
    /// Replicas the DeploymentActors own (each holds a reservation).
    pub(super) owned_replicas: usize,
    present: usize,
    deleted: usize,
    failing: usize,
    declared: usize,
    deployments: usize,
}

/// How many replicas a deployment must have.
#[derive(Debug, Clone, Copy)]
enum Want {
    Exactly(u32),
    Between(u32, u32),
}

impl Want {
    fn of(spec: &DeploymentSpec) -> Want {
        match &spec.config.num_replicas {
            ReplicaCount::Fixed(n) => Want::Exactly(*n),
            ReplicaCount::Auto(a) => Want::Between(a.min_replicas, a.max_replicas),
        }
    }

    fn admits(self, n: u32) -> bool {
        match self {
            Want::Exactly(w) => n == w,
            Want::Between(lo, hi) => (lo..=hi).contains(&n),
        }
    }
}

impl std::fmt::Display for Want {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Want::Exactly(n) => write!(f, "{n}"),
            Want::Between(lo, hi) => write!(f, "{lo}..={hi}"),
        }
    }
}

impl TargetsPass {
    /// The three per-application invariants.
    pub(super) fn verdicts(&self, ops: &Operations) -> Vec<Invariant> {
        let present = self.present;
        vec![
            Invariant {
                name: "every acknowledged operation is reflected".into(),
                ok: self.reflected.is_empty() && ops.abandoned == 0,
                detail: self.reflected.detail(format!(
                    "{} operations acknowledged, {} abandoned; {present} apps at their acknowledged targets ({} declared by config), {} deleted and gone",
                    ops.acknowledged, ops.abandoned, self.declared, self.deleted
                )),
            },
            Invariant {
                name: "every application RUNNING, or DEPLOY_FAILED where its code is broken or its build fails".into(),
                ok: self.statuses.is_empty(),
                detail: self.statuses.detail(format!(
                    "{} RUNNING, {} DEPLOY_FAILED (broken code or failed build)",
                    present - self.failing,
                    self.failing
                )),
            },
            Invariant {
                name: "replica counts and versions equal the targets".into(),
                ok: self.counts.is_empty(),
                detail: self.counts.detail(format!(
                    "{} deployments at target count and version",
                    self.deployments
                )),
            },
        ]
    }
}

impl Sim {
    /// Check every application of the model.
    pub(super) async fn check_targets(&self, serve: &Serve) -> TargetsPass {
        let mut pass = TargetsPass::default();
        let slots = self.shared.model().slots();
        for (idx, slot) in &slots {
            self.heartbeat.step();
            let name = self.shared.world.names().name(*idx);
            match slot {
                Slot::Unknown => {}
                Slot::Deleted | Slot::Deleting(_) => {
                    pass.deleted += 1;
                    if matches!(slot, Slot::Deleting(_)) {
                        pass.reflected
                            .add(format!("{name}: its deletion was never acknowledged"));
                    }
                    let status = serve.app_status(&name);
                    if status.status != ApplicationStatus::NotStarted {
                        pass.reflected
                            .add(format!("{name}: deleted, but {}", status.status));
                    }
                }
                Slot::Present(t) => self.check_present(serve, *idx, &name, t, &mut pass).await,
            }
        }
        pass
    }

    /// Check present application `idx` (`name`) at target `t`.
    async fn check_present(
        &self,
        serve: &Serve,
        idx: u32,
        name: &str,
        t: &Target,
        pass: &mut TargetsPass,
    ) {
        pass.present += 1;
        pass.failing += usize::from(t.fails());
        pass.declared += usize::from(t.declared().is_some());
        let status = serve.app_status(name);
        let want = if t.fails() {
            ApplicationStatus::DeployFailed
        } else {
            ApplicationStatus::Running
        };
        if status.status != want {
            pass.statuses.add(format!(
                "{name}: {} (want {want}): {}",
                status.status, status.message
            ));
        } else if let Some(why) = t.declared().and_then(|d| d.app.built.failure())
            && let why = why.to_string()
            && !status.message.contains(&why)
        {
            pass.statuses.add(format!(
                "{name}: DEPLOY_FAILED saying '{}', not why its build fails: {why}",
                status.message
            ));
        }
        let running = match t.running(&self.sc().workload, idx) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                pass.reflected.add(format!("{name}: {e}"));
                return;
            }
        };
        let ns = serve.namespace();
        pass.expected_groups.insert(
            format!("{ns}/deps:{name}"),
            (running.spec.deployments.len(), false),
        );
        for d in &running.spec.deployments {
            if !running.broken {
                pass.deployments += 1;
            }
            self.check_deployment(serve, name, d, running.broken, pass)
                .await;
        }
    }

    /// Check deployment `d` of application `name` (`broken`: no replica may run).
    async fn check_deployment(
        &self,
        serve: &Serve,
        name: &str,
        d: &DeploymentSpec,
        broken: bool,
        pass: &mut TargetsPass,
    ) {
        let dn = d.name.as_str();
        let group = format!("{}/replicas:{name}/{dn}", serve.namespace());
        let want = Want::of(d);
        let want_version = d.version();
        let snap = match serve.deployment_snapshot(name, dn).await {
            Ok(Some(s)) => s,
            _ => {
                let most = match want {
                    Want::Exactly(n) | Want::Between(_, n) => n,
                };
                pass.expected_groups.insert(
                    group,
                    (most as usize, broken || matches!(want, Want::Between(..))),
                );
                pass.reflected
                    .add(format!("{name}/{dn}: no DeploymentActor answers"));
                return;
            }
        };
        pass.owned_replicas += snap.replicas.len();
        if snap.version != want_version || !want.admits(snap.target.replicas) {
            pass.reflected.add(format!(
                "{name}/{dn}: target {} x{} is not the acknowledged {} x{want}",
                snap.version, snap.target.replicas, want_version
            ));
        }
        // Autoscaled: the autoscaler's (durable) decision is the count to meet.
        let n = match want {
            Want::Exactly(n) => n,
            Want::Between(..) => snap.target.replicas,
        };
        pass.expected_groups.insert(group, (n as usize, broken));
        let running = snap.count_at(ReplicaState::Running, &want_version);
        let routed = serve
            .deployment_handle(name, dn)
            .map(|h| h.replicas().len())
            .unwrap_or(0);
        if broken {
            if snap.count(ReplicaState::Running) != 0 {
                pass.counts
                    .add(format!("{name}/{dn}: broken code has running replicas"));
            }
        } else if running != n || snap.live() != n || routed != n as usize {
            pass.counts.add(format!(
                "{name}/{dn}: {running} running at the target version, {} live, {routed} routed; want {n}",
                snap.live()
            ));
        }
    }
}
