//! Opening trace writers, reading whole traces in either format, and converting between formats.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Serialize;

use crate::error::TraceError;
use crate::format::{TraceFormat, TraceWriter};
use crate::ndjson::{self, NdjsonWriter};
use crate::record::{ErrorInfo, Status, TraceRecord};
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
    let mut records = latest_versions(records);
    settle_resumed_runs(&mut records);
    Ok(Trace { records, warnings })
}

/// What a run resumed from its journal leaves in a trace it shares with the process that died:
/// that process's spans whose end it never wrote (`running`) under a run another process ended
/// (a subagent's run under an ended parent included), and a run record counting only the calls
/// of the process that ended it. Such a span reads as `interrupted` (`trace.unfinished`), and
/// the run's counts are at least the calls the file holds for it: spans of both processes,
/// their ids the same where they met.
fn settle_resumed_runs(records: &mut [TraceRecord]) {
    let mut calls: HashMap<String, (u32, u32)> = HashMap::new();
    for r in records.iter() {
        let n = calls.entry(r.span().run_id.clone()).or_default();
        match r {
            TraceRecord::ModelCall(_) => n.0 = n.0.saturating_add(1),
            TraceRecord::ToolCall(_) => n.1 = n.1.saturating_add(1),
            _ => {}
        }
    }
    let mut ended: HashSet<String> = records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Run(run) if run.span.status != Status::Running => {
                Some(run.span.run_id.clone())
            }
            _ => None,
        })
        .collect();
    // A subagent's run the killed process never ended, under a parent that has: its end came
    // in the killed process (the resumed parent read the child's answer from the journal and
    // ran nothing of it), or never will.
    loop {
        let orphans: Vec<String> = records
            .iter()
            .filter_map(|r| match r {
                TraceRecord::Run(run)
                    if !ended.contains(&run.span.run_id)
                        && run
                            .span
                            .parent_id
                            .as_ref()
                            .is_some_and(|p| ended.contains(p)) =>
                {
                    Some(run.span.run_id.clone())
                }
                _ => None,
            })
            .collect();
        if orphans.is_empty() {
            break;
        }
        ended.extend(orphans);
    }
    for r in records.iter_mut() {
        if let TraceRecord::Run(run) = r {
            let counted = ended
                .contains(&run.span.run_id)
                .then(|| calls.get(&run.span.run_id))
                .flatten();
            if let Some(&(model, tool)) = counted {
                run.model_calls = run.model_calls.map(|n| n.max(model));
                run.tool_calls = run.tool_calls.map(|n| n.max(tool));
            }
        }
        let span = r.span_mut();
        if span.status == Status::Running && ended.contains(&span.run_id) {
            span.status = Status::Interrupted;
            span.error = Some(ErrorInfo {
                code: "trace.unfinished".into(),
                message: "its end was never written: the process that recorded it stopped, \
                          and the run went on in another (resumed from its journal)"
                    .into(),
            });
        }
    }
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
