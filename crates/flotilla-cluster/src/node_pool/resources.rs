//! Resource arithmetic: whether a request fits a node, the dimensions it
//! asks for, and adding or giving back what a replica holds.

use flotilla_core::Resources;

/// Slack for comparing fractional resource amounts.
pub(super) const EPS: f64 = 1e-9;

/// Whether `need` fits a node offering `capacity` of which `used` is taken.
/// Allocates nothing: it runs for every node of every placement.
pub(super) fn fits(capacity: &Resources, used: &Resources, need: &Resources) -> bool {
    let room = |need: f64, capacity: f64, used: f64| need <= 0.0 || need <= capacity - used + EPS;
    let custom = |r: &Resources, k: &str| r.custom.get(k).copied().unwrap_or(0.0);
    room(need.cpus, capacity.cpus, used.cpus)
        && room(
            need.memory_bytes as f64,
            capacity.memory_bytes as f64,
            used.memory_bytes as f64,
        )
        && room(need.gpus, capacity.gpus, used.gpus)
        && need
            .custom
            .iter()
            .all(|(k, v)| room(*v, custom(capacity, k), custom(used, k)))
}

/// One resource dimension.
pub(super) enum Dim {
    Cpus,
    Memory,
    Gpus,
    Custom(String),
}

impl Dim {
    pub(super) fn amount(&self, r: &Resources) -> f64 {
        match self {
            Dim::Cpus => r.cpus,
            Dim::Memory => r.memory_bytes as f64,
            Dim::Gpus => r.gpus,
            Dim::Custom(name) => r.custom.get(name).copied().unwrap_or(0.0),
        }
    }

    pub(super) fn name(&self) -> &str {
        match self {
            Dim::Cpus => "cpus",
            Dim::Memory => "memory_bytes",
            Dim::Gpus => "gpus",
            Dim::Custom(name) => name,
        }
    }
}

/// The dimensions `need` asks for (amounts above zero).
pub(super) fn dims(need: &Resources) -> Vec<Dim> {
    let mut out: Vec<Dim> = [Dim::Cpus, Dim::Memory, Dim::Gpus]
        .into_iter()
        .filter(|d| d.amount(need) > 0.0)
        .collect();
    out.extend(
        need.custom
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(k, _)| Dim::Custom(k.clone())),
    );
    out
}

pub(super) fn add(used: &mut Resources, r: &Resources, sign: f64) {
    used.cpus += sign * r.cpus;
    used.gpus += sign * r.gpus;
    used.memory_bytes = if sign > 0.0 {
        used.memory_bytes.saturating_add(r.memory_bytes)
    } else {
        used.memory_bytes.saturating_sub(r.memory_bytes)
    };
    for (k, v) in &r.custom {
        *used.custom.entry(k.clone()).or_insert(0.0) += sign * v;
    }
}
