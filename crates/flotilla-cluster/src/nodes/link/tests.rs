#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::atomic::Ordering, time::Duration};

use flotilla_core::{AppName, DeploymentName, DeploymentSpec, Faults, actor_names};
use flotilla_replica::{
    CallError, Deployment, Directory, OnExit, Registry, ReplicaActor, ReplicaArgs, ReplicaEndpoint,
    ReplicaEvent, ReplicaId, UserError,
};
use futures::Stream;
use ractor::ActorProcessingErr;
use ractor_cluster::NodeSessionMessage;

use super::{port::data, *};
use crate::nodes::CHECK_PERIOD;
use crate::nodes::wire::{self, DataHeader, Envelope};
use tokio::time::Instant;

/// Streams 100 numbers; a unary call of 0 never ends.
struct Counter;

impl Deployment for Counter {
    type Request = u32;
    type Response = u32;

    async fn handle(&self, n: u32) -> Result<u32, UserError> {
        if n == 0 {
            std::future::pending::<()>().await;
        }
        Ok(n)
    }

    fn handle_stream(&self, _: u32) -> impl Stream<Item = Result<u32, UserError>> + Send + '_ {
        futures::stream::iter((0..100).map(Ok))
    }
}

/// A running `Counter` replica's endpoint.
pub(crate) async fn counter() -> Arc<ReplicaEndpoint> {
    let registry = Registry::new()
        .register("test::Counter", |_ctx| async { Ok(Counter) })
        .unwrap();
    let (tx, mut events) = mpsc::unbounded_channel();
    let (app, dep) = (
        AppName::new("a").unwrap(),
        DeploymentName::new("d").unwrap(),
    );
    let directory = Directory::new();
    let spec = Arc::new(
        DeploymentSpec::builder("d", "test::Counter")
            .build()
            .unwrap(),
    );
    let args = ReplicaArgs {
        id: ReplicaId(1),
        app: app.clone(),
        deployment: dep.clone(),
        version: spec.version(),
        spec,
        registry,
        directory: directory.clone(),
        route: directory.route(&app, &dep),
        reporter: Arc::new(move |_, e| {
            let _ = tx.send(e);
        }),
        group: actor_names::replica_group("link-test", &app, &dep),
        node: "n".into(),
        faults: Faults::new(),
        on_exit: OnExit::none(),
    };
    Actor::spawn(None, ReplicaActor, args).await.unwrap();
    loop {
        if let ReplicaEvent::Ready { endpoint, .. } = events.recv().await.unwrap() {
            return endpoint;
        }
    }
}

/// A dial that cannot connect says why, as a value: here a port that is
/// held (bound, never listening) so that connecting to it is refused.
#[tokio::test]
async fn a_refused_dial_is_a_typed_connect_failure() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (link, _inbound) = Link::start(
        "dial-test",
        "127.0.0.1",
        "cookie",
        listener,
        Duration::from_secs(5),
        Role::Node,
    )
    .await
    .unwrap();
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = held.local_addr().unwrap().to_string();
    match link.dial(&closed, Duration::from_secs(5)).await {
        Err(NodeError::Connect {
            addr,
            reason: ConnectFailure::Socket(e),
        }) => {
            assert_eq!(addr, closed);
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        }
        other => panic!("not a refused connection: {other:?}"),
    }
    link.stop().await;
}

/// An actor that stands for a session (it is never sent anything).
struct NoSession;

impl Actor for NoSession {
    type Msg = NodeSessionMessage;
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<Self::Msg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

/// `peer` has a session to `shared`'s process (one whose frames go
/// nowhere: its port is not in the cluster group).
async fn connect(shared: &Shared, peer: &str) -> ActorRef<NodeSessionMessage> {
    let (session, _) = Actor::spawn(None, NoSession, ()).await.unwrap();
    let ready = SessionEvent::Ready {
        peer: peer.to_owned(),
        addr: "127.0.0.1:1".into(),
        listen: "127.0.0.1:1".into(),
        outbound: false,
    };
    shared.on_session(ready, Some(session.clone()));
    session
}

/// Call `call` from `from` comes to `ep`, served here: a request that
/// keeps the counter's handler running until it is stopped.
fn long_call(shared: &Arc<Shared>, ep: &ReplicaEndpoint, call: u64, from: &str) {
    data(shared, call_header(ep, call, from, false), forever());
}

/// The header of call `call` from `from` to `ep`.
fn call_header(ep: &ReplicaEndpoint, call: u64, from: &str, stream: bool) -> DataHeader {
    DataHeader::Call {
        call,
        replica: ep.id().0,
        stream,
        from: from.to_owned(),
        model: None,
    }
}

/// A request the counter's handler runs until it is stopped.
fn forever() -> Vec<u8> {
    rmp_serde::to_vec_named(&0u32).unwrap()
}

/// `peer`'s session closed.
fn close(shared: &Shared, peer: &str) {
    let session = lock(&shared.sessions)
        .get(peer)
        .and_then(|s| s.first().cloned());
    close_session(shared, peer, session);
}

/// `session`, to `peer`, closed.
fn close_session(shared: &Shared, peer: &str, session: Option<ActorRef<NodeSessionMessage>>) {
    let closed = SessionEvent::Closed {
        addr: "127.0.0.1:1".into(),
        outbound: false,
        end: SessionEnd::Authenticated {
            peer: peer.to_owned(),
        },
    };
    shared.on_session(closed, session);
}

/// A session this process stopped closes late: after the peer opened a
/// new one, whose first call already runs here (a call can come before
/// its session's `Ready`). The late close leaves that call running: the
/// stop already failed what went by the old session.
#[tokio::test(start_paused = true)]
async fn a_stopped_sessions_late_close_leaves_the_peers_new_calls_alone() {
    let ep = counter().await;
    let shared = unconnected();
    shared.serve(ep.clone());
    let peer = "caller@127.0.0.1";
    let old = connect(&shared, peer).await;
    assert!(shared.drop_session(peer, "test"));
    long_call(&shared, &ep, 3, peer);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 1, "the new session's call runs");
    close_session(&shared, peer, Some(old));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 1, "the old session's close stopped it");
    assert!(lock(&shared.stopped).is_empty(), "the stop is forgotten");
    connect(&shared, peer).await;
    assert!(shared.is_connected(peer));
}

/// A process's `Shared` with no sessions (no frame it sends goes out).
fn unconnected() -> Arc<Shared> {
    unconnected_with_inbound().0
}

/// [`unconnected`], with what it passes on to its owner.
fn unconnected_with_inbound() -> (Arc<Shared>, mpsc::UnboundedReceiver<Inbound>) {
    unconnected_as(Role::Node)
}

/// [`unconnected_with_inbound`], as `role`'s process.
fn unconnected_as(role: Role) -> (Arc<Shared>, mpsc::UnboundedReceiver<Inbound>) {
    let (inbound, rx) = mpsc::unbounded_channel();
    let handshakes = Handshakes::new("me".into(), Duration::from_secs(5));
    let shared = Shared::new("me@127.0.0.1".into(), inbound, handshakes, 7, role);
    (shared, rx)
}

/// A peer's port, standing in for the remote one: what it is sent.
struct PeerPort(mpsc::UnboundedSender<PortMsg>);

impl Actor for PeerPort {
    type Msg = PortMsg;
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<Self::Msg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
    async fn handle(
        &self,
        _: ActorRef<Self::Msg>,
        msg: PortMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let _ = self.0.send(msg);
        Ok(())
    }
}

/// The head's port answers a node's heartbeat itself, even while its
/// owner (the registry) reads nothing, and from a node that has not joined
/// yet; but not once its owner is gone. A node's port answers nothing.
/// Both pass heartbeats on.
#[tokio::test(start_paused = true)]
async fn the_heads_port_answers_heartbeats_whatever_its_owner_does() {
    let peer = "node-a@127.0.0.1";
    let beat = |seq| {
        let env = Envelope {
            from: peer.to_owned(),
            control: wire::Control::Heartbeat { seq },
        };
        PortMsg::Control(wire::encode("control", &env).unwrap())
    };
    for role in [Role::Head, Role::Node] {
        let (shared, mut rx) = unconnected_as(role);
        let (port, _) = Actor::spawn(None, Port, shared.clone()).await.unwrap();
        connect(&shared, peer).await;
        assert!(matches!(
            rx.recv().await,
            Some(Inbound::Session(SessionEvent::Ready { .. }))
        ));
        let (tx, mut answers) = mpsc::unbounded_channel();
        let (theirs, _) = Actor::spawn(None, PeerPort(tx), ()).await.unwrap();
        lock(&shared.peers).insert(peer.to_owned(), theirs);
        port.cast(beat(41)).unwrap();
        port.cast(beat(42)).unwrap();
        // A mark behind the beats: everything the port does with them
        // is done once the owner hears it.
        let ready = SessionEvent::Ready {
            peer: "node-b@127.0.0.1".into(),
            addr: "127.0.0.1:2".into(),
            listen: "127.0.0.1:2".into(),
            outbound: false,
        };
        shared.pass_on(ready);
        let mut passed_on = Vec::new();
        while let Inbound::Control(env) = rx.recv().await.unwrap() {
            passed_on.push(env.control);
        }
        let mut answered = Vec::new();
        while let Ok(PortMsg::Control(bytes)) = answers.try_recv() {
            let env: Envelope = wire::decode("control", &bytes).unwrap();
            assert_eq!(env.from, shared.me);
            answered.push(env.control);
        }
        let seqs = |v: &[wire::Control]| -> Vec<u64> {
            v.iter()
                .map(|c| match c {
                    wire::Control::Heartbeat { seq } => *seq,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(seqs(&passed_on), [41, 42]);
        match role {
            Role::Head => assert_eq!(seqs(&answered), [41, 42]),
            Role::Node => assert!(answered.is_empty(), "{answered:?}"),
        }
        assert!(shared.heard_within(peer, Duration::from_millis(1)));
        // The owner is gone: nothing is answered any more. (An
        // undecodable frame behind the beat says when the port is past it.)
        drop(rx);
        port.cast(beat(43)).unwrap();
        port.cast(PortMsg::Control(vec![0xc1])).unwrap();
        while shared.undecodable.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        assert!(answers.try_recv().is_err(), "answered with no owner");
    }
}

/// A peer from which nothing came for longer than the timeout is dropped;
/// one that sent any frame (a streamed item too) is not, and neither is
/// one the judge leaves out. The calls in flight to the dropped peer fail
/// at once (not when its session's close comes, which may come after a
/// new session to it and then fails nothing). A new session is heard at
/// its start.
#[tokio::test(start_paused = true)]
async fn a_silent_peers_session_is_dropped_and_its_calls_fail_at_once() {
    let shared = unconnected();
    let (quiet, busy, head) = ("quiet@127.0.0.1", "busy@127.0.0.1", "head@127.0.0.1");
    for peer in [quiet, busy, head] {
        connect(&shared, peer).await;
    }
    let (_, waiting) = shared.calls.unary(quiet, "node-quiet", ReplicaId(1));
    let (streamed, _items) = shared.calls.stream(busy, "node-busy", ReplicaId(2));
    tokio::time::advance(Duration::from_millis(1_500)).await;
    data(&shared, DataHeader::Item { call: streamed }, Vec::new());
    tokio::time::advance(Duration::from_millis(1_000)).await;
    let timeout = Duration::from_secs(2);
    let judged = |peer: &str| peer != head;
    assert_eq!(shared.drop_silent(timeout, judged, "test"), [quiet]);
    assert!(!shared.is_connected(quiet));
    assert!(shared.is_connected(busy) && shared.is_connected(head));
    match waiting.await {
        Ok(Outcome::Ran(Err(CallError::NodeLost { node, .. }))) => {
            assert_eq!(node, "node-quiet");
        }
        other => panic!("the call to the dropped peer: {other:?}"),
    }
    // Its next session starts heard, whatever the last one was.
    connect(&shared, quiet).await;
    assert!(shared.drop_silent(timeout, judged, "test").is_empty());
    tokio::time::advance(Duration::from_millis(2_100)).await;
    let mut dropped = shared.drop_silent(timeout, judged, "test");
    dropped.sort();
    assert_eq!(dropped, [busy, quiet]);
}

/// A check that comes late (the process did not run) counts every peer as
/// heard that much later; one on time excuses nothing.
#[tokio::test(start_paused = true)]
async fn time_a_process_did_not_run_is_no_peers_silence() {
    let shared = unconnected();
    let peer = "node-p@127.0.0.1";
    connect(&shared, peer).await;
    let timeout = Duration::from_secs(2);
    let mut last_check = Instant::now();
    tokio::time::advance(CHECK_PERIOD).await;
    assert_eq!(
        shared.excuse_stall(&mut last_check, timeout),
        Duration::ZERO
    );
    // Late, but by less than half the timeout (a checker slowed by load):
    // nothing excused.
    tokio::time::advance(timeout / 2 - Duration::from_millis(1)).await;
    assert_eq!(
        shared.excuse_stall(&mut last_check, timeout),
        Duration::ZERO
    );
    // A frame, then a check on time, and then:
    shared.heard_from(peer);
    tokio::time::advance(CHECK_PERIOD).await;
    assert_eq!(
        shared.excuse_stall(&mut last_check, timeout),
        Duration::ZERO
    );
    // Stopped for 3 s, 250 ms after the peer was last heard: 500 ms of
    // silence (the 250 ms before, and the check period), not 3.25 s.
    tokio::time::advance(Duration::from_secs(3)).await;
    let lost = shared.excuse_stall(&mut last_check, timeout);
    assert_eq!(lost, Duration::from_secs(3) - CHECK_PERIOD);
    assert!(shared.heard_within(peer, CHECK_PERIOD * 2));
    assert!(!shared.heard_within(peer, CHECK_PERIOD));
    assert!(shared.drop_silent(timeout, |_| true, "test").is_empty());
    // Silent for a timeout of running time since, checked on time: dropped.
    for _ in 0..8 {
        tokio::time::advance(CHECK_PERIOD).await;
        assert_eq!(
            shared.excuse_stall(&mut last_check, timeout),
            Duration::ZERO
        );
    }
    assert_eq!(shared.drop_silent(timeout, |_| true, "test"), [peer]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_unary_call_stops_its_handler_and_frees_its_slot() {
    let ep = counter().await;
    let shared = unconnected();
    shared.serve(ep.clone());
    let from = "caller@127.0.0.1".to_owned();
    connect(&shared, &from).await;
    long_call(&shared, &ep, 3, &from);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 1, "the call runs");
    data(&shared, DataHeader::Cancel { call: 3, from }, Vec::new());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 0, "the cancelled call still holds its slot");
    assert!(lock(&shared.running).is_empty(), "the call's entry is left");
    assert_eq!(ep.stats().cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_callers_session_closes_stops_and_frees_its_slot() {
    let ep = counter().await;
    let shared = unconnected();
    shared.serve(ep.clone());
    let (from, other) = ("caller@127.0.0.1".to_owned(), "other@127.0.0.1");
    connect(&shared, &from).await;
    connect(&shared, other).await;
    long_call(&shared, &ep, 3, &from);
    long_call(&shared, &ep, 3, other);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 2, "both calls run");
    // The caller's session closes: it will never send a Cancel.
    close(&shared, &from);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 1, "the abandoned call still holds its slot");
    let running: Vec<_> = lock(&shared.running).keys().cloned().collect();
    assert_eq!(
        running,
        [(other.to_owned(), 3)],
        "the other caller's call runs on"
    );
}

/// A call still waiting in the port's mailbox when its caller's session
/// closed (so missed by the close's pass over the running calls) starts,
/// and is stopped when the port reaches the close's mark behind it. A
/// mark without this process's secret stops nothing.
#[tokio::test(start_paused = true)]
async fn a_call_that_waited_in_the_port_while_its_session_closed_is_stopped() {
    let ep = counter().await;
    let shared = unconnected();
    shared.serve(ep.clone());
    let (port, _) = Actor::spawn(None, Port, shared.clone()).await.unwrap();
    let from = "caller@127.0.0.1";
    connect(&shared, from).await;
    let call = |call| {
        let header = call_header(&ep, call, from, false);
        PortMsg::Data(wire::encode("data", &header).unwrap(), forever())
    };
    // Queued, then the close: the port reads the call after the pass.
    port.cast(call(1)).unwrap();
    close(&shared, from);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 0, "the call runs for nobody");
    assert!(lock(&shared.running).is_empty());
    // A forged mark (another secret) stops nothing.
    port.cast(call(2)).unwrap();
    let forged = wire::Closed {
        secret: shared.secret + 1,
        peer: from.to_owned(),
        abandon: true,
        event: None,
    };
    let forged = PortMsg::Closed(wire::encode("closed", &forged).unwrap());
    port.cast(forged).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 1, "a forged mark stopped a call");
}

/// A session's close reaches the owner after the frames the session
/// delivered before it closed: a node's `Hello` still in the port's
/// mailbox when its session closes comes first, so the registry never
/// admits a node whose session it has already seen close.
#[tokio::test(start_paused = true)]
async fn a_sessions_close_comes_after_the_frames_it_delivered() {
    let (shared, mut rx) = unconnected_with_inbound();
    let (port, _) = Actor::spawn(None, Port, shared.clone()).await.unwrap();
    let peer = "node-a@127.0.0.1";
    connect(&shared, peer).await;
    // Delivered by the session: in the port's mailbox, not read yet.
    let env = Envelope {
        from: peer.to_owned(),
        control: wire::Control::Heartbeat { seq: 1 },
    };
    port.cast(PortMsg::Control(wire::encode("control", &env).unwrap()))
        .unwrap();
    close(&shared, peer);
    let mut heard = Vec::new();
    for _ in 0..3 {
        heard.push(match rx.recv().await.unwrap() {
            Inbound::Session(SessionEvent::Ready { .. }) => "ready",
            Inbound::Control(_) => "frame",
            Inbound::Session(SessionEvent::Closed { .. }) => "closed",
            Inbound::Session(SessionEvent::Opened { .. }) => "opened",
        });
    }
    assert_eq!(heard, ["ready", "frame", "closed"]);
    assert!(lock(&shared.held).is_empty(), "a close held for good");
}

/// Session events keep the server's order: an old session's close comes
/// before the `Ready` of the peer's next session, which the server
/// reported after it (the registry keys where a node listens by peer: a
/// late close would erase the new session's address).
#[tokio::test(start_paused = true)]
async fn an_old_sessions_close_comes_before_the_next_sessions_ready() {
    let (shared, mut rx) = unconnected_with_inbound();
    let _port = Actor::spawn(None, Port, shared.clone()).await.unwrap();
    let peer = "node-a@127.0.0.1";
    connect(&shared, peer).await;
    close(&shared, peer);
    connect(&shared, peer).await;
    let mut heard = Vec::new();
    for _ in 0..3 {
        heard.push(match rx.recv().await.unwrap() {
            Inbound::Session(SessionEvent::Ready { .. }) => "ready",
            Inbound::Session(SessionEvent::Closed { .. }) => "closed",
            _ => "other",
        });
    }
    assert_eq!(heard, ["ready", "closed", "ready"]);
}

/// A call whose caller's session is not `Ready` here yet (its frames can
/// come first) runs: refused, it would never be answered.
#[tokio::test(start_paused = true)]
async fn a_call_before_its_callers_session_is_ready_here_runs() {
    let ep = counter().await;
    let shared = unconnected();
    shared.serve(ep.clone());
    long_call(&shared, &ep, 3, "early@127.0.0.1");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ep.in_flight(), 1, "the call was dropped unanswered");
}

#[tokio::test(start_paused = true)]
async fn a_stream_to_a_caller_gone_away_ends_and_frees_its_slot() {
    let ep = counter().await;
    // A session whose frames go nowhere: the caller has gone away, so no
    // item can be sent.
    let shared = unconnected();
    connect(&shared, "gone@127.0.0.1").await;
    shared.serve(ep.clone());
    data(
        &shared,
        call_header(&ep, 7, "gone@127.0.0.1", true),
        forever(),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        lock(&shared.running).is_empty(),
        "the stream's entry is left"
    );
    assert_eq!(ep.in_flight(), 0, "the stream still holds its slot");
}

#[test]
fn of_two_processes_exactly_one_dials_the_other() {
    let names = ["a-1@127.0.0.1", "m-2@127.0.0.1", "z-3@127.0.0.1", "z-3@::1"];
    for x in names {
        assert!(!dials(x, x), "{x} dials itself");
        for y in names.iter().filter(|y| **y != x) {
            assert!(dials(x, y) != dials(y, x), "{x} and {y}: one dials");
        }
    }
    // The one that dials is the one ractor_cluster's election keeps.
    assert!(dials("z-3@127.0.0.1", "a-1@127.0.0.1"));
}

/// A session `id` ractor_cluster opened for a connection from `peer`,
/// accepted (`is_server`) or dialed.
async fn session_info(
    id: u64,
    peer: &str,
    is_server: bool,
) -> ractor_cluster::node::NodeServerSessionInformation {
    let (actor, _) = Actor::spawn(None, NoSession, ()).await.unwrap();
    ractor_cluster::node::NodeServerSessionInformation {
        actor,
        peer_name: None,
        is_server,
        node_id: id,
        peer_addr: peer.to_owned(),
    }
}

/// A connection the listener holds is known by its peer address: a second
/// one from that address is not admitted while it waits, and only its own
/// session (not another from the same address, accepted on ractor_cluster's
/// listener) opens its read gate and frees its place. Its place is held from
/// accept to its session's end, even past the accept's deadline: a
/// handshake that ends between the two still opens the gate.
#[tokio::test(start_paused = true)]
async fn only_a_held_connections_own_session_opens_its_gate() {
    let peer = "10.0.0.7:40000";
    let h = Handshakes::new("me".into(), Duration::from_secs(5));
    let gate = h.admit(peer.into()).expect("a free place");
    assert!(h.admit(peer.into()).is_none(), "the same address twice");
    // Its session opens a second after the accept.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let own = session_info(1, peer, true).await;
    h.opened(&own);
    // Another session from the same address, not one the listener admitted.
    let other = session_info(2, peer, true).await;
    h.opened(&other);
    h.done(&other);
    assert!(
        !gate.load(Ordering::Acquire),
        "another session opened the gate"
    );
    // Past the accept's deadline, before the session's: still held.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert!(
        h.admit(peer.into()).is_none(),
        "released at the accept's deadline"
    );
    h.done(&own);
    assert!(gate.load(Ordering::Acquire), "its session authenticated");
    assert!(h.admit(peer.into()).is_some(), "its place is free again");
}
