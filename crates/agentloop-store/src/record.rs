//! The trace record model: one record per span (a run, a turn, a model call, a tool call), linked
//! by ids and parent ids. A turn's parent is its run, a call's parent is its turn, and a run's
//! parent is the run that started it (a subagent) or none.
//!
//! Times are unix milliseconds, UTC (`started_at_ms`, `ended_at_ms`); durations are fractional
//! milliseconds (`duration_ms`). A writer records a span twice: once when it starts (status
//! `running`, no end) and once when it ends; readers keep the last version of each span, so a trace
//! cut short by a crash still shows what was running. Payloads (`input`, `output`, `text`,
//! `reasoning`, `arguments`, `details`) are present only when the trace was written with payloads
//! on.

use agentloop::{
    limits::LimitHit,
    model::{FinishReason, Usage},
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One span of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TraceRecord {
    /// A run of an agent.
    Run(RunSpan),
    /// A turn: one model call (or several, when a structured answer was re-asked) and its tool batch.
    Turn(TurnSpan),
    /// One model call.
    ModelCall(ModelCallSpan),
    /// One tool call.
    ToolCall(ToolCallSpan),
    /// A compaction of the conversation before a turn's model call.
    Compaction(CompactionSpan),
}

impl TraceRecord {
    /// The fields every span has.
    pub fn span(&self) -> &Span {
        match self {
            TraceRecord::Run(r) => &r.span,
            TraceRecord::Turn(t) => &t.span,
            TraceRecord::ModelCall(m) => &m.span,
            TraceRecord::ToolCall(t) => &t.span,
            TraceRecord::Compaction(c) => &c.span,
        }
    }

    /// The fields every span has, to change.
    pub fn span_mut(&mut self) -> &mut Span {
        match self {
            TraceRecord::Run(r) => &mut r.span,
            TraceRecord::Turn(t) => &mut t.span,
            TraceRecord::ModelCall(m) => &mut m.span,
            TraceRecord::ToolCall(t) => &mut t.span,
            TraceRecord::Compaction(c) => &mut c.span,
        }
    }

    /// The span's kind: `run`, `turn`, `model_call`, `tool_call` or `compaction`.
    pub fn kind(&self) -> &'static str {
        match self {
            TraceRecord::Run(_) => "run",
            TraceRecord::Turn(_) => "turn",
            TraceRecord::ModelCall(_) => "model_call",
            TraceRecord::ToolCall(_) => "tool_call",
            TraceRecord::Compaction(_) => "compaction",
        }
    }
}

/// A hand-off of a run ([`agentloop::EventKind::HandedOff`]): the conversation went through the
/// call `call_id` to the agent `to`, whose run `run_id` (a child span) went on, and
/// `answered_by` answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandoffRecord {
    /// The hand-off's call.
    pub call_id: String,
    /// The agent it handed the conversation to.
    pub to: String,
    /// The agent whose answer is the run's.
    pub answered_by: String,
    /// The child run.
    pub run_id: String,
}

/// The fields every span has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// Unique within a trace (so run ids must be: the core's default UUIDv7 ids are; sequential
    /// test ids are not across processes): the run id for a run, `RUN:tN` for turn N, `RUN:tN:mK` for the K-th
    /// model call of turn N, `RUN:tN:CALL_ID` for a tool call.
    pub id: String,
    /// The enclosing span: the turn for a call, the run for a turn, the parent run for a subagent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// The run the span belongs to.
    pub run_id: String,
    /// When it started, unix milliseconds UTC.
    pub started_at_ms: i64,
    /// When it ended, unix milliseconds UTC; absent while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<i64>,
    /// How long it took, in milliseconds; absent while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// Where it stands.
    pub status: Status,
    /// What went wrong, when something did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

/// Where a span stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Started, not ended (yet, or ever: the writer stopped).
    Running,
    /// Ended well (a run: finished, or terminated by a tool).
    Ok,
    /// Failed: a model error, a recoverable tool error, or a run stopped by a limit or a failure.
    Error,
    /// A tool call that never started: unknown tool or invalid arguments.
    Rejected,
    /// A tool call a limit refused before it started.
    Refused,
    /// A tool call a permission gate or hook denied.
    Denied,
    /// A tool call not run because the run was a dry run.
    Skipped,
    /// A tool handler failed fatally or panicked.
    Fatal,
    /// Cancelled before it ended.
    Cancelled,
    /// The run stopped (deadline, failure) before this span ended.
    Interrupted,
}

impl Status {
    /// The stable word (`running`, `ok`, `error`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Rejected => "rejected",
            Status::Refused => "refused",
            Status::Denied => "denied",
            Status::Skipped => "skipped",
            Status::Fatal => "fatal",
            Status::Cancelled => "cancelled",
            Status::Interrupted => "interrupted",
        }
    }

    /// Parses the stable word.
    pub fn parse(word: &str) -> Option<Status> {
        [
            Status::Running,
            Status::Ok,
            Status::Error,
            Status::Rejected,
            Status::Refused,
            Status::Denied,
            Status::Skipped,
            Status::Fatal,
            Status::Cancelled,
            Status::Interrupted,
        ]
        .into_iter()
        .find(|s| s.as_str() == word)
    }
}

/// An error's stable code and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// The stable code (`model.rate_limited`, `unavailable`, `limit.max_tool_calls`).
    pub code: String,
    /// The message.
    pub message: String,
}

/// A run of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpan {
    /// The common fields; `parent_id` is the parent run of a subagent.
    #[serde(flatten)]
    pub span: Span,
    /// The parent's call that started it, for a subagent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_call_id: Option<String>,
    /// The agent's name.
    pub agent: String,
    /// The model's id.
    pub model: String,
    /// Why it stopped (`finished`, `max_turns`, ...), once ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Turns taken, once ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<u32>,
    /// Model calls made, once ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_calls: Option<u32>,
    /// Tool calls made (started or rejected), once ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u32>,
    /// Tokens over the run, once ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// USD over the run, once ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The limit that stopped the run, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitHit>,
    /// What went wrong without stopping the run (an observer hook that failed), once ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What the run's tool source wrote for the operator outside any call (an MCP server's
    /// stderr), each line as `origin: line` (payload), once ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_output: Vec<String>,
    /// The hand-off whose agent answered for the run, once ended (absent from traces written
    /// before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Box<HandoffRecord>>,
    /// The input text (payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The final answer of a finished run (payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// A turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnSpan {
    /// The common fields; `parent_id` is the run.
    #[serde(flatten)]
    pub span: Span,
    /// The turn's number, from 1.
    pub turn: u32,
    /// How the run's tools changed at the start of this turn (a tool source's new list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_changed: Option<ToolsChange>,
}

/// How a run's tools changed at the start of a turn.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolsChange {
    /// Tools that appeared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    /// Tools that went away.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Tools whose description, schemas or flags changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub updated: Vec<String>,
    /// Tools left out, each with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
}

impl ToolsChange {
    /// The change a [`agentloop::EventKind::ToolsChanged`] event tells of (none for another
    /// event).
    pub fn of(event: &agentloop::EventKind) -> Option<ToolsChange> {
        match event {
            agentloop::EventKind::ToolsChanged {
                added,
                removed,
                updated,
                refused,
            } => Some(ToolsChange {
                added: added.clone(),
                removed: removed.clone(),
                updated: updated.clone(),
                refused: refused.clone(),
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for ToolsChange {
    /// `+added -removed ~updated`, then what was refused.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for (sign, names) in [
            ("+", &self.added),
            ("-", &self.removed),
            ("~", &self.updated),
        ] {
            for name in names {
                let gap = if first { "" } else { " " };
                write!(f, "{gap}{sign}{name}")?;
                first = false;
            }
        }
        for why in &self.refused {
            write!(f, "; refused {why}")?;
        }
        Ok(())
    }
}

/// A model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCallSpan {
    /// The common fields; `parent_id` is the turn.
    #[serde(flatten)]
    pub span: Span,
    /// The model's id.
    pub model: String,
    /// The provider's name.
    pub provider: String,
    /// How many messages the transcript held when the call was made.
    pub messages: u64,
    /// Tokens the call used, once it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Its cost in USD, when priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Why the model stopped, once it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// How many tool calls the response made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u64>,
    /// The response's visible text (payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The reasoning text streamed (payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The answer came from a response cache, not from the model this time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
}

/// A tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallSpan {
    /// The common fields; `parent_id` is the turn.
    #[serde(flatten)]
    pub span: Span,
    /// The call id the model gave.
    pub call_id: String,
    /// The tool the model named.
    pub tool: String,
    /// The validated arguments (payload, secrets redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// What the model read on success: a string for text, else JSON (payload, secrets redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// The handler's details, never sent to the model (payload, secrets redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// The failed attempts run again under the tool's `retries`, in order, as `code: message`
    /// (the model read only the last attempt).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retries: Vec<String>,
}

/// A compaction: older messages replaced to keep the conversation inside its context budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionSpan {
    /// The common fields; `parent_id` is the turn whose model call it preceded.
    #[serde(flatten)]
    pub span: Span,
    /// `summarize` or `drop_tool_results`.
    pub policy: String,
    /// How many messages were replaced.
    pub messages_replaced: u64,
    /// The request's estimated tokens before.
    pub tokens_before: u64,
    /// And after.
    pub tokens_after: u64,
    /// What the summary call spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Its cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Why a summary was not used, when tool results were dropped instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The summary (payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The messages replaced (payload, secrets redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<Value>,
}

/// Formats unix milliseconds as RFC 3339 UTC with milliseconds: `2026-11-29T14:15:58.123Z`.
pub fn format_rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            format_rfc3339(1_795_961_758_123),
            "2026-11-29T14:15:58.123Z"
        );
        assert_eq!(format_rfc3339(-1), "1969-12-31T23:59:59.999Z");
    }
}
