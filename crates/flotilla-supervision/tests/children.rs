//! `Children` against real ractor actors, on paused time: typed exits, restarts
//! with backoff and intensity, stale exits, adopting a name holder, and a child
//! that is gone before it is watched.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flotilla_supervision::{ChildExit, Children, RestartPolicy, StartError, Started};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::mpsc;

/// What a [`Child`] is told: `"fail"` or `"stop"`. (With ractor's `cluster`
/// feature on, which nodes need, a message type must say it is one, and
/// `&'static str` cannot.)
#[derive(Debug)]
struct Cmd(&'static str);

impl ractor::Message for Cmd {}

/// A child that fails its handler when asked to.
struct Child;

impl Actor for Child {
    type Msg = Cmd;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<Self::Msg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        Cmd(msg): Cmd,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            "fail" => Err("asked to fail".into()),
            "stop" => {
                myself.stop(None);
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// A parent that forwards every supervision event and every message it gets.
struct Forwarder;

enum Seen {
    Event(SupervisionEvent),
    Msg(u32),
}

impl Actor for Forwarder {
    type Msg = u32;
    type State = mpsc::UnboundedSender<Seen>;
    type Arguments = mpsc::UnboundedSender<Seen>;

    async fn pre_start(
        &self,
        _: ActorRef<u32>,
        out: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(out)
    }

    async fn handle(
        &self,
        _: ActorRef<u32>,
        msg: u32,
        out: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = out.send(Seen::Msg(msg));
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<u32>,
        evt: SupervisionEvent,
        out: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = out.send(Seen::Event(evt));
        Ok(())
    }
}

struct Rig {
    parent: ActorRef<u32>,
    seen: mpsc::UnboundedReceiver<Seen>,
    children: Children<&'static str, Cmd>,
}

impl Rig {
    async fn new() -> Rig {
        let (tx, seen) = mpsc::unbounded_channel();
        let (parent, _) = Actor::spawn(None, Forwarder, tx).await.unwrap();
        Rig {
            parent,
            seen,
            children: Children::new(),
        }
    }

    async fn start(&mut self, key: &'static str, name: &str) -> ActorRef<Cmd> {
        let started = self
            .children
            .start(&self.parent.get_cell(), key, name.to_owned(), Child, ())
            .await
            .unwrap();
        started.actor().clone()
    }

    /// The next supervision event (paused time: a missing one fails, never hangs).
    async fn event(&mut self) -> SupervisionEvent {
        loop {
            match tokio::time::timeout(Duration::from_secs(5), self.seen.recv()).await {
                Ok(Some(Seen::Event(e))) => return e,
                Ok(Some(Seen::Msg(_))) => continue,
                other => panic!("no supervision event: {}", other.is_ok()),
            }
        }
    }

    /// The next message the parent got (paused time: a missing one fails).
    async fn msg(&mut self) -> u32 {
        loop {
            match tokio::time::timeout(Duration::from_secs(5), self.seen.recv()).await {
                Ok(Some(Seen::Msg(m))) => return m,
                Ok(Some(Seen::Event(_))) => continue,
                other => panic!("no message: {}", other.is_ok()),
            }
        }
    }

    /// The next exit the set attributes to a current child.
    async fn exit(&mut self) -> Option<(&'static str, ChildExit)> {
        loop {
            let e = self.event().await;
            if ChildExit::of(&e).is_some() {
                return self.children.exited(&e);
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn exits_are_typed() {
    let mut rig = Rig::new().await;
    let a = rig.start("a", "children-test/typed-a").await;
    a.cast(Cmd("stop")).unwrap();
    assert_eq!(rig.exit().await, Some(("a", ChildExit::Stopped)));
    let b = rig.start("b", "children-test/typed-b").await;
    b.kill();
    assert_eq!(rig.exit().await, Some(("b", ChildExit::Killed)));
    let c = rig.start("c", "children-test/typed-c").await;
    c.cast(Cmd("fail")).unwrap();
    let (key, how) = rig.exit().await.unwrap();
    assert_eq!(key, "c");
    assert!(
        matches!(&how, ChildExit::Failed { error } if error.contains("asked to fail")),
        "{how}"
    );
    assert!(how.is_crash() && ChildExit::Killed.is_crash() && !ChildExit::Stopped.is_crash());
    assert_eq!(rig.children.living(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_crash_restarts_after_a_growing_backoff_then_escalates() {
    let mut rig = Rig::new().await;
    let policy = RestartPolicy {
        max_restarts: 3,
        ..RestartPolicy::default()
    };
    let mut delays = Vec::new();
    for _ in 0..4 {
        let child = rig.start("a", "children-test/restart").await;
        child.kill();
        let (key, how) = rig.exit().await.unwrap();
        assert!(how.is_crash());
        delays.push(rig.children.on_crash(&key, &policy));
    }
    let ms = |n| Some(Duration::from_millis(n));
    assert_eq!(
        delays,
        [ms(10), ms(20), ms(40), None],
        "the fourth escalates"
    );
    assert_eq!(rig.children.restarts(), 4);

    // A scheduled restart reaches the parent as its own message, once due.
    rig.children
        .retry_later("a", Duration::from_millis(10), &rig.parent, |_| 7);
    assert!(rig.children.is_waiting(&"a"));
    let at = tokio::time::Instant::now();
    match tokio::time::timeout(Duration::from_secs(5), rig.seen.recv()).await {
        Ok(Some(Seen::Msg(7))) => {}
        _ => panic!("the restart message did not come"),
    }
    assert!(at.elapsed() >= Duration::from_millis(10));
    assert!(rig.children.retry_due(&"a"));
    assert!(!rig.children.is_waiting(&"a"));
    assert!(!rig.children.retry_due(&"a"), "nothing is scheduled now");
}

/// A retry message scheduled before a longer one was asked for does not cut
/// the longer backoff short, and a shorter ask does not shorten a longer one.
#[tokio::test(start_paused = true)]
async fn an_early_retry_message_is_stale() {
    let mut rig = Rig::new().await;
    rig.children
        .retry_later("a", Duration::from_millis(10), &rig.parent, |_| 1);
    rig.children
        .retry_later("a", Duration::from_millis(100), &rig.parent, |_| 2);
    rig.children
        .retry_later("a", Duration::from_millis(50), &rig.parent, |_| 3);
    assert_eq!(rig.msg().await, 1);
    assert!(!rig.children.retry_due(&"a"), "10 ms in, 100 ms were asked");
    assert!(rig.children.is_waiting(&"a"));
    assert_eq!(rig.msg().await, 2, "the 50 ms ask sent nothing");
    assert!(rig.children.retry_due(&"a"));
    assert!(!rig.children.is_waiting(&"a"));
}

#[tokio::test(start_paused = true)]
async fn the_exit_of_a_replaced_child_is_stale() {
    let mut rig = Rig::new().await;
    let old = rig.start("a", "children-test/stale-old").await;
    // Adopted under the same key (a parent finding another living child), the
    // old one is no longer the child of "a".
    let (new, _) = Actor::spawn(Some("children-test/stale-new".into()), Child, ())
        .await
        .unwrap();
    assert!(rig.children.adopt(&rig.parent.get_cell(), "a", new.clone()));
    old.kill();
    let e = rig.event().await;
    assert_eq!(rig.children.exited(&e), None, "stale");
    assert_eq!(
        rig.children.actor(&"a").map(|a| a.get_id()),
        Some(new.get_id())
    );
    new.kill();
    assert_eq!(rig.exit().await, Some(("a", ChildExit::Killed)));
    // A child a cast finds gone is still the child until its exit comes:
    // the exit says how it ended (a crash counts, and waits out its backoff).
    let gone = rig.start("b", "children-test/gone").await;
    gone.kill();
    let e = rig.event().await;
    assert!(gone.cast(Cmd("x")).is_err());
    assert!(rig.children.actor(&"b").is_some());
    assert_eq!(rig.children.exited(&e), Some(("b", ChildExit::Killed)));
}

#[tokio::test(start_paused = true)]
async fn a_living_name_holder_is_adopted_and_watched() {
    let mut rig = Rig::new().await;
    let (holder, _) = Actor::spawn(Some("children-test/holder".into()), Child, ())
        .await
        .unwrap();
    let started = rig
        .children
        .start(
            &rig.parent.get_cell(),
            "a",
            "children-test/holder".into(),
            Child,
            (),
        )
        .await
        .unwrap();
    assert!(matches!(&started, Started::Adopted(a) if a.get_id() == holder.get_id()));
    holder.kill();
    assert_eq!(rig.exit().await, Some(("a", ChildExit::Killed)));
}

#[tokio::test(start_paused = true)]
async fn a_child_gone_before_it_is_watched_is_not_a_child() {
    let mut rig = Rig::new().await;
    let (gone, h) = Actor::spawn(None, Child, ()).await.unwrap();
    gone.stop(None);
    h.await.unwrap();
    assert!(!rig.children.adopt(&rig.parent.get_cell(), "a", gone));
    assert!(rig.children.actor(&"a").is_none());
    assert_eq!(rig.children.living(), 0);
    // A name nobody holds and a spawn that cannot run: a typed error to retry on.
    struct Refuses;
    impl Actor for Refuses {
        type Msg = Cmd;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<Self::Msg>, _: ()) -> Result<(), ActorProcessingErr> {
            Err("no".into())
        }
    }
    let err = rig
        .children
        .start(
            &rig.parent.get_cell(),
            "b",
            "children-test/refuses".into(),
            Refuses,
            (),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StartError::Spawn(_)), "{err}");
}

/// A parent whose children are dropped (it ended, or crashed) stops watching
/// them: a child adopted by a successor is not left with its predecessor in
/// its monitor list for the rest of its life.
#[tokio::test(start_paused = true)]
async fn dropped_children_are_no_longer_watched_by_their_parent() {
    let mut first = Rig::new().await;
    let child = first.start("a", "children-test/handed-over").await;
    // It runs: the events it sends now are its exit's.
    assert!(matches!(
        first.event().await,
        SupervisionEvent::ActorStarted(_)
    ));
    let mut second = Rig::new().await;
    assert!(
        second
            .children
            .adopt(&second.parent.get_cell(), "a", child.clone())
    );
    drop(std::mem::take(&mut first.children));
    child.cast(Cmd("stop")).unwrap();
    assert_eq!(second.exit().await, Some(("a", ChildExit::Stopped)));
    // Paused time: the wait ends once every task is idle.
    let late = tokio::time::timeout(Duration::from_secs(5), first.seen.recv()).await;
    assert!(
        late.is_err(),
        "the first parent still watched the child: {}",
        match late {
            Ok(Some(Seen::Event(e))) => format!("{e:?}"),
            _ => "another message".into(),
        }
    );
}

/// A child forgotten ([`Children::remove`]) while it still runs is no longer
/// watched: its exit reaches nobody, and it does not keep the parent in its
/// monitor list for the rest of its life.
#[tokio::test(start_paused = true)]
async fn a_removed_child_is_no_longer_watched() {
    let mut rig = Rig::new().await;
    let child = rig.start("a", "children-test/removed").await;
    assert!(matches!(
        rig.event().await,
        SupervisionEvent::ActorStarted(_)
    ));
    assert_eq!(
        rig.children.remove(&"a").map(|a| a.get_id()),
        Some(child.get_id())
    );
    child.cast(Cmd("stop")).unwrap();
    let late = tokio::time::timeout(Duration::from_secs(5), rig.seen.recv()).await;
    assert!(
        late.is_err(),
        "the parent still watched the removed child: {}",
        match late {
            Ok(Some(Seen::Event(e))) => format!("{e:?}"),
            _ => "another message".into(),
        }
    );
}

/// A policy may ask for any backoff: one past what time can count is never
/// due, and nothing overflows.
#[tokio::test(start_paused = true)]
async fn a_backoff_of_any_length_schedules_without_overflow() {
    let mut rig = Rig::new().await;
    rig.children
        .retry_later("a", Duration::MAX, &rig.parent, |_| 1);
    assert!(rig.children.is_waiting(&"a"));
    assert!(!rig.children.retry_due(&"a"));
}
