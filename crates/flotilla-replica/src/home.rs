//! Where a replica's own background work runs.

use std::future::Future;

use flotilla_supervision::AbortOnDrop;
use tokio::{runtime::Handle, task::JoinHandle};

/// The runtime a replica was made on (its actor's): its batcher and model
/// loads run there, whatever runtime the call that starts them comes from. A
/// caller's short-lived runtime (a helper thread's `block_on`) would otherwise
/// take the work down with it, and every later call with it.
#[derive(Debug, Clone)]
pub(crate) struct Home(Option<Handle>);

impl Home {
    /// The runtime of the calling task, if any (tests without one fall back
    /// to the caller's at each spawn).
    pub(crate) fn current() -> Self {
        Home(Handle::try_current().ok())
    }

    /// This runtime, if the calling thread has none (a plain thread's
    /// `futures::executor::block_on`): a call from there must run here, since
    /// user code expects a runtime, and its first timer or I/O without one
    /// would fail as a panic, which replaces a healthy replica.
    pub(crate) fn instead_of_none(&self) -> Option<&Handle> {
        // A task, or a current-thread runtime's `block_on`, runs on a
        // runtime: told by thread-local reads, where `Handle::try_current`
        // clones a shared `Arc` (about 70 ns on the call's hot path, paid
        // still in a multi-thread runtime's `block_on`).
        if tokio::task::try_id().is_some() || tokio::runtime::worker_index().is_some() {
            return None;
        }
        self.0.as_ref().filter(|_| Handle::try_current().is_err())
    }

    /// Run `work` on this runtime.
    pub(crate) fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some(h) => h.spawn(work),
            None => tokio::spawn(work),
        }
    }
}

/// `work`, run on `runtime` and awaited from wherever this is polled (a
/// thread without a runtime, see [`Home::instead_of_none`]). Dropped, it
/// aborts the work, as dropping `work` itself would. `None` if the runtime
/// dropped the work first (it shut down).
pub(crate) async fn run_on<F>(runtime: &Handle, work: F) -> Option<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match AbortOnDrop::new(runtime.spawn(work)).await {
        Ok(out) => Some(out),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
}
