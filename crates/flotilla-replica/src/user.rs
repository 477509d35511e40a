//! The trait user code implements, and its type-erased form.

use std::{fmt, future::Future, panic::AssertUnwindSafe, sync::Arc};

use flotilla_core::Args;
use futures::{FutureExt, Stream, StreamExt, future::BoxFuture};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    CallError,
    model_cache::ModelHub,
    payload::{ItemSender, Payload, PayloadError, SendError},
};

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
///
/// # Batching
///
/// Code that sets [`BATCHED`](Self::BATCHED) and writes
/// [`handle_batch`](Self::handle_batch) (Ray's `@serve.batch`) can be deployed
/// with [`batching`](flotilla_core::DeploymentConfig::batching) in its config:
/// each replica then gathers the requests that reach it into batches (see
/// [`BatchConfig`](flotilla_core::BatchConfig)) and hands each batch over in
/// one call. A deployment whose config batches code that does not set
/// `BATCHED` is refused (`ServeError::NotBatched`), as Ray refused
/// `max_batch_size` on a method not marked `@serve.accept_batch`.
///
/// ```
/// use std::time::Duration;
/// use flotilla_core::{BatchConfig, DeploymentSpec};
/// use flotilla_replica::{Deployment, UserError};
/// struct Doubler;
/// impl Deployment for Doubler {
///     type Request = u32;
///     type Response = u32;
///     const BATCHED: bool = true;
///     async fn handle(&self, x: u32) -> Result<u32, UserError> {
///         Ok(2 * x)
///     }
///     // One call for up to 32 requests: one response per request, in order.
///     async fn handle_batch(&self, xs: Vec<u32>) -> Result<Vec<u32>, UserError> {
///         Ok(xs.into_iter().map(|x| 2 * x).collect())
///     }
/// }
/// let spec = DeploymentSpec::builder("doubler", "math::Doubler")
///     .with_config(|c| {
///         c.with_max_ongoing_requests(64)
///             .with_batching(BatchConfig::new(32, Duration::from_millis(5)))
///     })
///     .build()
///     .unwrap();
/// ```
pub trait Deployment: Send + Sync + 'static {
    /// What callers send.
    type Request: DeserializeOwned + Send + 'static;
    /// What callers get back.
    type Response: Serialize + Send + 'static;

    /// Whether [`handle_batch`](Self::handle_batch) is written for batches
    /// (Ray's `@serve.batch` on the method): only such code may be deployed
    /// with `batching` in its config. Batching other code would hand each
    /// batch to the default `handle_batch`, where one request's error fails
    /// every request of its batch (and its text reaches their callers), and
    /// streams are answered with one item; so a deploy, config or in-place
    /// change that asks for it is refused (`ServeError::NotBatched`), and a
    /// recovered record that does (the program changed) serves its requests
    /// one by one, its deployment DEPLOY_FAILED saying so.
    const BATCHED: bool = false;

    /// Serve one request.
    fn handle(
        &self,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, UserError>> + Send;

    /// Serve a batch of requests at once: one response per request, in the
    /// requests' order (the callers' arrival order). Called instead of
    /// [`handle`](Self::handle) when the deployment's config has `batching`
    /// (which needs [`BATCHED`](Self::BATCHED)).
    ///
    /// An error (or a panic) fails every request of the batch with it; a
    /// response list of another length fails them all with
    /// [`CallError::BatchSize`]. A caller that gives up (drops its call, or
    /// times out) before its batch starts is left out of it; one that gives up
    /// while its batch runs only loses its response. Once every caller of a
    /// running batch has given up, the batch is cancelled (its future
    /// dropped) and its place under `max_concurrent_batches` freed, as a
    /// request's handler is cancelled when its caller leaves: work it hands
    /// to another thread or task (`spawn_blocking` inference) must stop with
    /// the future (an abort guard it holds), or it goes on outside those
    /// limits. Ray's batch runs on to its end.
    ///
    /// Default (reached only by code that sets `BATCHED` without writing
    /// this): every request through [`handle`](Self::handle), concurrently;
    /// the first error fails the batch.
    fn handle_batch(
        &self,
        requests: Vec<Self::Request>,
    ) -> impl Future<Output = Result<Vec<Self::Response>, UserError>> + Send {
        async move {
            futures::future::join_all(requests.into_iter().map(|r| self.handle(r)))
                .await
                .into_iter()
                .collect()
        }
    }

    /// Serve one request with a stream of responses, delivered to the caller as
    /// they are produced ([`DeploymentHandle::call_stream`](crate::DeploymentHandle::call_stream)):
    /// token-by-token model output, server-sent events, chunked HTTP bodies. An
    /// error ends the stream (it is the caller's last item); so does a panic.
    /// The request holds its replica's `max_ongoing_requests` slot until the
    /// stream ends or the caller drops it, which cancels the stream.
    ///
    /// Default: one item, [`handle`](Self::handle)'s response, so every
    /// deployment can be called either way. A batched deployment answers a
    /// streaming call with one item, its response from
    /// [`handle_batch`](Self::handle_batch) (Flotilla does not batch streams).
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

/// A request as it reaches a replica (encoded, or the caller's value) and
/// the caller's model id, if any.
pub(crate) struct Call {
    pub(crate) payload: Payload,
    pub(crate) model_id: Option<Arc<str>>,
}

/// What a batch handler gave back: one encoded response (or that request's
/// own error, e.g. one that did not decode) per request, in order.
pub(crate) type BatchResult = Result<Vec<Result<Vec<u8>, CallError>>, BatchFailure>;

/// A whole batch's failure: every request gets it, except one that had
/// already failed on its own (it keeps that error).
#[derive(Debug)]
pub(crate) struct BatchFailure {
    /// Why the batch failed.
    pub(crate) error: BatchError,
    /// Per request, in order, the error it had on its own before the batch
    /// ran (it did not decode); empty when the batch failed before any
    /// request was looked at.
    pub(crate) own: Vec<Option<CallError>>,
}

impl From<BatchError> for BatchFailure {
    fn from(error: BatchError) -> Self {
        BatchFailure {
            error,
            own: Vec::new(),
        }
    }
}

/// Why a whole batch failed.
#[derive(Debug)]
pub(crate) enum BatchError {
    /// The handler failed (every request gets this error).
    Failed(CallError),
    /// The handler returned `got` responses for `expected` requests.
    Length { expected: usize, got: usize },
}

/// A [`Deployment`] (or a multiplexed one) behind [`Payload`]s (MessagePack
/// bytes, or values inside one process), so replicas are location-transparent.
/// Panics in user code are caught and turned into errors here.
pub(crate) trait ErasedDeployment: Send + Sync + 'static {
    fn handle(&self, call: Call) -> BoxFuture<'_, Result<Payload, CallError>>;
    /// Whether the code accepts batches ([`Deployment::BATCHED`]): without
    /// it a replica serves every request through `handle`, whatever its
    /// route's batching says.
    fn batched(&self) -> bool;
    /// Serve a batch of requests, all with the same model id.
    fn handle_batch(
        &self,
        model_id: Option<Arc<str>>,
        requests: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, BatchResult>;
    /// Run the streaming handler, sending each item to `items` (waiting
    /// while it is full); returns once the stream ended, with its error if it
    /// failed. A closed `items` (the caller went away) ends it early.
    fn handle_stream(&self, call: Call, items: ItemSender) -> BoxFuture<'_, Result<(), CallError>>;
    fn reconfigure(&self, user_config: Args) -> BoxFuture<'_, Result<(), UserError>>;
    fn check_health(&self) -> BoxFuture<'_, Result<(), UserError>>;
    /// Where a multiplexed deployment publishes its loaded model ids.
    fn models(&self) -> Option<&Arc<ModelHub>> {
        None
    }
    /// The replica stopped: unload every model (multiplexed deployments).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    /// The replica is gone and will not wait for its model loads any more:
    /// cancel those still running or queued (multiplexed deployments).
    fn abort_loads(&self) {}
}

pub(crate) fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Run user code, turning a panic into an error. It takes the call, not its
/// future: user code may panic before it returns its future (a plain `fn`
/// returning `impl Future`), and that panic is caught too.
pub(crate) async fn guarded<T, Fut>(call: impl FnOnce() -> Fut) -> Result<T, Guarded>
where
    Fut: Future<Output = Result<T, UserError>>,
{
    match AssertUnwindSafe(async move { call().await })
        .catch_unwind()
        .await
    {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Guarded::Failed(e)),
        Err(p) => Err(Guarded::Panicked(panic_message(p))),
    }
}

/// How user code went wrong.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Guarded {
    /// It returned an error.
    #[error("{0}")]
    Failed(#[source] UserError),
    /// It panicked, with this message.
    #[error("panicked: {0}")]
    Panicked(String),
}

impl From<Guarded> for UserError {
    fn from(g: Guarded) -> Self {
        UserError(g.to_string())
    }
}

impl From<Guarded> for CallError {
    fn from(g: Guarded) -> Self {
        match g {
            Guarded::Failed(e) => CallError::User(e.0),
            Guarded::Panicked(m) => CallError::Panicked(m),
        }
    }
}

/// Decode a request.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CallError> {
    crate::payload::from_bytes(bytes).map_err(PayloadError::bad_request)
}

/// A request as the handler's type: moved, or decoded.
pub(crate) fn request<T: DeserializeOwned + 'static>(payload: Payload) -> Result<T, CallError> {
    payload.take().map_err(PayloadError::bad_request)
}

/// Encode a response.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CallError> {
    crate::payload::to_bytes(value).map_err(PayloadError::bad_response)
}

/// Run a handler: take its request, call it (panics caught), and hand its
/// response back as a value (encoded only if its caller wants another type,
/// or is in another process).
pub(crate) async fn serve_one<Req, Resp, Fut>(
    payload: Payload,
    handler: impl FnOnce(Req) -> Fut,
) -> Result<Payload, CallError>
where
    Req: DeserializeOwned + 'static,
    Resp: Serialize + Send + 'static,
    Fut: Future<Output = Result<Resp, UserError>>,
{
    let req = request(payload)?;
    let resp = guarded(|| handler(req)).await?;
    Ok(Payload::of(resp))
}

/// Run a batch handler: decode every request (one that does not decode gets
/// its own error and stays out of the batch, whatever becomes of the batch),
/// call it once with the rest, check the length, encode every response.
pub(crate) async fn serve_batch<Req, Resp, Fut>(
    requests: Vec<Vec<u8>>,
    handler: impl FnOnce(Vec<Req>) -> Fut,
) -> BatchResult
where
    Req: DeserializeOwned,
    Resp: Serialize,
    Fut: Future<Output = Result<Vec<Resp>, UserError>>,
{
    let mut decoded = Vec::with_capacity(requests.len());
    let mut out: Vec<Result<Vec<u8>, CallError>> = Vec::with_capacity(requests.len());
    for bytes in &requests {
        match decode(bytes) {
            Ok(r) => {
                decoded.push(r);
                out.push(Ok(Vec::new()));
            }
            Err(e) => out.push(Err(e)),
        }
    }
    if decoded.is_empty() {
        return Ok(out);
    }
    let expected = decoded.len();
    let failed = |error, out: Vec<Result<Vec<u8>, CallError>>| {
        Err(BatchFailure {
            error,
            own: out.into_iter().map(Result::err).collect(),
        })
    };
    let responses = match guarded(|| handler(decoded)).await {
        Ok(responses) => responses,
        Err(g) => return failed(BatchError::Failed(g.into()), out),
    };
    if responses.len() != expected {
        let got = responses.len();
        return failed(BatchError::Length { expected, got }, out);
    }
    let mut responses = responses.iter();
    for slot in out.iter_mut().filter(|s| s.is_ok()) {
        if let Some(resp) = responses.next() {
            // A response whose `Serialize` panics fails its own request, as a
            // handler's panic would (and is reported as one), not the batch.
            *slot = encode(resp);
        }
    }
    Ok(out)
}

/// Drive a streaming handler's stream, sending each item.
pub(crate) async fn drive_stream<Resp: Serialize + Send + 'static>(
    stream: impl Stream<Item = Result<Resp, UserError>>,
    items: ItemSender,
) -> Result<(), CallError> {
    let mut stream = std::pin::pin!(AssertUnwindSafe(stream).catch_unwind());
    while let Some(item) = stream.next().await {
        let resp = match item {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => return Err(CallError::User(e.0)),
            Err(p) => return Err(CallError::Panicked(panic_message(p))),
        };
        match items.send(resp).await {
            Ok(()) => {}
            // The caller dropped the stream: stop producing.
            Err(SendError::Closed) => return Ok(()),
            Err(SendError::Encode(e)) => return Err(e.bad_response()),
        }
    }
    Ok(())
}

pub(crate) struct Erased<D>(pub D);

impl<D: Deployment> ErasedDeployment for Erased<D> {
    fn handle(&self, call: Call) -> BoxFuture<'_, Result<Payload, CallError>> {
        Box::pin(async move { serve_one(call.payload, |req| self.0.handle(req)).await })
    }

    fn batched(&self) -> bool {
        D::BATCHED
    }

    fn handle_batch(
        &self,
        _model_id: Option<Arc<str>>,
        requests: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, BatchResult> {
        Box::pin(serve_batch(requests, |reqs| self.0.handle_batch(reqs)))
    }

    fn handle_stream(&self, call: Call, items: ItemSender) -> BoxFuture<'_, Result<(), CallError>> {
        Box::pin(async move {
            let req: D::Request = request(call.payload)?;
            // Making the stream runs user code too: a panic there is caught as well.
            let stream = std::panic::catch_unwind(AssertUnwindSafe(|| self.0.handle_stream(req)))
                .map_err(|p| CallError::Panicked(panic_message(p)))?;
            drive_stream(stream, items).await
        })
    }

    fn reconfigure(&self, user_config: Args) -> BoxFuture<'_, Result<(), UserError>> {
        Box::pin(async move {
            guarded(|| self.0.reconfigure(user_config))
                .await
                .map_err(Into::into)
        })
    }

    fn check_health(&self) -> BoxFuture<'_, Result<(), UserError>> {
        Box::pin(async move { guarded(|| self.0.check_health()).await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Encodes as its number, but panics on 997.
    struct Touchy(u32);

    impl Serialize for Touchy {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            assert!(self.0 != 997, "cannot encode 997");
            s.serialize_u32(self.0)
        }
    }

    #[tokio::test]
    async fn a_batch_response_that_panics_as_it_encodes_fails_its_own_request_only() {
        let requests = vec![encode(&997u32).unwrap(), encode(&1u32).unwrap()];
        let out = serve_batch(requests, |xs: Vec<u32>| async move {
            Ok(xs.into_iter().map(Touchy).collect())
        })
        .await
        .unwrap();
        assert_eq!(
            out,
            [
                Err(CallError::Panicked("cannot encode 997".into())),
                Ok(encode(&1u32).unwrap())
            ]
        );
    }
}
