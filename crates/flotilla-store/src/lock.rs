//! The store's lock on its file: taken once, before anything reads the file, and held by
//! every redb open that follows until the store closes.
//!
//! redb locks the file in each open by itself: a read-only open takes shared locks over
//! one list of byte ranges, a writable open exclusive locks over another, each in its own
//! order. Two such opens of one file can refuse each other both: the read-only one holds
//! its first range (the protocol's generation byte), the writable one takes its first
//! (the tail of the lock bytes), and each then finds its next range held by the other
//! ([`redb::DatabaseError::DatabaseAlreadyOpen`]). A store that checked the file read-only
//! while another opener was past its check and opening for writing could therefore fail,
//! and the other opener with it, though neither file was held by anyone else.
//!
//! So the store takes the lock itself: the whole file, exclusively, through redb's own
//! [`FileBackend`] (on Linux and Apple platforms an open-file-description lock, on Windows
//! `LockFileEx`, elsewhere `flock`), a single try that either succeeds or finds another
//! holder. Every redb open of that store then runs over a [`LockedBackend`] on the same
//! handle, which reports that lock as the whole-storage lock redb asks for (redb's second
//! level of backend locking: whole-storage locks only, which is all its default
//! `ExclusiveWriter` mode needs) and does not release it when redb closes it. The lock is
//! released when the last such backend is dropped: when the store closes, or when an open
//! that refused the file returns.
//!
//! Another opener, a Flotilla instance or any redb handle (4.3 or later) in either mode,
//! conflicts with that lock at its first lock and is refused
//! ([`StoreError::Locked`]); nothing it does can overlap the check or the writable open.

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use crate::StoreError;

/// A file locked whole and exclusively, the lock held until this is dropped.
pub(crate) struct LockedFile {
    /// The file: its reads and writes, and the lock (taken through it, recorded in it).
    file: FileBackend,
    /// Flushes (`sync_data`) that failed, ever: a commit that fails in one
    /// may already be in the file (see `Store::commit`).
    failed_flushes: Arc<AtomicU64>,
}

impl fmt::Debug for LockedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockedFile").finish_non_exhaustive()
    }
}

impl LockedFile {
    /// Lock `file`, the file at `path`, which must be open for reading and writing (an
    /// exclusive lock needs a writable handle). Another handle holding any lock on it is
    /// [`StoreError::Locked`].
    ///
    /// On a platform or file system without file locks, the file is used unlocked (as
    /// redb itself does there), with a warning: nothing then stops a second instance.
    pub(crate) fn lock(path: &Path, file: File) -> Result<LockedBackend, StoreError> {
        let file = FileBackend::new(file).map_err(|e| StoreError::from_redb_database(path, e))?;
        match file.try_lock_range(Bound::Unbounded, Bound::Unbounded) {
            Ok(true) => {}
            Ok(false) => {
                return Err(StoreError::Locked {
                    path: path.to_path_buf(),
                });
            }
            Err(BackendError::Unsupported) => tracing::warn!(
                checkpoint = %path.display(),
                "file locks are not supported here: nothing stops a second instance from opening the checkpoint"
            ),
            Err(e) => return Err(StoreError::io(path, io::Error::from(e))),
        }
        Ok(LockedBackend {
            file: Arc::new(LockedFile {
                file,
                failed_flushes: Arc::default(),
            }),
        })
    }
}

impl Drop for LockedFile {
    fn drop(&mut self) {
        // Closing the handle would release the lock too; this says so if the release fails.
        if let Err(e) = self.file.close() {
            tracing::debug!(error = %e, "releasing the checkpoint's lock");
        }
    }
}

/// A redb storage backend on a [`LockedFile`]: the file's reads and writes, and its lock
/// as a whole-storage lock that is already held. Clones share the file and the lock.
#[derive(Debug, Clone)]
pub(crate) struct LockedBackend {
    file: Arc<LockedFile>,
}

impl LockedBackend {
    /// The count of the file's failed flushes, shared.
    pub(crate) fn failed_flushes(&self) -> Arc<AtomicU64> {
        self.file.failed_flushes.clone()
    }
}

/// Whether the range is the whole storage, the only lock this backend offers.
fn is_whole_storage(start: Bound<u64>, end: Bound<u64>) -> bool {
    matches!(start, Bound::Unbounded | Bound::Included(0)) && end == Bound::Unbounded
}

/// The whole storage is held already; other ranges are not offered, so redb asks for the
/// whole storage instead.
fn held(start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
    if is_whole_storage(start, end) {
        Ok(())
    } else {
        Err(BackendError::Unsupported)
    }
}

impl StorageBackend for LockedBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let synced = self.file.file.sync_data();
        if synced.is_err() {
            self.file.failed_flushes.fetch_add(1, Ordering::Relaxed);
        }
        synced
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.file.file.write(offset, data)
    }

    /// Releases nothing: the lock outlives each redb open over it, and goes with the last
    /// backend on the file.
    fn close(&self) -> Result<(), io::Error> {
        Ok(())
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        held(start, end).map(|()| true)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        held(start, end).map(|()| true)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        held(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        held(start, end)
    }

    /// The lock stays until the last backend goes; redb unlocking what it was granted
    /// changes nothing.
    fn unlock_range(&self, _start: Bound<u64>, _end: Bound<u64>) -> Result<(), BackendError> {
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::fs::OpenOptions;

    use super::*;

    fn open(path: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    #[test]
    fn the_lock_excludes_another_handle_until_the_last_backend_goes() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path();
        let first = LockedFile::lock(path, open(path)).unwrap();
        let second = first.clone();
        // redb closing one open over it releases nothing.
        first.close().unwrap();
        drop(first);
        assert!(matches!(
            LockedFile::lock(path, open(path)),
            Err(StoreError::Locked { .. })
        ));
        // Nor can redb take the file from another handle, for writing or for reading.
        assert!(matches!(
            redb::Database::create(path),
            Err(redb::DatabaseError::DatabaseAlreadyOpen)
        ));
        assert!(matches!(
            redb::ReadOnlyDatabase::open(path),
            Err(redb::DatabaseError::DatabaseAlreadyOpen)
        ));
        drop(second);
        let again = LockedFile::lock(path, open(path)).unwrap();
        drop(again);
    }

    #[test]
    fn only_the_whole_storage_is_offered() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let backend = LockedFile::lock(file.path(), open(file.path())).unwrap();
        assert!(
            backend
                .try_lock_range(Bound::Unbounded, Bound::Unbounded)
                .unwrap()
        );
        assert!(
            backend
                .try_lock_shared_range(Bound::Included(0), Bound::Unbounded)
                .unwrap()
        );
        assert!(matches!(
            backend.try_lock_range(Bound::Included(1 << 62), Bound::Unbounded),
            Err(BackendError::Unsupported)
        ));
        assert!(matches!(
            backend.lock_shared_range(Bound::Unbounded, Bound::Included(7)),
            Err(BackendError::Unsupported)
        ));
    }
}
