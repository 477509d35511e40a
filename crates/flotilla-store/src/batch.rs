//! A batch of key operations, encoded up front so that a commit only writes.

use std::fmt;

use flotilla_core::{AppName, AppRecord, DeploymentName, DeploymentRecord};

use crate::StoreError;
use crate::codec::encode;
use crate::tables::CONFIG_KEY;

/// MessagePack bytes ready to be stored; `Debug` shows their length only.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Encoded(pub(crate) Vec<u8>);

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

/// One key operation of a [`Batch`].
#[derive(Debug, Clone)]
pub(crate) enum Op {
    PutApp {
        name: String,
        value: Encoded,
    },
    /// Deletes the application's record and every deployment record of the application.
    DeleteApp {
        name: String,
    },
    PutDeployment {
        app: String,
        deployment: String,
        value: Encoded,
    },
    DeleteDeployment {
        app: String,
        deployment: String,
    },
    PutConfig {
        value: Encoded,
    },
    DeleteConfig,
}

/// The changed records of one Controller message, written by one [`Store::commit`](crate::Store::commit).
///
/// Values are encoded when they are added, so an encoding error is reported before
/// anything is committed and a commit only writes. Operations are applied in the order
/// they were added: a later operation on the same key wins.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    ops: Vec<Op>,
    /// Key plus value bytes of the puts, as counted in [`StoreCounters::bytes_written`](crate::StoreCounters::bytes_written).
    put_bytes: u64,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    fn push_put(&mut self, op: Op, key_bytes: usize, value_bytes: usize) {
        self.put_bytes = self.put_bytes.saturating_add(
            u64::try_from(key_bytes.saturating_add(value_bytes)).unwrap_or(u64::MAX),
        );
        self.ops.push(op);
    }

    /// Store `rec` under its application's name (`rec.spec.name`), replacing any record
    /// stored under that name. On an encoding error the batch is unchanged.
    pub fn put_app(&mut self, rec: &AppRecord) -> Result<(), StoreError> {
        let name = rec.spec.name.as_str();
        let value = encode(|| format!("the record of application '{name}'"), rec)?;
        let value_len = value.len();
        self.push_put(
            Op::PutApp {
                name: name.to_owned(),
                value: Encoded(value),
            },
            name.len(),
            value_len,
        );
        Ok(())
    }

    /// Delete the record of application `name` and, in the same operation, every
    /// deployment record of that application (and of no other). One key operation.
    pub fn delete_app(&mut self, name: &AppName) {
        self.ops.push(Op::DeleteApp {
            name: name.as_str().to_owned(),
        });
    }

    /// Store the durable decisions of deployment `dep` of application `app`, replacing
    /// any record stored under that pair. On an encoding error the batch is unchanged.
    pub fn put_deployment(
        &mut self,
        app: &AppName,
        dep: &DeploymentName,
        rec: &DeploymentRecord,
    ) -> Result<(), StoreError> {
        let value = encode(
            || format!("the record of deployment '{dep}' of application '{app}'"),
            rec,
        )?;
        let value_len = value.len();
        self.push_put(
            Op::PutDeployment {
                app: app.as_str().to_owned(),
                deployment: dep.as_str().to_owned(),
                value: Encoded(value),
            },
            app.as_str().len() + dep.as_str().len(),
            value_len,
        );
        Ok(())
    }

    /// Delete the record of deployment `dep` of application `app`.
    pub fn delete_deployment(&mut self, app: &AppName, dep: &DeploymentName) {
        self.ops.push(Op::DeleteDeployment {
            app: app.as_str().to_owned(),
            deployment: dep.as_str().to_owned(),
        });
    }

    /// Store `config` in the "last applied config" slot, replacing what was there. The
    /// Controller owns the type; [`Snapshot::config`](crate::Snapshot::config) reads it
    /// back. On an encoding error the batch is unchanged.
    pub fn put_config<T: serde::Serialize>(&mut self, config: &T) -> Result<(), StoreError> {
        let value = encode(|| "the last applied config".to_owned(), config)?;
        let value_len = value.len();
        self.push_put(
            Op::PutConfig {
                value: Encoded(value),
            },
            CONFIG_KEY.len(),
            value_len,
        );
        Ok(())
    }

    /// Empty the "last applied config" slot.
    pub fn delete_config(&mut self) {
        self.ops.push(Op::DeleteConfig);
    }

    /// Whether the batch holds no operation; committing it is a no-op.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The number of key operations (puts and deletes; a [`delete_app`](Self::delete_app)
    /// is one). A commit adds exactly this to
    /// [`StoreCounters::keys_written`](crate::StoreCounters::keys_written).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub(crate) fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub(crate) fn put_bytes(&self) -> u64 {
        self.put_bytes
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use flotilla_core::{ApiType, ApplicationSpec, DeploymentSpec};

    use super::*;

    fn record(name: &str) -> AppRecord {
        AppRecord {
            spec: ApplicationSpec::builder(name)
                .deployment(DeploymentSpec::builder("front", "test::Echo"))
                .build()
                .unwrap(),
            generation: 1,
            deleting: false,
            api_type: ApiType::Imperative,
            config: None,
            deployed_at: None,
        }
    }

    #[test]
    fn len_counts_every_key_operation_and_bytes_count_puts_only() {
        let app = AppName::new("shop").unwrap();
        let dep = DeploymentName::new("front").unwrap();
        let rec = record("shop");
        let dep_rec = DeploymentRecord {
            autoscaled_replicas: Some(2),
        };
        let mut batch = Batch::new();
        assert!(batch.is_empty());
        batch.put_app(&rec).unwrap();
        batch.put_deployment(&app, &dep, &dep_rec).unwrap();
        batch.put_config(&"cfg").unwrap();
        batch.delete_deployment(&app, &dep);
        batch.delete_app(&app);
        batch.delete_config();
        assert_eq!(batch.len(), 6);
        assert!(!batch.is_empty());
        let expected = 4
            + rmp_serde::to_vec_named(&rec).unwrap().len()
            + 4
            + 5
            + rmp_serde::to_vec_named(&dep_rec).unwrap().len()
            + CONFIG_KEY.len()
            + rmp_serde::to_vec_named(&"cfg").unwrap().len();
        assert_eq!(batch.put_bytes(), expected as u64);
    }

    #[test]
    fn values_are_msgpack_with_named_fields() {
        let mut batch = Batch::new();
        batch
            .put_deployment(
                &AppName::new("a").unwrap(),
                &DeploymentName::new("d").unwrap(),
                &DeploymentRecord {
                    autoscaled_replicas: None,
                },
            )
            .unwrap();
        let Op::PutDeployment { value, .. } = &batch.ops()[0] else {
            panic!("{:?}", batch.ops());
        };
        // fixmap of 1: "autoscaled_replicas" => nil
        let mut expected = vec![0x81, 0xa0 | 19];
        expected.extend_from_slice(b"autoscaled_replicas");
        expected.push(0xc0);
        assert_eq!(value.0, expected);
    }

    #[test]
    fn debug_shows_value_lengths_not_bytes() {
        let mut batch = Batch::new();
        batch.put_app(&record("shop")).unwrap();
        let shown = format!("{batch:?}");
        assert!(shown.contains("bytes"), "{shown}");
        assert!(shown.len() < 200, "{shown}");
    }
}
