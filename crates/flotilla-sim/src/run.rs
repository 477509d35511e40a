//! The driver: builds the simulated world on a paused, auto-advancing tokio clock
//! (so an hour of cluster life takes seconds), deploys the applications in
//! batches, plays the event schedule while traffic flows, samples the timeline,
//! waits for convergence, and checks every invariant of crash recovery.
//!
//! Everything it decides is drawn from the scenario's seed; the only wall-clock
//! readings are the figures in [`crate::summary::WallClock`] (and the stall
//! watchdog).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use flotilla::{
    ApplicationSpec, ApplicationStatus, ReplicaState, RestartPolicy, RunManyOptions, Serve,
    ServeError, ServeOptions,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::time::Instant;

use crate::{
    Result, SimError,
    cluster::SimCluster,
    faults::{Event, EventKind, Level},
    rng::{self, Rng},
    scenario::Scenario,
    summary::{
        Checkpoint, Convergence, EventRecord, Invariant, Operations, Replicas, Restarts,
        ScenarioEcho, Summary, WallClock,
    },
    traffic::{self, Cause, Handles, Ready, TrafficCtx, TrafficStats, Windows},
    workload::{self, AppTarget, World, app_index, app_name, deployment_name},
};

/// How to run a simulation (what is not part of the scenario).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Show a progress bar on stderr (hidden when stderr is not a terminal).
    pub progress: bool,
    /// Where to put the checkpoint store (default: a temporary directory).
    pub store_dir: Option<PathBuf>,
    /// Give up (print why and exit the process with status 3) if virtual time
    /// stops advancing for this long in wall time: the system under test is
    /// live-locked, busy at one virtual instant. `None`: wait forever.
    pub stall_timeout: Option<std::time::Duration>,
}

/// One timeline sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Virtual seconds from the start.
    pub t: f64,
    /// Replicas serving (published to routes).
    pub running: usize,
    /// Replica constructors running.
    pub starting: u64,
    /// Replicas holding a cluster reservation (starting, running or stopping).
    pub placed: usize,
    /// Applications by status.
    pub apps: BTreeMap<String, usize>,
    /// Applications as expected.
    pub as_expected: usize,
    /// Applications deployed so far (expected somewhere).
    pub known: usize,
    /// Requests served per second over the last interval.
    pub served_per_s: f64,
    /// Requests failed per second over the last interval.
    pub failed_per_s: f64,
    /// Retry attempts per second over the last interval.
    pub retried_per_s: f64,
    /// Live nodes.
    pub live_nodes: usize,
}

/// An event on the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mark {
    /// Virtual seconds from the start.
    pub t: f64,
    /// Short label.
    pub label: String,
    /// What it hit.
    pub level: Level,
}

/// The run over virtual time, for the report's picture.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// Samples, in time order.
    pub samples: Vec<Sample>,
    /// Events, in time order.
    pub marks: Vec<Mark>,
    /// When the event schedule ended (virtual seconds).
    pub run_end: f64,
}

/// What a run produces.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The summary.
    pub summary: Summary,
    /// The timeline.
    pub timeline: Timeline,
}

/// Run `scenario` on its own current-thread runtime with a paused clock.
pub fn run(scenario: &Scenario, options: &RunOptions) -> Result<Outcome> {
    scenario.validate()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| SimError::Setup(format!("building the tokio runtime: {e}")))?;
    let tmp;
    let dir: &Path = match &options.store_dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| SimError::Setup(format!("creating {}: {e}", d.display())))?;
            d
        }
        None => {
            tmp = tempfile::tempdir()
                .map_err(|e| SimError::Setup(format!("creating a temporary directory: {e}")))?;
            tmp.path()
        }
    };
    let store = dir.join(format!("sim-{}.redb", scenario.seed));
    // A store left by an earlier run would be recovered: start afresh.
    if store.exists() {
        std::fs::remove_file(&store)
            .map_err(|e| SimError::Setup(format!("removing old {}: {e}", store.display())))?;
    }
    let heartbeat = Arc::new(Heartbeat::default());
    let watchdog = options
        .stall_timeout
        .map(|limit| watchdog(heartbeat.clone(), limit));
    // Everything, the start instant included, is made inside the runtime: on its
    // paused clock, virtual time starts at the same instant on every run.
    let out = rt.block_on(async {
        let mut sim = Sim::new(scenario.clone(), options, store)?;
        sim.heartbeat = heartbeat.clone();
        sim.simulate().await
    });
    heartbeat.done.store(true, Ordering::Release);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    out
}

/// The simulation's sign of life: the virtual millisecond the sampler last
/// sampled, and steps of the final checks (which run at one virtual instant).
#[derive(Debug, Default)]
struct Heartbeat {
    virtual_ms: AtomicU64,
    steps: AtomicU64,
    done: AtomicBool,
}

impl Heartbeat {
    fn step(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }
}

/// A wall-clock thread that ends the process if virtual time stops (the only
/// way out of a live-lock on the runtime's one thread).
fn watchdog(beat: Arc<Heartbeat>, limit: std::time::Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut last = (u64::MAX, 0);
        let mut since = std::time::Instant::now();
        while !beat.done.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let now = (
                beat.virtual_ms.load(Ordering::Acquire),
                beat.steps.load(Ordering::Relaxed),
            );
            if now != last {
                last = now;
                since = std::time::Instant::now();
            } else if since.elapsed() > limit {
                eprintln!(
                    "\nflotilla-sim: virtual time has been stuck at {:.1}s for {:.0}s of wall time: \
                     the system under test is busy at one instant without end (a live-lock). Giving up.",
                    now.0 as f64 / 1000.0,
                    since.elapsed().as_secs_f64()
                );
                std::process::exit(3);
            }
        }
    })
}

/// What one application should be, as the acknowledged operations say.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    /// Never deployed.
    Unknown,
    /// Present at this target.
    Present(AppTarget),
    /// Being deleted (not yet acknowledged).
    Deleting(AppTarget),
    /// Deleted.
    Deleted,
}

/// What the simulation expects of an application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Ignore,
    Running,
    DeployFailed,
    Absent,
}

#[derive(Debug, Default)]
struct Model {
    slots: Vec<Slot>,
}

impl Model {
    fn slot(&self, idx: u32) -> &Slot {
        self.slots.get(idx as usize).unwrap_or(&Slot::Unknown)
    }

    fn set(&mut self, idx: u32, slot: Slot) {
        let i = idx as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, Slot::Unknown);
        }
        self.slots[i] = slot;
    }

    fn expect(&self, idx: u32) -> Expect {
        match self.slot(idx) {
            Slot::Unknown => Expect::Ignore,
            Slot::Present(t) | Slot::Deleting(t) if t.broken => Expect::DeployFailed,
            Slot::Present(_) | Slot::Deleting(_) => Expect::Running,
            Slot::Deleted => Expect::Absent,
        }
    }

    fn present(&self, healthy_only: bool) -> Vec<u32> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Slot::Present(t) if !(healthy_only && t.broken)))
            .map(|(i, _)| i as u32)
            .collect()
    }

    fn known(&self) -> usize {
        self.slots.iter().filter(|s| **s != Slot::Unknown).count()
    }
}

/// Per-process (Serve instance) counters read from `metrics()`.
#[derive(Debug, Clone, Copy, Default)]
struct ProcessCounters {
    controller_restarts: u64,
    app_restarts_done: u64,
    app_restarts_now: u64,
    commits: u64,
    keys: u64,
    bytes: u64,
}

/// An event record being followed until the system converges again.
#[derive(Debug)]
struct Follow {
    record: usize,
    at: f64,
    /// Counts as absorbed if nothing is disturbed until then.
    quiet_until: f64,
    disturbed: bool,
}

#[derive(Debug, Default)]
struct Observed {
    samples: Vec<Sample>,
    marks: Vec<Mark>,
    records: Vec<EventRecord>,
    follows: Vec<Follow>,
    processes: Vec<ProcessCounters>,
    converged: bool,
    initial_acked: bool,
    initial_at: Option<(f64, f64)>,
    settle_from: Option<(f64, f64)>,
    final_at: Option<(f64, f64)>,
    last_running: usize,
    fatal: Vec<String>,
}

struct Shared {
    scenario: Scenario,
    start: Instant,
    wall0: std::time::Instant,
    world: Arc<World>,
    cluster: Arc<SimCluster>,
    traffic: Arc<TrafficCtx>,
    model: Mutex<Model>,
    observed: Mutex<Observed>,
    progress: Option<ProgressBar>,
    stop_sampler: AtomicBool,
}

impl Shared {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn observed(&self) -> MutexGuard<'_, Observed> {
        self.observed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn windows(&self) -> &Windows {
        &self.traffic.windows
    }

    fn ready(&self) -> &Ready {
        &self.traffic.ready
    }

    fn handles(&self) -> &Handles {
        &self.traffic.handles
    }

    fn say(&self, msg: String) {
        if let Some(p) = &self.progress {
            p.set_message(msg);
        }
    }
}

/// An action of the driver's queue.
#[derive(Debug, Clone)]
enum Action {
    /// Deploy initial batch `k`.
    Batch(usize),
    /// A scheduled event.
    Event(Event),
    /// End a constructor failure spike.
    EndConstructorFailures,
    /// Stop the flapping of these applications.
    EndFlap(Vec<u32>),
}

struct Sim {
    shared: Arc<Shared>,
    registry: flotilla::Registry,
    store: PathBuf,
    rng: Rng,
    queue: Vec<(Duration, u64, Action)>,
    seq: u64,
    next_app: u32,
    updates: u64,
    dead: Vec<Serve>,
    ops: Operations,
    restarts: Restarts,
    base_failure_rate: f64,
    heartbeat: Arc<Heartbeat>,
}

const NO_WAIT: RunManyOptions = RunManyOptions {
    wait_for_ingress_deployment_creation: false,
    wait_for_applications_running: false,
};

/// Attempts per operation before it is abandoned.
const OP_ATTEMPTS: u32 = 30;
/// A control-plane window stays open at least this long (seconds).
const CONTROL_WINDOW: f64 = 30.0;
/// A data-plane window stays open at least this long (seconds).
const DATA_WINDOW: f64 = 30.0;
/// An event that disturbs nothing for this long counts as absorbed (seconds).
const ABSORBED_AFTER: f64 = 15.0;
/// Quiet time after convergence before the invariants are judged: stopping
/// replicas finish their graceful shutdown.
const QUIET: Duration = Duration::from_secs(60);

impl Sim {
    fn new(scenario: Scenario, options: &RunOptions, store: PathBuf) -> Result<Sim> {
        let world = Arc::new(World::new(scenario.seed, &scenario.workload));
        let cluster = Arc::new(SimCluster::new(
            scenario.cluster.groups.clone(),
            scenario.cluster.strategy,
            scenario.seed,
        ));
        let registry = workload::registry(&world)?;
        let start = Instant::now();
        let traffic = Arc::new(TrafficCtx {
            spec: scenario.traffic.clone(),
            seed: scenario.seed,
            start,
            stats: TrafficStats::default(),
            handles: Handles::default(),
            ready: Ready::default(),
            windows: Windows::default(),
        });
        let progress = options.progress.then(|| {
            let pb = ProgressBar::new(scenario.workload.apps as u64);
            pb.set_style(
                ProgressStyle::with_template(
                    "{prefix:>9.bold} [{bar:36}] {pos}/{len} {msg} ({elapsed})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            pb.set_prefix("deploying");
            pb
        });
        let base_failure_rate = scenario.workload.constructor_failure_rate;
        let rng = Rng::keyed(scenario.seed, &[rng::label("driver")]);
        Ok(Sim {
            shared: Arc::new(Shared {
                scenario,
                start,
                wall0: std::time::Instant::now(),
                world,
                cluster,
                traffic,
                model: Mutex::new(Model::default()),
                observed: Mutex::new(Observed::default()),
                progress,
                stop_sampler: AtomicBool::new(false),
            }),
            registry,
            store,
            rng,
            queue: Vec::new(),
            seq: 0,
            next_app: 0,
            updates: 0,
            dead: Vec::new(),
            ops: Operations::default(),
            restarts: Restarts::default(),
            base_failure_rate,
            heartbeat: Arc::new(Heartbeat::default()),
        })
    }

    fn sc(&self) -> &Scenario {
        &self.shared.scenario
    }

    fn push(&mut self, at: Duration, action: Action) {
        self.seq += 1;
        self.queue.push((at, self.seq, action));
    }

    fn pop(&mut self) -> Option<(Duration, Action)> {
        let i = self
            .queue
            .iter()
            .enumerate()
            .min_by_key(|(_, (at, seq, _))| (*at, *seq))
            .map(|(i, _)| i)?;
        let (at, _, a) = self.queue.swap_remove(i);
        Some((at, a))
    }

    async fn start_serve(&self) -> Result<Serve> {
        let mut options = ServeOptions::new(self.registry.clone())
            .store_path(&self.store)
            .cluster(self.shared.cluster.clone());
        // Scheduled faults come faster than real ones: escalate only on a storm.
        options.restart = RestartPolicy {
            max_restarts: 100,
            ..Default::default()
        };
        let serve = Serve::start(options)
            .await
            .map_err(|e| SimError::Serve(format!("starting on {}: {e}", self.store.display())))?;
        let shared = self.shared.clone();
        let watch = serve.clone();
        tokio::spawn(async move {
            let why = watch.fatal().await;
            if why != "flotilla stopped" {
                shared.observed().fatal.push(why);
            }
        });
        self.shared
            .observed()
            .processes
            .push(ProcessCounters::default());
        Ok(serve)
    }

    async fn simulate(mut self) -> Result<Outcome> {
        let serve = self.start_serve().await?;
        self.shared.handles().set_serve(Some(serve));
        let sc = self.sc().clone();
        let w = &sc.workload;
        let batches = w.apps.div_ceil(w.batch);
        for k in 0..batches {
            self.push(w.batch_every * k as u32, Action::Batch(k));
        }
        for e in sc.events()? {
            self.push(e.at, Action::Event(e));
        }
        let sampler = tokio::spawn(sample_loop(self.shared.clone(), self.heartbeat.clone()));
        let end = self.shared.start + sc.duration;
        let traffic = tokio::spawn(traffic::generate(self.shared.traffic.clone(), end));

        while let Some((at, action)) = self.pop() {
            if at > sc.duration && !matches!(action, Action::Batch(_)) {
                // Past the end: only undo what is still switched on.
                match action {
                    Action::EndConstructorFailures | Action::EndFlap(_) => {}
                    _ => continue,
                }
            } else {
                tokio::time::sleep_until(self.shared.start + at).await;
            }
            self.act(action).await?;
        }
        tokio::time::sleep_until(end).await;
        if let Some(p) = &self.shared.progress {
            p.set_prefix("draining");
        }
        let _ = traffic.await;
        let run_end = self.shared.now();
        self.settle(run_end).await;
        tokio::time::sleep(QUIET).await;
        self.shared.stop_sampler.store(true, Ordering::Release);
        let _ = sampler.await;
        if let Some(p) = &self.shared.progress {
            p.set_prefix("checking");
        }
        let invariants = self.check().await;
        self.finish(run_end, invariants).await
    }

    async fn act(&mut self, action: Action) -> Result<()> {
        match action {
            Action::Batch(k) => {
                let w = self.sc().workload.clone();
                let from = k * w.batch;
                let to = ((k + 1) * w.batch).min(w.apps);
                let apps: Vec<(u32, AppTarget)> = (from..to)
                    .map(|i| {
                        (
                            i as u32,
                            AppTarget {
                                tag: "v1".into(),
                                replicas: w.replicas,
                                // Spread the broken ones over the batches.
                                broken: w.broken_apps > 0
                                    && i % (w.apps / w.broken_apps).max(1) == 0
                                    && i / (w.apps / w.broken_apps).max(1) < w.broken_apps,
                            },
                        )
                    })
                    .collect();
                self.next_app = self.next_app.max(to as u32);
                self.shared
                    .say(format!("batch {} of {}", k + 1, w.apps.div_ceil(w.batch)));
                self.deploy(&apps).await?;
                if to == w.apps {
                    self.shared.observed().initial_acked = true;
                    if let Some(p) = &self.shared.progress {
                        p.set_message("waiting for every application");
                    }
                }
            }
            Action::Event(e) => self.inject(e).await?,
            Action::EndConstructorFailures => {
                self.shared.world.set_failure_rate(self.base_failure_rate);
            }
            Action::EndFlap(apps) => self.shared.world.set_flapping(&apps, false),
        }
        Ok(())
    }

    fn serve(&self) -> Result<Serve> {
        self.shared
            .handles()
            .serve()
            .ok_or_else(|| SimError::Serve("no live Serve instance".into()))
    }

    /// Send `op` until it is acknowledged; returns the attempts it took, or `None`
    /// if it was abandoned.
    async fn until_acked<F, Fut>(&mut self, what: &str, mut op: F) -> Result<Option<u32>>
    where
        F: FnMut(Serve) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<(), ServeError>>,
    {
        for attempt in 1..=OP_ATTEMPTS {
            let serve = self.serve()?;
            match op(serve).await {
                Ok(()) => {
                    self.ops.acknowledged += 1;
                    return Ok(Some(attempt));
                }
                Err(
                    ServeError::ControllerCrashed
                    | ServeError::Store(_)
                    | ServeError::Unavailable(_),
                ) => {
                    self.ops.retried += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => {
                    return Err(SimError::Serve(format!("{what}: unexpected error: {e}")));
                }
            }
        }
        self.ops.abandoned += 1;
        Ok(None)
    }

    fn specs(&self, apps: &[(u32, AppTarget)]) -> Result<Vec<ApplicationSpec>> {
        apps.iter()
            .map(|(i, t)| workload::app_spec(&self.sc().workload, *i, t))
            .collect()
    }

    /// Deploy (or redeploy) `apps` in one `run_many`; returns the attempts.
    async fn deploy(&mut self, apps: &[(u32, AppTarget)]) -> Result<Option<u32>> {
        if apps.is_empty() {
            return Ok(Some(0));
        }
        let specs = self.specs(apps)?;
        let what = format!("deploying {} applications", apps.len());
        let attempts = self
            .until_acked(&what, |serve| {
                let specs = specs.clone();
                async move { serve.run_many(specs, NO_WAIT).await.map(|_| ()) }
            })
            .await?;
        if attempts.is_some() {
            let mut m = self.shared.model();
            for (i, t) in apps {
                m.set(*i, Slot::Present(t.clone()));
            }
        }
        Ok(attempts)
    }

    fn pick(&mut self, from: &[u32], n: usize) -> Vec<u32> {
        self.rng
            .sample(from.len(), n)
            .into_iter()
            .map(|i| from[i])
            .collect()
    }

    fn target(&self, idx: u32) -> Option<AppTarget> {
        match self.shared.model().slot(idx) {
            Slot::Present(t) => Some(t.clone()),
            _ => None,
        }
    }

    fn mark(&self, e: &Event, effect: String) {
        let t = self.shared.now();
        let mut o = self.shared.observed();
        let record = o.records.len();
        o.records.push(EventRecord {
            at_s: t,
            event: e.text.clone(),
            effect: effect.clone(),
            disturbed_apps: 0,
            converged_after_s: None,
        });
        let lasting = match e.kind {
            EventKind::Flap { for_, .. } | EventKind::ConstructorFailures { for_, .. } => {
                for_.as_secs_f64()
            }
            _ => 0.0,
        };
        o.follows.push(Follow {
            record,
            at: t,
            quiet_until: t + lasting + ABSORBED_AFTER,
            disturbed: false,
        });
        o.marks.push(Mark {
            t,
            label: e.label(),
            level: e.level(),
        });
        drop(o);
        self.shared.say(format!("{}: {effect}", e.text));
    }

    async fn inject(&mut self, e: Event) -> Result<()> {
        let now = self.shared.now();
        let shared = self.shared.clone();
        let windows = shared.windows();
        let effect = match e.kind.clone() {
            EventKind::Controller(None) => {
                self.read_metrics().await;
                self.serve()?.crash_controller();
                windows.open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
                "crashed the Controller".to_owned()
            }
            EventKind::Controller(Some(point)) => {
                self.serve()?.faults().arm(point, 1);
                windows.open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
                "armed a Controller crash for the next operation".to_owned()
            }
            EventKind::Application(n) => {
                let present = self.shared.model().present(false);
                let serve = self.serve()?;
                let picked = self.pick(&present, n);
                let killed = picked
                    .iter()
                    .filter(|i| serve.crash_application(&app_name(**i)))
                    .count();
                windows.open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
                format!("killed {killed} ApplicationActors")
            }
            EventKind::Deployment(n) => {
                let present = self.shared.model().present(false);
                let deps = self.sc().workload.deployments as u64;
                let serve = self.serve()?;
                let picked = self.pick(&present, n);
                let mut killed = 0;
                for i in picked {
                    let d = self.rng.below(deps) as u32;
                    if serve.crash_deployment(&app_name(i), &deployment_name(d)) {
                        killed += 1;
                    }
                }
                self.restarts.deployment_actors_killed += killed;
                windows.open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
                format!("killed {killed} DeploymentActors")
            }
            EventKind::Replica(n) => {
                let serve = self.serve()?;
                let prefix = format!("{}/replicas:", serve.namespace());
                let mut members: Vec<(String, ractor::ActorCell)> = Vec::new();
                let mut groups = ractor::pg::which_groups();
                groups.retain(|g| g.starts_with(&prefix));
                groups.sort();
                for g in groups {
                    let mut cells = ractor::pg::get_members(&g);
                    cells.sort_by_key(|c| c.get_id());
                    members.extend(cells.into_iter().map(|c| (g.clone(), c)));
                }
                let picked = self.rng.sample(members.len(), n);
                let mut apps = BTreeSet::new();
                for i in &picked {
                    let (g, cell) = &members[*i];
                    if let Some(idx) = g
                        .strip_prefix(&prefix)
                        .and_then(|r| r.split('/').next())
                        .and_then(app_index)
                    {
                        apps.insert(idx);
                    }
                    cell.kill();
                }
                self.restarts.replicas_killed += picked.len() as u64;
                let count = apps.len();
                windows.open(now, DATA_WINDOW, Some(apps), Cause::ReplicaKill);
                format!("killed {} replicas of {count} apps", picked.len())
            }
            EventKind::NodeLoss(n) => {
                let live = self.shared.cluster.live_nodes();
                let idx: Vec<u32> = (0..live.len() as u32).collect();
                let picked = self.pick(&idx, n);
                let mut names = Vec::new();
                let mut apps = BTreeSet::new();
                let before = self.shared.cluster.counters().lost_with_nodes;
                for i in picked {
                    let name = &live[i as usize];
                    if let Some(hit) = self.shared.cluster.kill_node(name) {
                        apps.extend(hit.iter().filter_map(|a| app_index(a)));
                        names.push(name.clone());
                    }
                }
                let lost = self.shared.cluster.counters().lost_with_nodes - before;
                let count = apps.len();
                windows.open(now, DATA_WINDOW, Some(apps), Cause::NodeLoss);
                format!(
                    "killed {} ({lost} replicas, {count} apps)",
                    names.join(", ")
                )
            }
            EventKind::NodeAdd(n) => {
                let groups = self.shared.cluster.groups() as u64;
                let mut names = Vec::new();
                for _ in 0..n {
                    let g = self.rng.below(groups) as usize;
                    if let Some(name) = self.shared.cluster.add_node(g) {
                        names.push(name);
                    }
                }
                format!("added {}", names.join(", "))
            }
            EventKind::ConstructorFailures { rate, for_ } => {
                self.shared.world.set_failure_rate(rate);
                self.push(e.at + for_, Action::EndConstructorFailures);
                format!(
                    "constructors fail at {:.0}% for {}s",
                    rate * 100.0,
                    for_.as_secs()
                )
            }
            EventKind::Flap { apps, for_ } => {
                let present = self.shared.model().present(true);
                let picked = self.pick(&present, apps);
                self.shared.world.set_flapping(&picked, true);
                windows.open(
                    now,
                    for_.as_secs_f64() + DATA_WINDOW,
                    Some(picked.iter().copied().collect()),
                    Cause::Flap,
                );
                let count = picked.len();
                self.push(e.at + for_, Action::EndFlap(picked));
                format!("{count} apps' health checks flap for {}s", for_.as_secs())
            }
            EventKind::CommitFailure => {
                self.serve()?.fail_next_commit();
                windows.open(now, CONTROL_WINDOW, None, Cause::ControlPlane);
                "the next checkpoint commit fails".to_owned()
            }
            EventKind::Process => {
                self.restart_process().await?;
                windows.open(now, DATA_WINDOW, None, Cause::Process);
                "crashed the process; started again on the same store".to_owned()
            }
            EventKind::Update(n) => {
                self.updates += 1;
                let tag = format!("v{}", self.updates + 1);
                let present = self.shared.model().present(true);
                let picked = self.pick(&present, n);
                let apps: Vec<(u32, AppTarget)> = picked
                    .iter()
                    .filter_map(|i| {
                        self.target(*i).map(|t| {
                            (
                                *i,
                                AppTarget {
                                    tag: tag.clone(),
                                    ..t
                                },
                            )
                        })
                    })
                    .collect();
                let attempts = self.deploy(&apps).await?;
                format!(
                    "redeployed {} apps with code {tag}{}",
                    apps.len(),
                    attempts_note(attempts)
                )
            }
            EventKind::Scale(n) => {
                let base = self.sc().workload.replicas;
                let present = self.shared.model().present(true);
                let picked = self.pick(&present, n);
                let apps: Vec<(u32, AppTarget)> = picked
                    .iter()
                    .filter_map(|i| {
                        self.target(*i).map(|t| {
                            let replicas = if t.replicas == base { base + 1 } else { base };
                            (*i, AppTarget { replicas, ..t })
                        })
                    })
                    .collect();
                let attempts = self.deploy(&apps).await?;
                format!("rescaled {} apps{}", apps.len(), attempts_note(attempts))
            }
            EventKind::Delete(n) => {
                let present = self.shared.model().present(false);
                let picked = self.pick(&present, n);
                {
                    let mut m = self.shared.model();
                    for i in &picked {
                        if let Slot::Present(t) = m.slot(*i).clone() {
                            m.set(*i, Slot::Deleting(t));
                        }
                        self.shared.ready().set(*i, false);
                    }
                }
                windows.open(
                    now,
                    DATA_WINDOW,
                    Some(picked.iter().copied().collect()),
                    Cause::Deleted,
                );
                let names: Vec<String> = picked.iter().map(|i| app_name(*i)).collect();
                let attempts = self
                    .until_acked("deleting applications", |serve| {
                        let names = names.clone();
                        async move {
                            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                            serve.delete_apps(&refs, false).await
                        }
                    })
                    .await?;
                if attempts.is_some() {
                    let mut m = self.shared.model();
                    for i in &picked {
                        m.set(*i, Slot::Deleted);
                    }
                }
                format!("deleted {} apps{}", picked.len(), attempts_note(attempts))
            }
            EventKind::Deploy(n) => {
                let w = self.sc().workload.clone();
                let first = self.next_app;
                self.next_app += n as u32;
                let apps: Vec<(u32, AppTarget)> = (first..first + n as u32)
                    .map(|i| {
                        (
                            i,
                            AppTarget {
                                tag: "v1".into(),
                                replicas: w.replicas,
                                broken: false,
                            },
                        )
                    })
                    .collect();
                let attempts = self.deploy(&apps).await?;
                format!("deployed {n} new apps{}", attempts_note(attempts))
            }
        };
        self.mark(&e, effect);
        Ok(())
    }

    /// Read the live instance's metrics into its process counters.
    async fn read_metrics(&self) {
        if let Some(serve) = self.shared.handles().serve() {
            record_metrics(&self.shared, &serve).await;
        }
    }

    async fn restart_process(&mut self) -> Result<()> {
        let old = self.serve()?;
        self.read_metrics().await;
        self.shared.handles().set_serve(None);
        old.crash_process().await;
        self.shared.cluster.process_crashed();
        self.dead.push(old);
        self.restarts.process += 1;
        let serve = self.start_serve().await?;
        self.shared.handles().set_serve(Some(serve));
        Ok(())
    }

    /// After the run: let everything converge again.
    async fn settle(&mut self, run_end: f64) {
        if let Some(s) = self.shared.handles().serve() {
            s.faults().clear();
        }
        {
            let wall = self.shared.wall0.elapsed().as_secs_f64();
            let mut o = self.shared.observed();
            o.settle_from = Some((run_end, wall));
        }
        if let Some(p) = &self.shared.progress {
            p.set_prefix("settling");
            p.set_message("waiting for every application");
        }
        let deadline = Instant::now() + self.sc().settle_timeout;
        while Instant::now() < deadline {
            if self.shared.observed().final_at.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Judge every invariant.
    async fn check(&mut self) -> Vec<Invariant> {
        let mut out = Vec::new();
        let Some(serve) = self.shared.handles().serve() else {
            out.push(Invariant {
                name: "a Serve instance is alive".into(),
                ok: false,
                detail: "none".into(),
            });
            return out;
        };
        let sc = self.sc().clone();
        let slots: Vec<(u32, Slot)> = {
            let m = self.shared.model();
            m.slots
                .iter()
                .enumerate()
                .map(|(i, s)| (i as u32, s.clone()))
                .collect()
        };
        let ns = serve.namespace().to_owned();
        let deps = sc.workload.deployments as u32;

        let mut reflected = Offenders::default();
        let mut statuses = Offenders::default();
        let mut counts = Offenders::default();
        let mut orphans = Offenders::default();
        let mut expected_groups: BTreeMap<String, (usize, bool)> = BTreeMap::new();
        let mut owned_replicas = 0usize;
        let (mut present, mut deleted, mut broken) = (0, 0, 0);
        for (idx, slot) in &slots {
            self.heartbeat.step();
            let name = app_name(*idx);
            let status = serve.app_status(&name);
            match slot {
                Slot::Unknown => {}
                Slot::Deleted | Slot::Deleting(_) => {
                    deleted += 1;
                    if matches!(slot, Slot::Deleting(_)) {
                        reflected.add(format!("{name}: its deletion was never acknowledged"));
                    }
                    if status.status != ApplicationStatus::NotStarted {
                        reflected.add(format!("{name}: deleted, but {}", status.status));
                    }
                }
                Slot::Present(t) => {
                    present += 1;
                    broken += usize::from(t.broken);
                    let want = if t.broken {
                        ApplicationStatus::DeployFailed
                    } else {
                        ApplicationStatus::Running
                    };
                    if status.status != want {
                        statuses.add(format!(
                            "{name}: {} (want {want}): {}",
                            status.status, status.message
                        ));
                    }
                    let spec = match workload::app_spec(&sc.workload, *idx, t) {
                        Ok(s) => s,
                        Err(e) => {
                            reflected.add(format!("{name}: {e}"));
                            continue;
                        }
                    };
                    expected_groups.insert(format!("{ns}/deps:{name}"), (deps as usize, false));
                    for d in 0..deps {
                        let dn = deployment_name(d);
                        expected_groups.insert(
                            format!("{ns}/replicas:{name}/{dn}"),
                            (t.replicas as usize, t.broken),
                        );
                        let Some(want_version) =
                            spec.deployments.get(d as usize).map(|s| s.version())
                        else {
                            continue;
                        };
                        let snap = match serve.deployment_snapshot(&name, &dn).await {
                            Ok(Some(s)) => s,
                            _ => {
                                reflected.add(format!("{name}/{dn}: no DeploymentActor answers"));
                                continue;
                            }
                        };
                        owned_replicas += snap.replicas.len();
                        if snap.version != want_version || snap.target.replicas != t.replicas {
                            reflected.add(format!(
                                "{name}/{dn}: target {} x{} is not the acknowledged {} x{}",
                                snap.version, snap.target.replicas, want_version, t.replicas
                            ));
                        }
                        let running = snap.count_at(ReplicaState::Running, &want_version);
                        let routed = serve
                            .deployment_handle(&name, &dn)
                            .map(|h| h.replicas().len())
                            .unwrap_or(0);
                        if t.broken {
                            if snap.count(ReplicaState::Running) != 0 {
                                counts
                                    .add(format!("{name}/{dn}: broken code has running replicas"));
                            }
                        } else if running != t.replicas
                            || snap.live() != t.replicas
                            || routed != t.replicas as usize
                        {
                            counts.add(format!(
                                "{name}/{dn}: {running} running at the target version, {} live, {routed} routed; want {}",
                                snap.live(),
                                t.replicas
                            ));
                        }
                    }
                }
            }
        }
        out.push(Invariant {
            name: "every acknowledged operation is reflected".into(),
            ok: reflected.is_empty() && self.ops.abandoned == 0,
            detail: reflected.detail(format!(
                "{} operations acknowledged, {} abandoned; {present} apps at their acknowledged targets, {deleted} deleted and gone",
                self.ops.acknowledged, self.ops.abandoned
            )),
        });
        out.push(Invariant {
            name: "every application RUNNING, or DEPLOY_FAILED where its code is broken".into(),
            ok: statuses.is_empty(),
            detail: statuses.detail(format!(
                "{} RUNNING, {broken} DEPLOY_FAILED (broken code)",
                present - broken
            )),
        });
        out.push(Invariant {
            name: "replica counts and versions equal the targets".into(),
            ok: counts.is_empty(),
            detail: counts.detail(format!(
                "{} deployments at target count and version",
                (present - broken) * deps as usize
            )),
        });

        // Orphans: exactly the expected actors are alive, in this instance and none
        // in the crashed ones; the cluster holds exactly the owned replicas.
        let living = serve.living_groups();
        let mut seen = BTreeSet::new();
        for (group, n) in &living {
            seen.insert(group.clone());
            match expected_groups.get(group) {
                Some((want, false)) if n == want => {}
                Some((want, true)) if n <= want => {}
                Some((want, _)) => orphans.add(format!("{group}: {n} alive, want {want}")),
                None => orphans.add(format!("{group}: {n} alive, expected none")),
            }
        }
        for (group, (want, lenient)) in &expected_groups {
            if !seen.contains(group) && !*lenient && *want > 0 {
                orphans.add(format!("{group}: none alive, want {want}"));
            }
        }
        for (i, d) in self.dead.iter().enumerate() {
            let left = d.living_groups();
            if !left.is_empty() {
                orphans.add(format!("crashed process #{}: {left:?} still alive", i + 1));
            }
        }
        let reserved = self.shared.cluster.view().reserved;
        if reserved != owned_replicas {
            orphans.add(format!(
                "the cluster holds {reserved} reservations for {owned_replicas} owned replicas"
            ));
        }
        let actors: usize = living.iter().map(|(_, n)| n).sum();
        out.push(Invariant {
            name: "no orphan replica (Serve::living_groups, crashed processes, reservations)".into(),
            ok: orphans.is_empty(),
            detail: orphans.detail(format!(
                "{actors} actors in {} groups as expected, {} crashed processes empty, {reserved} reservations",
                living.len(),
                self.dead.len()
            )),
        });
        let r = self.shared.traffic.stats.counts();
        out.push(Invariant {
            name: "no request through a handle failed during control-plane crashes".into(),
            ok: r.failed_during_control_plane_crashes == 0,
            detail: if r.failed_during_control_plane_crashes == 0 {
                format!(
                    "0 of {} requests; {} failed where a node, replica, flap or the process was lost",
                    r.sent,
                    r.failed_excused.values().sum::<u64>()
                )
            } else {
                format!(
                    "{} failed: {}",
                    r.failed_during_control_plane_crashes,
                    r.unexcused_examples.join("; ")
                )
            },
        });
        let fatal = self.shared.observed().fatal.clone();
        out.push(Invariant {
            name: "the Supervisor never gave up".into(),
            ok: fatal.is_empty(),
            detail: if fatal.is_empty() {
                "no escalation".into()
            } else {
                fatal.join("; ")
            },
        });
        out
    }

    async fn finish(self, run_end: f64, mut invariants: Vec<Invariant>) -> Result<Outcome> {
        let sc = self.sc().clone();
        // Final readings, then a graceful shutdown that must leave nothing behind.
        let serve = self.serve()?;
        record_metrics(&self.shared, &serve).await;
        let running_at_end = serve
            .metrics()
            .await
            .map(|m| m.running_replicas)
            .unwrap_or(0);
        let statuses = serve.status();
        let total_virtual = self.shared.now();
        let wall_run = self.shared.wall0.elapsed().as_secs_f64();
        // Counters are read before the shutdown: how long it takes to reach each
        // application is not the simulation's business.
        let world = self.shared.world.counters();
        let cluster = self.shared.cluster.counters();
        let nodes_alive_at_end = self.shared.cluster.view().live_nodes;
        let requests = self.shared.traffic.stats.counts();
        let shutdown = serve.shutdown().await;
        let shutdown_virtual = self.shared.now() - total_virtual;
        let shutdown_wall = self.shared.wall0.elapsed().as_secs_f64() - wall_run;
        let left = serve.living_groups();
        invariants.push(Invariant {
            name: "a graceful shutdown leaves no actor behind".into(),
            ok: shutdown.is_ok() && left.is_empty(),
            detail: match (&shutdown, left.is_empty()) {
                (Err(e), _) => format!("shutdown failed: {e}"),
                (Ok(()), true) => "none left".into(),
                (Ok(()), false) => format!("{left:?}"),
            },
        });
        if let Some(p) = &self.shared.progress {
            p.finish_and_clear();
        }

        let mut applications: BTreeMap<String, usize> = BTreeMap::new();
        for (_, s) in &statuses {
            *applications.entry(s.status.to_string()).or_insert(0) += 1;
        }
        let mut expected: BTreeMap<String, usize> = BTreeMap::new();
        {
            let m = self.shared.model();
            for i in 0..m.slots.len() as u32 {
                let key = match m.expect(i) {
                    Expect::Ignore => continue,
                    Expect::Running => "RUNNING",
                    Expect::DeployFailed => "DEPLOY_FAILED",
                    Expect::Absent => "deleted",
                };
                *expected.entry(key.to_owned()).or_insert(0) += 1;
            }
        }
        let o = std::mem::take(&mut *self.shared.observed());
        let wall_total = self.shared.wall0.elapsed().as_secs_f64();
        let mut restarts = self.restarts.clone();
        let mut checkpoint = Checkpoint::default();
        for p in &o.processes {
            restarts.controller += p.controller_restarts;
            restarts.application += p.app_restarts_done + p.app_restarts_now;
            checkpoint.commits += p.commits;
            checkpoint.keys_written += p.keys;
            checkpoint.bytes_written += p.bytes;
        }
        let summary = Summary {
            scenario: ScenarioEcho {
                seed: sc.seed,
                nodes: sc.cluster.nodes(),
                node_groups: sc
                    .cluster
                    .groups
                    .iter()
                    .map(|g| format!("{} x{} ({} cpus)", g.name, g.count, g.cpus))
                    .collect(),
                strategy: sc.cluster.strategy.to_string(),
                apps: sc.workload.apps,
                deployments: sc.workload.deployments,
                replicas: sc.workload.replicas,
                batch: sc.workload.batch,
                broken_apps: sc.workload.broken_apps,
                constructor_failure_rate: sc.workload.constructor_failure_rate,
                traffic_rate: sc.traffic.rate,
                duration_s: sc.duration.as_secs_f64(),
                events: sc.faults.clone(),
            },
            applications,
            expected,
            convergence: Convergence {
                initial_s: o.initial_at.map(|(v, _)| v),
                final_s: o.final_at.map(|(v, _)| round3(v - run_end)),
                total_virtual_s: round3(total_virtual),
                shutdown_s: round3(shutdown_virtual),
                samples: o.samples.len(),
            },
            events: o.records,
            restarts,
            replicas: Replicas {
                started: world.started,
                stopped: world.started.saturating_sub(running_at_end as u64),
                constructor_calls: world.constructor_calls,
                constructor_failures: world.constructor_failures,
                health_check_failures: world.health_failures,
                cluster,
                running_at_end,
            },
            requests,
            operations: self.ops.clone(),
            checkpoint,
            nodes_alive_at_end,
            invariants,
            wall: WallClock {
                initial_converge_s: o.initial_at.map(|(_, w)| round3(w)),
                final_converge_s: o.final_at.map(|(_, w)| round3(w)),
                total_s: round3(wall_total),
                shutdown_s: round3(shutdown_wall),
                speedup: if wall_run > 0.0 {
                    (total_virtual / wall_run).round()
                } else {
                    0.0
                },
            },
        };
        Ok(Outcome {
            summary,
            timeline: Timeline {
                samples: o.samples,
                marks: o.marks,
                run_end,
            },
        })
    }
}

fn attempts_note(attempts: Option<u32>) -> String {
    match attempts {
        Some(0 | 1) => String::new(),
        Some(n) => format!(" (acknowledged on attempt {n})"),
        None => " (ABANDONED)".into(),
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The first few offenders of an invariant, and how many there were.
#[derive(Debug, Default)]
struct Offenders {
    first: Vec<String>,
    count: usize,
}

impl Offenders {
    fn add(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < 5 {
            self.first.push(what);
        }
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn detail(&self, ok: String) -> String {
        if self.count == 0 {
            ok
        } else {
            format!("{} offenders, e.g. {}", self.count, self.first.join("; "))
        }
    }
}

/// Fold `serve`'s metrics into the counters of the latest process.
async fn record_metrics(shared: &Shared, serve: &Serve) -> Option<usize> {
    let m = tokio::time::timeout(Duration::from_secs(5), serve.metrics())
        .await
        .ok()?
        .ok()?;
    let mut o = shared.observed();
    let p = o.processes.last_mut()?;
    p.controller_restarts = p.controller_restarts.max(m.controller_restarts);
    let app_restarts = m.controller.app_restarts;
    if app_restarts < p.app_restarts_now {
        // A new Controller life: its count started again from zero.
        p.app_restarts_done += p.app_restarts_now;
    }
    p.app_restarts_now = app_restarts;
    p.commits = p.commits.max(m.store.commits);
    p.keys = p.keys.max(m.store.keys_written);
    p.bytes = p.bytes.max(m.store.bytes_written);
    Some(m.running_replicas)
}

async fn sample_loop(shared: Arc<Shared>, beat: Arc<Heartbeat>) {
    let every = shared.scenario.sample_every;
    let mut next = shared.start;
    loop {
        next += every;
        tokio::time::sleep_until(next).await;
        if shared.stop_sampler.load(Ordering::Acquire) {
            return;
        }
        beat.virtual_ms
            .store(shared.start.elapsed().as_millis() as u64, Ordering::Release);
        sample(&shared, every.as_secs_f64()).await;
    }
}

async fn sample(shared: &Shared, interval: f64) {
    let t = shared.now();
    let serve = shared.handles().serve();
    let (statuses, running) = match &serve {
        Some(s) => (s.status(), record_metrics(shared, s).await),
        None => (Vec::new(), Some(0)),
    };
    let mut apps: BTreeMap<String, usize> = BTreeMap::new();
    let (as_expected, known, not_as_expected) = {
        let m = shared.model();
        let mut absent_listed = 0usize;
        let mut matched = 0usize;
        for (name, info) in &statuses {
            *apps.entry(info.status.to_string()).or_insert(0) += 1;
            let Some(idx) = app_index(name.as_str()) else {
                continue;
            };
            let expect = m.expect(idx);
            match (expect, info.status) {
                (Expect::Running, ApplicationStatus::Running) => {
                    matched += 1;
                    if matches!(m.slot(idx), Slot::Present(_)) {
                        shared.ready().set(idx, true);
                    }
                }
                (Expect::DeployFailed, ApplicationStatus::DeployFailed) => matched += 1,
                (Expect::Absent, _) => absent_listed += 1,
                _ => {}
            }
        }
        let absent = m
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Deleted))
            .count();
        let ok = matched + absent.saturating_sub(absent_listed);
        let known = m.known();
        (ok, known, known.saturating_sub(ok))
    };
    let converged = known > 0 && not_as_expected == 0;
    let (served, failed, retried) = shared.traffic.stats.take_bucket();
    let view = shared.cluster.view();
    let wall = shared.wall0.elapsed().as_secs_f64();
    let mut o = shared.observed();
    let running = running.unwrap_or(o.last_running);
    o.last_running = running;
    o.samples.push(Sample {
        t: round3(t),
        running,
        starting: shared.world.constructing(),
        placed: view.reserved,
        apps,
        as_expected,
        known,
        served_per_s: served as f64 / interval,
        failed_per_s: failed as f64 / interval,
        retried_per_s: retried as f64 / interval,
        live_nodes: view.live_nodes,
    });
    o.converged = converged;
    if converged {
        shared.windows().converged(t);
        if o.initial_acked && o.initial_at.is_none() {
            o.initial_at = Some((round3(t), wall));
        }
        if let (Some((_, from)), None) = (o.settle_from, o.final_at) {
            o.final_at = Some((round3(t), wall - from));
        }
    }
    // Follow each event until everything converged after it.
    let mut follows = std::mem::take(&mut o.follows);
    follows.retain_mut(|f| {
        let Some(rec) = o.records.get_mut(f.record) else {
            return false;
        };
        if !converged {
            f.disturbed = true;
            rec.disturbed_apps = rec.disturbed_apps.max(not_as_expected);
            return true;
        }
        if f.disturbed {
            rec.converged_after_s = Some(round3(t - f.at));
            return false;
        }
        if t >= f.quiet_until {
            rec.converged_after_s = Some(0.0);
            return false;
        }
        true
    });
    o.follows = follows;
    let initial_done = o.initial_at.is_some();
    let settling = o.settle_from.is_some();
    drop(o);
    if let Some(p) = &shared.progress {
        if !initial_done {
            p.set_length(known.max(1) as u64);
            p.set_position(as_expected as u64);
        } else if !settling {
            if p.length() != Some(shared.scenario.duration.as_secs()) {
                p.set_prefix("faults");
                p.set_length(shared.scenario.duration.as_secs());
            }
            p.set_position(t as u64);
        } else {
            p.set_length(known.max(1) as u64);
            p.set_position(as_expected as u64);
        }
    }
}
