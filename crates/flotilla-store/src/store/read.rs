//! Reading a checkpoint whole, and checking it: the schema version, every
//! record decoded and valid, no route prefix held twice.

use std::path::Path;

use flotilla_core::{AppName, AppRecord, DeploymentName, DeploymentRecord, RoutePrefix, shown};
use redb::{
    ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, TableError,
    TableHandle,
};
use serde::de::IgnoredAny;

use crate::codec::decode;
use crate::tables::{APPS, CONFIG, CONFIG_KEY, DEPLOYMENTS, META, SCHEMA_KEY};
use crate::{SCHEMA_VERSION, Snapshot, StoreError};

/// Refuse applications no API call could have left side by side: two live
/// ones holding one route prefix (a deploy refuses a prefix another live
/// application holds; one being deleted holds none). Recovered, one of them
/// would be unreachable.
pub(super) fn check_prefixes(path: &Path, apps: &[AppRecord]) -> Result<(), StoreError> {
    let mut holders: std::collections::HashMap<&RoutePrefix, &AppName> =
        std::collections::HashMap::with_capacity(apps.len());
    for r in apps.iter().filter(|r| !r.deleting) {
        if let Some(prefix) = &r.spec.route_prefix
            && let Some(other) = holders.insert(prefix, &r.spec.name)
        {
            return Err(StoreError::corrupt(
                path,
                format!(
                    "table `apps`: live applications {:?} and {:?} both hold route prefix {:?}",
                    other.as_str(),
                    r.spec.name.as_str(),
                    shown(prefix.as_str())
                ),
            ));
        }
    }
    Ok(())
}

/// Read the whole checkpoint in one read transaction, checking it: the schema version,
/// and every record decoded and valid. What [`Store::open`](super::Store::open) checks before it writes, and
/// [`Store::load`](super::Store::load) returns.
pub(super) fn read_snapshot(
    path: &Path,
    db: &impl ReadableDatabase,
) -> Result<Snapshot, StoreError> {
    let txn = db
        .begin_read()
        .map_err(|e| StoreError::from_redb_transaction(path, e))?;
    check_schema(path, schema_version(path, &txn)?)?;
    let storage = |e| StoreError::from_redb_storage(path, e);
    let mut snapshot = Snapshot::default();

    if let Some(apps) = open_read(path, &txn, APPS)? {
        for entry in apps.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let name = key.value();
            // Keys are quoted bounded: a hostile file may hold any length.
            let key_shown = format_args!("{:?}", shown(name));
            let record: AppRecord = decode(path, APPS.name(), &key_shown, value.value())?;
            if record.spec.name.as_str() != name {
                return Err(StoreError::corrupt(
                    path,
                    format!(
                        "table `apps`, key {key_shown}: holds the record of application {:?}",
                        record.spec.name.as_str()
                    ),
                ));
            }
            // Decoded is not valid: a record no API call could have written
            // (autoscaling bounds crossed, say) would fail the actors that run it.
            record.validate().map_err(|e| {
                let reason = format!("table `apps`, key {key_shown}: {e}");
                StoreError::corrupt_because(path, reason, e)
            })?;
            snapshot.apps.push(record);
        }
        check_prefixes(path, &snapshot.apps)?;
    }

    if let Some(deployments) = open_read(path, &txn, DEPLOYMENTS)? {
        for entry in deployments.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let (app, dep) = key.value();
            let key_shown = format_args!("({:?}, {:?})", shown(app), shown(dep));
            let invalid = |e: flotilla_core::Error| {
                let reason = format!("table `deployments`, key {key_shown}: {e}");
                StoreError::corrupt_because(path, reason, e)
            };
            let app_name = AppName::new(app).map_err(invalid)?;
            let dep_name = DeploymentName::new(dep).map_err(invalid)?;
            let record: DeploymentRecord =
                decode(path, DEPLOYMENTS.name(), &key_shown, value.value())?;
            record.validate().map_err(invalid)?;
            snapshot.deployments.push((app_name, dep_name, record));
        }
    }

    if let Some(config) = open_read(path, &txn, CONFIG)?
        && let Some(value) = config.get(CONFIG_KEY).map_err(storage)?
    {
        let bytes = value.value();
        // Its type is the Controller's (Snapshot::config decodes it), but whatever the
        // type, the value is one MessagePack value.
        let _: IgnoredAny = decode(path, CONFIG.name(), &format_args!("{CONFIG_KEY:?}"), bytes)?;
        snapshot.config = Some(bytes.to_vec());
    }
    Ok(snapshot)
}

/// Open a table for reading; a table that does not exist reads as empty.
pub(super) fn open_read<K: redb::Key + 'static, V: redb::Value + 'static>(
    path: &Path,
    txn: &ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(table) {
        Ok(t) => Ok(Some(t)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(StoreError::from_redb_table(path, e)),
    }
}

/// The schema version stamped in the file.
pub(super) fn schema_version(path: &Path, txn: &ReadTransaction) -> Result<u32, StoreError> {
    let Some(meta) = open_read(path, txn, META)? else {
        return Err(StoreError::corrupt(
            path,
            "a redb file without table `meta`, so not a Flotilla checkpoint",
        ));
    };
    match meta
        .get(SCHEMA_KEY)
        .map_err(|e| StoreError::from_redb_storage(path, e))?
    {
        Some(v) => Ok(v.value()),
        None => Err(StoreError::corrupt(
            path,
            "table `meta` has no key \"schema_version\"",
        )),
    }
}

/// Refuse a schema this build cannot read.
pub(super) fn check_schema(path: &Path, found: u32) -> Result<(), StoreError> {
    match found.cmp(&SCHEMA_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(StoreError::SchemaTooNew {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        }),
        std::cmp::Ordering::Less => Err(StoreError::corrupt(
            path,
            format!(
                "schema version {found} was never written by Flotilla (this build reads {SCHEMA_VERSION})"
            ),
        )),
    }
}
