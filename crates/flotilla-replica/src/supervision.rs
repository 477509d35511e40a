//! Restart policy shared by every supervising actor: exponential backoff and an
//! OTP-style intensity limit (more than `max_restarts` within `window` escalates).

use std::{
    collections::VecDeque,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use ractor::{ActorCell, ActorId, ActorRef, ActorStatus, Message, MessagingErr, SupervisionEvent};
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

/// How children reach their parent: by the name the parent registers, so that a
/// restarted parent hears from children its predecessor started. The actor found
/// is kept and looked up again only once a cast to it fails (it stopped), which
/// spares every report a name lookup.
pub struct Parent<M> {
    name: String,
    known: Mutex<Option<ActorRef<M>>>,
}

impl<M: Message> Parent<M> {
    /// The parent registered as `name`.
    pub fn new(name: String) -> Self {
        Parent {
            name,
            known: Mutex::new(None),
        }
    }

    /// Send `msg` to the parent living now; dropped if none is registered (a
    /// restarted parent learns the state of its children when it adopts them).
    pub fn cast(&self, msg: M) {
        // Casts never block, and a panic cannot leave the cached ref half-written.
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let msg = match known.as_ref() {
            Some(parent) => match parent.cast(msg) {
                Ok(()) => return,
                Err(MessagingErr::SendErr(msg)) => msg,
                Err(_) => return,
            },
            None => msg,
        };
        *known = ActorRef::where_is(self.name.clone());
        if let Some(p) = known.as_ref() {
            let _ = p.cast(msg);
        }
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

    /// Forwards what it receives, tagged with its generation.
    struct Sink;

    impl ractor::Actor for Sink {
        type Msg = u32;
        type State = (u32, tokio::sync::mpsc::UnboundedSender<(u32, u32)>);
        type Arguments = Self::State;

        async fn pre_start(
            &self,
            _myself: ActorRef<u32>,
            args: Self::State,
        ) -> Result<Self::State, ractor::ActorProcessingErr> {
            Ok(args)
        }

        async fn handle(
            &self,
            _myself: ActorRef<u32>,
            msg: u32,
            (generation, out): &mut Self::State,
        ) -> Result<(), ractor::ActorProcessingErr> {
            let _ = out.send((*generation, msg));
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_parent_is_found_again_after_it_restarts() {
        let name = "supervision-test/parent".to_owned();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let parent = Parent::<u32>::new(name.clone());
        parent.cast(0); // nobody registered: dropped

        let (first, h) = ractor::Actor::spawn(Some(name.clone()), Sink, (1, tx.clone()))
            .await
            .unwrap();
        // Paused time: a message that never comes fails the test, it does not hang it.
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(1), rx.recv())
                .await
                .ok()
                .flatten()
        };
        parent.cast(1);
        parent.cast(2);
        assert_eq!(next().await, Some((1, 1)));
        assert_eq!(next().await, Some((1, 2)));

        first.kill();
        h.await.unwrap();
        let (second, h) = ractor::Actor::spawn(Some(name), Sink, (2, tx))
            .await
            .unwrap();
        parent.cast(3);
        assert_eq!(
            next().await,
            Some((2, 3)),
            "the successor, not the dead one"
        );
        second.stop(None);
        h.await.unwrap();
        assert_eq!(
            next().await,
            None,
            "the cast before anyone lived was dropped"
        );
    }
}
