//! The store's guarantees, on real files: damaged pages, failed and
//! panicking commits, racing opens, schema versions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;

use flotilla_core::{ApiType, AppRecord, ApplicationSpec, DeploymentSpec};
use redb::Builder;

use super::open::{AT_STEP, dir_of, initialise};
use super::read::check_schema;
use super::*;
use crate::SCHEMA_VERSION;

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
