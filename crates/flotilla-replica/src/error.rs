//! Errors a caller of a deployment can get.

/// Why a call through a [`DeploymentHandle`](crate::DeploymentHandle) failed.
///
/// Serializable: a call served in another process comes back with its error
/// as it was, every variant intact (`flotilla-cluster`'s reply frames). This
/// makes it part of the wire format: the head and its nodes run one build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum CallError {
    /// The user's handler returned an error; it ran, and is not retried.
    #[error("the deployment returned an error: {0}")]
    User(String),
    /// The user's handler panicked; the replica is being replaced.
    #[error("the deployment panicked: {0}")]
    Panicked(String),
    /// The replica was killed while the request ran (its graceful shutdown timed
    /// out): the handler may have run in part. Not retried.
    #[error("replica {replica} was killed at its graceful shutdown timeout while the request ran")]
    Killed {
        /// The replica.
        replica: String,
    },
    /// The node of the replica running the request was lost (its process died,
    /// it stopped answering heartbeats, or its connection dropped) after the
    /// request was sent to it: it may or may not have run. Not retried (a
    /// request that was not sent yet is routed to another replica instead).
    #[error(
        "replica {replica} was lost with its node '{node}' after the request was sent to it (it may have run)"
    )]
    NodeLost {
        /// The node.
        node: String,
        /// The replica.
        replica: String,
    },
    /// The request could not be encoded, or decoded as the deployment's
    /// request type (also when the type's own serde code panicked: the
    /// handler never ran, and the replica serves on).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The response could not be encoded or decoded.
    #[error("bad response: {0}")]
    BadResponse(String),
    /// The queue in front of the deployment is full (`max_queued_requests`).
    #[error(
        "deployment '{deployment}' of application '{app}' is overloaded: {queued} requests queued (max_queued_requests)"
    )]
    BackPressure {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
        /// How many requests were queued.
        queued: usize,
    },
    /// The deployment (or its application) does not exist or was deleted.
    #[error(
        "deployment '{deployment}' of application '{app}' does not exist (deleted or never deployed)"
    )]
    NotFound {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
    },
    /// The Serve instance the handle belongs to was shut down (or crashed):
    /// nothing will serve this deployment through this handle again.
    #[error(
        "deployment '{deployment}' of application '{app}' is unavailable: its Flotilla instance was shut down"
    )]
    Unavailable {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
    },
    /// The deployment failed to deploy (DEPLOY_FAILED, with no replica of its
    /// target ever running: its replicas fail to start) and has no replica to
    /// take the request: none is coming soon, so
    /// the call fails at once instead of waiting (Ray's
    /// `DeploymentUnavailableError`). The deployment keeps retrying slowly;
    /// once a replica runs, calls reach it again.
    #[error(
        "deployment '{deployment}' of application '{app}' is unavailable because it failed to deploy"
    )]
    DeployFailed {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
    },
    /// A batch handler returned a different number of responses than it was
    /// given requests: every request of the batch fails (Ray's "Batched
    /// function doesn't preserve batch size").
    #[error(
        "deployment '{deployment}' of application '{app}': its batch handler doesn't preserve \
         batch size: the input list has length {requests} but the returned list has length \
         {responses} (handle_batch must return one response per request, in order)"
    )]
    BatchSize {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
        /// Requests in the batch.
        requests: usize,
        /// Responses the handler returned.
        responses: usize,
    },
    /// A multiplexed deployment could not get the request's model: its loader
    /// failed (every request waiting for that load gets the error, and nothing
    /// is cached), or the request carried no model id.
    #[error("failed to load model '{model_id}': {message}")]
    ModelLoad {
        /// The model id ("" when the request had none).
        model_id: String,
        /// The loader's error.
        message: String,
    },
    /// The call did not end within the handle's timeout. It may have run in
    /// part: a handler still running then is cancelled (its slot freed),
    /// where Ray's `result(timeout_s)` leaves the request running. Retry only
    /// what is safe to run twice.
    #[error("request to deployment '{deployment}' of application '{app}' timed out")]
    Timeout {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
    },
}
