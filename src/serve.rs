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
    nodes::{Head, HeadOptions, NodeCounters},
};
use flotilla_controller::{
    Checkpoint, CheckpointCloser, ControllerArgs, ControllerMsg, ControllerSnapshot, Fatal,
    LogSettings, NotRunning, Preloaded, RouteTable, ServeError, StatusBoard, StoreCounters,
    Supervisor, SupervisorArgs, SupervisorMsg, WallClock,
};
use flotilla_core::{Faults, actor_names};
use flotilla_replica::{Directory, Registry};
use flotilla_supervision::{RestartPolicy, groups};
use ractor::{Actor, ActorRef, RpcReplyPort};
use tokio::sync::watch;

use crate::namespace::NamespaceClaim;

mod deploy;
mod faults;
mod lookup;

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
