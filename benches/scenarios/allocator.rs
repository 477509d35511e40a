//! The bench's allocator settings. mimalloc returns freed memory to the system
//! after 10 ms by default (`purge_delay`); a program that frees memory to use it
//! again soon (a restart of Serve in the same process, an application deleted
//! and deployed again) then pays the kernel's zeroing of those pages twice, and
//! on this VM that is most of what a 100,000-application restart costs
//! (BENCHMARKS.md). The bench keeps freed memory (`MIMALLOC_PURGE_DELAY=-1`), as a
//! long-running server would configure its allocator.
//!
//! mimalloc reads its options from the environment when the process starts, so
//! the bench runs itself again with the setting in place; a value already set in
//! the environment is kept (`MIMALLOC_PURGE_DELAY=10` measures the default).

use std::{os::unix::process::ExitStatusExt, process::Command};

/// The environment variable mimalloc reads.
const PURGE_DELAY: &str = "MIMALLOC_PURGE_DELAY";

/// When the setting is missing, run this program again with it and return that
/// run's exit code; `None` when it is in place (carry on).
pub fn rerun_configured() -> Option<i32> {
    if std::env::var_os(PURGE_DELAY).is_some() {
        return None;
    }
    let result = std::env::current_exe().and_then(|exe| {
        Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env(PURGE_DELAY, "-1")
            .status()
    });
    match result {
        // Killed by a signal: exit as a shell reports it (128 + the signal).
        Ok(status) => Some(
            status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        ),
        Err(e) => {
            eprintln!("scenarios: could not run itself with {PURGE_DELAY}=-1: {e}");
            Some(1)
        }
    }
}
