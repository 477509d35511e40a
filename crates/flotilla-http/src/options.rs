//! How the HTTP server runs: both listeners, timeouts, limits and the token.

use std::{path::PathBuf, time::Duration};

use crate::{HttpError, OptionProblem, TokenSource};

/// The default request body limit: 10 MiB. Ray sets none (bodies stream to the
/// replica); Flotilla buffers a request body before the ingress sees it, so it
/// bounds what one request can make it hold. Raise it with
/// [`HttpOptionsBuilder::max_request_body_bytes`].
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 10 << 20;

/// Ray's `DEFAULT_HTTP_PORT`.
pub const DEFAULT_PORT: u16 = 8000;

/// Ray's dashboard port, where its REST API and `serve` CLI expect it.
pub const DEFAULT_REST_PORT: u16 = 8265;

/// Ray's `DEFAULT_UVICORN_KEEP_ALIVE_TIMEOUT_S`.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(90);

/// The default [`HttpOptions::max_connections`] of each listener.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// How long a shutdown waits for open connections to finish (Ray's
/// `PROXY_GRACEFUL_SHUTDOWN_TIMEOUT_S`).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Options of [`HttpServer`](crate::HttpServer): Ray's `http_options` (host,
/// port, root_path, request_timeout_s, keep_alive_timeout_s) with Ray's
/// defaults, plus the REST listener, the body limit and the bearer token.
/// Build with [`HttpOptions::builder`]; `HttpOptions::default()` is every default.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpOptions {
    /// The proxy's host (default `127.0.0.1`).
    pub host: String,
    /// The proxy's port (default 8000; 0 picks a free one).
    pub port: u16,
    /// Ray's `root_path`: the path prefix an upstream proxy has already stripped
    /// (default ""). Requests arrive without it; the ingress sees
    /// `path = root_path + request path` and `root_path = root_path + route
    /// prefix`, exactly as Ray (uvicorn) hands them to an ASGI app.
    pub root_path: String,
    /// End-to-end timeout of a request, queueing included (default none): 408
    /// when it passes before the response started, the stream cut after.
    pub request_timeout: Option<Duration>,
    /// How long a connection (HTTP/1.1 or 2) with no request in flight stays
    /// open: a new one until its first request, a kept-alive one between
    /// requests (default 90 s). A request body is held to it too: 408 when
    /// nothing of it arrives for that long, or when it falls that far behind
    /// 500 bytes a second (Apache's `MinRate`; a fast start banks no more
    /// than this timeout), so that a body trickled a byte at a time cannot
    /// hold its connection. So is a response: a client that takes nothing
    /// of one for that long loses its connection.
    pub keep_alive_timeout: Duration,
    /// The largest request body accepted (default
    /// [`DEFAULT_MAX_REQUEST_BODY_BYTES`]); larger is 413.
    pub max_request_body_bytes: usize,
    /// The most connections each listener holds open at once (default
    /// [`DEFAULT_MAX_CONNECTIONS`]; at least 1). At its limit a listener
    /// makes room for a newcomer by closing its connection idle longest (no
    /// request in flight: kept alive between requests, or never done sending
    /// a request's head), so that a flood of half-open connections cannot
    /// hold every place for `keep_alive_timeout`; with every connection busy
    /// it accepts no more until one closes: newcomers wait in the kernel's
    /// accept backlog, as HAProxy's `maxconn` holds them, so that a flood of
    /// connections takes at most that many file descriptors. Set it below
    /// the process's open-file limit (`ulimit -n`, often 1,024), less what
    /// the rest of the process needs, for that to keep the checkpoint, node
    /// links and the other listener served: above it, a flood meets the
    /// limit of the process first (accepts fail with EMFILE; the listener
    /// retries every 10 ms). Ray's proxy (uvicorn) sets none. `/metrics` shows each listener's open
    /// connections (`flotilla_http_connections`) and how often it reached its
    /// limit (`flotilla_http_connection_limit_reached_total`).
    pub max_connections: usize,
    /// Serve the REST API and `/metrics` (default true).
    pub rest: bool,
    /// The REST listener's host (default `127.0.0.1`).
    pub rest_host: String,
    /// The REST listener's port (default 8265; 0 picks a free one).
    pub rest_port: u16,
    /// Where the bearer token for mutating REST endpoints comes from.
    pub token: Option<TokenSource>,
    /// How long a shutdown waits for open connections (default 5 s; at most
    /// [`MAX_DURATION`](flotilla::MAX_DURATION)).
    pub shutdown_grace: Duration,
    /// Serve the proxy (default true; a config's `proxy_location: Disabled`
    /// turns it off).
    pub proxy: bool,
    /// The `ssl_*` field a config asked for TLS with (`ssl_keyfile`,
    /// `ssl_certfile`, `ssl_keyfile_password` or `ssl_ca_certs`), which the
    /// proxy does not serve: refused by [`validate`](Self::validate), by name.
    pub tls_asked: Option<&'static str>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            host: "127.0.0.1".to_owned(),
            port: DEFAULT_PORT,
            root_path: String::new(),
            request_timeout: None,
            keep_alive_timeout: DEFAULT_KEEP_ALIVE_TIMEOUT,
            max_request_body_bytes: DEFAULT_MAX_REQUEST_BODY_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            rest: true,
            rest_host: "127.0.0.1".to_owned(),
            rest_port: DEFAULT_REST_PORT,
            token: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            proxy: true,
            tls_asked: None,
        }
    }
}

impl HttpOptions {
    /// A builder starting from the defaults.
    ///
    /// ```
    /// use std::time::Duration;
    /// use flotilla_http::HttpOptions;
    /// let options = HttpOptions::builder()
    ///     .port(0)
    ///     .request_timeout(Duration::from_secs(30))
    ///     .root_path("/serve")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(options.host, "127.0.0.1");
    /// assert!(HttpOptions::builder().root_path("serve/").build().is_err());
    /// ```
    pub fn builder() -> HttpOptionsBuilder {
        HttpOptionsBuilder::from(HttpOptions::default())
    }

    /// Check every field (what [`HttpOptionsBuilder::build`] does). The rules a
    /// config's `http_options` share (host, root path, timeouts) are core's
    /// ([`flotilla::HttpOptions::check_host`] and its siblings), the same that
    /// [`ServeConfig::from_yaml`](flotilla::ServeConfig::from_yaml) holds a
    /// config to, so a config the parse accepts is one the server starts with.
    pub fn validate(&self) -> Result<(), HttpError> {
        type Rules = flotilla::HttpOptions;
        let rule = |field, result: Result<(), flotilla::HttpOptionError>| {
            result.map_err(|e| invalid(field, &e))
        };
        let bad = |field, reason| Err(HttpError::InvalidOption { field, reason });
        rule("root_path", Rules::check_root_path(&self.root_path))?;
        if let Some(timeout) = self.request_timeout {
            rule("request_timeout", Rules::check_request_timeout(timeout))?;
        }
        rule(
            "keep_alive_timeout",
            Rules::check_keep_alive_timeout(self.keep_alive_timeout),
        )?;
        if self.max_request_body_bytes == 0 {
            return bad("max_request_body_bytes", OptionProblem::Zero);
        }
        if self.max_connections == 0 {
            return bad("max_connections", OptionProblem::Zero);
        }
        if self.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
            return bad(
                "max_connections",
                OptionProblem::Above {
                    max: tokio::sync::Semaphore::MAX_PERMITS,
                },
            );
        }
        if self.shutdown_grace > flotilla::MAX_DURATION {
            return bad("shutdown_grace", OptionProblem::TooLong);
        }
        if let Some(field) = self.tls_asked {
            return bad(field, OptionProblem::Tls);
        }
        rule("host", Rules::check_host(&self.host))?;
        rule("rest_host", Rules::check_host(&self.rest_host))?;
        Ok(())
    }
}

/// `field` broke one of core's rules for HTTP options.
fn invalid(field: &'static str, e: &flotilla::HttpOptionError) -> HttpError {
    HttpError::InvalidOption {
        field,
        reason: OptionProblem::Rule(e.clone()),
    }
}

impl From<HttpOptions> for HttpOptionsBuilder {
    fn from(options: HttpOptions) -> Self {
        HttpOptionsBuilder {
            options,
            bad_request_timeout: None,
        }
    }
}

/// Builds [`HttpOptions`]; every setter takes Ray's meaning of the field.
#[derive(Debug, Clone)]
pub struct HttpOptionsBuilder {
    options: HttpOptions,
    /// Why the last `request_timeout_s` given is refused, for `build` to say.
    bad_request_timeout: Option<flotilla::HttpOptionError>,
}

impl HttpOptionsBuilder {
    /// The proxy's host.
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.options.host = host.into();
        self
    }

    /// The proxy's port (0: any free port; see
    /// [`HttpServer::proxy_addr`](crate::HttpServer::proxy_addr)).
    pub fn port(mut self, port: u16) -> Self {
        self.options.port = port;
        self
    }

    /// Ray's `root_path` (see [`HttpOptions::root_path`]).
    pub fn root_path(mut self, root_path: impl Into<String>) -> Self {
        self.options.root_path = root_path.into();
        self
    }

    /// The end-to-end request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.options.request_timeout = Some(timeout);
        self.bad_request_timeout = None;
        self
    }

    /// Ray's `request_timeout_s`, read as core reads a config's
    /// ([`flotilla::HttpOptions::request_timeout_from_secs`]): negative or
    /// infinite means none, as Ray's proxy treats it; 0, NaN or longer than
    /// [`flotilla::MAX_DURATION`] is refused by [`build`](Self::build).
    pub fn request_timeout_s(mut self, seconds: Option<f64>) -> Self {
        let read = seconds.map_or(Ok(None), flotilla::HttpOptions::request_timeout_from_secs);
        match read {
            Ok(timeout) => {
                self.options.request_timeout = timeout;
                self.bad_request_timeout = None;
            }
            Err(e) => self.bad_request_timeout = Some(e),
        }
        self
    }

    /// The idle timeout of connections (see [`HttpOptions::keep_alive_timeout`]).
    pub fn keep_alive_timeout(mut self, timeout: Duration) -> Self {
        self.options.keep_alive_timeout = timeout;
        self
    }

    /// The request body limit in bytes.
    pub fn max_request_body_bytes(mut self, limit: usize) -> Self {
        self.options.max_request_body_bytes = limit;
        self
    }

    /// The most connections each listener holds open at once (see
    /// [`HttpOptions::max_connections`]).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.options.max_connections = max;
        self
    }

    /// Serve the REST API and `/metrics` or not.
    pub fn rest(mut self, enabled: bool) -> Self {
        self.options.rest = enabled;
        self
    }

    /// The REST listener's host.
    pub fn rest_host(mut self, host: impl Into<String>) -> Self {
        self.options.rest_host = host.into();
        self
    }

    /// The REST listener's port.
    pub fn rest_port(mut self, port: u16) -> Self {
        self.options.rest_port = port;
        self
    }

    /// Read the bearer token from this file at start.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.options.token = Some(TokenSource::File(path.into()));
        self
    }

    /// Read the bearer token from this environment variable at start.
    pub fn token_env(mut self, var: impl Into<String>) -> Self {
        self.options.token = Some(TokenSource::Env(var.into()));
        self
    }

    /// Use this bearer token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.options.token = Some(TokenSource::Literal(token.into()));
        self
    }

    /// How long a shutdown waits for open connections.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.options.shutdown_grace = grace;
        self
    }

    /// Lay a config's `http_options` and `proxy_location` over these options:
    /// every field the config gives wins (host, port, root_path,
    /// request_timeout_s, keep_alive_timeout_s); `proxy_location: Disabled`
    /// turns the proxy off. A config never turns a proxy the program disabled
    /// back on: a config that leaves `proxy_location` out reads as Ray's default
    /// (`EveryNode`), which cannot be told from one that names it. The TLS fields cannot apply: the proxy serves plain
    /// HTTP (terminate TLS in front of it), so [`build`](Self::build) refuses
    /// them.
    pub fn serve_config(mut self, config: &flotilla::ServeConfig) -> Self {
        let h = &config.http_options;
        if let Some(host) = &h.host {
            self = self.host(host.clone());
        }
        if let Some(port) = h.port {
            self = self.port(port);
        }
        if let Some(root) = &h.root_path {
            self = self.root_path(root.clone());
        }
        if h.request_timeout_s.is_some() {
            self = self.request_timeout_s(h.request_timeout_s);
        }
        if let Some(s) = h.keep_alive_timeout_s {
            self = self.keep_alive_timeout(Duration::from_secs(u64::from(s)));
        }
        self.options.tls_asked = self.options.tls_asked.or(h.tls_field());
        if config.proxy_location == flotilla::ProxyLocation::Disabled {
            self.options.proxy = false;
        }
        self
    }

    /// Serve the proxy listener (default true; Ray's `proxy_location:
    /// Disabled` is false): without it only the REST API listens.
    pub fn proxy(mut self, enabled: bool) -> Self {
        self.options.proxy = enabled;
        self
    }

    /// Check and finish.
    pub fn build(self) -> Result<HttpOptions, HttpError> {
        if let Some(e) = self.bad_request_timeout {
            return Err(invalid("request_timeout", &e));
        }
        self.options.validate()?;
        Ok(self.options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_timeout_longer_than_the_longest_duration_is_refused() {
        let field = |b: HttpOptionsBuilder| match b.build() {
            Err(HttpError::InvalidOption { field, .. }) => field,
            other => panic!("accepted: {other:?}"),
        };
        let b = HttpOptions::builder;
        assert_eq!(field(b().request_timeout(Duration::MAX)), "request_timeout");
        assert_eq!(field(b().request_timeout_s(Some(1e20))), "request_timeout");
        assert_eq!(field(b().request_timeout_s(Some(1e10))), "request_timeout");
        assert_eq!(
            field(b().keep_alive_timeout(Duration::MAX)),
            "keep_alive_timeout"
        );
        assert_eq!(field(b().max_connections(0)), "max_connections");
        assert_eq!(field(b().max_connections(usize::MAX)), "max_connections");
        // Its shutdown would add a second to it.
        assert_eq!(field(b().shutdown_grace(Duration::MAX)), "shutdown_grace");
        assert!(b().shutdown_grace(flotilla::MAX_DURATION).build().is_ok());
        let longest = b().request_timeout(flotilla::MAX_DURATION).build();
        assert_eq!(
            longest.map(|o| o.request_timeout).ok(),
            Some(Some(flotilla::MAX_DURATION))
        );
        // Negative or infinite is none (Ray's proxy).
        for none in [-1.0, f64::INFINITY] {
            let o = b().request_timeout_s(Some(none)).build();
            assert_eq!(o.map(|o| o.request_timeout).ok(), Some(None), "{none}");
        }
        // Zero and NaN are refused, as a config's are; a later timeout replaces
        // the refused one.
        for bad in [0.0, f64::NAN] {
            assert_eq!(field(b().request_timeout_s(Some(bad))), "request_timeout");
        }
        let replaced = b()
            .request_timeout_s(Some(f64::NAN))
            .request_timeout(Duration::from_secs(1))
            .build();
        assert!(replaced.is_ok(), "{replaced:?}");
    }

    #[test]
    fn a_configs_http_options_are_held_to_cores_rules() {
        // A config built by hand, not parsed: the server refuses what the
        // parse refuses, with core's reason, and so does the config's own
        // validation.
        let mut config = flotilla::ServeConfig::new(vec![]);
        config.http_options.root_path = Some("serve".into());
        let core = flotilla::HttpOptions::check_root_path("serve");
        let server = HttpOptions::builder().serve_config(&config).build();
        match (core, server) {
            (Err(reason), Err(HttpError::InvalidOption { field, reason: r })) => {
                assert_eq!((field, r), ("root_path", OptionProblem::Rule(reason)));
            }
            other => panic!("not refused alike: {other:?}"),
        }
        assert!(config.validate().is_err());
        config.http_options.root_path = None;
        config.http_options.keep_alive_timeout_s = Some(0);
        let server = HttpOptions::builder().serve_config(&config).build();
        assert!(
            matches!(
                server,
                Err(HttpError::InvalidOption {
                    field: "keep_alive_timeout",
                    ..
                })
            ),
            "{server:?}"
        );
        assert!(config.validate().is_err());
    }
}
