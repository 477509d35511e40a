//! Everything the checkpoint holds, as read by one transaction.

use std::path::PathBuf;

use flotilla_core::{AppName, AppRecord, DeploymentName, DeploymentRecord};
use serde::de::DeserializeOwned;

use redb::TableHandle;

use crate::StoreError;
use crate::tables::{CONFIG, CONFIG_KEY};

/// The whole checkpoint as [`Store::load`](crate::Store::load) read it, in one read
/// transaction. Applications are sorted by name, deployments by (application,
/// deployment).
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// Every application record.
    pub apps: Vec<AppRecord>,
    /// Every deployment record, with its application and deployment names.
    pub deployments: Vec<(AppName, DeploymentName, DeploymentRecord)>,
    /// The raw MessagePack of the "last applied config" slot, if it is set.
    pub config: Option<Vec<u8>>,
}

impl Snapshot {
    /// Decode the "last applied config" slot as the Controller's type `T`; `Ok(None)` if
    /// the slot is empty.
    ///
    /// A value that does not decode as `T` is [`StoreError::Corrupt`], actor_names the table
    /// and key. A snapshot does not know which file it was read from, so the error's
    /// path is empty (it reads "(loaded snapshot)").
    pub fn config<T: DeserializeOwned>(&self) -> Result<Option<T>, StoreError> {
        self.config
            .as_deref()
            .map(|bytes| {
                crate::codec::decode(
                    &PathBuf::new(),
                    CONFIG.name(),
                    &format_args!("{CONFIG_KEY:?}"),
                    bytes,
                )
            })
            .transpose()
    }
}
