//! Error type of the analysis: loading run directories and writing reports.
//! Every I/O error carries its path; a bad line names the file and the
//! 1-based line number. Messages never repeat their `#[source]`, because
//! callers print the whole chain.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// Errors of [`crate::load_runs`] and [`crate::write_report`].
#[derive(Debug, Error)]
pub enum AnalysisError {
    #[error("{step} {}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A JSON document or JSON line that does not parse into its record.
    #[error("{}{}: invalid record", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Json {
        path: PathBuf,
        line: Option<usize>,
        #[source]
        source: serde_json::Error,
    },
    /// A record that parses but breaks the run-directory contract.
    #[error("{}{}: {reason}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        path: PathBuf,
        line: Option<usize>,
        reason: String,
    },
    /// Two runs describe the same state or task differently.
    #[error("{what} is defined differently in {} and {}", first.display(), second.display())]
    Conflict {
        what: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("serialising the analysis")]
    Serialize(#[source] serde_json::Error),
}

impl AnalysisError {
    pub(crate) fn io(step: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        AnalysisError::Io {
            step,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(
        path: impl Into<PathBuf>,
        line: Option<usize>,
        reason: impl Into<String>,
    ) -> Self {
        AnalysisError::Invalid {
            path: path.into(),
            line,
            reason: reason.into(),
        }
    }
}
