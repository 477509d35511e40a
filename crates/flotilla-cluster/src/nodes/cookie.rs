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
    /// The text holds no usable secret (empty, more than one line, too
    /// long): the rule every Flotilla secret obeys.
    #[error("the node cookie {place}: {source}")]
    Invalid {
        /// Where it was read from: `given in code`, `in file <path>`, `in
        /// environment variable <var>` (never the secret).
        place: String,
        /// What is wrong with it.
        #[source]
        source: flotilla_core::SecretError,
    },
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
        Self::with_source(&secret.into(), CookieSource::Inline, || {
            "given in code".to_owned()
        })
    }

    /// The secret in file `path`: its one line, surrounding whitespace
    /// trimmed ([`secret_from_text`](flotilla_core::secret_from_text)).
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Self, CookieError> {
        let path = path.into();
        let text = std::fs::read_to_string(&path).map_err(|source| CookieError::File {
            path: path.clone(),
            source,
        })?;
        Self::with_source(&text, CookieSource::File, || {
            format!("in file {}", path.display())
        })
    }

    /// The value of the environment variable `var`, trimmed.
    pub fn from_env(var: &str) -> Result<Self, CookieError> {
        let value = std::env::var(var).map_err(|source| CookieError::Env {
            var: var.to_owned(),
            source,
        })?;
        Self::with_source(&value, CookieSource::Env, || {
            format!("in environment variable {var}")
        })
    }

    fn with_source(
        text: &str,
        source: CookieSource,
        place: impl FnOnce() -> String,
    ) -> Result<Self, CookieError> {
        let secret = flotilla_core::secret_from_text(text)
            .map_err(|source| CookieError::Invalid {
                place: place(),
                source,
            })?
            .to_owned();
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
