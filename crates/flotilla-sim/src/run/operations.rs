//! Operations on Flotilla, as a user would send them: deploys (the initial
//! batches and new applications), rolling updates, rescales and deletes, each
//! sent again until acknowledged (a crashed Controller or a failed commit is
//! retried) and entered into the model once it is.

use std::time::Duration;

use flotilla::{ApplicationSpec, RunManyOptions, Serve, ServeError};

use super::{
    events::DATA_WINDOW,
    model::{Slot, Target},
    setup::Sim,
};
use crate::{
    Result, SimError,
    traffic::Cause,
    workload::{self, AppTarget},
};

/// `run_many` returns once the targets are durable.
const NO_WAIT: RunManyOptions = RunManyOptions {
    wait_for_ingress_deployment_creation: false,
    wait_for_applications_running: false,
};

/// Attempts per operation before it is abandoned.
const OP_ATTEMPTS: u32 = 30;

/// ` (acknowledged on attempt N)` or ` (ABANDONED)` for an effect's text.
pub(super) fn attempts_note(attempts: Option<u32>) -> String {
    match attempts {
        Some(0 | 1) => String::new(),
        Some(n) => format!(" (acknowledged on attempt {n})"),
        None => " (ABANDONED)".into(),
    }
}

impl Sim {
    /// Send `op` until it is acknowledged; returns the attempts it took, or `None`
    /// if it was abandoned.
    pub(super) async fn until_acked<F, Fut>(&mut self, what: &str, mut op: F) -> Result<Option<u32>>
    where
        F: FnMut(Serve) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<(), ServeError>>,
    {
        for attempt in 1..=OP_ATTEMPTS {
            let serve = self.serve()?;
            match op(serve).await {
                Ok(()) => {
                    self.ops.acknowledged += 1;
                    return Ok(Some(attempt));
                }
                Err(
                    ServeError::ControllerCrashed
                    | ServeError::Store(_)
                    | ServeError::Unavailable(_),
                ) => {
                    self.ops.retried += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => {
                    return Err(SimError::Unexpected {
                        what: what.to_owned(),
                        source: Box::new(e),
                    });
                }
            }
        }
        self.ops.abandoned += 1;
        Ok(None)
    }

    /// The specs of `apps` at their targets.
    fn specs(&self, apps: &[(u32, AppTarget)]) -> Result<Vec<ApplicationSpec>> {
        apps.iter()
            .map(|(i, t)| workload::app_spec(&self.sc().workload, *i, t))
            .collect()
    }

    /// Deploy (or redeploy) `apps` in one `run_many`; returns the attempts.
    pub(super) async fn deploy(&mut self, apps: &[(u32, AppTarget)]) -> Result<Option<u32>> {
        if apps.is_empty() {
            return Ok(Some(0));
        }
        let specs = self.specs(apps)?;
        let what = format!("deploying {} applications", apps.len());
        let attempts = self
            .until_acked(&what, |serve| {
                let specs = specs.clone();
                async move { serve.run_many(specs, NO_WAIT).await.map(|_| ()) }
            })
            .await?;
        if attempts.is_some() {
            let mut m = self.shared.model();
            for (i, t) in apps {
                m.set(*i, Slot::Present(Target::Imperative(t.clone())));
            }
        }
        Ok(attempts)
    }

    /// The applications of initial batch `k` at their first targets.
    pub(super) fn initial_batch(&self, k: usize) -> Vec<(u32, AppTarget)> {
        let w = &self.sc().workload;
        let from = k * w.batch;
        let to = ((k + 1) * w.batch).min(w.apps);
        // Spread the broken ones over the batches: every `every`-th is broken.
        let every = (w.apps / w.broken_apps.max(1)).max(1);
        (from..to)
            .map(|i| {
                let broken = w.broken_apps > 0 && i % every == 0 && i / every < w.broken_apps;
                (i as u32, self.first_target(broken))
            })
            .collect()
    }

    /// A new application's first target.
    fn first_target(&self, broken: bool) -> AppTarget {
        AppTarget {
            tag: "v1".into(),
            replicas: self.sc().workload.replicas,
            broken,
        }
    }

    /// Application `idx`'s acknowledged target, if it is present and imperative.
    fn target(&self, idx: u32) -> Option<AppTarget> {
        self.shared
            .model()
            .target(idx)
            .and_then(|t| t.imperative().cloned())
    }

    /// Redeploy `n` healthy imperative applications, each at `change` of its
    /// acknowledged target; returns how many and the attempts.
    async fn redeploy(
        &mut self,
        n: usize,
        change: impl Fn(AppTarget) -> AppTarget,
    ) -> Result<(usize, Option<u32>)> {
        let present = self.shared.model().present_imperative(true);
        let picked = self.pick(&present, n);
        let apps: Vec<(u32, AppTarget)> = picked
            .iter()
            .filter_map(|i| self.target(*i).map(|t| (*i, change(t))))
            .collect();
        let attempts = self.deploy(&apps).await?;
        Ok((apps.len(), attempts))
    }

    /// Redeploy `n` healthy applications with new code (a rolling update).
    pub(super) async fn update(&mut self, n: usize) -> Result<String> {
        self.updates += 1;
        let tag = format!("v{}", self.updates + 1);
        let (count, attempts) = self
            .redeploy(n, |t| AppTarget {
                tag: tag.clone(),
                ..t
            })
            .await?;
        Ok(format!(
            "redeployed {count} apps with code {tag}{}",
            attempts_note(attempts)
        ))
    }

    /// Change `n` healthy applications' replica counts (base <-> base + 1).
    pub(super) async fn scale(&mut self, n: usize) -> Result<String> {
        let base = self.sc().workload.replicas;
        let (count, attempts) = self
            .redeploy(n, |t| {
                let replicas = if t.replicas == base { base + 1 } else { base };
                AppTarget { replicas, ..t }
            })
            .await?;
        Ok(format!("rescaled {count} apps{}", attempts_note(attempts)))
    }

    /// Delete `n` applications, imperative or declared (a delete takes a
    /// declared application out of its config's hands) (`now`: virtual seconds,
    /// for the fault window that excuses their failed requests).
    pub(super) async fn delete(&mut self, n: usize, now: f64) -> Result<String> {
        let present = self.shared.model().present(false);
        let picked = self.pick(&present, n);
        self.deleting(&picked, now);
        let names: Vec<String> = picked
            .iter()
            .map(|i| self.shared.world.names().name(*i))
            .collect();
        let attempts = self
            .until_acked("deleting applications", |serve| {
                let names = names.clone();
                async move {
                    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                    serve.delete_apps(&refs, false).await
                }
            })
            .await?;
        if attempts.is_some() {
            let mut m = self.shared.model();
            for i in &picked {
                m.set(*i, Slot::Deleted);
            }
        }
        Ok(format!(
            "deleted {} apps{}",
            picked.len(),
            attempts_note(attempts)
        ))
    }

    /// `apps` are about to be deleted: they take no more traffic, and a window
    /// opening at `now` (virtual seconds) excuses their failed requests.
    pub(super) fn deleting(&self, apps: &[u32], now: f64) {
        {
            let mut m = self.shared.model();
            for i in apps {
                if let Slot::Present(t) = m.slot(*i).clone() {
                    m.set(*i, Slot::Deleting(t));
                }
                self.shared.ready().set(*i, false);
            }
        }
        self.shared.windows().open(
            now,
            DATA_WINDOW,
            Some(apps.iter().copied().collect()),
            Cause::Deleted,
        );
    }

    /// Deploy `n` new healthy applications.
    pub(super) async fn deploy_new(&mut self, n: usize) -> Result<String> {
        let first = self.next_app;
        self.next_app += n as u32;
        let apps: Vec<(u32, AppTarget)> = (first..first + n as u32)
            .map(|i| (i, self.first_target(false)))
            .collect();
        let attempts = self.deploy(&apps).await?;
        Ok(format!("deployed {n} new apps{}", attempts_note(attempts)))
    }
}
