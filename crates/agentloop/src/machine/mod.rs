//! The rules of the loop, as a state machine that does no I/O and has no clock of its own.
//!
//! A driver asks [`RunMachine::action`] what to do, does it, and reports the result with
//! [`RunMachine::feed`]; the machine decides everything that follows. Validation, limits, budgets,
//! stuck-loop detection, admission verdicts, hook and guardrail verdicts, steering, dispatch,
//! draining, and stop reasons all live here; a driver holds no rule. Time and ids are injected, so
//! feeding the same [`Step`]s to a fresh machine reproduces a run exactly (see
//! [`crate::driver::replay()`]).
//!
//! - `mod.rs`: the state, the turn's flow, limits and stops (`on_limit`), the stop conditions.
//! - `admit.rs`: a model's answer: refused, filtered or cut answers, cut calls, ids, known tools,
//!   arguments, the budgets and the last turn, the stuck-loop rule (judged after each tool turn on
//!   calls and results), output schemas and tool panics.
//! - `compact.rs`: compaction before a model call (the summary call, dropped tool results).
//! - `fold.rs`: outcomes into the transcript and the records.
//! - `step.rs`: the actions and inputs.

mod admit;
mod compact;
mod fold;
mod step;
mod unread_call;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

pub use step::{
    Action, AdmittedCall, Batch, HookFailure, Input, Interrupt, Seams, Step, Trip, Verdict,
};

use crate::config::AgentConfig;
use crate::error::RunError;
use crate::event::EventKind;
use crate::hooks::{HookRole, RequestChanges};
use crate::ids::IdSource;
use crate::limits::{LimitHit, LimitKind, Limits, OnLimit};
use crate::message::Message;
use crate::model::{ModelRequest, ModelResponse, Usage};
use crate::outcome::{CallOutcome, RunOutcome, StopReason, ToolCallRecord};
use crate::tool::ToolCatalog;

/// The longest call id accepted.
pub const MAX_CALL_ID_LEN: usize = 256;

/// A model decision that calls tools, waiting for its calls' outcomes.
#[derive(Debug)]
struct Pending {
    turn: u32,
    slots: Vec<Slot>,
    /// The calls still admitted.
    batch: Batch,
    /// Admission: the next gate to ask.
    gate: usize,
    /// Dispatch: the next call of `batch` to start.
    next: usize,
    running: usize,
    /// False once nothing new may start (a fatal sibling, a failed hook, an interrupt).
    open: bool,
    /// The failure of a required after-tool hook, which fails the run once the batch is drained.
    failure: Option<RunError>,
    /// What interrupted the batch, and the end of its grace period.
    interrupted: Option<(Interrupt, Duration)>,
    /// True when the response had calls cut off by the output limit: the model is asked to make
    /// them again, which is not a loop.
    cut: bool,
    /// Calls to start again before any new one (indices into `batch.calls`): idempotent calls
    /// that were running when a durable run's process stopped.
    restart: Vec<usize>,
}

#[derive(Debug)]
struct Slot {
    call_id: Arc<str>,
    tool: Arc<str>,
    /// The arguments as the model sent them (parsed when they were JSON), for the record.
    arguments: Arc<Value>,
    /// How the call ended, once known.
    outcome: Option<CallOutcome>,
    /// True once the call was dispatched.
    started: bool,
}

/// A summary call under way: what it replaces and what it asks.
#[derive(Debug)]
struct SummaryJob {
    /// The older part ends here.
    cut: usize,
    /// The request's estimate before the compaction.
    tokens_before: u64,
    /// When the summary call was asked for.
    started: Duration,
    /// The one message the summary call reads.
    messages: Vec<Message>,
    settings: crate::model::ModelSettings,
}

#[derive(Debug)]
enum Closing {
    /// A finished run takes waiting steering messages, which continue it.
    Steering,
    /// Then waiting follow-ups, which continue it too.
    FollowUps,
    /// Then the output guardrails.
    CheckOutput,
    /// Then the finish hooks.
    Finalize,
}

#[derive(Debug)]
enum Phase {
    CheckInput,
    Steering,
    /// A turn begins: the tool source's answer first.
    ListTools,
    Prepare,
    CallModel,
    /// A summary call, compacting the older part of the transcript before the turn's model call.
    Summarize(Box<SummaryJob>),
    Review(Box<ModelResponse>),
    Admit(Box<Pending>),
    Run(Box<Pending>),
    /// After a tool turn: the stop conditions decide whether the run goes on.
    CheckStop,
    Closing(Closing),
    Done,
}

/// The state of one run.
pub struct RunMachine {
    cfg: Arc<AgentConfig>,
    limits: Limits,
    seams: Seams,
    ids: Arc<dyn IdSource>,
    run_id: Arc<str>,
    input_text: String,
    transcript: Vec<Message>,
    new_from: usize,
    phase: Phase,
    turn: u32,
    model_calls: u32,
    tool_calls_used: u32,
    tool_calls_run: u32,
    usage: Usage,
    cost: f64,
    /// Answers whose cost is unknown (the pricing had no price for their model), and the name
    /// of the first one's model: `cost` leaves them out.
    unpriced: (u32, Option<String>),
    records: Vec<ToolCallRecord>,
    /// The recent tool turns since the last reset, each as the range of its records, for the
    /// stuck-loop rule.
    recent_turns: Vec<(usize, usize)>,
    /// The limit that stopped the run while the model is asked for a last answer
    /// (`on_limit = "answer"`).
    wrap_up: Option<LimitHit>,
    /// The run's tools: the agent's, until its tool source's change (see [`Action::ListTools`]).
    tools: Arc<ToolCatalog>,
    /// True when a tool of the run is a poller (the stuck-loop rule looks it up only then).
    has_pollers: bool,
    /// The output limit of the next model call, raised once after a cut answer.
    raise_output: Option<u32>,
    /// True once the output limit was raised (it is raised once per run).
    output_raised: bool,
    output_retries_used: u32,
    retrying_output: bool,
    stop: Option<StopReason>,
    error: Option<RunError>,
    limit: Option<LimitHit>,
    output: Option<String>,
    structured: Option<Value>,
    record_events: bool,
    /// Buffered events, each with the turn it happened in.
    events: Vec<(u32, EventKind)>,
    /// When the last step ended.
    now: Duration,
    /// When the current model call started.
    called_at: Duration,
    /// The before-model hooks' changes to the current call, and how many messages they added to
    /// the end of the transcript for this call only.
    changes: RequestChanges,
    extra_messages: usize,
    /// Why the journal failed, once it did.
    journal_failure: Option<String>,
    /// The subagents the run's calls ran, and the turns and model calls they took (which count
    /// against this run's limits: one budget for the tree).
    subagents: Vec<crate::outcome::SubagentRun>,
    sub_turns: u32,
    sub_model_calls: u32,
    /// The provider's count of the last request's input, and how much of the transcript it
    /// covered: the context estimate adds only what came after.
    context_known: Option<(usize, u64)>,
    /// The estimate of the instructions and schemas, made once a run when first needed.
    fixed_estimate: std::sync::OnceLock<u64>,
    compactions: Vec<crate::compaction::CompactionRecord>,
    /// Every call id the run has seen: in the transcript it continued and in each response since
    /// (compaction may drop a call from the transcript, never from here), so that an id a
    /// provider repeats is renamed ([`RunMachine::assign_call_ids`]).
    call_ids: std::collections::HashSet<String>,
}

impl std::fmt::Debug for RunMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunMachine")
            .field("run_id", &self.run_id)
            .field("turn", &self.turn)
            .field("phase", &self.phase)
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

/// Everything a run is started with besides its agent.
pub struct RunStart {
    /// The run's id.
    pub run_id: Arc<str>,
    /// Where call ids come from when the model leaves one blank.
    pub ids: Arc<dyn IdSource>,
    /// The steps the agent has around its machine.
    pub seams: Seams,
    /// Limits for this run instead of the agent's.
    pub limits: Option<Limits>,
    /// The transcript the run continues.
    pub transcript: Vec<Message>,
    /// The new message, if any.
    pub input: Option<Message>,
    /// Buffer events for the driver to drain with [`RunMachine::drain_events`].
    pub observed: bool,
}

impl std::fmt::Debug for RunStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStart")
            .field("run_id", &self.run_id)
            .field("seams", &self.seams)
            .finish_non_exhaustive()
    }
}

impl RunMachine {
    /// A run of `cfg`.
    pub fn new(cfg: Arc<AgentConfig>, start: RunStart) -> Self {
        let RunStart {
            run_id,
            ids,
            seams,
            limits,
            mut transcript,
            input,
            observed,
        } = start;
        let new_from = transcript.len();
        let input_text = input.as_ref().map(Message::text).unwrap_or_default();
        if let Some(m) = input {
            transcript.push(m);
        }
        let limits = limits.unwrap_or_else(|| cfg.limits.clone());
        let call_ids = transcript_call_ids(&transcript);
        let tools = Arc::clone(cfg.tools.catalog());
        let has_pollers = tools.specs().iter().any(|s| s.poller);
        let mut m = RunMachine {
            cfg,
            limits,
            seams,
            ids,
            run_id,
            input_text,
            transcript,
            new_from,
            phase: Phase::Done,
            turn: 0,
            model_calls: 0,
            tool_calls_used: 0,
            tool_calls_run: 0,
            usage: Usage::default(),
            cost: 0.0,
            unpriced: (0, None),
            records: Vec::new(),
            recent_turns: Vec::new(),
            tools,
            has_pollers,
            wrap_up: None,
            raise_output: None,
            output_raised: false,
            output_retries_used: 0,
            retrying_output: false,
            stop: None,
            error: None,
            limit: None,
            output: None,
            structured: None,
            record_events: observed,
            events: Vec::new(),
            now: Duration::ZERO,
            called_at: Duration::ZERO,
            changes: RequestChanges::default(),
            extra_messages: 0,
            journal_failure: None,
            subagents: Vec::new(),
            sub_turns: 0,
            sub_model_calls: 0,
            context_known: None,
            fixed_estimate: std::sync::OnceLock::new(),
            compactions: Vec::new(),
            call_ids,
        };
        if let Err(message) = m.limits.check() {
            m.fail(RunError::Other {
                message: format!("invalid limits: {message}"),
            });
        } else if m.seams.input_guardrails {
            m.phase = Phase::CheckInput;
        } else {
            m.need_model();
        }
        m
    }

    /// Takes the buffered events, each with the turn it happened in.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, (u32, EventKind)> {
        self.events.drain(..)
    }

    fn emit(&mut self, kind: impl FnOnce() -> EventKind) {
        if self.record_events {
            self.events.push((self.turn, kind()));
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

    /// The run's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The run's deadline (time since its start), if it has one.
    pub fn deadline(&self) -> Option<Duration> {
        self.limits.timeout
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

    /// True once the run has stopped.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
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

    /// The records so far.
    pub fn records(&self) -> &[ToolCallRecord] {
        &self.records
    }

    /// The run as the stop conditions see it.
    pub fn state(&self) -> crate::hooks::RunState<'_> {
        crate::hooks::RunState {
            turn: self.turn,
            model_calls: self.model_calls,
            tool_calls_run: self.tool_calls_run,
            usage: self.usage,
            cost_usd: self.cost,
            transcript: &self.transcript,
            tool_calls: &self.records,
        }
    }

    /// The run's input, as the input guardrails see it.
    pub fn input_text(&self) -> &str {
        &self.input_text
    }

    /// [`RunMachine::feed`], keeping the step in `log` first. A response's call ids are made
    /// unique in the run before it is kept (a blank id drawn from the run's id source, an id an
    /// earlier call of the run used renamed `ID_2`, ...), so that a replay of the log needs no
    /// id source of its own.
    pub fn feed_logged(&mut self, mut step: Step, log: &mut Vec<Step>) {
        if let Input::ModelResponded { response, .. } = &mut step.input {
            self.assign_call_ids(response);
        }
        log.push(step.clone());
        self.feed(step);
    }

    /// Makes every call id of a response unique within the run: a blank id is drawn from the
    /// run's id source, and an id an earlier response of the run (or the transcript it
    /// continued) already used is renamed `ID_2` (`ID_3`, ... the first one free), the same new
    /// id for each call that repeats it. Providers reject a transcript with a repeated id, a
    /// stored session holding one reads as damaged, and an approval must never be found again
    /// under an old call's id. The rename depends only on the run's ids so far, so a replay
    /// renames alike; two calls of one response sharing an id keep sharing it (that decision is
    /// refused whole, as before). Ids too long to keep are left for that refusal too.
    pub(crate) fn assign_call_ids(&self, response: &mut ModelResponse) {
        let calls = || {
            response
                .message
                .tool_calls
                .iter()
                .chain(&response.cut_calls)
        };
        let blank = calls().any(|c| c.call_id.trim().is_empty());
        let repeated = calls().any(|c| self.call_ids.contains(&c.call_id));
        if !blank && !repeated {
            return;
        }
        let all = response
            .message
            .tool_calls
            .iter_mut()
            .chain(response.cut_calls.iter_mut());
        let mut calls: Vec<&mut crate::message::ToolCall> = all.collect();
        for call in calls.iter_mut() {
            if call.call_id.trim().is_empty() {
                call.call_id = self.ids.call_id();
            }
        }
        let mut taken: std::collections::HashSet<String> =
            calls.iter().map(|c| c.call_id.clone()).collect();
        let mut renamed: std::collections::HashMap<String, String> =
            std::collections::HashMap::new();
        for call in calls {
            if call.call_id.len() > MAX_CALL_ID_LEN || !self.call_ids.contains(&call.call_id) {
                continue;
            }
            let new = match renamed.get(&call.call_id) {
                Some(new) => new.clone(),
                None => {
                    let new = fresh_call_id(&call.call_id, |id| {
                        self.call_ids.contains(id) || taken.contains(id)
                    });
                    taken.insert(new.clone());
                    renamed.insert(call.call_id.clone(), new.clone());
                    new
                }
            };
            call.call_id = new;
        }
    }

    /// Notes the call ids of a response the machine took, after [`RunMachine::assign_call_ids`].
    fn note_call_ids(&mut self, response: &ModelResponse) {
        for call in response
            .message
            .tool_calls
            .iter()
            .chain(&response.cut_calls)
        {
            self.call_ids.insert(call.call_id.clone());
        }
    }

    /// The step to take now.
    pub fn action(&self) -> Action<'_> {
        match &self.phase {
            Phase::CheckInput => Action::CheckInput(&self.input_text),
            Phase::Steering => Action::TakeMessages { follow_up: false },
            Phase::ListTools => Action::ListTools,
            Phase::Prepare => Action::PrepareRequest,
            Phase::CallModel => Action::CallModel(self.request()),
            Phase::Summarize(job) => Action::Summarize(ModelRequest {
                instructions: Some(crate::compaction::SUMMARY_INSTRUCTIONS),
                messages: &job.messages,
                tools: &[],
                output_schema: None,
                settings: &job.settings,
            }),
            Phase::Review(r) => Action::Review(r),
            Phase::Admit(p) => Action::Admit {
                gate: p.gate,
                batch: &p.batch,
            },
            Phase::Run(p) => self.run_action(p),
            Phase::CheckStop => Action::CheckStop,
            Phase::Closing(Closing::Steering) => Action::TakeMessages { follow_up: false },
            Phase::Closing(Closing::FollowUps) => Action::TakeMessages { follow_up: true },
            Phase::Closing(Closing::CheckOutput) => {
                Action::CheckOutput(self.output.as_deref().unwrap_or_default())
            }
            Phase::Closing(Closing::Finalize) => Action::Finalize,
            Phase::Done => Action::Finish,
        }
    }

    fn run_action<'a>(&'a self, p: &'a Pending) -> Action<'a> {
        if let Some((_, until)) = p.interrupted {
            return Action::Drain { until };
        }
        let cap = if p.batch.sequential {
            1
        } else {
            self.limits.max_concurrency.max(1)
        };
        let next = p.restart.first().copied().unwrap_or(p.next);
        if p.open
            && p.running < cap
            && let Some(call) = p.batch.calls.get(next)
        {
            return Action::StartCall(call);
        }
        Action::AwaitCalls { retries: p.open }
    }

    /// The request of the model call the machine asks for. It borrows the transcript.
    fn request(&self) -> ModelRequest<'_> {
        ModelRequest {
            instructions: self
                .changes
                .instructions
                .as_deref()
                .or(self.cfg.instructions.as_deref()),
            messages: &self.transcript,
            tools: self.tools.specs(),
            output_schema: self.cfg.output_schema.as_ref().map(|s| s.value()),
            settings: self.changes.settings.as_ref().unwrap_or(&self.cfg.settings),
        }
    }

    /// Reports the result of the step [`RunMachine::action`] asked for. An input that does not
    /// answer the step asked for is a bug in the driver: the run fails instead of guessing.
    pub fn feed(&mut self, step: Step) {
        self.now = self.now.max(step.at);
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match step.input {
            Input::Interrupted { by } => self.on_interrupt(phase, by),
            input => self.apply(phase, input),
        }
    }

    fn apply(&mut self, phase: Phase, input: Input) {
        match (phase, input) {
            (phase, Input::Restarted) => self.on_restarted(phase),
            (phase, Input::JournalFailed { message }) => self.on_journal_failed(phase, message),
            (Phase::CheckInput, Input::Checked { tripped }) => match tripped {
                Some(trip) => self.trip(trip),
                None => self.need_model(),
            },
            (Phase::Steering, Input::Messages { messages, .. }) => {
                self.deliver(messages, false);
                self.begin_model_call();
            }
            (Phase::ListTools, Input::ToolsListed { tools }) => {
                if let Some(specs) = tools {
                    self.switch_tools(specs);
                }
                self.ask_model();
            }
            (Phase::Prepare, Input::Prepared { changes, failures }) => {
                if let Some(e) = self.hook_failures(failures) {
                    self.fail(e);
                    return;
                }
                if !changes.extra_messages.is_empty() {
                    self.extra_messages = changes.extra_messages.len();
                    self.transcript
                        .extend(changes.extra_messages.iter().cloned());
                }
                self.changes = changes;
                self.called_at = self.now;
                self.enter_call_model();
            }
            (
                Phase::CallModel,
                Input::ModelResponded {
                    response,
                    cost,
                    failures,
                },
            ) => {
                self.end_model_call();
                self.observe_failures(failures);
                self.on_model_response(response, cost);
            }
            (
                Phase::Summarize(job),
                Input::ModelResponded {
                    response,
                    cost,
                    failures,
                },
            ) => {
                self.observe_failures(failures);
                self.on_summary(*job, Ok((*response, cost)));
            }
            (Phase::Summarize(job), Input::ModelFailed { error }) => {
                // Not the run's failure: the compaction's record says why it fell back.
                self.on_summary(*job, Err(format!("{} ({})", error.message, error.code())));
            }
            (Phase::CallModel, Input::ModelFailed { error }) => {
                self.end_model_call();
                self.emit(|| EventKind::ModelError {
                    code: error.code().to_owned(),
                    message: error.message.clone(),
                });
                match self.wrap_up {
                    // The last answer failed: the limit still names the stop.
                    Some(hit) => self.finish(limit_stop(hit.limit)),
                    None => self.fail(RunError::Model(error)),
                }
            }
            (Phase::Review(r), Input::Reviewed { failures, reask }) => {
                let response = *r;
                if let Some(e) = self.hook_failures(failures) {
                    // The response stays in the transcript, each of its calls answered, so the
                    // conversation can be continued.
                    self.answer_all(response.message, &CallOutcome::not_run());
                    self.fail(e);
                    return;
                }
                self.decide(response, reask);
            }
            (Phase::CheckStop, Input::StopChecked { stop, failures }) => {
                if let Some(e) = self.hook_failures(failures) {
                    self.fail(e);
                    return;
                }
                match stop {
                    Some(by) => {
                        self.emit(|| EventKind::StopConditionMet { by });
                        self.output = self.last_assistant_text();
                        self.finish(StopReason::Terminated);
                    }
                    None => self.need_model(),
                }
            }
            (Phase::Admit(p), Input::Admitted { verdicts, failures }) => {
                self.on_admitted(p, verdicts, failures)
            }
            (Phase::Run(p), Input::CallStarted { position }) => self.on_started(p, position),
            (
                Phase::Run(p),
                Input::CallFinished {
                    position,
                    outcome,
                    failures,
                },
            ) => self.on_finished(p, position, outcome, failures),
            (Phase::Run(mut p), Input::GraceOver) => {
                for slot in p.slots.iter_mut() {
                    if slot.started && slot.outcome.is_none() {
                        slot.outcome = Some(CallOutcome::cancelled());
                    }
                }
                p.running = 0;
                self.end_batch(p);
            }
            (Phase::Closing(Closing::Steering), Input::Messages { messages, .. }) => {
                if messages.is_empty() {
                    self.phase = Phase::Closing(Closing::FollowUps);
                } else {
                    self.reopen(messages, false);
                }
            }
            (Phase::Closing(Closing::FollowUps), Input::Messages { messages, .. }) => {
                if messages.is_empty() {
                    self.after_follow_ups();
                } else {
                    self.reopen(messages, true);
                }
            }
            (Phase::Closing(Closing::CheckOutput), Input::Checked { tripped }) => match tripped {
                Some(trip) => self.trip(trip),
                None => self.conclude_hooks(),
            },
            (Phase::Closing(Closing::Finalize), Input::Finalized { failures }) => {
                let mut first = None;
                for f in failures {
                    if f.role == HookRole::Required {
                        first.get_or_insert(RunError::Hook {
                            hook: f.hook,
                            message: format!("{}: {}", f.stage, f.message),
                        });
                    } else {
                        self.emit(|| EventKind::HookFailed {
                            hook: f.hook,
                            stage: f.stage,
                            message: f.message,
                        });
                    }
                }
                if let Some(e) = first {
                    self.stop = Some(StopReason::Failed);
                    self.error = Some(e);
                }
                self.phase = Phase::Done;
            }
            (phase, input) => {
                let message = format!(
                    "the driver reported {} when the machine asked for {}",
                    input_name(&input),
                    phase_name(&phase)
                );
                self.phase = phase;
                self.fail(RunError::Other { message });
            }
        }
    }

    /// A pricing function that failed is reported; the call counts as unpriced.
    fn observe_failures(&mut self, failures: Vec<HookFailure>) {
        let _ = self.hook_failures(
            failures
                .into_iter()
                .map(|f| HookFailure {
                    role: HookRole::Observer,
                    ..f
                })
                .collect(),
        );
    }

    /// Hook failures: observers' are reported; the first required one's is returned, for the
    /// caller to fail the run with.
    fn hook_failures(&mut self, failures: Vec<HookFailure>) -> Option<RunError> {
        let mut first = None;
        for f in failures {
            match f.role {
                HookRole::Required => {
                    first.get_or_insert(if f.stage == "gate" {
                        RunError::Other { message: f.message }
                    } else {
                        RunError::Hook {
                            hook: f.hook,
                            message: format!("{}: {}", f.stage, f.message),
                        }
                    });
                }
                HookRole::Observer => self.emit(|| EventKind::HookFailed {
                    hook: f.hook,
                    stage: f.stage,
                    message: f.message,
                }),
            }
        }
        first
    }

    fn deliver(&mut self, messages: Vec<Message>, follow_up: bool) {
        if messages.is_empty() {
            return;
        }
        // A new user message starts the stuck-loop count again.
        self.recent_turns.clear();
        let count = messages.len();
        self.transcript.extend(messages);
        self.emit(|| EventKind::MessagesDelivered { count, follow_up });
    }

    /// Waiting messages continue a run that would otherwise finish; the limits still apply.
    fn reopen(&mut self, messages: Vec<Message>, follow_up: bool) {
        self.deliver(messages, follow_up);
        self.stop = None;
        self.output = None;
        self.structured = None;
        self.begin_model_call();
    }

    fn after_follow_ups(&mut self) {
        if self.seams.output_guardrails {
            self.phase = Phase::Closing(Closing::CheckOutput);
        } else {
            self.conclude_hooks();
        }
    }

    fn conclude_hooks(&mut self) {
        self.phase = if self.seams.hooks {
            Phase::Closing(Closing::Finalize)
        } else {
            Phase::Done
        };
    }

    fn trip(&mut self, trip: Trip) {
        let Trip { name, message } = trip;
        self.error = Some(RunError::Guardrail {
            name: name.clone(),
            message: message.clone(),
        });
        self.finish(StopReason::Guardrail { name, message });
    }

    /// The next step needs the model: steering first, where the run takes it.
    fn need_model(&mut self) {
        if self.seams.steering {
            self.phase = Phase::Steering;
        } else {
            self.begin_model_call();
        }
    }

    fn begin_model_call(&mut self) {
        if let Some(hit) = self.check_before_model_call() {
            self.stop_on_limit(hit);
            return;
        }
        if !self.retrying_output {
            self.turn += 1;
            self.emit(|| EventKind::TurnStarted);
            if self.seams.dynamic_tools {
                // The tools a turn sees are settled at its start, never in the middle of it.
                self.phase = Phase::ListTools;
                return;
            }
        }
        self.ask_model();
    }

    /// The turn's model call, after a compaction when the conversation needs one.
    fn ask_model(&mut self) {
        if !self.compact() {
            self.count_model_call();
        }
    }

    /// The tool source's tools changed: from now on the run's tools are the agent's own and
    /// these. A spec that fails the checks of a registration (a bad name or schema, a name
    /// taken) is left out, and said so; calls of a tool that went away are unknown-tool errors
    /// the model reads.
    #[cold]
    #[inline(never)]
    fn switch_tools(&mut self, specs: Vec<crate::tool::ToolSpec>) {
        let mut tools = self.cfg.tools.prefix(self.cfg.own_tools);
        let mut refused = Vec::new();
        for spec in specs {
            let name = spec.name.clone();
            if let Err(e) = tools.add(spec) {
                refused.push(format!("{name}: {e}"));
            }
        }
        let before = &self.tools;
        let added: Vec<String> = tools
            .names()
            .filter(|n| before.index_of(n).is_none())
            .map(str::to_owned)
            .collect();
        let removed: Vec<String> = before
            .names()
            .filter(|n| tools.index_of(n).is_none())
            .map(str::to_owned)
            .collect();
        let updated: Vec<String> = tools
            .specs()
            .iter()
            .filter(|s| {
                before
                    .index_of(&s.name)
                    .and_then(|i| before.spec(i))
                    .is_some_and(|old| old != *s)
            })
            .map(|s| s.name.clone())
            .collect();
        if added.is_empty() && removed.is_empty() && updated.is_empty() && refused.is_empty() {
            return;
        }
        self.has_pollers = tools.specs().iter().any(|s| s.poller);
        self.tools = Arc::new(tools);
        // The instructions' and schemas' estimate is made again for the new schemas.
        self.fixed_estimate = std::sync::OnceLock::new();
        self.emit(|| EventKind::ToolsChanged {
            added,
            removed,
            updated,
            refused,
        });
    }

    /// The run's tools now: the agent's, or those its tool source last listed.
    pub fn tools(&self) -> &Arc<ToolCatalog> {
        &self.tools
    }

    /// A model call is counted and asked for: the before-model hooks first, when there are any.
    fn count_model_call(&mut self) {
        self.model_calls += 1;
        self.called_at = self.now;
        if self.seams.hooks {
            self.phase = Phase::Prepare;
        } else {
            self.enter_call_model();
        }
    }

    /// The model call itself: the machine's own changes to this call's settings go on top of the
    /// hooks' (tools off for a last answer, a raised output limit after a cut answer).
    fn enter_call_model(&mut self) {
        let raise = self.raise_output.take();
        if self.wrap_up.is_some() || raise.is_some() {
            let mut settings = self
                .changes
                .settings
                .take()
                .unwrap_or_else(|| self.cfg.settings.clone());
            if self.wrap_up.is_some() {
                settings.tool_choice = Some(crate::model::ToolChoice::None);
            }
            if let Some(n) = raise {
                settings.max_tokens = Some(n);
            }
            self.changes.settings = Some(settings);
        }
        self.phase = Phase::CallModel;
    }

    /// The text of the last assistant message, when it has any.
    fn last_assistant_text(&self) -> Option<String> {
        self.transcript.iter().rev().find_map(|m| match m {
            Message::Assistant(a) if !a.text.trim().is_empty() => Some(a.text.clone()),
            Message::Assistant(_) => None,
            _ => None,
        })
    }

    /// Takes back what the before-model hooks added for this call only.
    fn end_model_call(&mut self) {
        if self.extra_messages > 0 {
            let keep = self.transcript.len().saturating_sub(self.extra_messages);
            self.transcript.truncate(keep);
            self.extra_messages = 0;
        }
        self.changes = RequestChanges::default();
    }

    fn check_before_model_call(&self) -> Option<LimitHit> {
        let l = &self.limits;
        let now = self.now;
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
        if self.wrap_up.is_some() {
            // The last answer after a limit is the one call past it.
            return None;
        }
        if !self.retrying_output
            && let Some(hit) = self.turn_hit()
        {
            return Some(hit);
        }
        self.model_call_hit().or_else(|| self.spent_hit())
    }

    /// The calls of the batch running now (none outside one).
    pub(crate) fn batch_calls(&self) -> &[AdmittedCall] {
        match &self.phase {
            Phase::Run(p) => &p.batch.calls,
            _ => &[],
        }
    }

    /// What is left of the run's budget: what its subagents may draw on.
    pub(crate) fn remaining(&self) -> crate::budget::Pool {
        let l = &self.limits;
        crate::budget::Pool {
            turns: Limits::bound(l.max_turns)
                .map(|m| m.saturating_sub(self.turn.saturating_add(self.sub_turns))),
            model_calls: Limits::bound(l.max_model_calls)
                .map(|m| m.saturating_sub(self.model_calls.saturating_add(self.sub_model_calls))),
            tool_calls: Limits::bound(l.max_tool_calls)
                .map(|m| m.saturating_sub(self.tool_calls_used)),
            tokens: l
                .max_tokens
                .filter(|&n| n > 0)
                .map(|m| m.saturating_sub(self.usage.total_tokens())),
            cost: l.max_cost_usd.map(|m| (m - self.cost).max(0.0)),
            waiting: 0,
        }
    }

    /// The turn limit, when this turn is the last allowed.
    pub(super) fn turn_hit(&self) -> Option<LimitHit> {
        let max = Limits::bound(self.limits.max_turns)?;
        let turns = self.turn.saturating_add(self.sub_turns);
        (turns >= max).then(|| hit(LimitKind::Turns, max.into(), turns.into(), 1.0))
    }

    /// The model-call limit, when no model call is left.
    pub(super) fn model_call_hit(&self) -> Option<LimitHit> {
        let max = Limits::bound(self.limits.max_model_calls)?;
        let calls = self.model_calls.saturating_add(self.sub_model_calls);
        (calls >= max).then(|| hit(LimitKind::ModelCalls, max.into(), calls.into(), 1.0))
    }

    /// The token or cost budget, when it is spent.
    pub(super) fn spent_hit(&self) -> Option<LimitHit> {
        let l = &self.limits;
        if let Some(max) = l.max_tokens.filter(|&n| n > 0)
            && self.usage.total_tokens() >= max
        {
            let used = self.usage.total_tokens() as f64;
            return Some(hit(LimitKind::Tokens, max as f64, used, 0.0));
        }
        match l.max_cost_usd {
            // An answer of unknown cost: the budget can no longer be held, so nothing more is
            // spent (see `stop_on_limit`).
            Some(max) if self.cost >= max || self.unpriced.0 > 0 => {
                Some(hit(LimitKind::Cost, max, self.cost, 0.0))
            }
            _ => None,
        }
    }

    /// True when a limit of this kind asks the model for a last answer instead of stopping.
    pub(super) fn answers_on(&self, kind: LimitKind) -> bool {
        self.limits.on_limit == OnLimit::Answer
            && self.wrap_up.is_none()
            && !matches!(kind, LimitKind::ModelCalls | LimitKind::Deadline)
            // A last answer of unknown cost would be spent unmetered too.
            && !(kind == LimitKind::Cost && self.unpriced.0 > 0)
    }

    /// A limit stops the run: at once, or (`on_limit = "answer"`) after one last model call with
    /// tools off. Every call in the transcript is answered before this is called.
    fn stop_on_limit(&mut self, hit: LimitHit) {
        let reason = limit_stop(hit.limit);
        if self.answers_on(hit.limit) {
            self.limit = Some(hit);
            self.error = Some(RunError::LimitReached(hit));
            self.emit(|| EventKind::LimitReached { limit: hit });
            self.wrap_up = Some(hit);
            self.recent_turns.clear();
            self.transcript.push(Message::user(format!(
                "The run has reached its {} limit: no more tools can run. Give your final answer now, from what you have so far.",
                hit.limit
            )));
            self.count_model_call();
            return;
        }
        if let Some(first) = self.wrap_up {
            // Something stopped the last answer: the first limit still names the stop.
            self.finish(limit_stop(first.limit));
            return;
        }
        self.limit = Some(hit);
        self.error = Some(match hit.limit {
            LimitKind::Deadline => RunError::Deadline {
                elapsed_ms: self.now.as_millis() as u64,
            },
            LimitKind::Cost if self.unpriced.0 > 0 => RunError::CostUnknown {
                model: self.unpriced.1.clone().unwrap_or_default(),
            },
            _ => RunError::LimitReached(hit),
        });
        self.emit(|| EventKind::LimitReached { limit: hit });
        self.finish(reason);
    }

    /// Stops the run. Whatever step it stops in, every tool call in the transcript keeps exactly
    /// one result: a batch still waiting is folded first, its calls answered "not run".
    fn finish(&mut self, reason: StopReason) {
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Admit(p) | Phase::Run(p) => {
                self.fold(*p);
                if self.stop.is_some() {
                    // The batch decided the stop itself (a fatal failure).
                    return;
                }
            }
            Phase::Review(r) => self.answer_all(r.message, &CallOutcome::not_run()),
            Phase::CallModel | Phase::Prepare => self.end_model_call(),
            _ => {}
        }
        let finished = reason == StopReason::Finished;
        self.stop = Some(reason);
        if finished && self.seams.steering {
            self.phase = Phase::Closing(Closing::Steering);
        } else if finished {
            self.after_follow_ups();
        } else {
            self.conclude_hooks();
        }
    }

    fn fail(&mut self, error: RunError) {
        self.error = Some(error);
        self.finish(StopReason::Failed);
    }

    fn on_interrupt(&mut self, phase: Phase, by: Interrupt) {
        match phase {
            Phase::Run(mut p) => {
                if p.interrupted.is_none() {
                    p.interrupted = Some((by, self.now.saturating_add(self.limits.grace_period)));
                }
                p.open = false;
                if p.running == 0 {
                    self.end_batch(p);
                } else {
                    self.phase = Phase::Run(p);
                }
            }
            Phase::Done | Phase::Closing(Closing::Finalize) => {
                // Nothing is left to interrupt.
                self.phase = phase;
                if matches!(self.phase, Phase::Closing(_)) {
                    self.phase = Phase::Done;
                }
            }
            phase => {
                self.phase = phase;
                self.stop_interrupted(by);
            }
        }
    }

    /// A new process goes on with the run. Only a batch that was running holds anything of the
    /// old process: its calls that were running are started again when their tool is
    /// idempotent and the batch was still open, and answered as interrupted otherwise. Every
    /// other step is simply asked for again.
    // Rare steps, kept out of the hot path's code.
    #[cold]
    #[inline(never)]
    fn on_journal_failed(&mut self, phase: Phase, message: String) {
        self.journal_failure = Some(message);
        self.on_interrupt(phase, Interrupt::JournalFailed);
    }

    #[cold]
    #[inline(never)]
    fn on_restarted(&mut self, phase: Phase) {
        let Phase::Run(mut p) = phase else {
            self.phase = phase;
            return;
        };
        for (i, call) in p.batch.calls.iter().enumerate() {
            let Some(slot) = p
                .slots
                .get_mut(call.position)
                .filter(|s| s.started && s.outcome.is_none())
            else {
                continue;
            };
            p.running = p.running.saturating_sub(1);
            let idempotent = self.tools.spec(call.index).is_some_and(|s| s.idempotent);
            if idempotent && p.open {
                slot.started = false;
                p.restart.push(i);
            } else {
                self.emit(|| EventKind::ToolFinished {
                    call_id: slot.call_id.to_string(),
                    tool: slot.tool.to_string(),
                    outcome: CallOutcome::interrupted(),
                });
                slot.outcome = Some(CallOutcome::interrupted());
            }
        }
        if p.running == 0 && (!p.open || (p.next >= p.batch.calls.len() && p.restart.is_empty())) {
            self.end_batch(p);
        } else {
            self.phase = Phase::Run(p);
        }
    }

    fn stop_interrupted(&mut self, by: Interrupt) {
        match by {
            Interrupt::Cancelled => {
                self.error = Some(RunError::Cancelled);
                self.finish(StopReason::Cancelled);
            }
            Interrupt::Suspended => self.finish(StopReason::Suspended),
            Interrupt::JournalFailed => {
                let message = self
                    .journal_failure
                    .take()
                    .unwrap_or_else(|| "a step could not be written".into());
                self.fail(RunError::Journal { message });
            }
            Interrupt::Deadline => {
                let bound = self.limits.timeout.unwrap_or(self.now);
                self.stop_on_limit(hit(
                    LimitKind::Deadline,
                    bound.as_millis() as f64,
                    self.now.as_millis() as f64,
                    0.0,
                ));
            }
        }
    }

    /// A batch is over (every started call answered): fold it and decide what follows: the
    /// stuck-loop rule, then the stop conditions, then the next model call.
    fn end_batch(&mut self, p: Box<Pending>) {
        let failure = p.failure.clone();
        let interrupted = p.interrupted.map(|(by, _)| by);
        let first = self.records.len();
        let cut = p.cut;
        self.fold(*p);
        if let Some(e) = failure {
            self.fail(e);
            return;
        }
        if self.stop.is_some() {
            return;
        }
        if let Some(by) = interrupted {
            self.stop_interrupted(by);
            return;
        }
        if !cut && let Some(h) = self.stuck(first) {
            self.stop_on_limit(h);
            return;
        }
        if self.seams.hooks {
            self.phase = Phase::CheckStop;
        } else {
            self.need_model();
        }
    }

    /// The outcome so far, as the finish hooks see it.
    pub fn outcome(&self, elapsed: Duration) -> RunOutcome {
        RunOutcome {
            run_id: self.run_id.to_string(),
            stop_reason: self.stop.clone().unwrap_or(StopReason::Failed),
            output: self.output.clone(),
            structured_output: self.structured.clone(),
            transcript: self.transcript.clone(),
            new_messages_from: self.new_from,
            usage: self.usage,
            cost_usd: self.cost,
            unpriced_model_calls: self.unpriced.0,
            turns: self.turn,
            model_calls: self.model_calls.saturating_add(self.sub_model_calls),
            tool_calls_run: self.tool_calls_run,
            tool_calls: self.records.clone(),
            limit: self.limit,
            error: self.error.clone(),
            duration: elapsed,
            subagents: self.subagents.clone(),
            compactions: self.compactions.clone(),
        }
    }

    /// The outcome. Call after [`Action::Finish`]; `elapsed` is the run's duration.
    pub fn into_outcome(self, elapsed: Duration) -> RunOutcome {
        RunOutcome {
            run_id: self.run_id.to_string(),
            stop_reason: self.stop.unwrap_or(StopReason::Failed),
            output: self.output,
            structured_output: self.structured,
            transcript: self.transcript,
            new_messages_from: self.new_from,
            usage: self.usage,
            cost_usd: self.cost,
            unpriced_model_calls: self.unpriced.0,
            turns: self.turn,
            model_calls: self.model_calls.saturating_add(self.sub_model_calls),
            tool_calls_run: self.tool_calls_run,
            tool_calls: self.records,
            limit: self.limit,
            error: self.error,
            duration: elapsed,
            subagents: self.subagents,
            compactions: self.compactions,
        }
    }
}

/// The stop reason of a limit.
fn limit_stop(kind: LimitKind) -> StopReason {
    match kind {
        LimitKind::Turns => StopReason::MaxTurns,
        LimitKind::ToolCalls => StopReason::MaxToolCalls,
        LimitKind::ModelCalls => StopReason::MaxModelCalls,
        LimitKind::Tokens | LimitKind::Cost => StopReason::Budget,
        LimitKind::Deadline => StopReason::Deadline,
        LimitKind::StuckLoop => StopReason::StuckLoop,
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

fn phase_name(phase: &Phase) -> &'static str {
    match phase {
        Phase::CheckInput => "an input check",
        Phase::Steering => "steering messages",
        Phase::ListTools => "the tool source's tools",
        Phase::Prepare => "the before-model hooks",
        Phase::CallModel => "a model call",
        Phase::Summarize(_) => "a summary call",
        Phase::Review(_) => "the after-model hooks",
        Phase::Admit(_) => "an admission verdict",
        Phase::Run(_) => "a batch's calls",
        Phase::CheckStop => "the stop conditions",
        Phase::Closing(Closing::Steering | Closing::FollowUps) => "waiting messages",
        Phase::Closing(Closing::CheckOutput) => "an output check",
        Phase::Closing(Closing::Finalize) => "the finish hooks",
        Phase::Done => "nothing (the run is over)",
    }
}

fn input_name(input: &Input) -> &'static str {
    match input {
        Input::Checked { .. } => "a guardrail verdict",
        Input::Messages { .. } => "messages",
        Input::ToolsListed { .. } => "the tool source's tools",
        Input::Prepared { .. } => "request changes",
        Input::ModelResponded { .. } => "a model response",
        Input::ModelFailed { .. } => "a model failure",
        Input::Reviewed { .. } => "a review",
        Input::Admitted { .. } => "admission verdicts",
        Input::CallStarted { .. } => "a call start",
        Input::CallFinished { .. } => "a call's outcome",
        Input::GraceOver => "the end of a grace period",
        Input::StopChecked { .. } => "the stop conditions' verdict",
        Input::Interrupted { .. } => "an interrupt",
        Input::Restarted => "a restart",
        Input::JournalFailed { .. } => "a journal failure",
        Input::Finalized { .. } => "the finish hooks' result",
    }
}

/// The call ids a transcript holds: its calls' and its results'.
fn transcript_call_ids(transcript: &[Message]) -> std::collections::HashSet<String> {
    let mut ids = std::collections::HashSet::new();
    for message in transcript {
        match message {
            Message::Assistant(a) => ids.extend(a.tool_calls.iter().map(|c| c.call_id.clone())),
            Message::Tool(r) => {
                ids.insert(r.call_id.to_string());
            }
            Message::User { .. } => {}
        }
    }
    ids
}

/// `id_2`, `id_3`, ...: the first one not `taken`, at most [`MAX_CALL_ID_LEN`] bytes long (the
/// original shortened at a character boundary so that the suffix fits). The characters added
/// are ones every provider accepts in an id (Anthropic allows `[a-zA-Z0-9_-]`).
fn fresh_call_id(id: &str, taken: impl Fn(&str) -> bool) -> String {
    (2u64..)
        .map(|n| {
            let suffix = format!("_{n}");
            let mut keep = MAX_CALL_ID_LEN.saturating_sub(suffix.len()).min(id.len());
            while !id.is_char_boundary(keep) {
                keep -= 1;
            }
            format!("{}{suffix}", id.get(..keep).unwrap_or_default())
        })
        .find(|candidate| !taken(candidate))
        .unwrap_or_default()
}
