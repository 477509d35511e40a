//! The node's peer nodes: the ones it dials (of those the head lists
//! alive), heartbeats on the sessions between nodes, and the sessions dropped
//! when the head declares a peer lost.

use std::collections::HashSet;

use ractor::ActorRef;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{
    super::{link::dials, wire::Control},
    AgentMsg, AgentState, Course, is_head,
};

/// The head's `Nodes`: the peers to dial now, and the sessions to drop (those
/// of peers it declared lost).
pub(super) fn nodes_listed(
    myself: &ActorRef<AgentMsg>,
    state: &mut AgentState,
    alive: Vec<String>,
    ids: Vec<String>,
    listen: Vec<String>,
    settled: bool,
) {
    state.peers = ids;
    let me = state.args.link.shared.me.clone();
    state.to_dial = alive
        .iter()
        .zip(listen)
        .filter(|(peer, listen)| !is_head(peer) && dials(&me, peer) && !listen.is_empty())
        .map(|(peer, listen)| (peer.clone(), listen))
        .collect();
    state
        .dialing_peers
        .retain(|peer, _| state.to_dial.contains_key(peer));
    state
        .unreachable
        .retain(|peer| state.to_dial.contains_key(peer));
    meet_peers(myself, state);
    let connected = state.args.link.shared.connected();
    let lost = declared_lost(&connected, &state.listed, &state.inherited, &alive, settled);
    state.fenced.note(&state.listed, &alive, &lost);
    if settled {
        state.inherited.clear();
    }
    for peer in lost {
        state
            .args
            .link
            .shared
            .drop_session(&peer, "the head declared that node lost");
    }
    state.listed = alive.into_iter().collect();
}

/// Dial every live peer node this one dials ([`dials`]) and has no session
/// to, off the mailbox: the other of each pair waits to be dialed.
pub(super) fn meet_peers(myself: &ActorRef<AgentMsg>, state: &mut AgentState) {
    if !matches!(state.course, Course::Serving) {
        return;
    }
    let link = &state.args.link;
    let connected: HashSet<String> = link.shared.connected().into_iter().collect();
    let patience = state.args.options.connect_timeout.saturating_mul(2);
    state
        .dialing_peers
        .retain(|peer, since| !connected.contains(peer) && since.elapsed() < patience);
    for (peer, listen) in &state.to_dial {
        if connected.contains(peer) || state.dialing_peers.contains_key(peer) {
            continue;
        }
        state.dialing_peers.insert(peer.clone(), Instant::now());
        let at = state.args.options.peer_dial_address(listen);
        info!(node = %state.args.id, %peer, %listen, %at, "dialing a peer node");
        let (link, me, peer, listen) = (link.clone(), myself.clone(), peer.clone(), at);
        let timeout = state.args.options.connect_timeout;
        tokio::spawn(async move {
            let error = link.dial(&listen, timeout).await.err();
            let _ = me.cast(AgentMsg::PeerDialed { peer, error });
        });
    }
}

/// Heartbeats on the sessions between this node and its peer nodes (the
/// head's session has its own): a beat to each every `heartbeat`, and a
/// session from which nothing came for `heartbeat_timeout` (no beat, no
/// answer, no other frame) stopped. The head cannot see a partition between
/// two of its nodes that both still reach it: without this, calls in flight
/// over the silent session would wait for ever. They fail as `NodeLost`
/// (they may have run), the next calls go to the peer's replicas once a
/// session is back, and the node whose name sorts last dials again.
pub(super) fn peer_beats(state: &mut AgentState) {
    let shared = &state.args.link.shared;
    let options = &state.args.options;
    if state.last_peer_beat.elapsed() >= options.heartbeat {
        state.last_peer_beat = Instant::now();
        for peer in shared.connected().iter().filter(|p| !is_head(p)) {
            shared.send_control(peer, Control::PeerBeat { answer: false });
        }
    }
    let timeout = options.heartbeat_timeout;
    for peer in shared.drop_silent(timeout, |p| !is_head(p), "peer heartbeat timeout") {
        warn!(node = %state.args.id, %peer,
            "no heartbeat from the peer node for {} ms: dropped its session",
            timeout.as_millis());
    }
}

/// A beat from a peer node with a session here is answered (the port counted
/// it as heard); an answer is not.
pub(super) fn peer_beat(state: &AgentState, peer: &str, answer: bool) {
    let shared = &state.args.link.shared;
    if !answer && !is_head(peer) && shared.is_connected(peer) {
        shared.send_control(peer, Control::PeerBeat { answer: true });
    }
}

/// The peers to drop on a `Nodes` frame: connected ones (not the head) the
/// frame omits that this head session listed alive before, or, once the
/// head says its wait for its nodes is over (`settled`), that this node had
/// sessions to before this head (`inherited`). A restarted head lists the
/// nodes as they re-attach, and a frame sent before a node joined omits it:
/// neither is a loss, and the nodes' sessions to each other (and their
/// calls) go on meanwhile.
fn declared_lost(
    connected: &[String],
    listed: &HashSet<String>,
    inherited: &HashSet<String>,
    alive: &[String],
    settled: bool,
) -> Vec<String> {
    connected
        .iter()
        .filter(|p| {
            !is_head(p)
                && !alive.contains(p)
                && (listed.contains(*p) || (settled && inherited.contains(*p)))
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    /// A head's `Nodes` drops only the peers it listed before and omits now:
    /// a restarted head's first lists (the nodes back so far) and a frame that
    /// predates a node's join leave the sessions between nodes alone.
    #[test]
    fn only_peers_the_head_listed_and_then_omitted_are_dropped() {
        let s = |v: &[&str]| v.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
        let connected = s(&["node-b@h", "node-c@h"]);
        let none: HashSet<String> = HashSet::new();
        let inherited: HashSet<String> = connected.iter().cloned().collect();
        let only_a = s(&["node-a@h"]);
        // A new head session that lists only this node so far.
        assert!(declared_lost(&connected, &none, &inherited, &only_a, false).is_empty());
        // Its wait is over and it still does not list them: gone for it.
        assert_eq!(
            declared_lost(&connected, &none, &inherited, &only_a, true),
            connected
        );
        // Listed, then omitted: lost.
        let listed: HashSet<String> = s(&["node-a@h", "node-b@h"]).into_iter().collect();
        assert_eq!(
            declared_lost(&connected, &listed, &none, &only_a, true),
            s(&["node-b@h"]),
            "c was never listed nor inherited: a later join, not a loss"
        );
    }
}
