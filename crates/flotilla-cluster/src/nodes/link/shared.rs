//! What a process's port, transport and owner share: its sessions to peers,
//! when each was last heard, and the replicas it serves; and the
//! ractor_cluster subscription that reports sessions opening and closing.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use flotilla_replica::{ReplicaEndpoint, ReplicaId};
use ractor::{ActorRef, ActorStatus, MessagingErr, pg};
use ractor_cluster::{
    NodeEventSubscription, NodeSessionMessage, node::NodeServerSessionInformation,
};
use tokio::{sync::mpsc, time::Instant};
use tracing::{info, warn};

use super::{Calls, Inbound, PORTS, Role, SessionEnd, SessionEvent, lock, port_name};

use crate::nodes::{
    handshake::Handshakes,
    wire::{self, DataHeader, Envelope, PortMsg},
};

/// What a process shares between its port, its transport and its owner.
pub(crate) struct Shared {
    /// This process's ractor name (`name@host`).
    pub(crate) me: String,
    pub(crate) calls: Calls,
    /// Local replicas other processes may call, by id.
    pub(super) serving: Mutex<HashMap<ReplicaId, Arc<ReplicaEndpoint>>>,
    /// Calls running here for other processes, by caller and call id, for
    /// `Cancel`.
    pub(super) running: Mutex<HashMap<(String, u64), tokio::task::AbortHandle>>,
    /// Peer ports found so far, by ractor name.
    pub(super) peers: Mutex<HashMap<String, ActorRef<PortMsg>>>,
    /// Authenticated sessions, by peer ractor name. One per peer: of two
    /// nodes only one dials the other ([`dials`]), so ractor_cluster never
    /// has two to elect between. A second one (a peer that dials against the
    /// rule) is kept until ractor_cluster closes the loser.
    pub(super) sessions: Mutex<HashMap<String, Vec<ActorRef<NodeSessionMessage>>>>,
    /// Sessions this process stopped itself ([`stop_sessions`](Self::stop_sessions)),
    /// whose close is still to come: their calls were failed at the stop,
    /// so their close only passes on (it must not touch a newer session's).
    pub(super) stopped: Mutex<HashSet<ractor::ActorId>>,
    /// When each peer with a session was last heard: its session's start,
    /// then any frame of its (stamped by the port). Taken after `sessions`
    /// when both are held. What [`drop_silent`](Self::drop_silent) judges.
    pub(super) heard: Mutex<HashMap<String, Instant>>,
    pub(super) inbound: mpsc::UnboundedSender<Inbound>,
    /// Deadlines and slots of sessions not yet authenticated.
    pub(super) handshakes: Arc<Handshakes>,
    /// Frames that did not decode.
    pub(crate) undecodable: AtomicU64,
    /// This process's port, once it runs.
    pub(super) port: OnceLock<ActorRef<PortMsg>>,
    /// What proves a [`PortMsg::Closed`] came from this process.
    pub(super) secret: u64,
    /// Session events held until the port passes them on
    /// ([`pass_on`](Self::pass_on)), by number.
    pub(super) held: Mutex<HashMap<u64, SessionEvent>>,
    pub(super) next_held: AtomicU64,
    /// This process is the head: its port answers each node's heartbeat
    /// itself, whatever its owner (the registry) is busy with.
    pub(super) answers_heartbeats: bool,
}

impl Shared {
    /// The state of the process called `me` (`name@host`), before any
    /// session: what it passes on goes to `inbound`; `secret` proves a
    /// `Closed` mark is its own; a head's (`role`) port answers heartbeats.
    pub(super) fn new(
        me: String,
        inbound: mpsc::UnboundedSender<Inbound>,
        handshakes: Arc<Handshakes>,
        secret: u64,
        role: Role,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            me,
            calls: Calls::default(),
            serving: Mutex::default(),
            running: Mutex::default(),
            peers: Mutex::default(),
            sessions: Mutex::default(),
            stopped: Mutex::default(),
            heard: Mutex::default(),
            inbound,
            handshakes,
            undecodable: AtomicU64::new(0),
            port: OnceLock::new(),
            secret,
            held: Mutex::default(),
            next_held: AtomicU64::new(0),
            answers_heartbeats: role == Role::Head,
        })
    }

    /// Serve `ep` to other processes.
    pub(crate) fn serve(&self, ep: Arc<ReplicaEndpoint>) {
        lock(&self.serving).insert(ep.id(), ep);
    }

    /// Stop serving replica `id`.
    pub(crate) fn unserve(&self, id: ReplicaId) {
        lock(&self.serving).remove(&id);
    }

    /// Stop every call running here for `peer`; how many there were.
    pub(super) fn abandon_calls_from(&self, peer: &str) -> usize {
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
    pub(super) fn mark(&self, peer: &str, abandon: bool, event: Option<SessionEvent>) {
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
    pub(super) fn pass_on(&self, event: SessionEvent) {
        self.mark("", false, Some(event));
    }

    /// Pass on every event still held (the port stopped before it reached
    /// their marks).
    pub(super) fn pass_on_held(&self) {
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
    pub(super) fn port_of(&self, peer: &str) -> Option<ActorRef<PortMsg>> {
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
    pub(super) fn stop_sessions(
        &self,
        peer: &str,
        all: Vec<ActorRef<NodeSessionMessage>>,
        why: &str,
    ) {
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
    pub(super) fn session_ended(&self, peer: &str, failed: usize, event: Option<SessionEvent>) {
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

    /// Called at each silence check, which comes every
    /// [`CHECK_PERIOD`](crate::nodes::CHECK_PERIOD) after `last_check`: when
    /// it came half the silence `timeout` late or more, returns how much
    /// later than its period it came, and counts every peer as heard that
    /// much later. So late a check means this process did not run (a
    /// stopped process, a paused VM, swapping) or its checker was held up,
    /// and nothing it did not hear meanwhile is the peers' silence: without
    /// this, a head stopped for longer than the timeout declared every node
    /// lost (and had them stop their replicas) when it resumed. A peer that
    /// died meanwhile is found one timeout after the resumption. A check
    /// less late excuses nothing: a checker slowed by load does not slow
    /// the finding of a dead peer down with it.
    pub(crate) fn excuse_stall(
        &self,
        last_check: &mut Instant,
        timeout: std::time::Duration,
    ) -> std::time::Duration {
        let now = Instant::now();
        let gap = now.duration_since(*last_check);
        *last_check = now;
        let lost = if gap >= timeout / 2 {
            gap.saturating_sub(crate::nodes::CHECK_PERIOD)
        } else {
            std::time::Duration::ZERO
        };
        if !lost.is_zero() {
            for at in lock(&self.heard).values_mut() {
                *at = (*at + lost).min(now);
            }
        }
        lost
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

    pub(super) fn on_session(
        &self,
        event: SessionEvent,
        session: Option<ActorRef<NodeSessionMessage>>,
    ) {
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
pub(super) struct Events(
    pub(super) Arc<Shared>,
    pub(super) Mutex<HashSet<ractor_cluster::NodeId>>,
);

pub(super) fn peer_of(ses: &NodeServerSessionInformation) -> Option<String> {
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
