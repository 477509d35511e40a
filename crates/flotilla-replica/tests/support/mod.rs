//! What the replica crate's integration tests share: a replica's arguments.

use std::sync::Arc;

use flotilla_core::{AppName, DeploymentName, DeploymentSpec, Faults, actor_names};
use flotilla_replica::{Directory, OnExit, Registry, ReplicaArgs, ReplicaEvent, ReplicaId};
use tokio::sync::mpsc;

/// Arguments of replica 1 of deployment `d` of application `a`, built from
/// `registry`, reporting its events to `tx`, its actors named under `ns`.
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub fn args(
    ns: &str,
    spec: Arc<DeploymentSpec>,
    registry: Registry,
    directory: &Directory,
    tx: mpsc::UnboundedSender<ReplicaEvent>,
    on_exit: OnExit,
) -> ReplicaArgs {
    let (app, deployment) = (
        AppName::new("a").unwrap(),
        DeploymentName::new("d").unwrap(),
    );
    ReplicaArgs {
        id: ReplicaId(1),
        version: spec.version(),
        spec,
        registry,
        directory: directory.clone(),
        route: directory.route(&app, &deployment),
        reporter: Arc::new(move |_, e| {
            let _ = tx.send(e);
        }),
        group: actor_names::replica_group(ns, &app, &deployment),
        node: "local".into(),
        faults: Faults::new(),
        on_exit,
        app,
        deployment,
    }
}
