//! The agent: a model, instructions, tools, limits and the seams around its runs (hooks, gates,
//! guardrails, sinks). Each run is a [`RunMachine`] driven by the local tokio driver.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{FutureExt, Stream};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::{AgentConfig, DecisionPolicy, OutputSchema};
use crate::driver::{Driver, Parts, RunLog, StepLog};
use crate::error::RunError;
use crate::event::{Event, EventSink, Sinks};
use crate::gate::Approvals;
use crate::gate::Gate;
use crate::guardrail::Guardrail;
use crate::hooks::{Hook, HookRole};
use crate::ids::{IdSource, UuidIds};
use crate::journal::{Definition, Journal, JournalError, JournalHeader, JournaledRun, RunStatus};
use crate::limits::{Limits, Pricing};
use crate::machine::{Input, RunMachine, RunStart, Seams};
use crate::message::Message;
use crate::model::{Model, ModelSettings};
use crate::outcome::RunOutcome;
use crate::outcome::StopReason;
use crate::steering::Steering;
use crate::tool::{Tool, ToolSet, ToolSource};

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
    /// The parent's call that started this run, for a subagent.
    pub parent_call_id: Option<String>,
    /// A subagent's path from the top of its tree (`coordinator/worker`): what its gates show
    /// a human who is asked. A subagent's tool sets it.
    pub agent_path: Option<String>,
    /// Extra event sinks for this run only.
    pub sinks: Vec<Arc<dyn EventSink>>,
    /// Skip every tool (reported as skipped): a dry run.
    pub skip_tools: bool,
    /// Limits for this run instead of the agent's (a subagent's share of its parent's budget).
    pub limits: Option<Limits>,
    /// A handle through which the application sends steering messages and follow-ups.
    pub steering: Option<Steering>,
    /// Where the run leaves its step log (every step's result), for a journal or a replay.
    pub log: Option<StepLog>,
    /// Makes the run durable: how it started and each step's result are written here before
    /// the run moves on, so that [`Agent::resume`] can go on with it in another process, and a
    /// gate that must ask a human suspends it instead of waiting (see [`crate::journal`]).
    pub journal: Option<Arc<dyn Journal>>,
    /// Where the application finds this agent again to resume the run; kept in the journal's
    /// header (the CLI keeps the agent file's path).
    pub origin: Option<String>,
    /// The run's depth in a tree of subagents: 0 for a run of its own; a subagent's tool sets
    /// it for the runs it starts.
    pub depth: u32,
    /// For [`Agent::resume`]: the time the run has taken so far, when the driver counts more
    /// than its journal's last step says. By default a resumed run's clock (and its deadline)
    /// goes on from that step: the time between the crash and the resume is not the run's. A
    /// driver that keeps wall-clock time across workers and waits (Restate's) gives its own.
    pub elapsed: Option<std::time::Duration>,
}

/// An agent: a model, instructions, tools and limits. Cheap to clone; runs share nothing mutable.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Parts>,
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
    /// `None` until set: the model's known window, if any.
    compaction: Option<Option<crate::compaction::Compaction>>,
    sinks: Vec<Arc<dyn EventSink>>,
    pricing: Option<Arc<dyn Pricing>>,
    ids: Arc<dyn IdSource>,
    gates: Vec<Arc<dyn Gate>>,
    hooks: Vec<(Arc<dyn Hook>, HookRole)>,
    input_guardrails: Vec<Arc<dyn Guardrail>>,
    output_guardrails: Vec<Arc<dyn Guardrail>>,
    definition: Definition,
    source: Option<Arc<dyn ToolSource>>,
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
            compaction: None,
            sinks: Vec::new(),
            pricing: None,
            ids: Arc::new(UuidIds),
            gates: Vec::new(),
            hooks: Vec::new(),
            input_guardrails: Vec::new(),
            output_guardrails: Vec::new(),
            definition: Definition::new(),
            source: None,
            error: None,
        }
    }

    /// The agent's configuration.
    pub fn config(&self) -> &Arc<AgentConfig> {
        &self.inner.cfg
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn Model> {
        &self.inner.model
    }

    /// What a resumed run must find unchanged, and whose [`Definition::fingerprint`] its journal
    /// keeps: the model, instructions, its own tools with their schemas (not a
    /// [`ToolSource`]'s, which the journal holds as each run listed them), limits, decision
    /// policy, output schema and settings, and the parts the application added
    /// ([`AgentBuilder::version`], [`AgentBuilder::definition_part`]).
    pub fn definition(&self) -> &Definition {
        &self.inner.definition
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

    /// The steps this agent's runs take with `options`: what a replay of one of its runs needs.
    pub fn seams(&self, options: &RunOptions) -> Seams {
        Seams {
            input_guardrails: !self.inner.input_guardrails.is_empty(),
            output_guardrails: !self.inner.output_guardrails.is_empty(),
            hooks: !self.inner.hooks.is_empty(),
            gates: self.inner.gates.len(),
            steering: options.steering.is_some(),
            skip_tools: options.skip_tools,
            dynamic_tools: self.inner.source.is_some(),
        }
    }

    /// Runs the agent over a transcript with an optional new message, with options.
    pub async fn run_with(
        &self,
        mut transcript: Vec<Message>,
        mut input: Option<Message>,
        mut options: RunOptions,
    ) -> RunOutcome {
        let run_id: Arc<str> = Arc::from(self.inner.ids.run_id());
        // The agent's own limits passed at build; a run's own are checked before anything runs.
        if let Some(limits) = &options.limits
            && let Err(e) = check_priced(limits, self.inner.pricing.as_ref(), &self.inner.model)
        {
            return refused(&run_id, transcript, input, e);
        }
        let seams = self.seams(&options);
        let keep_log = options.log.is_some() || cfg!(feature = "verify-replay");
        let log = keep_log.then(|| RunLog {
            run_id: run_id.to_string(),
            seams,
            limits: options.limits.clone(),
            transcript: transcript.clone(),
            input: input.clone(),
            steps: Vec::new(),
        });
        if let Some(journal) = &options.journal {
            let header = JournalHeader {
                run_id: run_id.to_string(),
                agent: self.inner.cfg.name().to_owned(),
                definition: self.inner.definition.clone(),
                fingerprint: self.inner.definition.fingerprint(),
                seams,
                limits: options.limits.clone(),
                transcript,
                input,
                origin: options.origin.take(),
            };
            if let Err(e) = journal.begin(&header).await {
                let error = RunError::Journal {
                    message: e.to_string(),
                };
                return refused(&run_id, header.transcript, header.input, error);
            }
            (transcript, input) = (header.transcript, header.input);
        }
        let machine = RunMachine::new(
            Arc::clone(&self.inner.cfg),
            RunStart {
                run_id,
                ids: Arc::clone(&self.inner.ids),
                seams,
                limits: options.limits.take(),
                transcript,
                input,
                observed: !self.inner.sinks.is_empty() || !options.sinks.is_empty(),
            },
        );
        let start = Instant::now();
        let approvals = match &options.journal {
            Some(_) => Approvals::durable([]),
            None => Approvals::none(),
        };
        self.driver(options, log, start, 0, approvals)
            .drive(machine)
            .await
    }

    fn driver(
        &self,
        options: RunOptions,
        log: Option<RunLog>,
        start: Instant,
        seq: u64,
        approvals: Approvals,
    ) -> Driver<'_> {
        let mut sinks = self.inner.sinks.clone();
        sinks.0.extend(options.sinks.iter().cloned());
        let cancel = options.cancel.unwrap_or_default();
        let mut approvals = approvals;
        let interrupt = approvals.link(&cancel);
        Driver {
            inner: &self.inner,
            sinks,
            interrupt,
            cancel,
            steering: options.steering,
            start,
            log,
            log_out: options.log,
            journaling: options.journal.is_some(),
            journal: options.journal,
            seq,
            journal_error: None,
            approvals,
            parent_run_id: options.parent_run_id,
            parent_call_id: options.parent_call_id,
            agent_path: options.agent_path,
            depth: options.depth,
            scope: None,
            source_tools: None,
            tools_synced: false,
        }
    }

    /// Goes on with a journaled run in this process: its steps are fed to a fresh machine (no
    /// model is called and no tool runs for them), then the run continues, journaling into
    /// `options.journal` (give the journal it came from). A tool call that finished is never
    /// run again; one that was running when the old process stopped runs again if its tool is
    /// idempotent, and is answered [`crate::CallOutcome::interrupted`] otherwise. Usage, cost,
    /// counts and the deadline continue from the journal.
    ///
    /// Refused when the run is over, when a suspended run has unanswered approvals, and, unless
    /// `force`, when the agent's [`Agent::definition`] changed since the run started (the error
    /// lists what changed).
    pub async fn resume(
        &self,
        run: JournaledRun,
        options: RunOptions,
        force: bool,
    ) -> Result<RunOutcome, JournalError> {
        let JournaledRun {
            header,
            steps,
            status,
            approvals,
        } = run;
        let not_resumable = |reason: String| JournalError::NotResumable {
            run_id: header.run_id.clone(),
            reason,
        };
        if let RunStatus::Finished { stop_reason } = &status {
            return Err(not_resumable(format!(
                "it is over (stop reason {stop_reason})"
            )));
        }
        let waiting: Vec<&str> = approvals
            .iter()
            .filter(|a| a.answer.is_none())
            .map(|a| a.request.call_id.as_str())
            .collect();
        if !waiting.is_empty() {
            return Err(not_resumable(format!(
                "approvals are unanswered for call {}",
                waiting.join(", ")
            )));
        }
        if !force && header.definition != self.inner.definition {
            return Err(JournalError::Changed {
                run_id: header.run_id.clone(),
                changes: self.inner.definition.changes(&header.definition, 20),
            });
        }
        let seams = self.seams(&options);
        if seams != header.seams {
            return Err(not_resumable(format!(
                "the agent's guardrails, hooks, gates or steering differ from the run's \
                 (run: {:?}, now: {seams:?})",
                header.seams
            )));
        }
        let JournalHeader {
            run_id,
            limits,
            transcript,
            input,
            ..
        } = header;
        let keep_log = options.log.is_some() || cfg!(feature = "verify-replay");
        let mut log = keep_log.then(|| RunLog {
            run_id: run_id.clone(),
            seams,
            limits: limits.clone(),
            transcript: transcript.clone(),
            input: input.clone(),
            steps: Vec::new(),
        });
        let mut machine = RunMachine::new(
            Arc::clone(&self.inner.cfg),
            RunStart {
                run_id: Arc::from(run_id.as_str()),
                ids: Arc::clone(&self.inner.ids),
                seams,
                limits,
                transcript,
                input,
                observed: !self.inner.sinks.is_empty() || !options.sinks.is_empty(),
            },
        );
        let mut at = std::time::Duration::ZERO;
        let seq = steps.len() as u64;
        for step in steps {
            at = step.at;
            if let Some(log) = &mut log {
                log.steps.push(step.clone());
            }
            machine.feed(step);
        }
        // What happened before this process was told then: its events are not sent again.
        machine.drain_events().for_each(drop);
        let at = options.elapsed.map_or(at, |e| e.max(at));
        let now = Instant::now();
        let start = now.checked_sub(at).unwrap_or(now);
        let answers = approvals
            .into_iter()
            .filter_map(|a| Some((a.request, a.answer?)));
        let mut driver = self.driver(options, log, start, seq, Approvals::durable(answers));
        driver.record(&mut machine, Input::Restarted).await;
        Ok(driver.drive(machine).await)
    }

    /// Runs the agent and yields its events as they happen, then the outcome.
    pub fn stream(&self, input: impl Into<String>) -> RunStream {
        self.stream_with(
            Vec::new(),
            Some(Message::user(input)),
            RunOptions::default(),
        )
    }

    /// [`Agent::stream`] over a transcript, with options. Dropping the stream cancels the run.
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
        let cancel = options
            .cancel
            .get_or_insert_with(CancellationToken::new)
            .clone();
        let agent = self.clone();
        let handle = tokio::spawn(async move { agent.run_with(transcript, input, options).await });
        RunStream {
            events: rx,
            handle: Some(handle),
            outcome: None,
            _cancel_on_drop: cancel.drop_guard(),
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

/// The stream of a running agent's events, ending with its outcome. Dropping it cancels the run.
#[derive(Debug)]
pub struct RunStream {
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    handle: Option<tokio::task::JoinHandle<RunOutcome>>,
    outcome: Option<RunOutcome>,
    _cancel_on_drop: DropGuard,
}

impl Stream for RunStream {
    type Item = StreamItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        if let Some(handle) = self.handle.as_mut()
            && let Poll::Ready(result) = handle.poll_unpin(cx)
        {
            self.handle = None;
            match result {
                Ok(outcome) => self.outcome = Some(outcome),
                // The run task never panics (every seam is isolated); a join error means the
                // runtime is shutting down.
                Err(_) => self.events.close(),
            }
        }
        if self.handle.is_none() {
            // The run is over: what it emitted is delivered, then the outcome, even while an
            // abandoned handler still holds a sender (its later progress is dropped).
            return match self.events.try_recv() {
                Ok(e) => Poll::Ready(Some(StreamItem::Event(e))),
                Err(_) => Poll::Ready(self.outcome.take().map(StreamItem::Outcome)),
            };
        }
        match self.events.poll_recv(cx) {
            Poll::Ready(Some(e)) => Poll::Ready(Some(StreamItem::Event(e))),
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

impl AgentBuilder {
    /// Sets the agent's name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the model (an `Arc<dyn Model>` is a model too).
    pub fn model(mut self, model: impl Model + 'static) -> Self {
        self.model = Some(Arc::new(model));
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

    /// Adds the tools of a source whose tools may change while the agent runs (an MCP server's):
    /// its tools as listed now join the agent's at `build`, and each turn of a run asks it again,
    /// so a change shows from the next turn on (see [`crate::machine::Action::ListTools`]). One
    /// source per agent; a later call replaces an earlier one.
    pub fn tool_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.source = Some(source);
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

    /// Compacts conversations that would pass a context window (see [`crate::compaction`]). By
    /// default an agent whose model is a common one
    /// ([`crate::compaction::known_context_tokens`]) is compacted by summary at that model's
    /// window, and any other is not.
    pub fn compaction(mut self, compaction: crate::compaction::Compaction) -> Self {
        self.compaction = Some(Some(compaction));
        self
    }

    /// Never compacts: a conversation past the model's window fails as the provider refuses it.
    pub fn without_compaction(mut self) -> Self {
        self.compaction = Some(None);
        self
    }

    /// Adds an event sink (an `Arc<dyn EventSink>` is a sink too).
    pub fn sink(mut self, sink: impl EventSink + 'static) -> Self {
        self.sinks.push(Arc::new(sink));
        self
    }

    /// Sets the pricing (a [`crate::PriceTable`] or a cost function).
    pub fn pricing(mut self, pricing: impl Pricing + 'static) -> Self {
        self.pricing = Some(Arc::new(pricing));
        self
    }

    /// Sets where run and call ids come from.
    pub fn ids(mut self, ids: impl IdSource + 'static) -> Self {
        self.ids = Arc::new(ids);
        self
    }

    /// Adds an admission gate; gates see each batch in the order they were added, after the
    /// hooks' `before_tool_call`.
    pub fn gate(mut self, gate: impl Gate + 'static) -> Self {
        self.gates.push(Arc::new(gate));
        self
    }

    /// Adds a hook whose failure fails the run.
    pub fn hook(mut self, hook: impl Hook + 'static) -> Self {
        self.hooks.push((Arc::new(hook), HookRole::Required));
        self
    }

    /// Adds a stop condition: after each tool turn, `predicate` sees the run's state, and `true`
    /// ends the run with the stop reason `terminated` (the output is the last assistant text).
    /// A [`Hook`] can do the same with [`Hook::should_stop`].
    pub fn stop_when<F>(self, name: impl Into<String>, predicate: F) -> Self
    where
        F: Fn(&crate::hooks::RunState<'_>) -> bool + Send + Sync + 'static,
    {
        self.hook(crate::hooks::StopWhen::new(name, predicate))
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

    /// The agent's version, as the application numbers it: part of its [`Agent::definition`],
    /// so that resuming a run started under another version is refused.
    pub fn version(self, version: impl Into<String>) -> Self {
        self.definition_part("version", Value::String(version.into()))
    }

    /// A part of the agent's [`Agent::definition`] that the agent cannot see for itself (its
    /// permission rules, how its tools are implemented).
    pub fn definition_part(mut self, key: impl Into<String>, value: Value) -> Self {
        self.definition.set(key, value);
        self
    }

    /// The definition the agent will have ([`Agent::definition`]): the parts the application
    /// set, and the agent's own for the rest (a part the application set is kept, so the
    /// application may say what the model is in its own terms).
    pub fn definition(&self) -> Definition {
        let mut definition = self.definition.clone();
        let mut own = |key: &str, value: Value| {
            if definition.get(key).is_none() {
                definition.set(key, value);
            }
        };
        own("agent", Value::String(self.name.clone()));
        own(
            "model",
            serde_json::json!(
                self.model
                    .as_ref()
                    .map(|m| { serde_json::json!({"provider": m.provider(), "id": m.id()}) })
            ),
        );
        own("instructions", serde_json::json!(self.instructions));
        // The agent's own tools only: a tool source's may change at any turn, and a run's step
        // log (its journal) holds them as they were listed, so a resume needs them unchanged no
        // more than a run does (the application names the source itself, with
        // [`AgentBuilder::definition_part`]).
        own(
            "tools",
            Value::Object(
                self.tools
                    .specs()
                    .iter()
                    .map(|s| (s.name.clone(), serde_json::to_value(s).unwrap_or_default()))
                    .collect(),
            ),
        );
        own(
            "limits",
            serde_json::to_value(&self.limits).unwrap_or_default(),
        );
        own(
            "policy",
            serde_json::to_value(self.policy).unwrap_or_default(),
        );
        own("output_schema", serde_json::json!(self.output_schema));
        own(
            "settings",
            serde_json::to_value(&self.settings).unwrap_or_default(),
        );
        if let Some(c) = &self.compaction {
            own("compaction", serde_json::to_value(c).unwrap_or_default());
        }
        definition
    }

    /// Builds the agent.
    pub fn build(mut self) -> Result<Agent, RunError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let definition = self.definition();
        let own_tools = self.tools.len();
        if let Some(source) = &self.source {
            for tool in source.tools() {
                self.tools.register(tool)?;
            }
        }
        let has_subagents = self.tools.specs().iter().any(|s| s.subagent);
        let Some(model) = self.model else {
            return Err(RunError::Other {
                message: "the agent has no model".into(),
            });
        };
        self.limits.check().map_err(|message| RunError::Other {
            message: format!("invalid limits: {message}"),
        })?;
        check_priced(&self.limits, self.pricing.as_ref(), &model)?;
        let output_schema = match self.output_schema {
            Some(schema) => Some(OutputSchema::new(schema).map_err(|e| RunError::Other {
                message: format!("invalid output schema: {e}"),
            })?),
            None => None,
        };
        let compaction = self.compaction.unwrap_or_else(|| {
            crate::compaction::known_context_tokens(model.id())
                .map(crate::compaction::Compaction::new)
        });
        let cfg = AgentConfig {
            name: self.name,
            instructions: self.instructions,
            tools: self.tools,
            own_tools,
            limits: self.limits,
            policy: self.policy,
            output_schema,
            settings: self.settings,
            compaction,
        };
        Ok(Agent {
            inner: Arc::new(Parts {
                cfg: Arc::new(cfg),
                model,
                sinks: Sinks(self.sinks),
                pricing: self.pricing,
                ids: self.ids,
                gates: self.gates,
                hooks: self.hooks,
                input_guardrails: self.input_guardrails,
                output_guardrails: self.output_guardrails,
                definition,
                has_subagents,
                source: self.source,
            }),
        })
    }
}

/// The outcome of a run refused before it started: failed with `error`, the input kept in the
/// transcript, nothing called.
fn refused(
    run_id: &str,
    mut transcript: Vec<Message>,
    input: Option<Message>,
    error: RunError,
) -> RunOutcome {
    let new_messages_from = transcript.len();
    transcript.extend(input);
    RunOutcome {
        run_id: run_id.to_owned(),
        stop_reason: StopReason::Failed,
        output: None,
        structured_output: None,
        transcript,
        new_messages_from,
        usage: crate::model::Usage::default(),
        cost_usd: 0.0,
        unpriced_model_calls: 0,
        turns: 0,
        model_calls: 0,
        tool_calls_run: 0,
        tool_calls: Vec::new(),
        limit: None,
        error: Some(error),
        duration: std::time::Duration::ZERO,
        subagents: Vec::new(),
        compactions: Vec::new(),
    }
}

/// Refuses a cost budget that could never hold: `max_cost_usd` with no pricing, or with a
/// pricing that has no price for the model (asked with empty usage; one that panics prices
/// nothing). The one check for the builder's limits and a run's own.
fn check_priced(
    limits: &Limits,
    pricing: Option<&Arc<dyn Pricing>>,
    model: &Arc<dyn Model>,
) -> Result<(), RunError> {
    if limits.max_cost_usd.is_none() {
        return Ok(());
    }
    let priced = pricing.is_some_and(|p| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.cost(
                model.provider(),
                model.id(),
                &crate::model::Usage::default(),
            )
        }))
        .ok()
        .flatten()
        .is_some()
    });
    if priced {
        Ok(())
    } else {
        Err(RunError::UnpricedModel {
            model: model.id().to_owned(),
            provider: model.provider().to_owned(),
        })
    }
}
