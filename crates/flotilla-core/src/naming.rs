//! Actor and process-group names. Every name carries the Serve instance's namespace:
//! ractor's registry is process-global, and two instances must never collide.

use crate::{AppName, DeploymentName};

/// The Controller of namespace `ns`.
pub fn controller(ns: &str) -> String {
    format!("{ns}/controller")
}

/// The ApplicationActor of `app`.
pub fn application(ns: &str, app: &AppName) -> String {
    format!("{ns}/app:{app}")
}

/// The DeploymentActor of `app`/`deployment`.
pub fn deployment(ns: &str, app: &AppName, deployment: &DeploymentName) -> String {
    format!("{ns}/dep:{app}/{deployment}")
}

/// The process group every DeploymentActor of `app` joins.
pub fn deployment_group(ns: &str, app: &AppName) -> String {
    format!("{ns}/deps:{app}")
}

/// The process group every replica of `app`/`deployment` joins.
pub fn replica_group(ns: &str, app: &AppName, deployment: &DeploymentName) -> String {
    format!("{ns}/replicas:{app}/{deployment}")
}

/// A replica of `app`/`deployment` with process-unique id `id`.
pub fn replica(ns: &str, app: &AppName, deployment: &DeploymentName, id: u64) -> String {
    format!("{ns}/replica:{app}/{deployment}#{id}")
}
