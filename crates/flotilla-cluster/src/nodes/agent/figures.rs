//! The batch and model figures of this node's replicas, reported to the head
//! with every [`REPORT_BEATS`]th heartbeat, those that changed
//! (`Control::Figures`): the head's `/metrics` exports them as it does its
//! own replicas'. Scrapes come every 10-15 s; a busy replica's figures change
//! with every request, so they are not sent at every beat.

use std::collections::HashMap;

use flotilla_replica::ReplicaId;

use super::AgentState;
use crate::nodes::wire::{Control, FIGURES_PART, WireFigures};

/// Figures are reported every this many heartbeats (5 s at the default
/// 500 ms).
pub(super) const REPORT_BEATS: u64 = 10;

/// Every figure is reported again every this many heartbeats, changed or
/// not (30 s at the default): one the head could not take (a replica it had
/// no mirror of yet) reaches it then, as a load report does.
pub(super) const REFRESH_BEATS: u64 = 60;

// A refresh falls on a reporting beat.
const _: () = assert!(REFRESH_BEATS.is_multiple_of(REPORT_BEATS));

/// What the current head session was last told, per replica.
#[derive(Default)]
pub(super) struct Reported(HashMap<u64, WireFigures>);

impl Reported {
    /// A new head session was told nothing yet.
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Tell the head the figures that changed since it was last told (all of
/// them if `all`), in replica order, in parts of at most [`FIGURES_PART`]
/// replicas.
pub(super) fn report(state: &mut AgentState, all: bool) {
    if all {
        state.figures.clear();
    }
    let mut now: Vec<WireFigures> = (state.replicas.iter())
        .filter_map(|(id, local)| {
            let ep = local.endpoint.as_ref()?;
            let batches = ep.batch_stats().map(|s| s.counts());
            let models = ep.model_stats().map(|s| s.counts());
            (batches.is_some() || models.is_some()).then_some(WireFigures {
                replica: id.0,
                batches,
                models,
            })
        })
        .collect();
    now.sort_unstable_by_key(|f| f.replica);
    let replicas = &state.replicas;
    state
        .figures
        .0
        .retain(|id, _| replicas.contains_key(&ReplicaId(*id)));
    let changed: Vec<WireFigures> = now
        .into_iter()
        .filter(|f| state.figures.0.get(&f.replica) != Some(f))
        .collect();
    for part in changed.chunks(FIGURES_PART) {
        if !state.to_head(Control::Figures(part.to_vec())) {
            return;
        }
        for f in part {
            state.figures.0.insert(f.replica, f.clone());
        }
    }
}
