//! The REST API's `GET /api/serve/applications/` body: Ray's
//! `ServeInstanceDetails` (`python/ray/serve/schema.py`), built from the status
//! board, the route index, the applied config and every DeploymentActor's
//! snapshot. Fields Ray leaves unset are left out (it dumps with
//! `exclude_unset=True`, which applies to model fields: user values such as
//! `args`, `user_config` and `runtime_env` are sent as given); the fields its
//! schema requires are always sent (a deployment without a snapshot is left
//! out instead: see the crate's Decisions); fields that describe Ray's
//! processes (pids, worker ids, log files) are left out or say what Flotilla
//! has instead (actor names).

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use flotilla::{ApiType, ReplicaCount, Serve};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::HttpOptions;

/// How long a details request waits for each DeploymentActor's snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(2);

/// Ray's `ServeActorDetails` (the fields Flotilla can fill).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ActorDetails {
    /// The node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// The node's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<String>,
    /// The actor's registered name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_name: Option<String>,
}

/// Ray's `ProxyDetails`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyDetails {
    /// Where it runs.
    #[serde(flatten)]
    pub actor: ActorDetails,
    /// `HEALTHY` (or `DRAINING` while shutting down).
    pub status: String,
}

/// Ray's `ServeInstanceDetails`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServeInstanceDetails {
    /// The Controller.
    pub controller_info: ActorDetails,
    /// `HeadOnly`: one proxy, in the embedding process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_location: Option<String>,
    /// The proxy's `http_options`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_options: Option<Value>,
    /// The proxies by node.
    pub proxies: BTreeMap<String, ProxyDetails>,
    /// The applications by name.
    pub applications: BTreeMap<String, ApplicationDetails>,
    /// Always null (Flotilla has no target capacity).
    pub target_capacity: Option<f64>,
}

/// Ray's `ApplicationDetails`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplicationDetails {
    /// The name.
    pub name: String,
    /// Its route prefix; null when it has none (or is being deleted).
    pub route_prefix: Option<String>,
    /// Always null (no FastAPI docs).
    pub docs_path: Option<String>,
    /// `RUNNING`, `DEPLOYING`, ...
    pub status: String,
    /// What to do about it, or "".
    pub message: String,
    /// When its target was accepted, in Unix seconds (0 before it has one).
    pub last_deployed_time_s: f64,
    /// Its entry of the applied config, as submitted (null for imperative ones).
    pub deployed_app_config: Option<Value>,
    /// `imperative`, `declarative` or `unknown`.
    pub source: String,
    /// Its deployments by name.
    pub deployments: BTreeMap<String, DeploymentDetails>,
    /// Whether its replica counts may be set from outside (the scale route).
    pub external_scaler_enabled: bool,
    /// Its deployments and which is the ingress (Flotilla does not track calls
    /// between deployments: `outbound_deployments` is empty).
    pub deployment_topology: Option<Value>,
}

/// Ray's `DeploymentDetails`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentDetails {
    /// The name.
    pub name: String,
    /// `HEALTHY`, `UPDATING`, ...
    pub status: String,
    /// Why (Ray's `DeploymentStatusTrigger`).
    pub status_trigger: String,
    /// What to do about it, or "".
    pub message: String,
    /// The deployment's config in Ray's `DeploymentSchema` field names.
    pub deployment_config: Value,
    /// Replicas it aims for now.
    pub target_num_replicas: u32,
    /// What one replica reserves (`{"CPU": 1.0, ...}`).
    pub required_resources: BTreeMap<String, f64>,
    /// Its replicas, oldest first.
    pub replicas: Vec<ReplicaDetails>,
    /// Always empty: Flotilla keeps no dead replicas.
    pub recent_dead_replicas: Vec<ReplicaDetails>,
}

/// Ray's `ReplicaDetails`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaDetails {
    /// Where it runs and its actor name.
    #[serde(flatten)]
    pub actor: ActorDetails,
    /// Its id (Flotilla's are numbers, unique in the process).
    pub replica_id: String,
    /// `RUNNING`, `STARTING`, ...
    pub state: String,
    /// When it began serving, in Unix seconds; 0.0 when that is not known (a
    /// replica still starting, or no longer routed to while it stops).
    pub start_time_s: f64,
    /// Flotilla's extension (Ray shows them nowhere in its details): the models
    /// a multiplexed deployment's replica has loaded, sorted; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub multiplexed_model_ids: Vec<String>,
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The fields whose value is the user's own (a builder's `args`, a
/// deployment's `user_config`, a `runtime_env`, the kwargs and selectors: any
/// value, `Dict` in Ray's schema), not a model whose unset fields Ray leaves
/// out: what is under them is sent as given, nulls included.
const USER_VALUE_FIELDS: &[&str] = &[
    "args",
    "runtime_env",
    "user_config",
    "request_router_kwargs",
    "policy_kwargs",
    "label_selector",
    "placement_group_bundle_label_selector",
    "gang_scheduling_config",
    "deployment_actors",
    "fallback_strategy",
];

/// Remove the null fields of objects, recursively: Ray's `exclude_unset`,
/// which applies to model fields only, so the value of a user field
/// ([`USER_VALUE_FIELDS`]) is kept whole (the field itself is left out when
/// null, as Flotilla cannot tell an explicit null from an unset field).
pub(crate) fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| {
                    let v = if USER_VALUE_FIELDS.contains(&k.as_str()) {
                        v
                    } else {
                        strip_nulls(v)
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        v => v,
    }
}

/// Whether an application's `field` holds its default, which Ray's
/// `exclude_unset` leaves out when the config leaves it out (Flotilla
/// cannot tell an explicit default from an unset field, so it leaves out
/// both): `args: {}`, `runtime_env: {}`, `deployments: []`,
/// `external_scaler_enabled: false`, and Flotilla's own `take_over: false`.
fn is_app_default(field: &str, v: &Value) -> bool {
    match field {
        "args" | "runtime_env" => v.as_object().is_some_and(|m| m.is_empty()),
        "deployments" => v.as_array().is_some_and(|a| a.is_empty()),
        "external_scaler_enabled" | "take_over" => *v == Value::Bool(false),
        _ => false,
    }
}

/// An application's applied config with its defaults left out
/// ([`is_app_default`]).
fn strip_app_defaults(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.retain(|field, v| !is_app_default(field, v));
    }
    v
}

/// A free-form value as JSON (map keys that are not text written as text,
/// as Ray's REST API writes a dict's); `None` if it is not MessagePack.
fn json_of(args: &flotilla::Args) -> Option<Value> {
    args.readable()
        .ok()
        .and_then(|r| serde_json::to_value(r).ok())
}

/// Ray's `DeploymentSchema` fields of a Flotilla deployment config.
fn deployment_config(name: &str, c: &flotilla::DeploymentConfig) -> Value {
    let mut v = serde_json::json!({
        "name": name,
        "max_ongoing_requests": c.max_ongoing_requests,
        "max_queued_requests": c.max_queued_requests.map_or(-1, i64::from),
        "user_config": c.user_config.as_ref().and_then(json_of),
        "graceful_shutdown_wait_loop_s": c.graceful_shutdown_wait_loop.as_secs_f64(),
        "graceful_shutdown_timeout_s": c.graceful_shutdown_timeout.as_secs_f64(),
        "health_check_period_s": c.health_check_period.as_secs_f64(),
        "health_check_timeout_s": c.health_check_timeout.as_secs_f64(),
        "ray_actor_options": {
            "num_cpus": c.resources.cpus,
            "num_gpus": c.resources.gpus,
            "memory": c.resources.memory_bytes,
            "resources": c.resources.custom,
        },
        "rolling_update_percentage": c.rollout.max_changing_fraction,
    });
    let r = &c.request_router;
    v["request_router_config"] = serde_json::json!({
        "request_router_class": r.request_router_class.as_str(),
        "request_router_kwargs": json_of(&r.request_router_kwargs),
        "request_routing_stats_period_s": r.request_routing_stats_period.as_secs_f64(),
        "request_routing_stats_timeout_s": r.request_routing_stats_timeout.as_secs_f64(),
        "initial_backoff_s": r.initial_backoff.as_secs_f64(),
        "backoff_multiplier": r.backoff_multiplier,
        "max_backoff_s": r.max_backoff.as_secs_f64(),
    });
    if let Some(n) = c.max_replicas_per_node {
        v["max_replicas_per_node"] = n.into();
    }
    if let Some(pg) = &c.placement_group {
        v["placement_group_bundles"] =
            serde_json::to_value(pg.bundles.iter().map(resources).collect::<Vec<_>>())
                .unwrap_or(Value::Null);
        v["placement_group_strategy"] = serde_json::to_value(pg.strategy).unwrap_or(Value::Null);
    }
    if let Some(l) = &c.logging {
        v["logging_config"] = serde_json::to_value(l).unwrap_or(Value::Null);
    }
    if let Some(p) = c.rollout.max_surge_percent {
        v["max_surge_percent"] = p.into();
    }
    // Flotilla's extensions, under the config file's names (the batching and
    // model settings when set).
    v["backpressure_config"] = serde_json::json!({
        "status_code": c.backpressure.status_code.code(),
        "retry_after_s": c.backpressure.retry_after.map(|d| d.as_secs_f64()),
    });
    if let Some(b) = &c.batching {
        v["max_batch_size"] = b.max_batch_size.into();
        v["batch_wait_timeout_s"] = b.batch_wait_timeout.as_secs_f64().into();
        v["max_concurrent_batches"] = b.max_concurrent_batches.into();
    }
    if c.max_num_models_per_replica != Some(flotilla::DEFAULT_MAX_NUM_MODELS_PER_REPLICA) {
        v["max_num_models_per_replica"] = c.max_num_models_per_replica.map_or(-1, i64::from).into();
    }
    match &c.num_replicas {
        ReplicaCount::Fixed(n) => v["num_replicas"] = (*n).into(),
        ReplicaCount::Auto(a) => {
            v["autoscaling_config"] = serde_json::json!({
                "min_replicas": a.min_replicas,
                "initial_replicas": a.initial_replicas,
                "max_replicas": a.max_replicas,
                "target_ongoing_requests": a.target_ongoing_requests,
                "upscale_delay_s": a.upscale_delay.as_secs_f64(),
                "downscale_delay_s": a.downscale_delay.as_secs_f64(),
                "upscaling_factor": a.upscaling_factor,
                "downscaling_factor": a.downscaling_factor,
                "look_back_period_s": a.look_back_period.as_secs_f64(),
                "downscale_to_zero_delay_s": a.downscale_to_zero_delay.map(|d| d.as_secs_f64()),
                "aggregation_function": a.aggregation_function.name(),
                "policy": {
                    "policy_function": a.policy.policy_function.as_str(),
                    "policy_kwargs": json_of(&a.policy.policy_kwargs),
                },
            });
        }
    }
    v
}

fn resources(r: &flotilla::Resources) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::from([("CPU".to_owned(), r.cpus)]);
    if r.gpus > 0.0 {
        m.insert("GPU".to_owned(), r.gpus);
    }
    if r.memory_bytes > 0 {
        m.insert("memory".to_owned(), r.memory_bytes as f64);
    }
    m.extend(r.custom.clone());
    m
}

/// Which applications a GET asks for (Ray's `api_type` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApiFilter {
    All,
    Only(ApiType),
}

/// Build the instance's details.
pub(crate) async fn instance_details(
    serve: &Serve,
    options: &HttpOptions,
    proxy_addr: Option<std::net::SocketAddr>,
    draining: bool,
    filter: ApiFilter,
) -> Result<ServeInstanceDetails, flotilla::ServeError> {
    let node = serve.node_id().to_owned();
    let config = serve.applied_config().await?;
    let configs: BTreeMap<String, Value> = config
        .iter()
        .flat_map(|c| c.applications.iter())
        .filter_map(|a| {
            let mut v = strip_app_defaults(strip_nulls(serde_json::to_value(a).ok()?));
            // Set, to null (no HTTP route): kept, as Ray keeps a set field.
            if let (flotilla::RouteOverride::Off, Value::Object(m)) = (&a.route_prefix, &mut v) {
                m.insert("route_prefix".to_owned(), Value::Null);
            }
            // So are a deployment's fields set to null.
            if let Some(Value::Array(written)) = v.get_mut("deployments") {
                for (w, d) in written.iter_mut().zip(&a.deployments) {
                    if let Value::Object(m) = w {
                        m.extend(d.nulls().map(|f| (f.to_owned(), Value::Null)));
                    }
                }
            }
            Some((a.name.to_string(), v))
        })
        .collect();
    let prefixes: BTreeMap<String, String> = serve
        .routes()
        .routes()
        .into_iter()
        .map(|r| (r.app.to_string(), r.prefix.to_string()))
        .collect();
    let mut snapshots: BTreeMap<(String, String), flotilla::DeploymentSnapshot> = serve
        .deployment_details(SNAPSHOT_TIMEOUT)
        .await
        .into_iter()
        .filter_map(|d| {
            d.snapshot
                .map(|s| ((d.app.to_string(), d.deployment.to_string()), s))
        })
        .collect();
    let mut applications = BTreeMap::new();
    for (name, s) in serve.status() {
        let name = name.to_string();
        if let ApiFilter::Only(t) = filter
            && s.api_type != Some(t)
        {
            continue;
        }
        let ingress = serve
            .app_handle(&name)
            .ok()
            .map(|h| h.deployment().to_owned());
        let mut deployments = BTreeMap::new();
        for (dep, ds) in &s.deployments {
            let dep = dep.to_string();
            // Ray's DeploymentDetails requires the config, the target and the
            // resources, which only the DeploymentActor's snapshot gives: a
            // deployment whose actor is not running now (being started or
            // restarted, gone while its application is deleted) or does not
            // answer in time is left out, not sent without them.
            let Some(sn) = snapshots.remove(&(name.clone(), dep.clone())) else {
                continue;
            };
            let started: BTreeMap<u64, SystemTime> = serve
                .deployment_handle(&name, &dep)
                .map(|h| {
                    h.replicas()
                        .iter()
                        .map(|r| (r.id().0, r.started_at()))
                        .collect()
                })
                .unwrap_or_default();
            let replicas = sn
                .replicas
                .iter()
                .map(|r| ReplicaDetails {
                    actor: ActorDetails {
                        node_id: Some(r.node.clone()),
                        node_ip: None,
                        actor_name: Some(format!(
                            "{}/replica:{name}/{dep}#{}",
                            serve.namespace(),
                            r.id
                        )),
                    },
                    replica_id: r.id.to_string(),
                    state: r.state.to_string(),
                    // Only a routable replica's start is known (when its
                    // constructor finished); not when a starting one began.
                    start_time_s: started.get(&r.id.0).copied().map_or(0.0, unix_s),
                    multiplexed_model_ids: r.model_ids.clone(),
                })
                .collect();
            deployments.insert(
                dep.clone(),
                DeploymentDetails {
                    name: dep.clone(),
                    status: ds.status.to_string(),
                    status_trigger: serde_json::to_value(ds.trigger)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    message: ds.message.clone(),
                    deployment_config: strip_nulls(deployment_config(&dep, &sn.target.spec.config)),
                    target_num_replicas: sn.target.replicas,
                    required_resources: resources(&sn.target.spec.config.resources),
                    replicas,
                    recent_dead_replicas: Vec::new(),
                },
            );
        }
        let topology = ingress.as_ref().map(|ing| {
            let nodes: serde_json::Map<String, Value> = s
                .deployments
                .keys()
                .map(|d| {
                    (
                        d.to_string(),
                        serde_json::json!({"name": d.as_str(), "app_name": name,
                            "outbound_deployments": [], "is_ingress": d.as_str() == ing}),
                    )
                })
                .collect();
            serde_json::json!({"app_name": name, "nodes": nodes, "ingress_deployment": ing})
        });
        applications.insert(
            name.clone(),
            ApplicationDetails {
                route_prefix: prefixes.get(&name).cloned(),
                docs_path: None,
                status: s.status.to_string(),
                message: s.message.clone(),
                last_deployed_time_s: s.last_deployed.map_or(0.0, unix_s),
                deployed_app_config: configs.get(&name).cloned(),
                source: match s.api_type {
                    Some(ApiType::Imperative) => "imperative",
                    Some(ApiType::Declarative) => "declarative",
                    None => "unknown",
                }
                .to_owned(),
                deployments,
                external_scaler_enabled: s.external_scaler_enabled,
                deployment_topology: topology,
                name,
            },
        );
    }
    let (controller_name, _) = serve.controller_actor();
    let proxy_ip = proxy_addr.map(|a| a.ip().to_string());
    let proxies = match proxy_addr {
        Some(_) => BTreeMap::from([(
            node.clone(),
            ProxyDetails {
                actor: ActorDetails {
                    node_id: Some(node.clone()),
                    node_ip: proxy_ip.clone(),
                    actor_name: Some("flotilla-http proxy".to_owned()),
                },
                status: if draining { "DRAINING" } else { "HEALTHY" }.to_owned(),
            },
        )]),
        None => BTreeMap::new(),
    };
    let http_options = strip_nulls(serde_json::json!({
        "host": options.host,
        "port": proxy_addr.map_or(options.port, |a| a.port()),
        "root_path": options.root_path,
        "request_timeout_s": options.request_timeout.map(|t| t.as_secs_f64()),
        "keep_alive_timeout_s": options.keep_alive_timeout.as_secs(),
    }));
    Ok(ServeInstanceDetails {
        controller_info: ActorDetails {
            node_id: Some(node),
            node_ip: proxy_ip,
            actor_name: Some(controller_name),
        },
        proxy_location: Some(
            if proxy_addr.is_some() {
                "HeadOnly"
            } else {
                "Disabled"
            }
            .to_owned(),
        ),
        http_options: Some(http_options),
        proxies,
        applications,
        target_capacity: None,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use flotilla::{
        AggregationFunction, AutoscalingConfig, BackpressureConfig, BackpressureStatus,
        DeploymentConfig, LogLevel, LoggingConfig, PlacementGroup, PlacementStrategy, ReplicaCount,
        Resources, RolloutConfig,
    };

    use super::*;

    #[test]
    fn nulls_are_stripped_from_model_fields_only() {
        let v = strip_nulls(serde_json::json!({
            "name": "a",
            "route_prefix": null,
            "args": {"lora": null, "deep": {"x": null}},
            "runtime_env": {"env_vars": {"X": null}},
            "user_config": null,
            "deployments": [{
                "name": "d",
                "num_replicas": null,
                "user_config": {"k": null, "list": [null, {"y": null}]},
                "ray_actor_options": {"num_cpus": null, "runtime_env": {"pip": null}},
                "request_router_config": {"request_router_kwargs": {"z": null}, "max_backoff_s": null},
            }],
        }));
        assert_eq!(
            v,
            serde_json::json!({
                "name": "a",
                "args": {"lora": null, "deep": {"x": null}},
                "runtime_env": {"env_vars": {"X": null}},
                "deployments": [{
                    "name": "d",
                    "user_config": {"k": null, "list": [null, {"y": null}]},
                    "ray_actor_options": {"runtime_env": {"pip": null}},
                    "request_router_config": {"request_router_kwargs": {"z": null}},
                }],
            })
        );
    }

    #[test]
    fn a_deployment_config_shows_every_setting_that_applies() {
        let c = DeploymentConfig {
            num_replicas: ReplicaCount::Auto(AutoscalingConfig {
                max_replicas: 4,
                downscale_to_zero_delay: Some(Duration::from_secs(900)),
                aggregation_function: AggregationFunction::Max,
                ..Default::default()
            }),
            max_replicas_per_node: Some(2),
            logging: Some(LoggingConfig {
                log_level: LogLevel::Debug,
                ..Default::default()
            }),
            backpressure: BackpressureConfig {
                status_code: BackpressureStatus::TooManyRequests,
                retry_after: Some(Duration::from_secs(3)),
            },
            rollout: RolloutConfig {
                max_surge_percent: Some(50),
                ..Default::default()
            },
            ..Default::default()
        };
        let v = strip_nulls(deployment_config("d", &c));
        let a = &v["autoscaling_config"];
        assert_eq!(a["downscale_to_zero_delay_s"], 900.0);
        assert_eq!(a["aggregation_function"], "max");
        assert_eq!(a["policy"]["policy_kwargs"], serde_json::json!({}));
        assert!(a["policy"]["policy_function"].is_string(), "{a}");
        assert_eq!(v["max_replicas_per_node"], 2);
        assert_eq!(v["logging_config"]["log_level"], "DEBUG");
        assert_eq!(v["backpressure_config"]["status_code"], 429);
        assert_eq!(v["backpressure_config"]["retry_after_s"], 3.0);
        assert_eq!(v["max_surge_percent"], 50);
        assert_eq!(v["request_router_config"]["initial_backoff_s"], 0.025);
        assert!(v.get("placement_group_bundles").is_none());
        let pg = DeploymentConfig {
            placement_group: Some(PlacementGroup::new(
                vec![
                    Resources::none().with_cpus(1.0),
                    Resources::none().with_gpus(1.0),
                ],
                PlacementStrategy::StrictPack,
            )),
            ..Default::default()
        };
        let v = strip_nulls(deployment_config("d", &pg));
        assert_eq!(v["placement_group_strategy"], "STRICT_PACK");
        assert_eq!(
            v["placement_group_bundles"],
            serde_json::json!([{"CPU": 1.0}, {"CPU": 0.0, "GPU": 1.0}])
        );
    }
}
