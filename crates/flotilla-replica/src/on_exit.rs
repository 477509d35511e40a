//! A hook run once when a replica is gone, whoever watches it.

use std::fmt;

/// Runs its function once, when it is dropped. A replica keeps it in its state,
/// so it runs when the replica is gone however it went (stopped, crashed, killed
/// or failed to start), even while no DeploymentActor watches the replica: the
/// DeploymentActor gives the replica's cluster reservation back here, so a
/// replica that exits while its DeploymentActor is down does not hold its place
/// for ever.
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// use flotilla_replica::OnExit;
///
/// let runs = Arc::new(AtomicU32::new(0));
/// let counter = runs.clone();
/// let hook = OnExit::new(move || {
///     counter.fetch_add(1, Ordering::SeqCst);
/// });
/// assert_eq!(runs.load(Ordering::SeqCst), 0);
/// drop(hook);
/// assert_eq!(runs.load(Ordering::SeqCst), 1);
/// ```
#[derive(Default)]
pub struct OnExit(Option<Box<dyn FnOnce() + Send + Sync>>);

impl OnExit {
    /// Run `f` when this is dropped.
    pub fn new(f: impl FnOnce() + Send + Sync + 'static) -> Self {
        OnExit(Some(Box::new(f)))
    }

    /// Run nothing (a replica whose resources nobody here reserved).
    pub fn none() -> Self {
        OnExit(None)
    }
}

impl Drop for OnExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

impl fmt::Debug for OnExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OnExit").field(&self.0.is_some()).finish()
    }
}
