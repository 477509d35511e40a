//! What the checkpoint path may name: a regular file only, created private to its owner.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use flotilla_store::{FileKind, Store, StoreError};

/// Open `path` on another thread and give up after a while: an open that blocks (on a
/// FIFO, say) fails the test instead of hanging it.
fn open_promptly(path: &Path) -> Result<Store, StoreError> {
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(Store::open(&path).map(|(store, _)| store));
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("Store::open did not return: {e}"))
}

/// Expect `path` refused as not a regular file but a `kind` (which the message names too).
fn refused_as(path: &Path, kind: FileKind, shown: &str) {
    let err = open_promptly(path).unwrap_err();
    assert!(
        matches!(&err, StoreError::NotAFile { path: p, kind: k } if p == path && *k == kind),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains(shown), "{message}");
}

/// [`refused_as`], for a path in a directory of the test's own: nothing is made beside it.
fn refused_in_own_dir(path: &Path, kind: FileKind, shown: &str) {
    let dir = path.parent().unwrap();
    let before = dir_listing(dir);
    refused_as(path, kind, shown);
    assert_eq!(dir_listing(dir), before);
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {}: {status}", path.display());
}

#[cfg(unix)]
#[test]
fn a_fifo_is_refused_at_once() {
    let (_dir, path) = temp_checkpoint();
    mkfifo(&path);
    refused_in_own_dir(&path, FileKind::Fifo, "FIFO");
}

#[cfg(unix)]
#[test]
fn a_socket_is_refused() {
    let (_dir, path) = temp_checkpoint();
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    refused_in_own_dir(&path, FileKind::Socket, "socket");
}

#[cfg(unix)]
#[test]
fn a_device_is_refused() {
    // Every unix has it: a test that found none would test nothing.
    let path = Path::new("/dev/null");
    refused_as(path, FileKind::CharDevice, "character device");
}

#[test]
fn a_directory_is_not_a_file() {
    let (dir, _) = temp_checkpoint();
    let path = dir.path().join("sub");
    std::fs::create_dir(&path).unwrap();
    refused_in_own_dir(&path, FileKind::Directory, "directory");
}

#[cfg(unix)]
#[test]
fn a_new_checkpoint_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, path) = temp_checkpoint();
    drop(Store::open(&path).unwrap().0);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "mode {mode:o}");
}
