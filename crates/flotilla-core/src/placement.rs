//! Where a deployment's replicas may go: Ray's placement groups
//! (`placement_group_bundles`, `placement_group_strategy`) and
//! `max_replicas_per_node`.
//!
//! This module holds and validates the settings; the cluster's placement
//! applies them (`flotilla-cluster`'s `PlacementRequest` carries them to every
//! cluster: the limit per node, and the bundles placed by the strategy). Like
//! resources, they are part of a deployment's code version: a change
//! replaces its replicas (Ray restarts replica actors when placement group options
//! or `max_replicas_per_node` change).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    Resources,
    error::{Error, shown},
};

/// Most replicas of one deployment per node that `max_replicas_per_node` may
/// allow (Ray's `MAX_REPLICAS_PER_NODE_MAX_VALUE`).
pub const MAX_REPLICAS_PER_NODE: u32 = 100;

/// How a replica's bundles are placed (Ray's placement group strategies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PlacementStrategy {
    /// Bundles on as few nodes as possible (best effort): the bundles' sum on
    /// one node where one has room for it; otherwise each bundle, in order, on
    /// a node an earlier bundle took if it has room, else on another (pending
    /// only while some bundle fits no node). The default.
    #[default]
    Pack,
    /// Bundles on distinct nodes where the cluster has several with room;
    /// where it has too few, bundles share a node (best effort).
    Spread,
    /// All bundles on one node: their sum is reserved there.
    StrictPack,
    /// Every bundle on a different node; pending while the cluster has too few.
    StrictSpread,
}

impl PlacementStrategy {
    /// Ray's name (`PACK`, `SPREAD`, `STRICT_PACK`, `STRICT_SPREAD`).
    pub fn name(self) -> &'static str {
        match self {
            PlacementStrategy::Pack => "PACK",
            PlacementStrategy::Spread => "SPREAD",
            PlacementStrategy::StrictPack => "STRICT_PACK",
            PlacementStrategy::StrictSpread => "STRICT_SPREAD",
        }
    }

    /// Whether the strategy puts its bundles together: on one node
    /// (`STRICT_PACK`; `PACK` where a node has room for them all, else on as
    /// few as it can).
    pub fn packs(self) -> bool {
        matches!(
            self,
            PlacementStrategy::Pack | PlacementStrategy::StrictPack
        )
    }
}

/// A placement group reserved for each replica: the bundles, and how they are
/// placed. The replica itself runs in the first bundle, so its resources must
/// fit in it (Ray's rule).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacementGroup {
    /// What each bundle reserves; at least one, none empty.
    pub bundles: Vec<Resources>,
    /// How the bundles are placed.
    pub strategy: PlacementStrategy,
}

impl PlacementGroup {
    /// `bundles` placed with `strategy`.
    pub fn new(bundles: Vec<Resources>, strategy: PlacementStrategy) -> Self {
        PlacementGroup { bundles, strategy }
    }

    /// What all bundles reserve together (what one node holds under `PACK` and
    /// `STRICT_PACK`).
    pub fn total(&self) -> Resources {
        let mut sum = Resources::none();
        for b in &self.bundles {
            sum.cpus += b.cpus;
            sum.gpus += b.gpus;
            sum.memory_bytes = sum.memory_bytes.saturating_add(b.memory_bytes);
            for (k, v) in &b.custom {
                *sum.custom.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        sum
    }

    /// At least one bundle, every bundle valid and not empty, and `replica` (the
    /// replica's own resources) within the first bundle. Errors name the config
    /// file's field (`placement_group_bundles`).
    pub fn validate(&self, replica: &Resources) -> Result<(), Error> {
        const FIELD: &str = "placement_group_bundles";
        let Some(first) = self.bundles.first() else {
            return Err(Error::field(
                FIELD,
                "Bundles must be a non-empty list of resource dictionaries, \
                 e.g. [{CPU: 1}, {GPU: 1}]; got an empty list",
            ));
        };
        for (i, b) in self.bundles.iter().enumerate() {
            b.validate().map_err(|e| {
                Error::field(FIELD, format!("bundle #{}: {}", i + 1, reason_of(&e)))
            })?;
            if b.cpus == 0.0
                && b.gpus == 0.0
                && b.memory_bytes == 0
                && b.custom.values().all(|v| *v == 0.0)
            {
                return Err(Error::field(
                    FIELD,
                    format!(
                        "bundle #{}: a bundle cannot be empty or hold only zero amounts",
                        i + 1
                    ),
                ));
            }
        }
        let short = |what: &str, need: f64, has: f64| {
            Error::field(
                FIELD,
                format!(
                    "the replica runs in the first bundle, so its resources must fit in it: \
                     it needs {need} {what}, but the first bundle has {has}"
                ),
            )
        };
        if replica.cpus > first.cpus {
            return Err(short("CPU", replica.cpus, first.cpus));
        }
        if replica.gpus > first.gpus {
            return Err(short("GPU", replica.gpus, first.gpus));
        }
        for (k, need) in &replica.custom {
            let has = first.custom.get(k).copied().unwrap_or(0.0);
            if *need > has {
                return Err(short(&format!("'{}'", shown(k)), *need, has));
            }
        }
        Ok(())
    }
}

fn reason_of(e: &Error) -> String {
    match e {
        Error::InvalidField { field, reason, .. } => format!("{field}: {reason}"),
        other => other.to_string(),
    }
}

/// `max_replicas_per_node` in range (1 to [`MAX_REPLICAS_PER_NODE`]).
pub(crate) fn validate_max_replicas_per_node(n: u32) -> Result<(), Error> {
    if (1..=MAX_REPLICAS_PER_NODE).contains(&n) {
        Ok(())
    } else {
        Err(Error::field(
            "max_replicas_per_node",
            format!(
                "Invalid max_replicas_per_node {n}. Valid values are None or an integer in \
                 the range of [1, {MAX_REPLICAS_PER_NODE}]"
            ),
        ))
    }
}

/// Why a bundle of a config file is not a set of resources.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BundleError {
    /// `memory` is not a whole number of bytes.
    #[error("`memory` is a whole number of bytes >= 0, got {0}")]
    Memory(f64),
}

/// A bundle as a config file writes it (`{CPU: 1, GPU: 1, memory: 2e9, x: 1}`)
/// as [`Resources`]: `CPU`, `GPU` and `memory` (bytes, whole) are the fields of
/// the same name, every other key is a custom resource. `object_store_memory`
/// is dropped (Flotilla has no object store; Ray only warns about it too).
pub fn bundle_resources(bundle: &BTreeMap<String, f64>) -> Result<Resources, BundleError> {
    let mut r = Resources::none();
    for (k, v) in bundle {
        match k.as_str() {
            "CPU" => r.cpus = *v,
            "GPU" => r.gpus = *v,
            "memory" => {
                if !(v.is_finite() && *v >= 0.0 && v.fract() == 0.0 && *v <= u64::MAX as f64) {
                    return Err(BundleError::Memory(*v));
                }
                r.memory_bytes = *v as u64;
            }
            "object_store_memory" => {}
            other => {
                r.custom.insert(other.to_owned(), *v);
            }
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(cpus: f64) -> Resources {
        Resources::none().with_cpus(cpus)
    }

    #[test]
    fn the_replica_must_fit_in_the_first_bundle() {
        let pg = PlacementGroup::new(vec![bundle(1.0), bundle(2.0)], PlacementStrategy::Pack);
        pg.validate(&Resources::default()).unwrap();
        let e = pg
            .validate(&Resources::default().with_cpus(1.5))
            .unwrap_err();
        assert_eq!(e.field_name(), Some("placement_group_bundles"));
        assert!(e.to_string().contains("first bundle has 1"), "{e}");
        let gpu = PlacementGroup::new(
            vec![Resources::none().with_gpus(1.0)],
            PlacementStrategy::Pack,
        );
        // The replica's default CPU does not fit a GPU-only bundle (Ray's rule).
        assert!(gpu.validate(&Resources::default()).is_err());
        gpu.validate(&Resources::none().with_gpus(1.0)).unwrap();
        let custom = PlacementGroup::new(vec![bundle(1.0)], PlacementStrategy::Pack);
        assert!(
            custom
                .validate(&Resources::none().with_custom("tpu", 1.0))
                .is_err()
        );
    }

    #[test]
    fn empty_and_all_zero_bundles_are_refused() {
        let none = PlacementGroup::new(vec![], PlacementStrategy::Spread);
        assert!(none.validate(&Resources::none()).is_err());
        let zero = PlacementGroup::new(vec![bundle(1.0), bundle(0.0)], PlacementStrategy::Spread);
        let e = zero.validate(&Resources::none()).unwrap_err();
        assert!(e.to_string().contains("bundle #2"), "{e}");
        let negative = PlacementGroup::new(vec![bundle(-1.0)], PlacementStrategy::Spread);
        assert!(negative.validate(&Resources::none()).is_err());
    }

    #[test]
    fn total_sums_every_bundle() {
        let pg = PlacementGroup::new(
            vec![
                Resources::none().with_cpus(1.0).with_custom("x", 1.0),
                Resources::none()
                    .with_cpus(2.0)
                    .with_gpus(1.0)
                    .with_memory(5),
            ],
            PlacementStrategy::StrictPack,
        );
        assert_eq!(
            pg.total(),
            Resources::none()
                .with_cpus(3.0)
                .with_gpus(1.0)
                .with_memory(5)
                .with_custom("x", 1.0)
        );
        assert!(pg.strategy.packs());
        assert!(!PlacementStrategy::StrictSpread.packs());
    }

    #[test]
    fn bundles_map_rays_keys() {
        let b: BTreeMap<String, f64> = [
            ("CPU".to_owned(), 2.0),
            ("GPU".to_owned(), 1.0),
            ("memory".to_owned(), 1.5e9),
            ("object_store_memory".to_owned(), 1.0),
            ("accel".to_owned(), 0.5),
        ]
        .into();
        assert_eq!(
            bundle_resources(&b).unwrap(),
            Resources::none()
                .with_cpus(2.0)
                .with_gpus(1.0)
                .with_memory(1_500_000_000)
                .with_custom("accel", 0.5)
        );
        let frac: BTreeMap<String, f64> = [("memory".to_owned(), 1.5)].into();
        assert!(bundle_resources(&frac).is_err());
    }

    #[test]
    fn max_replicas_per_node_is_one_to_a_hundred() {
        assert!(validate_max_replicas_per_node(0).is_err());
        assert!(validate_max_replicas_per_node(1).is_ok());
        assert!(validate_max_replicas_per_node(100).is_ok());
        assert!(validate_max_replicas_per_node(101).is_err());
    }
}
