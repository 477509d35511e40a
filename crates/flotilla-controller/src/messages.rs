//! The Controller's messages: one variant per request.

use flotilla_application::AppEvent;
use flotilla_core::{ApiType, AppName, ApplicationSpec, ServeConfig};
use ractor::RpcReplyPort;

use crate::ServeError;

/// A snapshot of the Controller, for tests and metrics.
#[derive(Debug, Clone, Default)]
pub struct ControllerSnapshot {
    /// Applications with a record (including those being deleted).
    pub apps: usize,
    /// Applications being deleted.
    pub deleting: usize,
    /// Living ApplicationActors.
    pub app_actors: usize,
    /// ApplicationActor restarts since this Controller started.
    pub app_restarts: u64,
}

/// Messages to the Controller.
#[derive(Debug)]
pub enum ControllerMsg {
    /// Deploy (or redeploy) a batch of applications: one validation, one commit.
    /// Replies with each application's new generation, in order.
    Deploy {
        /// The applications.
        apps: Vec<ApplicationSpec>,
        /// How they are deployed.
        api_type: ApiType,
        /// The reply.
        reply: RpcReplyPort<Result<Vec<u64>, ServeError>>,
    },
    /// Delete applications (unknown names are ignored): one commit. Replies with the
    /// generation of each deletion, `None` for an unknown name.
    Delete {
        /// The applications.
        names: Vec<AppName>,
        /// The reply.
        reply: RpcReplyPort<Result<Vec<Option<u64>>, ServeError>>,
    },
    /// Apply a declarative config: one validation, one commit (the config and the
    /// deletion of declarative applications it no longer names), then a build task
    /// per application whose entry changed.
    ApplyConfig {
        /// The config.
        config: Box<ServeConfig>,
        /// The reply.
        reply: RpcReplyPort<Result<(), ServeError>>,
    },
    /// Internal: a build task finished (or failed, panicked or timed out).
    BuildDone {
        /// The application.
        app: AppName,
        /// Which build (a newer config cancels older builds).
        build: u64,
        /// The built spec, or why the build failed.
        result: Result<ApplicationSpec, crate::BuildError>,
    },
    /// An event from an ApplicationActor.
    App(AppEvent),
    /// Internal: a crashed ApplicationActor's backoff passed.
    RestartApp(AppName),
    /// Internal: remove the records of the deletions finished since the last
    /// removal, in one commit (the reports queued before it are batched).
    RemoveDeleted,
    /// Reply with a snapshot.
    Observe(RpcReplyPort<ControllerSnapshot>),
    /// Reply with the last applied config as it is durable (`None` if no config
    /// was ever applied); read-only, answered during shutdown too.
    AppliedConfig(RpcReplyPort<Option<ServeConfig>>),
    /// Stop every replica gracefully; reply when done.
    Shutdown(RpcReplyPort<()>),
}
