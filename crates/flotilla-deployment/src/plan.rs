//! The reconcile step as a pure function: given the target and the replicas as they
//! are, decide which replicas to start, stop and reconfigure. Level-triggered: the
//! same input always gives the same plan, so it can run after any event or crash.

use flotilla_core::{DeploymentVersion, ReplicaState, RolloutConfig};
use flotilla_replica::ReplicaId;

/// One replica as the planner sees it.
#[derive(Debug, Clone)]
pub struct ReplicaView {
    /// Its id (ids grow with age: a larger id is newer).
    pub id: ReplicaId,
    /// Its state.
    pub state: ReplicaState,
    /// The version it runs.
    pub version: DeploymentVersion,
}

/// What to do now.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// How many new replicas to start at the target version.
    pub start: u32,
    /// Replicas to stop, in order; `true` = gracefully.
    pub stop: Vec<(ReplicaId, bool)>,
    /// Replicas at the target code version whose config is outdated.
    pub reconfigure: Vec<ReplicaId>,
}

/// Plan one step toward `target` replicas at `version`.
///
/// - With no outdated code: start or stop the difference. On scale-down, replicas
///   not yet RUNNING go first, then the newest.
/// - With outdated code (a roll): new replicas start first, at most
///   `rollout.step(target)` above the target (surge); an outdated replica stops only
///   once enough new ones RUNNING replace it, so serving capacity never drops below
///   the target. A pending scale-down finishes first (nothing starts while more
///   than target + surge replicas live).
/// - `can_start` false (constructor backoff, no room) holds starts back.
pub fn plan(
    target: u32,
    version: &DeploymentVersion,
    rollout: RolloutConfig,
    replicas: &[ReplicaView],
    can_start: bool,
) -> Plan {
    let live: Vec<&ReplicaView> = replicas
        .iter()
        .filter(|r| r.state != ReplicaState::Stopping)
        .collect();
    let (new, old): (Vec<&ReplicaView>, Vec<&ReplicaView>) = live
        .into_iter()
        .partition(|r| r.version.code == version.code);
    let new_running = new
        .iter()
        .filter(|r| r.state == ReplicaState::Running)
        .count() as u32;
    let (new_live, old_live) = (new.len() as u32, old.len() as u32);
    let mut out = Plan {
        reconfigure: new
            .iter()
            .filter(|r| r.version.config != version.config && r.state == ReplicaState::Running)
            .map(|r| r.id)
            .collect(),
        ..Plan::default()
    };

    if old_live == 0 {
        if new_live < target {
            out.start = if can_start { target - new_live } else { 0 };
        } else {
            out.stop = stop_order(&new, (new_live - target) as usize);
        }
        return out;
    }

    // A roll is under way.
    let surge = rollout.step(target);
    let total = new_live + old_live;
    if new_live > target {
        out.stop
            .extend(stop_order(&new, (new_live - target) as usize));
    }
    if can_start && new_live < target && total < target + surge {
        out.start = (target - new_live).min(target + surge - total);
    }
    // Old replicas allowed to stay: what the running new ones do not yet replace.
    let keep_old = target.saturating_sub(new_running);
    if old_live > keep_old {
        out.stop
            .extend(stop_order(&old, (old_live - keep_old) as usize));
    }
    out
}

/// The `n` replicas to stop first: not yet RUNNING ones, then the newest.
fn stop_order(replicas: &[&ReplicaView], n: usize) -> Vec<(ReplicaId, bool)> {
    let mut v: Vec<&&ReplicaView> = replicas.iter().collect();
    v.sort_by_key(|r| (r.state == ReplicaState::Running, std::cmp::Reverse(r.id)));
    v.into_iter()
        .take(n)
        .map(|r| (r.id, r.state == ReplicaState::Running))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReplicaState::*;
    use flotilla_core::{CodeVersion, ConfigVersion};

    fn v(code: &str) -> DeploymentVersion {
        DeploymentVersion {
            code: CodeVersion::explicit(code),
            config: ConfigVersion(1),
        }
    }

    fn r(id: u64, state: ReplicaState, code: &str) -> ReplicaView {
        ReplicaView {
            id: ReplicaId(id),
            state,
            version: v(code),
        }
    }

    const R: RolloutConfig = RolloutConfig {
        max_changing_fraction: 0.2,
    };

    #[test]
    fn initial_deploy_starts_everything_at_once() {
        assert_eq!(plan(10, &v("a"), R, &[], true).start, 10);
        assert_eq!(plan(10, &v("a"), R, &[], false).start, 0);
    }

    #[test]
    fn scale_down_stops_starting_then_newest() {
        let rs = [
            r(1, Running, "a"),
            r(2, Running, "a"),
            r(3, Starting, "a"),
            r(4, Running, "a"),
        ];
        let p = plan(2, &v("a"), R, &rs, true);
        assert_eq!(p.stop, vec![(ReplicaId(3), false), (ReplicaId(4), true)]);
        assert_eq!(p.start, 0);
    }

    #[test]
    fn stopping_replicas_do_not_count() {
        let rs = [r(1, Running, "a"), r(2, Stopping, "a")];
        assert_eq!(plan(2, &v("a"), R, &rs, true).start, 1);
    }

    #[test]
    fn roll_surges_then_stops_old_only_when_new_run() {
        let old: Vec<_> = (1..=10).map(|i| r(i, Running, "a")).collect();
        // Step 1: start 2 new (20% of 10), stop nothing.
        let p = plan(10, &v("b"), R, &old, true);
        assert_eq!((p.start, p.stop.len()), (2, 0));
        // New ones still starting: nothing more.
        let mut rs = old.clone();
        rs.push(r(11, Starting, "b"));
        rs.push(r(12, Starting, "b"));
        let p = plan(10, &v("b"), R, &rs, true);
        assert_eq!((p.start, p.stop.len()), (0, 0));
        // Both run: two old may stop.
        rs[10].state = Running;
        rs[11].state = Running;
        let p = plan(10, &v("b"), R, &rs, true);
        assert_eq!(p.start, 0);
        assert_eq!(p.stop.len(), 2);
        assert!(p.stop.iter().all(|(id, graceful)| id.0 <= 10 && *graceful));
    }

    #[test]
    fn capacity_never_drops_below_target_during_a_roll() {
        // Simulate a whole roll: each round, started replicas become RUNNING and stopped
        // ones disappear; count running replicas at every point.
        let mut rs: Vec<ReplicaView> = (1..=5).map(|i| r(i, Running, "a")).collect();
        let mut next = 6;
        for _ in 0..50 {
            let p = plan(5, &v("b"), R, &rs, true);
            for (id, _) in &p.stop {
                rs.retain(|x| x.id != *id);
            }
            let running = rs.iter().filter(|x| x.state == Running).count();
            assert!(running >= 5, "capacity dropped to {running}");
            assert!(rs.len() <= 6, "surge exceeded: {}", rs.len());
            for _ in 0..p.start {
                rs.push(r(next, Starting, "b"));
                next += 1;
            }
            for x in rs.iter_mut() {
                x.state = Running;
            }
        }
        assert!(rs.iter().all(|x| x.version.code.as_str() == "b"));
        assert_eq!(rs.len(), 5);
    }

    #[test]
    fn scale_down_finishes_before_a_roll_starts() {
        let rs: Vec<_> = (1..=10).map(|i| r(i, Running, "a")).collect();
        let p = plan(2, &v("b"), R, &rs, true);
        // 8 old must go before anything new starts (2 kept to serve).
        assert_eq!(p.start, 0);
        assert_eq!(p.stop.len(), 8);
    }

    #[test]
    fn config_only_change_reconfigures_running_replicas_in_place() {
        let rs = [r(1, Running, "a"), r(2, Starting, "a")];
        let mut target = v("a");
        target.config = ConfigVersion(2);
        let p = plan(2, &target, R, &rs, true);
        assert_eq!(p.reconfigure, vec![ReplicaId(1)]);
        assert_eq!((p.start, p.stop.len()), (0, 0));
    }

    #[test]
    fn same_target_twice_changes_nothing() {
        let rs = [r(1, Running, "a"), r(2, Running, "a")];
        assert_eq!(plan(2, &v("a"), R, &rs, true), Plan::default());
    }
}
