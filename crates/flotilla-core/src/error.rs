//! The one error type of this crate: bad input, named precisely.

use std::fmt;

/// Where a validation error was found: the application, and the deployment if any.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Location {
    /// The application's name, as given (it may itself be the invalid part).
    pub app: Option<String>,
    /// The deployment's name, as given.
    pub deployment: Option<String>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.app, &self.deployment) {
            (Some(a), Some(d)) => write!(f, "application '{a}', deployment '{d}': "),
            (Some(a), None) => write!(f, "application '{a}': "),
            (None, Some(d)) => write!(f, "deployment '{d}': "),
            (None, None) => Ok(()),
        }
    }
}

/// Bad input, rejected before anything changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A name, route prefix or import path is malformed.
    #[error("{at}invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// Where it was found.
        at: Location,
        /// What kind of name ("application name", "route prefix", ...).
        what: &'static str,
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A field of a spec or config holds a value out of its range.
    #[error("{at}field `{field}`: {reason}")]
    InvalidField {
        /// Where it was found.
        at: Location,
        /// The field's name, as in the config file.
        field: &'static str,
        /// Why it was rejected, with the offending value.
        reason: String,
    },
    /// A value could not be encoded or decoded as MessagePack.
    #[error("{at}cannot {action} `{field}` as MessagePack: {reason}")]
    Codec {
        /// Where it was found.
        at: Location,
        /// "encode" or "decode".
        action: &'static str,
        /// The field being converted.
        field: &'static str,
        /// The codec's message.
        reason: String,
    },
}

impl Error {
    /// Attach the application (and deployment) to an error found without them.
    pub fn at(mut self, app: Option<&str>, deployment: Option<&str>) -> Self {
        let loc = match &mut self {
            Error::InvalidName { at, .. }
            | Error::InvalidField { at, .. }
            | Error::Codec { at, .. } => at,
        };
        if loc.app.is_none() {
            loc.app = app.map(str::to_owned);
        }
        if loc.deployment.is_none() {
            loc.deployment = deployment.map(str::to_owned);
        }
        self
    }

    /// The application the error names, if any.
    pub fn app(&self) -> Option<&str> {
        match self {
            Error::InvalidName { at, .. }
            | Error::InvalidField { at, .. }
            | Error::Codec { at, .. } => at.app.as_deref(),
        }
    }

    /// The deployment the error names, if any.
    pub fn deployment(&self) -> Option<&str> {
        match self {
            Error::InvalidName { at, .. }
            | Error::InvalidField { at, .. }
            | Error::Codec { at, .. } => at.deployment.as_deref(),
        }
    }

    pub(crate) fn field(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidField {
            at: Location::default(),
            field,
            reason: reason.into(),
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
