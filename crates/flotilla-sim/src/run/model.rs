//! The model: what every application must be, as the acknowledged operations
//! say. The sampler measures convergence against it and the invariants judge the
//! end state by it.

use std::{borrow::Cow, collections::BTreeMap, sync::Arc};

use flotilla::ApplicationSpec;

use crate::{
    Result,
    scenario::WorkloadSpec,
    serve_config::DeclaredApp,
    workload::{self, AppTarget},
};

/// What one application should be, as the acknowledged operations say.
#[derive(Debug, Clone)]
pub(super) enum Slot {
    /// Never deployed.
    Unknown,
    /// Present at this target.
    Present(Target),
    /// Being deleted (not yet acknowledged).
    Deleting(Target),
    /// Deleted.
    Deleted,
}

/// An application's acknowledged target.
#[derive(Debug, Clone)]
pub(super) enum Target {
    /// Deployed by `run_many` (the imperative workload).
    Imperative(AppTarget),
    /// Declared by an applied ServeConfig.
    Declared(Declared),
}

/// A declared application's target.
#[derive(Debug, Clone)]
pub(super) struct Declared {
    /// What the config says it must become.
    pub(super) app: Arc<DeclaredApp>,
    /// The config entry whose spec its deployments run: `app` itself, or, where
    /// `app` fails to build, the entry that ran before (Flotilla keeps an
    /// application's last target when a new build fails), if any.
    pub(super) runs: Option<Arc<DeclaredApp>>,
}

impl Declared {
    /// `app` as the new target of an application whose target was `before`.
    pub(super) fn after(app: Arc<DeclaredApp>, before: Option<&Declared>) -> Declared {
        let runs = if app.built.spec().is_some() {
            Some(app.clone())
        } else {
            before.and_then(|b| b.runs.clone())
        };
        Declared { app, runs }
    }
}

/// What an application's deployments must run.
pub(super) struct Running<'a> {
    /// The spec.
    pub(super) spec: Cow<'a, ApplicationSpec>,
    /// Its code is broken: no replica ever starts.
    pub(super) broken: bool,
}

impl Target {
    /// Whether it must end DEPLOY_FAILED.
    pub(super) fn fails(&self) -> bool {
        match self {
            Target::Imperative(t) => t.broken,
            Target::Declared(d) => d.app.fails(),
        }
    }

    /// The imperative target, if it is one.
    pub(super) fn imperative(&self) -> Option<&AppTarget> {
        match self {
            Target::Imperative(t) => Some(t),
            Target::Declared(_) => None,
        }
    }

    /// The declared target, if it is one.
    pub(super) fn declared(&self) -> Option<&Declared> {
        match self {
            Target::Imperative(_) => None,
            Target::Declared(d) => Some(d),
        }
    }

    /// What application `idx`'s deployments must run, if anything (`None`: a
    /// declared application that never built).
    pub(super) fn running(&self, workload: &WorkloadSpec, idx: u32) -> Result<Option<Running<'_>>> {
        Ok(match self {
            Target::Imperative(t) => Some(Running {
                spec: Cow::Owned(workload::app_spec(workload, idx, t)?),
                broken: t.broken,
            }),
            Target::Declared(d) => d.runs.as_ref().and_then(|r| {
                r.built.spec().map(|spec| Running {
                    spec: Cow::Borrowed(spec),
                    broken: r.broken,
                })
            }),
        })
    }
}

/// What the simulation expects of an application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// Nothing (never deployed).
    Ignore,
    /// RUNNING.
    Running,
    /// DEPLOY_FAILED: its code is broken, or its build fails.
    DeployFailed,
    /// Gone.
    Absent,
}

impl Expect {
    /// The summary's name for it (`None` for [`Expect::Ignore`]).
    pub(super) fn label(self) -> Option<&'static str> {
        match self {
            Expect::Ignore => None,
            Expect::Running => Some("RUNNING"),
            Expect::DeployFailed => Some("DEPLOY_FAILED"),
            Expect::Absent => Some("deleted"),
        }
    }
}

/// Every application's slot, by index.
#[derive(Debug, Default)]
pub(super) struct Model {
    slots: Vec<Slot>,
}

impl Model {
    /// Application `idx`'s slot.
    pub(super) fn slot(&self, idx: u32) -> &Slot {
        self.slots.get(idx as usize).unwrap_or(&Slot::Unknown)
    }

    /// Set application `idx`'s slot.
    pub(super) fn set(&mut self, idx: u32, slot: Slot) {
        let i = idx as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, Slot::Unknown);
        }
        self.slots[i] = slot;
    }

    /// Application `idx`'s target, if it is present.
    pub(super) fn target(&self, idx: u32) -> Option<&Target> {
        match self.slot(idx) {
            Slot::Present(t) => Some(t),
            _ => None,
        }
    }

    /// What application `idx` must be.
    pub(super) fn expect(&self, idx: u32) -> Expect {
        match self.slot(idx) {
            Slot::Unknown => Expect::Ignore,
            Slot::Present(t) | Slot::Deleting(t) if t.fails() => Expect::DeployFailed,
            Slot::Present(_) | Slot::Deleting(_) => Expect::Running,
            Slot::Deleted => Expect::Absent,
        }
    }

    /// The applications present (without those that must fail if
    /// `healthy_only`), imperative and declared.
    pub(super) fn present(&self, healthy_only: bool) -> Vec<u32> {
        self.present_where(|t| !(healthy_only && t.fails()))
    }

    /// The imperative applications present (without the broken ones if
    /// `healthy_only`): those `run_many` may redeploy.
    pub(super) fn present_imperative(&self, healthy_only: bool) -> Vec<u32> {
        self.present_where(|t| t.imperative().is_some() && !(healthy_only && t.fails()))
    }

    /// The declared applications present, with their targets.
    pub(super) fn present_declared(&self) -> Vec<(u32, Declared)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Slot::Present(Target::Declared(d)) => Some((i as u32, d.clone())),
                _ => None,
            })
            .collect()
    }

    fn present_where(&self, keep: impl Fn(&Target) -> bool) -> Vec<u32> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Slot::Present(t) if keep(t)))
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Applications ever deployed.
    pub(super) fn known(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !matches!(s, Slot::Unknown))
            .count()
    }

    /// Applications deleted (acknowledged).
    pub(super) fn deleted(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::Deleted))
            .count()
    }

    /// Every slot with its index, in index order.
    pub(super) fn slots(&self) -> Vec<(u32, Slot)> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u32, s.clone()))
            .collect()
    }

    /// Applications by what they must be, by the summary's names.
    pub(super) fn tally(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for i in 0..self.slots.len() as u32 {
            if let Some(key) = self.expect(i).label() {
                *out.entry(key.to_owned()).or_insert(0) += 1;
            }
        }
        out
    }
}
