//! `RemoteReplica`: on the head, the stand-in of one replica running on a node.
//! Its message is `ReplicaMsg`, so the DeploymentActor starts, watches, adopts
//! and stops it as any replica; it forwards to the node, mirrors what the node
//! reports, and ends as the remote replica ended (`docs/nodes.md`).

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use flotilla_core::{AppName, DeploymentName, DeploymentSpec, DeploymentVersion};
use flotilla_replica::{
    DeploymentRoute, OnExit, ReplicaArgs, ReplicaEvent, ReplicaId, ReplicaMsg, ReplicaPhase,
    ReplicaReporter, ReplicaSnapshot, remote::RemoteEndpoint,
};
use flotilla_supervision::groups::{self, Membership};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{info, warn};

use super::{
    RemoteHost,
    account::Account,
    head::lock,
    transport::PeerCall,
    wire::{Control, Start, WireEvent, WireFigures, WireModels},
};

/// What the registry tells a proxy about its replica.
#[derive(Debug)]
pub(crate) enum ProxyReport {
    /// The replica's event.
    Event(WireEvent),
    /// The models it holds now (a multiplexed replica).
    Models(WireModels),
    /// The requests running on it now, from every caller (its node's load
    /// report).
    Load(u32),
    /// Its batch and model figures (its node's report), for `/metrics`.
    Figures(Box<WireFigures>),
    /// The replica ended.
    Exited { crashed: bool, why: String },
    /// Its node was lost.
    NodeLost { why: String },
}

/// A replica found on a re-attaching node: the proxy mirrors it instead of
/// starting one.
#[derive(Debug, Clone)]
pub(crate) struct Adopted {
    pub(crate) phase: ReplicaPhase,
    pub(crate) condemned: Option<String>,
    /// The models it holds, if it is multiplexed.
    pub(crate) models: Option<WireModels>,
}

/// What a [`RemoteReplica`] needs.
pub struct RemoteReplicaArgs {
    id: ReplicaId,
    app: AppName,
    deployment: DeploymentName,
    spec: Arc<DeploymentSpec>,
    version: DeploymentVersion,
    route: Arc<DeploymentRoute>,
    reporter: ReplicaReporter,
    group: String,
    host: RemoteHost,
    adopted: Option<Adopted>,
    on_exit: OnExit,
}

impl RemoteReplicaArgs {
    /// Stand for the replica `args` describe, started on `host`'s node.
    pub fn new(args: ReplicaArgs, host: RemoteHost) -> Self {
        RemoteReplicaArgs {
            id: args.id,
            app: args.app,
            deployment: args.deployment,
            spec: args.spec,
            version: args.version,
            route: args.route,
            reporter: args.reporter,
            group: args.group,
            host,
            adopted: None,
            on_exit: args.on_exit,
        }
    }

    /// Stand for a replica `host`'s node already runs (a re-attach); `on_exit`
    /// gives back what the re-attach reserved for it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn adopted(
        id: ReplicaId,
        app: AppName,
        spec: Arc<DeploymentSpec>,
        version: DeploymentVersion,
        route: Arc<DeploymentRoute>,
        reporter: ReplicaReporter,
        group: String,
        host: RemoteHost,
        adopted: Adopted,
        on_exit: OnExit,
    ) -> Self {
        RemoteReplicaArgs {
            id,
            app,
            deployment: spec.name.clone(),
            spec,
            version,
            route,
            reporter,
            group,
            host,
            adopted: Some(adopted),
            on_exit,
        }
    }
}

/// The head's stand-in for a replica on a node.
pub struct RemoteReplica;

struct Mirror {
    account: Account,
    spec: Arc<DeploymentSpec>,
}

/// A [`RemoteReplica`]'s state.
pub struct RemoteReplicaState {
    id: ReplicaId,
    app: AppName,
    deployment: DeploymentName,
    host: RemoteHost,
    mirror: Arc<Mutex<Mirror>>,
    endpoint: RemoteEndpoint,
    reporter: ReplicaReporter,
    start: Option<Box<Start>>,
    reports: Option<mpsc::UnboundedReceiver<ProxyReport>>,
    /// Its deployment's route here (exported again when its models change).
    route: Arc<DeploymentRoute>,
    task: Option<JoinHandle<()>>,
    /// A re-attached replica: whether a DeploymentActor has adopted it (asked
    /// it what it is), and the timer that stops it if none does in time.
    unowned: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    _membership: Membership,
    /// Gives the replica's reservation back when this stand-in is gone.
    _on_exit: OnExit,
}

impl RemoteReplicaState {
    fn peer(&self) -> Option<String> {
        self.host.shared.peer_of(&self.host.node)
    }

    fn send(&self, control: Control) -> bool {
        match self.peer() {
            Some(peer) => self.host.shared.link.shared.send_control(&peer, control),
            None => false,
        }
    }
}

impl Actor for RemoteReplica {
    type Msg = ReplicaMsg;
    type State = RemoteReplicaState;
    type Arguments = RemoteReplicaArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ReplicaMsg>,
        a: RemoteReplicaArgs,
    ) -> Result<RemoteReplicaState, ActorProcessingErr> {
        let membership = groups::join(a.group.clone(), myself.get_cell());
        let shared = &a.host.shared;
        let peer = shared.peer_of(&a.host.node).unwrap_or_default();
        let call = PeerCall::boxed(shared.link.shared.clone(), peer, a.host.node.clone());
        let endpoint = RemoteEndpoint::new(
            a.id,
            a.host.node.clone(),
            call,
            a.spec.config.max_ongoing_requests,
            &a.route,
        );
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&shared.proxies).insert(a.id, (a.host.node.clone(), tx));
        // Re-attached: stopped unless a deployment here adopts it in time.
        let unowned = a.adopted.is_some().then(|| {
            let span = tracing::info_span!("adoption", app = %a.app,
                deployment = %a.deployment, replica = %a.id, node = %a.host.node);
            adoption_deadline(&myself, shared.options.adopt_timeout, span)
        });
        let (phase, condemned, start) = match a.adopted {
            Some(ad) => {
                if let Some(models) = ad.models {
                    endpoint.set_models(models.into());
                }
                (ad.phase, ad.condemned, None)
            }
            None => (
                ReplicaPhase::Starting,
                None,
                Some(Box::new(Start {
                    replica: a.id.0,
                    app: a.app.clone(),
                    spec: (*a.spec).clone(),
                    version: a.version.clone(),
                })),
            ),
        };
        Ok(RemoteReplicaState {
            id: a.id,
            app: a.app,
            deployment: a.deployment,
            host: a.host,
            mirror: Arc::new(Mutex::new(Mirror {
                account: Account {
                    phase,
                    version: a.version,
                    condemned,
                },
                spec: a.spec,
            })),
            endpoint,
            reporter: a.reporter,
            start,
            reports: Some(rx),
            route: a.route,
            task: None,
            unowned,
            _membership: membership,
            _on_exit: a.on_exit,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ReplicaMsg>,
        state: &mut RemoteReplicaState,
    ) -> Result<(), ActorProcessingErr> {
        // Its node declared lost before this stand-in was in `proxies` (the
        // loss's sweep missed it): nothing will ever tell it, and a control
        // frame to the lost node's session may still be taken and dropped.
        // (Declared lost after: the sweep finds it.)
        let node = &state.host.node;
        if !state.host.shared.node_alive(node) {
            state.endpoint.stop_accepting();
            myself.stop(Some(format!("its node '{node}' was lost")));
            return Ok(());
        }
        if let Some(start) = state.start.take()
            && !state.send(Control::Start(start))
        {
            warn!(app = %state.app, deployment = %state.deployment, replica = %state.id,
                node = %state.host.node, "replica not started: its node is not reachable");
            myself.stop(Some("its node is not reachable".to_owned()));
            return Ok(());
        }
        let running = lock(&state.mirror).account.phase == ReplicaPhase::Running;
        if running {
            // Re-attached while serving: say so, so a DeploymentActor that did
            // not find it in its group adopts it by name.
            let version = lock(&state.mirror).account.version.clone();
            (state.reporter)(
                state.id,
                ReplicaEvent::Ready {
                    endpoint: state.endpoint.endpoint().clone(),
                    version,
                },
            );
        }
        if let Some(rx) = state.reports.take() {
            // The models it reports reach the other nodes with its route.
            let (shared, route) = (Arc::downgrade(&state.host.shared), state.route.clone());
            let models_changed = move || {
                if let Some(shared) = shared.upgrade() {
                    super::export::models_changed(&shared, &route);
                }
            };
            state.task = Some(tokio::spawn(reports(
                rx,
                myself,
                state.id,
                state.mirror.clone(),
                (state.endpoint.clone(), Box::new(models_changed)),
                state.reporter.clone(),
            )));
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ReplicaMsg>,
        msg: ReplicaMsg,
        state: &mut RemoteReplicaState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReplicaMsg::Observe(reply) => {
                // Only its DeploymentActor asks (adopting it).
                if let Some((owned, timer)) = state.unowned.take() {
                    owned.store(true, Ordering::Release);
                    timer.abort();
                }
                let m = lock(&state.mirror);
                let a = &m.account;
                let serving = matches!(a.phase, ReplicaPhase::Running | ReplicaPhase::Updating);
                let _ = reply.send(ReplicaSnapshot {
                    id: state.id,
                    version: a.version.clone(),
                    phase: a.phase,
                    endpoint: serving.then(|| state.endpoint.endpoint().clone()),
                    node: state.host.node.clone(),
                    condemned: a.condemned.clone(),
                    model_ids: state.endpoint.endpoint().model_ids(),
                });
            }
            ReplicaMsg::Reconfigure(spec) => {
                lock(&state.mirror).spec = spec.clone();
                let sent = state.send(Control::Reconfigure {
                    replica: state.id.0,
                    spec: Box::new((*spec).clone()),
                });
                if !sent {
                    warn!(app = %state.app, deployment = %state.deployment, replica = %state.id,
                        node = %state.host.node, "reconfigure not sent: the node is not reachable");
                }
            }
            ReplicaMsg::Stop { graceful } => {
                lock(&state.mirror).account.phase = ReplicaPhase::Stopping;
                state.endpoint.stop_accepting();
                let sent = state.send(Control::Stop {
                    replica: state.id.0,
                    graceful,
                });
                if !sent {
                    // Nobody to stop there: gone with its node.
                    myself.stop(None);
                }
            }
            // A remote endpoint reports no panics (the node's replica does).
            ReplicaMsg::Internal(_) => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ReplicaMsg>,
        state: &mut RemoteReplicaState,
    ) -> Result<(), ActorProcessingErr> {
        lock(&state.host.shared.proxies).remove(&state.id);
        state.endpoint.stop_accepting();
        if let Some(t) = state.task.take() {
            t.abort();
        }
        if let Some((_, timer)) = state.unowned.take() {
            timer.abort();
        }
        info!(app = %state.app, deployment = %state.deployment, replica = %state.id,
            node = %state.host.node, "remote replica stopped");
        Ok(())
    }
}

/// Stop the stand-in `myself` (and so its replica) after `wait`, unless the
/// returned flag is set first (a DeploymentActor adopted it).
fn adoption_deadline(
    myself: &ActorRef<ReplicaMsg>,
    wait: std::time::Duration,
    span: tracing::Span,
) -> (Arc<AtomicBool>, JoinHandle<()>) {
    let owned = Arc::new(AtomicBool::new(false));
    let (me, seen) = (myself.clone(), owned.clone());
    let timer = tokio::spawn(tracing::Instrument::instrument(
        async move {
            tokio::time::sleep(wait).await;
            if !seen.load(Ordering::Acquire) {
                warn!(timeout = ?wait,
                    "re-attached replica adopted by no deployment here: stopping it");
                let _ = me.cast(ReplicaMsg::Stop { graceful: true });
            }
        },
        span,
    ));
    (owned, timer)
}

/// Apply the node's reports to the mirror, tell the DeploymentActor, and end
/// the proxy as the replica ended. Model ids go to the endpoint (for routers
/// here), then `models_changed` (to export them to the other nodes).
async fn reports(
    mut rx: mpsc::UnboundedReceiver<ProxyReport>,
    myself: ActorRef<ReplicaMsg>,
    id: ReplicaId,
    mirror: Arc<Mutex<Mirror>>,
    (endpoint, models_changed): (RemoteEndpoint, Box<dyn Fn() + Send>),
    reporter: ReplicaReporter,
) {
    while let Some(report) = rx.recv().await {
        let event = match report {
            ProxyReport::Event(e) => e,
            // For routers only: the DeploymentActor is not told.
            ProxyReport::Models(m) => {
                endpoint.set_models(m.into());
                models_changed();
                continue;
            }
            // For the deployment's autoscaler, which reads it on the endpoint.
            ProxyReport::Load(n) => {
                endpoint.set_reported_load(n);
                continue;
            }
            // For the exporter, which reads them on the endpoint.
            ProxyReport::Figures(f) => {
                endpoint.set_reported_figures(f.batches.as_ref(), f.models.as_ref());
                continue;
            }
            ProxyReport::Exited { crashed, why } => {
                endpoint.stop_accepting();
                myself.stop(crashed.then_some(why));
                return;
            }
            ProxyReport::NodeLost { why } => {
                endpoint.stop_accepting();
                myself.stop(Some(why));
                return;
            }
        };
        let mut m = lock(&mirror);
        m.account.apply(&event);
        let out = match event {
            WireEvent::Ready { version } => ReplicaEvent::Ready {
                endpoint: endpoint.endpoint().clone(),
                version,
            },
            WireEvent::Reconfigured { version } => {
                endpoint.set_max_ongoing(m.spec.config.max_ongoing_requests);
                ReplicaEvent::Reconfigured { version }
            }
            WireEvent::StartFailed { error } => ReplicaEvent::StartFailed { error },
            WireEvent::Unhealthy { reason } => ReplicaEvent::Unhealthy { reason },
            WireEvent::ReconfigureFailed { error } => ReplicaEvent::ReconfigureFailed { error },
        };
        drop(m);
        reporter(id, out);
    }
}
