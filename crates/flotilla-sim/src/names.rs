//! Application names and the simulation's application indexes.
//!
//! The simulation keys everything it tracks about an application (its slot in
//! the model, its traffic, its fault windows, its simulated code's random
//! streams) by a `u32` index. Applications of the imperative workload are named
//! from their index (`app-00042`, see [`app_name`]); applications declared by a
//! ServeConfig keep the names their config gives them, and [`AppNames`] remembers
//! which index each of those names has.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
};

use crate::workload::{app_index, app_name};

/// The index of every application name, both ways.
#[derive(Debug, Default)]
pub struct AppNames {
    declared: Mutex<Declared>,
}

#[derive(Debug, Default)]
struct Declared {
    by_name: HashMap<String, u32>,
    by_index: HashMap<u32, String>,
}

impl AppNames {
    /// No declared names yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Give the declared application `name` the index `idx` (once: a name keeps
    /// its first index).
    pub fn declare(&self, name: &str, idx: u32) {
        let mut d = self.lock();
        if d.by_name.contains_key(name) {
            return;
        }
        d.by_name.insert(name.to_owned(), idx);
        d.by_index.insert(idx, name.to_owned());
    }

    /// The index of application `name`, if it is a workload name or a declared one.
    pub fn index(&self, name: &str) -> Option<u32> {
        app_index(name).or_else(|| self.lock().by_name.get(name).copied())
    }

    /// The index a declared application `name` already has.
    pub fn declared(&self, name: &str) -> Option<u32> {
        self.lock().by_name.get(name).copied()
    }

    /// The name of application `idx`.
    pub fn name(&self, idx: u32) -> String {
        self.lock()
            .by_index
            .get(&idx)
            .cloned()
            .unwrap_or_else(|| app_name(idx))
    }

    fn lock(&self) -> MutexGuard<'_, Declared> {
        self.declared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_and_declared_names_map_to_indexes_both_ways() {
        let n = AppNames::new();
        assert_eq!(n.index("app-00007"), Some(7));
        assert_eq!(n.name(7), "app-00007");
        assert_eq!(n.index("shop"), None);
        n.declare("shop", 12);
        n.declare("shop", 99);
        assert_eq!(n.index("shop"), Some(12));
        assert_eq!(n.declared("shop"), Some(12));
        assert_eq!(n.declared("app-00007"), None);
        assert_eq!(n.name(12), "shop");
    }
}
