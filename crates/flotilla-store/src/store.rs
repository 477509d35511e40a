//! The store: an open that checks before it writes, one read transaction per load, one
//! write transaction per commit.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use flotilla_core::{AppName, AppRecord, DeploymentName, DeploymentRecord, RoutePrefix, shown};
use redb::{
    Builder, Database, Durability, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable,
    TableDefinition, TableError, TableHandle, WriteTransaction,
};
use serde::de::IgnoredAny;

use crate::batch::{Batch, Op};
use crate::codec::decode;
use crate::lock::{LockedBackend, LockedFile};
use crate::scratch::Scratch;
use crate::tables::{APPS, CONFIG, CONFIG_KEY, DEPLOYMENTS, META, SCHEMA_KEY};
use crate::{FileKind, SCHEMA_VERSION, Snapshot, StoreError};

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
    /// [`SCHEMA_VERSION`] in one write transaction, and then hard-linked into place, so
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

/// Refuse applications no API call could have left side by side: two live
/// ones holding one route prefix (a deploy refuses a prefix another live
/// application holds; one being deleted holds none). Recovered, one of them
/// would be unreachable.
fn check_prefixes(path: &Path, apps: &[AppRecord]) -> Result<(), StoreError> {
    let mut holders: std::collections::HashMap<&RoutePrefix, &AppName> =
        std::collections::HashMap::with_capacity(apps.len());
    for r in apps.iter().filter(|r| !r.deleting) {
        if let Some(prefix) = &r.spec.route_prefix
            && let Some(other) = holders.insert(prefix, &r.spec.name)
        {
            return Err(StoreError::corrupt(
                path,
                format!(
                    "table `apps`: live applications {:?} and {:?} both hold route prefix {:?}",
                    other.as_str(),
                    r.spec.name.as_str(),
                    shown(prefix.as_str())
                ),
            ));
        }
    }
    Ok(())
}

/// Read the whole checkpoint in one read transaction, checking it: the schema version,
/// and every record decoded and valid. What [`Store::open`] checks before it writes, and
/// [`Store::load`] returns.
fn read_snapshot(path: &Path, db: &impl ReadableDatabase) -> Result<Snapshot, StoreError> {
    let txn = db
        .begin_read()
        .map_err(|e| StoreError::from_redb_transaction(path, e))?;
    check_schema(path, schema_version(path, &txn)?)?;
    let storage = |e| StoreError::from_redb_storage(path, e);
    let mut snapshot = Snapshot::default();

    if let Some(apps) = open_read(path, &txn, APPS)? {
        for entry in apps.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let name = key.value();
            // Keys are quoted bounded: a hostile file may hold any length.
            let key_shown = format_args!("{:?}", shown(name));
            let record: AppRecord = decode(path, APPS.name(), &key_shown, value.value())?;
            if record.spec.name.as_str() != name {
                return Err(StoreError::corrupt(
                    path,
                    format!(
                        "table `apps`, key {key_shown}: holds the record of application {:?}",
                        record.spec.name.as_str()
                    ),
                ));
            }
            // Decoded is not valid: a record no API call could have written
            // (autoscaling bounds crossed, say) would fail the actors that run it.
            record.validate().map_err(|e| {
                let reason = format!("table `apps`, key {key_shown}: {e}");
                StoreError::corrupt_because(path, reason, e)
            })?;
            snapshot.apps.push(record);
        }
        check_prefixes(path, &snapshot.apps)?;
    }

    if let Some(deployments) = open_read(path, &txn, DEPLOYMENTS)? {
        for entry in deployments.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let (app, dep) = key.value();
            let key_shown = format_args!("({:?}, {:?})", shown(app), shown(dep));
            let invalid = |e: flotilla_core::Error| {
                let reason = format!("table `deployments`, key {key_shown}: {e}");
                StoreError::corrupt_because(path, reason, e)
            };
            let app_name = AppName::new(app).map_err(invalid)?;
            let dep_name = DeploymentName::new(dep).map_err(invalid)?;
            let record: DeploymentRecord =
                decode(path, DEPLOYMENTS.name(), &key_shown, value.value())?;
            record.validate().map_err(invalid)?;
            snapshot.deployments.push((app_name, dep_name, record));
        }
    }

    if let Some(config) = open_read(path, &txn, CONFIG)?
        && let Some(value) = config.get(CONFIG_KEY).map_err(storage)?
    {
        let bytes = value.value();
        // Its type is the Controller's (Snapshot::config decodes it), but whatever the
        // type, the value is one MessagePack value.
        let _: IgnoredAny = decode(path, CONFIG.name(), &format_args!("{CONFIG_KEY:?}"), bytes)?;
        snapshot.config = Some(bytes.to_vec());
    }
    Ok(snapshot)
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

/// Open a table for reading; a table that does not exist reads as empty.
fn open_read<K: redb::Key + 'static, V: redb::Value + 'static>(
    path: &Path,
    txn: &ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(table) {
        Ok(t) => Ok(Some(t)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(StoreError::from_redb_table(path, e)),
    }
}

/// Create a missing checkpoint: build it under a temporary name, locked, then link it into
/// place. Returns the new file, still locked, to be opened; `None` if another opener created
/// it first (its file is to be opened, and locked, as any existing one).
fn create(path: &Path) -> Result<Option<LockedBackend>, StoreError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let Some(file_name) = path.file_name() else {
        return Err(StoreError::io(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "the path does not name a file"),
        ));
    };
    let dir = dir_of(path);
    let mut tmp_name = OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(
        ".creating-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = dir.join(tmp_name);
    let file = create_new(&tmp).map_err(|e| StoreError::io(path, e))?;
    // Locked before it is linked into place: an opener that finds it there finds it locked.
    let linked = built(path, file).map(|file| (file, fs::hard_link(&tmp, path)));
    if let Err(e) = fs::remove_file(&tmp) {
        tracing::warn!(file = %tmp.display(), error = %e, "cannot remove the temporary checkpoint");
    }
    match linked? {
        (file, Ok(())) => {
            tracing::info!(checkpoint = %path.display(), schema = SCHEMA_VERSION, "created the checkpoint");
            if let Err(e) = sync_dir(path, dir) {
                remove_created(path);
                drop(file);
                return Err(e);
            }
            Ok(Some(file))
        }
        // Another opener created it first: open theirs.
        (_, Err(e)) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
        // A file system without hard links: create the file in place instead.
        (_, Err(e)) => {
            tracing::debug!(error = %e, "cannot link the new checkpoint into place; creating it in place");
            match create_new(path) {
                Ok(file) => {
                    // Visible before it is locked: another opener may lock it
                    // first (this open is then refused, and leaves the file be).
                    let file = LockedFile::lock(path, file)?;
                    if let Err(e) =
                        initialise_locked(path, &file).and_then(|()| sync_dir(path, dir))
                    {
                        remove_created(path);
                        drop(file);
                        return Err(e);
                    }
                    Ok(Some(file))
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(StoreError::io(path, e)),
            }
        }
    }
}

/// Lock the new, empty `file` and [`initialise`] it; the lock is kept.
fn built(path: &Path, file: File) -> Result<LockedBackend, StoreError> {
    let file = LockedFile::lock(path, file)?;
    initialise_locked(path, &file)?;
    Ok(file)
}

/// [`initialise`] the new, empty, locked `file` (a panic of redb caught).
fn initialise_locked(path: &Path, file: &LockedBackend) -> Result<(), StoreError> {
    unpanicking(path, "creating", || initialise(path, file.clone()))?
}

/// Create a file that must not exist yet, for reading and writing. On Unix it is made
/// with mode 0600 (before the umask) from the start, before anything is written: a
/// checkpoint holds init args and user configs.
fn create_new(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// The directory holding `path`: its parent, or "." for a bare file name.
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Make a new directory entry durable.
fn sync_dir(path: &Path, dir: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(path, e))?;
    #[cfg(not(unix))]
    let _ = (path, dir);
    Ok(())
}

/// Initialise a new, empty, locked `file` as a checkpoint: the tables and the schema
/// version, in one durable write transaction.
fn initialise(path: &Path, file: impl redb::StorageBackend) -> Result<(), StoreError> {
    let db_err = |e| StoreError::from_redb_database(path, e);
    let table = |e| StoreError::from_redb_table(path, e);
    let db = Builder::new().create_with_backend(file).map_err(db_err)?;
    let txn = begin_write(path, &db)?;
    {
        let mut meta = txn.open_table(META).map_err(table)?;
        meta.insert(SCHEMA_KEY, SCHEMA_VERSION)
            .map_err(|e| StoreError::from_redb_storage(path, e))?;
        txn.open_table(APPS).map_err(table)?;
        txn.open_table(DEPLOYMENTS).map_err(table)?;
        txn.open_table(CONFIG).map_err(table)?;
    }
    txn.commit()
        .map_err(|e| StoreError::from_redb_commit(path, e))?;
    db.close().map_err(db_err)
}

/// How many times an open looks for its file again after finding it removed
/// before it could lock it.
const OPEN_ATTEMPTS: usize = 3;

/// Open and lock the file at `path`, which was found there; `None` if it was
/// removed before the lock was taken (or replaced by another file): the lock
/// then holds a file nobody will find, and the caller looks again.
fn lock_existing(path: &Path) -> Result<Option<LockedBackend>, StoreError> {
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io(path, e)),
    };
    let opened = file.metadata().map_err(|e| StoreError::io(path, e))?;
    #[cfg(test)]
    at_step("found");
    let locked = LockedFile::lock(path, file)?;
    match fs::metadata(path) {
        Ok(now) if same_file(&opened, &now) => Ok(Some(locked)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io(path, e)),
    }
}

/// Whether two looks at a path saw the same file.
#[cfg(unix)]
fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// Whether two looks at a path saw the same file (without inode numbers, as
/// far as can be told: where an open file cannot be removed, it is).
#[cfg(not(unix))]
fn same_file(_: &fs::Metadata, _: &fs::Metadata) -> bool {
    true
}

/// Remove the checkpoint this open created, after the open failed; a
/// removal that fails is logged (the file is a valid, empty checkpoint).
fn remove_created(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => tracing::info!(
            checkpoint = %path.display(),
            "removed the checkpoint this failed open created"
        ),
        Err(e) => tracing::warn!(
            checkpoint = %path.display(),
            error = %e,
            "cannot remove the checkpoint this failed open created"
        ),
    }
}

/// Open a checkpoint this open has locked: read and check it without
/// writing, then open it for writing, all through the one lock.
fn open_locked(
    path: PathBuf,
    file: LockedBackend,
    created: bool,
    check: impl FnOnce(&Path, &Snapshot) -> Result<(), StoreError>,
) -> Result<(Store, Snapshot), StoreError> {
    #[cfg(test)]
    at_step("checking");
    let snapshot = check_without_writing(&path, &file)?;
    check(&path, &snapshot)?;
    #[cfg(test)]
    at_step("opening");

    let mut builder = Builder::new();
    let shown = path.display().to_string();
    builder.set_repair_callback(move |session| {
        tracing::warn!(
            checkpoint = %shown,
            progress = session.progress(),
            "repairing the checkpoint"
        );
    });
    let again = file.clone();
    let failed_flushes = file.failed_flushes();
    // The file is not empty (it passed the check), so this opens it and initialises nothing.
    let db = unpanicking(&path, "opening", || builder.create_with_backend(file))?
        .map_err(|e| StoreError::from_redb_database(&path, e))?;
    let reopen: Reopen = Box::new(move || Builder::new().create_with_backend(again.clone()));
    let store = Store::with_database(path, db, reopen, failed_flushes, created);
    // Checked again (one key), at no cost: the lock keeps redb handles out, not a writer
    // that takes no lock.
    store.with_db("reading", |path, db| {
        let txn = db
            .begin_read()
            .map_err(|e| StoreError::from_redb_transaction(path, e))?;
        check_schema(path, schema_version(path, &txn)?)
    })?;
    Ok((store, snapshot))
}

/// Read and check the whole, locked file ([`read_snapshot`]) without writing a byte of it:
/// through a read-only open, or, for a file that needs recovery (which a read-only open
/// refuses), through a recovery in memory.
fn check_without_writing(path: &Path, file: &LockedBackend) -> Result<Snapshot, StoreError> {
    let read_only = || Builder::new().open_read_only_with_backend(file.clone());
    match unpanicking(path, "opening", read_only)? {
        Ok(read_only) => {
            let snapshot = unpanicking(path, "reading", || read_snapshot(path, &read_only));
            let closed = unpanicking(path, "closing", || read_only.close())
                .and_then(|r| r.map_err(|e| StoreError::from_redb_database(path, e)));
            if let Err(e) = closed {
                tracing::debug!(error = %e, "closing the read-only look at the checkpoint");
            }
            snapshot?
        }
        Err(redb::DatabaseError::RepairAborted) => {
            tracing::warn!(
                checkpoint = %path.display(),
                "the checkpoint was not closed cleanly; checking it before recovering it"
            );
            check_unclean(path, file)
        }
        Err(e) => Err(StoreError::from_redb_database(path, e)),
    }
}

/// [`check_without_writing`] for a file that was not closed cleanly: redb recovers it over
/// a [`Scratch`], which keeps every write in memory, and it is read there.
fn check_unclean(path: &Path, file: &LockedBackend) -> Result<Snapshot, StoreError> {
    let scratch = Scratch::new(file.clone()).map_err(|e| StoreError::io(path, e))?;
    let db = unpanicking(path, "recovering", || {
        Builder::new().create_with_backend(scratch)
    })?
    .map_err(|e| StoreError::from_redb_database(path, e))?;
    let snapshot = unpanicking(path, "reading", || read_snapshot(path, &db));
    if let Err(e) = unpanicking(path, "closing", || drop(db)) {
        tracing::debug!(error = %e, "closing the in-memory recovery of the checkpoint");
    }
    snapshot?
}

/// A test's hook, run at a step of an open (see [`AT_STEP`]).
#[cfg(test)]
type Hook = Box<dyn FnMut(&str)>;

#[cfg(test)]
thread_local! {
    /// Test seam: run in the opening thread at each step of an open, with its
    /// name: "found" ([`lock_existing`] has opened a file it found, and not
    /// locked it yet); then, while the lock is held ([`open_locked`]),
    /// "checking" (before the check) and "opening" (before the writable open).
    static AT_STEP: std::cell::RefCell<Option<Hook>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
fn at_step(step: &str) {
    // Taken out while it runs, so that an open it makes runs none.
    if let Some(mut hook) = AT_STEP.with_borrow_mut(Option::take) {
        hook(step);
        AT_STEP.set(Some(hook));
    }
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

/// The schema version stamped in the file.
fn schema_version(path: &Path, txn: &ReadTransaction) -> Result<u32, StoreError> {
    let Some(meta) = open_read(path, txn, META)? else {
        return Err(StoreError::corrupt(
            path,
            "a redb file without table `meta`, so not a Flotilla checkpoint",
        ));
    };
    match meta
        .get(SCHEMA_KEY)
        .map_err(|e| StoreError::from_redb_storage(path, e))?
    {
        Some(v) => Ok(v.value()),
        None => Err(StoreError::corrupt(
            path,
            "table `meta` has no key \"schema_version\"",
        )),
    }
}

/// Refuse a schema this build cannot read.
fn check_schema(path: &Path, found: u32) -> Result<(), StoreError> {
    match found.cmp(&SCHEMA_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(StoreError::SchemaTooNew {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        }),
        std::cmp::Ordering::Less => Err(StoreError::corrupt(
            path,
            format!(
                "schema version {found} was never written by Flotilla (this build reads {SCHEMA_VERSION})"
            ),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use flotilla_core::{ApiType, ApplicationSpec, DeploymentSpec};

    use super::*;

    const NEEDLE: &str = "needle-app";

    fn record(name: &str, generation: u64) -> AppRecord {
        AppRecord {
            spec: ApplicationSpec::builder(name)
                .deployment(DeploymentSpec::builder("front", "test::Echo"))
                .build()
                .unwrap(),
            generation,
            deleting: false,
            api_type: ApiType::Imperative,
            config: None,
            deployed_at: None,
        }
    }

    /// A checkpoint holding application [`NEEDLE`], whose leaf page (the one leaf holding
    /// the name) is then damaged by writing `patch` at `offset` of the page; and a store
    /// opened on it for writing without the open's checks, as if the damage had happened
    /// after the open (through the API, the open's checks read every page first).
    fn store_on_a_damaged_leaf(offset: usize, patch: &[u8]) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let (store, _) = Store::open(&path).unwrap();
        let mut batch = Batch::new();
        batch.put_app(&record(NEEDLE, 1)).unwrap();
        store.commit(&batch).unwrap();
        drop(store);

        let mut bytes = fs::read(&path).unwrap();
        let leaves: Vec<usize> = (0..bytes.len() / 4096)
            .map(|i| i * 4096)
            .filter(|&at| {
                bytes[at] == 1
                    && bytes[at..at + 4096]
                        .windows(NEEDLE.len())
                        .any(|w| w == NEEDLE.as_bytes())
            })
            .collect();
        assert_eq!(leaves.len(), 1, "{leaves:?}");
        bytes[leaves[0] + offset..][..patch.len()].copy_from_slice(patch);
        fs::write(&path, &bytes).unwrap();

        let db = Builder::new().open(&path).unwrap();
        let reopen = path.clone();
        let reopen: Reopen = Box::new(move || Builder::new().open(&reopen));
        (
            dir,
            Store::with_database(path, db, reopen, Arc::default(), true),
        )
    }

    /// An in-memory file whose writes fail while `failing` is set (a full disk),
    /// and whose `fail_sync`-th flush from now fails (0: none).
    #[derive(Debug, Clone, Default)]
    struct Flaky {
        bytes: std::sync::Arc<redb::backends::InMemoryBackend>,
        failing: std::sync::Arc<AtomicBool>,
        fail_sync: std::sync::Arc<std::sync::atomic::AtomicU32>,
        /// Counted as a store's backend counts them.
        failed_flushes: Arc<AtomicU64>,
        /// The next flush panics (as redb may on a damaged page).
        panic_sync: std::sync::Arc<AtomicBool>,
    }

    impl redb::StorageBackend for Flaky {
        fn len(&self) -> Result<u64, io::Error> {
            self.bytes.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
            self.bytes.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), io::Error> {
            self.full()?;
            self.bytes.set_len(len)
        }
        fn sync_data(&self) -> Result<(), io::Error> {
            let synced = self.sync();
            if synced.is_err() {
                self.failed_flushes.fetch_add(1, Ordering::SeqCst);
            }
            synced
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
            self.full()?;
            self.bytes.write(offset, data)
        }
        fn close(&self) -> Result<(), io::Error> {
            Ok(())
        }
    }

    impl Flaky {
        fn sync(&self) -> Result<(), io::Error> {
            assert!(
                !self.panic_sync.swap(false, Ordering::SeqCst),
                "a flush panicked"
            );
            self.full()?;
            let n = self.fail_sync.load(Ordering::SeqCst);
            if n > 0 {
                self.fail_sync.store(n - 1, Ordering::SeqCst);
                if n == 1 {
                    return Err(io::Error::other("flush failed"));
                }
            }
            redb::StorageBackend::sync_data(&*self.bytes)
        }

        fn full(&self) -> Result<(), io::Error> {
            if self.failing.load(Ordering::SeqCst) {
                Err(io::Error::from(io::ErrorKind::StorageFull))
            } else {
                Ok(())
            }
        }
    }

    /// Commit one application record named `name`.
    fn put(store: &Store, name: &str) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        batch.put_app(&record(name, 1)).unwrap();
        store.commit(&batch)
    }

    /// The names of the applications the store holds.
    fn app_names(store: &Store) -> Vec<String> {
        let snapshot = store.load().unwrap();
        snapshot
            .apps
            .iter()
            .map(|r| r.spec.name.to_string())
            .collect()
    }

    /// A store over a new in-memory [`Flaky`] file, and the file.
    fn flaky_store() -> (Flaky, Store) {
        let file = Flaky::default();
        let path = PathBuf::from("flaky.redb");
        initialise(&path, file.clone()).unwrap();
        let open = {
            let file = file.clone();
            move || Builder::new().create_with_backend(file.clone())
        };
        let db = open().unwrap();
        let flushes = file.failed_flushes.clone();
        (
            file,
            Store::with_database(path, db, Box::new(open), flushes, true),
        )
    }

    /// A commit whose flush fails may still be in the file when the failed
    /// flush was its last (redb wrote the header that names it first): that
    /// one is `CommitUnsettled`, and no other failed commit is in the file.
    /// Either way the next commit works, over the file as it is.
    #[test]
    fn only_an_unsettled_commit_may_be_in_the_file_after_it_failed() {
        let mut unsettled_and_written = 0;
        for k in 1..=4 {
            let (file, store) = flaky_store();
            put(&store, "before").unwrap();
            file.fail_sync.store(k, Ordering::SeqCst);
            let result = put(&store, "ghost");
            file.fail_sync.store(0, Ordering::SeqCst);
            let written = app_names(&store).contains(&"ghost".to_owned());
            match &result {
                Ok(()) => assert!(written, "flush {k}"),
                Err(StoreError::CommitUnsettled { .. }) => {
                    unsettled_and_written += usize::from(written);
                }
                Err(e) => assert!(!written, "flush {k}: {e} and yet it is in the file"),
            }
            put(&store, "after").unwrap();
            assert!(app_names(&store).contains(&"after".to_owned()));
        }
        assert!(
            unsettled_and_written > 0,
            "no failed flush left its commit in the file: the case this checks did not occur"
        );
    }

    /// A commit in which redb panicked may be in the file (unsettled), and
    /// leaves redb's handle unusable (it drops its allocator state): the next
    /// commit opens the file again and works.
    #[test]
    fn a_commit_that_panicked_is_unsettled_and_the_next_one_works() {
        let (file, store) = flaky_store();
        put(&store, "before").unwrap();
        file.panic_sync.store(true, Ordering::SeqCst);
        let err = put(&store, "panicked").unwrap_err();
        assert!(matches!(err, StoreError::CommitUnsettled { .. }), "{err:?}");
        put(&store, "after").unwrap();
        let names = app_names(&store);
        assert!(names.contains(&"after".to_owned()), "{names:?}");
    }

    /// A write that fails on I/O (the disk was full) fails its own call
    /// alone: once the disk has room, the next commit works, and the store
    /// holds every commit that succeeded.
    #[test]
    fn an_io_error_fails_its_commit_alone() {
        let (file, store) = flaky_store();
        put(&store, "before").unwrap();
        file.failing.store(true, Ordering::SeqCst);
        let err = put(&store, "lost").unwrap_err();
        assert!(err.is_io_failure(), "{err:?}");
        file.failing.store(false, Ordering::SeqCst);
        put(&store, "after").unwrap();
        let mut names = app_names(&store);
        names.sort();
        assert_eq!(names, ["after", "before"]);
        assert_eq!(store.counters().commits, 2);
    }

    /// Damage to a leaf page on which redb panics: (what, offset in the page, bytes).
    const LEAF_DAMAGE: [(&str, usize, &[u8]); 3] = [
        ("entry count", 2, &[0xff, 0xff]),
        ("first key's end", 4, &[0xff, 0xff, 0, 0]),
        ("first value's end", 8, &[0xff, 0xff, 0xff, 0x7f]),
    ];

    #[test]
    fn a_damaged_page_met_by_load_is_corrupt_not_a_panic() {
        for (what, offset, patch) in LEAF_DAMAGE {
            let (_dir, store) = store_on_a_damaged_leaf(offset, patch);
            let err = store.load().unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { .. }), "{what}: {err:?}");
            let message = err.to_string();
            assert!(
                message.contains(&store.path().display().to_string())
                    && message.contains("redb failed reading the file"),
                "{what}: {message}"
            );
        }
    }

    #[test]
    fn a_damaged_page_met_by_commit_is_corrupt_not_a_panic() {
        for (what, offset, patch) in LEAF_DAMAGE {
            let (_dir, store) = store_on_a_damaged_leaf(offset, patch);
            let mut batch = Batch::new();
            batch.put_app(&record(NEEDLE, 2)).unwrap();
            batch.put_app(&record("another", 1)).unwrap();
            let err = store.commit(&batch).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { .. }), "{what}: {err:?}");
            assert!(
                err.to_string().contains("redb failed writing the file"),
                "{what}: {err}"
            );
            assert_eq!(store.counters().commits, 0, "{what}");
            // The store is still usable, and says so again.
            assert!(
                matches!(store.load(), Err(StoreError::Corrupt { .. })),
                "{what}"
            );
        }
    }

    /// Open `path` while the hook opens it again at every step under the lock: each of
    /// those opens must be refused as `Locked`. Returns the store and the steps the hook
    /// saw.
    fn open_while_another_tries(path: &Path) -> (Store, Vec<String>) {
        let steps = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let (other, seen) = (path.to_path_buf(), steps.clone());
        AT_STEP.set(Some(Box::new(move |step| {
            if step == "found" {
                return;
            }
            let refused = Store::open(&other);
            assert!(
                matches!(refused, Err(StoreError::Locked { .. })),
                "{step}: {refused:?}"
            );
            seen.borrow_mut().push(step.to_owned());
        })));
        let opened = Store::open(path);
        AT_STEP.set(None);
        let store = opened.unwrap().0;
        (store, steps.take())
    }

    /// The names in `dir`.
    fn listing(dir: &Path) -> Vec<OsString> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_open_that_fails_after_creating_the_file_leaves_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        // An open whose caller's check refuses the file.
        let refused_open = || {
            let refused = Store::open_checked(&path, |path, _| {
                Err(StoreError::Injected {
                    path: path.to_owned(),
                })
            });
            assert!(
                matches!(refused, Err(StoreError::Injected { .. })),
                "{refused:?}"
            );
        };
        refused_open();
        assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));

        // A file that was there before is left as it was.
        drop(Store::open(&path).unwrap());
        let before = fs::read(&path).unwrap();
        refused_open();
        assert_eq!(fs::read(&path).unwrap(), before);
    }

    #[test]
    fn an_open_whose_file_is_removed_before_it_locks_it_creates_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let first = Store::open(&path).unwrap().0;
        let mut batch = Batch::new();
        batch.put_app(&record(NEEDLE, 1)).unwrap();
        first.commit(&batch).unwrap();
        // Closed and removed between the open's look and its lock, as a failed start
        // that created it removes it.
        let removed = path.clone();
        let mut held = Some(first);
        let steps = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let seen = steps.clone();
        AT_STEP.set(Some(Box::new(move |step| {
            seen.borrow_mut().push(step.to_owned());
            if let Some(store) = held.take() {
                fs::remove_file(&removed).unwrap();
                store.close();
            }
        })));
        let opened = Store::open(&path);
        AT_STEP.set(None);
        let (store, snapshot) = opened.unwrap();
        // It locked the removed file, found it gone, and created the path anew: it does
        // not run on a file nobody can find.
        assert_eq!(steps.take(), ["found", "checking", "opening"]);
        assert!(snapshot.apps.is_empty());
        assert!(store.created());
        store.commit(&batch).unwrap();
        drop(store);
        let (store, snapshot) = Store::open(&path).unwrap();
        assert_eq!(snapshot.apps.len(), 1);
        assert!(!store.created());
    }

    #[test]
    fn another_open_is_locked_out_from_before_the_check_to_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let both = ["checking", "opening"];

        // A new file, created by the open.
        let (store, steps) = open_while_another_tries(&path);
        assert_eq!(steps, both);
        let mut batch = Batch::new();
        batch.put_app(&record(NEEDLE, 1)).unwrap();
        store.commit(&batch).unwrap();
        // Copied while a writer has it: a file that was not closed cleanly.
        let unclean = dir.path().join("unclean.redb");
        fs::copy(&path, &unclean).unwrap();
        drop(store);

        // A clean file, checked read-only. Closing the store releases the lock at once.
        let (store, steps) = open_while_another_tries(&path);
        assert_eq!(steps, both);
        store.close();
        drop(Store::open(&path).unwrap());
        drop(store);

        // An unclean one, checked in memory, then recovered.
        assert!(matches!(
            Builder::new().open_read_only(&unclean),
            Err(redb::DatabaseError::RepairAborted)
        ));
        let (store, steps) = open_while_another_tries(&unclean);
        assert_eq!(steps, both);
        assert_eq!(store.load().unwrap().apps.len(), 1);

        // The lock goes with the store.
        drop(store);
        assert_eq!(Store::open(&unclean).unwrap().1.apps.len(), 1);
        let listing: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(listing.len(), 2, "{listing:?}");
    }

    #[test]
    fn the_directory_of_a_bare_file_name_is_the_current_one() {
        assert_eq!(dir_of(Path::new("c.redb")), Path::new("."));
        assert_eq!(dir_of(Path::new("a/c.redb")), Path::new("a"));
        assert_eq!(dir_of(Path::new("/c.redb")), Path::new("/"));
    }

    #[test]
    fn schema_versions_other_than_ours_are_refused() {
        let path = Path::new("c.redb");
        check_schema(path, SCHEMA_VERSION).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            check_schema(path, SCHEMA_VERSION + 1),
            Err(StoreError::SchemaTooNew { found, supported, .. })
                if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION
        ));
        assert!(matches!(
            check_schema(path, 0),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
