//! What passes between the machine and a driver: the [`Action`] the machine asks for, and the
//! [`Input`] that answers it. An input is plain data (serializable), so a log of inputs is a
//! run's whole history: fed to a fresh machine, it reproduces the run exactly.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Closing, Phase};
use crate::hooks::{HookRole, RequestChanges};
use crate::message::Message;
use crate::model::{ModelError, ModelRequest, ModelResponse, Usage};
use crate::outcome::CallOutcome;

/// One admitted call, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmittedCall {
    /// Its position among the calls of the model's response.
    pub position: usize,
    /// The call id.
    pub call_id: Arc<str>,
    /// The tool's name.
    pub tool: Arc<str>,
    /// The validated arguments (they read as a `Value`; their text is
    /// [`Arguments::as_str`](crate::tool::Arguments::as_str)).
    pub arguments: crate::tool::Arguments,
    /// The tool's index in the run's current [`crate::tool::ToolCatalog`].
    pub(crate) index: usize,
    /// A gate answered [`Verdict::Approved`] for it and no later gate rewrote it: a person
    /// allowed this very call ([`AdmittedCall::approved`]).
    pub(crate) approved: bool,
}

impl AdmittedCall {
    /// A call as a gate would see it, for testing a [`crate::Gate`] on its own: it stands for no
    /// tool of any agent.
    pub fn new(
        position: usize,
        call_id: impl Into<Arc<str>>,
        tool: impl Into<Arc<str>>,
        arguments: Value,
    ) -> Self {
        AdmittedCall {
            position,
            call_id: call_id.into(),
            tool: tool.into(),
            arguments: crate::tool::Arguments::new(arguments),
            index: usize::MAX,
            approved: false,
        }
    }

    /// True when a person allowed this very call: a gate answered it [`Verdict::Approved`]
    /// (asked now, or an answer recorded for it), and no gate after it rewrote its arguments.
    /// False when rules allowed it without asking. Its handler reads it as
    /// [`crate::ToolContext::approved`].
    pub fn approved(&self) -> bool {
        self.approved
    }
}

/// A batch's admitted calls: inline up to four (most responses call a few tools), so that the
/// batch, its calls and their slots are one allocation a tool turn. It reads as a slice.
pub type BatchCalls = smallvec::SmallVec<[AdmittedCall; 4]>;

/// A batch of admitted calls. Every call's arguments were validated before the batch was formed.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The turn it belongs to.
    pub turn: u32,
    /// The calls still admitted, in decision order.
    pub calls: BatchCalls,
    /// True when any tool of the batch is sequential: the calls run one at a time.
    pub sequential: bool,
}

/// The next step a driver must take. It borrows the machine: the driver performs it, then
/// reports with [`crate::machine::RunMachine::feed`].
#[derive(Debug)]
pub enum Action<'m> {
    /// Check the run's input with the input guardrails; answer [`Input::Checked`].
    CheckInput(&'m str),
    /// Take the application's waiting messages (steering, or follow-ups when `follow_up`);
    /// answer [`Input::Messages`], empty when none wait.
    TakeMessages {
        /// Follow-ups rather than steering messages.
        follow_up: bool,
    },
    /// A turn begins and the agent has a [`crate::ToolSource`]: ask it whether its tools
    /// changed; answer [`Input::ToolsListed`]. Asked only when [`Seams::dynamic_tools`].
    ListTools,
    /// Run the before-model hooks; answer [`Input::Prepared`].
    PrepareRequest,
    /// Call the model with this request; answer [`Input::ModelResponded`] or
    /// [`Input::ModelFailed`].
    CallModel(ModelRequest<'m>),
    /// Call the model for a summary of the older part of the conversation (compaction, before a
    /// turn's model call); answer [`Input::ModelResponded`] or [`Input::ModelFailed`]. Its text
    /// is not the run's output: stream none of it as such.
    Summarize(ModelRequest<'m>),
    /// Run the after-model hooks on this response, and their answer review when `answer`;
    /// answer [`Input::Reviewed`].
    Review {
        /// The response.
        response: &'m ModelResponse,
        /// True when the response calls no tool: a final answer the hooks' `review_answer`
        /// judges too (the first rejection sends the model back).
        answer: bool,
    },
    /// Put these calls to admission gate `gate` (0 is the hooks' `before_tool_call` when the
    /// agent has hooks, then the gates in order); answer [`Input::Admitted`] with one verdict per
    /// call. A call denied by one gate is never put to the next.
    Admit {
        /// Which gate.
        gate: usize,
        /// The batch, holding only the calls still admitted.
        batch: &'m Batch,
    },
    /// Start this call; answer [`Input::CallStarted`] once it runs.
    StartCall(&'m AdmittedCall),
    /// Wait for a running call to finish; answer [`Input::CallFinished`].
    AwaitCalls {
        /// False once no new attempt may start (a sibling failed fatally): retries stop.
        retries: bool,
    },
    /// The run was interrupted: tell the running calls to stop, and wait for them until `until`
    /// (time since the run started); answer [`Input::CallFinished`], or [`Input::GraceOver`].
    /// For a suspension ([`crate::machine::RunMachine::suspending`]) only the subagent calls
    /// are told, and `until` is the deadline; once the deadline or a cancel reaches that drain
    /// (the driver answers [`Input::Interrupted`]), every call is told and `until` is the end of
    /// the grace period that follows.
    Drain {
        /// The end of the grace period.
        until: Duration,
    },
    /// After a tool turn, ask the stop conditions (the hooks' `should_stop`) whether the run ends
    /// here, on [`crate::machine::RunMachine::state`]; answer [`Input::StopChecked`].
    CheckStop,
    /// Check the final output with the output guardrails; answer [`Input::Checked`].
    CheckOutput(&'m str),
    /// Run the hooks' `on_error` and `on_finish` on [`crate::machine::RunMachine::outcome`];
    /// answer [`Input::Finalized`].
    Finalize,
    /// The run is over: take [`crate::machine::RunMachine::into_outcome`].
    Finish,
}

/// What interrupted a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interrupt {
    /// The run was cancelled.
    Cancelled,
    /// The run's deadline passed.
    Deadline,
    /// A gate asked a human and the run is durable: it stops here, waiting for the answers, and
    /// its journal ends before this step so that resuming asks the gate again.
    Suspended,
    /// A durable run's journal could not be written: the run stops at its last written step.
    JournalFailed,
}

/// How many model calls have a result among `steps`: where a model whose answers depend on the
/// calls before it (a script) goes on when the run resumes ([`crate::model::Model::resumed`]).
pub fn model_calls(steps: &[Step]) -> usize {
    steps
        .iter()
        .filter(|s| {
            matches!(
                s.input,
                Input::ModelResponded { .. } | Input::ModelFailed { .. }
            )
        })
        .count()
}

/// Where a hook (or a gate, a pricing function) failed. Serialized as its name
/// (`before_model_call`, ...), the word events and traces carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HookStage {
    /// [`crate::Hook::before_model_call`].
    BeforeModelCall,
    /// [`crate::Hook::after_model_call`].
    AfterModelCall,
    /// [`crate::Hook::review_answer`].
    ReviewAnswer,
    /// [`crate::Hook::should_stop`].
    ShouldStop,
    /// [`crate::Hook::before_tool_call`].
    BeforeToolCall,
    /// [`crate::Hook::after_tool_call`].
    AfterToolCall,
    /// [`crate::Hook::on_error`].
    OnError,
    /// [`crate::Hook::on_finish`].
    OnFinish,
    /// A gate ([`crate::Gate`]): its failure fails the run with the gate's own message.
    Gate,
    /// The pricing function.
    Price,
}

impl HookStage {
    /// The stage's name, as events and traces carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            HookStage::BeforeModelCall => "before_model_call",
            HookStage::AfterModelCall => "after_model_call",
            HookStage::ReviewAnswer => "review_answer",
            HookStage::ShouldStop => "should_stop",
            HookStage::BeforeToolCall => "before_tool_call",
            HookStage::AfterToolCall => "after_tool_call",
            HookStage::OnError => "on_error",
            HookStage::OnFinish => "on_finish",
            HookStage::Gate => "gate",
            HookStage::Price => "price",
        }
    }
}

impl std::fmt::Display for HookStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A hook (or a gate, a guardrail, a pricing function) that failed or panicked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookFailure {
    /// The hook's name.
    pub hook: String,
    /// Whether its failure fails the run.
    pub role: HookRole,
    /// Where it failed.
    pub stage: HookStage,
    /// What went wrong.
    pub message: String,
}

/// A guardrail that tripped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trip {
    /// The guardrail's name.
    pub name: String,
    /// Why.
    pub message: String,
}

/// A gate's answer for one call. New answers are added as gates learn them (`Approved` was), so
/// a match on a verdict needs a wildcard arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", content = "value", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Verdict {
    /// The call may run.
    Allow,
    /// The call may run, and a person allowed this very call: asked now, or an answer recorded
    /// for it (a durable run's). A tool that judges what the call touches again as it runs (a
    /// path that a sibling call turned into a link) lets a person's approval stand where rules
    /// that only allowed it would not ([`crate::ToolContext::approved`]). A later gate that
    /// rewrites the call's arguments takes the approval away: the person saw other arguments.
    Approved,
    /// The call is denied; the model reads why.
    Deny(String),
    /// The call runs with these arguments instead (validated again against the tool's schema).
    Rewrite(Value),
    /// The gate answered the call itself: it does not run, and this is its result (the
    /// user's answer to an `ask_user` question, [`crate::ask::AskGate`]).
    Answer(Value),
}

/// What a failed model call's attempts spent ([`Input::ModelFailed`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    /// The tokens their providers reported.
    pub usage: Usage,
    /// Their price in USD, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// The result of a step, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "input", rename_all = "snake_case")]
pub enum Input {
    /// The guardrails' verdict: the first that tripped, if any.
    Checked {
        /// The guardrail that tripped.
        tripped: Option<Trip>,
    },
    /// Messages from the application (empty when none waited).
    Messages {
        /// The messages, in order.
        messages: Vec<Message>,
        /// Follow-ups rather than steering.
        follow_up: bool,
    },
    /// The agent's tool source answered, at a turn boundary.
    ToolsListed {
        /// The specs of the source's tools when they differ from the run's (the run's tools are
        /// then the agent's own and these, from this turn on); `None` when nothing changed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tools: Option<Vec<crate::tool::ToolSpec>>,
    },
    /// The before-model hooks ran.
    Prepared {
        /// The changes to this call's request.
        changes: RequestChanges,
        /// Hooks that failed.
        failures: Vec<HookFailure>,
    },
    /// The model answered.
    ModelResponded {
        /// The response (boxed: it is the largest input by far, and every input is moved).
        response: Box<ModelResponse>,
        /// Its price in USD, when known.
        cost: Option<f64>,
        /// A pricing function that failed (it panicked): the call counts as unpriced.
        failures: Vec<HookFailure>,
    },
    /// The model call failed.
    ModelFailed {
        /// Why.
        error: ModelError,
        /// What its attempts spent before it failed, when their providers reported any tokens
        /// (the failed attempts a retry layer abandoned, and the last): it counts in the run's
        /// usage and cost. Boxed: most failures report none, and every input is moved.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spent: Option<Box<Spent>>,
    },
    /// The after-model hooks ran.
    Reviewed {
        /// Hooks that failed.
        failures: Vec<HookFailure>,
        /// A hook rejected the final answer: the message the model reads before it answers again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reask: Option<String>,
    },
    /// The stop conditions answered.
    StopChecked {
        /// The stop condition that ends the run here, if any.
        stop: Option<String>,
        /// Stop conditions that failed.
        failures: Vec<HookFailure>,
    },
    /// A gate answered, one verdict per call it was shown, or failed.
    Admitted {
        /// The verdicts, in the order of the calls shown.
        verdicts: Vec<Verdict>,
        /// The gate (or hook) that failed.
        failures: Vec<HookFailure>,
    },
    /// A call started.
    CallStarted {
        /// Its position in the model's response.
        position: usize,
    },
    /// A call finished (its after-tool hooks included).
    CallFinished {
        /// Its position in the model's response.
        position: usize,
        /// How it ended.
        outcome: CallOutcome,
        /// After-tool hooks that failed.
        failures: Vec<HookFailure>,
    },
    /// A started call had no handler in this driver (its tool is not among those the driver
    /// runs): the machine answers it.
    CallUnhandled {
        /// Its position in the model's response.
        position: usize,
    },
    /// The grace period of an interrupted batch ended with calls still running.
    GraceOver,
    /// The step was interrupted before it completed.
    Interrupted {
        /// By what.
        by: Interrupt,
    },
    /// The run goes on in a new process, from its journal: calls that were running when the old
    /// one stopped are run again when their tool is idempotent, and answered
    /// [`CallOutcome::interrupted`] otherwise.
    Restarted {
        /// The run's subagents are journaled with it (see [`crate::journal`]): a subagent's
        /// call that was running starts again, and resumes its child from its last step.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        children: bool,
    },
    /// A durable run's journal could not keep the last step's result: the run stops (as if
    /// interrupted) at its last written step, failing with this message. After the run is over
    /// it means the journal could not record how the run ended: a run that ended well fails
    /// with this message, and one that ended otherwise keeps its stop reason and first error.
    JournalFailed {
        /// What went wrong.
        message: String,
    },
    /// The finish hooks ran.
    Finalized {
        /// Hooks that failed.
        failures: Vec<HookFailure>,
    },
}

/// What an agent has around its machine: which steps the machine asks for. A replay must use
/// the same seams as the run it replays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seams {
    /// The agent has input guardrails.
    pub input_guardrails: bool,
    /// The agent has output guardrails.
    pub output_guardrails: bool,
    /// The agent has hooks.
    pub hooks: bool,
    /// How many admission gates the agent has (besides the hooks).
    pub gates: usize,
    /// The run takes steering messages and follow-ups.
    pub steering: bool,
    /// A dry run: every admitted call is skipped.
    pub skip_tools: bool,
    /// The agent has a [`crate::ToolSource`]: each turn begins with [`Action::ListTools`].
    /// Absent from logs and journals written before it existed, which never asked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dynamic_tools: bool,
}

/// One entry of a run's step log: when a step ended (time since the run started) and its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// When the step ended.
    #[serde(with = "crate::serde_duration")]
    pub at: Duration,
    /// Its result.
    #[serde(flatten)]
    pub input: Input,
}

pub(super) fn phase_name(phase: &Phase) -> &'static str {
    match phase {
        Phase::CheckInput => "an input check",
        Phase::Steering => "steering messages",
        Phase::CheckMessages(_) => "an input check of arrived messages",
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

pub(super) fn input_name(input: &Input) -> &'static str {
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
        Input::CallUnhandled { .. } => "a call without a handler",
        Input::GraceOver => "the end of a grace period",
        Input::StopChecked { .. } => "the stop conditions' verdict",
        Input::Interrupted { .. } => "an interrupt",
        Input::Restarted { .. } => "a restart",
        Input::JournalFailed { .. } => "a journal failure",
        Input::Finalized { .. } => "the finish hooks' result",
    }
}
