//! The head's registry of nodes: joins and refusals, heartbeats, losses,
//! re-attachment after a head restart, and the reports of remote replicas.

mod joins;
mod reports;
#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, atomic::Ordering},
};

use flotilla_core::{AppName, DeploymentName};
use flotilla_replica::ReplicaId;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::{task::JoinHandle, time::Instant};
use tracing::{debug, info, warn};

use super::{
    head::{HeadShared, lock},
    link::{Inbound, SessionEnd, SessionEvent},
    options::CHECK_PERIOD,
    proxy::ProxyReport,
    wire::{Control, Envelope, WireLoad},
};
use crate::ClusterEvent;
use joins::{hello, join_done, take_reports};
use reports::{deliver, report, take_load};

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

pub(super) fn touch(state: &RegistryState, peer: &str) {
    if let Some(id) = state.by_peer.get(peer)
        && let Some(n) = lock(&state.shared.nodes).get_mut(id)
    {
        n.last_heard = Instant::now();
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
            // Any peer can cause as many as it likes: logged at the 1st,
            // 2nd, 4th, 8th... (all are counted).
            if let Some(refused) = state.shared.refused.hit() {
                warn!(%addr, refused, "node connection refused: authentication failed \
                    (wrong cookie?; logged at the 1st, 2nd, 4th, 8th...)");
            }
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
pub(super) fn send(state: &RegistryState, peer: &str, control: Control) {
    if !state.shared.link.shared.send_control(peer, control) {
        warn!(%peer, "head: control frame not sent (peer unreachable)");
    }
}

/// The nodes alive, or where one listens, changed: the nodes hear it in one
/// `Nodes` broadcast, once the registry has read what its mailbox holds now.
pub(super) fn nodes_changed(state: &mut RegistryState) {
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
