//! Opening: creation, the lock, and files that must be refused and left untouched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{borrow::Borrow, path::Path};

use common::*;
use flotilla_store::{Batch, SCHEMA_VERSION, Store, StoreError};

const META: redb::TableDefinition<&str, u32> = redb::TableDefinition::new("meta");

/// Open `path`, expect an error, and check the file did not change by a byte.
fn refused(path: &Path) -> StoreError {
    let before = bytes_of(path);
    let err = Store::open(path).unwrap_err();
    assert!(bytes_of(path) == before, "the file changed: {err}");
    // Refusing twice is the same refusal.
    let again = Store::open(path).unwrap_err();
    assert_eq!(again.to_string(), err.to_string());
    assert!(bytes_of(path) == before, "the file changed: {again}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the message does not name the file: {err}"
    );
    err
}

/// Insert `key` -> `value` into `table` of `db` directly, behind the Store's back,
/// in one committed transaction; then close `db`.
fn insert_raw<'k, 'v, K: redb::Key + 'static, V: redb::Value + 'static>(
    db: redb::Database,
    table: redb::TableDefinition<K, V>,
    key: impl Borrow<K::SelfType<'k>>,
    value: impl Borrow<V::SelfType<'v>>,
) {
    let txn = db.begin_write().unwrap();
    txn.open_table(table).unwrap().insert(key, value).unwrap();
    txn.commit().unwrap();
}

/// A checkpoint with one application in it, closed cleanly.
fn written_checkpoint(path: &Path) {
    let store = Store::open(path).unwrap().0;
    let mut batch = Batch::new();
    batch.put_app(&app_record("shop", 1)).unwrap();
    store.commit(&batch).unwrap();
}

#[test]
fn open_creates_the_file_and_leaves_nothing_else() {
    let (dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    assert!(path.is_file());
    assert_eq!(dir_listing(dir.path()), vec!["checkpoint.redb"]);
    drop(store);

    // The new file is a redb database stamped with the schema version.
    let db = redb::Database::open(&path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    let meta = txn.open_table(META).unwrap();
    assert_eq!(
        redb::ReadableTable::get(&meta, "schema_version")
            .unwrap()
            .unwrap()
            .value(),
        SCHEMA_VERSION
    );
}

/// Open `path` from `threads` threads at once: exactly one gets the store, the others
/// `Locked`.
fn one_store_of_concurrent_opens(path: &Path, threads: usize) {
    let barrier = std::sync::Barrier::new(threads);
    let results: Vec<Result<Store, StoreError>> = std::thread::scope(|s| {
        let opens: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    Store::open(path).map(|(store, _)| store)
                })
            })
            .collect();
        opens.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let opened = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(opened, 1, "{results:?}");
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(e, StoreError::Locked { .. }), "{e:?}");
        }
    }
}

#[test]
fn concurrent_opens_of_a_new_file_give_one_store() {
    for _ in 0..10 {
        let (dir, path) = temp_checkpoint();
        one_store_of_concurrent_opens(&path, 2);
        assert_eq!(dir_listing(dir.path()), vec!["checkpoint.redb"]);
    }
}

#[test]
fn concurrent_opens_of_an_existing_file_give_one_store() {
    let (dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    for _ in 0..10 {
        one_store_of_concurrent_opens(&path, 4);
    }
    assert_eq!(dir_listing(dir.path()), vec!["checkpoint.redb"]);
    assert_eq!(Store::open(&path).unwrap().1.apps.len(), 1);
}

#[test]
fn a_second_open_is_locked_and_names_the_file() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    let err = Store::open(&path).unwrap_err();
    assert!(
        matches!(&err, StoreError::Locked { path: p } if *p == path),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains("is held by another Flotilla instance"),
        "{message}"
    );
    // The first store is unharmed, and the file opens again once it is closed.
    let mut batch = Batch::new();
    batch.put_app(&app_record("shop", 1)).unwrap();
    store.commit(&batch).unwrap();
    drop(store);
    assert_eq!(Store::open(&path).unwrap().0.load().unwrap().apps.len(), 1);
}

#[test]
fn a_file_open_in_redb_elsewhere_is_locked_and_untouched() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let holder = redb::Database::open(&path).unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
    // The holder's file was not touched by the refused open.
    drop(holder);
    assert_eq!(Store::open(&path).unwrap().0.load().unwrap().apps.len(), 1);
}

#[test]
fn a_garbage_file_is_corrupt_and_untouched() {
    let (_dir, path) = temp_checkpoint();
    let garbage: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    let err = refused(&path);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(bytes_of(&path) == garbage);
}

#[test]
fn an_empty_file_is_corrupt_and_untouched() {
    let (_dir, path) = temp_checkpoint();
    std::fs::write(&path, b"").unwrap();
    let err = refused(&path);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
}

#[test]
fn a_short_file_is_corrupt_and_untouched() {
    let (_dir, path) = temp_checkpoint();
    std::fs::write(&path, b"redb").unwrap();
    let err = refused(&path);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

#[test]
fn a_truncated_checkpoint_is_refused_and_untouched() {
    let (dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let whole = bytes_of(&path);
    for len in [16, 100, 512, 4096, whole.len() / 2, whole.len() - 1] {
        let cut = dir.path().join(format!("cut-{len}.redb"));
        std::fs::write(&cut, &whole[..len]).unwrap();
        let err = refused(&cut);
        assert!(matches!(err, StoreError::Corrupt { .. }), "{len}: {err:?}");
    }
}

#[test]
fn a_newer_schema_is_refused_and_untouched() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let db = redb::Database::open(&path).unwrap();
    insert_raw(db, META, "schema_version", SCHEMA_VERSION + 1);
    let err = refused(&path);
    match err {
        StoreError::SchemaTooNew {
            path: p,
            found,
            supported,
        } => {
            assert_eq!(p, path);
            assert_eq!(found, SCHEMA_VERSION + 1);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_redb_file_that_is_not_a_checkpoint_is_corrupt_and_untouched() {
    let (dir, path) = temp_checkpoint();
    let db = redb::Database::create(&path).unwrap();
    insert_raw(db, redb::TableDefinition::<u64, u64>::new("other"), 1, 2);
    let err = refused(&path);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("meta"), "{err}");

    // A `meta` table of another type is no checkpoint either.
    let other = dir.path().join("other.redb");
    let db = redb::Database::create(&other).unwrap();
    let meta = redb::TableDefinition::<&str, &str>::new("meta");
    insert_raw(db, meta, "schema_version", "1");
    let err = refused(&other);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
}

#[test]
fn an_undecodable_record_is_corrupt_naming_table_and_key() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let db = redb::Database::open(&path).unwrap();
    let apps = redb::TableDefinition::<&str, &[u8]>::new("apps");
    insert_raw(db, apps, "broken", [0xc1u8].as_slice());
    // Found by the open, which reads every record before it writes anything.
    let err = refused(&path);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("`apps`") && message.contains("\"broken\""),
        "{message}"
    );
    assert!(message.contains(&path.display().to_string()), "{message}");
}

#[test]
fn a_decodable_but_invalid_record_is_corrupt_naming_table_key_and_field() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    // Autoscaling bounds crossed: no API call could have written this.
    let mut record = app_record("crossed", 1);
    for d in &mut record.spec.deployments {
        if let flotilla_core::ReplicaCount::Auto(a) = &mut d.config.num_replicas {
            a.min_replicas = 9;
        }
    }
    let bytes = rmp_serde::to_vec_named(&record).unwrap();
    let db = redb::Database::open(&path).unwrap();
    let apps = redb::TableDefinition::<&str, &[u8]>::new("apps");
    insert_raw(db, apps, "crossed", bytes.as_slice());
    // Found by the open, which validates every record before it writes anything.
    let err = refused(&path);
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("`apps`")
            && message.contains("\"crossed\"")
            && message.contains("min_replicas"),
        "{message}"
    );
}

#[test]
fn a_missing_directory_is_an_io_error_naming_the_file() {
    let (dir, _) = temp_checkpoint();
    let path = dir.path().join("no-such-dir").join("checkpoint.redb");
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert!(!path.exists());
}

#[test]
fn a_directory_is_refused() {
    let (dir, _) = temp_checkpoint();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotAFile {
                kind: flotilla_store::FileKind::Directory,
                ..
            }
        ),
        "{err:?}"
    );
}
