//! Reading what runs: routes, statuses, handles, snapshots, metrics and nodes.

use flotilla_cluster::nodes::{Head, NodeInfo};
use flotilla_controller::{ControllerMsg, RouteTable, ServeError, SupervisorMsg};
use flotilla_core::{AppName, ApplicationStatus, ApplicationStatusInfo};
use flotilla_replica::DeploymentHandle;
use ractor::rpc::CallResult;
use tokio::sync::watch;

use super::{Metrics, Serve};

impl Serve {
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
    pub(super) fn handle_on(
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
    /// proxy's details name it: the head's ([`HeadOptions::node_id`](flotilla_cluster::nodes::HeadOptions::node_id), `head`
    /// by default) with [`ServeOptions::nodes`](crate::ServeOptions::nodes), else [`LOCAL_NODE`](crate::LOCAL_NODE).
    pub fn node_id(&self) -> &str {
        self.inner
            .head
            .as_ref()
            .map_or(flotilla_cluster::LOCAL_NODE, Head::node_id)
    }

    /// Where node processes connect, with [`ServeOptions::nodes`](crate::ServeOptions::nodes) (the bound
    /// address: a port 0 in the options is the system's choice here).
    pub fn node_address(&self) -> Option<std::net::SocketAddr> {
        self.inner.head.as_ref().map(Head::address)
    }

    /// Every node that joined this head, alive or lost (the 1,000 most recently
    /// lost, as Ray's GCS keeps), sorted by id (empty
    /// without [`ServeOptions::nodes`](crate::ServeOptions::nodes)).
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.inner
            .head
            .as_ref()
            .map(Head::nodes)
            .unwrap_or_default()
    }
}
