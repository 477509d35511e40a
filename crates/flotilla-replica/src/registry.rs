//! The code registry: import paths to deployment constructors.

use std::{collections::HashMap, future::Future, sync::Arc};

use flotilla_core::{
    AppName, ApplicationSpec, Args, DeploymentName, ImportPath, RequestRouterConfig,
    is_builtin_policy, is_builtin_router,
};
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;

use crate::{
    AutoscalingPolicyFn, Deployment, DeploymentHandle, Directory, MultiplexedDeployment,
    PolicyContext, ReplicaId, RequestRouter, RouterError, UserError,
    multiplex::ErasedMultiplexed,
    router::default_router,
    user::{Erased, ErasedDeployment},
};

/// What a constructor receives: its init args, where it runs, and a way to reach
/// other deployments.
#[derive(Clone)]
pub struct InitContext {
    /// The init args, as MessagePack; see [`InitContext::args`].
    pub init_args: Args,
    /// The application.
    pub app: AppName,
    /// The deployment.
    pub deployment: DeploymentName,
    /// This replica.
    pub replica: ReplicaId,
    /// The node this replica was placed on; handles made here prefer it.
    pub node: String,
    directory: Directory,
}

impl InitContext {
    /// Decode the init args into the constructor's own type.
    pub fn args<T: DeserializeOwned>(&self) -> Result<T, UserError> {
        self.init_args
            .decode()
            .map_err(|e| UserError::new(format!("init args: {e}")))
    }

    /// A handle to another deployment of the same application, preferring
    /// replicas on this replica's node.
    pub fn handle(&self, deployment: &str) -> Result<DeploymentHandle, UserError> {
        let d = DeploymentName::new(deployment).map_err(|e| UserError::new(e.to_string()))?;
        Ok(self.handle_in(&self.app, &d))
    }

    /// A handle to a deployment of any application, preferring replicas on this
    /// replica's node.
    pub fn handle_in(&self, app: &AppName, deployment: &DeploymentName) -> DeploymentHandle {
        self.directory
            .handle(app, deployment)
            .prefer_node(self.node.clone())
    }
}

type Constructor = Arc<
    dyn Fn(InitContext) -> BoxFuture<'static, Result<Arc<dyn ErasedDeployment>, UserError>>
        + Send
        + Sync,
>;

/// Makes a request router from a deployment's `request_router_kwargs`
/// (canonical MessagePack: decode with [`Args::decode`]).
pub type RequestRouterFactory =
    Arc<dyn Fn(&Args) -> Result<Arc<dyn RequestRouter>, UserError> + Send + Sync>;

/// A deployment's registered code: its constructor, and whether it accepts
/// batches ([`Deployment::BATCHED`]).
#[derive(Clone)]
struct Code {
    construct: Constructor,
    batched: bool,
    multiplexed: bool,
}

type AppBuilder =
    Arc<dyn Fn(Args) -> BoxFuture<'static, Result<ApplicationSpec, UserError>> + Send + Sync>;

/// Maps import paths to deployment constructors, application builders and
/// autoscaling policies. Register the same paths after a process restart and
/// every checkpointed application comes back.
///
/// ```
/// use flotilla_replica::{Deployment, Registry, UserError};
/// struct Echo;
/// impl Deployment for Echo {
///     type Request = String;
///     type Response = String;
///     async fn handle(&self, r: String) -> Result<String, UserError> { Ok(r) }
/// }
/// let registry = Registry::new().register("echo::Echo", |_ctx| async { Ok(Echo) }).unwrap();
/// assert!(registry.contains("echo::Echo"));
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    constructors: Arc<HashMap<ImportPath, Code>>,
    builders: Arc<HashMap<ImportPath, AppBuilder>>,
    policies: Arc<HashMap<ImportPath, AutoscalingPolicyFn>>,
    routers: Arc<HashMap<ImportPath, RequestRouterFactory>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn sorted<V>(m: &HashMap<ImportPath, V>) -> Vec<&str> {
            let mut v: Vec<&str> = m.keys().map(ImportPath::as_str).collect();
            v.sort_unstable();
            v
        }
        f.debug_struct("Registry")
            .field("deployments", &sorted(&self.constructors))
            .field("applications", &sorted(&self.builders))
            .field("autoscaling_policies", &sorted(&self.policies))
            .field("request_routers", &sorted(&self.routers))
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register `ctor` under `path`. Constructors are async and may fail; a failure
    /// is retried by the deployment with backoff.
    pub fn register<D, F, Fut>(mut self, path: &str, ctor: F) -> Result<Self, flotilla_core::Error>
    where
        D: Deployment,
        F: Fn(InitContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<D, UserError>> + Send + 'static,
    {
        let path = ImportPath::new(path)?;
        let ctor: Constructor = Arc::new(move |ctx| {
            let fut = ctor(ctx);
            Box::pin(async move {
                let d = fut.await?;
                Ok(Arc::new(Erased(d)) as Arc<dyn ErasedDeployment>)
            })
        });
        let code = Code {
            construct: ctor,
            batched: D::BATCHED,
            multiplexed: false,
        };
        Arc::make_mut(&mut self.constructors).insert(path, code);
        Ok(self)
    }

    /// Register a multiplexed deployment's constructor under `path` (see
    /// [`MultiplexedDeployment`]): each replica gets its own model cache,
    /// bounded by the deployment's `max_num_models_per_replica`. Deployed,
    /// redeployed and recovered exactly as one registered with
    /// [`register`](Self::register).
    pub fn register_multiplexed<M, F, Fut>(
        mut self,
        path: &str,
        ctor: F,
    ) -> Result<Self, flotilla_core::Error>
    where
        M: MultiplexedDeployment,
        F: Fn(InitContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M, UserError>> + Send + 'static,
    {
        let path = ImportPath::new(path)?;
        let ctor: Constructor = Arc::new(move |ctx: InitContext| {
            // The model limit is the deployment's, kept on its route.
            let settings = ctx
                .directory
                .route(&ctx.app, &ctx.deployment)
                .settings()
                .clone();
            // The replica's loads and unloads run in tasks of their own, in it.
            let span = tracing::info_span!(parent: None, "model_cache", app = %ctx.app,
                deployment = %ctx.deployment, replica = %ctx.replica);
            let fut = ctor(ctx);
            Box::pin(async move {
                let m = fut.await?;
                Ok(Arc::new(ErasedMultiplexed::new(m, settings, span))
                    as Arc<dyn ErasedDeployment>)
            })
        });
        let code = Code {
            construct: ctor,
            batched: M::BATCHED,
            multiplexed: true,
        };
        Arc::make_mut(&mut self.constructors).insert(path, code);
        Ok(self)
    }

    /// Whether `path` is registered.
    pub fn contains(&self, path: &str) -> bool {
        self.constructors.contains_key(path)
    }

    /// Whether the code registered under `path` accepts batches
    /// ([`Deployment::BATCHED`], [`MultiplexedDeployment::BATCHED`]): what a
    /// deployment with `batching` in its config must run. `false` for a path
    /// nothing is registered under.
    pub fn accepts_batches(&self, path: &str) -> bool {
        self.constructors.get(path).is_some_and(|c| c.batched)
    }

    /// Whether the code registered under `path` is multiplexed (registered with
    /// [`register_multiplexed`](Self::register_multiplexed)): what a deployment
    /// that sets `max_num_models_per_replica` must run. `false` for a path
    /// nothing is registered under.
    pub fn multiplexes(&self, path: &str) -> bool {
        self.constructors.get(path).is_some_and(|c| c.multiplexed)
    }

    /// Register a request router under `path`, the import path a deployment's
    /// `request_router_config.request_router_class` names. `factory` makes the
    /// router from the config's `request_router_kwargs` each time a deployment
    /// takes that class or new kwargs (an error refuses the kwargs, and the
    /// deployment is refused with it). Ray's default router paths
    /// ([`BUILTIN_REQUEST_ROUTERS`](flotilla_core::BUILTIN_REQUEST_ROUTERS))
    /// name the built-in router and cannot be registered.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use flotilla_replica::{Registry, ReplicaEndpoint, RequestRouter, RoutingRequest, UserError};
    /// /// The first replica with at least `min_free` free slots.
    /// struct FirstFree { min_free: u32 }
    /// impl RequestRouter for FirstFree {
    ///     fn choose(&self, _: &RoutingRequest<'_>, replicas: &[Arc<ReplicaEndpoint>]) -> Option<usize> {
    ///         replicas.iter().position(|r| {
    ///             r.is_accepting() && r.in_flight() + self.min_free <= r.max_ongoing_requests()
    ///         })
    ///     }
    /// }
    /// #[derive(serde::Deserialize)]
    /// struct Kwargs { #[serde(default = "one")] min_free: u32 }
    /// fn one() -> u32 { 1 }
    /// let registry = Registry::new()
    ///     .register_request_router("shop.routers:FirstFree", |kwargs| {
    ///         let k: Kwargs = kwargs.decode().map_err(|e| UserError::new(e.to_string()))?;
    ///         Ok(FirstFree { min_free: k.min_free.max(1) })
    ///     })
    ///     .unwrap();
    /// assert!(registry.contains_request_router("shop.routers:FirstFree"));
    /// // Ray's default class is the built-in router: always there.
    /// assert!(registry.contains_request_router(
    ///     "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"
    /// ));
    /// ```
    pub fn register_request_router<R, F>(
        mut self,
        path: &str,
        factory: F,
    ) -> Result<Self, flotilla_core::Error>
    where
        R: RequestRouter,
        F: Fn(&Args) -> Result<R, UserError> + Send + Sync + 'static,
    {
        let path = ImportPath::new(path)?;
        if is_builtin_router(path.as_str()) {
            return Err(flotilla_core::Error::InvalidName {
                at: flotilla_core::Location::default(),
                what: "request router path",
                value: path.to_string(),
                reason: "names Ray's default router, which is Flotilla's built-in one; \
                         register a custom router under a path of its own",
            });
        }
        let factory: RequestRouterFactory =
            Arc::new(move |kwargs| factory(kwargs).map(|r| Arc::new(r) as Arc<dyn RequestRouter>));
        Arc::make_mut(&mut self.routers).insert(path, factory);
        Ok(self)
    }

    /// Whether `path` names a request router: one registered with
    /// [`register_request_router`](Self::register_request_router), or one of
    /// Ray's default paths (the built-in router).
    pub fn contains_request_router(&self, path: &str) -> bool {
        is_builtin_router(path) || self.routers.contains_key(path)
    }

    /// Make the router `config` names, with its kwargs: the built-in one for
    /// Ray's default paths (which takes no kwargs), else the registered
    /// factory's (a panic in it is an error too).
    pub fn request_router(
        &self,
        config: &RequestRouterConfig,
    ) -> Result<Arc<dyn RequestRouter>, RouterError> {
        let path = config.request_router_class.as_str();
        if is_builtin_router(path) {
            return Ok(default_router());
        }
        let factory = self
            .routers
            .get(path)
            .ok_or_else(|| RouterError::NotRegistered {
                path: path.to_owned(),
            })?;
        let kwargs = &config.request_router_kwargs;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory(kwargs))) {
            Ok(Ok(router)) => Ok(router),
            Ok(Err(e)) => Err(RouterError::Kwargs {
                path: path.to_owned(),
                message: e.0,
            }),
            Err(p) => Err(RouterError::Kwargs {
                path: path.to_owned(),
                message: format!("panicked: {}", crate::user::panic_message(p)),
            }),
        }
    }

    /// Register an application builder under `path`, for config deploys: it turns
    /// the config's `args` into an [`ApplicationSpec`] (the config's overrides are
    /// applied on top). Builders run in a build task, off the Controller.
    pub fn register_app<F, Fut>(
        mut self,
        path: &str,
        builder: F,
    ) -> Result<Self, flotilla_core::Error>
    where
        F: Fn(Args) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ApplicationSpec, UserError>> + Send + 'static,
    {
        let path = ImportPath::new(path)?;
        let builder: AppBuilder = Arc::new(move |args| Box::pin(builder(args)));
        Arc::make_mut(&mut self.builders).insert(path, builder);
        Ok(self)
    }

    /// Whether an application builder is registered under `path` (deployment
    /// constructors and application builders are separate name spaces).
    ///
    /// ```
    /// use flotilla_core::{ApplicationSpec, DeploymentSpec};
    /// use flotilla_replica::Registry;
    /// let registry = Registry::new()
    ///     .register_app("shop:app", |_args| async {
    ///         Ok(ApplicationSpec::builder("shop")
    ///             .deployment(DeploymentSpec::builder("front", "shop::Front"))
    ///             .build()
    ///             .map_err(|e| e.to_string())?)
    ///     })
    ///     .unwrap();
    /// assert!(registry.contains_app("shop:app"));
    /// assert!(!registry.contains("shop:app"));
    /// assert!(!registry.contains_app("shop:other"));
    /// ```
    pub fn contains_app(&self, path: &str) -> bool {
        self.builders.contains_key(path)
    }

    /// Register a custom autoscaling policy under `path`, the import path a
    /// config names in `autoscaling_config.policy.policy_function` or an
    /// application's `autoscaling_policy` (see [`AutoscalingPolicyFn`] for what
    /// it computes). Ray's default policy paths
    /// ([`BUILTIN_AUTOSCALING_POLICIES`](flotilla_core::BUILTIN_AUTOSCALING_POLICIES))
    /// name the built-in policy and cannot be registered.
    ///
    /// ```
    /// use flotilla_replica::Registry;
    /// // Twice as many replicas as the queue asks for.
    /// let registry = Registry::new()
    ///     .register_autoscaling_policy("shop.policies:eager", |ctx| {
    ///         2.0 * ctx.total_requests / ctx.config.target_ongoing_requests
    ///     })
    ///     .unwrap();
    /// assert!(registry.contains_autoscaling_policy("shop.policies:eager"));
    /// // Ray's default path is the built-in policy: always there.
    /// assert!(registry.contains_autoscaling_policy(
    ///     "ray.serve.autoscaling_policy:default_autoscaling_policy"
    /// ));
    /// assert!(!registry.contains_autoscaling_policy("shop.policies:other"));
    /// ```
    pub fn register_autoscaling_policy<F>(
        mut self,
        path: &str,
        policy: F,
    ) -> Result<Self, flotilla_core::Error>
    where
        F: Fn(&PolicyContext<'_>) -> f64 + Send + Sync + 'static,
    {
        let path = ImportPath::new(path)?;
        if is_builtin_policy(path.as_str()) {
            return Err(flotilla_core::Error::InvalidName {
                at: flotilla_core::Location::default(),
                what: "autoscaling policy path",
                value: path.to_string(),
                reason: "names Ray's default policy, which is Flotilla's built-in one; \
                         register a custom policy under a path of its own",
            });
        }
        Arc::make_mut(&mut self.policies).insert(path, Arc::new(policy));
        Ok(self)
    }

    /// Whether `path` names an autoscaling policy: one registered with
    /// [`register_autoscaling_policy`](Self::register_autoscaling_policy), or one
    /// of Ray's default paths (the built-in policy).
    pub fn contains_autoscaling_policy(&self, path: &str) -> bool {
        is_builtin_policy(path) || self.policies.contains_key(path)
    }

    /// The custom policy registered under `path`; `None` for the built-in
    /// policy's paths and for paths nothing is registered under.
    pub fn autoscaling_policy(&self, path: &str) -> Option<AutoscalingPolicyFn> {
        self.policies.get(path).cloned()
    }

    /// Run the application builder registered under `path`; a panic in it is an
    /// error, and an unknown path is an error naming it.
    pub fn build_app(
        &self,
        path: &ImportPath,
        args: Args,
    ) -> BoxFuture<'static, Result<ApplicationSpec, UserError>> {
        match self.builders.get(path.as_str()) {
            Some(b) => {
                let b = b.clone();
                Box::pin(async move { crate::user::guarded(|| b(args)).await.map_err(Into::into) })
            }
            None => {
                let msg =
                    format!("no application builder is registered under import path '{path}'");
                Box::pin(async move { Err(UserError(msg)) })
            }
        }
    }

    pub(crate) fn construct(
        &self,
        path: &ImportPath,
        ctx: InitContext,
    ) -> BoxFuture<'static, Result<Arc<dyn ErasedDeployment>, UserError>> {
        match self.constructors.get(path.as_str()) {
            // The closure itself may panic before returning its future: call it
            // inside the (guarded) future so that panic is caught too.
            Some(c) => {
                let c = c.construct.clone();
                Box::pin(async move { c(ctx).await })
            }
            None => {
                let msg = format!("no deployment is registered under import path '{path}'");
                Box::pin(async move { Err(UserError(msg)) })
            }
        }
    }

    pub(crate) fn context(
        directory: &Directory,
        init_args: Args,
        app: AppName,
        deployment: DeploymentName,
        replica: ReplicaId,
        node: String,
    ) -> InitContext {
        InitContext {
            init_args,
            app,
            deployment,
            replica,
            node,
            directory: directory.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use flotilla_core::{AutoscalingConfig, BUILTIN_AUTOSCALING_POLICIES};

    use super::*;

    #[test]
    fn a_registered_policy_is_found_and_called_and_rays_defaults_are_built_in() {
        let registry = Registry::new()
            .register_autoscaling_policy("shop.policies:fixed", |ctx| {
                f64::from(ctx.config.max_replicas) + ctx.total_requests
            })
            .unwrap();
        let policy = registry.autoscaling_policy("shop.policies:fixed").unwrap();
        let (app, dep) = (
            AppName::new("a").unwrap(),
            DeploymentName::new("d").unwrap(),
        );
        let config = AutoscalingConfig {
            max_replicas: 7,
            ..AutoscalingConfig::default()
        };
        let ctx = PolicyContext {
            app: &app,
            deployment: &dep,
            current_replicas: 1,
            running_replicas: 1,
            total_requests: 0.5,
            queued_requests: 0.0,
            samples: &[0.5],
            config: &config,
            kwargs: &Args::empty_map(),
        };
        assert_eq!(policy(&ctx), 7.5);
        for path in BUILTIN_AUTOSCALING_POLICIES {
            assert!(registry.contains_autoscaling_policy(path));
            assert!(registry.autoscaling_policy(path).is_none());
            assert!(
                Registry::new()
                    .register_autoscaling_policy(path, |_| 1.0)
                    .is_err(),
                "{path}"
            );
        }
        assert!(!registry.contains_autoscaling_policy("shop.policies:other"));
        assert!(
            Registry::new()
                .register_autoscaling_policy("a b", |_| 1.0)
                .is_err()
        );
        assert!(format!("{registry:?}").contains("shop.policies:fixed"));
    }
}
