//! A real process kill: a child process (this test binary, re-run) deploys
//! applications and prints each acknowledgement; the parent kills it with SIGKILL at
//! a seeded moment, reopens the store and checks every acknowledged application is
//! there and comes back to RUNNING.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use flotilla::{ApplicationStatus, Serve};
use support::{ProbeArgs, Switches};

const CHILD_ENV: &str = "FLOTILLA_KILL_CHILD_DIR";

/// The child: deploy batches of applications until killed, printing an
/// acknowledgement after each `run_many` returned Ok.
#[test]
#[ignore = "the child process of every_acknowledged_application_survives_sigkill, which runs it"]
fn child_deploys_until_killed() {
    let dir = std::env::var(CHILD_ENV)
        .expect("run by every_acknowledged_application_survives_sigkill, with its directory");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let sw = Arc::new(Switches::default());
        let serve = Serve::start(support::options(&dir, support::registry(&sw)))
            .await
            .unwrap();
        let mut out = std::io::stdout();
        for batch in 0..100_000 {
            let apps = (0..10)
                .map(|j| support::app(&format!("b{batch}-{j}"), 1, ProbeArgs::default()))
                .collect();
            serve.run_many(apps, support::no_wait()).await.unwrap();
            writeln!(out, "ack {batch}").unwrap();
            out.flush().unwrap();
        }
        std::future::pending::<()>().await;
    });
}

#[test]
fn every_acknowledged_application_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "--ignored",
            "child_deploys_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The moment of the kill comes from a seed: after 7 to 26 acknowledgements.
    let seed: u64 = std::env::var("FLOTILLA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let kill_after = 7 + (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 59) as usize;
    let stdout = child.stdout.take().unwrap();
    let mut acked = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("ack ") {
            acked.push(n.parse::<u64>().unwrap());
            if acked.len() >= kill_after {
                break;
            }
        }
    }
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed, not finished");
    assert_eq!(
        acked.len(),
        kill_after,
        "the child acknowledged batches before the kill"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let sw = Arc::new(Switches::default());
        let serve = support::start(&dir, &sw).await;
        for batch in &acked {
            for j in 0..10 {
                let name = format!("b{batch}-{j}");
                let s = support::wait_status(&serve, &name, ApplicationStatus::Running).await;
                assert_eq!(s.observed_generation, 1, "{name}");
            }
        }
        // Whatever the child committed after its last printed ack is there whole or
        // not at all: batches are all-or-nothing.
        for (name, _) in serve.status() {
            let batch: u64 = name.as_str()[1..]
                .split('-')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let count = serve
                .status()
                .iter()
                .filter(|(n, _)| n.as_str().starts_with(&format!("b{batch}-")))
                .count();
            assert_eq!(count, 10, "batch {batch} is whole");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
}
