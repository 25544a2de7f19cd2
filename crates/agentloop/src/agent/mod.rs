//! The agent: a model, instructions, tools, limits and the seams around its runs (hooks, gates,
//! guardrails, sinks). Each run is a [`RunMachine`] driven by the local tokio driver. This is the
//! top layer of the crate (see the crate's `docs/architecture.md`): the facade and its features.
//!
//! - `mod.rs`: [`Agent`], its runs, resumes and streams.
//! - `builder.rs`: [`AgentBuilder`].
//! - `ask.rs`: the model's questions to the user (`ask_user`) and the gate that answers them.
//! - `permissions/`: permission rules with human approval, one [`crate::Gate`] (`mod.rs`: the
//!   rules, their store and the gate; `command.rs`: what a shell command runs, as deny and ask
//!   command prefixes read it; `resolve.rs`: the seam a tool resolves its paths through).
//! - `session.rs`: conversations kept from run to run.
//! - `subagent.rs`: an agent as a tool of another.

pub mod ask;
pub mod handoff;
mod handoff_history;
pub mod permissions;
pub mod session;
pub mod subagent;

mod builder;

pub use builder::AgentBuilder;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use futures::{FutureExt, Stream};
use std::future::ready;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::AgentConfig;
use crate::driver::{Driver, Parts, RunLog, StepLog};
use crate::error::RunError;
use crate::event::{Event, EventSink};
use crate::gate::Approvals;
use crate::journal::{
    Definition, Journal, JournalError, JournalHeader, JournaledRun, ParentCall, RunStatus,
    child_run_id,
};
use crate::limits::Limits;
use crate::machine::{RunMachine, RunStart, Seams};
use crate::message::Message;
use crate::model::Model;
use crate::outcome::RunOutcome;
use crate::outcome::StopReason;
use crate::steering::Steering;
use builder::check_priced;

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
    /// The run's id, when the application names it (an A2A task is the run of the same id, so
    /// a server that restarts finds the task in the journal); else the agent's
    /// [`crate::ids::IdSource`] draws one. A subagent's journaled run keeps the id its parent's
    /// call gives it. An id the journal already holds is refused there.
    pub run_id: Option<String>,
    /// The conversation this run is a turn of (a session's id, an A2A context's), kept in the
    /// journal's header so that whoever finds the run there knows it.
    pub session: Option<String>,
    /// The service that starts this run for its callers (`a2a`), kept in the journal's header:
    /// a service finds there only the runs it started, never a run of the application's own
    /// (`agentloop run --journal`) that a caller names by its id.
    pub served_by: Option<String>,
}

/// Where a run sits, as the runtime sets it (never the application): its place in a tree of
/// subagents, and a resumed run's clock.
#[derive(Debug, Default)]
pub(crate) struct Plumbing {
    /// The call of a parent run that started this one, for a subagent.
    pub(crate) parent: Option<ParentCall>,
    /// A subagent's path from the top of its tree (`coordinator/worker`): what its gates show
    /// a human who is asked.
    pub(crate) agent_path: Option<String>,
    /// The run's depth in a tree of subagents: 0 for a run of its own.
    pub(crate) depth: u32,
    /// For a resume: the time the run has taken so far (see [`Agent::resume_at`]).
    pub(crate) elapsed: Option<std::time::Duration>,
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

impl Agent {
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
    /// [`crate::ToolSource`]'s, which the journal holds as each run listed them), limits, decision
    /// policy, output schema and settings, and the parts the application added
    /// ([`AgentBuilder::version`], [`AgentBuilder::definition_part`]).
    pub fn definition(&self) -> &Definition {
        &self.inner.definition
    }

    /// Runs the agent on one input.
    pub fn run(&self, input: impl Into<String>) -> impl Future<Output = RunOutcome> + Send + '_ {
        self.run_with(
            Vec::new(),
            Some(Message::user(input)),
            RunOptions::default(),
        )
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
    ///
    /// (`run`, `run_with` and the run's inner steps return their futures rather than being
    /// `async fn`s: an `async fn` keeps its arguments twice in its future, and each wrapper its
    /// own copy, which every running run pays for in memory.)
    pub fn run_with(
        &self,
        transcript: Vec<Message>,
        input: Option<Message>,
        options: RunOptions,
    ) -> impl Future<Output = RunOutcome> + Send + '_ {
        self.start(transcript, input, options, Plumbing::default())
    }

    /// [`Agent::run_with`], in its place: a subagent's run names the call that starts it (a
    /// journaled child takes the id its parent's call gives it, and its header names the call).
    ///
    /// Two futures one after the other, not one: what begins the run (its options, its input,
    /// its journal's header) is dropped before the run is driven, where one `async` block
    /// would keep it beside the driven run until the end (540 bytes of every running run's
    /// task, `agentloop-bench scale`).
    pub(crate) fn start(
        &self,
        transcript: Vec<Message>,
        input: Option<Message>,
        options: RunOptions,
        plumbing: Plumbing,
    ) -> impl Future<Output = RunOutcome> + Send + '_ {
        self.begin(transcript, input, options, plumbing)
            .then(|begun| match begun {
                Ok((driver, machine)) => Either::Left(driver.drive(machine, None)),
                Err(refused) => Either::Right(ready(*refused)),
            })
    }

    /// The run's beginning: its id, its checks, its journal's header; then its machine and its
    /// driver, or the outcome of a run refused before it began.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its future"
    )]
    fn begin(
        &self,
        mut transcript: Vec<Message>,
        mut input: Option<Message>,
        mut options: RunOptions,
        plumbing: Plumbing,
    ) -> impl Future<Output = Result<(Driver<'_>, RunMachine), Box<RunOutcome>>> + Send + '_ {
        async move {
            let run_id: Arc<str> = match (&plumbing.parent, &options.journal) {
                (Some(p), Some(_)) => Arc::from(child_run_id(&p.run_id, &p.call_id)),
                _ => match options.run_id.take() {
                    Some(id) => Arc::from(id),
                    None => Arc::from(self.inner.ids.run_id()),
                },
            };
            // The agent's own limits passed at build; a run's own are checked before anything runs.
            if let Some(limits) = &options.limits
                && let Err(e) = check_priced(limits, self.inner.pricing.as_ref(), &self.inner.model)
            {
                let refused = refused(self.inner.cfg.name(), &run_id, transcript, input, e);
                return Err(Box::new(refused));
            }
            let seams = self.seams(&options);
            let log = run_log(
                &options,
                &run_id,
                seams,
                &options.limits,
                &transcript,
                &input,
            );
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
                    parent: plumbing.parent.clone(),
                    session: options.session.take(),
                    served_by: options.served_by.take(),
                };
                if let Err(e) = journal.begin(&header).await {
                    let error = RunError::Journal {
                        message: e.to_string(),
                    };
                    return Err(Box::new(refused(
                        self.inner.cfg.name(),
                        &run_id,
                        header.transcript,
                        header.input,
                        error,
                    )));
                }
                (transcript, input) = (header.transcript, header.input);
            }
            let limits = options.limits.take();
            let machine = self.machine(&options, run_id, seams, limits, transcript, input);
            let start = Instant::now();
            let approvals = match &options.journal {
                Some(_) => Approvals::durable([]),
                None => Approvals::none(),
            };
            let driver = Self::driver(&self.inner, options, plumbing, log, start, 0, approvals);
            Ok((driver, machine))
        }
    }

    /// A fresh machine for a run of this agent (a new one, or one a journal is fed to).
    fn machine(
        &self,
        options: &RunOptions,
        run_id: Arc<str>,
        seams: Seams,
        limits: Option<Limits>,
        transcript: Vec<Message>,
        input: Option<Message>,
    ) -> RunMachine {
        RunMachine::new(
            Arc::clone(&self.inner.cfg),
            RunStart {
                run_id,
                ids: Arc::clone(&self.inner.ids),
                seams,
                limits,
                transcript,
                input,
                observed: !self.inner.sinks.is_empty() || !options.sinks.is_empty(),
            },
        )
    }

    /// The driver of a run of `parts`.
    fn driver<'a>(
        parts: &'a Parts,
        options: RunOptions,
        plumbing: Plumbing,
        log: Option<Box<RunLog>>,
        start: Instant,
        seq: u64,
        approvals: Approvals,
    ) -> Driver<'a> {
        let mut sinks = parts.sinks.clone();
        sinks.0.extend(options.sinks.iter().cloned());
        let cancel = options.cancel.unwrap_or_default();
        let mut approvals = approvals;
        let interrupt = approvals.link(&cancel);
        let approvals = Arc::new(approvals);
        Driver {
            inner: parts,
            sinks,
            interrupt,
            cancel,
            steering: options.steering,
            start,
            log,
            log_out: options.log,
            journaling: options.journal.is_some(),
            suspended: false,
            journal: options.journal,
            seq,
            approvals,
            parent: plumbing.parent.map(Box::new),
            agent_path: plumbing.agent_path,
            depth: plumbing.depth,
            scope: None,
            source_tools: None,
            tools_synced: false,
            held: None,
            interrupts: Default::default(),
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
    /// lists what changed); with `force`, when the changed agent cannot replay the journal (the
    /// machine stops before its last step, or fails on it: [`JournalError::NotResumable`]), as
    /// a tool gone that a journaled call ran, or a limit the journaled steps pass, would:
    /// nothing is written then.
    ///
    /// Not an `async fn`: that kept `run` and `options` (784 bytes) beside the resumed run's own
    /// future, which holds them too, for the whole run.
    pub fn resume(
        &self,
        run: JournaledRun,
        options: RunOptions,
        force: bool,
    ) -> impl Future<Output = Result<RunOutcome, JournalError>> + Send + '_ {
        match &run.header.parent {
            Some(parent) => Either::Left(ready(Err(parent.not_resumable(&run.header.run_id)))),
            None => Either::Right(self.go_on(run, options, force, Plumbing::default())),
        }
    }

    /// [`Agent::resume`], for a driver that counts more time than the journal's last step says:
    /// `elapsed` is the time the run has taken so far. By default a resumed run's clock (and its
    /// deadline) goes on from that step, the time between a crash and the resume not being the
    /// run's; a driver that keeps wall-clock time across workers and waits (Restate's, or a
    /// suspended run's wait for approvals) gives its own.
    ///
    /// Not an `async fn`, as [`Agent::resume`].
    pub fn resume_at(
        &self,
        run: JournaledRun,
        options: RunOptions,
        force: bool,
        elapsed: std::time::Duration,
    ) -> impl Future<Output = Result<RunOutcome, JournalError>> + Send + '_ {
        if let Some(parent) = &run.header.parent {
            return Either::Left(ready(Err(parent.not_resumable(&run.header.run_id))));
        }
        let plumbing = Plumbing {
            elapsed: Some(elapsed),
            ..Plumbing::default()
        };
        Either::Right(self.go_on(run, options, force, plumbing))
    }

    /// [`Agent::resume`], for a top-level run or (from its parent's call) a child journal.
    ///
    /// The journal is checked and replayed before the returned future is first polled, and what
    /// the run needs then is handed to it boxed: an `async fn` kept its arguments, the journal's
    /// header and the replayed machine in the future beside the driven run's own (5 KB every
    /// resumed run held, the Restate worker's every run among them).
    pub(crate) fn go_on(
        &self,
        run: JournaledRun,
        options: RunOptions,
        force: bool,
        plumbing: Plumbing,
    ) -> impl Future<Output = Result<RunOutcome, JournalError>> + Send + '_ {
        let ready_to_go = match self.replay_to_go_on(run, options, force, plumbing) {
            Ok(ready_to_go) => Box::new(ready_to_go),
            Err(e) => return Either::Left(ready(Err(e))),
        };
        Either::Right(async move {
            // Destructured, not kept whole: a `GoOn` borrowed across the await below would stay
            // in this future, its machine with it (1.3 KB).
            let GoOn {
                machine,
                resumed,
                options,
                plumbing,
                log,
                start,
                seq,
                approvals,
                children,
            } = *ready_to_go;
            let parts = resumed.as_ref().unwrap_or(&self.inner);
            let driver = Self::driver(parts, options, plumbing, log, start, seq, approvals);
            Ok(driver.drive(machine, Some(children)).await)
        })
    }

    /// The calls a journaled run waits on that have no answer: it cannot go on before they
    /// have. None past its deadline, where a run goes on only to stop (the machine's rule), and
    /// what it waits on needs no answer. `elapsed`: the run's time, its wait counted, when the
    /// driver counts it.
    pub(crate) fn waiting_on<'r>(
        &self,
        header: &crate::journal::JournalHeader,
        steps: &[crate::machine::Step],
        approvals: &'r [crate::journal::PendingApproval],
        elapsed: Option<std::time::Duration>,
    ) -> Vec<&'r str> {
        let at = steps.last().map_or(std::time::Duration::ZERO, |s| s.at);
        let at = elapsed.map_or(at, |e| e.max(at));
        let limits = header.limits.as_ref().unwrap_or(self.inner.cfg.limits());
        if limits.deadline().is_some_and(|t| at >= t) {
            return Vec::new();
        }
        approvals
            .iter()
            .filter(|a| a.answer.is_none())
            .map(|a| a.request.call_id.as_str())
            .collect()
    }

    /// [`Agent::go_on`]'s checks and replay: the journal's steps fed to a fresh machine.
    fn replay_to_go_on(
        &self,
        run: JournaledRun,
        options: RunOptions,
        force: bool,
        plumbing: Plumbing,
    ) -> Result<GoOn, JournalError> {
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
        let waiting = self.waiting_on(&header, &steps, &approvals, plumbing.elapsed);
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
        let mut log = run_log(&options, &run_id, seams, &limits, &transcript, &input);
        let run_id = Arc::from(run_id.as_str());
        let mut machine = self.machine(&options, run_id, seams, limits, transcript, input);
        // A model whose answers depend on the calls before (a script) goes on where the
        // journal left it.
        let resumed = self
            .inner
            .model
            .resumed(crate::machine::model_calls(&steps))
            .map(|model| Parts {
                model,
                ..Parts::clone(&self.inner)
            });
        let mut at = std::time::Duration::ZERO;
        let seq = steps.len() as u64;
        for (n, step) in (0u64..).zip(steps) {
            // A journal the machine stops short of (an agent changed under `force`: a tool gone,
            // a tighter limit) is refused ([`does_not_replay`]).
            if machine.is_done() {
                return Err(does_not_replay(
                    &machine,
                    format!("before step {n} of {seq}"),
                ));
            }
            at = step.at;
            if let Some(log) = &mut log {
                log.steps.push(step.clone());
            }
            machine.feed(step);
        }
        // The last step may be the one the changed agent cannot take: the machine fails on it
        // (a call it never asked for, say), where a journal that fits never makes it fail so.
        if machine.is_done() && matches!(machine.error(), Some(RunError::Other { .. })) {
            let last = seq.saturating_sub(1);
            return Err(does_not_replay(
                &machine,
                format!("at step {last}, its last"),
            ));
        }
        // What happened before this process was told then: its events are not sent again.
        machine.drain_events().for_each(drop);
        let at = plumbing.elapsed.map_or(at, |e| e.max(at));
        let now = Instant::now();
        let start = now.checked_sub(at).unwrap_or(now);
        let answers = approvals
            .into_iter()
            .filter_map(|a| Some((a.request, a.answer?, a.reply)));
        let children = options.journal.as_ref().is_some_and(|j| j.holds_children());
        let approvals = Approvals::durable_with_replies(answers);
        Ok(GoOn {
            machine,
            resumed,
            options,
            plumbing,
            log,
            start,
            seq,
            approvals,
            children,
        })
    }

    /// The outcome of a journaled run that is over, from its steps alone (no model is called,
    /// no tool runs): what a finished child answers its parent's call with when the parent
    /// resumes.
    pub(crate) fn replayed(&self, run: JournaledRun) -> RunOutcome {
        let options = RunOptions::default();
        let JournalHeader {
            run_id,
            seams,
            limits,
            transcript,
            input,
            ..
        } = run.header;
        let mut machine = self.machine(
            &options,
            Arc::from(run_id),
            seams,
            limits,
            transcript,
            input,
        );
        let mut at = std::time::Duration::ZERO;
        for step in run.steps {
            at = step.at;
            machine.feed(step);
        }
        machine.drain_events().for_each(drop);
        machine.into_outcome(at)
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
        let backlog = Arc::new(crate::event::Backlog::new(STREAM_BACKLOG));
        options.sinks.push(Arc::new(StreamSink {
            tx,
            backlog: Arc::clone(&backlog),
        }));
        let cancel = options
            .cancel
            .get_or_insert_with(CancellationToken::new)
            .clone();
        let agent = self.clone();
        let handle = tokio::spawn(async move { agent.run_with(transcript, input, options).await });
        RunStream {
            events: rx,
            backlog,
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

/// How many events a [`RunStream`] holds that its reader has not taken before the run waits for
/// it ([`crate::Backlog`]): a reader slower than the model slows the run, and memory stays
/// bounded.
pub const STREAM_BACKLOG: usize = 1024;

/// The sink of a [`RunStream`]: each event goes to the stream's channel, counted in its backlog.
struct StreamSink {
    tx: tokio::sync::mpsc::UnboundedSender<Event>,
    backlog: Arc<crate::event::Backlog>,
}

impl EventSink for StreamSink {
    fn emit(&self, event: &Event) {
        if self.tx.send(event.clone()).is_ok() {
            self.backlog.pushed();
        }
    }

    fn backlog(&self) -> Option<&crate::event::Backlog> {
        Some(&self.backlog)
    }
}

/// The stream of a running agent's events, ending with its outcome. Dropping it cancels the run.
/// It holds up to [`STREAM_BACKLOG`] events the reader has not taken; then the run waits for
/// the reader, between its steps and between a model's deltas.
#[derive(Debug)]
pub struct RunStream {
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    backlog: Arc<crate::event::Backlog>,
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
                Ok(e) => {
                    self.backlog.taken();
                    Poll::Ready(Some(StreamItem::Event(e)))
                }
                Err(_) => Poll::Ready(self.outcome.take().map(StreamItem::Outcome)),
            };
        }
        match self.events.poll_recv(cx) {
            Poll::Ready(Some(e)) => {
                self.backlog.taken();
                Poll::Ready(Some(StreamItem::Event(e)))
            }
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        // The run is cancelled (`_cancel_on_drop`); nothing of it may wait for this reader.
        self.backlog.close();
    }
}

/// A journaled run checked and replayed, ready to go on ([`Agent::go_on`]).
struct GoOn {
    machine: RunMachine,
    /// The agent's parts with its model where the journal left it, when the model is a script.
    resumed: Option<Parts>,
    options: RunOptions,
    plumbing: Plumbing,
    log: Option<Box<RunLog>>,
    start: Instant,
    seq: u64,
    approvals: Approvals,
    children: bool,
}

/// The step log a run keeps when its caller asked for one (or, in the crate's tests, to check
/// its replay): how it started, and then each step.
/// The refusal of a journal that a changed agent (resumed with `force`) stops replaying `at` a
/// step: going on would drop the steps after it, calls that ran among them then reported as
/// never run, and close the run for good; refused, it is left as it was for the agent it
/// started with.
fn does_not_replay(machine: &RunMachine, at: String) -> JournalError {
    let why = machine.error().map_or_else(
        || {
            machine
                .stop_reason()
                .map(ToString::to_string)
                .unwrap_or_default()
        },
        ToString::to_string,
    );
    JournalError::NotResumable {
        run_id: machine.run_id().to_string(),
        reason: format!(
            "its journal does not replay with the agent as it is now: the run stops {at} \
             ({why}); resume it with the agent it started with"
        ),
    }
}

fn run_log(
    options: &RunOptions,
    run_id: &str,
    seams: Seams,
    limits: &Option<Limits>,
    transcript: &[Message],
    input: &Option<Message>,
) -> Option<Box<RunLog>> {
    let keep = options.log.is_some() || cfg!(feature = "verify-replay");
    keep.then(|| {
        Box::new(RunLog {
            run_id: run_id.to_owned(),
            seams,
            limits: limits.clone(),
            transcript: transcript.to_vec(),
            input: input.clone(),
            steps: Vec::new(),
        })
    })
}

/// The outcome of a run refused before it started: failed with `error`, the input kept in the
/// transcript, nothing called.
fn refused(
    agent: &str,
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
        cached_tokens: 0,
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
        answered_by: agent.to_owned(),
        warnings: Vec::new(),
    }
}
