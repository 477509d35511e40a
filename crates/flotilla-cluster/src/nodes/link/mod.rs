//! One process's place in the cluster: its ractor_cluster `NodeServer`, its
//! port (the one remotable actor, [`port`]), the sessions to its peers
//! ([`shared`]), the calls it is waiting on ([`calls`]), and the local
//! replicas it serves to other processes.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ractor::{Actor, ActorRef};
use ractor_cluster::{NodeServer, NodeServerMessage, node::NodeConnectionMode};
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{debug, warn};

use super::{
    ConnectFailure, NodeError,
    handshake::Handshakes,
    wire::{Envelope, PortMsg},
};

mod calls;
mod port;
mod preauth;
mod shared;
#[cfg(test)]
pub(crate) mod tests;

pub(crate) use calls::{Calls, Outcome, Piece};
use port::Port;
use preauth::PreAuthStream;
use shared::Events;
pub(crate) use shared::Shared;

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

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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

/// A process's link: its NodeServer, port, and everything they share.
pub(crate) struct Link {
    pub(crate) shared: Arc<Shared>,
    pub(crate) server: ActorRef<NodeServerMessage>,
    /// The port of this process's listener: what its peers dial.
    listen_port: u16,
    server_done: Mutex<Option<JoinHandle<()>>>,
    port: ActorRef<PortMsg>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("me", &self.shared.me).finish()
    }
}

impl Link {
    /// Start a NodeServer named `name@host` with `cookie`, its port and its
    /// event subscription, for a process of `role`, accepting peers on
    /// `listener`. Inbound control frames and session events come out of the
    /// returned receiver (but the head's port answers heartbeats itself). An
    /// inbound session that has not authenticated within `handshake` is
    /// closed, and what it may send first is bounded ([`Handshakes`]).
    ///
    /// The NodeServer tells peers `host` and `listener`'s port as where this
    /// process listens. Its own listener, which ractor_cluster always runs,
    /// binds an ephemeral port on loopback: every peer is accepted here, where
    /// each connection gets a slot and a read budget before ractor_cluster
    /// sees it.
    pub(crate) async fn start(
        name: &str,
        host: &str,
        cookie: &str,
        listener: tokio::net::TcpListener,
        handshake: std::time::Duration,
        role: Role,
    ) -> Result<(Link, mpsc::UnboundedReceiver<Inbound>), NodeError> {
        let (inbound, rx) = mpsc::unbounded_channel();
        let me = format!("{name}@{host}");
        let handshakes = Handshakes::new(me.clone(), handshake);
        let secret = super::head::random_u64();
        let shared = Shared::new(me.clone(), inbound, handshakes, secret, role);
        let (port, _) = Actor::spawn(Some(port_name(&me)), Port, shared.clone())
            .await
            .map_err(|source| NodeError::Spawn {
                what: "node port",
                source,
            })?;
        let listen_addr = listener.local_addr().map_err(|source| NodeError::Io {
            what: "reading the listener's address",
            source,
        })?;
        let listen_port = listen_addr.port();
        // ractor_cluster's listener, on IPv4 loopback whatever the listener's
        // family: `::1` is missing where IPv6 is off on `lo` (containers).
        let loopback: std::net::IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
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
        .with_listen_addr(loopback)
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
        // What peers are told to dial: `host` and this listener's port, not
        // the loopback port ractor_cluster's listener reported as it started
        // (already in the NodeServer's mailbox, so this comes after it). Told
        // again before every accept and dial (`advertise`): ractor_cluster
        // respawns a failed listener, which reports its new port.
        let told = advertise(&server, listen_port);
        let subscribed = server.cast(NodeServerMessage::SubscribeToEvents {
            id: "flotilla".to_owned(),
            subscription: Box::new(Events(shared.clone(), Mutex::default())),
        });
        let link = Link {
            shared,
            server,
            listen_port,
            server_done: Mutex::new(Some(server_done)),
            port,
            tasks: Mutex::default(),
        };
        if !told || subscribed.is_err() {
            link.stop().await;
            return Err(NodeError::Stopped {
                what: "ractor_cluster NodeServer",
            });
        }
        let accept = tokio::spawn(accept(
            listener,
            listen_port,
            link.server.clone(),
            me,
            link.shared.handshakes.clone(),
        ));
        lock(&link.tasks).push(accept);
        Ok((link, rx))
    }

    /// Dial `addr` (`host:port`; bounded by `timeout`: ractor_cluster's dial
    /// has none). `Ok` means connected: the handshake runs after.
    pub(crate) async fn dial(
        &self,
        addr: &str,
        timeout: std::time::Duration,
    ) -> Result<(), NodeError> {
        advertise(&self.server, self.listen_port);
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
        let tasks: Vec<_> = lock(&self.tasks).drain(..).collect();
        for t in tasks {
            t.abort();
            // Ended, so the listener is closed: a new incarnation may bind
            // its port at once.
            let _ = t.await;
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

/// Accept peers on `listener` for `server` until it stops: each connection
/// takes a handshake slot and reaches ractor_cluster with its read budget
/// ([`Handshakes::admit`]).
async fn accept(
    listener: tokio::net::TcpListener,
    listen_port: u16,
    server: ActorRef<NodeServerMessage>,
    me: String,
    handshakes: Arc<Handshakes>,
) {
    loop {
        let (stream, peer_addr) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(node = %me, error = %e, "node listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(open) = handshakes.admit(peer_addr.to_string()) else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok(local_addr) = stream.local_addr() else {
            continue;
        };
        advertise(&server, listen_port);
        let opened = NodeServerMessage::ConnectionOpenedExternal {
            stream: Box::new(PreAuthStream::new(stream, peer_addr, local_addr, open)),
            is_server: true,
        };
        if server.cast(opened).is_err() {
            return;
        }
    }
}

/// Tell `server` to advertise `port` (the process's own listener) in the name
/// it sends each new peer; false if it has stopped.
fn advertise(server: &ActorRef<NodeServerMessage>, port: u16) -> bool {
    server.cast(NodeServerMessage::PortChanged { port }).is_ok()
}
