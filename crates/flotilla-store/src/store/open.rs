//! Opening the file: create a missing one (built under a temporary name,
//! locked, linked into place), lock an existing one, read and check it
//! without writing, then open it for writing, all through the one lock.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Builder, ReadableDatabase};

use super::read::{check_schema, read_snapshot, schema_version};
use super::{Reopen, Store, begin_write, unpanicking};
use crate::lock::{LockedBackend, LockedFile};
use crate::scratch::Scratch;
use crate::tables::{APPS, CONFIG, DEPLOYMENTS, META, SCHEMA_KEY};
use crate::{SCHEMA_VERSION, Snapshot, StoreError};

/// Create a missing checkpoint: build it under a temporary name, locked, then link it into
/// place. Returns the new file, still locked, to be opened; `None` if another opener created
/// it first (its file is to be opened, and locked, as any existing one).
pub(super) fn create(path: &Path) -> Result<Option<LockedBackend>, StoreError> {
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
pub(super) fn built(path: &Path, file: File) -> Result<LockedBackend, StoreError> {
    let file = LockedFile::lock(path, file)?;
    initialise_locked(path, &file)?;
    Ok(file)
}

/// [`initialise`] the new, empty, locked `file` (a panic of redb caught).
pub(super) fn initialise_locked(path: &Path, file: &LockedBackend) -> Result<(), StoreError> {
    unpanicking(path, "creating", || initialise(path, file.clone()))?
}

/// Create a file that must not exist yet, for reading and writing. On Unix it is made
/// with mode 0600 (before the umask) from the start, before anything is written: a
/// checkpoint holds init args and user configs.
pub(super) fn create_new(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// The directory holding `path`: its parent, or "." for a bare file name.
pub(super) fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Make a new directory entry durable.
pub(super) fn sync_dir(path: &Path, dir: &Path) -> Result<(), StoreError> {
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
pub(super) fn initialise(path: &Path, file: impl redb::StorageBackend) -> Result<(), StoreError> {
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
pub(super) const OPEN_ATTEMPTS: usize = 3;

/// Open and lock the file at `path`, which was found there; `None` if it was
/// removed before the lock was taken (or replaced by another file): the lock
/// then holds a file nobody will find, and the caller looks again.
pub(super) fn lock_existing(path: &Path) -> Result<Option<LockedBackend>, StoreError> {
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
pub(super) fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// Whether two looks at a path saw the same file (without inode numbers, as
/// far as can be told: where an open file cannot be removed, it is).
#[cfg(not(unix))]
pub(super) fn same_file(_: &fs::Metadata, _: &fs::Metadata) -> bool {
    true
}

/// Remove the checkpoint this open created, after the open failed; a
/// removal that fails is logged (the file is a valid, empty checkpoint).
pub(super) fn remove_created(path: &Path) {
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
pub(super) fn open_locked(
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
pub(super) fn check_without_writing(
    path: &Path,
    file: &LockedBackend,
) -> Result<Snapshot, StoreError> {
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
pub(super) fn check_unclean(path: &Path, file: &LockedBackend) -> Result<Snapshot, StoreError> {
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
pub(super) type Hook = Box<dyn FnMut(&str)>;

#[cfg(test)]
thread_local! {
    /// Test seam: run in the opening thread at each step of an open, with its
    /// name: "found" ([`lock_existing`] has opened a file it found, and not
    /// locked it yet); then, while the lock is held ([`open_locked`]),
    /// "checking" (before the check) and "opening" (before the writable open).
    pub(super) static AT_STEP: std::cell::RefCell<Option<Hook>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
pub(super) fn at_step(step: &str) {
    // Taken out while it runs, so that an open it makes runs none.
    if let Some(mut hook) = AT_STEP.with_borrow_mut(Option::take) {
        hook(step);
        AT_STEP.set(Some(hook));
    }
}
