//! One access-log line per request a replica took, written when the request
//! ends, however it ends.

use tokio::time::Instant;

use crate::{ACCESS_TARGET, ReplicaId, route::DeploymentRoute};

/// A request's access line, written when this is dropped: `status` `OK` or
/// `ERROR` once [`finish`](Self::finish)ed, `CANCELLED` if the call was
/// dropped first (its caller gave up, or its timeout passed), as Ray's
/// replica logs every request; with `latency_ms` since its replica took it.
/// It is written by the caller's process, by its logging settings (a call
/// from the head to a node's replica is logged by the head). Nothing is
/// timed while no subscriber wants access lines (a filter on the event's
/// fields, which `tracing::enabled!` cannot see, is not told apart).
pub(crate) struct AccessLine<'r> {
    route: &'r DeploymentRoute,
    replica: ReplicaId,
    stream: bool,
    /// `None`: nothing to write (no subscriber, or a refusal routed again).
    started: Option<Instant>,
    ok: Option<bool>,
}

impl<'r> AccessLine<'r> {
    /// The line of a request `replica` takes now.
    pub(crate) fn new(route: &'r DeploymentRoute, replica: ReplicaId, stream: bool) -> Self {
        let wanted = tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO);
        AccessLine {
            route,
            replica,
            stream,
            started: wanted.then(Instant::now),
            ok: None,
        }
    }

    /// The request was answered, `ok` or not.
    pub(crate) fn finish(mut self, ok: bool) {
        self.ok = Some(ok);
    }

    /// The replica refused it before running it: it is routed again, and
    /// logged where it runs.
    pub(crate) fn refused(mut self) {
        self.started = None;
    }
}

impl Drop for AccessLine<'_> {
    fn drop(&mut self) {
        let Some(started) = self.started else {
            return;
        };
        let status = match self.ok {
            Some(true) => "OK",
            Some(false) => "ERROR",
            None => "CANCELLED",
        };
        tracing::info!(target: ACCESS_TARGET, app = %self.route.app(),
            deployment = %self.route.deployment(), replica = %self.replica,
            status, ok = self.ok == Some(true), stream = self.stream,
            latency_ms = started.elapsed().as_secs_f64() * 1_000.0, "request");
    }
}
