//! Setting the simulation up: its state ([`Sim`]), starting Flotilla on the
//! simulated cluster, and crashing and restarting the whole process on the same
//! store.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, atomic::AtomicBool},
    time::Duration,
};

use flotilla::{FaultPoint, RestartPolicy, Serve, ServeOptions};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::time::Instant;

use super::{
    RunOptions,
    driver::Action,
    model::Model,
    shared::{Observed, ProcessCounters, Shared, record_metrics},
    watchdog::Heartbeat,
};
use crate::{
    Result, SimError,
    cluster::SimCluster,
    rng::{self, Rng},
    scenario::Scenario,
    serve_config::{Configs, register_builders},
    summary::{Operations, Restarts},
    traffic::{Handles, Ready, TrafficCtx, TrafficStats, Windows},
    workload::{self, World},
};

/// The simulation: the shared state, the driver's queue and RNG, and what it
/// counts itself.
pub(super) struct Sim {
    pub(super) shared: Arc<Shared>,
    pub(super) registry: flotilla::Registry,
    pub(super) store: PathBuf,
    pub(super) rng: Rng,
    pub(super) queue: Vec<(Duration, u64, Action)>,
    pub(super) seq: u64,
    pub(super) next_app: u32,
    pub(super) updates: u64,
    pub(super) dead: Vec<Serve>,
    pub(super) ops: Operations,
    pub(super) restarts: Restarts,
    pub(super) base_failure_rate: f64,
    pub(super) heartbeat: Arc<Heartbeat>,
    /// The ServeConfigs of the run, loaded before it started.
    pub(super) configs: Configs,
    /// Initial operations (batches, the initial config) not yet done.
    pub(super) initial_pending: usize,
}

impl Sim {
    /// The world of `scenario` and its `configs`, its store at `store`, nothing
    /// started yet.
    pub(super) fn new(
        scenario: Scenario,
        configs: Configs,
        options: &RunOptions,
        store: PathBuf,
        heartbeat: Arc<Heartbeat>,
    ) -> Result<Sim> {
        let world = Arc::new(World::new(scenario.seed, &scenario.workload));
        let cluster = Arc::new(SimCluster::new(
            scenario.cluster.groups.clone(),
            scenario.cluster.strategy,
            scenario.seed,
        ));
        let registry = register_builders(workload::registry(&world)?, &scenario.workload)?;
        let start = Instant::now();
        let traffic = Arc::new(TrafficCtx {
            spec: scenario.traffic.clone(),
            seed: scenario.seed,
            start,
            stats: TrafficStats::default(),
            handles: Handles::default(),
            ready: Ready::default(),
            windows: Windows::default(),
            names: world.names().clone(),
        });
        let progress = options
            .progress
            .then(|| progress_bar(scenario.workload.apps as u64));
        let base_failure_rate = scenario.workload.constructor_failure_rate;
        let rng = Rng::keyed(scenario.seed, &[rng::label("driver")]);
        // Workload applications take indexes from 0; later ones (declared, or
        // deployed by events) follow them.
        let next_app = scenario.workload.apps as u32;
        let initial_pending = scenario.workload.apps.div_ceil(scenario.workload.batch)
            + usize::from(configs.initial.is_some());
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
            next_app,
            updates: 0,
            dead: Vec::new(),
            ops: Operations::default(),
            restarts: Restarts::default(),
            base_failure_rate,
            heartbeat,
            configs,
            initial_pending,
        })
    }

    /// The scenario.
    pub(super) fn sc(&self) -> &Scenario {
        &self.shared.scenario
    }

    /// The live Serve instance.
    pub(super) fn serve(&self) -> Result<Serve> {
        self.shared.handles().serve().ok_or(SimError::NoServe)
    }

    /// Start Flotilla on the store and the simulated cluster, and watch it for a
    /// fatal escalation.
    pub(super) async fn start_serve(&self) -> Result<Serve> {
        let mut options = ServeOptions::new(self.registry.clone())
            .store_path(&self.store)
            .cluster(self.shared.cluster.clone());
        // Targets are stamped on virtual time, not the wall clock: the stamp is
        // in every record written, and its MessagePack length (a sub-second
        // part under 65536 ns encodes shorter) is in the checkpoint's bytes.
        let start = self.shared.start;
        options = options.clock(Arc::new(move || {
            std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000) + start.elapsed()
        }));
        // Scheduled faults come faster than real ones: escalate only on a storm.
        options.restart = RestartPolicy {
            max_restarts: 100,
            ..Default::default()
        };
        let serve = Serve::start(options).await.map_err(|e| SimError::Start {
            store: self.store.clone(),
            source: Box::new(e),
        })?;
        let shared = self.shared.clone();
        let watch = serve.clone();
        tokio::spawn(async move {
            if let Some(why) = watch.fatal().await {
                shared.observed().fatal.push(why.to_string());
            }
        });
        self.shared
            .observed()
            .processes
            .push(ProcessCounters::default());
        Ok(serve)
    }

    /// Read the live instance's metrics into its process counters.
    pub(super) async fn read_metrics(&self) {
        if let Some(serve) = self.shared.handles().serve() {
            record_metrics(&self.shared, &serve).await;
        }
    }

    /// Crash the whole process (every actor of the instance dies, the cluster
    /// loses its reservations), then start again on the same store.
    pub(super) async fn restart_process(&mut self) -> Result<()> {
        let old = self.serve()?;
        self.read_metrics().await;
        self.note_unfired(&old, "before the process crash");
        self.shared.handles().set_serve(None);
        // A crashed process leaves its store as it was on disk, not closed:
        // its image now (no commit runs meanwhile: commits run inline on this
        // runtime's one thread) is put back after the crash, whose close
        // marked the file clean, so the next start goes through redb's
        // recovery of a file that was not closed, as after a real crash.
        let image = std::fs::read(&self.store).map_err(|source| SimError::Io {
            what: "reading the store's image before the process crash",
            source,
        })?;
        old.crash_process().await;
        std::fs::write(&self.store, image).map_err(|source| SimError::Io {
            what: "putting back the store's image after the process crash",
            source,
        })?;
        self.shared.cluster.process_crashed();
        self.dead.push(old);
        self.restarts.process += 1;
        let serve = self.start_serve().await?;
        self.shared.handles().set_serve(Some(serve));
        Ok(())
    }
}

impl Sim {
    /// Note the control-plane faults the schedule armed on `serve` that have
    /// not fired (`when`): each was meant to crash something, and a run in
    /// which one never did has not tested what it stands for.
    pub(super) fn note_unfired(&self, serve: &Serve, when: &str) {
        let unfired: Vec<String> = [
            FaultPoint::ControllerBeforeCommit,
            FaultPoint::ControllerAfterCommit,
            FaultPoint::ControllerAfterReply,
            FaultPoint::CommitFails,
            FaultPoint::CommitUnsettled,
        ]
        .into_iter()
        .filter(|p| serve.faults().remaining(*p) > 0)
        .map(|p| format!("{p:?} {when}"))
        .collect();
        self.shared.observed().unfired.extend(unfired);
    }
}

/// The progress bar, `len` applications long to begin with.
fn progress_bar(len: u64) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>9.bold} [{bar:36}] {pos}/{len} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix("deploying");
    pb
}
