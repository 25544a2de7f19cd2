//! How one tool call ended: the call's vocabulary ([`CallOutcome`], [`CallStatus`], the
//! [`codes`] table, [`ToolCallRecord`], and the [`SubagentRun`] a subagent's call carries), shared
//! by the transcript, the machine's records, the events and the stores.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::message::ToolContent;
use crate::model::Usage;
use crate::tool::bounded_text;

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

/// How one tool call ended: the one vocabulary the transcript, the run's records, the events and
/// the stores share. It is built in one place ([`CallOutcome::from_result`] for a handler's result,
/// and the constructors below for calls decided without running), so that what the model reads
/// and what the operator reads never travel as formatted text to be parsed back.
///
/// The codes are listed in [`codes`].
///
/// Every call's outcome lives in its record until the run ends, so what most calls leave empty
/// is boxed (`code`, `diagnostic` and `details`: 40 bytes a record, a fifth of it); read them with
/// `as_deref()`, as `Option<&str>` and `Option<&Value>`. They serialize as they did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    /// How it ended.
    pub status: CallStatus,
    /// The error code, for anything but a success or a skipped call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Box<str>>,
    /// What the model reads: the tool's output, or the error text.
    pub content: ToolContent,
    /// For the operator only (a fatal error's message, a panic's message); never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<Box<str>>,
    /// Structured details for the application; never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Box<Value>>,
    /// True when the tool asked to end the run with this output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminate: bool,
    /// How long it ran, retries included.
    #[serde(default, with = "crate::serde_duration")]
    pub duration: Duration,
    /// How many times it was run again after a failure.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
    /// True when another attempt cannot cure the failure ([`crate::ToolError::permanent`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
    /// The run of a subagent this call was ([`crate::Agent::as_tool`]): what it spent, which the
    /// parent's budget is charged, and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent: Option<Box<SubagentRun>>,
}

/// A subagent's run as its parent sees it: a node of the run tree. What it spent counts its own
/// subagents too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentRun {
    /// Its run id.
    pub run_id: String,
    /// Its agent's name.
    pub agent: String,
    /// The parent's call that started it.
    pub call_id: String,
    /// The tool it was called as.
    pub tool: String,
    /// Its stop reason's word ([`crate::StopReason::as_str`]).
    pub stop_reason: String,
    /// Its error, as `code: message`, when it failed or a limit stopped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Tokens, its subtree's.
    pub usage: Usage,
    /// Of `usage`, the tokens of answers a response cache served, its subtree's: they count
    /// toward no token budget. Absent when none.
    #[serde(default, skip_serializing_if = "is_zero_tokens")]
    pub cached_tokens: u64,
    /// USD, its subtree's.
    pub cost_usd: f64,
    /// Model answers of unknown cost (no price for their model), its subtree's: `cost_usd`
    /// leaves them out. Absent from records written before it existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpriced_model_calls: u32,
    /// Turns, its subtree's.
    pub turns: u32,
    /// Model calls, its subtree's.
    pub model_calls: u32,
    /// Tool calls that ran, its subtree's (its subagent calls included).
    pub tool_calls: u32,
    /// When it did not finish, its failure fails the parent (the tool was marked `fatal`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fatal: bool,
    /// Its own subagents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subagents: Vec<SubagentRun>,
    /// For a hand-off's run ([`crate::handoff::Handoff`]): the agent that answered in it (its
    /// own, or the one it handed off to in turn). `None` for a subagent called as a tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

impl SubagentRun {
    /// True when it finished or a tool ended it.
    pub fn is_success(&self) -> bool {
        matches!(self.stop_reason.as_str(), "finished" | "terminated")
    }

    /// The tokens its subtree's models read and wrote: its `usage` less what a response cache
    /// served. What a token budget counts.
    pub fn spent_tokens(&self) -> u64 {
        self.usage.total_tokens().saturating_sub(self.cached_tokens)
    }
}

fn is_zero_tokens(n: &u64) -> bool {
    *n == 0
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Every code a call outcome or a rejected call carries, in one namespace. A tool's own codes
/// ([`crate::ToolError::new`]) are passed through as the tool gave them.
///
/// | code | status | what the model reads | what the caller sees |
/// |---|---|---|---|
/// | `unknown_tool` | rejected | the name and the valid tools | the same |
/// | `invalid_arguments` | rejected (or error, from a handler) | each failing path | the same |
/// | `decision.invalid` | refused | why the whole decision was invalid | `RunError::InvalidDecision` |
/// | `limit.stuck_loop` | refused | the repeated call | the limit hit |
/// | `limit.max_tool_calls` | refused | the limit was reached | the limit hit |
/// | `limit.max_turns`, `limit.max_model_calls`, `limit.max_tokens`, `limit.max_cost_usd` | refused | `not run:` (or, with `on_limit = "answer"`, `stopped:`) and the limit | the limit hit |
/// | `truncated` | rejected | the call was cut off by the output limit and may be made again | the partial arguments in the record |
/// | `invalid_output` | error | the tool's output failed its declared output schema | the same |
/// | `denied` | denied | `denied: <reason>` | the gate's or hook's reason |
/// | `skipped` | skipped | `skipped: dry run, the tool was not run` | a dry run |
/// | `not_run` | cancelled | `not run: the run stopped before this call started` | never dispatched |
/// | `cancelled` | cancelled | `cancelled: the call did not complete` | cut short by cancel or deadline |
/// | `interrupted` | error | `interrupted: the run stopped while this call was running, ...` | running at a crash, its tool not idempotent (a resumed durable run) |
/// | `timeout` | error | the tool did not finish within its timeout | the same |
/// | `tool.fatal` | fatal | `the tool failed` | the tool's message (diagnostic) |
/// | `tool.panicked` | error (fatal under [`crate::config::OnToolPanic::Fail`]) | the tool failed unexpectedly | the panic message (diagnostic) |
/// | `handoff.not_alone` | rejected | a hand-off must be the only call of its turn: the other calls ran, hand off again alone | the same |
///
/// What the model reads of an error is at most [`codes::MAX_ERROR_TEXT`] bytes, and a code at most
/// [`codes::MAX_CODE_LEN`] characters: longer ones are cut, saying so.
pub mod codes {
    /// A call to a tool that is not registered.
    pub const UNKNOWN_TOOL: &str = "unknown_tool";
    /// Arguments that are not JSON or fail the tool's schema.
    pub const INVALID_ARGUMENTS: &str = "invalid_arguments";
    /// A decision that cannot be fed back (a bad call id, or a policy that makes a bad call fatal).
    pub const DECISION_INVALID: &str = "decision.invalid";
    /// A call refused by the stuck-loop rule.
    pub const STUCK_LOOP: &str = "limit.stuck_loop";
    /// A call refused by the tool-call limit.
    pub const MAX_TOOL_CALLS: &str = "limit.max_tool_calls";
    /// A call denied by a gate or a hook.
    pub const DENIED: &str = "denied";
    /// A call skipped by a dry run.
    pub const SKIPPED: &str = "skipped";
    /// A call the run stopped before it started.
    pub const NOT_RUN: &str = "not_run";
    /// A call cut short by cancellation or the deadline.
    pub const CANCELLED: &str = "cancelled";
    /// A call that was running when its run's process stopped; resumed, its effect is unknown.
    pub const INTERRUPTED: &str = "interrupted";
    /// A call that ran past its tool's timeout.
    pub const TIMEOUT: &str = "timeout";
    /// A handler that failed fatally.
    pub const TOOL_FATAL: &str = "tool.fatal";
    /// A handler that panicked.
    pub const TOOL_PANICKED: &str = "tool.panicked";
    /// A call cut off by the output token limit: never run.
    pub const TRUNCATED: &str = "truncated";
    /// An output that failed the tool's declared output schema.
    pub const INVALID_OUTPUT: &str = "invalid_output";
    /// A hand-off called beside other calls in one turn: not run (the others run).
    pub const HANDOFF_NOT_ALONE: &str = "handoff.not_alone";

    /// The most bytes of error text a model reads from one call (its head and its tail are kept).
    pub const MAX_ERROR_TEXT: usize = 16 * 1024;
    /// The most characters of an error code.
    pub const MAX_CODE_LEN: usize = 256;

    /// The code of a call a limit kept from running: `limit.` and the limit's word.
    pub fn limit(kind: crate::limits::LimitKind) -> String {
        format!("limit.{}", kind.as_str())
    }
}

fn bounded_code(code: &str) -> String {
    match code.char_indices().nth(codes::MAX_CODE_LEN) {
        Some((end, _)) => code.get(..end).unwrap_or_default().to_owned(),
        None => code.to_owned(),
    }
}

impl CallOutcome {
    /// Every outcome decided without a handler's output, and every error, is built here: the
    /// text and code the model reads are bounded.
    pub(crate) fn decided(status: CallStatus, code: &str, text: String) -> Self {
        CallOutcome {
            status,
            code: Some(bounded_code(code).into()),
            content: ToolContent::Text(bounded_text(text, codes::MAX_ERROR_TEXT).into()),
            diagnostic: None,
            details: None,
            terminate: false,
            duration: Duration::ZERO,
            retries: 0,
            permanent: false,
            subagent: None,
        }
    }

    /// A recoverable error the model reads.
    pub fn error(code: impl AsRef<str>, message: impl Into<String>) -> Self {
        CallOutcome::decided(CallStatus::Error, code.as_ref(), message.into())
    }

    /// A fatal failure: the model reads that the tool failed, the operator reads `message`.
    pub fn fatal(message: impl Into<String>) -> Self {
        CallOutcome {
            diagnostic: Some(message.into().into()),
            ..CallOutcome::decided(
                CallStatus::Fatal,
                codes::TOOL_FATAL,
                "the tool failed".into(),
            )
        }
    }

    /// A handler that panicked: an error the model reads and can route around (the machine makes
    /// it fatal under [`crate::config::OnToolPanic::Fail`]), with the panic message for the operator only.
    pub fn panicked(message: impl Into<String>) -> Self {
        CallOutcome {
            diagnostic: Some(message.into().into()),
            ..CallOutcome::decided(
                CallStatus::Error,
                codes::TOOL_PANICKED,
                "the tool failed unexpectedly (an internal error in the tool); try another way"
                    .into(),
            )
        }
    }

    /// A call that ran past its timeout.
    pub fn timed_out(after: Duration) -> Self {
        CallOutcome::error(
            codes::TIMEOUT,
            format!(
                "the tool did not finish within {:.1} s",
                after.as_secs_f64()
            ),
        )
    }

    /// A call denied by a gate or hook.
    pub fn denied(reason: impl AsRef<str>) -> Self {
        CallOutcome::decided(
            CallStatus::Denied,
            codes::DENIED,
            format!("denied: {}", reason.as_ref()),
        )
    }

    /// A call the model got wrong (unknown tool, invalid arguments), fed back.
    pub fn rejected(code: &str, message: impl Into<String>) -> Self {
        CallOutcome::decided(CallStatus::Rejected, code, message.into())
    }

    /// A rejection read back from an event that did not carry its outcome.
    pub(crate) fn unknown_rejection() -> Self {
        CallOutcome::rejected("rejected", "")
    }

    /// A call refused with its whole decision (a bad id, a limit, the stuck-loop rule).
    pub fn refused(code: &str, message: impl Into<String>) -> Self {
        CallOutcome::decided(CallStatus::Refused, code, message.into())
    }

    /// A call a limit kept from running: `not run:` when the run stops at once, `stopped:` when
    /// the model is asked for a last answer.
    pub fn limited(kind: crate::limits::LimitKind, answer: bool) -> Self {
        let text = if answer {
            format!(
                "stopped: the run reached its {kind} limit, so this call was not run; no more tools can run"
            )
        } else {
            format!(
                "not run: the run reached its {kind} limit, so no model call would read this result"
            )
        };
        CallOutcome::decided(CallStatus::Refused, &codes::limit(kind), text)
    }

    /// A call the run stopped before it started.
    pub fn not_run() -> Self {
        CallOutcome::decided(
            CallStatus::Cancelled,
            codes::NOT_RUN,
            "not run: the run stopped before this call started".into(),
        )
    }

    /// A call that was running when its run's process stopped (a crash, a kill): on resume the
    /// model reads that its effect is unknown, unless its tool is idempotent and runs again.
    pub fn interrupted() -> Self {
        CallOutcome::decided(
            CallStatus::Error,
            codes::INTERRUPTED,
            "interrupted: the run stopped while this call was running, so whether it took effect \
             is unknown; check before repeating it"
                .into(),
        )
    }

    /// A call cut short by cancellation or the deadline.
    pub fn cancelled() -> Self {
        CallOutcome::decided(
            CallStatus::Cancelled,
            codes::CANCELLED,
            "cancelled: the call did not complete".into(),
        )
    }

    /// A call skipped by a dry run: not an error, the model reads that it did not run.
    pub fn skipped() -> Self {
        CallOutcome {
            code: None,
            ..CallOutcome::decided(
                CallStatus::Skipped,
                codes::SKIPPED,
                "skipped: dry run, the tool was not run".into(),
            )
        }
    }

    /// With its duration.
    #[must_use]
    pub fn took(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// True when the model reads it as an error.
    pub fn is_error(&self) -> bool {
        !matches!(self.status, CallStatus::Ok | CallStatus::Skipped)
    }

    /// The output, when the call did not fail.
    pub fn output(&self) -> Option<&ToolContent> {
        (!self.is_error()).then_some(&self.content)
    }

    /// The error text the model read, when the call failed.
    pub fn error_text(&self) -> Option<String> {
        self.is_error().then(|| self.content.to_text())
    }
}

/// The record of one tool call, kept in the outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// The call id.
    pub call_id: Arc<str>,
    /// The tool the model named.
    pub tool: Arc<str>,
    /// The arguments the model sent (parsed when they were JSON).
    pub arguments: CallArguments,
    /// The turn it belongs to.
    pub turn: u32,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: CallOutcome,
}

/// A call's arguments as its record keeps them: the compact JSON text of the parsed value, each
/// object's keys sorted (as `serde_json::Value` writes them).
///
/// A record lives as long as the run's outcome, so it keeps the text (one allocation the size of
/// the text) rather than the parsed tree (`serde_json` gives even a one-key object a whole B-tree
/// node of 632 bytes): for a run of 15 calls that is about 9 KiB of its memory. The text is
/// shared (cloning it copies a pointer): the call's [`Arguments`](crate::tool::Arguments), which
/// the batch and the handler hold while it runs, are the same text. It serializes as the JSON
/// value itself, the same bytes the parsed value would give.
///
/// ```
/// use agentloop::outcome::CallArguments;
/// use serde_json::json;
///
/// let arguments = CallArguments::from(json!({"path": "src/lib.rs", "limit": 10}));
/// assert_eq!(arguments.as_str(), r#"{"limit":10,"path":"src/lib.rs"}"#);
/// assert_eq!(arguments.get("path"), Some(json!("src/lib.rs")));
/// assert_eq!(arguments, json!({"limit": 10, "path": "src/lib.rs"}));
/// ```
#[derive(Clone)]
pub struct CallArguments {
    /// The text, or the text of a whole batch's calls (see [`CallArguments::with_buffer`]),
    /// which holds this call's at `start..end`.
    text: Arc<str>,
    start: u32,
    end: u32,
}

/// Texts past this size are written in a buffer of their own, not kept in the thread's.
const SCRATCH_KEPT: usize = 64 * 1024;

thread_local! {
    /// Where a call's arguments are written before they are copied into a text of their exact
    /// size: written straight into a `String`, the text starts at 128 bytes and is shrunk
    /// after, two allocations a call where this is one (`agentloop-bench allocs`).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl CallArguments {
    /// The arguments of `value`, as compact JSON text.
    pub fn new(value: &Value) -> Self {
        Self::of(value)
    }

    /// The compact JSON text of what `value` serializes as (the view a call's arguments are
    /// read into writes what the `Value` would).
    pub(crate) fn of<T: Serialize + ?Sized>(value: &T) -> Self {
        let text = SCRATCH
            .try_with(|scratch| match scratch.try_borrow_mut() {
                Ok(mut buf) => {
                    let text = Self::write(&mut buf, value);
                    if buf.capacity() > SCRATCH_KEPT {
                        *buf = Vec::new();
                    }
                    text
                }
                Err(_) => Self::write(&mut Vec::new(), value),
            })
            .unwrap_or_else(|_| Self::write(&mut Vec::new(), value));
        // A `Value` always serializes (its map keys are strings); were that ever to change,
        // `null` keeps the record readable rather than ending the run.
        text.map_or_else(Self::null, Self::whole)
    }

    /// All of `text`; `null` for a text past 4 GiB, which no call's arguments reach (their
    /// reading refuses them first).
    fn whole(text: Arc<str>) -> Self {
        match u32::try_from(text.len()) {
            Ok(end) => CallArguments {
                text,
                start: 0,
                end,
            },
            Err(_) => Self::null(),
        }
    }

    /// Lends the thread's buffer (a new one when it is in use) to `f`, which writes the
    /// arguments of several calls in it with [`CallArguments::append`] and shares them with
    /// [`CallArguments::shared`]: a batch of K calls makes one text, not K.
    pub(crate) fn with_buffer<T>(f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
        let taken = SCRATCH.try_with(|s| s.try_borrow_mut().map(|mut b| std::mem::take(&mut *b)));
        let mut buf = match taken {
            Ok(Ok(buf)) => buf,
            _ => Vec::new(),
        };
        buf.clear();
        let out = f(&mut buf);
        if buf.capacity() <= SCRATCH_KEPT {
            let _ = SCRATCH.try_with(|s| {
                if let Ok(mut kept) = s.try_borrow_mut()
                    && kept.capacity() == 0
                {
                    *kept = buf;
                }
            });
        }
        out
    }

    /// The texts appended to `buf`, as one shared text (`None` when there are none).
    pub(crate) fn shared(buf: &[u8]) -> Option<Arc<str>> {
        if buf.is_empty() {
            return None;
        }
        std::str::from_utf8(buf).ok().map(Arc::from)
    }

    /// The arguments at `span` of a shared text; `null` when the span is not in it (it always
    /// is: it came from [`CallArguments::append`] on the buffer the text was made of).
    pub(crate) fn slice(shared: Option<&Arc<str>>, span: std::ops::Range<usize>) -> Self {
        match (shared, u32::try_from(span.start), u32::try_from(span.end)) {
            (Some(text), Ok(start), Ok(end)) if text.get(span).is_some() => CallArguments {
                text: Arc::clone(text),
                start,
                end,
            },
            _ => Self::null(),
        }
    }

    /// Appends the compact JSON text of `value` to a batch's buffer (see
    /// [`CallArguments::with_buffer`]): the span it takes, or `None` (nothing appended) when it
    /// does not serialize.
    pub(crate) fn append<T: Serialize + ?Sized>(
        buf: &mut Vec<u8>,
        value: &T,
    ) -> Option<std::ops::Range<usize>> {
        let start = buf.len();
        if serde_json::to_writer(&mut *buf, value).is_err() {
            buf.truncate(start);
            return None;
        }
        Some(start..buf.len())
    }

    fn write<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) -> Option<Arc<str>> {
        buf.clear();
        serde_json::to_writer(&mut *buf, value).ok()?;
        std::str::from_utf8(buf).ok().map(Arc::from)
    }

    fn null() -> Self {
        Self::whole(Arc::from("null"))
    }

    /// The compact JSON text.
    pub fn as_str(&self) -> &str {
        self.text
            .get(self.start as usize..self.end as usize)
            .unwrap_or_default()
    }

    /// The arguments parsed again into a [`Value`].
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.as_str()).unwrap_or(Value::Null)
    }

    /// The member `key` when the arguments are an object that has it.
    pub fn get(&self, key: &str) -> Option<Value> {
        match self.to_value() {
            Value::Object(mut map) => map.remove(key),
            _ => None,
        }
    }
}

impl Default for CallArguments {
    fn default() -> Self {
        Self::null()
    }
}

impl From<Value> for CallArguments {
    fn from(value: Value) -> Self {
        Self::new(&value)
    }
}

impl From<&Value> for CallArguments {
    fn from(value: &Value) -> Self {
        Self::new(value)
    }
}

impl From<&CallArguments> for Value {
    fn from(arguments: &CallArguments) -> Self {
        arguments.to_value()
    }
}

// The text is always the compact serialization of a `Value` (sorted keys, one spelling per
// number), so equal texts are equal values and the other way round.
impl PartialEq for CallArguments {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for CallArguments {}

impl PartialEq<Value> for CallArguments {
    fn eq(&self, other: &Value) -> bool {
        self.to_value() == *other
    }
}

impl PartialEq<CallArguments> for Value {
    fn eq(&self, other: &CallArguments) -> bool {
        other == self
    }
}

impl fmt::Display for CallArguments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for CallArguments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_value(), f)
    }
}

impl Serialize for CallArguments {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Borrowed: checking the text again costs no allocation, and a record is serialized far
        // less often than made (a journaled step, `--json`).
        match serde_json::from_str::<&RawValue>(self.as_str()) {
            Ok(raw) => raw.serialize(serializer),
            Err(_) => serializer.serialize_unit(),
        }
    }
}

// Through a `Value`, so that any JSON spelling (and any deserializer, not only `serde_json`'s
// own, which `RawValue` needs) gives the one compact text.
impl<'de> Deserialize<'de> for CallArguments {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(|value| Self::new(&value))
    }
}

impl ToolCallRecord {
    /// True when the handler succeeded.
    pub fn ok(&self) -> bool {
        self.outcome.status == CallStatus::Ok
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::tool::ToolError;

    #[test]
    fn a_long_error_keeps_its_head_and_its_tail_within_the_bound() {
        let text = format!(
            "collected 900 tests\n{}\nFAILED: 3 failed, 897 passed\né",
            "x".repeat(40_000)
        );
        let o = CallOutcome::from_result(Err(ToolError::new("exit", text.clone())));
        let shown = o.content.to_text();
        assert!(shown.len() <= codes::MAX_ERROR_TEXT, "{}", shown.len());
        assert!(shown.len() > codes::MAX_ERROR_TEXT - 8, "the bound is used");
        assert!(shown.starts_with("collected 900 tests\n"));
        assert!(shown.ends_with("FAILED: 3 failed, 897 passed\né"));
        assert!(shown.contains(&format!(
            "bytes cut from the middle ({} bytes in all)",
            text.len()
        )));
        let short = CallOutcome::from_result(Err(ToolError::new("exit", "short")));
        assert_eq!(short.content.to_text(), "short");
    }

    #[test]
    fn a_batchs_arguments_share_one_text_and_each_reads_as_its_own() {
        let values = [
            serde_json::json!({"b": 1, "a": "x\"y"}),
            serde_json::json!([]),
            serde_json::json!({"path": "é/ü", "n": -3.5}),
        ];
        let (spans, text) = CallArguments::with_buffer(|buf| {
            let spans: Vec<_> = values
                .iter()
                .map(|v| CallArguments::append(buf, v).unwrap())
                .collect();
            (spans, CallArguments::shared(buf))
        });
        let text = text.unwrap();
        let batch: Vec<CallArguments> = spans
            .into_iter()
            .map(|span| CallArguments::slice(Some(&text), span))
            .collect();
        for (arguments, value) in batch.iter().zip(&values) {
            let own = CallArguments::from(value);
            assert_eq!(arguments.as_str(), own.as_str());
            assert_eq!(arguments, &own);
            assert_eq!(arguments, value);
            assert_eq!(
                serde_json::to_string(arguments).unwrap(),
                serde_json::to_string(value).unwrap()
            );
            let read: CallArguments =
                serde_json::from_str(&serde_json::to_string(arguments).unwrap()).unwrap();
            assert_eq!(read.as_str(), own.as_str());
            assert_eq!(arguments.clone().as_str(), own.as_str());
        }
        // One text for all three, held by each.
        assert_eq!(Arc::strong_count(&text), 4);
        // A span that is not in the text is `null`, never a panic.
        assert_eq!(CallArguments::slice(Some(&text), 5..500).as_str(), "null");
        assert_eq!(CallArguments::slice(None, 0..0).as_str(), "null");
        // The thread's buffer is lent again after, and a batch inside a batch gets its own.
        let nested = CallArguments::with_buffer(|outer| {
            CallArguments::append(outer, &values[0]).unwrap();
            CallArguments::with_buffer(|inner| {
                assert!(inner.is_empty());
                CallArguments::append(inner, &values[1]).unwrap()
            })
        });
        assert_eq!(nested, 0..2);
    }

    #[test]
    fn a_records_arguments_read_and_write_as_the_parsed_value_did() {
        let value = serde_json::json!({
            "z": [1, 2.5, -3e40, null, true],
            "a": {"nested": "é \" \\ \u{0001}", "n": 18446744073709551615u64},
            "m": -9223372036854775808i64,
        });
        let arguments = CallArguments::from(&value);
        // The same bytes the parsed value writes, wherever it is written.
        assert_eq!(arguments.as_str(), value.to_string());
        assert_eq!(
            serde_json::to_string(&arguments).unwrap(),
            value.to_string()
        );
        assert_eq!(serde_json::to_value(&arguments).unwrap(), value);
        assert_eq!(arguments.to_string(), value.to_string());
        assert_eq!(format!("{arguments:?}"), format!("{value:?}"));
        assert_eq!(arguments.to_value(), value);
        assert_eq!(arguments.get("m"), Some(value["m"].clone()));
        assert_eq!(arguments.get("missing"), None);
        // Any spelling of the same value reads back as the one text: equal values, equal records.
        let spelled = r#" { "m" : -9223372036854775808, "a": {"n": 18446744073709551615,
            "nested": "\u00e9 \" \\ \u0001"}, "z": [1, 2.5, -3E+40, null, true] } "#;
        let read: CallArguments = serde_json::from_str(spelled).unwrap();
        assert_eq!(read, arguments);
        assert_eq!(read, value);
        let through_value: CallArguments = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(through_value, arguments);
        // Text that was not JSON is kept as a string, as the record kept it before.
        let text = CallArguments::from(Value::String("{not json".into()));
        assert_eq!(text.as_str(), r#""{not json""#);
        assert_eq!(text.get("not"), None);
        assert_ne!(text, arguments);
        assert_eq!(CallArguments::default().to_value(), Value::Null);
        // A record round-trips with its outcome flattened beside the arguments.
        let record = ToolCallRecord {
            call_id: Arc::from("c1"),
            tool: Arc::from("read"),
            arguments,
            turn: 2,
            outcome: CallOutcome::ok(crate::tool::ToolOutput::text("done")),
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["arguments"], value);
        let back: ToolCallRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }
}
