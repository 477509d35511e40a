//! The port, a process's one remotable actor, and the serving of the calls
//! that reach it for local replicas.

use std::sync::{Arc, atomic::Ordering};

use flotilla_replica::{ReplicaEndpoint, ReplicaId, remote::Served};
use ractor::{Actor, ActorProcessingErr, ActorRef, pg};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Inbound, Outcome, PORTS, Shared, lock};

use crate::nodes::wire::{self, DataHeader, Envelope, PortMsg};

/// The one remotable actor of a process: decodes frames and dispatches them
/// without waiting (see `docs/nodes.md`, "Actors").
pub(super) struct Port;

impl Actor for Port {
    type Msg = PortMsg;
    type State = Arc<Shared>;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<PortMsg>,
        shared: Arc<Shared>,
    ) -> Result<Arc<Shared>, ActorProcessingErr> {
        pg::join(PORTS.to_owned(), vec![myself.get_cell()]);
        let _ = shared.port.set(myself);
        Ok(shared)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<PortMsg>,
        shared: &mut Arc<Shared>,
    ) -> Result<(), ActorProcessingErr> {
        // A stop is taken before the messages still queued: the events
        // whose marks it never reached go on now, in order.
        shared.pass_on_held();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<PortMsg>,
        msg: PortMsg,
        shared: &mut Arc<Shared>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            PortMsg::Control(bytes) => match wire::decode::<Envelope>("control", &bytes) {
                Ok(env) => {
                    shared.heard_from(&env.from);
                    // The head answers a node's heartbeat here, not in its
                    // registry: a registry busy with a wave of joins must not
                    // fall silent to the nodes (they would drop their
                    // sessions, and the head would then declare them lost).
                    // A node sends its heartbeats from its session's start.
                    // Only while the owner lives (what it is passed on to
                    // still takes it): a head whose registry is gone falls
                    // silent, and its nodes notice.
                    let answer = match env.control {
                        wire::Control::Heartbeat { seq } if shared.answers_heartbeats => {
                            Some((env.from.clone(), seq))
                        }
                        _ => None,
                    };
                    let passed_on = shared.inbound.send(Inbound::Control(env)).is_ok();
                    if let Some((peer, seq)) = answer.filter(|_| passed_on) {
                        shared.send_control(&peer, wire::Control::Heartbeat { seq });
                    }
                }
                Err(e) => undecodable(shared, &e),
            },
            PortMsg::Data(header, body) => match wire::decode::<DataHeader>("data", &header) {
                Ok(h) => data(shared, h, body),
                Err(e) => undecodable(shared, &e),
            },
            PortMsg::Closed(bytes) => match wire::decode::<wire::Closed>("closed", &bytes) {
                Ok(c) if c.secret == shared.secret => {
                    if c.abandon {
                        let late = shared.abandon_calls_from(&c.peer);
                        if late > 0 {
                            info!(node = %shared.me, peer = %c.peer, late,
                                "calls that waited here while their session closed stopped");
                        }
                    }
                    let event = c.event.and_then(|n| lock(&shared.held).remove(&n));
                    if let Some(event) = event {
                        let _ = shared.inbound.send(Inbound::Session(event));
                    }
                }
                Ok(c) => warn!(node = %shared.me, peer = %c.peer,
                    "a session close not marked by this process: ignored"),
                Err(e) => undecodable(shared, &e),
            },
        }
        Ok(())
    }
}

pub(super) fn undecodable(shared: &Shared, e: &wire::WireError) {
    shared.undecodable.fetch_add(1, Ordering::Relaxed);
    warn!(node = %shared.me, error = %e, "node port: undecodable frame dropped");
}

/// One data frame: a call to serve here, or the answer to one of ours. Its
/// sender counts as heard (a peer busy sending large frames is not silent).
pub(super) fn data(shared: &Arc<Shared>, header: DataHeader, body: Vec<u8>) {
    let answered = match header {
        DataHeader::Call {
            call,
            replica,
            stream,
            from,
            model,
        } => {
            shared.heard_from(&from);
            serve_call(shared, call, ReplicaId(replica), stream, from, model, body);
            None
        }
        DataHeader::Cancel { call, from } => {
            shared.heard_from(&from);
            if let Some(task) = lock(&shared.running).remove(&(from, call)) {
                task.abort();
            }
            None
        }
        DataHeader::Reply { call, error } => {
            let outcome = match error {
                None => Outcome::Ran(Ok(body)),
                Some(e) => Outcome::Ran(Err(e)),
            };
            shared.calls.finish(call, outcome)
        }
        DataHeader::Item { call } => {
            shared
                .calls
                .item(call, body, |peer| shared.heard_from(peer));
            None
        }
        DataHeader::End { call, error } => {
            let outcome = match error {
                None => Outcome::Ran(Ok(Vec::new())),
                Some(e) => Outcome::Ran(Err(e)),
            };
            shared.calls.finish(call, outcome)
        }
        DataHeader::Refused { call, full } => shared.calls.finish(
            call,
            Outcome::Refused {
                request: body,
                full,
            },
        ),
    };
    if let Some(peer) = answered {
        shared.heard_from(&peer);
    }
}

/// Run a request from `from` on local replica `replica`, in a task of its own,
/// which a `Cancel` from the caller aborts (freeing the replica's slot).
pub(super) fn serve_call(
    shared: &Arc<Shared>,
    call: u64,
    replica: ReplicaId,
    stream: bool,
    from: String,
    model: Option<String>,
    body: Vec<u8>,
) {
    let model: Option<Arc<str>> = model.map(Arc::from);
    let Some(ep) = shared.served(replica) else {
        debug!(node = %shared.me, %replica, "call for a replica not served here: refused");
        let _ = shared.send_data(&from, &DataHeader::Refused { call, full: false }, body);
        return;
    };
    let s = shared.clone();
    let key = (from.clone(), call);
    // Held until the entry is in: the task's own removal, when it ends,
    // takes the lock, so it cannot come first and leave the entry behind.
    let mut running = lock(&shared.running);
    // Not refused when its caller has no session here: a session's first
    // frames can reach this port before its `Ready` reaches `on_session`
    // (two actors, no order between them), and a call dropped unanswered
    // would leave its caller waiting for ever. So a call that waited here
    // while its caller's session closed runs, for nobody (docs/nodes.md).
    let task = tokio::spawn(async move {
        let (header, body) = if stream {
            serve_stream(&s, &ep, call, &from, model, body).await
        } else {
            serve_unary(&ep, call, model, body).await
        };
        let _ = s.send_data(&from, &header, body);
        lock(&s.running).remove(&(from, call));
    });
    running.insert(key, task.abort_handle());
}

/// A unary call's answer: its reply, or its refusal.
pub(super) async fn serve_unary(
    ep: &Arc<ReplicaEndpoint>,
    call: u64,
    model: Option<Arc<str>>,
    body: Vec<u8>,
) -> (DataHeader, Vec<u8>) {
    match flotilla_replica::remote::serve(ep, body, model).await {
        Served::Ran(Ok(out)) => (DataHeader::Reply { call, error: None }, out),
        Served::Ran(Err(e)) => (
            DataHeader::Reply {
                call,
                error: Some(e),
            },
            Vec::new(),
        ),
        Served::Refused { full, request } => (DataHeader::Refused { call, full }, request),
    }
}

/// A streaming call: its items go to `from` as produced; returns its end.
pub(super) async fn serve_stream(
    s: &Shared,
    ep: &Arc<ReplicaEndpoint>,
    call: u64,
    from: &str,
    model: Option<Arc<str>>,
    body: Vec<u8>,
) -> (DataHeader, Vec<u8>) {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let serving = flotilla_replica::remote::serve_stream(ep, body, model, tx);
    // The forwarder owns the receiver: when the caller cannot be sent to
    // (its session closed), it returns and the receiver goes with it, so
    // the replica's next item finds the stream closed and the handler
    // ends (freeing its slot) instead of waiting on a full channel for
    // a Cancel that will never come.
    let forward = async {
        let mut rx = rx;
        while let Some(item) = rx.recv().await {
            if s.send_data(from, &DataHeader::Item { call }, item).is_err() {
                return;
            }
        }
    };
    let (served, ()) = tokio::join!(serving, forward);
    match served {
        Served::Ran(r) => (
            DataHeader::End {
                call,
                error: r.err(),
            },
            Vec::new(),
        ),
        Served::Refused { full, request } => (DataHeader::Refused { call, full }, request),
    }
}
