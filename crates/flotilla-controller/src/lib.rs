//! The Controller and the Supervisor: the top of the actor tree.
//!
//! This crate owns the public API messages, the durable targets of every
//! application and the checkpoint protocol of DESIGN.md: every mutating message is
//! validated whole, applied to a copy, committed in **one** store transaction,
//! swapped in, answered, and only then turned into commands to ApplicationActors.
//! It keeps the route-prefix index (O(1) per application), the status board that
//! outlives actor crashes, and restarts crashed ApplicationActors. The
//! [`Supervisor`] restarts the Controller and escalates to the embedding program.
//!
//! It is the only writer of the store. It must not touch replicas directly, and
//! must not hold its children by a link: they survive its crash and are re-adopted.

mod apps;
mod board;
mod checkpoint;
mod config_deploy;
mod controller;
mod deploy;
mod error;
mod messages;
mod protocol;
mod removal;
mod route_table;
mod state;
mod supervisor;
mod targets;
mod validate;

pub use board::StatusBoard;
pub use checkpoint::{Checkpoint, CheckpointCloser};
pub use config_deploy::{BUILD_TIMEOUT, BuildError};
pub use controller::Controller;
pub use error::{Fatal, MAX_CONFIG_FILE_BYTES, NotRunning, ServeError};
pub use flotilla_replica::LogSettings;
pub use flotilla_store::{FileKind, StoreCounters, StoreError};
pub use messages::{ControllerMsg, ControllerSnapshot, Deleting, Deployed, Internal};
pub use route_table::{Route, RouteTable};
pub use state::{ControllerArgs, Preloaded, WallClock};
pub use supervisor::{Supervisor, SupervisorArgs, SupervisorMsg};
