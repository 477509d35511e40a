//! Actor and process-group names. Every name carries the Serve instance's namespace:
//! ractor's registry is process-global, and two instances must never collide.

use crate::{AppName, DeploymentName, error::Error, names::MAX_NAME_LEN};

/// Check a Serve instance's namespace: 1 to 128 bytes of letters, digits, `_`,
/// `.` and `-`. No `/`, so the names of one instance (`{ns}/...`) are never a
/// prefix of another's, and no control characters.
///
/// ```
/// use flotilla_core::actor_names::validate_namespace;
/// assert!(validate_namespace("prod-1").is_ok());
/// assert!(validate_namespace("prod/inner").is_err());
/// ```
pub fn validate_namespace(ns: &str) -> Result<(), Error> {
    let reason = if ns.is_empty() {
        "must not be empty"
    } else if ns.len() > MAX_NAME_LEN {
        "must be at most 128 bytes"
    } else if !ns
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        "may hold only letters, digits, '_', '.' and '-' (no '/': names are matched by namespace segment)"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        at: crate::error::Location::default(),
        what: "namespace",
        value: crate::error::shown(ns),
        reason,
    })
}

/// What every actor and group name of namespace `ns` starts with: the whole
/// namespace segment, `{ns}/`.
pub fn namespace_prefix(ns: &str) -> String {
    format!("{ns}/")
}

/// The Supervisor of namespace `ns` (its name held means the namespace is in
/// use).
pub fn supervisor(ns: &str) -> String {
    format!("{ns}/supervisor")
}

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

/// The application, deployment and id in a replica's name (the inverse of
/// [`replica`]); `None` for any other name, or one of another namespace.
///
/// ```
/// use flotilla_core::{AppName, DeploymentName, actor_names};
/// let (a, d) = (AppName::new("shop").unwrap(), DeploymentName::new("front").unwrap());
/// let name = actor_names::replica("ns", &a, &d, 7);
/// assert_eq!(actor_names::parse_replica("ns", &name), Some((a, d, 7)));
/// assert_eq!(actor_names::parse_replica("other", &name), None);
/// ```
pub fn parse_replica(ns: &str, name: &str) -> Option<(AppName, DeploymentName, u64)> {
    let rest = name.strip_prefix(ns)?.strip_prefix("/replica:")?;
    let (app, rest) = rest.split_once('/')?;
    let (deployment, id) = rest.rsplit_once('#')?;
    Some((
        AppName::new(app).ok()?,
        DeploymentName::new(deployment).ok()?,
        id.parse().ok()?,
    ))
}
