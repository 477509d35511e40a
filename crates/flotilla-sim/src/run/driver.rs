//! The run from start to verdict: the driver's queue of actions (initial
//! batches, scheduled events, the ends of timed faults), played in virtual-time
//! order while the traffic and the sampler run; then settling, the final
//! checks and the summary.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::time::Instant;

use super::{Outcome, setup::Sim, timeline::sample_loop};
use crate::{Result, faults::Event, serve_config::LoadedConfig, traffic};

/// Quiet time after convergence before the invariants are judged: stopping
/// replicas finish their graceful shutdown.
const QUIET: Duration = Duration::from_secs(60);

/// An action of the driver's queue.
#[derive(Debug, Clone)]
pub(super) enum Action {
    /// Apply the initial ServeConfig.
    InitialConfig(Arc<LoadedConfig>),
    /// Deploy initial batch `k`.
    Batch(usize),
    /// A scheduled event.
    Event(Event),
    /// End a constructor failure spike.
    EndConstructorFailures,
    /// Stop the flapping of these applications.
    EndFlap(Vec<u32>),
}

impl Sim {
    /// Queue `action` at `at` (after every action queued earlier for that time).
    pub(super) fn push(&mut self, at: Duration, action: Action) {
        self.seq += 1;
        self.queue.push((at, self.seq, action));
    }

    /// The next action: the earliest, first queued first.
    fn pop(&mut self) -> Option<(Duration, Action)> {
        let i = self
            .queue
            .iter()
            .enumerate()
            .min_by_key(|(_, (at, seq, _))| (*at, *seq))
            .map(|(i, _)| i)?;
        let (at, _, a) = self.queue.swap_remove(i);
        Some((at, a))
    }

    /// Run the whole simulation and judge it.
    pub(super) async fn simulate(mut self) -> Result<Outcome> {
        let serve = self.start_serve().await?;
        self.shared.handles().set_serve(Some(serve));
        let sc = self.sc().clone();
        let w = &sc.workload;
        if let Some(config) = self.configs.initial.clone() {
            self.push(Duration::ZERO, Action::InitialConfig(config));
        }
        let batches = w.apps.div_ceil(w.batch);
        for k in 0..batches {
            self.push(w.batch_every * k as u32, Action::Batch(k));
        }
        for e in sc.events()? {
            self.push(e.at, Action::Event(e));
        }
        let sampler = tokio::spawn(sample_loop(self.shared.clone(), self.heartbeat.clone()));
        let end = self.shared.start + sc.duration;
        let traffic = tokio::spawn(traffic::generate(self.shared.traffic.clone(), end));

        while let Some((at, action)) = self.pop() {
            // Every event falls before the end (`Scenario::validate`); past it
            // there is only the undoing of a fault still switched on, done at once.
            let undo = matches!(action, Action::EndConstructorFailures | Action::EndFlap(_));
            if !(undo && at > sc.duration) {
                tokio::time::sleep_until(self.shared.start + at).await;
            }
            self.act(action).await?;
        }
        tokio::time::sleep_until(end).await;
        if let Some(p) = &self.shared.progress {
            p.set_prefix("draining");
        }
        let _ = traffic.await;
        let run_end = self.shared.now();
        self.settle(run_end).await;
        tokio::time::sleep(QUIET).await;
        self.shared.stop_sampler.store(true, Ordering::Release);
        let _ = sampler.await;
        if let Some(p) = &self.shared.progress {
            p.set_prefix("checking");
        }
        let invariants = self.check().await;
        self.finish(run_end, invariants).await
    }

    /// Do one action of the queue.
    async fn act(&mut self, action: Action) -> Result<()> {
        match action {
            Action::InitialConfig(config) => {
                let now = self.shared.now();
                self.shared
                    .say(format!("applying {}", config.path.display()));
                self.apply_config(&config, now).await?;
                self.initial_done();
            }
            Action::Batch(k) => self.deploy_batch(k).await?,
            Action::Event(e) => self.inject(e).await?,
            Action::EndConstructorFailures => {
                self.shared.world.set_failure_rate(self.base_failure_rate);
            }
            Action::EndFlap(apps) => self.shared.world.set_flapping(&apps, false),
        }
        Ok(())
    }

    /// Deploy initial batch `k` of the workload.
    async fn deploy_batch(&mut self, k: usize) -> Result<()> {
        let w = &self.sc().workload;
        let batches = w.apps.div_ceil(w.batch);
        let apps = self.initial_batch(k);
        self.shared.say(format!("batch {} of {batches}", k + 1));
        self.deploy(&apps).await?;
        self.initial_done();
        Ok(())
    }

    /// One initial operation is done; after the last, convergence is measured.
    fn initial_done(&mut self) {
        self.initial_pending = self.initial_pending.saturating_sub(1);
        if self.initial_pending == 0 {
            self.shared.observed().initial_acked = true;
            if let Some(p) = &self.shared.progress {
                p.set_message("waiting for every application");
            }
        }
    }

    /// After the run: let everything converge again.
    async fn settle(&mut self, run_end: f64) {
        if let Some(s) = self.shared.handles().serve() {
            self.note_unfired(&s, "at the end of the run");
            s.faults().clear();
        }
        {
            let wall = self.shared.wall0.elapsed().as_secs_f64();
            let mut o = self.shared.observed();
            o.settle_from = Some((run_end, wall));
        }
        if let Some(p) = &self.shared.progress {
            p.set_prefix("settling");
            p.set_message("waiting for every application");
        }
        let deadline = Instant::now() + self.sc().settle_timeout;
        while Instant::now() < deadline {
            if self.shared.observed().final_at.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
