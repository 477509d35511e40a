//! The head's side: [`NodeCluster`] (the `Cluster` over the head and every
//! joined node) and [`Head`] (its link, registry and route exporter).

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use flotilla_core::{AppName, DeploymentName, Resources};
use flotilla_replica::{DeploymentRoute, Directory, LogSettings, ReplicaId, ReplicaReporter};
use ractor::{Actor, ActorRef};
use tokio::{
    sync::{Notify, broadcast, mpsc, watch},
    task::JoinHandle,
};
use tracing::info;

use super::{
    HeadOptions, NodeError,
    link::{Link, Role},
    proxy::ProxyReport,
    registry::{Registry, RegistryMsg},
};
use crate::{
    Cluster, ClusterEvent, DeploymentKey, NodeId, NodePool, NodeSpec, PlacementRequest, Refusal,
};

/// Events a slow subscriber may fall behind by before it resynchronises.
const EVENT_BUFFER: usize = 1024;

/// How a head's ractor name begins (then its namespace and epoch): a node
/// tells its head's session from its peers' by it.
pub(crate) const HEAD_NAME_PREFIX: &str = "flotilla-head-";

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes the reporter of a replica of `app`/`deployment` under namespace `ns`
/// (how a proxy made for a re-attached replica reaches its DeploymentActor).
pub type ReporterFactory =
    Arc<dyn Fn(&str, &AppName, &DeploymentName) -> ReplicaReporter + Send + Sync>;

/// One node the head knows, as [`Head::nodes`] lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// Its node id.
    pub id: String,
    /// Its process's ractor name (`name@host`).
    pub peer: String,
    /// The address its connection came from.
    pub address: String,
    /// Where its own listener is (`host:port`, what other nodes dial), as it
    /// advertised it; empty until its session is ready.
    pub listen: String,
    /// What it offers.
    pub resources: Resources,
    /// Its labels.
    pub labels: Vec<(String, String)>,
    /// Whether it is alive (a lost node stays listed, never comes back).
    pub alive: bool,
    /// Whether it is shutting down: alive, its replicas draining, nothing new
    /// placed on it.
    pub leaving: bool,
    /// Replicas placed on it now.
    pub replicas: usize,
}

/// Counters of the nodes a head has seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCounters {
    /// Nodes accepted (a node re-attaching to a restarted head counts).
    pub joined: u64,
    /// Nodes declared lost (gone without shutting down).
    pub lost: u64,
    /// Nodes that shut down: said they were leaving, then closed their session.
    pub left: u64,
    /// Connections refused (a failed cookie handshake, a fenced node).
    pub refused: u64,
    /// Nodes alive now.
    pub live: usize,
    /// Replicas placed on nodes now (not on the head).
    pub replicas_on_nodes: usize,
    /// Replicas that were on nodes when those were declared lost (each
    /// replaced by its DeploymentActor).
    pub replicas_lost: u64,
}

/// One joined node, as the registry keeps it.
#[derive(Debug)]
pub(crate) struct NodeEntry {
    pub(crate) peer: String,
    pub(crate) address: String,
    pub(crate) listen: String,
    pub(crate) resources: Resources,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) alive: bool,
    pub(crate) last_heard: tokio::time::Instant,
}

/// Route export bookkeeping (see `export.rs`).
#[derive(Default)]
pub(crate) struct Export {
    /// Every route published so far, for a joining node's full copy.
    pub(crate) known: HashMap<(AppName, DeploymentName), Arc<DeploymentRoute>>,
    /// Routes changed since the exporter last ran.
    pub(crate) dirty: HashSet<(AppName, DeploymentName)>,
    /// Head-local replicas served to nodes, per route.
    pub(crate) served: HashMap<(AppName, DeploymentName), Vec<ReplicaId>>,
    /// The watchers of served multiplexed replicas' model ids.
    pub(crate) watched: HashMap<ReplicaId, flotilla_supervision::AbortOnDrop<()>>,
    /// The deployments the Controller recovered and that have not closed
    /// since; `None` until it has recovered. With `known`, every live route:
    /// what a node's copy is pruned to.
    pub(crate) recovered: Option<HashSet<(AppName, DeploymentName)>>,
}

/// What the head's parts share.
pub(crate) struct HeadShared {
    pub(crate) options: HeadOptions,
    pub(crate) ns: String,
    /// Random per head process life: a node re-attaching with another epoch
    /// re-attaches to a restarted head.
    pub(crate) epoch: u64,
    pub(crate) link: Arc<Link>,
    pub(crate) directory: Directory,
    pub(crate) reporter: ReporterFactory,
    /// The Serve instance's logging settings, which the nodes are sent.
    pub(crate) logging: LogSettings,
    pool: Mutex<NodePool>,
    events: broadcast::Sender<ClusterEvent>,
    /// Joined nodes by node id, and the ids declared lost this epoch.
    pub(crate) nodes: Mutex<HashMap<String, NodeEntry>>,
    pub(crate) lost: Mutex<HashSet<String>>,
    /// Proxies of replicas on nodes: their node and where their reports go.
    pub(crate) proxies: Mutex<HashMap<ReplicaId, (String, mpsc::UnboundedSender<ProxyReport>)>>,
    pub(crate) export: Mutex<Export>,
    /// Held while route entries are read and sent to nodes (a full copy, or
    /// the exporter's changes), so that they reach a node in the order they
    /// were read; `export` itself is held only to read them, so publishing
    /// DeploymentActors never wait on the encoding.
    pub(crate) export_send: Mutex<()>,
    pub(crate) export_wake: Notify,
    pub(crate) joined: AtomicU64,
    pub(crate) lost_count: AtomicU64,
    pub(crate) left_count: AtomicU64,
    /// Replicas on nodes declared lost, when they were.
    pub(crate) replicas_lost: AtomicU64,
    /// Connections refused (a failed cookie handshake, a fenced node).
    pub(crate) refused: super::handshake::Sparse,
    /// `Nodes` broadcasts sent (each changes that come at once share one).
    pub(crate) nodes_broadcasts: AtomicU64,
    /// (a node re-attached, node ids still expected back).
    pub(crate) reattach: watch::Sender<(bool, usize)>,
}

impl HeadShared {
    pub(crate) fn pool(&self) -> MutexGuard<'_, NodePool> {
        lock(&self.pool)
    }

    pub(crate) fn announce(&self, event: ClusterEvent) {
        let _ = self.events.send(event);
    }

    /// Give back what `replica` reserved, and announce the room if it held any.
    pub(crate) fn release(&self, replica: ReplicaId) {
        if self.pool().release(replica) {
            self.announce(ClusterEvent::CapacityFreed);
        }
    }

    /// The ractor name of node `id`'s process, if it joined.
    pub(crate) fn peer_of(&self, id: &str) -> Option<String> {
        lock(&self.nodes).get(id).map(|n| n.peer.clone())
    }

    /// Whether node `id` joined and was not declared lost (or left).
    pub(crate) fn node_alive(&self, id: &str) -> bool {
        lock(&self.nodes).get(id).is_some_and(|n| n.alive)
    }

    /// Whether any node is alive (routes are exported only then).
    pub(crate) fn any_alive(&self) -> bool {
        lock(&self.nodes).values().any(|n| n.alive)
    }

    /// Node ids and peers of the live nodes.
    pub(crate) fn alive(&self) -> Vec<(String, String)> {
        lock(&self.nodes)
            .iter()
            .filter(|(_, n)| n.alive)
            .map(|(id, n)| (id.clone(), n.peer.clone()))
            .collect()
    }
}

/// The `Cluster` over the head and every node joined to it: placement by
/// resources on a [`NodePool`] (spread, or packed with [`HeadOptions::pack`]),
/// with `max_replicas_per_node` and placement groups as the pool applies them;
/// a join announces [`ClusterEvent::CapacityFreed`], a lost node
/// [`ClusterEvent::NodeDied`]. Made by [`Head::start`].
#[derive(Clone)]
pub struct NodeCluster {
    shared: Arc<HeadShared>,
}

impl std::fmt::Debug for NodeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCluster")
            .field("head", &self.shared.options.node_id)
            .finish()
    }
}

impl Cluster for NodeCluster {
    fn place(&self, request: &PlacementRequest<'_>) -> Result<NodeId, Refusal> {
        let mut pool = self.shared.pool();
        if self.shared.options.pack {
            // The node that runs the most replicas first: fill nodes one by one.
            pool.place(request, |i, n, _| (std::cmp::Reverse(n.replicas()), i))
        } else {
            pool.place(request, |i, n, key| (n.replicas_of(key), n.replicas(), i))
        }
    }

    fn release(&self, replica: ReplicaId) {
        self.shared.release(replica);
    }

    fn subscribe(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.shared.events.subscribe())
    }

    fn is_alive(&self, node: &str) -> bool {
        self.shared.pool().is_alive(node)
    }

    fn host(&self, node: &str) -> Option<super::RemoteHost> {
        (node != self.shared.options.node_id).then(|| super::RemoteHost {
            shared: self.shared.clone(),
            node: node.to_owned(),
        })
    }

    fn route_changed(&self, route: &Arc<DeploymentRoute>) {
        super::export::changed(&self.shared, route);
    }

    fn deployments_recovered(&self, live: &mut dyn Iterator<Item = DeploymentKey>) {
        super::export::recovered(&self.shared, live.collect());
    }
}

/// The head's node machinery: its link (ractor_cluster `NodeServer`, listener,
/// port), the registry of nodes, the route exporter, and the [`NodeCluster`].
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use flotilla_cluster::nodes::{Cookie, Head, HeadOptions};
/// let options = HeadOptions::new(Cookie::from_env("FLOTILLA_COOKIE")?);
/// let reporter = Arc::new(|_: &str, _: &_, _: &_| -> flotilla_replica::ReplicaReporter {
///     Arc::new(|_, _| {})
/// });
/// let logging = flotilla_replica::LogSettings::new();
/// let head = Head::start(options, "ns".into(), Default::default(), reporter, logging).await?;
/// println!("nodes join at {}", head.address());
/// head.stop().await;
/// # Ok(()) }
/// ```
pub struct Head {
    pub(crate) shared: Arc<HeadShared>,
    address: SocketAddr,
    pub(crate) registry: ActorRef<RegistryMsg>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Head")
            .field("address", &self.address)
            .field("epoch", &self.shared.epoch)
            .finish()
    }
}

pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

pub(crate) fn random_suffix() -> String {
    format!("{:06x}", random_u64() & 0xff_ffff)
}

impl Head {
    /// Listen for nodes as `options` say, for the Serve instance of namespace
    /// `ns` whose routes are `directory` and whose logging settings are
    /// `logging` (sent to every node, whose replicas log by them). Seeds
    /// [`ReplicaId::fresh`] from the clock, so ids stay unique across
    /// restarts of the head.
    pub async fn start(
        options: HeadOptions,
        ns: String,
        directory: Directory,
        reporter: ReporterFactory,
        logging: LogSettings,
    ) -> Result<Head, NodeError> {
        options.validate()?;
        let millis = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        ReplicaId::seed(millis << 16);
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|source| NodeError::Bind {
                addr: options.listen,
                source,
            })?;
        let address = listener.local_addr().map_err(|source| NodeError::Io {
            what: "reading the listener's address",
            source,
        })?;
        let epoch = random_u64();
        let name = format!("{HEAD_NAME_PREFIX}{ns}-{:08x}", epoch as u32);
        let host = address.ip().to_string();
        let (link, inbound) = Link::start(
            &name,
            &host,
            options.cookie.secret(),
            listener,
            options.handshake_timeout,
            Role::Head,
        )
        .await?;
        let link = Arc::new(link);
        let pool = NodePool::new([NodeSpec::new(
            options.node_id.clone(),
            options.resources.clone(),
        )]);
        let shared = Arc::new(HeadShared {
            options,
            ns,
            epoch,
            link: link.clone(),
            directory,
            reporter,
            logging,
            pool: Mutex::new(pool),
            events: broadcast::Sender::new(EVENT_BUFFER),
            nodes: Mutex::default(),
            lost: Mutex::default(),
            proxies: Mutex::default(),
            export: Mutex::default(),
            export_send: Mutex::default(),
            export_wake: Notify::new(),
            joined: AtomicU64::new(0),
            lost_count: AtomicU64::new(0),
            left_count: AtomicU64::new(0),
            replicas_lost: AtomicU64::new(0),
            refused: Default::default(),
            nodes_broadcasts: AtomicU64::new(0),
            reattach: watch::Sender::new((false, 0)),
        });
        let (registry, _) = match Actor::spawn(None, Registry, shared.clone()).await {
            Ok(r) => r,
            Err(source) => {
                link.stop().await;
                return Err(NodeError::Spawn {
                    what: "node registry",
                    source,
                });
            }
        };
        let forward = super::forward(inbound, registry.clone(), RegistryMsg::Inbound);
        let exporter = tokio::spawn(super::export::run(shared.clone()));
        let log_exporter = tokio::spawn(super::log_export::run(shared.clone()));
        info!(node = %shared.options.node_id, %address, peer = %link.shared.me,
            "head listening for nodes");
        Ok(Head {
            shared,
            address,
            registry,
            tasks: vec![forward, exporter, log_exporter],
        })
    }

    /// The head's own node id ([`HeadOptions::node_id`](super::HeadOptions::node_id)):
    /// the node its own replicas run on.
    pub fn node_id(&self) -> &str {
        &self.shared.options.node_id
    }

    /// Where nodes connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The cluster over the head and its nodes, for the DeploymentActors.
    pub fn cluster(&self) -> Arc<dyn Cluster> {
        Arc::new(NodeCluster {
            shared: self.shared.clone(),
        })
    }

    /// Every node the head knows, alive or lost (the most recent
    /// `DEAD_NODES_KEPT` of those, 1,000), sorted by id.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let pool = self.shared.pool();
        let mut out: Vec<NodeInfo> = lock(&self.shared.nodes)
            .iter()
            .map(|(id, n)| NodeInfo {
                id: id.clone(),
                peer: n.peer.clone(),
                address: n.address.clone(),
                listen: n.listen.clone(),
                resources: n.resources.clone(),
                labels: n.labels.clone(),
                alive: n.alive,
                leaving: n.alive && pool.node(id).is_some_and(crate::PoolNode::is_draining),
                replicas: if n.alive {
                    pool.node(id).map_or(0, crate::PoolNode::replicas)
                } else {
                    0
                },
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Nodes joined, lost and refused; live nodes and their replicas.
    pub fn counters(&self) -> NodeCounters {
        let nodes = self.nodes();
        NodeCounters {
            joined: self.shared.joined.load(Ordering::Relaxed),
            lost: self.shared.lost_count.load(Ordering::Relaxed),
            left: self.shared.left_count.load(Ordering::Relaxed),
            refused: self.shared.refused.count(),
            live: nodes.iter().filter(|n| n.alive).count(),
            replicas_on_nodes: nodes.iter().map(|n| n.replicas).sum(),
            replicas_lost: self.shared.replicas_lost.load(Ordering::Relaxed),
        }
    }

    /// Wait (at most the re-attach grace) until the nodes of a previous head
    /// are back: the first node that re-attaches says which it knew, and the
    /// wait ends when all of them are back. A head whose checkpoint is empty
    /// need not call this.
    pub async fn await_reattach(&self) {
        let grace = self.shared.options.reattach_grace;
        if grace.is_zero() {
            return;
        }
        let mut rx = self.shared.reattach.subscribe();
        let _ = tokio::time::timeout(grace, rx.wait_for(|(any, left)| *any && *left == 0)).await;
        let (any, left) = *rx.borrow();
        info!(
            reattached = any,
            missing = left,
            "head: waited for nodes to re-attach"
        );
    }

    /// Drop the connection to node `id` as a network failure would (fault
    /// injection): the node is lost at once. Returns whether it was alive.
    pub async fn drop_node(&self, id: &str) -> bool {
        ractor::call!(self.registry, RegistryMsg::DropNode, id.to_owned()).unwrap_or(false)
    }

    /// Stop listening and drop every node session, waiting for the NodeServer.
    pub async fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
        self.registry.stop(None);
        self.shared.link.stop().await;
    }

    /// Stop at once, as a crash would (the nodes see their sessions drop).
    pub fn kill(&self) {
        for t in &self.tasks {
            t.abort();
        }
        self.registry.kill();
        self.shared.link.kill();
    }
}
