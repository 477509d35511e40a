//! The node agent: one actor per node incarnation. It joins (or re-attaches
//! to) the head, starts the replicas the head asks for and reports on them,
//! answers heartbeats, keeps the node's copy of every route, and fences the
//! node when the head refuses it (`docs/nodes.md`).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use flotilla_core::{
    AppName, DeploymentName, DeploymentSpec, Faults, RequestRouterConfig, actor_names,
};
use flotilla_replica::{
    Directory, OnExit, Registry, ReplicaActor, ReplicaArgs, ReplicaEndpoint, ReplicaEvent,
    ReplicaId, ReplicaMsg, ReplicaPhase, ReplicaReporter, remote::RemoteEndpoint,
};
use flotilla_supervision::{Backoff, Children};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{debug, error, info, warn};

use super::{
    AbortOnDrop, NodeError, NodeOptions,
    account::Account,
    fenced::Fenced,
    head::HEAD_NAME_PREFIX,
    link::{Inbound, Link, SessionEnd, SessionEvent, dials},
    on_model_changes,
    options::CHECK_PERIOD,
    transport::PeerCall,
    wire::{
        Control, Envelope, Hello, REPORTS_PART, ReplicaReport, RouteEntry, Start, WireEvent,
        WireLoad, WireModels, WirePhase, in_parts,
    },
};

/// How an incarnation ended.
#[derive(Debug, Clone)]
pub(crate) enum Ending {
    /// The head declared this node lost: its replicas are stopped; join as a
    /// new node.
    Fenced(String),
    /// The head refused the handshake (wrong cookie).
    Refused(String),
    /// Shut down.
    Stopped,
}

/// The agent's messages (local only).
#[derive(Debug)]
pub(crate) enum AgentMsg {
    Inbound(Inbound),
    Replica(ReplicaId, ReplicaEvent),
    /// A local multiplexed replica's models changed: tell the head.
    Models(ReplicaId),
    /// A dial of the head ended (an error: the reason).
    Dialed(Option<NodeError>),
    /// Dial the head again.
    Redial,
    /// A dial of the peer node `peer` ended (an error: the reason).
    PeerDialed {
        peer: String,
        error: Option<NodeError>,
    },
    Tick,
    /// Stop every replica, then end.
    Shutdown,
}

impl ractor::Message for AgentMsg {}

pub(crate) struct AgentArgs {
    pub(crate) id: String,
    pub(crate) options: NodeOptions,
    pub(crate) registry: Registry,
    pub(crate) link: Arc<Link>,
    /// The epoch of the head the previous incarnation knew.
    pub(crate) last_head: Option<u64>,
    pub(crate) ending: Option<oneshot::Sender<Ending>>,
    /// The node's live replica count, for shutdown.
    pub(crate) live: watch::Sender<usize>,
}

struct Local {
    app: AppName,
    spec: Arc<DeploymentSpec>,
    account: Account,
    endpoint: Option<Arc<ReplicaEndpoint>>,
    /// Forwards a multiplexed replica's model changes while it serves.
    models: Option<AbortOnDrop>,
}

struct Head {
    ns: String,
}

pub(crate) struct Agent;

pub(crate) struct AgentState {
    args: AgentArgs,
    directory: Directory,
    /// The head's session (authenticated), and the head once it welcomed us.
    session: Option<String>,
    head: Option<Head>,
    last_heard: Instant,
    /// When silence was last checked (`AgentMsg::Tick`).
    last_check: Instant,
    /// When this node last sent the head a heartbeat, and its number.
    last_beat: Instant,
    seq: u64,
    /// The load last reported to the head (sent again only when it changes).
    last_load: WireLoad,
    dialing: bool,
    /// Handshakes with the head that ended as refusals since its last
    /// session (see [`REFUSALS_TO_END`]).
    refusals: u32,
    /// Dials of the head that failed since its last session: the wait
    /// before the next grows with them ([`REDIAL_MAX`]), and they are
    /// logged at the 1st, 2nd, 4th, 8th... (a head gone for an hour is not
    /// 14,000 warnings).
    failed_dials: u32,
    replicas: HashMap<ReplicaId, Local>,
    children: Children<ReplicaId, ReplicaMsg>,
    routes: HashMap<(AppName, DeploymentName), RouteEntry>,
    /// The live routes of a `Prune` whose last part has not come yet.
    pruning: Option<Pruning>,
    mirrors: HashMap<ReplicaId, ((AppName, DeploymentName), RemoteEndpoint)>,
    peers: Vec<String>,
    /// The live peer nodes this node dials ([`dials`]), by ractor name, with
    /// where each listens.
    to_dial: HashMap<String, String>,
    /// Peers being dialed, since when: not dialed again until the session is
    /// ready, the dial fails, or `connect_timeout` passed twice over.
    dialing_peers: HashMap<String, Instant>,
    /// Peers whose last dial failed (warned once, then retried quietly).
    unreachable: HashSet<String>,
    /// When this node last sent its peer nodes a beat.
    last_peer_beat: Instant,
    /// The nodes the current head session last listed alive (`Nodes`).
    listed: HashSet<String>,
    /// Peers this node had sessions to when the current head welcomed it:
    /// dropped, if that head still does not list them, once it says its
    /// wait for its nodes is over.
    inherited: HashSet<String>,
    /// Peers a head declared lost (or that left): their sessions are
    /// dropped as they open.
    fenced: Fenced,
    shutting_down: bool,
    /// Shut down with every replica gone: the `Leaving` whose answer ends the
    /// node (the head has then read every replica's `Exited`), and when it
    /// was sent.
    farewell: Option<(u64, Instant)>,
    /// Refused by the head (declared lost): the replicas are being killed, and
    /// the incarnation ends with this reason once the last has exited.
    fencing: Option<String>,
    timer: Option<JoinHandle<()>>,
}

/// A node's load that stands is sent again every this many heartbeats.
const LOAD_REFRESH_BEATS: u64 = 10;

impl AgentState {
    /// The load the head's autoscalers cannot see from there: requests
    /// running on this node's replicas (every caller's, counted by their own
    /// endpoints) and callers waiting in this node's handles, in a stable
    /// order (a report is sent only when it differs from the last).
    fn load(&self) -> WireLoad {
        let mut running: Vec<(u64, u32)> = (self.replicas.iter())
            .filter_map(|(id, l)| Some((id.0, l.endpoint.as_ref()?.in_flight())))
            .filter(|(_, n)| *n > 0)
            .collect();
        running.sort_unstable();
        // Every route a caller here waits on: a copy of the head's, or one
        // a handle made before the copy came.
        let mut queued: Vec<(AppName, DeploymentName, u32)> = (self.directory.waiting())
            .into_iter()
            .map(|(app, dep, n)| (app, dep, u32::try_from(n).unwrap_or(u32::MAX)))
            .collect();
        queued.sort_unstable();
        WireLoad { running, queued }
    }

    fn to_head(&self, control: Control) -> bool {
        match &self.session {
            Some(peer) => self.args.link.shared.send_control(peer, control),
            None => false,
        }
    }

    /// Shut down, with no replica left: tell the head and end once it
    /// answers (every frame sent before has then been read, and the replicas'
    /// places are free there), or at once without a head. Ended by the tick
    /// if no answer comes within `heartbeat_timeout`.
    fn leave(&mut self) {
        if self.farewell.is_some() {
            return;
        }
        self.seq += 1;
        if self.head.is_some() && self.to_head(Control::Leaving { seq: self.seq }) {
            self.farewell = Some((self.seq, Instant::now()));
        } else {
            self.end(Ending::Stopped);
        }
    }

    fn end(&mut self, ending: Ending) {
        if let Some(tx) = self.args.ending.take() {
            let _ = tx.send(ending);
        }
    }

    fn live_changed(&self) {
        self.args.live.send_replace(self.replicas.len());
    }

    /// Whether a session whose address is `addr` is this node's dial to the
    /// head (a dialed session's address is the one dialed).
    fn dials_head(&self, addr: &str) -> bool {
        addr == self.args.options.head.to_string()
    }

    /// A dial of the head failed: dial again after `redial`, doubling per
    /// failure since the last session up to [`REDIAL_MAX`], unless the node
    /// is shutting down. Returns whether to log this failure (the 1st, 2nd,
    /// 4th, 8th...).
    fn redial_later(&mut self, myself: &ActorRef<AgentMsg>) -> bool {
        self.failed_dials = self.failed_dials.saturating_add(1);
        if !self.shutting_down {
            let first = self.args.options.redial;
            let wait = Backoff::new(first, REDIAL_MAX.max(first)).after(self.failed_dials);
            myself.send_after(wait, || AgentMsg::Redial);
        }
        self.failed_dials.is_power_of_two()
    }
}

/// The longest wait between dials of a head that stays unreachable (or
/// the node's `redial`, if longer): short enough that a restarted head's
/// nodes are back within its re-attach grace.
pub(crate) const REDIAL_MAX: Duration = Duration::from_secs(1);

/// Handshakes with the head ending as refusals, since the last session to
/// it, before the node gives up ([`Ending::Refused`]): a wrong cookie is
/// refused every time, a dropped connection is not.
const REFUSALS_TO_END: u32 = 3;

fn is_head(peer: &str) -> bool {
    peer.starts_with(HEAD_NAME_PREFIX)
}

impl Actor for Agent {
    type Msg = AgentMsg;
    type State = AgentState;
    type Arguments = AgentArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AgentMsg>,
        args: AgentArgs,
    ) -> Result<AgentState, ActorProcessingErr> {
        let timer = myself.send_interval(CHECK_PERIOD, || AgentMsg::Tick);
        Ok(AgentState {
            args,
            directory: Directory::new(),
            session: None,
            head: None,
            last_heard: Instant::now(),
            last_check: Instant::now(),
            last_beat: Instant::now(),
            last_load: WireLoad::default(),
            seq: 0,
            dialing: false,
            refusals: 0,
            failed_dials: 0,
            replicas: HashMap::new(),
            children: Children::new(),
            routes: HashMap::new(),
            pruning: None,
            mirrors: HashMap::new(),
            peers: Vec::new(),
            to_dial: HashMap::new(),
            dialing_peers: HashMap::new(),
            unreachable: HashSet::new(),
            last_peer_beat: Instant::now(),
            listed: HashSet::new(),
            inherited: HashSet::new(),
            fenced: Fenced::default(),
            shutting_down: false,
            farewell: None,
            fencing: None,
            timer: Some(timer),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<AgentMsg>,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        dial(&myself, state);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<AgentMsg>,
        msg: AgentMsg,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AgentMsg::Inbound(Inbound::Control(env)) => {
                Box::pin(control(&myself, state, env)).await;
            }
            AgentMsg::Inbound(Inbound::Session(ev)) => session(&myself, state, ev),
            AgentMsg::Replica(id, event) => replica_event(&myself, state, id, event),
            AgentMsg::Models(id) => {
                let models = state
                    .replicas
                    .get(&id)
                    .and_then(|r| r.endpoint.as_ref())
                    .and_then(|e| e.models());
                if let Some(m) = models {
                    state.to_head(Control::Models {
                        replica: id.0,
                        models: WireModels::from(&m),
                    });
                }
            }
            AgentMsg::Dialed(None) => {}
            AgentMsg::Dialed(Some(reason)) => {
                state.dialing = false;
                if state.session.is_none() && !state.shutting_down && state.redial_later(&myself) {
                    warn!(node = %state.args.id, head = %state.args.options.head, %reason,
                        failed_dials = state.failed_dials,
                        "head not reachable; dialing again (logged at the 1st, 2nd, 4th, 8th... failure)");
                }
            }
            AgentMsg::Redial => {
                if state.session.is_none() && !state.dialing && !state.shutting_down {
                    dial(&myself, state);
                }
            }
            AgentMsg::PeerDialed { peer, error } => match error {
                None => {
                    state.unreachable.remove(&peer);
                }
                Some(reason) => {
                    state.dialing_peers.remove(&peer);
                    if state.unreachable.insert(peer.clone()) {
                        warn!(node = %state.args.id, %peer, %reason,
                            "peer node not reachable; dialing again");
                    }
                }
            },
            AgentMsg::Tick => {
                // Time this node did not run is neither its head's silence
                // nor its peers'.
                let lost = (state.args.link.shared)
                    .excuse_stall(&mut state.last_check, state.args.options.heartbeat_timeout);
                if !lost.is_zero() {
                    state.last_heard = (state.last_heard + lost).min(Instant::now());
                    warn!(node = %state.args.id, lost_ms = lost.as_millis(),
                        "this node did not run for a while (stopped, paused or starved): \
                         its head's and peers' silence over that time is not held against them");
                }
                meet_peers(&myself, state);
                peer_beats(state);
                // The node's own heartbeat, every `NodeOptions::heartbeat`
                // from the start of its head session, before the welcome
                // too: the head's port answers each one, however long the
                // head takes to welcome it (a wave of joins), so the node
                // hears its head at least that often.
                if state.session.is_some()
                    && state.last_beat.elapsed() >= state.args.options.heartbeat
                {
                    state.last_beat = Instant::now();
                    state.seq += 1;
                    state.to_head(Control::Heartbeat { seq: state.seq });
                    // When it changed, and a load that stands now and then
                    // (the head applies a report to the routes and replicas
                    // it has: one it gets later, as after its restart, takes
                    // the load from the next); once welcomed.
                    let load = state.load();
                    let refresh = state.seq.is_multiple_of(LOAD_REFRESH_BEATS) && !load.is_empty();
                    if state.head.is_some()
                        && (load != state.last_load || refresh)
                        && state.to_head(Control::Load(load.clone()))
                    {
                        state.last_load = load;
                    }
                }
                let timeout = state.args.options.heartbeat_timeout;
                if let Some((_, since)) = state.farewell
                    && (state.session.is_none() || since.elapsed() > timeout)
                {
                    warn!(node = %state.args.id, "the head did not answer this node's leaving: ending");
                    state.end(Ending::Stopped);
                }
                // Any frame counts as heard, a data frame too (the link
                // stamps those). Said once: the session is gone until its
                // close comes.
                if let Some(peer) = state.session.clone()
                    && state.last_heard.elapsed() > timeout
                    && !state.args.link.shared.heard_within(&peer, timeout)
                    && state
                        .args
                        .link
                        .shared
                        .drop_session(&peer, "heartbeat timeout")
                {
                    warn!(node = %state.args.id, head = %peer,
                        "no heartbeat from the head for {} ms: dropped its session",
                        timeout.as_millis());
                }
            }
            AgentMsg::Shutdown => {
                state.shutting_down = true;
                // First, so that the replicas' exits below are not answered
                // with replacements placed here.
                state.seq += 1;
                if !state.to_head(Control::Leaving { seq: state.seq }) {
                    warn!(node = %state.args.id, "shutting down with no head to tell");
                }
                for (_, actor) in state.children.actors() {
                    let _ = actor.cast(ReplicaMsg::Stop { graceful: true });
                }
                if state.replicas.is_empty() {
                    state.leave();
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<AgentMsg>,
        evt: SupervisionEvent,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        let Some((id, how)) = state.children.exited(&evt) else {
            return Ok(());
        };
        state.children.remove(&id);
        state.args.link.shared.unserve(id);
        if let Some(r) = state.replicas.remove(&id) {
            info!(node = %state.args.id, app = %r.app, deployment = %r.spec.name,
                replica = %id, %how, "replica ended");
        }
        state.live_changed();
        state.to_head(Control::Exited {
            replica: id.0,
            crashed: how.is_crash(),
            why: how.to_string(),
        });
        if state.replicas.is_empty() {
            if let Some(reason) = state.fencing.take() {
                state.end(Ending::Fenced(reason));
            } else if state.shutting_down {
                state.leave();
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<AgentMsg>,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.timer.take() {
            t.abort();
        }
        Ok(())
    }
}

/// Dial the head, off the mailbox.
fn dial(myself: &ActorRef<AgentMsg>, state: &mut AgentState) {
    state.dialing = true;
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

/// Dial every live peer node this one dials ([`dials`]) and has no session
/// to, off the mailbox: the other of each pair waits to be dialed.
fn meet_peers(myself: &ActorRef<AgentMsg>, state: &mut AgentState) {
    if state.shutting_down || state.fencing.is_some() {
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
fn peer_beats(state: &mut AgentState) {
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
fn peer_beat(state: &AgentState, peer: &str, answer: bool) {
    let shared = &state.args.link.shared;
    if !answer && !is_head(peer) && shared.is_connected(peer) {
        shared.send_control(peer, Control::PeerBeat { answer: true });
    }
}

fn session(myself: &ActorRef<AgentMsg>, state: &mut AgentState, ev: SessionEvent) {
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
                if state.failed_dials.saturating_add(1).is_power_of_two() {
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
            state.dialing = false;
            state.session = Some(peer.clone());
            state.refusals = 0;
            state.failed_dials = 0;
            state.last_heard = Instant::now();
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
            if state.session.as_deref() == Some(peer.as_str()) {
                warn!(node = %state.args.id, head = %peer,
                    "lost the head; replicas keep serving; dialing again");
                state.session = None;
                state.head = None;
                forget_replicas_of(state, &peer);
                let _ = state.redial_later(myself);
            } else if outbound && state.dials_head(&addr) && state.session.is_none() {
                // The head dial's session ended before it became the head's
                // (it closed before it was ready, or it was not a head).
                state.dialing = false;
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
        } if outbound && state.dials_head(&addr) && state.session.is_none() => {
            state.dialing = false;
            if end == SessionEnd::Refused {
                // A wrong cookie and a connection cut mid-handshake look
                // alike here (docs/nodes.md, ractor_cluster's limit 6): one
                // refusal may be a network blip or a head that died mid-
                // handshake, and ending would stop every replica for good.
                state.refusals += 1;
                if state.refusals >= REFUSALS_TO_END {
                    let reason = "authentication failed (wrong cookie?)".to_owned();
                    error!(node = %state.args.id, head = %addr, refusals = state.refusals,
                        "the head refused this node: {reason}");
                    state.end(Ending::Refused(reason));
                } else {
                    warn!(node = %state.args.id, head = %addr, refusals = state.refusals,
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
                        failed_dials = state.failed_dials,
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

async fn control(myself: &ActorRef<AgentMsg>, state: &mut AgentState, env: Envelope) {
    if state.session.as_deref() != Some(env.from.as_str()) {
        if let Control::PeerBeat { answer } = env.control {
            peer_beat(state, &env.from, answer);
            return;
        }
        warn!(node = %state.args.id, from = %env.from,
            "control frame from a peer other than the head this node dialed: ignored");
        return;
    }
    state.last_heard = Instant::now();
    match env.control {
        Control::Welcome(w) => {
            info!(node = %state.args.id, head = %env.from, epoch = w.epoch,
                head_node = %w.head_node, "joined the head");
            state.args.last_head = Some(w.epoch);
            state.head = Some(Head { ns: w.ns });
            // A new head session lists the nodes back so far: those it has
            // not listed yet are not lost, until its wait for them is over.
            state.listed.clear();
            state.inherited = (state.args.link.shared.connected().into_iter())
                .filter(|p| !is_head(p))
                .collect();
            // A new head session knows none of this node's load.
            state.last_load = WireLoad::default();
        }
        Control::Refused { reason } => {
            warn!(node = %state.args.id, %reason,
                "the head refused this node: fencing (stopping every replica) to join as a new node");
            // The next incarnation joins only once no replica of this one
            // runs (handle_supervisor_evt ends it after the last exit).
            for (_, actor) in state.children.actors() {
                actor.kill();
            }
            if state.replicas.is_empty() {
                state.end(Ending::Fenced(reason));
            } else {
                state.fencing = Some(reason);
            }
        }
        // Heard (every frame from the head counts); not echoed: the head
        // answers the node's own heartbeats, so an echo would loop.
        Control::Heartbeat { .. } => {}
        Control::Leaving { seq } => {
            if state.farewell.is_some_and(|(last, _)| last == seq) {
                info!(node = %state.args.id, "the head heard this node leave");
                state.end(Ending::Stopped);
            }
        }
        Control::Start(s) => Box::pin(start_replica(myself, state, *s)).await,
        Control::Reconfigure { replica, spec } => {
            let spec = Arc::new(*spec);
            if let Some(r) = state.replicas.get_mut(&ReplicaId(replica)) {
                r.spec = spec.clone();
            }
            state.cast(ReplicaId(replica), ReplicaMsg::Reconfigure(spec));
        }
        Control::Stop { replica, graceful } => {
            let id = ReplicaId(replica);
            match state.children.actor(&id) {
                Some(actor) => {
                    if let Some(r) = state.replicas.get_mut(&id) {
                        r.account.phase = ReplicaPhase::Stopping;
                    }
                    let _ = actor.cast(ReplicaMsg::Stop { graceful });
                }
                None => {
                    state.to_head(Control::Exited {
                        replica,
                        crashed: false,
                        why: "not running on this node".to_owned(),
                    });
                }
            }
        }
        Control::Routes(entries) => {
            for e in entries {
                let key = (e.app.clone(), e.deployment.clone());
                if e.closed {
                    if state.routes.contains_key(&key) {
                        info!(node = %state.args.id, app = %key.0, deployment = %key.1,
                            "route dropped: the head deleted the deployment");
                    }
                    drop_route(state, &key);
                    continue;
                }
                state.routes.insert(key.clone(), e);
                publish(state, &key);
            }
        }
        Control::Prune { keep, part, more } => {
            let Some(live) = gather(&mut state.pruning, keep, part, more) else {
                return;
            };
            let stale: Vec<_> = (state.routes.keys())
                .filter(|k| !live.contains(*k))
                .cloned()
                .collect();
            for key in stale {
                info!(node = %state.args.id, app = %key.0, deployment = %key.1,
                    "route dropped: the head runs no such deployment");
                drop_route(state, &key);
            }
        }
        Control::Nodes {
            alive,
            ids,
            listen,
            settled,
        } => {
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
        Control::Logging(settings) => {
            debug!(node = %state.args.id, "logging settings from the head");
            state.args.options.logging.replace(*settings);
        }
        other => {
            warn!(node = %state.args.id, frame = ?other, "node: unexpected control frame");
        }
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

/// A `Prune` being gathered: the part expected next, and the names so far.
type Pruning = (u32, HashSet<(AppName, DeploymentName)>);

/// Add a `Prune` part to the set being gathered in `pending`: the whole set
/// once `more` is false. A part that is not the one expected next (a part
/// went missing, or the session changed mid-way) drops the set: pruning by
/// an incomplete one would drop live routes. The next set starts at part 0.
fn gather(
    pending: &mut Option<Pruning>,
    keep: Vec<(AppName, DeploymentName)>,
    part: u32,
    more: bool,
) -> Option<HashSet<(AppName, DeploymentName)>> {
    let mut live = match (part, pending.take()) {
        (0, _) => HashSet::new(),
        (_, Some((next, live))) if next == part => live,
        _ => return None,
    };
    live.extend(keep);
    if more {
        *pending = Some((part.saturating_add(1), live));
        return None;
    }
    Some(live)
}

/// Drop the copy of a deleted route: callers here hear so, as on the head.
fn drop_route(state: &mut AgentState, key: &(AppName, DeploymentName)) {
    state.routes.remove(key);
    state.mirrors.retain(|_, (k, _)| k != key);
    state.directory.remove(&key.0, &key.1);
}

impl AgentState {
    fn cast(&self, id: ReplicaId, msg: ReplicaMsg) {
        if let Some(a) = self.children.actor(&id) {
            let _ = a.cast(msg);
        }
    }
}

async fn start_replica(myself: &ActorRef<AgentMsg>, state: &mut AgentState, s: Start) {
    let id = ReplicaId(s.replica);
    let Some(ns) = state.head.as_ref().map(|h| h.ns.clone()) else {
        // The head welcomes a node before it places a replica there, so this
        // should not happen; if it does, the head hears that the replica
        // ended at once, as a failed start (counted and backed off), instead
        // of waiting for it.
        warn!(node = %state.args.id, app = %s.app, deployment = %s.spec.name, replica = %id,
            "start before the head's welcome: not started");
        state.to_head(Control::Exited {
            replica: s.replica,
            crashed: true,
            why: "start before the head's welcome".to_owned(),
        });
        return;
    };
    if state.replicas.contains_key(&id) {
        return;
    }
    if state.shutting_down {
        // Placed before the head heard `Leaving`: it ends at once, stopped
        // (not a failed start), and the head places it again elsewhere.
        info!(node = %state.args.id, app = %s.app, deployment = %s.spec.name, replica = %id,
            "start refused: the node is shutting down");
        state.to_head(Control::Exited {
            replica: s.replica,
            crashed: false,
            why: "not started: its node is shutting down".to_owned(),
        });
        return;
    }
    let spec = Arc::new(s.spec);
    let dep = spec.name.clone();
    // Its first requests may come before the route's next copy: take the
    // batching and model limit its spec was deployed with (later changes
    // come with the route).
    let route = state.directory.route(&s.app, &dep);
    route.set_batching(spec.config.batching);
    route.set_max_models_per_replica(spec.config.max_num_models_per_replica);
    let agent = myself.clone();
    let reporter: ReplicaReporter = Arc::new(move |id, event| {
        let _ = agent.cast(AgentMsg::Replica(id, event));
    });
    let args = ReplicaArgs {
        id,
        app: s.app.clone(),
        deployment: dep.clone(),
        spec: spec.clone(),
        version: s.version.clone(),
        registry: state.args.registry.clone(),
        directory: state.directory.clone(),
        route,
        reporter,
        group: actor_names::replica_group(&ns, &s.app, &dep),
        node: state.args.id.clone(),
        faults: Faults::new(),
        // Its place is reserved on the head, which its stand-in there gives back.
        on_exit: OnExit::none(),
    };
    let name = actor_names::replica(&ns, &s.app, &dep, id.0);
    let parent = myself.get_cell();
    match state
        .children
        .start(&parent, id, name, ReplicaActor, args)
        .await
    {
        Ok(_) => {
            info!(node = %state.args.id, app = %s.app, deployment = %dep, replica = %id,
                "replica started");
            state.replicas.insert(
                id,
                Local {
                    app: s.app,
                    spec,
                    account: Account::starting(s.version),
                    endpoint: None,
                    models: None,
                },
            );
            state.live_changed();
        }
        Err(e) => {
            warn!(node = %state.args.id, app = %s.app, deployment = %dep, replica = %id,
                error = %e, "replica not started");
            state.to_head(Control::Event {
                replica: id.0,
                event: WireEvent::StartFailed {
                    error: format!("the replica actor could not start on its node: {e}"),
                },
            });
        }
    }
}

fn replica_event(
    myself: &ActorRef<AgentMsg>,
    state: &mut AgentState,
    id: ReplicaId,
    event: ReplicaEvent,
) {
    let wire = WireEvent::of(&event);
    let Some(r) = state.replicas.get_mut(&id) else {
        return;
    };
    r.account.apply(&wire);
    if let ReplicaEvent::Ready { endpoint, .. } = event {
        state.args.link.shared.serve(endpoint.clone());
        // The head's routers prefer the replica holding a request's model:
        // tell it what this one holds, now and after every change.
        if r.models.is_none() && endpoint.is_multiplexed() {
            let _ = myself.cast(AgentMsg::Models(id));
            let agent = myself.clone();
            let span = tracing::debug_span!("report_models", replica = %id);
            r.models = on_model_changes(&endpoint, span, move || {
                agent.cast(AgentMsg::Models(id)).is_ok()
            });
        }
        r.endpoint = Some(endpoint);
        let keys: Vec<_> = state
            .routes
            .iter()
            .filter(|(_, e)| e.replicas.iter().any(|x| x.id == id.0))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            publish(state, &k);
        }
    }
    if !state.to_head(Control::Event {
        replica: id.0,
        event: wire,
    }) && let Some(r) = state.replicas.get(&id)
    {
        warn!(node = %state.args.id, app = %r.app, deployment = %r.spec.name, replica = %id,
            "replica event not sent: no head (it re-attaches with the replica's state)");
    }
}

/// The head `peer` is gone: its own replicas (those in its process) go from
/// every route copy, and the routes they leave are published again.
///
/// Nothing else would take them out. A head that comes back after a crash is
/// a new process under a new name, and it sends a route again only when the
/// route changes there; one whose replicas it cannot place soon (or ever)
/// never changes. Callers here would meanwhile try the dead replicas over and
/// over (no session reaches them), never waiting in the queue that the head
/// counts as load. If the same head answers again, its welcome sends every
/// route, its own replicas in them.
fn forget_replicas_of(state: &mut AgentState, peer: &str) {
    let changed = drop_replicas_of(&mut state.routes, peer);
    if !changed.is_empty() {
        info!(node = %state.args.id, head = %peer, routes = changed.len(),
            "the head's own replicas left this node's routes with it");
    }
    for key in changed {
        publish(state, &key);
    }
}

/// Take `peer`'s replicas out of `routes`; the keys of the routes they left.
fn drop_replicas_of(
    routes: &mut HashMap<(AppName, DeploymentName), RouteEntry>,
    peer: &str,
) -> Vec<(AppName, DeploymentName)> {
    routes
        .iter_mut()
        .filter_map(|(key, entry)| {
            let before = entry.replicas.len();
            entry.replicas.retain(|r| r.peer != peer);
            (entry.replicas.len() != before).then(|| key.clone())
        })
        .collect()
}

/// Publish the node's copy of a route: its own replicas' endpoints, and remote
/// endpoints (kept per replica) for the rest.
fn publish(state: &mut AgentState, key: &(AppName, DeploymentName)) {
    let Some(entry) = state.routes.get(key) else {
        return;
    };
    let route = state.directory.route(&key.0, &key.1);
    route.set_deploy_failed(entry.deploy_failed);
    route.set_max_queued(entry.max_queued);
    route.set_batching(entry.batching);
    route.set_max_models_per_replica(entry.max_models);
    let builtin = RequestRouterConfig::default();
    route.set_router_config(
        entry.router.as_ref().unwrap_or(&builtin),
        &state.args.registry,
    );
    let me = state.args.link.shared.me.clone();
    let mut set = Vec::with_capacity(entry.replicas.len());
    let mut ids = Vec::with_capacity(entry.replicas.len());
    for r in &entry.replicas {
        let id = ReplicaId(r.id);
        ids.push(id);
        if r.peer == me {
            if let Some(ep) = state.replicas.get(&id).and_then(|l| l.endpoint.clone()) {
                set.push(ep);
            }
            continue;
        }
        let (_, remote) = state.mirrors.entry(id).or_insert_with(|| {
            let call = PeerCall::boxed(
                state.args.link.shared.clone(),
                r.peer.clone(),
                r.node.clone(),
            );
            (
                key.clone(),
                RemoteEndpoint::new(id, r.node.clone(), call, r.max_ongoing, &route),
            )
        });
        remote.set_max_ongoing(r.max_ongoing);
        if let Some(models) = &r.models {
            remote.set_models(models.clone().into());
        }
        set.push(remote.endpoint().clone());
    }
    state
        .mirrors
        .retain(|id, (k, _)| k != key || ids.contains(id));
    route.publish(set);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::nodes::wire::RouteReplica;

    fn keys(names: &[&str]) -> Vec<(AppName, DeploymentName)> {
        names
            .iter()
            .map(|n| (AppName::new(*n).unwrap(), DeploymentName::new("d").unwrap()))
            .collect()
    }

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

    #[test]
    fn a_lost_heads_replicas_leave_every_route_and_only_theirs() {
        let replica = |id, peer: &str| RouteReplica {
            id,
            node: peer.to_owned(),
            peer: peer.to_owned(),
            max_ongoing: 5,
            models: None,
        };
        let entry = |key: &(AppName, DeploymentName), replicas| RouteEntry {
            app: key.0.clone(),
            deployment: key.1.clone(),
            max_queued: None,
            batching: None,
            max_models: None,
            router: None,
            replicas,
            closed: false,
            deploy_failed: false,
        };
        let k = keys(&["mixed", "nodes", "head"]);
        let mut routes: HashMap<_, _> = [
            (
                k[0].clone(),
                vec![replica(1, "head-1"), replica(2, "node-b")],
            ),
            (k[1].clone(), vec![replica(3, "node-b")]),
            (k[2].clone(), vec![replica(4, "head-1")]),
        ]
        .into_iter()
        .map(|(key, replicas)| (key.clone(), entry(&key, replicas)))
        .collect();
        let mut changed = drop_replicas_of(&mut routes, "head-1");
        changed.sort();
        let mut expected = vec![k[0].clone(), k[2].clone()];
        expected.sort();
        assert_eq!(changed, expected);
        let ids = |key: &(AppName, DeploymentName)| -> Vec<u64> {
            routes[key].replicas.iter().map(|r| r.id).collect()
        };
        assert_eq!(
            (ids(&k[0]), ids(&k[1]), ids(&k[2])),
            (vec![2], vec![3], vec![])
        );
        // The route stays (its callers wait for a replica); a second loss of
        // the same head changes nothing.
        assert!(drop_replicas_of(&mut routes, "head-1").is_empty());
    }

    #[test]
    fn prune_parts_gather_into_one_set_and_a_stray_part_prunes_nothing() {
        let mut pending = None;
        assert_eq!(gather(&mut pending, keys(&["a"]), 0, true), None);
        assert_eq!(gather(&mut pending, keys(&["b"]), 1, true), None);
        let all = gather(&mut pending, keys(&["c"]), 2, false).unwrap();
        assert_eq!(all, keys(&["a", "b", "c"]).into_iter().collect());
        assert!(pending.is_none());
        // One part alone is a whole set.
        let one = gather(&mut pending, keys(&["x"]), 0, false).unwrap();
        assert_eq!(one, keys(&["x"]).into_iter().collect());
        // A set begun on a session that closed mid-way: the next starts anew.
        assert_eq!(gather(&mut pending, keys(&["old"]), 0, true), None);
        let fresh = gather(&mut pending, keys(&["new"]), 0, false).unwrap();
        assert_eq!(fresh, keys(&["new"]).into_iter().collect());
        // The tail of a set whose first part this node never saw: nothing is
        // pruned by it (that would drop the routes of the missing parts).
        assert_eq!(gather(&mut pending, keys(&["tail"]), 1, false), None);
        assert!(pending.is_none());
        // A part missing in the middle: the set is dropped, not used.
        assert_eq!(gather(&mut pending, keys(&["a"]), 0, true), None);
        assert_eq!(gather(&mut pending, keys(&["c"]), 2, false), None);
        assert!(pending.is_none());
        assert_eq!(gather(&mut pending, keys(&["c"]), 1, false), None);
    }
}
