//! The errors of trace writing and reading, each with a stable code.
//!
//! | code | meaning |
//! |---|---|
//! | `trace.unknown_format` | the path's extension is not `.ndjson`, `.sqlite` or `.db` |
//! | `trace.io` | a trace file could not be opened, read or written |
//! | `trace.sqlite` | SQLite refused an operation (not a database, locked, corrupt) |
//! | `trace.json` | a record could not be encoded as JSON |
//! | `trace.newer_schema` | the SQLite trace was written by a newer version of this crate |
//! | `trace.destination_exists` | a conversion would overwrite an existing file |
//! | `trace.run_not_found` | no run in the trace matches the id asked for |
//! | `trace.ambiguous_run` | several runs match the id prefix asked for |
//! | `trace.render` | a view could not be encoded as JSON |
//! | `trace.not_a_trace` | the file exists and holds something else (another SQLite database; for NDJSON, a file whose first line is no record), or is no regular file (a named pipe, a device) |

use std::path::Path;

/// An error of writing or reading a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file extension names no known trace format.
    #[error(
        "unknown trace format for {path}: use a .ndjson file for NDJSON or a .sqlite or .db file for SQLite"
    )]
    UnknownFormat {
        /// The path given.
        path: String,
    },
    /// A file could not be opened, read or written.
    #[error("trace file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite refused an operation.
    #[error("SQLite trace {path}: {source}")]
    Sqlite {
        /// The file.
        path: String,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// A record could not be encoded or decoded as JSON.
    #[error("trace file {path}: {source}")]
    Json {
        /// The file.
        path: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The SQLite trace has a schema version newer than this crate knows.
    #[error(
        "SQLite trace {path} has schema version {found}; this version of agentloop reads up to {supported}"
    )]
    NewerSchema {
        /// The file.
        path: String,
        /// The version in the file.
        found: i64,
        /// The newest version this crate knows.
        supported: i64,
    },
    /// A conversion's destination exists already.
    #[error("{path} exists already; convert into a new file")]
    DestinationExists {
        /// The destination.
        path: String,
    },
    /// No run matches the id.
    #[error("no run {id} in the trace")]
    RunNotFound {
        /// The id or prefix asked for.
        id: String,
    },
    /// Several runs match the id prefix.
    #[error("{id} matches several runs: {}", matches.join(", "))]
    AmbiguousRun {
        /// The prefix asked for.
        id: String,
        /// The runs it matches.
        matches: Vec<String>,
    },
    /// A view could not be encoded as JSON.
    #[error("cannot encode the view as JSON: {0}")]
    Render(#[source] serde_json::Error),
    /// The file exists and is not a trace: it is left as it was.
    #[error("{path} is not an agentloop trace: {reason}")]
    NotATrace {
        /// The file.
        path: String,
        /// What it is instead.
        reason: String,
    },
}

impl TraceError {
    /// The stable code (see the module docs).
    pub fn code(&self) -> &'static str {
        match self {
            TraceError::UnknownFormat { .. } => "trace.unknown_format",
            TraceError::Io { .. } => "trace.io",
            TraceError::Sqlite { .. } => "trace.sqlite",
            TraceError::Json { .. } => "trace.json",
            TraceError::NewerSchema { .. } => "trace.newer_schema",
            TraceError::DestinationExists { .. } => "trace.destination_exists",
            TraceError::RunNotFound { .. } => "trace.run_not_found",
            TraceError::AmbiguousRun { .. } => "trace.ambiguous_run",
            TraceError::Render(_) => "trace.render",
            TraceError::NotATrace { .. } => "trace.not_a_trace",
        }
    }

    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        TraceError::Io {
            path: agentloop::printable::path(path),
            source,
        }
    }

    pub(crate) fn sqlite(path: &Path, source: rusqlite::Error) -> Self {
        TraceError::Sqlite {
            path: agentloop::printable::path(path),
            source,
        }
    }

    pub(crate) fn json(path: &Path, source: serde_json::Error) -> Self {
        TraceError::Json {
            path: agentloop::printable::path(path),
            source,
        }
    }
}
