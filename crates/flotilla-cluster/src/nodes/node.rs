//! A node process: [`run`] or [`start`]. Each incarnation has its own node id,
//! NodeServer and agent; a fenced incarnation is followed by a new one.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use flotilla_replica::Registry;
use ractor::Actor;
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};
use tracing::{info, warn};

use super::{
    NodeError, NodeOptions,
    agent::{Agent, AgentArgs, AgentMsg, Ending},
    head::random_suffix,
    link::{Link, Role},
};

/// How long [`Node::shutdown`] waits for the replicas to drain.
const DRAIN: Duration = Duration::from_secs(30);

/// A running node process (see [`start`]).
#[derive(Debug)]
pub struct Node {
    id: watch::Receiver<String>,
    live: watch::Receiver<usize>,
    stop: watch::Sender<bool>,
    commands: mpsc::UnboundedSender<Command>,
    task: JoinHandle<Result<(), NodeError>>,
}

/// What a [`Node`]'s owner asks of its current incarnation.
#[derive(Debug)]
enum Command {
    /// Close the session to the node with this id; answer whether there was one.
    DropPeer {
        node: String,
        done: oneshot::Sender<bool>,
    },
}

impl Node {
    /// The node id of the current incarnation (a new one after every fencing).
    pub fn id(&self) -> String {
        self.id.borrow().clone()
    }

    /// Watch the node id change.
    pub fn watch_id(&self) -> watch::Receiver<String> {
        self.id.clone()
    }

    /// Replicas running on this node now.
    pub fn replicas(&self) -> usize {
        *self.live.borrow()
    }

    /// Watch how many replicas run on this node.
    pub fn watch_replicas(&self) -> watch::Receiver<usize> {
        self.live.clone()
    }

    /// Wait until the node ends: `Ok` after [`shutdown`](Self::shutdown), the
    /// error if the head refused it (a wrong cookie) or it could not run.
    pub async fn wait(self) -> Result<(), NodeError> {
        self.task
            .await
            .unwrap_or(Err(NodeError::Stopped { what: "node task" }))
    }

    /// Close this node's session to the node whose id is `node` (fault
    /// injection, as the head's `drop_node_connection`): calls in flight on it
    /// fail as lost, and of the two nodes the one whose name sorts last dials
    /// the other again on its next tick (`docs/nodes.md`). `false` if there was
    /// no such session, or the node has ended.
    pub async fn drop_peer_session(&self, node: &str) -> bool {
        let (done, answer) = oneshot::channel();
        let asked = self.commands.send(Command::DropPeer {
            node: node.to_owned(),
            done,
        });
        asked.is_ok() && answer.await.unwrap_or(false)
    }

    /// Stop every replica gracefully (at most 30 s), leave the cluster, end.
    pub async fn shutdown(self) -> Result<(), NodeError> {
        let _ = self.stop.send(true);
        self.wait().await
    }
}

/// Start a node process in the background: it joins the head at
/// `options.head` and runs the replicas the head places on it, with the code
/// of `registry` (the same registry as the head's, so every import path
/// resolves the same). It dials again while the head is unreachable or
/// restarting.
///
/// ```no_run
/// # async fn demo(registry: flotilla_replica::Registry) -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla_cluster::nodes::{Cookie, NodeOptions};
/// let options = NodeOptions::new("127.0.0.1:4697".parse()?, Cookie::from_env("FLOTILLA_COOKIE")?);
/// let node = flotilla_cluster::nodes::start(registry, options).await?;
/// println!("node {} running", node.id());
/// node.shutdown().await?;
/// # Ok(()) }
/// ```
pub async fn start(registry: Registry, options: NodeOptions) -> Result<Node, NodeError> {
    options.validate()?;
    let (id_tx, id) = watch::channel(String::new());
    let (live_tx, live) = watch::channel(0);
    let (stop, stop_rx) = watch::channel(false);
    let (commands, commands_rx) = mpsc::unbounded_channel();
    // The first incarnation starts here, so a bad option fails `start`.
    let first = Incarnation::start(&registry, &options, None, live_tx.clone()).await?;
    id_tx.send_replace(first.id.clone());
    let task = tokio::spawn(incarnations(
        registry,
        options,
        first,
        (id_tx, live_tx),
        stop_rx,
        commands_rx,
    ));
    Ok(Node {
        id,
        live,
        stop,
        commands,
        task,
    })
}

/// Run a node process until it is refused or interrupted (Ctrl-C: its replicas
/// drain, then it leaves). See [`start`].
pub async fn run(registry: Registry, options: NodeOptions) -> Result<(), NodeError> {
    let node = start(registry, options).await?;
    let mut id = node.watch_id();
    let stop = node.stop.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = stop.send(true);
        }
    });
    let _ = id.borrow_and_update();
    node.wait().await
}

struct Incarnation {
    id: String,
    link: Arc<Link>,
    agent: ractor::ActorRef<AgentMsg>,
    ending: oneshot::Receiver<Ending>,
    forward: JoinHandle<()>,
}

impl Incarnation {
    async fn start(
        registry: &Registry,
        options: &NodeOptions,
        last_head: Option<u64>,
        live: watch::Sender<usize>,
    ) -> Result<Incarnation, NodeError> {
        let id = format!("{}-{}", options.name, random_suffix());
        let name = peer_name(&id);
        // What other nodes dial: its ractor name's host, which ractor_cluster
        // sends each peer with its port.
        let host = options
            .advertised()
            .map_err(|source| NodeError::Io {
                what: "finding the address this node reaches its head from",
                source,
            })?
            .to_string();
        let at = SocketAddr::new(options.listen, options.listen_port);
        let listener = tokio::net::TcpListener::bind(at)
            .await
            .map_err(|source| NodeError::Bind { addr: at, source })?;
        let (link, inbound) = Link::start(
            &name,
            &host,
            options.cookie.secret(),
            listener,
            options.handshake_timeout,
            Role::Node,
        )
        .await?;
        let link = Arc::new(link);
        let (tx, ending) = oneshot::channel();
        let args = AgentArgs {
            id: id.clone(),
            options: options.clone(),
            registry: registry.clone(),
            link: link.clone(),
            last_head,
            ending: Some(tx),
            live,
        };
        let (agent, _) = match Actor::spawn(None, Agent, args).await {
            Ok(a) => a,
            Err(source) => {
                link.stop().await;
                return Err(NodeError::Spawn {
                    what: "node agent",
                    source,
                });
            }
        };
        let forward = super::forward(inbound, agent.clone(), AgentMsg::Inbound);
        info!(node = %id, head = %options.head, "node starting");
        Ok(Incarnation {
            id,
            link,
            agent,
            ending,
            forward,
        })
    }

    fn command(&self, command: Command) {
        match command {
            Command::DropPeer { node, done } => {
                // A session's peer is `<ractor name>@<host>`.
                let name = peer_name(&node);
                let shared = &self.link.shared;
                let mut dropped = false;
                for peer in shared.connected() {
                    if peer.split('@').next() == Some(name.as_str()) {
                        dropped |= shared.drop_session(&peer, "asked to drop the session");
                    }
                }
                let _ = done.send(dropped);
            }
        }
    }

    async fn stop(self) {
        self.forward.abort();
        self.agent.stop(None);
        self.link.stop().await;
    }
}

/// The ractor name of the node process whose node id is `id`.
fn peer_name(id: &str) -> String {
    format!("flotilla-node-{id}")
}

async fn incarnations(
    registry: Registry,
    options: NodeOptions,
    mut current: Incarnation,
    (id, live): (watch::Sender<String>, watch::Sender<usize>),
    mut stop: watch::Receiver<bool>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) -> Result<(), NodeError> {
    loop {
        let ending = loop {
            tokio::select! {
                e = &mut current.ending => break e.unwrap_or(Ending::Stopped),
                Some(command) = commands.recv() => current.command(command),
                _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
                    let _ = current.agent.cast(AgentMsg::Shutdown);
                    let drained = tokio::time::timeout(DRAIN, &mut current.ending).await;
                    if drained.is_err() {
                        warn!(node = %current.id, "replicas did not drain in {DRAIN:?}: leaving");
                    }
                    break Ending::Stopped;
                }
            }
        };
        match ending {
            Ending::Stopped => {
                info!(node = %current.id, "node stopped");
                current.stop().await;
                return Ok(());
            }
            Ending::Refused(reason) => {
                current.stop().await;
                return Err(NodeError::Refused {
                    addr: options.head,
                    reason,
                });
            }
            Ending::Fenced(reason) => {
                let old = current.id.clone();
                current.stop().await;
                let next = Incarnation::start(&registry, &options, None, live.clone()).await?;
                info!(old = %old, new = %next.id, %reason, "node fenced: joining as a new node");
                id.send_replace(next.id.clone());
                current = next;
            }
        }
    }
}
