//! Requests to replicas of other processes: the [`RemoteCall`] behind every
//! remote endpoint (`docs/nodes.md`, "Requests across nodes").

use std::sync::Arc;

use flotilla_replica::{
    CallError, ItemSender, ReplicaId,
    remote::{Attempt, RemoteCall},
};
use futures::future::BoxFuture;

use super::{
    link::{Outcome, Piece, Shared},
    wire::DataHeader,
};

/// Calls to the replicas of one peer process.
#[derive(Clone)]
pub(crate) struct PeerCall {
    shared: Arc<Shared>,
    /// The peer's ractor name (where frames go).
    peer: String,
    /// The peer's Flotilla node id (for errors).
    node: String,
}

impl PeerCall {
    pub(crate) fn boxed(shared: Arc<Shared>, peer: String, node: String) -> Arc<dyn RemoteCall> {
        Arc::new(PeerCall { shared, peer, node })
    }

    /// Send call `call` (registered in `shared.calls`) to the peer, with the
    /// guard that forgets it, and cancels it there, if its caller goes away
    /// before it ends; the attempt's outcome if it could not be sent.
    fn send<T>(
        &self,
        call: u64,
        replica: ReplicaId,
        stream: bool,
        request: Vec<u8>,
        model_id: Option<Arc<str>>,
    ) -> Result<Forget, Attempt<T>> {
        let guard = Forget {
            shared: self.shared.clone(),
            call,
            peer: self.peer.clone(),
            done: false,
        };
        let header = DataHeader::Call {
            call,
            replica: replica.0,
            stream,
            from: self.shared.me.clone(),
            model: model_id.map(|m| m.to_string()),
        };
        match self.shared.send_data(&self.peer, &header, request) {
            Ok(()) => Ok(guard),
            Err(kept) => Err(unsent(kept, &self.node, replica)),
        }
    }
}

/// Forgets a call whose caller went away, and cancels it at the peer (which
/// aborts its handler and frees its slot there).
struct Forget {
    shared: Arc<Shared>,
    call: u64,
    /// The peer the call went to.
    peer: String,
    done: bool,
}

impl Drop for Forget {
    fn drop(&mut self) {
        if self.done || !self.shared.calls.forget(self.call) {
            return;
        }
        let cancel = DataHeader::Cancel {
            call: self.call,
            from: self.shared.me.clone(),
        };
        let _ = self.shared.send_data(&self.peer, &cancel, Vec::new());
    }
}

fn lost(node: &str, replica: ReplicaId) -> CallError {
    CallError::NodeLost {
        node: node.to_owned(),
        replica: replica.to_string(),
    }
}

/// A call that could not be sent: refused (not started) when the request
/// came back, else lost with the node.
fn unsent<T>(kept: Option<Vec<u8>>, node: &str, replica: ReplicaId) -> Attempt<T> {
    match kept {
        Some(request) => Attempt::Refused {
            request,
            full: false,
        },
        None => Attempt::Ran(Err(lost(node, replica))),
    }
}

impl RemoteCall for PeerCall {
    fn call(
        &self,
        replica: ReplicaId,
        request: Vec<u8>,
        model_id: Option<Arc<str>>,
    ) -> BoxFuture<'static, Attempt<Vec<u8>>> {
        let this = self.clone();
        Box::pin(async move {
            let (call, rx) = this.shared.calls.unary(&this.peer, &this.node, replica);
            let mut guard = match this.send(call, replica, false, request, model_id) {
                Ok(guard) => guard,
                Err(unsent) => return unsent,
            };
            let outcome = rx.await;
            guard.done = true;
            match outcome {
                Ok(Outcome::Ran(r)) => Attempt::Ran(r),
                Ok(Outcome::Refused { request, full }) => Attempt::Refused { request, full },
                Err(_) => Attempt::Ran(Err(lost(&this.node, replica))),
            }
        })
    }

    fn call_stream(
        &self,
        replica: ReplicaId,
        request: Vec<u8>,
        model_id: Option<Arc<str>>,
        items: ItemSender,
    ) -> BoxFuture<'static, Attempt<()>> {
        let this = self.clone();
        Box::pin(async move {
            let (call, mut rx) = this.shared.calls.stream(&this.peer, &this.node, replica);
            let mut guard = match this.send(call, replica, true, request, model_id) {
                Ok(guard) => guard,
                Err(unsent) => return unsent,
            };
            while let Some(piece) = rx.recv().await {
                match piece {
                    Piece::Item(item) => {
                        if items.send_encoded(item).await.is_err() {
                            // The caller dropped the stream: the guard cancels it there.
                            return Attempt::Ran(Ok(()));
                        }
                    }
                    Piece::End(Outcome::Ran(r)) => {
                        guard.done = true;
                        return Attempt::Ran(r);
                    }
                    Piece::End(Outcome::Refused { request, full }) => {
                        guard.done = true;
                        return Attempt::Refused { request, full };
                    }
                }
            }
            guard.done = true;
            Attempt::Ran(Err(lost(&this.node, replica)))
        })
    }
}
