//! The summary of a run: what converged and how fast, what was injected and
//! restarted, replicas, requests, checkpoint commits, and every invariant with
//! its verdict. Printed for people, written as JSON for machines.
//!
//! Everything outside [`WallClock`] is a function of the scenario and its seed:
//! [`Summary::without_wall_clock`] is what two runs of one seed must agree on.

use std::{collections::BTreeMap, fmt};

use serde::Serialize;

use crate::{cluster::ClusterCounters, traffic::RequestCounts};

/// The scenario, echoed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScenarioEcho {
    /// Seed.
    pub seed: u64,
    /// Nodes at the start.
    pub nodes: usize,
    /// Node groups as `name x count (cpus)`.
    pub node_groups: Vec<String>,
    /// Placement strategy.
    pub strategy: String,
    /// Applications deployed at the start.
    pub apps: usize,
    /// Deployments per application.
    pub deployments: usize,
    /// Replicas per deployment.
    pub replicas: u32,
    /// Applications per batch.
    pub batch: usize,
    /// Applications with broken code.
    pub broken_apps: usize,
    /// Constructor failure rate.
    pub constructor_failure_rate: f64,
    /// Requests per second.
    pub traffic_rate: f64,
    /// Run length, virtual seconds.
    pub duration_s: f64,
    /// The event schedule.
    pub events: Vec<String>,
    /// The ServeConfig applied at the start, if any.
    pub serve_config: Option<String>,
    /// Applications it declares.
    pub declared_apps: usize,
    /// Of those, the ones that must end DEPLOY_FAILED (their build fails or
    /// their code is broken).
    pub declared_failing: usize,
}

/// Virtual-time convergence figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Convergence {
    /// From the first batch to every application as expected (virtual seconds;
    /// `None`: never, during the run).
    pub initial_s: Option<f64>,
    /// From the end of the run to every application as expected again.
    pub final_s: Option<f64>,
    /// Virtual time simulated up to the final checks, seconds.
    pub total_virtual_s: f64,
    /// Virtual time the final graceful shutdown took, seconds.
    pub shutdown_s: f64,
    /// Timeline samples taken.
    pub samples: usize,
}

/// One event as it happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EventRecord {
    /// When it was applied (virtual seconds).
    pub at_s: f64,
    /// As written.
    pub event: String,
    /// What it did.
    pub effect: String,
    /// Most applications not as expected before everything converged again.
    pub disturbed_apps: usize,
    /// Seconds until everything converged again (`None`: not before the next
    /// event or the end).
    pub converged_after_s: Option<f64>,
}

/// Restarts and kills, by level.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Restarts {
    /// Process crashes (each followed by a start on the same store).
    pub process: u64,
    /// Controller restarts by the Supervisor (summed over processes).
    pub controller: u64,
    /// ApplicationActor restarts by the Controller (summed over Controller lives).
    pub application: u64,
    /// DeploymentActors killed (Flotilla's metrics do not count their restarts).
    pub deployment_actors_killed: u64,
    /// ApplicationActors the schedule killed.
    pub applications_killed: u64,
    /// Controller crashes the schedule caused (crashed at once, or armed at a
    /// point of its next mutating message).
    pub controller_crashes: u64,
    /// Replica actors killed.
    pub replicas_killed: u64,
}

/// Replica life cycle counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Replicas {
    /// Constructors that succeeded (replicas started).
    pub started: u64,
    /// Started replicas that are gone by the end (stopped gracefully, replaced,
    /// or lost with a node or the process): started minus running at the end.
    pub stopped: u64,
    /// Constructor calls (each start attempt).
    pub constructor_calls: u64,
    /// Constructor calls that failed.
    pub constructor_failures: u64,
    /// Health checks that failed (flapping).
    pub health_check_failures: u64,
    /// User configs taken in place (`reconfigure` calls).
    pub reconfigures: u64,
    /// Cluster reservations: placements, refusals, releases, losses.
    pub cluster: ClusterCounters,
    /// Replicas serving at the end.
    pub running_at_end: usize,
}

/// Operations (deploy, update, scale, delete) sent to Flotilla.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Operations {
    /// Acknowledged.
    pub acknowledged: u64,
    /// Attempts that failed and were sent again (controller crash, failed commit).
    pub retried: u64,
    /// Given up on after every attempt failed.
    pub abandoned: u64,
}

/// Checkpoint store figures, summed over processes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Checkpoint {
    /// Commits.
    pub commits: u64,
    /// Keys written.
    pub keys_written: u64,
    /// Bytes written.
    pub bytes_written: u64,
}

/// One invariant and its verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Invariant {
    /// What must hold.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
    /// Counts, or the first offenders.
    pub detail: String,
}

/// Wall-clock figures: they vary from machine to machine and run to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WallClock {
    /// Initial convergence, wall seconds.
    pub initial_converge_s: Option<f64>,
    /// Final convergence (from the end of the run), wall seconds.
    pub final_converge_s: Option<f64>,
    /// The whole simulation, wall seconds.
    pub total_s: f64,
    /// The final graceful shutdown, wall seconds.
    pub shutdown_s: f64,
    /// Virtual seconds simulated per wall second (up to the final checks).
    pub speedup: f64,
}

/// The summary of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// The scenario.
    pub scenario: ScenarioEcho,
    /// Applications by final status.
    pub applications: BTreeMap<String, usize>,
    /// Applications expected RUNNING, DEPLOY_FAILED (broken code) and deleted.
    pub expected: BTreeMap<String, usize>,
    /// Convergence.
    pub convergence: Convergence,
    /// Every event as applied.
    pub events: Vec<EventRecord>,
    /// Restarts by level.
    pub restarts: Restarts,
    /// Replicas.
    pub replicas: Replicas,
    /// Requests through handles.
    pub requests: RequestCounts,
    /// Operations.
    pub operations: Operations,
    /// Checkpoint commits.
    pub checkpoint: Checkpoint,
    /// Nodes alive at the end.
    pub nodes_alive_at_end: usize,
    /// Every invariant checked.
    pub invariants: Vec<Invariant>,
    /// Wall-clock figures (excluded from same-seed comparisons).
    pub wall: WallClock,
}

impl Summary {
    /// Whether every invariant held.
    pub fn ok(&self) -> bool {
        self.invariants.iter().all(|i| i.ok)
    }

    /// The summary without its wall-clock figures: what one seed always gives.
    pub fn without_wall_clock(&self) -> Summary {
        Summary {
            wall: WallClock::default(),
            ..self.clone()
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

fn opt_s(v: Option<f64>) -> String {
    v.map_or_else(|| "never".to_owned(), |s| format!("{s:.1}s"))
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.scenario;
        let c = &self.convergence;
        let w = &self.wall;
        writeln!(
            f,
            "flotilla cluster simulation (seed {}): {} nodes [{}], {} placement",
            s.seed,
            s.nodes,
            s.node_groups.join(", "),
            s.strategy
        )?;
        writeln!(
            f,
            "  {} apps x {} deployment(s) x {} replicas, batches of {}, {} broken, constructor failure rate {:.0}%, {} req/s, {:.0}s virtual",
            s.apps,
            s.deployments,
            s.replicas,
            s.batch,
            s.broken_apps,
            s.constructor_failure_rate * 100.0,
            s.traffic_rate,
            s.duration_s
        )?;
        if let Some(path) = &s.serve_config {
            writeln!(
                f,
                "  serve config {path}: {} applications, {} of them must end DEPLOY_FAILED",
                s.declared_apps, s.declared_failing
            )?;
        }
        writeln!(f)?;
        let statuses: Vec<String> = self
            .applications
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let expected: Vec<String> = self
            .expected
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(f, "applications      {}", statuses.join(", "))?;
        writeln!(f, "  expected        {}", expected.join(", "))?;
        writeln!(
            f,
            "converged         initially after {} virtual / {} wall; again after the run in {} virtual / {} wall",
            opt_s(c.initial_s),
            opt_s(w.initial_converge_s),
            opt_s(c.final_s),
            opt_s(w.final_converge_s)
        )?;
        writeln!(
            f,
            "simulated         {:.0}s virtual ({:.0}x wall speed), {} samples; graceful shutdown {:.0}s virtual / {:.1}s wall; {:.1}s wall in all",
            c.total_virtual_s, w.speedup, c.samples, c.shutdown_s, w.shutdown_s, w.total_s
        )?;
        writeln!(f, "events")?;
        for e in &self.events {
            writeln!(
                f,
                "  {:>6.1}s  {:<30} {:<44} disturbed {:>4}, converged {}",
                e.at_s,
                e.event,
                e.effect,
                e.disturbed_apps,
                e.converged_after_s
                    .map_or_else(|| "-".to_owned(), |s| format!("+{s:.0}s"))
            )?;
        }
        let r = &self.restarts;
        writeln!(
            f,
            "restarts          process {}, controller {} (crashes caused {}), application {} (killed {}); killed: deployment actors {}, replicas {}",
            r.process,
            r.controller,
            r.controller_crashes,
            r.application,
            r.applications_killed,
            r.deployment_actors_killed,
            r.replicas_killed
        )?;
        let p = &self.replicas;
        writeln!(
            f,
            "replicas          started {}, stopped {}, running at end {}; constructor calls {} ({} failed), health checks failed {}, reconfigured {}",
            p.started,
            p.stopped,
            p.running_at_end,
            p.constructor_calls,
            p.constructor_failures,
            p.health_check_failures,
            p.reconfigures
        )?;
        let k = &p.cluster;
        writeln!(
            f,
            "placements        {} placed, {} refused, {} released, {} lost with nodes, {} lost with the process; nodes killed {}, added {}, alive at end {}",
            k.placements,
            k.refusals,
            k.releases,
            k.lost_with_nodes,
            k.lost_with_process,
            k.nodes_killed,
            k.nodes_added,
            self.nodes_alive_at_end
        )?;
        let q = &self.requests;
        let excused: Vec<String> = q
            .failed_excused
            .iter()
            .map(|(k, v)| {
                format!(
                    "{} {v}",
                    serde_json::to_string(k)
                        .unwrap_or_default()
                        .trim_matches('"')
                )
            })
            .collect();
        writeln!(
            f,
            "requests          sent {}, served {}, failed {}, retried {}",
            q.sent, q.served, q.failed, q.retried
        )?;
        writeln!(
            f,
            "  failures        excused by faults [{}], during control-plane crashes {}, unexplained {}",
            excused.join(", "),
            q.failed_during_control_plane_crashes,
            q.failed_unexplained
        )?;
        let o = &self.operations;
        writeln!(
            f,
            "operations        acknowledged {}, retried {}, abandoned {}",
            o.acknowledged, o.retried, o.abandoned
        )?;
        let ck = &self.checkpoint;
        writeln!(
            f,
            "checkpoint        {} commits, {} keys, {} bytes written",
            ck.commits, ck.keys_written, ck.bytes_written
        )?;
        writeln!(f, "invariants")?;
        for i in &self.invariants {
            writeln!(
                f,
                "  [{}] {}: {}",
                if i.ok { "ok" } else { "FAILED" },
                i.name,
                i.detail
            )?;
        }
        write!(
            f,
            "{}",
            if self.ok() {
                "every invariant held"
            } else {
                "SOME INVARIANTS FAILED"
            }
        )
    }
}
