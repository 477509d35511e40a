//! The proxies' options of a config file (Ray's `ProxyLocation`,
//! `HTTPOptionsSchema`, `gRPCOptionsSchema`): validated here, applied by the
//! HTTP proxy.

use serde::{Deserialize, Serialize};

use crate::{
    MAX_DURATION,
    error::{Error, Location},
};

use super::{Sited, lax, top};

/// Ray's default HTTP port.
pub const DEFAULT_HTTP_PORT: u16 = 8000;
/// Ray's default gRPC port.
pub const DEFAULT_GRPC_PORT: u16 = 9000;
/// Ray's default keep-alive timeout of idle HTTP connections, in seconds.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT_S: u32 = 90;

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
    /// The address to listen on. Left out, the proxy binds loopback, Flotilla's
    /// default (Ray's is `0.0.0.0`); any other bind needs the proxy's bearer
    /// token for mutations (DESIGN.md, "HTTP and the REST API").
    #[serde(default)]
    pub host: Option<String>,
    /// The port (default [`DEFAULT_HTTP_PORT`]).
    #[serde(default, deserialize_with = "lax::opt_u16")]
    pub port: Option<u16>,
    /// The root path the applications are mounted at behind another proxy that
    /// strips it (ASGI's `root_path`; default empty).
    #[serde(default)]
    pub root_path: Option<String>,
    /// Seconds a request may take before the proxy answers a timeout (> 0);
    /// none by default, and none when negative or infinite, as in Ray.
    #[serde(default, deserialize_with = "lax::opt_f64")]
    pub request_timeout_s: Option<f64>,
    /// Seconds an idle connection is kept open (default
    /// [`DEFAULT_KEEP_ALIVE_TIMEOUT_S`]).
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
        if let Some(t) = self.request_timeout_s {
            check_timeout("http_options.request_timeout_s", t)?;
        }
        Ok(())
    }
}

/// `grpc_options` (Ray's `gRPCOptionsSchema`). Flotilla has no gRPC proxy: an
/// empty `grpc_servicer_functions` (Ray's "no gRPC server", the default) is the
/// only one accepted, and the other fields are kept as given.
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
            check_timeout("grpc_options.request_timeout_s", t)?;
        }
        Ok(())
    }
}

/// A request timeout, as Ray's proxies read it: negative is no timeout (Ray's
/// `GenericProxy`: `if request_timeout_s < 0: request_timeout_s = None`), and so
/// is infinite (none, as left out); otherwise it must be > 0 and at most
/// [`MAX_DURATION`]. Ray's schema takes any float: at 0 every request times out
/// at once (its remaining time is 0), and NaN is no number of seconds, so
/// Flotilla refuses both, and a finite timeout longer than [`MAX_DURATION`],
/// which would overflow the clock.
fn check_timeout(field: &'static str, t: f64) -> Result<(), Sited> {
    let max = MAX_DURATION.as_secs_f64();
    if t < 0.0 || t == f64::INFINITY {
        return Ok(());
    }
    if t.is_nan() || t == 0.0 || t > max {
        return Err(refuse(
            field,
            format!(
                "must be a number of seconds > 0 and at most {max} (or negative, or left out: \
                 no timeout), got {t}"
            ),
        ));
    }
    Ok(())
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
