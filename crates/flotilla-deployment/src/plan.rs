//! The reconcile step as a pure function: given the target and the replicas as they
//! are, decide which replicas to start, stop and reconfigure. Level-triggered: the
//! same input always gives the same plan, so it can run after any event or crash.

use std::collections::HashMap;

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
    /// The node it was placed on ("" while unknown).
    pub node: String,
}

/// Whether replicas may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starts {
    /// Yes.
    Allowed,
    /// No: the constructors are backing off after failures.
    HeldBack,
    /// Yes, but the cluster refused the last one for want of room: a roll may
    /// free room by stopping old replicas first.
    NoRoom,
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
/// - With no outdated code: start or stop the difference. On scale-down (after
///   Ray's scheduler order), replicas not yet RUNNING go first, then those on the
///   nodes holding the fewest replicas of this deployment (to empty nodes), then
///   the newest. Ray's counts every deployment's replicas on a node, keeps the
///   head node for last and counts UPDATING replicas as running; a
///   DeploymentActor sees only its own replicas.
/// - With outdated code (a roll): a pending scale-down finishes first: while more
///   outdated replicas live or stop than the target, outdated ones are stopped and
///   nothing new starts. Then new replicas start: those below the target at once,
///   those above it (at most `rollout.surge(target)`) within the step; an
///   outdated replica stops once a new one RUNNING replaces it, or sooner within
///   `rollout.unavailable(target)`, and its replacement starts in the same pass (a
///   stopping replica takes no surge room, as Ray counts none: a step does not
///   wait for the last one's drains). By default the whole step is surge, so
///   serving capacity never drops below the target; with Ray's
///   `max_surge_percent` the rest of the step is stopped first.
/// - Only RUNNING replicas take a config change in place (`reconfigure`).
/// - Restarts and reconfigures share one step (Ray's `max_to_stop`): at most
///   `rollout.step(target)` replicas in transition at once, counting those
///   UPDATING, STARTING (a roll's surge too) or missing (a replica whose
///   reconfigure failed counts until its replacement runs), after this pass's
///   starts and stops. A STARTING replica is reconfigured once it runs. A
///   pending scale-down finishes first: none is reconfigured while more
///   replicas at another version live or stop than the target.
/// - [`Starts::HeldBack`] (constructor backoff) holds starts back;
///   [`Starts::NoRoom`] (the cluster refused the last start) lets a roll stop a
///   step of old replicas before their replacements run, so a full cluster (or a
///   `max_replicas_per_node` every node has reached) cannot stall it.
pub fn plan(
    target: u32,
    version: &DeploymentVersion,
    rollout: RolloutConfig,
    replicas: &[ReplicaView],
    starts: Starts,
) -> Plan {
    let can_start = starts != Starts::HeldBack;
    let live: Vec<&ReplicaView> = replicas
        .iter()
        .filter(|r| r.state != ReplicaState::Stopping)
        .collect();
    let (new, old): (Vec<&ReplicaView>, Vec<&ReplicaView>) = live
        .iter()
        .copied()
        .partition(|r| r.version.code == version.code);
    let old_stopping = replicas
        .iter()
        .filter(|r| r.state == ReplicaState::Stopping && r.version.code != version.code)
        .count() as u32;
    let new_running = new
        .iter()
        .filter(|r| r.state == ReplicaState::Running)
        .count() as u32;
    let (new_live, old_live) = (new.len() as u32, old.len() as u32);
    // A RECOVERING replica's version is a placeholder until it describes itself:
    // judging it now could stop a replica that is already at the target. Only
    // start what is missing until every replica has told us what it runs.
    if live.iter().any(|r| r.state == ReplicaState::Recovering) {
        let missing = target.saturating_sub(live.len() as u32);
        return Plan {
            start: if can_start { missing } else { 0 },
            ..Plan::default()
        };
    }
    // Changes are paced (Ray's S39, `_check_and_stop_outdated_version_replicas`):
    // at most a roll step of replicas in transition at once, restarts and
    // reconfigures alike (Ray's `code_version_changes + reconfigure_changes`
    // under one `max_to_stop`). In transition are those updating, those
    // starting (a roll's surge too) and those missing. A replica whose
    // reconfigure failed is stopped and stays missing until its replacement
    // runs, so a bad config takes one step of replicas down, not one step
    // after another until none is left.
    let changing = updating_or_starting(&live);
    // A scale-down finishes first (Ray's `target_num < old_running +
    // old_stopping: return`): while more replicas at another version live or
    // still stop than the target, none is reconfigured.
    let outdated_or_stopping = replicas
        .iter()
        .filter(|r| r.version != *version && r.state != ReplicaState::Updating)
        .count();
    let reconfigure_step = if outdated_or_stopping > target as usize {
        0
    } else {
        rollout.step(target) as usize
    };
    let mut out = Plan::default();
    let outdated_config: Vec<ReplicaId> = new
        .iter()
        .filter(|r| r.version.config != version.config && r.state == ReplicaState::Running)
        .map(|r| r.id)
        .collect();
    // What the step leaves for reconfigures once the starts and stops of this
    // pass are planned: what changes then is what changes now, what starts,
    // and what is still missing.
    let reconfigure = |out: &Plan| {
        let live_after = (live.len() + out.start as usize).saturating_sub(out.stop.len());
        let in_transition =
            changing + out.start as usize + (target as usize).saturating_sub(live_after);
        outdated_config
            .iter()
            .copied()
            .filter(|id| !out.stop.iter().any(|(s, _)| s == id))
            .take(reconfigure_step.saturating_sub(in_transition))
            .collect()
    };

    if old_live == 0 {
        if new_live < target {
            out.start = if can_start { target - new_live } else { 0 };
        } else {
            out.stop = stop_order(&new, &live, (new_live - target) as usize);
        }
        out.reconfigure = reconfigure(&out);
        return out;
    }

    // A roll is under way.
    let surge = rollout.surge(target);
    let scaling_down = old_live + old_stopping > target;
    if new_live > target {
        out.stop
            .extend(stop_order(&new, &live, (new_live - target) as usize));
    }
    // Old replicas allowed to stay: what the running new ones do not yet
    // replace, less what the rollout may leave unavailable (none by default; a
    // step when there is no room for the replacements).
    let unavailable = match starts {
        Starts::NoRoom => rollout.step(target),
        Starts::Allowed | Starts::HeldBack => rollout.unavailable(target),
    };
    let keep_old = target.saturating_sub(new_running + unavailable);
    let old_stops = old_live.saturating_sub(keep_old);
    if old_stops > 0 {
        out.stop.extend(stop_order(&old, &live, old_stops as usize));
    }
    // Replicas stopped in this pass count against the surge no more than
    // those already stopping (Ray counts no STOPPING replica): their
    // replacements start now, not once they have drained.
    let total = new_live + old_live - old_stops;
    if can_start && !scaling_down && new_live < target && total < target + surge {
        let want = (target - new_live).min(target + surge - total);
        // Slots below the target start at once (as Ray's scale step does); the
        // surge above it within the step, less the new replicas updating or
        // starting already. Old ones not RUNNING do not count: a roll is how
        // they go (they stop first once a replacement runs), and one whose
        // constructor hangs would otherwise hold the roll for ever (Ray counts
        // them as old, not in transition).
        let missing = target.saturating_sub(total).min(want);
        let new_changing = updating_or_starting(&new);
        let room = (rollout.step(target) as usize).saturating_sub(new_changing) as u32;
        out.start = missing + (want - missing).min(room);
    }
    out.reconfigure = reconfigure(&out);
    out
}

/// How many of `replicas` are taking a config or starting.
fn updating_or_starting(replicas: &[&ReplicaView]) -> usize {
    replicas
        .iter()
        .filter(|r| matches!(r.state, ReplicaState::Updating | ReplicaState::Starting))
        .count()
}

/// The `n` of `candidates` to stop first: not yet RUNNING ones, then those on the
/// node with the fewest live replicas of the deployment (counted over `live`, and
/// recounted after each pick so a node is emptied before another is touched), then
/// the newest. Replicas that may serve (RUNNING, UPDATING, RECOVERING) stop
/// gracefully; STARTING ones at once.
fn stop_order(
    candidates: &[&ReplicaView],
    live: &[&ReplicaView],
    n: usize,
) -> Vec<(ReplicaId, bool)> {
    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for r in live {
        *per_node.entry(r.node.as_str()).or_insert(0) += 1;
    }
    let mut left: Vec<&ReplicaView> = candidates.to_vec();
    let mut out = Vec::with_capacity(n.min(left.len()));
    for _ in 0..n {
        let best = left
            .iter()
            .enumerate()
            .min_by_key(|(_, r)| {
                (
                    r.state == ReplicaState::Running,
                    per_node.get(r.node.as_str()).copied().unwrap_or(0),
                    std::cmp::Reverse(r.id),
                )
            })
            .map(|(i, _)| i);
        let Some(i) = best else { break };
        let r = left.swap_remove(i);
        if let Some(c) = per_node.get_mut(r.node.as_str()) {
            *c = c.saturating_sub(1);
        }
        out.push((r.id, r.state != ReplicaState::Starting));
    }
    out
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
        on(id, state, code, "local")
    }

    fn on(id: u64, state: ReplicaState, code: &str, node: &str) -> ReplicaView {
        ReplicaView {
            id: ReplicaId(id),
            state,
            version: v(code),
            node: node.into(),
        }
    }

    const R: RolloutConfig = RolloutConfig {
        max_changing_fraction: 0.2,
        max_surge_percent: None,
    };

    #[test]
    fn nothing_is_stopped_while_a_replica_is_still_recovering() {
        let rs = [
            r(1, Running, "a"),
            r(2, Running, "b"),
            r(3, Recovering, "b"),
        ];
        // Two live replicas beyond a target of one, but one has not said what it runs.
        assert_eq!(plan(1, &v("b"), R, &rs, Starts::Allowed), Plan::default());
        // Missing replicas still start.
        assert_eq!(plan(5, &v("b"), R, &rs, Starts::Allowed).start, 2);
    }

    #[test]
    fn initial_deploy_starts_everything_at_once() {
        assert_eq!(plan(10, &v("a"), R, &[], Starts::Allowed).start, 10);
        assert_eq!(plan(10, &v("a"), R, &[], Starts::HeldBack).start, 0);
    }

    #[test]
    fn scale_down_stops_starting_then_newest() {
        let rs = [
            r(1, Running, "a"),
            r(2, Running, "a"),
            r(3, Starting, "a"),
            r(4, Running, "a"),
        ];
        let p = plan(2, &v("a"), R, &rs, Starts::Allowed);
        assert_eq!(p.stop, vec![(ReplicaId(3), false), (ReplicaId(4), true)]);
        assert_eq!(p.start, 0);
    }

    #[test]
    fn stopping_replicas_do_not_count() {
        let rs = [r(1, Running, "a"), r(2, Stopping, "a")];
        assert_eq!(plan(2, &v("a"), R, &rs, Starts::Allowed).start, 1);
    }

    #[test]
    fn roll_surges_then_stops_old_only_when_new_run() {
        let old: Vec<_> = (1..=10).map(|i| r(i, Running, "a")).collect();
        // Step 1: start 2 new (20% of 10), stop nothing.
        let p = plan(10, &v("b"), R, &old, Starts::Allowed);
        assert_eq!((p.start, p.stop.len()), (2, 0));
        // New ones still starting: nothing more.
        let mut rs = old.clone();
        rs.push(r(11, Starting, "b"));
        rs.push(r(12, Starting, "b"));
        let p = plan(10, &v("b"), R, &rs, Starts::Allowed);
        assert_eq!((p.start, p.stop.len()), (0, 0));
        // Both run: two old stop, and their replacements start in the same
        // pass (stopping ones take no surge room), not once they have drained.
        rs[10].state = Running;
        rs[11].state = Running;
        let p = plan(10, &v("b"), R, &rs, Starts::Allowed);
        assert_eq!(p.start, 2);
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
            let p = plan(5, &v("b"), R, &rs, Starts::Allowed);
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
        let p = plan(2, &v("b"), R, &rs, Starts::Allowed);
        // 8 old must go before anything new starts (2 kept to serve).
        assert_eq!(p.start, 0);
        assert_eq!(p.stop.len(), 8);
    }

    #[test]
    fn scale_down_waits_for_stopping_outdated_replicas_before_starting_new_ones() {
        // The 8 extra old replicas are still draining: nothing new may start yet.
        let mut rs: Vec<_> = (1..=2).map(|i| r(i, Running, "a")).collect();
        rs.extend((3..=10).map(|i| r(i, Stopping, "a")));
        let p = plan(2, &v("b"), R, &rs, Starts::Allowed);
        assert_eq!(p, Plan::default());
        // Once they are gone, the roll starts: one new replica (surge 1).
        let p = plan(2, &v("b"), R, &rs[..2], Starts::Allowed);
        assert_eq!((p.start, p.stop.len()), (1, 0));
    }

    #[test]
    fn scale_down_empties_the_nodes_with_fewest_replicas_first() {
        // n1 holds the oldest replica alone; n2 holds three; n3 two.
        let rs = [
            on(1, Running, "a", "n1"),
            on(2, Running, "a", "n2"),
            on(3, Running, "a", "n2"),
            on(4, Running, "a", "n3"),
            on(5, Running, "a", "n3"),
            on(6, Running, "a", "n2"),
        ];
        let p = plan(3, &v("a"), R, &rs, Starts::Allowed);
        // n1 first (1 replica), then n3 twice (2, then 1 left): n1 and n3 emptied.
        assert_eq!(
            p.stop,
            vec![
                (ReplicaId(1), true),
                (ReplicaId(5), true),
                (ReplicaId(4), true)
            ]
        );
        // Not-yet-running replicas still go before any node consideration.
        let mut rs = rs.to_vec();
        rs[2].state = Starting;
        let p = plan(5, &v("a"), R, &rs, Starts::Allowed);
        assert_eq!(p.stop, vec![(ReplicaId(3), false)]);
    }

    #[test]
    fn a_rolls_starts_and_reconfigures_share_one_step() {
        // A code roll of 10 (step 2) with two new replicas running and two
        // more starting in the surge, when a config change comes: the starts
        // fill the step, so nothing is reconfigured yet.
        let mut target = v("b");
        target.config = ConfigVersion(2);
        let mut rs: Vec<_> = (1..=8).map(|i| r(i, Running, "a")).collect();
        rs.extend([r(9, Running, "b"), r(10, Running, "b")]);
        rs.extend([11, 12].map(|i| ReplicaView {
            version: target.clone(),
            ..r(i, Starting, "b")
        }));
        let p = plan(10, &target, R, &rs, Starts::Allowed);
        assert!(p.reconfigure.is_empty(), "{p:?}");
        // Once they run, the roll's next step (two stops, two starts) takes
        // the whole step: still nothing to reconfigure.
        rs[10].state = Running;
        rs[11].state = Running;
        let p = plan(10, &target, R, &rs, Starts::Allowed);
        assert_eq!(
            (p.start, p.stop.len(), p.reconfigure.len()),
            (2, 2, 0),
            "{p:?}"
        );
        // Two updating and nothing starting: the step is full, the roll waits.
        rs[8].state = Updating;
        rs[9].state = Updating;
        let p = plan(10, &target, R, &rs, Starts::Allowed);
        assert_eq!((p.start, p.reconfigure.len()), (0, 0), "{p:?}");
        // The roll done, a step of the outdated config at a time.
        let mut rs: Vec<_> = (1..=10).map(|i| r(i, Running, "b")).collect();
        for x in &mut rs[5..] {
            x.version = target.clone();
        }
        let p = plan(10, &target, R, &rs, Starts::Allowed);
        assert_eq!(
            (p.start, p.stop.len(), p.reconfigure.len()),
            (0, 0, 2),
            "{p:?}"
        );
    }

    #[test]
    fn a_roll_replaces_old_replicas_whose_constructor_hangs() {
        // v1's constructor hangs (no startup timeout); v2 is deployed to fix
        // it: its replica starts, and once it runs the stuck one stops.
        let rs = [r(1, Starting, "a")];
        let p = plan(1, &v("b"), R, &rs, Starts::Allowed);
        assert_eq!((p.start, p.stop.len()), (1, 0), "{p:?}");
        let rs = [r(1, Starting, "a"), r(2, Running, "b")];
        let p = plan(1, &v("b"), R, &rs, Starts::Allowed);
        assert_eq!(p.stop, vec![(ReplicaId(1), false)]);
        // Two of ten stuck: the roll goes on around them.
        let mut rs: Vec<_> = (1..=8).map(|i| r(i, Running, "a")).collect();
        rs.extend([r(9, Starting, "a"), r(10, Starting, "a")]);
        let p = plan(10, &v("b"), R, &rs, Starts::Allowed);
        assert_eq!(p.start, 2, "{p:?}");
    }

    #[test]
    fn config_only_change_reconfigures_running_replicas_in_place() {
        let mut target = v("a");
        target.config = ConfigVersion(2);
        // Target 5, step 1: one RUNNING replica at a time, none STARTING (it
        // is reconfigured once it runs), nothing started or stopped.
        let mut rs: Vec<_> = (1..=4).map(|i| r(i, Running, "a")).collect();
        rs.push(r(5, Starting, "a"));
        let p = plan(5, &target, R, &rs, Starts::Allowed);
        assert!(p.reconfigure.is_empty(), "the start fills the step: {p:?}");
        rs[4].state = Running;
        let p = plan(5, &target, R, &rs, Starts::Allowed);
        assert_eq!(p.reconfigure, vec![ReplicaId(1)]);
        assert_eq!((p.start, p.stop.len()), (0, 0));
    }

    #[test]
    fn with_ray_s_max_surge_percent_a_roll_stops_the_rest_of_its_step_first() {
        let no_surge = RolloutConfig {
            max_changing_fraction: 0.2,
            max_surge_percent: Some(0),
        };
        let rs: Vec<_> = (1..=10).map(|i| r(i, Running, "a")).collect();
        // Step 2, surge 0: two old ones stop at once and their replacements
        // start in the same pass (Ray counts no STOPPING replica), nothing
        // above the target.
        let p = plan(10, &v("b"), no_surge, &rs, Starts::Allowed);
        assert_eq!((p.start, p.stop.len()), (2, 2));
        let mut rs = rs;
        rs[8].state = Stopping;
        rs[9].state = Stopping;
        let p = plan(10, &v("b"), no_surge, &rs, Starts::Allowed);
        assert_eq!((p.start, p.stop.len()), (2, 0), "replacements start");
        // The default keeps every old replica until a new one runs.
        let rs: Vec<_> = (1..=10).map(|i| r(i, Running, "a")).collect();
        let p = plan(10, &v("b"), R, &rs, Starts::Allowed);
        assert_eq!((p.start, p.stop.len()), (2, 0));
    }

    #[test]
    fn a_roll_without_room_for_its_replacements_stops_a_step_first() {
        let rs = [r(1, Running, "a"), r(2, Running, "a")];
        // Room: the new one starts first, nothing stops.
        let p = plan(2, &v("b"), R, &rs, Starts::Allowed);
        assert_eq!((p.start, p.stop.len()), (1, 0));
        // No room (every node full, or at max_replicas_per_node): a step of old
        // ones stops, so the replacement can take its place.
        let p = plan(2, &v("b"), R, &rs, Starts::NoRoom);
        assert_eq!(p.stop.len(), 1);
    }

    #[test]
    fn config_changes_are_paced_by_the_roll_step() {
        let mut target = v("a");
        target.config = ConfigVersion(2);
        let rs: Vec<_> = (1..=10).map(|i| r(i, Running, "a")).collect();
        // A step of max(1, 20% of 10) = 2 at once.
        assert_eq!(
            plan(10, &target, R, &rs, Starts::Allowed).reconfigure.len(),
            2
        );
        let mut rs = rs;
        rs[0].state = Updating;
        assert_eq!(
            plan(10, &target, R, &rs, Starts::Allowed).reconfigure.len(),
            1,
            "one already updating leaves room for one more"
        );
        rs[1].state = Updating;
        assert!(
            plan(10, &target, R, &rs, Starts::Allowed)
                .reconfigure
                .is_empty()
        );
    }

    #[test]
    fn a_scale_down_finishes_before_a_config_change_rolls() {
        let mut target = v("a");
        target.config = ConfigVersion(2);
        let mut rs: Vec<_> = (1..=10).map(|i| r(i, Running, "a")).collect();
        // Ten at the old config, five wanted at the new one: five stop, and
        // nothing is reconfigured yet.
        let p = plan(5, &target, R, &rs, Starts::Allowed);
        assert_eq!(p.stop.len(), 5, "{p:?}");
        assert!(p.reconfigure.is_empty(), "{p:?}");
        // While those five still stop, still nothing.
        for r in &mut rs[5..] {
            r.state = Stopping;
        }
        let p = plan(5, &target, R, &rs, Starts::Allowed);
        assert!(p.reconfigure.is_empty() && p.stop.is_empty(), "{p:?}");
        // Once they are gone, the change rolls, a step at a time.
        rs.truncate(5);
        let p = plan(5, &target, R, &rs, Starts::Allowed);
        assert_eq!(p.reconfigure, vec![ReplicaId(1)]);
    }

    #[test]
    fn a_replica_missing_after_a_failed_reconfigure_holds_the_next_step_back() {
        let mut target = v("a");
        target.config = ConfigVersion(2);
        // Of 5 (a step of one), one failed its reconfigure and is stopping:
        // no other takes the config until its replacement runs.
        let mut rs: Vec<_> = (1..=5).map(|i| r(i, Running, "a")).collect();
        rs[0].state = Stopping;
        let p = plan(5, &target, R, &rs, Starts::Allowed);
        assert!(p.reconfigure.is_empty(), "{p:?}");
        assert_eq!(p.start, 1, "its replacement starts");
        let mut replacement = r(6, Starting, "a");
        replacement.version = target.clone();
        rs.push(replacement);
        assert!(
            plan(5, &target, R, &rs, Starts::Allowed)
                .reconfigure
                .is_empty()
        );
        rs[5].state = Running;
        assert_eq!(
            plan(5, &target, R, &rs, Starts::Allowed).reconfigure.len(),
            1
        );
    }

    #[test]
    fn same_target_twice_changes_nothing() {
        let rs = [r(1, Running, "a"), r(2, Running, "a")];
        assert_eq!(plan(2, &v("a"), R, &rs, Starts::Allowed), Plan::default());
    }
}
