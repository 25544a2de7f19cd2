//! The rules of the loop, as a state machine that does no I/O and has no clock of its own.
//!
//! Given the run's state and the result of the last step, [`RunMachine::next_action`] answers the
//! next step: call the model, run an admitted batch of tool calls, or finish. Validation, limits,
//! budgets, stuck-loop detection and stop reasons all live here; drivers (the tokio driver in
//! [`crate::agent`], a journaled driver, a distributed one) do the I/O around it. Time and ids are
//! injected, so the same inputs always give the same run.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RunError;
use crate::event::EventKind;
use crate::ids::IdSource;
use crate::limits::{LimitHit, LimitKind, Limits};
use crate::message::{ContentPart, Message, ToolCall, ToolContent, ToolResult};
use crate::model::{ModelError, ModelErrorKind, ModelRequest, ModelResponse, ModelSettings, Usage};
use crate::outcome::{CallStatus, RunOutcome, StopReason, ToolCallRecord};
use crate::tool::{ExecutionMode, SchemaViolation, ToolOutput, ToolSet, validate_with};

/// The longest call id accepted.
pub const MAX_CALL_ID_LEN: usize = 256;

/// What to do with a call the model got wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInvalidCall {
    /// Send an error result to the model, which may recover (the default).
    #[default]
    FeedBack,
    /// Fail the run.
    Fail,
}

/// How invalid decisions are treated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionPolicy {
    /// A call to a tool that is not registered.
    pub unknown_tool: OnInvalidCall,
    /// Arguments that are not JSON or fail the schema.
    pub invalid_arguments: OnInvalidCall,
}

/// What an agent is, independent of any one run. Shared by all its runs.
pub struct AgentConfig {
    /// The agent's name.
    pub name: String,
    /// System instructions.
    pub instructions: Option<String>,
    /// The tools.
    pub tools: ToolSet,
    /// The limits.
    pub limits: Limits,
    /// How invalid calls are treated.
    pub policy: DecisionPolicy,
    /// The schema of the final answer and its compiled validator.
    pub output_schema: Option<(Value, Arc<jsonschema::Validator>)>,
    /// Model settings sent with every call.
    pub settings: ModelSettings,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("name", &self.name)
            .field("tools", &self.tools)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// One admitted call, ready to run.
#[derive(Debug, Clone)]
pub struct AdmittedCall {
    /// Its position among the calls of the model's response.
    pub position: usize,
    /// The call id.
    pub call_id: Arc<str>,
    /// The tool's index in the agent's [`ToolSet`].
    pub tool: usize,
    /// The tool's name.
    pub name: Arc<str>,
    /// The validated arguments, shared with the run's record of the call (a hook that rewrites
    /// them replaces the value, and the record keeps what the model sent).
    pub args: Arc<Value>,
}

/// A batch of admitted calls. Every call's arguments were validated before the batch was formed.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The turn it belongs to.
    pub turn: u32,
    /// The calls, in decision order.
    pub calls: Vec<AdmittedCall>,
    /// True when any tool of the batch is sequential: the calls run one at a time.
    pub sequential: bool,
}

/// How one admitted call ended, as a driver reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CallResult {
    /// The handler succeeded.
    Ok(ToolOutput),
    /// A recoverable error (or a per-tool timeout).
    Error {
        /// The code.
        code: String,
        /// What the model reads.
        message: String,
    },
    /// The handler failed fatally.
    Fatal {
        /// The diagnostic.
        message: String,
    },
    /// The handler panicked.
    Panicked {
        /// The panic message.
        message: String,
    },
    /// Cancelled (or cut short by the deadline) before it completed.
    Cancelled,
    /// Not run: a sibling failed fatally first.
    NotRun,
    /// Denied by a permission gate or hook.
    Denied {
        /// Why, as the model reads it.
        reason: String,
    },
    /// Not run on purpose (dry run).
    Skipped,
}

/// A call's result with its timing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    /// How it ended.
    pub result: CallResult,
    /// How long it ran, retries included.
    #[serde(with = "crate::serde_duration")]
    pub duration: Duration,
    /// How many times it was run again after a failure ([`crate::ToolSpec::retries`]).
    #[serde(default, skip_serializing_if = "crate::tool::is_zero")]
    pub retries: u32,
}

impl CallOutcome {
    /// An outcome that took no time.
    pub fn instant(result: CallResult) -> Self {
        CallOutcome {
            retries: 0,
            result,
            duration: Duration::ZERO,
        }
    }
}

/// The next step a driver must take.
#[derive(Debug)]
pub enum Action {
    /// Call the model with [`RunMachine::request`], then report with
    /// [`RunMachine::on_model_response`] or [`RunMachine::on_model_error`].
    CallModel,
    /// Run this batch, then report with [`RunMachine::on_tool_outcomes`].
    RunTools(Batch),
    /// The run is over: take [`RunMachine::into_outcome`].
    Finish,
}

enum Slot {
    /// Waiting for the driver's outcome.
    Admitted {
        tool: usize,
        input: Arc<Value>,
        call_id: Arc<str>,
        name: Arc<str>,
    },
    /// Decided before running.
    Decided {
        status: CallStatus,
        code: String,
        message: String,
        input: Value,
    },
}

impl Slot {
    fn input(&self) -> &Value {
        match self {
            Slot::Admitted { input, .. } => input,
            Slot::Decided { input, .. } => input,
        }
    }
}

struct Pending {
    turn: u32,
    message_index: usize,
    slots: Vec<Slot>,
}

enum Phase {
    NeedModel,
    AwaitModel,
    AwaitTools(Pending),
    Done,
}

/// The state of one run.
pub struct RunMachine {
    cfg: Arc<AgentConfig>,
    ids: Arc<dyn IdSource>,
    run_id: Arc<str>,
    transcript: Vec<Message>,
    new_from: usize,
    phase: Phase,
    turn: u32,
    model_calls: u32,
    tool_calls_used: u32,
    tool_calls_run: u32,
    usage: Usage,
    cost: f64,
    records: Vec<ToolCallRecord>,
    /// The distinct calls of the last tool turn: the index of each one's record, and in how many
    /// turns in a row it was made.
    streaks: Vec<(usize, u32)>,
    output_retries_used: u32,
    retrying_output: bool,
    stop: Option<StopReason>,
    error: Option<RunError>,
    limit: Option<LimitHit>,
    output: Option<String>,
    structured: Option<Value>,
    pending_batch: Option<Batch>,
    record_events: bool,
    events: Vec<EventKind>,
    now: Duration,
}

impl std::fmt::Debug for RunMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunMachine")
            .field("run_id", &self.run_id)
            .field("turn", &self.turn)
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl RunMachine {
    /// A run of `cfg` continuing `transcript` with `input` (a user message), if any.
    pub fn new(
        cfg: Arc<AgentConfig>,
        ids: Arc<dyn IdSource>,
        run_id: Arc<str>,
        mut transcript: Vec<Message>,
        input: Option<Message>,
    ) -> Self {
        let new_from = transcript.len();
        if let Some(m) = input {
            transcript.push(m);
        }
        RunMachine {
            cfg,
            ids,
            run_id,
            transcript,
            new_from,
            phase: Phase::NeedModel,
            turn: 0,
            model_calls: 0,
            tool_calls_used: 0,
            tool_calls_run: 0,
            usage: Usage::default(),
            cost: 0.0,
            records: Vec::new(),
            streaks: Vec::new(),
            output_retries_used: 0,
            retrying_output: false,
            stop: None,
            error: None,
            limit: None,
            output: None,
            structured: None,
            pending_batch: None,
            record_events: false,
            events: Vec::new(),
            now: Duration::ZERO,
        }
    }

    /// Buffers events for a driver to drain with [`RunMachine::drain_events`].
    pub fn record_events(&mut self, yes: bool) {
        self.record_events = yes;
    }

    /// Takes the buffered events.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, EventKind> {
        self.events.drain(..)
    }

    fn emit(&mut self, kind: impl FnOnce() -> EventKind) {
        if self.record_events {
            self.events.push(kind());
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &Arc<str> {
        &self.run_id
    }

    /// The current turn (1-based; 0 before the first).
    pub fn turn(&self) -> u32 {
        self.turn
    }

    /// The agent.
    pub fn config(&self) -> &Arc<AgentConfig> {
        &self.cfg
    }

    /// The transcript so far.
    pub fn transcript(&self) -> &[Message] {
        &self.transcript
    }

    /// Tokens so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// USD so far.
    pub fn cost_usd(&self) -> f64 {
        self.cost
    }

    /// True when the next step is a model call: messages may be added now without splitting a
    /// tool call from its result.
    pub fn at_safe_point(&self) -> bool {
        matches!(self.phase, Phase::NeedModel)
    }

    /// True once the run has stopped.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The request for the model call the machine asked for. It borrows the transcript.
    pub fn request(&self) -> ModelRequest<'_> {
        ModelRequest {
            instructions: self.cfg.instructions.as_deref(),
            messages: &self.transcript,
            tools: self.cfg.tools.specs(),
            output_schema: self.cfg.output_schema.as_ref().map(|(v, _)| v),
            settings: &self.cfg.settings,
        }
    }

    /// Adds a message before the next model call (steering, a follow-up).
    pub fn push_user_message(&mut self, message: Message) {
        self.transcript.push(message);
        if matches!(self.phase, Phase::Done) && self.stop == Some(StopReason::Finished) {
            self.stop = None;
            self.output = None;
            self.structured = None;
            self.phase = Phase::NeedModel;
        }
    }

    /// The next step, at `now` (time since the run started).
    pub fn next_action(&mut self, now: Duration) -> Action {
        self.now = now;
        match &mut self.phase {
            Phase::Done => Action::Finish,
            Phase::AwaitTools(_) if self.pending_batch.is_some() => match self.take_batch() {
                Some(batch) => Action::RunTools(batch),
                None => Action::Finish,
            },
            Phase::AwaitModel | Phase::AwaitTools(_) => {
                // A driver asked again without reporting: the step is lost, which is a bug in the
                // driver; fail the run instead of repeating work.
                self.fail(RunError::Other {
                    message: "the driver skipped a step's report".into(),
                });
                Action::Finish
            }
            Phase::NeedModel => {
                if let Some(hit) = self.check_before_model_call(now) {
                    self.stop_on_limit(hit);
                    return Action::Finish;
                }
                if !self.retrying_output {
                    self.turn += 1;
                    self.emit(|| EventKind::TurnStarted);
                }
                self.model_calls += 1;
                self.phase = Phase::AwaitModel;
                Action::CallModel
            }
        }
    }

    fn check_before_model_call(&self, now: Duration) -> Option<LimitHit> {
        let l = &self.cfg.limits;
        if let Some(t) = l.timeout
            && now >= t
        {
            return Some(hit(
                LimitKind::Deadline,
                t.as_millis() as f64,
                now.as_millis() as f64,
                0.0,
            ));
        }
        if !self.retrying_output
            && let Some(max) = l.max_turns
            && self.turn >= max
        {
            return Some(hit(LimitKind::Turns, max.into(), self.turn.into(), 1.0));
        }
        if let Some(max) = l.max_model_calls
            && self.model_calls >= max
        {
            return Some(hit(
                LimitKind::ModelCalls,
                max.into(),
                self.model_calls.into(),
                1.0,
            ));
        }
        if let Some(max) = l.max_tokens
            && self.usage.total_tokens() >= max
        {
            return Some(hit(
                LimitKind::Tokens,
                max as f64,
                self.usage.total_tokens() as f64,
                0.0,
            ));
        }
        if let Some(max) = l.max_cost_usd
            && self.cost >= max
        {
            return Some(hit(LimitKind::Cost, max, self.cost, 0.0));
        }
        None
    }

    fn stop_on_limit(&mut self, hit: LimitHit) {
        let reason = match hit.limit {
            LimitKind::Turns => StopReason::MaxTurns,
            LimitKind::ToolCalls => StopReason::MaxToolCalls,
            LimitKind::ModelCalls => StopReason::MaxModelCalls,
            LimitKind::Tokens | LimitKind::Cost => StopReason::Budget,
            LimitKind::Deadline => StopReason::Deadline,
            LimitKind::StuckLoop => StopReason::StuckLoop,
        };
        self.limit = Some(hit);
        self.error = Some(match hit.limit {
            LimitKind::Deadline => RunError::Deadline {
                elapsed_ms: self.now.as_millis() as u64,
            },
            _ => RunError::LimitReached(hit),
        });
        self.emit(|| EventKind::LimitReached { limit: hit });
        self.finish(reason);
    }

    fn finish(&mut self, reason: StopReason) {
        self.stop = Some(reason);
        self.phase = Phase::Done;
    }

    fn fail(&mut self, error: RunError) {
        if self.error.is_none() {
            self.error = Some(error);
        }
        self.finish(StopReason::Failed);
    }

    /// Stops the run with a typed reason and error (guardrails, hooks, drivers).
    pub fn stop_with(&mut self, reason: StopReason, error: Option<RunError>) {
        if let Some(e) = error {
            self.error = Some(e);
        }
        self.finish(reason);
    }

    /// Reports a failed model call.
    pub fn on_model_error(&mut self, error: ModelError) {
        self.emit(|| EventKind::ModelError {
            code: error.code().to_owned(),
            message: error.message.clone(),
        });
        self.fail(RunError::Model(error));
    }

    /// Reports that the run was cancelled (during a model call, or after a drained batch).
    pub fn on_cancelled(&mut self) {
        self.error.get_or_insert(RunError::Cancelled);
        self.finish(StopReason::Cancelled);
    }

    /// Reports that the deadline passed during the last step.
    pub fn on_deadline(&mut self, now: Duration) {
        self.now = now;
        let bound = self.cfg.limits.timeout.unwrap_or(now);
        self.stop_on_limit(hit(
            LimitKind::Deadline,
            bound.as_millis() as f64,
            now.as_millis() as f64,
            0.0,
        ));
    }

    /// Reports the model's response (`cost`: its price in USD, when known).
    pub fn on_model_response(&mut self, mut response: ModelResponse, cost: Option<f64>) {
        if !matches!(self.phase, Phase::AwaitModel) {
            self.fail(RunError::Other {
                message: "a model response arrived when none was asked for".into(),
            });
            return;
        }
        self.retrying_output = false;
        self.usage.add(&response.usage);
        self.cost += cost.unwrap_or(0.0);
        if response.truncated {
            response.message.tool_calls.clear();
            self.transcript.push(Message::Assistant(response.message));
            self.fail(RunError::Model(ModelError::new(
                ModelErrorKind::Truncated,
                "the response was cut off inside a tool call (output token limit); the call was not run",
            )));
            return;
        }
        if response.message.tool_calls.is_empty() {
            self.on_final_answer(response);
            return;
        }
        self.on_tool_decision(response);
    }

    fn on_final_answer(&mut self, response: ModelResponse) {
        let text = response.message.text.clone();
        self.transcript.push(Message::Assistant(response.message));
        let Some((_, validator)) = &self.cfg.output_schema else {
            self.output = Some(text);
            self.finish(StopReason::Finished);
            return;
        };
        let parsed = parse_json_answer(&text);
        let problems = match &parsed {
            Ok(value) => match validate_with(validator, value) {
                Ok(()) => None,
                Err(v) => Some(join_violations(&v)),
            },
            Err(e) => Some(format!("the answer is not JSON: {e}")),
        };
        match problems {
            None => {
                self.output = Some(text);
                self.structured = parsed.ok();
                self.finish(StopReason::Finished);
            }
            Some(p) if self.output_retries_used < self.cfg.limits.output_retries => {
                self.output_retries_used += 1;
                self.retrying_output = true;
                self.transcript.push(Message::User {
                    content: vec![ContentPart::Text {
                        text: format!(
                            "Your final answer does not match the required JSON schema: {p}. Answer again with only a JSON value that matches the schema."
                        ),
                    }],
                });
                self.phase = Phase::NeedModel;
            }
            Some(p) => {
                self.output = Some(text);
                self.fail(RunError::OutputInvalid { message: p });
            }
        }
    }

    fn on_tool_decision(&mut self, mut response: ModelResponse) {
        // Ids first: blank ones get a generated id; overlong or duplicate ones make the whole
        // decision invalid, because results could not be matched to calls.
        let mut seen: HashSet<&str> = HashSet::new();
        for call in response.message.tool_calls.iter_mut() {
            if call.id.trim().is_empty() {
                call.id = self.ids.call_id();
            }
        }
        let mut id_problem = None;
        for call in &response.message.tool_calls {
            if call.id.len() > MAX_CALL_ID_LEN {
                id_problem = Some(format!(
                    "call id of {} bytes for tool {} (at most {MAX_CALL_ID_LEN})",
                    call.id.len(),
                    call.name
                ));
                break;
            }
            if !seen.insert(call.id.as_str()) {
                id_problem = Some(format!("duplicate call id {:?} in one response", call.id));
                break;
            }
        }
        drop(seen);
        let turn = self.turn;
        if let Some(reason) = id_problem {
            self.refuse_all(
                response,
                "decision.invalid",
                &format!("not executed: invalid decision ({reason})"),
            );
            self.fail(RunError::InvalidDecision { reason });
            return;
        }

        let tools = &self.cfg.tools;
        let policy = self.cfg.policy;
        let mut slots: Vec<Slot> = Vec::with_capacity(response.message.tool_calls.len());
        let mut fatal: Option<String> = None;
        let mut admitted = 0u32;
        let mut sequential = false;
        for call in &response.message.tool_calls {
            let Some(tool) = tools.index_of(&call.name) else {
                let names: Vec<&str> = tools.names().collect();
                let message = if names.is_empty() {
                    format!("unknown tool {:?}: no tools are available", call.name)
                } else {
                    format!(
                        "unknown tool {:?}; valid tools: {}",
                        call.name,
                        names.join(", ")
                    )
                };
                if policy.unknown_tool == OnInvalidCall::Fail && fatal.is_none() {
                    fatal = Some(message.clone());
                }
                slots.push(Slot::Decided {
                    status: CallStatus::Rejected,
                    code: "unknown_tool".into(),
                    message,
                    input: raw_input(&call.arguments),
                });
                continue;
            };
            let args = if call.arguments.trim().is_empty() {
                Ok(Value::Object(Default::default()))
            } else {
                serde_json::from_str::<Value>(&call.arguments)
            };
            let checked = match args {
                Err(e) => Err((
                    format!("invalid arguments for {}: not valid JSON ({e})", call.name),
                    raw_input(&call.arguments),
                )),
                Ok(value) => match tools.validate(tool, &value) {
                    Ok(()) => Ok(value),
                    Err(v) => Err((
                        format!(
                            "invalid arguments for {}: {}",
                            call.name,
                            join_violations(&v)
                        ),
                        value,
                    )),
                },
            };
            match checked {
                Ok(value) => {
                    admitted += 1;
                    if tools
                        .spec(tool)
                        .is_some_and(|s| s.mode == ExecutionMode::Sequential)
                    {
                        sequential = true;
                    }
                    slots.push(Slot::Admitted {
                        tool,
                        input: Arc::new(value),
                        call_id: Arc::from(call.id.as_str()),
                        name: match tools.shared_name(tool) {
                            Some(name) => Arc::clone(name),
                            None => Arc::from(call.name.as_str()),
                        },
                    });
                }
                Err((message, input)) => {
                    if policy.invalid_arguments == OnInvalidCall::Fail && fatal.is_none() {
                        fatal = Some(message.clone());
                    }
                    slots.push(Slot::Decided {
                        status: CallStatus::Rejected,
                        code: "invalid_arguments".into(),
                        message,
                        input,
                    });
                }
            }
        }

        if let Some(reason) = fatal {
            self.refuse_all(
                response,
                "decision.invalid",
                &format!("not executed: invalid decision ({reason})"),
            );
            self.fail(RunError::InvalidDecision { reason });
            return;
        }

        // The stuck-loop rule: the same call (tool and arguments, key order aside) in N turns in
        // a row stops the run before the Nth runs. Identical calls within one batch count once.
        let threshold = self.cfg.limits.stuck_loop_threshold;
        if threshold > 0 {
            // Calls are compared by value (serde_json's map equality ignores key order); each
            // streak points at the record its call will have once this batch is folded, so the
            // next turn compares against the records without keeping a copy of the arguments.
            let first_record = self.records.len();
            let mut streaks: Vec<(usize, u32)> = Vec::with_capacity(slots.len());
            let mut stuck: Option<(String, u32)> = None;
            for (position, (call, slot)) in
                response.message.tool_calls.iter().zip(&slots).enumerate()
            {
                let input = slot.input();
                let repeated_in_batch = streaks.iter().any(|(record, _)| {
                    let p = record - first_record;
                    let same_tool = response
                        .message
                        .tool_calls
                        .get(p)
                        .is_some_and(|c| c.name == call.name);
                    same_tool && slots.get(p).is_some_and(|s| s.input() == input)
                });
                if repeated_in_batch {
                    continue;
                }
                let count = self
                    .streaks
                    .iter()
                    .find(|(record, _)| {
                        self.records
                            .get(*record)
                            .is_some_and(|r| *r.tool == *call.name && r.input == *input)
                    })
                    .map_or(1, |(_, n)| n + 1);
                streaks.push((first_record + position, count));
                if count >= threshold && stuck.is_none() {
                    stuck = Some((call.name.clone(), count));
                }
            }
            if let Some((tool, count)) = stuck {
                let h = hit(
                    LimitKind::StuckLoop,
                    threshold.into(),
                    (count - 1).into(),
                    1.0,
                );
                self.refuse_all(
                    response,
                    "limit.stuck_loop",
                    &format!("not executed: {tool} was called with the same arguments in {count} turns in a row"),
                );
                self.stop_on_limit(h);
                return;
            }
            self.streaks = streaks;
        }

        // The tool-call budget: a batch larger than what remains is refused whole.
        if let Some(max) = self.cfg.limits.max_tool_calls
            && self.tool_calls_used + admitted > max
        {
            let h = hit(
                LimitKind::ToolCalls,
                max.into(),
                self.tool_calls_used.into(),
                admitted.into(),
            );
            self.refuse_all(
                response,
                "limit.max_tool_calls",
                "not executed: the run's tool call limit was reached",
            );
            self.stop_on_limit(h);
            return;
        }
        self.tool_calls_used += admitted;

        for (call, slot) in response.message.tool_calls.iter().zip(&slots) {
            if let Slot::Decided { code, message, .. } = slot {
                self.emit(|| EventKind::ToolRejected {
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    code: code.clone(),
                    reason: message.clone(),
                });
            }
        }

        let calls: Vec<AdmittedCall> = slots
            .iter()
            .enumerate()
            .filter_map(|(position, slot)| match slot {
                Slot::Admitted {
                    tool,
                    input,
                    call_id,
                    name,
                } => Some(AdmittedCall {
                    position,
                    call_id: Arc::clone(call_id),
                    tool: *tool,
                    name: Arc::clone(name),
                    // Shared: the batch lends them to the handlers, the slot keeps them for the
                    // record, which takes them over once the batch is gone.
                    args: Arc::clone(input),
                }),
                Slot::Decided { .. } => None,
            })
            .collect();
        let message_index = self.transcript.len();
        self.transcript.push(Message::Assistant(response.message));
        let pending = Pending {
            turn,
            message_index,
            slots,
        };
        if calls.is_empty() {
            self.fold(pending, Vec::new());
            if !matches!(self.phase, Phase::Done) {
                self.phase = Phase::NeedModel;
            }
            return;
        }
        self.phase = Phase::AwaitTools(pending);
        self.pending_batch = Some(Batch {
            turn,
            calls,
            sequential,
        });
    }

    /// Pushes the assistant message and a refusal result for each of its calls, so the transcript
    /// stays valid to continue later.
    fn refuse_all(&mut self, response: ModelResponse, code: &str, message: &str) {
        let turn = self.turn;
        let shared: Vec<(Arc<str>, Arc<str>)> = response
            .message
            .tool_calls
            .iter()
            .map(|call| (Arc::from(call.id.as_str()), Arc::from(call.name.as_str())))
            .collect();
        for (call, (id, name)) in response.message.tool_calls.iter().zip(&shared) {
            self.records.push(ToolCallRecord {
                id: Arc::clone(id),
                tool: Arc::clone(name),
                input: raw_input(&call.arguments),
                turn,
                status: CallStatus::Refused,
                output: None,
                error_code: Some(code.to_owned()),
                error: Some(message.to_owned()),
                details: None,
                duration: Duration::ZERO,
                retries: 0,
            });
            self.emit(|| EventKind::ToolRejected {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                code: code.to_owned(),
                reason: message.to_owned(),
            });
        }
        let results: Vec<Message> = shared
            .into_iter()
            .map(|(call_id, name)| {
                Message::Tool(ToolResult {
                    call_id,
                    name,
                    content: ToolContent::Text(message.to_owned()),
                    is_error: true,
                })
            })
            .collect();
        self.transcript.push(Message::Assistant(response.message));
        self.transcript.extend(results);
    }

    /// Takes the batch the machine admitted (the driver calls this after [`Action::RunTools`]).
    fn take_batch(&mut self) -> Option<Batch> {
        self.pending_batch.take()
    }

    /// Reports the outcomes of the batch, in the batch's order.
    pub fn on_tool_outcomes(&mut self, outcomes: Vec<CallOutcome>) {
        let phase = std::mem::replace(&mut self.phase, Phase::NeedModel);
        let Phase::AwaitTools(pending) = phase else {
            self.phase = phase;
            self.fail(RunError::Other {
                message: "tool outcomes arrived when none were asked for".into(),
            });
            return;
        };
        self.fold(pending, outcomes);
    }

    fn fold(&mut self, pending: Pending, outcomes: Vec<CallOutcome>) {
        let Pending {
            turn,
            message_index,
            slots,
        } = pending;
        let mut outcomes = outcomes.into_iter();
        let mut all_terminate = true;
        let mut terminate_output: Option<String> = None;
        let mut fatal: Option<RunError> = None;
        let mut results = Vec::with_capacity(slots.len());
        // Borrowed, not cloned: only other fields of the machine change while folding.
        let calls: &[ToolCall] = match self
            .transcript
            .get(message_index)
            .and_then(Message::as_assistant)
        {
            Some(a) => &a.tool_calls,
            None => &[],
        };
        let any_calls = !calls.is_empty();
        for (call, slot) in calls.iter().zip(slots) {
            let (record, result) = match slot {
                Slot::Decided {
                    status,
                    code,
                    message,
                    input,
                } => {
                    all_terminate = false;
                    let call_id: Arc<str> = Arc::from(call.id.as_str());
                    let name: Arc<str> = Arc::from(call.name.as_str());
                    (
                        ToolCallRecord {
                            id: Arc::clone(&call_id),
                            tool: Arc::clone(&name),
                            input,
                            turn,
                            status,
                            output: None,
                            error_code: Some(code),
                            error: Some(message.clone()),
                            details: None,
                            duration: Duration::ZERO,
                            retries: 0,
                        },
                        ToolResult {
                            call_id,
                            name,
                            content: ToolContent::Text(message),
                            is_error: true,
                        },
                    )
                }
                Slot::Admitted {
                    input,
                    call_id,
                    name,
                    ..
                } => {
                    let outcome = outcomes
                        .next()
                        .unwrap_or(CallOutcome::instant(CallResult::NotRun));
                    let (status, content, code, is_error, details) = match outcome.result {
                        CallResult::Ok(out) => {
                            self.tool_calls_run += 1;
                            if out.terminate {
                                terminate_output = Some(out.content.to_text());
                            } else {
                                all_terminate = false;
                            }
                            (CallStatus::Ok, out.content, None, false, out.details)
                        }
                        CallResult::Error { code, message } => {
                            self.tool_calls_run += 1;
                            all_terminate = false;
                            (
                                CallStatus::Error,
                                ToolContent::Text(message),
                                Some(code),
                                true,
                                None,
                            )
                        }
                        CallResult::Fatal { message } => {
                            self.tool_calls_run += 1;
                            all_terminate = false;
                            if fatal.is_none() {
                                fatal = Some(RunError::ToolFatal {
                                    tool: call.name.clone(),
                                    call_id: call.id.clone(),
                                    message,
                                });
                            }
                            (
                                CallStatus::Fatal,
                                ToolContent::Text("the tool failed".into()),
                                Some("tool.fatal".into()),
                                true,
                                None,
                            )
                        }
                        CallResult::Panicked { message } => {
                            self.tool_calls_run += 1;
                            all_terminate = false;
                            if fatal.is_none() {
                                fatal = Some(RunError::ToolPanicked {
                                    tool: call.name.clone(),
                                    call_id: call.id.clone(),
                                    message,
                                });
                            }
                            (
                                CallStatus::Fatal,
                                ToolContent::Text("the tool failed".into()),
                                Some("tool.panicked".into()),
                                true,
                                None,
                            )
                        }
                        CallResult::Cancelled => {
                            self.tool_calls_run += 1;
                            all_terminate = false;
                            (
                                CallStatus::Cancelled,
                                ToolContent::Text("cancelled: the call did not complete".into()),
                                Some("cancelled".into()),
                                true,
                                None,
                            )
                        }
                        CallResult::NotRun => {
                            self.tool_calls_used = self.tool_calls_used.saturating_sub(1);
                            all_terminate = false;
                            (
                                CallStatus::Cancelled,
                                ToolContent::Text(
                                    "not run: the run stopped before this call started".into(),
                                ),
                                Some("not_run".into()),
                                true,
                                None,
                            )
                        }
                        CallResult::Denied { reason } => {
                            self.tool_calls_used = self.tool_calls_used.saturating_sub(1);
                            all_terminate = false;
                            (
                                CallStatus::Denied,
                                ToolContent::Text(format!("denied: {reason}")),
                                Some("denied".into()),
                                true,
                                None,
                            )
                        }
                        CallResult::Skipped => {
                            all_terminate = false;
                            (
                                CallStatus::Skipped,
                                ToolContent::Text("skipped: dry run, the tool was not run".into()),
                                None,
                                false,
                                None,
                            )
                        }
                    };
                    let (output, error) = if is_error {
                        (None, Some(content.to_text()))
                    } else {
                        (Some(content.clone()), None)
                    };
                    (
                        ToolCallRecord {
                            id: Arc::clone(&call_id),
                            tool: Arc::clone(&name),
                            input: Arc::unwrap_or_clone(input),
                            turn,
                            status,
                            output,
                            error_code: code,
                            error,
                            details,
                            duration: outcome.duration,
                            retries: outcome.retries,
                        },
                        ToolResult {
                            call_id,
                            name,
                            content,
                            is_error,
                        },
                    )
                }
            };
            self.records.push(record);
            results.push(Message::Tool(result));
        }
        self.transcript.extend(results);
        if let Some(e) = fatal {
            self.fail(e);
            return;
        }
        if all_terminate && any_calls {
            self.output = terminate_output;
            self.finish(StopReason::Terminated);
        }
    }

    /// Validates arguments for a tool again (after a hook rewrote them).
    pub fn revalidate(&self, tool: usize, args: &Value) -> Result<(), String> {
        self.cfg
            .tools
            .validate(tool, args)
            .map_err(|v| join_violations(&v))
    }

    /// The outcome. Call after [`Action::Finish`]; `elapsed` is the run's duration.
    pub fn into_outcome(self, elapsed: Duration) -> RunOutcome {
        let stop_reason = self.stop.unwrap_or(StopReason::Failed);
        RunOutcome {
            run_id: self.run_id.to_string(),
            stop_reason,
            output: self.output,
            structured_output: self.structured,
            transcript: self.transcript,
            new_messages_from: self.new_from,
            usage: self.usage,
            cost_usd: self.cost,
            turns: self.turn,
            model_calls: self.model_calls,
            tool_calls_run: self.tool_calls_run,
            tool_calls: self.records,
            limit: self.limit,
            error: self.error,
            duration: elapsed,
        }
    }

    /// The final output so far.
    pub fn output(&self) -> Option<&str> {
        self.output.as_deref()
    }

    /// The stop reason, once stopped.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.stop.as_ref()
    }

    /// The error so far.
    pub fn error(&self) -> Option<&RunError> {
        self.error.as_ref()
    }

    /// Counts so far: turns, model calls, tool calls admitted, tool calls run.
    pub fn counts(&self) -> (u32, u32, u32, u32) {
        (
            self.turn,
            self.model_calls,
            self.tool_calls_used,
            self.tool_calls_run,
        )
    }

    /// The records so far.
    pub fn records(&self) -> &[ToolCallRecord] {
        &self.records
    }
}

fn hit(limit: LimitKind, bound: f64, consumed: f64, requested: f64) -> LimitHit {
    LimitHit {
        limit,
        bound,
        consumed,
        requested,
    }
}

fn raw_input(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

fn join_violations(v: &[SchemaViolation]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Parses a final answer as JSON, allowing a fenced code block around it.
fn parse_json_answer(text: &str) -> Result<Value, serde_json::Error> {
    let t = text.trim();
    let inner = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .and_then(|s| s.strip_suffix("```"))
        .unwrap_or(t);
    serde_json::from_str(inner.trim())
}
