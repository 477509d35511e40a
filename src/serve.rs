//! `Serve`: the embedding API.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::SystemTime,
};

use flotilla_cluster::{
    Cluster, LocalCluster,
    nodes::{Head, HeadOptions, NodeCounters, NodeInfo},
};
use flotilla_controller::{
    Checkpoint, CheckpointCloser, ControllerArgs, ControllerMsg, ControllerSnapshot, Deleting,
    Deployed, Fatal, LogSettings, NotRunning, Preloaded, RouteTable, ServeError, StatusBoard,
    StoreCounters, Supervisor, SupervisorArgs, SupervisorMsg, WallClock,
};
use flotilla_core::{
    ApiType, AppName, ApplicationSpec, ApplicationStatus, ApplicationStatusInfo, Faults,
    ServeConfig, actor_names,
};
use flotilla_replica::{DeploymentHandle, Directory, Registry};
use flotilla_supervision::{RestartPolicy, groups};
use ractor::{Actor, ActorRef, RpcReplyPort, rpc::CallResult};
use tokio::sync::watch;

use crate::namespace::NamespaceClaim;

mod faults;

pub use faults::LivingReplica;

/// How to start Flotilla.
#[derive(Clone)]
pub struct ServeOptions {
    /// The checkpoint file (default `flotilla.redb` in the working directory).
    pub store_path: PathBuf,
    /// The code.
    pub registry: Registry,
    /// Where replicas run (default: one local node).
    pub cluster: Arc<dyn Cluster>,
    /// Names every actor of this instance; unique per process (default: generated).
    pub namespace: Option<String>,
    /// How crashed actors restart.
    pub restart: RestartPolicy,
    /// Fault points to arm (fault injection); free when unarmed.
    pub faults: Faults,
    /// Logging settings, kept current by the Controller; give the same to
    /// [`AppLogLayer`](crate::AppLogLayer).
    pub logging: LogSettings,
    /// The wall clock that stamps each accepted target (a status's
    /// `last_deployed`); `SystemTime::now` by default.
    pub clock: WallClock,
    /// Listen for node processes and place replicas on them too (`None`, the
    /// default: this process only). See [`ServeOptions::nodes`].
    pub nodes: Option<HeadOptions>,
}

impl ServeOptions {
    /// Defaults around `registry`.
    pub fn new(registry: Registry) -> Self {
        ServeOptions {
            store_path: PathBuf::from("flotilla.redb"),
            registry,
            cluster: Arc::new(LocalCluster::new()),
            namespace: None,
            restart: RestartPolicy::default(),
            faults: Faults::new(),
            logging: LogSettings::new(),
            clock: Arc::new(SystemTime::now),
            nodes: None,
        }
    }

    /// Make this process a head: listen for node processes
    /// ([`crate::node::run`]) as `head` says (loopback and a cookie by default)
    /// and place replicas on the head and every joined node by their resources.
    /// It replaces [`cluster`](Self::cluster). See `docs/nodes.md`.
    ///
    /// ```no_run
    /// # async fn demo(registry: flotilla::Registry) -> Result<(), Box<dyn std::error::Error>> {
    /// use flotilla::{Cookie, HeadOptions, Serve, ServeOptions};
    /// let head = HeadOptions::new(Cookie::from_env("FLOTILLA_COOKIE")?)
    ///     .listen("127.0.0.1:4697".parse()?);
    /// let serve = Serve::start(ServeOptions::new(registry).nodes(head)).await?;
    /// println!("nodes join at {:?}", serve.node_address());
    /// # Ok(()) }
    /// ```
    pub fn nodes(mut self, head: HeadOptions) -> Self {
        self.nodes = Some(head);
        self
    }

    /// Use the checkpoint file at `path`.
    pub fn store_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.store_path = path.into();
        self
    }

    /// Place replicas on `cluster`.
    pub fn cluster(mut self, cluster: Arc<dyn Cluster>) -> Self {
        self.cluster = cluster;
        self
    }

    /// Name this instance's actors under `ns`: 1 to 128 bytes of letters,
    /// digits, `_`, `.` and `-` ([`Serve::start`] refuses anything else).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    /// Stamp accepted targets with `clock` instead of the system's.
    pub fn clock(mut self, clock: WallClock) -> Self {
        self.clock = clock;
        self
    }
}

/// What `run_many` waits for.
#[derive(Debug, Clone, Copy)]
pub struct RunManyOptions {
    /// Wait until every application's status shows its new generation with its
    /// ingress deployment, as Ray's `_wait_for_deployment_created` waits for
    /// the deployment's status (default true). Flotilla's Controller publishes
    /// that status before it replies, so the wait ends at once; the returned
    /// handles queue requests until replicas run either way. A later deploy of
    /// the application ends the wait too.
    pub wait_for_ingress_deployment_creation: bool,
    /// Wait until every application is RUNNING at its new generation (default true).
    pub wait_for_applications_running: bool,
}

impl Default for RunManyOptions {
    fn default() -> Self {
        RunManyOptions {
            wait_for_ingress_deployment_creation: true,
            wait_for_applications_running: true,
        }
    }
}

/// Counters for tests, benchmarks and operators.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// The store's commits, keys and bytes written.
    pub store: StoreCounters,
    /// The Controller's view.
    pub controller: ControllerSnapshot,
    /// Controller restarts by the Supervisor.
    pub controller_restarts: u64,
    /// Deployments with a live route.
    pub deployments: usize,
    /// Replicas serving now (published to routes).
    pub running_replicas: usize,
    /// Nodes joined, lost and refused, live nodes and the replicas on them
    /// (all zero without [`ServeOptions::nodes`]).
    pub nodes: NodeCounters,
}

struct Inner {
    ns: String,
    /// The namespace, this instance's until it is stopped.
    claim: Mutex<NamespaceClaim>,
    supervisor: ActorRef<SupervisorMsg>,
    /// Closes the checkpoint when the instance dies without the Controller's
    /// goodbye; the Controller alone reads and writes it.
    checkpoint: CheckpointCloser,
    board: StatusBoard,
    route_table: RouteTable,
    directory: Directory,
    fatal: watch::Receiver<Option<Fatal>>,
    faults: Faults,
    /// Set by `shutdown` and `crash_process`: the instance serves no more.
    stopped: AtomicBool,
    /// The head's node machinery, with [`ServeOptions::nodes`].
    head: Option<Head>,
}

impl Inner {
    /// Every actor of this instance still alive: the Controller, the
    /// ApplicationActors of the applications on the board, and the members of
    /// its process groups (DeploymentActors and replicas). Only names under
    /// this instance's namespace segment are matched.
    fn living_actors(&self) -> Vec<ractor::ActorCell> {
        let ns = &self.ns;
        let mut cells = Vec::new();
        cells.extend(ractor::registry::where_is(actor_names::controller(ns)));
        for (app, _) in self.board.all() {
            cells.extend(ractor::registry::where_is(actor_names::application(
                ns, &app,
            )));
        }
        for (_, members) in groups::with_prefix(&actor_names::namespace_prefix(ns)) {
            cells.extend(members);
        }
        cells
    }

    /// The instance is stopped: another may take its namespace. (Its last
    /// `Serve` dropped releases it too, after killing what was left.)
    fn release_namespace(&self) {
        self.claim
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .release();
    }

    /// Kill every actor at once (no drain), close every route and the store.
    /// Returns the actors killed, to wait for.
    fn kill_all(&self) -> Vec<ractor::ActorCell> {
        self.stopped.store(true, Ordering::Release);
        self.supervisor.kill();
        let cells = self.living_actors();
        for cell in &cells {
            cell.kill();
        }
        self.directory.shut_down();
        self.checkpoint.close();
        if let Some(head) = &self.head {
            // As a crash: the nodes see their sessions drop, and keep their replicas.
            head.kill();
        }
        cells
    }
}

/// Dropping the last `Serve` of an instance that was not shut down stops it
/// at once, as a crash would (no drain; acknowledged work is in the store): its
/// store is closed, so another `Serve::start` on the same file may open it.
impl Drop for Inner {
    fn drop(&mut self) {
        if !self.stopped.load(Ordering::Acquire) {
            tracing::warn!(namespace = %self.ns,
                "the last Serve handle was dropped without shutdown(): stopping at once, without draining");
            self.kill_all();
        }
    }
}

/// A running Flotilla instance: cheap to clone.
#[derive(Clone)]
pub struct Serve {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Serve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serve")
            .field("namespace", &self.inner.ns)
            .finish()
    }
}

impl Serve {
    /// Open (or create) the store, recover what it holds, and start the actor tree.
    pub async fn start(options: ServeOptions) -> Result<Serve, ServeError> {
        let claim = match &options.namespace {
            Some(ns) => {
                actor_names::validate_namespace(ns)?;
                NamespaceClaim::take(ns).ok_or_else(|| ServeError::NamespaceInUse {
                    namespace: ns.clone(),
                })?
            }
            None => NamespaceClaim::generated(),
        };
        // The node options are checked before the store is touched: a start
        // they fail leaves no file behind.
        if let Some(head_options) = &options.nodes {
            head_options
                .validate()
                .map_err(flotilla_cluster::nodes::NodeError::from)?;
        }
        // Fail before spawning anything if the checkpoint cannot be read; the open reads
        // and checks all of it, and the Controller starts from what it read.
        let (checkpoint, snapshot) = Checkpoint::open(&options.store_path)?;
        let created = checkpoint.created();
        let closer = checkpoint.closer();
        // A start that fails after this removes the file if this start
        // created it (what is left is as before the call), then closes the
        // store: removed while its lock is held, so it is not another
        // start's, which could open the path once the lock is released.
        let undo = |closer: &CheckpointCloser| {
            let removed = created && std::fs::remove_file(&options.store_path).is_ok();
            closer.close();
            // Where an open file cannot be removed (Windows), once closed.
            if created && !removed {
                let _ = std::fs::remove_file(&options.store_path);
            }
        };
        let recovering = !snapshot.apps.is_empty();
        let preloaded = Preloaded::new(snapshot);
        let ns = claim.name().to_owned();
        let board = StatusBoard::new();
        let route_table = RouteTable::new();
        let directory = Directory::new();
        let mut cluster = options.cluster;
        let head = match options.nodes {
            None => None,
            Some(head_options) => {
                let reporter: flotilla_cluster::nodes::ReporterFactory =
                    Arc::new(flotilla_deployment::replica_reporter);
                let head = match Head::start(
                    head_options,
                    ns.clone(),
                    directory.clone(),
                    reporter,
                    options.logging.clone(),
                )
                .await
                {
                    Ok(h) => h,
                    Err(e) => {
                        undo(&closer);
                        return Err(e.into());
                    }
                };
                if recovering {
                    // Nodes that outlived the previous head re-attach before the
                    // recovered DeploymentActors look for their replicas.
                    head.await_reattach().await;
                }
                cluster = head.cluster();
                Some(head)
            }
        };
        let (fatal_tx, fatal) = watch::channel(None);
        let args = SupervisorArgs {
            controller: ControllerArgs {
                ns: ns.clone(),
                checkpoint,
                registry: options.registry,
                directory: directory.clone(),
                cluster,
                board: board.clone(),
                restart: options.restart,
                faults: options.faults.clone(),
                logging: options.logging.clone(),
                preloaded,
                clock: options.clock,
                route_table: route_table.clone(),
                app_restarts: Default::default(),
                shutdown: Default::default(),
            },
            fatal: fatal_tx,
        };
        let (supervisor, _) =
            match Actor::spawn(Some(actor_names::supervisor(&ns)), Supervisor, args).await {
                Ok(s) => s,
                Err(e) => {
                    if let Some(head) = &head {
                        head.stop().await;
                    }
                    undo(&closer);
                    // Another instance took the namespace since it was checked.
                    if let ractor::SpawnErr::ActorAlreadyRegistered(_) = e {
                        return Err(ServeError::NamespaceInUse { namespace: ns });
                    }
                    return Err(ServeError::Unavailable(
                        NotRunning::SupervisorFailedToStart(e),
                    ));
                }
            };
        Ok(Serve {
            inner: Arc::new(Inner {
                ns,
                claim: Mutex::new(claim),
                supervisor,
                checkpoint: closer,
                board,
                route_table,
                directory,
                fatal,
                faults: options.faults,
                stopped: AtomicBool::new(false),
                head,
            }),
        })
    }

    /// `Unavailable` once the instance was shut down or crashed.
    fn check_running(&self) -> Result<(), ServeError> {
        if self.inner.stopped.load(Ordering::Acquire) {
            return Err(ServeError::Unavailable(NotRunning::Stopped));
        }
        Ok(())
    }

    /// Send `build(reply)` to the current Controller and await the reply.
    pub(crate) async fn ask<T: Send + 'static>(
        &self,
        build: impl FnOnce(RpcReplyPort<T>) -> ControllerMsg,
    ) -> Result<T, ServeError> {
        let (tx, rx) = ractor::concurrency::oneshot();
        self.inner
            .supervisor
            .cast(SupervisorMsg::Forward(build(tx.into())))
            // Stopped: shut down, or gone after giving up (then it says so).
            .map_err(|_| lost_reply(&self.inner.fatal, true))?;
        rx.await.map_err(|_| self.lost())
    }

    /// Why a reply the Controller owed did not come (or came incomplete).
    fn lost(&self) -> ServeError {
        lost_reply(
            &self.inner.fatal,
            self.inner.stopped.load(Ordering::Acquire),
        )
    }

    /// Deploy one application and wait until it is RUNNING at the new generation;
    /// returns a handle to its ingress deployment.
    ///
    /// ```no_run
    /// # async fn demo(serve: flotilla::Serve) -> Result<(), Box<dyn std::error::Error>> {
    /// use flotilla::{ApplicationSpec, DeploymentSpec};
    /// let app = ApplicationSpec::builder("greeter")
    ///     .route_prefix("/greet")
    ///     .deployment(DeploymentSpec::builder("hello", "demo::Hello").replicas(2))
    ///     .build()?;
    /// let handle = serve.run(app).await?;
    /// let answer: String = handle.call("world").await?;
    /// # Ok(()) }
    /// ```
    pub async fn run(&self, app: ApplicationSpec) -> Result<DeploymentHandle, ServeError> {
        let handles = self.run_many(vec![app], RunManyOptions::default()).await?;
        // `deploy` answers one handle per application, or an error.
        handles.into_iter().next().ok_or_else(|| self.lost())
    }

    /// Deploy many applications in one controller message and one checkpoint commit.
    /// All-or-nothing: a rejected batch changes nothing.
    ///
    /// With `wait_for_applications_running` (the default) the call then waits
    /// for every application to run. An error from that wait comes after the
    /// commit: `DeployFailed` (or `NotFound`, for an application deleted
    /// meanwhile) names the first application that did not reach RUNNING,
    /// and every application of the batch stays deployed (see
    /// [`status`](Self::status) for the others). An application that a
    /// later deploy changed meanwhile is waited for at that later
    /// generation; if its target no longer has this call's ingress, the
    /// call is `NotFound` naming the ingress (no handle to a deployment
    /// nothing runs).
    ///
    /// ```no_run
    /// # async fn demo(serve: flotilla::Serve) -> Result<(), Box<dyn std::error::Error>> {
    /// use flotilla::{ApplicationSpec, DeploymentSpec, RunManyOptions, ServeError};
    /// let apps = (0..1_000)
    ///     .map(|i| {
    ///         ApplicationSpec::builder(format!("tenant-{i}"))
    ///             .deployment(DeploymentSpec::builder("model", "demo::Model"))
    ///             .build()
    ///     })
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// // Durable when this returns; the replicas start in the background.
    /// let options = RunManyOptions {
    ///     wait_for_applications_running: false,
    ///     ..RunManyOptions::default()
    /// };
    /// let handles = serve.run_many(apps, options).await?;
    /// assert_eq!(handles.len(), 1_000);
    /// // One bad application refuses the whole batch, and nothing changes.
    /// let again = ApplicationSpec::builder("tenant-x")
    ///     .deployment(DeploymentSpec::builder("model", "demo::Model"))
    ///     .build()?;
    /// let twice = vec![again.clone(), again];
    /// assert!(matches!(
    ///     serve.run_many(twice, RunManyOptions::default()).await,
    ///     Err(ServeError::DuplicateApp { .. })
    /// ));
    /// # Ok(()) }
    /// ```
    pub async fn run_many(
        &self,
        apps: Vec<ApplicationSpec>,
        options: RunManyOptions,
    ) -> Result<Vec<DeploymentHandle>, ServeError> {
        self.deploy(apps, ApiType::Imperative, options).await
    }

    async fn deploy(
        &self,
        apps: Vec<ApplicationSpec>,
        api_type: ApiType,
        options: RunManyOptions,
    ) -> Result<Vec<DeploymentHandle>, ServeError> {
        let targets: Vec<_> = apps
            .iter()
            .map(|a| (a.name.clone(), a.ingress.clone()))
            .collect();
        let deployed = self
            .ask(|reply| ControllerMsg::Deploy {
                apps,
                api_type,
                reply,
            })
            .await??;
        // The Controller answers one target per application it was given;
        // an answer short of that is one it did not finish giving.
        if deployed.len() != targets.len() {
            return Err(self.lost());
        }
        let mut handles = Vec::with_capacity(targets.len());
        for ((name, ingress), deployed) in targets.into_iter().zip(deployed) {
            let Deployed {
                generation,
                status: mut rx,
            } = deployed;
            if options.wait_for_applications_running {
                self.wait_running(&name, &mut rx, generation).await?;
            } else if options.wait_for_ingress_deployment_creation {
                self.wait_for(&name, &mut rx, |s| {
                    s.observed_generation > generation
                        || (s.observed_generation == generation
                            && s.deployments.contains_key(&ingress))
                })
                .await?;
            }
            // A delete that came meanwhile (or already finished: the channel
            // is closed), or a later deploy whose target has no such ingress
            // (the wait ends at a later generation too): its route goes as
            // its deployment ends, and a route made now would have nothing
            // behind it.
            let gone = rx.has_changed().is_err() || {
                let s = rx.borrow();
                s.status == ApplicationStatus::Deleting || !s.deployments.contains_key(&ingress)
            };
            handles.push(self.handle_on(&name, &ingress, gone)?);
        }
        Ok(handles)
    }

    /// Wait until `name`'s status, watched by `rx`, satisfies `done`;
    /// `Err(NotFound)` if the application is deleted.
    async fn wait_for(
        &self,
        name: &AppName,
        rx: &mut watch::Receiver<ApplicationStatusInfo>,
        done: impl Fn(&ApplicationStatusInfo) -> bool,
    ) -> Result<ApplicationStatusInfo, ServeError> {
        loop {
            {
                let s = rx.borrow_and_update();
                if done(&s) {
                    return Ok(s.clone());
                }
            }
            // The status first: a wait its last change satisfied is not
            // `Unavailable` because the instance stopped right after.
            tokio::select! {
                biased;
                changed = rx.changed() => if changed.is_err() {
                    return Err(ServeError::NotFound {
                        app: name.to_string(),
                        deployment: None,
                    });
                },
                () = self.stopped() => return Err(Self::stopped_waiting(name)),
            }
        }
    }

    /// Resolves once this instance has stopped serving for good: shut down
    /// (its Supervisor gone) or given up ([`fatal`](Self::fatal)). A status
    /// wait selects on it, since the board keeps every application's channel
    /// open for the life of the `Serve`, and no status moves after this.
    async fn stopped(&self) {
        let mut rx = self.inner.fatal.clone();
        // Ok once the Supervisor gave up; Err once it is gone.
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// The answer of a call that waited on `app`'s status when the instance
    /// stopped: what was acknowledged stays durable; nothing moves any more.
    fn stopped_waiting(app: &AppName) -> ServeError {
        ServeError::Unavailable(NotRunning::StoppedWhileWaiting {
            app: app.to_string(),
        })
    }

    async fn wait_running(
        &self,
        name: &AppName,
        rx: &mut watch::Receiver<ApplicationStatusInfo>,
        generation: u64,
    ) -> Result<(), ServeError> {
        let s = self
            .wait_for(name, rx, |s| {
                s.observed_generation >= generation
                    && matches!(
                        s.status,
                        ApplicationStatus::Running | ApplicationStatus::DeployFailed
                    )
            })
            .await?;
        match s.status {
            ApplicationStatus::DeployFailed => Err(ServeError::DeployFailed {
                app: name.to_string(),
                message: s.message,
            }),
            _ => Ok(()),
        }
    }

    /// Apply a declarative config: validated whole, then one commit. Applications
    /// it names are built by their registered builders (off the Controller) and
    /// deployed with the config's overrides; declarative applications it no longer
    /// names are deleted; imperative ones are left alone unless an entry says
    /// `take_over: true`. Returns once the config is durable; watch the statuses
    /// for the builds.
    ///
    /// The config's `http_options` and `proxy_location` are stored with it:
    /// the HTTP server (`flotilla_http::HttpServer::start`) lays them over its
    /// program's options when it starts. A server already running keeps its
    /// listeners until it is started again, as Ray's proxies do (its REST API
    /// says so to whoever PUTs such a config).
    ///
    /// ```no_run
    /// # async fn demo(serve: flotilla::Serve) -> Result<(), Box<dyn std::error::Error>> {
    /// let config = flotilla::ServeConfig::from_yaml(
    ///     "applications:\n  - name: shop\n    route_prefix: /shop\n    import_path: shop:app\n",
    /// )?;
    /// serve.apply_config(config).await?;
    /// # Ok(()) }
    /// ```
    pub async fn apply_config(&self, config: ServeConfig) -> Result<(), ServeError> {
        self.ask(|reply| ControllerMsg::ApplyConfig {
            config: Box::new(config),
            reply,
        })
        .await?
    }

    /// Set `deployment`'s replica count from outside (Ray's external scaler, for
    /// an application with `external_scaler_enabled`): durable in one
    /// Controller commit when this returns, and standing until the application
    /// declares another count. `ExternalScalerDisabled` for an application
    /// without an external scaler, `BeingDeleted` for one being deleted,
    /// `NotFound` for an unknown one.
    pub async fn scale_deployment(
        &self,
        app: &str,
        deployment: &str,
        replicas: u32,
    ) -> Result<(), ServeError> {
        let app = AppName::new(app)?;
        let deployment = flotilla_core::DeploymentName::new(deployment)?;
        self.ask(|reply| ControllerMsg::ScaleDeployment {
            app,
            deployment,
            replicas,
            reply,
        })
        .await?
    }

    /// Read, parse (errors carry line and column) and apply a YAML config file.
    ///
    /// A path that names no regular file (a FIFO would wait for a writer) is
    /// [`ServeError::ConfigFileNotAFile`], found from its metadata; a file over
    /// [`MAX_CONFIG_FILE_BYTES`](crate::MAX_CONFIG_FILE_BYTES) is
    /// [`ServeError::ConfigFileTooLarge`]. Either changes nothing.
    ///
    /// ```no_run
    /// # async fn demo(serve: flotilla::Serve) -> Result<(), flotilla::ServeError> {
    /// serve.apply_config_file("serve_config.yaml").await?;
    /// # Ok(()) }
    /// ```
    pub async fn apply_config_file(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<(), ServeError> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let path = path.as_ref().to_owned();
        let parse = move || -> Result<ServeConfig, ServeError> {
            let text = read_config_file(&path)?;
            Ok(ServeConfig::from_yaml(&text)?)
        };
        // Reading and parsing take a few milliseconds per MiB: off the
        // runtime's workers, which the actors and the proxy share. A
        // current-thread runtime has no other worker to free, and parsing
        // inline keeps a paused-time run (the simulator) a pure function of
        // its seed, as the Controller's checkpoint commits do: a blocking
        // thread finishes at a wall-clock moment, and the paused clock may
        // advance between its end and this task's wake.
        if Handle::current().runtime_flavor() == RuntimeFlavor::CurrentThread {
            return self.apply_config(parse()?).await;
        }
        let parsed = tokio::task::spawn_blocking(parse).await;
        let config = match parsed {
            Ok(config) => config?,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down.
            Err(_) => return Err(ServeError::Unavailable(NotRunning::Stopped)),
        };
        self.apply_config(config).await
    }

    /// Delete applications (unknown names are ignored), given as any iterator of
    /// names (`["a", "b"]`, a `Vec<String>`, the keys of a status list...). With
    /// `wait`, return once they are gone.
    ///
    /// Every name is checked first: one that no application could have (empty,
    /// too long, or with a character application names refuse) is
    /// [`ServeError::Invalid`] (`flotilla_core::Error::InvalidName`) naming it,
    /// and nothing is deleted. No names delete nothing and answer `Ok`, as
    /// unknown ones do (unlike an empty [`run_many`](Self::run_many)): a
    /// "delete everything" of an instance with no application succeeds.
    ///
    /// ```no_run
    /// # async fn demo(serve: flotilla::Serve) -> Result<(), flotilla::ServeError> {
    /// serve.delete_apps(["greeter", "shop"], true).await?;
    /// assert!(serve.status().is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn delete_apps<I>(&self, names: I, wait: bool) -> Result<(), ServeError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let deletion = self.begin_delete(names).await?;
        if wait {
            self.deleted(deletion).await?;
        }
        Ok(())
    }

    /// [`delete_apps`](Self::delete_apps), waiting at most `limit` for the
    /// applications to be gone: `Ok(true)` once they are, `Ok(false)` when
    /// the limit passed first (the deletions, committed, go on). An error
    /// is the deletion's own, however long the Controller took to answer.
    pub async fn delete_apps_within<I>(
        &self,
        names: I,
        limit: std::time::Duration,
    ) -> Result<bool, ServeError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let deletion = self.begin_delete(names).await?;
        match tokio::time::timeout(limit, self.deleted(deletion)).await {
            Ok(gone) => gone.map(|()| true),
            Err(_) => Ok(false),
        }
    }

    /// Ask the Controller to delete `names`; answered once the deletion is
    /// committed (or refused).
    async fn begin_delete<I>(&self, names: I) -> Result<Deletion, ServeError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names = names
            .into_iter()
            .map(|n| AppName::new(n.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let deletions = self
            .ask(|reply| ControllerMsg::Delete {
                names: names.clone(),
                reply,
            })
            .await??;
        Ok(Deletion { names, deletions })
    }

    /// Wait until every application of `deletion` is gone.
    async fn deleted(&self, deletion: Deletion) -> Result<(), ServeError> {
        let Deletion { names, deletions } = deletion;
        for (deleting, name) in deletions.into_iter().zip(&names) {
            let Some(Deleting {
                generation,
                status: mut rx,
            }) = deleting
            else {
                continue;
            };
            // Gone when the board drops the channel; a redeploy that cancels the
            // deletion shows as a newer generation.
            loop {
                tokio::select! {
                    biased;
                    changed = rx.changed() => if changed.is_err() {
                        break;
                    },
                    () = self.stopped() => return Err(Self::stopped_waiting(name)),
                }
                if rx.borrow().observed_generation > generation {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The route index: which application's ingress serves which route prefix
    /// (applications being deleted hold none), kept current by the Controller;
    /// [`RouteTable::subscribe`] wakes on every change.
    pub fn routes(&self) -> &RouteTable {
        &self.inner.route_table
    }

    /// Every application's status, sorted by name.
    ///
    /// ```no_run
    /// # fn demo(serve: &flotilla::Serve) {
    /// for (name, info) in serve.status() {
    ///     println!("{name}: {:?} {}", info.status, info.message);
    /// }
    /// # }
    /// ```
    pub fn status(&self) -> Vec<(AppName, ApplicationStatusInfo)> {
        self.inner.board.all()
    }

    /// One application's status; NOT_STARTED ("Application X doesn't exist") for an
    /// unknown one.
    pub fn app_status(&self, name: &str) -> ApplicationStatusInfo {
        self.inner.board.status(name)
    }

    /// Watch one application's status (`None` if it does not exist).
    pub fn watch_status(&self, name: &str) -> Option<watch::Receiver<ApplicationStatusInfo>> {
        self.inner.board.subscribe(name)
    }

    /// A handle to an application's ingress deployment: `NotFound` for an
    /// unknown application (or one being deleted whose ingress has ended),
    /// `Unavailable` after `shutdown`.
    pub fn app_handle(&self, name: &str) -> Result<DeploymentHandle, ServeError> {
        self.check_running()?;
        let not_found = || ServeError::NotFound {
            app: flotilla_core::shown(name),
            deployment: None,
        };
        let ingress = self.inner.board.ingress(name).ok_or_else(not_found)?;
        let app = AppName::new(name).map_err(|_| not_found())?;
        let deleting = self
            .inner
            .board
            .subscribe(name)
            .is_some_and(|s| s.borrow().status == ApplicationStatus::Deleting);
        self.handle_on(&app, &ingress, deleting)
    }

    /// A handle to `app`'s `dep`, whose route is made if it has none, unless
    /// the application is being deleted: its deployments' routes go as they
    /// end, and one made after that would have no DeploymentActor behind it
    /// (calls would wait for ever). Then only a route still there serves.
    fn handle_on(
        &self,
        app: &AppName,
        dep: &flotilla_core::DeploymentName,
        deleting: bool,
    ) -> Result<DeploymentHandle, ServeError> {
        if !deleting {
            return Ok(self.inner.directory.handle(app, dep));
        }
        self.inner
            .directory
            .existing_handle(app, dep)
            .ok_or_else(|| ServeError::NotFound {
                app: app.to_string(),
                deployment: Some(dep.to_string()),
            })
    }

    /// A handle to a deployment of a live application: `NotFound` unless the
    /// application's target has that deployment (and, while the application is
    /// deleted, the deployment has not ended yet), `Unavailable` after
    /// `shutdown`.
    pub fn deployment_handle(
        &self,
        app: &str,
        deployment: &str,
    ) -> Result<DeploymentHandle, ServeError> {
        self.check_running()?;
        let status = self
            .inner
            .board
            .subscribe(app)
            .ok_or_else(|| ServeError::NotFound {
                app: flotilla_core::shown(app),
                deployment: None,
            })?;
        let (dep, deleting) = {
            let s = status.borrow();
            let dep = s
                .deployments
                .get_key_value(deployment)
                .map(|(d, _)| d.clone());
            (dep, s.status == ApplicationStatus::Deleting)
        };
        let Some(dep) = dep else {
            return Err(ServeError::NotFound {
                app: flotilla_core::shown(app),
                deployment: Some(flotilla_core::shown(deployment)),
            });
        };
        let a = AppName::new(app)?;
        self.handle_on(&a, &dep, deleting)
    }

    /// One deployment's state as its DeploymentActor sees it: target, status, and
    /// replicas with their states and versions (counts by state and version
    /// included). `None` if it has no living actor (or it did not answer in time).
    pub async fn deployment_snapshot(
        &self,
        app: &str,
        deployment: &str,
    ) -> Result<Option<flotilla_deployment::DeploymentSnapshot>, ServeError> {
        let app = AppName::new(app)?;
        let dep = flotilla_core::DeploymentName::new(deployment)?;
        Ok(flotilla_deployment::observe(
            &self.inner.ns,
            &app,
            &dep,
            std::time::Duration::from_secs(5),
        )
        .await)
    }

    /// Counters: store commits, keys and bytes; actor counts; restarts.
    pub async fn metrics(&self) -> Result<Metrics, ServeError> {
        let controller = self.ask(ControllerMsg::Observe).await?;
        let restarts = self
            .inner
            .supervisor
            .call(SupervisorMsg::Restarts, None)
            .await
            .ok()
            .and_then(|r| match r {
                CallResult::Success(n) => Some(n),
                _ => None,
            })
            .unwrap_or(0);
        let status = self.status();
        let mut running_replicas = 0;
        let mut deployments = 0;
        for (app, s) in &status {
            for d in s.deployments.keys() {
                deployments += 1;
                if let Some(r) = self.inner.directory.get(app, d) {
                    running_replicas += r.replicas().len();
                }
            }
        }
        Ok(Metrics {
            store: controller.store,
            controller,
            controller_restarts: restarts,
            deployments,
            running_replicas,
            nodes: self
                .inner
                .head
                .as_ref()
                .map(Head::counters)
                .unwrap_or_default(),
        })
    }

    /// The id of the node this process is, as its replicas' and its
    /// proxy's details name it: the head's ([`HeadOptions::node_id`], `head`
    /// by default) with [`ServeOptions::nodes`], else [`LOCAL_NODE`](crate::LOCAL_NODE).
    pub fn node_id(&self) -> &str {
        self.inner
            .head
            .as_ref()
            .map_or(flotilla_cluster::LOCAL_NODE, Head::node_id)
    }

    /// Where node processes connect, with [`ServeOptions::nodes`] (the bound
    /// address: a port 0 in the options is the system's choice here).
    pub fn node_address(&self) -> Option<std::net::SocketAddr> {
        self.inner.head.as_ref().map(Head::address)
    }

    /// Every node that joined this head, alive or lost (the 1,000 most recently
    /// lost, as Ray's GCS keeps), sorted by id (empty
    /// without [`ServeOptions::nodes`]).
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.inner
            .head
            .as_ref()
            .map(Head::nodes)
            .unwrap_or_default()
    }

    /// Stop every actor of this instance that is still alive, wait for them,
    /// then close every route and the store.
    async fn stop_everything(&self) {
        self.inner.stopped.store(true, Ordering::Release);
        let cells = self.inner.living_actors();
        for cell in &cells {
            cell.stop(None);
        }
        let _ = self.inner.supervisor.wait(None).await;
        for cell in cells {
            let _ = cell.wait(None).await;
        }
        self.inner.directory.shut_down();
        self.inner.checkpoint.close();
        if let Some(head) = &self.inner.head {
            head.stop().await;
        }
        self.inner.release_namespace();
    }

    /// The namespace of this instance's actor names.
    pub fn namespace(&self) -> &str {
        &self.inner.ns
    }

    /// Resolves when the instance stops serving for good: `Some` with why when
    /// the Supervisor gives up (the Controller crashed too often), `None` when
    /// it stopped without giving up (shut down, or dropped).
    ///
    /// ```no_run
    /// # async fn demo(serve: flotilla::Serve) {
    /// if let Some(flotilla::Fatal::ControllerCrashLoop { escalation, last }) = serve.fatal().await {
    ///     eprintln!("flotilla gave up after {} restarts: {last}", escalation.max_restarts);
    /// }
    /// # }
    /// ```
    pub async fn fatal(&self) -> Option<Fatal> {
        let mut rx = self.inner.fatal.clone();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return Some(why);
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Stop every replica gracefully, then stop the actors. Records stay in the
    /// store: a later `start` on the same file brings every application back.
    ///
    /// Replicas drain in parallel. Whatever is still alive afterwards (an actor
    /// waiting out a restart backoff, or everything if the Supervisor had given up)
    /// is stopped too, so no actor of this instance outlives `shutdown`.
    pub async fn shutdown(&self) -> Result<(), ServeError> {
        // A Controller that crashed with the request queued, or while it began
        // the drain, lost it: its successor drains (a repeated drain is a
        // no-op). A Supervisor that gives up answers `Unavailable`, which ends
        // the loop.
        let drained = loop {
            match self.ask(ControllerMsg::Shutdown).await {
                Err(ServeError::ControllerCrashed) => continue,
                drained => break drained,
            }
        };
        let _ = self.inner.supervisor.stop_and_wait(None, None).await;
        self.stop_everything().await;
        match drained {
            Ok(()) | Err(ServeError::Unavailable(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A config file's text, read only if it is a regular file of at most
/// [`MAX_CONFIG_FILE_BYTES`](crate::MAX_CONFIG_FILE_BYTES) (checked again while
/// reading, in case it grew).
fn read_config_file(path: &std::path::Path) -> Result<String, ServeError> {
    use std::io::Read;
    let limit = flotilla_controller::MAX_CONFIG_FILE_BYTES;
    let io = |source| ServeError::ConfigFile {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(ServeError::ConfigFileNotAFile {
            path: path.to_owned(),
        });
    }
    let too_large = || ServeError::ConfigFileTooLarge {
        path: path.to_owned(),
        limit,
    };
    if meta.len() > limit {
        return Err(too_large());
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(limit + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(text)
}

/// The error of a call whose reply was dropped: the Controller crashed while
/// handling it ([`ServeError::ControllerCrashed`], retry it), unless the
/// instance has stopped for good (its Supervisor gave up, which it says
/// before it stops and drops the calls queued with it, or it was shut
/// down): then a retry could only answer [`ServeError::Unavailable`], so
/// this one does.
fn lost_reply(fatal: &watch::Receiver<Option<Fatal>>, stopped: bool) -> ServeError {
    if let Some(why) = fatal.borrow().as_ref() {
        return ServeError::Unavailable(NotRunning::GaveUp(why.clone()));
    }
    if stopped || fatal.has_changed().is_err() {
        return ServeError::Unavailable(NotRunning::Stopped);
    }
    ServeError::ControllerCrashed
}

/// A deletion the Controller committed, and how to see it done: per name,
/// the application it found (`None` for an unknown one), its status channel
/// subscribed in the Controller's turn and the generation its deletion was
/// given.
struct Deletion {
    names: Vec<AppName>,
    deletions: Vec<Option<Deleting>>,
}

#[cfg(test)]
mod tests {
    use flotilla_supervision::Escalation;

    use super::*;

    #[test]
    fn a_reply_lost_after_the_supervisor_gave_up_or_stopped_is_unavailable() {
        let (tx, rx) = watch::channel(None);
        assert!(matches!(
            lost_reply(&rx, false),
            ServeError::ControllerCrashed
        ));
        assert!(matches!(
            lost_reply(&rx, true),
            ServeError::Unavailable(NotRunning::Stopped)
        ));
        tx.send_replace(Some(Fatal::ControllerCrashLoop {
            escalation: Escalation::of("the controller", &RestartPolicy::default()),
            last: "boom".into(),
        }));
        let gave_up = lost_reply(&rx, false);
        assert!(gave_up.to_string().contains("gave up"), "{gave_up}");
        assert!(matches!(
            gave_up,
            ServeError::Unavailable(NotRunning::GaveUp(_))
        ));
        let (tx, rx) = watch::channel(None::<Fatal>);
        drop(tx);
        assert!(matches!(
            lost_reply(&rx, false),
            ServeError::Unavailable(NotRunning::Stopped)
        ));
    }
}
