//! The final verdicts: every acknowledged operation reflected, every
//! application in its expected status, replica counts and versions at target,
//! no orphan actor or reservation, no request lost to a control-plane crash,
//! no escalation. Judged against the model once the system has settled.

use std::collections::{BTreeMap, BTreeSet};

use flotilla::{ApplicationStatus, ReplicaState};

use super::{model::Slot, setup::Sim};
use crate::{
    summary::Invariant,
    workload::{self, app_name, deployment_name},
};

impl Sim {
    /// Judge every invariant.
    pub(super) async fn check(&mut self) -> Vec<Invariant> {
        let mut out = Vec::new();
        let Some(serve) = self.shared.handles().serve() else {
            out.push(Invariant {
                name: "a Serve instance is alive".into(),
                ok: false,
                detail: "none".into(),
            });
            return out;
        };
        let sc = self.sc().clone();
        let slots = self.shared.model().slots();
        let ns = serve.namespace().to_owned();
        let deps = sc.workload.deployments as u32;

        let mut reflected = Offenders::default();
        let mut statuses = Offenders::default();
        let mut counts = Offenders::default();
        let mut orphans = Offenders::default();
        let mut expected_groups: BTreeMap<String, (usize, bool)> = BTreeMap::new();
        let mut owned_replicas = 0usize;
        let (mut present, mut deleted, mut broken) = (0, 0, 0);
        for (idx, slot) in &slots {
            self.heartbeat.step();
            let name = app_name(*idx);
            let status = serve.app_status(&name);
            match slot {
                Slot::Unknown => {}
                Slot::Deleted | Slot::Deleting(_) => {
                    deleted += 1;
                    if matches!(slot, Slot::Deleting(_)) {
                        reflected.add(format!("{name}: its deletion was never acknowledged"));
                    }
                    if status.status != ApplicationStatus::NotStarted {
                        reflected.add(format!("{name}: deleted, but {}", status.status));
                    }
                }
                Slot::Present(t) => {
                    present += 1;
                    broken += usize::from(t.broken);
                    let want = if t.broken {
                        ApplicationStatus::DeployFailed
                    } else {
                        ApplicationStatus::Running
                    };
                    if status.status != want {
                        statuses.add(format!(
                            "{name}: {} (want {want}): {}",
                            status.status, status.message
                        ));
                    }
                    let spec = match workload::app_spec(&sc.workload, *idx, t) {
                        Ok(s) => s,
                        Err(e) => {
                            reflected.add(format!("{name}: {e}"));
                            continue;
                        }
                    };
                    expected_groups.insert(format!("{ns}/deps:{name}"), (deps as usize, false));
                    for d in 0..deps {
                        let dn = deployment_name(d);
                        expected_groups.insert(
                            format!("{ns}/replicas:{name}/{dn}"),
                            (t.replicas as usize, t.broken),
                        );
                        let Some(want_version) =
                            spec.deployments.get(d as usize).map(|s| s.version())
                        else {
                            continue;
                        };
                        let snap = match serve.deployment_snapshot(&name, &dn).await {
                            Ok(Some(s)) => s,
                            _ => {
                                reflected.add(format!("{name}/{dn}: no DeploymentActor answers"));
                                continue;
                            }
                        };
                        owned_replicas += snap.replicas.len();
                        if snap.version != want_version || snap.target.replicas != t.replicas {
                            reflected.add(format!(
                                "{name}/{dn}: target {} x{} is not the acknowledged {} x{}",
                                snap.version, snap.target.replicas, want_version, t.replicas
                            ));
                        }
                        let running = snap.count_at(ReplicaState::Running, &want_version);
                        let routed = serve
                            .deployment_handle(&name, &dn)
                            .map(|h| h.replicas().len())
                            .unwrap_or(0);
                        if t.broken {
                            if snap.count(ReplicaState::Running) != 0 {
                                counts
                                    .add(format!("{name}/{dn}: broken code has running replicas"));
                            }
                        } else if running != t.replicas
                            || snap.live() != t.replicas
                            || routed != t.replicas as usize
                        {
                            counts.add(format!(
                                "{name}/{dn}: {running} running at the target version, {} live, {routed} routed; want {}",
                                snap.live(),
                                t.replicas
                            ));
                        }
                    }
                }
            }
        }
        out.push(Invariant {
            name: "every acknowledged operation is reflected".into(),
            ok: reflected.is_empty() && self.ops.abandoned == 0,
            detail: reflected.detail(format!(
                "{} operations acknowledged, {} abandoned; {present} apps at their acknowledged targets, {deleted} deleted and gone",
                self.ops.acknowledged, self.ops.abandoned
            )),
        });
        out.push(Invariant {
            name: "every application RUNNING, or DEPLOY_FAILED where its code is broken".into(),
            ok: statuses.is_empty(),
            detail: statuses.detail(format!(
                "{} RUNNING, {broken} DEPLOY_FAILED (broken code)",
                present - broken
            )),
        });
        out.push(Invariant {
            name: "replica counts and versions equal the targets".into(),
            ok: counts.is_empty(),
            detail: counts.detail(format!(
                "{} deployments at target count and version",
                (present - broken) * deps as usize
            )),
        });

        // Orphans: exactly the expected actors are alive, in this instance and none
        // in the crashed ones; the cluster holds exactly the owned replicas.
        let living = serve.living_groups();
        let mut seen = BTreeSet::new();
        for (group, n) in &living {
            seen.insert(group.clone());
            match expected_groups.get(group) {
                Some((want, false)) if n == want => {}
                Some((want, true)) if n <= want => {}
                Some((want, _)) => orphans.add(format!("{group}: {n} alive, want {want}")),
                None => orphans.add(format!("{group}: {n} alive, expected none")),
            }
        }
        for (group, (want, lenient)) in &expected_groups {
            if !seen.contains(group) && !*lenient && *want > 0 {
                orphans.add(format!("{group}: none alive, want {want}"));
            }
        }
        for (i, d) in self.dead.iter().enumerate() {
            let left = d.living_groups();
            if !left.is_empty() {
                orphans.add(format!("crashed process #{}: {left:?} still alive", i + 1));
            }
        }
        let reserved = self.shared.cluster.view().reserved;
        if reserved != owned_replicas {
            orphans.add(format!(
                "the cluster holds {reserved} reservations for {owned_replicas} owned replicas"
            ));
        }
        let actors: usize = living.iter().map(|(_, n)| n).sum();
        out.push(Invariant {
            name: "no orphan replica (Serve::living_groups, crashed processes, reservations)".into(),
            ok: orphans.is_empty(),
            detail: orphans.detail(format!(
                "{actors} actors in {} groups as expected, {} crashed processes empty, {reserved} reservations",
                living.len(),
                self.dead.len()
            )),
        });
        let r = self.shared.traffic.stats.counts();
        out.push(Invariant {
            name: "no request through a handle failed during control-plane crashes".into(),
            ok: r.failed_during_control_plane_crashes == 0,
            detail: if r.failed_during_control_plane_crashes == 0 {
                format!(
                    "0 of {} requests; {} failed where a node, replica, flap or the process was lost",
                    r.sent,
                    r.failed_excused.values().sum::<u64>()
                )
            } else {
                format!(
                    "{} failed: {}",
                    r.failed_during_control_plane_crashes,
                    r.unexcused_examples.join("; ")
                )
            },
        });
        let fatal = self.shared.observed().fatal.clone();
        out.push(Invariant {
            name: "the Supervisor never gave up".into(),
            ok: fatal.is_empty(),
            detail: if fatal.is_empty() {
                "no escalation".into()
            } else {
                fatal.join("; ")
            },
        });
        out
    }
}

/// The first few offenders of an invariant, and how many there were.
#[derive(Debug, Default)]
struct Offenders {
    first: Vec<String>,
    count: usize,
}

impl Offenders {
    fn add(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < 5 {
            self.first.push(what);
        }
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn detail(&self, ok: String) -> String {
        if self.count == 0 {
            ok
        } else {
            format!("{} offenders, e.g. {}", self.count, self.first.join("; "))
        }
    }
}
