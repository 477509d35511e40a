//! A parent's children, keyed by name: the one way Flotilla's parents spawn,
//! watch, adopt, restart and escalate.

use std::{collections::HashMap, fmt::Debug, hash::Hash, time::Duration};

use ractor::{Actor, ActorCell, ActorId, ActorRef, ActorStatus, Message, SpawnErr};
use tokio::time::Instant;

/// How long a retry scheduled beyond what an `Instant` reaches waits (about
/// 30 years, as tokio's own far future).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

use crate::{ChildExit, RestartLog, RestartPolicy};

/// A parent's children, each under a key (an application's name, a
/// deployment's, a replica's id), like quickwit's `Supervisor<A>`:
///
/// - [`start`](Self::start) spawns a child under its registered name and
///   watches it. The watch is a monitor, never a link: a child outlives a crash
///   of its parent, and the parent's successor [`adopt`](Self::adopt)s it.
///   A name held by a living actor the parent did not know (an adoption that
///   timed out, a predecessor's child) is adopted instead of failing.
/// - [`exited`](Self::exited) turns a supervision event into the key and a
///   typed [`ChildExit`], and ignores exits of actors that are not the key's
///   current child (stale ones, after a replacement or an adoption).
/// - [`on_crash`](Self::on_crash) counts a crash against the
///   [`RestartPolicy`]: the delay before the restart, or `None` to escalate;
///   [`retry_later`](Self::retry_later) schedules it as a message to the parent.
///
/// The parent keeps its own data about each child (a target, a status) beside
/// it; this type holds only what supervision needs.
///
/// ```
/// use flotilla_supervision::{Children, RestartPolicy};
/// let mut children: Children<String, ()> = Children::new();
/// assert!(children.actor(&"app".to_owned()).is_none());
/// assert_eq!(children.on_crash(&"app".to_owned(), &RestartPolicy::default()),
///            Some(std::time::Duration::from_millis(10)));
/// ```
pub struct Children<K, M> {
    slots: HashMap<K, Slot<M>>,
    by_actor: HashMap<ActorId, K>,
    restarts: u64,
    /// The parent watching them, once it watches one: when these children are
    /// dropped (the parent ended, crashed or not), it stops watching them.
    /// Else every parent that ever watched a child would stay in the child's
    /// monitor list, its actor kept alive, for the child's life.
    parent: Option<ActorCell>,
}

struct Slot<M> {
    actor: Option<ActorRef<M>>,
    log: RestartLog,
    /// A restart is scheduled for this instant: nothing starts the child
    /// before it is due, and a retry message that comes earlier (one
    /// scheduled before a longer backoff) is stale.
    waiting: Option<Instant>,
}

impl<M> Default for Slot<M> {
    fn default() -> Self {
        Slot {
            actor: None,
            log: RestartLog::default(),
            waiting: None,
        }
    }
}

impl<K, M> Default for Children<K, M> {
    fn default() -> Self {
        Children {
            slots: HashMap::new(),
            by_actor: HashMap::new(),
            restarts: 0,
            parent: None,
        }
    }
}

impl<K, M> Children<K, M> {
    /// Stop watching `actor`, a child no longer tracked here (as `Drop` does
    /// for every child left): it does not keep this parent in its monitor list.
    fn unwatch(&self, actor: &ActorRef<M>) {
        if let Some(parent) = &self.parent {
            parent.unmonitor(actor.get_cell());
        }
    }
}

impl<K, M> Drop for Children<K, M> {
    fn drop(&mut self) {
        for actor in self.slots.values().filter_map(|s| s.actor.as_ref()) {
            self.unwatch(actor);
        }
    }
}

impl<K: Debug, M> Debug for Children<K, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Children")
            .field("children", &self.slots.len())
            .field("living", &self.by_actor.len())
            .field("restarts", &self.restarts)
            .finish()
    }
}

/// How a child came to be watched.
#[derive(Debug)]
pub enum Started<M> {
    /// Spawned now.
    Spawned(ActorRef<M>),
    /// Its name was held by a living actor, which is the child now: it did not
    /// get the spawn's arguments, so tell it what it must know.
    Adopted(ActorRef<M>),
}

impl<M> Started<M> {
    /// The child.
    pub fn actor(&self) -> &ActorRef<M> {
        match self {
            Started::Spawned(a) | Started::Adopted(a) => a,
        }
    }
}

/// Why a child could not be started now (the parent retries later).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The spawn failed and no living actor holds the name (its holder is
    /// still stopping, or the child's start-up failed): nothing ran as this
    /// child.
    #[error("the child could not be spawned: {0}")]
    Spawn(#[source] SpawnErr),
    /// The actor spawned for it stopped before it could be watched (a monitor
    /// set that late may never fire, so it is not counted as a child): it
    /// ran, and ended.
    #[error("the child stopped before it could be watched")]
    Exited,
}

impl<K, M> Children<K, M>
where
    K: Eq + Hash + Clone,
    M: Message,
{
    /// No children.
    pub fn new() -> Self {
        Self::default()
    }

    /// No children yet, with room for `n` of them (a parent about to adopt
    /// or start that many).
    pub fn with_capacity(n: usize) -> Self {
        Children {
            slots: HashMap::with_capacity(n),
            by_actor: HashMap::with_capacity(n),
            restarts: 0,
            parent: None,
        }
    }

    /// The living child of `key`, if it has one.
    pub fn actor(&self, key: &K) -> Option<&ActorRef<M>> {
        self.slots.get(key)?.actor.as_ref()
    }

    /// Every living child.
    pub fn actors(&self) -> impl Iterator<Item = (&K, &ActorRef<M>)> {
        self.slots
            .iter()
            .filter_map(|(k, s)| s.actor.as_ref().map(|a| (k, a)))
    }

    /// How many children live.
    pub fn living(&self) -> usize {
        self.by_actor.len()
    }

    /// Crashes counted so far, over every child.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// Spawn `actor` as the child `key`, registered as `name`, watched by
    /// `parent`. The spawn's start-up future is boxed, so it does not sit in the
    /// parent's own (long-lived) message future.
    pub async fn start<A>(
        &mut self,
        parent: &ActorCell,
        key: K,
        name: String,
        actor: A,
        args: A::Arguments,
    ) -> Result<Started<M>, StartError>
    where
        A: Actor<Msg = M>,
    {
        let spawned = Box::pin(Actor::spawn(Some(name.clone()), actor, args)).await;
        match spawned {
            Ok((child, _)) => {
                if self.watch(parent, key, child.clone()) {
                    Ok(Started::Spawned(child))
                } else {
                    Err(StartError::Exited)
                }
            }
            Err(e) => match ActorRef::<M>::where_is(name) {
                // A holder already stopping is not this child: the name is
                // still taken, as if no actor held it (try again later).
                Some(holder) if self.watch(parent, key, holder.clone()) => {
                    Ok(Started::Adopted(holder))
                }
                _ => Err(StartError::Spawn(e)),
            },
        }
    }

    /// Watch the living `actor` as the child `key` (a parent adopting what its
    /// predecessor left running). Returns false if it is already stopping.
    pub fn adopt(&mut self, parent: &ActorCell, key: K, actor: ActorRef<M>) -> bool {
        self.watch(parent, key, actor)
    }

    fn watch(&mut self, parent: &ActorCell, key: K, actor: ActorRef<M>) -> bool {
        // Watch first: an exit between the check and the watch would be missed.
        parent.monitor(actor.get_cell());
        if actor.get_status() >= ActorStatus::Stopping {
            parent.unmonitor(actor.get_cell());
            return false;
        }
        if self.parent.is_none() {
            self.parent = Some(parent.clone());
        }
        let id = actor.get_id();
        let slot = self.slots.entry(key.clone()).or_default();
        if let Some(old) = slot.actor.replace(actor) {
            self.by_actor.remove(&old.get_id());
        }
        self.by_actor.insert(id, key);
        true
    }

    /// Which child `event` says ended, and how. `None` when it is not an exit,
    /// or not of a current child (an unknown actor, or one replaced since).
    pub fn exited(&mut self, event: &ractor::SupervisionEvent) -> Option<(K, ChildExit)> {
        let (id, how) = ChildExit::of(event)?;
        let key = self.by_actor.remove(&id)?;
        if let Some(slot) = self.slots.get_mut(&key) {
            slot.actor = None;
        }
        Some((key, how))
    }

    /// Count a crash of `key`: `Some(delay)` to restart it after, `None` when
    /// it crashed more often than `policy` allows (escalate).
    pub fn on_crash(&mut self, key: &K, policy: &RestartPolicy) -> Option<Duration> {
        self.restarts += 1;
        self.slots
            .entry(key.clone())
            .or_default()
            .log
            .on_crash(policy)
    }

    /// Start `key` again after `after`: `msg(key)` reaches `myself` then, and
    /// until [`retry_due`](Self::retry_due) the key [`is_waiting`](Self::is_waiting).
    /// A restart already scheduled later than that stays as it is.
    pub fn retry_later<P: Message>(
        &mut self,
        key: K,
        after: Duration,
        myself: &ActorRef<P>,
        msg: impl FnOnce(K) -> P + Send + 'static,
    ) where
        K: Send + 'static,
    {
        // A policy's backoff may be huge (`Duration::MAX`): then never due,
        // but no overflow.
        let now = Instant::now();
        let due = now.checked_add(after).unwrap_or_else(|| now + FAR_FUTURE);
        let slot = self.slots.entry(key.clone()).or_default();
        if slot.waiting.is_some_and(|at| at >= due) {
            return;
        }
        slot.waiting = Some(due);
        myself.send_after(after, move || msg(key));
    }

    /// Whether a restart of `key` is scheduled and not yet due.
    pub fn is_waiting(&self, key: &K) -> bool {
        self.slots.get(key).is_some_and(|s| s.waiting.is_some())
    }

    /// Cancel every scheduled restart and return the keys that had one, for a
    /// parent that must start them at once (a shutdown that drains each
    /// child's work cannot wait out a backoff). Their retry messages, when
    /// they come, are stale ([`retry_due`](Self::retry_due) is false).
    pub fn end_waits(&mut self) -> Vec<K> {
        self.slots
            .iter_mut()
            .filter_map(|(k, s)| s.waiting.take().map(|_| k.clone()))
            .collect()
    }

    /// A retry message of `key` came (the one [`retry_later`](Self::retry_later)
    /// scheduled): true when the scheduled restart is due now, and no longer
    /// waiting; false for a stale message (nothing scheduled, or a later
    /// restart scheduled since), which the parent ignores.
    pub fn retry_due(&mut self, key: &K) -> bool {
        let Some(s) = self.slots.get_mut(key) else {
            return false;
        };
        match s.waiting {
            Some(at) if at <= Instant::now() => {
                s.waiting = None;
                true
            }
            _ => false,
        }
    }

    /// Forget `key` altogether (its child, restarts and any scheduled restart:
    /// a due restart of a forgotten key finds nothing to do).
    pub fn remove(&mut self, key: &K) -> Option<ActorRef<M>> {
        let actor = self.slots.remove(key)?.actor?;
        self.by_actor.remove(&actor.get_id());
        self.unwatch(&actor);
        Some(actor)
    }
}
