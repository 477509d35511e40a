//! Bounds on sessions that have not authenticated yet: a deadline for each,
//! accepted or dialed (ractor_cluster waits for a silent peer's next frame for
//! ever), a cap on how many accepted ones are open at once, and a budget on
//! what each may send first (`link::preauth::PRE_AUTH_BYTES`). A process's node listener
//! is its own: it takes a slot at accept and hands ractor_cluster the
//! connection with its budget. ractor_cluster's listener, which it always
//! runs, listens on loopback only and serves nobody, but its sessions are
//! capped as they open too. A peer without the cookie can therefore hold at
//! most [`MAX_HANDSHAKES`] of a listener's connections, each for at most the
//! deadline and that budget of memory, and a node whose dial stalls (a
//! hung head, a half-open connection) gives up at the deadline and dials
//! again. Their warnings are logged at the 1st, 2nd, 4th, 8th... of each
//! kind, so a flood of them does not flood the log.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use ractor_cluster::node::NodeServerSessionInformation;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinHandle,
};
use tracing::{debug, warn};

/// Connections a listener holds at once before they authenticate; beyond
/// it, new ones are closed (at accept on a process's own listener, as their
/// session opens on ractor_cluster's).
pub(crate) const MAX_HANDSHAKES: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts one kind of event and says which to log: the 1st, 2nd, 4th,
/// 8th... (a peer can cause as many as it likes).
#[derive(Debug, Default)]
pub(crate) struct Sparse(AtomicU64);

impl Sparse {
    /// Count one; `Some(count so far)` if this one is to be logged.
    pub(crate) fn hit(&self) -> Option<u64> {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        n.is_power_of_two().then_some(n)
    }

    /// How many were counted.
    pub(crate) fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// How a session not yet authenticated came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// This process dialed it.
    Dialed,
    /// Accepted on this process's own listener (holds a slot already).
    Admitted,
    /// Accepted on ractor_cluster's listener (capped as it opens).
    Unadmitted,
}

/// A connection accepted on a process's own listener, until it authenticates
/// or its deadline passes.
struct Held {
    /// The accept's sequence number, so that a late release spares a newer
    /// holder of the same peer address.
    seq: u64,
    _slot: OwnedSemaphorePermit,
    /// Set when it authenticates: lifts its read budget.
    open: Arc<AtomicBool>,
    /// Its session, once ractor_cluster opened one: only that session's end
    /// releases it and opens its gate.
    session: Option<ractor_cluster::NodeId>,
}

/// The handshakes of one process's link.
pub(crate) struct Handshakes {
    me: String,
    deadline: Duration,
    /// The deadline of each session not yet authenticated, by
    /// ractor_cluster's session id, and how it came.
    pending: Mutex<HashMap<ractor_cluster::NodeId, (Origin, JoinHandle<()>)>>,
    /// Sessions stopped at their deadline, until they are reported closed.
    timed_out: Mutex<HashSet<ractor_cluster::NodeId>>,
    /// The cap of the own listener.
    slots: Arc<Semaphore>,
    /// Each connection accepted on the own listener, by peer address.
    held: Mutex<HashMap<String, Held>>,
    seq: AtomicU64,
    /// Connections closed for the cap, and sessions stopped at the deadline.
    over_cap: Sparse,
    late: Sparse,
}

impl Handshakes {
    pub(crate) fn new(me: String, deadline: Duration) -> Arc<Self> {
        Arc::new(Handshakes {
            me,
            deadline,
            pending: Mutex::default(),
            timed_out: Mutex::default(),
            slots: Arc::new(Semaphore::new(MAX_HANDSHAKES)),
            held: Mutex::default(),
            seq: AtomicU64::new(0),
            over_cap: Sparse::default(),
            late: Sparse::default(),
        })
    }

    /// At accept on the own listener: take a slot for the connection from
    /// `peer` and return the gate of its read budget (set when it
    /// authenticates), or `None` if all slots are taken (the caller closes
    /// it). The slot is given back when the session authenticates or closes,
    /// and at the deadline whatever happened (ractor_cluster may drop a
    /// connection without a session event).
    ///
    /// A connection from an address one still holds (the same source address
    /// and port, to another of this host's addresses, or again before the
    /// first one's end was told) is closed too: each held connection is
    /// known by its peer address, which must name one.
    pub(crate) fn admit(self: &Arc<Self>, peer: String) -> Option<Arc<AtomicBool>> {
        let mut held = lock(&self.held);
        if held.contains_key(&peer) {
            debug!(node = %self.me, %peer,
                "node listener: a connection from this address waits to authenticate already; closed");
            return None;
        }
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            drop(held);
            self.closed_for_cap(&peer);
            return None;
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let open = Arc::new(AtomicBool::new(false));
        held.insert(
            peer.clone(),
            Held {
                seq,
                _slot: slot,
                open: open.clone(),
                session: None,
            },
        );
        drop(held);
        // A connection ractor_cluster never opened a session for (it dropped
        // it) is released at the deadline; one with a session, at that
        // session's end or deadline.
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(this.deadline).await;
            let mut held = lock(&this.held);
            if held
                .get(&peer)
                .is_some_and(|h| h.seq == seq && h.session.is_none())
            {
                held.remove(&peer);
            }
        });
        Some(open)
    }

    fn closed_for_cap(&self, peer: &str) {
        if let Some(n) = self.over_cap.hit() {
            warn!(node = %self.me, %peer, max = MAX_HANDSHAKES, closed = n,
                "node listener: too many connections waiting to authenticate; closed \
                 (logged at the 1st, 2nd, 4th, 8th...)");
        }
    }

    /// A session opened, accepted or dialed: it must authenticate within the
    /// deadline, or it is stopped. One accepted on ractor_cluster's listener
    /// is stopped at once if [`MAX_HANDSHAKES`] such ones wait already.
    pub(crate) fn opened(self: &Arc<Self>, ses: &NodeServerSessionInformation) {
        let (id, actor, peer) = (ses.node_id, ses.actor.clone(), ses.peer_addr.clone());
        let origin = match ses.is_server {
            false => Origin::Dialed,
            true => match lock(&self.held).get_mut(&peer) {
                Some(h) if h.session.is_none() => {
                    h.session = Some(id);
                    Origin::Admitted
                }
                _ => Origin::Unadmitted,
            },
        };
        if origin == Origin::Unadmitted {
            let waiting = lock(&self.pending)
                .values()
                .filter(|(o, _)| *o == Origin::Unadmitted)
                .count();
            if waiting >= MAX_HANDSHAKES {
                self.closed_for_cap(&peer);
                actor.stop(Some(
                    "too many connections waiting to authenticate".to_owned(),
                ));
                return;
            }
        }
        let dialed = origin == Origin::Dialed;
        let this = self.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(this.deadline).await;
            if lock(&this.pending).remove(&id).is_some() {
                lock(&this.timed_out).insert(id);
                this.release(&peer, id);
                if let Some(n) = this.late.hit() {
                    warn!(node = %this.me, %peer, dialed, deadline = ?this.deadline, closed = n,
                        "node connection closed: no handshake within the deadline \
                         (logged at the 1st, 2nd, 4th, 8th...)");
                }
                actor.stop(Some("no handshake within the deadline".to_owned()));
            }
        });
        lock(&self.pending).insert(id, (origin, timer));
    }

    /// A session authenticated or closed: its deadline and slot are done, and
    /// its reads unbounded. Returns whether its deadline had stopped it.
    pub(crate) fn done(&self, ses: &NodeServerSessionInformation) -> bool {
        if let Some((_, timer)) = lock(&self.pending).remove(&ses.node_id) {
            timer.abort();
        }
        if let Some(open) = self.release(&ses.peer_addr, ses.node_id) {
            open.store(true, Ordering::Release);
        }
        lock(&self.timed_out).remove(&ses.node_id)
    }

    /// Release the connection held for `peer` if session `id` is its own;
    /// its gate.
    fn release(&self, peer: &str, id: ractor_cluster::NodeId) -> Option<Arc<AtomicBool>> {
        let mut held = lock(&self.held);
        if held.get(peer).is_some_and(|h| h.session == Some(id)) {
            return held.remove(peer).map(|h| h.open);
        }
        None
    }
}
