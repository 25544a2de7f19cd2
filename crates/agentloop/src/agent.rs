//! The agent and its local tokio driver: the I/O around the [`RunMachine`].
//!
//! The driver calls the model (streaming deltas out as events), runs admitted batches
//! concurrently up to the concurrency cap (one at a time when any tool is sequential) inside the
//! run's own task, races every step against cancellation and the deadline, and folds outcomes back
//! in decision order.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::error::RunError;
use crate::event::{Event, EventKind, EventSink, Sinks};
use crate::guardrail::Guardrail;
use crate::hooks::{
    Hook, HookContext, HookError, HookRole, RequestChanges, ToolCallDecision, ToolCallView,
};
use crate::ids::{IdSource, UuidIds};
use crate::limits::{Limits, Pricing};
use crate::machine::{
    Action, AgentConfig, Batch, CallOutcome, CallResult, DecisionPolicy, RunMachine,
};
use crate::message::Message;
use crate::model::{
    Model, ModelError, ModelEvent, ModelRequest, ModelResponse, ModelSettings, ResponseAccumulator,
};
use crate::outcome::{RunOutcome, StopReason};
use crate::steering::Steering;
use crate::tool::{
    ProgressSender, Tool, ToolContext, ToolError, ToolFuture, ToolHandler, ToolOutput, ToolSet,
    compile_schema, tool_retry_delay,
};

/// Decides, per call, whether a batch may run. Sees the whole admitted batch once per turn, before
/// any tool of it starts.
pub trait BatchGate: Send + Sync {
    /// One answer per call of `batch`, in order: `None` allows it, `Some(reason)` denies it.
    fn check<'a>(
        &'a self,
        run_id: &'a str,
        batch: &'a Batch,
    ) -> futures::future::BoxFuture<'a, Result<Vec<Option<String>>, RunError>>;
}

/// A conversation carried from run to run.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The transcript.
    pub messages: Vec<Message>,
}

impl Session {
    /// An empty session.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Options for one run.
#[derive(Default)]
pub struct RunOptions {
    /// Cancels the run: nothing new is dispatched, running handlers are drained.
    pub cancel: Option<CancellationToken>,
    /// The parent run, for a subagent.
    pub parent_run_id: Option<String>,
    /// Extra event sinks for this run only.
    pub sinks: Vec<Arc<dyn EventSink>>,
    /// Skip every tool (reported as skipped): a dry run.
    pub skip_tools: bool,
    /// Limits for this run instead of the agent's (a subagent's share of its parent's budget).
    pub limits: Option<Limits>,
    /// A handle through which the application sends steering messages and follow-ups.
    pub steering: Option<Steering>,
}

struct Inner {
    cfg: Arc<AgentConfig>,
    model: Arc<dyn Model>,
    sinks: Sinks,
    pricing: Option<Arc<dyn Pricing>>,
    ids: Arc<dyn IdSource>,
    gate: Option<Arc<dyn BatchGate>>,
    hooks: Vec<(Arc<dyn Hook>, HookRole)>,
    input_guardrails: Vec<Arc<dyn Guardrail>>,
    output_guardrails: Vec<Arc<dyn Guardrail>>,
}

/// An agent: a model, instructions, tools and limits. Cheap to clone; runs share nothing mutable.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("config", &self.inner.cfg)
            .field("model", &self.inner.model.id())
            .finish()
    }
}

/// Builds an [`Agent`]. Setters record the first error; [`AgentBuilder::build`] returns it.
#[must_use]
pub struct AgentBuilder {
    name: String,
    model: Option<Arc<dyn Model>>,
    instructions: Option<String>,
    tools: ToolSet,
    limits: Limits,
    policy: DecisionPolicy,
    output_schema: Option<Value>,
    settings: ModelSettings,
    sinks: Vec<Arc<dyn EventSink>>,
    pricing: Option<Arc<dyn Pricing>>,
    ids: Arc<dyn IdSource>,
    gate: Option<Arc<dyn BatchGate>>,
    hooks: Vec<(Arc<dyn Hook>, HookRole)>,
    input_guardrails: Vec<Arc<dyn Guardrail>>,
    output_guardrails: Vec<Arc<dyn Guardrail>>,
    error: Option<RunError>,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("name", &self.name)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Starts a builder.
    pub fn builder() -> AgentBuilder {
        AgentBuilder {
            name: "agent".into(),
            model: None,
            instructions: None,
            tools: ToolSet::new(),
            limits: Limits::default(),
            policy: DecisionPolicy::default(),
            output_schema: None,
            settings: ModelSettings::default(),
            sinks: Vec::new(),
            pricing: None,
            ids: Arc::new(UuidIds),
            gate: None,
            hooks: Vec::new(),
            input_guardrails: Vec::new(),
            output_guardrails: Vec::new(),
            error: None,
        }
    }

    /// The agent's configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.inner.cfg
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn Model> {
        &self.inner.model
    }

    /// Runs the agent on one input.
    pub async fn run(&self, input: impl Into<String>) -> RunOutcome {
        self.run_with(
            Vec::new(),
            Some(Message::user(input)),
            RunOptions::default(),
        )
        .await
    }

    /// Runs the agent on one input, continuing a session; the session holds the new transcript
    /// afterwards.
    pub async fn run_in(&self, session: &mut Session, input: impl Into<String>) -> RunOutcome {
        let transcript = std::mem::take(&mut session.messages);
        let outcome = self
            .run_with(
                transcript,
                Some(Message::user(input)),
                RunOptions::default(),
            )
            .await;
        session.messages = outcome.transcript.clone();
        outcome
    }

    /// Runs the agent over a transcript with an optional new message, with options.
    pub async fn run_with(
        &self,
        transcript: Vec<Message>,
        input: Option<Message>,
        options: RunOptions,
    ) -> RunOutcome {
        let run_id: Arc<str> = Arc::from(self.inner.ids.run_id());
        let cfg = match &options.limits {
            Some(limits) => Arc::new(AgentConfig {
                name: self.inner.cfg.name.clone(),
                instructions: self.inner.cfg.instructions.clone(),
                tools: self.inner.cfg.tools.clone(),
                limits: limits.clone(),
                policy: self.inner.cfg.policy,
                output_schema: self.inner.cfg.output_schema.clone(),
                settings: self.inner.cfg.settings.clone(),
            }),
            None => self.inner.cfg.clone(),
        };
        let input_text = input.as_ref().map(Message::text).unwrap_or_default();
        let machine = RunMachine::new(cfg, self.inner.ids.clone(), run_id, transcript, input);
        let mut sinks = self.inner.sinks.clone();
        sinks.0.extend(options.sinks.iter().cloned());
        let driver = Driver {
            inner: &self.inner,
            sinks,
            cancel: options.cancel.clone().unwrap_or_default(),
            skip_tools: options.skip_tools,
            steering: options.steering.clone(),
            start: Instant::now(),
        };
        driver
            .drive(machine, input_text, options.parent_run_id)
            .await
    }

    /// Runs the agent and yields its events as they happen, then the outcome.
    pub fn stream(&self, input: impl Into<String>) -> RunStream {
        self.stream_with(
            Vec::new(),
            Some(Message::user(input)),
            RunOptions::default(),
        )
    }

    /// [`Agent::stream`] over a transcript, with options.
    pub fn stream_with(
        &self,
        transcript: Vec<Message>,
        input: Option<Message>,
        mut options: RunOptions,
    ) -> RunStream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let sink = move |e: &Event| {
            let _ = tx.send(e.clone());
        };
        options.sinks.push(Arc::new(sink));
        let agent = self.clone();
        let handle = tokio::spawn(async move { agent.run_with(transcript, input, options).await });
        RunStream {
            events: rx,
            handle: Some(handle),
        }
    }
}

/// What [`Agent::stream`] yields.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum StreamItem {
    /// An event of the run.
    Event(Event),
    /// The run's outcome: always the last item.
    Outcome(RunOutcome),
}

/// The stream of a running agent's events, ending with its outcome.
#[derive(Debug)]
pub struct RunStream {
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    handle: Option<tokio::task::JoinHandle<RunOutcome>>,
}

impl Stream for RunStream {
    type Item = StreamItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        match self.events.poll_recv(cx) {
            Poll::Ready(Some(e)) => return Poll::Ready(Some(StreamItem::Event(e))),
            Poll::Ready(None) => {}
            Poll::Pending => return Poll::Pending,
        }
        let Some(handle) = self.handle.as_mut() else {
            return Poll::Ready(None);
        };
        match handle.poll_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                self.handle = None;
                match result {
                    Ok(outcome) => Poll::Ready(Some(StreamItem::Outcome(outcome))),
                    // The run task itself never panics (handlers are isolated); a join error here
                    // means the runtime is shutting down.
                    Err(_) => Poll::Ready(None),
                }
            }
        }
    }
}

impl AgentBuilder {
    /// Sets the agent's name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the model.
    pub fn model(mut self, model: impl Model + 'static) -> Self {
        self.model = Some(Arc::new(model));
        self
    }

    /// Sets a shared model.
    pub fn model_arc(mut self, model: Arc<dyn Model>) -> Self {
        self.model = Some(model);
        self
    }

    /// Sets the system instructions.
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// Registers a tool (errors surface at `build`).
    pub fn tool(mut self, tool: Tool) -> Self {
        if self.error.is_none()
            && let Err(e) = self.tools.register(tool)
        {
            self.error = Some(e.into());
        }
        self
    }

    /// Registers several tools.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Tool>) -> Self {
        for t in tools {
            self = self.tool(t);
        }
        self
    }

    /// Sets the limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets how invalid calls are treated.
    pub fn policy(mut self, policy: DecisionPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Requires the final answer to be JSON matching this schema.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Requires the final answer to be JSON matching `T`'s schema.
    pub fn output_type<T: schemars::JsonSchema>(self) -> Self {
        self.output_schema(crate::tool::schema_for::<T>())
    }

    /// Sets the model settings.
    pub fn settings(mut self, settings: ModelSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Adds an event sink.
    pub fn sink(mut self, sink: impl EventSink + 'static) -> Self {
        self.sinks.push(Arc::new(sink));
        self
    }

    /// Adds a shared event sink.
    pub fn sink_arc(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Sets the pricing (a [`crate::PriceTable`] or a cost function).
    pub fn pricing(mut self, pricing: impl Pricing + 'static) -> Self {
        self.pricing = Some(Arc::new(pricing));
        self
    }

    /// Sets a shared pricing.
    pub fn pricing_arc(mut self, pricing: Arc<dyn Pricing>) -> Self {
        self.pricing = Some(pricing);
        self
    }

    /// Sets where run and call ids come from.
    pub fn ids(mut self, ids: impl IdSource + 'static) -> Self {
        self.ids = Arc::new(ids);
        self
    }

    /// Sets the gate every admitted batch passes before it runs.
    pub fn gate(mut self, gate: Arc<dyn BatchGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Adds a hook whose failure fails the run.
    pub fn hook(mut self, hook: impl Hook + 'static) -> Self {
        self.hooks.push((Arc::new(hook), HookRole::Required));
        self
    }

    /// Adds an observer hook: its failures are reported as events and the run goes on.
    pub fn observer(mut self, hook: impl Hook + 'static) -> Self {
        self.hooks.push((Arc::new(hook), HookRole::Observer));
        self
    }

    /// Adds a guardrail on the input, checked before the first model call.
    pub fn input_guardrail(mut self, g: impl Guardrail + 'static) -> Self {
        self.input_guardrails.push(Arc::new(g));
        self
    }

    /// Adds a guardrail on the final output.
    pub fn output_guardrail(mut self, g: impl Guardrail + 'static) -> Self {
        self.output_guardrails.push(Arc::new(g));
        self
    }

    /// Builds the agent.
    pub fn build(self) -> Result<Agent, RunError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let Some(model) = self.model else {
            return Err(RunError::Other {
                message: "the agent has no model".into(),
            });
        };
        let output_schema = match self.output_schema {
            Some(schema) => {
                let validator = compile_schema(&schema).map_err(|e| RunError::Other {
                    message: format!("invalid output schema: {e}"),
                })?;
                Some((schema, Arc::new(validator)))
            }
            None => None,
        };
        let cfg = AgentConfig {
            name: self.name,
            instructions: self.instructions,
            tools: self.tools,
            limits: self.limits,
            policy: self.policy,
            output_schema,
            settings: self.settings,
        };
        Ok(Agent {
            inner: Arc::new(Inner {
                cfg: Arc::new(cfg),
                model,
                sinks: Sinks(self.sinks),
                pricing: self.pricing,
                ids: self.ids,
                gate: self.gate,
                hooks: self.hooks,
                input_guardrails: self.input_guardrails,
                output_guardrails: self.output_guardrails,
            }),
        })
    }
}

enum Interrupt {
    Cancelled,
    Deadline,
}

struct Driver<'a> {
    inner: &'a Inner,
    sinks: Sinks,
    cancel: CancellationToken,
    skip_tools: bool,
    steering: Option<Steering>,
    start: Instant,
}

impl Driver<'_> {
    fn emit(&self, run_id: &Arc<str>, turn: u32, kind: EventKind) {
        self.sinks.emit(&Event {
            run_id: run_id.clone(),
            turn,
            kind,
        });
    }

    fn flush(&self, m: &mut RunMachine) {
        if self.sinks.is_empty() {
            return;
        }
        let run_id = m.run_id().clone();
        let turn = m.turn();
        let events: Vec<EventKind> = m.drain_events().collect();
        for kind in events {
            self.emit(&run_id, turn, kind);
        }
    }

    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        // A timeout too large to add to a clock reading is no deadline at all.
        limits.timeout.and_then(|t| self.start.checked_add(t))
    }

    /// The interrupt that has already happened, if any, without waiting.
    fn interrupted_now(&self, deadline: Option<Instant>) -> Option<Interrupt> {
        if self.cancel.is_cancelled() {
            Some(Interrupt::Cancelled)
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Interrupt::Deadline)
        } else {
            None
        }
    }

    async fn interrupted(&self, deadline: Option<Instant>) -> Interrupt {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Interrupt::Cancelled,
            _ = sleep => Interrupt::Deadline,
        }
    }

    async fn drive(
        &self,
        mut m: RunMachine,
        input: String,
        parent_run_id: Option<String>,
    ) -> RunOutcome {
        let observed = !self.sinks.is_empty();
        m.record_events(observed);
        let run_id = m.run_id().clone();
        let deadline = self.deadline(&m.config().limits);
        if observed {
            self.emit(
                &run_id,
                0,
                EventKind::RunStarted {
                    agent: m.config().name.clone(),
                    model: self.inner.model.id().to_owned(),
                    parent_run_id,
                    input: input.clone(),
                },
            );
        }
        for g in &self.inner.input_guardrails {
            if let Err(message) = g.check(&input).await {
                let name = g.name().to_owned();
                m.stop_with(
                    StopReason::Guardrail {
                        name: name.clone(),
                        message: message.clone(),
                    },
                    Some(RunError::Guardrail { name, message }),
                );
                break;
            }
        }
        // The tools' cancellation: a child of the run's token, made once with the first batch.
        // Only an interrupt cancels it, and an interrupt ends the run.
        let mut calls_cancel: Option<CancellationToken> = None;
        loop {
            if let Some(s) = &self.steering
                && m.at_safe_point()
            {
                self.deliver(&mut m, s.take_steering(), false);
            }
            let action = if self.cancel.is_cancelled() && !m.is_done() {
                m.on_cancelled();
                Action::Finish
            } else {
                m.next_action(self.start.elapsed())
            };
            self.flush(&mut m);
            match action {
                Action::Finish => {
                    if m.stop_reason() == Some(&StopReason::Finished) {
                        if let Some(s) = &self.steering {
                            // Waiting steering messages and follow-ups continue a run that would
                            // otherwise finish; the limits still apply to what follows.
                            let mut messages = s.take_steering();
                            let follow_up = messages.is_empty();
                            if follow_up {
                                messages = s.take_follow_ups();
                            }
                            if !messages.is_empty() {
                                self.deliver(&mut m, messages, follow_up);
                                continue;
                            }
                        }
                        self.check_output(&mut m).await;
                    }
                    break;
                }
                Action::CallModel => {
                    let called = Instant::now();
                    let mut changes = RequestChanges::default();
                    if let Err(e) = self.before_model_call(&m, &mut changes).await {
                        m.stop_with(StopReason::Failed, Some(e));
                        continue;
                    }
                    let result = tokio::select! {
                        biased;
                        i = self.interrupted(deadline) => Err(i),
                        r = self.call_model(&m, &changes) => Ok(r),
                    };
                    match result {
                        Ok(Ok(response)) => {
                            let cost = self.inner.pricing.as_ref().and_then(|p| {
                                p.cost(
                                    self.inner.model.provider(),
                                    response.model.as_deref().unwrap_or(self.inner.model.id()),
                                    &response.usage,
                                )
                            });
                            if observed {
                                self.emit(
                                    &run_id,
                                    m.turn(),
                                    EventKind::ModelResponse {
                                        usage: response.usage,
                                        cost_usd: cost,
                                        finish_reason: response.finish_reason,
                                        tool_calls: response.message.tool_calls.len(),
                                        text: response.message.text.clone(),
                                        duration: called.elapsed(),
                                    },
                                );
                            }
                            if let Err(e) = self.after_model_call(&m, &response).await {
                                m.on_model_response(response, cost);
                                m.stop_with(StopReason::Failed, Some(e));
                                continue;
                            }
                            m.on_model_response(response, cost);
                        }
                        Ok(Err(e)) => m.on_model_error(e),
                        Err(Interrupt::Cancelled) => m.on_cancelled(),
                        Err(Interrupt::Deadline) => m.on_deadline(self.start.elapsed()),
                    }
                }
                Action::RunTools(batch) => {
                    let calls_cancel =
                        calls_cancel.get_or_insert_with(|| self.cancel.child_token());
                    let (outcomes, interrupt, failure) =
                        self.run_batch(&m, batch, deadline, calls_cancel).await;
                    m.on_tool_outcomes(outcomes);
                    if let Some(e) = failure {
                        m.stop_with(StopReason::Failed, Some(e));
                    }
                    match interrupt {
                        Some(Interrupt::Cancelled) if !m.is_done() => m.on_cancelled(),
                        Some(Interrupt::Deadline) if !m.is_done() => {
                            m.on_deadline(self.start.elapsed())
                        }
                        _ => {}
                    }
                }
            }
        }
        self.flush(&mut m);
        let mut outcome = m.into_outcome(self.start.elapsed());
        self.finish_hooks(&mut outcome).await;
        if observed {
            self.emit(
                &run_id,
                outcome.turns,
                EventKind::RunFinished {
                    stop_reason: outcome.stop_reason.clone(),
                    usage: outcome.usage,
                    cost_usd: outcome.cost_usd,
                    turns: outcome.turns,
                    error: outcome.error.as_ref().map(|e| format!("{}: {e}", e.code())),
                },
            );
        }
        outcome
    }

    async fn call_model(
        &self,
        m: &RunMachine,
        changes: &RequestChanges,
    ) -> Result<ModelResponse, ModelError> {
        let observed = !self.sinks.is_empty();
        let run_id = m.run_id();
        let turn = m.turn();
        let model = &self.inner.model;
        if observed {
            self.emit(
                run_id,
                turn,
                EventKind::ModelRequestStarted {
                    model: model.id().to_owned(),
                    provider: model.provider().to_owned(),
                    messages: m.transcript().len(),
                },
            );
        }
        let base = m.request();
        // Only a hook that adds messages costs a copy of the transcript, and only for this call.
        let extended: Vec<Message>;
        let request = if changes.is_empty() {
            base
        } else {
            let messages = if changes.extra_messages.is_empty() {
                base.messages
            } else {
                extended = base
                    .messages
                    .iter()
                    .chain(changes.extra_messages.iter())
                    .cloned()
                    .collect();
                &extended
            };
            ModelRequest {
                instructions: changes.instructions.as_deref().or(base.instructions),
                messages,
                tools: base.tools,
                output_schema: base.output_schema,
                settings: changes.settings.as_ref().unwrap_or(base.settings),
            }
        };
        let mut stream = model.stream(request);
        let mut acc = ResponseAccumulator::new();
        let mut names: Vec<(u32, String, String)> = Vec::new();
        while let Some(event) = stream.next().await {
            let event = event?;
            if observed {
                match &event {
                    ModelEvent::TextDelta(t) => {
                        self.emit(run_id, turn, EventKind::TextDelta { text: t.clone() })
                    }
                    ModelEvent::ReasoningDelta(t) => {
                        self.emit(run_id, turn, EventKind::ReasoningDelta { text: t.clone() })
                    }
                    ModelEvent::ToolCallStart { index, id, name } => {
                        names.push((*index, id.clone(), name.clone()))
                    }
                    ModelEvent::ToolCallDelta { index, arguments } => {
                        let known = names.iter().find(|(i, _, _)| i == index);
                        self.emit(
                            run_id,
                            turn,
                            EventKind::ToolCallDelta {
                                index: *index,
                                call_id: known.map(|k| k.1.clone()).filter(|s| !s.is_empty()),
                                name: known.map(|k| k.2.clone()),
                                arguments: arguments.clone(),
                            },
                        );
                    }
                    _ => {}
                }
            }
            acc.push(event)?;
        }
        acc.finish()
    }

    /// Runs a batch; returns one outcome per call, in the batch's order, and what interrupted it.
    async fn run_batch(
        &self,
        m: &RunMachine,
        batch: Batch,
        deadline: Option<Instant>,
        calls_cancel: &CancellationToken,
    ) -> (Vec<CallOutcome>, Option<Interrupt>, Option<RunError>) {
        let mut batch = batch;
        let n = batch.calls.len();
        let mut outcomes: Vec<Option<CallOutcome>> = vec![None; n];
        let run_id = m.run_id().clone();
        let turn = batch.turn;

        // Hooks see each call first (they may veto it or rewrite its arguments, which are
        // validated again); then the gate sees the whole batch once, before any tool starts.
        let not_run = || {
            (0..n)
                .map(|_| CallOutcome::instant(CallResult::NotRun))
                .collect::<Vec<_>>()
        };
        if let Err(e) = self.before_tool_calls(m, &mut batch, &mut outcomes).await {
            return (not_run(), None, Some(e));
        }
        if let Some(gate) = &self.inner.gate {
            match gate.check(&run_id, &batch).await {
                Ok(answers) => {
                    for (slot, answer) in outcomes.iter_mut().zip(answers) {
                        if let Some(reason) = answer
                            && slot.is_none()
                        {
                            *slot = Some(CallOutcome::instant(CallResult::Denied { reason }));
                        }
                    }
                }
                Err(e) => return (not_run(), None, Some(e)),
            }
        }
        if self.skip_tools {
            for slot in outcomes.iter_mut().filter(|s| s.is_none()) {
                *slot = Some(CallOutcome::instant(CallResult::Skipped));
            }
        }
        // Calls decided before any runs (denied, skipped) are reported now.
        for (i, slot) in outcomes.iter().enumerate() {
            if let Some(o) = slot {
                self.finished(&run_id, turn, &batch, i, &o.result, Duration::ZERO);
            }
        }
        let mut failure: Option<RunError> = None;

        let cfg = m.config();
        let cap = if batch.sequential {
            1
        } else {
            cfg.limits.max_concurrency.max(1)
        };
        let observed = !self.sinks.is_empty();
        let progress_sink: Option<Arc<dyn EventSink>> = if observed {
            Some(Arc::new(self.sinks.clone()))
        } else {
            None
        };
        // The calls' progress senders (observed runs only), closed as each call is folded.
        let senders: Vec<ProgressSender> = match &progress_sink {
            Some(sink) => batch
                .calls
                .iter()
                .map(|call| {
                    ProgressSender::new(
                        sink.clone(),
                        run_id.clone(),
                        turn,
                        call.call_id.clone(),
                        call.name.clone(),
                    )
                })
                .collect(),
            None => Vec::new(),
        };
        // Folds a finished call: its event, the end of its progress, its outcome.
        let fold = |outcomes: &mut [Option<CallOutcome>],
                    i: usize,
                    result: CallResult,
                    duration: Duration,
                    retries: u32| {
            self.finished(&run_id, turn, &batch, i, &result, duration);
            if let Some(sender) = senders.get(i) {
                sender.close();
            }
            if let Some(slot) = outcomes.get_mut(i) {
                *slot = Some(CallOutcome {
                    result,
                    duration,
                    retries,
                });
            }
        };
        // The calls run concurrently inside the run's own task: no task per call to spawn,
        // schedule and free on another thread. A tool with blocking or CPU-heavy work is marked
        // `own_task` and gets a task of its own.
        let mut set = FuturesUnordered::new();
        // Calls that finished while an after-tool hook ran, waiting to be folded.
        let mut ready: VecDeque<CallDone> = VecDeque::new();
        let mut next = 0usize;
        let mut stop_dispatch = false;
        // Cancelled when the batch stops dispatching (a fatal sibling, a failed hook) or the run
        // is interrupted: no retry starts after that. Made with the first call that may retry.
        let mut no_more_attempts: Option<CancellationToken> = None;
        let mut interrupt: Option<Interrupt> = None;

        loop {
            while !stop_dispatch && set.len() < cap && next < n {
                let i = next;
                next += 1;
                if outcomes[i].is_some() {
                    continue;
                }
                let call = &batch.calls[i];
                let Some(entry) = cfg.tools.entry(call.tool) else {
                    outcomes[i] = Some(CallOutcome::instant(CallResult::Error {
                        code: "unknown_tool".into(),
                        message: format!("unknown tool {}", call.name),
                    }));
                    continue;
                };
                let spec = cfg.tools.spec(call.tool);
                let timeout = spec.and_then(|s| s.timeout);
                let ctx = ToolContext {
                    call_id: call.call_id.clone(),
                    tool: call.name.clone(),
                    run_id: run_id.clone(),
                    turn,
                    cancel: calls_cancel.child_token(),
                    progress: senders.get(i).cloned().unwrap_or_default(),
                };
                if observed {
                    self.emit(
                        &run_id,
                        turn,
                        EventKind::ToolStarted {
                            call_id: call.call_id.to_string(),
                            tool: call.name.to_string(),
                            arguments: Value::clone(&call.args),
                        },
                    );
                }
                let retry = spec.filter(|s| s.retries > 0).map(|s| Retry {
                    left: s.retries,
                    handler: Arc::clone(&entry.handler),
                    args: Arc::clone(&call.args),
                    ctx: ctx.clone(),
                    sink: progress_sink.clone(),
                    stop: no_more_attempts
                        .get_or_insert_with(|| calls_cancel.child_token())
                        .clone(),
                });
                let started = Instant::now();
                let own_task = spec.is_some_and(|s| s.own_task);
                let first = Attempt::start(&entry.handler, &call.args, ctx, timeout, own_task);
                set.push(async move {
                    let (mut result, mut panic) = first.run().await;
                    let mut retried = 0u32;
                    if let Some(r) = retry {
                        while retried < r.left && panic.is_none() {
                            let Some((code, message)) = retryable(&result) else {
                                break;
                            };
                            let delay = tool_retry_delay(retried + 1);
                            if let Some(sink) = &r.sink {
                                sink.emit(&Event {
                                    run_id: r.ctx.run_id.clone(),
                                    turn: r.ctx.turn,
                                    kind: EventKind::ToolRetrying {
                                        call_id: r.ctx.call_id.to_string(),
                                        tool: r.ctx.tool.to_string(),
                                        retry: retried + 1,
                                        code: code.to_owned(),
                                        message: message.to_owned(),
                                        delay,
                                    },
                                });
                            }
                            // The grace period of an interrupted run, and the drain of a batch
                            // that stopped dispatching, are for attempts already running: an
                            // announced retry that they stop does not run (nor count).
                            tokio::select! {
                                biased;
                                _ = r.stop.cancelled() => break,
                                _ = tokio::time::sleep(delay) => {}
                            }
                            retried += 1;
                            let next = Attempt::start(
                                &r.handler,
                                &r.args,
                                r.ctx.clone(),
                                timeout,
                                own_task,
                            );
                            (result, panic) = next.run().await;
                        }
                    }
                    (i, result, started.elapsed(), panic, retried)
                });
            }
            if set.is_empty() && ready.is_empty() {
                break;
            }
            // Calls waiting after a hook: a deadline or cancellation that came meanwhile ends the
            // batch first (the waiting calls are folded without hooks, below).
            if !ready.is_empty()
                && interrupt.is_none()
                && let Some(i) = self.interrupted_now(deadline)
            {
                interrupt = Some(i);
                calls_cancel.cancel();
                break;
            }
            let joined = match ready.pop_front() {
                Some(done) => Ok(Some(done)),
                None => tokio::select! {
                    biased;
                    i = self.interrupted(deadline), if interrupt.is_none() => Err(i),
                    j = set.next() => Ok(j),
                },
            };
            match joined {
                Err(i) => {
                    interrupt = Some(i);
                    calls_cancel.cancel();
                    break;
                }
                Ok(None) => break,
                Ok(Some((i, result, duration, panic, retries))) => {
                    let outcome = call_result(result, panic);
                    // The hooks run one call at a time; the other calls keep running meanwhile,
                    // and those that finish wait in `ready`.
                    let hooked = if self.inner.hooks.is_empty() {
                        Ok(outcome)
                    } else {
                        let hooked = self.after_tool_call(m, &batch, i, outcome);
                        tokio::pin!(hooked);
                        loop {
                            tokio::select! {
                                biased;
                                r = &mut hooked => break r,
                                // The deadline still holds while a hook runs: the running calls
                                // are told at once, the hook is let finish.
                                i = self.interrupted(deadline), if interrupt.is_none() => {
                                    interrupt = Some(i);
                                    calls_cancel.cancel();
                                }
                                Some(done) = set.next(), if !set.is_empty() => ready.push_back(done),
                            }
                        }
                    };
                    let outcome = match hooked {
                        Ok(o) => o,
                        Err((o, e)) => {
                            failure.get_or_insert(e);
                            stop_dispatch = true;
                            o
                        }
                    };
                    if matches!(
                        outcome,
                        CallResult::Fatal { .. } | CallResult::Panicked { .. }
                    ) {
                        // A fatal failure drains the batch without cancelling the siblings.
                        stop_dispatch = true;
                    }
                    if stop_dispatch && let Some(t) = &no_more_attempts {
                        t.cancel();
                    }
                    fold(&mut outcomes, i, outcome, duration, retries);
                    if interrupt.is_some() {
                        break;
                    }
                }
            }
        }

        if interrupt.is_some() {
            // Calls that finished while a hook ran are folded as they are: the run is stopping.
            for (i, result, duration, panic, retries) in ready.drain(..) {
                fold(
                    &mut outcomes,
                    i,
                    call_result(result, panic),
                    duration,
                    retries,
                );
            }
        }
        if interrupt.is_some() && !set.is_empty() {
            // Running handlers saw the cancellation; give them the grace period to finish.
            let grace = tokio::time::sleep(cfg.limits.grace_period);
            tokio::pin!(grace);
            loop {
                tokio::select! {
                    biased;
                    j = set.next() => match j {
                        None => break,
                        Some((i, result, duration, panic, retries)) => {
                            fold(&mut outcomes, i, call_result(result, panic), duration, retries);
                        }
                    },
                    _ = &mut grace => break,
                }
            }
            // Dropping the calls still running cancels them; a handler whose drop panics must not
            // take the run down with it.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| set.clear()));
        }
        // Started, never completed: a synthetic "cancelled" result keeps the transcript valid.
        for i in 0..next {
            if outcomes.get(i).is_some_and(Option::is_none) {
                fold(&mut outcomes, i, CallResult::Cancelled, Duration::ZERO, 0);
            }
        }
        let results = outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| CallOutcome::instant(CallResult::NotRun)))
            .collect();
        (results, interrupt, failure)
    }

    fn finished(
        &self,
        run_id: &Arc<str>,
        turn: u32,
        batch: &Batch,
        i: usize,
        result: &CallResult,
        duration: Duration,
    ) {
        if self.sinks.is_empty() {
            return;
        }
        let Some(call) = batch.calls.get(i) else {
            return;
        };
        let (ok, output, error, details) = match result {
            CallResult::Ok(out) => (true, Some(out.content.clone()), None, out.details.clone()),
            CallResult::Error { code, message } => {
                (false, None, Some(format!("{code}: {message}")), None)
            }
            CallResult::Fatal { message } => (false, None, Some(format!("fatal: {message}")), None),
            CallResult::Panicked { message } => {
                (false, None, Some(format!("panicked: {message}")), None)
            }
            CallResult::Cancelled => (false, None, Some("cancelled".into()), None),
            CallResult::Denied { reason } => {
                self.emit(
                    run_id,
                    turn,
                    EventKind::ToolRejected {
                        call_id: call.call_id.to_string(),
                        tool: call.name.to_string(),
                        code: "denied".into(),
                        reason: reason.clone(),
                    },
                );
                return;
            }
            CallResult::Skipped => {
                self.emit(
                    run_id,
                    turn,
                    EventKind::ToolRejected {
                        call_id: call.call_id.to_string(),
                        tool: call.name.to_string(),
                        code: "skipped".into(),
                        reason: "dry run: the tool was not run".into(),
                    },
                );
                return;
            }
            CallResult::NotRun => return,
        };
        self.emit(
            run_id,
            turn,
            EventKind::ToolFinished {
                call_id: call.call_id.to_string(),
                tool: call.name.to_string(),
                ok,
                output,
                error,
                details,
                duration,
            },
        );
    }
}

impl Driver<'_> {
    fn ctx<'a>(&self, m: &'a RunMachine) -> HookContext<'a> {
        HookContext {
            run_id: m.run_id(),
            agent: &m.config().name,
            turn: m.turn(),
        }
    }

    /// A hook failed: a required hook's failure becomes the run's error; an observer's is
    /// reported and the run goes on.
    fn hook_failed(
        &self,
        m: &RunMachine,
        hook: &dyn Hook,
        role: HookRole,
        stage: &str,
        e: HookError,
    ) -> Option<RunError> {
        match role {
            HookRole::Required => Some(RunError::Hook {
                hook: hook.name().to_owned(),
                message: format!("{stage}: {e}"),
            }),
            HookRole::Observer => {
                if !self.sinks.is_empty() {
                    self.emit(
                        m.run_id(),
                        m.turn(),
                        EventKind::HookFailed {
                            hook: hook.name().to_owned(),
                            stage: stage.to_owned(),
                            message: e.0,
                        },
                    );
                }
                None
            }
        }
    }

    async fn before_model_call(
        &self,
        m: &RunMachine,
        changes: &mut RequestChanges,
    ) -> Result<(), RunError> {
        for (hook, role) in &self.inner.hooks {
            if let Err(e) = hook.before_model_call(self.ctx(m), changes).await
                && let Some(err) = self.hook_failed(m, hook.as_ref(), *role, "before_model_call", e)
            {
                return Err(err);
            }
        }
        Ok(())
    }

    async fn after_model_call(
        &self,
        m: &RunMachine,
        response: &ModelResponse,
    ) -> Result<(), RunError> {
        for (hook, role) in self.inner.hooks.iter().rev() {
            if let Err(e) = hook.after_model_call(self.ctx(m), response).await
                && let Some(err) = self.hook_failed(m, hook.as_ref(), *role, "after_model_call", e)
            {
                return Err(err);
            }
        }
        Ok(())
    }

    async fn before_tool_calls(
        &self,
        m: &RunMachine,
        batch: &mut Batch,
        outcomes: &mut [Option<CallOutcome>],
    ) -> Result<(), RunError> {
        if self.inner.hooks.is_empty() {
            return Ok(());
        }
        for (i, call) in batch.calls.iter_mut().enumerate() {
            for (hook, role) in &self.inner.hooks {
                let view = ToolCallView {
                    call_id: &call.call_id,
                    tool: &call.name,
                    arguments: &call.args,
                };
                match hook.before_tool_call(self.ctx(m), view).await {
                    Ok(ToolCallDecision::Continue) => {}
                    Ok(ToolCallDecision::Veto(reason)) => {
                        outcomes[i] = Some(CallOutcome::instant(CallResult::Denied { reason }));
                        break;
                    }
                    Ok(ToolCallDecision::Rewrite(args)) => match m.revalidate(call.tool, &args) {
                        Ok(()) => call.args = Arc::new(args),
                        Err(v) => {
                            let e = HookError(format!(
                                "rewrote the arguments of {} into ones that fail its schema: {v}",
                                call.name
                            ));
                            if let Some(err) =
                                self.hook_failed(m, hook.as_ref(), *role, "before_tool_call", e)
                            {
                                return Err(err);
                            }
                        }
                    },
                    Err(e) => {
                        if let Some(err) =
                            self.hook_failed(m, hook.as_ref(), *role, "before_tool_call", e)
                        {
                            return Err(err);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs the after-tool hooks (reverse order); a replacement result wins.
    async fn after_tool_call(
        &self,
        m: &RunMachine,
        batch: &Batch,
        i: usize,
        mut result: CallResult,
    ) -> Result<CallResult, (CallResult, RunError)> {
        if self.inner.hooks.is_empty() {
            return Ok(result);
        }
        let Some(call) = batch.calls.get(i) else {
            return Ok(result);
        };
        for (hook, role) in self.inner.hooks.iter().rev() {
            let view = ToolCallView {
                call_id: &call.call_id,
                tool: &call.name,
                arguments: &call.args,
            };
            match hook.after_tool_call(self.ctx(m), view, &result).await {
                Ok(Some(replacement)) => result = replacement,
                Ok(None) => {}
                Err(e) => {
                    if let Some(err) =
                        self.hook_failed(m, hook.as_ref(), *role, "after_tool_call", e)
                    {
                        return Err((result, err));
                    }
                }
            }
        }
        Ok(result)
    }

    fn deliver(&self, m: &mut RunMachine, messages: Vec<Message>, follow_up: bool) {
        if messages.is_empty() {
            return;
        }
        let count = messages.len();
        for msg in messages {
            m.push_user_message(msg);
        }
        if !self.sinks.is_empty() {
            self.emit(
                m.run_id(),
                m.turn(),
                EventKind::MessagesDelivered { count, follow_up },
            );
        }
    }

    async fn check_output(&self, m: &mut RunMachine) {
        if self.inner.output_guardrails.is_empty() {
            return;
        }
        let output = m.output().unwrap_or_default().to_owned();
        for g in &self.inner.output_guardrails {
            if let Err(message) = g.check(&output).await {
                let name = g.name().to_owned();
                m.stop_with(
                    StopReason::Guardrail {
                        name: name.clone(),
                        message: message.clone(),
                    },
                    Some(RunError::Guardrail { name, message }),
                );
                return;
            }
        }
    }

    async fn finish_hooks(&self, outcome: &mut RunOutcome) {
        if self.inner.hooks.is_empty() {
            return;
        }
        let run_id = outcome.run_id.clone();
        let agent = self.inner.cfg.name.clone();
        let ctx = HookContext {
            run_id: &run_id,
            agent: &agent,
            turn: outcome.turns,
        };
        let mut failure = None;
        if let Some(error) = outcome.error.clone() {
            for (hook, role) in &self.inner.hooks {
                if let Err(e) = hook.on_error(ctx, &error).await
                    && *role == HookRole::Required
                {
                    failure.get_or_insert(RunError::Hook {
                        hook: hook.name().to_owned(),
                        message: format!("on_error: {e}"),
                    });
                }
            }
        }
        for (hook, role) in &self.inner.hooks {
            if let Err(e) = hook.on_finish(ctx, outcome).await {
                match role {
                    HookRole::Required => {
                        failure.get_or_insert(RunError::Hook {
                            hook: hook.name().to_owned(),
                            message: format!("on_finish: {e}"),
                        });
                    }
                    HookRole::Observer => {
                        if !self.sinks.is_empty() {
                            self.emit(
                                &Arc::from(run_id.as_str()),
                                outcome.turns,
                                EventKind::HookFailed {
                                    hook: hook.name().to_owned(),
                                    stage: "on_finish".into(),
                                    message: e.0,
                                },
                            );
                        }
                    }
                }
            }
        }
        if let Some(e) = failure {
            outcome.stop_reason = StopReason::Failed;
            outcome.error = Some(e);
        }
    }
}

/// A handler's future, or the panic raised while it was being made.
type StartedCall = std::thread::Result<ToolFuture>;

/// Calls a handler; a handler that panics before it returns its future fails its call, not the run.
fn start_call(handler: &Arc<dyn ToolHandler>, args: &Value, ctx: ToolContext) -> StartedCall {
    std::panic::catch_unwind(AssertUnwindSafe(|| handler.call(args, ctx)))
}

/// Runs one attempt of a call under its timeout: the result, and the panic message if it panicked.
async fn attempt(
    started: StartedCall,
    timeout: Option<Duration>,
) -> (Result<ToolOutput, ToolError>, Option<String>) {
    let fut = match started {
        Ok(fut) => fut,
        Err(panic) => {
            return (
                Err(ToolError::fatal("panicked")),
                Some(panic_message(&panic)),
            );
        }
    };
    let guarded = AssertUnwindSafe(async move {
        match timeout {
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r,
                Err(_) => Err(timeout_error(t)),
            },
            None => fut.await,
        }
    })
    .catch_unwind()
    .await;
    match guarded {
        Ok(r) => (r, None),
        Err(panic) => (
            Err(ToolError::fatal("panicked")),
            Some(panic_message(&panic)),
        ),
    }
}

/// One attempt of a call: its handler's future, run in the run's task, or the task it runs in (a
/// tool with `own_task`), aborted if the attempt is dropped (cancellation, the end of the grace
/// period).
enum Attempt {
    Here(StartedCall, Option<Duration>),
    Task(
        AbortOnDropHandle<(Result<ToolOutput, ToolError>, Option<String>)>,
        Option<Duration>,
    ),
}

impl Attempt {
    fn start(
        handler: &Arc<dyn ToolHandler>,
        args: &Arc<Value>,
        ctx: ToolContext,
        timeout: Option<Duration>,
        own_task: bool,
    ) -> Attempt {
        if !own_task {
            return Attempt::Here(start_call(handler, args, ctx), timeout);
        }
        let handler = Arc::clone(handler);
        let args = Arc::clone(args);
        // The handler is called in the task as well, so that its synchronous work runs there.
        // The timeout is kept on the run's side, where a handler blocking its thread cannot stop
        // it firing.
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            attempt(start_call(&handler, &args, ctx), None).await
        }));
        Attempt::Task(task, timeout)
    }

    async fn run(self) -> (Result<ToolOutput, ToolError>, Option<String>) {
        match self {
            Attempt::Here(started, timeout) => attempt(started, timeout).await,
            Attempt::Task(task, timeout) => {
                let joined = match timeout {
                    Some(t) => match tokio::time::timeout(t, task).await {
                        Ok(joined) => joined,
                        // Dropping the handle aborts the task.
                        Err(_) => return (Err(timeout_error(t)), None),
                    },
                    None => task.await,
                };
                joined.unwrap_or_else(|e| {
                    if e.is_panic() {
                        let message = panic_message(&e.into_panic());
                        (Err(ToolError::fatal("panicked")), Some(message))
                    } else {
                        // Only a runtime shutting down cancels the task: nothing to retry.
                        let error = ToolError::new("cancelled", "the call's task was cancelled");
                        (Err(error.permanent()), None)
                    }
                })
            }
        }
    }
}

/// What a call whose tool has `retries` needs to run again.
struct Retry {
    left: u32,
    handler: Arc<dyn ToolHandler>,
    args: Arc<Value>,
    ctx: ToolContext,
    sink: Option<Arc<dyn EventSink>>,
    /// Cancelled when no new attempt may start.
    stop: CancellationToken,
}

/// A call that finished: its index, its last attempt's result, how long it took, the panic
/// message if it panicked, and how many times it was retried.
type CallDone = (
    usize,
    Result<ToolOutput, ToolError>,
    Duration,
    Option<String>,
    u32,
);

/// The code and message of a failure worth another attempt: a recoverable error or a timeout that
/// is not marked permanent, nor about arguments the handler could not read (they would fail the
/// same way again, however the handler said so).
fn retryable(result: &Result<ToolOutput, ToolError>) -> Option<(&str, &str)> {
    match result {
        Err(ToolError::Recoverable {
            code,
            message,
            permanent: false,
        }) if code != "invalid_arguments" => Some((code, message)),
        _ => None,
    }
}

/// The error a call that ran past its tool's timeout ends with.
fn timeout_error(t: Duration) -> ToolError {
    ToolError::new(
        "timeout",
        format!("the tool did not finish within {:.1} s", t.as_secs_f64()),
    )
}

/// How a finished call ended, from its last attempt's result and panic.
fn call_result(result: Result<ToolOutput, ToolError>, panic: Option<String>) -> CallResult {
    match (result, panic) {
        (_, Some(message)) => CallResult::Panicked { message },
        (Ok(out), None) => CallResult::Ok(out),
        (Err(ToolError::Recoverable { code, message, .. }), None) => {
            CallResult::Error { code, message }
        }
        (Err(ToolError::Fatal { message }), None) => CallResult::Fatal { message },
    }
}

fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a tool handler panicked".to_owned()
    }
}
