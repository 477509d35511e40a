//! The shared secret nodes authenticate with (ractor_cluster's cookie).

use std::{fmt, path::PathBuf};

/// Where a [`Cookie`] came from: a non-loopback head accepts only one read from
/// a file or the environment, so a secret never sits in source code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieSource {
    /// Given in code ([`Cookie::new`]): loopback only.
    Inline,
    /// Read from a file.
    File,
    /// Read from an environment variable.
    Env,
}

/// The secret a node and its head share: ractor_cluster's challenge-response
/// cookie. Never logged: its `Debug` and `Display` print `Cookie(***)`.
///
/// ```
/// use flotilla_cluster::nodes::Cookie;
/// let c = Cookie::new("s3cret").unwrap();
/// assert_eq!(format!("{c:?}"), "Cookie(***)");
/// assert!(Cookie::new("").is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Cookie {
    secret: String,
    source: CookieSource,
}

/// Why a cookie could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CookieError {
    /// It is empty (or only whitespace).
    #[error("the node cookie is empty")]
    Empty,
    /// The file could not be read.
    #[error("could not read the node cookie file {path}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The variable is not set (or not Unicode).
    #[error("the node cookie variable {var} is not set")]
    Env {
        /// The variable.
        var: String,
        /// Why.
        #[source]
        source: std::env::VarError,
    },
}

impl Cookie {
    /// A cookie given in code (loopback heads only).
    pub fn new(secret: impl Into<String>) -> Result<Self, CookieError> {
        Self::with_source(secret.into(), CookieSource::Inline)
    }

    /// The first line of `path`, trimmed.
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Self, CookieError> {
        let path = path.into();
        let text = std::fs::read_to_string(&path).map_err(|source| CookieError::File {
            path: path.clone(),
            source,
        })?;
        let line = text.lines().next().unwrap_or_default().to_owned();
        Self::with_source(line, CookieSource::File)
    }

    /// The value of the environment variable `var`, trimmed.
    pub fn from_env(var: &str) -> Result<Self, CookieError> {
        let value = std::env::var(var).map_err(|source| CookieError::Env {
            var: var.to_owned(),
            source,
        })?;
        Self::with_source(value, CookieSource::Env)
    }

    fn with_source(secret: String, source: CookieSource) -> Result<Self, CookieError> {
        let secret = secret.trim().to_owned();
        if secret.is_empty() {
            return Err(CookieError::Empty);
        }
        Ok(Cookie { secret, source })
    }

    /// Where it came from.
    pub fn source(&self) -> CookieSource {
        self.source
    }

    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }
}

impl fmt::Debug for Cookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cookie(***)")
    }
}

impl fmt::Display for Cookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cookie(***)")
    }
}
