//! Which namespaces living instances hold in this process.
//!
//! An instance's actor names, process groups and routes are all under its
//! namespace, and stopping it (shutdown, a crash, its last `Serve` dropped)
//! stops every actor under that name. So a namespace is one instance's from its
//! `start` until it is stopped, whatever became of its actors meanwhile (its
//! Supervisor may have given up): a second instance under the same name
//! would have its actors killed by the first one's stop.

use std::{
    collections::BTreeSet,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use flotilla_core::actor_names;

static HELD: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
static INSTANCE: AtomicU64 = AtomicU64::new(0);

/// A namespace held by one instance; released when dropped (or by
/// [`release`](Self::release)).
#[derive(Debug)]
pub(crate) struct NamespaceClaim {
    ns: Option<String>,
}

impl NamespaceClaim {
    /// Hold `ns`, or `None` if a living instance holds it.
    pub(crate) fn take(ns: &str) -> Option<NamespaceClaim> {
        // A stopped instance's Supervisor may still be on its way out (a
        // dropped `Serve` kills its actors without waiting): its name is not
        // free yet.
        if ractor::registry::where_is(actor_names::supervisor(ns)).is_some() {
            return None;
        }
        let fresh = HELD
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ns.to_owned());
        fresh.then(|| NamespaceClaim {
            ns: Some(ns.to_owned()),
        })
    }

    /// The next `flotilla<N>` nobody holds (a program may have chosen one of
    /// these names itself), held.
    pub(crate) fn generated() -> NamespaceClaim {
        Self::generated_from(&INSTANCE)
    }

    /// [`generated`](Self::generated), numbered by `counter`.
    fn generated_from(counter: &AtomicU64) -> NamespaceClaim {
        loop {
            let ns = format!("flotilla{}", counter.fetch_add(1, Ordering::Relaxed));
            if let Some(claim) = NamespaceClaim::take(&ns) {
                return claim;
            }
        }
    }

    /// The namespace held.
    pub(crate) fn name(&self) -> &str {
        self.ns.as_deref().unwrap_or_default()
    }

    /// Let another instance take the namespace (this one is stopped).
    pub(crate) fn release(&mut self) {
        if let Some(ns) = self.ns.take() {
            HELD.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&ns);
        }
    }
}

impl Drop for NamespaceClaim {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbered far beyond what any other test's instances reach, so the
    /// names the test holds are the next ones generated, whatever runs beside.
    #[test]
    fn a_generated_namespace_skips_the_names_programs_chose() {
        let base = 1u64 << 62;
        let counter = AtomicU64::new(base);
        let chosen = [base, base + 1].map(|n| NamespaceClaim::take(&format!("flotilla{n}")));
        assert!(chosen.iter().all(Option::is_some), "free names");
        let generated = NamespaceClaim::generated_from(&counter);
        assert_eq!(generated.name(), format!("flotilla{}", base + 2));
        // Released with its claim: the name is free again.
        drop(chosen);
        let again = NamespaceClaim::generated_from(&AtomicU64::new(base));
        assert_eq!(again.name(), format!("flotilla{base}"));
    }
}
