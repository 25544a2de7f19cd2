//! The rules of the loop, as a state machine that does no I/O and has no clock of its own.
//!
//! A driver asks [`RunMachine::action`] what to do, does it, and reports the result with
//! [`RunMachine::feed`]; the machine decides everything that follows. Validation, limits, budgets,
//! stuck-loop detection, admission verdicts, hook and guardrail verdicts, steering, dispatch,
//! draining, and stop reasons all live here; a driver holds no rule. Time and ids are injected, so
//! feeding the same [`Step`]s to a fresh machine reproduces a run exactly (see
//! [`crate::driver::replay()`]).
//!
//! - `mod.rs`: the state (its fields grouped: counters, the ending, what is kept for the
//!   outcome, output retries, the context estimate), `new`, `action` and `feed`/`apply`.
//! - `admit.rs`: a model's answer: refused, filtered or cut answers, cut calls, known tools,
//!   arguments, the budgets and the last turn, the stuck-loop rule (judged after each tool turn on
//!   calls and results), output schemas and tool panics.
//! - `batch.rs`: an admitted batch: the gates' verdicts, dispatch, each outcome judged.
//! - `call_ids.rs`: every call id made unique within the run.
//! - `closing.rs`: hook failures, steering and follow-ups, guardrail trips, the stop conditions
//!   and the finish hooks.
//! - `compact.rs`: compaction before a model call (the summary call, dropped tool results).
//! - `fold.rs`: outcomes into the transcript and the records.
//! - `handoff.rs`: a hand-off alone in its turn, the conversation it passes on, the run's end.
//! - `interrupt.rs`: cancel, deadline and suspension; a restart; a failed journal.
//! - `limits.rs`: what each limit lets happen next, what is left for subagents, the stop on one.
//! - `model_call.rs`: the turn's model call and its request.
//! - `step.rs`: the actions and inputs.
//! - `tools.rs`: the run's tools when its tool source changes them.

mod admit;
mod batch;
mod call_ids;
mod closing;
mod compact;
mod fold;
mod handoff;
mod interrupt;
mod limits;
mod model_call;
mod step;
mod tools;
mod unread_call;

use call_ids::transcript_call_ids;
use limits::{hit, limit_stop};
use step::{input_name, phase_name};

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

pub use step::{
    Action, AdmittedCall, Batch, BatchCalls, HookFailure, HookStage, Input, Interrupt, Seams,
    Spent, Step, Trip, Verdict, model_calls,
};

use crate::config::AgentConfig;
use crate::error::RunError;
use crate::event::EventKind;
use crate::hooks::RequestChanges;
use crate::ids::IdSource;
use crate::limits::{LimitHit, Limits};
use crate::message::Message;
use crate::model::{ModelRequest, ModelResponse, Usage};
use crate::outcome::{CallOutcome, RunOutcome, StopReason, ToolCallRecord, codes};
use crate::tool::ToolCatalog;

/// The longest call id accepted.
pub const MAX_CALL_ID_LEN: usize = 256;

/// A model decision that calls tools, waiting for its calls' outcomes.
#[derive(Debug)]
struct Pending {
    turn: u32,
    slots: Slots,
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
    /// True once a suspension's drain was reached by the deadline or a cancel: from then on
    /// every call still running is told to stop and has the grace period, as in other drains.
    stopping: bool,
    /// True when the response had calls cut off by the output limit: the model is asked to make
    /// them again, which is not a loop.
    cut: bool,
    /// Calls to start again before any new one (indices into `batch.calls`): idempotent calls
    /// that were running when a durable run's process stopped.
    restart: Vec<usize>,
}

/// A batch's slots, one a call, inline in its box up to four calls (most responses call a few
/// tools): one allocation a tool turn fewer, and nothing kept once the batch is folded.
type Slots = smallvec::SmallVec<[Slot; 4]>;

#[derive(Debug)]
struct Slot {
    call_id: Arc<str>,
    tool: Arc<str>,
    /// The arguments as the model sent them (parsed when they were JSON), for the record.
    arguments: crate::tool::Arguments,
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

/// Messages that arrived while the run went on (steering) or as it was finishing (steering or
/// follow-ups), held while the input guardrails read them: what reaches the model is checked as
/// the run's input was.
#[derive(Debug)]
struct Arriving {
    messages: Vec<Message>,
    /// Their text, as the guardrails read it.
    text: String,
    /// `None` for messages that steer a running run; `Some(follow_up)` for those that reopen a
    /// finishing one.
    reopens: Option<bool>,
}

#[derive(Debug)]
enum Phase {
    CheckInput,
    Steering,
    /// Arrived messages, before the input guardrails ([`Arriving`]).
    CheckMessages(Box<Arriving>),
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

/// What the run has counted: the limits are judged on these.
#[derive(Debug, Default)]
struct Counters {
    turn: u32,
    model_calls: u32,
    tool_calls_used: u32,
    tool_calls_run: u32,
    usage: Usage,
    /// Of `usage`, the tokens of answers a response cache served (the run's and its
    /// subagents'): spent by no model, so `max_tokens` leaves them out.
    cached_tokens: u64,
    cost: f64,
    /// Answers whose cost is unknown (the pricing had no price for their model), and the name
    /// of the first one's model: `cost` leaves them out.
    unpriced: (u32, Option<String>),
    /// The turns and model calls the run's subagents took (which count against this run's
    /// limits: one budget for the tree).
    sub_turns: u32,
    sub_model_calls: u32,
}

/// How the run ends, once it does.
#[derive(Debug, Clone, Default)]
struct Ending {
    stop: Option<StopReason>,
    /// Boxed: most runs end without one, and inline it is 168 bytes of every running run.
    error: Option<Box<RunError>>,
    limit: Option<LimitHit>,
    output: Option<String>,
    structured: Option<Value>,
    /// The agent a hand-off passed the conversation to, when one answered.
    answered_by: Option<String>,
}

/// What the run keeps for its outcome besides its counts.
#[derive(Debug, Clone, Default)]
struct Kept {
    transcript: Vec<Message>,
    records: Vec<ToolCallRecord>,
    /// The subagents the run's calls ran.
    subagents: Vec<crate::outcome::SubagentRun>,
    compactions: Vec<crate::compaction::CompactionRecord>,
    /// The model's answers' warnings, each with its turn.
    warnings: Vec<String>,
}

/// Asking again after a cut answer or one that failed the output schema.
#[derive(Debug, Default)]
struct OutputRetry {
    /// The output limit of the next model call, raised once after a cut answer.
    raise_output: Option<u32>,
    /// True once the output limit was raised (it is raised once per run).
    output_raised: bool,
    output_retries_used: u32,
    retrying_output: bool,
}

/// The estimate of the next request's size, for compaction.
#[derive(Debug, Default)]
struct ContextEstimate {
    /// The provider's count of the last request's input, and how much of the transcript it
    /// covered: the estimate adds only what came after.
    context_known: Option<(usize, u64)>,
    /// The estimate of the instructions and schemas, made once a run when first needed.
    fixed_estimate: std::sync::OnceLock<u64>,
}

/// The state of one run.
pub struct RunMachine {
    cfg: Arc<AgentConfig>,
    /// The run's own limits, when it was given some; else the agent's. Boxed: most runs take
    /// the agent's, and inline the limits are 112 bytes of every running run's future.
    own_limits: Option<Box<Limits>>,
    seams: Seams,
    ids: Arc<dyn IdSource>,
    run_id: Arc<str>,
    input_text: String,
    kept: Kept,
    new_from: usize,
    phase: Phase,
    counters: Counters,
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
    retry: OutputRetry,
    ending: Ending,
    record_events: bool,
    /// Buffered events, each with the turn it happened in.
    events: Vec<(u32, EventKind)>,
    /// When the last step ended.
    now: Duration,
    /// When the current model call started.
    called_at: Duration,
    /// The before-model hooks' changes to the current call, and how many messages they added to
    /// the end of the transcript for this call only.
    /// Boxed, and only when there are any: inline they were 136 bytes of every running run's
    /// future.
    changes: Option<Box<RequestChanges>>,
    extra_messages: usize,
    /// Why the journal failed, once it did.
    journal_failure: Option<String>,
    context: ContextEstimate,
    /// Every call id the run has seen: in the transcript it continued and in each response since
    /// (compaction may drop a call from the transcript, never from here), so that an id a
    /// provider repeats is renamed ([`RunMachine::assign_call_ids`]). Each is the response's own
    /// `Arc`, shared with the admitted calls, their results and records: noting an id costs no
    /// copy of it.
    call_ids: call_ids::CallIds,
    /// The names of the agent's tools this run called, the run's own copies: its admitted calls,
    /// their results and records share them, where sharing the agent's one copy with every run
    /// would count on one cache line from every core of a multi-threaded runtime at every call.
    tool_names: call_ids::ToolNames,
}

impl std::fmt::Debug for RunMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunMachine")
            .field("run_id", &self.run_id)
            .field("turn", &self.counters.turn)
            .field("phase", &self.phase)
            .field("stop", &self.ending.stop)
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
        let input_text = input.as_ref().map(input_text_of).unwrap_or_default();
        if let Some(m) = input {
            transcript.push(m);
        }
        let own_limits = limits.map(Box::new);
        let call_ids = transcript_call_ids(&transcript);
        let tools = Arc::clone(cfg.tools.catalog());
        let has_pollers = tools.specs().iter().any(|s| s.poller);
        let mut m = RunMachine {
            cfg,
            own_limits,
            seams,
            ids,
            run_id,
            input_text,
            kept: Kept {
                transcript,
                ..Kept::default()
            },
            new_from,
            phase: Phase::Done,
            counters: Counters::default(),
            recent_turns: Vec::new(),
            tools,
            has_pollers,
            wrap_up: None,
            retry: OutputRetry::default(),
            ending: Ending::default(),
            record_events: observed,
            events: Vec::new(),
            now: Duration::ZERO,
            called_at: Duration::ZERO,
            changes: None,
            extra_messages: 0,
            journal_failure: None,
            context: ContextEstimate::default(),
            call_ids,
            tool_names: call_ids::ToolNames::default(),
        };
        if let Err(message) = m.limits().check() {
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
            self.events.push((self.counters.turn, kind()));
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &Arc<str> {
        &self.run_id
    }

    /// How many model calls were asked for so far, the one being made included: a call's
    /// number in its run, the same when a resumed run makes it again.
    pub(crate) fn model_calls_asked(&self) -> u32 {
        self.counters.model_calls
    }

    /// The current turn (1-based; 0 before the first).
    pub fn turn(&self) -> u32 {
        self.counters.turn
    }

    /// The agent.
    pub fn config(&self) -> &Arc<AgentConfig> {
        &self.cfg
    }

    /// The run's limits.
    pub fn limits(&self) -> &Limits {
        self.own_limits.as_deref().unwrap_or(&self.cfg.limits)
    }

    /// The settings of the next model call: as the hooks or the machine changed them for it, else
    /// the agent's.
    fn settings(&self) -> &crate::model::ModelSettings {
        self.changes
            .as_ref()
            .and_then(|c| c.settings.as_ref())
            .unwrap_or(&self.cfg.settings)
    }

    /// The run's deadline (time since its start), if it has one.
    pub fn deadline(&self) -> Option<Duration> {
        self.limits().deadline()
    }

    /// The transcript so far.
    pub fn transcript(&self) -> &[Message] {
        &self.kept.transcript
    }

    /// Tokens so far.
    pub fn usage(&self) -> Usage {
        self.counters.usage
    }

    /// USD so far.
    pub fn cost_usd(&self) -> f64 {
        self.counters.cost
    }

    /// True once the run has stopped.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The final output so far.
    pub fn output(&self) -> Option<&str> {
        self.ending.output.as_deref()
    }

    /// The stop reason, once stopped.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.ending.stop.as_ref()
    }

    /// The error so far.
    pub fn error(&self) -> Option<&RunError> {
        self.ending.error.as_deref()
    }

    /// The records so far.
    pub fn records(&self) -> &[ToolCallRecord] {
        &self.kept.records
    }

    /// The run as the stop conditions see it.
    pub fn state(&self) -> crate::hooks::RunState<'_> {
        crate::hooks::RunState {
            turn: self.counters.turn,
            model_calls: self.counters.model_calls,
            tool_calls_run: self.counters.tool_calls_run,
            usage: self.counters.usage,
            cost_usd: self.counters.cost,
            transcript: &self.kept.transcript,
            tool_calls: &self.kept.records,
        }
    }

    /// The run's input, as the input guardrails see it.
    pub fn input_text(&self) -> &str {
        &self.input_text
    }

    /// [`RunMachine::feed`], keeping the step in `log` first, as [`RunMachine::settle`] leaves it.
    pub fn feed_logged(&mut self, mut step: Step, log: &mut Vec<Step>) {
        self.settle(&mut step.input);
        log.push(step.clone());
        self.feed(step);
    }

    /// Completes what the driver learned before it is logged or journaled: a response's call
    /// ids (cut calls' too) are made unique in the run (a blank id drawn from the run's id
    /// source, an id an earlier call of the run used renamed `ID_2`, ...), so that a replay or a
    /// resume of the log needs no id source of its own. [`RunMachine::feed`] does the same to a
    /// step that was not settled, alike, since the rule depends only on the run's ids so far.
    pub fn settle(&self, input: &mut Input) {
        if let Input::ModelResponded { response, .. } = input {
            self.assign_call_ids(response);
        }
    }

    /// The step to take now.
    pub fn action(&self) -> Action<'_> {
        match &self.phase {
            Phase::CheckInput => Action::CheckInput(&self.input_text),
            Phase::Steering => Action::TakeMessages { follow_up: false },
            Phase::CheckMessages(arriving) => Action::CheckInput(&arriving.text),
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
            Phase::Review(r) => Action::Review {
                response: r,
                answer: !admit::calls_tools(r),
            },
            Phase::Admit(p) => Action::Admit {
                gate: p.gate,
                batch: &p.batch,
            },
            Phase::Run(p) => self.run_action(p),
            Phase::CheckStop => Action::CheckStop,
            Phase::Closing(Closing::Steering) => Action::TakeMessages { follow_up: false },
            Phase::Closing(Closing::FollowUps) => Action::TakeMessages { follow_up: true },
            Phase::Closing(Closing::CheckOutput) => {
                Action::CheckOutput(self.ending.output.as_deref().unwrap_or_default())
            }
            Phase::Closing(Closing::Finalize) => Action::Finalize,
            Phase::Done => Action::Finish,
        }
    }

    fn run_action<'a>(&'a self, p: &'a Pending) -> Action<'a> {
        if let Some((_, until)) = p.interrupted {
            return Action::Drain { until };
        }
        let cap = self.start_cap(p);
        let next = p.restart.first().copied().unwrap_or(p.next);
        if p.open
            && p.running < cap
            && let Some(call) = p.batch.calls.get(next)
        {
            return Action::StartCall(call);
        }
        Action::AwaitCalls { retries: p.open }
    }

    /// How many calls of the batch may run at once.
    fn start_cap(&self, p: &Pending) -> usize {
        if p.batch.sequential {
            1
        } else {
            self.limits().max_concurrency.max(1)
        }
    }

    /// True when the next step [`RunMachine::action`] asks for starts a call: nothing outside the
    /// machine (a hook, a gate, a model or a tool) runs before it. A journaling driver commits
    /// the step it just fed together with that start (see `Driver::record`).
    pub fn starts_next(&self) -> bool {
        match &self.phase {
            Phase::Run(p) => matches!(self.run_action(p), Action::StartCall(_)),
            _ => false,
        }
    }

    /// True while the batch drains for a suspension ([`Action::Drain`] after
    /// [`Interrupt::Suspended`]): the driver tells only the subagent calls to stop (their
    /// children are left as they are, to resume with the run) and lets the other calls run to
    /// their end, journaling each as it finishes; the batch ends when only subagent calls are
    /// left. Other drains tell every call to stop. While it is true the driver reports the
    /// deadline or a cancel ([`Input::Interrupted`]); from then on it is false, and the calls
    /// still running are told to stop and given the grace period, as in any drain (the run
    /// still ends suspended).
    pub fn suspending(&self) -> bool {
        matches!(&self.phase, Phase::Run(p) if !p.stopping && matches!(p.interrupted, Some((Interrupt::Suspended, _))))
    }

    /// The calls [`RunMachine::action`] asks to start one after another from here, each as soon
    /// as the one before it is reported started, with no other step between them (empty when
    /// the next step is not a start). A journaling driver starts them together and journals
    /// their [`Input::CallStarted`] steps in one commit, feeding each, in order, after it.
    pub fn starts_ahead(&self) -> &[AdmittedCall] {
        match &self.phase {
            Phase::Run(p) if p.interrupted.is_none() && p.open && p.restart.is_empty() => {
                let free = self.start_cap(p).saturating_sub(p.running);
                let end = p.next.saturating_add(free).min(p.batch.calls.len());
                p.batch.calls.get(p.next..end).unwrap_or_default()
            }
            _ => &[],
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
            (phase, Input::Restarted { children }) => self.on_restarted(phase, children),
            (phase, Input::JournalFailed { message }) => self.on_journal_failed(phase, message),
            (Phase::CheckInput, Input::Checked { tripped }) => match tripped {
                Some(trip) => self.trip(trip),
                None => self.need_model(),
            },
            (Phase::Steering, Input::Messages { messages, .. }) => {
                self.arrived(messages, None);
            }
            (Phase::CheckMessages(arriving), Input::Checked { tripped }) => match tripped {
                Some(trip) => self.trip(trip),
                None => self.take_arrived(*arriving),
            },
            (Phase::ListTools, Input::ToolsListed { tools }) => {
                if let Some(specs) = tools {
                    self.switch_tools(specs);
                }
                self.ask_model();
            }
            (Phase::Prepare, Input::Prepared { changes, failures }) => {
                self.on_prepared(changes, failures)
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
            (Phase::Summarize(job), Input::ModelFailed { error, spent }) => {
                self.count_failed_spend(spent.as_deref());
                // Not the run's failure: the compaction's record says why it fell back.
                self.on_summary(*job, Err(format!("{} ({})", error.message, error.code())));
            }
            (Phase::CallModel, Input::ModelFailed { error, spent }) => {
                self.count_failed_spend(spent.as_deref());
                self.on_model_failed(error)
            }
            (Phase::Review(r), Input::Reviewed { failures, reask }) => {
                self.on_reviewed(*r, failures, reask)
            }
            (Phase::CheckStop, Input::StopChecked { stop, failures }) => {
                self.on_stop_checked(stop, failures)
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
            (Phase::Run(p), Input::CallUnhandled { position }) => {
                // The same verdict as a call of a tool the run does not have.
                let outcome = CallOutcome::error(codes::UNKNOWN_TOOL, "unknown tool");
                self.on_finished(p, position, outcome, Vec::new())
            }
            (Phase::Run(p), Input::GraceOver) => self.on_grace_over(p),
            (Phase::Closing(Closing::Steering), Input::Messages { messages, .. }) => {
                if messages.is_empty() {
                    self.phase = Phase::Closing(Closing::FollowUps);
                } else {
                    self.arrived(messages, Some(false));
                }
            }
            (Phase::Closing(Closing::FollowUps), Input::Messages { messages, .. }) => {
                if messages.is_empty() {
                    self.after_follow_ups();
                } else {
                    self.arrived(messages, Some(true));
                }
            }
            (Phase::Closing(Closing::CheckOutput), Input::Checked { tripped }) => match tripped {
                Some(trip) => self.trip(trip),
                None => self.conclude_hooks(),
            },
            (Phase::Closing(Closing::Finalize), Input::Finalized { failures }) => {
                self.on_finalized(failures)
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

    /// The before-model hooks answered: their changes go on this call.
    fn on_prepared(&mut self, changes: RequestChanges, failures: Vec<HookFailure>) {
        if let Some(e) = self.hook_failures(failures) {
            self.fail(e);
            return;
        }
        if !changes.extra_messages.is_empty() {
            self.extra_messages = changes.extra_messages.len();
            self.kept
                .transcript
                .extend(changes.extra_messages.iter().cloned());
        }
        self.changes = (!changes.is_empty()).then(|| Box::new(changes));
        self.called_at = self.now;
        self.enter_call_model();
    }

    /// What a failed call's attempts spent, as their providers reported it, counts in the run's
    /// usage and cost like an answer's (a call that reported nothing adds nothing, not even an
    /// unpriced answer).
    fn count_failed_spend(&mut self, spent: Option<&Spent>) {
        let Some(spent) = spent.filter(|s| !s.usage.is_zero()) else {
            return;
        };
        self.counters.usage.add(&spent.usage);
        self.count_cost(spent.cost, None);
    }

    fn on_model_failed(&mut self, error: crate::model::ModelError) {
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

    /// The after-model hooks reviewed the response: it is decided on, unless one failed.
    fn on_reviewed(
        &mut self,
        response: ModelResponse,
        failures: Vec<HookFailure>,
        reask: Option<String>,
    ) {
        if let Some(e) = self.hook_failures(failures) {
            // The response stays in the transcript, each of its calls answered, so the
            // conversation can be continued.
            self.answer_all(response.message, &CallOutcome::not_run(), false);
            self.fail(e);
            return;
        }
        self.decide(response, reask);
    }

    /// The batch's grace period ended (or, for a suspension, only subagent calls are left): the
    /// calls still running are cut short, each finishing `cancelled` (its `ToolFinished` too:
    /// every start has one, whoever ends the call).
    fn on_grace_over(&mut self, mut p: Box<Pending>) {
        for slot in p.slots.iter_mut() {
            if slot.started && slot.outcome.is_none() {
                let outcome = CallOutcome::cancelled();
                self.emit_finished(p.turn, slot, &outcome);
                slot.outcome = Some(outcome);
            }
        }
        p.running = 0;
        self.end_batch(p);
    }

    /// Stops the run. Whatever step it stops in, every tool call in the transcript keeps exactly
    /// one result: a batch still waiting is folded first, its calls answered "not run".
    fn finish(&mut self, reason: StopReason) {
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Admit(p) | Phase::Run(p) => {
                self.fold(p);
                if self.ending.stop.is_some() {
                    // The batch decided the stop itself (a fatal failure).
                    return;
                }
            }
            Phase::Review(r) => self.answer_all(r.message, &CallOutcome::not_run(), false),
            Phase::CallModel | Phase::Prepare => self.end_model_call(),
            _ => {}
        }
        let finished = reason == StopReason::Finished;
        // A run a tool or a stop condition ended (or a limit, after a last answer) shows its
        // output as a finished one does: the output guardrails read it the same.
        let shown = reason != StopReason::Failed && self.ending.output.is_some();
        self.ending.stop = Some(reason);
        if finished && self.seams.steering {
            self.phase = Phase::Closing(Closing::Steering);
        } else if finished || (shown && self.seams.output_guardrails) {
            self.after_follow_ups();
        } else {
            self.conclude_hooks();
        }
    }

    fn fail(&mut self, error: RunError) {
        self.ending.error = Some(Box::new(error));
        self.finish(StopReason::Failed);
    }

    /// A batch is over (every started call answered): fold it and decide what follows: the
    /// stuck-loop rule, then the stop conditions, then the next model call.
    fn end_batch(&mut self, p: Box<Pending>) {
        let failure = p.failure.clone();
        let interrupted = p.interrupted.map(|(by, _)| by);
        let first = self.kept.records.len();
        let cut = p.cut;
        self.fold(p);
        if let Some(e) = failure {
            self.fail(e);
            return;
        }
        if self.ending.stop.is_some() {
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
        self.outcome_of(self.ending.clone(), self.kept.clone(), elapsed)
    }

    /// The outcome. Call after [`Action::Finish`]; `elapsed` is the run's duration.
    pub fn into_outcome(mut self, elapsed: Duration) -> RunOutcome {
        let ending = std::mem::take(&mut self.ending);
        let kept = std::mem::take(&mut self.kept);
        self.outcome_of(ending, kept, elapsed)
    }

    fn outcome_of(&self, ending: Ending, mut kept: Kept, elapsed: Duration) -> RunOutcome {
        // A limit that stopped the run says itself what was spent; otherwise an overspend
        // would go unsaid.
        if ending.limit.is_none()
            && let Some(w) = self.over_budget_warning()
        {
            kept.warnings.push(w);
        }
        let c = &self.counters;
        RunOutcome {
            run_id: self.run_id.to_string(),
            stop_reason: ending.stop.unwrap_or(StopReason::Failed),
            output: ending.output,
            structured_output: ending.structured,
            transcript: kept.transcript,
            new_messages_from: self.new_from,
            usage: c.usage,
            cached_tokens: c.cached_tokens,
            cost_usd: c.cost,
            unpriced_model_calls: c.unpriced.0,
            turns: c.turn,
            model_calls: c.model_calls.saturating_add(c.sub_model_calls),
            tool_calls_run: c.tool_calls_run,
            tool_calls: kept.records,
            limit: ending.limit,
            error: ending.error.map(|e| *e),
            duration: elapsed,
            subagents: kept.subagents,
            compactions: kept.compactions,
            warnings: kept.warnings,
            answered_by: ending
                .answered_by
                .unwrap_or_else(|| self.cfg.name().to_owned()),
        }
    }
}

/// The run's input as the input guardrails read it ([`Message::text`]): one text part, as nearly
/// every input is, copied straight rather than gathered through a vector.
fn input_text_of(input: &Message) -> String {
    if let Message::User { content } = input
        && let [crate::message::ContentPart::Text { text }] = content.as_slice()
    {
        return text.clone();
    }
    input.text()
}
