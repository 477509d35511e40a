//! The checkpoint protocol of DESIGN.md, in one place: every call that changes
//! durable state goes through [`Controller::transact`].

use flotilla_core::{AppName, FaultPoint};
use flotilla_store::Batch;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::{Controller, ControllerMsg, ServeError, checkpoint::crash_if, state::ControllerState};

impl Controller {
    /// Validate and stage (`stage` reads the state as it is and fills one
    /// batch; an error is the reply, and nothing changed) -> **one** commit (a
    /// refusal is the reply, nothing changed) -> swap into the state (`swap`
    /// gives the reply and the applications to command) -> reply -> command
    /// them. Returns whether the call was applied, for the caller's work after
    /// the reply.
    pub(crate) async fn transact<S, R>(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        reply: RpcReplyPort<Result<R, ServeError>>,
        stage: impl FnOnce(&ControllerState, &mut Batch) -> Result<S, ServeError>,
        swap: impl FnOnce(&mut ControllerState, S) -> (R, Vec<AppName>),
    ) -> Result<bool, ActorProcessingErr> {
        let mut batch = Batch::new();
        let staged = match stage(state, &mut batch) {
            Ok(s) => s,
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(false);
            }
        };
        if let Err(e) = state.checkpoint.commit(&state.faults, batch).await? {
            let _ = reply.send(Err(e.into()));
            return Ok(false);
        }
        let (answer, names) = swap(state, staged);
        let _ = reply.send(Ok(answer));
        crash_if(&state.faults, FaultPoint::ControllerAfterReply)?;
        for name in &names {
            Self::command(myself, state, name).await;
        }
        Ok(true)
    }
}
