//! Nodes: replicas in other processes, joined over ractor's own cluster layer,
//! `ractor_cluster` (`docs/nodes.md` is the design).
//!
//! - The head (the process that runs `Serve`) starts a [`Head`]: a
//!   ractor_cluster `NodeServer` behind its own listener (loopback by default,
//!   port 0 allowed), the registry of nodes (joins, cookie refusals,
//!   heartbeats, losses, re-attachment after a head restart), the route
//!   exporter, and [`NodeCluster`], the `Cluster` over the head and its nodes.
//! - A node process runs [`run`] (or [`start`]): its agent starts the replicas
//!   the head asks for (ractor_cluster cannot spawn remotely), reports their
//!   events, keeps a copy of every route for the handles its replicas hold,
//!   re-attaches to a restarted head, and fences itself (stops every replica
//!   and joins as a new node) when the head has declared it lost.
//! - On the head, each replica on a node is a [`RemoteReplica`]: a local actor
//!   with `ReplicaMsg`, which the DeploymentActor starts where
//!   [`Cluster::host`](crate::Cluster::host) says the node is remote, and then
//!   treats as any replica.
//! - Requests cross as the handle's MessagePack bytes, in one remotable
//!   message type (`wire::PortMsg`); replies come back the same way.
//!
//! It must not decide how many replicas run (the DeploymentActor does) and
//! must not block an actor: every network wait runs in a task.

mod account;
mod agent;
mod cookie;
mod export;
mod fenced;
mod handshake;
mod head;
mod link;
mod log_export;
mod node;
mod options;
mod proxy;
mod registry;
mod transport;
mod wire;

use std::{net::SocketAddr, sync::Arc};

use flotilla_supervision::AbortOnDrop;
use ractor::{ActorRef, Message};
use tokio::{sync::mpsc, task::JoinHandle};

pub use cookie::{Cookie, CookieError, CookieSource};
pub use head::{Head, NodeCluster, NodeCounters, NodeInfo, ReporterFactory};
pub use node::{Node, run, start};
pub use options::{
    ADOPT_TIMEOUT, CHECK_PERIOD, DEFAULT_HEAD_PORT, HANDSHAKE_TIMEOUT, HEARTBEAT,
    HEARTBEAT_TIMEOUT, HeadOptions, NodeOptions, OptionsError, REATTACH_GRACE,
};
pub use proxy::{RemoteReplica, RemoteReplicaArgs, RemoteReplicaState};

/// Why a head or a node could not run.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The options are not usable.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// An actor of the node machinery could not be spawned.
    #[error("could not start the {what}")]
    Spawn {
        /// Which.
        what: &'static str,
        /// Why.
        #[source]
        source: ractor::SpawnErr,
    },
    /// The head could not listen.
    #[error("the head could not listen on {addr}")]
    Bind {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another I/O failure.
    #[error("node I/O failed: {what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A dial failed: the head (from a node's agent) or a peer node.
    #[error("could not connect to {addr}: {reason}")]
    Connect {
        /// Where (`host:port`).
        addr: String,
        /// What failed.
        reason: ConnectFailure,
    },
    /// The head refused this node: the cookie handshake failed.
    #[error("the head at {addr} refused this node: {reason}")]
    Refused {
        /// The head.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// A part of the node machinery stopped.
    #[error("the {what} stopped")]
    Stopped {
        /// Which.
        what: &'static str,
    },
}

/// Why a dial failed ([`NodeError::Connect`]): ractor_cluster's
/// `ClientConnectErr`, whose messaging case cannot cross threads, as a value
/// that can, or the dial's own timeout.
#[derive(Debug, thiserror::Error)]
pub enum ConnectFailure {
    /// The connection could not be opened (refused, unreachable, a name that
    /// does not resolve).
    #[error("{0}")]
    Socket(std::io::Error),
    /// The encrypted session could not be set up.
    #[error("encryption failed: {0}")]
    Encryption(std::io::Error),
    /// This process's node server has stopped (it is shutting down).
    #[error("this process's node server has stopped")]
    ServerStopped,
    /// No connection within the dial's timeout.
    #[error("no connection within {0:?}")]
    TimedOut(std::time::Duration),
}

impl From<ractor_cluster::ClientConnectErr> for ConnectFailure {
    fn from(e: ractor_cluster::ClientConnectErr) -> Self {
        use ractor_cluster::ClientConnectErr as E;
        match e {
            E::Socket(io) => ConnectFailure::Socket(io),
            E::Encryption(io) => ConnectFailure::Encryption(io),
            E::Messaging(_) => ConnectFailure::ServerStopped,
        }
    }
}

/// A node a replica was placed on, as the head reaches it: what
/// [`Cluster::host`](crate::Cluster::host) gives the DeploymentActor, which
/// starts a [`RemoteReplica`] with it.
#[derive(Clone)]
pub struct RemoteHost {
    pub(crate) shared: Arc<head::HeadShared>,
    pub(crate) node: String,
}

impl RemoteHost {
    /// The node's id.
    pub fn node(&self) -> &str {
        &self.node
    }
}

impl std::fmt::Debug for RemoteHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteHost")
            .field("node", &self.node)
            .finish()
    }
}

/// Call `changed` after every change of local replica `ep`'s model ids, until
/// it returns false or the replica's cache is gone, in a task (in `span`)
/// that ends with the returned guard; `None` unless `ep` is multiplexed.
/// A node tells the head with it; the head re-exports a route with it.
pub(crate) fn on_model_changes(
    ep: &flotilla_replica::ReplicaEndpoint,
    span: tracing::Span,
    changed: impl Fn() -> bool + Send + 'static,
) -> Option<AbortOnDrop<()>> {
    let mut ids = ep.watch_models()?;
    let watcher = async move {
        while ids.changed().await.is_ok() {
            if !changed() {
                return;
            }
        }
    };
    Some(AbortOnDrop::new(tokio::spawn(
        tracing::Instrument::instrument(watcher, span),
    )))
}

/// Forward what the link receives into `actor`'s mailbox.
fn forward<M: Message>(
    mut rx: mpsc::UnboundedReceiver<link::Inbound>,
    actor: ActorRef<M>,
    wrap: fn(link::Inbound) -> M,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(x) = rx.recv().await {
            if actor.cast(wrap(x)).is_err() {
                return;
            }
        }
    })
}
