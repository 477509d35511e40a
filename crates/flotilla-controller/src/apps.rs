//! The Controller's children: one ApplicationActor per application with a
//! record, started, adopted, restarted and escalated through [`Children`].
//!
//! [`Children`]: flotilla_supervision::Children

use std::{sync::atomic::Ordering, time::Duration};

use flotilla_application::{AppMsg, ApplicationActor};
use flotilla_core::{AppName, actor_names};
use flotilla_supervision::{ChildExit, Escalation, StartError, Started};
use ractor::{ActorProcessingErr, ActorRef};
use tracing::warn;

use crate::{Controller, ControllerMsg, messages::InternalMsg, state::ControllerState};

/// Delay before retrying a spawn whose name is still held by a stopping actor,
/// or a failed commit of a finished deletion.
pub(crate) const RETRY: Duration = Duration::from_millis(10);

impl Controller {
    /// Start or update the ApplicationActor of `name` with its current record.
    pub(crate) async fn command(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: &AppName,
    ) {
        let Some(entry) = state.apps.get(name) else {
            return;
        };
        // One copy of the record per message: a restarted Controller sends
        // one to every application.
        if let Some(actor) = state.actors.actor(name) {
            // A failed cast means it is stopping: its exit event is on its way
            // (it is watched), and the restart that follows (after a backoff
            // if it crashed) starts it with the record as it is then.
            let _ = actor.cast(state.set_target(&entry.record));
            return;
        }
        Self::start_app(myself, state, name).await;
    }

    async fn start_app(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: &AppName,
    ) {
        if state.actors.is_waiting(name) {
            return;
        }
        let Some(entry) = state.apps.get(name) else {
            return;
        };
        // A finished deletion whose record removal failed and waits to be tried
        // again needs no actor to report it once more.
        if entry.record.deleting && state.removals.get(name) == Some(&entry.record.generation) {
            return;
        }
        let args = state.app_args(&entry.record);
        let actor_name = actor_names::application(&state.ns, name);
        let parent = myself.get_cell();
        match state
            .actors
            .start(&parent, name.clone(), actor_name, ApplicationActor, args)
            .await
        {
            Ok(Started::Spawned(_)) => {}
            // A living actor we did not watch held the name: it is ours now.
            Ok(Started::Adopted(actor)) => {
                if let Some(e) = state.apps.get(name) {
                    let _ = actor.cast(state.set_target(&e.record));
                }
            }
            // Already gone (a finished deletion): its Deleted report is on its way.
            Err(StartError::Exited) => Self::restart_later(myself, state, name.clone(), RETRY),
            Err(e) => {
                warn!(app = %name, error = %e, "could not start application actor; retrying");
                Self::restart_later(myself, state, name.clone(), RETRY);
            }
        }
    }

    /// Look at `name` again after `after`.
    pub(crate) fn restart_later(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: AppName,
        after: Duration,
    ) {
        state
            .actors
            .retry_later(name, after, myself, |n| InternalMsg::RestartApp(n).into());
    }

    /// Re-adopt the ApplicationActors a predecessor left running, then start the
    /// missing ones (a restarted Controller).
    pub(crate) async fn adopt_apps(myself: &ActorRef<ControllerMsg>, state: &mut ControllerState) {
        // In name order, not the map's: which application gets room first
        // (on a full cluster, which gets any) must not change from one run
        // of the same history to the next.
        let mut names: Vec<AppName> = state.apps.keys().cloned().collect();
        names.sort();
        for name in names {
            if let Some(actor) =
                ActorRef::<AppMsg>::where_is(actor_names::application(&state.ns, &name))
            {
                state.actors.adopt(&myself.get_cell(), name.clone(), actor);
            }
            Self::command(myself, state, &name).await;
        }
    }

    /// An ApplicationActor exited: a finished deletion, a cancelled one, or a
    /// crash to restart from (escalated past the restart policy).
    pub(crate) async fn app_exited(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        name: AppName,
        how: ChildExit,
    ) -> Result<(), ActorProcessingErr> {
        if state.is_shutting_down() {
            return Ok(());
        }
        let Some(entry) = state.apps.get(&name) else {
            return Ok(());
        };
        match how {
            // A graceful exit means it finished deleting. Its Deleted report is
            // queued behind this event (supervision events come first): let it
            // land before looking again, or every exit would respawn an actor
            // that reports and exits again, without end. If the report was lost,
            // the later look starts an actor that sends it anew.
            ChildExit::Stopped if entry.record.deleting => {
                Self::restart_later(myself, state, name, RETRY);
            }
            // A redeploy cancelled the deletion since: start it with that target.
            ChildExit::Stopped => Self::command(myself, state, &name).await,
            how @ (ChildExit::Killed | ChildExit::Failed { .. }) => {
                warn!(app = %name, %how, "application actor crashed");
                let policy = state.restart;
                match state.actors.on_crash(&name, &policy) {
                    Some(delay) => {
                        state.app_restarts.fetch_add(1, Ordering::Relaxed);
                        Self::restart_later(myself, state, name, delay);
                    }
                    None => {
                        return Err(Escalation::of(format!("application '{name}'"), &policy).into());
                    }
                }
            }
        }
        Ok(())
    }
}
