//! What an ApplicationActor receives and reports.

use std::{collections::BTreeMap, sync::Arc};

use flotilla_core::{AppName, AppRecord, DeploymentName};
use flotilla_deployment::DeploymentEvent;
use ractor::RpcReplyPort;

/// What an ApplicationActor tells the Controller.
#[derive(Debug, Clone)]
pub enum AppEvent {
    /// Every deployment is gone; the actor is stopping. The Controller may now
    /// remove the record.
    Deleted {
        /// The application.
        name: AppName,
        /// The generation whose deletion finished.
        generation: u64,
    },
    /// A deployment's autoscaler decided a new replica target; the Controller makes
    /// it durable, then sends it back as [`AppMsg::SetReplicas`].
    Autoscale {
        /// The application.
        app: AppName,
        /// The deployment.
        deployment: DeploymentName,
        /// The decided replica count.
        replicas: u32,
        /// The generation of the target it was decided under.
        generation: u64,
    },
}

/// How an ApplicationActor reports to the Controller (looked up by name).
pub type AppReporter = Arc<dyn Fn(AppEvent) + Send + Sync>;

/// Messages to an ApplicationActor: the Controller's requests, and its own
/// internal ones.
#[derive(Debug)]
pub enum AppMsg {
    /// A new target (idempotent), with the durable replica decisions that
    /// stand for it (an autoscaler's or an external scaler's; the Controller
    /// drops those a new declaration voids) and the failed build that stands
    /// over it, if any. The Controller sends it again, same target, when a
    /// config's build of the application fails or stops failing.
    SetTarget {
        /// The target.
        record: Box<AppRecord>,
        /// Replica decisions by deployment.
        decisions: BTreeMap<DeploymentName, u32>,
        /// The config's latest build of this application failed while this
        /// target runs: DEPLOY_FAILED with this message sticks over it (Ray:
        /// until a new config), whatever its deployments report. `None`: the
        /// application's own status holds.
        build_failure: Option<String>,
    },
    /// A durable replica decision for one deployment (its autoscaler's, or an
    /// external scaler's).
    SetReplicas(DeploymentName, u32),
    /// Stop every replica gracefully; reply when done.
    Shutdown(RpcReplyPort<()>),
    /// The actor's own messages (its deployments' reports, restart timers);
    /// only this crate makes one.
    Internal(Internal),
}

/// `ractor`'s `cluster` feature (on for nodes) wants every message type to say it is one; this one stays local.
impl ractor::Message for AppMsg {}

/// An ApplicationActor's message to itself; opaque outside this crate.
#[derive(Debug)]
pub struct Internal(pub(crate) InternalMsg);

#[derive(Debug)]
pub(crate) enum InternalMsg {
    /// An event from one of its deployments.
    Deployment(DeploymentEvent),
    /// A crashed deployment's backoff passed; start it again.
    RestartDeployment(DeploymentName),
}

impl From<InternalMsg> for AppMsg {
    fn from(m: InternalMsg) -> Self {
        AppMsg::Internal(Internal(m))
    }
}
