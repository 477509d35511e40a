//! The checkpoint, as only the Controller holds it: opening it (read and checked
//! whole before anything runs), and the one commit path with its fault points.

use std::{
    path::Path,
    sync::{Arc, Mutex, PoisonError},
};

use flotilla_core::{FaultPoint, Faults, ServeConfig};
use flotilla_store::{Batch, Snapshot, Store, StoreCounters, StoreError};
use ractor::ActorProcessingErr;

use crate::ServeError;

/// The open checkpoint store. [`Checkpoint::open`] gives it to the embedding
/// program only to hand to the Controller ([`ControllerArgs`](crate::ControllerArgs)):
/// everything that reads or writes the store goes through the Controller, the
/// only writer. Counters come with [`ControllerMsg::Observe`](crate::ControllerMsg),
/// a failing commit is a fault point ([`FaultPoint::CommitFails`]).
///
/// One Controller at a time writes it: each incarnation
/// claims it before it reads it, and a commit of an
/// earlier incarnation still in flight (it was killed while its fsync ran on a
/// blocking thread, which a kill does not stop) lands before the claim or not
/// at all. Without that, a successor could read the store before the dead
/// Controller's batch landed, and hold in memory less than the file.
#[derive(Clone)]
pub struct Checkpoint {
    store: Arc<Store>,
    /// The incarnation that may commit now, shared by every clone; its lock
    /// also orders claims against commits.
    writer: Arc<Mutex<u64>>,
    /// The incarnation this clone commits for.
    epoch: u64,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("path", &self.store.path())
            .finish()
    }
}

/// The instance's hold on its checkpoint, which closes it when the instance
/// stops (shutdown, a crash, or the last `Serve` dropped): the file's lock is
/// released then, so another instance may open it, and not before. In
/// particular a Supervisor that gave up (its Controller gone with its copy of
/// the store) leaves the file locked while the instance's replicas may still
/// serve: a second instance opening it would run the same applications twice.
#[derive(Clone, Debug)]
pub struct CheckpointCloser {
    store: Arc<Store>,
}

impl CheckpointCloser {
    /// Close the store if it is still open; later reads and commits fail with
    /// `StoreError::Closed`.
    pub fn close(&self) {
        self.store.close();
    }
}

impl Checkpoint {
    /// Open (or create) the checkpoint at `path` and read all of it: a file that
    /// is locked, damaged, from a newer schema or not a regular file is refused
    /// here, before anything runs, and left as it was. The snapshot is what the
    /// first Controller starts from ([`Preloaded`](crate::Preloaded)).
    pub fn open(path: impl AsRef<Path>) -> Result<(Checkpoint, Snapshot), ServeError> {
        let (store, snapshot) = Store::open_checked(path, check_config)?;
        Ok((
            Checkpoint {
                store: Arc::new(store),
                writer: Arc::default(),
                epoch: 0,
            },
            snapshot,
        ))
    }

    /// Whether [`open`](Self::open) created the file (it found none).
    pub fn created(&self) -> bool {
        self.store.created()
    }

    /// A handle that can only close the store.
    pub fn closer(&self) -> CheckpointCloser {
        CheckpointCloser {
            store: self.store.clone(),
        }
    }

    /// This checkpoint for a new Controller incarnation, which alone commits
    /// from now on: an earlier incarnation's commit in progress has landed when
    /// this returns, and a later one of it is refused ([`Superseded`]).
    pub(crate) fn claim(&self) -> Checkpoint {
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        *writer += 1;
        Checkpoint {
            store: self.store.clone(),
            writer: self.writer.clone(),
            epoch: *writer,
        }
    }

    pub(crate) fn load(&self) -> Result<Snapshot, StoreError> {
        self.store.load()
    }

    pub(crate) fn counters(&self) -> StoreCounters {
        self.store.counters()
    }

    pub(crate) fn close(&self) {
        self.store.close();
    }

    /// Commit `batch` with the fault points around it. `Err` is a crash: an
    /// injected one, or a commit whose outcome is the file's
    /// ([`StoreError::CommitUnsettled`]: the Controller's memory must take it
    /// neither as written nor as not, so its successor reads the file, and the
    /// call's caller hears the crash: may or may not be applied). `Ok(Err)` is
    /// the store's refusal, for the caller to report (nothing changed).
    pub(crate) async fn commit(
        &self,
        faults: &Faults,
        batch: Batch,
    ) -> Result<Result<(), StoreError>, ActorProcessingErr> {
        crash_if(faults, FaultPoint::ControllerBeforeCommit)?;
        if faults.hit(FaultPoint::CommitFails) {
            self.store.fail_next_commit();
        }
        if faults.hit(FaultPoint::CommitUnsettled) {
            self.store.unsettle_next_commit();
        }
        let result = self.write(batch).await?;
        if let Err(e @ StoreError::CommitUnsettled { .. }) = result {
            tracing::error!(error = %e, "checkpoint commit of unknown outcome: restarting the controller");
            return Err(Box::new(e));
        }
        if result.is_ok() {
            crash_if(faults, FaultPoint::ControllerAfterCommit)?;
        }
        Ok(result)
    }

    /// Commit `batch` and wait for it; the Controller handles nothing else
    /// meanwhile (the protocol's order holds). On a multi-thread runtime the
    /// fsync runs on a blocking thread, so it does not hold a worker its
    /// children's actors could use. On a current-thread runtime there is no
    /// other worker to free, and committing inline keeps a paused-time run
    /// (tests, the simulator) a pure function of its seed: a blocking thread
    /// would finish at a wall-clock moment. A panic inside the store crashes the
    /// Controller (`Err`), whose successor recovers.
    async fn write(&self, batch: Batch) -> Result<Result<(), StoreError>, ActorProcessingErr> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let (store, writer, epoch) = (self.store.clone(), self.writer.clone(), self.epoch);
        let commit = move || {
            let current = writer.lock().unwrap_or_else(PoisonError::into_inner);
            if *current != epoch {
                return Err(Superseded(epoch));
            }
            Ok(store.commit(&batch))
        };
        if Handle::current().runtime_flavor() == RuntimeFlavor::CurrentThread {
            return Ok(commit()?);
        }
        Ok(tokio::task::spawn_blocking(commit).await??)
    }
}

/// Crash the Controller here if `point` is armed (fault injection).
pub(crate) fn crash_if(faults: &Faults, point: FaultPoint) -> Result<(), ActorProcessingErr> {
    if faults.hit(point) {
        return Err(Box::new(InjectedCrash(point)));
    }
    Ok(())
}

/// A commit of a Controller incarnation that a newer one replaced (it was
/// killed; its successor claimed the checkpoint): refused, nothing written.
#[derive(Debug, thiserror::Error)]
#[error("controller incarnation {0} was superseded; its commit was not written")]
pub(crate) struct Superseded(u64);

/// A crash injected at a fault point.
#[derive(Debug, thiserror::Error)]
#[error("injected fault: {0:?}")]
pub(crate) struct InjectedCrash(pub(crate) FaultPoint);

/// The config slot is the Controller's type, which the store does not know:
/// decoded before the file is opened for writing, so a damaged one is refused
/// at open as a corrupt file left as it was (the first Controller would fail
/// on it, and every restart after). Not validated here: a config an earlier
/// Flotilla accepted may break a rule added since, and that is no damage
/// (the Controller's recovery warns about it, and runs on).
fn check_config(path: &Path, snapshot: &Snapshot) -> Result<(), StoreError> {
    snapshot
        .config_checked(path, |_: &ServeConfig| {
            Ok::<(), std::convert::Infallible>(())
        })
        .map(drop)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use flotilla_core::{AppName, Faults};
    use flotilla_store::Batch;

    use super::Checkpoint;

    fn batch() -> Batch {
        let mut batch = Batch::new();
        batch.delete_app(&AppName::new("a").unwrap());
        batch
    }

    // Multi-thread: the commit runs on a blocking thread, as in production.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_superseded_controllers_commit_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (opened, _) = Checkpoint::open(dir.path().join("c.redb")).unwrap();
        let (old, new) = (opened.claim(), opened.claim());
        let faults = Faults::default();
        assert!(old.commit(&faults, batch()).await.is_err(), "refused");
        assert_eq!(new.counters().commits, 0, "nothing written");
        new.commit(&faults, batch()).await.unwrap().unwrap();
        assert_eq!(new.counters().commits, 1);
    }
}
