//! The driver: builds the simulated world on a paused, auto-advancing tokio clock
//! (so an hour of cluster life takes seconds), deploys the applications in
//! batches, plays the event schedule while traffic flows, samples the timeline,
//! waits for convergence, and checks every invariant of crash recovery.
//!
//! Everything it decides is drawn from the scenario's seed; the only wall-clock
//! readings are the figures in [`crate::summary::WallClock`] (and the stall
//! watchdog).
//!
//! Its parts, one concern each:
//! - `setup`: the simulation's state, starting Flotilla, a process restart;
//! - `driver`: the action queue and the run from first batch to final checks;
//! - `model`: what the acknowledged operations say every application must be;
//! - `shared`: what the driver shares with the sampler: the world, the model,
//!   what the run has observed, Flotilla's metrics folded per process;
//! - `operations`: deploys, updates, rescales and deletes, retried until
//!   acknowledged;
//! - `declare`: applying ServeConfigs, and the model following them;
//! - `events`: the event schedule's dispatch, and the record of every event;
//! - `control_faults`, `data_faults`: the faults, by the plane they hit;
//! - `timeline`: the sampler and the timeline it writes;
//! - `targets`, `invariants`: the final verdicts, per application and overall;
//! - `summarize`: the [`Summary`] of a finished run;
//! - `watchdog`: the live-lock guard on the wall clock.

mod control_faults;
mod data_faults;
mod declare;
mod driver;
mod events;
mod invariants;
mod model;
mod operations;
mod setup;
mod shared;
mod summarize;
mod targets;
mod timeline;
mod watchdog;

use std::path::{Path, PathBuf};

pub use timeline::{Mark, Sample, Timeline};

use crate::{Result, SetupError, scenario::Scenario, serve_config::Configs, summary::Summary};

/// How to run a simulation (what is not part of the scenario).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Show a progress bar on stderr (hidden when stderr is not a terminal).
    pub progress: bool,
    /// Where to put the checkpoint store (default: a temporary directory).
    pub store_dir: Option<PathBuf>,
    /// Give up (print why and exit the process with status 3) if virtual time
    /// stops advancing for this long in wall time: the system under test is
    /// live-locked, busy at one virtual instant. `None`: wait forever.
    pub stall_timeout: Option<std::time::Duration>,
}

/// What a run produces.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The summary.
    pub summary: Summary,
    /// The timeline.
    pub timeline: Timeline,
}

/// Run `scenario` on its own current-thread runtime with a paused clock.
pub fn run(scenario: &Scenario, options: &RunOptions) -> Result<Outcome> {
    scenario.validate()?;
    // Every config is read and checked before anything runs.
    let configs = Configs::load(scenario)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(SetupError::Runtime)?;
    let tmp;
    let dir: &Path = match &options.store_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|source| SetupError::StoreDir {
                path: d.clone(),
                source,
            })?;
            d
        }
        None => {
            tmp = tempfile::tempdir().map_err(SetupError::TempDir)?;
            tmp.path()
        }
    };
    let store = dir.join(format!("sim-{}.redb", scenario.seed));
    // A store left by an earlier run would be recovered: start afresh.
    if store.exists() {
        std::fs::remove_file(&store).map_err(|source| SetupError::OldStore {
            path: store.clone(),
            source,
        })?;
    }
    // Ends its thread when dropped, at the end of the run however it ends.
    let watchdog = watchdog::Watchdog::start(options.stall_timeout);
    // Everything, the start instant included, is made inside the runtime: on its
    // paused clock, virtual time starts at the same instant on every run.
    rt.block_on(async {
        let sim = setup::Sim::new(
            scenario.clone(),
            configs,
            options,
            store,
            watchdog.heartbeat(),
        )?;
        sim.simulate().await
    })
}

/// Round to milliseconds (seconds with three decimals), for stable figures.
fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::SimError;

    #[test]
    fn a_store_that_cannot_be_set_up_keeps_the_io_error() {
        let tmp = tempfile::tempdir().unwrap();
        let scenario = Scenario::default();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        let options = RunOptions {
            store_dir: Some(file.clone()),
            ..Default::default()
        };
        let e = run(&scenario, &options).unwrap_err();
        assert!(
            matches!(&e, SimError::Setup(SetupError::StoreDir { path, .. }) if *path == file),
            "{e:?}"
        );
        assert!(std::error::Error::source(&e).is_some_and(|s| s.source().is_some()));
        assert!(
            e.to_string()
                .starts_with("setting up the simulation: creating "),
            "{e}"
        );

        // A directory where the store file would be cannot be removed as a file.
        let store = tmp.path().join(format!("sim-{}.redb", scenario.seed));
        std::fs::create_dir(&store).unwrap();
        let options = RunOptions {
            store_dir: Some(tmp.path().to_owned()),
            ..Default::default()
        };
        let e = run(&scenario, &options).unwrap_err();
        assert!(
            matches!(&e, SimError::Setup(SetupError::OldStore { path, .. }) if *path == store),
            "{e:?}"
        );
    }
}
