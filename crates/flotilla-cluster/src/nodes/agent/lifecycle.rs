//! The agent's two state machines: where the node stands with its head
//! ([`HeadLink`]), and whether it serves or is ending ([`Course`]). Their
//! transitions are the methods here; the agent acts on what they return.

use tokio::time::Instant;

/// Where the node stands with its head.
#[derive(Debug)]
pub(super) enum HeadLink {
    /// No session to the head and no dial of it in flight: a redial is due
    /// (unless the node is shutting down).
    Apart(Attempts),
    /// A dial of the head is in flight.
    Dialing(Attempts),
    /// In session with the head.
    Joined(HeadSession),
}

/// The tries to reach the head since its last session.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Attempts {
    /// Dials that failed: the wait before the next grows with them
    /// ([`REDIAL_MAX`](super::REDIAL_MAX)), and they are logged at the 1st,
    /// 2nd, 4th, 8th... (a head gone for an hour is not 14,000 warnings).
    pub(super) failed_dials: u32,
    /// Handshakes that ended as refusals ([`REFUSALS_TO_END`](super::REFUSALS_TO_END)).
    pub(super) refusals: u32,
}

/// A session with the head.
#[derive(Debug)]
pub(super) struct HeadSession {
    /// The head's ractor name.
    pub(super) peer: String,
    /// The head's actor namespace, once it welcomed this node.
    pub(super) ns: Option<String>,
    /// When a frame from the head last came.
    pub(super) last_heard: Instant,
}

impl HeadLink {
    /// The head's ractor name, in session.
    pub(super) fn peer(&self) -> Option<&str> {
        match self {
            HeadLink::Joined(s) => Some(&s.peer),
            HeadLink::Apart(_) | HeadLink::Dialing(_) => None,
        }
    }

    /// The head's actor namespace, once it welcomed this node.
    pub(super) fn welcomed(&self) -> Option<&str> {
        match self {
            HeadLink::Joined(s) => s.ns.as_deref(),
            HeadLink::Apart(_) | HeadLink::Dialing(_) => None,
        }
    }

    pub(super) fn is_joined(&self) -> bool {
        matches!(self, HeadLink::Joined(_))
    }

    /// The tries since the last session (none in session).
    pub(super) fn attempts(&self) -> Attempts {
        match self {
            HeadLink::Apart(a) | HeadLink::Dialing(a) => *a,
            HeadLink::Joined(_) => Attempts::default(),
        }
    }

    /// A dial of the head starts.
    pub(super) fn dial(&mut self) {
        *self = HeadLink::Dialing(self.attempts());
    }

    /// The dial in flight ended without a session (it failed, or its session
    /// closed before it was the head's); a session stays.
    pub(super) fn dial_ended(&mut self) {
        if let HeadLink::Dialing(a) = self {
            *self = HeadLink::Apart(*a);
        }
    }

    /// A session to the head `peer` is ready: the tries start again from
    /// nothing.
    pub(super) fn joined(&mut self, peer: String) {
        *self = HeadLink::Joined(HeadSession {
            peer,
            ns: None,
            last_heard: Instant::now(),
        });
    }

    /// The session to `peer` closed; whether it was the head's.
    pub(super) fn closed(&mut self, peer: &str) -> bool {
        let head = self.peer() == Some(peer);
        if head {
            *self = HeadLink::Apart(Attempts::default());
        }
        head
    }

    /// A failed dial, counted, while apart; the failures since the last
    /// session (0 in session: nothing counted).
    pub(super) fn dial_failed(&mut self) -> u32 {
        self.count(|a| &mut a.failed_dials)
    }

    /// A refused handshake, counted; the refusals since the last session.
    pub(super) fn refused(&mut self) -> u32 {
        self.count(|a| &mut a.refusals)
    }

    /// One more of the tries `which` picks, while apart; how many now.
    fn count(&mut self, which: fn(&mut Attempts) -> &mut u32) -> u32 {
        match self {
            HeadLink::Apart(a) | HeadLink::Dialing(a) => {
                let n = which(a);
                *n = n.saturating_add(1);
                *n
            }
            HeadLink::Joined(_) => 0,
        }
    }
}

/// Whether the node serves or is ending.
#[derive(Debug)]
pub(super) enum Course {
    Serving,
    /// Shutting down: its replicas drain; once none is left, the `Leaving`
    /// whose answer ends the node (the head has then read every replica's
    /// `Exited`), and when it was sent.
    ShuttingDown {
        farewell: Option<(u64, Instant)>,
    },
    /// Refused by the head (declared lost): its replicas are being killed,
    /// and the incarnation ends with `reason` once the last has exited
    /// (`shutting_down` if a shutdown was asked too).
    Fencing {
        reason: String,
        shutting_down: bool,
    },
}

impl Course {
    /// Whether a shutdown was asked: no replica starts, no redial.
    pub(super) fn shutting_down(&self) -> bool {
        match self {
            Course::Serving => false,
            Course::ShuttingDown { .. } => true,
            Course::Fencing { shutting_down, .. } => *shutting_down,
        }
    }

    /// A shutdown is asked.
    pub(super) fn shut_down(&mut self) {
        match self {
            Course::Serving => *self = Course::ShuttingDown { farewell: None },
            Course::ShuttingDown { .. } => {}
            Course::Fencing { shutting_down, .. } => *shutting_down = true,
        }
    }

    /// The head refused this node, with replicas still to kill.
    pub(super) fn fence(&mut self, reason: String) {
        *self = Course::Fencing {
            reason,
            shutting_down: self.shutting_down(),
        };
    }

    /// The `Leaving` answered by the head, if one was sent, and when.
    pub(super) fn farewell(&self) -> Option<(u64, Instant)> {
        match self {
            Course::ShuttingDown { farewell } => *farewell,
            Course::Serving | Course::Fencing { .. } => None,
        }
    }
}
