//! How a watched child ended, as a type.

use std::fmt;

use ractor::{ActorId, SupervisionEvent};

/// How a child actor ended (quickwit's `ActorExitStatus`, in ractor's terms).
///
/// Nothing here reads a reason's text: a termination that carries one at all
/// is [`ChildExit::Killed`]. ractor gives a killed actor a reason; of
/// Flotilla's own actors only a head's stand-in for a replica on a node
/// (`flotilla-cluster`'s `RemoteReplica`) stops with one, when the replica it
/// stands for crashed, could not be started (its node unreachable) or was lost
/// with its node, so that its parent sees what happened: a kill. Every other actor of ours stops itself only gracefully,
/// without a reason, and a child that wants its parent to know *why* it is
/// done says so in a typed report before it stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildExit {
    /// It stopped itself, or was stopped, gracefully.
    Stopped,
    /// It was killed (fault injection, a stuck actor, its process going away).
    Killed,
    /// Its start-up or a handler returned an error or panicked.
    Failed {
        /// The error, as ractor reports it.
        error: String,
    },
}

impl ChildExit {
    /// Whether it ended abnormally (killed or failed): a crash to restart from.
    pub fn is_crash(&self) -> bool {
        !matches!(self, ChildExit::Stopped)
    }

    /// The child and how it ended, if `event` is an exit (`None` for start and
    /// process-group events).
    pub fn of(event: &SupervisionEvent) -> Option<(ActorId, ChildExit)> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, None) => {
                Some((cell.get_id(), ChildExit::Stopped))
            }
            SupervisionEvent::ActorTerminated(cell, _, Some(_)) => {
                Some((cell.get_id(), ChildExit::Killed))
            }
            SupervisionEvent::ActorFailed(cell, error) => Some((
                cell.get_id(),
                ChildExit::Failed {
                    error: error.to_string(),
                },
            )),
            _ => None,
        }
    }
}

impl fmt::Display for ChildExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildExit::Stopped => f.write_str("stopped"),
            ChildExit::Killed => f.write_str("killed"),
            ChildExit::Failed { error } => write!(f, "failed: {error}"),
        }
    }
}
