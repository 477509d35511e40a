//! The calls a process waits on, by call id: each one's waiter, told how it ended.

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use flotilla_replica::{CallError, ReplicaId};
use tokio::sync::{mpsc, oneshot};

use super::lock;

/// How a call to another process ended, as its waiter learns it.
#[derive(Debug)]
pub(crate) enum Outcome<T> {
    /// It ran there.
    Ran(Result<T, CallError>),
    /// It did not start; the request comes back.
    Refused { request: Vec<u8>, full: bool },
}

/// One piece of a streaming call's answer, in order.
#[derive(Debug)]
pub(crate) enum Piece {
    Item(Vec<u8>),
    End(Outcome<()>),
}

pub(super) enum Waiter {
    Unary(oneshot::Sender<Outcome<Vec<u8>>>),
    Stream(mpsc::UnboundedSender<Piece>),
}

pub(super) struct Pending {
    pub(super) peer: String,
    pub(super) node: String,
    pub(super) replica: ReplicaId,
    pub(super) waiter: Waiter,
}

/// Calls this process waits on, by call id.
#[derive(Default)]
pub(crate) struct Calls {
    pub(super) next: AtomicU64,
    pub(super) pending: Mutex<HashMap<u64, Pending>>,
}

impl Calls {
    pub(crate) fn unary(
        &self,
        peer: &str,
        node: &str,
        replica: ReplicaId,
    ) -> (u64, oneshot::Receiver<Outcome<Vec<u8>>>) {
        let (tx, rx) = oneshot::channel();
        (self.add(peer, node, replica, Waiter::Unary(tx)), rx)
    }

    pub(crate) fn stream(
        &self,
        peer: &str,
        node: &str,
        replica: ReplicaId,
    ) -> (u64, mpsc::UnboundedReceiver<Piece>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (self.add(peer, node, replica, Waiter::Stream(tx)), rx)
    }

    pub(super) fn add(&self, peer: &str, node: &str, replica: ReplicaId, waiter: Waiter) -> u64 {
        let call = self.next.fetch_add(1, Ordering::Relaxed);
        let p = Pending {
            peer: peer.to_owned(),
            node: node.to_owned(),
            replica,
            waiter,
        };
        lock(&self.pending).insert(call, p);
        call
    }

    /// Forget `call` (its caller went away, or it could not be sent).
    pub(crate) fn forget(&self, call: u64) -> bool {
        lock(&self.pending).remove(&call).is_some()
    }

    /// The answer to `call` came: its waiter gets `outcome`. Returns the
    /// peer that answered, if the call was still waited on.
    pub(super) fn finish(&self, call: u64, outcome: Outcome<Vec<u8>>) -> Option<String> {
        let p = lock(&self.pending).remove(&call)?;
        let peer = p.peer;
        match (p.waiter, outcome) {
            (Waiter::Unary(tx), o) => {
                let _ = tx.send(o);
            }
            (Waiter::Stream(tx), Outcome::Refused { request, full }) => {
                let _ = tx.send(Piece::End(Outcome::Refused { request, full }));
            }
            (Waiter::Stream(tx), Outcome::Ran(r)) => {
                let _ = tx.send(Piece::End(Outcome::Ran(r.map(|_| ()))));
            }
        }
        Some(peer)
    }

    /// An item of streamed `call` came; `heard` is told which peer sent it.
    pub(super) fn item(&self, call: u64, body: Vec<u8>, heard: impl FnOnce(&str)) {
        if let Some(Pending {
            waiter: Waiter::Stream(tx),
            peer,
            ..
        }) = lock(&self.pending).get(&call)
        {
            let _ = tx.send(Piece::Item(body));
            heard(peer);
        }
    }

    /// Every call waiting on `peer` fails: it was sent, so it may have run.
    pub(crate) fn fail_peer(&self, peer: &str) -> usize {
        let lost: Vec<Pending> = {
            let mut pending = lock(&self.pending);
            let ids: Vec<u64> = pending
                .iter()
                .filter(|(_, p)| p.peer == peer)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        let n = lost.len();
        for p in lost {
            let e = CallError::NodeLost {
                node: p.node,
                replica: p.replica.to_string(),
            };
            match p.waiter {
                Waiter::Unary(tx) => {
                    let _ = tx.send(Outcome::Ran(Err(e)));
                }
                Waiter::Stream(tx) => {
                    let _ = tx.send(Piece::End(Outcome::Ran(Err(e))));
                }
            }
        }
        n
    }
}
