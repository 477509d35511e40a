//! What crosses the wire between processes (`docs/nodes.md`, "What crosses the
//! wire"): one remotable message type, [`PortMsg`], carrying MessagePack
//! encodings of typed frames. Decoding never panics: bad bytes are a
//! [`WireError`].

use std::sync::Arc;

use flotilla_core::{
    AppName, BatchConfig, DeploymentName, DeploymentSpec, DeploymentVersion, RequestRouterConfig,
    Resources,
};
use flotilla_replica::{BatchCounts, CallError, LogSnapshot, ModelCounts, ModelIds, ReplicaEvent};
use ractor_cluster::RactorClusterMessage;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// The one message Flotilla sends across processes, to a process's port.
/// Every field is bytes, so the derive needs no hand-written conversion.
#[derive(RactorClusterMessage)]
pub(crate) enum PortMsg {
    /// A control frame: an encoded [`Envelope`].
    Control(Vec<u8>),
    /// A data frame: an encoded [`DataHeader`], and the request or response
    /// bytes exactly as the handle or the replica made them.
    Data(Vec<u8>, Vec<u8>),
    /// Local, from the process's own link to its port: a peer's session
    /// closed (an encoded [`Closed`]). Every frame of that session that
    /// reached the port is ahead of it in the mailbox.
    Closed(Vec<u8>),
}

/// What [`PortMsg::Closed`] carries. The process's own secret makes one
/// that a peer sends (it is a remotable message) count for nothing.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Closed {
    /// The process's secret, random per link.
    pub secret: u64,
    /// The peer (its ractor name) whose session closed (empty for a mark
    /// that only passes an event on).
    pub peer: String,
    /// Stop the calls the peer made here that are still running (or still
    /// queued ahead of this mark).
    pub abandon: bool,
    /// The session event the port passes on when it reaches this mark (an
    /// index into the link's held events), after every frame sessions put
    /// in the port's mailbox before it.
    pub event: Option<u64>,
}

/// A frame that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Encoding failed (a value serde cannot write).
    #[error("could not encode a {what} frame")]
    Encode {
        /// Which frame.
        what: &'static str,
        /// Why.
        #[source]
        source: rmp_serde::encode::Error,
    },
    /// The bytes are not a frame of this kind (another version, or damage).
    #[error("could not decode a {what} frame of {len} bytes")]
    Decode {
        /// Which frame.
        what: &'static str,
        /// Its length.
        len: usize,
        /// Why.
        #[source]
        source: rmp_serde::decode::Error,
    },
}

pub(crate) fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, WireError> {
    rmp_serde::to_vec_named(value).map_err(|source| WireError::Encode { what, source })
}

pub(crate) fn decode<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, WireError> {
    rmp_serde::from_slice(bytes).map_err(|source| WireError::Decode {
        what,
        len: bytes.len(),
        source,
    })
}

/// A control frame and who sent it (ractor gives a receiver no sender).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Envelope {
    /// The sender's ractor node name (`name@host`), its port's address.
    pub from: String,
    /// The frame.
    pub control: Control,
}

/// Control frames: joins, heartbeats, replica lifecycle, routes.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Control {
    /// Node -> head: join, or re-attach with the replicas it runs.
    Hello(Hello),
    /// Head -> node: accepted.
    Welcome(Welcome),
    /// Head -> node: not accepted; the node fences and joins as a new node.
    Refused {
        /// Why, for the node's log.
        reason: String,
    },
    /// Both ways, every heartbeat period.
    Heartbeat {
        /// A counter, for logs.
        seq: u64,
    },
    /// Node <-> node, on a session between two nodes (the head's session has
    /// [`Control::Heartbeat`]): each sends its own every its heartbeat
    /// period, and the other answers each, so each side judges the session
    /// by its own period.
    PeerBeat {
        /// An answer to the peer's beat (not answered again).
        answer: bool,
    },
    /// Head -> node: start a replica.
    Start(Box<Start>),
    /// Head -> node: take a new config in place.
    Reconfigure {
        /// The replica.
        replica: u64,
        /// The new spec.
        spec: Box<DeploymentSpec>,
    },
    /// Head -> node: stop a replica.
    Stop {
        /// The replica.
        replica: u64,
        /// Drain first.
        graceful: bool,
    },
    /// Node -> head: a replica's event.
    Event {
        /// The replica.
        replica: u64,
        /// What happened.
        event: WireEvent,
    },
    /// Node -> head: the models a multiplexed replica holds now (sent when it
    /// starts serving and after every load and eviction).
    Models {
        /// The replica.
        replica: u64,
        /// What it holds.
        models: WireModels,
    },
    /// Node -> head: the node is shutting down. The head places nothing more
    /// on it; its replicas drain and stop (each reported `Exited`), then it
    /// says `Leaving` again and closes its session once the head answers, and
    /// the head counts it as left, not lost.
    ///
    /// Head -> node: the answer to each, with its `seq`: the head has read
    /// every frame the node sent before it.
    Leaving {
        /// Which of the node's `Leaving`s this is (or answers).
        seq: u64,
    },
    /// Node -> head: a replica ended.
    Exited {
        /// The replica.
        replica: u64,
        /// It crashed or was killed (else it stopped gracefully).
        crashed: bool,
        /// How, for logs.
        why: String,
    },
    /// Node -> head: more replicas of a re-attach, after its `Hello` (see
    /// [`Hello::more`]).
    Replicas {
        /// Replicas it runs.
        reports: Vec<ReplicaReport>,
        /// Whether more parts follow.
        more: bool,
    },
    /// Head -> node: routes that changed.
    Routes(Vec<RouteEntry>),
    /// Head -> node: every live route, once the head knows them all (its
    /// Controller recovered), in parts of at most `PRUNE_PART` names (a
    /// frame's size is bounded); after the last part the node drops its copy
    /// of any other.
    Prune {
        /// Live routes.
        keep: Vec<(AppName, DeploymentName)>,
        /// Which part this is: the first (0) starts a new set.
        part: u32,
        /// Whether more parts follow.
        more: bool,
    },
    /// Head -> node: the live nodes (ractor names), after every change.
    Nodes {
        /// Their ractor names.
        alive: Vec<String>,
        /// Their Flotilla node ids, in the same order.
        ids: Vec<String>,
        /// Where each one's `NodeServer` listens (`host:port`), in the same
        /// order: what the node that [`dials`](super::link::dials) a peer
        /// dials.
        listen: Vec<String>,
        /// The head's wait for its nodes to re-attach is over (after its
        /// restart: every node it expects is back, or its grace ran out): a
        /// node drops its sessions, from before this head, to peers the head
        /// does not list.
        #[serde(default)]
        settled: bool,
    },
    /// Node -> head, with a heartbeat, when it changed since the last one:
    /// the load the head's autoscalers cannot see from there.
    Load(WireLoad),
    /// Head -> node: the logging settings, whole (after every change, and to
    /// a node that joins), which the node's replicas log by.
    Logging(Box<LogSnapshot>),
    /// Node -> head, with a heartbeat: the batch and model figures of its
    /// replicas whose figures changed since the last (every replica's to a
    /// new head session), at most [`FIGURES_PART`] per frame; the head's
    /// `/metrics` exports them.
    Figures(Vec<WireFigures>),
}

/// Replicas per [`Control::Figures`] frame: about 1 KiB each, so a frame
/// stays near half a MiB (see [`REPORTS_PART`]).
pub(crate) const FIGURES_PART: usize = 512;

/// One replica's batch and model figures, whole (see [`Control::Figures`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireFigures {
    /// The replica.
    pub replica: u64,
    /// Its batcher's, once it batched.
    pub batches: Option<BatchCounts>,
    /// Its model cache's, if it is multiplexed.
    pub models: Option<ModelCounts>,
}

/// The load a node sees: the requests running on its replicas (from every
/// caller) and the callers waiting in its handles. Only what is not zero;
/// the head takes each report whole, in place of the node's last.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireLoad {
    /// Its replicas with requests running: (replica id, requests).
    pub running: Vec<(u64, u32)>,
    /// Its copies of routes with callers waiting: (application, deployment,
    /// callers).
    pub queued: Vec<(AppName, DeploymentName, u32)>,
}

impl WireLoad {
    /// Nothing runs and nobody waits.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty() && self.queued.is_empty()
    }
}

/// A node's join.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Hello {
    /// Its Flotilla node id (new for every incarnation).
    pub node: String,
    /// What it offers.
    pub resources: Resources,
    /// Its labels.
    pub labels: Vec<(String, String)>,
    /// The epoch of the head it was last welcomed by (re-attach), if any.
    pub last_head: Option<u64>,
    /// The node ids it last knew alive (a restarted head waits for them).
    pub peers: Vec<String>,
    /// The replicas it runs: all of them, or the first part when `more`.
    pub replicas: Vec<ReplicaReport>,
    /// The rest follow in `Replicas` frames: a frame's size is bounded, and
    /// a node may run more replica specs than one frame holds.
    #[serde(default)]
    pub more: bool,
}

/// Bytes of replica reports per frame of a re-attach (`Hello`, then
/// `Replicas`): far under the 64 MiB frame limit, and small enough that each
/// part (which the head counts as hearing from the node) crosses a slow link
/// well within the heartbeat timeout (1 MiB: 2 s at 4 Mbit/s).
pub(crate) const REPORTS_PART: usize = 1 << 20;

/// `reports` in parts of at most `budget` encoded bytes each (a report larger
/// than `budget` is a part of its own), in order; at least one part.
pub(crate) fn in_parts(reports: Vec<ReplicaReport>, budget: usize) -> Vec<Vec<ReplicaReport>> {
    let mut parts = vec![Vec::new()];
    let mut size = 0;
    for r in reports {
        // What it adds to the frame. One that does not encode would fail its
        // whole frame: it is left out (its replica runs on, unreported, and
        // is stopped by nobody; no spec has failed to encode so far).
        let len = match rmp_serde::to_vec_named(&r) {
            Ok(b) => b.len(),
            Err(e) => {
                tracing::error!(replica = r.id, app = %r.app, error = %e,
                    "replica report does not encode: left out of the re-attach");
                continue;
            }
        };
        if size + len > budget && parts.last().is_some_and(|p| !p.is_empty()) {
            parts.push(Vec::new());
            size = 0;
        }
        size += len;
        if let Some(part) = parts.last_mut() {
            part.push(r);
        }
    }
    parts
}

/// One replica a re-attaching node runs.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReplicaReport {
    /// Its id.
    pub id: u64,
    /// Its application.
    pub app: AppName,
    /// Its spec (names the deployment; its resources are reserved again).
    pub spec: Box<DeploymentSpec>,
    /// The version it runs.
    pub version: DeploymentVersion,
    /// Where it is in its life.
    pub phase: WirePhase,
    /// Why it must be replaced, if it knows.
    pub condemned: Option<String>,
    /// The models it holds, if it is multiplexed and serving.
    pub models: Option<WireModels>,
}

/// A multiplexed replica's models, as `flotilla_replica::ModelIds`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireModels {
    pub loaded: Vec<String>,
    pub loading: Vec<String>,
}

impl From<&ModelIds> for WireModels {
    fn from(ids: &ModelIds) -> Self {
        let strings = |v: &[Arc<str>]| v.iter().map(|m| m.to_string()).collect();
        WireModels {
            loaded: strings(&ids.loaded),
            loading: strings(&ids.loading),
        }
    }
}

impl From<WireModels> for ModelIds {
    fn from(m: WireModels) -> Self {
        let arcs = |v: Vec<String>| v.into_iter().map(Arc::from).collect();
        ModelIds {
            loaded: arcs(m.loaded),
            loading: arcs(m.loading),
        }
    }
}

/// A replica's phase, as `flotilla_replica::ReplicaPhase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum WirePhase {
    Starting,
    Running,
    Updating,
    Stopping,
    StartFailed,
}

impl From<flotilla_replica::ReplicaPhase> for WirePhase {
    fn from(p: flotilla_replica::ReplicaPhase) -> Self {
        use flotilla_replica::ReplicaPhase as P;
        match p {
            P::Starting => WirePhase::Starting,
            P::Running => WirePhase::Running,
            P::Updating => WirePhase::Updating,
            P::Stopping => WirePhase::Stopping,
            P::StartFailed => WirePhase::StartFailed,
        }
    }
}

impl From<WirePhase> for flotilla_replica::ReplicaPhase {
    fn from(p: WirePhase) -> Self {
        use flotilla_replica::ReplicaPhase as P;
        match p {
            WirePhase::Starting => P::Starting,
            WirePhase::Running => P::Running,
            WirePhase::Updating => P::Updating,
            WirePhase::Stopping => P::Stopping,
            WirePhase::StartFailed => P::StartFailed,
        }
    }
}

/// The head's welcome.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Welcome {
    /// The head's epoch (random per head process life).
    pub epoch: u64,
    /// The head's namespace (replica actor names carry it).
    pub ns: String,
    /// The head's own node id (where head-local replicas run).
    pub head_node: String,
}

/// Start one replica.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Start {
    /// Its id.
    pub replica: u64,
    /// Its application.
    pub app: AppName,
    /// Its spec.
    pub spec: DeploymentSpec,
    /// The spec's version, as the DeploymentActor computed it.
    pub version: DeploymentVersion,
}

/// A replica's event as it crosses: `ReplicaEvent` without the endpoint (the
/// head makes a remote endpoint for it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum WireEvent {
    Ready { version: DeploymentVersion },
    StartFailed { error: String },
    Unhealthy { reason: String },
    Reconfigured { version: DeploymentVersion },
    ReconfigureFailed { error: String },
}

impl WireEvent {
    pub(crate) fn of(event: &ReplicaEvent) -> Self {
        match event {
            ReplicaEvent::Ready { version, .. } => WireEvent::Ready {
                version: version.clone(),
            },
            ReplicaEvent::StartFailed { error } => WireEvent::StartFailed {
                error: error.clone(),
            },
            ReplicaEvent::Unhealthy { reason } => WireEvent::Unhealthy {
                reason: reason.clone(),
            },
            ReplicaEvent::Reconfigured { version } => WireEvent::Reconfigured {
                version: version.clone(),
            },
            ReplicaEvent::ReconfigureFailed { error } => WireEvent::ReconfigureFailed {
                error: error.clone(),
            },
        }
    }
}

/// One deployment's route, as nodes copy it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RouteEntry {
    pub app: AppName,
    pub deployment: DeploymentName,
    /// `None` is unbounded.
    pub max_queued: Option<u32>,
    /// The deployment's batching (`None`: off), for its replicas there.
    pub batching: Option<BatchConfig>,
    /// Its models per replica (`None`: no limit), for its replicas there.
    pub max_models: Option<u32>,
    /// Its request router, when not the built-in one: callers there route
    /// by it (made by their own registry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<RequestRouterConfig>,
    pub replicas: Vec<RouteReplica>,
    /// The deployment was deleted: the node drops its copy (its callers
    /// there hear that it is not found), and no later frame names it unless
    /// a deployment of that name is deployed again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closed: bool,
    /// The deployment is DEPLOY_FAILED: callers there that find no replica
    /// fail at once, as on the head.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deploy_failed: bool,
}

/// One replica of a route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RouteReplica {
    pub id: u64,
    /// Its Flotilla node id (what `prefer_node` compares).
    pub node: String,
    /// Its process's ractor name (where requests go).
    pub peer: String,
    pub max_ongoing: u32,
    /// The models it holds, if it is multiplexed and has told (left out of
    /// the frame otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<WireModels>,
}

/// The header of a data frame; the body travels beside it, unencoded.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum DataHeader {
    /// Caller -> replica's process: run the body on `replica`.
    Call {
        call: u64,
        replica: u64,
        stream: bool,
        /// The caller's ractor name (where the reply goes).
        from: String,
        /// The request's multiplexed model id, if it has one (left out of the
        /// frame when it has none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// The caller went away.
    Cancel { call: u64, from: String },
    /// The response (the body), or the call's error.
    Reply { call: u64, error: Option<CallError> },
    /// One item of a stream (the body).
    Item { call: u64 },
    /// A stream ended, with its error if it failed.
    End { call: u64, error: Option<CallError> },
    /// Not started: the replica is full, stopping or unknown here.
    Refused { call: u64, full: bool },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_error_crosses_as_it_was() {
        let (app, deployment) = (String::from("a"), String::from("d"));
        let errors = [
            CallError::User("u".into()),
            CallError::Panicked("p".into()),
            CallError::Killed {
                replica: "r".into(),
            },
            CallError::NodeLost {
                node: "n".into(),
                replica: "r".into(),
            },
            CallError::BadRequest("q".into()),
            CallError::BadResponse("s".into()),
            CallError::BackPressure {
                app: app.clone(),
                deployment: deployment.clone(),
                queued: 3,
            },
            CallError::NotFound {
                app: app.clone(),
                deployment: deployment.clone(),
            },
            CallError::Unavailable {
                app: app.clone(),
                deployment: deployment.clone(),
            },
            CallError::DeployFailed {
                app: app.clone(),
                deployment: deployment.clone(),
            },
            CallError::BatchSize {
                app: app.clone(),
                deployment: deployment.clone(),
                requests: 4,
                responses: 3,
            },
            CallError::ModelLoad {
                model_id: "m".into(),
                message: "no".into(),
            },
            CallError::Timeout { app, deployment },
        ];
        // Every variant is listed: a new one fails to compile here first.
        for e in &errors {
            match e {
                CallError::User(_)
                | CallError::Panicked(_)
                | CallError::Killed { .. }
                | CallError::NodeLost { .. }
                | CallError::BadRequest(_)
                | CallError::BadResponse(_)
                | CallError::BackPressure { .. }
                | CallError::NotFound { .. }
                | CallError::Unavailable { .. }
                | CallError::DeployFailed { .. }
                | CallError::BatchSize { .. }
                | CallError::ModelLoad { .. }
                | CallError::Timeout { .. } => {}
            }
        }
        assert_eq!(errors.len(), 13, "one of each variant");
        for e in errors {
            let header = DataHeader::End {
                call: 9,
                error: Some(e.clone()),
            };
            let bytes = encode("data", &header).unwrap_or_default();
            match decode::<DataHeader>("data", &bytes) {
                Ok(DataHeader::End {
                    call: 9,
                    error: Some(back),
                }) => assert_eq!(back, e),
                other => panic!("{e:?} came back as {other:?}"),
            }
        }
    }

    #[test]
    fn frames_round_trip_and_bad_bytes_are_typed_errors() {
        let e = Envelope {
            from: "n@h".into(),
            control: Control::Heartbeat { seq: 7 },
        };
        let bytes = encode("control", &e).unwrap_or_default();
        let back: Envelope = decode("control", &bytes).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(back.control, Control::Heartbeat { seq: 7 }));
        let bad = decode::<Envelope>("control", &[0xc1, 0xff, 3]).unwrap_err();
        assert!(
            bad.to_string().contains("control frame of 3 bytes"),
            "{bad}"
        );
        let h = encode(
            "data",
            &DataHeader::Call {
                call: 1,
                replica: 2,
                stream: false,
                from: "x".into(),
                model: None,
            },
        )
        .unwrap_or_default();
        assert!(h.len() < 40, "a call header is small: {} bytes", h.len());
        assert!(decode::<DataHeader>("data", &h[..h.len() - 1]).is_err());
        let with_model = DataHeader::Call {
            call: 1,
            replica: 2,
            stream: true,
            from: "x".into(),
            model: Some("m1".into()),
        };
        let h = encode("data", &with_model).unwrap_or_default();
        let back: DataHeader = decode("data", &h).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(&back, DataHeader::Call { model: Some(m), stream: true, .. } if m == "m1"),
            "{back:?}"
        );
    }
}
