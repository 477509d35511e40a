//! Every record type goes in with a commit and comes back out with a load, both from the
//! open store and after closing and reopening the file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use flotilla_core::AppRecord;
use flotilla_store::{Batch, Snapshot, Store};

/// "search", being deleted.
fn deleting_search() -> AppRecord {
    let mut deleting = app_record("search", 9);
    deleting.deleting = true;
    deleting.api_type = flotilla_core::ApiType::Imperative;
    deleting
}

fn everything() -> Batch {
    let mut batch = Batch::new();
    batch.put_app(&app_record("shop", 3)).unwrap();
    batch.put_app(&deleting_search()).unwrap();
    batch
        .put_deployment(&app("shop"), &dep("model"), &dep_record(Some(4)))
        .unwrap();
    batch
        .put_deployment(&app("shop"), &dep("front"), &dep_record(None))
        .unwrap();
    batch
        .put_deployment(&app("search"), &dep("front"), &dep_record(Some(0)))
        .unwrap();
    batch.put_config(&test_config()).unwrap();
    batch
}

fn assert_everything(snapshot: &Snapshot) {
    // Sorted by name, whatever the order of the batch.
    assert_eq!(
        snapshot.apps,
        vec![deleting_search(), app_record("shop", 3)]
    );
    assert_eq!(
        snapshot.deployments,
        vec![
            (app("search"), dep("front"), dep_record(Some(0))),
            (app("shop"), dep("front"), dep_record(None)),
            (app("shop"), dep("model"), dep_record(Some(4))),
        ]
    );
    assert_eq!(
        snapshot.config::<TestConfig>().unwrap(),
        Some(test_config())
    );
    assert_eq!(
        snapshot.config.as_deref(),
        Some(rmp_serde::to_vec_named(&test_config()).unwrap().as_slice())
    );
}

/// After a second batch: shop at `generation` with only `deployment`, deciding
/// `replicas`; search as it was.
fn assert_shop_now(snapshot: &Snapshot, generation: u64, deployment: &str, replicas: Option<u32>) {
    assert_eq!(snapshot.apps[1], app_record("shop", generation));
    assert_eq!(
        snapshot.deployments,
        vec![
            (app("search"), dep("front"), dep_record(Some(0))),
            (app("shop"), dep(deployment), dep_record(replicas)),
        ]
    );
}

/// A new store with [`everything`] committed (and the directory holding it).
fn store_with_everything() -> (tempfile::TempDir, Store) {
    let (dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    store.commit(&everything()).unwrap();
    (dir, store)
}

#[test]
fn a_new_store_is_empty() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    assert_eq!(store.path(), path.as_path());
    let snapshot = store.load().unwrap();
    assert!(snapshot.apps.is_empty());
    assert!(snapshot.deployments.is_empty());
    assert_eq!(snapshot.config, None);
    assert_eq!(snapshot.config::<TestConfig>().unwrap(), None);
    assert_eq!(store.counters(), Default::default());
}

#[test]
fn every_record_type_round_trips_through_commit_and_load() {
    let (_dir, store) = store_with_everything();
    assert_everything(&store.load().unwrap());
}

#[test]
fn every_record_type_survives_close_and_reopen() {
    let (_dir, path) = temp_checkpoint();
    {
        let store = Store::open(&path).unwrap().0;
        store.commit(&everything()).unwrap();
    }
    let store = Store::open(&path).unwrap().0;
    assert_everything(&store.load().unwrap());
    // A reopened store counts from zero.
    assert_eq!(store.counters().commits, 0);
    drop(store);
    // And once more, after a reopen that wrote nothing.
    assert_everything(&Store::open(&path).unwrap().0.load().unwrap());
}

#[test]
fn puts_replace_and_deletes_remove() {
    let (_dir, store) = store_with_everything();

    let mut batch = Batch::new();
    batch.put_app(&app_record("shop", 4)).unwrap();
    batch.delete_deployment(&app("shop"), &dep("front"));
    batch
        .put_deployment(&app("shop"), &dep("model"), &dep_record(Some(6)))
        .unwrap();
    batch.delete_config();
    // Deleting what is not there is not an error.
    batch.delete_deployment(&app("nope"), &dep("nope"));
    store.commit(&batch).unwrap();

    let snapshot = store.load().unwrap();
    assert_shop_now(&snapshot, 4, "model", Some(6));
    assert_eq!(snapshot.config, None);
}

#[test]
fn operations_apply_in_batch_order() {
    let (_dir, store) = store_with_everything();

    // Delete the application and recreate it with one deployment, in one batch.
    let mut batch = Batch::new();
    batch.delete_app(&app("shop"));
    batch.put_app(&app_record("shop", 5)).unwrap();
    batch
        .put_deployment(&app("shop"), &dep("front"), &dep_record(Some(1)))
        .unwrap();
    // The last put of a key wins.
    batch.put_config(&1u8).unwrap();
    batch.put_config(&test_config()).unwrap();
    store.commit(&batch).unwrap();

    let snapshot = store.load().unwrap();
    assert_shop_now(&snapshot, 5, "front", Some(1));
    assert_eq!(
        snapshot.config::<TestConfig>().unwrap(),
        Some(test_config())
    );
}

#[test]
fn a_config_of_the_wrong_type_is_corrupt_naming_the_slot() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    let mut batch = Batch::new();
    batch.put_config(&"just a string").unwrap();
    store.commit(&batch).unwrap();
    let err = store.load().unwrap().config::<TestConfig>().unwrap_err();
    assert!(
        matches!(err, flotilla_store::StoreError::Corrupt { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("`config`") && message.contains("last_applied"),
        "{message}"
    );
}

#[test]
fn a_config_that_does_not_decode_keeps_rmp_serde_s_error_as_its_source() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    let mut batch = Batch::new();
    batch.put_config(&"just a string").unwrap();
    store.commit(&batch).unwrap();
    let err = store.load().unwrap().config::<TestConfig>().unwrap_err();
    let source =
        std::error::Error::source(&err).and_then(|s| s.downcast_ref::<rmp_serde::decode::Error>());
    assert!(source.is_some(), "no rmp-serde source: {err:?}");
}

#[test]
fn the_open_returns_what_load_reads() {
    let (_dir, path) = temp_checkpoint();
    {
        let (store, _) = Store::open(&path).unwrap();
        store.commit(&everything()).unwrap();
    }
    let (store, snapshot) = Store::open(&path).unwrap();
    assert_everything(&snapshot);
    let loaded = store.load().unwrap();
    assert_eq!(snapshot.apps, loaded.apps);
    assert_eq!(snapshot.deployments, loaded.deployments);
    assert_eq!(snapshot.config, loaded.config);
}
