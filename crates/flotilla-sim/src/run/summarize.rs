//! The summary of a finished run: final readings, a graceful shutdown that must
//! leave nothing behind, and every figure gathered into a [`Summary`].

use std::collections::BTreeMap;

use super::{Outcome, round3, setup::Sim, shared::record_metrics, timeline::Timeline};
use crate::{
    Result,
    scenario::Scenario,
    serve_config::LoadedConfig,
    summary::{Checkpoint, Convergence, Invariant, Replicas, ScenarioEcho, Summary, WallClock},
};

impl Sim {
    /// Read the last figures, shut down gracefully, and build the outcome.
    pub(super) async fn finish(
        self,
        run_end: f64,
        mut invariants: Vec<Invariant>,
    ) -> Result<Outcome> {
        let sc = self.sc().clone();
        // Final readings, then a graceful shutdown that must leave nothing behind.
        let serve = self.serve()?;
        let running_at_end = record_metrics(&self.shared, &serve).await.unwrap_or(0);
        let statuses = serve.status();
        let total_virtual = self.shared.now();
        let wall_run = self.shared.wall0.elapsed().as_secs_f64();
        // Counters are read before the shutdown: how long it takes to reach each
        // application is not the simulation's business.
        let world = self.shared.world.counters();
        let cluster = self.shared.cluster.counters();
        let nodes_alive_at_end = self.shared.cluster.view().live_nodes;
        let requests = self.shared.traffic.stats.counts();
        let shutdown = serve.shutdown().await;
        let shutdown_virtual = self.shared.now() - total_virtual;
        let shutdown_wall = self.shared.wall0.elapsed().as_secs_f64() - wall_run;
        let left = serve.living_groups();
        invariants.push(Invariant {
            name: "a graceful shutdown leaves no actor behind".into(),
            ok: shutdown.is_ok() && left.is_empty(),
            detail: match (&shutdown, left.is_empty()) {
                (Err(e), _) => format!("shutdown failed: {e}"),
                (Ok(()), true) => "none left".into(),
                (Ok(()), false) => format!("{left:?}"),
            },
        });
        if let Some(p) = &self.shared.progress {
            p.finish_and_clear();
        }

        let mut applications: BTreeMap<String, usize> = BTreeMap::new();
        for (_, s) in &statuses {
            *applications.entry(s.status.to_string()).or_insert(0) += 1;
        }
        let expected = self.shared.model().tally();
        let o = std::mem::take(&mut *self.shared.observed());
        let wall_total = self.shared.wall0.elapsed().as_secs_f64();
        let mut restarts = self.restarts.clone();
        let mut checkpoint = Checkpoint::default();
        for p in &o.processes {
            restarts.controller += p.controller_restarts;
            restarts.application += p.app_restarts_done + p.app_restarts_now;
            checkpoint.commits += p.commits;
            checkpoint.keys_written += p.keys;
            checkpoint.bytes_written += p.bytes;
        }
        // Every control actor the schedule crashed was restarted (and
        // counted): the supervision under test, not only its outcome.
        invariants.push(Invariant {
            name: "every crashed control actor was restarted".into(),
            ok: restarts.controller >= restarts.controller_crashes
                && restarts.application >= restarts.applications_killed,
            detail: format!(
                "Controller restarted {} times for {} crashes caused; ApplicationActors {} for {} killed",
                restarts.controller,
                restarts.controller_crashes,
                restarts.application,
                restarts.applications_killed
            ),
        });
        let summary = Summary {
            scenario: echo(&sc, self.configs.initial.as_deref()),
            applications,
            expected,
            convergence: Convergence {
                initial_s: o.initial_at.map(|(v, _)| v),
                final_s: o.final_at.map(|(v, _)| round3(v - run_end)),
                total_virtual_s: round3(total_virtual),
                shutdown_s: round3(shutdown_virtual),
                samples: o.samples.len(),
            },
            events: o.records,
            restarts,
            replicas: Replicas {
                started: world.started,
                stopped: world.started.saturating_sub(running_at_end as u64),
                constructor_calls: world.constructor_calls,
                constructor_failures: world.constructor_failures,
                health_check_failures: world.health_failures,
                reconfigures: world.reconfigures,
                cluster,
                running_at_end,
            },
            requests,
            operations: self.ops.clone(),
            checkpoint,
            nodes_alive_at_end,
            invariants,
            wall: WallClock {
                initial_converge_s: o.initial_at.map(|(_, w)| round3(w)),
                final_converge_s: o.final_at.map(|(_, w)| round3(w)),
                total_s: round3(wall_total),
                shutdown_s: round3(shutdown_wall),
                speedup: if wall_run > 0.0 {
                    (total_virtual / wall_run).round()
                } else {
                    0.0
                },
            },
        };
        Ok(Outcome {
            summary,
            timeline: Timeline {
                samples: o.samples,
                marks: o.marks,
                run_end,
            },
        })
    }
}

/// The scenario as the summary echoes it, with its initial config.
fn echo(sc: &Scenario, config: Option<&LoadedConfig>) -> ScenarioEcho {
    ScenarioEcho {
        seed: sc.seed,
        nodes: sc.cluster.nodes(),
        node_groups: sc
            .cluster
            .groups
            .iter()
            .map(|g| format!("{} x{} ({} cpus)", g.name, g.count, g.cpus))
            .collect(),
        strategy: sc.cluster.strategy.to_string(),
        apps: sc.workload.apps,
        deployments: sc.workload.deployments,
        replicas: sc.workload.replicas,
        batch: sc.workload.batch,
        broken_apps: sc.workload.broken_apps,
        constructor_failure_rate: sc.workload.constructor_failure_rate,
        traffic_rate: sc.traffic.rate,
        duration_s: sc.duration.as_secs_f64(),
        events: sc.faults.clone(),
        serve_config: config.map(|c| c.path.display().to_string()),
        declared_apps: config.map_or(0, |c| c.apps.len()),
        declared_failing: config.map_or(0, LoadedConfig::failing),
    }
}
