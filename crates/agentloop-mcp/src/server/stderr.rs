//! What a stdio server writes on stderr: forwarded to `tracing` with its secrets scrubbed, its
//! last lines kept to explain a death, and each call's lines captured into its details. Apart
//! from the connection, which only starts the forwarding and reads the tail.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use agentloop::ToolOutput;
use futures::StreamExt;
use serde_json::Value;
use tokio_util::codec::{FramedRead, LinesCodec};

use super::McpServer;

/// How many of a child's last stderr lines are kept to explain its death.
const STDERR_TAIL_LINES: usize = 20;
/// The longest stderr line kept whole; a longer one is cut (a server may write anything there).
const STDERR_LINE_BYTES: usize = 4096;

/// What a child wrote on stderr: its last lines (to explain its death), the lines of each call
/// in flight (which go into the call's details, so that a trace with payloads keeps them), and
/// the lines written while no call was (which the runs of its agent take for their events).
#[derive(Default)]
pub(super) struct Stderr {
    tail: VecDeque<String>,
    calls: HashMap<u64, Vec<String>>,
    next: u64,
    /// Lines written outside any call, not yet taken; the oldest give way past
    /// [`STDERR_OUTSIDE_LINES`].
    pub(super) outside: VecDeque<String>,
    /// How many lines outside calls gave way since they were last taken.
    pub(super) dropped: usize,
}

/// The most stderr lines written outside calls that wait to be taken.
const STDERR_OUTSIDE_LINES: usize = 200;

/// The most stderr lines one call's details keep.
const STDERR_CALL_LINES: usize = 100;

/// The stderr lines written while one call is in flight; dropping it stops the capture.
pub(super) struct Capture {
    stderr: Arc<Mutex<Stderr>>,
    id: u64,
}

impl Capture {
    pub(super) fn start(stderr: &Arc<Mutex<Stderr>>) -> Capture {
        let mut s = stderr.lock().unwrap_or_else(PoisonError::into_inner);
        let id = s.next;
        s.next = s.next.wrapping_add(1);
        s.calls.insert(id, Vec::new());
        Capture {
            stderr: Arc::clone(stderr),
            id,
        }
    }

    pub(super) fn take(&self) -> Vec<String> {
        let mut s = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        s.calls
            .get_mut(&self.id)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let mut s = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        s.calls.remove(&self.id);
    }
}

impl McpServer {
    pub(super) fn report_exit(&self, when: &str) {
        let tail = self.stderr_tail();
        tracing::warn!(target: "agentloop_mcp", server = %self.name(), stderr = %tail, "the MCP server exited {when}");
    }

    pub(super) fn stderr_tail(&self) -> String {
        let tail = self
            .inner
            .stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        tail.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// A call's output with what the server wrote on stderr meanwhile in its details (never read by
/// the model; kept by a trace with payloads).
pub(super) fn with_stderr(mut out: ToolOutput, lines: Vec<String>) -> ToolOutput {
    if lines.is_empty() {
        return out;
    }
    let lines = Value::from(lines);
    match &mut out.details {
        Some(Value::Object(map)) => {
            map.insert("stderr".into(), lines);
        }
        Some(other) => {
            let kept = other.take();
            out.details = Some(serde_json::json!({"details": kept, "stderr": lines}));
        }
        None => out.details = Some(serde_json::json!({ "stderr": lines })),
    }
    out
}

/// Reads a child's stderr line by line into `tracing`, the tail kept to explain its death, and
/// the lines of the calls in flight.
pub(super) async fn forward_stderr(
    stderr: tokio::process::ChildStderr,
    server: String,
    secrets: Vec<String>,
    tail: Arc<Mutex<Stderr>>,
) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(STDERR_LINE_BYTES));
    while let Some(line) = lines.next().await {
        let line = match line {
            Ok(line) => line,
            Err(tokio_util::codec::LinesCodecError::MaxLineLengthExceeded) => {
                "[a line too long to keep]".to_owned()
            }
            Err(tokio_util::codec::LinesCodecError::Io(_)) => break,
        };
        // Its environment's secrets never reach a log, an error or a call's details.
        let line = agentloop::url_secrets::scrub(&line, &secrets);
        tracing::info!(target: "agentloop_mcp::stderr", server = %server, "{line}");
        let mut s = tail.lock().unwrap_or_else(PoisonError::into_inner);
        for call in s.calls.values_mut() {
            if call.len() < STDERR_CALL_LINES {
                call.push(line.clone());
            }
        }
        if s.calls.is_empty() {
            if s.outside.len() == STDERR_OUTSIDE_LINES {
                s.outside.pop_front();
                s.dropped += 1;
            }
            s.outside.push_back(line.clone());
        }
        if s.tail.len() == STDERR_TAIL_LINES {
            s.tail.pop_front();
        }
        s.tail.push_back(line);
    }
}
