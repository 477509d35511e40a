//! Why an HTTP server could not start.

use std::{net::SocketAddr, path::PathBuf};

/// What is wrong with an HTTP option ([`HttpError::InvalidOption`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptionProblem {
    /// It breaks one of core's rules for a config's `http_options` (host,
    /// root path, timeouts), which a config file is held to as well.
    #[error(transparent)]
    Rule(#[from] flotilla::HttpOptionError),
    /// A count or size of zero.
    #[error("must be at least 1")]
    Zero,
    /// A count above what the server can hold.
    #[error("must be at most {max}")]
    Above {
        /// The most it takes.
        max: usize,
    },
    /// A duration longer than [`flotilla::MAX_DURATION`].
    #[error("must be at most the longest duration Flotilla takes (MAX_DURATION)")]
    TooLong,
    /// A TLS setting: the proxy serves plain HTTP.
    #[error(
        "the proxy serves plain HTTP: terminate TLS in front of it (the ssl_* fields do not \
         apply)"
    )]
    Tls,
}

/// Why [`HttpServer::start`](crate::HttpServer::start) (or building
/// [`HttpOptions`](crate::HttpOptions)) failed. Nothing is left listening after
/// an error.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The applied config (whose `http_options` the server takes) could not be
    /// read from the Controller.
    #[error("cannot read the applied config's http_options: {0}")]
    AppliedConfig(#[source] Box<flotilla::ServeError>),
    /// The applied config's `http_options` (which the server takes over its
    /// own options) cannot be served: they ask for what the server does not
    /// do (`ssl_*`), or an earlier Flotilla accepted them under a rule
    /// tightened since. Applying a config whose `http_options` can be
    /// (`Serve::apply_config`) lets the server start.
    #[error(
        "the applied config's http_options cannot be served: {0}; apply a config whose \
         http_options can"
    )]
    AppliedConfigOptions(#[source] Box<HttpError>),
    /// An option is out of range.
    #[error("invalid HTTP option '{field}': {reason}")]
    InvalidOption {
        /// The option, as [`HttpOptionsBuilder`](crate::HttpOptionsBuilder) names it.
        field: &'static str,
        /// What is wrong with it.
        reason: OptionProblem,
    },
    /// A listener was asked to bind a non-loopback address with no bearer token
    /// configured: the REST API's mutating endpoints would be open to the network.
    #[error(
        "refusing to bind the {listener} listener to {addr}: binding an address other than \
         loopback requires a bearer token for the REST API's mutating endpoints; configure one \
         with HttpOptionsBuilder::token_file or token_env (or bind 127.0.0.1)"
    )]
    TokenRequired {
        /// `proxy` or `rest`.
        listener: &'static str,
        /// The address asked for.
        addr: SocketAddr,
    },
    /// A listener was asked to bind a non-loopback address with a bearer token
    /// shorter than [`flotilla::MIN_EXPOSED_SECRET_LEN`] bytes: anyone who can
    /// reach the REST API could guess it.
    #[error(
        "refusing to bind the {listener} listener to {addr}: off loopback the REST API's bearer \
         token must be at least {min} bytes long (it is {len}); generate one, for example with \
         `openssl rand -hex 16`"
    )]
    WeakToken {
        /// `proxy` or `rest`.
        listener: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The token's length in bytes.
        len: usize,
        /// The shortest allowed.
        min: usize,
    },
    /// A host name did not resolve to an address.
    #[error("cannot resolve the {listener} listener's address '{host}:{port}'")]
    Resolve {
        /// `proxy` or `rest`.
        listener: &'static str,
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// The resolver's error.
        #[source]
        source: std::io::Error,
    },
    /// The proxy and the REST API were asked to listen on one port.
    #[error(
        "the proxy and the REST API cannot both listen on port {port}: give the proxy \
         (http_options.port) another"
    )]
    SharedPort {
        /// The port.
        port: u16,
    },
    /// Binding failed (Ray's message).
    #[error("Failed to bind to address '{addr}'.")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The token file could not be read.
    #[error("cannot read the bearer token file {}", path.display())]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The token's environment variable is not set (or not Unicode).
    #[error("the bearer token variable {var} is not set (or not Unicode)")]
    TokenEnv {
        /// The variable.
        var: String,
        /// Why.
        #[source]
        source: std::env::VarError,
    },
    /// The token's source holds no usable token: empty, more than one line,
    /// too long ([`flotilla::secret_from_text`]).
    #[error("the bearer token in {source_name}: {source}")]
    BadToken {
        /// Where the token was read from (never the token itself).
        source_name: String,
        /// What is wrong with it.
        #[source]
        source: flotilla::SecretError,
    },
}
