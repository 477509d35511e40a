//! The ApplicationActor: keeps one application's deployments at its target.
//!
//! It owns the set of DeploymentActors of one application: it creates or updates
//! one per deployment in the target, deletes those no longer in it, restarts
//! crashed ones (with backoff and an intensity limit), derives the application
//! status from theirs and publishes it, tagged with the generation it describes.
//!
//! It must not write the checkpoint (the Controller does) and must not hold its
//! DeploymentActors by a link: they outlive its crash, and its successor re-adopts
//! them through their process group.

mod actor;
mod messages;
mod status;

pub use actor::{AppArgs, ApplicationActor};
pub use messages::{AppEvent, AppMsg, AppReporter, Internal};
pub use status::publish_status;
