//! The proxy's route table: the Controller's route index
//! ([`Serve::routes`](flotilla::Serve::routes)) followed by subscription, each
//! prefix with its ingress handle and counters.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, OnceLock, PoisonError, RwLock},
};

use bytes::Bytes;
use flotilla::{DeploymentHandle, Serve, ServeError};
use tokio::sync::watch;

use crate::{metrics::HttpStats, router::PrefixRouter};

/// One route prefix the proxy serves.
#[derive(Debug)]
pub(crate) struct RouteEntry {
    pub(crate) prefix: String,
    pub(crate) app: String,
    pub(crate) ingress: String,
    /// What the ingress sees as `root_path`: the server's plus the prefix.
    pub(crate) root_path: String,
    /// Made on first use: the Controller publishes a route a moment before the
    /// status board knows its application.
    handle: OnceLock<DeploymentHandle>,
    pub(crate) stats: Arc<HttpStats>,
}

impl RouteEntry {
    fn new(prefix: &str, app: &str, ingress: &str, root_path: &str) -> Self {
        let root_path = if prefix == "/" {
            root_path.to_owned()
        } else {
            format!("{root_path}{prefix}")
        };
        RouteEntry {
            prefix: prefix.to_owned(),
            app: app.to_owned(),
            ingress: ingress.to_owned(),
            root_path,
            handle: OnceLock::new(),
            stats: Arc::new(HttpStats::new(prefix, app, ingress)),
        }
    }

    /// The ingress handle.
    pub(crate) fn handle(&self, serve: &Serve) -> Result<&DeploymentHandle, ServeError> {
        if let Some(h) = self.handle.get() {
            return Ok(h);
        }
        let h = serve.deployment_handle(&self.app, &self.ingress)?;
        Ok(self.handle.get_or_init(|| h))
    }
}

/// The table at one moment.
#[derive(Debug, Default)]
pub(crate) struct RouteSnapshot {
    pub(crate) router: PrefixRouter<Arc<RouteEntry>>,
    /// The `/-/routes` body: `{"<prefix>": "<application>"}`.
    pub(crate) routes_json: Bytes,
}

impl RouteSnapshot {
    /// Every entry's counters.
    pub(crate) fn stats(&self) -> Vec<Arc<HttpStats>> {
        self.entries().map(|e| e.stats.clone()).collect()
    }

    fn entries(&self) -> impl Iterator<Item = &Arc<RouteEntry>> {
        self.router.values()
    }
}

/// The followed table, swapped whole on every change.
#[derive(Debug, Default)]
pub(crate) struct RouteFollower {
    current: RwLock<Arc<RouteSnapshot>>,
    /// Ray's `_route_table_populated`: true once a non-empty table was seen.
    populated: std::sync::atomic::AtomicBool,
}

impl RouteFollower {
    /// The table now.
    pub(crate) fn current(&self) -> Arc<RouteSnapshot> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether a non-empty table was ever seen.
    pub(crate) fn populated(&self) -> bool {
        self.populated.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Build the table from the route index as it is, reusing the entries
    /// (handles, counters) of prefixes that still lead to the same ingress.
    fn rebuild(&self, serve: &Serve, root_path: &str) {
        let old = self.current();
        let mut reuse: HashMap<(&str, &str, &str), &Arc<RouteEntry>> = old
            .entries()
            .map(|e| ((e.prefix.as_str(), e.app.as_str(), e.ingress.as_str()), e))
            .collect();
        let routes = serve.routes().routes();
        let mut json = BTreeMap::new();
        let entries: Vec<(String, Arc<RouteEntry>)> = routes
            .iter()
            .map(|r| {
                let (p, a, i) = (r.prefix.as_str(), r.app.as_str(), r.ingress.as_str());
                json.insert(p, a);
                let entry = reuse
                    .remove(&(p, a, i))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(RouteEntry::new(p, a, i, root_path)));
                (p.to_owned(), entry)
            })
            .collect();
        let routes_json = serde_json::to_vec(&json)
            .map(Bytes::from)
            .unwrap_or_default();
        let fresh = Arc::new(RouteSnapshot {
            router: PrefixRouter::new(entries),
            routes_json,
        });
        if !fresh.router.is_empty() {
            self.populated
                .store(true, std::sync::atomic::Ordering::Release);
        }
        tracing::debug!(routes = fresh.router.len(), "proxy route table updated");
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
    }

    /// Follow `serve`'s route index until `stop` turns true: the table is
    /// current when this returns, and is rebuilt on every change (changes that
    /// come in a burst are taken together).
    pub(crate) fn follow(
        serve: Serve,
        root_path: String,
        mut stop: watch::Receiver<bool>,
    ) -> (Arc<RouteFollower>, tokio::task::JoinHandle<()>) {
        let follower = Arc::new(RouteFollower::default());
        let mut changes = serve.routes().subscribe();
        changes.mark_unchanged();
        follower.rebuild(&serve, &root_path);
        let f = follower.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        changes.mark_unchanged();
                        f.rebuild(&serve, &root_path);
                    }
                    () = crate::stopped(&mut stop) => return,
                }
            }
        });
        (follower, task)
    }
}
