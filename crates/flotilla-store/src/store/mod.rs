//! The store: an open that checks before it writes, one read transaction per load, one
//! write transaction per commit.

mod open;
mod read;
#[cfg(test)]
mod tests;

use std::fmt;
use std::fs;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use redb::{Database, Durability, WriteTransaction};

use crate::batch::{Batch, Op};
use crate::tables::{APPS, CONFIG, CONFIG_KEY, DEPLOYMENTS};
use crate::{FileKind, Snapshot, StoreError};
use open::{OPEN_ATTEMPTS, create, lock_existing, open_locked, remove_created};
use read::read_snapshot;

/// What the store has written since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounters {
    /// Successful commits of non-empty batches (each is one redb write transaction).
    pub commits: u64,
    /// Key operations committed, puts and deletes alike (the sum of [`Batch::len`]).
    pub keys_written: u64,
    /// Key plus value bytes of the committed puts (keys counted as their names' bytes).
    pub bytes_written: u64,
}

/// The checkpoint: one redb file, opened by one Flotilla instance at a time.
///
/// `Send + Sync`; the Controller shares it in an `Arc` and is its only caller. Dropping
/// it closes the file and releases its lock.
pub struct Store {
    /// `None` once closed (or while an open after an I/O error failed).
    db: RwLock<Option<Database>>,
    /// Opens the database again over the same locked file. `None` once closed.
    reopen: Mutex<Option<Reopen>>,
    /// The file's failed flushes (counted by its backend): a commit that
    /// failed while this grew may be in the file.
    failed_flushes: Arc<AtomicU64>,
    /// An I/O error or a failed commit failed a call: redb refuses the handle
    /// for good (`PreviousIo`, or a discarded allocator state), so the next
    /// call opens the database again first.
    broken: AtomicBool,
    path: PathBuf,
    /// This store's open created the file.
    created: bool,
    fail_next: AtomicBool,
    unsettle_next: AtomicBool,
    counters: Mutex<StoreCounters>,
}

/// Opens a store's database again, over the file (and lock) it was opened on.
type Reopen = Box<dyn Fn() -> Result<Database, redb::DatabaseError> + Send + Sync>;

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Open the checkpoint at `path`, creating it if it is missing, and return it with
    /// everything it holds, read and checked (what [`load`](Self::load) would return now).
    ///
    /// A path that names a FIFO, a socket, a device or a directory is
    /// [`StoreError::NotAFile`], found from its metadata before anything opens it (opening
    /// a FIFO would wait for a writer).
    ///
    /// **One store per file.** Before anything reads the file, it is locked, whole and
    /// exclusively, by a single try through one handle that the check, the writable open
    /// and the store then share (redb's own file lock: on Linux and Apple platforms an
    /// open-file-description lock, on Windows `LockFileEx`); it is released when the store
    /// closes, or when the open fails. A file that another instance, another `Store` in
    /// this process, or any other redb handle has open is [`StoreError::Locked`], and
    /// nothing of it was read. Of concurrent opens of one path, exactly one gets the
    /// store and the others `Locked`: no step of one overlaps another's check or writable
    /// open. (Left to redb, whose read-only and writable opens each lock the file by
    /// themselves, in different orders, one opener's check and another's writable open
    /// could refuse each other both.) No lock file is made: the directory holds the
    /// checkpoint alone. The lock needs a handle open for writing, so a file that cannot
    /// be opened for writing is [`StoreError::Io`].
    ///
    /// A missing file is built under a temporary name in the same directory (on Unix with
    /// mode 0600, readable by its owner only, from its creation), locked, stamped with
    /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION) in one write transaction, and then hard-linked into place, so
    /// `path` never names a half-made checkpoint; it is opened through the lock it was
    /// built under, so its creator gets the store. On a file system without hard links it
    /// is built in place and locked at once; an opener that finds it in the moment between
    /// its creation and its lock reads an empty file ([`StoreError::Corrupt`]). A crash
    /// while creating may leave the temporary `.<name>.creating-<pid>-<n>` behind; it is
    /// never read. An open that fails after it created the file removes it, under its
    /// lock, and leaves no file behind; an opener that found the file and locked it only
    /// after it was removed sees that (the path no longer names what it locked) and looks
    /// at the path again.
    ///
    /// **A damaged file is never written.** An existing file is first opened read-only,
    /// which writes nothing, and read whole in one read transaction: its schema version is
    /// checked and every record decoded and validated, as [`load`](Self::load) does (the
    /// config slot, whose type is the Controller's, is checked to be one MessagePack
    /// value). A file that is not a redb file (garbage, empty, truncated), is not a
    /// Flotilla checkpoint, has a page redb cannot read (it fails or panics on it), or
    /// holds a record that does not decode or is not valid ([`StoreError::Corrupt`]), or
    /// has a newer schema ([`StoreError::SchemaTooNew`]) is refused and left byte-for-byte
    /// as it was. Only a file that passed every check is opened for writing, and the
    /// snapshot the check read is the one returned: no record is read or validated twice.
    /// The lock is held from before the check to the writable open, so no other instance
    /// (nor any redb handle) can have changed the file in between.
    ///
    /// A file that was not closed cleanly (its writer crashed) cannot be opened read-only:
    /// redb refuses to read it before recovering it, and recovery writes. It is recovered
    /// in memory instead, over the file (redb's writes are kept in memory and its reads
    /// see them over the file's bytes; the file is not written), and checked there as
    /// above. Only if it passes is it opened for writing, which recovers it on disk: redb
    /// rewrites its header and allocator state (and may shorten the file's free tail),
    /// never a committed record. Every commit records the allocator state (redb's quick
    /// repair), so that recovery is quick; for such a file it runs twice, in memory and on
    /// disk.
    ///
    /// A panic of redb on a damaged file, here or in any later call of the store, is
    /// caught and is [`StoreError::Corrupt`].
    ///
    /// ```
    /// use flotilla_store::{Batch, Store};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let (store, snapshot) = Store::open(dir.path().join("checkpoint.redb")).unwrap();
    /// assert!(snapshot.apps.is_empty());
    /// let mut batch = Batch::new();
    /// batch.put_config(&("my", "config")).unwrap();
    /// store.commit(&batch).unwrap();
    /// let config: Option<(String, String)> = store.load().unwrap().config().unwrap();
    /// assert_eq!(config.unwrap().0, "my");
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<(Store, Snapshot), StoreError> {
        Self::open_checked(path, |_, _| Ok(()))
    }

    /// [`open`](Self::open), with one more check of the snapshot before the
    /// file is opened for writing: `check` sees what the read-only look read
    /// (the caller validates what the store cannot, such as the config slot,
    /// whose type is its own: [`Snapshot::config_checked`]), and its error
    /// refuses the file, left byte-for-byte as it was.
    pub fn open_checked(
        path: impl AsRef<Path>,
        check: impl FnOnce(&Path, &Snapshot) -> Result<(), StoreError>,
    ) -> Result<(Store, Snapshot), StoreError> {
        let path = path.as_ref().to_path_buf();
        // A file found here may be removed before this open locks it, by the
        // failed open that created it (below): then the path is looked at again.
        for _ in 0..OPEN_ATTEMPTS {
            // Looked at before anything opens it: opening a FIFO would wait for a writer.
            let file = match fs::metadata(&path) {
                Ok(meta) => {
                    if let Some(kind) = FileKind::of(meta.file_type()) {
                        return Err(StoreError::NotAFile { path, kind });
                    }
                    match lock_existing(&path)? {
                        Some(file) => file,
                        None => continue,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => match create(&path)? {
                    Some(file) => {
                        // An open that fails after it created the file leaves none:
                        // removed while the lock is held (this clone holds it), so
                        // the file removed is this open's, and an opener that
                        // locks it later finds it gone (`lock_existing`).
                        let held = file.clone();
                        let opened = open_locked(path.clone(), file, true, check);
                        if opened.is_err() {
                            remove_created(&path);
                        }
                        drop(held);
                        return opened;
                    }
                    // Another opener created it first: open theirs.
                    None => match lock_existing(&path)? {
                        Some(file) => file,
                        None => continue,
                    },
                },
                Err(e) => return Err(StoreError::io(&path, e)),
            };
            return open_locked(path, file, false, check);
        }
        Err(StoreError::io(
            &path,
            io::Error::other("the file was removed while it was being opened, again and again"),
        ))
    }

    /// The checkpoint file's path, as given to [`open`](Self::open).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the open that made this store created the file (it found none).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Read everything the checkpoint holds, in one read transaction, checked as
    /// [`open`](Self::open) checks it (for a Controller that restarts on an open store).
    ///
    /// A record that does not decode, is not valid, or whose key does not match its
    /// content is [`StoreError::Corrupt`] naming the table and key; so is a damaged page
    /// (on which redb may panic; the panic is caught).
    pub fn load(&self) -> Result<Snapshot, StoreError> {
        self.with_db("reading", read_snapshot)
    }

    /// Write `batch` in one redb write transaction with immediate durability: when this
    /// returns `Ok`, the batch survives a crash. On `Err` nothing of it was written,
    /// except on [`StoreError::CommitUnsettled`]: a flush failed during the commit (redb
    /// writes the header that names the transaction before its last flush), or redb
    /// panicked in it, and the batch may be in the file. After any failed commit the store's next call opens the
    /// file again (redb refuses a handle whose commit failed), which recovers it as after
    /// a crash.
    ///
    /// An empty batch is a no-op: it opens no transaction and does not count as a commit
    /// (nor does it consume a [`fail_next_commit`](Self::fail_next_commit)). A damaged
    /// page met on the way is [`StoreError::Corrupt`] (a panic of redb is caught), and
    /// the transaction is not committed.
    pub fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.fail_next.load(Ordering::Relaxed) && self.fail_next.swap(false, Ordering::Relaxed) {
            return Err(StoreError::Injected {
                path: self.path.clone(),
            });
        }
        let written = self.with_db("writing", |path, db| {
            let txn = begin_write(path, db)?;
            // On an error the transaction is dropped, which aborts it: nothing is written.
            apply(path, &txn, batch)?;
            // redb writes the new pages, flushes, writes the header that names
            // the transaction, and flushes again: a failed write leaves the
            // old header in charge, but after a failed flush (or a panic) the
            // new header may be in the file.
            let unsettled = |source| StoreError::CommitUnsettled {
                path: path.to_owned(),
                source: Box::new(source),
            };
            let flushes = self.failed_flushes.load(Ordering::Acquire);
            match unpanicking(path, "committing to", || txn.commit()) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => {
                    let e = StoreError::from_redb_commit(path, e);
                    if self.failed_flushes.load(Ordering::Acquire) == flushes {
                        Err(e)
                    } else {
                        Err(unsettled(e))
                    }
                }
                Err(panicked) => Err(unsettled(panicked)),
            }
        });
        if let Err(e) = written {
            // redb refuses a handle whose commit failed (its allocator state
            // is dropped), whatever the cause: the next call opens it again.
            self.broken.store(true, Ordering::Release);
            return Err(e);
        }
        if self.unsettle_next.load(Ordering::Relaxed)
            && self.unsettle_next.swap(false, Ordering::Relaxed)
        {
            return Err(StoreError::CommitUnsettled {
                path: self.path.clone(),
                source: Box::new(StoreError::Injected {
                    path: self.path.clone(),
                }),
            });
        }

        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        counters.commits = counters.commits.saturating_add(1);
        counters.keys_written = counters
            .keys_written
            .saturating_add(u64::try_from(batch.len()).unwrap_or(u64::MAX));
        counters.bytes_written = counters.bytes_written.saturating_add(batch.put_bytes());
        tracing::trace!(
            keys = batch.len(),
            bytes = batch.put_bytes(),
            "checkpoint commit"
        );
        Ok(())
    }

    /// Close the file and release its lock now (later calls fail with
    /// [`StoreError::Closed`]). Waits for a commit in progress to finish. Dropping the
    /// store does the same.
    pub fn close(&self) {
        let mut db = self.db.write().unwrap_or_else(PoisonError::into_inner);
        // The reopener holds the file's lock too.
        self.reopen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(db) = db.take() {
            match unpanicking(&self.path, "closing", || db.close()) {
                Ok(Ok(())) => tracing::debug!(path = %self.path.display(), "checkpoint closed"),
                Ok(Err(e)) => {
                    let e = StoreError::from_redb_database(&self.path, e);
                    tracing::warn!(error = %e, "closing the checkpoint");
                }
                Err(e) => tracing::warn!(error = %e, "closing the checkpoint"),
            }
        }
    }

    /// The store over `db`, the open checkpoint at `path`, which `reopen` opens
    /// again.
    fn with_database(
        path: PathBuf,
        db: Database,
        reopen: Reopen,
        failed_flushes: Arc<AtomicU64>,
        created: bool,
    ) -> Store {
        Store {
            created,
            failed_flushes,
            db: RwLock::new(Some(db)),
            reopen: Mutex::new(Some(reopen)),
            broken: AtomicBool::new(false),
            path,
            fail_next: AtomicBool::new(false),
            unsettle_next: AtomicBool::new(false),
            counters: Mutex::new(StoreCounters::default()),
        }
    }

    /// Run `f` on the open database, turning a panic of redb into [`StoreError::Corrupt`].
    ///
    /// After an I/O error (a full disk, say) or a failed commit redb refuses every later
    /// access to its handle, even once the cause is gone; the call after one opens the
    /// database again, over the same locked file (which redb recovers as after a crash:
    /// only committed transactions are there), so one failure leaves no trace beyond
    /// its own (see [`commit`](Self::commit)).
    fn with_db<T>(
        &self,
        doing: &str,
        f: impl FnOnce(&Path, &Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.broken.load(Ordering::Acquire) {
            self.reopen()?;
        }
        let db = self.open_db();
        let db = db.as_ref().ok_or_else(|| self.closed())?;
        let result = unpanicking(&self.path, doing, || f(&self.path, db))?;
        if let Err(e) = &result
            && e.is_io_failure()
        {
            self.broken.store(true, Ordering::Release);
        }
        result
    }

    /// Open the database again after an I/O error or a failed commit (see
    /// [`Self::with_db`]). Should that fail too, the next call tries again.
    fn reopen(&self) -> Result<(), StoreError> {
        let mut db = self.db.write().unwrap_or_else(PoisonError::into_inner);
        if !self.broken.load(Ordering::Acquire) {
            return Ok(());
        }
        let reopen = self.reopen.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(open) = reopen.as_ref() else {
            return Err(self.closed());
        };
        if let Some(old) = db.take() {
            // Refused for good by redb: dropped, it leaves the file to recover.
            let _ = unpanicking(&self.path, "closing", || drop(old));
        }
        let new = unpanicking(&self.path, "reopening", open)?
            .map_err(|e| StoreError::from_redb_database(&self.path, e))?;
        *db = Some(new);
        self.broken.store(false, Ordering::Release);
        tracing::warn!(checkpoint = %self.path.display(),
            "opened the checkpoint again after an I/O error or a failed commit");
        Ok(())
    }

    fn open_db(&self) -> RwLockReadGuard<'_, Option<Database>> {
        self.db.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn closed(&self) -> StoreError {
        StoreError::Closed {
            path: self.path.clone(),
        }
    }

    /// What this store has written since it was opened.
    pub fn counters(&self) -> StoreCounters {
        *self.counters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fault hook for tests: the next [`commit`](Self::commit) of a non-empty batch returns
    /// [`StoreError::Injected`] and writes nothing; the one after it works again. Costs a
    /// commit one relaxed atomic load while unused.
    pub fn fail_next_commit(&self) {
        self.fail_next.store(true, Ordering::Relaxed);
    }

    /// Fault hook for tests: the next [`commit`](Self::commit) of a non-empty batch is
    /// written, then returns [`StoreError::CommitUnsettled`] (as a commit whose last
    /// flush failed after redb wrote its header may).
    pub fn unsettle_next_commit(&self) {
        self.unsettle_next.store(true, Ordering::Relaxed);
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

/// Apply the batch's operations, in order, inside `txn`.
fn apply(path: &Path, txn: &WriteTransaction, batch: &Batch) -> Result<(), StoreError> {
    let table = |e| StoreError::from_redb_table(path, e);
    let storage = |e| StoreError::from_redb_storage(path, e);
    let mut apps = txn.open_table(APPS).map_err(table)?;
    let mut deployments = txn.open_table(DEPLOYMENTS).map_err(table)?;
    let mut config = txn.open_table(CONFIG).map_err(table)?;
    for op in batch.ops() {
        match op {
            Op::PutApp { name, value } => {
                apps.insert(name.as_str(), value.0.as_slice())
                    .map_err(storage)?;
            }
            Op::DeleteApp { name } => {
                apps.remove(name.as_str()).map_err(storage)?;
                // Every (name, _) key and nothing else: `name + "\0"` is the least string
                // greater than `name` (strings order by their bytes).
                let next = format!("{name}\0");
                deployments
                    .retain_in((name.as_str(), "")..(next.as_str(), ""), |_, _| false)
                    .map_err(storage)?;
            }
            Op::PutDeployment {
                app,
                deployment,
                value,
            } => {
                deployments
                    .insert((app.as_str(), deployment.as_str()), value.0.as_slice())
                    .map_err(storage)?;
            }
            Op::DeleteDeployment { app, deployment } => {
                deployments
                    .remove((app.as_str(), deployment.as_str()))
                    .map_err(storage)?;
            }
            Op::PutConfig { value } => {
                config
                    .insert(CONFIG_KEY, value.0.as_slice())
                    .map_err(storage)?;
            }
            Op::DeleteConfig => {
                config.remove(CONFIG_KEY).map_err(storage)?;
            }
        }
    }
    Ok(())
}

/// A write transaction that is durable when its commit returns and records the allocator
/// state, so that recovery after a crash is quick.
fn begin_write(path: &Path, db: &Database) -> Result<WriteTransaction, StoreError> {
    let mut txn = db
        .begin_write()
        .map_err(|e| StoreError::from_redb_transaction(path, e))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| StoreError::from_redb_durability(path, e))?;
    txn.set_quick_repair(true);
    Ok(txn)
}

/// Run `f`, a call into redb, turning a panic (redb may panic on a file damaged outside
/// redb) into [`StoreError::Corrupt`]; `doing` says what it was doing ("reading").
///
/// redb stays usable after a panic (it marks what it could not finish for repair).
fn unpanicking<T>(path: &Path, doing: &str, f: impl FnOnce() -> T) -> Result<T, StoreError> {
    panic::catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        StoreError::corrupt(path, format!("redb failed {doing} the file: {message}"))
    })
}
