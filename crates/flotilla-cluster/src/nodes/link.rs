//! One process's place in the cluster: its ractor_cluster `NodeServer`, its
//! [`Port`] (the one remotable actor), the sessions to its peers, the calls it
//! is waiting on, and the local replicas it serves to other processes.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use flotilla_replica::{CallError, ReplicaEndpoint, ReplicaId, remote::Served};
use ractor::{Actor, ActorProcessingErr, ActorRef, ActorStatus, MessagingErr, pg};
use ractor_cluster::{
    NetworkStream, NodeEventSubscription, NodeServer, NodeServerMessage, NodeSessionMessage,
    node::{NodeConnectionMode, NodeServerSessionInformation},
};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
    time::Instant,
};
use tracing::{debug, info, warn};

use super::{
    ConnectFailure, NodeError,
    handshake::Handshakes,
    wire::{self, DataHeader, Envelope, PortMsg},
};

/// The cluster-wide process group every port joins.
pub(crate) const PORTS: &str = "flotilla/ports";
/// The largest frame a process accepts (ractor_cluster's default is 16 MiB;
/// a larger one drops the whole session).
pub(crate) const MAX_FRAME: u64 = 64 << 20;

/// The registered name of the port of the process called `peer` (`name@host`).
pub(crate) fn port_name(peer: &str) -> String {
    format!("flotilla/port:{peer}")
}

/// Whether the process called `me` dials the peer called `peer` (ractor
/// names), once the head has said both are alive: the one whose name sorts
/// last does, never the other, so two processes that learn of each other at
/// once still open one session. It is the side ractor_cluster's election
/// (Erlang's simultaneous-connect rule) would keep. Nobody dials itself, and
/// nodes dial the head, never the reverse (`is_head` at the caller).
pub(crate) fn dials(me: &str, peer: &str) -> bool {
    me > peer
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which process a link is: the head's (its port answers the nodes'
/// heartbeats) or a node's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The head.
    Head,
    /// A node.
    Node,
}

/// What a session did, as the registry or agent hears it.
#[derive(Debug, Clone)]
pub(crate) enum SessionEvent {
    /// A connection opened (not yet authenticated).
    Opened { id: u64, addr: String },
    /// It authenticated; `peer` is the peer's ractor name, `listen` the
    /// address its `NodeServer` listens on (`host:port`, what a peer dials).
    /// `addr` is, for a session this process dialed (`outbound`), the
    /// address it dialed; for one it accepted, the peer's source address.
    Ready {
        peer: String,
        addr: String,
        listen: String,
        outbound: bool,
    },
    /// It closed, as `end` says.
    Closed {
        addr: String,
        outbound: bool,
        end: SessionEnd,
    },
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SessionEnd {
    /// After it authenticated as `peer` (the peer's ractor name).
    Authenticated { peer: String },
    /// The handshake failed after the peer had named itself: a wrong cookie,
    /// on one side or the other.
    Refused,
    /// The handshake deadline passed first ([`Handshakes`]).
    TimedOut,
    /// It ended before the peer named itself: the other side closed it at
    /// once (a head whose listener holds as many handshakes as it may), the
    /// connection dropped, or the peer does not speak ractor_cluster.
    Unanswered,
}

/// What reaches the registry (head) or agent (node) from the link.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A decoded control frame.
    Control(Envelope),
    /// A session event.
    Session(SessionEvent),
}

/// How a call to another process ended, as its waiter learns it.
#[derive(Debug)]
pub(crate) enum Outcome<T> {
    /// It ran there.
    Ran(Result<T, CallError>),
    /// It did not start; the request comes back.
    Refused { request: Vec<u8>, full: bool },
}

/// One piece of a streaming call's answer, in order.
#[derive(Debug)]
pub(crate) enum Piece {
    Item(Vec<u8>),
    End(Outcome<()>),
}

enum Waiter {
    Unary(oneshot::Sender<Outcome<Vec<u8>>>),
    Stream(mpsc::UnboundedSender<Piece>),
}

struct Pending {
    peer: String,
    node: String,
    replica: ReplicaId,
    waiter: Waiter,
}

/// Calls this process waits on, by call id.
#[derive(Default)]
pub(crate) struct Calls {
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
}

impl Calls {
    pub(crate) fn unary(
        &self,
        peer: &str,
        node: &str,
        replica: ReplicaId,
    ) -> (u64, oneshot::Receiver<Outcome<Vec<u8>>>) {
        let (tx, rx) = oneshot::channel();
        (self.add(peer, node, replica, Waiter::Unary(tx)), rx)
    }

    pub(crate) fn stream(
        &self,
        peer: &str,
        node: &str,
        replica: ReplicaId,
    ) -> (u64, mpsc::UnboundedReceiver<Piece>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (self.add(peer, node, replica, Waiter::Stream(tx)), rx)
    }

    fn add(&self, peer: &str, node: &str, replica: ReplicaId, waiter: Waiter) -> u64 {
        let call = self.next.fetch_add(1, Ordering::Relaxed);
        let p = Pending {
            peer: peer.to_owned(),
            node: node.to_owned(),
            replica,
            waiter,
        };
        lock(&self.pending).insert(call, p);
        call
    }

    /// Forget `call` (its caller went away, or it could not be sent).
    pub(crate) fn forget(&self, call: u64) -> bool {
        lock(&self.pending).remove(&call).is_some()
    }

    /// The answer to `call` came: its waiter gets `outcome`. Returns the
    /// peer that answered, if the call was still waited on.
    fn finish(&self, call: u64, outcome: Outcome<Vec<u8>>) -> Option<String> {
        let p = lock(&self.pending).remove(&call)?;
        let peer = p.peer;
        match (p.waiter, outcome) {
            (Waiter::Unary(tx), o) => {
                let _ = tx.send(o);
            }
            (Waiter::Stream(tx), Outcome::Refused { request, full }) => {
                let _ = tx.send(Piece::End(Outcome::Refused { request, full }));
            }
            (Waiter::Stream(tx), Outcome::Ran(r)) => {
                let _ = tx.send(Piece::End(Outcome::Ran(r.map(|_| ()))));
            }
        }
        Some(peer)
    }

    /// An item of streamed `call` came; `heard` is told which peer sent it.
    fn item(&self, call: u64, body: Vec<u8>, heard: impl FnOnce(&str)) {
        if let Some(Pending {
            waiter: Waiter::Stream(tx),
            peer,
            ..
        }) = lock(&self.pending).get(&call)
        {
            let _ = tx.send(Piece::Item(body));
            heard(peer);
        }
    }

    /// Every call waiting on `peer` fails: it was sent, so it may have run.
    pub(crate) fn fail_peer(&self, peer: &str) -> usize {
        let lost: Vec<Pending> = {
            let mut pending = lock(&self.pending);
            let ids: Vec<u64> = pending
                .iter()
                .filter(|(_, p)| p.peer == peer)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        let n = lost.len();
        for p in lost {
            let e = CallError::NodeLost {
                node: p.node,
                replica: p.replica.to_string(),
            };
            match p.waiter {
                Waiter::Unary(tx) => {
                    let _ = tx.send(Outcome::Ran(Err(e)));
                }
                Waiter::Stream(tx) => {
                    let _ = tx.send(Piece::End(Outcome::Ran(Err(e))));
                }
            }
        }
        n
    }
}

/// What a process shares between its port, its transport and its owner.
pub(crate) struct Shared {
    /// This process's ractor name (`name@host`).
    pub(crate) me: String,
    pub(crate) calls: Calls,
    /// Local replicas other processes may call, by id.
    serving: Mutex<HashMap<ReplicaId, Arc<ReplicaEndpoint>>>,
    /// Calls running here for other processes, by caller and call id, for
    /// `Cancel`.
    running: Mutex<HashMap<(String, u64), tokio::task::AbortHandle>>,
    /// Peer ports found so far, by ractor name.
    peers: Mutex<HashMap<String, ActorRef<PortMsg>>>,
    /// Authenticated sessions, by peer ractor name. One per peer: of two
    /// nodes only one dials the other ([`dials`]), so ractor_cluster never
    /// has two to elect between. A second one (a peer that dials against the
    /// rule) is kept until ractor_cluster closes the loser.
    sessions: Mutex<HashMap<String, Vec<ActorRef<NodeSessionMessage>>>>,
    /// Sessions this process stopped itself ([`stop_sessions`](Self::stop_sessions)),
    /// whose close is still to come: their calls were failed at the stop,
    /// so their close only passes on (it must not touch a newer session's).
    stopped: Mutex<HashSet<ractor::ActorId>>,
    /// When each peer with a session was last heard: its session's start,
    /// then any frame of its (stamped by the port). Taken after `sessions`
    /// when both are held. What [`drop_silent`](Self::drop_silent) judges.
    heard: Mutex<HashMap<String, Instant>>,
    inbound: mpsc::UnboundedSender<Inbound>,
    /// Deadlines and slots of sessions not yet authenticated.
    handshakes: Arc<Handshakes>,
    /// Frames that did not decode.
    pub(crate) undecodable: AtomicU64,
    /// This process's port, once it runs.
    port: OnceLock<ActorRef<PortMsg>>,
    /// What proves a [`PortMsg::Closed`] came from this process.
    secret: u64,
    /// Session events held until the port passes them on
    /// ([`pass_on`](Self::pass_on)), by number.
    held: Mutex<HashMap<u64, SessionEvent>>,
    next_held: AtomicU64,
    /// This process is the head: its port answers each node's heartbeat
    /// itself, whatever its owner (the registry) is busy with.
    answers_heartbeats: bool,
}

impl Shared {
    /// Serve `ep` to other processes.
    pub(crate) fn serve(&self, ep: Arc<ReplicaEndpoint>) {
        lock(&self.serving).insert(ep.id(), ep);
    }

    /// Stop serving replica `id`.
    pub(crate) fn unserve(&self, id: ReplicaId) {
        lock(&self.serving).remove(&id);
    }

    /// Stop every call running here for `peer`; how many there were.
    fn abandon_calls_from(&self, peer: &str) -> usize {
        let mut n = 0;
        lock(&self.running).retain(|(from, _), task| {
            let theirs = from == peer;
            if theirs {
                task.abort();
                n += 1;
            }
            !theirs
        });
        n
    }

    /// Put one mark in this process's port mailbox (see [`wire::Closed`]):
    /// when the port reaches it, it stops the calls `peer` made here (if
    /// `abandon`) and passes `event` on to the owner.
    ///
    /// Session events go this way, behind the frames sessions delivered
    /// before them. Those frames wait in the port's mailbox (a session puts
    /// each in as it reads it), while session events come from the server's
    /// own task: sent straight on, a close could overtake its session's
    /// frames (the registry would hear a node's close before its `Hello`, and
    /// then admit a node with no session), and an old session's close a new
    /// session's `Ready`. Through the port, every event keeps the server's
    /// order and comes after the frames before it. Straight on when no port
    /// runs.
    fn mark(&self, peer: &str, abandon: bool, event: Option<SessionEvent>) {
        let held = event.map(|event| {
            let n = self.next_held.fetch_add(1, Ordering::Relaxed);
            lock(&self.held).insert(n, event);
            n
        });
        let closed = wire::Closed {
            secret: self.secret,
            peer: peer.to_owned(),
            abandon,
            event: held,
        };
        let sent = match (self.port.get(), wire::encode("closed", &closed)) {
            (Some(port), Ok(bytes)) => port.cast(PortMsg::Closed(bytes)).is_ok(),
            _ => false,
        };
        if !sent && let Some(event) = held.and_then(|n| lock(&self.held).remove(&n)) {
            let _ = self.inbound.send(Inbound::Session(event));
        }
    }

    /// Pass a session event on to the owner, behind the frames before it
    /// ([`mark`](Self::mark)).
    fn pass_on(&self, event: SessionEvent) {
        self.mark("", false, Some(event));
    }

    /// Pass on every event still held (the port stopped before it reached
    /// their marks).
    fn pass_on_held(&self) {
        let mut held: Vec<(u64, SessionEvent)> = lock(&self.held).drain().collect();
        held.sort_unstable_by_key(|(n, _)| *n);
        for (_, event) in held {
            let _ = self.inbound.send(Inbound::Session(event));
        }
    }

    /// The replica `id`, if it is served to other processes.
    pub(crate) fn served(&self, id: ReplicaId) -> Option<Arc<ReplicaEndpoint>> {
        lock(&self.serving).get(&id).cloned()
    }

    /// The port of `peer`, looked up in the cluster-wide group once.
    fn port_of(&self, peer: &str) -> Option<ActorRef<PortMsg>> {
        if let Some(p) = lock(&self.peers).get(peer)
            && p.get_status() < ActorStatus::Stopping
        {
            return Some(p.clone());
        }
        let name = port_name(peer);
        let cell = pg::get_members(&PORTS.to_owned())
            .into_iter()
            .find(|c| !c.get_id().is_local() && c.get_name().as_deref() == Some(name.as_str()))?;
        let port: ActorRef<PortMsg> = cell.into();
        lock(&self.peers).insert(peer.to_owned(), port.clone());
        Some(port)
    }

    /// Send a control frame to `peer`. False if it is not reachable.
    pub(crate) fn send_control(&self, peer: &str, control: wire::Control) -> bool {
        let envelope = Envelope {
            from: self.me.clone(),
            control,
        };
        let bytes = match wire::encode("control", &envelope) {
            Ok(b) => b,
            Err(e) => {
                warn!(node = %self.me, peer, error = %e, "node control frame not sent");
                return false;
            }
        };
        let Some(port) = self.port_of(peer) else {
            return false;
        };
        if port.cast(PortMsg::Control(bytes)).is_err() {
            lock(&self.peers).remove(peer);
            return false;
        }
        true
    }

    /// Send a data frame to `peer`. When it could not go, the body comes back
    /// (`Err(Some)`), unless ractor kept it (`Err(None)`, after it was
    /// serialized).
    pub(crate) fn send_data(
        &self,
        peer: &str,
        header: &DataHeader,
        body: Vec<u8>,
    ) -> Result<(), Option<Vec<u8>>> {
        // A call is not sent to a peer whose session closed: ractor drops a
        // cast to a remote actor whose session is gone without an error, so
        // the call would wait forever. Callers register their call before
        // sending and a closing session is removed before its calls fail
        // (`on_session`), so a call either sees the session gone here (not
        // sent: retried) or is failed with it.
        //
        // An answer (a reply, refusal, item or end) and a Cancel are not held
        // to it: a call can run here before its caller's session is `Ready`
        // here (see `serve_call`), and its answer, dropped, would leave the
        // caller waiting on a session that stays up. One to a session that
        // did close is lost harmlessly: its caller fails the call with the
        // session, and the close stops the calls it made here.
        if matches!(header, DataHeader::Call { .. }) && !lock(&self.sessions).contains_key(peer) {
            return Err(Some(body));
        }
        let Ok(h) = wire::encode("data", header) else {
            return Err(Some(body));
        };
        let Some(port) = self.port_of(peer) else {
            return Err(Some(body));
        };
        match port.cast(PortMsg::Data(h, body)) {
            Ok(()) => Ok(()),
            Err(MessagingErr::SendErr(PortMsg::Data(_, body))) => {
                lock(&self.peers).remove(peer);
                Err(Some(body))
            }
            Err(_) => {
                lock(&self.peers).remove(peer);
                Err(None)
            }
        }
    }

    /// Stop the session to `peer` (a heartbeat timeout, a lost or fenced
    /// node). Returns whether there was one.
    pub(crate) fn drop_session(&self, peer: &str, why: &str) -> bool {
        let session = {
            let mut sessions = lock(&self.sessions);
            lock(&self.heard).remove(peer);
            sessions.remove(peer)
        };
        match session {
            Some(all) => {
                self.stop_sessions(peer, all, why);
                true
            }
            None => {
                lock(&self.peers).remove(peer);
                false
            }
        }
    }

    /// Stop the sessions to the peers that `judged` accepts and from which
    /// nothing came for longer than `timeout` (see [`heard_from`](Self::heard_from)),
    /// as [`drop_session`](Self::drop_session) does; the peers dropped. A
    /// peer's session that is newer than the silence is never taken for it:
    /// judged and removed under the lock its registration takes.
    pub(crate) fn drop_silent(
        &self,
        timeout: std::time::Duration,
        judged: impl Fn(&str) -> bool,
        why: &str,
    ) -> Vec<String> {
        let now = Instant::now();
        let dropped: Vec<(String, Vec<ActorRef<NodeSessionMessage>>)> = {
            let mut sessions = lock(&self.sessions);
            let mut heard = lock(&self.heard);
            let silent: Vec<String> = (heard.iter())
                .filter(|(peer, at)| judged(peer) && now.duration_since(**at) > timeout)
                .map(|(peer, _)| peer.clone())
                .collect();
            silent
                .into_iter()
                .map(|peer| {
                    heard.remove(&peer);
                    let all = sessions.remove(&peer).unwrap_or_default();
                    (peer, all)
                })
                .collect()
        };
        dropped
            .into_iter()
            .map(|(peer, all)| {
                self.stop_sessions(&peer, all, why);
                peer
            })
            .collect()
    }

    /// Stop `all`, the sessions to `peer` just taken out of the map, and
    /// fail what went by them at once, as their close would: a close that
    /// comes after a new session to the peer registered is taken for a
    /// duplicate's and fails nothing, so it cannot be left to it.
    fn stop_sessions(&self, peer: &str, all: Vec<ActorRef<NodeSessionMessage>>, why: &str) {
        lock(&self.peers).remove(peer);
        info!(node = %self.me, peer, why, "stopping the session");
        lock(&self.stopped).extend(all.iter().map(|s| s.get_id()));
        for s in all {
            s.stop(Some(format!("flotilla: {why}")));
        }
        let failed = self.calls.fail_peer(peer);
        // Its close comes later, and is passed on then.
        self.session_ended(peer, failed, None);
    }

    /// The session to `peer` ended (`failed` of our calls on it failed):
    /// the calls the peer made here have nobody to answer now (its side
    /// fails them as lost, and no Cancel can come), so their handlers stop
    /// and free their slots, as a Cancel would have them. Those still in the
    /// port's mailbox start after this pass: the port stops them when it
    /// reaches the mark put behind them. (A call of a session the peer opens
    /// again is not one of them: that session must connect and authenticate
    /// first, while this close is reported as the old session exits.) The
    /// close `event`, if it came already, goes on behind the same mark.
    fn session_ended(&self, peer: &str, failed: usize, event: Option<SessionEvent>) {
        if failed > 0 {
            warn!(node = %self.me, peer, failed, "calls lost with their session");
        }
        let abandoned = self.abandon_calls_from(peer);
        if abandoned > 0 {
            info!(node = %self.me, peer, abandoned,
                "calls of a peer whose session closed stopped here");
        }
        self.mark(peer, true, event);
    }

    /// A frame came from `peer`: heard now (only a peer with a session is
    /// tracked, so a frame naming anyone else adds nothing).
    pub(crate) fn heard_from(&self, peer: &str) {
        if let Some(at) = lock(&self.heard).get_mut(peer) {
            *at = Instant::now();
        }
    }

    /// Whether some frame came from `peer` within `timeout` (on a session
    /// that is still up).
    pub(crate) fn heard_within(&self, peer: &str, timeout: std::time::Duration) -> bool {
        lock(&self.heard)
            .get(peer)
            .is_some_and(|at| at.elapsed() <= timeout)
    }

    /// Whether `peer` has an authenticated session now.
    pub(crate) fn is_connected(&self, peer: &str) -> bool {
        lock(&self.sessions).contains_key(peer)
    }

    /// Peers with an authenticated session now.
    pub(crate) fn connected(&self) -> Vec<String> {
        lock(&self.sessions).keys().cloned().collect()
    }

    fn on_session(&self, event: SessionEvent, session: Option<ActorRef<NodeSessionMessage>>) {
        match (&event, session) {
            (SessionEvent::Ready { peer, .. }, Some(actor)) => {
                let mut sessions = lock(&self.sessions);
                sessions.entry(peer.clone()).or_default().push(actor);
                // A new session: heard now, whatever an earlier one was.
                lock(&self.heard).insert(peer.clone(), Instant::now());
            }
            (
                SessionEvent::Closed {
                    end: SessionEnd::Authenticated { peer },
                    ..
                },
                closing,
            ) => {
                if closing
                    .as_ref()
                    .is_some_and(|c| lock(&self.stopped).remove(&c.get_id()))
                {
                    // Stopped here: its calls failed then, and the peer may
                    // have a new session by now, whose calls (some can run
                    // before its `Ready`) this close must leave alone.
                    self.pass_on(event);
                    return;
                }
                // The session goes before its calls fail (see `send_data`).
                let (registered, duplicate) = {
                    let mut sessions = lock(&self.sessions);
                    let (registered, others) = match (sessions.get_mut(peer), closing) {
                        (Some(all), Some(closing)) => {
                            let before = all.len();
                            all.retain(|s| s.get_id() != closing.get_id());
                            (all.len() < before, !all.is_empty())
                        }
                        _ => (false, false),
                    };
                    if !others {
                        sessions.remove(peer);
                        lock(&self.heard).remove(peer);
                    }
                    (registered, others)
                };
                if duplicate && !registered {
                    // It authenticated under the name of a connected peer and
                    // closed before it was ready: no call went by it, and the
                    // peer's own session is untouched.
                    info!(node = %self.me, peer, "a second session to a connected peer closed before it was ready");
                    return;
                }
                lock(&self.peers).remove(peer);
                // A duplicate session (only a peer that dials against `dials`
                // opens one) leaves the peer connected by the other. Still,
                // a call in flight on it, or whose answer was, would wait
                // forever (item 12 of `docs/nodes.md`), and which ones went
                // that way is not known here: all fail as lost (they may have
                // run), and later ones go by the other session.
                let failed = self.calls.fail_peer(peer);
                if duplicate {
                    warn!(node = %self.me, peer, failed,
                        "a duplicate session closed; the calls in flight to that peer fail");
                    // The peer is still connected: nobody hears of a close.
                    return;
                }
                let peer = peer.clone();
                self.session_ended(&peer, failed, Some(event));
                return;
            }
            _ => {}
        }
        self.pass_on(event);
    }
}

/// Forwards ractor_cluster's session events (called on the NodeServer's task).
/// It remembers which sessions authenticated: a session that failed the
/// cookie challenge still carries the peer's name (the server sends it in the
/// challenge), so the name alone does not say it was accepted.
struct Events(Arc<Shared>, Mutex<HashSet<ractor_cluster::NodeId>>);

fn peer_of(ses: &NodeServerSessionInformation) -> Option<String> {
    ses.peer_name.as_ref().map(|p| p.name.clone())
}

impl NodeEventSubscription for Events {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        self.0.handshakes.opened(&ses);
        self.0.on_session(
            SessionEvent::Opened {
                id: ses.node_id,
                addr: ses.peer_addr,
            },
            None,
        );
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        self.0.handshakes.done(&ses);
        lock(&self.1).insert(ses.node_id);
    }

    fn node_session_ready(&self, ses: NodeServerSessionInformation) {
        let Some(peer) = peer_of(&ses) else {
            return;
        };
        let listen = ses
            .peer_name
            .as_ref()
            .map(|p| p.connection_string.clone())
            .unwrap_or_default();
        self.0.on_session(
            SessionEvent::Ready {
                peer,
                addr: ses.peer_addr.clone(),
                listen,
                outbound: !ses.is_server,
            },
            Some(ses.actor),
        );
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        let timed_out = self.0.handshakes.done(&ses);
        let authenticated = lock(&self.1).remove(&ses.node_id);
        let end = match peer_of(&ses) {
            Some(peer) if authenticated => SessionEnd::Authenticated { peer },
            _ if timed_out => SessionEnd::TimedOut,
            Some(_) => SessionEnd::Refused,
            None => SessionEnd::Unanswered,
        };
        self.0.on_session(
            SessionEvent::Closed {
                addr: ses.peer_addr,
                outbound: !ses.is_server,
                end,
            },
            Some(ses.actor),
        );
    }
}

/// The one remotable actor of a process: decodes frames and dispatches them
/// without waiting (see `docs/nodes.md`, "Actors").
struct Port;

impl Actor for Port {
    type Msg = PortMsg;
    type State = Arc<Shared>;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<PortMsg>,
        shared: Arc<Shared>,
    ) -> Result<Arc<Shared>, ActorProcessingErr> {
        pg::join(PORTS.to_owned(), vec![myself.get_cell()]);
        let _ = shared.port.set(myself);
        Ok(shared)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<PortMsg>,
        shared: &mut Arc<Shared>,
    ) -> Result<(), ActorProcessingErr> {
        // A stop is taken before the messages still queued: the events
        // whose marks it never reached go on now, in order.
        shared.pass_on_held();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<PortMsg>,
        msg: PortMsg,
        shared: &mut Arc<Shared>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            PortMsg::Control(bytes) => match wire::decode::<Envelope>("control", &bytes) {
                Ok(env) => {
                    shared.heard_from(&env.from);
                    // The head answers a node's heartbeat here, not in its
                    // registry: a registry busy with a wave of joins must not
                    // fall silent to the nodes (they would drop their
                    // sessions, and the head would then declare them lost).
                    // A node sends its heartbeats from its session's start.
                    // Only while the owner lives (what it is passed on to
                    // still takes it): a head whose registry is gone falls
                    // silent, and its nodes notice.
                    let answer = match env.control {
                        wire::Control::Heartbeat { seq } if shared.answers_heartbeats => {
                            Some((env.from.clone(), seq))
                        }
                        _ => None,
                    };
                    let passed_on = shared.inbound.send(Inbound::Control(env)).is_ok();
                    if let Some((peer, seq)) = answer.filter(|_| passed_on) {
                        shared.send_control(&peer, wire::Control::Heartbeat { seq });
                    }
                }
                Err(e) => undecodable(shared, &e),
            },
            PortMsg::Data(header, body) => match wire::decode::<DataHeader>("data", &header) {
                Ok(h) => data(shared, h, body),
                Err(e) => undecodable(shared, &e),
            },
            PortMsg::Closed(bytes) => match wire::decode::<wire::Closed>("closed", &bytes) {
                Ok(c) if c.secret == shared.secret => {
                    if c.abandon {
                        let late = shared.abandon_calls_from(&c.peer);
                        if late > 0 {
                            info!(node = %shared.me, peer = %c.peer, late,
                                "calls that waited here while their session closed stopped");
                        }
                    }
                    let event = c.event.and_then(|n| lock(&shared.held).remove(&n));
                    if let Some(event) = event {
                        let _ = shared.inbound.send(Inbound::Session(event));
                    }
                }
                Ok(c) => warn!(node = %shared.me, peer = %c.peer,
                    "a session close not marked by this process: ignored"),
                Err(e) => undecodable(shared, &e),
            },
        }
        Ok(())
    }
}

fn undecodable(shared: &Shared, e: &wire::WireError) {
    shared.undecodable.fetch_add(1, Ordering::Relaxed);
    warn!(node = %shared.me, error = %e, "node port: undecodable frame dropped");
}

/// One data frame: a call to serve here, or the answer to one of ours. Its
/// sender counts as heard (a peer busy sending large frames is not silent).
fn data(shared: &Arc<Shared>, header: DataHeader, body: Vec<u8>) {
    let answered = match header {
        DataHeader::Call {
            call,
            replica,
            stream,
            from,
            model,
        } => {
            shared.heard_from(&from);
            serve_call(shared, call, ReplicaId(replica), stream, from, model, body);
            None
        }
        DataHeader::Cancel { call, from } => {
            shared.heard_from(&from);
            if let Some(task) = lock(&shared.running).remove(&(from, call)) {
                task.abort();
            }
            None
        }
        DataHeader::Reply { call, error } => {
            let outcome = match error {
                None => Outcome::Ran(Ok(body)),
                Some(e) => Outcome::Ran(Err(e)),
            };
            shared.calls.finish(call, outcome)
        }
        DataHeader::Item { call } => {
            shared
                .calls
                .item(call, body, |peer| shared.heard_from(peer));
            None
        }
        DataHeader::End { call, error } => {
            let outcome = match error {
                None => Outcome::Ran(Ok(Vec::new())),
                Some(e) => Outcome::Ran(Err(e)),
            };
            shared.calls.finish(call, outcome)
        }
        DataHeader::Refused { call, full } => shared.calls.finish(
            call,
            Outcome::Refused {
                request: body,
                full,
            },
        ),
    };
    if let Some(peer) = answered {
        shared.heard_from(&peer);
    }
}

/// Run a request from `from` on local replica `replica`, in a task of its own,
/// which a `Cancel` from the caller aborts (freeing the replica's slot).
fn serve_call(
    shared: &Arc<Shared>,
    call: u64,
    replica: ReplicaId,
    stream: bool,
    from: String,
    model: Option<String>,
    body: Vec<u8>,
) {
    let model: Option<Arc<str>> = model.map(Arc::from);
    let Some(ep) = shared.served(replica) else {
        debug!(node = %shared.me, %replica, "call for a replica not served here: refused");
        let _ = shared.send_data(&from, &DataHeader::Refused { call, full: false }, body);
        return;
    };
    let s = shared.clone();
    let key = (from.clone(), call);
    // Held until the entry is in: the task's own removal, when it ends,
    // takes the lock, so it cannot come first and leave the entry behind.
    let mut running = lock(&shared.running);
    // Not refused when its caller has no session here: a session's first
    // frames can reach this port before its `Ready` reaches `on_session`
    // (two actors, no order between them), and a call dropped unanswered
    // would leave its caller waiting for ever. So a call that waited here
    // while its caller's session closed runs, for nobody (docs/nodes.md).
    let task = tokio::spawn(async move {
        let (header, body) = if stream {
            serve_stream(&s, &ep, call, &from, model, body).await
        } else {
            serve_unary(&ep, call, model, body).await
        };
        let _ = s.send_data(&from, &header, body);
        lock(&s.running).remove(&(from, call));
    });
    running.insert(key, task.abort_handle());
}

/// A unary call's answer: its reply, or its refusal.
async fn serve_unary(
    ep: &Arc<ReplicaEndpoint>,
    call: u64,
    model: Option<Arc<str>>,
    body: Vec<u8>,
) -> (DataHeader, Vec<u8>) {
    match flotilla_replica::remote::serve(ep, body, model).await {
        Served::Ran(Ok(out)) => (DataHeader::Reply { call, error: None }, out),
        Served::Ran(Err(e)) => (
            DataHeader::Reply {
                call,
                error: Some(e),
            },
            Vec::new(),
        ),
        Served::Refused { full, request } => (DataHeader::Refused { call, full }, request),
    }
}

/// A streaming call: its items go to `from` as produced; returns its end.
async fn serve_stream(
    s: &Shared,
    ep: &Arc<ReplicaEndpoint>,
    call: u64,
    from: &str,
    model: Option<Arc<str>>,
    body: Vec<u8>,
) -> (DataHeader, Vec<u8>) {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let serving = flotilla_replica::remote::serve_stream(ep, body, model, tx);
    // The forwarder owns the receiver: when the caller cannot be sent to
    // (its session closed), it returns and the receiver goes with it, so
    // the replica's next item finds the stream closed and the handler
    // ends (freeing its slot) instead of waiting on a full channel for
    // a Cancel that will never come.
    let forward = async {
        let mut rx = rx;
        while let Some(item) = rx.recv().await {
            if s.send_data(from, &DataHeader::Item { call }, item).is_err() {
                return;
            }
        }
    };
    let (served, ()) = tokio::join!(serving, forward);
    match served {
        Served::Ran(r) => (
            DataHeader::End {
                call,
                error: r.err(),
            },
            Vec::new(),
        ),
        Served::Refused { full, request } => (DataHeader::Refused { call, full }, request),
    }
}

/// A process's link: its NodeServer, port, and everything they share.
pub(crate) struct Link {
    pub(crate) shared: Arc<Shared>,
    pub(crate) server: ActorRef<NodeServerMessage>,
    server_done: Mutex<Option<JoinHandle<()>>>,
    port: ActorRef<PortMsg>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("me", &self.shared.me).finish()
    }
}

/// Where a link listens.
pub(crate) enum Listen {
    /// Accept on this bound listener (the head: port 0 readable).
    Own(tokio::net::TcpListener),
    /// Only ractor_cluster's own listener, on this address and a system port
    /// (nodes: what the peers that [`dials`] picks dial).
    Server(IpAddr),
}

impl Link {
    /// Start a NodeServer named `name@host` with `cookie`, its port and its
    /// event subscription, for a process of `role`. Inbound control frames
    /// and session events come out of the returned receiver (but the head's
    /// port answers heartbeats itself). An inbound session that has not
    /// authenticated within `handshake` is closed ([`Handshakes`]).
    pub(crate) async fn start(
        name: &str,
        host: &str,
        cookie: &str,
        listen: Listen,
        handshake: std::time::Duration,
        role: Role,
    ) -> Result<(Link, mpsc::UnboundedReceiver<Inbound>), NodeError> {
        let (inbound, rx) = mpsc::unbounded_channel();
        let me = format!("{name}@{host}");
        let shared = Arc::new(Shared {
            me: me.clone(),
            calls: Calls::default(),
            serving: Mutex::default(),
            running: Mutex::default(),
            peers: Mutex::default(),
            sessions: Mutex::default(),
            stopped: Mutex::default(),
            heard: Mutex::default(),
            inbound,
            handshakes: Handshakes::new(me.clone(), handshake, matches!(listen, Listen::Own(_))),
            undecodable: AtomicU64::new(0),
            port: OnceLock::new(),
            secret: super::head::random_u64(),
            held: Mutex::default(),
            next_held: AtomicU64::new(0),
            answers_heartbeats: role == Role::Head,
        });
        let (port, _) = Actor::spawn(Some(port_name(&me)), Port, shared.clone())
            .await
            .map_err(|source| NodeError::Spawn {
                what: "node port",
                source,
            })?;
        let ip = match &listen {
            Listen::Own(l) => l
                .local_addr()
                .map(|a| a.ip())
                .map_err(|source| NodeError::Io {
                    what: "reading the listener's address",
                    source,
                })?,
            Listen::Server(ip) => *ip,
        };
        let server = NodeServer::new(
            0,
            cookie.to_owned(),
            name.to_owned(),
            host.to_owned(),
            None,
            // Isolated: ractor_cluster dials nobody by itself. Its
            // `Transitive` mode has both of two nodes that learn of each other
            // at once dial, and the session it then closes as a duplicate
            // takes the calls in flight on it along (`docs/nodes.md`).
            Some(NodeConnectionMode::Isolated),
        )
        .with_listen_addr(ip)
        .with_max_inbound_frame_size(MAX_FRAME);
        let (server, server_done) = match Actor::spawn(None, server, ()).await {
            Ok(s) => s,
            Err(source) => {
                port.stop(None);
                return Err(NodeError::Spawn {
                    what: "ractor_cluster NodeServer",
                    source,
                });
            }
        };
        let subscribed = server.cast(NodeServerMessage::SubscribeToEvents {
            id: "flotilla".to_owned(),
            subscription: Box::new(Events(shared.clone(), Mutex::default())),
        });
        let link = Link {
            shared,
            server,
            server_done: Mutex::new(Some(server_done)),
            port,
            tasks: Mutex::default(),
        };
        if subscribed.is_err() {
            link.stop().await;
            return Err(NodeError::Stopped {
                what: "ractor_cluster NodeServer",
            });
        }
        if let Listen::Own(listener) = listen {
            let server = link.server.clone();
            let me = me.clone();
            let handshakes = link.shared.handshakes.clone();
            let accept = tokio::spawn(async move {
                loop {
                    let (stream, peer_addr) = match listener.accept().await {
                        Ok(s) => s,
                        Err(e) => {
                            warn!(node = %me, error = %e, "node listener: accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    if !handshakes.admit(peer_addr.to_string()) {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let Ok(local_addr) = stream.local_addr() else {
                        continue;
                    };
                    let opened = NodeServerMessage::ConnectionOpened {
                        stream: Box::new(NetworkStream::Raw {
                            peer_addr,
                            local_addr,
                            stream,
                        }),
                        is_server: true,
                    };
                    if server.cast(opened).is_err() {
                        return;
                    }
                }
            });
            lock(&link.tasks).push(accept);
        }
        Ok((link, rx))
    }

    /// Dial `addr` (`host:port`; bounded by `timeout`: ractor_cluster's dial
    /// has none). `Ok` means connected: the handshake runs after.
    pub(crate) async fn dial(
        &self,
        addr: &str,
        timeout: std::time::Duration,
    ) -> Result<(), NodeError> {
        match tokio::time::timeout(timeout, ractor_cluster::client_connect(&self.server, addr))
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(NodeError::Connect {
                addr: addr.to_owned(),
                reason: e.into(),
            }),
            Err(_) => Err(NodeError::Connect {
                addr: addr.to_owned(),
                reason: ConnectFailure::TimedOut(timeout),
            }),
        }
    }

    /// Stop the NodeServer (every session drops) and the port, and wait for the
    /// server, so its listener is not respawned while the runtime winds down.
    pub(crate) async fn stop(&self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        self.server.stop(None);
        let done = lock(&self.server_done).take();
        if let Some(done) = done {
            let _ = done.await;
        }
        self.port.stop(None);
        let me = self.shared.me.clone();
        for peer in lock(&self.shared.sessions)
            .keys()
            .cloned()
            .collect::<Vec<_>>()
        {
            self.shared.calls.fail_peer(&peer);
        }
        debug!(node = %me, "link stopped");
    }

    /// Stop at once without waiting (a drop, a crash).
    pub(crate) fn kill(&self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        self.server.kill();
        self.port.kill();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use flotilla_core::{AppName, DeploymentName, DeploymentSpec, Faults, actor_names};
    use flotilla_replica::{
        Deployment, Directory, OnExit, Registry, ReplicaActor, ReplicaArgs, ReplicaEvent, UserError,
    };
    use futures::Stream;

    use super::*;

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
            Listen::Own(listener),
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
        let shared = Arc::new(Shared {
            me: "me@127.0.0.1".into(),
            calls: Calls::default(),
            serving: Mutex::default(),
            running: Mutex::default(),
            peers: Mutex::default(),
            sessions: Mutex::default(),
            stopped: Mutex::default(),
            heard: Mutex::default(),
            inbound,
            handshakes: Handshakes::new("me".into(), Duration::from_secs(5), false),
            undecodable: AtomicU64::new(0),
            port: OnceLock::new(),
            secret: 7,
            held: Mutex::default(),
            next_held: AtomicU64::new(0),
            answers_heartbeats: role == Role::Head,
        });
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
}
