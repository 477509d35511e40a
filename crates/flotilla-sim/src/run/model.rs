//! The model: what every application must be, as the acknowledged operations
//! say. The sampler measures convergence against it and the invariants judge the
//! end state by it.

use std::collections::BTreeMap;

use crate::workload::AppTarget;

/// What one application should be, as the acknowledged operations say.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Slot {
    /// Never deployed.
    Unknown,
    /// Present at this target.
    Present(AppTarget),
    /// Being deleted (not yet acknowledged).
    Deleting(AppTarget),
    /// Deleted.
    Deleted,
}

/// What the simulation expects of an application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// Nothing (never deployed).
    Ignore,
    /// RUNNING.
    Running,
    /// DEPLOY_FAILED: its code is broken.
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

    /// What application `idx` must be.
    pub(super) fn expect(&self, idx: u32) -> Expect {
        match self.slot(idx) {
            Slot::Unknown => Expect::Ignore,
            Slot::Present(t) | Slot::Deleting(t) if t.broken => Expect::DeployFailed,
            Slot::Present(_) | Slot::Deleting(_) => Expect::Running,
            Slot::Deleted => Expect::Absent,
        }
    }

    /// The applications present (without the broken ones if `healthy_only`).
    pub(super) fn present(&self, healthy_only: bool) -> Vec<u32> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Slot::Present(t) if !(healthy_only && t.broken)))
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Applications ever deployed.
    pub(super) fn known(&self) -> usize {
        self.slots.iter().filter(|s| **s != Slot::Unknown).count()
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
