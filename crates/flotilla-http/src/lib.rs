//! Flotilla over HTTP: the proxy, the Serve REST API, Prometheus metrics and the
//! `flotilla` CLI.
//!
//! This crate owns how Flotilla is reached from outside its process:
//! - the **proxy** ([`HttpServer`], default `127.0.0.1:8000`): HTTP/1.1 and h2c,
//!   routed by longest route prefix with Ray's boundary rule ([`PrefixRouter`])
//!   to each application's ingress deployment through its `DeploymentHandle`,
//!   following the Controller's route index by subscription (a request
//!   sees every change acknowledged before it came: `run` returned means the
//!   prefix routes, `delete_apps` returned means it 404s); Ray's status codes
//!   and bodies (see the [`proxy`] module), `/-/healthz`, `/-/routes`, request
//!   ids, timeouts, body limits, streamed responses;
//! - the **REST API** on a second listener (default `127.0.0.1:8265`): Ray's
//!   `PUT`/`GET`/`DELETE /api/serve/applications/` and
//!   `POST /api/v1/applications/{app}/deployments/{deployment}/scale` (see
//!   [`rest`]), and `GET /metrics` in Prometheus text ([`metrics`]);
//! - the serde types an HTTP ingress takes and answers ([`HttpRequest`],
//!   [`HttpResponse`]), and the `flotilla` binary, a client of the REST API.
//!
//! It must not reach below the facade (`flotilla`): everything it needs is
//! public there. It holds no state of its own worth keeping: the route table is
//! the Controller's, counters live on the data plane, the applied config in the
//! checkpoint. It never blocks a request on a control message (the only
//! control-plane reads on a request's path are on the no-replica path).
//!
//! # An ingress
//!
//! ```no_run
//! use flotilla::{Deployment, UserError};
//! use flotilla_http::{HttpRequest, HttpResponse};
//!
//! struct Echo;
//! impl Deployment for Echo {
//!     type Request = HttpRequest;
//!     type Response = HttpResponse;
//!     async fn handle(&self, req: HttpRequest) -> Result<HttpResponse, UserError> {
//!         let path = req.route_path().to_owned();
//!         Ok(HttpResponse::new(200, req.body).with_header("x-path", path))
//!     }
//! }
//! ```
//!
//! # Decisions (where Flotilla departs from Ray, or Ray leaves it open)
//!
//! - Request bodies are read whole before the ingress runs, up to
//!   [`DEFAULT_MAX_REQUEST_BODY_BYTES`] (10 MiB, configurable; 413 above it).
//!   Ray sets no limit and streams request bodies to the replica.
//! - HTTP/2 (h2c with prior knowledge, and on the REST listener) is served;
//!   Ray's uvicorn proxy speaks HTTP/1.1 only. `keep_alive_timeout` is the idle
//!   timeout of every connection, HTTP/1.1 (as uvicorn's) and HTTP/2 alike: a
//!   connection with no request in flight (none yet, or none since its last
//!   response was sent) for that long is closed (an HTTP/2 one with GOAWAY).
//! - With no replica, a request answers 503 at once when its ingress cannot
//!   get one soon (the ingress deployment DEPLOY_FAILED, the application
//!   DELETING, or a fixed target of 0), and waits in the handle's queue
//!   otherwise (DEPLOYING, UNHEALTHY, another deployment failed, autoscaled to
//!   zero) until its timeout, giving up with 503 if its ingress fails while the
//!   request still waits for a replica; a request a replica holds is never
//!   given up for a status. Ray waits in every case.
//! - A 500 carries the user error's message (Ray's plain deployments answer
//!   `Internal Server Error`); a 500 for an ingress of the wrong types names the
//!   application and deployment.
//! - Streaming: the first item of an ingress's stream is the response head; a
//!   stream with one item is sent whole with `content-length`. An error or the
//!   timeout after the head cuts the stream (as Ray), the timeout even while
//!   its client reads nothing (the server's reaper cuts it then).
//! - A client that takes nothing of a response for `keep_alive_timeout` (as
//!   a request body that stalls) has its connection dropped, with whatever
//!   was in flight on it: streams end, their handlers and replica slots
//!   freed, and each request is recorded as its client gone (499). It holds
//!   neither its connection nor its place under `max_connections` for
//!   longer. A client that keeps reading gets all of it, whole or
//!   streamed, unless it is very slow: the server sees a client's progress
//!   only as its socket's send buffer drains (the kernel reports room once
//!   about a third of it is free: up to 1.3 MiB on Linux's defaults), so a
//!   client that takes less than that in a `keep_alive_timeout` (90 s by
//!   default: about 15 KB/s) counts as taking nothing.
//! - A client that pipelines a request behind one in flight and then
//!   disconnects is noticed only when the first ends: hyper, as Ray's
//!   uvicorn, does not watch for the disconnect while a pipelined request
//!   waits in its buffer, so the first runs on until it answers or
//!   `request_timeout` cuts it.
//! - `request_timeout` starts when the request arrives and covers reading its
//!   body, queueing and the handler (Ray's is end to end too).
//! - Both listeners bind loopback by default. When the REST listener is on,
//!   binding either listener elsewhere needs a bearer token
//!   ([`HttpError::TokenRequired`] otherwise) of at least 16 bytes
//!   ([`HttpError::WeakToken`] otherwise: the REST API answers every guess);
//!   with a token configured, `PUT`, `DELETE`
//!   and the scale `POST` always need `Authorization: Bearer <token>` (or, as Ray's,
//!   `X-Ray-Authorization`): 401 without a token, 403 with a wrong one.
//!   Reads and `/metrics` need none, as Ray's dashboard; a REST listener on
//!   loopback answers only requests for `localhost` or an IP address (403
//!   otherwise, where Ray answers any `Host`): a page whose own name a DNS
//!   rebinding points here could read the applied config. With the REST listener
//!   off, the proxy may bind anywhere without a token; a disabled proxy binds
//!   nothing, so its host is neither resolved nor checked.
//! - A config's `http_options` and `proxy_location` are laid over the
//!   program's [`HttpOptions`] when the server starts, from the applied config
//!   (the fields it gives win; see [`HttpOptionsBuilder::serve_config`]; a left
//!   out `host` stays loopback, where Ray's schema says 0.0.0.0;
//!   `proxy_location: Disabled` starts no proxy; `EveryNode` and `HeadOnly`
//!   serve this one proxy). A later PUT cannot move a running server: its
//!   different `http_options` are logged, as Ray warns, and apply at the next
//!   start; `http_options` that start would refuse (any `ssl_*` field, an
//!   empty host, a host that does not resolve, a host off loopback without a
//!   token, the proxy on the REST API's port) or could not bind (a host that
//!   is not this machine's, a new port another process holds now) make the
//!   PUT a 400 that changes nothing and names the field, where Ray accepts
//!   them: stored, they would stop the next start, and with it the REST API
//!   that could mend them. (A port taken only after the PUT still does.)
//! - `GET /api/serve/applications/`: replica ids are Flotilla's numbers,
//!   `actor_name`s are Flotilla's actor names, pids, worker ids, `node_ip`,
//!   `actor_id` and log files are left out, and so are the instance's
//!   `deploy_mode` (Ray's is always `MULTI_APP`), `grpc_options` (no gRPC
//!   proxy) and `target_groups` (all optional in Ray's schema); `recent_dead_replicas` is empty, `deployment_topology` lists
//!   no outbound calls, `proxy_location` is `HeadOnly` (one proxy per
//!   `HttpServer`). A replica's `start_time_s` is when it began serving, 0.0
//!   while that is not known (still starting, or stopping). A deployment whose
//!   DeploymentActor is not running (being started or restarted, gone while
//!   its application is deleted) or does not answer within 2 s is left out of
//!   its application's `deployments` (still in `deployment_topology`): its
//!   config, target and resources, which Ray's schema requires, are not
//!   known without it. Ray's controller always has them.
//!
//! # Metrics
//!
//! Ray Serve's names as Prometheus sees them (`ray_` + name, counters with
//! `_total`), with Ray's labels, so its dashboards work:
//! `ray_serve_num_http_requests_total`, `ray_serve_num_http_error_requests_total`,
//! `ray_serve_num_deployment_http_error_requests_total`,
//! `ray_serve_http_request_latency_ms` (histogram, Ray's buckets),
//! `ray_serve_num_ongoing_http_requests`, `ray_serve_deployment_request_counter_total`,
//! `ray_serve_deployment_error_counter_total` (`exception_type`: `UserError`,
//! `Panicked`, `Killed`, `BadRequest`, `BadResponse`),
//! `ray_serve_deployment_processing_latency_ms`, `ray_serve_replica_processing_queries`,
//! `ray_serve_deployment_replica_starts_total` (per deployment: no `replica`
//! label), `ray_serve_deployment_replica_healthy`, `ray_serve_num_router_requests_total`,
//! `ray_serve_deployment_queued_queries`, `ray_serve_num_ongoing_requests_at_replicas`,
//! `ray_serve_deployment_status`, `ray_serve_application_status`,
//! `ray_serve_autoscaling_target_replicas`; batching, per replica with
//! `function_name="handle_batch"`: `ray_serve_batch_wait_time_ms`,
//! `ray_serve_batch_execution_time_ms`, `ray_serve_batch_utilization_percent`,
//! `ray_serve_actual_batch_size` (histograms), `ray_serve_batch_queue_length`,
//! `ray_serve_batches_processed_total`; multiplexing, per replica:
//! `ray_serve_num_multiplexed_models`,
//! `ray_serve_registered_multiplexed_model_id{model_id}` (1 per loaded
//! model), `ray_serve_multiplexed_models_load_counter_total`,
//! `ray_serve_multiplexed_models_unload_counter_total`,
//! `ray_serve_multiplexed_get_model_requests_counter_total` (one per batch
//! part with batching: the model is fetched once for it),
//! `ray_serve_multiplexed_model_load_latency_ms` and `..._unload_latency_ms`.
//! (`ray_serve_batch_queue_length` counts, as Ray's queue size, the requests
//! not yet taken into a batch.) A replica in another process batches and
//! loads there: its batch and model series are its node's last report of
//! them (up to 10 heartbeats late). And Flotilla's own:
//! `flotilla_checkpoint_commits_total`, `flotilla_checkpoint_keys_written_total`,
//! `flotilla_checkpoint_bytes_written_total`, `flotilla_restarts_total{level}`
//! (`controller`, `application`), `flotilla_replicas{state}`,
//! `flotilla_backpressure_rejections_total`, `flotilla_deployment_cancelled_requests_total`,
//! `flotilla_metrics_scrapes_total`, and per listener (`listener`: `proxy`,
//! `rest`) `flotilla_http_connections`, `flotilla_http_max_connections` and
//! `flotilla_http_connection_limit_reached_total` (see
//! [`HttpOptions::max_connections`]); with nodes, `flotilla_nodes_live`,
//! `flotilla_node_changes_total{change}` (`joined`, `lost`, `left`,
//! `refused`), `flotilla_node_replicas_lost_total` and
//! `flotilla_node_replicas{node_id}` per live node. The `route` label of replica metrics is
//! the application's route prefix (Ray's is the request's route). Router
//! metrics are per deployment (Ray's are per handle). A route's HTTP series
//! outlive it, as Ray's proxy keeps its series for its life (a deletion does
//! not erase its history, and requests that finish after their route went
//! are counted), for the last 1,000 routes that went; one back under the same
//! prefix, application and ingress goes on from them.

mod auth;
mod body;
mod connection;
mod connection_limit;
pub mod details;
mod error;
pub mod metrics;
mod options;
pub mod proxy;
mod reaper;
mod request_body;
pub mod rest;
mod router;
mod server;
mod table;
mod types;

pub use auth::TokenSource;
pub use error::{HttpError, OptionProblem};
pub use metrics::METRICS_CONTENT_TYPE;
pub use options::{
    DEFAULT_KEEP_ALIVE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUEST_BODY_BYTES,
    DEFAULT_PORT, DEFAULT_REST_PORT, DEFAULT_SHUTDOWN_GRACE, HttpOptions, HttpOptionsBuilder,
};
pub use proxy::{MULTIPLEXED_MODEL_ID_HEADER, REQUEST_TIMEOUT_HEADER};
pub use rest::RAY_VERSION;
pub use router::PrefixRouter;
pub use server::HttpServer;
pub use types::{HttpRequest, HttpResponse};

/// The request id header (Ray's `SERVE_HTTP_REQUEST_ID_HEADER`): taken from the
/// request, or made by the proxy (for a request without one, or with an empty
/// one or one that is not visible ASCII, which the proxy's replaces); the
/// ingress always sees the id the response carries, and every response
/// carries it.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The `tracing` target of the proxy's and the REST API's per-request access
/// log events: under [`flotilla::ACCESS_TARGET`], so `enable_access_log: false`
/// silences them too (the proxy's by their application's logging config; the
/// REST API's, which belong to no application, by the top-level one).
pub const ACCESS_LOG_TARGET: &str = "flotilla::access::http";

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}
