//! Errors of the embedding API.

use flotilla_store::StoreError;
use flotilla_supervision::Escalation;

/// The largest config file `apply_config_file` reads (10 MiB, the REST API's
/// default body limit): a config is text a person writes.
pub const MAX_CONFIG_FILE_BYTES: u64 = 10 << 20;

/// Why a call to Flotilla failed. A call refused before its commit (an
/// invalid spec, a name in use, a store that refused the write, ...) changed
/// nothing. Errors that come after the commit say so: `DeployFailed` and
/// `NotFound` from a `run` that waited (the target was accepted, and stays),
/// `ControllerCrashed` (the change may or may not have landed; calls are
/// idempotent, so retry).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A spec, name or config is invalid.
    #[error(transparent)]
    Invalid(#[from] flotilla_core::Error),
    /// `run_many` (or `deploy`) was given no application (Ray: "No applications
    /// provided").
    #[error("no applications provided")]
    NoApplications,
    /// Code a call names is not in the `Registry`: a deployment's import path
    /// (then `deployment` names it) or a config's application builder.
    #[error(
        "application '{app}'{}: nothing is registered under import path '{import_path}' \
         (register it in the Registry before naming it)",
        deployment.as_ref().map(|d| format!(", deployment '{d}'")).unwrap_or_default()
    )]
    NotRegistered {
        /// The application.
        app: String,
        /// The deployment whose code is missing; `None` for an application builder.
        deployment: Option<String>,
        /// The import path nothing is registered under.
        import_path: String,
    },
    /// A deployment's config batches its requests (`batching`:
    /// `max_batch_size`...), but the code it names does not accept batches
    /// (`Deployment::BATCHED` is false): its default `handle_batch` would let
    /// one request's error fail, and reach, every caller of its batch.
    #[error(
        "application '{app}', deployment '{deployment}': its config batches requests \
         (max_batch_size, batch_wait_timeout_s), but the code under import path \
         '{import_path}' does not accept batches: set `const BATCHED: bool = true` beside \
         its handle_batch (Ray's @serve.batch), or remove the batching settings"
    )]
    NotBatched {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
        /// The import path of its code.
        import_path: String,
    },
    /// A deployment's config limits the models each replica keeps loaded
    /// (`max_num_models_per_replica` other than its default), but the code it
    /// names is not multiplexed (registered with `register`, not
    /// `register_multiplexed`): the limit would bound nothing. In Ray the limit
    /// is `@serve.multiplexed`'s argument, so it cannot be set on other code.
    #[error(
        "application '{app}', deployment '{deployment}': its config sets \
         max_num_models_per_replica, but the code under import path '{import_path}' is not \
         multiplexed: register it with Registry::register_multiplexed (Ray's \
         @serve.multiplexed), or remove the setting"
    )]
    NotMultiplexed {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
        /// The import path of its code.
        import_path: String,
    },
    /// A config or spec names, in `field`, an autoscaling policy or a request
    /// router that the `Registry` does not have.
    #[error(
        "application '{app}'{}, field `{field}`: nothing is registered under import path \
         '{import_path}': {reason}",
        deployment.as_ref().map(|d| format!(", deployment '{d}'")).unwrap_or_default()
    )]
    NotRegisteredAt {
        /// The application.
        app: String,
        /// The deployment, unless the field is the application's.
        deployment: Option<String>,
        /// The field, as a config file names it.
        field: &'static str,
        /// The import path nothing is registered under.
        import_path: String,
        /// What to do about it.
        reason: &'static str,
    },
    /// An application's replica counts were set from outside, but it does not
    /// enable an external scaler (Ray answers 412 Precondition Failed).
    #[error(
        "application '{app}' does not enable an external scaler (external_scaler_enabled: true); its replica counts are its own"
    )]
    ExternalScalerDisabled {
        /// The application.
        app: String,
    },
    /// The application is being deleted, so its replica counts can no longer
    /// be set (Ray's `DeploymentIsBeingDeletedError`).
    #[error("application '{app}' is being deleted")]
    BeingDeleted {
        /// The application.
        app: String,
    },
    /// The same application name appears twice in one batch.
    #[error("application '{app}' appears more than once in the batch")]
    DuplicateApp {
        /// The repeated name.
        app: String,
    },
    /// A route prefix is used twice in the batch, or by another live application.
    #[error(
        "application '{app}': route prefix '{prefix}' is already used by application '{holder}'"
    )]
    RouteTaken {
        /// The application that asked for it.
        app: String,
        /// The prefix.
        prefix: String,
        /// Who holds it.
        holder: String,
    },
    /// A config names an application deployed imperatively (by `run`) without
    /// `take_over: true`.
    #[error(
        "application '{app}' was deployed imperatively; set `take_over: true` in the config to manage it declaratively"
    )]
    ImperativeApp {
        /// The application.
        app: String,
    },
    /// A config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    ConfigFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A config file path that names no regular file (a directory, a FIFO, a
    /// device): refused from its metadata, before anything opens it.
    #[error("config file {path} is not a regular file")]
    ConfigFileNotAFile {
        /// The path.
        path: std::path::PathBuf,
    },
    /// A config file larger than [`MAX_CONFIG_FILE_BYTES`].
    #[error("config file {path} is larger than {limit} bytes")]
    ConfigFileTooLarge {
        /// The file.
        path: std::path::PathBuf,
        /// The limit.
        limit: u64,
    },
    /// The checkpoint store failed; nothing was changed.
    #[error("checkpoint store: {0}")]
    Store(#[from] StoreError),
    /// The application reached DEPLOY_FAILED at the awaited generation. The
    /// call's change was committed before the wait, and stays.
    #[error("application '{app}' failed to deploy (its target is committed and stays): {message}")]
    DeployFailed {
        /// The application.
        app: String,
        /// Its status message.
        message: String,
    },
    /// Another running Flotilla instance of this process has the namespace.
    #[error(
        "namespace '{namespace}' is in use by another running Flotilla instance of this process"
    )]
    NamespaceInUse {
        /// The namespace.
        namespace: String,
    },
    /// No such application, or (`deployment` given) the application's target
    /// has no such deployment.
    #[error("{}", match deployment {
        None => format!("application '{app}' doesn't exist"),
        Some(d) => format!("application '{app}' has no deployment '{d}'"),
    })]
    NotFound {
        /// The application.
        app: String,
        /// The deployment asked for, when the application exists.
        deployment: Option<String>,
    },
    /// The Controller crashed while handling the call: it may or may not have been
    /// applied (as in Ray Serve); calls are idempotent, so retry.
    #[error("the controller crashed while handling the call; retry it")]
    ControllerCrashed,
    /// Flotilla is shut down, shutting down, or its supervisor gave up.
    #[error("flotilla is not running: {0}")]
    Unavailable(#[source] NotRunning),
    /// The head could not start (`ServeOptions::nodes`): its options are
    /// invalid, or it could not listen for nodes.
    #[error("the head could not start: {0}")]
    Nodes(#[from] flotilla_cluster::nodes::NodeError),
}

/// Why flotilla is not running, as [`ServeError::Unavailable`] says.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotRunning {
    /// `shutdown` has begun: nothing new starts while replicas drain.
    #[error("flotilla is shutting down")]
    ShuttingDown,
    /// The instance stopped: `shutdown` finished, or it stopped at once
    /// (its last `Serve` dropped, its Supervisor gone without giving up).
    #[error("flotilla was stopped (shut down, or its last handle dropped)")]
    Stopped,
    /// The Supervisor gave up on the Controller.
    #[error("flotilla's supervisor gave up: {0}")]
    GaveUp(#[source] Fatal),
    /// The Supervisor could not be started.
    #[error("its supervisor failed to start: {0}")]
    SupervisorFailedToStart(#[source] ractor::SpawnErr),
    /// The instance stopped (shut down, or its supervisor gave up) while a
    /// call waited for an application's status; what the call changed was
    /// committed.
    #[error(
        "flotilla stopped (shut down, or its supervisor gave up) while this call waited for \
         application '{app}'; what the call changed was committed"
    )]
    StoppedWhileWaiting {
        /// The application the call waited for.
        app: String,
    },
}

/// Why an instance stopped serving for good: what `Serve::fatal` resolves to.
/// Every later call answers [`ServeError::Unavailable`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fatal {
    /// The Controller crashed, or failed to start again, more often than its
    /// restart policy allows, and the Supervisor gave up.
    #[error(
        "the controller crashed more than {} times in {:?} (last: {last})",
        escalation.max_restarts,
        escalation.window
    )]
    ControllerCrashLoop {
        /// The restart policy it went past.
        #[source]
        escalation: Escalation,
        /// How the last crash or failed start ended, for people.
        last: String,
    },
}
