//! How a run ended. An outcome always keeps the transcript, usage, cost, counts and every tool
//! outcome so far, whatever stopped the run; [`RunOutcome::into_result`] turns a non-finished
//! outcome into an error for callers who want that.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::error::RunError;
use crate::limits::LimitHit;
use crate::message::{Message, ToolContent};
use crate::model::Usage;

/// Why a run stopped. The words of [`StopReason::as_str`] are a stable contract.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The model gave its final answer.
    Finished,
    /// Every call of a batch asked to end the run.
    Terminated,
    /// `max_turns` was reached.
    MaxTurns,
    /// `max_tool_calls` would have been exceeded.
    MaxToolCalls,
    /// `max_model_calls` was reached.
    MaxModelCalls,
    /// The deadline passed.
    Deadline,
    /// The token or cost budget was spent.
    Budget,
    /// The same call was repeated too often.
    StuckLoop,
    /// The run was cancelled.
    Cancelled,
    /// The run failed (see the outcome's error).
    Failed,
    /// A guardrail tripped.
    Guardrail {
        /// The guardrail's name.
        name: String,
        /// Its message.
        message: String,
    },
}

impl StopReason {
    /// The stable word: `finished`, `terminated`, `max_turns`, `max_tool_calls`, `max_model_calls`,
    /// `deadline`, `budget`, `stuck_loop`, `cancelled`, `failed`, `guardrail`.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Finished => "finished",
            StopReason::Terminated => "terminated",
            StopReason::MaxTurns => "max_turns",
            StopReason::MaxToolCalls => "max_tool_calls",
            StopReason::MaxModelCalls => "max_model_calls",
            StopReason::Deadline => "deadline",
            StopReason::Budget => "budget",
            StopReason::StuckLoop => "stuck_loop",
            StopReason::Cancelled => "cancelled",
            StopReason::Failed => "failed",
            StopReason::Guardrail { .. } => "guardrail",
        }
    }

    /// True for `finished` and `terminated`: the run ended as its agent meant it to.
    pub fn is_success(&self) -> bool {
        matches!(self, StopReason::Finished | StopReason::Terminated)
    }

    /// True when a limit or budget stopped the run.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            StopReason::MaxTurns
                | StopReason::MaxToolCalls
                | StopReason::MaxModelCalls
                | StopReason::Deadline
                | StopReason::Budget
                | StopReason::StuckLoop
        )
    }
}

impl Serialize for StopReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Guardrail { name, message } => write!(f, "guardrail {name}: {message}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// How one tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// The handler succeeded.
    Ok,
    /// The handler returned a recoverable error (or timed out).
    Error,
    /// The call never started: unknown tool or invalid arguments.
    Rejected,
    /// A permission gate or hook denied it.
    Denied,
    /// A limit refused it before it started.
    Refused,
    /// The run was cancelled (or its deadline passed) before the call completed.
    Cancelled,
    /// The handler failed fatally or panicked.
    Fatal,
    /// Not run (dry run).
    Skipped,
}

/// The record of one tool call, kept in the outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// The call id.
    pub id: Arc<str>,
    /// The tool the model named.
    pub tool: Arc<str>,
    /// The arguments (the parsed value, or the raw string when it was not JSON).
    pub input: Value,
    /// The turn.
    pub turn: u32,
    /// How it ended.
    pub status: CallStatus,
    /// What the model read on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<ToolContent>,
    /// The error code on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// The error message on failure (what the model read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The handler's details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// How long it ran, retries included.
    #[serde(default, with = "crate::serde_duration")]
    pub duration: Duration,
    /// How many times it was run again after a failure before this result (the tool's
    /// `retries`); the model read only the last attempt.
    #[serde(default, skip_serializing_if = "crate::tool::is_zero")]
    pub retries: u32,
}

impl ToolCallRecord {
    /// True when the handler succeeded.
    pub fn ok(&self) -> bool {
        self.status == CallStatus::Ok
    }
}

/// The end of a run.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The run's id.
    pub run_id: String,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// The final text (or, when terminated by a tool, that tool's output text).
    pub output: Option<String>,
    /// The validated structured answer, when the agent has an output schema.
    pub structured_output: Option<Value>,
    /// The whole transcript, including what came before this run in its session.
    pub transcript: Vec<Message>,
    /// Where this run's messages start in the transcript.
    pub new_messages_from: usize,
    /// Tokens over all model calls.
    pub usage: Usage,
    /// USD over all model calls that were priced.
    pub cost_usd: f64,
    /// Turns taken.
    pub turns: u32,
    /// Model calls made.
    pub model_calls: u32,
    /// Tool calls that ran (or were started).
    pub tool_calls_run: u32,
    /// Every tool call of the run, in decision order.
    pub tool_calls: Vec<ToolCallRecord>,
    /// The limit that stopped the run, if one did.
    pub limit: Option<LimitHit>,
    /// The error, when the run failed (or a limit or cancellation stopped it).
    pub error: Option<RunError>,
    /// How long the run took.
    pub duration: Duration,
}

impl RunOutcome {
    /// The messages this run added.
    pub fn new_messages(&self) -> &[Message] {
        self.transcript
            .get(self.new_messages_from..)
            .unwrap_or_default()
    }

    /// True when the run finished or was terminated by a tool.
    pub fn is_success(&self) -> bool {
        self.stop_reason.is_success()
    }

    /// The outcome when it succeeded; otherwise the error that stopped it.
    pub fn into_result(self) -> Result<RunOutcome, RunError> {
        if self.is_success() {
            return Ok(self);
        }
        Err(match (&self.error, &self.limit, &self.stop_reason) {
            (Some(e), _, _) => e.clone(),
            (None, Some(hit), _) => RunError::LimitReached(*hit),
            (None, None, StopReason::Cancelled) => RunError::Cancelled,
            (None, None, StopReason::Guardrail { name, message }) => RunError::Guardrail {
                name: name.clone(),
                message: message.clone(),
            },
            (None, None, other) => RunError::Other {
                message: format!("the run stopped: {other}"),
            },
        })
    }
}
