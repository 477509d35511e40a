//! The published route index: which application serves which route prefix.

use std::{
    collections::HashMap,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use flotilla_core::{AppName, DeploymentName, RoutePrefix};
use tokio::sync::watch;

/// Where one route prefix leads: an application's ingress deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The prefix.
    pub prefix: RoutePrefix,
    /// The application that holds it.
    pub app: AppName,
    /// The application's ingress deployment, which receives its requests.
    pub ingress: DeploymentName,
}

/// The route prefixes of the live applications (those being deleted hold none),
/// as the Controller last committed them. The Controller is its only writer; it
/// outlives Controller restarts, and readers (the HTTP proxy) learn of changes by
/// subscription ([`subscribe`](Self::subscribe)), never by polling. A change
/// costs what changed: readers rebuild what they derive from it when woken.
#[derive(Clone)]
pub struct RouteTable {
    routes: Arc<RwLock<HashMap<RoutePrefix, Route>>>,
    /// How many changes were made: read without a lock by [`version`](Self::version).
    changes: Arc<AtomicU64>,
    /// The same count, for subscribers.
    version: watch::Sender<u64>,
}

impl Default for RouteTable {
    fn default() -> Self {
        RouteTable {
            routes: Arc::default(),
            changes: Arc::default(),
            version: watch::Sender::new(0),
        }
    }
}

impl std::fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTable")
            .field("routes", &self.len())
            .field("version", &*self.version.borrow())
            .finish()
    }
}

impl RouteTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every route, sorted by prefix.
    pub fn routes(&self) -> Vec<Route> {
        let mut all: Vec<Route> = self.read().values().cloned().collect();
        all.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        all
    }

    /// The route of `prefix`, if an application holds it.
    pub fn get(&self, prefix: &str) -> Option<Route> {
        self.read().get(prefix).cloned()
    }

    /// How many prefixes are held.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether no prefix is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A receiver that wakes on every change (its value counts changes).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// How many changes were made so far (one atomic load, no lock): a reader
    /// that derived something from the table at version `v` is current while
    /// this is still `v`. A change is counted after it is in the table, so
    /// [`routes`](Self::routes) read after this holds at least that version.
    pub fn version(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Count one change, for [`version`](Self::version) and the subscribers.
    fn changed(&self) {
        let v = self.changes.fetch_add(1, Ordering::AcqRel) + 1;
        self.version.send_replace(v);
    }

    /// `app` (entering through `ingress`) holds `prefix` now.
    pub(crate) fn insert(&self, prefix: RoutePrefix, app: AppName, ingress: DeploymentName) {
        let route = Route {
            prefix: prefix.clone(),
            app,
            ingress,
        };
        let changed = self.write().insert(prefix, route.clone()).as_ref() != Some(&route);
        if changed {
            self.changed();
        }
    }

    /// `prefix` is released, if `app` holds it.
    pub(crate) fn remove(&self, prefix: &RoutePrefix, app: &AppName) {
        let mut routes = self.write();
        if routes.get(prefix).is_some_and(|r| &r.app == app) {
            routes.remove(prefix);
            drop(routes);
            self.changed();
        }
    }

    /// Replace every route at once (a Controller recovering from the checkpoint).
    pub(crate) fn replace_all(&self, routes: impl IntoIterator<Item = Route>) {
        let fresh: HashMap<RoutePrefix, Route> =
            routes.into_iter().map(|r| (r.prefix.clone(), r)).collect();
        let mut current = self.write();
        if *current != fresh {
            *current = fresh;
            drop(current);
            self.changed();
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<RoutePrefix, Route>> {
        self.routes.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<RoutePrefix, Route>> {
        self.routes.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> RoutePrefix {
        RoutePrefix::new(s).unwrap_or_else(|e| panic!("{e}"))
    }
    fn a(s: &str) -> AppName {
        AppName::new(s).unwrap_or_else(|e| panic!("{e}"))
    }
    fn d(s: &str) -> DeploymentName {
        DeploymentName::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn changes_wake_subscribers_and_no_change_does_not() {
        let t = RouteTable::new();
        let mut rx = t.subscribe();
        t.insert(p("/a"), a("one"), d("front"));
        assert!(rx.has_changed().unwrap_or(false));
        rx.mark_unchanged();
        t.insert(p("/a"), a("one"), d("front"));
        assert!(!rx.has_changed().unwrap_or(true), "same route again");
        t.remove(&p("/a"), &a("two"));
        assert!(!rx.has_changed().unwrap_or(true), "not the holder");
        assert_eq!(t.get("/a").map(|r| r.app), Some(a("one")));
        t.remove(&p("/a"), &a("one"));
        assert!(rx.has_changed().unwrap_or(false));
        assert!(t.is_empty());
    }

    #[test]
    fn the_version_counts_changes_and_subscribers_see_the_same_count() {
        let t = RouteTable::new();
        let rx = t.subscribe();
        assert_eq!(t.version(), 0);
        t.insert(p("/a"), a("one"), d("front"));
        t.insert(p("/a"), a("one"), d("front")); // no change
        t.insert(p("/b"), a("two"), d("front"));
        assert_eq!(t.version(), 2);
        t.replace_all(t.routes()); // the same routes: no change
        t.replace_all(Vec::new());
        assert_eq!(t.version(), 3);
        assert_eq!(*rx.borrow(), t.version());
    }
}
