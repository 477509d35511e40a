//! The peer nodes a node keeps away: those its head declared lost (or that
//! left). A node cut off from the head but not from its peers dials them
//! again; its sessions are dropped as they open, so no call reaches the
//! replicas its head is replacing.

use std::collections::{HashSet, VecDeque};

use super::registry::DEAD_NODES_KEPT;

/// Peer ractor names kept away, at most [`DEAD_NODES_KEPT`] (the oldest go
/// first). A name belongs to one incarnation, so a node that comes back
/// comes under a new one; a name the head lists alive again (a restarted
/// head that took the node back) is let in again.
#[derive(Debug, Default)]
pub(crate) struct Fenced {
    order: VecDeque<String>,
    names: HashSet<String>,
}

impl Fenced {
    /// Take in a `Nodes` frame: the peers the head listed before (`listed`)
    /// and omits now (`alive`), and those dropped as gone (`lost`), are kept
    /// away; those it lists alive are not.
    pub(crate) fn note(&mut self, listed: &HashSet<String>, alive: &[String], lost: &[String]) {
        let now: HashSet<&String> = alive.iter().collect();
        let gone = listed.iter().filter(|p| !now.contains(p)).chain(lost);
        for peer in gone {
            if self.names.insert(peer.clone()) {
                self.order.push_back(peer.clone());
            }
        }
        for peer in alive {
            if self.names.remove(peer) {
                self.order.retain(|p| p != peer);
            }
        }
        while self.order.len() > DEAD_NODES_KEPT {
            if let Some(oldest) = self.order.pop_front() {
                self.names.remove(&oldest);
            }
        }
    }

    /// Whether `peer` is kept away.
    pub(crate) fn contains(&self, peer: &str) -> bool {
        self.names.contains(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|p| (*p).to_owned()).collect()
    }

    #[test]
    fn peers_the_head_drops_are_kept_away_until_it_lists_them_again() {
        let mut fenced = Fenced::default();
        let listed: HashSet<String> = names(&["node-a@h", "node-m@h"]).into_iter().collect();
        // m is omitted (declared lost); c was inherited and dropped as gone.
        fenced.note(&listed, &names(&["node-a@h"]), &names(&["node-c@h"]));
        assert!(fenced.contains("node-m@h"));
        assert!(fenced.contains("node-c@h"));
        assert!(!fenced.contains("node-a@h"));
        // A frame that lists m again (a restarted head took it back).
        fenced.note(&HashSet::new(), &names(&["node-a@h", "node-m@h"]), &[]);
        assert!(!fenced.contains("node-m@h"));
        assert!(fenced.contains("node-c@h"));
    }

    #[test]
    fn at_most_so_many_are_kept_the_oldest_forgotten_first() {
        let mut fenced = Fenced::default();
        for i in 0..DEAD_NODES_KEPT + 2 {
            fenced.note(&HashSet::new(), &[], &[format!("node-{i}@h")]);
        }
        assert!(!fenced.contains("node-0@h"));
        assert!(!fenced.contains("node-1@h"));
        assert!(fenced.contains("node-2@h"));
        assert_eq!(fenced.names.len(), DEAD_NODES_KEPT);
        assert_eq!(fenced.order.len(), DEAD_NODES_KEPT);
    }
}
