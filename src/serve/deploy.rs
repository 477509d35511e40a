//! Changing what runs: deploy, apply a config, scale, delete, and wait for it.

use flotilla_controller::{ControllerMsg, Deleting, Deployed, NotRunning, ServeError};
use flotilla_core::{
    ApiType, AppName, ApplicationSpec, ApplicationStatus, ApplicationStatusInfo, ServeConfig,
};
use flotilla_replica::DeploymentHandle;
use tokio::sync::watch;

use super::{RunManyOptions, Serve};

impl Serve {
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

/// A deletion the Controller committed, and how to see it done: per name,
/// the application it found (`None` for an unknown one), its status channel
/// subscribed in the Controller's turn and the generation its deletion was
/// given.
struct Deletion {
    names: Vec<AppName>,
    deletions: Vec<Option<Deleting>>,
}
