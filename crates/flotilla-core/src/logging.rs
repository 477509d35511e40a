//! Logging settings, with Ray Serve's fields, names and defaults (`LoggingConfig`).
//!
//! Flotilla's logs are `tracing` events; these types say which of them an
//! application (or deployment) writes and how. Writing them is the embedding
//! program's layer (core does no I/O): this module only holds and validates.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::error::{Error, shown};

/// Log levels, with Python's (and so Ray Serve's) names and numbers.
///
/// A config file may give a level by name (`CRITICAL`, `FATAL`, `ERROR`, `WARN`,
/// `WARNING`, `INFO`, `DEBUG`, `NOTSET`: case-sensitive, as Ray) or by number
/// (`50`, `40`, `30`, `20`, `10`, `0`). `WARN` is `WARNING` and `FATAL` is
/// `CRITICAL`, as in Python (the same numbers); the level is kept, and written
/// back, under its canonical name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum LogLevel {
    /// Python's `NOTSET` (0): nothing is filtered out.
    NotSet,
    /// Everything (10).
    Debug,
    /// The default (20).
    #[default]
    Info,
    /// Warnings and worse (30).
    Warning,
    /// Errors and worse (40).
    Error,
    /// Critical only (50); `tracing` has no level above ERROR, so a layer treats
    /// it as ERROR.
    Critical,
}

impl LogLevel {
    /// Every level, lowest first.
    pub const ALL: [LogLevel; 6] = [
        LogLevel::NotSet,
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Warning,
        LogLevel::Error,
        LogLevel::Critical,
    ];

    /// The canonical (Python) name.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::NotSet => "NOTSET",
            LogLevel::Debug => "DEBUG",
            LogLevel::Info => "INFO",
            LogLevel::Warning => "WARNING",
            LogLevel::Error => "ERROR",
            LogLevel::Critical => "CRITICAL",
        }
    }

    /// Python's number for the level.
    pub fn number(self) -> u8 {
        match self {
            LogLevel::NotSet => 0,
            LogLevel::Debug => 10,
            LogLevel::Info => 20,
            LogLevel::Warning => 30,
            LogLevel::Error => 40,
            LogLevel::Critical => 50,
        }
    }

    /// The level Python's `logging` names `name` (`WARN` and `FATAL` included).
    pub fn from_name(name: &str) -> Option<LogLevel> {
        match name {
            "WARN" => Some(LogLevel::Warning),
            "FATAL" => Some(LogLevel::Critical),
            _ => LogLevel::ALL.into_iter().find(|l| l.name() == name),
        }
    }

    /// The level numbered `n` (one of 0, 10, 20, 30, 40, 50).
    pub fn from_number(n: u64) -> Option<LogLevel> {
        LogLevel::ALL
            .into_iter()
            .find(|l| u64::from(l.number()) == n)
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const NAMES: &str =
            "['CRITICAL', 'FATAL', 'ERROR', 'WARN', 'WARNING', 'INFO', 'DEBUG', 'NOTSET']";
        const NUMBERS: &str = "[50, 40, 30, 20, 10, 0]";
        impl de::Visitor<'_> for V {
            type Value = LogLevel;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a log level: one of {NAMES} or {NUMBERS}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<LogLevel, E> {
                LogLevel::from_name(v).ok_or_else(|| {
                    E::custom(format!(
                        "Got \"{}\" for log_level. log_level must be one of {NAMES} \
                         (case-sensitive) or {NUMBERS}",
                        shown(v)
                    ))
                })
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LogLevel, E> {
                LogLevel::from_number(v).ok_or_else(|| {
                    E::custom(format!(
                        "Got \"{v}\" for log_level. log_level must be one of {NUMBERS}"
                    ))
                })
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LogLevel, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!(
                        "Got \"{v}\" for log_level. log_level must be one of {NUMBERS}"
                    ))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<LogLevel, E> {
                // Ray (pydantic) reads an integral float as the integer: 20.0 is INFO.
                if v.is_finite() && v.fract() == 0.0 && (0.0..=50.0).contains(&v) {
                    self.visit_u64(v as u64)
                } else {
                    Err(E::custom(format!(
                        "Got \"{v}\" for log_level. log_level must be one of {NUMBERS}"
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum LogEncoding {
    /// Human-readable text (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The attributes of a Python `LogRecord` that Ray's
/// `additional_log_standard_attrs` may add to every log line, restricted to those
/// a `tracing` event has an equivalent for. Named as Ray names them.
///
/// Ray's other attributes are refused by name, each with its reason (see
/// [`LogAttr::refusal`]): `args`, `msg` (an event has no separate format string),
/// `exc_info`, `exc_text`, `stack_info` (Rust has no exceptions), `funcName`
/// (`tracing` records no function name), `processName` (no multiprocessing
/// name), `taskName` (no asyncio task name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogAttr {
    /// `asctime`: the event's time, as Ray formats it
    /// (`2026-12-08 01:28:49,053`), in UTC (Ray's is the host's local time).
    /// Every line carries it already.
    Asctime,
    /// `created`: the event's time, in seconds since the Unix epoch.
    Created,
    /// `filename`: the last component of the source file's path.
    Filename,
    /// `levelname`: the level's name ([`LogLevel::name`]).
    Levelname,
    /// `levelno`: the level's number ([`LogLevel::number`]).
    Levelno,
    /// `lineno`: the source line (`tracing` metadata `line`).
    Lineno,
    /// `message`: the event's message (always written; accepted as Ray does).
    Message,
    /// `module`: the Rust module path (`tracing` metadata `module_path`).
    Module,
    /// `msecs`: the millisecond part of the event's time.
    Msecs,
    /// `name`: the logger's name, which is the event's `tracing` target.
    Name,
    /// `pathname`: the source file's path (`tracing` metadata `file`).
    Pathname,
    /// `process`: the process id.
    Process,
    /// `relativeCreated`: milliseconds since the logging layer started.
    RelativeCreated,
    /// `thread`: the OS thread's id.
    Thread,
    /// `threadName`: the thread's name.
    ThreadName,
}

/// Why an `additional_log_standard_attrs` name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogAttrError {
    /// One of Ray's attributes, without an equivalent in Flotilla's logs.
    #[error("Ray's log attribute '{name}' has no equivalent in Flotilla's logs: {why}")]
    NoEquivalent {
        /// The attribute.
        name: String,
        /// Why it has none.
        why: &'static str,
    },
    /// Not one of Ray's attributes either.
    #[error("Unknown attribute '{name}'. Additional log standard attributes must be one of Ray's; Flotilla writes: {}", LogAttr::ALL.map(LogAttr::name).join(", "))]
    Unknown {
        /// The name (shortened if long).
        name: String,
    },
}

impl LogAttr {
    /// Every attribute, in Ray's spelling order.
    pub const ALL: [LogAttr; 15] = [
        LogAttr::Asctime,
        LogAttr::Created,
        LogAttr::Filename,
        LogAttr::Levelname,
        LogAttr::Levelno,
        LogAttr::Lineno,
        LogAttr::Message,
        LogAttr::Module,
        LogAttr::Msecs,
        LogAttr::Name,
        LogAttr::Pathname,
        LogAttr::Process,
        LogAttr::RelativeCreated,
        LogAttr::Thread,
        LogAttr::ThreadName,
    ];

    /// Ray's (Python's) name of the attribute.
    pub fn name(self) -> &'static str {
        match self {
            LogAttr::Asctime => "asctime",
            LogAttr::Created => "created",
            LogAttr::Filename => "filename",
            LogAttr::Levelname => "levelname",
            LogAttr::Levelno => "levelno",
            LogAttr::Lineno => "lineno",
            LogAttr::Message => "message",
            LogAttr::Module => "module",
            LogAttr::Msecs => "msecs",
            LogAttr::Name => "name",
            LogAttr::Pathname => "pathname",
            LogAttr::Process => "process",
            LogAttr::RelativeCreated => "relativeCreated",
            LogAttr::Thread => "thread",
            LogAttr::ThreadName => "threadName",
        }
    }

    /// The attribute Ray names `name`, or why Flotilla refuses it: the reason for
    /// one of Ray's attributes without a Rust equivalent, or an "unknown
    /// attribute" message for a name Ray does not have either.
    pub fn parse(name: &str) -> Result<LogAttr, LogAttrError> {
        if let Some(a) = LogAttr::ALL.into_iter().find(|a| a.name() == name) {
            return Ok(a);
        }
        Err(match LogAttr::refusal(name) {
            Some(why) => LogAttrError::NoEquivalent {
                name: name.to_owned(),
                why,
            },
            None => LogAttrError::Unknown { name: shown(name) },
        })
    }

    /// Why one of Ray's `LOGRECORD_STANDARD_ATTRS` that is not a [`LogAttr`] is
    /// refused; `None` for a name that is not one of Ray's attributes.
    pub fn refusal(name: &str) -> Option<&'static str> {
        Some(match name {
            "args" | "msg" => {
                "a tracing event has no separate format string and arguments; its text is `message`"
            }
            "exc_info" | "exc_text" | "stack_info" => {
                "Rust has no exceptions; an error is a field of the event"
            }
            "funcName" => {
                "tracing records no function name; `module` and `lineno` locate the event"
            }
            "processName" => "a Rust process has no multiprocessing name; `process` gives its id",
            "taskName" => "an asyncio task name has no tokio equivalent",
            _ => return None,
        })
    }
}

impl fmt::Display for LogAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for LogAttr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for LogAttr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        LogAttr::parse(&name).map_err(de::Error::custom)
    }
}

/// Longest `logs_dir`, in bytes.
pub const MAX_LOGS_DIR_LEN: usize = 4096;

/// Logging settings (Ray Serve's `LoggingConfig`): global, per application, and
/// per deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggingConfig {
    /// Lowest level written.
    pub log_level: LogLevel,
    /// Text or JSON.
    pub encoding: LogEncoding,
    /// Whether each request is logged.
    pub enable_access_log: bool,
    /// The directory the log lines are written under; `None` is the embedding
    /// program's default. Non-empty, no NUL byte, at most [`MAX_LOGS_DIR_LEN`]
    /// bytes; nothing here touches the file system.
    #[serde(default)]
    pub logs_dir: Option<String>,
    /// Attributes added to every log line, sorted and without duplicates (Ray
    /// de-duplicates them too).
    #[serde(default)]
    pub additional_log_standard_attrs: Vec<LogAttr>,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            log_level: LogLevel::Info,
            encoding: LogEncoding::Text,
            enable_access_log: true,
            logs_dir: None,
            additional_log_standard_attrs: Vec::new(),
        }
    }
}

impl LoggingConfig {
    /// The same config writing its lines under `dir`.
    pub fn with_logs_dir(mut self, dir: impl Into<String>) -> Self {
        self.logs_dir = Some(dir.into());
        self
    }

    /// The same config adding `attrs` to every line (sorted, de-duplicated).
    pub fn with_additional_log_standard_attrs(
        mut self,
        attrs: impl IntoIterator<Item = LogAttr>,
    ) -> Self {
        self.additional_log_standard_attrs = attrs.into_iter().collect();
        self.additional_log_standard_attrs.sort_unstable();
        self.additional_log_standard_attrs.dedup();
        self
    }

    /// `logs_dir` is usable as a directory name, and the attributes are sorted
    /// and unique. Errors name the field as a config file does
    /// (`logging_config.logs_dir`).
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(dir) = &self.logs_dir {
            if dir.is_empty() {
                return Err(Error::field(
                    "logging_config.logs_dir",
                    "must not be empty (leave it out for the default directory)",
                ));
            }
            if dir.contains('\0') {
                return Err(Error::field(
                    "logging_config.logs_dir",
                    format!("must not contain a NUL byte, got {:?}", shown(dir)),
                ));
            }
            if dir.len() > MAX_LOGS_DIR_LEN {
                return Err(Error::field(
                    "logging_config.logs_dir",
                    format!(
                        "must be at most {MAX_LOGS_DIR_LEN} bytes, got {} bytes",
                        dir.len()
                    ),
                ));
            }
        }
        if !self
            .additional_log_standard_attrs
            .windows(2)
            .all(|w| w[0] < w[1])
        {
            return Err(Error::field(
                "logging_config.additional_log_standard_attrs",
                "must be sorted and without duplicates (use \
                 LoggingConfig::with_additional_log_standard_attrs)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_by_name_and_number_as_python() {
        assert_eq!(LogLevel::from_name("WARN"), Some(LogLevel::Warning));
        assert_eq!(LogLevel::from_name("FATAL"), Some(LogLevel::Critical));
        assert_eq!(LogLevel::from_name("info"), None);
        for l in LogLevel::ALL {
            assert_eq!(LogLevel::from_name(l.name()), Some(l));
            assert_eq!(LogLevel::from_number(u64::from(l.number())), Some(l));
        }
        assert_eq!(LogLevel::from_number(15), None);
        assert!(LogLevel::Debug < LogLevel::Critical);
    }

    #[test]
    fn attrs_with_a_rust_equivalent_parse_and_the_rest_say_why() {
        for a in LogAttr::ALL {
            assert_eq!(LogAttr::parse(a.name()), Ok(a));
        }
        let func = LogAttr::parse("funcName").unwrap_err().to_string();
        assert!(func.contains("no function name"), "{func}");
        let bogus = LogAttr::parse("bogus").unwrap_err().to_string();
        assert!(bogus.starts_with("Unknown attribute 'bogus'"), "{bogus}");
    }

    #[test]
    fn old_records_without_the_new_fields_decode() {
        #[derive(Serialize)]
        struct Old {
            log_level: LogLevel,
            encoding: LogEncoding,
            enable_access_log: bool,
        }
        let bytes = rmp_serde::to_vec_named(&Old {
            log_level: LogLevel::Debug,
            encoding: LogEncoding::Json,
            enable_access_log: false,
        })
        .unwrap();
        let back: LoggingConfig = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back.log_level, LogLevel::Debug);
        assert_eq!(back.logs_dir, None);
        assert!(back.additional_log_standard_attrs.is_empty());
    }

    #[test]
    fn validate_names_the_field() {
        let e = LoggingConfig::default()
            .with_logs_dir("")
            .validate()
            .unwrap_err();
        assert_eq!(e.field_name(), Some("logging_config.logs_dir"));
        let unsorted = LoggingConfig {
            additional_log_standard_attrs: vec![LogAttr::Thread, LogAttr::Name],
            ..LoggingConfig::default()
        };
        assert!(unsorted.validate().is_err());
        LoggingConfig::default()
            .with_additional_log_standard_attrs([LogAttr::Thread, LogAttr::Name, LogAttr::Name])
            .validate()
            .unwrap();
    }
}
