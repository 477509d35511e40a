//! The Supervisor: restarts the Controller, forwards API messages to the current
//! one, and escalates to the embedding program when restarts come too fast.

use std::time::Duration;

use flotilla_core::actor_names;
use flotilla_supervision::{Children, Escalation};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::watch;
use tracing::{error, warn};

use crate::{Controller, ControllerArgs, ControllerMsg, Fatal};

/// Everything the Supervisor needs.
pub struct SupervisorArgs {
    /// Given to every Controller it starts.
    pub controller: ControllerArgs,
    /// Where a fatal error is announced to the embedding program.
    pub fatal: watch::Sender<Option<Fatal>>,
}

/// Messages to the Supervisor.
#[derive(Debug)]
pub enum SupervisorMsg {
    /// Forward to the current Controller (queued while it restarts).
    Forward(ControllerMsg),
    /// Crash the Controller now (fault injection).
    CrashController,
    /// Reply with how many times the Controller was restarted.
    Restarts(ractor::RpcReplyPort<u64>),
    /// The Supervisor's own message; only this crate makes one.
    Internal(SupervisorInternal),
}

/// `ractor`'s `cluster` feature (on for nodes) wants every message type to say it is one; this one stays local.
impl ractor::Message for SupervisorMsg {}

/// The Supervisor's message to itself; opaque outside this crate.
#[derive(Debug)]
pub struct SupervisorInternal(Restart);

/// The restart backoff passed: start the Controller again.
#[derive(Debug)]
struct Restart;

/// The supervisor actor.
pub struct Supervisor;

/// The Supervisor's state.
pub struct SupervisorState {
    args: SupervisorArgs,
    /// The one child: the Controller.
    controller: Children<(), ControllerMsg>,
    queued: Vec<ControllerMsg>,
}

impl Supervisor {
    async fn start_controller(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let name = actor_names::controller(&state.args.controller.ns);
        let started = state
            .controller
            .start(
                &myself.get_cell(),
                (),
                name,
                Controller,
                state.args.controller.clone(),
            )
            .await?;
        for m in state.queued.drain(..) {
            let _ = started.actor().cast(m);
        }
        Ok(())
    }

    fn give_up(myself: &ActorRef<SupervisorMsg>, state: &SupervisorState, why: Fatal) {
        error!(%why, "supervisor gives up");
        state.args.fatal.send_replace(Some(why));
        myself.stop(None);
    }

    /// Count a failure to (re)start: retry after the policy's backoff, or give up.
    fn restart_later(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, why: &str) {
        let policy = state.args.controller.restart;
        match state.controller.on_crash(&(), &policy) {
            Some(delay) => {
                state.controller.retry_later(
                    (),
                    delay.max(Duration::from_millis(1)),
                    myself,
                    |()| SupervisorMsg::Internal(SupervisorInternal(Restart)),
                );
            }
            None => {
                let escalation = Escalation::of("the controller", &policy);
                Self::give_up(
                    myself,
                    state,
                    Fatal::ControllerCrashLoop {
                        escalation,
                        last: why.to_owned(),
                    },
                );
            }
        }
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
            controller: Children::new(),
            queued: Vec::new(),
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
            SupervisorMsg::Forward(m) => match state.controller.actor(&()) {
                Some(c) => {
                    if let Err(ractor::MessagingErr::SendErr(m)) = c.cast(m) {
                        state.queued.push(m);
                    }
                }
                None => state.queued.push(m),
            },
            SupervisorMsg::Internal(SupervisorInternal(Restart)) => {
                if state.controller.retry_due(&())
                    && state.controller.actor(&()).is_none()
                    && let Err(e) = Self::start_controller(&myself, state).await
                {
                    warn!(error = %e, "controller failed to start; retrying");
                    Self::restart_later(&myself, state, &e.to_string());
                }
            }
            SupervisorMsg::CrashController => {
                if let Some(c) = state.controller.actor(&()) {
                    c.kill();
                }
            }
            SupervisorMsg::Restarts(reply) => {
                let _ = reply.send(state.controller.restarts());
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
        let Some(((), how)) = state.controller.exited(&evt) else {
            return Ok(());
        };
        warn!(%how, "controller exited; restarting");
        Self::restart_later(&myself, state, &how.to_string());
        Ok(())
    }
}
