//! The proxy's route table: the Controller's route index
//! ([`Serve::routes`](flotilla::Serve::routes)) followed by subscription, each
//! prefix with its ingress handle and counters.
//!
//! A request reads the table through [`RouteFollower::fresh`]: if the index
//! changed since the table was built (one atomic load tells), the table is
//! rebuilt first, so that a route is served as soon as `run` returns and a
//! deleted one 404s as soon as `delete_apps` does, however late the follower
//! task runs.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, OnceLock, PoisonError, RwLock},
};

use bytes::Bytes;
use flotilla::{DeploymentHandle, RouteTable, Serve, ServeError};
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
    fn new(prefix: &str, app: &str, ingress: &str, root_path: &str, stats: Arc<HttpStats>) -> Self {
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
            stats,
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
    /// The route index's [`version`](RouteTable::version) it was built from
    /// (or a later one).
    version: u64,
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

/// How many routes that went keep their counters in the scrape.
pub(crate) const RETIRED_ROUTES: usize = 1_000;

/// A route's series labels: prefix and application.
type RouteKey = (String, String);

/// The counters of the last [`RETIRED_ROUTES`] routes that went (deleted, or
/// their prefix moved to another application or ingress): scraped still, as
/// Ray's proxy keeps a series for its life, so a deletion does not erase its
/// history, and a request that finishes after its route went counts there.
/// One per prefix and application (the labels of Ray's series): a route back
/// under them goes on from its counters (one series, still monotonic), or,
/// with another ingress, drops them (two series under one label set would
/// be one too many).
#[derive(Debug, Default)]
struct Retired {
    by_key: HashMap<RouteKey, Arc<HttpStats>>,
    /// The keys of `by_key`, oldest retirement first.
    order: VecDeque<RouteKey>,
}

impl Retired {
    fn retire(&mut self, stats: Arc<HttpStats>) {
        let key = (stats.route.clone(), stats.app.clone());
        if self.by_key.insert(key.clone(), stats).is_none() {
            self.order.push_back(key);
        }
        while self.by_key.len() > RETIRED_ROUTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.by_key.remove(&oldest);
        }
    }

    /// The counters of a route back under its labels, taken out: `None` if
    /// there are none, or they were another ingress's (dropped).
    fn revive(&mut self, prefix: &str, app: &str, ingress: &str) -> Option<Arc<HttpStats>> {
        let key = (prefix.to_owned(), app.to_owned());
        let stats = self.by_key.remove(&key)?;
        self.order.retain(|k| *k != key);
        (stats.deployment == ingress).then_some(stats)
    }
}

/// The followed table, swapped whole on every change.
#[derive(Debug)]
pub(crate) struct RouteFollower {
    root_path: String,
    /// The index followed ([`Serve::routes`]).
    index: RouteTable,
    current: RwLock<Arc<RouteSnapshot>>,
    /// Held while the table is rebuilt: changes that come while one rebuild
    /// runs are taken together by the next.
    rebuilding: tokio::sync::Mutex<()>,
    /// Ray's `_route_table_populated`: true once a non-empty table was seen.
    populated: std::sync::atomic::AtomicBool,
    retired: Mutex<Retired>,
}

impl RouteFollower {
    /// The table as last built, which may lag the index (the `/-/routes`
    /// body and the metrics; requests use [`fresh`](Self::fresh)).
    pub(crate) fn current(&self) -> Arc<RouteSnapshot> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The table as of the index now: the current one while the index has
    /// not changed since it was built (one atomic load), else rebuilt first.
    pub(crate) async fn fresh(&self) -> Arc<RouteSnapshot> {
        let table = self.current();
        let want = self.index.version();
        if table.version >= want {
            return table;
        }
        let _turn = self.rebuilding.lock().await;
        let table = self.current();
        if table.version >= want {
            // Rebuilt while this waited.
            return table;
        }
        self.rebuild();
        self.current()
    }

    /// Every route's counters, live and gone (the last [`RETIRED_ROUTES`]),
    /// read together: a rebuild retires routes and swaps the table under the
    /// same lock, so a route is in one list or the other, never both (one
    /// series exported twice) or neither.
    pub(crate) fn all_stats(&self) -> Vec<Arc<HttpStats>> {
        let retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all = self.current().stats();
        all.extend(retired.by_key.values().cloned());
        all
    }

    /// Whether a non-empty table was ever seen.
    pub(crate) fn populated(&self) -> bool {
        self.populated.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Build the table from the route index as it is, reusing the entries
    /// (handles, counters) of prefixes that still lead to the same ingress.
    /// Callers hold `rebuilding` (the first build, in `follow`, has the
    /// follower to itself), so that one rebuild never overwrites a later one.
    fn rebuild(&self) {
        // Read before the routes: they hold at least this version's changes.
        let version = self.index.version();
        let root_path = self.root_path.as_str();
        let old = self.current();
        let mut reuse: HashMap<(&str, &str, &str), &Arc<RouteEntry>> = old
            .entries()
            .map(|e| ((e.prefix.as_str(), e.app.as_str(), e.ingress.as_str()), e))
            .collect();
        let routes = self.index.routes();
        let mut json = BTreeMap::new();
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        // The routes that went retire first: one whose prefix and application
        // come back with another ingress then drops their counters.
        let kept: std::collections::HashSet<(&str, &str, &str)> = routes
            .iter()
            .map(|r| (r.prefix.as_str(), r.app.as_str(), r.ingress.as_str()))
            .collect();
        reuse.retain(|key, gone| {
            if kept.contains(key) {
                return true;
            }
            retired.retire(gone.stats.clone());
            false
        });
        let entries: Vec<(String, Arc<RouteEntry>)> = routes
            .iter()
            .map(|r| {
                let (p, a, i) = (r.prefix.as_str(), r.app.as_str(), r.ingress.as_str());
                json.insert(p, a);
                let entry = reuse.remove(&(p, a, i)).cloned().unwrap_or_else(|| {
                    let stats = (retired.revive(p, a, i))
                        .unwrap_or_else(|| Arc::new(HttpStats::new(p, a, i)));
                    Arc::new(RouteEntry::new(p, a, i, root_path, stats))
                });
                (p.to_owned(), entry)
            })
            .collect();
        let routes_json = serde_json::to_vec(&json)
            .map(Bytes::from)
            .unwrap_or_default();
        let fresh = Arc::new(RouteSnapshot {
            router: PrefixRouter::new(entries),
            routes_json,
            version,
        });
        if !fresh.router.is_empty() {
            self.populated
                .store(true, std::sync::atomic::Ordering::Release);
        }
        tracing::debug!(routes = fresh.router.len(), "proxy route table updated");
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        // Held to here: see `all_stats`.
        drop(retired);
    }

    /// Follow `index` (an instance's [`Serve::routes`]) until `stop` turns true: the table is
    /// current when this returns, and is rebuilt on every change (changes that
    /// come in a burst are taken together), ahead of the requests that would
    /// otherwise rebuild it in [`fresh`](Self::fresh).
    pub(crate) fn follow(
        index: RouteTable,
        root_path: String,
        mut stop: watch::Receiver<bool>,
    ) -> (Arc<RouteFollower>, tokio::task::JoinHandle<()>) {
        let mut changes = index.subscribe();
        changes.mark_unchanged();
        let follower = Arc::new(RouteFollower {
            root_path,
            index,
            current: RwLock::default(),
            rebuilding: tokio::sync::Mutex::new(()),
            populated: std::sync::atomic::AtomicBool::new(false),
            retired: Mutex::default(),
        });
        follower.rebuild();
        let f = follower.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        changes.mark_unchanged();
                        let _ = f.fresh().await;
                    }
                    () = crate::stopped(&mut stop) => return,
                }
            }
        });
        (follower, task)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use flotilla::{
        ApplicationSpec, Deployment, DeploymentSpec, Registry, ServeOptions, UserError,
    };

    use super::*;

    struct Nop;

    impl Deployment for Nop {
        type Request = u8;
        type Response = u8;
        async fn handle(&self, x: u8) -> Result<u8, UserError> {
            Ok(x)
        }
    }

    /// A Serve running `t::Nop` (and `t::Other`, the same code) in `dir`.
    async fn serve_in(dir: &tempfile::TempDir) -> Serve {
        let registry = Registry::new()
            .register("t::Nop", |_ctx| async { Ok(Nop) })
            .and_then(|r| r.register("t::Other", |_ctx| async { Ok(Nop) }))
            .unwrap();
        Serve::start(ServeOptions::new(registry).store_path(dir.path().join("t.redb")))
            .await
            .unwrap()
    }

    /// The counters of the route serving `path` now.
    async fn stats_of(follower: &RouteFollower, path: &str) -> Arc<HttpStats> {
        follower
            .fresh()
            .await
            .router
            .route(path)
            .unwrap()
            .1
            .stats
            .clone()
    }

    fn app(name: &str, prefix: &str) -> ApplicationSpec {
        ApplicationSpec::builder(name)
            .route_prefix(prefix)
            .deployment(DeploymentSpec::builder("ingress", "t::Nop"))
            .build()
            .unwrap()
    }

    /// A request reads the index as it is when it comes, even if the follower
    /// task never ran after the change (here it stopped before it): what `run`
    /// and `delete_apps` acknowledged is what the proxy routes.
    #[tokio::test(start_paused = true)]
    async fn a_lookup_sees_every_change_made_before_it_without_the_follower_task() {
        let dir = tempfile::tempdir().unwrap();
        let serve = serve_in(&dir).await;
        let (_stop, stopped) = watch::channel(true);
        let (follower, task) =
            RouteFollower::follow(serve.routes().clone(), "/root".into(), stopped);
        task.await.unwrap(); // the task has ended: only lookups rebuild now
        assert!(follower.fresh().await.router.route("/a/x").is_none());

        serve.run(app("a", "/a")).await.unwrap();
        let table = follower.fresh().await;
        let (_, entry) = table.router.route("/a/x").unwrap();
        assert_eq!(
            (entry.app.as_str(), entry.root_path.as_str()),
            ("a", "/root/a")
        );
        assert_eq!(&table.routes_json[..], br#"{"/a":"a"}"#);
        assert!(follower.populated());
        // Unchanged since: the same table, not a rebuild.
        assert!(Arc::ptr_eq(&table, &follower.fresh().await));

        serve.run(app("b", "/b")).await.unwrap();
        serve.delete_apps(["a"], false).await.unwrap();
        let table = follower.fresh().await;
        assert!(table.router.route("/a/x").is_none(), "deleted");
        assert_eq!(table.router.route("/b").unwrap().1.app, "b");
        serve.shutdown().await.unwrap();
    }

    /// A route that goes keeps its counters in the scrape, and requests that
    /// finish after it went count there; back under the same prefix,
    /// application and ingress it goes on from them; with another ingress
    /// they go (one series per label set). Only the last `RETIRED_ROUTES` are
    /// kept.
    #[tokio::test(start_paused = true)]
    async fn a_route_that_goes_keeps_its_counters_and_one_back_goes_on_from_them() {
        let dir = tempfile::tempdir().unwrap();
        let serve = serve_in(&dir).await;
        let (_stop, stopped) = watch::channel(false);
        let (follower, _task) =
            RouteFollower::follow(serve.routes().clone(), String::new(), stopped);
        serve.run(app("a", "/a")).await.unwrap();
        let stats = stats_of(&follower, "/a").await;
        stats.record(0, 200, std::time::Duration::from_millis(1));
        serve.delete_apps(["a"], true).await.unwrap();
        assert!(follower.fresh().await.stats().is_empty());
        // In flight as it went: counted, and scraped.
        stats.record(0, 404, std::time::Duration::from_millis(1));
        let all = follower.all_stats();
        assert_eq!(all.len(), 1);
        assert!(Arc::ptr_eq(&all[0], &stats));
        assert_eq!(stats.read().len(), 2);
        // Back: the same counters, live again, retired no more.
        serve.run(app("a", "/a")).await.unwrap();
        let back = stats_of(&follower, "/a").await;
        assert!(Arc::ptr_eq(&back, &stats));
        assert_eq!(follower.all_stats().len(), 1, "live, not retired too");
        // Another ingress under the same labels: fresh counters, the old gone.
        let other = ApplicationSpec::builder("a")
            .route_prefix("/a")
            .deployment(DeploymentSpec::builder("other", "t::Other"))
            .build()
            .unwrap();
        serve.run(other).await.unwrap();
        let table = follower.fresh().await;
        let fresh = &table.router.route("/a").unwrap().1.stats;
        assert!(!Arc::ptr_eq(fresh, &stats));
        assert!(fresh.read().is_empty());
        assert_eq!(follower.all_stats().len(), 1, "the old counters went");
        // Bounded: the oldest go first.
        let mut many = Retired::default();
        for i in 0..=RETIRED_ROUTES {
            many.retire(Arc::new(HttpStats::new(&format!("/r{i}"), "x", "ingress")));
        }
        assert_eq!(many.by_key.len(), RETIRED_ROUTES);
        assert!(
            !many
                .by_key
                .contains_key(&("/r0".to_owned(), "x".to_owned()))
        );
        serve.shutdown().await.unwrap();
    }
}
