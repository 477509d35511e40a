//! Prometheus metrics: the proxy's per-request counters, and the exporter that
//! reads them and the data plane's at scrape time.
//!
//! Recording is lock-free everywhere: the proxy records each request in its
//! route's `HttpStats` (a small open-addressed table of atomic slots keyed by
//! method and status), replicas and routes keep their own atomics in
//! flotilla-replica ([`ReplicaStats`](flotilla::ReplicaStats),
//! [`RouteStats`](flotilla::RouteStats)). A scrape walks every route, deployment
//! and replica once (O(routes + replicas)) plus one snapshot message per
//! DeploymentActor, and writes Prometheus text (0.0.4, as Ray's exporter) through
//! `prometheus-client`'s encoder. The names are Ray Serve's as its users see them
//! in Prometheus (`ray_` + name, counters `_total`); see the crate docs for the list.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

use flotilla::{
    ApplicationStatus, DeploymentStatus, ErrorKind, HistogramSnapshot, ReplicaCount, ReplicaState,
    Serve,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use crate::connection_limit::ConnectionLimit;

mod batches_and_models;
mod http_stats;

use batches_and_models::{BatchFigures, ModelFigures};
pub(crate) use http_stats::{HttpStats, method_index, method_name};

/// The content type of a scrape: Prometheus text 0.0.4, as Ray's exporter.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long a scrape waits for each DeploymentActor's snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(1);

/// The proxy's own counters beyond its routes'.
#[derive(Debug)]
pub(crate) struct ProxyMetrics {
    /// Requests matched to a route and not finished (Ray's gauge).
    pub(crate) ongoing: AtomicI64,
    /// Requests no route matched (404), malformed paths (400).
    pub(crate) unmatched: Arc<HttpStats>,
    pub(crate) healthz: Arc<HttpStats>,
    pub(crate) routes: Arc<HttpStats>,
    /// The `node_id` and `node_ip_address` labels.
    pub(crate) node_id: String,
    pub(crate) node_ip: String,
    /// Scrapes served (Flotilla's own).
    pub(crate) scrapes: AtomicU64,
    /// The connection limit of each listener that runs.
    pub(crate) listeners: Vec<Arc<ConnectionLimit>>,
}

impl ProxyMetrics {
    pub(crate) fn new(
        node_id: String,
        node_ip: String,
        listeners: Vec<Arc<ConnectionLimit>>,
    ) -> Self {
        ProxyMetrics {
            ongoing: AtomicI64::new(0),
            unmatched: Arc::new(HttpStats::new("", "", "")),
            healthz: Arc::new(HttpStats::new("/-/healthz", "", "")),
            routes: Arc::new(HttpStats::new("/-/routes", "", "")),
            node_id,
            node_ip,
            scrapes: AtomicU64::new(0),
            listeners,
        }
    }
}

/// One replica's figures, read at scrape time.
struct ReplicaFigures {
    id: String,
    ok: u64,
    errors: Vec<(&'static str, u64)>,
    cancelled: u64,
    ongoing: u32,
    latency: HistogramSnapshot,
    /// Its batcher's figures (a batched replica of this process).
    batch: Option<BatchFigures>,
    /// Its models (a multiplexed replica).
    models: Option<ModelFigures>,
}

/// One deployment's figures.
struct DeploymentFigures {
    app: String,
    deployment: String,
    route: String,
    assigned: u64,
    rejected: u64,
    starts: u64,
    queued: usize,
    replicas: Vec<ReplicaFigures>,
    status: Option<DeploymentStatus>,
    /// From the DeploymentActor's snapshot: (replica id, state) and the target.
    states: Vec<(String, ReplicaState)>,
    autoscaled_target: Option<u32>,
}

/// Everything one scrape writes, gathered first (the encoder is synchronous).
struct Scrape {
    http: Vec<Arc<HttpStats>>,
    ongoing_http: i64,
    node_id: String,
    node_ip: String,
    deployments: Vec<DeploymentFigures>,
    apps: Vec<(String, ApplicationStatus)>,
    /// Flotilla's own counters; `None` while the Controller cannot answer (a
    /// crash in progress, or shut down): left out then, since a 0 would read
    /// as a counter reset.
    flotilla: Option<flotilla::Metrics>,
    scrapes: u64,
    /// Each listener's `(name, open connections, limit, times it reached it)`.
    listeners: Vec<(&'static str, usize, usize, u64)>,
    /// With nodes: each live node process's `(id, replicas on it)` (`None`
    /// without nodes: no node series then).
    nodes: Option<Vec<(String, usize)>>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape").finish_non_exhaustive()
    }
}

/// Gather and encode one scrape.
pub(crate) async fn scrape(
    serve: &Serve,
    proxy: Option<&ProxyMetrics>,
    http: Vec<Arc<HttpStats>>,
) -> Result<String, std::fmt::Error> {
    let statuses = serve.status();
    let prefixes: BTreeMap<String, String> = serve
        .routes()
        .routes()
        .into_iter()
        .map(|r| (r.app.to_string(), r.prefix.to_string()))
        .collect();
    let details = serve.deployment_details(SNAPSHOT_TIMEOUT).await;
    let mut deployments = Vec::new();
    for d in details {
        let (app, dep) = (d.app.to_string(), d.deployment.to_string());
        let status = statuses
            .iter()
            .find(|(a, _)| a.as_str() == app)
            .and_then(|(_, s)| s.deployments.get(dep.as_str()))
            .map(|s| s.status);
        let Ok(handle) = serve.deployment_handle(&app, &dep) else {
            continue;
        };
        let route = handle.route();
        let replicas = route
            .replicas()
            .iter()
            .map(|r| {
                let s = r.stats();
                ReplicaFigures {
                    id: r.id().to_string(),
                    ok: s.succeeded(),
                    errors: ErrorKind::ALL
                        .iter()
                        .map(|k| (k.label(), s.failed(*k)))
                        .collect(),
                    cancelled: s.cancelled(),
                    ongoing: r.in_flight(),
                    latency: s.latency().snapshot(),
                    batch: BatchFigures::of(r),
                    models: ModelFigures::of(r),
                }
            })
            .collect();
        let (states, autoscaled_target) = match &d.snapshot {
            Some(s) => (
                s.replicas
                    .iter()
                    .map(|r| (r.id.to_string(), r.state))
                    .collect(),
                matches!(s.target.spec.config.num_replicas, ReplicaCount::Auto(_))
                    .then_some(s.target.replicas),
            ),
            None => (Vec::new(), None),
        };
        let stats = route.stats();
        deployments.push(DeploymentFigures {
            route: prefixes.get(&app).cloned().unwrap_or_default(),
            app,
            deployment: dep,
            assigned: stats.assigned(),
            rejected: stats.rejected(),
            starts: stats.replica_starts(),
            queued: route.queued(),
            replicas,
            status,
            states,
            autoscaled_target,
        });
    }
    let flotilla = serve.metrics().await.ok();
    let nodes = serve.node_address().map(|_| {
        (serve.nodes().into_iter())
            .filter(|n| n.alive)
            .map(|n| (n.id, n.replicas))
            .collect()
    });
    let scrape = Scrape {
        nodes,
        http,
        ongoing_http: proxy.map_or(0, |p| p.ongoing.load(Ordering::Relaxed)),
        node_id: proxy.map(|p| p.node_id.clone()).unwrap_or_default(),
        node_ip: proxy.map(|p| p.node_ip.clone()).unwrap_or_default(),
        deployments,
        apps: statuses
            .iter()
            .map(|(a, s)| (a.to_string(), s.status))
            .collect(),
        flotilla,
        scrapes: proxy.map_or(0, |p| p.scrapes.fetch_add(1, Ordering::Relaxed) + 1),
        listeners: proxy
            .map(|p| {
                p.listeners
                    .iter()
                    .map(|l| (l.listener, l.open(), l.max(), l.reached()))
                    .collect()
            })
            .unwrap_or_default(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// Writes one metric family: a descriptor and its samples.
struct Family<'e, 'a> {
    encoder: prometheus_client::encoding::MetricEncoder<'e>,
    _labels: std::marker::PhantomData<&'a ()>,
}

fn family<'e>(
    encoder: &'e mut DescriptorEncoder,
    name: &'e str,
    help: &str,
    kind: MetricType,
) -> Result<Family<'e, 'e>, std::fmt::Error> {
    Ok(Family {
        encoder: encoder.encode_descriptor(name, help, None, kind)?,
        _labels: std::marker::PhantomData,
    })
}

impl Family<'_, '_> {
    fn counter(&mut self, labels: &Labels, value: u64) -> Result<(), std::fmt::Error> {
        ConstCounter::new(value).encode(self.encoder.encode_family(labels)?)
    }

    fn gauge(&mut self, labels: &Labels, value: i64) -> Result<(), std::fmt::Error> {
        ConstGauge::new(value).encode(self.encoder.encode_family(labels)?)
    }

    fn histogram(&mut self, labels: &Labels, h: &HistogramSnapshot) -> Result<(), std::fmt::Error> {
        self.encoder
            .encode_family(labels)?
            .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.pairs(), None)
    }
}

fn deployment_status_value(s: Option<DeploymentStatus>) -> i64 {
    match s {
        None => 0,
        Some(DeploymentStatus::DeployFailed) => 1,
        Some(DeploymentStatus::Unhealthy) => 2,
        Some(DeploymentStatus::Updating) => 3,
        Some(DeploymentStatus::Upscaling) => 4,
        Some(DeploymentStatus::Downscaling) => 5,
        Some(DeploymentStatus::Healthy) => 6,
    }
}

fn application_status_value(s: ApplicationStatus) -> i64 {
    match s {
        ApplicationStatus::DeployFailed => 1,
        ApplicationStatus::Unhealthy => 2,
        ApplicationStatus::NotStarted => 3,
        ApplicationStatus::Deleting => 4,
        ApplicationStatus::Deploying => 5,
        ApplicationStatus::Running => 6,
    }
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge, Histogram};
        // The proxy's (P/request_ingress_metrics.py).
        let http: Vec<_> = self.http.iter().map(|s| (s, s.read())).collect();
        let mut f = family(
            &mut e,
            "ray_serve_num_http_requests",
            "The number of HTTP requests processed",
            Counter,
        )?;
        for (s, pairs) in &http {
            for (method, status, h) in pairs {
                let l = vec![
                    ("route", s.route.as_str()),
                    ("method", method),
                    ("application", s.app.as_str()),
                    ("status_code", status.as_str()),
                ];
                f.counter(&l, h.count)?;
            }
        }
        let mut f = family(
            &mut e,
            "ray_serve_num_http_error_requests",
            "The number of non-200 HTTP responses",
            Counter,
        )?;
        for (s, pairs) in &http {
            for (method, status, h) in pairs.iter().filter(|p| is_error(&p.1)) {
                let l = vec![
                    ("route", s.route.as_str()),
                    ("error_code", status.as_str()),
                    ("method", method),
                    ("application", s.app.as_str()),
                ];
                f.counter(&l, h.count)?;
            }
        }
        let mut f = family(
            &mut e,
            "ray_serve_num_deployment_http_error_requests",
            "The number of non-200 HTTP responses returned by each deployment",
            Counter,
        )?;
        for (s, pairs) in &http {
            for (method, status, h) in pairs.iter().filter(|p| is_error(&p.1)) {
                let l = vec![
                    ("deployment", s.deployment.as_str()),
                    ("error_code", status.as_str()),
                    ("method", method),
                    ("route", s.route.as_str()),
                    ("application", s.app.as_str()),
                ];
                f.counter(&l, h.count)?;
            }
        }
        let mut f = family(
            &mut e,
            "ray_serve_http_request_latency_ms",
            "The end-to-end latency of HTTP requests (measured from the Serve HTTP proxy)",
            Histogram,
        )?;
        for (s, pairs) in &http {
            for (method, status, h) in pairs {
                let l = vec![
                    ("method", *method),
                    ("route", s.route.as_str()),
                    ("application", s.app.as_str()),
                    ("status_code", status.as_str()),
                ];
                f.histogram(&l, h)?;
            }
        }
        if !self.node_id.is_empty() {
            let mut f = family(
                &mut e,
                "ray_serve_num_ongoing_http_requests",
                "The number of ongoing requests in this HTTP proxy",
                Gauge,
            )?;
            let l = vec![
                ("node_id", self.node_id.as_str()),
                ("node_ip_address", self.node_ip.as_str()),
            ];
            f.gauge(&l, self.ongoing_http)?;
        }

        // Replicas (P/replica.py), recorded by the data plane.
        let mut f = family(
            &mut e,
            "ray_serve_deployment_request_counter",
            "The number of queries that have been processed in this replica",
            Counter,
        )?;
        for d in &self.deployments {
            for r in &d.replicas {
                f.counter(&replica_labels(d, r, true), r.ok)?;
            }
        }
        let mut f = family(
            &mut e,
            "ray_serve_deployment_error_counter",
            "The number of exceptions that have occurred in this replica",
            Counter,
        )?;
        for d in &self.deployments {
            for r in &d.replicas {
                for (kind, n) in r.errors.iter().filter(|(_, n)| *n > 0) {
                    let mut l = replica_labels(d, r, true);
                    l.push(("exception_type", kind));
                    f.counter(&l, *n)?;
                }
            }
        }
        let mut f = family(
            &mut e,
            "ray_serve_deployment_processing_latency_ms",
            "The latency for queries to be processed",
            Histogram,
        )?;
        for d in &self.deployments {
            for r in &d.replicas {
                f.histogram(&replica_labels(d, r, true), &r.latency)?;
            }
        }
        let mut f = family(
            &mut e,
            "ray_serve_replica_processing_queries",
            "The current number of queries being processed",
            Gauge,
        )?;
        for d in &self.deployments {
            for r in &d.replicas {
                f.gauge(&replica_labels(d, r, false), i64::from(r.ongoing))?;
            }
        }
        let mut f = family(
            &mut e,
            "ray_serve_deployment_replica_starts",
            "The number of times this replica has been restarted due to failure",
            Counter,
        )?;
        for d in &self.deployments {
            f.counter(&deployment_labels(d), d.starts)?;
        }
        let mut f = family(
            &mut e,
            "ray_serve_deployment_replica_healthy",
            "Tracks whether this deployment replica is healthy. 1 means healthy, 0 means unhealthy",
            Gauge,
        )?;
        for d in &self.deployments {
            for (id, state) in &d.states {
                // As Ray's: 1 once a replica serves (and while it is updated
                // in place or recovered), 0 once it stops; a replica still
                // starting has no series yet.
                let healthy = match state {
                    ReplicaState::Starting => continue,
                    ReplicaState::Running | ReplicaState::Updating | ReplicaState::Recovering => 1,
                    ReplicaState::Stopping => 0,
                };
                let l = vec![
                    ("deployment", d.deployment.as_str()),
                    ("replica", id.as_str()),
                    ("application", d.app.as_str()),
                ];
                f.gauge(&l, healthy)?;
            }
        }

        batches_and_models::encode(&mut e, &self.deployments)?;

        // Routers (P/router.py), per deployment (shared by all its handles).
        let mut f = family(
            &mut e,
            "ray_serve_num_router_requests",
            "The number of requests processed by the router",
            Counter,
        )?;
        for d in &self.deployments {
            f.counter(&deployment_labels(d), d.assigned)?;
        }
        let mut f = family(
            &mut e,
            "ray_serve_deployment_queued_queries",
            "The current number of queries to this deployment waiting to be assigned to a replica",
            Gauge,
        )?;
        for d in &self.deployments {
            f.gauge(&deployment_labels(d), d.queued as i64)?;
        }
        let mut f = family(
            &mut e,
            "ray_serve_num_ongoing_requests_at_replicas",
            "The current number of requests to this deployment that have been submitted to a replica",
            Gauge,
        )?;
        for d in &self.deployments {
            let n: i64 = d.replicas.iter().map(|r| i64::from(r.ongoing)).sum();
            f.gauge(&deployment_labels(d), n)?;
        }

        // Controller side.
        let mut f = family(
            &mut e,
            "ray_serve_deployment_status",
            "Numeric status of deployment. 0=UNKNOWN, 1=DEPLOY_FAILED, 2=UNHEALTHY, 3=UPDATING, 4=UPSCALING, 5=DOWNSCALING, 6=HEALTHY",
            Gauge,
        )?;
        for d in &self.deployments {
            f.gauge(&deployment_labels(d), deployment_status_value(d.status))?;
        }
        let mut f = family(
            &mut e,
            "ray_serve_application_status",
            "Numeric status of application. 0=UNKNOWN, 1=DEPLOY_FAILED, 2=UNHEALTHY, 3=NOT_STARTED, 4=DELETING, 5=DEPLOYING, 6=RUNNING",
            Gauge,
        )?;
        for (app, status) in &self.apps {
            f.gauge(
                &vec![("application", app.as_str())],
                application_status_value(*status),
            )?;
        }
        let mut f = family(
            &mut e,
            "ray_serve_autoscaling_target_replicas",
            "The target number of replicas for the autoscaling deployment",
            Gauge,
        )?;
        for d in &self.deployments {
            if let Some(t) = d.autoscaled_target {
                f.gauge(&deployment_labels(d), i64::from(t))?;
            }
        }

        // Flotilla's own.
        if let Some(m) = &self.flotilla {
            let mut f = family(
                &mut e,
                "flotilla_checkpoint_commits",
                "Checkpoint commits (one redb write transaction each)",
                Counter,
            )?;
            f.counter(&vec![], m.store.commits)?;
            let mut f = family(
                &mut e,
                "flotilla_checkpoint_keys_written",
                "Checkpoint key operations committed (puts and deletes)",
                Counter,
            )?;
            f.counter(&vec![], m.store.keys_written)?;
            let mut f = family(
                &mut e,
                "flotilla_checkpoint_bytes_written",
                "Checkpoint key and value bytes committed",
                Counter,
            )?;
            f.counter(&vec![], m.store.bytes_written)?;
            let mut f = family(
                &mut e,
                "flotilla_restarts",
                "Control actors restarted after a crash, by level (controller: by the Supervisor; application: by the Controller, over all its restarts)",
                Counter,
            )?;
            f.counter(&vec![("level", "controller")], m.controller_restarts)?;
            f.counter(&vec![("level", "application")], m.controller.app_restarts)?;
            if self.nodes.is_some() {
                let n = &m.nodes;
                let mut f = family(
                    &mut e,
                    "flotilla_nodes_live",
                    "Node processes joined to this head and alive now (the head not counted)",
                    Gauge,
                )?;
                f.gauge(&vec![], i64::try_from(n.live).unwrap_or(i64::MAX))?;
                let mut f = family(
                    &mut e,
                    "flotilla_node_changes",
                    "Nodes joined (a re-attach counts), lost (gone without shutting down), \
                     left (shut down) and refused (a failed handshake, a fenced node)",
                    Counter,
                )?;
                for (change, count) in [
                    ("joined", n.joined),
                    ("lost", n.lost),
                    ("left", n.left),
                    ("refused", n.refused),
                ] {
                    f.counter(&vec![("change", change)], count)?;
                }
                let mut f = family(
                    &mut e,
                    "flotilla_node_replicas_lost",
                    "Replicas that were on nodes when those were declared lost (each replaced)",
                    Counter,
                )?;
                f.counter(&vec![], n.replicas_lost)?;
            }
        }
        if let Some(nodes) = &self.nodes {
            let mut f = family(
                &mut e,
                "flotilla_node_replicas",
                "Replicas placed on each live node (node processes; the head's own are \
                 flotilla_replicas')",
                Gauge,
            )?;
            for (node, replicas) in nodes {
                f.gauge(
                    &vec![("node_id", node.as_str())],
                    i64::try_from(*replicas).unwrap_or(i64::MAX),
                )?;
            }
        }
        let mut f = family(
            &mut e,
            "flotilla_replicas",
            "Replicas by state, as their DeploymentActors see them",
            Gauge,
        )?;
        for d in &self.deployments {
            let mut by_state: BTreeMap<String, i64> = BTreeMap::new();
            for (_, s) in &d.states {
                *by_state.entry(s.to_string()).or_default() += 1;
            }
            for (state, n) in &by_state {
                let mut l = deployment_labels(d);
                l.push(("state", state.as_str()));
                f.gauge(&l, *n)?;
            }
        }
        let mut f = family(
            &mut e,
            "flotilla_backpressure_rejections",
            "Requests refused because the deployment's queue was full (max_queued_requests)",
            Counter,
        )?;
        for d in &self.deployments {
            f.counter(&deployment_labels(d), d.rejected)?;
        }
        let mut f = family(
            &mut e,
            "flotilla_deployment_cancelled_requests",
            "Requests whose caller went away before they finished (their handler was cancelled)",
            Counter,
        )?;
        for d in &self.deployments {
            for r in &d.replicas {
                f.counter(&replica_labels(d, r, false), r.cancelled)?;
            }
        }
        if !self.listeners.is_empty() {
            let mut f = family(
                &mut e,
                "flotilla_http_connections",
                "Connections open on each HTTP listener",
                Gauge,
            )?;
            for (listener, open, _, _) in &self.listeners {
                f.gauge(&vec![("listener", *listener)], gauge_value(*open))?;
            }
            let mut f = family(
                &mut e,
                "flotilla_http_max_connections",
                "The most connections each HTTP listener holds open at once (max_connections)",
                Gauge,
            )?;
            for (listener, _, max, _) in &self.listeners {
                f.gauge(&vec![("listener", *listener)], gauge_value(*max))?;
            }
            let mut f = family(
                &mut e,
                "flotilla_http_connection_limit_reached",
                "Times an HTTP listener reached max_connections and held new connections back",
                Counter,
            )?;
            for (listener, _, _, reached) in &self.listeners {
                f.counter(&vec![("listener", *listener)], *reached)?;
            }
        }
        if self.scrapes > 0 {
            let mut f = family(
                &mut e,
                "flotilla_metrics_scrapes",
                "Scrapes of /metrics served",
                Counter,
            )?;
            f.counter(&vec![], self.scrapes)?;
        }
        Ok(())
    }
}

/// A count as a gauge's value (saturated: no count comes near it).
fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn is_error(status: &str) -> bool {
    status.starts_with('4') || status.starts_with('5')
}

fn deployment_labels(d: &DeploymentFigures) -> Labels<'_> {
    vec![
        ("deployment", d.deployment.as_str()),
        ("application", d.app.as_str()),
    ]
}

fn replica_labels<'a>(d: &'a DeploymentFigures, r: &'a ReplicaFigures, route: bool) -> Labels<'a> {
    let mut l = vec![
        ("deployment", d.deployment.as_str()),
        ("replica", r.id.as_str()),
        ("application", d.app.as_str()),
    ];
    if route {
        l.push(("route", d.route.as_str()));
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_live_node_has_its_replica_count_and_without_nodes_no_node_series() {
        // Flotilla's own counters given: the node families among them are
        // left out without nodes too.
        let encode = |nodes: Option<Vec<(String, usize)>>| {
            let scrape = Scrape {
                http: Vec::new(),
                ongoing_http: 0,
                node_id: "head".into(),
                node_ip: String::new(),
                deployments: Vec::new(),
                apps: Vec::new(),
                flotilla: Some(flotilla::Metrics::default()),
                scrapes: 1,
                listeners: Vec::new(),
                nodes,
            };
            let mut registry = Registry::default();
            registry.register_collector(Box::new(scrape));
            let mut out = String::new();
            prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
                .unwrap_or_else(|e| panic!("{e}"));
            out
        };
        let with = encode(Some(vec![("a-1".into(), 2), ("b-2".into(), 0)]));
        assert!(
            with.contains("flotilla_node_replicas{node_id=\"a-1\"} 2\n"),
            "{with}"
        );
        assert!(
            with.contains("flotilla_node_replicas{node_id=\"b-2\"} 0\n"),
            "{with}"
        );
        assert!(with.contains("flotilla_nodes_live 0\n"), "{with}");
        let without = encode(None);
        assert!(without.contains("flotilla_restarts"), "{without}");
        assert!(!without.contains("flotilla_node"), "{without}");
    }
}
