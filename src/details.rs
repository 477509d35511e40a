//! What the HTTP layer (the REST API's `ServeInstanceDetails`, the Prometheus
//! exporter) reads of a running instance beyond the core API: the applied
//! config, every deployment's snapshot at once, the Controller's identity.
//!
//! Everything here reads; nothing changes state. It uses only the instance's
//! public face and the actors' registered names, so it stays independent of how
//! `serve.rs` holds its parts.

use std::time::Duration;

use flotilla_controller::{ControllerMsg, ServeError};
use flotilla_core::{AppName, DeploymentName, ServeConfig, actor_names};
use flotilla_deployment::DeploymentSnapshot;

use crate::Serve;

/// How many times a read lost to a Controller crash is asked again.
pub const READ_ATTEMPTS: u32 = 5;

/// One deployment of one application, with its DeploymentActor's snapshot
/// (`None` when its actor is not alive now, e.g. restarting, or did not answer
/// in time).
#[derive(Debug, Clone)]
pub struct DeploymentDetail {
    /// The application.
    pub app: AppName,
    /// The deployment.
    pub deployment: DeploymentName,
    /// Its DeploymentActor's view: target, status, replicas with states.
    pub snapshot: Option<DeploymentSnapshot>,
}

impl Serve {
    /// The last applied config as the Controller holds it (durable: it survives
    /// Controller crashes and process restarts), `None` if no config was ever
    /// applied. Declarative applications that `run` or `delete_apps` took out of
    /// the config's hands are no longer in it.
    ///
    /// ```no_run
    /// # async fn demo(serve: flotilla::Serve) -> Result<(), flotilla::ServeError> {
    /// if let Some(config) = serve.applied_config().await? {
    ///     for app in &config.applications {
    ///         println!("{} <- {}", app.name, app.import_path);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// A read is idempotent: one lost to a Controller crash is asked again (up to
    /// [`READ_ATTEMPTS`] times) of its successor.
    pub async fn applied_config(&self) -> Result<Option<ServeConfig>, ServeError> {
        let mut attempt = 1;
        loop {
            match self.ask_applied_config().await {
                Err(ServeError::ControllerCrashed) if attempt < READ_ATTEMPTS => attempt += 1,
                other => return other,
            }
        }
    }

    async fn ask_applied_config(&self) -> Result<Option<ServeConfig>, ServeError> {
        self.ask(ControllerMsg::AppliedConfig).await
    }

    /// The snapshot of every deployment of every application on the status
    /// board, asked of all DeploymentActors at once, each given `timeout`: one
    /// message per deployment, so a caller (a scrape, a status request) costs
    /// O(deployments + replicas) and never waits longer than `timeout`. Sorted by
    /// application, then deployment.
    pub async fn deployment_details(&self, timeout: Duration) -> Vec<DeploymentDetail> {
        let ns = self.namespace().to_owned();
        let keys: Vec<(AppName, DeploymentName)> = self
            .status()
            .into_iter()
            .flat_map(|(app, s)| {
                s.deployments
                    .into_keys()
                    .map(move |d| (app.clone(), d))
                    .collect::<Vec<_>>()
            })
            .collect();
        let asks = keys.into_iter().map(|(app, deployment)| {
            let ns = ns.clone();
            async move {
                let snapshot = flotilla_deployment::observe(&ns, &app, &deployment, timeout).await;
                DeploymentDetail {
                    app,
                    deployment,
                    snapshot,
                }
            }
        });
        futures::future::join_all(asks).await
    }

    /// The registered name of this instance's Controller actor, and whether it
    /// is alive now (false while the Supervisor restarts it).
    pub fn controller_actor(&self) -> (String, bool) {
        let name = actor_names::controller(self.namespace());
        let alive = ractor::registry::where_is(name.clone()).is_some();
        (name, alive)
    }
}
