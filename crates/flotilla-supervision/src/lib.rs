//! The one child-supervision mechanism every Flotilla parent uses: the
//! Supervisor over the Controller, the Controller over ApplicationActors, an
//! ApplicationActor over DeploymentActors, a DeploymentActor over replicas.
//!
//! It owns:
//! - [`Children`]: a parent's children by key: spawn under a registered name,
//!   watch (a monitor, never a link: children outlive their parent's crash),
//!   adopt a living child (a name holder, or a member of a process group),
//!   ignore stale exits, count crashes against a [`RestartPolicy`], schedule
//!   restarts, and tell the parent when to escalate ([`Escalation`]);
//! - [`ChildExit`]: how a child ended, typed (no reason is read from a string);
//! - [`Parent`]: how children report to their parent by name, so a restarted
//!   parent hears from the children of its predecessor;
//! - [`groups`]: the process groups a restarted parent finds its children in;
//! - [`Backoff`]: how long to wait before trying a failed thing again, the
//!   one rule for every retry in Flotilla (restarts, constructors, commits);
//! - [`AbortOnDrop`]: a background task that ends with its owner.
//!
//! It must not know what the actors do: no Flotilla message, spec or status
//! type appears here, and it never decides *whether* a child should exist —
//! only how one is started, watched and restarted.

mod backoff;
mod children;
mod exit;
pub mod groups;
mod parent;
mod policy;
mod task;

pub use backoff::Backoff;
pub use children::{Children, StartError, Started};
pub use exit::ChildExit;
pub use parent::Parent;
pub use policy::{Escalation, RestartLog, RestartPolicy};
pub use task::AbortOnDrop;
