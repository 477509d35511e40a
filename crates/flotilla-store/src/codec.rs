//! MessagePack encoding of stored values (rmp-serde, named fields).

use std::fmt::Display;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::StoreError;

/// Encode `value` with named fields, so a stored record survives field reordering.
pub(crate) fn encode<T: Serialize + ?Sized>(
    what: impl FnOnce() -> String,
    value: &T,
) -> Result<Vec<u8>, StoreError> {
    rmp_serde::to_vec_named(value).map_err(|source| StoreError::Encode {
        what: what(),
        source,
    })
}

/// Decode a stored value; a failure is [`StoreError::Corrupt`] naming the table and key.
pub(crate) fn decode<T: DeserializeOwned>(
    path: &Path,
    table: &str,
    key: &dyn Display,
    bytes: &[u8],
) -> Result<T, StoreError> {
    rmp_serde::from_slice(bytes).map_err(|e| {
        let reason = format!("table `{table}`, key {key}: cannot decode the value: {e}");
        StoreError::corrupt_because(path, reason, e)
    })
}
