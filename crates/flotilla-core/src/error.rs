//! The one error type of this crate: bad input, named precisely.

use std::fmt;

/// Longest piece of an offending value an error quotes, in bytes.
pub const MAX_QUOTED: usize = 200;

/// `value` as an error quotes it: whole if short, else its first
/// [`MAX_QUOTED`] bytes (cut at a character boundary) and how long it was, so a
/// 10 MB name makes a short error.
pub fn shown(value: &str) -> String {
    shown_up_to(value, MAX_QUOTED)
}

/// `value` whole if at most `max` bytes long, else its first `max` bytes (cut
/// at a character boundary) and how long it was.
pub(crate) fn shown_up_to(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_owned();
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &value[..end], value.len())
}

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
    /// A value (init args, a user config, a request) could not be encoded,
    /// or decoded into the type its receiver asked for.
    #[error("{at}cannot {action} {what}: {reason}")]
    Codec {
        /// Where it was found.
        at: Location,
        /// "encode" or "decode".
        action: &'static str,
        /// What was converted (for a decode, the type it was decoded into).
        what: String,
        /// Why, in serde's words.
        reason: String,
    },
    /// A config file is not YAML of the expected shape: a syntax error, an unknown
    /// field, a value of the wrong type or a missing required field.
    #[error("config line {line}, column {column}: {message}")]
    Parse {
        /// 1-based line of the offending text; 0 when the parser could not tell.
        line: u64,
        /// 1-based column (in characters); 0 when the parser could not tell.
        column: u64,
        /// The parser's message, without the position.
        message: String,
    },
    /// A config file parsed, but a value in it is invalid: `error` names the
    /// application, deployment and field, `line` and `column` the value's position.
    #[error("config line {line}, column {column}: {error}")]
    InConfig {
        /// 1-based line of the offending value.
        line: u64,
        /// 1-based column (in characters) of the offending value.
        column: u64,
        /// What is wrong with it.
        #[source]
        error: Box<Error>,
    },
}

impl Error {
    /// Attach the application (and deployment) to an error found without them.
    /// A [`Parse`](Error::Parse) error has no location to fill and is returned as is.
    pub fn at(self, app: Option<&str>, deployment: Option<&str>) -> Self {
        let mut this = match self {
            Error::InConfig {
                line,
                column,
                error,
            } => {
                return Error::InConfig {
                    line,
                    column,
                    error: Box::new(error.at(app, deployment)),
                };
            }
            parse @ Error::Parse { .. } => return parse,
            other => other,
        };
        if let Error::InvalidName { at, .. }
        | Error::InvalidField { at, .. }
        | Error::Codec { at, .. } = &mut this
        {
            if at.app.is_none() {
                at.app = app.map(shown);
            }
            if at.deployment.is_none() {
                at.deployment = deployment.map(shown);
            }
        }
        this
    }

    /// The application the error names, if any.
    pub fn app(&self) -> Option<&str> {
        match self {
            Error::InvalidName { at, .. }
            | Error::InvalidField { at, .. }
            | Error::Codec { at, .. } => at.app.as_deref(),
            Error::Parse { .. } => None,
            Error::InConfig { error, .. } => error.app(),
        }
    }

    /// The deployment the error names, if any.
    pub fn deployment(&self) -> Option<&str> {
        match self {
            Error::InvalidName { at, .. }
            | Error::InvalidField { at, .. }
            | Error::Codec { at, .. } => at.deployment.as_deref(),
            Error::Parse { .. } => None,
            Error::InConfig { error, .. } => error.deployment(),
        }
    }

    /// The field the error names, if any, as written in the config file.
    pub fn field_name(&self) -> Option<&'static str> {
        match self {
            Error::InvalidField { field, .. } => Some(field),
            Error::InvalidName { .. } | Error::Codec { .. } | Error::Parse { .. } => None,
            Error::InConfig { error, .. } => error.field_name(),
        }
    }

    /// The `(line, column)` in a config file the error points at, if known.
    pub fn position(&self) -> Option<(u64, u64)> {
        match self {
            Error::Parse { line: 0, .. } => None,
            Error::Parse { line, column, .. } | Error::InConfig { line, column, .. } => {
                Some((*line, *column))
            }
            _ => None,
        }
    }

    /// The error without its config-file position (itself for every other variant).
    pub fn without_position(&self) -> &Error {
        match self {
            Error::InConfig { error, .. } => error.without_position(),
            other => other,
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
