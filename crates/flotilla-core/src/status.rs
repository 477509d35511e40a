//! Statuses with Ray Serve's names, and the deployment status state machine.
//!
//! All deployment status transitions live in [`DeploymentStatusInfo::handle`], and the
//! application status is derived in one place, [`ApplicationStatusInfo::derive`].

use std::{collections::BTreeMap, fmt, time::SystemTime};

use serde::{Deserialize, Serialize};

use crate::{ApiType, AppRecord, DeploymentName};

/// An application's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ApplicationStatus {
    /// Not deployed (or deleted).
    NotStarted,
    /// Deployments are being created or updated.
    Deploying,
    /// A deployment failed to deploy.
    DeployFailed,
    /// Every deployment is healthy.
    Running,
    /// A deployment is unhealthy after having run.
    Unhealthy,
    /// Being deleted.
    Deleting,
}

/// A deployment's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DeploymentStatus {
    /// Replicas are not yet at the target.
    Updating,
    /// Every replica runs at the target version.
    Healthy,
    /// Replicas failed health checks or failed to start after having run.
    Unhealthy,
    /// Adding replicas.
    Upscaling,
    /// Removing replicas.
    Downscaling,
    /// Replica constructors failed past the retry limit.
    DeployFailed,
}

/// A replica's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReplicaState {
    /// Placed or waiting for room; its constructor may be running.
    Starting,
    /// Taking a new config in place.
    Updating,
    /// Found alive after its parent restarted; its state is being learned.
    Recovering,
    /// Serving.
    Running,
    /// Draining, then gone.
    Stopping,
}

macro_rules! screaming_display {
    ($($ty:ty => [$($v:ident = $s:literal),* $(,)?]),* $(,)?) => {$(
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $(Self::$v => $s),* })
            }
        }
    )*};
}

screaming_display! {
    ApplicationStatus => [NotStarted = "NOT_STARTED", Deploying = "DEPLOYING",
        DeployFailed = "DEPLOY_FAILED", Running = "RUNNING", Unhealthy = "UNHEALTHY",
        Deleting = "DELETING"],
    DeploymentStatus => [Updating = "UPDATING", Healthy = "HEALTHY", Unhealthy = "UNHEALTHY",
        Upscaling = "UPSCALING", Downscaling = "DOWNSCALING", DeployFailed = "DEPLOY_FAILED"],
    ReplicaState => [Starting = "STARTING", Updating = "UPDATING", Recovering = "RECOVERING",
        Running = "RUNNING", Stopping = "STOPPING"],
}

/// Why a deployment has its status (Ray's public `DeploymentStatusTrigger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StatusTrigger {
    /// No particular reason.
    Unspecified,
    /// A new config or version is being applied.
    ConfigUpdateStarted,
    /// The new config or version is fully applied.
    ConfigUpdateCompleted,
    /// A scale-up finished.
    UpscaleCompleted,
    /// A scale-down finished.
    DownscaleCompleted,
    /// The autoscaler changed the target.
    Autoscaling,
    /// A replica failed to start.
    ReplicaStartupFailed,
    /// A replica failed its health checks.
    HealthCheckFailed,
    /// Flotilla itself failed.
    InternalError,
    /// The deployment is being deleted.
    Deleting,
}

/// An input to the deployment status machine (Ray's `DeploymentStatusInternalTrigger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeploymentTrigger {
    /// Every replica runs at target.
    Healthy,
    /// A new config or code version was deployed.
    ConfigUpdate,
    /// The autoscaler raised the target.
    AutoscaleUp,
    /// The autoscaler lowered the target.
    AutoscaleDown,
    /// A redeploy raised only the replica count.
    ManuallyIncrease,
    /// A redeploy lowered only the replica count.
    ManuallyDecrease,
    /// Replica constructors are failing past the retry limit.
    ReplicaStartupFailed,
    /// A replica at the target version failed its health checks.
    HealthCheckFailed,
    /// Flotilla itself failed.
    InternalError,
    /// The deployment is being deleted.
    Delete,
}

/// A deployment's status with its trigger and a message a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentStatusInfo {
    /// The status.
    pub status: DeploymentStatus,
    /// Why.
    pub trigger: StatusTrigger,
    /// What to do about it, or "".
    pub message: String,
}

impl Default for DeploymentStatusInfo {
    fn default() -> Self {
        DeploymentStatusInfo {
            status: DeploymentStatus::Updating,
            trigger: StatusTrigger::ConfigUpdateStarted,
            message: String::new(),
        }
    }
}

impl DeploymentStatusInfo {
    /// Apply `trigger` (Ray Serve's transition table, `common.py`). Returns whether
    /// the status changed; an ignored trigger leaves status, trigger and message as
    /// they were, a taken one sets `message`.
    pub fn handle(&mut self, trigger: DeploymentTrigger, message: impl Into<String>) -> bool {
        use DeploymentStatus as S;
        use DeploymentTrigger as T;
        use StatusTrigger as R;
        let next = match (self.status, trigger) {
            (_, T::InternalError) => Some((S::Unhealthy, R::InternalError)),
            (_, T::Delete) => Some((S::Updating, R::Deleting)),
            (_, T::ConfigUpdate) => Some((S::Updating, R::ConfigUpdateStarted)),
            (S::Updating, T::Healthy) => Some((S::Healthy, R::ConfigUpdateCompleted)),
            (S::Updating, T::AutoscaleUp) => Some((S::Upscaling, R::Autoscaling)),
            (S::Updating, T::AutoscaleDown) => Some((S::Downscaling, R::Autoscaling)),
            (S::Updating | S::DeployFailed, T::HealthCheckFailed) => {
                Some((S::DeployFailed, R::HealthCheckFailed))
            }
            (S::Updating | S::DeployFailed, T::ReplicaStartupFailed) => {
                Some((S::DeployFailed, R::ReplicaStartupFailed))
            }
            (S::Upscaling | S::Downscaling, T::HealthCheckFailed) => {
                Some((S::Unhealthy, R::HealthCheckFailed))
            }
            (S::Upscaling | S::Downscaling, T::ReplicaStartupFailed) => {
                Some((S::Unhealthy, R::ReplicaStartupFailed))
            }
            (S::Upscaling, T::Healthy) => Some((S::Healthy, R::UpscaleCompleted)),
            (S::Downscaling, T::Healthy) => Some((S::Healthy, R::DownscaleCompleted)),
            (S::Upscaling | S::Downscaling, T::AutoscaleUp) if self.trigger == R::Autoscaling => {
                Some((S::Upscaling, R::Autoscaling))
            }
            (S::Upscaling | S::Downscaling, T::AutoscaleDown) if self.trigger == R::Autoscaling => {
                Some((S::Downscaling, R::Autoscaling))
            }
            (S::Upscaling | S::Downscaling, T::ManuallyIncrease)
                if self.trigger == R::Autoscaling =>
            {
                Some((S::Upscaling, R::ConfigUpdateStarted))
            }
            (S::Upscaling | S::Downscaling, T::ManuallyDecrease)
                if self.trigger == R::Autoscaling =>
            {
                Some((S::Downscaling, R::ConfigUpdateStarted))
            }
            (S::Upscaling | S::Downscaling, T::ManuallyIncrease)
                if self.trigger == R::ConfigUpdateStarted =>
            {
                Some((S::Upscaling, self.trigger))
            }
            (S::Upscaling | S::Downscaling, T::ManuallyDecrease)
                if self.trigger == R::ConfigUpdateStarted =>
            {
                Some((S::Downscaling, self.trigger))
            }
            (S::Healthy, T::ManuallyIncrease) => Some((S::Upscaling, R::ConfigUpdateStarted)),
            (S::Healthy, T::ManuallyDecrease) => Some((S::Downscaling, R::ConfigUpdateStarted)),
            (S::Healthy, T::AutoscaleUp) => Some((S::Upscaling, R::Autoscaling)),
            (S::Healthy, T::AutoscaleDown) => Some((S::Downscaling, R::Autoscaling)),
            (S::Healthy | S::Unhealthy, T::HealthCheckFailed) => {
                Some((S::Unhealthy, R::HealthCheckFailed))
            }
            (S::Unhealthy, T::ReplicaStartupFailed) => {
                Some((S::Unhealthy, R::ReplicaStartupFailed))
            }
            (S::Unhealthy | S::DeployFailed, T::Healthy) => Some((S::Healthy, R::Unspecified)),
            _ => None,
        };
        match next {
            Some((status, trigger)) => {
                self.status = status;
                self.trigger = trigger;
                self.message = message.into();
                true
            }
            None => false,
        }
    }

    /// Ray's rank: lower is more important when deriving the application status.
    fn rank(&self) -> u8 {
        use DeploymentStatus as S;
        match (self.status, self.trigger) {
            (S::DeployFailed, _) => 0,
            (S::Unhealthy, _) => 1,
            (S::Updating, _) => 2,
            (S::Upscaling | S::Downscaling, StatusTrigger::ConfigUpdateStarted) => 2,
            _ => 3,
        }
    }
}

/// An application's status, the generation it describes, and its deployments'.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplicationStatusInfo {
    /// The status.
    pub status: ApplicationStatus,
    /// What to do about it, or "".
    pub message: String,
    /// The target generation this status describes.
    pub observed_generation: u64,
    /// Each deployment of the target and its status: from the moment the target
    /// is accepted (a deployment that has not reported yet is UPDATING).
    pub deployments: BTreeMap<DeploymentName, DeploymentStatusInfo>,
    /// How the application was deployed (Ray's `source`); `None` while it does
    /// not exist (an application a config declares is declarative from the
    /// moment the config is applied, before its build produced a target).
    pub api_type: Option<ApiType>,
    /// When its current target was accepted (Ray's `last_deployed_time_s`);
    /// for a config's new application still building, when the config was
    /// applied.
    pub last_deployed: Option<SystemTime>,
    /// Whether its replica counts may be set from outside (Ray's
    /// `external_scaler_enabled`, as its current target declares).
    pub external_scaler_enabled: bool,
}

/// What an application's status is derived from, all of it: the one place that
/// decides an application status is [`ApplicationStatusInfo::derive`].
#[derive(Debug, Clone, Copy)]
pub struct AppStatusInputs<'a> {
    /// The durable target; `None` while a config build of an application that
    /// has no target yet runs (or failed).
    pub record: Option<&'a AppRecord>,
    /// What its deployments reported for `record`'s generation (reports of
    /// other generations must be left out by the caller).
    pub reported: &'a BTreeMap<DeploymentName, DeploymentStatusInfo>,
    /// A failed config build standing over this generation: DEPLOY_FAILED with
    /// this message, whatever the deployments say (Ray: until a new config).
    pub build_failure: Option<&'a str>,
}

impl ApplicationStatusInfo {
    /// The synthesised status of an application that does not exist.
    pub fn not_started(name: &str) -> Self {
        ApplicationStatusInfo {
            status: ApplicationStatus::NotStarted,
            message: format!("Application {name} doesn't exist"),
            observed_generation: 0,
            deployments: BTreeMap::new(),
            api_type: None,
            last_deployed: None,
            external_scaler_enabled: false,
        }
    }

    /// Derive the application status (Ray's `_determine_app_status`):
    /// - being deleted: DELETING;
    /// - a failed config build over this target (or over no target): DEPLOY_FAILED;
    /// - no target yet (a config build runs): DEPLOYING;
    /// - else the worst deployment decides: DEPLOY_FAILED, UNHEALTHY, DEPLOYING
    ///   (updating, or scaling for a config change), RUNNING. A target deployment
    ///   that has not reported counts as UPDATING.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use flotilla_core::{AppStatusInputs, ApplicationStatus, ApplicationStatusInfo};
    /// let building = ApplicationStatusInfo::derive(AppStatusInputs {
    ///     record: None,
    ///     reported: &BTreeMap::new(),
    ///     build_failure: None,
    /// });
    /// assert_eq!(building.status, ApplicationStatus::Deploying);
    /// ```
    pub fn derive(inputs: AppStatusInputs<'_>) -> Self {
        let AppStatusInputs {
            record,
            reported,
            build_failure,
        } = inputs;
        let deployments: BTreeMap<DeploymentName, DeploymentStatusInfo> = record
            .map(|r| {
                r.spec
                    .deployments
                    .iter()
                    .map(|d| {
                        let s = reported.get(&d.name).cloned().unwrap_or_default();
                        (d.name.clone(), s)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let deleting = record.is_some_and(|r| r.deleting);
        let (status, message) = match (deleting, build_failure, record) {
            (true, _, _) => (ApplicationStatus::Deleting, String::new()),
            (false, Some(why), _) => (ApplicationStatus::DeployFailed, why.to_owned()),
            (false, None, None) => (ApplicationStatus::Deploying, String::new()),
            (false, None, Some(_)) => from_deployments(&deployments),
        };
        ApplicationStatusInfo {
            status,
            message,
            observed_generation: record.map_or(0, |r| r.generation),
            deployments,
            api_type: record
                .map(|r| r.api_type)
                .or(build_failure.map(|_| ApiType::Declarative)),
            last_deployed: record.and_then(|r| r.deployed_at),
            external_scaler_enabled: record.is_some_and(|r| r.spec.external_scaler_enabled),
        }
    }
}

/// The application status its deployments' statuses give (the worst decides).
fn from_deployments(
    deployments: &BTreeMap<DeploymentName, DeploymentStatusInfo>,
) -> (ApplicationStatus, String) {
    let worst = deployments.values().map(DeploymentStatusInfo::rank).min();
    let names_with = |s: DeploymentStatus| {
        deployments
            .iter()
            .filter(|(_, d)| d.status == s)
            .map(|(n, _)| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match worst {
        Some(0) => (
            ApplicationStatus::DeployFailed,
            format!(
                "Failed to update the deployments [{}]: {}",
                names_with(DeploymentStatus::DeployFailed),
                first_message(deployments, DeploymentStatus::DeployFailed)
            ),
        ),
        Some(1) => (
            ApplicationStatus::Unhealthy,
            format!(
                "The deployments [{}] are UNHEALTHY: {}",
                names_with(DeploymentStatus::Unhealthy),
                first_message(deployments, DeploymentStatus::Unhealthy)
            ),
        ),
        Some(2) => (ApplicationStatus::Deploying, String::new()),
        _ => (ApplicationStatus::Running, String::new()),
    }
}

fn first_message(
    deployments: &BTreeMap<DeploymentName, DeploymentStatusInfo>,
    status: DeploymentStatus,
) -> &str {
    deployments
        .values()
        .find(|d| d.status == status)
        .map(|d| d.message.as_str())
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeploymentStatus as S;
    use DeploymentTrigger as T;

    fn at(status: S, trigger: StatusTrigger) -> DeploymentStatusInfo {
        DeploymentStatusInfo {
            status,
            trigger,
            message: "old".into(),
        }
    }

    #[test]
    fn updating_transitions() {
        let mut s = DeploymentStatusInfo::default();
        assert!(!s.handle(T::ManuallyIncrease, "x"));
        assert!(s.handle(T::ReplicaStartupFailed, "boom"));
        assert_eq!(
            (s.status, s.trigger),
            (S::DeployFailed, StatusTrigger::ReplicaStartupFailed)
        );
        assert_eq!(s.message, "boom");
        assert!(s.handle(T::Healthy, ""));
        assert_eq!(
            (s.status, s.trigger),
            (S::Healthy, StatusTrigger::Unspecified)
        );
    }

    #[test]
    fn ignored_triggers_keep_the_old_message() {
        let mut s = at(S::Healthy, StatusTrigger::ConfigUpdateCompleted);
        assert!(!s.handle(T::Healthy, "new"));
        assert!(!s.handle(T::ReplicaStartupFailed, "new"));
        assert_eq!(s.message, "old");
        let mut u = at(S::Unhealthy, StatusTrigger::HealthCheckFailed);
        assert!(!u.handle(T::AutoscaleUp, "new"));
        assert_eq!(u.status, S::Unhealthy);
    }

    #[test]
    fn healthy_and_scaling_transitions() {
        let mut s = at(S::Healthy, StatusTrigger::Unspecified);
        s.handle(T::ManuallyIncrease, "Upscaling from 1 to 2 replicas.");
        assert_eq!(
            (s.status, s.trigger),
            (S::Upscaling, StatusTrigger::ConfigUpdateStarted)
        );
        assert!(!s.handle(T::AutoscaleDown, ""));
        s.handle(T::ReplicaStartupFailed, "e");
        assert_eq!(s.status, S::Unhealthy);
        let mut a = at(S::Healthy, StatusTrigger::Unspecified);
        a.handle(T::AutoscaleUp, "");
        assert_eq!(
            (a.status, a.trigger),
            (S::Upscaling, StatusTrigger::Autoscaling)
        );
        a.handle(T::Healthy, "");
        assert_eq!(
            (a.status, a.trigger),
            (S::Healthy, StatusTrigger::UpscaleCompleted)
        );
        a.handle(T::HealthCheckFailed, "hc");
        assert_eq!(a.status, S::Unhealthy);
        a.handle(T::Delete, "");
        assert_eq!(
            (a.status, a.trigger),
            (S::Updating, StatusTrigger::Deleting)
        );
    }

    fn deps(list: &[(&str, S, StatusTrigger)]) -> BTreeMap<DeploymentName, DeploymentStatusInfo> {
        list.iter()
            .map(|(n, s, t)| (DeploymentName::new(*n).unwrap(), at(*s, *t)))
            .collect()
    }

    fn record(names: &[&str], deleting: bool) -> AppRecord {
        let mut b = crate::ApplicationSpec::builder("app");
        for n in names {
            b = b.deployment(crate::DeploymentSpec::builder(*n, "x::X"));
        }
        AppRecord {
            spec: b.build().unwrap(),
            generation: 3,
            deleting,
            api_type: ApiType::Imperative,
            config: None,
            deployed_at: Some(SystemTime::UNIX_EPOCH),
        }
    }

    fn derive(
        r: &AppRecord,
        reported: &[(&str, S, StatusTrigger)],
        failure: Option<&str>,
    ) -> ApplicationStatusInfo {
        ApplicationStatusInfo::derive(AppStatusInputs {
            record: Some(r),
            reported: &deps(reported),
            build_failure: failure,
        })
    }

    #[test]
    fn application_status_takes_the_worst_deployment() {
        use ApplicationStatus as A;
        let u = StatusTrigger::Unspecified;
        let ab = record(&["a", "b"], false);
        let status = |l: &[(&str, S, StatusTrigger)]| derive(&ab, l, None).status;
        assert_eq!(
            status(&[("a", S::Healthy, u), ("b", S::Healthy, u)]),
            A::Running
        );
        assert_eq!(status(&[("a", S::Healthy, u)]), A::Deploying);
        assert_eq!(
            status(&[("a", S::Healthy, u), ("b", S::Updating, u)]),
            A::Deploying
        );
        assert_eq!(
            status(&[("a", S::Unhealthy, u), ("b", S::Updating, u)]),
            A::Unhealthy
        );
        assert_eq!(
            status(&[("a", S::Unhealthy, u), ("b", S::DeployFailed, u)]),
            A::DeployFailed
        );
        let a = record(&["a"], false);
        assert_eq!(
            derive(&a, &[("a", S::Upscaling, StatusTrigger::Autoscaling)], None).status,
            A::Running
        );
        assert_eq!(
            derive(
                &a,
                &[("a", S::Upscaling, StatusTrigger::ConfigUpdateStarted)],
                None
            )
            .status,
            A::Deploying
        );
        let info = derive(&record(&["a"], true), &[("a", S::Healthy, u)], None);
        assert_eq!((info.status, info.observed_generation), (A::Deleting, 3));
        let failed = derive(&a, &[("a", S::DeployFailed, u)], None);
        assert!(failed.message.contains("'a'") && failed.message.contains("old"));
    }

    #[test]
    fn every_target_deployment_shows_from_the_start_and_reports_of_others_do_not() {
        let ab = record(&["a", "b"], false);
        let info = derive(
            &ab,
            &[("gone", S::Healthy, StatusTrigger::Unspecified)],
            None,
        );
        let names: Vec<&str> = info.deployments.keys().map(|d| d.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(info.deployments.values().all(|d| d.status == S::Updating));
        assert_eq!(info.api_type, Some(ApiType::Imperative));
        assert_eq!(info.last_deployed, Some(SystemTime::UNIX_EPOCH));
    }

    #[test]
    fn a_failed_build_stands_over_the_deployments_but_not_over_a_deletion() {
        let u = StatusTrigger::Unspecified;
        let a = record(&["a"], false);
        let info = derive(&a, &[("a", S::Healthy, u)], Some("builder broke"));
        assert_eq!(
            (info.status, info.message.as_str()),
            (ApplicationStatus::DeployFailed, "builder broke")
        );
        let deleting = derive(&record(&["a"], true), &[], Some("builder broke"));
        assert_eq!(deleting.status, ApplicationStatus::Deleting);
        let building = ApplicationStatusInfo::derive(AppStatusInputs {
            record: None,
            reported: &BTreeMap::new(),
            build_failure: None,
        });
        assert_eq!(
            (
                building.status,
                building.observed_generation,
                building.api_type
            ),
            (ApplicationStatus::Deploying, 0, None)
        );
    }

    #[test]
    fn display_uses_ray_names() {
        assert_eq!(ApplicationStatus::DeployFailed.to_string(), "DEPLOY_FAILED");
        assert_eq!(ApplicationStatus::NotStarted.to_string(), "NOT_STARTED");
        assert_eq!(ReplicaState::Recovering.to_string(), "RECOVERING");
        assert_eq!(
            ApplicationStatusInfo::not_started("x").message,
            "Application x doesn't exist"
        );
    }
}
