//! The head's registry of nodes: joins and refusals, heartbeats, losses,
//! re-attachment after a head restart, and the reports of remote replicas.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, atomic::Ordering},
};

use flotilla_core::{AppName, DeploymentName, Resources, actor_names};
use flotilla_replica::{OnExit, ReplicaId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::{task::JoinHandle, time::Instant};
use tracing::{debug, info, warn};

use super::{
    RemoteHost,
    head::{HeadShared, NodeEntry, lock},
    link::{Inbound, SessionEnd, SessionEvent},
    options::{CHECK_PERIOD, OptionsError, check_id, check_resources},
    proxy::{Adopted, ProxyReport, RemoteReplica, RemoteReplicaArgs},
    wire::{Control, Envelope, Hello, ReplicaReport, Welcome, WireLoad},
};
use crate::{ClusterEvent, NodeSpec, PlacementRequest};

/// The registry's messages (local only).
#[derive(Debug)]
pub(crate) enum RegistryMsg {
    /// A frame or session event from the link.
    Inbound(Inbound),
    /// Time to check silences and send heartbeats.
    Tick,
    /// Drop the connection to a node (fault injection).
    DropNode(String, RpcReplyPort<bool>),
    /// Tell the nodes which nodes are alive, if that changed since the last
    /// time (sent by the registry to itself: see `nodes_changed`).
    BroadcastNodes,
}

impl ractor::Message for RegistryMsg {}

pub(crate) struct Registry;

/// A join whose replica reports come in several frames: what its end needs.
struct Joining {
    /// The node's id.
    node: String,
    /// Whether it re-attaches (else its reported replicas are stopped).
    reattach: bool,
    /// The node ids it knew alive.
    peers: Vec<String>,
}

/// Where an authenticated peer is.
struct Reach {
    /// The address its session came from.
    addr: String,
    /// Where its `NodeServer` listens, as it advertised it: what the other
    /// nodes dial.
    listen: String,
}

pub(crate) struct RegistryState {
    shared: Arc<HeadShared>,
    /// Node ids by peer ractor name.
    by_peer: HashMap<String, String>,
    /// Where each authenticated session's peer is, by peer ractor name.
    reach: HashMap<String, Reach>,
    seq: u64,
    last_beat: Instant,
    /// When silence was last checked ([`tick`]).
    last_check: Instant,
    /// Node ids a re-attached node knew alive and that are not back yet.
    expected: HashSet<String>,
    /// Nodes whose join waits for more replica reports (`Replicas`), by peer.
    joining: HashMap<String, Joining>,
    reattached: bool,
    /// The dead nodes [`Head::nodes`](super::Head::nodes) still lists, oldest
    /// first: at most [`DEAD_NODES_KEPT`].
    dead: VecDeque<String>,
    /// Each live node's last load report (`Load`), by node id.
    loads: HashMap<String, WireLoad>,
    /// Each route's callers waiting on any node: the sum of `loads`' queued
    /// counts, kept as reports replace each other.
    queued: HashMap<(AppName, DeploymentName), u64>,
    /// When this head started, and whether its wait for its nodes to
    /// re-attach is over (see `Control::Nodes::settled`).
    started: Instant,
    settled: bool,
    timer: Option<JoinHandle<()>>,
    /// The nodes alive (or where they listen) changed since the last
    /// `Nodes` broadcast, and whether a `BroadcastNodes` is in the mailbox.
    nodes_changed: bool,
    broadcast_queued: bool,
}

/// How many dead nodes the head still lists, the most recent ones (Ray's GCS
/// keeps as many: `maximum_gcs_dead_node_cached_count`). Each incarnation of a
/// node has an id of its own, so without a bound a long-lived head's list, and
/// every scan of it, would grow with every restart of every node. The ids of
/// nodes declared lost are all kept, apart: that is what fences them.
pub(crate) const DEAD_NODES_KEPT: usize = 1_000;

impl Actor for Registry {
    type Msg = RegistryMsg;
    type State = RegistryState;
    type Arguments = Arc<HeadShared>;

    async fn pre_start(
        &self,
        myself: ActorRef<RegistryMsg>,
        shared: Arc<HeadShared>,
    ) -> Result<RegistryState, ActorProcessingErr> {
        let timer = myself.send_interval(CHECK_PERIOD, || RegistryMsg::Tick);
        Ok(RegistryState {
            shared,
            by_peer: HashMap::new(),
            reach: HashMap::new(),
            seq: 0,
            last_beat: Instant::now(),
            last_check: Instant::now(),
            expected: HashSet::new(),
            joining: HashMap::new(),
            reattached: false,
            dead: VecDeque::new(),
            loads: HashMap::new(),
            queued: HashMap::new(),
            started: Instant::now(),
            settled: false,
            timer: Some(timer),
            nodes_changed: false,
            broadcast_queued: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<RegistryMsg>,
        msg: RegistryMsg,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::BroadcastNodes => {
                state.broadcast_queued = false;
                if std::mem::take(&mut state.nodes_changed) {
                    broadcast_nodes(state);
                }
            }
            RegistryMsg::Inbound(Inbound::Control(env)) => control(state, env).await,
            RegistryMsg::Inbound(Inbound::Session(ev)) => session(state, ev),
            RegistryMsg::Tick => tick(state),
            RegistryMsg::DropNode(id, reply) => {
                let peer = state.shared.peer_of(&id);
                let alive = lock(&state.shared.nodes).get(&id).is_some_and(|n| n.alive);
                if let (true, Some(peer)) = (alive, peer) {
                    state
                        .shared
                        .link
                        .shared
                        .drop_session(&peer, "connection dropped (fault injection)");
                    declare_lost(state, &id, "its connection was dropped");
                }
                let _ = reply.send(alive);
            }
        }
        // One broadcast for every change the mailbox holds now: a wave of
        // joins (or losses) costs one `Nodes` per node, not one per change.
        if state.nodes_changed && !state.broadcast_queued {
            state.broadcast_queued = myself.cast(RegistryMsg::BroadcastNodes).is_ok();
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<RegistryMsg>,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.timer.take() {
            t.abort();
        }
        Ok(())
    }
}

fn touch(state: &RegistryState, peer: &str) {
    if let Some(id) = state.by_peer.get(peer)
        && let Some(n) = lock(&state.shared.nodes).get_mut(id)
    {
        n.last_heard = Instant::now();
    }
}

/// Why a node's report on a replica went to no proxy.
enum Undelivered {
    /// The replica runs on this other node.
    OtherNode(String),
    /// The head has no proxy of the replica (it never placed it, or it ended).
    NoProxy,
}

/// Pass a node's report on `replica` to its proxy, if the node that sent it
/// (`from`) is the one the replica runs on; else the report back, and why.
fn deliver(
    state: &RegistryState,
    from: &str,
    replica: u64,
    report: ProxyReport,
) -> Result<(), (ProxyReport, Undelivered)> {
    let sender = state.by_peer.get(from);
    let proxies = lock(&state.shared.proxies);
    match proxies.get(&ReplicaId(replica)) {
        Some((node, tx)) if sender == Some(node) => {
            let _ = tx.send(report);
            Ok(())
        }
        Some((node, _)) => Err((report, Undelivered::OtherNode(node.clone()))),
        None => Err((report, Undelivered::NoProxy)),
    }
}

/// [`deliver`], with a warning when the report goes nowhere (returns whether
/// it was delivered).
fn report(state: &RegistryState, from: &str, replica: u64, report: ProxyReport) -> bool {
    match deliver(state, from, replica, report) {
        Ok(()) => return true,
        Err((report, Undelivered::OtherNode(node))) => warn!(
            replica,
            %node,
            peer = %from,
            ?report,
            "report on a replica from a peer other than its node: ignored"
        ),
        Err((report, Undelivered::NoProxy)) => warn!(
            replica,
            ?report,
            "report for a replica the head has no proxy of"
        ),
    }
    false
}

async fn control(state: &mut RegistryState, env: Envelope) {
    let from = env.from;
    match env.control {
        Control::Hello(hello) => {
            Box::pin(self::hello(state, from, hello)).await;
        }
        Control::Replicas { reports, more } => {
            touch(state, &from);
            let Some(j) = state.joining.get(&from) else {
                warn!(peer = %from, "replica reports without a join in progress: ignored");
                return;
            };
            let (node, reattach) = (j.node.clone(), j.reattach);
            if !lock(&state.shared.nodes)
                .get(&node)
                .is_some_and(|n| n.alive)
            {
                // Declared lost mid-join: its replicas are being replaced.
                warn!(peer = %from, %node, "replica reports of a node no longer alive: ignored");
                state.joining.remove(&from);
                return;
            }
            Box::pin(take_reports(state, &from, &node, reattach, reports)).await;
            if !more && let Some(j) = state.joining.remove(&from) {
                join_done(state, &from, &j.node, j.reattach, j.peers);
            }
        }
        // Answered by the head's port (the link's `Role::Head`), whatever
        // this is busy with; here it only counts as heard.
        Control::Heartbeat { .. } => touch(state, &from),
        Control::Event { replica, event } => {
            touch(state, &from);
            let _ = report(state, &from, replica, ProxyReport::Event(event));
        }
        Control::Models { replica, models } => {
            touch(state, &from);
            let _ = report(state, &from, replica, ProxyReport::Models(models));
        }
        Control::Exited {
            replica,
            crashed,
            why,
        } => {
            touch(state, &from);
            if report(state, &from, replica, ProxyReport::Exited { crashed, why }) {
                // Its place is free now, before its proxy has heard: a node
                // that closes its session right after (it shut down) did not
                // lose this replica. Its proxy's release is then a no-op.
                state.shared.release(ReplicaId(replica));
            }
        }
        Control::Leaving { seq } => {
            touch(state, &from);
            let Some(id) = state.by_peer.get(&from).cloned() else {
                return;
            };
            // Every frame before this one is read (and each `Exited` freed
            // its replica's place): the node may close its session.
            send(state, &from, Control::Leaving { seq });
            let replicas = {
                let mut pool = state.shared.pool();
                pool.drain(&id)
                    .then(|| pool.node(&id).map_or(0, crate::PoolNode::replicas))
            };
            if let Some(replicas) = replicas {
                info!(node = %id, peer = %from, replicas,
                    "node leaving: nothing more is placed there while its replicas drain");
            }
        }
        Control::Figures(figures) => {
            touch(state, &from);
            for f in figures {
                // Quietly, as a load report: one for a replica the head has
                // no mirror of (any more) comes again with the node's
                // periodic refresh, or not at all.
                let replica = f.replica;
                if deliver(state, &from, replica, ProxyReport::Figures(Box::new(f))).is_err() {
                    debug!(replica, peer = %from,
                        "figures of a replica the head has no proxy of from this node: dropped");
                }
            }
        }
        Control::Load(load) => {
            touch(state, &from);
            let Some(node) = state.by_peer.get(&from).cloned() else {
                return;
            };
            take_load(state, &node, Some(load));
        }
        other => warn!(peer = %from, frame = ?other, "head: unexpected control frame"),
    }
}

/// Take `node`'s load report in place of its last (`None`: it is gone, and
/// its load with it): each of its replicas' running requests goes to its
/// mirror's endpoint, and each route's callers waiting on any node are summed
/// on the head's route, where the deployment's autoscaler reads them.
fn take_load(state: &mut RegistryState, node: &str, load: Option<WireLoad>) {
    let old = match load {
        Some(new) => state.loads.insert(node.to_owned(), new),
        None => state.loads.remove(node),
    }
    .unwrap_or_default();
    let none = WireLoad::default();
    let new = state.loads.get(node).unwrap_or(&none);
    // Only to the node's own replicas' mirrors; quietly (a replica may have
    // ended since the node counted it).
    let proxies = lock(&state.shared.proxies);
    let tell = |replica: u64, n: u32| {
        if let Some((at, tx)) = proxies.get(&ReplicaId(replica))
            && at == node
        {
            let _ = tx.send(ProxyReport::Load(n));
        }
    };
    let still: HashSet<u64> = new.running.iter().map(|(r, _)| *r).collect();
    for (replica, _) in &old.running {
        if !still.contains(replica) {
            tell(*replica, 0);
        }
    }
    for (replica, n) in &new.running {
        tell(*replica, *n);
    }
    drop(proxies);
    // The totals change by this node's difference alone: O(its routes), not
    // O(nodes x routes) per report.
    let mut touched = HashSet::new();
    for (queued, sign) in [(&old.queued, -1i64), (&new.queued, 1)] {
        for (app, dep, n) in queued {
            let key = (app.clone(), dep.clone());
            let total = state.queued.entry(key.clone()).or_default();
            *total = total.saturating_add_signed(sign * i64::from(*n));
            touched.insert(key);
        }
    }
    for key in touched {
        let total = state.queued.get(&key).copied().unwrap_or_default();
        if total == 0 {
            state.queued.remove(&key);
        }
        if let Some(route) = state.shared.directory.get(&key.0, &key.1) {
            route.set_queued_elsewhere(total);
        }
    }
}

fn session(state: &mut RegistryState, ev: SessionEvent) {
    match ev {
        SessionEvent::Opened { id, addr } => {
            tracing::debug!(session = id, %addr, "head: node connection opened");
        }
        SessionEvent::Ready {
            peer, addr, listen, ..
        } => {
            info!(%peer, %addr, %listen, "head: node session authenticated");
            // Its hello may have come first (the two travel apart): then the
            // nodes heard of it without where it listens, and hear again.
            let joined = state.by_peer.get(&peer).cloned();
            state.reach.insert(
                peer,
                Reach {
                    addr: addr.clone(),
                    listen: listen.clone(),
                },
            );
            if let Some(id) = joined {
                if let Some(n) = lock(&state.shared.nodes).get_mut(&id) {
                    if n.address.is_empty() {
                        n.address = addr;
                    }
                    n.listen = listen;
                }
                nodes_changed(state);
            }
        }
        SessionEvent::Closed {
            addr,
            end: SessionEnd::Refused,
            ..
        } => {
            state.shared.refused.fetch_add(1, Ordering::Relaxed);
            warn!(%addr, "node connection refused: authentication failed (wrong cookie?)");
        }
        SessionEvent::Closed {
            end: SessionEnd::Authenticated { peer },
            ..
        } => {
            state.reach.remove(&peer);
            state.joining.remove(&peer);
            if let Some(id) = state.by_peer.get(&peer).cloned() {
                let alive = lock(&state.shared.nodes).get(&id).is_some_and(|n| n.alive);
                if alive {
                    declare_lost(state, &id, "its connection closed");
                }
            }
        }
        // Stopped at the deadline (logged there), or closed before the peer
        // said who it is.
        SessionEvent::Closed { addr, end, .. } => {
            tracing::debug!(%addr, ?end, "head: a node connection closed before its handshake");
        }
    }
}

/// Send `control` to `peer`, logging a failure.
fn send(state: &RegistryState, peer: &str, control: Control) {
    if !state.shared.link.shared.send_control(peer, control) {
        warn!(%peer, "head: control frame not sent (peer unreachable)");
    }
}

/// Whether a node saying hello as `node` with `resources` may join: its id
/// must be one a node could have (`check_id`), not the head's own (the
/// head's replicas run under it, and the session's close would declare it
/// lost), not one that is `joined` (alive), and not one this head declared
/// `lost`; its resources must be amounts replicas can be placed against
/// (`check_resources`: a node of another build could send a NaN).
fn admission(
    node: &str,
    resources: &Resources,
    head: &str,
    lost: bool,
    joined: bool,
) -> Result<(), Refusal> {
    check_id(node).map_err(Refusal::BadId)?;
    check_resources("node", resources).map_err(Refusal::BadResources)?;
    if node == head {
        return Err(Refusal::HeadsOwn {
            node: node.to_owned(),
        });
    }
    if lost {
        return Err(Refusal::Lost {
            node: node.to_owned(),
        });
    }
    if joined {
        return Err(Refusal::Joined {
            node: node.to_owned(),
        });
    }
    Ok(())
}

/// Why the head refuses a node's hello; its text is what the node hears
/// ([`Control::Refused`]).
#[derive(Debug, PartialEq, thiserror::Error)]
enum Refusal {
    /// The node id is not one a node could have.
    #[error(transparent)]
    BadId(OptionsError),
    /// The node offers resources no replica could be placed against.
    #[error(transparent)]
    BadResources(OptionsError),
    /// The node id is the head's own.
    #[error("node id {node} is the head's own")]
    HeadsOwn {
        /// The node id given.
        node: String,
    },
    /// This head declared the node lost.
    #[error(
        "node {node} was declared lost by this head: its replicas were replaced; stop them and \
         join as a new node"
    )]
    Lost {
        /// The node id given.
        node: String,
    },
    /// A node of that id is alive.
    #[error("node {node} already joined")]
    Joined {
        /// The node id given.
        node: String,
    },
}

fn refuse(state: &RegistryState, peer: &str, node: &str, reason: Refusal) {
    state.shared.refused.fetch_add(1, Ordering::Relaxed);
    warn!(%peer, %node, %reason, "head: node refused");
    send(
        state,
        peer,
        Control::Refused {
            reason: reason.to_string(),
        },
    );
}

async fn hello(state: &mut RegistryState, from: String, h: Hello) {
    let shared = state.shared.clone();
    let lost = lock(&shared.lost).contains(&h.node);
    let joined = lock(&shared.nodes).get(&h.node).is_some_and(|n| n.alive)
        || shared.pool().is_alive(&h.node);
    if let Err(reason) = admission(&h.node, &h.resources, &shared.options.node_id, lost, joined) {
        // Its parts, if any follow, belong to no join.
        state.joining.remove(&from);
        refuse(state, &from, &h.node, reason);
        return;
    }
    // The welcome goes before the node joins the pool: once it is there, a
    // DeploymentActor may place a replica on it at once, and the node ignores
    // a `Start` that comes before its welcome (it has no namespace yet). Both
    // go over the one session, in the order sent.
    send(
        state,
        &from,
        Control::Welcome(Welcome {
            epoch: shared.epoch,
            ns: shared.ns.clone(),
            head_node: shared.options.node_id.clone(),
        }),
    );
    let (address, listen) = state
        .reach
        .get(&from)
        .map(|r| (r.addr.clone(), r.listen.clone()))
        .unwrap_or_default();
    lock(&shared.nodes).insert(
        h.node.clone(),
        NodeEntry {
            peer: from.clone(),
            address: address.clone(),
            listen,
            resources: h.resources.clone(),
            labels: h.labels.clone(),
            alive: true,
            last_heard: Instant::now(),
        },
    );
    state.by_peer.insert(from.clone(), h.node.clone());
    // Its replicas log by the head's settings from their start.
    super::log_export::welcome(&shared, &from);
    shared
        .pool()
        .add(NodeSpec::new(h.node.clone(), h.resources.clone()));
    shared.joined.fetch_add(1, Ordering::Relaxed);
    let reattach = h.last_head.is_some_and(|e| e != shared.epoch);
    info!(node = %h.node, peer = %from, %address, cpus = h.resources.cpus,
        replicas = h.replicas.len(), more = h.more, reattach, "node joined");
    Box::pin(take_reports(state, &from, &h.node, reattach, h.replicas)).await;
    if h.more {
        // The join ends with its last `Replicas` frame: a restarted head's
        // wait for its nodes must not end before every replica is adopted,
        // even if another node that knew this one joins meanwhile.
        if reattach {
            state.expected.insert(h.node.clone());
        }
        let joining = Joining {
            node: h.node,
            reattach,
            peers: h.peers,
        };
        state.joining.insert(from, joining);
        return;
    }
    join_done(state, &from, &h.node, reattach, h.peers);
}

/// Replicas a joining node reported: adopted if it re-attaches; else they
/// are of this head's own epoch on a node it does not know: nobody counts
/// them, so they must not run.
async fn take_reports(
    state: &RegistryState,
    from: &str,
    node: &str,
    reattach: bool,
    reports: Vec<ReplicaReport>,
) {
    for r in reports {
        if reattach {
            Box::pin(adopt(state, from, node, r)).await;
        } else {
            let stop = Control::Stop {
                replica: r.id,
                graceful: false,
            };
            send(state, from, stop);
        }
    }
}

/// The end of node `node`'s join, once every replica it reported is taken:
/// a restarted head's wait hears of it, and the node gets every route.
fn join_done(
    state: &mut RegistryState,
    from: &str,
    node: &str,
    reattach: bool,
    peers: Vec<String>,
) {
    let shared = state.shared.clone();
    if reattach {
        let joined: HashSet<String> = shared.alive().into_iter().map(|(id, _)| id).collect();
        state
            .expected
            .extend(peers.into_iter().filter(|p| !joined.contains(p)));
        state.reattached = true;
    }
    state.expected.remove(node);
    // Kept even while nobody waits (`send` would drop it): the head's wait
    // may subscribe after this node is back.
    shared
        .reattach
        .send_replace((state.reattached, state.expected.len()));
    super::export::full_copy(&shared, from);
    nodes_changed(state);
    shared.announce(ClusterEvent::CapacityFreed);
}

/// A replica a re-attaching node (`node`, session `from`) runs: reserve its
/// resources there again and make its proxy, which its DeploymentActor
/// adopts. One that cannot be adopted is stopped on its node: nothing here
/// would own it, count it, or ever stop it.
async fn adopt(state: &RegistryState, from: &str, node: &str, r: ReplicaReport) {
    let shared = &state.shared;
    let id = ReplicaId(r.id);
    ReplicaId::seed(r.id.saturating_add(1));
    let spec = Arc::new(*r.spec);
    let dep = spec.name.clone();
    let ns = &shared.ns;
    let name = actor_names::replica(ns, &r.app, &dep, id.0);
    let stop = || {
        send(
            state,
            from,
            Control::Stop {
                replica: r.id,
                graceful: true,
            },
        );
    };
    // Ids are unique per head (the clock's milliseconds, then past every id
    // re-attached), but a clock that went back, or a head moved to another
    // machine, can give one of this head's own replicas the id of a
    // re-attached one. Reserving it would take (and its exit free) the other
    // replica's reservation, and its proxy could not take the name. A
    // reservation on this very node counts too: a node re-attaches once, so
    // it is another replica's, placed there since the node's hello.
    let taken = match shared.pool().node_of(id) {
        Some(n) => Some(format!("reserved on node '{}'", n.name())),
        None => ractor::registry::where_is(name.clone()).map(|_| "its name in use".to_owned()),
    };
    if let Some(taken) = taken {
        warn!(app = %r.app, deployment = %dep, replica = %id, node, %taken,
            "re-attached replica's id is another replica's here (a clock that went back?): stopping it");
        stop();
        return;
    }
    {
        let mut pool = shared.pool();
        let req = PlacementRequest::for_config(id, &r.app, &dep, &spec.config);
        match pool.place(&req, |_, n, _| n.name() != node) {
            Ok(at) if at == node => {}
            Ok(at) => {
                pool.release(id);
                warn!(app = %r.app, deployment = %dep, replica = %id, node, elsewhere = %at,
                    "re-attached replica's resources do not fit its node again: not reserved");
            }
            Err(refusal) => warn!(app = %r.app, deployment = %dep, replica = %id, node, %refusal,
                "re-attached replica's resources do not fit: not reserved"),
        }
    }
    let args = RemoteReplicaArgs::adopted(
        id,
        r.app.clone(),
        spec,
        r.version,
        shared.directory.route(&r.app, &dep),
        (shared.reporter)(ns, &r.app, &dep),
        actor_names::replica_group(ns, &r.app, &dep),
        RemoteHost {
            shared: shared.clone(),
            node: node.to_owned(),
        },
        Adopted {
            phase: r.phase.into(),
            condemned: r.condemned,
            models: r.models,
        },
        {
            let shared = shared.clone();
            OnExit::new(move || shared.release(id))
        },
    );
    match Actor::spawn(Some(name), RemoteReplica, args).await {
        Ok(_) => info!(app = %r.app, deployment = %dep, replica = %id, node,
            "re-attached replica adopted"),
        Err(e) => {
            // Its reservation went with the args (their `OnExit`).
            warn!(app = %r.app, deployment = %dep, replica = %id, node, error = %e,
                "re-attached replica could not be adopted: stopping it");
            stop();
        }
    }
}

/// The nodes alive, or where one listens, changed: the nodes hear it in one
/// `Nodes` broadcast, once the registry has read what its mailbox holds now.
fn nodes_changed(state: &mut RegistryState) {
    state.nodes_changed = true;
}

/// Tell every live node which nodes are alive and where they listen.
fn broadcast_nodes(state: &RegistryState) {
    state
        .shared
        .nodes_broadcasts
        .fetch_add(1, Ordering::Relaxed);
    let alive = state.shared.alive();
    let (ids, peers): (Vec<String>, Vec<String>) = alive.iter().cloned().unzip();
    let listen: Vec<String> = peers
        .iter()
        .map(|p| {
            state
                .reach
                .get(p)
                .map(|r| r.listen.clone())
                .unwrap_or_default()
        })
        .collect();
    for (_, peer) in &alive {
        send(
            state,
            peer,
            Control::Nodes {
                alive: peers.clone(),
                ids: ids.clone(),
                listen: listen.clone(),
                settled: state.settled,
            },
        );
    }
}

/// Node `id` is gone: lost, or left if it said it was leaving. Its replicas
/// still there are gone (replaced elsewhere by their DeploymentActors), its
/// calls fail, and it never comes back under this id.
fn declare_lost(state: &mut RegistryState, id: &str, why: &str) {
    let shared = state.shared.clone();
    let peer = {
        let mut nodes = lock(&shared.nodes);
        let Some(n) = nodes.get_mut(id) else { return };
        if !n.alive {
            return;
        }
        n.alive = false;
        n.peer.clone()
    };
    lock(&shared.lost).insert(id.to_owned());
    // Lost mid-join: its join never ends, and the head's wait stops
    // expecting it (it never comes back under this id).
    state.joining.retain(|_, j| j.node != id);
    if state.expected.remove(id) {
        shared
            .reattach
            .send_replace((state.reattached, state.expected.len()));
    }
    // Gone for good: the id never comes back, and its session never speaks
    // again (every caller dropped or lost it first).
    if state.by_peer.get(&peer).is_some_and(|n| n == id) {
        state.by_peer.remove(&peer);
    }
    take_load(state, id, None);
    state.dead.push_back(id.to_owned());
    while state.dead.len() > DEAD_NODES_KEPT {
        if let Some(oldest) = state.dead.pop_front() {
            lock(&shared.nodes).remove(&oldest);
        }
    }
    let (left, replicas) = {
        let mut pool = shared.pool();
        let left = pool.node(id).is_some_and(crate::PoolNode::is_draining);
        let lost = pool.kill(id).map_or(0, |r| r.len());
        pool.forget(id);
        (left, lost)
    };
    shared
        .replicas_lost
        .fetch_add(replicas as u64, Ordering::Relaxed);
    if left {
        shared.left_count.fetch_add(1, Ordering::Relaxed);
        if replicas == 0 {
            info!(node = id, %peer, why, "node left");
        } else {
            warn!(node = id, %peer, why, replicas, "node left before its replicas ended");
        }
    } else {
        shared.lost_count.fetch_add(1, Ordering::Relaxed);
        warn!(node = id, %peer, why, replicas, "node lost");
    }
    let failed = shared.link.shared.calls.fail_peer(&peer);
    let reason = format!("its node '{id}' was lost: {why}");
    for (node, tx) in lock(&shared.proxies).values() {
        if node == id {
            let _ = tx.send(ProxyReport::NodeLost {
                why: reason.clone(),
            });
        }
    }
    if failed > 0 {
        warn!(node = id, failed, "calls in flight to a lost node failed");
    }
    shared.announce(ClusterEvent::NodeDied(id.to_owned()));
    nodes_changed(state);
}

fn tick(state: &mut RegistryState) {
    let shared = state.shared.clone();
    // The re-attach wait is over: every node expected is back (after one
    // re-attached), or the grace ran out. The nodes hear it.
    if !state.settled
        && ((state.reattached && state.expected.is_empty())
            || state.started.elapsed() >= shared.options.reattach_grace)
    {
        state.settled = true;
        nodes_changed(state);
    }
    let timeout = shared.options.heartbeat_timeout;
    // Time the head did not run is nobody's silence.
    let lost = shared
        .link
        .shared
        .excuse_stall(&mut state.last_check, timeout);
    if !lost.is_zero() {
        let now = Instant::now();
        for n in lock(&shared.nodes).values_mut() {
            n.last_heard = (n.last_heard + lost).min(now);
        }
        warn!(
            lost_ms = lost.as_millis(),
            "the head did not run for a while (stopped, paused or starved): \
             its nodes' silence over that time is not held against them"
        );
    }
    // Any frame counts as heard, a data frame too: a node busy answering
    // calls with large responses has its heartbeats queued behind them.
    let silent: Vec<(String, String)> = lock(&shared.nodes)
        .iter()
        .filter(|(_, n)| n.alive && n.last_heard.elapsed() > timeout)
        .filter(|(_, n)| !shared.link.shared.heard_within(&n.peer, timeout))
        .map(|(id, n)| (id.clone(), n.peer.clone()))
        .collect();
    for (id, peer) in silent {
        shared.link.shared.drop_session(&peer, "heartbeat timeout");
        declare_lost(
            state,
            &id,
            &format!("no heartbeat for {}", humantime(timeout)),
        );
    }
    if state.last_beat.elapsed() >= shared.options.heartbeat {
        state.last_beat = Instant::now();
        state.seq += 1;
        for (_, peer) in shared.alive() {
            send(state, &peer, Control::Heartbeat { seq: state.seq });
        }
    }
}

fn humantime(d: std::time::Duration) -> String {
    format!("{} ms", d.as_millis())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use flotilla_core::DeploymentSpec;
    use flotilla_replica::{Directory, ReplicaMsg};
    use tokio::sync::mpsc;

    use super::*;
    use crate::nodes::{
        Head,
        wire::{REPORTS_PART, WirePhase, in_parts},
    };

    #[test]
    fn a_hello_with_the_heads_id_a_bad_id_a_joined_or_a_lost_id_is_refused() {
        let cpus = Resources::none().with_cpus(2.0);
        assert_eq!(
            admission("node-a1b2c3", &cpus, "head", false, false),
            Ok(())
        );
        let refused = |node: &str, lost, joined| match admission(node, &cpus, "head", lost, joined)
        {
            Err(reason) => reason,
            Ok(()) => panic!("{node} was admitted"),
        };
        let head = refused("head", false, false);
        assert!(matches!(head, Refusal::HeadsOwn { .. }), "{head:?}");
        assert!(head.to_string().contains("the head's own"));
        for bad in ["", "a/b", &"n".repeat(65)] {
            let id = refused(bad, false, false);
            assert!(matches!(id, Refusal::BadId(_)), "{id:?}");
            assert!(id.to_string().contains("1 to 64"), "{id}");
        }
        let lost = refused("node-1", true, false);
        assert!(matches!(lost, Refusal::Lost { .. }), "{lost:?}");
        assert!(lost.to_string().contains("declared lost"));
        let joined = refused("node-1", false, true);
        assert!(matches!(joined, Refusal::Joined { .. }), "{joined:?}");
        assert!(joined.to_string().contains("already joined"));
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let r = Resources::none().with_cpus(bad);
            let refused = admission("node-1", &r, "head", false, false);
            assert!(matches!(refused, Err(Refusal::BadResources(_))), "{bad}");
        }
    }

    const PEER: &str = "node-test@127.0.0.1";

    async fn head(ns: &str) -> Head {
        crate::nodes::export::tests::head(ns).await.0
    }

    fn report(id: u64) -> ReplicaReport {
        let spec = DeploymentSpec::builder("d", "test::D").build().unwrap();
        ReplicaReport {
            id,
            app: AppName::new("a").unwrap(),
            version: spec.version(),
            spec: Box::new(spec),
            phase: WirePhase::Running,
            condemned: None,
            models: None,
        }
    }

    /// Deliver `control` from `from`, and wait until the registry has read it.
    async fn deliver(head: &Head, from: &str, control: Control) {
        let env = Envelope {
            from: from.to_owned(),
            control,
        };
        head.registry
            .cast(RegistryMsg::Inbound(Inbound::Control(env)))
            .unwrap();
        let barrier = ractor::call!(head.registry, |r| RegistryMsg::DropNode("nobody".into(), r));
        assert!(!barrier.unwrap(), "no node is called nobody");
    }

    fn proxies(head: &Head) -> Vec<u64> {
        let mut ids: Vec<u64> = lock(&head.shared.proxies).keys().map(|r| r.0).collect();
        ids.sort_unstable();
        ids
    }

    fn joining(node: &str) -> Control {
        Control::Hello(Hello {
            node: node.into(),
            resources: Resources::none().with_cpus(4.0),
            labels: Vec::new(),
            last_head: None,
            peers: Vec::new(),
            replicas: Vec::new(),
            more: false,
        })
    }

    /// Callers waiting on each node are summed on the head's route, each
    /// node's report taking the place of its last; a lost node's go with it.
    #[tokio::test]
    async fn queued_load_is_summed_over_nodes_and_forgotten_with_a_lost_node() {
        let head = head("registry-load").await;
        let (app, dep) = (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
        );
        let route = head.shared.directory.route(&app, &dep);
        let load = |n: u32| {
            Control::Load(WireLoad {
                running: Vec::new(),
                queued: vec![(app.clone(), dep.clone(), n)],
            })
        };
        let (p1, p2) = ("node-1@127.0.0.1", "node-2@127.0.0.1");
        deliver(&head, p1, joining("n-1")).await;
        deliver(&head, p2, joining("n-2")).await;
        deliver(&head, p1, load(3)).await;
        deliver(&head, p2, load(4)).await;
        assert_eq!(route.queued_elsewhere(), 7);
        deliver(&head, p1, load(1)).await;
        assert_eq!(route.queued_elsewhere(), 5);
        // Nothing waits on n-2 any more: it says so with an empty report.
        deliver(&head, p2, Control::Load(WireLoad::default())).await;
        assert_eq!(route.queued_elsewhere(), 1);
        // From a peer that never joined: not counted.
        deliver(&head, "node-9@127.0.0.1", load(50)).await;
        assert_eq!(route.queued_elsewhere(), 1);
        let dropped = ractor::call!(head.registry, |r| RegistryMsg::DropNode("n-1".into(), r));
        assert!(dropped.unwrap());
        assert_eq!(
            route.queued_elsewhere(),
            0,
            "n-1's callers are gone with it"
        );
        head.stop().await;
    }

    /// The requests running on a node's replica, as its node reports them,
    /// reach that replica's mirror endpoint (where the deployment's autoscaler
    /// reads a replica's load), and a report that leaves the replica out puts
    /// it back to 0.
    #[tokio::test]
    async fn running_load_reaches_the_mirror_of_the_reporting_nodes_replica() {
        let head = head("registry-running").await;
        deliver(&head, PEER, reattaching("n-1", &head, &[], 1, false)).await;
        assert_eq!(proxies(&head), [1]);
        let (app, dep) = (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
        );
        let name = actor_names::replica("registry-running", &app, &dep, 1);
        let proxy: ActorRef<ReplicaMsg> = ractor::registry::where_is(name).unwrap().into();
        let endpoint = ractor::call!(proxy, ReplicaMsg::Observe)
            .unwrap()
            .endpoint
            .unwrap();
        assert_eq!(endpoint.load(), 0);
        // The mirror takes its report in a task of its own: wait for it.
        let settles = |n: u32| {
            let endpoint = endpoint.clone();
            async move {
                while endpoint.load() != n {
                    tokio::task::yield_now().await;
                }
            }
        };
        let running = |replicas: Vec<(u64, u32)>| {
            Control::Load(WireLoad {
                running: replicas,
                queued: Vec::new(),
            })
        };
        deliver(&head, PEER, running(vec![(1, 5)])).await;
        tokio::time::timeout(Duration::from_secs(10), settles(5))
            .await
            .unwrap();
        deliver(&head, PEER, running(vec![(1, 2)])).await;
        tokio::time::timeout(Duration::from_secs(10), settles(2))
            .await
            .unwrap();
        // Nothing runs there any more: left out of the next report.
        deliver(&head, PEER, running(Vec::new())).await;
        tokio::time::timeout(Duration::from_secs(10), settles(0))
            .await
            .unwrap();
        head.stop().await;
    }

    /// Time the head did not run (its process stopped, as a paused VM is)
    /// is not held against its nodes: a node it joined is still alive after
    /// a stall longer than the heartbeat timeout, and is declared lost one
    /// timeout of the head's own running time after it resumed.
    #[tokio::test(start_paused = true)]
    async fn a_head_that_did_not_run_holds_its_nodes_silence_meanwhile_against_none() {
        let timeout = Duration::from_secs(2);
        let (head, _) = crate::nodes::export::tests::head_with("registry-stall", |o| {
            o.reattach_grace(Duration::from_secs(3_600))
                .heartbeat(Duration::from_millis(500), timeout)
        })
        .await;
        deliver(&head, "node-s@127.0.0.1", joining("s")).await;
        let alive = || head.nodes().iter().any(|n| n.id == "s" && n.alive);
        assert!(alive());
        // The head's process stops for 3 s: its clock moves on while none of
        // its ticks runs (`advance` jumps at once; the ticks then come late).
        tokio::time::advance(timeout + Duration::from_secs(1)).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(alive(), "a head that did not run declared its node lost");
        // Running again, and the node still silent: lost within one timeout
        // and one check period.
        tokio::time::sleep(timeout - Duration::from_millis(300)).await;
        assert!(
            alive(),
            "lost before a timeout of the head's own running time"
        );
        tokio::time::sleep(Duration::from_millis(300) + CHECK_PERIOD * 2).await;
        assert!(!alive(), "a silent node was never declared lost");
        head.stop().await;
    }

    /// Every incarnation of a node has an id of its own: the head forgets
    /// dead ones beyond the most recent [`DEAD_NODES_KEPT`], and its pool
    /// keeps none, while every lost id stays fenced.
    #[tokio::test]
    async fn a_head_keeps_a_bounded_list_of_dead_nodes_and_fences_every_lost_id() {
        let head = head("registry-dead").await;
        let incarnations = DEAD_NODES_KEPT + 3;
        for i in 0..incarnations {
            let (node, peer) = (format!("n-{i}"), format!("node-{i}@127.0.0.1"));
            deliver(&head, &peer, joining(&node)).await;
            let dropped = ractor::call!(head.registry, |r| RegistryMsg::DropNode(node.clone(), r));
            assert!(dropped.unwrap(), "{node} had joined");
        }
        let listed = head.nodes();
        assert_eq!(listed.len(), DEAD_NODES_KEPT);
        assert!(listed.iter().all(|n| !n.alive));
        assert!(!listed.iter().any(|n| n.id == "n-0" || n.id == "n-2"));
        assert!(listed.iter().any(|n| n.id == "n-3"));
        // The pool holds the head's own node alone.
        assert_eq!(head.shared.pool().nodes().len(), 1);
        assert_eq!(lock(&head.shared.lost).len(), incarnations);
        // A forgotten id is still refused.
        deliver(&head, "node-0@127.0.0.1", joining("n-0")).await;
        assert!(!head.nodes().iter().any(|n| n.id == "n-0"));
        assert_eq!(head.shared.pool().nodes().len(), 1);
        head.stop().await;
    }

    /// The joins a wave brings at once share one `Nodes` broadcast: each
    /// node hears the new list once, not once per join (a wave of N joins
    /// cost N broadcasts of N frames of N names each).
    #[tokio::test]
    async fn a_wave_of_joins_is_told_in_one_nodes_broadcast() {
        // Nothing else changes the node list meanwhile, however slow the
        // machine: the test head's grace and silences last an hour.
        let head = head("registry-wave").await;
        let broadcasts = || head.shared.nodes_broadcasts.load(Ordering::Relaxed);
        for i in 0..20 {
            let env = Envelope {
                from: format!("node-{i}@127.0.0.1"),
                control: joining(&format!("n-{i}")),
            };
            head.registry
                .cast(RegistryMsg::Inbound(Inbound::Control(env)))
                .unwrap();
        }
        // Two barriers: the broadcast the first join queued comes after the
        // first (behind the other joins), and before the second.
        for _ in 0..2 {
            let barrier =
                ractor::call!(head.registry, |r| RegistryMsg::DropNode("nobody".into(), r));
            assert!(!barrier.unwrap());
        }
        assert_eq!(head.nodes().iter().filter(|n| n.alive).count(), 20);
        assert_eq!(broadcasts(), 1);
        // A later change is told again.
        deliver(&head, "node-20@127.0.0.1", joining("n-20")).await;
        let barrier = ractor::call!(head.registry, |r| RegistryMsg::DropNode("nobody".into(), r));
        assert!(!barrier.unwrap());
        assert_eq!(broadcasts(), 2);
        head.stop().await;
    }

    /// A re-attach whose reports come in parts: every replica is adopted, and
    /// a restarted head's wait ends only with the last part.
    #[tokio::test]
    async fn a_reattach_in_parts_ends_with_its_last_part() {
        let head = head("registry-parts").await;
        let reattach = || *head.shared.reattach.borrow();
        // Parts from a peer that has not said hello are not a join.
        let stray = Control::Replicas {
            reports: vec![report(9)],
            more: false,
        };
        deliver(&head, PEER, stray).await;
        assert!(proxies(&head).is_empty());
        let hello = Hello {
            node: "n-1".into(),
            resources: Resources::none().with_cpus(4.0),
            labels: Vec::new(),
            last_head: Some(head.shared.epoch ^ 1),
            peers: Vec::new(),
            replicas: vec![report(1)],
            more: true,
        };
        deliver(&head, PEER, Control::Hello(hello)).await;
        assert_eq!(proxies(&head), [1]);
        assert_eq!(
            reattach(),
            (false, 0),
            "the wait ended before every replica came"
        );
        let middle = Control::Replicas {
            reports: vec![report(2)],
            more: true,
        };
        deliver(&head, PEER, middle).await;
        assert_eq!(reattach(), (false, 0));
        let last = Control::Replicas {
            reports: vec![report(3)],
            more: false,
        };
        deliver(&head, PEER, last).await;
        assert_eq!(proxies(&head), [1, 2, 3]);
        assert_eq!(reattach(), (true, 0));
        head.stop().await;
    }

    fn reattaching(node: &str, head: &Head, peers: &[&str], first: u64, more: bool) -> Control {
        Control::Hello(Hello {
            node: node.into(),
            resources: Resources::none().with_cpus(4.0),
            labels: Vec::new(),
            last_head: Some(head.shared.epoch ^ 1),
            peers: peers.iter().map(|p| (*p).to_owned()).collect(),
            replicas: vec![report(first)],
            more,
        })
    }

    /// A node that knew one still mid-join joins whole: the head's wait
    /// goes on until the other's last part.
    #[tokio::test]
    async fn a_node_joining_whole_does_not_end_the_wait_for_one_mid_join() {
        let head = head("registry-two").await;
        let reattach = || *head.shared.reattach.borrow();
        let (a, b) = ("node-a@127.0.0.1", "node-b@127.0.0.1");
        deliver(&head, a, reattaching("n-a", &head, &["n-b"], 1, true)).await;
        deliver(&head, b, reattaching("n-b", &head, &["n-a"], 2, false)).await;
        assert_eq!(reattach(), (true, 1), "the wait ended with n-a mid-join");
        let last = Control::Replicas {
            reports: vec![report(3)],
            more: false,
        };
        deliver(&head, a, last).await;
        assert_eq!(reattach(), (true, 0));
        assert_eq!(proxies(&head), [1, 2, 3]);
        head.stop().await;
    }

    /// A node declared lost mid-join: its later parts are not taken (their
    /// replicas are being replaced), its join never ends, and the wait no
    /// longer expects it.
    #[tokio::test]
    async fn the_parts_of_a_node_lost_mid_join_are_not_adopted() {
        let head = head("registry-lost").await;
        deliver(&head, PEER, reattaching("n-1", &head, &[], 1, true)).await;
        let lost = ractor::call!(head.registry, |r| RegistryMsg::DropNode("n-1".into(), r));
        assert!(lost.unwrap(), "n-1 was not alive");
        assert_eq!(*head.shared.reattach.borrow(), (false, 0));
        let late = Control::Replicas {
            reports: vec![report(2)],
            more: false,
        };
        deliver(&head, PEER, late).await;
        assert!(
            !proxies(&head).contains(&2),
            "a lost node's replica adopted"
        );
        assert_eq!(
            *head.shared.reattach.borrow(),
            (false, 0),
            "the join of a lost node ended"
        );
        head.stop().await;
    }

    /// A re-attached replica whose id this head already gave another replica
    /// (a clock that went back) is not adopted, and the other's reservation
    /// stays where it is.
    #[tokio::test]
    async fn a_reattached_replica_whose_id_is_taken_here_is_not_adopted() {
        let head = head("registry-taken").await;
        deliver(&head, "node-x@127.0.0.1", joining("n-x")).await;
        let spec = DeploymentSpec::builder("d", "test::D").build().unwrap();
        let app = AppName::new("a").unwrap();
        {
            let req = PlacementRequest::for_config(ReplicaId(1), &app, &spec.name, &spec.config);
            let at = head
                .shared
                .pool()
                .place(&req, |_, n, _| n.name() != "n-x")
                .unwrap();
            assert_eq!(at, "n-x");
        }
        deliver(&head, PEER, reattaching("n-1", &head, &[], 1, false)).await;
        assert!(proxies(&head).is_empty(), "adopted under a taken id");
        let holder = head
            .shared
            .pool()
            .node_of(ReplicaId(1))
            .map(|n| n.name().to_owned());
        assert_eq!(
            holder.as_deref(),
            Some("n-x"),
            "the other replica's reservation moved"
        );
        head.stop().await;
    }

    /// Hears how its children stopped.
    struct Watcher;

    impl Actor for Watcher {
        type Msg = ();
        type State = mpsc::UnboundedSender<Option<String>>;
        type Arguments = mpsc::UnboundedSender<Option<String>>;

        async fn pre_start(
            &self,
            _: ActorRef<()>,
            tx: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(tx)
        }

        async fn handle_supervisor_evt(
            &self,
            _: ActorRef<()>,
            event: ractor::SupervisionEvent,
            tx: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let ractor::SupervisionEvent::ActorTerminated(_, _, why) = event {
                let _ = tx.send(why);
            }
            Ok(())
        }
    }

    /// A stand-in made for a node the head has just declared lost (its
    /// DeploymentActor placed the replica a moment before) is not in the
    /// loss's sweep: it stops for the node's loss instead of waiting for ever.
    #[tokio::test]
    async fn a_stand_in_made_after_its_node_was_lost_stops_as_lost() {
        let head = head("registry-late-stand-in").await;
        deliver(&head, PEER, joining("n-1")).await;
        let host = head.cluster().host("n-1").unwrap();
        let lost = ractor::call!(head.registry, |r| RegistryMsg::DropNode("n-1".into(), r));
        assert!(lost.unwrap());
        let spec = Arc::new(DeploymentSpec::builder("d", "test::D").build().unwrap());
        let (app, dep) = (AppName::new("a").unwrap(), spec.name.clone());
        let directory = Directory::new();
        let args = flotilla_replica::ReplicaArgs {
            id: ReplicaId(77),
            version: spec.version(),
            spec,
            registry: flotilla_replica::Registry::new(),
            directory: directory.clone(),
            route: directory.route(&app, &dep),
            reporter: Arc::new(|_, _| {}),
            group: actor_names::replica_group("registry-late-stand-in", &app, &dep),
            node: "n-1".into(),
            faults: flotilla_core::Faults::new(),
            on_exit: OnExit::none(),
            app,
            deployment: dep,
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (watcher, _) = Actor::spawn(None, Watcher, tx).await.unwrap();
        let args = RemoteReplicaArgs::new(args, host);
        Actor::spawn_linked(None, RemoteReplica, args, watcher.get_cell())
            .await
            .unwrap();
        let why = tokio::time::timeout(std::time::Duration::from_secs(30), rx.recv())
            .await
            .expect("the stand-in stopped")
            .unwrap();
        assert_eq!(why.as_deref(), Some("its node 'n-1' was lost"));
        watcher.stop(None);
        head.stop().await;
    }

    #[test]
    fn reports_go_in_parts_under_the_budget_in_order() {
        let one = rmp_serde::to_vec_named(&report(1)).unwrap().len();
        let ids = |parts: &[Vec<ReplicaReport>]| -> Vec<Vec<u64>> {
            parts
                .iter()
                .map(|p| p.iter().map(|r| r.id).collect())
                .collect()
        };
        let reports = || (1..=5).map(report).collect::<Vec<_>>();
        assert_eq!(
            ids(&in_parts(reports(), 2 * one)),
            [vec![1, 2], vec![3, 4], vec![5]]
        );
        assert_eq!(
            ids(&in_parts(reports(), REPORTS_PART)),
            [vec![1, 2, 3, 4, 5]]
        );
        // A report larger than the budget goes alone; nothing is dropped.
        assert_eq!(ids(&in_parts(reports(), 1)), [[1], [2], [3], [4], [5]]);
        assert_eq!(ids(&in_parts(Vec::new(), 1)), [Vec::<u64>::new()]);
    }
}
