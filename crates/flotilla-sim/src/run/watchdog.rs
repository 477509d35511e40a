//! The live-lock guard: the simulation's sign of life, and a wall-clock thread
//! that ends the process when virtual time stops advancing.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

/// The simulation's sign of life: the virtual millisecond the sampler last
/// sampled, and steps of the final checks (which run at one virtual instant).
#[derive(Debug, Default)]
pub(super) struct Heartbeat {
    pub(super) virtual_ms: AtomicU64,
    pub(super) steps: AtomicU64,
    pub(super) done: AtomicBool,
}

impl Heartbeat {
    /// One more step of work at the current virtual instant.
    pub(super) fn step(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }
}

/// A wall-clock thread that ends the process if virtual time stops (the only
/// way out of a live-lock on the runtime's one thread).
pub(super) fn watchdog(
    beat: Arc<Heartbeat>,
    limit: std::time::Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut last = (u64::MAX, 0);
        let mut since = std::time::Instant::now();
        while !beat.done.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let now = (
                beat.virtual_ms.load(Ordering::Acquire),
                beat.steps.load(Ordering::Relaxed),
            );
            if now != last {
                last = now;
                since = std::time::Instant::now();
            } else if since.elapsed() > limit {
                eprintln!(
                    "\nflotilla-sim: virtual time has been stuck at {:.1}s for {:.0}s of wall time: \
                     the system under test is busy at one instant without end (a live-lock). Giving up.",
                    now.0 as f64 / 1000.0,
                    since.elapsed().as_secs_f64()
                );
                std::process::exit(3);
            }
        }
    })
}
