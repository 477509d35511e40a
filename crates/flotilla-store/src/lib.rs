//! flotilla-store: the checkpoint store of Flotilla (DESIGN.md, "State and the checkpoint
//! protocol").
//!
//! This crate owns the redb checkpoint file and everything about its layout: the tables
//! (`meta`, `apps`, `deployments`, `config`), the MessagePack codec of their values
//! (rmp-serde, named fields), the schema version checked at open, the rule that one
//! [`Store::commit`] is exactly one redb write transaction with immediate durability, and
//! the [`StoreCounters`] that let tests see what a commit cost.
//!
//! It must not do anything else: no actors, no tasks, no decisions. It stores what the
//! Controller gives it, in the order given, and reads back what was stored; only the
//! Controller calls it.
//!
//! A file it cannot trust is reported as an error and is never written, not by a byte:
//! [`Store::open`] reads the whole file and checks it (schema version, every record
//! decoded and validated) before it opens it for writing, through a read-only open, or,
//! for a file not closed cleanly, through a recovery in memory; the checked snapshot is
//! what it returns. The file is locked, whole and exclusively, before anything reads it,
//! and stays locked until the store closes: of concurrent opens of one path, exactly one
//! gets the store, the others [`StoreError::Locked`]. A path that is not a regular file
//! (a FIFO, a socket, a device) is refused before it is opened. Nothing panics on a damaged file: a panic of redb on one,
//! at open, load or commit, is caught and reported as [`StoreError::Corrupt`]. A new
//! checkpoint is created readable by its owner only (mode 0600 on Unix): it holds init
//! args and user configs.

mod batch;
mod codec;
mod error;
mod lock;
mod scratch;
mod snapshot;
mod store;
mod tables;

pub use batch::Batch;
pub use error::{CorruptCause, FileKind, StoreError};
pub use snapshot::Snapshot;
pub use store::{Store, StoreCounters};

/// The version of the checkpoint's layout that this build writes and reads.
///
/// It is stamped into table `meta`, key `schema_version`, when a file is created and
/// checked at every open: a file with a newer version is refused with
/// [`StoreError::SchemaTooNew`] and left untouched.
pub const SCHEMA_VERSION: u32 = 1;
