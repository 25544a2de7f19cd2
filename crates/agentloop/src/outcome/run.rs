//! How a run ended: its [`StopReason`] and its [`RunOutcome`].

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use super::call::{SubagentRun, ToolCallRecord};
use crate::error::RunError;
use crate::limits::LimitHit;
use crate::message::Message;
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
    /// The final answer was cut off by the output token limit (after one retry with a larger
    /// limit, where the agent sets one); the partial text is kept as the output.
    Truncated,
    /// The model refused to answer; its words are kept as the output.
    Refused,
    /// A content filter stopped the answer.
    ContentFilter,
    /// A durable run waits for a human's approval: its journal holds the pending calls, and
    /// resuming it goes on once each is answered.
    Suspended,
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
    /// `deadline`, `budget`, `stuck_loop`, `cancelled`, `failed`, `truncated`, `refused`,
    /// `content_filter`, `suspended`, `guardrail`.
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
            StopReason::Truncated => "truncated",
            StopReason::Refused => "refused",
            StopReason::ContentFilter => "content_filter",
            StopReason::Suspended => "suspended",
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

/// The end of a run.
#[derive(Debug, Clone, PartialEq)]
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
    /// Of `usage`, the tokens of answers a response cache served ([`crate::model::cache`]),
    /// this run's and its subagents': no model read or wrote them, so they count toward no
    /// `max_tokens`.
    pub cached_tokens: u64,
    /// USD over all model calls that were priced.
    pub cost_usd: f64,
    /// Model answers whose cost is unknown: the pricing had no price for their model (or the
    /// agent has no pricing at all). `cost_usd` leaves them out, so while this is above zero it
    /// is what was metered, not what was spent; under `max_cost_usd` such an answer stops the
    /// run (`limit.cost_unknown`) before anything more is spent.
    pub unpriced_model_calls: u32,
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
    /// The subagents its tool calls ran, in the order they finished, each with its own tree.
    /// `usage`, `cost_usd`, `model_calls` and `tool_calls_run` above count theirs too.
    pub subagents: Vec<SubagentRun>,
    /// The compactions of its conversation, oldest first, each with the messages it replaced:
    /// [`crate::compaction::expand`] gives the transcript back as it would be without them.
    pub compactions: Vec<crate::compaction::CompactionRecord>,
    /// The name of the agent whose answer ended the run: the run's own agent, or the one a
    /// hand-off passed the conversation to ([`crate::handoff::Handoff`]), at the end of the chain.
    pub answered_by: String,
    /// What the run noticed without stopping for it: the warnings of its model's answers (a
    /// block of a type the provider's adapter does not support ignored, a tool call cut by the
    /// output limit dropped, a stream that ended without a finish reason), each naming its turn.
    /// A subagent's are in its own outcome. A run that spent past its token or cost budget
    /// without a limit stopping it (its last model call, which asked for no more work, went
    /// past the bound) says so here too ([`RunOutcome::budget_warnings`]).
    pub warnings: Vec<String>,
}

/// How a warning of the run's spend past a budget starts: told apart from the model answers'.
pub(crate) const OVER_BUDGET: &str = "over budget: ";

impl RunOutcome {
    /// The journal could not record the run (its last step, or how it ended). A run that would
    /// have ended well then fails with the journal's error: its caller must not take it as done
    /// and recorded (a resume would not find it ended). A run that failed already keeps its own
    /// error; a cancelled or limited one keeps its stop reason. A suspended one fails too: its
    /// suspension was not recorded, so nothing waits to be approved.
    pub fn journal_failed(&mut self, message: String) {
        journal_failed_at_end(&mut self.stop_reason, &mut self.error, message);
    }

    /// The warnings that the run spent past its token or cost budget although no limit stopped
    /// it: the run's own, which no model answer's event carried.
    pub fn budget_warnings(&self) -> impl Iterator<Item = &str> {
        self.warnings
            .iter()
            .map(String::as_str)
            .filter(|w| w.starts_with(OVER_BUDGET))
    }

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

/// The rule of [`RunOutcome::journal_failed`] on a run's ending, so that the machine, which folds
/// the journal's failed last write, and the outcome share it.
pub(crate) fn journal_failed_at_end(
    stop: &mut StopReason,
    error: &mut Option<RunError>,
    message: String,
) {
    // A suspension the journal did not record leaves nothing waiting to approve: said
    // "suspended", its user would be sent to answer approvals the journal never held.
    if matches!(
        stop,
        StopReason::Finished | StopReason::Terminated | StopReason::Suspended
    ) {
        *stop = StopReason::Failed;
    }
    if error.is_none() {
        *error = Some(RunError::Journal { message });
    }
}
