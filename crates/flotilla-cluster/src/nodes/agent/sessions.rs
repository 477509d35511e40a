//! The node's sessions: dialing its head, and sessions opening and closing
//! (the head's, which join or re-attach this node, and its peer nodes').

use ractor::ActorRef;
use tracing::{error, info, warn};

use super::{
    super::{
        link::{SessionEnd, SessionEvent},
        wire::{Control, Hello, REPORTS_PART, ReplicaReport, WireModels, WirePhase, in_parts},
    },
    AgentMsg, AgentState, Ending, REFUSALS_TO_END, is_head,
    routes::forget_replicas_of,
};

/// Dial the head, off the mailbox.
pub(super) fn dial(myself: &ActorRef<AgentMsg>, state: &mut AgentState) {
    state.head.dial();
    let (link, addr, timeout) = (
        state.args.link.clone(),
        state.args.options.head,
        state.args.options.connect_timeout,
    );
    let me = myself.clone();
    tokio::spawn(async move {
        let r = link.dial(&addr.to_string(), timeout).await.err();
        let _ = me.cast(AgentMsg::Dialed(r));
    });
}

pub(super) fn session(myself: &ActorRef<AgentMsg>, state: &mut AgentState, ev: SessionEvent) {
    match ev {
        SessionEvent::Opened { .. } => {}
        SessionEvent::Ready {
            peer,
            addr,
            outbound,
            ..
        } if outbound && state.dials_head(&addr) => {
            if !is_head(&peer) {
                // Something else listens where the head should: a node's
                // listener, or another program holding the cookie. Its
                // close (below) dials again (and counts the failure: logged
                // at the 1st, 2nd, 4th, 8th... as the others are).
                if (state.head.attempts().failed_dials)
                    .saturating_add(1)
                    .is_power_of_two()
                {
                    error!(node = %state.args.id, head = %addr, %peer,
                        "the process at the head's address is not a Flotilla head; dialing again");
                }
                state
                    .args
                    .link
                    .shared
                    .drop_session(&peer, "not a Flotilla head");
                return;
            }
            state.head.joined(peer.clone());
            let (hello, rest) = hello(state);
            info!(node = %state.args.id, head = %peer,
                replicas = hello.replicas.len() + rest.iter().map(Vec::len).sum::<usize>(),
                frames = 1 + rest.len(), "connected to the head: joining");
            if !state.to_head(Control::Hello(hello)) {
                // The head answers this node's heartbeats whether it joined
                // or not: a session whose Hello went nowhere would stay up,
                // unjoined, for good. Closed, it is dialed again.
                warn!(node = %state.args.id,
                    "hello not sent: the head's port is not visible; closing the session to join again");
                state
                    .args
                    .link
                    .shared
                    .drop_session(&peer, "the hello could not be sent");
                return;
            }
            let parts = rest.len();
            for (i, reports) in rest.into_iter().enumerate() {
                let more = i + 1 < parts;
                if !state.to_head(Control::Replicas { reports, more }) {
                    // A join left half-done would never end: start again.
                    warn!(node = %state.args.id,
                        "replica reports not sent: closing the session to join again");
                    state
                        .args
                        .link
                        .shared
                        .drop_session(&peer, "a re-attach's reports could not be sent");
                    return;
                }
            }
        }
        SessionEvent::Ready { peer, outbound, .. } => {
            // Who dialed is the session's own fact: the dial's entry may be
            // gone already (`meet_peers` drops entries of peers the link lists
            // as connected, which it may do before this event arrives).
            state.dialing_peers.remove(&peer);
            if state.fenced.contains(&peer) {
                // Cut off from the head, not from this node: its replicas are
                // being replaced, and no call of ours goes to them.
                warn!(node = %state.args.id, %peer,
                    "a peer node the head declared lost connected: dropped its session");
                state
                    .args
                    .link
                    .shared
                    .drop_session(&peer, "a peer node the head declared lost");
                return;
            }
            info!(node = %state.args.id, %peer, dialed = outbound, "connected to a peer node");
        }
        SessionEvent::Closed {
            addr,
            outbound,
            end: SessionEnd::Authenticated { peer },
        } => {
            if state.head.closed(&peer) {
                warn!(node = %state.args.id, head = %peer,
                    "lost the head; replicas keep serving; dialing again");
                forget_replicas_of(state, &peer);
                let _ = state.redial_later(myself);
            } else if outbound && state.dials_head(&addr) && !state.head.is_joined() {
                // The head dial's session ended before it became the head's
                // (it closed before it was ready, or it was not a head).
                state.head.dial_ended();
                let _ = state.redial_later(myself);
            }
        }
        // Only the session this node dialed to the head tells about the
        // head: peer nodes dial this one too, and one with a wrong cookie
        // closes mid-handshake without saying anything about the head.
        SessionEvent::Closed {
            addr,
            outbound,
            end,
        } if outbound && state.dials_head(&addr) && !state.head.is_joined() => {
            state.head.dial_ended();
            if end == SessionEnd::Refused {
                // A wrong cookie and a connection cut mid-handshake look
                // alike here (docs/nodes.md, ractor_cluster's limit 6): one
                // refusal may be a network blip or a head that died mid-
                // handshake, and ending would stop every replica for good.
                let refusals = state.head.refused();
                if refusals >= REFUSALS_TO_END {
                    let reason = "authentication failed (wrong cookie?)".to_owned();
                    error!(node = %state.args.id, head = %addr, refusals,
                        "the head refused this node: {reason}");
                    state.end(Ending::Refused(reason));
                } else {
                    warn!(node = %state.args.id, head = %addr, refusals,
                        "the handshake with the head failed (a wrong cookie, or the connection \
                         dropped mid-handshake); dialing again");
                    let _ = state.redial_later(myself);
                }
            } else {
                // Not a refusal: the head closed it before its challenge (a
                // head holding as many handshakes as it may, as when many
                // nodes dial a restarted head at once), or it stalled; or
                // what listens there is no Flotilla head (an HTTP server).
                if state.redial_later(myself) {
                    warn!(node = %state.args.id, head = %addr, ?end,
                        failed_dials = state.head.attempts().failed_dials,
                        "the connection to the head ended before the handshake did (is a \
                         Flotilla head listening there?); dialing again (logged at the 1st, \
                         2nd, 4th, 8th... failure)");
                }
            }
        }
        SessionEvent::Closed { addr, end, .. } => {
            info!(node = %state.args.id, peer = %addr, ?end,
                "a connection that never authenticated closed");
        }
    }
}

/// This node's `Hello`, and the parts of its replica reports that follow it
/// (`Replicas` frames) when they do not fit one frame.
fn hello(state: &AgentState) -> (Hello, Vec<Vec<ReplicaReport>>) {
    let reports = state
        .replicas
        .iter()
        .map(|(id, r)| ReplicaReport {
            id: id.0,
            app: r.app.clone(),
            spec: Box::new((*r.spec).clone()),
            version: r.account.version.clone(),
            phase: WirePhase::from(r.account.phase),
            condemned: r.account.condemned.clone(),
            models: r
                .endpoint
                .as_ref()
                .and_then(|e| e.models())
                .map(|m| WireModels::from(&m)),
        })
        .collect();
    let mut parts = in_parts(reports, REPORTS_PART).into_iter();
    let replicas = parts.next().unwrap_or_default();
    let rest: Vec<_> = parts.collect();
    let hello = Hello {
        node: state.args.id.clone(),
        resources: state.args.options.resources.clone(),
        labels: state.args.options.labels.clone(),
        last_head: state.args.last_head,
        peers: state.peers.clone(),
        replicas,
        more: !rest.is_empty(),
    };
    (hello, rest)
}
