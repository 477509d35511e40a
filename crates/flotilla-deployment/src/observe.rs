//! Reading a deployment's state from outside its actor tree (the status API,
//! tests): replicas by state and version, pending placements, the status.

use std::time::Duration;

use flotilla_core::{AppName, DeploymentName, actor_names};
use ractor::{ActorRef, rpc::CallResult};

use crate::{DeploymentMsg, DeploymentSnapshot};

/// The snapshot of the DeploymentActor of `app`/`deployment` in the Serve
/// instance of namespace `ns`, found by its registered name. `None` if no such
/// actor is alive (deleted, or restarting) or it did not answer within `timeout`.
pub async fn observe(
    ns: &str,
    app: &AppName,
    deployment: &DeploymentName,
    timeout: Duration,
) -> Option<DeploymentSnapshot> {
    let actor = ActorRef::<DeploymentMsg>::where_is(actor_names::deployment(ns, app, deployment))?;
    match actor.call(DeploymentMsg::Observe, Some(timeout)).await {
        Ok(CallResult::Success(snapshot)) => Some(snapshot),
        _ => None,
    }
}
