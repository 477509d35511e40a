//! The final verdicts, judged against the model once the system has settled:
//! the per-application ones (`targets`: every acknowledged operation reflected,
//! every application in its expected status, replica counts and versions at
//! target), then no orphan actor or reservation, no request lost to a
//! control-plane crash or failed with no fault to explain it, no escalation.

use std::collections::BTreeSet;

use flotilla::Serve;

use super::{setup::Sim, targets::TargetsPass};
use crate::{summary::Invariant, traffic::RequestCounts};

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
        out.push(self.no_request_failed_unexcused());
        out.push(self.supervisor_never_gave_up());
        out.push(self.every_armed_fault_fired());
        out
    }

    /// Every control-plane fault the schedule armed fired: a crash point no
    /// message passed is a crash that never happened, and the run would pass
    /// without testing it.
    fn every_armed_fault_fired(&self) -> Invariant {
        let unfired = self.shared.observed().unfired.clone();
        Invariant {
            name: "every armed control-plane fault fired".into(),
            ok: unfired.is_empty(),
            detail: if unfired.is_empty() {
                "all fired".into()
            } else {
                format!("never fired: {}", unfired.join("; "))
            },
        }
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
    /// control plane crashed, nor with no fault at all to explain them.
    fn no_request_failed_unexcused(&self) -> Invariant {
        requests_failed_only_where_excused(&self.shared.traffic.stats.counts())
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

/// The verdict on failed requests: every one excused by a data-plane fault
/// (a node, replica, flap, deletion or the process lost), none during a crash
/// of only the control plane, none unexplained.
fn requests_failed_only_where_excused(r: &RequestCounts) -> Invariant {
    let unexcused = r.failed_during_control_plane_crashes + r.failed_unexplained;
    Invariant {
        name: "no request through a handle failed during control-plane crashes or without a \
               fault to explain it"
            .into(),
        ok: unexcused == 0,
        detail: if unexcused == 0 {
            format!(
                "0 of {} requests; {} failed where a node, replica, flap or the process was lost",
                r.sent,
                r.failed_excused.values().sum::<u64>()
            )
        } else {
            format!(
                "{} failed during control-plane crashes, {} unexplained: {}",
                r.failed_during_control_plane_crashes,
                r.failed_unexplained,
                r.unexcused_examples.join("; ")
            )
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::Cause;

    #[test]
    fn an_unexplained_request_failure_fails_the_run() {
        let excused = RequestCounts {
            sent: 100,
            failed: 2,
            failed_excused: [(Cause::NodeLoss, 2)].into(),
            ..Default::default()
        };
        let v = requests_failed_only_where_excused(&excused);
        assert!(v.ok, "{}", v.detail);
        let lost = RequestCounts {
            failed: 1,
            failed_during_control_plane_crashes: 1,
            unexcused_examples: vec!["app-00001 failed at 20.0s: timeout".into()],
            ..excused.clone()
        };
        let v = requests_failed_only_where_excused(&lost);
        assert!(!v.ok);
        assert!(
            v.detail.contains("1 failed during control-plane crashes"),
            "{}",
            v.detail
        );
        let unexplained = RequestCounts {
            failed: 1,
            failed_unexplained: 1,
            unexcused_examples: vec!["app-00002 failed at 30.0s: timeout".into()],
            ..excused
        };
        let v = requests_failed_only_where_excused(&unexplained);
        assert!(!v.ok, "an unexplained failure must fail the run");
        assert!(
            v.detail.contains("1 unexplained") && v.detail.contains("app-00002"),
            "{}",
            v.detail
        );
    }
}
