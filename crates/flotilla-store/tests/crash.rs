//! Acknowledged means durable: a real child process commits, acknowledges each commit on
//! stdout, and is killed with SIGKILL (`Child::kill`); every acknowledged batch is in the
//! file when it is reopened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::*;
use flotilla_store::{Batch, Store};

/// Set to the checkpoint path to make [`crash_child_commits_until_killed`] act as the child.
const CHILD_ENV: &str = "FLOTILLA_STORE_CRASH_CHILD";
/// Batches the child commits at most.
const BATCHES: u64 = 10_000;
/// Acknowledgements the parent waits for before killing the child.
const ACKS_BEFORE_KILL: u64 = 40;

/// Batch `i`: an application, one of its deployments, and the config slot, so that a
/// torn batch would show.
fn batch(i: u64) -> Batch {
    let mut b = Batch::new();
    let name = format!("app-{i:05}");
    b.put_app(&app_record(&name, i)).unwrap();
    b.put_deployment(&app(&name), &dep("front"), &dep_record(Some(i as u32)))
        .unwrap();
    b.put_config(&i).unwrap();
    b
}

/// The child process of [`every_acknowledged_batch_survives_sigkill`], which runs it
/// with [`CHILD_ENV`] set.
#[test]
#[ignore = "the child process of every_acknowledged_batch_survives_sigkill, which runs it"]
fn crash_child_commits_until_killed() {
    let path = std::env::var(CHILD_ENV)
        .expect("run by every_acknowledged_batch_survives_sigkill, with its checkpoint path");
    let store = Store::open(&path).unwrap().0;
    let mut out = std::io::stdout().lock();
    for i in 0..BATCHES {
        store.commit(&batch(i)).unwrap();
        writeln!(out, "ack {i}").unwrap();
        out.flush().unwrap();
    }
    // Wait to be killed, holding the store open.
    loop {
        std::thread::park();
    }
}

#[test]
fn every_acknowledged_batch_survives_sigkill() {
    let (_dir, path) = temp_checkpoint();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "--ignored",
            "crash_child_commits_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();

    // The pipe stays open until the child is dead, so that no write of the child fails
    // and the child dies of the kill and of nothing else.
    let mut acks = BufReader::new(child.stdout.take().unwrap());
    let mut acked: Option<u64> = None;
    let mut line = String::new();
    loop {
        line.clear();
        if acks.read_line(&mut line).unwrap() == 0 {
            break; // the child died early; the assertions below say so
        }
        // libtest may print its own lines around ours; take only the acks.
        let Some(rest) = line.find("ack ").map(|at| &line[at + 4..]) else {
            continue;
        };
        let i: u64 = rest.trim().parse().unwrap();
        assert_eq!(i, acked.map_or(0, |a| a + 1), "acks out of order");
        acked = Some(i);
        if i + 1 >= ACKS_BEFORE_KILL {
            break;
        }
    }
    // SIGKILL on Unix: no destructor, no close, no flush runs in the child.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    drop(acks);
    assert!(!status.success(), "the child was expected to die: {status}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "the child died of something else: {status}"
        );
    }
    let acked = acked.expect("the child acknowledged nothing") + 1;
    assert!(acked >= ACKS_BEFORE_KILL);

    // The killed child never closed the file, so it needs recovery (a read-only open
    // refuses it), which Store::open does.
    assert!(matches!(
        redb::ReadOnlyDatabase::open(&path),
        Err(redb::DatabaseError::RepairAborted)
    ));
    let (store, snapshot) = Store::open(&path).unwrap();
    // The open's snapshot, checked while the file was recovered in memory, is the file's.
    assert_eq!(store.load().unwrap().apps, snapshot.apps);
    let committed = snapshot.apps.len() as u64;
    assert!(
        committed >= acked,
        "only {committed} of {acked} acknowledged batches survived"
    );
    // Whole batches in order: batch i is there, entirely, exactly when i < committed.
    for (i, record) in snapshot.apps.iter().enumerate() {
        assert_eq!(*record, app_record(&format!("app-{i:05}"), i as u64));
    }
    assert_eq!(snapshot.deployments.len() as u64, committed);
    for (i, (a, d, record)) in snapshot.deployments.iter().enumerate() {
        assert_eq!(a.as_str(), format!("app-{i:05}"));
        assert_eq!(d.as_str(), "front");
        assert_eq!(record.autoscaled_replicas, Some(i as u32));
    }
    assert_eq!(snapshot.config::<u64>().unwrap(), Some(committed - 1));

    // The recovered store takes new commits, and they survive a clean close.
    store.commit(&batch(committed)).unwrap();
    drop(store);
    assert_eq!(
        Store::open(&path).unwrap().0.load().unwrap().apps.len() as u64,
        committed + 1
    );
}
