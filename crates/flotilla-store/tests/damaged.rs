//! Damaged checkpoints: every record is decoded and validated, read-only, before the file
//! is opened for writing, so a damaged file is refused and left byte-for-byte as it was;
//! and a damaged page is an error wherever redb meets it, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::borrow::Borrow;
use std::path::Path;

use common::*;
use flotilla_store::{Batch, Store, StoreError};

/// redb's page size, and the first byte of a b-tree leaf page.
const PAGE: usize = 4096;
const LEAF: u8 = 1;

/// A distinctive application name, to find its records' page in the file.
const NEEDLE: &str = "needle-app";

const APPS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("apps");
const DEPLOYMENTS: redb::TableDefinition<(&str, &str), &[u8]> =
    redb::TableDefinition::new("deployments");
const CONFIG: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("config");

/// Open through the API under test.
fn open(path: &Path) -> Result<Store, StoreError> {
    Store::open(path).map(|(store, _)| store)
}

/// A checkpoint holding application [`NEEDLE`], one of its deployments and a config,
/// closed cleanly.
fn written_checkpoint(path: &Path) {
    let store = open(path).unwrap();
    let mut batch = Batch::new();
    batch.put_app(&app_record(NEEDLE, 1)).unwrap();
    batch
        .put_deployment(&app(NEEDLE), &dep("front"), &dep_record(Some(2)))
        .unwrap();
    batch.put_config(&test_config()).unwrap();
    store.commit(&batch).unwrap();
}

/// Insert `key` -> `value` into `table` directly, behind the Store's back, and close the
/// file cleanly.
fn insert_raw<'k, 'v, K: redb::Key + 'static, V: redb::Value + 'static>(
    path: &Path,
    table: redb::TableDefinition<K, V>,
    key: impl Borrow<K::SelfType<'k>>,
    value: impl Borrow<V::SelfType<'v>>,
) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(table).unwrap().insert(key, value).unwrap();
    txn.commit().unwrap();
}

/// The offsets of the leaf pages of `bytes` that hold `needle`.
fn leaf_pages_holding(bytes: &[u8], needle: &[u8]) -> Vec<usize> {
    (0..bytes.len() / PAGE)
        .map(|i| i * PAGE)
        .filter(|&at| {
            let page = &bytes[at..at + PAGE];
            page[0] == LEAF && page.windows(needle.len()).any(|w| w == needle)
        })
        .collect()
}

/// Overwrite `patch.len()` bytes at `offset` of every leaf page holding [`NEEDLE`]'s
/// records, in place (the file keeps its inode, so an open store sees the damage).
/// Returns how many pages were damaged.
fn damage_leaves(path: &Path, offset: usize, patch: &[u8]) -> usize {
    use std::io::{Seek, SeekFrom, Write};
    let bytes = bytes_of(path);
    let pages = leaf_pages_holding(&bytes, NEEDLE.as_bytes());
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    for at in &pages {
        file.seek(SeekFrom::Start((at + offset) as u64)).unwrap();
        file.write_all(patch).unwrap();
    }
    file.sync_all().unwrap();
    pages.len()
}

/// Ways to damage a leaf page: (what, offset in the page, bytes written there). A leaf is
/// its type byte, a reserved byte, a u16 entry count, then u32 end offsets of the keys and
/// of the values, then the keys' and values' bytes.
const LEAF_DAMAGE: [(&str, usize, &[u8]); 4] = [
    ("entry count", 2, &[0xff, 0xff]),
    ("first key's end", 4, &[0xff, 0xff, 0, 0]),
    ("first key's end before its start", 4, &[0, 0, 0, 0]),
    ("first value's end", 8, &[0xff, 0xff, 0xff, 0x7f]),
];

/// Open `path`, expect `Corrupt` naming the file, and check the file did not change by a
/// byte; twice, for the same refusal.
fn refused_as_corrupt(path: &Path) -> StoreError {
    let before = bytes_of(path);
    let err = open(path).map(|_| ()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(bytes_of(path) == before, "the file changed: {err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the message does not name the file: {err}"
    );
    let again = open(path).map(|_| ()).unwrap_err();
    assert_eq!(again.to_string(), err.to_string());
    assert!(bytes_of(path) == before, "the file changed: {again}");
    err
}

/// The cause `err` keeps, as a `T`.
fn cause<T: std::error::Error + 'static>(err: &StoreError) -> Option<&T> {
    std::error::Error::source(err)?.downcast_ref::<T>()
}

/// Copy `src` while a writer has it open: the copy is a file that was not closed cleanly,
/// as a crash leaves it (redb marks the file at a writable open).
fn unclean_copy(src: &Path, dst: &Path) {
    let writer = redb::Database::open(src).unwrap();
    std::fs::copy(src, dst).unwrap();
    drop(writer);
    assert!(
        matches!(
            redb::ReadOnlyDatabase::open(dst),
            Err(redb::DatabaseError::RepairAborted)
        ),
        "the copy is not unclean"
    );
}

// --- A damaged page is an error, never a panic (Store::load and Store::commit meeting one
// are tested in the crate: through the API, the open has read every page first) --------

#[test]
fn a_damaged_leaf_page_is_corrupt_at_open_and_the_file_is_byte_identical() {
    for (what, offset, patch) in LEAF_DAMAGE {
        let (_dir, path) = temp_checkpoint();
        written_checkpoint(&path);
        assert_eq!(damage_leaves(&path, offset, patch), 2, "{what}");
        refused_as_corrupt(&path);
    }
}

// --- A damaged record is found before any writable open --------------------------------

#[test]
fn an_undecodable_record_is_refused_at_open_and_the_file_is_byte_identical() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    insert_raw(&path, APPS, "broken", [0xc1u8].as_slice());
    let err = refused_as_corrupt(&path);
    let message = err.to_string();
    assert!(
        message.contains("`apps`") && message.contains("\"broken\""),
        "{message}"
    );
    assert!(cause::<rmp_serde::decode::Error>(&err).is_some(), "{err:?}");
}

#[test]
fn an_invalid_record_is_refused_at_open_and_the_file_is_byte_identical() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let mut record = app_record("crossed", 1);
    for d in &mut record.spec.deployments {
        if let flotilla_core::ReplicaCount::Auto(a) = &mut d.config.num_replicas {
            a.min_replicas = 9;
        }
    }
    let bytes = rmp_serde::to_vec_named(&record).unwrap();
    insert_raw(&path, APPS, "crossed", bytes.as_slice());
    let err = refused_as_corrupt(&path);
    assert!(err.to_string().contains("min_replicas"), "{err}");
    assert!(cause::<flotilla_core::Error>(&err).is_some(), "{err:?}");
}

#[test]
fn a_record_whose_generation_no_deploy_could_reach_is_refused_at_open() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let bytes = rmp_serde::to_vec_named(&app_record("late", u64::MAX)).unwrap();
    insert_raw(&path, APPS, "late", bytes.as_slice());
    let err = refused_as_corrupt(&path);
    assert!(err.to_string().contains("generation"), "{err}");
    assert!(cause::<flotilla_core::Error>(&err).is_some(), "{err:?}");
}

#[test]
fn a_record_under_another_name_is_refused_at_open_and_the_file_is_byte_identical() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let bytes = rmp_serde::to_vec_named(&app_record("shop", 1)).unwrap();
    insert_raw(&path, APPS, "not-shop", bytes.as_slice());
    let err = refused_as_corrupt(&path);
    assert!(err.to_string().contains("\"not-shop\""), "{err}");
}

#[test]
fn two_live_applications_on_one_route_prefix_are_refused_at_open() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    // "twin" takes needle-app's prefix: no deploy could have committed that.
    let mut twin = app_record("twin", 1);
    twin.spec.route_prefix = app_record(NEEDLE, 1).spec.route_prefix;
    let bytes = rmp_serde::to_vec_named(&twin).unwrap();
    insert_raw(&path, APPS, "twin", bytes.as_slice());
    let err = refused_as_corrupt(&path);
    assert!(
        err.to_string()
            .contains("both hold route prefix \"/needle-app\""),
        "{err}"
    );
    // One being deleted holds none: that file opens.
    twin.deleting = true;
    twin.generation = 2;
    let bytes = rmp_serde::to_vec_named(&twin).unwrap();
    insert_raw(&path, APPS, "twin", bytes.as_slice());
    open(&path).unwrap();
}

#[test]
fn a_huge_key_is_quoted_short() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let key = "k".repeat(100_000);
    insert_raw(&path, APPS, key.as_str(), [0xc1u8].as_slice());
    let err = refused_as_corrupt(&path);
    assert!(
        err.to_string().len() < 2_000,
        "{} bytes",
        err.to_string().len()
    );
    assert!(err.to_string().contains("100000 bytes in all"), "{err}");
}

#[test]
fn a_bad_deployment_key_or_record_is_refused_at_open_and_the_file_is_byte_identical() {
    let good = rmp_serde::to_vec_named(&dep_record(Some(1))).unwrap();
    // Decodes, but no API call writes a target above MAX_REPLICAS (its
    // arithmetic would overflow in the actors that run it).
    let huge = rmp_serde::to_vec_named(&dep_record(Some(4_000_000_000))).unwrap();
    for (key, value, shown) in [
        (("", "front"), good.as_slice(), "(\"\", \"front\")"),
        ((NEEDLE, "huge"), huge.as_slice(), "autoscaled_replicas"),
        ((NEEDLE, "bad name!"), good.as_slice(), "bad name!"),
        (
            (NEEDLE, "model"),
            [0xc1u8].as_slice(),
            "(\"needle-app\", \"model\")",
        ),
    ] {
        let (_dir, path) = temp_checkpoint();
        written_checkpoint(&path);
        insert_raw(&path, DEPLOYMENTS, key, value);
        let err = refused_as_corrupt(&path);
        let message = err.to_string();
        assert!(
            message.contains("`deployments`") && message.contains(shown),
            "{message}"
        );
    }
}

#[test]
fn a_config_slot_that_is_not_msgpack_is_refused_at_open_and_the_file_is_byte_identical() {
    let (_dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    insert_raw(&path, CONFIG, "last_applied", [0xc1u8].as_slice());
    let err = refused_as_corrupt(&path);
    let message = err.to_string();
    assert!(
        message.contains("`config`") && message.contains("last_applied"),
        "{message}"
    );
}

// --- A file that was not closed cleanly ------------------------------------------------

#[test]
fn an_unclean_file_with_a_damaged_record_is_refused_and_byte_identical() {
    let (dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    insert_raw(&path, APPS, "broken", [0xc1u8].as_slice());
    let unclean = dir.path().join("unclean.redb");
    unclean_copy(&path, &unclean);
    let err = refused_as_corrupt(&unclean);
    assert!(err.to_string().contains("\"broken\""), "{err}");
}

#[test]
fn an_unclean_file_with_a_damaged_page_is_refused_and_byte_identical() {
    for (what, offset, patch) in LEAF_DAMAGE {
        let (dir, path) = temp_checkpoint();
        written_checkpoint(&path);
        let unclean = dir.path().join("unclean.redb");
        unclean_copy(&path, &unclean);
        assert_eq!(damage_leaves(&unclean, offset, patch), 2, "{what}");
        refused_as_corrupt(&unclean);
    }
}

#[test]
fn an_unclean_good_file_is_recovered_whole() {
    let (dir, path) = temp_checkpoint();
    written_checkpoint(&path);
    let unclean = dir.path().join("unclean.redb");
    unclean_copy(&path, &unclean);
    let store = open(&unclean).unwrap();
    let snapshot = store.load().unwrap();
    assert_eq!(snapshot.apps, vec![app_record(NEEDLE, 1)]);
    assert_eq!(snapshot.deployments.len(), 1);
    assert_eq!(
        snapshot.config::<TestConfig>().unwrap(),
        Some(test_config())
    );
    // Recovered: a read-only open no longer needs repair once the store has closed it.
    drop(store);
    redb::ReadOnlyDatabase::open(&unclean).unwrap();
}
