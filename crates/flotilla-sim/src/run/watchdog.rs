//! The live-lock guard: the simulation's sign of life, and a wall-clock thread
//! that ends the process when virtual time stops advancing.
//!
//! The thread sleeps in `recv_timeout` on a channel of beats: each beat (a
//! sample at a new virtual instant, a step of the final checks) starts its wait
//! again, a wait that runs out is a live-lock, and the run closing the channel
//! ends the thread at once. It never polls.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc::{self, RecvTimeoutError, SyncSender},
    },
    thread::JoinHandle,
    time::Duration,
};

/// The simulation's sign of life, given to the watchdog (if there is one).
#[derive(Debug, Default)]
pub(super) struct Heartbeat {
    /// The virtual millisecond the sampler last sampled (for the message).
    virtual_ms: AtomicU64,
    /// Where beats go; `None` without a watchdog, or once the run ended.
    beats: Mutex<Option<SyncSender<()>>>,
}

impl Heartbeat {
    /// The sampler sampled at virtual millisecond `ms`.
    pub(super) fn sampled(&self, ms: u64) {
        self.virtual_ms.store(ms, Ordering::Release);
        self.beat();
    }

    /// One more step of work at the current virtual instant.
    pub(super) fn step(&self) {
        self.beat();
    }

    fn beat(&self) {
        if let Some(tx) = self.lock().as_ref() {
            // Full: a beat is already on its way, which says as much.
            let _ = tx.try_send(());
        }
    }

    /// Close the channel: the watchdog ends.
    fn close(&self) {
        self.lock().take();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<SyncSender<()>>> {
        self.beats.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The watchdog of a run: its heartbeat, and the thread that ends the process
/// if no beat comes for the stall limit. Dropping it ends the thread (and waits
/// for it), whichever way the run ended.
#[derive(Debug)]
pub(super) struct Watchdog {
    heartbeat: Arc<Heartbeat>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// A watchdog giving up after `limit` of wall time without a beat; `None`:
    /// a heartbeat nobody listens to.
    pub(super) fn start(limit: Option<Duration>) -> Watchdog {
        let heartbeat = Arc::new(Heartbeat::default());
        let thread = limit.map(|limit| {
            let (tx, rx) = mpsc::sync_channel(1);
            *heartbeat.lock() = Some(tx);
            let beat = heartbeat.clone();
            std::thread::spawn(move || {
                loop {
                    match rx.recv_timeout(limit) {
                        Ok(()) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                        Err(RecvTimeoutError::Timeout) => {
                            let ms = beat.virtual_ms.load(Ordering::Acquire);
                            eprintln!(
                                "\nflotilla-sim: virtual time has been stuck at {:.1}s for {:.0}s of wall time: \
                                 the system under test is busy at one instant without end (a live-lock). Giving up.",
                                ms as f64 / 1000.0,
                                limit.as_secs_f64()
                            );
                            std::process::exit(3);
                        }
                    }
                }
            })
        });
        Watchdog { heartbeat, thread }
    }

    /// The heartbeat to give the simulation.
    pub(super) fn heartbeat(&self) -> Arc<Heartbeat> {
        self.heartbeat.clone()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.heartbeat.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beats_keep_it_quiet_and_the_end_of_the_run_ends_it_at_once() {
        // An hour's limit: dropping must not wait for it (else this test hangs).
        let watchdog = Watchdog::start(Some(Duration::from_secs(3600)));
        let beat = watchdog.heartbeat();
        beat.sampled(1_000);
        assert_eq!(beat.virtual_ms.load(Ordering::Acquire), 1_000);
        beat.step();
        beat.step();
        assert!(beat.lock().is_some(), "a watchdog listens");
        drop(watchdog);
        assert!(
            beat.lock().is_none(),
            "the end of the run closed the channel"
        );
        // Beats after the end go nowhere.
        beat.step();
        // Without a limit nobody listens.
        let quiet = Watchdog::start(None);
        assert!(quiet.thread.is_none() && quiet.heartbeat().lock().is_none());
        quiet.heartbeat().step();
    }

    /// Set in the child process of the test below.
    const STALL_CHILD: &str = "FLOTILLA_SIM_WATCHDOG_STALL_CHILD";

    #[test]
    fn a_stall_ends_the_process_with_code_3_naming_the_virtual_instant() {
        if std::env::var_os(STALL_CHILD).is_some() {
            // The child: one beat at 2.5 s of virtual time, then none.
            let watchdog = Watchdog::start(Some(Duration::from_millis(20)));
            watchdog.heartbeat().sampled(2_500);
            loop {
                std::thread::park();
            }
        }
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "run::watchdog::tests::a_stall_ends_the_process_with_code_3_naming_the_virtual_instant",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STALL_CHILD, "1")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(
            stderr.contains("virtual time has been stuck at 2.5s") && stderr.contains("live-lock"),
            "{stderr}"
        );
    }
}
