//! Restart policy shared by every supervising actor: exponential backoff and an
//! OTP-style intensity limit (more than `max_restarts` within `window` escalates).

use std::{collections::VecDeque, time::Duration};

use ractor::{ActorCell, ActorId, ActorStatus, SupervisionEvent};
use tokio::time::Instant;

/// Watch `child` from `parent` (a monitor, never a link: the child outlives a crash
/// of its parent). Returns false when the child is already stopping: a monitor set
/// that late may never fire, so the caller must handle the exit itself.
pub fn watch(parent: &ActorCell, child: &ActorCell) -> bool {
    parent.monitor(child.clone());
    child.get_status() < ActorStatus::Stopping
}

/// How a watched child exited: its id, and `Some(why)` if it crashed. A kill
/// (fault injection, or a stuck actor) counts as a crash, a stop does not.
/// `None` for events that are not an exit.
pub fn child_exit(evt: &SupervisionEvent) -> Option<(ActorId, Option<String>)> {
    match evt {
        SupervisionEvent::ActorTerminated(c, _, reason) => {
            Some((c.get_id(), reason.clone().filter(|r| r == "killed")))
        }
        SupervisionEvent::ActorFailed(c, e) => Some((c.get_id(), Some(e.to_string()))),
        _ => None,
    }
}

/// How a supervisor restarts a crashed child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed within `window` before escalating (default 5).
    pub max_restarts: usize,
    /// The intensity window (default 60 s).
    pub window: Duration,
    /// First restart delay; doubles per restart inside the window (default 10 ms).
    pub first_backoff: Duration,
    /// Longest restart delay (default 2 s).
    pub max_backoff: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 5,
            window: Duration::from_secs(60),
            first_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// One child's recent restarts.
#[derive(Debug, Clone, Default)]
pub struct RestartLog {
    recent: VecDeque<Instant>,
}

impl RestartLog {
    /// Record a crash now. `Some(delay)`: restart after `delay`; `None`: the
    /// intensity limit is exceeded, escalate to the parent.
    pub fn on_crash(&mut self, policy: &RestartPolicy) -> Option<Duration> {
        let now = Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= policy.max_restarts {
            return None;
        }
        let exp = self.recent.len().min(16) as u32;
        self.recent.push_back(now);
        Some(
            policy
                .first_backoff
                .saturating_mul(1 << exp)
                .min(policy.max_backoff),
        )
    }

    /// Restarts inside the current window.
    pub fn count(&self) -> usize {
        self.recent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backs_off_exponentially_then_escalates_then_forgets() {
        let p = RestartPolicy::default();
        let mut log = RestartLog::default();
        let delays: Vec<_> = (0..5).map(|_| log.on_crash(&p)).collect();
        assert_eq!(
            delays,
            [10, 20, 40, 80, 160].map(|ms| Some(Duration::from_millis(ms)))
        );
        assert_eq!(log.on_crash(&p), None);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(log.on_crash(&p), Some(Duration::from_millis(10)));
    }
}
