//! Everything the checkpoint holds, as read by one transaction.

use std::path::{Path, PathBuf};

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

    /// [`config`](Self::config), as read from the file at `path`, and checked by
    /// `check` (the Controller's validation): a value that does not decode or
    /// does not pass is [`StoreError::Corrupt`] naming the file, the table and
    /// the key, and keeping the error that found it.
    pub fn config_checked<T, E>(
        &self,
        path: &Path,
        check: impl FnOnce(&T) -> Result<(), E>,
    ) -> Result<Option<T>, StoreError>
    where
        T: DeserializeOwned,
        E: std::error::Error + Send + Sync + 'static,
    {
        let Some(bytes) = self.config.as_deref() else {
            return Ok(None);
        };
        let config: T =
            crate::codec::decode(path, CONFIG.name(), &format_args!("{CONFIG_KEY:?}"), bytes)?;
        check(&config).map_err(|e| {
            let reason = format!("table `{}`, key {CONFIG_KEY:?}: {e}", CONFIG.name());
            StoreError::corrupt_because(path, reason, e)
        })?;
        Ok(Some(config))
    }
}
