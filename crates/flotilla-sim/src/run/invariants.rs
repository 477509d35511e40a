//! The final verdicts, judged against the model once the system has settled:
//! the per-application ones (`targets`: every acknowledged operation reflected,
//! every application in its expected status, replica counts and versions at
//! target), then no orphan actor or reservation, no request lost to a
//! control-plane crash, no escalation.

use std::collections::BTreeSet;

use flotilla::Serve;

use super::{setup::Sim, targets::TargetsPass};
use crate::summary::Invariant;

impl Sim {
    /// Judge every invariant.
    pub(super) async fn check(&mut self) -> Vec<Invariant> {
        let Some(serve) = self.shared.handles().serve() else {
            return vec![Invariant {
                name: "a Serve instance is alive".into(),
                ok: false,
                detail: "none".into(),
            }];
        };
        let pass = self.check_targets(&serve).await;
        let mut out = pass.verdicts(&self.ops);
        out.push(self.no_orphans(&serve, &pass));
        out.push(self.no_request_lost_to_control_plane());
        out.push(self.supervisor_never_gave_up());
        out
    }

    /// Exactly the expected actors are alive, in this instance and none in the
    /// crashed ones; the cluster holds exactly the owned replicas.
    fn no_orphans(&self, serve: &Serve, pass: &TargetsPass) -> Invariant {
        let mut orphans = Offenders::default();
        let living = serve.living_groups();
        let mut seen = BTreeSet::new();
        for (group, n) in &living {
            seen.insert(group.clone());
            match pass.expected_groups.get(group) {
                Some((want, false)) if n == want => {}
                Some((want, true)) if n <= want => {}
                Some((want, _)) => orphans.add(format!("{group}: {n} alive, want {want}")),
                None => orphans.add(format!("{group}: {n} alive, expected none")),
            }
        }
        for (group, (want, lenient)) in &pass.expected_groups {
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
        if reserved != pass.owned_replicas {
            orphans.add(format!(
                "the cluster holds {reserved} reservations for {} owned replicas",
                pass.owned_replicas
            ));
        }
        let actors: usize = living.iter().map(|(_, n)| n).sum();
        Invariant {
            name: "no orphan replica (Serve::living_groups, crashed processes, reservations)".into(),
            ok: orphans.is_empty(),
            detail: orphans.detail(format!(
                "{actors} actors in {} groups as expected, {} crashed processes empty, {reserved} reservations",
                living.len(),
                self.dead.len()
            )),
        }
    }

    /// Requests may fail where a data-plane fault hit, never because only the
    /// control plane crashed.
    fn no_request_lost_to_control_plane(&self) -> Invariant {
        let r = self.shared.traffic.stats.counts();
        Invariant {
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
        }
    }

    /// The restart intensity limit was never exceeded.
    fn supervisor_never_gave_up(&self) -> Invariant {
        let fatal = self.shared.observed().fatal.clone();
        Invariant {
            name: "the Supervisor never gave up".into(),
            ok: fatal.is_empty(),
            detail: if fatal.is_empty() {
                "no escalation".into()
            } else {
                fatal.join("; ")
            },
        }
    }
}

/// The first few offenders of an invariant, and how many there were.
#[derive(Debug, Default)]
pub(super) struct Offenders {
    first: Vec<String>,
    count: usize,
}

impl Offenders {
    /// One more offender.
    pub(super) fn add(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < 5 {
            self.first.push(what);
        }
    }

    /// Whether there were none.
    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// `ok` if there were none, else how many and the first few.
    pub(super) fn detail(&self, ok: String) -> String {
        if self.count == 0 {
            ok
        } else {
            format!("{} offenders, e.g. {}", self.count, self.first.join("; "))
        }
    }
}
