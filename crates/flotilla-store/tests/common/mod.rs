//! Helpers shared by the integration tests: realistic records and file utilities.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_core::{
    ApiType, AppName, AppRecord, ApplicationSpec, Args, AutoscalingConfig, CodeVersion,
    ConfigSource, DeploymentName, DeploymentRecord, DeploymentSpec, LogEncoding, LogLevel,
    LoggingConfig, Resources,
};
use serde::{Deserialize, Serialize};

/// A realistic application: two deployments, one autoscaled with a user config and GPUs.
pub fn app_record(name: &str, generation: u64) -> AppRecord {
    let spec = ApplicationSpec::builder(name)
        .route_prefix(format!("/{name}"))
        .deployment(
            DeploymentSpec::builder("front", "shop::Front")
                .init_args(&("hello", 3u32))
                .replicas(2),
        )
        .deployment(
            DeploymentSpec::builder("model", "shop::Model")
                .version("v7")
                .with_config(|c| {
                    c.with_autoscaling(AutoscalingConfig {
                        min_replicas: 1,
                        initial_replicas: Some(2),
                        max_replicas: 8,
                        target_ongoing_requests: 3.5,
                        upscaling_factor: Some(1.5),
                        ..AutoscalingConfig::default()
                    })
                    .with_user_config(Args::encode(&vec!["threshold", "0.7"]).unwrap())
                    .with_max_queued_requests(Some(100))
                    .with_health_check(Duration::from_millis(1500), Duration::from_secs(9))
                    .with_resources(
                        Resources::default()
                            .with_gpus(1.0)
                            .with_memory(2 << 30)
                            .with_custom("tpu", 0.5),
                    )
                }),
        )
        .ingress("front")
        .logging(LoggingConfig {
            log_level: LogLevel::Debug,
            encoding: LogEncoding::Json,
            enable_access_log: false,
            ..LoggingConfig::default()
        })
        .build()
        .unwrap();
    AppRecord {
        spec: spec.clone(),
        generation,
        deleting: false,
        api_type: ApiType::Declarative,
        config: Some(Box::new(ConfigSource {
            code: CodeVersion::hashed(7),
            entry: 7,
            built: spec.clone(),
        })),
        deployed_at: Some(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(7)),
    }
}

/// A deployment record deciding `replicas`.
pub fn dep_record(replicas: Option<u32>) -> DeploymentRecord {
    DeploymentRecord {
        autoscaled_replicas: replicas,
    }
}

pub fn app(name: &str) -> AppName {
    AppName::new(name).unwrap()
}

pub fn dep(name: &str) -> DeploymentName {
    DeploymentName::new(name).unwrap()
}

/// The controller's config type stand-in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestConfig {
    pub http_port: u16,
    pub apps: Vec<String>,
    pub note: Option<String>,
}

pub fn test_config() -> TestConfig {
    TestConfig {
        http_port: 8000,
        apps: vec!["shop".into(), "search".into()],
        note: Some("applied by test".into()),
    }
}

/// A fresh directory and a checkpoint path inside it.
pub fn temp_checkpoint() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.redb");
    (dir, path)
}

pub fn bytes_of(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// The names in `dir`, sorted.
pub fn dir_listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
