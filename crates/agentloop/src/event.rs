//! Everything observable in a run is an [`Event`]. Sinks subscribe: a closure, a channel for a UI,
//! trace writers. Events carry payloads (arguments, outputs); a sink that records them decides
//! whether to keep them.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::limits::LimitHit;
use crate::model::{Discarded, FinishReason, Usage};
use crate::outcome::CallOutcome;
use crate::outcome::StopReason;

/// One thing that happened in a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// The run it belongs to.
    pub run_id: Arc<str>,
    /// The turn (1-based; 0 before the first turn).
    pub turn: u32,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl Event {
    /// The call id, for events about one tool call.
    pub fn call_id(&self) -> Option<&str> {
        match &self.kind {
            EventKind::ToolCallDelta { call_id, .. } => call_id.as_deref(),
            EventKind::ToolStarted { call_id, .. }
            | EventKind::ToolProgress { call_id, .. }
            | EventKind::ToolRetrying { call_id, .. }
            | EventKind::ToolFinished { call_id, .. }
            | EventKind::ToolRejected { call_id, .. } => Some(call_id),
            _ => None,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The run began.
    RunStarted {
        /// The agent's name.
        agent: String,
        /// The model's id.
        model: String,
        /// The parent run, for a subagent.
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_run_id: Option<String>,
        /// The parent's call that started it, for a subagent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_call_id: Option<String>,
        /// The input text.
        input: String,
    },
    /// A turn began.
    TurnStarted,
    /// A model call began.
    ModelRequestStarted {
        /// The model's id.
        model: String,
        /// The provider's name.
        provider: String,
        /// How many messages the transcript holds.
        messages: usize,
    },
    /// A piece of visible text streamed in.
    TextDelta {
        /// The piece.
        text: String,
    },
    /// A piece of reasoning streamed in.
    ReasoningDelta {
        /// The piece.
        text: String,
    },
    /// A piece of a tool call's arguments streamed in.
    ToolCallDelta {
        /// The provider's index of the call.
        index: u32,
        /// The call id, once known.
        call_id: Option<String>,
        /// The tool name, once known.
        name: Option<String>,
        /// The piece of raw JSON.
        arguments: String,
    },
    /// The model's response is complete.
    ModelResponse {
        /// Tokens used by the call.
        usage: Usage,
        /// Its cost in USD, when priced.
        cost_usd: Option<f64>,
        /// Why the model stopped.
        finish_reason: FinishReason,
        /// How many tool calls it made.
        tool_calls: usize,
        /// The response's text.
        text: String,
        /// How long the call took.
        #[serde(with = "crate::serde_duration")]
        duration: Duration,
        /// The answer came from a response cache, not from the model this time.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cached: bool,
        /// What the provider's adapter noticed about the answer without failing it (a block of
        /// a type it does not support ignored, a tool call cut by the output limit dropped, a
        /// stream that ended without a finish reason); absent when there was nothing.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
    },
    /// The model call's attempt failed part-way or before its first byte and the call starts
    /// over (the provider's retry layer, or a fallback to the next model): the text, reasoning
    /// and tool-call deltas since the call's `model_request_started` (or its last
    /// `model_retrying`) are discarded, and the response is the one the deltas after this
    /// event make. A UI that printed them takes them back. No tool of the discarded attempt ran.
    ModelRetrying {
        /// The retry about to run (1 for the first).
        retry: u32,
        /// The model the next attempt asks.
        model: String,
        /// The failed attempt's error code (`model.overloaded`).
        code: String,
        /// The failed attempt's message.
        message: String,
        /// The wait before the next attempt.
        #[serde(with = "crate::serde_duration")]
        delay: Duration,
        /// How much of the failed attempt had streamed and is now discarded.
        discarded: Discarded,
        /// The tokens the provider reported for the failed attempt, if any: they are part of
        /// the call's usage in its `model_response`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
    },
    /// Older messages were compacted to keep the conversation inside the context budget.
    Compacted {
        /// `summarize` or `drop_tool_results`.
        policy: String,
        /// How many messages were replaced.
        messages_replaced: usize,
        /// The request's estimated tokens before.
        tokens_before: u64,
        /// And after.
        tokens_after: u64,
        /// The summary that replaced them.
        #[serde(skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        /// The messages replaced (a payload: a trace keeps them only with payloads on).
        replaced: Vec<crate::message::Message>,
        /// What the summary call spent.
        usage: Usage,
        /// Its cost.
        cost_usd: f64,
        /// Why a summary was not used, when tool results were dropped instead.
        #[serde(skip_serializing_if = "Option::is_none")]
        fallback: Option<String>,
        /// How long it took.
        #[serde(with = "crate::serde_duration")]
        duration: Duration,
    },
    /// A model call failed.
    ModelError {
        /// The stable code.
        code: String,
        /// The message.
        message: String,
    },
    /// A tool call passed validation and its handler started.
    ToolStarted {
        /// The call id.
        call_id: String,
        /// The tool.
        tool: String,
        /// The validated arguments.
        arguments: Value,
    },
    /// A running call reported progress.
    ToolProgress {
        /// The call id.
        call_id: String,
        /// The tool.
        tool: String,
        /// What it reported.
        progress: Value,
    },
    /// A call failed and will run again after `delay`, as its tool's
    /// [`retry`](crate::tool::ToolPolicy::retry) policy says.
    ToolRetrying {
        /// The call id.
        call_id: String,
        /// The tool.
        tool: String,
        /// The retry about to run (1 for the first).
        retry: u32,
        /// The failed attempt's error code.
        code: String,
        /// The failed attempt's message.
        message: String,
        /// The wait before the retry.
        #[serde(with = "crate::serde_duration")]
        delay: Duration,
    },
    /// A started call finished (exactly once per start).
    ToolFinished {
        /// The call id.
        call_id: String,
        /// The tool.
        tool: String,
        /// How it ended: status, code, what the model read, the operator's diagnostic, timing.
        outcome: CallOutcome,
    },
    /// A call never started: unknown tool, invalid arguments, denied, or refused by a limit.
    ToolRejected {
        /// The call id.
        call_id: String,
        /// The tool the model named.
        tool: String,
        /// The error code (the outcome's).
        code: String,
        /// Why (as the model reads it).
        reason: String,
        /// The call's typed outcome, as the transcript and `--json` have it: sinks read its
        /// status rather than guess it from the code (an event of an older writer has a plain
        /// `rejected` one).
        #[serde(default = "CallOutcome::unknown_rejection")]
        outcome: CallOutcome,
    },
    /// The run's tool source changed its tools: the model sees the new list from this turn on.
    ToolsChanged {
        /// Tools that appeared.
        added: Vec<String>,
        /// Tools that went away (a later call of one is an unknown-tool error).
        removed: Vec<String>,
        /// Tools whose description, schemas or flags changed.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        updated: Vec<String>,
        /// Tools left out, each with why (`name: reason`): a bad name or schema, a name taken.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        refused: Vec<String>,
    },
    /// What the run's tool source wrote for the operator outside any call (an MCP server's
    /// stderr), as the driver collected it at a turn boundary or at the run's end. Never read
    /// by the model; a payload, as a trace sees it.
    ToolSourceOutput {
        /// Who wrote it (an MCP server's name).
        origin: String,
        /// The lines, in order.
        lines: Vec<String>,
    },
    /// An observer hook failed; the run went on.
    HookFailed {
        /// The hook's name.
        hook: String,
        /// Where it failed (`before_model_call`, `after_tool_call`, ...).
        stage: String,
        /// Its message.
        message: String,
    },
    /// Messages from the application were added to the transcript (steering or follow-ups).
    MessagesDelivered {
        /// How many.
        count: usize,
        /// True for follow-ups (delivered when the run would have finished).
        follow_up: bool,
    },
    /// A final answer was sent back to the model to answer again: it was cut off by the output
    /// limit, failed its schema, or a hook rejected it.
    AnswerRetried {
        /// Why.
        reason: String,
    },
    /// A stop condition ended the run after a turn (stop reason `terminated`).
    StopConditionMet {
        /// The hook (or stop condition) that ended it.
        by: String,
    },
    /// A hand-off's agent returned and its answer ends the run ([`crate::handoff::Handoff`]):
    /// the conversation went from this run's agent to `to` through the call `call_id`, and
    /// `answered_by` answered (`to`, or an agent `to` handed off to in turn).
    HandedOff {
        /// The hand-off's call.
        call_id: String,
        /// The hand-off's tool.
        tool: String,
        /// This run's agent.
        from: String,
        /// The agent it handed the conversation to.
        to: String,
        /// The agent whose answer is the run's.
        answered_by: String,
        /// The child run, where the other agent went on.
        run_id: String,
    },
    /// A limit stopped the run.
    LimitReached {
        /// Which limit, its bound, what was consumed and what was requested.
        limit: LimitHit,
    },
    /// The run ended.
    RunFinished {
        /// Why.
        stop_reason: StopReason,
        /// Total tokens.
        usage: Usage,
        /// Total cost in USD.
        cost_usd: f64,
        /// Turns taken.
        turns: u32,
        /// The error, when the run did not succeed.
        error: Option<ErrorSummary>,
    },
}

/// An error as events carry it: its stable code and what it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorSummary {
    /// The stable code ([`crate::RunError::code`]).
    pub code: String,
    /// The error's text.
    pub message: String,
}

impl From<&crate::RunError> for ErrorSummary {
    fn from(e: &crate::RunError) -> Self {
        ErrorSummary {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

/// Receives events. Implementations must be quick: they run on the loop's task.
pub trait EventSink: Send + Sync {
    /// Handles one event.
    fn emit(&self, event: &Event);

    /// The events this sink holds for a reader that has not taken them yet, when it keeps
    /// them for one ([`Backlog`]): a run waits for room in it before its next step, and
    /// between the deltas of a model's answer. None by default.
    fn backlog(&self) -> Option<&Backlog> {
        None
    }
}

/// How many events a sink holds for a reader that has not taken them yet, and how many it may
/// hold. A run that finds it full waits (its cancellation and deadline still apply) until the
/// reader takes some or the sink is closed: a slow reader slows the run instead of letting its
/// events pile up without bound. The run waits only between its steps and between a model's
/// deltas, so what one step emits at once (a tool's progress while it runs, the records of a
/// batch) may go past `capacity`; the excess is bounded by that step.
#[derive(Debug)]
pub struct Backlog {
    queued: std::sync::atomic::AtomicUsize,
    capacity: usize,
    closed: std::sync::atomic::AtomicBool,
    room: tokio::sync::Notify,
}

impl Backlog {
    /// A backlog that holds up to `capacity` events (at least one).
    pub fn new(capacity: usize) -> Backlog {
        Backlog {
            queued: std::sync::atomic::AtomicUsize::new(0),
            capacity: capacity.max(1),
            closed: std::sync::atomic::AtomicBool::new(false),
            room: tokio::sync::Notify::new(),
        }
    }

    /// The sink kept one more event.
    pub fn pushed(&self) {
        self.queued
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// The reader took one event.
    pub fn taken(&self) {
        let before = self.queued.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |n| n.checked_sub(1),
        );
        if before.is_ok_and(|n| n <= self.capacity) {
            self.room.notify_waiters();
        }
    }

    /// The reader is gone: nothing waits for room any more.
    pub fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.room.notify_waiters();
    }

    /// The events held now.
    pub fn queued(&self) -> usize {
        self.queued.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until the backlog has room, or is closed.
    pub(crate) async fn room(&self) {
        loop {
            let notified = self.room.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so that a `taken` between the check and the wait
            // is not missed.
            notified.as_mut().enable();
            if self.closed.load(std::sync::atomic::Ordering::Acquire)
                || self.queued() < self.capacity
            {
                return;
            }
            notified.await;
        }
    }
}

impl<F: Fn(&Event) + Send + Sync> EventSink for F {
    fn emit(&self, event: &Event) {
        self(event)
    }
}

/// Fans events out to several sinks.
#[derive(Clone, Default)]
pub(crate) struct Sinks(pub(crate) Vec<Arc<dyn EventSink>>);

impl Sinks {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when a sink that keeps events for a reader is full ([`Backlog`]).
    pub(crate) fn full(&self) -> bool {
        self.0
            .iter()
            .filter_map(|s| s.backlog())
            .any(|b| b.queued() >= b.capacity)
    }

    /// Waits until every sink that keeps events for a reader has room ([`Backlog`]).
    pub(crate) async fn room(&self) {
        for backlog in self.0.iter().filter_map(|s| s.backlog()) {
            backlog.room().await;
        }
    }
}

impl EventSink for Sinks {
    /// Emits to every sink; a sink that panics is isolated, and the others hear of it.
    fn emit(&self, event: &Event) {
        let mut panicked: Option<String> = None;
        for s in &self.0 {
            let emitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.emit(event)));
            if let Err(p) = emitted {
                panicked.get_or_insert_with(|| crate::panic::panic_message(&p));
            }
        }
        if let Some(message) = panicked {
            // Reported once, and never about a report (a sink that panics on every event must
            // not recurse).
            if matches!(event.kind, EventKind::HookFailed { .. }) {
                return;
            }
            self.emit(&Event {
                run_id: event.run_id.clone(),
                turn: event.turn,
                kind: EventKind::HookFailed {
                    hook: "sink".into(),
                    stage: "emit".into(),
                    message: format!("panicked: {message}"),
                },
            });
        }
    }
}
