//! The checkpoint's tables and fixed keys: the file layout of [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).

use redb::TableDefinition;

/// `meta`: name -> value; holds the schema version.
pub(crate) const META: TableDefinition<&str, u32> = TableDefinition::new("meta");
/// The key of the schema version in `meta`.
pub(crate) const SCHEMA_KEY: &str = "schema_version";

/// `apps`: application name -> MessagePack `AppRecord`.
pub(crate) const APPS: TableDefinition<&str, &[u8]> = TableDefinition::new("apps");

/// `deployments`: (application name, deployment name) -> MessagePack `DeploymentRecord`.
pub(crate) const DEPLOYMENTS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("deployments");

/// `config`: slot name -> MessagePack value; holds the last applied config.
pub(crate) const CONFIG: TableDefinition<&str, &[u8]> = TableDefinition::new("config");
/// The key of the last applied config in `config`.
pub(crate) const CONFIG_KEY: &str = "last_applied";
