//! What one replica needs from a node.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The finest amount of a resource other than 0: Ray counts resources in
/// units of 1/10,000 (`RESOURCE_UNIT_SCALING`) and refuses a finer
/// fraction, as a config file does here. Not a rule of
/// [`Resources::validate`]: records checkpointed before it still read.
pub const MIN_RESOURCE_AMOUNT: f64 = 0.0001;

/// `amount` of `field`, refused if it is finer than [`MIN_RESOURCE_AMOUNT`]
/// but not 0 (Ray's `_validate_resource_quantity`).
pub(crate) fn check_precision(field: &'static str, amount: f64) -> Result<(), Error> {
    if amount > 0.0 && amount < MIN_RESOURCE_AMOUNT {
        return Err(Error::field(
            field,
            format!(
                "the precision of a fractional amount cannot go beyond \
                 {MIN_RESOURCE_AMOUNT} (as Ray's), got {amount}"
            ),
        ));
    }
    Ok(())
}

/// Resources one replica reserves on its node (Ray's `ray_actor_options`).
/// Part of the code version: changing them replaces replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// Logical CPUs (Ray's default for a replica is 1).
    pub cpus: f64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// GPUs.
    pub gpus: f64,
    /// Custom resources by name, sorted so the version hash is stable.
    pub custom: BTreeMap<String, f64>,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: 1.0,
            memory_bytes: 0,
            gpus: 0.0,
            custom: BTreeMap::new(),
        }
    }
}

impl Resources {
    /// Nothing at all: a replica that fits anywhere.
    pub fn none() -> Self {
        Resources {
            cpus: 0.0,
            ..Resources::default()
        }
    }

    /// Set the CPUs.
    pub fn with_cpus(mut self, cpus: f64) -> Self {
        self.cpus = cpus;
        self
    }

    /// Set the memory in bytes.
    pub fn with_memory(mut self, bytes: u64) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// Set the GPUs.
    pub fn with_gpus(mut self, gpus: f64) -> Self {
        self.gpus = gpus;
        self
    }

    /// Add a custom resource.
    pub fn with_custom(mut self, name: impl Into<String>, amount: f64) -> Self {
        self.custom.insert(name.into(), amount);
        self
    }

    /// Every amount is finite and non-negative, and custom names are non-empty.
    pub fn validate(&self) -> Result<(), Error> {
        let check = |field: &'static str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(Error::field(
                    field,
                    format!("must be a finite amount >= 0, got {v}"),
                ))
            }
        };
        check("resources.cpus", self.cpus)?;
        check("resources.gpus", self.gpus)?;
        for (name, v) in &self.custom {
            if name.is_empty() {
                return Err(Error::field(
                    "resources.custom",
                    "a custom resource needs a name",
                ));
            }
            check("resources.custom", *v)?;
        }
        Ok(())
    }
}
