//! How children reach their parent: by the name it registers.

use std::sync::{Mutex, PoisonError};

use ractor::{ActorRef, Message, MessagingErr};

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
