//! Removing the records of finished deletions: batched, one commit for every
//! deletion finished by then.

use std::time::Duration;

use flotilla_core::AppName;
use flotilla_store::Batch;
use flotilla_supervision::Backoff;
use ractor::{ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::{
    Controller, ControllerMsg, apps::RETRY, messages::InternalMsg, state::ControllerState,
};

/// The waits between tries of a removal whose commit keeps failing.
const REMOVAL_BACKOFF: Backoff = Backoff::new(RETRY, Duration::from_secs(5));

impl Controller {
    /// The ApplicationActor finished deleting: its record is removed with the
    /// other deletions finished by then, in one commit ([`Self::remove_deleted`]).
    pub(crate) fn deleted(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: AppName,
        generation: u64,
    ) {
        // While a failed removal waits to be tried again, the new one joins it.
        if state.removals.is_empty() && state.removal_retry.is_none() {
            let _ = myself.cast(InternalMsg::RemoveDeleted.into());
        }
        state.removals.insert(name, generation);
    }

    /// Remove the records of the finished deletions that still stand (a redeploy
    /// may have cancelled one since): one commit for them all.
    pub(crate) async fn remove_deleted(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        // This is the retry, if one was scheduled: whatever happens now, none is.
        let retry = state.removal_retry.take();
        let done: Vec<AppName> = std::mem::take(&mut state.removals)
            .into_iter()
            .filter(|(name, generation)| {
                state
                    .apps
                    .get(name)
                    .is_some_and(|e| e.record.deleting && e.record.generation == *generation)
            })
            .map(|(name, _)| name)
            .collect();
        if done.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new();
        for name in &done {
            batch.delete_app(name);
        }
        if let Err(err) = state.checkpoint.commit(&state.faults, batch).await? {
            // A store that keeps failing (a full disk) is tried again ever less
            // often, not every 10 ms for ever.
            let failures = retry.unwrap_or(0).saturating_add(1);
            let after = REMOVAL_BACKOFF.after(failures);
            state.removal_retry = Some(failures);
            warn!(apps = done.len(), error = %err, retry_in = ?after,
                "could not remove deleted applications; retrying");
            for name in done {
                if let Some(e) = state.apps.get(&name) {
                    let generation = e.record.generation;
                    state.removals.insert(name, generation);
                }
            }
            myself.send_after(after, || InternalMsg::RemoveDeleted.into());
            return Ok(());
        }
        for name in &done {
            state.apps.remove(name);
            state.actors.remove(name);
            state.autoscaled.remove(name);
            state.config.forget_failure(name);
            // Logged by the application's own logging, then forgotten.
            state.board.remove(name);
            info!(app = %name, "application removed");
            state.logging.set_app(name, None);
            // Routes only handles made (to a deployment the application
            // never had): nothing else would ever remove them.
            let stray = state.args.directory.remove_unclaimed(name);
            if stray > 0 {
                debug!(app = %name, routes = stray, "unclaimed routes of a removed application dropped");
            }
        }
        Self::resume_removed(myself, state, &done);
        Ok(())
    }
}
