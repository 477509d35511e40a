//! The proxies' options of a config file (Ray's `ProxyLocation`,
//! `HTTPOptionsSchema`, `gRPCOptionsSchema`): validated here, applied by the
//! HTTP proxy.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{
    MAX_DURATION,
    error::{Error, Location, shown},
};

use super::{Sited, lax, top};

/// Ray's default HTTP port.
pub const DEFAULT_HTTP_PORT: u16 = 8000;
/// Ray's default gRPC port.
pub const DEFAULT_GRPC_PORT: u16 = 9000;
/// Ray's default keep-alive timeout of idle HTTP connections, in seconds.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT_S: u32 = 90;

/// Why a value of an HTTP proxy option is refused. Each rule is stated once,
/// here: a config's `http_options` are checked with these at parse
/// ([`ServeConfig::from_yaml`](super::ServeConfig::from_yaml)), and the HTTP
/// server checks its own options, whether a program set them or a config did,
/// with the same functions ([`HttpOptions::check_host`] and its siblings), so a
/// config the parse accepts is one the server starts with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HttpOptionError {
    /// A host that is empty or only whitespace: nothing to bind.
    #[error("must not be empty")]
    EmptyHost,
    /// A root path that is neither empty nor of the form `/a[/b...]`.
    #[error(
        "must be empty, or start with '/' and not end with '/' (e.g. \"/serve\"), got \"{}\"",
        shown(root_path)
    )]
    RootPath {
        /// The root path given.
        root_path: String,
    },
    /// A request timeout of zero (every request would time out at once) or
    /// NaN. Negative and infinite are not errors: no timeout, as in Ray.
    #[error(
        "must be a number of seconds > 0 (negative, infinite or left out: no timeout), got \
         {seconds}"
    )]
    RequestTimeoutNotPositive {
        /// The seconds given.
        seconds: f64,
    },
    /// A keep-alive timeout of zero: every idle connection would close at once.
    #[error("must be longer than zero")]
    KeepAliveNotPositive,
    /// A duration longer than [`MAX_DURATION`], which would overflow the clock
    /// it is added to.
    #[error("must be at most {} s, got {seconds} s", MAX_DURATION.as_secs())]
    TooLong {
        /// The seconds given.
        seconds: f64,
    },
}

/// Where HTTP proxies run (Ray's `ProxyLocation`; exactly these names, as Ray's
/// file schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum ProxyLocation {
    /// No proxy: applications are reached through handles only.
    Disabled,
    /// One proxy, on the head node.
    HeadOnly,
    /// A proxy on every node that runs a replica (the default).
    #[default]
    EveryNode,
}

/// `http_options` (Ray's `HTTPOptionsSchema`). Every field is kept as given,
/// `None` where the file leaves it out; the accessors give the defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpOptions {
    /// The address to listen on, not empty ([`check_host`](Self::check_host)).
    /// Left out, the proxy binds loopback, Flotilla's default (Ray's is
    /// `0.0.0.0`); any other bind needs the proxy's bearer token for mutations
    /// (DESIGN.md, "HTTP and the REST API").
    #[serde(default)]
    pub host: Option<String>,
    /// The port (default [`DEFAULT_HTTP_PORT`]).
    #[serde(default, deserialize_with = "lax::opt_u16")]
    pub port: Option<u16>,
    /// The root path the applications are mounted at behind another proxy that
    /// strips it (ASGI's `root_path`; default empty): empty, or `/a[/b...]`
    /// ([`check_root_path`](Self::check_root_path)).
    #[serde(default)]
    pub root_path: Option<String>,
    /// Seconds a request may take before the proxy answers a timeout (> 0);
    /// none by default, and none when negative or infinite, as in Ray.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub request_timeout_s: Option<f64>,
    /// Seconds an idle connection is kept open (default
    /// [`DEFAULT_KEEP_ALIVE_TIMEOUT_S`]): at least 1 and at most
    /// [`MAX_DURATION`] ([`check_keep_alive_timeout`](Self::check_keep_alive_timeout)).
    #[serde(default, deserialize_with = "lax::opt_u32")]
    pub keep_alive_timeout_s: Option<u32>,
    /// The TLS private key's file; given together with `ssl_certfile`.
    #[serde(default)]
    pub ssl_keyfile: Option<String>,
    /// The TLS certificate's file; given together with `ssl_keyfile`.
    #[serde(default)]
    pub ssl_certfile: Option<String>,
    /// The private key's password, if it is encrypted (kept in the applied config
    /// as given).
    #[serde(default)]
    pub ssl_keyfile_password: Option<String>,
    /// CA certificates to verify client certificates with.
    #[serde(default)]
    pub ssl_ca_certs: Option<String>,
}

impl HttpOptions {
    /// The port to listen on.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_HTTP_PORT)
    }

    /// The keep-alive timeout, in seconds.
    pub fn keep_alive_timeout_s(&self) -> u32 {
        self.keep_alive_timeout_s
            .unwrap_or(DEFAULT_KEEP_ALIVE_TIMEOUT_S)
    }

    /// The root path (empty by default).
    pub fn root_path(&self) -> &str {
        self.root_path.as_deref().unwrap_or("")
    }

    /// The host rule: not empty or only whitespace.
    pub fn check_host(host: &str) -> Result<(), HttpOptionError> {
        if host.trim().is_empty() {
            return Err(HttpOptionError::EmptyHost);
        }
        Ok(())
    }

    /// The root path rule: empty, or starting with `/` and not ending with one
    /// (`/serve`, `/a/b`; not `serve`, `/serve/` or `/`). Flotilla's own: Ray
    /// does not check it, and a path that breaks it cannot be joined to a
    /// route prefix into the path an ingress sees.
    pub fn check_root_path(root_path: &str) -> Result<(), HttpOptionError> {
        if !root_path.is_empty() && (!root_path.starts_with('/') || root_path.ends_with('/')) {
            return Err(HttpOptionError::RootPath {
                root_path: root_path.to_owned(),
            });
        }
        Ok(())
    }

    /// The request timeout rule: longer than zero and at most [`MAX_DURATION`].
    pub fn check_request_timeout(timeout: Duration) -> Result<(), HttpOptionError> {
        if timeout.is_zero() {
            return Err(HttpOptionError::RequestTimeoutNotPositive { seconds: 0.0 });
        }
        check_max(timeout)
    }

    /// Ray's `request_timeout_s` as a timeout: `None` (no timeout) when it is
    /// negative or infinite, as Ray's proxies read it; otherwise the duration,
    /// held to the limits of [`check_request_timeout`](Self::check_request_timeout)
    /// (checked here, so a refusal names the seconds given). NaN is
    /// refused. (Ray's schema takes any float; at 0 every request times out at
    /// once, so Flotilla refuses it.)
    pub fn request_timeout_from_secs(seconds: f64) -> Result<Option<Duration>, HttpOptionError> {
        if seconds < 0.0 || seconds == f64::INFINITY {
            return Ok(None);
        }
        if seconds.is_nan() || seconds == 0.0 {
            return Err(HttpOptionError::RequestTimeoutNotPositive { seconds });
        }
        let timeout = Duration::try_from_secs_f64(seconds)
            .map_err(|_| HttpOptionError::TooLong { seconds })?;
        // Less than a nanosecond rounds to zero.
        if timeout.is_zero() {
            return Err(HttpOptionError::RequestTimeoutNotPositive { seconds });
        }
        check_max(timeout)?;
        Ok(Some(timeout))
    }

    /// The keep-alive timeout rule: longer than zero and at most
    /// [`MAX_DURATION`] (hyper adds it to the clock unchecked, on every
    /// connection).
    pub fn check_keep_alive_timeout(timeout: Duration) -> Result<(), HttpOptionError> {
        if timeout.is_zero() {
            return Err(HttpOptionError::KeepAliveNotPositive);
        }
        check_max(timeout)
    }

    /// Whether the config asks for TLS: any `ssl_*` field given (`check` makes
    /// the key and certificate come together).
    pub fn tls(&self) -> bool {
        self.tls_field().is_some()
    }

    /// The first `ssl_*` field given, as `http_options.<field>`: what a proxy
    /// that serves no TLS names when it refuses the config.
    pub fn tls_field(&self) -> Option<&'static str> {
        [
            ("http_options.ssl_certfile", self.ssl_certfile.is_some()),
            ("http_options.ssl_keyfile", self.ssl_keyfile.is_some()),
            (
                "http_options.ssl_keyfile_password",
                self.ssl_keyfile_password.is_some(),
            ),
            ("http_options.ssl_ca_certs", self.ssl_ca_certs.is_some()),
        ]
        .into_iter()
        .find_map(|(field, given)| given.then_some(field))
    }

    pub(super) fn check(&self) -> Result<(), Sited> {
        if self.ssl_keyfile.is_some() != self.ssl_certfile.is_some() {
            let field = if self.ssl_certfile.is_some() {
                "http_options.ssl_certfile"
            } else {
                "http_options.ssl_keyfile"
            };
            return Err(refuse(
                field,
                "Both ssl_keyfile and ssl_certfile must be provided together to enable HTTPS"
                    .into(),
            ));
        }
        if let Some(host) = &self.host {
            rule("http_options.host", Self::check_host(host))?;
        }
        if let Some(root_path) = &self.root_path {
            rule("http_options.root_path", Self::check_root_path(root_path))?;
        }
        if let Some(t) = self.request_timeout_s {
            rule(
                "http_options.request_timeout_s",
                Self::request_timeout_from_secs(t).map(drop),
            )?;
        }
        if let Some(s) = self.keep_alive_timeout_s {
            rule(
                "http_options.keep_alive_timeout_s",
                Self::check_keep_alive_timeout(Duration::from_secs(u64::from(s))),
            )?;
        }
        Ok(())
    }
}

/// `grpc_options` (Ray's `gRPCOptionsSchema`). Flotilla has no gRPC proxy: an
/// empty `grpc_servicer_functions` (Ray's "no gRPC server", the default) is the
/// only one accepted, and the other fields are kept as given, unwarned: with no
/// servicer functions Ray starts no gRPC server either, so they change nothing
/// there too (and `serve build` writes `port` into every config).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcOptions {
    /// The gRPC port (Ray's default [`DEFAULT_GRPC_PORT`]).
    #[serde(default, deserialize_with = "lax::opt_u16")]
    pub port: Option<u16>,
    /// Import paths of gRPC servicer functions: must be empty.
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub grpc_servicer_functions: Vec<String>,
    /// Seconds a gRPC request may take (> 0; negative or infinite: none, as in
    /// Ray).
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub request_timeout_s: Option<f64>,
    /// gRPC server reflection (Ray's default: on).
    #[serde(default)]
    pub enable_reflection: Option<bool>,
}

impl GrpcOptions {
    pub(super) fn check(&self) -> Result<(), Sited> {
        if !self.grpc_servicer_functions.is_empty() {
            return Err(refuse(
                "grpc_options.grpc_servicer_functions",
                format!(
                    "Flotilla has no gRPC proxy, so gRPC servicers cannot be added; leave \
                     grpc_servicer_functions empty (got {} entries) and serve over HTTP or \
                     through handles",
                    self.grpc_servicer_functions.len()
                ),
            ));
        }
        if let Some(t) = self.request_timeout_s {
            rule(
                "grpc_options.request_timeout_s",
                HttpOptions::request_timeout_from_secs(t).map(drop),
            )?;
        }
        Ok(())
    }
}

fn check_max(d: Duration) -> Result<(), HttpOptionError> {
    if d > MAX_DURATION {
        return Err(HttpOptionError::TooLong {
            seconds: d.as_secs_f64(),
        });
    }
    Ok(())
}

/// `result`'s error as a refusal of `field`.
fn rule(field: &'static str, result: Result<(), HttpOptionError>) -> Result<(), Sited> {
    result.map_err(|e| refuse(field, e.to_string()))
}

fn refuse(field: &'static str, reason: String) -> Sited {
    top(
        Error::InvalidField {
            at: Location::default(),
            field,
            reason,
        },
        field,
    )
}
