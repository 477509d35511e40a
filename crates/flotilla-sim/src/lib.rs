//! The cluster simulator: Flotilla driven at scale on virtual time.
//!
//! It owns a simulated cluster ([`cluster::SimCluster`]: node groups of different
//! sizes, spread or pack placement, node loss and arrival), simulated user code
//! ([`workload`]: seeded start latencies, constructor failures at a rate, health
//! checks that flap), an event schedule of faults and operations ([`faults`]),
//! traffic through handles ([`traffic`]), the driver that plays it all on a paused
//! tokio clock and checks the invariants of crash recovery ([`mod@run`]), the
//! [`Summary`] and the report picture ([`report`]). One seed ([`rng`]) decides
//! everything, so a seed replays the same summary. Besides its imperative
//! workload it deploys ServeConfig files through `Serve::apply_config_file`
//! ([`serve_config`]), with application builders of its own.
//!
//! It stands on the facade crate `flotilla` and uses only its public API (plus
//! `apply_overrides` of `flotilla-core`, to predict what a config's application
//! must run). It must never be a dependency of
//! the control plane, must not reach into Flotilla's internals to make a run look
//! better, and must not read the wall clock except for the figures reported as
//! wall-clock time and the stall watchdog ([`RunOptions::stall_timeout`]).
//!
//! ```no_run
//! use flotilla_sim::{RunOptions, Scenario};
//! let outcome = flotilla_sim::run(&Scenario::default(), &RunOptions::default()).unwrap();
//! println!("{}", outcome.summary);
//! assert!(outcome.summary.ok());
//! ```

pub mod cluster;
mod error;
pub mod faults;
pub mod names;
pub mod report;
pub mod rng;
pub mod run;
pub mod scenario;
pub mod serve_config;
pub mod summary;
pub mod traffic;
pub mod workload;

pub use error::{Result, SetupError, SimError};
pub use run::{Outcome, RunOptions, Timeline, run};
pub use scenario::{Overrides, Scenario};
pub use summary::Summary;
