//! How a crashed child restarts: exponential backoff and an OTP-style intensity
//! limit (more than `max_restarts` within `window` escalates).

use std::{collections::VecDeque, time::Duration};

use tokio::time::Instant;

use crate::Backoff;

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
        self.recent.push_back(now);
        let crashes = u32::try_from(self.recent.len()).unwrap_or(u32::MAX);
        Some(Backoff::new(policy.first_backoff, policy.max_backoff).after(crashes))
    }
}

/// A child crashed more often than its [`RestartPolicy`] allows: the parent
/// fails with this, and its own supervisor decides (the Supervisor tells the
/// embedding program).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{child} crashed more than {max_restarts} times in {window:?}: escalating")]
pub struct Escalation {
    /// The child, as its parent names it.
    pub child: String,
    /// The policy's limit.
    pub max_restarts: usize,
    /// The policy's window.
    pub window: Duration,
}

impl Escalation {
    /// The escalation of `child` under `policy`.
    pub fn of(child: impl Into<String>, policy: &RestartPolicy) -> Self {
        Escalation {
            child: child.into(),
            max_restarts: policy.max_restarts,
            window: policy.window,
        }
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

    #[test]
    fn backoff_is_capped() {
        let p = RestartPolicy {
            max_restarts: 100,
            ..RestartPolicy::default()
        };
        let mut log = RestartLog::default();
        let last = (0..20).filter_map(|_| log.on_crash(&p)).last();
        assert_eq!(last, Some(p.max_backoff));
    }
}
