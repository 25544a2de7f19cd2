//! Trace formats and the writer trait. The format of a path is chosen by its extension:
//! `.ndjson` for NDJSON, `.sqlite` or `.db` for SQLite. The writers themselves (`ndjson`, `sqlite`)
//! build on this file, and `trace` opens them, so the vocabulary never imports what uses it.

use std::path::Path;

use crate::error::TraceError;
use crate::record::TraceRecord;

/// A trace file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// One JSON record per line, appended.
    Ndjson,
    /// A SQLite database with one table per span kind.
    Sqlite,
}

impl TraceFormat {
    /// The format a path's extension names (case-insensitive), or
    /// [`TraceError::UnknownFormat`].
    pub fn from_path(path: &Path) -> Result<TraceFormat, TraceError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("ndjson") => Ok(TraceFormat::Ndjson),
            Some("sqlite" | "db") => Ok(TraceFormat::Sqlite),
            _ => Err(TraceError::UnknownFormat {
                path: agentloop::printable::path(path),
            }),
        }
    }
}

/// Where records go. A writer records each span when it starts and again when it ends; the last
/// version of a span wins when the trace is read.
pub trait TraceWriter: Send {
    /// Writes one record, durably enough that a crash of the process loses at most this record.
    fn write(&mut self, record: &TraceRecord) -> Result<(), TraceError>;
    /// Pushes everything written so far to the file (and to the disk).
    fn flush(&mut self) -> Result<(), TraceError>;
}
