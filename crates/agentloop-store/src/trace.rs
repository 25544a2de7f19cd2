//! Opening trace writers, reading whole traces in either format, and converting between formats.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::error::TraceError;
use crate::format::{TraceFormat, TraceWriter};
use crate::ndjson::{self, NdjsonWriter};
use crate::record::TraceRecord;
use crate::sqlite::{self, SqliteWriter};

/// Opens a writer for a path, creating the file or appending to it; the extension picks the
/// format.
pub fn open_writer(path: &Path) -> Result<Box<dyn TraceWriter>, TraceError> {
    Ok(match TraceFormat::from_path(path)? {
        TraceFormat::Ndjson => Box::new(NdjsonWriter::open(path)?),
        TraceFormat::Sqlite => Box::new(SqliteWriter::open(path)?),
    })
}

/// The spans of a trace and what could not be read.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Trace {
    /// One record per span (its last version), in the order spans were first written.
    pub records: Vec<TraceRecord>,
    /// Lines or rows that were skipped, and why (a last line cut off by a crash, for one).
    pub warnings: Vec<String>,
}

/// Reads a trace; the extension picks the format. Unreadable NDJSON lines become warnings.
pub fn read_trace(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let (records, warnings) = match TraceFormat::from_path(path)? {
        TraceFormat::Ndjson => ndjson::read(path)?,
        TraceFormat::Sqlite => sqlite::read(path)?,
    };
    Ok(Trace {
        records: latest_versions(records),
        warnings,
    })
}

/// Keeps the last version of each span, at the position of its first.
pub fn latest_versions(records: Vec<TraceRecord>) -> Vec<TraceRecord> {
    let mut at: HashMap<(&'static str, String), usize> = HashMap::new();
    let mut out: Vec<TraceRecord> = Vec::with_capacity(records.len());
    for r in records {
        let key = (r.kind(), r.span().id.clone());
        match at.get(&key).and_then(|&i| out.get_mut(i)) {
            Some(slot) => *slot = r,
            None => {
                at.insert(key, out.len());
                out.push(r);
            }
        }
    }
    out
}

/// Writes every record of a trace to a new file, in the format its extension names; returns the
/// trace that was read (with its warnings). The destination must not exist.
pub fn convert(from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let (from, to) = (from.as_ref(), to.as_ref());
    TraceFormat::from_path(to)?;
    if to.exists() {
        return Err(TraceError::DestinationExists {
            path: agentloop::printable::path(to),
        });
    }
    let trace = read_trace(from)?;
    let mut writer = open_writer(to)?;
    for record in &trace.records {
        writer.write(record)?;
    }
    writer.flush()?;
    Ok(trace)
}
