//! The ReplicaActor: one per replica. Runs the constructor off its mailbox, health
//! checks its user code, reconfigures in place, drains gracefully, and reports to
//! its DeploymentActor through a [`ReplicaReporter`].
//!
//! A replica never stops itself: when its start fails it reports
//! [`ReplicaEvent::StartFailed`] and waits for its owner to stop it, so the owner
//! learns why from a typed report (or, after its own restart, from the replica's
//! [`ReplicaSnapshot`]), never from an exit reason.

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use flotilla_core::{
    AppName, DeploymentName, DeploymentSpec, DeploymentVersion, FaultPoint, Faults,
};
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tracing::{Instrument, info, warn};

use flotilla_supervision::groups::{self, Membership};

use crate::{
    DeploymentRoute, Directory, OnExit, Registry, ReplicaEndpoint, ReplicaId, UserError,
    user::{ErasedDeployment, Guarded, guarded},
};

/// Consecutive failed health checks that make a replica unhealthy (Ray's threshold).
pub const UNHEALTHY_THRESHOLD: u32 = 3;

/// The shortest period a draining replica checks whether it is idle at. A
/// `graceful_shutdown_wait_loop` shorter than this (zero is allowed, as in
/// Ray's `ge=0`) checks on this tick instead: a zero-length sleep is ready at
/// once, so the drain would spin on the in-flight count, holding a core.
pub const MIN_DRAIN_CHECK_PERIOD: Duration = Duration::from_millis(1);

/// How the DeploymentActor hears from its replicas. It looks its current owner up
/// by name on every call, so a restarted owner hears events without re-wiring.
pub type ReplicaReporter = Arc<dyn Fn(ReplicaId, ReplicaEvent) + Send + Sync>;

/// What a replica tells its DeploymentActor.
#[derive(Debug)]
pub enum ReplicaEvent {
    /// Constructed, configured and healthy once: ready to serve.
    Ready {
        /// Where routers reach it.
        endpoint: Arc<ReplicaEndpoint>,
        /// The version it runs.
        version: DeploymentVersion,
    },
    /// The constructor (or the first reconfigure or health check) failed; the
    /// replica serves nothing and waits to be stopped.
    StartFailed {
        /// Why.
        error: String,
    },
    /// Failed health checks, panicked in user code, or failed a reconfigure: it
    /// must be replaced.
    Unhealthy {
        /// Why.
        reason: String,
    },
    /// A reconfigure to `version` finished.
    Reconfigured {
        /// The version now running.
        version: DeploymentVersion,
    },
    /// The user's `reconfigure` failed (or panicked): the replica must be replaced,
    /// and its owner counts it as a startup failure (Ray's UPDATING -> FAILED).
    ReconfigureFailed {
        /// Why.
        error: String,
    },
}

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaPhase {
    /// Constructor running.
    Starting,
    /// Serving.
    Running,
    /// Taking a new config in place.
    Updating,
    /// Draining, then gone.
    Stopping,
    /// Its start failed ([`ReplicaSnapshot::condemned`] says why): it serves
    /// nothing and waits for its owner to stop it.
    StartFailed,
}

/// A replica's own account of itself, for a DeploymentActor re-adopting it.
#[derive(Debug, Clone)]
pub struct ReplicaSnapshot {
    /// Its id.
    pub id: ReplicaId,
    /// The version it runs (or is starting).
    pub version: DeploymentVersion,
    /// Where it is in its life.
    pub phase: ReplicaPhase,
    /// Its endpoint, once running.
    pub endpoint: Option<Arc<ReplicaEndpoint>>,
    /// The node it was placed on.
    pub node: String,
    /// Why it must be replaced, if it reported itself unhealthy or failed to
    /// start (the report may have been lost while its DeploymentActor restarted).
    pub condemned: Option<String>,
    /// The models it has loaded, sorted (a multiplexed deployment's).
    pub model_ids: Vec<String>,
}

/// Why a health check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthError {
    /// The user's `check_health` returned an error.
    #[error("{0}")]
    Unhealthy(#[source] UserError),
    /// It did not answer within the health check timeout.
    #[error("health check timed out after {0:?}")]
    TimedOut(std::time::Duration),
    /// It panicked.
    #[error("health check panicked")]
    Panicked,
    /// A fault point failed it (fault injection).
    #[error("injected fault: ReplicaHealthCheck")]
    Injected,
}

/// Why a replica failed to start (Ray's `initialize_and_get_metadata`
/// failing); its text is what [`ReplicaEvent::StartFailed`] says.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartFailure {
    /// Its spec, from another process, does not validate.
    #[error("its spec does not validate: {0}")]
    InvalidSpec(#[source] flotilla_core::Error),
    /// A fault point failed the constructor (fault injection).
    #[error("constructor failed: injected fault: ReplicaConstructor")]
    Injected,
    /// The user's constructor failed or panicked.
    #[error("constructor failed: {0}")]
    Constructor(#[source] Guarded),
    /// The user's `reconfigure` with the user config failed.
    #[error("reconfigure failed: {0}")]
    Reconfigure(#[source] UserError),
    /// The first health check failed.
    #[error("initial health check failed: {0}")]
    HealthCheck(#[source] UserError),
    /// The first health check did not answer within its timeout.
    #[error("initial health check timed out")]
    HealthCheckTimedOut,
}

/// Messages to a ReplicaActor: its owner's requests, and its own internal ones.
#[derive(Debug)]
pub enum ReplicaMsg {
    /// Reply with a snapshot of the replica.
    Observe(RpcReplyPort<ReplicaSnapshot>),
    /// Take `spec`'s config in place (its code version must be the running one).
    Reconfigure(Arc<DeploymentSpec>),
    /// Stop: gracefully (drain, then kill at the graceful timeout) or at once.
    Stop {
        /// Drain first.
        graceful: bool,
    },
    /// The replica's own messages (timers, task results); only this crate
    /// makes one.
    Internal(Internal),
}

/// `ractor`'s `cluster` feature (on for nodes) wants every message type to say it is one; this one stays local.
impl ractor::Message for ReplicaMsg {}

/// A ReplicaActor's message to itself; opaque outside this crate.
#[derive(Debug)]
pub struct Internal(pub(crate) InternalMsg);

pub(crate) enum InternalMsg {
    /// The constructor task finished.
    Started(Result<Arc<dyn ErasedDeployment>, StartFailure>),
    /// A reconfigure finished: its number (the state's `reconfigures`),
    /// the spec it applied, its result.
    Reconfigured(u64, Arc<DeploymentSpec>, Result<(), UserError>),
    /// Time for a health check.
    HealthTick,
    /// A health check finished.
    HealthResult(Result<(), HealthError>),
    /// Draining finished (idle, or the timeout passed).
    Drained,
    /// A request panicked in user code: the replica must be replaced.
    Panicked(String),
}

impl std::fmt::Debug for InternalMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InternalMsg::Started(r) => write!(f, "Started(ok: {})", r.is_ok()),
            InternalMsg::Reconfigured(n, _, r) => write!(f, "Reconfigured({n}, {r:?})"),
            InternalMsg::HealthTick => f.write_str("HealthTick"),
            InternalMsg::HealthResult(r) => write!(f, "HealthResult({r:?})"),
            InternalMsg::Drained => f.write_str("Drained"),
            InternalMsg::Panicked(m) => write!(f, "Panicked({m})"),
        }
    }
}

impl From<InternalMsg> for ReplicaMsg {
    fn from(m: InternalMsg) -> Self {
        ReplicaMsg::Internal(Internal(m))
    }
}

/// Everything a replica needs to start.
pub struct ReplicaArgs {
    /// Its id.
    pub id: ReplicaId,
    /// Its application.
    pub app: AppName,
    /// Its deployment.
    pub deployment: DeploymentName,
    /// The spec it runs (shared with its DeploymentActor).
    pub spec: Arc<DeploymentSpec>,
    /// `spec`'s version, as its DeploymentActor computed it (not hashed again
    /// per replica).
    pub version: DeploymentVersion,
    /// Where its code is registered.
    pub registry: Registry,
    /// For handles given to the constructor.
    pub directory: Directory,
    /// Its deployment's route (whose queue its endpoint wakes).
    pub route: Arc<DeploymentRoute>,
    /// How it reports to its DeploymentActor.
    pub reporter: ReplicaReporter,
    /// The process group of its deployment, joined at start (see
    /// [`flotilla_supervision::groups`]).
    pub group: String,
    /// The node it was placed on.
    pub node: String,
    /// Armed fault points (fault injection; free when unarmed).
    pub faults: Faults,
    /// Run when the replica is gone, however it went (its DeploymentActor gives
    /// its reservation back here).
    pub on_exit: OnExit,
}

/// The replica actor.
pub struct ReplicaActor;

/// The replica's state.
pub struct ReplicaActorState {
    args: ReplicaArgs,
    version: DeploymentVersion,
    phase: ReplicaPhase,
    user: Option<Arc<dyn ErasedDeployment>>,
    endpoint: Option<Arc<ReplicaEndpoint>>,
    constructor: Option<JoinHandle<()>>,
    health_timer: Option<JoinHandle<()>>,
    drain: Option<JoinHandle<()>>,
    /// The user's `reconfigure` calls running, by number (each holds the
    /// user value).
    reconfiguring: Vec<(u64, JoinHandle<()>)>,
    /// The number of the last `reconfigure` started: only its result counts
    /// (an older one ending later must not undo it).
    reconfigures: u64,
    /// A health check that did not answer at once, running (it holds the
    /// user value); the next waits for it.
    health_check: Option<JoinHandle<()>>,
    health_failures: u32,
    /// Why it must be replaced, once it knows.
    condemned: Option<String>,
    /// A reconfigure that arrived while the constructor ran; applied once running.
    deferred: Option<Arc<DeploymentSpec>>,
    /// Its place in its deployment's group, left when this state is dropped.
    _membership: Membership,
    /// The span its user code runs in outside requests (constructor,
    /// reconfigure, health checks): it names the application, deployment and
    /// replica, which is what the per-application logging config goes by.
    span: tracing::Span,
}

impl ReplicaActorState {
    fn report(&self, event: ReplicaEvent) {
        (self.args.reporter)(self.args.id, event);
    }

    /// Every phase change goes through here, and is logged.
    fn set_phase(&mut self, to: ReplicaPhase) {
        if self.phase != to {
            info!(app = %self.args.app, deployment = %self.args.deployment,
                replica = %self.args.id, node = %self.args.node, from = ?self.phase, to = ?to,
                "replica phase");
            self.phase = to;
        }
    }

    fn condemn(&mut self, reason: String) {
        if self.condemned.is_none() && self.phase != ReplicaPhase::Stopping {
            self.condemned = Some(reason.clone());
            warn!(app = %self.args.app, deployment = %self.args.deployment,
                replica = %self.args.id, node = %self.args.node, %reason, "replica unhealthy");
            self.report(ReplicaEvent::Unhealthy { reason });
        }
    }

    fn start_health_timer(&mut self, myself: &ActorRef<ReplicaMsg>) {
        if let Some(t) = self.health_timer.take() {
            t.abort();
        }
        let period = self.args.spec.config.health_check_period;
        self.health_timer = Some(myself.send_interval(period, || InternalMsg::HealthTick.into()));
    }

    /// Count a health check's outcome: three failures in a row condemn it.
    fn health_result(&mut self, result: Result<(), HealthError>) {
        match result {
            Ok(()) => self.health_failures = 0,
            Err(e) => {
                self.health_failures += 1;
                if self.health_failures >= UNHEALTHY_THRESHOLD {
                    self.condemn(format!(
                        "replica {} failed {} consecutive health checks: {e}",
                        self.args.id, self.health_failures
                    ));
                }
            }
        }
    }

    fn snapshot(&self) -> ReplicaSnapshot {
        ReplicaSnapshot {
            id: self.args.id,
            version: self.version.clone(),
            phase: self.phase,
            endpoint: self.endpoint.clone(),
            node: self.args.node.clone(),
            condemned: self.condemned.clone(),
            model_ids: self
                .endpoint
                .as_ref()
                .map(|e| e.model_ids())
                .unwrap_or_default(),
        }
    }
}

/// Construct, then reconfigure with the user config, then one health check: a
/// failure anywhere is a startup failure (Ray's `initialize_and_get_metadata`).
async fn initialise(args: InitArgs) -> Result<Arc<dyn ErasedDeployment>, StartFailure> {
    let InitArgs {
        registry,
        ctx,
        spec,
        faults,
    } = args;
    if faults.hit(FaultPoint::ReplicaConstructor) {
        return Err(StartFailure::Injected);
    }
    let user = guarded(|| registry.construct(&spec.import_path, ctx))
        .await
        .map_err(StartFailure::Constructor)?;
    if spec.config.batching.is_some() && !user.batched() {
        // Deploys check the code of the process that places replicas; this
        // one (a node built from another program) registers code under the
        // same path that does not accept batches: it serves one by one.
        tracing::error!(import_path = %spec.import_path,
            "the deployment batches requests, but the code registered here under its import \
             path does not accept batches (Deployment::BATCHED): serving its requests one by one");
    }
    if let Some(uc) = spec.config.user_config.clone() {
        user.reconfigure(uc)
            .await
            .map_err(StartFailure::Reconfigure)?;
    }
    match tokio::time::timeout(spec.config.health_check_timeout, user.check_health()).await {
        Ok(Ok(())) => Ok(user),
        Ok(Err(e)) => Err(StartFailure::HealthCheck(e)),
        Err(_) => Err(StartFailure::HealthCheckTimedOut),
    }
}

/// One health check of user code, bounded by `timeout`. User panics are caught
/// inside `check_health` already; the outer catch keeps a result coming whatever
/// happens, so a check can never stay outstanding forever.
async fn health_check(
    user: Arc<dyn ErasedDeployment>,
    timeout: std::time::Duration,
) -> Result<(), HealthError> {
    let check = tokio::time::timeout(timeout, user.check_health());
    match AssertUnwindSafe(check).catch_unwind().await {
        Ok(Ok(r)) => r.map_err(HealthError::Unhealthy),
        Ok(Err(_)) => Err(HealthError::TimedOut(timeout)),
        Err(_) => Err(HealthError::Panicked),
    }
}

struct InitArgs {
    registry: Registry,
    ctx: crate::InitContext,
    spec: Arc<DeploymentSpec>,
    faults: Faults,
}

impl Actor for ReplicaActor {
    type Msg = ReplicaMsg;
    type State = ReplicaActorState;
    type Arguments = ReplicaArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ReplicaMsg>,
        args: ReplicaArgs,
    ) -> Result<ReplicaActorState, ActorProcessingErr> {
        let membership = groups::join(args.group.clone(), myself.get_cell());
        let version = args.version.clone();
        let span = tracing::info_span!(parent: None, "replica", app = %args.app,
            deployment = %args.deployment, replica = %args.id, node = %args.node);
        Ok(ReplicaActorState {
            span,
            args,
            version,
            phase: ReplicaPhase::Starting,
            user: None,
            endpoint: None,
            constructor: None,
            health_timer: None,
            drain: None,
            reconfiguring: Vec::new(),
            reconfigures: 0,
            health_check: None,
            health_failures: 0,
            condemned: None,
            deferred: None,
            _membership: membership,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ReplicaMsg>,
        state: &mut ReplicaActorState,
    ) -> Result<(), ActorProcessingErr> {
        // Every entry point in this process validates the specs it takes; a
        // spec from another process (a node's `Start`) is checked here, so
        // that no config a validation refuses (a zero health-check period,
        // whose timer would panic) ever runs.
        if let Err(e) = state.args.spec.validate() {
            start_failed(state, StartFailure::InvalidSpec(e));
            return Ok(());
        }
        let a = &state.args;
        let init = InitArgs {
            registry: a.registry.clone(),
            ctx: Registry::context(
                &a.directory,
                a.spec.init_args.clone(),
                a.app.clone(),
                a.deployment.clone(),
                a.id,
                a.node.clone(),
            ),
            spec: a.spec.clone(),
            faults: a.faults.clone(),
        };
        let me = myself.clone();
        state.constructor = Some(tokio::spawn(
            async move {
                let result = initialise(init).await;
                let _ = me.cast(InternalMsg::Started(result).into());
            }
            .instrument(state.span.clone()),
        ));
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ReplicaMsg>,
        msg: ReplicaMsg,
        state: &mut ReplicaActorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReplicaMsg::Observe(reply) => {
                let _ = reply.send(state.snapshot());
            }
            ReplicaMsg::Reconfigure(spec) => reconfigure(&myself, state, spec),
            ReplicaMsg::Stop { graceful } => begin_stop(&myself, state, graceful),
            ReplicaMsg::Internal(Internal(m)) => internal(&myself, state, m),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ReplicaMsg>,
        state: &mut ReplicaActorState,
    ) -> Result<(), ActorProcessingErr> {
        state.abort_tasks();
        if let Some(ep) = &state.endpoint {
            ep.kill();
            // Its models go before the replica counts as gone: its place (a
            // GPU's memory) is given back when this state drops. A hook slower
            // than the graceful shutdown timeout goes on in the background; a
            // load still running then is cancelled (it would keep the
            // shutdown waiting for its turn, for good if it never returns).
            if let Some(unloading) = ep.unload_models() {
                let bound = state.args.spec.config.graceful_shutdown_timeout;
                if tokio::time::timeout(bound, unloading).await.is_err() {
                    warn!(app = %state.args.app, deployment = %state.args.deployment,
                        replica = %state.args.id, node = %state.args.node, timeout = ?bound,
                        "models still loading or unloading after the graceful shutdown \
                         timeout: loads cancelled, unloads left to finish");
                    ep.abort_model_loads();
                }
            }
        }
        info!(app = %state.args.app, deployment = %state.args.deployment,
            replica = %state.args.id, node = %state.args.node, "replica stopped");
        Ok(())
    }
}

impl ReplicaActorState {
    /// Its own tasks end with it: each holds the replica's user value (a
    /// hung `reconfigure` held it, and what it owns, for good).
    fn abort_tasks(&mut self) {
        let reconfiguring = self.reconfiguring.drain(..).map(|(_, t)| t);
        for t in [
            self.constructor.take(),
            self.health_timer.take(),
            self.drain.take(),
            self.health_check.take(),
        ]
        .into_iter()
        .flatten()
        .chain(reconfiguring)
        {
            t.abort();
        }
    }
}

impl Drop for ReplicaActorState {
    /// A killed replica runs no `post_stop` (ractor's rule): its tasks are
    /// ended, its requests cut and its models unloaded here, in the
    /// background. After a `post_stop`, all have been done and do nothing
    /// again.
    fn drop(&mut self) {
        self.abort_tasks();
        if let Some(ep) = &self.endpoint {
            ep.kill();
            // Killed: its loads are cut as its requests are.
            ep.abort_model_loads();
            drop(ep.unload_models());
        }
    }
}

/// The constructor finished: serve, or report the failure and wait to be
/// stopped (the owner decides; an exit reason never carries the error).
fn started(
    myself: &ActorRef<ReplicaMsg>,
    state: &mut ReplicaActorState,
    result: Result<Arc<dyn ErasedDeployment>, StartFailure>,
) {
    state.constructor = None;
    if state.phase == ReplicaPhase::Stopping {
        myself.stop(None);
        return;
    }
    match result {
        Ok(user) => {
            let a = &state.args;
            let endpoint = Arc::new(ReplicaEndpoint::new(
                a.id,
                a.node.clone(),
                user.clone(),
                a.spec.config.max_ongoing_requests,
                &a.route,
                myself.clone(),
                a.faults.clone(),
            ));
            state.user = Some(user);
            state.endpoint = Some(endpoint.clone());
            state.set_phase(ReplicaPhase::Running);
            state.start_health_timer(myself);
            state.report(ReplicaEvent::Ready {
                endpoint,
                version: state.version.clone(),
            });
            if let Some(spec) = state.deferred.take() {
                let _ = myself.cast(ReplicaMsg::Reconfigure(spec));
            }
        }
        Err(error) => start_failed(state, error),
    }
}

/// The replica could not start: it says why and waits to be stopped.
fn start_failed(state: &mut ReplicaActorState, failure: StartFailure) {
    let error = failure.to_string();
    warn!(app = %state.args.app, deployment = %state.args.deployment,
        replica = %state.args.id, node = %state.args.node, %error, "replica failed to start");
    state.set_phase(ReplicaPhase::StartFailed);
    state.condemned = Some(error.clone());
    state.report(ReplicaEvent::StartFailed { error });
}

/// Take a new config: at once if the user config is unchanged, else through
/// the user's `reconfigure` in a task.
fn reconfigure(
    myself: &ActorRef<ReplicaMsg>,
    state: &mut ReplicaActorState,
    spec: Arc<DeploymentSpec>,
) {
    // As at the start: a spec from another process is checked here.
    if let Err(e) = spec.validate() {
        let error = format!("the new spec does not validate: {e}");
        warn!(app = %state.args.app, deployment = %state.args.deployment,
            replica = %state.args.id, node = %state.args.node, %error, "reconfigure refused");
        state.report(ReplicaEvent::ReconfigureFailed { error });
        return;
    }
    let Some(user) = state.user.clone() else {
        // Still starting: the constructor runs the old config; apply the
        // new one (user reconfigure included) once it runs.
        state.deferred = Some(spec);
        return;
    };
    if state.phase == ReplicaPhase::Stopping {
        return;
    }
    if spec.config.user_config == state.args.spec.config.user_config {
        apply_config(myself, state, spec);
        return;
    }
    state.set_phase(ReplicaPhase::Updating);
    let me = myself.clone();
    state.reconfigures += 1;
    let n = state.reconfigures;
    let task = tokio::spawn(
        async move {
            let result = match spec.config.user_config.clone() {
                Some(uc) => user.reconfigure(uc).await,
                None => Ok(()),
            };
            let _ = me.cast(InternalMsg::Reconfigured(n, spec, result).into());
        }
        .instrument(state.span.clone()),
    );
    state.reconfiguring.push((n, task));
}

/// The replica's own messages.
fn internal(myself: &ActorRef<ReplicaMsg>, state: &mut ReplicaActorState, msg: InternalMsg) {
    match msg {
        InternalMsg::Started(result) => started(myself, state, result),
        InternalMsg::Reconfigured(n, spec, result) => {
            state.reconfiguring.retain(|(running, _)| *running != n);
            // Superseded by a later one, whose result counts.
            if state.phase == ReplicaPhase::Stopping || n != state.reconfigures {
                return;
            }
            match result {
                Ok(()) => {
                    state.set_phase(ReplicaPhase::Running);
                    apply_config(myself, state, spec);
                }
                Err(e) => {
                    if state.condemned.is_none() {
                        let error = format!("replica {} failed to reconfigure: {e}", state.args.id);
                        state.condemned = Some(error.clone());
                        warn!(app = %state.args.app, deployment = %state.args.deployment,
                            replica = %state.args.id, node = %state.args.node, %error, "reconfigure failed");
                        state.report(ReplicaEvent::ReconfigureFailed { error });
                    }
                }
            }
        }
        InternalMsg::HealthTick => {
            // Ray health-checks RUNNING replicas only: one taking its config
            // in place is judged by its reconfigure.
            if state.health_check.is_some()
                || matches!(state.phase, ReplicaPhase::Stopping | ReplicaPhase::Updating)
            {
                return;
            }
            if state.args.faults.hit(FaultPoint::ReplicaHealthCheck) {
                state.health_result(Err(HealthError::Injected));
                return;
            }
            if let Some(user) = state.user.clone() {
                // Most checks finish at once: run them inline, and spend a task
                // (and a timer) only on one that has to wait.
                let timeout = state.args.spec.config.health_check_timeout;
                let mut check =
                    Box::pin(health_check(user, timeout).instrument(state.span.clone()));
                match check.as_mut().now_or_never() {
                    Some(result) => state.health_result(result),
                    None => {
                        let me = myself.clone();
                        state.health_check = Some(tokio::spawn(async move {
                            let _ = me.cast(InternalMsg::HealthResult(check.await).into());
                        }));
                    }
                }
            }
        }
        InternalMsg::HealthResult(result) => {
            state.health_check = None;
            // A check that began while it ran and ends while it updates
            // counts for nothing (its reconfigure judges it now).
            if state.phase != ReplicaPhase::Updating {
                state.health_result(result);
            }
        }
        InternalMsg::Panicked(m) => {
            state.condemn(format!(
                "replica {} panicked handling a request: {m}",
                state.args.id
            ));
        }
        InternalMsg::Drained => myself.stop(None),
    }
}

/// Swap a config in place: the router limit and health timer follow it.
fn apply_config(
    myself: &ActorRef<ReplicaMsg>,
    state: &mut ReplicaActorState,
    spec: Arc<DeploymentSpec>,
) {
    let period_changed =
        spec.config.health_check_period != state.args.spec.config.health_check_period;
    if let Some(ep) = &state.endpoint {
        ep.set_max_ongoing(spec.config.max_ongoing_requests);
    }
    state.version = spec.version();
    state.args.spec = spec;
    if period_changed && state.user.is_some() {
        state.start_health_timer(myself);
    }
    state.report(ReplicaEvent::Reconfigured {
        version: state.version.clone(),
    });
}

/// Wait until `in_flight` reads zero: Ray's `_drain_ongoing_requests`, a
/// wait of `wait_loop` before each check (so the first check comes after one
/// wait), the wait at least [`MIN_DRAIN_CHECK_PERIOD`].
async fn until_idle(wait_loop: Duration, in_flight: impl Fn() -> u32) {
    let period = wait_loop.max(MIN_DRAIN_CHECK_PERIOD);
    loop {
        tokio::time::sleep(period).await;
        if in_flight() == 0 {
            return;
        }
    }
}

/// Stop taking requests at once; drain (checking every wait loop) and stop when
/// idle, or kill at the graceful timeout. A replica still starting stops at once.
fn begin_stop(myself: &ActorRef<ReplicaMsg>, state: &mut ReplicaActorState, graceful: bool) {
    if state.phase == ReplicaPhase::Stopping && state.drain.is_some() {
        if !graceful {
            myself.stop(None);
        }
        return;
    }
    info!(app = %state.args.app, deployment = %state.args.deployment,
        replica = %state.args.id, node = %state.args.node, graceful, "replica stopping");
    state.set_phase(ReplicaPhase::Stopping);
    if let Some(t) = state.health_timer.take() {
        t.abort();
    }
    let Some(ep) = state.endpoint.clone() else {
        myself.stop(None);
        return;
    };
    ep.stop_accepting();
    if !graceful {
        myself.stop(None);
        return;
    }
    let wait_loop = state.args.spec.config.graceful_shutdown_wait_loop;
    let timeout = state.args.spec.config.graceful_shutdown_timeout;
    let me = myself.clone();
    state.drain = Some(tokio::spawn(async move {
        let drained = tokio::time::timeout(timeout, until_idle(wait_loop, || ep.in_flight())).await;
        if drained.is_err() {
            ep.kill();
        }
        let _ = me.cast(InternalMsg::Drained.into());
    }));
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_zero_wait_loop_checks_on_the_shortest_tick_and_does_not_spin() {
        // Busy for the first 100 checks, idle after: with a zero wait loop the
        // drain takes 100 ticks of virtual time, not none (a spin).
        let checks = AtomicU32::new(0);
        let start = tokio::time::Instant::now();
        until_idle(Duration::ZERO, || {
            let n = checks.fetch_add(1, Ordering::Relaxed) + 1;
            u32::from(n < 100)
        })
        .await;
        assert_eq!(checks.load(Ordering::Relaxed), 100);
        assert_eq!(start.elapsed(), MIN_DRAIN_CHECK_PERIOD * 100);
        // A longer wait loop is kept as given.
        let start = tokio::time::Instant::now();
        until_idle(Duration::from_secs(2), || 0).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
