//! Model multiplexing (Ray's `@serve.multiplexed`): a deployment whose
//! replicas each hold a few of many models, loaded by id on demand.
//!
//! A request carries its model id ([`DeploymentHandle::with_model_id`], or the
//! `serve_multiplexed_model_id` HTTP header); the replica's model cache gives
//! the handler the model, loading it first if needed (see the cache's rules in
//! [`ModelIds`]); routers prefer a replica that holds the model.
//!
//! [`DeploymentHandle::with_model_id`]: crate::DeploymentHandle::with_model_id

use std::{future::Future, panic::AssertUnwindSafe, sync::Arc};

use flotilla_core::Args;
use futures::{Stream, future::BoxFuture};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    CallError, ModelIds, UserError,
    model_cache::{ModelCache, ModelHub},
    payload::{ItemSender, Payload},
    settings::Settings,
    user::{
        BatchResult, Call, ErasedDeployment, drive_stream, guarded, panic_message, request,
        serve_batch, serve_one,
    },
};

/// The longest model id a request may carry, in bytes.
pub const MAX_MODEL_ID_LEN: usize = 512;

/// Why a model id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelIdError {
    /// The id is empty (Ray: "The model ID cannot be empty.").
    #[error("the model ID cannot be empty")]
    Empty,
    /// The id is longer than [`MAX_MODEL_ID_LEN`] bytes.
    #[error("the model ID is {len} bytes long, more than the {MAX_MODEL_ID_LEN} allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The id holds a control character.
    #[error("the model ID {id:?} holds a control character")]
    ControlCharacter {
        /// The id (at most a few hundred bytes of it).
        id: String,
    },
}

/// Check a model id: not empty, at most [`MAX_MODEL_ID_LEN`] bytes, no control
/// characters.
///
/// ```
/// use flotilla_replica::{ModelIdError, validate_model_id};
/// validate_model_id("org/llama-7b").unwrap();
/// assert_eq!(validate_model_id(""), Err(ModelIdError::Empty));
/// assert!(validate_model_id("a\nb").is_err());
/// ```
pub fn validate_model_id(id: &str) -> Result<(), ModelIdError> {
    if id.is_empty() {
        return Err(ModelIdError::Empty);
    }
    if id.len() > MAX_MODEL_ID_LEN {
        return Err(ModelIdError::TooLong { len: id.len() });
    }
    if id.chars().any(char::is_control) {
        return Err(ModelIdError::ControlCharacter {
            id: flotilla_core::shown(id).to_owned(),
        });
    }
    Ok(())
}

/// User code that serves many models, a few per replica (Ray's
/// `@serve.multiplexed`): register it with
/// [`Registry::register_multiplexed`](crate::Registry::register_multiplexed).
///
/// Each replica keeps at most the deployment's `max_num_models_per_replica`
/// models (Ray's default 3), loading them with
/// [`load_model`](Self::load_model) when a request needs one it does not hold,
/// after unloading the least recently used one with
/// [`unload_model`](Self::unload_model) if it is full. Concurrent requests for a
/// model that is loading wait for that one load; a failed load fails them with
/// its error ([`CallError::ModelLoad`]) and caches nothing. A request without a
/// model id fails the same way (Ray: "The model ID cannot be empty."). When a
/// replica stops, it unloads all its models before it counts as gone (before
/// its place, and a GPU's memory, is given back), waiting at most its
/// `graceful_shutdown_timeout`; a replica killed outright unloads them in the
/// background.
///
/// Batching composes: with `batching` in the config, each batch is split by
/// model id (in order of first appearance, as Ray does) and every part is
/// handed to [`handle_batch`](Self::handle_batch) with its model.
///
/// ```
/// use std::sync::Arc;
/// use flotilla_replica::{MultiplexedDeployment, Registry, UserError};
///
/// struct Translator;
/// impl MultiplexedDeployment for Translator {
///     type Request = String;
///     type Response = String;
///     type Model = String; // say, a loaded model's weights
///     async fn load_model(&self, model_id: &str) -> Result<String, UserError> {
///         Ok(format!("weights of {model_id}"))
///     }
///     async fn unload_model(&self, _model_id: &str, _model: Arc<String>) {
///         // free GPU memory, close files...
///     }
///     async fn handle(&self, model: &String, text: String) -> Result<String, UserError> {
///         Ok(format!("{text} (by {model})"))
///     }
/// }
/// let registry = Registry::new()
///     .register_multiplexed("nlp::Translator", |_ctx| async { Ok(Translator) })
///     .unwrap();
/// assert!(registry.contains("nlp::Translator"));
/// ```
pub trait MultiplexedDeployment: Send + Sync + 'static {
    /// What callers send.
    type Request: DeserializeOwned + Send + 'static;
    /// What callers get back.
    type Response: Serialize + Send + 'static;
    /// One loaded model, shared by the requests that use it.
    type Model: Send + Sync + 'static;

    /// Whether [`handle_batch`](Self::handle_batch) is written for batches:
    /// only such code may be deployed with `batching` in its config (see
    /// [`Deployment::BATCHED`](crate::Deployment::BATCHED)).
    const BATCHED: bool = false;

    /// Load the model `model_id` (Ray's decorated loader). Runs in a task of
    /// its own, one load at a time per replica; its result serves every
    /// request that waited for it. An error or a panic (before or after it
    /// returns its future) fails that load: its requests get
    /// [`CallError::ModelLoad`](crate::CallError::ModelLoad), nothing is
    /// cached, and the replica is not replaced (as Ray, where a loader's
    /// exception fails its requests only). A load still waiting for its turn
    /// when the replica stops does not run; one still running when the
    /// replica's graceful shutdown timeout passes, or when it is killed, is
    /// cancelled (its future dropped; an unload hook is never cut), and its
    /// requests fail with [`CallError::ModelLoad`](crate::CallError::ModelLoad).
    fn load_model(
        &self,
        model_id: &str,
    ) -> impl Future<Output = Result<Self::Model, UserError>> + Send;

    /// Unload an evicted model (Ray calls the model's `__del__`). It runs at
    /// once, as Ray's does: requests that took the model before it was
    /// evicted may still be running with it (each holds an `Arc` of it, so
    /// the value itself lives until the last is done). Free what they could
    /// still use (a GPU's memory) in the model's `Drop`, which runs after
    /// them, not here. A panic here is logged. Default: drop it.
    fn unload_model(
        &self,
        model_id: &str,
        model: Arc<Self::Model>,
    ) -> impl Future<Output = ()> + Send {
        let _ = (model_id, model);
        async {}
    }

    /// Serve one request with its model.
    fn handle(
        &self,
        model: &Self::Model,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, UserError>> + Send;

    /// Serve a batch of requests for one model (when the config has
    /// `batching`, which needs [`BATCHED`](Self::BATCHED)): one response per
    /// request, in order. Default (reached only by code that sets `BATCHED`
    /// without writing this): every request through [`handle`](Self::handle),
    /// concurrently; the first error fails the batch.
    fn handle_batch(
        &self,
        model: &Self::Model,
        requests: Vec<Self::Request>,
    ) -> impl Future<Output = Result<Vec<Self::Response>, UserError>> + Send {
        async move {
            futures::future::join_all(requests.into_iter().map(|r| self.handle(model, r)))
                .await
                .into_iter()
                .collect()
        }
    }

    /// Serve one request with a stream of responses (see
    /// [`Deployment::handle_stream`](crate::Deployment::handle_stream)).
    /// Default: one item, [`handle`](Self::handle)'s response.
    fn handle_stream(
        &self,
        model: Arc<Self::Model>,
        request: Self::Request,
    ) -> impl Stream<Item = Result<Self::Response, UserError>> + Send + '_ {
        futures::stream::once(async move { self.handle(&model, request).await })
    }

    /// Take a new user config in place (see
    /// [`Deployment::reconfigure`](crate::Deployment::reconfigure)).
    fn reconfigure(&self, user_config: Args) -> impl Future<Output = Result<(), UserError>> + Send {
        let _ = user_config;
        async { Ok(()) }
    }

    /// Report health (see
    /// [`Deployment::check_health`](crate::Deployment::check_health)).
    fn check_health(&self) -> impl Future<Output = Result<(), UserError>> + Send {
        async { Ok(()) }
    }
}

/// A [`MultiplexedDeployment`] behind bytes, with its replica's model cache.
pub(crate) struct ErasedMultiplexed<M: MultiplexedDeployment> {
    inner: Arc<M>,
    cache: Arc<ModelCache<M>>,
}

impl<M: MultiplexedDeployment> ErasedMultiplexed<M> {
    /// `span`: the replica's, for its model loads and unloads.
    pub(crate) fn new(inner: M, settings: Arc<Settings>, span: tracing::Span) -> Self {
        let inner = Arc::new(inner);
        ErasedMultiplexed {
            cache: ModelCache::new(inner.clone(), settings, span),
            inner,
        }
    }

    async fn model(&self, model_id: Option<&Arc<str>>) -> Result<Arc<M::Model>, CallError> {
        match model_id {
            Some(id) => self.cache.get(id).await,
            None => Err(CallError::ModelLoad {
                model_id: String::new(),
                message: "The model ID cannot be empty: a request to a multiplexed deployment \
                          needs one (DeploymentHandle::with_model_id, or the \
                          serve_multiplexed_model_id HTTP header)"
                    .to_owned(),
            }),
        }
    }
}

impl<M: MultiplexedDeployment> ErasedDeployment for ErasedMultiplexed<M> {
    fn batched(&self) -> bool {
        M::BATCHED
    }

    fn handle(&self, call: Call) -> BoxFuture<'_, Result<Payload, CallError>> {
        Box::pin(async move {
            let model = self.model(call.model_id.as_ref()).await?;
            serve_one(call.payload, |req| self.inner.handle(&model, req)).await
        })
    }

    fn handle_batch(
        &self,
        model_id: Option<Arc<str>>,
        requests: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, BatchResult> {
        Box::pin(async move {
            let model = self
                .model(model_id.as_ref())
                .await
                .map_err(crate::user::BatchError::Failed)?;
            serve_batch(requests, |reqs| self.inner.handle_batch(&model, reqs)).await
        })
    }

    fn handle_stream(&self, call: Call, items: ItemSender) -> BoxFuture<'_, Result<(), CallError>> {
        Box::pin(async move {
            let model = self.model(call.model_id.as_ref()).await?;
            let req: M::Request = request(call.payload)?;
            let stream =
                std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.handle_stream(model, req)))
                    .map_err(|p| CallError::Panicked(panic_message(p)))?;
            drive_stream(stream, items).await
        })
    }

    fn reconfigure(&self, user_config: Args) -> BoxFuture<'_, Result<(), UserError>> {
        Box::pin(async move {
            guarded(|| self.inner.reconfigure(user_config))
                .await
                .map_err(Into::into)
        })
    }

    fn check_health(&self) -> BoxFuture<'_, Result<(), UserError>> {
        Box::pin(async move {
            guarded(|| self.inner.check_health())
                .await
                .map_err(Into::into)
        })
    }

    fn models(&self) -> Option<&Arc<ModelHub>> {
        Some(self.cache.hub())
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.cache.shutdown())
    }

    fn abort_loads(&self) {
        self.cache.abort_loads();
    }
}

/// The ids of `ids` as text (for snapshots), sorted.
pub(crate) fn sorted_ids(ids: &ModelIds) -> Vec<String> {
    let mut v: Vec<String> = ids.loaded.iter().map(|m| m.to_string()).collect();
    v.sort_unstable();
    v
}
