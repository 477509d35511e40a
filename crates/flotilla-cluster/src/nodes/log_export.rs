//! The head's logging settings reach every node, so that replicas log by
//! their deployment's, application's or the global `logging_config`
//! wherever they run: after every change the head sends each live node the
//! settings whole (changes that come at once share one send, as a `watch`
//! keeps only the latest), and a node that joins gets them as it is
//! welcomed, before any replica can be placed on it.
//!
//! Only once the Controller has recovered (the head's export is told so):
//! until then the settings are not yet filled from the checkpoint, and a
//! node re-attaching to a restarted head keeps the ones it has. The
//! Controller's recovery sends them to every live node.
//!
//! Read and sent under the head's send lock (`export_send`), as the routes
//! are: the last settings a node is sent are the last the head read.

use std::sync::Arc;

use super::{
    head::{HeadShared, lock},
    wire::Control,
};

/// The exporter: wakes on every change of the settings, sends them to every
/// live node. Ends when the settings are dropped.
pub(crate) async fn run(shared: Arc<HeadShared>) {
    let mut changes = shared.logging.subscribe();
    while changes.changed().await.is_ok() {
        let _sending = lock(&shared.export_send);
        send_all(&shared);
    }
}

/// Send the settings to every live node, if the Controller has recovered.
/// The caller holds the send lock.
pub(crate) fn send_all(shared: &HeadShared) {
    // No node, nothing to read: one that joins is sent them then.
    let peers = shared.alive();
    if peers.is_empty() || !recovered(shared) {
        return;
    }
    let snapshot = shared.logging.snapshot();
    for (_, peer) in peers {
        send(shared, &peer, &snapshot);
    }
}

/// Send the settings now to `peer`, a node being welcomed (listed alive
/// already, so that a recovery that comes after this sends them too), if the
/// Controller has recovered.
pub(crate) fn welcome(shared: &HeadShared, peer: &str) {
    let _sending = lock(&shared.export_send);
    if recovered(shared) {
        send(shared, peer, &shared.logging.snapshot());
    }
}

fn recovered(shared: &HeadShared) -> bool {
    lock(&shared.export).recovered.is_some()
}

fn send(shared: &HeadShared, peer: &str, snapshot: &flotilla_replica::LogSnapshot) {
    shared
        .link
        .shared
        .send_control(peer, Control::Logging(Box::new(snapshot.clone())));
}
