//! The simulator's errors.

use std::{path::PathBuf, time::Duration};

use flotilla::{ServeError, SpecError};

use crate::{
    report::ReportError,
    scenario::{DurationError, format_duration},
    serve_config::ConfigAppError,
};

/// Why a simulation could not run or report. Invariant violations are not errors:
/// they are in the [`Summary`](crate::Summary).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A `--faults` entry or a scenario's fault could not be parsed (its time:
    /// [`FaultTime`](SimError::FaultTime)).
    #[error("fault '{entry}': {why}")]
    Fault {
        /// The entry as written.
        entry: String,
        /// What is wrong with it (the simulator's own reading: an unknown kind,
        /// a count or rate that is not one, too many arguments).
        why: String,
    },
    /// The time (or a duration argument) of a fault entry could not be parsed.
    #[error("fault '{entry}': {source}")]
    FaultTime {
        /// The entry as written.
        entry: String,
        /// Why the duration in it cannot be read.
        #[source]
        source: DurationError,
    },
    /// An event is scheduled at or after the end of the run (`duration`), when
    /// traffic has stopped and nothing it did would be seen.
    #[error(
        "fault '{entry}': at {}, at or after the end of the run at {}, when traffic has stopped \
         (lengthen the duration or drop the entry)",
        format_duration(*.at),
        format_duration(*.duration)
    )]
    EventAfterEnd {
        /// The entry as written.
        entry: String,
        /// Its time.
        at: Duration,
        /// The scenario's duration.
        duration: Duration,
    },
    /// A duration could not be parsed.
    #[error(transparent)]
    Duration(#[from] DurationError),
    /// The store's file could not be read or written around a simulated
    /// process crash.
    #[error("{what}: {source}")]
    Io {
        /// What the simulator was doing.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The scenario is inconsistent (zero nodes, a rate out of range, ...): the
    /// simulator's own check, in words.
    #[error("scenario: {0}")]
    Scenario(String),
    /// A scenario file could not be read.
    #[error("cannot read scenario file {path}: {source}")]
    ReadScenario {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A scenario is not YAML of a scenario's shape (a syntax error, an unknown
    /// field, a value of the wrong type).
    #[error("scenario: {0}")]
    ScenarioYaml(#[source] serde_saphyr::Error),
    /// A scenario file is not a valid scenario.
    #[error("scenario file {path}: {source}")]
    ParseScenario {
        /// The file.
        path: PathBuf,
        /// What is wrong: [`ScenarioYaml`](SimError::ScenarioYaml) (the parser's
        /// message, with line and column) or [`Scenario`](SimError::Scenario).
        source: Box<SimError>,
    },
    /// A ServeConfig file could not be read.
    #[error("cannot read serve config {path}: {source}")]
    ReadServeConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A ServeConfig file is not a valid config (Flotilla's parser and checks).
    #[error("serve config {path}: {source}")]
    ParseServeConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column where known.
        source: Box<flotilla_core::Error>,
    },
    /// An application of a ServeConfig cannot run in the simulation (an import
    /// path that is not one of the simulator's builders, args the builder does
    /// not take, a workload name, a deployment no simulated node can hold).
    #[error("serve config {path}, application '{app}': {source}")]
    ServeConfigApp {
        /// The file.
        path: PathBuf,
        /// The application.
        app: String,
        /// What is wrong.
        source: ConfigAppError,
    },
    /// The simulation's runtime, store or simulated code could not be set up.
    #[error("setting up the simulation: {0}")]
    Setup(#[from] SetupError),
    /// Flotilla refused to start on the simulation's store.
    #[error("flotilla: starting on {store}: {source}")]
    Start {
        /// The store file.
        store: PathBuf,
        /// Why.
        source: Box<ServeError>,
    },
    /// A call to Flotilla failed in a way the simulation cannot go on from (not
    /// a retryable crash or unavailability).
    #[error("flotilla: {what}: unexpected error: {source}")]
    Unexpected {
        /// What the simulation was doing.
        what: String,
        /// Flotilla's error.
        source: Box<ServeError>,
    },
    /// The simulation needs Flotilla, but no instance is live (a process crash
    /// and restart is under way).
    #[error("flotilla: no live Serve instance")]
    NoServe,
    /// The report could not be written.
    #[error("writing report {path}: {source}")]
    Report {
        /// The file (or the directory).
        path: PathBuf,
        /// Why.
        source: ReportError,
    },
}

/// Why the simulation could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The tokio runtime could not be built.
    #[error("building the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The store's directory could not be created.
    #[error("creating {path}: {source}")]
    StoreDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A temporary directory for the store could not be created.
    #[error("creating a temporary directory: {0}")]
    TempDir(#[source] std::io::Error),
    /// A store left by an earlier run could not be removed.
    #[error("removing old {path}: {source}")]
    OldStore {
        /// The store file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The simulated code or the application builders could not be registered.
    #[error("registering {what}: {source}")]
    Register {
        /// What: "the simulated code", "the application builders".
        what: &'static str,
        /// Flotilla's refusal.
        source: Box<SpecError>,
    },
    /// An application of the imperative workload does not make a valid spec.
    #[error("building application {name}: {source}")]
    App {
        /// The application.
        name: String,
        /// Flotilla's validation error.
        source: Box<SpecError>,
    },
}

/// The simulator's result type.
pub type Result<T, E = SimError> = std::result::Result<T, E>;

// Every error can cross threads and be boxed as `dyn Error + Send + Sync`.
const _: () = {
    const fn sendable<T: std::error::Error + Send + Sync + 'static>() {}
    sendable::<SimError>();
    sendable::<SetupError>();
};
