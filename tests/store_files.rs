//! The store file through the public API: `Serve::start` refuses a damaged checkpoint
//! without writing a byte of it (and without panicking), opens one whose config an
//! earlier Flotilla accepted under rules since tightened, refuses a path that is not a
//! regular file at once, and creates a new checkpoint private to its owner.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flotilla::{FileKind, Serve, ServeError, StoreError};
use support::{Switches, app, options, registry, start, tag};

/// The application whose record the tests damage; a name found nowhere else in the file.
const NEEDLE: &str = "needleapp";
/// redb's page size, and the first byte of a b-tree leaf page.
const PAGE: usize = 4096;
const LEAF: u8 = 1;
/// Where a one-entry leaf of string keys keeps its key: after the type byte, a reserved
/// byte, the u16 entry count, and the u32 ends of the key and of the value.
const KEY_AT: usize = 12;

/// The store file of [`support::options`] in `dir`.
fn store_file(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("f.redb")
}

/// A checkpoint in `dir` holding application [`NEEDLE`], written by a Serve that then
/// shut down cleanly.
async fn written_checkpoint(dir: &tempfile::TempDir) {
    let sw = Arc::new(Switches::default());
    let serve = start(dir, &sw).await;
    serve.run(app(NEEDLE, 1, tag("v"))).await.unwrap();
    serve.shutdown().await.unwrap();
}

/// Change the file in place: for every leaf page of table `apps` holding [`NEEDLE`]'s
/// record (the one live page, and any stale copy of it), write `patch` at `offset` of the
/// page. Returns how many pages were changed.
fn damage_apps_leaves(path: &Path, offset: impl Fn(usize) -> usize, patch: &[u8]) -> usize {
    let mut bytes = std::fs::read(path).unwrap();
    let mut damaged = 0;
    for at in (0..bytes.len() / PAGE).map(|i| i * PAGE) {
        let page = &bytes[at..at + PAGE];
        let one_entry = page[0] == LEAF && page[2..4] == [1, 0];
        if one_entry && page[KEY_AT..].starts_with(NEEDLE.as_bytes()) {
            let from = at + offset(NEEDLE.len());
            bytes[from..from + patch.len()].copy_from_slice(patch);
            damaged += 1;
        }
    }
    std::fs::write(path, &bytes).unwrap();
    damaged
}

/// Start a Serve on `dir`'s store, expecting it refused as corrupt with the file
/// byte-identical afterwards; returns the error's message.
async fn refused_as_corrupt(dir: &tempfile::TempDir) -> String {
    let path = store_file(dir);
    let before = std::fs::read(&path).unwrap();
    let sw = Arc::new(Switches::default());
    let err = Serve::start(options(dir, registry(&sw))).await.unwrap_err();
    assert!(
        matches!(err, ServeError::Store(StoreError::Corrupt { .. })),
        "{err:?}"
    );
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the file changed: {err}"
    );
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    message
}

#[tokio::test(start_paused = true)]
async fn a_store_with_a_corrupted_record_is_refused_and_left_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    written_checkpoint(&dir).await;
    // The record's first byte, a MessagePack map marker, becomes 0xc1, which MessagePack
    // never uses.
    let damaged = damage_apps_leaves(&store_file(&dir), |key_len| KEY_AT + key_len, &[0xc1]);
    assert!(damaged >= 1);
    let message = refused_as_corrupt(&dir).await;
    assert!(
        message.contains("`apps`") && message.contains(NEEDLE),
        "{message}"
    );
    // Refused again, the same way: nothing was repaired or rewritten in between.
    assert_eq!(refused_as_corrupt(&dir).await, message);
}

#[tokio::test(start_paused = true)]
async fn a_store_with_a_damaged_page_is_an_error_not_a_panic_and_left_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    written_checkpoint(&dir).await;
    // The leaf's entry count: redb panics reading past the page.
    let damaged = damage_apps_leaves(&store_file(&dir), |_| 2, &[0xff, 0xff]);
    assert!(damaged >= 1);
    refused_as_corrupt(&dir).await;
}

#[tokio::test(start_paused = true)]
async fn a_store_whose_config_slot_is_not_a_serve_config_is_refused_and_left_byte_identical() {
    // Not a config at all: the first Controller would fail on it, and every
    // restart after it.
    let dir = tempfile::tempdir().unwrap();
    written_checkpoint(&dir).await;
    put_config(&dir, &"hello");
    let message = refused_as_corrupt(&dir).await;
    assert!(
        message.contains("`config`") && message.contains("last_applied"),
        "{message}"
    );
}

/// A config that decodes but breaks a rule of today (an earlier Flotilla
/// accepted `http_options.root_path: /serve/`; `target_capacity` stands for
/// any such rule) is no damage: the checkpoint opens, its applications run,
/// and the config stays the applied one until the next (its breach is
/// logged). Refusing the file would stop every application until a downgrade.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_whose_config_breaks_a_newer_rule_opens_and_runs() {
    let mut older = flotilla::ServeConfig::from_yaml("applications: []\n").unwrap();
    older.target_capacity = Some(50.0);
    assert!(older.validate().is_err(), "the rule this test stands on");
    let dir = tempfile::tempdir().unwrap();
    written_checkpoint(&dir).await;
    put_config(&dir, &older);
    let sw = Arc::new(Switches::default());
    let serve = Serve::start(options(&dir, registry(&sw))).await.unwrap();
    support::wait_status(&serve, NEEDLE, flotilla::ApplicationStatus::Running).await;
    let applied = serve.applied_config().await.unwrap().unwrap();
    assert_eq!(applied.target_capacity, Some(50.0));
    // The next config replaces it.
    serve
        .apply_config(flotilla::ServeConfig::from_yaml("applications: []\n").unwrap())
        .await
        .unwrap();
    let applied = serve.applied_config().await.unwrap().unwrap();
    assert_eq!(applied.target_capacity, None);
    support::wait_status(&serve, NEEDLE, flotilla::ApplicationStatus::Running).await;
    serve.shutdown().await.unwrap();
}

/// Write `value` into the config slot of `dir`'s store, as no Serve would.
fn put_config<T: serde::Serialize>(dir: &tempfile::TempDir, value: &T) {
    let (store, _) = flotilla_store::Store::open(store_file(dir)).unwrap();
    let mut batch = flotilla_store::Batch::new();
    batch.put_config(value).unwrap();
    store.commit(&batch).unwrap();
    store.close();
}

#[cfg(unix)]
#[tokio::test(start_paused = true)]
async fn a_fifo_store_path_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo: {made}");
    // Refused from the path's metadata, before anything opens it (which would block).
    let sw = Arc::new(Switches::default());
    let err = Serve::start(options(&dir, registry(&sw)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ServeError::Store(StoreError::NotAFile { path: p, kind: FileKind::Fifo }) if *p == path
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("FIFO"), "{err}");
}

#[cfg(unix)]
#[tokio::test(start_paused = true)]
async fn a_new_store_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let serve = start(&dir, &sw).await;
    let mode = std::fs::metadata(store_file(&dir))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "mode {:o}", mode & 0o777);
    serve.shutdown().await.unwrap();
}
