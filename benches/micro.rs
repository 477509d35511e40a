//! Criterion micro-benchmarks of Flotilla's hot paths, each alone:
//!
//! - `handle/call`: one `DeploymentHandle::call` to one replica of a trivial
//!   deployment (`u64` in, the same `u64` out), from one task;
//! - `checkpoint_commit/1`, `checkpoint_commit/1000`: one `Store::commit` of a batch
//!   of 1 and of 1,000 application records (the records bulk-deploy writes), fsync
//!   included: the disk decides most of it;
//! - `plan_100_replicas/*`: `flotilla_deployment::plan::plan` over a deployment of
//!   100 replicas on 10 nodes: at rest, in the middle of a roll, scaling down to 50;
//! - `status_derive/*`: `ApplicationStatusInfo::derive` for an application of 1
//!   and of 10 HEALTHY deployments, and of 10 with one UNHEALTHY (the message path);
//! - `route_match/*`: the HTTP proxy's `PrefixRouter::route` over 100 route
//!   prefixes, for an ordinary path and for one of 65,000 slashes (a request
//!   any client may send): the two should cost about the same.
//!
//! Run from the repository root: `cargo bench --bench micro` (a filter after `--`
//! picks benchmarks, e.g. `cargo bench --bench micro -- plan`). Criterion keeps
//! each result in `target/criterion/` and reports the change from the last run.

// A benchmark stops on the first failure: an `expect` says which step failed.
#![allow(clippy::expect_used)]

use std::{collections::BTreeMap, hint::black_box, time::Duration};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flotilla::{ApplicationSpec, DeploymentSpec};
use flotilla_benches::{
    floor,
    workload::{self, Shape, TempStore},
};
use flotilla_core::{
    AppRecord, AppStatusInputs, ApplicationStatusInfo, CodeVersion, ConfigVersion, DeploymentName,
    DeploymentStatus, DeploymentStatusInfo, DeploymentVersion, ReplicaState, RolloutConfig,
    StatusTrigger,
};
use flotilla_deployment::plan::{ReplicaView, Starts, plan};
use flotilla_replica::ReplicaId;
use flotilla_store::{Batch, Store};

/// The scenarios' allocator, so that both measure the same program.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn handle_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let store = TempStore::new("micro-handle").expect("a temporary store directory");
    let shape = Shape {
        max_ongoing: Some(1000),
        drain_wait: Some(Duration::from_millis(10)),
        ..Shape::default()
    };
    let (serve, handle) = rt.block_on(async {
        let serve = store.start().await.expect("flotilla starts");
        let app = workload::app("call", shape).expect("a valid application");
        let handle = serve.run(app).await.expect("the application runs");
        (serve, handle)
    });
    c.bench_function("handle/call", |b| {
        b.to_async(&rt).iter(|| async {
            let out: u64 = handle
                .call(black_box(&7u64))
                .await
                .expect("the call answers");
            out
        });
    });
    rt.block_on(serve.shutdown()).expect("flotilla shuts down");
}

fn checkpoint_commit(c: &mut Criterion) {
    let dir = TempStore::new("micro-commit").expect("a temporary store directory");
    let (store, _) = Store::open(dir.file()).expect("a new store");
    let mut group = c.benchmark_group("checkpoint_commit");
    // Each commit waits for an fsync: fewer samples keep the run short.
    group.sample_size(20);
    for n in [1usize, 1000] {
        let mut batch = Batch::new();
        for i in 0..n {
            let spec = workload::app(&format!("a{i}"), Shape::default()).expect("a valid app");
            batch
                .put_app(&floor::record(spec))
                .expect("the record encodes");
        }
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &batch, |b, batch| {
            b.iter(|| store.commit(batch).expect("the commit succeeds"));
        });
    }
    group.finish();
}

fn version(code: &str) -> DeploymentVersion {
    DeploymentVersion {
        code: CodeVersion::explicit(code),
        config: ConfigVersion(1),
    }
}

/// Replica `id` on one of 10 nodes.
fn replica(id: u64, state: ReplicaState, version: &DeploymentVersion) -> ReplicaView {
    ReplicaView {
        id: ReplicaId(id),
        state,
        version: version.clone(),
        node: format!("node{}", id % 10),
    }
}

fn plan_100_replicas(c: &mut Criterion) {
    let new = version("v2");
    let old = version("v1");
    let rollout = RolloutConfig::default();
    let at_rest: Vec<ReplicaView> = (0..100)
        .map(|i| replica(i, ReplicaState::Running, &new))
        .collect();
    // Half-way through a roll: 50 old RUNNING, 40 new RUNNING, 10 new STARTING.
    let rolling: Vec<ReplicaView> = (0..100)
        .map(|i| match i {
            0..50 => replica(i, ReplicaState::Running, &old),
            50..90 => replica(i, ReplicaState::Running, &new),
            _ => replica(i, ReplicaState::Starting, &new),
        })
        .collect();
    let mut group = c.benchmark_group("plan_100_replicas");
    for (name, target, replicas) in [
        ("at_rest", 100, &at_rest),
        ("rolling", 100, &rolling),
        ("scale_down_to_50", 50, &at_rest),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                plan(
                    black_box(target),
                    &new,
                    rollout,
                    black_box(replicas.as_slice()),
                    Starts::Allowed,
                )
            });
        });
    }
    group.finish();
}

/// An application of `n` deployments and its deployments' reports: all HEALTHY,
/// or the last UNHEALTHY.
fn status_inputs(
    n: usize,
    one_unhealthy: bool,
) -> (AppRecord, BTreeMap<DeploymentName, DeploymentStatusInfo>) {
    let mut app = ApplicationSpec::builder("app").route_prefix("/app");
    for i in 0..n {
        app = app.deployment(DeploymentSpec::builder(format!("d{i}"), workload::NOOP));
    }
    let record = floor::record(app.build().expect("a valid application"));
    let reported = record
        .spec
        .deployments
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let unhealthy = one_unhealthy && i + 1 == n;
            let info = DeploymentStatusInfo {
                status: if unhealthy {
                    DeploymentStatus::Unhealthy
                } else {
                    DeploymentStatus::Healthy
                },
                trigger: if unhealthy {
                    StatusTrigger::HealthCheckFailed
                } else {
                    StatusTrigger::Unspecified
                },
                message: if unhealthy {
                    "replica failed its health check 3 times".to_owned()
                } else {
                    String::new()
                },
            };
            (d.name.clone(), info)
        })
        .collect();
    (record, reported)
}

fn status_derive(c: &mut Criterion) {
    let mut group = c.benchmark_group("status_derive");
    for (name, n, unhealthy) in [
        ("1_healthy", 1, false),
        ("10_healthy", 10, false),
        ("10_one_unhealthy", 10, true),
    ] {
        let (record, reported) = status_inputs(n, unhealthy);
        group.bench_function(name, |b| {
            b.iter(|| {
                ApplicationStatusInfo::derive(AppStatusInputs {
                    record: Some(black_box(&record)),
                    reported: black_box(&reported),
                    build_failure: None,
                })
            });
        });
    }
    group.finish();
}

fn route_match(c: &mut Criterion) {
    let router = flotilla_http::PrefixRouter::new((0..100).map(|i| (format!("/app{i}/v1"), i)));
    let mut group = c.benchmark_group("route_match");
    let ordinary = "/app42/v1/items/7".to_owned();
    let slashes = "/".repeat(65_000);
    for (name, path) in [("ordinary", &ordinary), ("65000_slashes", &slashes)] {
        group.bench_function(name, |b| b.iter(|| router.route(black_box(path)).is_some()));
    }
    group.finish();
}

criterion_group!(
    benches,
    route_match,
    handle_call,
    checkpoint_commit,
    plan_100_replicas,
    status_derive
);
criterion_main!(benches);
