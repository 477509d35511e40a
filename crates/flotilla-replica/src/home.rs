//! Where a replica's own background work runs.

use std::future::Future;

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
