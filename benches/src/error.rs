//! The benchmarks' error: a message naming what failed, and the cause.

use std::{error::Error, fmt};

/// What went wrong while running a scenario.
#[derive(Debug)]
pub struct BenchError {
    what: String,
    source: Option<Box<dyn Error + Send + Sync>>,
}

impl BenchError {
    /// An error without an underlying cause.
    pub fn msg(what: impl Into<String>) -> Self {
        BenchError {
            what: what.into(),
            source: None,
        }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl Error for BenchError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// Attach what was being done to an error.
pub trait Context<T> {
    /// Wrap the error with `what()`.
    fn context(self, what: impl FnOnce() -> String) -> Result<T, BenchError>;
}

impl<T, E: Error + Send + Sync + 'static> Context<T> for Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, BenchError> {
        self.map_err(|e| BenchError {
            what: what(),
            source: Some(Box::new(e)),
        })
    }
}

/// The result of a scenario step.
pub type BenchResult<T> = Result<T, BenchError>;
