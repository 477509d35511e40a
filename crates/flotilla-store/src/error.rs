//! The store's one error type, and the mapping from redb's errors onto it.

use std::io;
use std::path::{Path, PathBuf};

/// The error behind a [`StoreError::Corrupt`] finding, when one is behind it: a
/// [`redb::Error`], an [`io::Error`], an [`rmp_serde::decode::Error`] or a
/// [`flotilla_core::Error`]; downcast it to see which.
pub type CorruptCause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why the store refused or failed an operation.
///
/// Every variant that concerns the file names its path. None of them but
/// [`CommitUnsettled`](Self::CommitUnsettled) is returned after the file was modified by
/// the failed call: an open that refuses a file (as `Corrupt`, `SchemaTooNew`,
/// `NotAFile`, `Locked`) wrote nothing, not even to a file that was not closed cleanly
/// (see [`Store::open`](crate::Store::open)), and a commit that fails before it ends is
/// rolled back.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another Flotilla instance (or another `Store` in this process) has the file open.
    #[error("checkpoint {}: is held by another Flotilla instance (the file is locked)", path.display())]
    Locked {
        /// The checkpoint file.
        path: PathBuf,
    },
    /// The file is not a redb file, is corrupt (redb failed or panicked reading it), is not
    /// a Flotilla checkpoint, or holds a record that does not decode or is not valid (the
    /// reason names the table and key).
    #[error(
        "checkpoint {}: corrupt or not a Flotilla checkpoint: {reason}; the file was left as it is",
        shown(path)
    )]
    Corrupt {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong, actor_names the table and key where there is one.
        reason: String,
        /// The error that revealed it (redb's, rmp-serde's, a failed validation), if an
        /// error did; `None` when the finding is the store's own (a missing table, say).
        #[source]
        source: Option<CorruptCause>,
    },
    /// The file was written by a newer Flotilla with a schema this build cannot read.
    #[error(
        "checkpoint {}: schema version {found} is newer than the version {supported} this build supports; the file was left as it is",
        path.display()
    )]
    SchemaTooNew {
        /// The checkpoint file.
        path: PathBuf,
        /// The version stamped in the file.
        found: u32,
        /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
        supported: u32,
    },
    /// The path names something other than a regular file (a FIFO, a socket, a device, a
    /// directory); it was not opened, so a FIFO cannot block the open.
    #[error("checkpoint {}: is {kind}, not a regular file", path.display())]
    NotAFile {
        /// The checkpoint path.
        path: PathBuf,
        /// What the path names instead.
        kind: FileKind,
    },
    /// The operating system refused an operation on the file.
    #[error("checkpoint {}: I/O error: {source}", path.display())]
    Io {
        /// The checkpoint file.
        path: PathBuf,
        /// The error from the operating system.
        source: io::Error,
    },
    /// The commit failed because [`Store::fail_next_commit`](crate::Store::fail_next_commit)
    /// asked it to; nothing was written.
    #[error("checkpoint {}: commit failed on purpose (fail_next_commit); nothing was written", path.display())]
    Injected {
        /// The checkpoint file.
        path: PathBuf,
    },
    /// The store was closed (by `Store::close`, at shutdown); nothing was read or
    /// written.
    #[error("checkpoint {}: the store is closed", path.display())]
    Closed {
        /// The checkpoint file.
        path: PathBuf,
    },
    /// A value could not be encoded as MessagePack; the batch was not changed.
    #[error("cannot encode {what} as MessagePack: {source}")]
    Encode {
        /// What was being encoded, e.g. "application record 'shop'".
        what: String,
        /// rmp-serde's error.
        #[source]
        source: rmp_serde::encode::Error,
    },
    /// The commit failed as it ended (redb's last flush, or what follows it):
    /// the transaction may or may not be in the file, as the next read of it
    /// (after a crash, or the store's next call, which opens the file again)
    /// will tell. Its caller must not take it as written nor as not written.
    #[error(
        "checkpoint {}: the commit failed as it ended and may or may not be in the file: {source}",
        path.display()
    )]
    CommitUnsettled {
        /// The checkpoint file.
        path: PathBuf,
        /// How it failed (an I/O error, or a panic of redb as `Corrupt`).
        #[source]
        source: Box<StoreError>,
    },
    /// Any other error from redb.
    #[error("checkpoint {}: storage error: {source}", path.display())]
    Storage {
        /// The checkpoint file.
        path: PathBuf,
        /// redb's error.
        #[source]
        source: redb::Error,
    },
}

/// The path for a message; empty for a value decoded from a [`Snapshot`](crate::Snapshot).
fn shown(path: &Path) -> String {
    if path.as_os_str().is_empty() {
        "(loaded snapshot)".to_owned()
    } else {
        path.display().to_string()
    }
}

/// What a checkpoint path names when it is not a regular file ([`StoreError::NotAFile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A directory.
    Directory,
    /// A FIFO (named pipe): opening it would wait for a writer.
    Fifo,
    /// A Unix domain socket.
    Socket,
    /// A character device, such as `/dev/null`.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything else that is not a regular file.
    Other,
}

impl FileKind {
    /// What `file_type` is, or `None` for a regular file.
    pub(crate) fn of(file_type: std::fs::FileType) -> Option<FileKind> {
        if file_type.is_file() {
            return None;
        }
        if file_type.is_dir() {
            return Some(FileKind::Directory);
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if file_type.is_fifo() {
                return Some(FileKind::Fifo);
            }
            if file_type.is_socket() {
                return Some(FileKind::Socket);
            }
            if file_type.is_char_device() {
                return Some(FileKind::CharDevice);
            }
            if file_type.is_block_device() {
                return Some(FileKind::BlockDevice);
            }
        }
        Some(FileKind::Other)
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a FIFO (named pipe)",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Other => "a special file",
        })
    }
}

impl StoreError {
    /// A finding of the store's own, with no error behind it.
    pub(crate) fn corrupt(path: &Path, reason: impl Into<String>) -> Self {
        StoreError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.into(),
            source: None,
        }
    }

    /// A finding revealed by `source`, which it keeps.
    pub(crate) fn corrupt_because(
        path: &Path,
        reason: impl Into<String>,
        source: impl Into<CorruptCause>,
    ) -> Self {
        StoreError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.into(),
            source: Some(source.into()),
        }
    }

    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    fn storage(path: &Path, source: impl Into<redb::Error>) -> Self {
        StoreError::Storage {
            path: path.to_path_buf(),
            source: source.into(),
        }
    }

    /// Whether this is an I/O failure of the file (or redb's refusal after one), after
    /// which redb's handle must be opened again.
    pub(crate) fn is_io_failure(&self) -> bool {
        matches!(
            self,
            StoreError::Io { .. }
                | StoreError::Storage {
                    source: redb::Error::PreviousIo,
                    ..
                }
        )
    }

    /// redb's storage-layer error.
    pub(crate) fn from_redb_storage(path: &Path, err: redb::StorageError) -> Self {
        match err {
            redb::StorageError::Corrupted(ref reason) => {
                let reason = reason.clone();
                Self::corrupt_because(path, reason, redb::Error::from(err))
            }
            // redb reports "not a redb file" and short reads as I/O errors of these kinds.
            redb::StorageError::Io(ref e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
                ) =>
            {
                let reason = format!("not a readable redb database: {e}");
                Self::corrupt_because(path, reason, redb::Error::from(err))
            }
            redb::StorageError::Io(source) => Self::io(path, source),
            other => Self::storage(path, other),
        }
    }

    /// redb's error from opening a database.
    pub(crate) fn from_redb_database(path: &Path, err: redb::DatabaseError) -> Self {
        match err {
            redb::DatabaseError::DatabaseAlreadyOpen
            | redb::DatabaseError::LockProtocolMismatch => StoreError::Locked {
                path: path.to_path_buf(),
            },
            redb::DatabaseError::Storage(e) => Self::from_redb_storage(path, e),
            other => Self::storage(path, other),
        }
    }

    /// redb's error from beginning a transaction.
    pub(crate) fn from_redb_transaction(path: &Path, err: redb::TransactionError) -> Self {
        match err {
            redb::TransactionError::Storage(e) => Self::from_redb_storage(path, e),
            other => Self::storage(path, other),
        }
    }

    /// redb's error from opening a table: a table of the wrong type means the file is not
    /// laid out as this schema says.
    pub(crate) fn from_redb_table(path: &Path, err: redb::TableError) -> Self {
        match err {
            redb::TableError::Storage(e) => Self::from_redb_storage(path, e),
            e @ (redb::TableError::TableTypeMismatch { .. }
            | redb::TableError::TableIsMultimap(_)
            | redb::TableError::TableIsNotMultimap(_)
            | redb::TableError::TypeDefinitionChanged { .. }) => {
                Self::corrupt_because(path, e.to_string(), redb::Error::from(e))
            }
            other => Self::storage(path, other),
        }
    }

    /// redb's error from committing.
    pub(crate) fn from_redb_commit(path: &Path, err: redb::CommitError) -> Self {
        match err {
            redb::CommitError::Storage(e) => Self::from_redb_storage(path, e),
            other => Self::storage(path, other),
        }
    }

    /// redb's error from setting a transaction's durability.
    pub(crate) fn from_redb_durability(path: &Path, err: redb::SetDurabilityError) -> Self {
        Self::storage(path, err)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_file() {
        let path = Path::new("/var/lib/flotilla/checkpoint.redb");
        let errors = [
            StoreError::Locked {
                path: path.to_path_buf(),
            },
            StoreError::corrupt(path, "bad"),
            StoreError::SchemaTooNew {
                path: path.to_path_buf(),
                found: 2,
                supported: 1,
            },
            StoreError::io(path, io::Error::other("disk on fire")),
            StoreError::NotAFile {
                path: path.to_path_buf(),
                kind: FileKind::Fifo,
            },
            StoreError::Injected {
                path: path.to_path_buf(),
            },
            StoreError::storage(path, redb::Error::WouldBlock),
        ];
        for e in errors {
            assert!(
                e.to_string().contains("/var/lib/flotilla/checkpoint.redb"),
                "{e}"
            );
        }
    }

    #[test]
    fn redb_errors_map_to_their_meaning() {
        let path = Path::new("c.redb");
        assert!(matches!(
            StoreError::from_redb_database(path, redb::DatabaseError::DatabaseAlreadyOpen),
            StoreError::Locked { .. }
        ));
        let not_redb = io::Error::new(io::ErrorKind::InvalidData, "magic number mismatch");
        assert!(matches!(
            StoreError::from_redb_storage(path, redb::StorageError::Io(not_redb)),
            StoreError::Corrupt { .. }
        ));
        assert!(matches!(
            StoreError::from_redb_storage(
                path,
                redb::StorageError::Io(io::Error::from(io::ErrorKind::PermissionDenied))
            ),
            StoreError::Io { .. }
        ));
        assert!(matches!(
            StoreError::from_redb_storage(path, redb::StorageError::Corrupted("x".into())),
            StoreError::Corrupt { .. }
        ));
        assert!(matches!(
            StoreError::from_redb_storage(path, redb::StorageError::ValueTooLarge(1 << 40)),
            StoreError::Storage { .. }
        ));
    }

    /// The redb error an error keeps as its source, if it keeps one.
    fn redb_source(e: &StoreError) -> Option<&redb::Error> {
        std::error::Error::source(e)?.downcast_ref::<redb::Error>()
    }

    #[test]
    fn redb_errors_are_kept_as_sources() {
        let path = Path::new("c.redb");
        let storage =
            StoreError::from_redb_storage(path, redb::StorageError::ValueTooLarge(1 << 40));
        assert!(matches!(storage, StoreError::Storage { .. }), "{storage:?}");
        assert!(
            matches!(redb_source(&storage), Some(redb::Error::ValueTooLarge(_))),
            "{storage:?}"
        );
        assert!(storage.to_string().contains("c.redb"), "{storage}");

        let corrupted =
            StoreError::from_redb_storage(path, redb::StorageError::Corrupted("bad page".into()));
        assert!(
            matches!(corrupted, StoreError::Corrupt { .. }),
            "{corrupted:?}"
        );
        assert!(
            matches!(redb_source(&corrupted), Some(redb::Error::Corrupted(m)) if m == "bad page"),
            "{corrupted:?}"
        );

        let not_redb = io::Error::new(io::ErrorKind::InvalidData, "magic number mismatch");
        let not_redb = StoreError::from_redb_database(
            path,
            redb::DatabaseError::Storage(redb::StorageError::Io(not_redb)),
        );
        assert!(
            matches!(not_redb, StoreError::Corrupt { .. }),
            "{not_redb:?}"
        );
        assert!(
            matches!(redb_source(&not_redb), Some(redb::Error::Io(e)) if e.kind() == io::ErrorKind::InvalidData),
            "{not_redb:?}"
        );

        let busy = StoreError::from_redb_transaction(path, redb::TransactionError::WouldBlock);
        assert!(matches!(busy, StoreError::Storage { .. }), "{busy:?}");
        assert!(
            matches!(redb_source(&busy), Some(redb::Error::WouldBlock)),
            "{busy:?}"
        );
    }

    #[test]
    fn our_own_findings_have_no_source() {
        let e = StoreError::corrupt(Path::new("c.redb"), "bad");
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn a_snapshot_error_says_so_instead_of_an_empty_path() {
        let e = StoreError::corrupt(Path::new(""), "bad");
        assert!(
            e.to_string().starts_with("checkpoint (loaded snapshot): "),
            "{e}"
        );
    }
}
