//! The head's logging settings reach every node, so that replicas log by
//! their deployment's, application's or the global `logging_config`
//! wherever they run: after every change the head sends each live node the
//! settings whole (changes that come at once share one send, as a `watch`
//! keeps only the latest), and a node that joins gets them with its full
//! copy of the routes.
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
        // No node, nothing to read: one that joins is sent them then.
        let peers = shared.alive();
        if peers.is_empty() {
            continue;
        }
        let snapshot = shared.logging.snapshot();
        for (_, peer) in peers {
            send(&shared, &peer, &snapshot);
        }
    }
}

/// Send the settings now to `peer` (a node that just joined).
pub(crate) fn full_copy(shared: &HeadShared, peer: &str) {
    let _sending = lock(&shared.export_send);
    send(shared, peer, &shared.logging.snapshot());
}

fn send(shared: &HeadShared, peer: &str, snapshot: &flotilla_replica::LogSnapshot) {
    shared
        .link
        .shared
        .send_control(peer, Control::Logging(Box::new(snapshot.clone())));
}
