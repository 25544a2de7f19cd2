//! What holds of reading an NDJSON trace file whatever it holds (a line cut off by a crash, a
//! corrupt or foreign line, spans that name each other in any way), checked by the property test
//! (`tests/trace_props.rs`) and the cargo fuzz target (`fuzz/`, `trace_ndjson`) alike: the trace
//! reads, with a warning for each line it skipped, and every view `agentloop trace` shows of it
//! renders, without a panic or a hang.

use std::path::Path;

use agentloop_store::record::TraceRecord;
use agentloop_store::{read_trace, view};

/// Writes `bytes` to the NDJSON trace at `path`, reads it and renders every view of it; says
/// what failed to hold, if anything did.
pub(crate) fn read_and_render(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let trace = read_trace(path).map_err(|e| format!("a regular NDJSON file was refused: {e}"))?;
    let lines = bytes.split(|b| *b == b'\n').count();
    if trace.records.len() + trace.warnings.len() > lines {
        return Err(format!(
            "{} records and {} warnings from {lines} lines",
            trace.records.len(),
            trace.warnings.len()
        ));
    }
    let records = &trace.records;
    let _ = view::render_list(records);
    let _ = view::render_list_json(records);
    let _ = view::render_run(records, None);
    let _ = view::render_run_json(records, None);
    let _ = view::render_run_tree(records, None);
    for r in records {
        if let TraceRecord::Run(run) = r {
            let id = run.span.id.as_str();
            let _ = view::render_run(records, Some(id));
            let _ = view::render_run_tree(records, Some(id));
            let prefix = id.get(..id.len() / 2).unwrap_or_default();
            let _ = view::render_run(records, Some(prefix));
        }
    }
    Ok(())
}
