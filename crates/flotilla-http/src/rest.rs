//! The Serve REST API (Ray's `dashboard/modules/serve/serve_head.py`) and
//! `/metrics`, on the second listener.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /api/ray/version` | 200 JSON `{"version": "4", "ray_version": ..., ...}`: Ray's `serve` CLI checks it first |
//! | `GET /api/serve/applications/` (`?api_type=imperative\|declarative`, any case; empty is no filter) | 200 JSON `ServeInstanceDetails` ([`crate::details`]) |
//! | `PUT /api/serve/applications/` | a ServeConfig, JSON or YAML: 200 once it is durable, its body one `Warning: ...` line per thing the config holds that is not applied (empty when none, as Ray's); 400 naming the line, field and application, nothing changed |
//! | `DELETE /api/serve/applications/` | delete every application: 200 (empty) once they are gone, or after 30 s while they go on, as Ray's `serve.shutdown()` |
//! | `POST /api/v1/applications/{app}/deployments/{deployment}/scale` | `{"target_num_replicas": N}` (other keys ignored): 200 once durable; 400 for an unknown application or deployment or a bad body, 412 when its application does not enable an external scaler or is being deleted (`Deployment is deleted`), as Ray |
//! | `GET /metrics` | Prometheus text |
//!
//! The body of `PUT` is parsed by content type: `application/json` and
//! anything else alike go through [`ServeConfig::from_yaml`](flotilla::ServeConfig::from_yaml)
//! (JSON is YAML 1.2), whose errors carry the line and column and name the
//! application and field. Paths are accepted with or without the trailing `/`.
//!
//! A `PUT`, `DELETE` or `POST` that looks like a browser's (Ray's heuristic:
//! `crate::auth`) is 405 `'PUT' method not allowed for browser traffic.`,
//! with or without a token; reads are served to browsers. A listener on
//! loopback answers only requests whose `Host` is `localhost` or an IP
//! address: 403 for any other name (a DNS-rebinding page's).

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use flotilla::{ApiType, Serve, ServeConfig, ServeError};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};

use crate::{
    HttpOptions,
    auth::{Token, is_browser_request},
    details::{ApiFilter, instance_details},
    metrics::{METRICS_CONTENT_TYPE, ProxyMetrics, scrape},
    request_body::{BodyReadError, read_whole},
    table::RouteFollower,
};

/// The Ray version `GET /api/ray/version` reports: the one whose REST API and
/// CLI Flotilla follows.
pub const RAY_VERSION: &str = "2.60.0";

/// The REST listener's state.
pub(crate) struct Rest {
    pub(crate) serve: Serve,
    /// The options the server runs with (the program's, with the applied
    /// config's laid over them at start).
    pub(crate) options: Arc<HttpOptions>,
    /// The program's own options, which the next start lays the config
    /// applied then over.
    pub(crate) base_options: Arc<HttpOptions>,
    pub(crate) token: Option<Token>,
    pub(crate) proxy_addr: Option<std::net::SocketAddr>,
    /// The proxy's, for its counters in `/metrics`.
    pub(crate) proxy: Option<(Arc<ProxyMetrics>, Arc<RouteFollower>)>,
    pub(crate) draining: Arc<std::sync::atomic::AtomicBool>,
    /// The listener is bound to loopback: a request naming another host is
    /// refused ([`host_allowed`]).
    pub(crate) loopback_only: bool,
}

type Body = crate::body::Whole;

fn respond(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(crate::body::Whole::new(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    respond(status, "text/plain; charset=utf-8", body)
}

fn json(status: u16, value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(b) => respond(status, "application/json; charset=utf-8", b),
        Err(e) => text(500, format!("encoding the response failed: {e}")),
    }
}

/// The application and deployment of Ray's scale route,
/// `/api/v1/applications/{app}/deployments/{deployment}/scale`.
fn scale_target(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/api/v1/applications/")?;
    let (app, rest) = rest.split_once("/deployments/")?;
    let deployment = rest.strip_suffix("/scale")?;
    (!app.is_empty() && !deployment.is_empty() && !deployment.contains('/'))
        .then_some((app, deployment))
}

/// A query string component, decoded as aiohttp's `req.query` decodes it
/// (`+` is a space, then percent-decoding; invalid UTF-8 replaced).
fn query_component(raw: &str) -> String {
    percent_encoding::percent_decode_str(&raw.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// Which applications a GET asks for, as Ray's `get_serve_instance_details`
/// reads its `api_type` parameter: the first one, decoded; none or an empty
/// one is no filter; matched lower-cased. A value that is neither
/// `imperative` nor `declarative` is an [`UnknownApiType`].
fn api_filter(query: Option<&str>) -> Result<ApiFilter, UnknownApiType> {
    let given = query
        .unwrap_or_default()
        .split('&')
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .find(|(k, _)| query_component(k) == "api_type")
        .map(|(_, v)| query_component(v));
    match given.as_deref().map(str::to_lowercase).as_deref() {
        None | Some("") => Ok(ApiFilter::All),
        Some("imperative") => Ok(ApiFilter::Only(ApiType::Imperative)),
        Some("declarative") => Ok(ApiFilter::Only(ApiType::Declarative)),
        Some(_) => Err(UnknownApiType(given.unwrap_or_default())),
    }
}

/// A GET's `api_type` that is neither `imperative` nor `declarative`: the
/// value as given (decoded), and Ray's 400 text as its message.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("Invalid 'api_type' value: '{0}'. Must be one of: imperative, declarative")]
struct UnknownApiType(String);

/// The status of a failed `apply_config` or `delete_apps`, with its text.
/// How long `DELETE /api/serve/applications/` waits for the applications to
/// be gone (Ray's `serve.shutdown()` waits as long for its controller).
const DELETE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn serve_error(e: &ServeError) -> (u16, String) {
    let status = match e {
        ServeError::ControllerCrashed | ServeError::Unavailable(_) => 503,
        ServeError::Store(_) => 500,
        _ => 400,
    };
    (status, e.to_string())
}

impl Rest {
    pub(crate) async fn handle(
        self: Arc<Self>,
        req: Request<hyper::body::Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        let path = req.uri().path().trim_end_matches('/').to_owned();
        let method = req.method().clone();
        // HTTP/1's `Host`, or HTTP/2's `:authority`.
        let host = match req.headers().get(header::HOST) {
            Some(h) => Some(String::from_utf8_lossy(h.as_bytes()).into_owned()),
            None => req.uri().authority().map(|a| a.as_str().to_owned()),
        };
        if self.loopback_only
            && let Some(host) = host.filter(|h| !host_allowed(h))
        {
            // Not an access-log line: logged with access logs off too.
            tracing::warn!(method = %method, path = %path, %host,
                "rest request refused: it names a host other than this machine's loopback");
            return Ok(text(
                403,
                format!(
                    "Host '{host}' is not allowed: this REST API listens on loopback, and \
                     answers requests for localhost or an IP address only (a page served \
                     from another name that resolves here could otherwise read it)."
                ),
            ));
        }
        let response = match (path.as_str(), &method) {
            ("/api/ray/version", &Method::GET) => json(
                200,
                &serde_json::json!({
                    "version": "4",
                    "ray_version": RAY_VERSION,
                    "ray_commit": "flotilla",
                    "session_name": self.serve.namespace(),
                    "flotilla_version": env!("CARGO_PKG_VERSION"),
                }),
            ),
            ("/api/serve/applications", &Method::GET) => self.get(req.uri().query()).await,
            ("/api/serve/applications", &Method::PUT) => match self.authorize(&req) {
                Some(denied) => denied,
                None => self.put(req).await,
            },
            ("/api/serve/applications", &Method::DELETE) => match self.authorize(&req) {
                Some(denied) => denied,
                None => self.delete().await,
            },
            ("/metrics", &Method::GET) => self.metrics().await,
            (p, &Method::POST) if scale_target(p).is_some() => match self.authorize(&req) {
                Some(denied) => denied,
                None => match scale_target(p) {
                    Some((app, deployment)) => {
                        let (app, deployment) = (app.to_owned(), deployment.to_owned());
                        self.scale(req, &app, &deployment).await
                    }
                    None => text(404, "Not Found"),
                },
            },
            ("/api/ray/version" | "/api/serve/applications" | "/metrics", _) => {
                let mut r = text(405, "Method Not Allowed");
                let allow = if path == "/api/serve/applications" {
                    "GET, PUT, DELETE"
                } else {
                    "GET"
                };
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(allow));
                r
            }
            _ => text(404, "Not Found"),
        };
        tracing::info!(target: crate::ACCESS_LOG_TARGET, method = %method, path = %path,
            status_code = response.status().as_u16(), "rest request");
        Ok(response)
    }

    /// Ray's external scaler route: set a deployment's replica count
    /// (`{"target_num_replicas": N}`), durable once answered.
    async fn scale(
        &self,
        req: Request<hyper::body::Incoming>,
        app: &str,
        deployment: &str,
    ) -> Response<Body> {
        // Ray's `ScaleDeploymentRequest`: a pydantic model, so other keys
        // are ignored, and its `NonNegativeInt` takes what pydantic's lax
        // mode takes for one (3, 3.0, "3").
        #[derive(serde::Deserialize)]
        struct ScaleBody {
            #[serde(deserialize_with = "lax_count")]
            target_num_replicas: u32,
        }
        let error = |status, e: String| json(status, &serde_json::json!({ "error": e }));
        let limit = self.options.max_request_body_bytes;
        let stall = self.options.keep_alive_timeout;
        let body = match read_whole(req.into_body(), limit, stall).await {
            Ok(b) => b,
            Err(e @ (BodyReadError::Stalled { .. } | BodyReadError::TooSlow { .. })) => {
                return error(408, format!("The request body stalled: {e}."));
            }
            Err(e) => return error(400, format!("Invalid request body: {e}")),
        };
        let target = match serde_json::from_slice::<ScaleBody>(&body) {
            Ok(b) => b.target_num_replicas,
            Err(e) => return error(400, format!("Invalid request body: {e}")),
        };
        match self.serve.scale_deployment(app, deployment, target).await {
            Ok(()) => json(
                200,
                &serde_json::json!({
                    "message": "Scaling request received. Deployment will get scaled asynchronously."
                }),
            ),
            // Ray's `DeploymentIsBeingDeletedError`: "From customer's viewpoint,
            // the deployment is deleted".
            Err(ServeError::BeingDeleted { .. }) => error(412, "Deployment is deleted".to_owned()),
            Err(ServeError::NotFound { .. }) => {
                error(400, "Application or Deployment not found".to_owned())
            }
            Err(e @ ServeError::ExternalScalerDisabled { .. }) => error(412, e.to_string()),
            Err(e @ (ServeError::ControllerCrashed | ServeError::Unavailable(_))) => {
                error(503, format!("Serve controller is not available: {e}"))
            }
            // Ray answers 503 "Internal Server Error" for a failure of the
            // server's own (here a failed checkpoint commit), which a scaler
            // retries; the request's own faults stay 400.
            Err(e) => match serve_error(&e) {
                (400, msg) => error(400, msg),
                (_, msg) => {
                    tracing::error!(app, deployment, error = %msg,
                        "scaling a deployment over the REST API failed");
                    error(503, format!("Internal Server Error: {msg}"))
                }
            },
        }
    }

    /// `Some(405)` for a browser's request (Ray's refusal of browser traffic,
    /// see [`crate::auth`]), `Some(401)` without a token, `Some(403)` with a
    /// wrong one; `None` if the
    /// request may mutate.
    fn authorize(&self, req: &Request<hyper::body::Incoming>) -> Option<Response<Body>> {
        if is_browser_request(req.headers()) {
            return Some(text(
                405,
                format!("'{}' method not allowed for browser traffic.", req.method()),
            ));
        }
        let token = self.token.as_ref()?;
        // As Ray's token middleware: `Authorization`, else the
        // `X-Ray-Authorization` proxies and KubeRay set; none is 401, a wrong
        // one 403.
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .or_else(|| req.headers().get("x-ray-authorization"))
            .map(|v| v.as_bytes());
        if given.is_some() && token.accepts(given) {
            return None;
        }
        let mut r = match given {
            None => text(
                401,
                "Unauthorized: Missing authentication token (this endpoint needs the server's \
                 token: Authorization: Bearer <token>).",
            ),
            Some(_) => text(403, "Forbidden: Invalid authentication token"),
        };
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        Some(r)
    }

    async fn get(&self, query: Option<&str>) -> Response<Body> {
        let filter = match api_filter(query) {
            Ok(f) => f,
            Err(unknown) => return text(400, unknown.to_string()),
        };
        let draining = self.draining.load(std::sync::atomic::Ordering::Acquire);
        match instance_details(
            &self.serve,
            &self.options,
            self.proxy_addr,
            draining,
            filter,
        )
        .await
        {
            Ok(d) => json(200, &d),
            Err(e) => text(
                503,
                format!("Failed to get a response from the controller, please retry later: {e}"),
            ),
        }
    }

    async fn put(&self, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let limit = self.options.max_request_body_bytes;
        let stall = self.options.keep_alive_timeout;
        let body = match read_whole(req.into_body(), limit, stall).await {
            Ok(b) => b,
            Err(BodyReadError::TooLarge { .. }) => {
                return text(
                    413,
                    format!("Request body is larger than the limit of {limit} bytes."),
                );
            }
            Err(e @ (BodyReadError::Stalled { .. } | BodyReadError::TooSlow { .. })) => {
                return text(408, format!("The request body stalled: {e}."));
            }
            Err(e) => return text(400, format!("The request body could not be read: {e}")),
        };
        // Parsing (and, for a bad config, locating the error) takes a few
        // milliseconds per MiB: off the runtime's workers, which the proxy
        // and the actors share. The body moves there as it is (no copy).
        let parsed = tokio::task::spawn_blocking(move || {
            std::str::from_utf8(&body).map(ServeConfig::from_yaml)
        })
        .await;
        let config = match parsed {
            Ok(Ok(Ok(c))) => c,
            Ok(Ok(Err(e))) => return text(400, format!("Invalid config: {e}")),
            Ok(Err(_)) => return text(400, "The config is not UTF-8 text."),
            Err(e) => return text(500, format!("The config could not be parsed: {e}")),
        };
        let apps = config.applications.len();
        // The server's next start lays this config over its options: one that
        // start would refuse (an ssl_* field, an empty host, an address off
        // loopback without a token) is refused now, before anything changes,
        // not at that start.
        let wanted = match crate::HttpOptionsBuilder::from((*self.base_options).clone())
            .serve_config(&config)
            .build()
        {
            Ok(wanted) => wanted,
            Err(e) => return text(400, format!("Invalid config: {e}")),
        };
        // And what that start checks before it binds (the host resolves, the
        // bind rule, one port per listener), then whether its proxy could
        // bind (its host is this machine's, a new port is free): a stored
        // config it would refuse stops the REST API that could mend it.
        let token = self.token.as_ref().map(crate::auth::Token::len);
        let running = self.proxy_addr;
        let checked = {
            let wanted = wanted.clone();
            tokio::task::spawn_blocking(move || {
                let field = |e: crate::HttpError| {
                    let field = match &e {
                        crate::HttpError::SharedPort { .. } => "http_options.port",
                        crate::HttpError::TokenRequired {
                            listener: "proxy", ..
                        }
                        | crate::HttpError::WeakToken {
                            listener: "proxy", ..
                        }
                        | crate::HttpError::Resolve {
                            listener: "proxy", ..
                        } => "http_options.host",
                        _ => "rest_host",
                    };
                    (field, e)
                };
                crate::server::check_startable(&wanted, token).map_err(field)?;
                crate::server::check_bindable(&wanted, running)
            })
            .await
        };
        match checked {
            Ok(Ok(())) => {}
            // Said for whoever deploys the file (`serve build` writes host
            // 0.0.0.0), not for the program that started the server.
            Ok(Err((
                field,
                crate::HttpError::TokenRequired {
                    listener: "proxy",
                    addr,
                },
            ))) => {
                return text(
                    400,
                    format!(
                        "Invalid config: {field}: the proxy would listen on {addr}, off \
                         loopback, and this server's REST API has no bearer token, so anyone \
                         who reaches the network could change what it serves; set \
                         http_options.host to 127.0.0.1 (`serve build` writes 0.0.0.0), or \
                         start the server with a token"
                    ),
                );
            }
            Ok(Err((field, e))) => return text(400, format!("Invalid config: {field}: {e}")),
            Err(e) => return text(500, format!("The config could not be checked: {e}")),
        }
        let moved = wanted != *self.options;
        // What the config holds that is not applied (or not yet): the one
        // deploying hears it in the answer, not only the server's log.
        // (The Controller logs the config's own as it applies it.)
        let mut warnings: Vec<String> = config.warnings().iter().map(|w| w.to_string()).collect();
        if moved {
            // As Ray: a running proxy does not move; the next start takes them.
            warnings.push(
                "the config's http_options (or proxy_location) differ from the running \
                 HTTP server's; they apply when the server is next started"
                    .to_owned(),
            );
        }
        match self.serve.apply_config(config).await {
            Ok(()) => {
                tracing::info!(applications = apps, "config applied over the REST API");
                if let Some(moved) = warnings.last().filter(|_| moved) {
                    tracing::warn!("{moved}");
                }
                let body: String = warnings.iter().map(|w| format!("Warning: {w}\n")).collect();
                respond(200, "text/plain; charset=utf-8", Bytes::from(body))
            }
            Err(e) => {
                let (status, msg) = serve_error(&e);
                text(status, msg)
            }
        }
    }

    async fn delete(&self) -> Response<Body> {
        let mut names: Vec<String> = self
            .serve
            .status()
            .into_iter()
            .map(|(n, _)| n.to_string())
            .collect();
        if let Ok(Some(config)) = self.serve.applied_config().await {
            names.extend(config.applications.iter().map(|a| a.name.to_string()));
        }
        names.sort();
        names.dedup();
        if names.is_empty() {
            return respond(200, "text/plain; charset=utf-8", Bytes::new());
        }
        // Ray's `serve.shutdown()` waits (30 s at most) until its controller
        // has deleted everything; so does this. The bound is on the wait
        // only: the deletion is answered once it is committed (or refused),
        // however long the Controller takes, so a 200 is never sent for a
        // deletion that a crash could still lose. Past the bound the
        // deletions, committed, go on.
        match self.serve.delete_apps_within(&names, DELETE_WAIT).await {
            Ok(true) => tracing::info!(
                applications = names.len(),
                "every application deleted over the REST API"
            ),
            Ok(false) => tracing::warn!(applications = names.len(), wait = ?DELETE_WAIT,
                "applications still deleting after the REST API's wait: they go on"),
            Err(e) => {
                let (status, msg) = serve_error(&e);
                return text(status, msg);
            }
        }
        respond(200, "text/plain; charset=utf-8", Bytes::new())
    }

    async fn metrics(&self) -> Response<Body> {
        let (proxy, mut http) = match &self.proxy {
            Some((m, _)) => (
                Some(m.as_ref()),
                vec![m.unmatched.clone(), m.healthz.clone(), m.routes.clone()],
            ),
            None => (None, Vec::new()),
        };
        if let Some((_, routes)) = &self.proxy {
            http.extend(routes.all_stats());
        }
        match scrape(&self.serve, proxy, http).await {
            Ok(body) => respond(200, METRICS_CONTENT_TYPE, body),
            Err(e) => text(500, format!("encoding the metrics failed: {e}")),
        }
    }
}

/// Whether a loopback listener answers a request whose `Host` is `host`: an
/// IP address, or `localhost` (or a name under it, which resolves to
/// loopback only), with any port. A DNS-rebinding page names its own domain,
/// which resolves here: the browser then treats this API as that page's
/// origin, and could read it.
fn host_allowed(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // An IPv6 literal, `[::1]` or `[::1]:port`.
        Some(v6) => {
            return v6
                .split_once(']')
                .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
}

/// A replica count as pydantic's lax `NonNegativeInt` reads one: an integer,
/// a float with no fraction (3.0), or a string of digits ("3"); a fraction
/// (which pydantic 1 would truncate), a negative number, or anything else is
/// refused.
fn lax_count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    use serde::de::Error;
    let v = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
    let n = match &v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse::<u32>().ok().map(f64::from),
        _ => None,
    };
    match n {
        Some(n) if n.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&n) => Ok(n as u32),
        _ => Err(D::Error::custom(format!(
            "target_num_replicas must be an integer from 0 to {}, got {v}",
            u32::MAX
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_listener_answers_ip_addresses_and_localhost_only() {
        for ok in [
            "127.0.0.1:52365",
            "127.0.0.1",
            "localhost:52365",
            "LOCALHOST",
            "localhost.",
            "app.localhost:8",
            "[::1]:52365",
            "[::1]",
            "10.0.0.7:52365",
        ] {
            assert!(host_allowed(ok), "{ok}");
        }
        for refused in [
            "evil.example:52365",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:52365",
            "[evil]:1",
            "",
        ] {
            assert!(!host_allowed(refused), "{refused}");
        }
    }

    #[test]
    fn api_type_is_read_as_rays_query_reads_it() {
        let imperative = Ok(ApiFilter::Only(ApiType::Imperative));
        let declarative = Ok(ApiFilter::Only(ApiType::Declarative));
        assert_eq!(api_filter(Some("api_type=imperative")), imperative);
        // Lower-cased, percent-decoded (key and value), `+` a space.
        assert_eq!(api_filter(Some("api_type=IMPERATIVE")), imperative);
        assert_eq!(api_filter(Some("api_type=Declarative")), declarative);
        assert_eq!(api_filter(Some("x=1&api_type=%64eclarative")), declarative);
        assert_eq!(api_filter(Some("api%5Ftype=imperative")), imperative);
        assert_eq!(
            api_filter(Some("api_type=not+one")),
            Err(UnknownApiType("not one".to_owned()))
        );
        // Empty or absent: no filter.
        for all in [
            None,
            Some(""),
            Some("api_type="),
            Some("api_type"),
            Some("x=y"),
        ] {
            assert_eq!(api_filter(all), Ok(ApiFilter::All), "{all:?}");
        }
        // The first one counts, as aiohttp's `query.get`.
        assert_eq!(
            api_filter(Some("api_type=imperative&api_type=nope")),
            imperative
        );
        // The error names the value as given (decoded), not lower-cased.
        assert_eq!(
            api_filter(Some("api_type=Nope")),
            Err(UnknownApiType("Nope".to_owned()))
        );
    }
}
