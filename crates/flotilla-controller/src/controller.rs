//! The Controller actor: recovers its state from the checkpoint, then
//! dispatches each message to the module that owns it (imperative calls in
//! `deploy`, config deploys in `config_deploy`, finished deletions in
//! `removal`, its ApplicationActors in `apps`).

use flotilla_application::{AppEvent, AppMsg};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::{
    ControllerArgs, ControllerMsg, NotRunning, ServeError,
    messages::{Internal, InternalMsg},
    state::ControllerState,
};

/// The controller actor.
pub struct Controller;

/// After `Shutdown`, mutating calls are refused and internal messages dropped, so
/// nothing new starts while the tree drains; `Observe` still tells the truth.
fn refuse_after_shutdown(state: &ControllerState, msg: ControllerMsg) {
    let gone = || ServeError::Unavailable(NotRunning::ShuttingDown);
    match msg {
        ControllerMsg::Deploy { reply, .. } => {
            let _ = reply.send(Err(gone()));
        }
        ControllerMsg::Delete { reply, .. } => {
            let _ = reply.send(Err(gone()));
        }
        ControllerMsg::ApplyConfig { reply, .. } | ControllerMsg::ScaleDeployment { reply, .. } => {
            let _ = reply.send(Err(gone()));
        }
        ControllerMsg::Observe(reply) => {
            let _ = reply.send(state.snapshot());
        }
        ControllerMsg::AppliedConfig(reply) => {
            let _ = reply.send(state.config.applied().cloned());
        }
        ControllerMsg::Shutdown(reply) => {
            let _ = reply.send(());
        }
        ControllerMsg::Internal(_) => {}
    }
}

impl Controller {
    /// Drain every application at once (each drains its deployments), then
    /// reply; nothing new starts meanwhile. An application waiting out a
    /// restart backoff starts first: its replicas drain only through it.
    async fn shutdown(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        reply: ractor::RpcReplyPort<()>,
    ) {
        for name in state.actors.end_waits() {
            Self::command(myself, state, &name).await;
        }
        state.config.cancel_all();
        let actors: Vec<_> = state.actors.actors().map(|(_, a)| a.clone()).collect();
        tokio::spawn(async move {
            futures::future::join_all(actors.iter().map(|a| a.call(AppMsg::Shutdown, None))).await;
            for a in actors {
                a.stop(None);
            }
            let _ = reply.send(());
        });
        // Once the drain runs: a successor then leaves it to go on.
        state
            .shutdown
            .store(true, std::sync::atomic::Ordering::Release);
    }

    async fn internal(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        msg: InternalMsg,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            InternalMsg::App(AppEvent::Deleted { name, generation }) => {
                Self::deleted(myself, state, name, generation);
            }
            InternalMsg::App(AppEvent::Autoscale {
                app,
                deployment,
                replicas,
                generation,
            }) => Self::autoscale(state, app, deployment, replicas, generation).await?,
            InternalMsg::BuildDone { app, build, result } => {
                Self::build_done(myself, state, app, build, result).await?;
            }
            InternalMsg::RemoveDeleted => Self::remove_deleted(myself, state).await?,
            InternalMsg::SettleParked => Self::settle_parked(myself, state).await?,
            InternalMsg::RestartApp(name) => {
                if state.actors.retry_due(&name) {
                    Self::command(myself, state, &name).await;
                }
            }
        }
        Ok(())
    }
}

impl Actor for Controller {
    type Msg = ControllerMsg;
    type State = ControllerState;
    type Arguments = ControllerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ControllerMsg>,
        args: ControllerArgs,
    ) -> Result<ControllerState, ActorProcessingErr> {
        ControllerState::recover(args)
    }

    async fn post_start(
        &self,
        myself: ActorRef<ControllerMsg>,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        if state.is_shutting_down() {
            // Its predecessor crashed during the shutdown's drain, which goes
            // on without it and stops every ApplicationActor: nothing starts.
            return Ok(());
        }
        Self::adopt_apps(&myself, state).await;
        // A crash during a build: rebuild what the last applied config still owes.
        Self::resume_builds(&myself, state);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ControllerMsg>,
        msg: ControllerMsg,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        if state.is_shutting_down() {
            refuse_after_shutdown(state, msg);
            return Ok(());
        }
        match msg {
            ControllerMsg::Deploy {
                apps,
                api_type,
                reply,
            } => Self::deploy(&myself, state, apps, api_type, reply).await,
            ControllerMsg::Delete { names, reply } => {
                Self::delete(&myself, state, names, reply).await
            }
            ControllerMsg::ApplyConfig { config, reply } => {
                Self::apply_config(&myself, state, config, reply).await
            }
            ControllerMsg::ScaleDeployment {
                app,
                deployment,
                replicas,
                reply,
            } => Self::scale(&myself, state, app, deployment, replicas, reply).await,
            ControllerMsg::Observe(reply) => {
                let _ = reply.send(state.snapshot());
                Ok(())
            }
            ControllerMsg::AppliedConfig(reply) => {
                let _ = reply.send(state.config.applied().cloned());
                Ok(())
            }
            ControllerMsg::Shutdown(reply) => {
                Self::shutdown(&myself, state, reply).await;
                Ok(())
            }
            ControllerMsg::Internal(Internal(m)) => Self::internal(&myself, state, m).await,
        }
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ControllerMsg>,
        evt: SupervisionEvent,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        // Read the event before any await: it is not `Sync`.
        let Some((name, how)) = state.actors.exited(&evt) else {
            return Ok(());
        };
        Self::app_exited(&myself, state, name, how).await
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ControllerMsg>,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        // After a shutdown the checkpoint is done with; a crash leaves it open
        // for the successor.
        if state.is_shutting_down() {
            state.checkpoint.close();
        }
        Ok(())
    }
}
