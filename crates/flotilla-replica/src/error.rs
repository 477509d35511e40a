//! Errors a caller of a deployment can get.

/// Why a call through a [`DeploymentHandle`](crate::DeploymentHandle) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// The request could not be decoded as the deployment's request type.
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
    /// No replica took the request within the caller's timeout.
    #[error("request to deployment '{deployment}' of application '{app}' timed out")]
    Timeout {
        /// The application.
        app: String,
        /// The deployment.
        deployment: String,
    },
}
