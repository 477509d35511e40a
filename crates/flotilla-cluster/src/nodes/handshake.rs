//! Bounds on sessions that have not authenticated yet: a deadline for each,
//! accepted or dialed (ractor_cluster waits for a silent peer's next frame for
//! ever), and a cap on how many accepted ones are open at once: on a listener
//! of our own (the head's) at accept, on ractor_cluster's (a node's) as soon
//! as the session opens. A peer without the cookie can therefore hold at most
//! [`MAX_HANDSHAKES`] of a process's descriptors (a node's: and each one it
//! opens beyond them for as long as a session takes to start), each for at
//! most the deadline, and a node whose dial stalls (a hung head, a half-open
//! connection) gives up at the deadline and dials again.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use ractor_cluster::node::NodeServerSessionInformation;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinHandle,
};
use tracing::warn;

/// Connections a listener holds at once before they authenticate; beyond
/// it, new ones are closed (the head's at accept, a node's as their session
/// opens).
pub(crate) const MAX_HANDSHAKES: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The handshakes of one process's link.
pub(crate) struct Handshakes {
    me: String,
    deadline: Duration,
    /// The deadline of each session not yet authenticated, by
    /// ractor_cluster's session id, and whether it was accepted.
    pending: Mutex<HashMap<ractor_cluster::NodeId, (bool, JoinHandle<()>)>>,
    /// Whether accepted connections are capped at accept ([`Self::admit`]):
    /// the listener is ours.
    capped_at_accept: bool,
    /// Sessions stopped at their deadline, until they are reported closed.
    timed_out: Mutex<HashSet<ractor_cluster::NodeId>>,
    /// The cap of our own listener.
    slots: Arc<Semaphore>,
    /// The slot of each accepted connection, by peer address (with the
    /// accept's sequence number, so a late release spares a newer holder).
    held: Mutex<HashMap<String, (u64, OwnedSemaphorePermit)>>,
    seq: AtomicU64,
}

impl Handshakes {
    pub(crate) fn new(me: String, deadline: Duration, capped_at_accept: bool) -> Arc<Self> {
        Arc::new(Handshakes {
            me,
            deadline,
            pending: Mutex::default(),
            capped_at_accept,
            timed_out: Mutex::default(),
            slots: Arc::new(Semaphore::new(MAX_HANDSHAKES)),
            held: Mutex::default(),
            seq: AtomicU64::new(0),
        })
    }

    /// At accept on our own listener: take a slot for the connection from
    /// `peer`, or `false` if all are taken (the caller closes it). The slot
    /// is given back when the session authenticates or closes, and at the
    /// deadline whatever happened (ractor_cluster may drop a connection
    /// without a session event).
    pub(crate) fn admit(self: &Arc<Self>, peer: String) -> bool {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            warn!(node = %self.me, %peer, max = MAX_HANDSHAKES,
                "node listener: too many connections waiting to authenticate; closed");
            return false;
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        lock(&self.held).insert(peer.clone(), (seq, permit));
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(this.deadline).await;
            let mut held = lock(&this.held);
            if held.get(&peer).is_some_and(|(s, _)| *s == seq) {
                held.remove(&peer);
            }
        });
        true
    }

    /// A session opened, accepted or dialed: it must authenticate within the
    /// deadline, or it is stopped. One accepted on a listener that is not ours
    /// is stopped at once if [`MAX_HANDSHAKES`] accepted ones wait already.
    pub(crate) fn opened(self: &Arc<Self>, ses: &NodeServerSessionInformation) {
        let (id, actor, peer) = (ses.node_id, ses.actor.clone(), ses.peer_addr.clone());
        let accepted = ses.is_server;
        if accepted && !self.capped_at_accept {
            let waiting = lock(&self.pending).values().filter(|(a, _)| *a).count();
            if waiting >= MAX_HANDSHAKES {
                warn!(node = %self.me, %peer, max = MAX_HANDSHAKES,
                    "node listener: too many connections waiting to authenticate; closed");
                actor.stop(Some(
                    "too many connections waiting to authenticate".to_owned(),
                ));
                return;
            }
        }
        let dialed = !accepted;
        let this = self.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(this.deadline).await;
            if lock(&this.pending).remove(&id).is_some() {
                lock(&this.timed_out).insert(id);
                warn!(node = %this.me, %peer, dialed, deadline = ?this.deadline,
                    "node connection closed: no handshake within the deadline");
                actor.stop(Some("no handshake within the deadline".to_owned()));
            }
        });
        lock(&self.pending).insert(id, (accepted, timer));
    }

    /// A session authenticated or closed: its deadline and slot are done.
    /// Returns whether its deadline had stopped it.
    pub(crate) fn done(&self, ses: &NodeServerSessionInformation) -> bool {
        if let Some((_, timer)) = lock(&self.pending).remove(&ses.node_id) {
            timer.abort();
        }
        lock(&self.held).remove(&ses.peer_addr);
        lock(&self.timed_out).remove(&ses.node_id)
    }
}
