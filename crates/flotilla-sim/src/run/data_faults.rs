//! Data-plane faults: kill replica actors, lose and add nodes, make
//! constructors fail, make health checks flap. Requests to the applications hit
//! may fail (and are retried) while they heal.

use std::{collections::BTreeSet, time::Duration};

use super::{driver::Action, events::DATA_WINDOW, setup::Sim};
use crate::{Result, traffic::Cause};

impl Sim {
    /// Kill `n` replica actors, drawn from every replica group of the instance.
    pub(super) fn kill_replicas(&mut self, n: usize, now: f64) -> Result<String> {
        let serve = self.serve()?;
        let replicas = serve.living_replicas();
        let picked = self.rng.sample(replicas.len(), n);
        let names = self.shared.world.names().clone();
        let mut apps = BTreeSet::new();
        for i in &picked {
            let r = &replicas[*i];
            if let Some(idx) = names.index(r.app.as_str()) {
                apps.insert(idx);
            }
            serve.crash_replica(r.app.as_str(), r.deployment.as_str(), r.id);
        }
        self.restarts.replicas_killed += picked.len() as u64;
        let count = apps.len();
        self.shared
            .windows()
            .open(now, DATA_WINDOW, Some(apps), Cause::ReplicaKill);
        Ok(format!("killed {} replicas of {count} apps", picked.len()))
    }

    /// Kill `n` live nodes; their replicas die with them.
    pub(super) fn lose_nodes(&mut self, n: usize, now: f64) -> String {
        let live = self.shared.cluster.live_nodes();
        let idx: Vec<u32> = (0..live.len() as u32).collect();
        let picked = self.pick(&idx, n);
        let mut names = Vec::new();
        let mut apps = BTreeSet::new();
        let before = self.shared.cluster.counters().lost_with_nodes;
        let app_names = self.shared.world.names().clone();
        for i in picked {
            let name = &live[i as usize];
            if let Some(hit) = self.shared.cluster.kill_node(name) {
                apps.extend(hit.iter().filter_map(|a| app_names.index(a)));
                names.push(name.clone());
            }
        }
        let lost = self.shared.cluster.counters().lost_with_nodes - before;
        let count = apps.len();
        self.shared
            .windows()
            .open(now, DATA_WINDOW, Some(apps), Cause::NodeLoss);
        format!(
            "killed {} ({lost} replicas, {count} apps)",
            names.join(", ")
        )
    }

    /// Add `n` nodes, each of a group drawn from the driver's stream.
    pub(super) fn add_nodes(&mut self, n: usize) -> String {
        let groups = self.shared.cluster.groups() as u64;
        let mut names = Vec::new();
        for _ in 0..n {
            let g = self.rng.below(groups) as usize;
            if let Some(name) = self.shared.cluster.add_node(g) {
                names.push(name);
            }
        }
        format!("added {}", names.join(", "))
    }

    /// Constructors fail at `rate` for `for_` from `at` (virtual time from the
    /// start).
    pub(super) fn constructor_failures(
        &mut self,
        rate: f64,
        at: Duration,
        for_: Duration,
    ) -> String {
        self.shared.world.set_failure_rate(rate);
        self.push(at + for_, Action::EndConstructorFailures);
        format!(
            "constructors fail at {:.0}% for {}s",
            rate * 100.0,
            for_.as_secs()
        )
    }

    /// The health checks of `apps` healthy applications flap for `for_` from `at`.
    pub(super) fn flap(&mut self, apps: usize, at: Duration, for_: Duration, now: f64) -> String {
        let present = self.shared.model().present(true);
        let picked = self.pick(&present, apps);
        self.shared.world.set_flapping(&picked, true);
        self.shared.windows().open(
            now,
            for_.as_secs_f64() + DATA_WINDOW,
            Some(picked.iter().copied().collect()),
            Cause::Flap,
        );
        let count = picked.len();
        self.push(at + for_, Action::EndFlap(picked));
        format!("{count} apps' health checks flap for {}s", for_.as_secs())
    }
}
