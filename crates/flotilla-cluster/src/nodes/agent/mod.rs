//! The node agent: one actor per node incarnation. It joins (or re-attaches
//! to) the head, starts the replicas the head asks for and reports on them,
//! answers heartbeats, keeps the node's copy of every route, and fences the
//! node when the head refuses it (`docs/nodes.md`).
//!
//! This module holds the actor, its state and its message dispatch; its
//! state machines are in `lifecycle`, and what it does per concern in
//! `sessions` (the head's and peers' sessions), `peers`, `routes` and
//! `replicas`.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use flotilla_core::{AppName, DeploymentName, DeploymentSpec};
use flotilla_replica::{
    Directory, Registry, ReplicaEndpoint, ReplicaEvent, ReplicaId, ReplicaMsg, ReplicaPhase,
    remote::RemoteEndpoint,
};
use flotilla_supervision::{Backoff, Children};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{debug, info, warn};

mod figures;
mod lifecycle;
mod peers;
mod replicas;
mod routes;
mod sessions;

use lifecycle::{Attempts, Course, HeadLink};
use peers::{meet_peers, nodes_listed, peer_beat, peer_beats};
use replicas::{replica_event, start_replica};
use routes::{Pruning, prune, routes_changed};
use sessions::{dial, session};

use flotilla_supervision::AbortOnDrop;

use super::{
    NodeError, NodeOptions,
    account::Account,
    fenced::Fenced,
    head::HEAD_NAME_PREFIX,
    link::{Inbound, Link},
    options::CHECK_PERIOD,
    wire::{Control, Envelope, RouteEntry, WireLoad, WireModels},
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
    /// A control frame from the head or a peer node, or an event of a
    /// session to one.
    Inbound(Inbound),
    /// A local replica's lifecycle event (ready, failed, stopped...).
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
    /// Every `CHECK_PERIOD`: excuse this node's own stalls, meet peers, and
    /// send the heartbeats that are due.
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
    models: Option<AbortOnDrop<()>>,
}

pub(crate) struct Agent;

pub(crate) struct AgentState {
    args: AgentArgs,
    directory: Directory,
    /// Where this node stands with its head.
    head: HeadLink,
    /// Whether it serves or is ending.
    course: Course,
    /// When silence was last checked (`AgentMsg::Tick`).
    last_check: Instant,
    /// When this node last sent the head a heartbeat, and its number.
    last_beat: Instant,
    seq: u64,
    /// The load last reported to the head (sent again only when it changes).
    last_load: WireLoad,
    /// The replicas' batch and model figures last reported to the head (each
    /// sent again when it changed, and all of them now and then: `figures`).
    figures: figures::Reported,
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
        match self.head.peer() {
            Some(peer) => self.args.link.shared.send_control(peer, control),
            None => false,
        }
    }

    /// Shut down, with no replica left: tell the head and end once it
    /// answers (every frame sent before has then been read, and the replicas'
    /// places are free there), or at once without a head. Ended by the tick
    /// if no answer comes within `heartbeat_timeout`.
    fn leave(&mut self) {
        if self.course.farewell().is_some() {
            return;
        }
        self.seq += 1;
        if self.head.welcomed().is_some() && self.to_head(Control::Leaving { seq: self.seq }) {
            self.course = Course::ShuttingDown {
                farewell: Some((self.seq, Instant::now())),
            };
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
        let failed = self.head.dial_failed();
        if !self.course.shutting_down() {
            let first = self.args.options.redial;
            let wait = Backoff::new(first, REDIAL_MAX.max(first)).after(failed);
            myself.send_after(wait, || AgentMsg::Redial);
        }
        failed.is_power_of_two()
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
            head: HeadLink::Apart(Attempts::default()),
            course: Course::Serving,
            last_check: Instant::now(),
            last_beat: Instant::now(),
            last_load: WireLoad::default(),
            figures: figures::Reported::default(),
            seq: 0,
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
                state.head.dial_ended();
                if !state.head.is_joined()
                    && !state.course.shutting_down()
                    && state.redial_later(&myself)
                {
                    warn!(node = %state.args.id, head = %state.args.options.head, %reason,
                        failed_dials = state.head.attempts().failed_dials,
                        "head not reachable; dialing again (logged at the 1st, 2nd, 4th, 8th... failure)");
                }
            }
            AgentMsg::Redial => {
                if matches!(state.head, HeadLink::Apart(_)) && !state.course.shutting_down() {
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
                    if let HeadLink::Joined(s) = &mut state.head {
                        s.last_heard = (s.last_heard + lost).min(Instant::now());
                    }
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
                if state.head.is_joined()
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
                    if state.head.welcomed().is_some()
                        && (load != state.last_load || refresh)
                        && state.to_head(Control::Load(load.clone()))
                    {
                        state.last_load = load;
                    }
                    if state.head.welcomed().is_some()
                        && state.seq.is_multiple_of(figures::REPORT_BEATS)
                    {
                        let all = state.seq.is_multiple_of(figures::REFRESH_BEATS);
                        figures::report(state, all);
                    }
                }
                let timeout = state.args.options.heartbeat_timeout;
                if let Some((_, since)) = state.course.farewell()
                    && (!state.head.is_joined() || since.elapsed() > timeout)
                {
                    warn!(node = %state.args.id, "the head did not answer this node's leaving: ending");
                    state.end(Ending::Stopped);
                }
                // Any frame counts as heard, a data frame too (the link
                // stamps those). Said once: the session is gone until its
                // close comes.
                if let HeadLink::Joined(s) = &state.head
                    && s.last_heard.elapsed() > timeout
                    && !state.args.link.shared.heard_within(&s.peer, timeout)
                    && state
                        .args
                        .link
                        .shared
                        .drop_session(&s.peer, "heartbeat timeout")
                {
                    warn!(node = %state.args.id, head = %s.peer,
                        "no heartbeat from the head for {} ms: dropped its session",
                        timeout.as_millis());
                }
            }
            AgentMsg::Shutdown => {
                state.course.shut_down();
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
            match &state.course {
                Course::Fencing { reason, .. } => {
                    let ending = Ending::Fenced(reason.clone());
                    state.end(ending);
                }
                Course::ShuttingDown { .. } => state.leave(),
                Course::Serving => {}
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
        // The incarnation is over (shut down or fenced): every route of its
        // directory closes, so calls waiting in its handles end `Unavailable`
        // rather than for ever, and its routes let go of their endpoints. A
        // route holds its replicas' endpoints, an endpoint the user's code,
        // and user code may hold a handle, which holds the directory: nothing
        // else breaks that cycle once no head sends the routes again, and the
        // incarnation (routes, link, its frames) stayed in memory.
        state.directory.shut_down();
        Ok(())
    }
}

async fn control(myself: &ActorRef<AgentMsg>, state: &mut AgentState, env: Envelope) {
    let head = match &mut state.head {
        HeadLink::Joined(head) if head.peer == env.from => head,
        _ => {
            if let Control::PeerBeat { answer } = env.control {
                peer_beat(state, &env.from, answer);
                return;
            }
            warn!(node = %state.args.id, from = %env.from,
                "control frame from a peer other than the head this node dialed: ignored");
            return;
        }
    };
    head.last_heard = Instant::now();
    match env.control {
        Control::Welcome(w) => {
            info!(node = %state.args.id, head = %env.from, epoch = w.epoch,
                head_node = %w.head_node, "joined the head");
            state.args.last_head = Some(w.epoch);
            head.ns = Some(w.ns);
            // A new head session lists the nodes back so far: those it has
            // not listed yet are not lost, until its wait for them is over.
            state.listed.clear();
            state.inherited = (state.args.link.shared.connected().into_iter())
                .filter(|p| !is_head(p))
                .collect();
            // A new head session knows none of this node's load or figures.
            state.last_load = WireLoad::default();
            state.figures.clear();
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
                state.course.fence(reason);
            }
        }
        // Heard (every frame from the head counts); not echoed: the head
        // answers the node's own heartbeats, so an echo would loop.
        Control::Heartbeat { .. } => {}
        Control::Leaving { seq } => {
            if state.course.farewell().is_some_and(|(last, _)| last == seq) {
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
        Control::Routes(entries) => routes_changed(state, entries),
        Control::Prune { keep, part, more } => prune(state, keep, part, more),
        Control::Nodes {
            alive,
            ids,
            listen,
            settled,
        } => nodes_listed(myself, state, alive, ids, listen, settled),
        Control::Logging(settings) => {
            debug!(node = %state.args.id, "logging settings from the head");
            state.args.options.logging.replace(*settings);
        }
        other => {
            warn!(node = %state.args.id, frame = ?other, "node: unexpected control frame");
        }
    }
}
