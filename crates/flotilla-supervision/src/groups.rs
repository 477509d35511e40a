//! Process groups: the living actors of a deployment (its replicas) and of an
//! application (its DeploymentActors), so that a restarted parent finds and
//! re-adopts the children its predecessor left running.
//!
//! ractor's `pg` does the same, but a join there costs about ten allocations and
//! as many hash-map updates (scope and group keys, an index, per-actor relation
//! sets, listener notifications), and Flotilla joins one group per actor: at
//! 100,000 applications it was a tenth of a bulk deploy's user CPU. A group here
//! is one vector in one map, and membership ends when the member's [`Membership`]
//! (kept in the actor's state) is dropped, however the actor ended: a stop, a
//! failure, a kill, or its runtime going away.
//!
//! Group names are process-wide, as ractor's are: they start with the Serve
//! instance's namespace (see `flotilla_core::actor_names`).

use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex, MutexGuard, PoisonError},
};

use ractor::{ActorCell, ActorId, ActorStatus};

static GROUPS: LazyLock<Mutex<HashMap<String, Vec<ActorCell>>>> = LazyLock::new(Mutex::default);

fn groups() -> MutexGuard<'static, HashMap<String, Vec<ActorCell>>> {
    // A panic while holding the lock leaves the map consistent (every update
    // is a single push or remove), so a poisoned lock is still usable.
    GROUPS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An actor's place in a group; dropping it leaves the group.
#[derive(Debug)]
#[must_use = "dropping the membership leaves the group at once"]
pub struct Membership {
    group: String,
    id: ActorId,
}

impl Drop for Membership {
    fn drop(&mut self) {
        let mut groups = groups();
        if let Some(members) = groups.get_mut(&self.group) {
            members.retain(|c| c.get_id() != self.id);
            if members.is_empty() {
                groups.remove(&self.group);
            }
        }
    }
}

/// Put `actor` in `group` until the returned [`Membership`] is dropped.
pub fn join(group: String, actor: ActorCell) -> Membership {
    let id = actor.get_id();
    let mut groups = groups();
    match groups.get_mut(&group) {
        Some(members) => members.push(actor),
        None => {
            groups.insert(group.clone(), vec![actor]);
        }
    }
    Membership { group, id }
}

/// The members of `group` that are not stopping, oldest first.
pub fn members(group: &str) -> Vec<ActorCell> {
    groups()
        .get(group)
        .map_or_else(Vec::new, |members| living(members))
}

/// Those of `members` that are not stopping.
fn living(members: &[ActorCell]) -> Vec<ActorCell> {
    members
        .iter()
        .filter(|c| c.get_status() < ActorStatus::Stopping)
        .cloned()
        .collect()
}

/// Every non-empty group whose name starts with `prefix`, with its living
/// members, sorted by name.
pub fn with_prefix(prefix: &str) -> Vec<(String, Vec<ActorCell>)> {
    let groups = groups();
    let mut found: Vec<(String, Vec<ActorCell>)> = groups
        .iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(name, members)| (name.clone(), living(members)))
        .filter(|(_, living)| !living.is_empty())
        .collect();
    drop(groups);
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

#[cfg(test)]
mod tests {
    use ractor::{Actor, ActorProcessingErr, ActorRef};

    use super::*;

    /// Holds its membership in its state, as replicas and deployments do.
    struct Member;

    impl Actor for Member {
        type Msg = ();
        type State = Membership;
        type Arguments = String;

        async fn pre_start(
            &self,
            myself: ActorRef<()>,
            group: String,
        ) -> Result<Membership, ActorProcessingErr> {
            Ok(join(group, myself.get_cell()))
        }

        async fn handle(
            &self,
            _myself: ActorRef<()>,
            _msg: (),
            _state: &mut Membership,
        ) -> Result<(), ActorProcessingErr> {
            Err("asked to fail".into())
        }
    }

    fn ids(cells: &[ActorCell]) -> Vec<ActorId> {
        cells.iter().map(ActorCell::get_id).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn members_leave_however_they_end() {
        let g = "groups-test/a".to_owned();
        let (a, ha) = Actor::spawn(None, Member, g.clone()).await.unwrap();
        let (b, hb) = Actor::spawn(None, Member, g.clone()).await.unwrap();
        let (c, hc) = Actor::spawn(None, Member, g.clone()).await.unwrap();
        let (other, ho) = Actor::spawn(None, Member, "groups-test/b".to_owned())
            .await
            .unwrap();
        assert_eq!(
            ids(&members(&g)),
            vec![a.get_id(), b.get_id(), c.get_id()],
            "oldest first"
        );

        a.stop(None);
        ha.await.unwrap();
        b.kill();
        hb.await.unwrap();
        c.cast(()).unwrap(); // fails in its handler
        hc.await.unwrap();
        assert!(members(&g).is_empty());
        assert!(
            !groups().contains_key(&g),
            "an empty group is removed, not kept"
        );

        let found = with_prefix("groups-test/");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "groups-test/b");
        assert_eq!(ids(&found[0].1), vec![other.get_id()]);
        other.stop(None);
        ho.await.unwrap();
        assert!(with_prefix("groups-test/").is_empty());
    }
}
