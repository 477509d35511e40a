//! The trait user code implements, and its type-erased form.

use std::{fmt, future::Future, panic::AssertUnwindSafe};

use flotilla_core::Args;
use futures::{FutureExt, Stream, StreamExt, future::BoxFuture};
use serde::{Serialize, de::DeserializeOwned};

use crate::CallError;

/// An error returned by user code; its message reaches callers and statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserError(pub String);

impl UserError {
    /// An error with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        UserError(message.into())
    }
}

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

impl From<String> for UserError {
    fn from(s: String) -> Self {
        UserError(s)
    }
}

impl From<&str> for UserError {
    fn from(s: &str) -> Self {
        UserError(s.to_owned())
    }
}

/// User code served by replicas. Requests run concurrently (up to the deployment's
/// `max_ongoing_requests`), hence `&self`.
///
/// ```
/// use flotilla_replica::{Deployment, UserError};
/// struct Echo;
/// impl Deployment for Echo {
///     type Request = String;
///     type Response = String;
///     async fn handle(&self, request: String) -> Result<String, UserError> {
///         Ok(request)
///     }
/// }
/// ```
pub trait Deployment: Send + Sync + 'static {
    /// What callers send.
    type Request: DeserializeOwned + Send;
    /// What callers get back.
    type Response: Serialize + Send;

    /// Serve one request.
    fn handle(
        &self,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, UserError>> + Send;

    /// Serve one request with a stream of responses, delivered to the caller as
    /// they are produced ([`DeploymentHandle::call_stream`](crate::DeploymentHandle::call_stream)):
    /// token-by-token model output, server-sent events, chunked HTTP bodies. An
    /// error ends the stream (it is the caller's last item); so does a panic.
    /// The request holds its replica's `max_ongoing_requests` slot until the
    /// stream ends or the caller drops it, which cancels the stream.
    ///
    /// Default: one item, [`handle`](Self::handle)'s response, so every
    /// deployment can be called either way.
    ///
    /// ```
    /// use futures::{Stream, stream};
    /// use flotilla_replica::{Deployment, UserError};
    /// struct Tokens;
    /// impl Deployment for Tokens {
    ///     type Request = String;
    ///     type Response = String;
    ///     async fn handle(&self, prompt: String) -> Result<String, UserError> {
    ///         Ok(prompt)
    ///     }
    ///     fn handle_stream(&self, prompt: String)
    ///         -> impl Stream<Item = Result<String, UserError>> + Send + '_ {
    ///         stream::iter(prompt.split(' ').map(|w| Ok(w.to_owned())).collect::<Vec<_>>())
    ///     }
    /// }
    /// ```
    fn handle_stream(
        &self,
        request: Self::Request,
    ) -> impl Stream<Item = Result<Self::Response, UserError>> + Send + '_ {
        futures::stream::once(self.handle(request))
    }

    /// Take a new user config in place; called after construction when the
    /// deployment has one, and on every config-only change. Default: accept.
    fn reconfigure(&self, user_config: Args) -> impl Future<Output = Result<(), UserError>> + Send {
        let _ = user_config;
        async { Ok(()) }
    }

    /// Report health; an error (or a panic, or a timeout) is a failed check.
    /// Default: healthy.
    fn check_health(&self) -> impl Future<Output = Result<(), UserError>> + Send {
        async { Ok(()) }
    }
}

/// A [`Deployment`] behind MessagePack bytes, so replicas are location-transparent.
/// Panics in user code are caught and turned into errors here.
pub(crate) trait ErasedDeployment: Send + Sync + 'static {
    fn handle(&self, request: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>, CallError>>;
    /// Run the streaming handler, sending each encoded item to `items` (waiting
    /// while it is full); returns once the stream ended, with its error if it
    /// failed. A closed `items` (the caller went away) ends it early.
    fn handle_stream(
        &self,
        request: Vec<u8>,
        items: ItemSender,
    ) -> BoxFuture<'_, Result<(), CallError>>;
    fn reconfigure(&self, user_config: Args) -> BoxFuture<'_, Result<(), UserError>>;
    fn check_health(&self) -> BoxFuture<'_, Result<(), UserError>>;
}

/// Where a streaming handler's encoded items go.
pub(crate) type ItemSender = tokio::sync::mpsc::Sender<Vec<u8>>;

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Run user code, turning a panic into an error.
pub(crate) async fn guarded<T>(
    fut: impl Future<Output = Result<T, UserError>>,
) -> Result<T, Guarded> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Guarded::Failed(e)),
        Err(p) => Err(Guarded::Panicked(panic_message(p))),
    }
}

/// How user code went wrong.
pub(crate) enum Guarded {
    Failed(UserError),
    Panicked(String),
}

impl fmt::Display for Guarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Guarded::Failed(e) => write!(f, "{e}"),
            Guarded::Panicked(m) => write!(f, "panicked: {m}"),
        }
    }
}

impl From<Guarded> for UserError {
    fn from(g: Guarded) -> Self {
        UserError(g.to_string())
    }
}

pub(crate) struct Erased<D>(pub D);

impl<D: Deployment> ErasedDeployment for Erased<D> {
    fn handle(&self, request: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>, CallError>> {
        Box::pin(async move {
            let req: D::Request = rmp_serde::from_slice(&request)
                .map_err(|e| CallError::BadRequest(e.to_string()))?;
            match guarded(async { self.0.handle(req).await }).await {
                Ok(resp) => rmp_serde::to_vec_named(&resp)
                    .map_err(|e| CallError::BadResponse(e.to_string())),
                Err(Guarded::Failed(e)) => Err(CallError::User(e.0)),
                Err(Guarded::Panicked(m)) => Err(CallError::Panicked(m)),
            }
        })
    }

    fn handle_stream(
        &self,
        request: Vec<u8>,
        items: ItemSender,
    ) -> BoxFuture<'_, Result<(), CallError>> {
        Box::pin(async move {
            let req: D::Request = rmp_serde::from_slice(&request)
                .map_err(|e| CallError::BadRequest(e.to_string()))?;
            // Making the stream runs user code too: a panic there is caught as well.
            let stream = std::panic::catch_unwind(AssertUnwindSafe(|| self.0.handle_stream(req)))
                .map_err(|p| CallError::Panicked(panic_message(p)))?;
            let mut stream = std::pin::pin!(AssertUnwindSafe(stream).catch_unwind());
            while let Some(item) = stream.next().await {
                let resp = match item {
                    Ok(Ok(resp)) => resp,
                    Ok(Err(e)) => return Err(CallError::User(e.0)),
                    Err(p) => return Err(CallError::Panicked(panic_message(p))),
                };
                let bytes = rmp_serde::to_vec_named(&resp)
                    .map_err(|e| CallError::BadResponse(e.to_string()))?;
                if items.send(bytes).await.is_err() {
                    // The caller dropped the stream: stop producing.
                    return Ok(());
                }
            }
            Ok(())
        })
    }

    fn reconfigure(&self, user_config: Args) -> BoxFuture<'_, Result<(), UserError>> {
        Box::pin(async move {
            guarded(async { self.0.reconfigure(user_config).await })
                .await
                .map_err(Into::into)
        })
    }

    fn check_health(&self) -> BoxFuture<'_, Result<(), UserError>> {
        Box::pin(async move {
            guarded(async { self.0.check_health().await })
                .await
                .map_err(Into::into)
        })
    }
}
