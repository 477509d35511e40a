//! The simulator's errors.

use std::path::PathBuf;

use crate::{scenario::DurationError, serve_config::ConfigAppError};

/// Why a simulation could not run or report. Invariant violations are not errors:
/// they are in the [`Summary`](crate::Summary).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A `--faults` entry or a scenario's fault could not be parsed.
    #[error("fault '{entry}': {why}")]
    Fault {
        /// The entry as written.
        entry: String,
        /// What is wrong with it.
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
    /// A duration could not be parsed.
    #[error(transparent)]
    Duration(#[from] DurationError),
    /// The scenario is inconsistent (zero nodes, a rate out of range, ...).
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
    /// The simulation's runtime or store could not be set up.
    #[error("setting up the simulation: {0}")]
    Setup(String),
    /// Flotilla refused to start or failed in a way the simulation cannot go on from.
    #[error("flotilla: {0}")]
    Serve(String),
    /// The report could not be written.
    #[error("writing report {path}: {why}")]
    Report {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// The simulator's result type.
pub type Result<T, E = SimError> = std::result::Result<T, E>;
