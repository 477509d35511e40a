//! Declarative deploys: `apply_config` and the builds it starts.
//!
//! Applying a config is one controller message and one commit: the config itself
//! and the deletion of the declarative applications it no longer names. Each
//! application whose config entry is not what runs is then built:
//! - its import path and args changed (or it has no target yet): its registered
//!   builder runs in a task off the Controller (with a timeout);
//! - only its overrides changed: the builder's last output, kept in the record,
//!   is used again at once, without calling the builder (Ray's lightweight update).
//!
//! Either way the result, with the config's overrides laid over it, *lands*: it
//! waits (parked) while its route prefix is still held by another application of
//! the config whose own build is under way, and the builds that can land together
//! (two applications swapping prefixes, say) become targets in one commit. A
//! prefix held by an application that will keep it fails the build. A newer
//! config cancels a build still running or parked for the same application.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    time::Duration,
};

use flotilla_core::{
    ApiType, AppConfig, AppName, AppRecord, AppStatusInputs, ApplicationSpec,
    ApplicationStatusInfo, Args, ConfigSource, ServeConfig, apply_overrides, stable_hash,
};
use flotilla_replica::UserError;
use flotilla_store::Batch;
use flotilla_supervision::Backoff;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{
    Controller, ControllerMsg, ServeError,
    apps::RETRY,
    messages::InternalMsg,
    state::ControllerState,
    validate::{POLICY_NOT_REGISTERED, check_router, validate_app},
};

/// How long an application builder may run before its build fails.
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a build produced no application.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The builder returned an error (or panicked).
    #[error("{0}")]
    Failed(#[source] UserError),
    /// The builder ran past [`BUILD_TIMEOUT`].
    #[error("the builder did not finish within {0:?}")]
    TimedOut(Duration),
}

/// Why a finished build did not land: it shows as the application's
/// DEPLOY_FAILED message.
#[derive(Debug, thiserror::Error)]
enum LandingError {
    /// The builder produced no application.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The config entry's overrides do not apply to what it built.
    #[error(transparent)]
    Overrides(#[from] flotilla_core::Error),
    /// What it built, overrides applied, is refused: not a valid
    /// application, or its route prefix is another's.
    #[error(transparent)]
    Refused(#[from] ServeError),
}

/// A build under way: its id, the entry version it builds, and its task
/// (`None` for a lightweight update, whose result is already in the mailbox).
struct Build {
    id: u64,
    version: u64,
    task: Option<JoinHandle<()>>,
}

/// A finished build waiting to land: its target spec (overrides applied) and
/// where it came from.
#[derive(Clone)]
struct Parked {
    version: u64,
    spec: ApplicationSpec,
    source: ConfigSource,
}

/// The applied config, its applications indexed by name: every build that
/// lands looks its entry up, and a config may hold thousands.
struct Applied {
    config: ServeConfig,
    index: HashMap<AppName, usize>,
}

impl Applied {
    fn new(config: ServeConfig) -> Self {
        let mut index = HashMap::with_capacity(config.applications.len());
        for (i, a) in config.applications.iter().enumerate() {
            index.entry(a.name.clone()).or_insert(i);
        }
        Applied { config, index }
    }

    fn application(&self, name: &AppName) -> Option<&AppConfig> {
        self.config.applications.get(*self.index.get(name)?)
    }
}

/// The last applied config and its builds.
pub(crate) struct ConfigState {
    applied: Option<Applied>,
    builds: HashMap<AppName, Build>,
    /// Finished builds whose route prefix is still held (see the module docs).
    parked: BTreeMap<AppName, Parked>,
    /// Applications the config names that have no record yet (building or failed).
    unbuilt: HashSet<AppName>,
    /// Failed builds of applications that have a record: the generation the
    /// failure stands over and its message (volatile, as Ray's; a Controller
    /// restart rebuilds and fails again).
    failed: HashMap<AppName, (u64, String)>,
    next_build: u64,
    /// How many tries in a row of a landing failed to commit, while another
    /// is due (the wait grows with them, [`LANDING_BACKOFF`]).
    landing_retry: Option<u32>,
}

/// The waits between tries of a landing whose commit keeps failing.
const LANDING_BACKOFF: Backoff = Backoff::new(RETRY, Duration::from_secs(5));

/// The Controller's state is dropped on every exit, a crash or a kill too
/// (ractor runs no `post_stop` then): its builds end with it, since its
/// successor starts them again from the durable config. Left running, a
/// builder would run twice at once, side effects and all.
impl Drop for ConfigState {
    fn drop(&mut self) {
        self.cancel_all();
    }
}

impl ConfigState {
    pub(crate) fn recovered(applied: Option<ServeConfig>) -> Self {
        ConfigState {
            applied: applied.map(Applied::new),
            builds: HashMap::new(),
            parked: BTreeMap::new(),
            unbuilt: HashSet::new(),
            failed: HashMap::new(),
            next_build: 1,
            landing_retry: None,
        }
    }

    /// The last applied config, as committed.
    pub(crate) fn applied(&self) -> Option<&ServeConfig> {
        self.applied.as_ref().map(|a| &a.config)
    }

    /// Forget what is built or building for `app`.
    fn cancel(&mut self, app: &AppName) {
        if let Some(b) = self.builds.remove(app) {
            if let Some(task) = b.task {
                task.abort();
            }
            info!(app = %app, "build cancelled");
        }
        self.parked.remove(app);
    }

    /// Whether `app` has a build that has not landed (running or parked).
    fn in_flight(&self, app: &AppName) -> bool {
        self.builds.contains_key(app) || self.parked.contains_key(app)
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
            .filter(|n| applied.application(n).is_some())
            .collect();
        if drop.is_empty() {
            return None;
        }
        let mut config = applied.config.clone();
        config.applications.retain(|a| !drop.contains(&a.name));
        Some(config)
    }

    /// After the commit of [`without`](Self::without): take the smaller config and
    /// cancel what was building for the applications it dropped. Returns those
    /// that had no record yet (still building, or failed to build).
    pub(crate) fn release(&mut self, config: ServeConfig) -> Vec<AppName> {
        let unbuilt = self.drop_unnamed(&config);
        self.applied = Some(Applied::new(config));
        unbuilt
    }

    /// Cancel what is building or parked for every application `config` does
    /// not name (a parked build would otherwise land it again, as a new
    /// generation of a record being deleted). Returns those that had no
    /// record yet (still building, or failed to build).
    fn drop_unnamed(&mut self, config: &ServeConfig) -> Vec<AppName> {
        let named = config.by_name();
        let mut dropped: Vec<AppName> = self
            .builds
            .keys()
            .chain(self.parked.keys())
            .chain(self.unbuilt.iter())
            .filter(|n| !named.contains_key(n.as_str()))
            .cloned()
            .collect();
        // In name order, not the maps': a run is a function of its seed.
        dropped.sort_unstable();
        dropped.dedup();
        let mut unbuilt = Vec::new();
        for n in dropped {
            self.cancel(&n);
            if self.unbuilt.remove(&n) {
                unbuilt.push(n);
            }
        }
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
        for (_, b) in self.builds.drain() {
            if let Some(task) = b.task {
                task.abort();
            }
        }
        self.parked.clear();
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
    /// After the commit of a newly applied `config` (which deleted `deleted`
    /// applications): forget the builds of applications it no longer names, take
    /// its logging, and put the applications it adds on the board, DEPLOYING,
    /// before the reply (Ray creates their state in the call).
    fn take_config(&mut self, config: ServeConfig, deleted: usize) {
        let dropped = self.config.drop_unnamed(&config);
        self.forget_unbuilt(dropped);
        // A failed build of an entry this config no longer names stands over
        // nothing now: the application it failed over (an imperative one the
        // entry took over, which the config leaves alone) shows what runs.
        let named = config.by_name();
        let mut unnamed: Vec<AppName> = self
            .config
            .failed
            .keys()
            .filter(|app| !named.contains_key(app.as_str()))
            .cloned()
            .collect();
        // In name order, not the map's: a run is a function of its seed.
        unnamed.sort_unstable();
        for app in unnamed {
            self.build_current(&app);
        }
        self.logging
            .set_config_global(config.logging_config.clone());
        // What the config holds that Flotilla does not apply (runtime_env keys,
        // deprecated names, ...): one warning each, naming its application.
        for w in config.warnings() {
            warn!(
                app = w.app().map_or("", |a| a.as_str()),
                deployment = w.deployment().map_or("", |d| d.as_str()),
                "config: {w}"
            );
        }
        info!(apps = config.applications.len(), deleted, "config applied");
        for app in &config.applications {
            if !self.apps.contains_key(&app.name) {
                self.show_unbuilt(app);
            }
        }
        self.config.applied = Some(Applied::new(config));
    }

    /// Take the applied config without some applications (after the commit that
    /// wrote it); an application it dropped that never got a record leaves the board.
    pub(crate) fn release_config(&mut self, config: ServeConfig) {
        let dropped = self.config.release(config);
        self.forget_unbuilt(dropped);
    }

    /// Applications a config dropped before their build landed: one that
    /// never got a record leaves the board (logged by its own logging), and
    /// its logging goes.
    fn forget_unbuilt(&mut self, dropped: Vec<AppName>) {
        for unbuilt in dropped {
            if !self.apps.contains_key(&unbuilt) {
                self.board.remove(&unbuilt);
                self.logging.set_app(&unbuilt, None);
            }
        }
    }

    /// `app` has no target yet: it shows DEPLOYING until its build lands,
    /// and its events (that status first) log by its entry's logging.
    fn show_unbuilt(&mut self, app: &AppConfig) {
        // No record: nothing else sets its logging (and a config that
        // dropped the entry's logging_config clears it).
        self.logging.set_app(&app.name, app.logging_config.clone());
        self.config.unbuilt.insert(app.name.clone());
        self.publish_unbuilt(&app.name, None);
    }

    /// A build of `app` failed. An application that has a target keeps running it,
    /// and its actor shows DEPLOY_FAILED over it until a new target or a config
    /// whose entry is what runs; one without a target shows it on the board.
    fn build_failed(&mut self, app: &AppName, why: &LandingError) {
        warn!(app = %app, %why, "build failed");
        let message = format!("Deploying app '{app}' failed: {why}");
        match self.apps.get(app).filter(|e| !e.record.deleting) {
            Some(e) => {
                let generation = e.record.generation;
                self.config
                    .failed
                    .insert(app.clone(), (generation, message));
                self.retell_target(app);
            }
            None => self.publish_unbuilt(app, Some(&message)),
        }
    }

    /// What runs for `app` is the config's entry: no failed build stands over it.
    fn build_current(&mut self, app: &AppName) {
        self.config.forget_failure(app);
        self.retell_target(app);
    }

    /// Tell `app`'s actor its target again, with the failed build that now
    /// stands over it (or none): the one message that carries both.
    fn retell_target(&self, app: &AppName) {
        if let Some(e) = self.apps.get(app)
            && let Some(actor) = self.actors.actor(app)
        {
            let _ = actor.cast(self.set_target(&e.record));
        }
    }

    /// Publish the status of an application that has no target yet.
    fn publish_unbuilt(&self, app: &AppName, failure: Option<&str>) {
        let mut info = ApplicationStatusInfo::derive(AppStatusInputs {
            record: None,
            reported: &BTreeMap::new(),
            build_failure: failure,
        });
        // A config declared it: declarative from then on, deployed when the
        // config was applied (Ray creates its state so in the call), though
        // no target has been built yet.
        info.api_type = Some(ApiType::Declarative);
        info.last_deployed = self
            .board
            .status(app.as_str())
            .last_deployed
            .or_else(|| Some((self.clock)()));
        self.board.publish(app, None, info);
    }

    /// The record `parked` lands as: the running target with its new source when
    /// the spec is unchanged (no new generation), else the next generation.
    fn landing_record(&self, app: &AppName, parked: Parked) -> (AppRecord, bool) {
        let source = Some(Box::new(parked.source));
        match self.apps.get(app) {
            Some(e)
                if !e.record.deleting
                    && e.record.spec == parked.spec
                    && e.record.api_type == ApiType::Declarative =>
            {
                let mut r = e.record.clone();
                r.config = source;
                (r, true)
            }
            _ => (
                self.next_record(parked.spec, ApiType::Declarative, source),
                false,
            ),
        }
    }
}

impl Controller {
    /// Validate the whole config -> one commit (the config, and the deletion of
    /// the declarative applications it no longer names) -> reply -> command the
    /// deletions -> start the builds it owes.
    pub(crate) async fn apply_config(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        config: Box<ServeConfig>,
        reply: RpcReplyPort<Result<(), ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        let config = config.inherit_logging();
        let stage = move |s: &ControllerState, batch: &mut Batch| {
            Self::check_config(s, &config)?;
            let named = config.by_name();
            let gone: Vec<AppName> = s
                .apps
                .iter()
                .filter(|(n, e)| {
                    e.record.api_type == ApiType::Declarative
                        && !e.record.deleting
                        && !named.contains_key(n.as_str())
                })
                .map(|(n, _)| n.clone())
                .collect();
            batch.put_config(&config)?;
            let changed = s.stage_deletions(&gone, batch)?;
            Ok((config, changed))
        };
        let swap = |s: &mut ControllerState, (config, changed): (ServeConfig, Vec<AppRecord>)| {
            s.swap_deletions(&changed);
            s.take_config(config, changed.len());
            ((), changed.into_iter().map(|r| r.spec.name).collect())
        };
        if Self::transact(myself, state, reply, stage, swap).await? {
            Self::resume_builds(myself, state);
            // The deletions released prefixes parked builds may wait for.
            Self::settle_parked_next(myself, state);
        }
        Ok(())
    }

    /// Whole-config checks against the registry and the live applications: every
    /// builder registered, imperative applications taken over only when asked,
    /// and no prefix taken from an application the config does not manage.
    fn check_config(state: &ControllerState, config: &ServeConfig) -> Result<(), ServeError> {
        config.validate()?;
        let named = config.by_name();
        for app in &config.applications {
            if !state.registry.contains_app(app.import_path.as_str()) {
                return Err(ServeError::NotRegistered {
                    app: app.name.to_string(),
                    deployment: None,
                    import_path: app.import_path.to_string(),
                });
            }
            let unregistered = |deployment: Option<&str>, field, import_path: &str, reason| {
                ServeError::NotRegisteredAt {
                    app: app.name.to_string(),
                    deployment: deployment.map(str::to_owned),
                    field,
                    import_path: import_path.to_owned(),
                    reason,
                }
            };
            if let Some(p) = &app.autoscaling_policy
                && !state
                    .registry
                    .contains_autoscaling_policy(p.policy_function.as_str())
            {
                return Err(unregistered(
                    None,
                    "autoscaling_policy.policy_function",
                    p.policy_function.as_str(),
                    POLICY_NOT_REGISTERED,
                ));
            }
            for d in &app.deployments {
                let dep = Some(d.name.as_str());
                if let Some(p) = d.autoscaling_config.given().and_then(|a| a.policy.as_ref())
                    && !state
                        .registry
                        .contains_autoscaling_policy(p.policy_function.as_str())
                {
                    return Err(unregistered(
                        dep,
                        "autoscaling_config.policy.policy_function",
                        p.policy_function.as_str(),
                        POLICY_NOT_REGISTERED,
                    ));
                }
                // The override replaces the builder's router config whole:
                // its router must be registered and take its kwargs now, as
                // `run` checks a spec's (not at the build, after the ack).
                if let Some(router) = d
                    .request_router_config
                    .as_ref()
                    .and_then(|r| r.to_config().ok())
                {
                    check_router(&state.registry, &router, app.name.as_str(), d.name.as_str())?;
                }
            }
            if let Some(e) = state.apps.get(&app.name)
                && e.record.api_type == ApiType::Imperative
                && !e.record.deleting
                && !app.take_over
            {
                return Err(ServeError::ImperativeApp {
                    app: app.name.to_string(),
                });
            }
            if let Some(p) = app.route_prefix.prefix()
                && let Some(holder) = state.routes.get(p)
                && holder != &app.name
                && !named.contains_key(holder.as_str())
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
        let Some(config) = state.config.applied().cloned() else {
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
                .filter_map(|n| config.application(n).cloned())
                .collect(),
            None => return,
        };
        for app in &named {
            Self::resume_build(myself, state, app);
        }
    }

    /// Start a build of `app` unless its entry is what runs or is being built:
    /// a lightweight one (the builder's last output again) when only its
    /// overrides changed, else a build task.
    fn resume_build(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        app: &AppConfig,
    ) {
        let version = entry_version(app);
        let source = state
            .apps
            .get(&app.name)
            .filter(|e| !e.record.deleting && e.record.api_type == ApiType::Declarative)
            .and_then(|e| e.record.config.as_deref());
        if source.is_some_and(|s| s.entry == version) {
            state.config.cancel(&app.name);
            // A build of another entry may have failed over this target since
            // (perhaps before a Controller restart).
            state.build_current(&app.name);
            return;
        }
        // A new application shows DEPLOYING while it builds; a running one keeps
        // its status until the build changes its target.
        let unbuilt = !state.apps.contains_key(&app.name);
        let building = state
            .config
            .builds
            .get(&app.name)
            .map(|b| b.version)
            .or(state.config.parked.get(&app.name).map(|p| p.version));
        if building == Some(version) {
            if unbuilt {
                state.show_unbuilt(app);
            }
            return;
        }
        state.config.cancel(&app.name);
        let id = state.config.next_build;
        state.config.next_build += 1;
        let name = app.name.clone();
        let task = match source.filter(|s| s.code == app.code_version()) {
            Some(s) => {
                // Same import path and args: the builder's last output is the
                // build; only the overrides are laid over it again.
                info!(app = %name, build = id, "overrides changed: updating without a rebuild");
                let _ = myself.cast(
                    InternalMsg::BuildDone {
                        app: name.clone(),
                        build: id,
                        result: Ok(s.built.clone()),
                    }
                    .into(),
                );
                None
            }
            None => {
                let fut = state.registry.build_app(&app.import_path, app.args.clone());
                let me = myself.clone();
                let app = name.clone();
                info!(app = %name, build = id, "build started");
                Some(tokio::spawn(async move {
                    let result = match tokio::time::timeout(BUILD_TIMEOUT, fut).await {
                        Ok(Ok(spec)) => Ok(spec),
                        Ok(Err(e)) => Err(BuildError::Failed(e)),
                        Err(_) => Err(BuildError::TimedOut(BUILD_TIMEOUT)),
                    };
                    let _ = me.cast(
                        InternalMsg::BuildDone {
                            app,
                            build: id,
                            result,
                        }
                        .into(),
                    );
                }))
            }
        };
        if unbuilt {
            state.show_unbuilt(app);
        }
        state
            .config
            .builds
            .insert(name, Build { id, version, task });
    }

    /// A build finished: lay the config's overrides over it, validate, and let
    /// it land (see [`Self::settle_parked`]).
    pub(crate) async fn build_done(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        app: AppName,
        build: u64,
        result: Result<ApplicationSpec, BuildError>,
    ) -> Result<(), ActorProcessingErr> {
        let version = match state.config.builds.get(&app) {
            Some(b) if b.id == build => b.version,
            _ => return Ok(()),
        };
        state.config.builds.remove(&app);
        let Some(entry) = state
            .config
            .applied
            .as_ref()
            .and_then(|c| c.application(&app))
            .cloned()
        else {
            return Ok(());
        };
        let landed = result.map_err(LandingError::from).and_then(|mut built| {
            built.name = app.clone();
            let spec = apply_overrides(built.clone(), &entry)?;
            validate_app(&spec, &state.registry)?;
            let source = ConfigSource {
                code: entry.code_version(),
                entry: version,
                built,
            };
            Ok(Parked {
                version,
                spec,
                source,
            })
        });
        match landed {
            Ok(parked) => {
                state.config.parked.insert(app, parked);
            }
            Err(why) => state.build_failed(&app, &why),
        }
        Self::settle_parked(myself, state).await
    }

    /// Settle the parked builds in a message of their own, after this one's
    /// commit: a message never commits twice.
    pub(crate) fn settle_parked_next(myself: &ActorRef<ControllerMsg>, state: &ControllerState) {
        if !state.config.parked.is_empty() {
            let _ = myself.cast(InternalMsg::SettleParked.into());
        }
    }

    /// Land the parked builds that can land now, in one commit. A parked build
    /// whose prefix is held by an application outside the landing set waits if
    /// that holder's own build is in flight (it may be moving away), and fails if
    /// the holder will keep it. Builds that want each other's prefixes land
    /// together, so a swap never fails on the order builds finish in.
    pub(crate) async fn settle_parked(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
    ) -> Result<(), ActorProcessingErr> {
        if state.config.parked.is_empty() {
            return Ok(());
        }
        let mut landing: BTreeSet<AppName> = state.config.parked.keys().cloned().collect();
        let mut failed = Vec::new();
        loop {
            let mut wanted: HashMap<&str, &AppName> = HashMap::new();
            let mut out = None;
            for name in &landing {
                let Some(prefix) = state.config.parked[name].spec.route_prefix.as_ref() else {
                    continue;
                };
                let holder = state.routes.get(prefix);
                if let Some(first) = wanted.insert(prefix.as_str(), name) {
                    // Two builds chose the same prefix: the one that holds it
                    // keeps it; between two newcomers the later name fails.
                    out = Some(if holder == Some(name) {
                        (first.clone(), Some(name.clone()))
                    } else {
                        (name.clone(), Some(first.clone()))
                    });
                    break;
                }
                let Some(holder) = holder else {
                    continue;
                };
                if holder == name || landing.contains(holder) {
                    continue;
                }
                // A holder whose build failed here keeps its prefix; one whose
                // build is still to land may be moving off it.
                let decided = failed.iter().any(|(f, _)| f == holder);
                let waits = state.config.in_flight(holder) && !decided;
                out = Some((name.clone(), (!waits).then(|| holder.clone())));
                break;
            }
            let Some((name, holder)) = out else { break };
            landing.remove(&name);
            if let Some(holder) = holder {
                failed.push((name, holder));
            }
        }
        for (name, holder) in failed {
            if let Some(p) = state.config.parked.remove(&name) {
                let prefix = p
                    .spec
                    .route_prefix
                    .map(|p| p.to_string())
                    .unwrap_or_default();
                let taken = ServeError::RouteTaken {
                    app: name.to_string(),
                    prefix,
                    holder: holder.to_string(),
                };
                state.build_failed(&name, &taken.into());
            }
        }
        if landing.is_empty() {
            return Ok(());
        }
        let mut records = Vec::with_capacity(landing.len());
        for name in &landing {
            if let Some(p) = state.config.parked.get(name) {
                records.push(state.landing_record(name, p.clone()));
            }
        }
        let mut batch = Batch::new();
        let all: Vec<AppRecord> = records.iter().map(|(r, _)| r.clone()).collect();
        let dropped = state.stage_targets(&all, &mut batch)?;
        if let Err(e) = state.checkpoint.commit(&state.faults, batch).await? {
            // The store failed, not the builds: they stay parked and land at
            // the next try, ever less often while it keeps failing (a full
            // disk), as removals are tried again.
            let failures = state.config.landing_retry.unwrap_or(0).saturating_add(1);
            let after = LANDING_BACKOFF.after(failures);
            state.config.landing_retry = Some(failures);
            warn!(apps = landing.len(), error = %e, retry_in = ?after,
                "could not commit finished builds; retrying");
            myself.send_after(after, || InternalMsg::SettleParked.into());
            return Ok(());
        }
        state.config.landing_retry = None;
        for name in &landing {
            state.config.parked.remove(name);
        }
        let mut new_targets = Vec::new();
        for (record, unchanged) in records {
            let name = record.spec.name.clone();
            state.config.unbuilt.remove(&name);
            if unchanged {
                if let Some(e) = state.apps.get_mut(&name) {
                    e.record = record;
                }
                state.build_current(&name);
            } else {
                state.config.forget_failure(&name);
                info!(app = %name, "build landed");
                new_targets.push(record);
            }
        }
        let names = state.swap_targets(new_targets, dropped);
        for n in &names {
            Self::command(myself, state, n).await;
        }
        Ok(())
    }
}
