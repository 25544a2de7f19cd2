//! Hooks around a run: before and after each model call and each tool call, on error and on
//! finish. They let an application observe and steer a run without touching the loop's rules.
//!
//! Order: `before_*` hooks run in registration order, `after_*` hooks in reverse registration
//! order (like layers around a service), `on_error` and `on_finish` in registration order. A hook
//! registered with [`crate::AgentBuilder::hook`] that fails fails the run with an error naming it;
//! one registered with [`crate::AgentBuilder::observer`] that fails is reported as a
//! [`crate::EventKind::HookFailed`] event and the run goes on.

use futures::future::BoxFuture;
use serde_json::Value;

use crate::error::RunError;
use crate::message::Message;
use crate::model::{ModelResponse, ModelSettings, Usage};
use crate::outcome::{CallOutcome, RunOutcome, ToolCallRecord};

/// What a hook knows of the run.
#[derive(Debug, Clone, Copy)]
pub struct HookContext<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// The agent's name.
    pub agent: &'a str,
    /// The current turn.
    pub turn: u32,
}

/// Changes a hook may make to the next model request. They apply to that call only; the
/// transcript is not changed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RequestChanges {
    /// Replaces the instructions.
    pub instructions: Option<String>,
    /// Messages appended after the transcript for this call.
    pub extra_messages: Vec<Message>,
    /// Replaces the model settings.
    pub settings: Option<ModelSettings>,
}

impl RequestChanges {
    /// True when nothing changes.
    pub fn is_empty(&self) -> bool {
        self.instructions.is_none() && self.extra_messages.is_empty() && self.settings.is_none()
    }
}

/// The run as a stop condition sees it, after a turn.
#[derive(Debug, Clone, Copy)]
pub struct RunState<'a> {
    /// The turn that just ended.
    pub turn: u32,
    /// Model calls so far.
    pub model_calls: u32,
    /// Tool calls that ran so far.
    pub tool_calls_run: u32,
    /// Tokens so far.
    pub usage: Usage,
    /// USD so far.
    pub cost_usd: f64,
    /// The transcript so far (what came before the run included).
    pub transcript: &'a [Message],
    /// Every tool call of the run so far, in decision order.
    pub tool_calls: &'a [ToolCallRecord],
}

/// A tool call as a hook sees it.
#[derive(Debug, Clone, Copy)]
pub struct ToolCallView<'a> {
    /// The call id.
    pub call_id: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The validated arguments.
    pub arguments: &'a Value,
}

/// What a `before_tool_call` hook decides.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCallDecision {
    /// Go on unchanged.
    Continue,
    /// Do not run the call; the model reads the reason.
    Veto(String),
    /// Run it with these arguments instead (validated again against the tool's schema).
    Rewrite(Value),
}

/// A hook failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

impl From<String> for HookError {
    fn from(s: String) -> Self {
        HookError(s)
    }
}

impl From<&str> for HookError {
    fn from(s: &str) -> Self {
        HookError(s.to_owned())
    }
}

/// The result of a hook.
pub type HookResult<T> = Result<T, HookError>;

/// A hook. Every method has a default that does nothing, so a hook implements only what it needs.
pub trait Hook: Send + Sync {
    /// The hook's name, used in errors and events.
    fn name(&self) -> &str;

    /// Before each model call: observe, or change the request.
    fn before_model_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _changes: &'a mut RequestChanges,
    ) -> BoxFuture<'a, HookResult<()>> {
        Box::pin(async { Ok(()) })
    }

    /// After each model response.
    fn after_model_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _response: &'a ModelResponse,
    ) -> BoxFuture<'a, HookResult<()>> {
        Box::pin(async { Ok(()) })
    }

    /// After a final answer (a response without tool calls), before the run accepts it: `Some`
    /// rejects it and sends the model back with that message (say, "cite a source"). The re-asks
    /// share the agent's `output_retries`; once they are spent, a rejected answer fails the run
    /// (`output.invalid`).
    fn review_answer<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _answer: &'a ModelResponse,
    ) -> BoxFuture<'a, HookResult<Option<String>>> {
        Box::pin(async { Ok(None) })
    }

    /// After each tool turn: `true` ends the run here, with the stop reason `terminated`.
    fn should_stop<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _state: RunState<'a>,
    ) -> BoxFuture<'a, HookResult<bool>> {
        Box::pin(async { Ok(false) })
    }

    /// Before each admitted tool call: go on, veto, or rewrite the arguments.
    fn before_tool_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _call: ToolCallView<'a>,
    ) -> BoxFuture<'a, HookResult<ToolCallDecision>> {
        Box::pin(async { Ok(ToolCallDecision::Continue) })
    }

    /// After each tool call: observe, or return a replacement result.
    fn after_tool_call<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _call: ToolCallView<'a>,
        _result: &'a CallOutcome,
    ) -> BoxFuture<'a, HookResult<Option<CallOutcome>>> {
        Box::pin(async { Ok(None) })
    }

    /// When the run fails.
    fn on_error<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _error: &'a RunError,
    ) -> BoxFuture<'a, HookResult<()>> {
        Box::pin(async { Ok(()) })
    }

    /// When the run ends, whatever the reason.
    fn on_finish<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        _outcome: &'a RunOutcome,
    ) -> BoxFuture<'a, HookResult<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// How a hook's failures are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookRole {
    /// A failure fails the run.
    Required,
    /// A failure is reported as an event; the run goes on.
    Observer,
}

/// A stop condition: a predicate on the run's state after each tool turn, as a hook
/// ([`crate::AgentBuilder::stop_when`] registers one).
pub struct StopWhen<F> {
    name: String,
    predicate: F,
}

impl<F> StopWhen<F>
where
    F: Fn(&RunState<'_>) -> bool + Send + Sync,
{
    /// A stop condition named `name`.
    pub fn new(name: impl Into<String>, predicate: F) -> Self {
        StopWhen {
            name: name.into(),
            predicate,
        }
    }
}

impl<F> Hook for StopWhen<F>
where
    F: Fn(&RunState<'_>) -> bool + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn should_stop<'a>(
        &'a self,
        _ctx: HookContext<'a>,
        state: RunState<'a>,
    ) -> BoxFuture<'a, HookResult<bool>> {
        let stop = (self.predicate)(&state);
        Box::pin(async move { Ok(stop) })
    }
}
