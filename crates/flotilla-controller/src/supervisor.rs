//! The Supervisor: restarts the Controller, forwards API messages to the current
//! one, and escalates to the embedding program when restarts come too fast.

use std::time::Duration;

use flotilla_core::naming;
use flotilla_replica::supervision::RestartLog;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::watch;
use tracing::{error, warn};

use crate::{Controller, ControllerArgs, ControllerMsg};

/// Everything the Supervisor needs.
pub struct SupervisorArgs {
    /// Given to every Controller it starts.
    pub controller: ControllerArgs,
    /// Where a fatal error is announced to the embedding program.
    pub fatal: watch::Sender<Option<String>>,
}

/// Messages to the Supervisor.
#[derive(Debug)]
pub enum SupervisorMsg {
    /// Forward to the current Controller (queued while it restarts).
    Forward(ControllerMsg),
    /// Internal: the restart backoff passed.
    Restart,
    /// Crash the Controller now (fault injection).
    CrashController,
    /// Reply with how many times the Controller was restarted.
    Restarts(ractor::RpcReplyPort<u64>),
}

/// The supervisor actor.
pub struct Supervisor;

/// The Supervisor's state.
pub struct SupervisorState {
    args: SupervisorArgs,
    controller: Option<ActorRef<ControllerMsg>>,
    queued: Vec<ControllerMsg>,
    log: RestartLog,
    restarts: u64,
}

impl Supervisor {
    async fn start_controller(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let name = naming::controller(&state.args.controller.ns);
        let (c, _) = Actor::spawn_linked(
            Some(name),
            Controller,
            state.args.controller.clone(),
            myself.get_cell(),
        )
        .await?;
        for m in state.queued.drain(..) {
            let _ = c.cast(m);
        }
        state.controller = Some(c);
        Ok(())
    }

    fn give_up(myself: &ActorRef<SupervisorMsg>, state: &SupervisorState, why: String) {
        error!(%why, "supervisor gives up");
        state.args.fatal.send_replace(Some(why.clone()));
        myself.stop(Some(why));
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut state = SupervisorState {
            args,
            controller: None,
            queued: Vec::new(),
            log: RestartLog::default(),
            restarts: 0,
        };
        Self::start_controller(&myself, &mut state).await?;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Forward(m) => match &state.controller {
                Some(c) => {
                    if let Err(ractor::MessagingErr::SendErr(m)) = c.cast(m) {
                        state.queued.push(m);
                    }
                }
                None => state.queued.push(m),
            },
            SupervisorMsg::Restart => {
                if state.controller.is_none()
                    && let Err(e) = Self::start_controller(&myself, state).await
                {
                    warn!(error = %e, "controller failed to start; retrying");
                    match state.log.on_crash(&state.args.controller.restart) {
                        Some(d) => {
                            myself.send_after(d, || SupervisorMsg::Restart);
                        }
                        None => {
                            Self::give_up(&myself, state, format!("controller cannot start: {e}"))
                        }
                    }
                }
            }
            SupervisorMsg::CrashController => {
                if let Some(c) = &state.controller {
                    c.kill();
                }
            }
            SupervisorMsg::Restarts(reply) => {
                let _ = reply.send(state.restarts);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        evt: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let why = match evt {
            SupervisionEvent::ActorFailed(_, e) => e.to_string(),
            SupervisionEvent::ActorTerminated(_, _, reason) => {
                reason.unwrap_or_else(|| "killed".to_owned())
            }
            _ => return Ok(()),
        };
        state.controller = None;
        warn!(%why, "controller exited; restarting");
        state.restarts += 1;
        match state.log.on_crash(&state.args.controller.restart) {
            Some(delay) => {
                myself.send_after(delay.max(Duration::from_millis(1)), || {
                    SupervisorMsg::Restart
                });
            }
            None => Self::give_up(
                &myself,
                state,
                format!("the controller crashed too often (last: {why})"),
            ),
        }
        Ok(())
    }
}
