//! The floor: what any control plane built like Flotilla must pay for the same
//! work, measured in the same run so that both see the same machine.
//!
//! On this VM the host backs guest memory lazily, and absolute figures swing 2-3x
//! between runs (BENCHMARKS.md, "fresh memory"). A figure divided by a floor
//! measured right next to it does not: `ratio_to_floor` is what changes are judged
//! by. The floor of a deploy of N applications is
//!
//! - **3 N bare ractor actors**, three per application, stand-ins for its
//!   application, deployment and replica actors: each named as Flotilla names them
//!   (ractor's registry is part of an actor's cost), each holding a state of the
//!   size of Flotilla's (`size_of` of its actor's `State`, see [`StateSizes`]) and
//!   doing nothing else; the first is spawned by the driver, and each spawns the
//!   next in its `post_start`, as Flotilla's do, so they start on every worker;
//! - **the same records committed in the same batches**: the [`AppRecord`] that
//!   Flotilla's Controller writes for each application, encoded and committed
//!   through [`flotilla_store::Store`], one commit per batch on a blocking thread,
//!   each batch's actors spawned after its commit.
//!
//! The floor of a restart is the same actors after reading every record back with
//! [`Store::open`] (which reads and checks the whole file, as `Serve::start` does).
//!
//! What the floor leaves out is what the ratio shows: Flotilla's messages and
//! reports, statuses, routes, replica constructors and health checks, the
//! supervision (monitors), the heap its states own (specs, maps).

use std::{
    mem::size_of,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use flotilla::ApplicationSpec;
use flotilla_core::{ApiType, AppRecord};
use flotilla_store::{Batch, Store, StoreError};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::Notify;

use crate::{
    error::{BenchError, BenchResult, Context},
    sys,
};

/// The deployment name of every benchmark application ([`crate::workload::app`]).
const DEPLOYMENT: &str = "noop";

/// The sizes of Flotilla's actor states, the floor's stand-ins' state sizes.
#[derive(Debug, Clone, Copy)]
pub struct StateSizes;

impl StateSizes {
    /// `ApplicationActor`'s state (its arguments, the record among them, inline).
    pub const APPLICATION: usize =
        size_of::<<flotilla_application::ApplicationActor as Actor>::State>();
    /// `DeploymentActor`'s state.
    pub const DEPLOYMENT: usize =
        size_of::<<flotilla_deployment::DeploymentActor as Actor>::State>();
    /// `ReplicaActor`'s state.
    pub const REPLICA: usize = size_of::<<flotilla_replica::ReplicaActor as Actor>::State>();
}

/// What one floor run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct FloorRun {
    /// From the first commit (or the open) until every stand-in has started.
    pub wall_s: f64,
    /// The commits alone, summed (deploy); the `Store::open` (restart).
    pub store_s: f64,
    /// The process's user CPU over `wall_s`.
    pub user_cpu_s: f64,
    /// The process's system CPU over `wall_s`.
    pub system_cpu_s: f64,
    /// How much the resident set grew over `wall_s`, in bytes.
    pub rss_grown: u64,
    /// Applications (each three stand-ins).
    pub apps: usize,
}

impl FloorRun {
    /// System CPU per GiB the process grew: what fresh memory cost in this run
    /// (`None` when it did not grow).
    pub fn system_s_per_gib(&self) -> Option<f64> {
        (self.rss_grown > 0)
            .then(|| self.system_cpu_s / (self.rss_grown as f64 / f64::from(1u32 << 30)))
    }
}

/// The application stand-ins of one floor run (each holds the next level). They
/// stay alive, and the memory they hold taken, as Flotilla's actors' does, until
/// the process ends.
pub type Fleet = Vec<ActorRef<()>>;

/// Deploy's floor: commit `batches`' records to a new store at `file`, one commit
/// per batch, spawning each batch's stand-ins after its commit, and wait until all
/// have started. `ns` keeps the stand-ins' names apart from Flotilla's.
pub async fn deploy(
    file: &Path,
    ns: &str,
    batches: Vec<Vec<ApplicationSpec>>,
    timeout: Duration,
) -> BenchResult<(FloorRun, Fleet)> {
    let shown = file.display().to_string();
    let (store, _) = Store::open(file).context(|| format!("opening the floor's store {shown}"))?;
    let store = Arc::new(store);
    let apps: usize = batches.iter().map(Vec::len).sum();
    let done = Done::new(apps);
    let mut roots = Vec::with_capacity(apps);
    // The Controller keeps every record: so does the floor.
    let mut kept: Vec<AppRecord> = Vec::with_capacity(apps);
    let mut store_s = 0.0;

    let before = Sample::now()?;
    for (i, batch) in batches.into_iter().enumerate() {
        let records: Vec<AppRecord> = batch.into_iter().map(record).collect();
        let mut b = Batch::new();
        for r in &records {
            b.put_app(r)
                .context(|| format!("encoding the floor's batch {i}"))?;
        }
        let t = Instant::now();
        let s = store.clone();
        tokio::task::spawn_blocking(move || s.commit(&b))
            .await
            .context(|| "joining the floor's commit".to_owned())?
            .context(|| format!("committing the floor's batch {i}"))?;
        store_s += t.elapsed().as_secs_f64();
        for r in &records {
            roots.push(spawn_root(ns, r.spec.name.as_str(), &done).await?);
        }
        kept.extend(records);
    }
    done.wait(timeout).await?;
    let run = before.run(store_s, apps)?;
    store.close();
    drop(kept);
    Ok((run, roots))
}

/// Restart's floor: read every record of the store at `file` back (waiting while
/// another instance still holds its lock; the wait is not counted), then spawn
/// three stand-ins per application and wait until all have started. The store is
/// closed before this returns.
pub async fn restart(file: &Path, ns: &str, timeout: Duration) -> BenchResult<(FloorRun, Fleet)> {
    let deadline = Instant::now() + timeout;
    let shown = file.display().to_string();
    let (before, store, snapshot, store_s) = loop {
        let before = Sample::now()?;
        let t = Instant::now();
        match Store::open(file) {
            Ok((store, snapshot)) => break (before, store, snapshot, t.elapsed().as_secs_f64()),
            Err(StoreError::Locked { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => return Err(e).context(|| format!("opening {shown} for the floor")),
        }
    };
    let apps = snapshot.apps.len();
    let done = Done::new(apps);
    let mut roots = Vec::with_capacity(apps);
    for r in &snapshot.apps {
        roots.push(spawn_root(ns, r.spec.name.as_str(), &done).await?);
    }
    done.wait(timeout).await?;
    let run = before.run(store_s, apps)?;
    store.close();
    drop(store);
    drop(snapshot);
    Ok((run, roots))
}

/// The record Flotilla's Controller commits for a new application (generation 1,
/// imperative, accepted now).
pub fn record(spec: ApplicationSpec) -> AppRecord {
    AppRecord {
        spec,
        generation: 1,
        deleting: false,
        api_type: ApiType::Imperative,
        config: None,
        deployed_at: Some(SystemTime::now()),
    }
}

/// Spawn the application stand-in of `app` (which spawns the other two).
async fn spawn_root(ns: &str, app: &str, done: &Arc<Done>) -> BenchResult<ActorRef<()>> {
    let name = format!("{ns}/app:{app}");
    // Boxed, as Flotilla's Controller boxes its children's spawns.
    let spawned = Box::pin(Actor::spawn(
        Some(name.clone()),
        StandIn::<{ pad(StateSizes::APPLICATION) }, APPLICATION>,
        done.clone(),
    ))
    .await
    .context(|| format!("spawning {name}"))?;
    Ok(spawned.0)
}

/// The process's CPU, memory and the time, at the start of a floor run.
struct Sample {
    user: f64,
    system: f64,
    rss: u64,
    t: Instant,
}

impl Sample {
    fn now() -> BenchResult<Self> {
        let (user, system) = sys::cpu_split()?;
        Ok(Sample {
            user,
            system,
            rss: sys::rss_bytes()?,
            t: Instant::now(),
        })
    }

    fn run(&self, store_s: f64, apps: usize) -> BenchResult<FloorRun> {
        let wall_s = self.t.elapsed().as_secs_f64();
        let (user, system) = sys::cpu_split()?;
        Ok(FloorRun {
            wall_s,
            store_s,
            user_cpu_s: user - self.user,
            system_cpu_s: system - self.system,
            rss_grown: sys::rss_bytes()?.saturating_sub(self.rss),
            apps,
        })
    }
}

/// Counts the replica stand-ins that have started; wakes the waiter when all
/// have, or when one could not spawn its child.
#[derive(Debug)]
struct Done {
    left: AtomicUsize,
    failed: Mutex<Option<String>>,
    notify: Notify,
}

impl Done {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Done {
            left: AtomicUsize::new(n),
            failed: Mutex::new(None),
            notify: Notify::new(),
        })
    }

    fn started(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.notify.notify_one();
        }
    }

    fn fail(&self, why: String) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(why);
        }
        self.notify.notify_one();
    }

    async fn wait(&self, timeout: Duration) -> BenchResult<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(why) = self.failed.lock().ok().and_then(|f| f.clone()) {
                return Err(BenchError::msg(why));
            }
            if self.left.load(Ordering::Acquire) == 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, self.notify.notified())
                .await
                .is_err()
            {
                return Err(BenchError::msg(format!(
                    "the floor timed out after {timeout:?}: {} stand-ins not started",
                    self.left.load(Ordering::Acquire)
                )));
            }
        }
    }
}

/// The bytes of filler that make a stand-in's state `n` bytes in all.
const fn pad(n: usize) -> usize {
    n.saturating_sub(size_of::<Arc<Done>>() + size_of::<Option<ActorRef<()>>>())
}

/// Level of the application stand-in.
const APPLICATION: u8 = 0;
/// Level of the deployment stand-in.
const DEPLOYMENT_LEVEL: u8 = 1;
/// Level of the replica stand-in.
const REPLICA: u8 = 2;

/// A bare actor: a state of `N` bytes, no messages handled. At level
/// [`APPLICATION`] and [`DEPLOYMENT_LEVEL`] it spawns the next level in
/// `post_start`; at [`REPLICA`] it counts itself started.
struct StandIn<const N: usize, const LEVEL: u8>;

/// A stand-in's state: `N` bytes, what it shares with the driver, and the next
/// level's actor (so `post_stop` can stop it); [`pad`] makes the whole the size of
/// Flotilla's state.
struct StandInState<const N: usize> {
    _bytes: [u8; N],
    done: Arc<Done>,
    next: Option<ActorRef<()>>,
}

impl<const N: usize, const LEVEL: u8> Actor for StandIn<N, LEVEL> {
    type Msg = ();
    type State = StandInState<N>;
    type Arguments = Arc<Done>;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        done: Arc<Done>,
    ) -> Result<StandInState<N>, ActorProcessingErr> {
        Ok(StandInState {
            _bytes: [0; N],
            done,
            next: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<()>,
        state: &mut StandInState<N>,
    ) -> Result<(), ActorProcessingErr> {
        let name = myself.get_name().unwrap_or_default();
        // Flotilla's names: {ns}/app:{app}, {ns}/dep:{app}/{deployment},
        // {ns}/replica:{app}/{deployment}#{id}.
        let spawned = match LEVEL {
            APPLICATION => {
                let next = format!("{}/{DEPLOYMENT}", name.replacen("/app:", "/dep:", 1));
                Box::pin(Actor::spawn(
                    Some(next.clone()),
                    StandIn::<{ pad(StateSizes::DEPLOYMENT) }, DEPLOYMENT_LEVEL>,
                    state.done.clone(),
                ))
                .await
                .map(|(a, _)| a)
                .map_err(|e| format!("spawning {next}: {e}"))
            }
            DEPLOYMENT_LEVEL => {
                let next = format!("{}#1", name.replacen("/dep:", "/replica:", 1));
                Box::pin(Actor::spawn(
                    Some(next.clone()),
                    StandIn::<{ pad(StateSizes::REPLICA) }, REPLICA>,
                    state.done.clone(),
                ))
                .await
                .map(|(a, _)| a)
                .map_err(|e| format!("spawning {next}: {e}"))
            }
            _ => {
                state.done.started();
                return Ok(());
            }
        };
        match spawned {
            Ok(a) => state.next = Some(a),
            Err(why) => state.done.fail(why),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<()>,
        state: &mut StandInState<N>,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(next) = state.next.take() {
            next.stop(None);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_ins_hold_states_of_flotillas_sizes() {
        for n in [
            StateSizes::APPLICATION,
            StateSizes::DEPLOYMENT,
            StateSizes::REPLICA,
        ] {
            assert!(n > 64, "{n}");
        }
        assert_eq!(
            size_of::<StandInState<{ pad(StateSizes::APPLICATION) }>>(),
            StateSizes::APPLICATION.next_multiple_of(8)
        );
        assert_eq!(
            size_of::<StandInState<{ pad(StateSizes::DEPLOYMENT) }>>(),
            StateSizes::DEPLOYMENT.next_multiple_of(8)
        );
        assert_eq!(
            size_of::<StandInState<{ pad(StateSizes::REPLICA) }>>(),
            StateSizes::REPLICA.next_multiple_of(8)
        );
    }
}
