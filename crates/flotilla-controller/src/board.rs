//! The status board: every application's published status, outliving actor crashes.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use flotilla_application::publish_status;
use flotilla_core::{AppName, ApplicationStatusInfo, DeploymentName};
use tokio::sync::watch;

struct Entry {
    tx: watch::Sender<ApplicationStatusInfo>,
    /// Unknown while a config deploy is still building the application.
    ingress: Option<DeploymentName>,
}

/// Per application: a `watch` channel of its status and its ingress. The
/// Controller adds and removes entries; ApplicationActors publish into them;
/// callers subscribe to wait for a status without polling.
#[derive(Clone, Default)]
pub struct StatusBoard {
    entries: Arc<RwLock<HashMap<AppName, Entry>>>,
}

impl std::fmt::Debug for StatusBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusBoard")
            .field("apps", &self.len())
            .finish()
    }
}

impl StatusBoard {
    /// An empty board.
    pub fn new() -> Self {
        Self::default()
    }

    /// Publish `info` as `app`'s status (through
    /// [`publish_status`]: never back a generation, every transition logged),
    /// putting `app` on the board if it is not yet there: its first status is
    /// a transition from NOT_STARTED, logged as any other. Under the board's
    /// lock, so no reader sees the new entry before its status. A known
    /// ingress is recorded (`None` keeps what was there). Returns whether the
    /// status changed.
    pub fn publish(
        &self,
        app: &AppName,
        ingress: Option<&DeploymentName>,
        info: ApplicationStatusInfo,
    ) -> bool {
        let mut m = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(app.clone()).or_insert_with(|| Entry {
            tx: watch::Sender::new(ApplicationStatusInfo::not_started(app.as_str())),
            ingress: None,
        });
        if let Some(i) = ingress {
            e.ingress = Some(i.clone());
        }
        publish_status(&e.tx, app, info)
    }

    /// The sender of `app`, created with `initial` if absent (a status
    /// restored from the checkpoint as the Controller starts: no transition,
    /// so not logged); a known ingress is recorded (`None` keeps what was
    /// there).
    pub fn sender(
        &self,
        app: &AppName,
        ingress: Option<&DeploymentName>,
        initial: impl FnOnce() -> ApplicationStatusInfo,
    ) -> watch::Sender<ApplicationStatusInfo> {
        let mut m = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(app.clone()).or_insert_with(|| Entry {
            tx: watch::Sender::new(initial()),
            ingress: None,
        });
        if let Some(i) = ingress {
            e.ingress = Some(i.clone());
        }
        e.tx.clone()
    }

    /// Watch `app`'s status; `None` if it does not exist.
    pub fn subscribe(&self, app: &str) -> Option<watch::Receiver<ApplicationStatusInfo>> {
        let m = self.entries.read().unwrap_or_else(|p| p.into_inner());
        m.get(app).map(|e| e.tx.subscribe())
    }

    /// Watch `app`'s status; a closed channel showing NOT_STARTED if it does
    /// not exist (so that a watcher reads "gone" either way).
    pub fn watch(&self, app: &str) -> watch::Receiver<ApplicationStatusInfo> {
        self.subscribe(app)
            .unwrap_or_else(|| watch::channel(ApplicationStatusInfo::not_started(app)).1)
    }

    /// `app`'s status (NOT_STARTED if it does not exist).
    pub fn status(&self, app: &str) -> ApplicationStatusInfo {
        let m = self.entries.read().unwrap_or_else(|p| p.into_inner());
        m.get(app)
            .map(|e| e.tx.borrow().clone())
            .unwrap_or_else(|| ApplicationStatusInfo::not_started(app))
    }

    /// `app`'s ingress deployment, if it exists.
    pub fn ingress(&self, app: &str) -> Option<DeploymentName> {
        let m = self.entries.read().unwrap_or_else(|p| p.into_inner());
        m.get(app).and_then(|e| e.ingress.clone())
    }

    /// Every application's status, sorted by name.
    pub fn all(&self) -> Vec<(AppName, ApplicationStatusInfo)> {
        let m = self.entries.read().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = m
            .iter()
            .map(|(n, e)| (n.clone(), e.tx.borrow().clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Remove a deleted application: publish NOT_STARTED, then drop the channel so
    /// watchers see it closed.
    pub fn remove(&self, app: &AppName) {
        let removed = self
            .entries
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(app);
        if let Some(e) = removed {
            let mut gone = ApplicationStatusInfo::not_started(app.as_str());
            gone.observed_generation = e.tx.borrow().observed_generation;
            // Its watchers read it as the channel closes.
            publish_status(&e.tx, app, gone);
        }
    }

    /// Remove (as [`remove`](Self::remove) does) every application `keep`
    /// refuses; returns how many were removed.
    pub fn retain(&self, keep: impl Fn(&AppName, &ApplicationStatusInfo) -> bool) -> usize {
        let gone: Vec<AppName> = {
            let m = self.entries.read().unwrap_or_else(|p| p.into_inner());
            m.iter()
                .filter(|(n, e)| !keep(n, &e.tx.borrow()))
                .map(|(n, _)| n.clone())
                .collect()
        };
        for name in &gone {
            self.remove(name);
        }
        gone.len()
    }

    /// How many applications are on the board.
    pub fn len(&self) -> usize {
        self.entries.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether the board is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
