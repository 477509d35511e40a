//! The Controller's messages: one variant per request.

use flotilla_application::AppEvent;
use flotilla_core::{
    ApiType, AppName, ApplicationSpec, ApplicationStatusInfo, DeploymentName, ServeConfig,
};
use ractor::RpcReplyPort;
use tokio::sync::watch;

use flotilla_store::StoreCounters;

use crate::{BuildError, ServeError};

/// A snapshot of the Controller, for tests and metrics.
#[derive(Debug, Clone, Default)]
pub struct ControllerSnapshot {
    /// Applications with a record (including those being deleted).
    pub apps: usize,
    /// Applications being deleted.
    pub deleting: usize,
    /// Living ApplicationActors.
    pub app_actors: usize,
    /// ApplicationActor restarts after a crash since the instance started,
    /// over every Controller's life.
    pub app_restarts: u64,
    /// The checkpoint's commits, keys and bytes written since it was opened.
    pub store: StoreCounters,
}

/// An application's committed target, as the Controller's reply to
/// [`ControllerMsg::Deploy`] gives it.
#[derive(Debug)]
pub struct Deployed {
    /// The target's generation: the application's status shows it as
    /// `observed_generation` once its actor works on it.
    pub generation: u64,
    /// The application's status, subscribed in the deploy's own turn: the
    /// channel closes once this application is deleted, whatever a later
    /// one of the same name does.
    pub status: watch::Receiver<ApplicationStatusInfo>,
}

/// An application's committed deletion, as the Controller's reply to
/// [`ControllerMsg::Delete`] gives it.
#[derive(Debug)]
pub struct Deleting {
    /// The deletion's generation: a later deploy of the name publishes a
    /// greater `observed_generation`, which cancels the deletion.
    pub generation: u64,
    /// The application's status, subscribed in the deletion's own turn, so
    /// that a caller watches the application it deleted, whenever that was
    /// created: the channel closes once the application is gone.
    pub status: watch::Receiver<ApplicationStatusInfo>,
}

/// Messages to the Controller: the public API's requests, and its own internal
/// ones.
#[derive(Debug)]
pub enum ControllerMsg {
    /// Deploy (or redeploy) a batch of applications: one validation, one commit.
    /// Replies with each application's new target, in order.
    Deploy {
        /// The applications.
        apps: Vec<ApplicationSpec>,
        /// How they are deployed.
        api_type: ApiType,
        /// The reply.
        reply: RpcReplyPort<Result<Vec<Deployed>, ServeError>>,
    },
    /// Delete applications (unknown names are ignored): one commit. Replies,
    /// per name, with its deletion, `None` for an unknown name.
    Delete {
        /// The applications.
        names: Vec<AppName>,
        /// The reply.
        reply: RpcReplyPort<Result<Vec<Option<Deleting>>, ServeError>>,
    },
    /// Apply a declarative config: one validation, one commit (the config and the
    /// deletion of declarative applications it no longer names), then a build
    /// per application whose entry changed.
    ApplyConfig {
        /// The config.
        config: Box<ServeConfig>,
        /// The reply.
        reply: RpcReplyPort<Result<(), ServeError>>,
    },
    /// Set a deployment's replica count from outside (Ray's external scaler):
    /// only for an application with `external_scaler_enabled`; durable in one
    /// commit, and it stands until the application declares another count.
    ScaleDeployment {
        /// The application.
        app: AppName,
        /// The deployment.
        deployment: DeploymentName,
        /// The replica count.
        replicas: u32,
        /// The reply.
        reply: RpcReplyPort<Result<(), ServeError>>,
    },
    /// Reply with a snapshot.
    Observe(RpcReplyPort<ControllerSnapshot>),
    /// Reply with the last applied config as it is durable (`None` if no config
    /// was ever applied); read-only, answered during shutdown too.
    AppliedConfig(RpcReplyPort<Option<ServeConfig>>),
    /// Stop every replica gracefully; reply when done. The checkpoint is closed
    /// once the Controller stops.
    Shutdown(RpcReplyPort<()>),
    /// The Controller's own messages (its children's reports, build results,
    /// timers); only this crate makes one.
    Internal(Internal),
}

/// `ractor`'s `cluster` feature (on for nodes) wants every message type to say it is one; this one stays local.
impl ractor::Message for ControllerMsg {}

/// A Controller's message to itself; opaque outside this crate.
#[derive(Debug)]
pub struct Internal(pub(crate) InternalMsg);

#[derive(Debug)]
pub(crate) enum InternalMsg {
    /// An event from an ApplicationActor.
    App(AppEvent),
    /// A build finished (or failed, panicked or timed out).
    BuildDone {
        /// The application.
        app: AppName,
        /// Which build (a newer config cancels older builds).
        build: u64,
        /// The built spec, or why the build failed.
        result: Result<ApplicationSpec, BuildError>,
    },
    /// A crashed (or not yet startable) ApplicationActor's delay passed.
    RestartApp(AppName),
    /// Remove the records of the deletions finished since the last removal, in
    /// one commit (the reports queued before it are batched).
    RemoveDeleted,
    /// Land the finished builds that can land now: after a commit that may
    /// have released their prefixes, or to try again after a failed commit.
    SettleParked,
}

impl From<InternalMsg> for ControllerMsg {
    fn from(m: InternalMsg) -> Self {
        ControllerMsg::Internal(Internal(m))
    }
}
