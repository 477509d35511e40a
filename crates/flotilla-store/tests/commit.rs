//! What one commit writes: exactly its batch, in one transaction, or nothing at all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use flotilla_store::{Batch, Store, StoreCounters, StoreError};

#[test]
fn a_commit_counts_exactly_its_keys_and_bytes() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;

    let shop = app_record("shop", 1);
    let shop_bytes = rmp_serde::to_vec_named(&shop).unwrap().len() as u64;
    let record = dep_record(Some(3));
    let record_bytes = rmp_serde::to_vec_named(&record).unwrap().len() as u64;
    let config_bytes = rmp_serde::to_vec_named(&test_config()).unwrap().len() as u64;

    let mut first = Batch::new();
    first.put_app(&shop).unwrap();
    first
        .put_deployment(&app("shop"), &dep("model"), &record)
        .unwrap();
    first.put_config(&test_config()).unwrap();
    assert_eq!(first.len(), 3);
    store.commit(&first).unwrap();
    let expected_first = "shop".len() as u64
        + shop_bytes
        + ("shop".len() + "model".len()) as u64
        + record_bytes
        + "last_applied".len() as u64
        + config_bytes;
    assert_eq!(
        store.counters(),
        StoreCounters {
            commits: 1,
            keys_written: 3,
            bytes_written: expected_first,
        }
    );

    // Deletes count as keys written and add no bytes; puts of other records are not
    // rewritten.
    let mut second = Batch::new();
    second.delete_deployment(&app("shop"), &dep("model"));
    second.delete_config();
    second
        .put_deployment(&app("shop"), &dep("front"), &record)
        .unwrap();
    store.commit(&second).unwrap();
    assert_eq!(
        store.counters(),
        StoreCounters {
            commits: 2,
            keys_written: 6,
            bytes_written: expected_first + ("shop".len() + "front".len()) as u64 + record_bytes,
        }
    );
}

#[test]
fn an_empty_batch_is_not_a_commit() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    let empty = Batch::new();
    assert!(empty.is_empty());
    assert_eq!(empty.len(), 0);
    store.commit(&empty).unwrap();
    assert_eq!(store.counters(), StoreCounters::default());
}

#[test]
fn a_thousand_applications_are_one_commit() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    let mut batch = Batch::new();
    let mut expected_bytes = 0u64;
    for i in 0..1000 {
        let record = app_record(&format!("app-{i:04}"), i);
        expected_bytes += (record.spec.name.as_str().len()
            + rmp_serde::to_vec_named(&record).unwrap().len()) as u64;
        batch.put_app(&record).unwrap();
    }
    assert_eq!(batch.len(), 1000);
    store.commit(&batch).unwrap();
    assert_eq!(
        store.counters(),
        StoreCounters {
            commits: 1,
            keys_written: 1000,
            bytes_written: expected_bytes,
        }
    );
    let apps = store.load().unwrap().apps;
    assert_eq!(apps.len(), 1000);
    assert_eq!(apps[0], app_record("app-0000", 0));
    assert_eq!(apps[999], app_record("app-0999", 999));
}

#[test]
fn delete_app_removes_its_deployments_and_no_one_elses() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    // Names that sort right around "a": prefixes, extensions and neighbours.
    let apps = ["-", "A", "_", "a", "a-b", "a.", "a0", "aa", "ab", "b"];
    let mut batch = Batch::new();
    for name in apps {
        batch.put_app(&app_record(name, 1)).unwrap();
        for d in ["-", "0", "front", "model", "zzz"] {
            batch
                .put_deployment(&app(name), &dep(d), &dep_record(Some(2)))
                .unwrap();
        }
    }
    store.commit(&batch).unwrap();

    let mut delete = Batch::new();
    delete.delete_app(&app("a"));
    assert_eq!(delete.len(), 1);
    store.commit(&delete).unwrap();

    let snapshot = store.load().unwrap();
    let left_apps: Vec<&str> = snapshot.apps.iter().map(|r| r.spec.name.as_str()).collect();
    let expected: Vec<&str> = apps.iter().copied().filter(|n| *n != "a").collect();
    assert_eq!(left_apps, expected);
    assert_eq!(snapshot.deployments.len(), expected.len() * 5);
    assert!(
        snapshot
            .deployments
            .iter()
            .all(|(a, _, _)| a.as_str() != "a")
    );
    for name in expected {
        assert_eq!(
            snapshot
                .deployments
                .iter()
                .filter(|(a, _, _)| a.as_str() == name)
                .count(),
            5,
            "{name}"
        );
    }

    // It also removes deployment records of an application that has no record of its own.
    let mut orphan = Batch::new();
    orphan
        .put_deployment(&app("ghost"), &dep("front"), &dep_record(None))
        .unwrap();
    store.commit(&orphan).unwrap();
    let mut delete = Batch::new();
    delete.delete_app(&app("ghost"));
    store.commit(&delete).unwrap();
    assert_eq!(store.load().unwrap().deployments, snapshot.deployments);
}

#[test]
fn an_injected_failure_writes_nothing_and_the_next_commit_works() {
    let (_dir, path) = temp_checkpoint();
    let store = Store::open(&path).unwrap().0;
    let mut first = Batch::new();
    first.put_app(&app_record("shop", 1)).unwrap();
    first
        .put_deployment(&app("shop"), &dep("front"), &dep_record(Some(1)))
        .unwrap();
    first.put_config(&test_config()).unwrap();
    store.commit(&first).unwrap();
    let before = store.load().unwrap();
    let counters_before = store.counters();

    let mut doomed = Batch::new();
    doomed.delete_app(&app("shop"));
    doomed.put_app(&app_record("search", 1)).unwrap();
    doomed.delete_config();
    store.fail_next_commit();
    // An empty batch neither fails nor uses up the injected failure.
    store.commit(&Batch::new()).unwrap();
    let err = store.commit(&doomed).unwrap_err();
    assert!(
        matches!(&err, StoreError::Injected { path: p } if *p == path),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );

    let after = store.load().unwrap();
    assert_eq!(after.apps, before.apps);
    assert_eq!(after.deployments, before.deployments);
    assert_eq!(after.config, before.config);
    assert_eq!(store.counters(), counters_before);

    // The failure was for one commit only.
    store.commit(&doomed).unwrap();
    let done = store.load().unwrap();
    assert_eq!(done.apps, vec![app_record("search", 1)]);
    assert!(done.deployments.is_empty());
    assert_eq!(done.config, None);
    assert_eq!(store.counters().commits, counters_before.commits + 1);

    // And it survives a reopen exactly as loaded.
    drop(store);
    let reopened = Store::open(&path).unwrap().0.load().unwrap();
    assert_eq!(reopened.apps, done.apps);
}

#[test]
fn an_encoding_error_is_reported_by_the_batch_and_leaves_it_unchanged() {
    struct Unencodable;
    impl serde::Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("refuses to be encoded"))
        }
    }
    let mut batch = Batch::new();
    batch.put_config(&1u32).unwrap();
    let err = batch.put_config(&Unencodable).unwrap_err();
    match &err {
        StoreError::Encode { what, source } => {
            assert!(what.contains("config"), "{what}");
            let reason = source.to_string();
            assert!(reason.contains("refuses to be encoded"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(batch.len(), 1);
}

#[test]
fn an_encoding_error_keeps_rmp_serde_s_error_as_its_source() {
    struct Unencodable;
    impl serde::Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("refuses to be encoded"))
        }
    }
    let err = Batch::new().put_config(&Unencodable).unwrap_err();
    let source = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<rmp_serde::encode::Error>())
        .unwrap_or_else(|| panic!("no rmp-serde source: {err:?}"));
    assert!(
        source.to_string().contains("refuses to be encoded"),
        "{source}"
    );
    // The message still says what was being encoded, and why it failed.
    let message = err.to_string();
    assert!(
        message.contains("config") && message.contains("refuses to be encoded"),
        "{message}"
    );
}

#[test]
fn the_store_is_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();

    let (_dir, path) = temp_checkpoint();
    let store = std::sync::Arc::new(Store::open(&path).unwrap().0);
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    let mut batch = Batch::new();
                    batch.put_app(&app_record(&format!("t{t}-{i}"), i)).unwrap();
                    store.commit(&batch).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(store.counters().commits, 40);
    assert_eq!(store.load().unwrap().apps.len(), 40);
}

#[test]
fn a_closed_store_releases_its_file_and_refuses_calls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.redb");
    let store = flotilla_store::Store::open(&path).unwrap().0;
    store.close();
    assert!(matches!(
        store.load(),
        Err(flotilla_store::StoreError::Closed { .. })
    ));
    let mut batch = flotilla_store::Batch::new();
    batch.delete_config();
    assert!(matches!(
        store.commit(&batch),
        Err(flotilla_store::StoreError::Closed { .. })
    ));
    // The lock is gone: the same file opens again while `store` is still alive.
    let again = flotilla_store::Store::open(&path).unwrap().0;
    again.load().unwrap();
}
