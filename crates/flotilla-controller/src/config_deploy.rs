//! Declarative deploys: `apply_config` and the build tasks it starts.
//!
//! Applying a config is one controller message and one commit: the config itself
//! and the deletion of the declarative applications it no longer names. Each
//! application whose config entry changed is then built by its registered builder
//! in a task off the Controller (with a timeout); the result, with the config's
//! overrides applied, becomes the application's target in a commit of its own.
//! A newer config cancels a build still running for the same application.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use flotilla_application::{AppMsg, publish_status};
use flotilla_core::{
    ApiType, AppConfig, AppName, ApplicationSpec, ApplicationStatus, ApplicationStatusInfo, Args,
    FaultPoint, ServeConfig, apply_overrides, stable_hash,
};
use flotilla_store::Batch;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{
    Controller, ControllerMsg, ServeError,
    controller::{ControllerState, commit, fault, stage_and_commit},
    validate::validate_batch,
};

/// How long an application builder may run before its build fails.
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(120);

/// The last applied config and its builds.
pub(crate) struct ConfigState {
    applied: Option<ServeConfig>,
    /// Running builds: id, the entry version being built, the task.
    builds: HashMap<AppName, (u64, u64, JoinHandle<()>)>,
    /// Applications the config names that have no record yet (building or failed).
    unbuilt: HashSet<AppName>,
    /// Failed builds of applications that have a record: the generation the
    /// failure stands over and its message (volatile, as Ray's; a Controller
    /// restart rebuilds and fails again).
    failed: HashMap<AppName, (u64, String)>,
    next_build: u64,
}

impl ConfigState {
    pub(crate) fn recovered(applied: Option<ServeConfig>) -> Self {
        ConfigState {
            applied,
            builds: HashMap::new(),
            unbuilt: HashSet::new(),
            failed: HashMap::new(),
            next_build: 1,
        }
    }

    fn cancel(&mut self, app: &AppName) {
        if let Some((_, _, task)) = self.builds.remove(app) {
            task.abort();
            info!(app = %app, "build cancelled");
        }
    }

    /// The applied config without the applications in `names`, if it names any:
    /// an imperative deploy or a delete takes an application out of the config's
    /// hands, in the same commit, so no build or recovery brings it back.
    pub(crate) fn without<'a>(
        &self,
        names: impl IntoIterator<Item = &'a AppName>,
    ) -> Option<ServeConfig> {
        let applied = self.applied.as_ref()?;
        let drop: HashSet<&AppName> = names
            .into_iter()
            .filter(|n| applied.application(n.as_str()).is_some())
            .collect();
        if drop.is_empty() {
            return None;
        }
        let mut config = applied.clone();
        config.applications.retain(|a| !drop.contains(&a.name));
        Some(config)
    }

    /// After the commit of [`without`](Self::without): take the smaller config and
    /// cancel what was building for the applications it dropped. Returns those
    /// that had no record yet (still building, or failed to build).
    pub(crate) fn release(&mut self, config: ServeConfig) -> Vec<AppName> {
        let named: HashSet<AppName> = config.applications.iter().map(|a| a.name.clone()).collect();
        let dropped: Vec<AppName> = self
            .builds
            .keys()
            .chain(self.unbuilt.iter())
            .filter(|n| !named.contains(*n))
            .cloned()
            .collect();
        let mut unbuilt = Vec::new();
        for n in dropped {
            self.cancel(&n);
            if self.unbuilt.remove(&n) {
                unbuilt.push(n);
            }
        }
        self.applied = Some(config);
        unbuilt
    }

    /// The failed build standing over `app` at `generation`, if any.
    pub(crate) fn build_failure(&self, app: &AppName, generation: u64) -> Option<String> {
        self.failed
            .get(app)
            .filter(|(g, _)| *g == generation)
            .map(|(_, m)| m.clone())
    }

    /// `app` is gone: forget its failed build.
    pub(crate) fn forget_failure(&mut self, app: &AppName) {
        self.failed.remove(app);
    }

    /// Stop every build (shutdown).
    pub(crate) fn cancel_all(&mut self) {
        for (_, (_, _, task)) in self.builds.drain() {
            task.abort();
        }
    }
}

/// A stable version of one application's config entry (builder, args, overrides,
/// logging): equal versions need no rebuild.
fn entry_version(app: &AppConfig) -> u64 {
    Args::encode(app)
        .map(|a| stable_hash(a.as_bytes()))
        .unwrap_or_default()
}

impl ControllerState {
    /// Take the applied config without some applications (after the commit that
    /// wrote it); an application it dropped that never got a record leaves the board.
    pub(crate) fn release_config(&mut self, config: ServeConfig) {
        for unbuilt in self.config.release(config) {
            if !self.apps.contains_key(&unbuilt) {
                self.board.remove(&unbuilt);
            }
        }
    }

    /// `app` has no target yet: it shows DEPLOYING until its build lands.
    fn show_unbuilt(&mut self, app: &AppName) {
        self.config.unbuilt.insert(app.clone());
        self.publish(app, ApplicationStatus::Deploying, String::new());
    }

    fn generation_of(&self, app: &AppName) -> u64 {
        self.apps.get(app).map_or(0, |e| e.record.generation)
    }

    /// A build of `app` failed. An application that has a target keeps running it,
    /// and its actor shows DEPLOY_FAILED over it until a new target or a config
    /// whose entry is what runs; one without a target shows it on the board.
    fn build_failed(&mut self, app: &AppName, why: &str) {
        let message = format!("Deploying app '{app}' failed: {why}");
        match self.apps.get(app).filter(|e| !e.record.deleting) {
            Some(e) => {
                let generation = e.record.generation;
                if let Some(actor) = &e.actor {
                    let _ = actor.cast(AppMsg::BuildFailure {
                        generation,
                        message: Some(message.clone()),
                    });
                }
                self.config
                    .failed
                    .insert(app.clone(), (generation, message));
            }
            None => self.publish(app, ApplicationStatus::DeployFailed, message),
        }
    }

    /// What runs for `app` is the config's entry: no failed build stands over it.
    fn build_current(&mut self, app: &AppName) {
        self.config.forget_failure(app);
        if let Some(e) = self.apps.get(app)
            && let Some(actor) = &e.actor
        {
            let _ = actor.cast(AppMsg::BuildFailure {
                generation: e.record.generation,
                message: None,
            });
        }
    }

    fn publish(&self, app: &AppName, status: ApplicationStatus, message: String) {
        let generation = self.generation_of(app);
        let tx = self
            .board
            .sender(app, None, || ApplicationStatusInfo::deploying(generation));
        let mut info = tx.borrow().clone();
        info.status = status;
        info.message = message;
        info.observed_generation = generation;
        publish_status(&tx, info);
    }
}

impl Controller {
    /// Validate the whole config -> one commit (config + deletions) -> reply ->
    /// command deletions -> start builds.
    pub(crate) async fn apply_config(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        config: Box<ServeConfig>,
        reply: RpcReplyPort<Result<(), ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        let config = config.inherit_logging();
        if let Err(e) = Self::check_config(state, &config) {
            let _ = reply.send(Err(e));
            return Ok(());
        }
        let gone: Vec<AppName> = state
            .apps
            .iter()
            .filter(|(n, e)| {
                e.record.api_type == ApiType::Declarative
                    && !e.record.deleting
                    && config.application(n.as_str()).is_none()
            })
            .map(|(n, _)| n.clone())
            .collect();
        let staged = stage_and_commit(state, |s, batch| {
            batch.put_config(&config)?;
            s.stage_deletions(&gone, batch)
        })
        .await?;
        let changed = match staged {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        state.swap_deletions(&changed);
        let unnamed: Vec<AppName> = state
            .config
            .unbuilt
            .iter()
            .filter(|n| config.application(n.as_str()).is_none())
            .cloned()
            .collect();
        for n in unnamed {
            state.config.cancel(&n);
            state.config.unbuilt.remove(&n);
            state.board.remove(&n);
        }
        state
            .logging
            .set_global(config.logging_config.clone().unwrap_or_default());
        info!(
            apps = config.applications.len(),
            deleted = changed.len(),
            "config applied"
        );
        // A new application is on the board, DEPLOYING, when the call returns
        // (Ray creates its state in the call), not only once its build starts.
        for app in &config.applications {
            if !state.apps.contains_key(&app.name) {
                state.show_unbuilt(&app.name);
            }
        }
        state.config.applied = Some(config);
        let _ = reply.send(Ok(()));
        fault(&state.faults, FaultPoint::ControllerAfterReply)?;
        for r in &changed {
            Self::command(myself, state, &r.spec.name).await;
        }
        Self::resume_builds(myself, state);
        Ok(())
    }

    /// Whole-config checks against the live applications: imperative ones are
    /// taken over only when asked, and route prefixes stay unique.
    fn check_config(state: &ControllerState, config: &ServeConfig) -> Result<(), ServeError> {
        config.validate()?;
        for app in &config.applications {
            if let Some(e) = state.apps.get(&app.name)
                && e.record.api_type == ApiType::Imperative
                && !e.record.deleting
                && !app.take_over
            {
                return Err(ServeError::ImperativeApp {
                    app: app.name.to_string(),
                });
            }
            if let Some(p) = &app.route_prefix
                && let Some(holder) = state.routes.get(p)
                && holder != &app.name
                && config.application(holder.as_str()).is_none()
                && state
                    .apps
                    .get(holder)
                    .is_some_and(|e| e.record.api_type == ApiType::Imperative)
            {
                return Err(ServeError::RouteTaken {
                    app: app.name.to_string(),
                    prefix: p.to_string(),
                    holder: holder.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Start a build for every application of the applied config whose entry is
    /// not what runs (nor already being built). Used after `apply_config` and after
    /// a crash (a build in progress is simply started again).
    pub(crate) fn resume_builds(myself: &ActorRef<ControllerMsg>, state: &mut ControllerState) {
        let Some(config) = state.config.applied.clone() else {
            return;
        };
        for app in &config.applications {
            Self::resume_build(myself, state, app);
        }
    }

    /// The finished deletions `removed` are gone from the board; an application
    /// the applied config still names (it was dropped, then named again while its
    /// old record was being deleted) is unbuilt now: back on the board, DEPLOYING,
    /// and built if no build runs (one that failed over the old record included).
    pub(crate) fn resume_removed(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        removed: &[AppName],
    ) {
        // Only the entries named again: most removals are of applications the
        // config no longer names, and the config may hold thousands.
        let named: Vec<AppConfig> = match &state.config.applied {
            Some(config) => removed
                .iter()
                .filter_map(|n| config.application(n.as_str()).cloned())
                .collect(),
            None => return,
        };
        for app in &named {
            Self::resume_build(myself, state, app);
        }
    }

    /// Start a build of `app` unless its entry is what runs or is being built.
    fn resume_build(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        app: &AppConfig,
    ) {
        let version = entry_version(app);
        let running = state
            .apps
            .get(&app.name)
            .filter(|e| !e.record.deleting && e.record.api_type == ApiType::Declarative)
            .and_then(|e| e.record.config_version);
        if running == Some(version) {
            state.config.cancel(&app.name);
            // A build of another entry may have failed over this target since
            // (perhaps before a Controller restart).
            state.build_current(&app.name);
            return;
        }
        // A new application shows DEPLOYING while it builds; a running one keeps
        // its status until the build changes its target.
        let unbuilt = !state.apps.contains_key(&app.name);
        if state
            .config
            .builds
            .get(&app.name)
            .is_some_and(|(_, v, _)| *v == version)
        {
            if unbuilt {
                state.show_unbuilt(&app.name);
            }
            return;
        }
        state.config.cancel(&app.name);
        let build = state.config.next_build;
        state.config.next_build += 1;
        let fut = state.registry.build_app(&app.import_path, app.args.clone());
        let me = myself.clone();
        let name = app.name.clone();
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(BUILD_TIMEOUT, fut).await {
                Ok(Ok(spec)) => Ok(spec),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "the builder did not finish within {BUILD_TIMEOUT:?}"
                )),
            };
            let _ = me.cast(ControllerMsg::BuildDone {
                app: name,
                build,
                result,
            });
        });
        if unbuilt {
            state.show_unbuilt(&app.name);
        }
        info!(app = %app.name, build, "build started");
        state
            .config
            .builds
            .insert(app.name.clone(), (build, version, task));
    }

    /// A build finished: apply the config's overrides, validate, commit the target.
    pub(crate) async fn build_done(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        app: AppName,
        build: u64,
        result: Result<ApplicationSpec, String>,
    ) -> Result<(), ActorProcessingErr> {
        let version = match state.config.builds.get(&app) {
            Some((id, v, _)) if *id == build => *v,
            _ => return Ok(()),
        };
        state.config.builds.remove(&app);
        let Some(entry) = state
            .config
            .applied
            .as_ref()
            .and_then(|c| c.application(app.as_str()))
            .cloned()
        else {
            return Ok(());
        };
        let spec = result.and_then(|mut spec| {
            spec.name = app.clone();
            let spec = apply_overrides(spec, &entry).map_err(|e| e.to_string())?;
            validate_batch(std::slice::from_ref(&spec), &state.routes)
                .map_err(|e| e.to_string())?;
            Ok(spec)
        });
        let spec = match spec {
            Ok(s) => s,
            Err(why) => {
                warn!(app = %app, %why, "build failed");
                state.build_failed(&app, &why);
                return Ok(());
            }
        };
        let record = match state.apps.get(&app) {
            Some(e)
                if !e.record.deleting
                    && e.record.spec == spec
                    && e.record.api_type == ApiType::Declarative =>
            {
                let mut r = e.record.clone();
                r.config_version = Some(version);
                r
            }
            _ => state.next_record(spec, ApiType::Declarative, Some(version)),
        };
        let unchanged = state
            .apps
            .get(&app)
            .is_some_and(|e| e.record.generation == record.generation);
        let mut batch = Batch::new();
        let dropped = state.stage_targets(std::slice::from_ref(&record), &mut batch)?;
        if let Err(e) = commit(state, batch).await? {
            state.build_failed(&app, &format!("the checkpoint could not be written: {e}"));
            return Ok(());
        }
        state.config.unbuilt.remove(&app);
        if unchanged {
            if let Some(e) = state.apps.get_mut(&app) {
                e.record = record;
            }
            state.build_current(&app);
            return Ok(());
        }
        state.config.forget_failure(&app);
        info!(app = %app, build, "build succeeded");
        let names = state.swap_targets(vec![record], dropped);
        for n in &names {
            Self::command(myself, state, n).await;
        }
        Ok(())
    }
}
