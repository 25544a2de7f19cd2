//! One tracker of what a stream of events leaves open: runs (and the tree of subagent runs under
//! tool calls), their turns, model calls and tool calls. It owns the lifecycle; a [`Render`] owns
//! what each span looks like (a trace record, an OpenTelemetry span, a terminal line).
//!
//! The rules live here once:
//! - A run opens at `RunStarted`. Events of a run never seen start open it as *joined* (the
//!   renderer may decline it, and then every event of that run is ignored).
//! - A turn opens at `TurnStarted` (closing the one before), or at the first event that belongs
//!   inside turn N (a model request, a tool call's start or rejection, a tools change, a
//!   compaction) when turn N is not the open one.
//! - A model call opens at `ModelRequestStarted`; a second request while one is open *supersedes*
//!   it. It closes at `ModelResponse` or `ModelError`; an end whose start was never seen is an
//!   *orphan*: it opens and closes at once, started as long ago as it says it took.
//! - A tool call opens at `ToolStarted`, keyed by its call id (calls of a batch run in parallel),
//!   and closes at `ToolFinished` (an orphan when never seen start); a rejected call opens and
//!   closes at once.
//! - `RunFinished` closes what the run left open, in order: its model call, its tool calls (by
//!   turn, then call id), its turn, then the run itself.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use agentloop::event::ErrorSummary;
use agentloop::model::Usage;
use agentloop::{CallOutcome, Event, EventKind, StopReason};

/// How a span came to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// Its starting event was seen, and is the event at hand.
    Started,
    /// Only its end was seen (the event at hand): it opens and closes at once, and started
    /// `ago` before now (the duration its end reports).
    Orphan {
        /// How long before now the span started.
        ago: Duration,
    },
}

/// Why a model call closed.
#[derive(Debug, Clone, Copy)]
pub enum ModelEnd<'a> {
    /// A `ModelResponse` (the event, to read its usage, text and finish reason from).
    Responded(&'a Event),
    /// A `ModelError`.
    Failed {
        /// The error's stable code.
        code: &'a str,
        /// The error's message.
        message: &'a str,
    },
    /// A second model request of the same run started while this one was open.
    Superseded,
    /// The run ended (or was abandoned) with the call still open.
    RunEnded(&'a RunEnd<'a>),
}

/// Why a tool call closed.
#[derive(Debug, Clone, Copy)]
pub enum ToolEnd<'a> {
    /// A `ToolFinished`, with the call's outcome.
    Finished(&'a CallOutcome),
    /// A `ToolRejected`: the call never started.
    Rejected {
        /// The rejection's code.
        code: &'a str,
        /// Why, for the operator.
        reason: &'a str,
        /// The call's typed outcome.
        outcome: &'a CallOutcome,
    },
    /// The run ended (or was abandoned) with the call still running.
    RunEnded(&'a RunEnd<'a>),
}

/// How a run ended.
#[derive(Debug, Clone, Copy)]
pub enum RunEnd<'a> {
    /// Its `RunFinished` event.
    Finished {
        /// Why it stopped.
        stop_reason: &'a StopReason,
        /// The tokens it used.
        usage: &'a Usage,
        /// What it cost.
        cost_usd: f64,
        /// How many turns it took.
        turns: u32,
        /// What failed, when something did.
        error: Option<&'a ErrorSummary>,
    },
    /// The observer stopped before the run ended ([`Tracker::abandon_all`]).
    Abandoned,
}

/// Who a run and its spans are, as far as events told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunHead {
    /// The run's id.
    pub run_id: String,
    /// The agent's name (empty for a joined run).
    pub agent: String,
    /// The model the run started with (empty for a joined run).
    pub model: String,
    /// The run that started this one as a subagent.
    pub parent_run_id: Option<String>,
    /// The call of the parent run that started this one.
    pub parent_call_id: Option<String>,
    /// How many subagent runs down from a top-level run (0); a run whose parent was never seen
    /// is one down from the top.
    pub depth: usize,
    /// The run was never seen start: only later events were.
    pub joined: bool,
}

/// A parent run, as a new subagent run sees it.
pub struct Parent<'a, R: Render + ?Sized> {
    /// The parent run.
    pub run: &'a Tracked<R>,
    /// The parent's tool call that started the subagent, while it is open.
    pub call: Option<&'a R::ToolCall>,
}

/// What a renderer makes of the lifecycle. Each method is told one step and keeps what it needs
/// in its own span types; the [`Tracker`] keeps them open and hands them back at their end.
pub trait Render {
    /// What a renderer keeps of an open run.
    type Run;
    /// What a renderer keeps of an open turn.
    type Turn;
    /// What a renderer keeps of an open model call.
    type ModelCall;
    /// What a renderer keeps of an open tool call.
    type ToolCall;

    /// A run opens: at its `RunStarted` (the event), or joined at its first event seen. `None`
    /// declines it: the run is not tracked, and its events are ignored.
    fn open_run(
        &mut self,
        head: &RunHead,
        parent: Option<Parent<'_, Self>>,
        event: &Event,
    ) -> Option<Self::Run>;
    /// Turn `turn` of `run` opens.
    fn open_turn(&mut self, run: &mut Tracked<Self>, turn: u32) -> Self::Turn;
    /// The open turn closes.
    fn close_turn(&mut self, run: &mut Tracked<Self>, turn: Self::Turn);
    /// A model call opens: at its `ModelRequestStarted` (the event), or as an orphan at its end.
    fn open_model_call(
        &mut self,
        run: &mut Tracked<Self>,
        event: &Event,
        opening: Opening,
    ) -> Self::ModelCall;
    /// The open model call closes.
    fn close_model_call(
        &mut self,
        run: &mut Tracked<Self>,
        call: Self::ModelCall,
        end: ModelEnd<'_>,
    );
    /// A tool call opens: at its `ToolStarted` or `ToolRejected` (the event), or as an orphan at
    /// its `ToolFinished`.
    fn open_tool_call(
        &mut self,
        run: &mut Tracked<Self>,
        event: &Event,
        opening: Opening,
    ) -> Self::ToolCall;
    /// A tool call closes.
    fn close_tool_call(&mut self, run: &mut Tracked<Self>, call: Self::ToolCall, end: ToolEnd<'_>);
    /// The run closes, after everything it left open.
    fn close_run(&mut self, run: Tracked<Self>, end: &RunEnd<'_>);
    /// An event of an open run that opens or closes no span (deltas, retries, limits, hook
    /// failures, a tools change, a compaction, a tool source's output).
    fn on_event(&mut self, run: &mut Tracked<Self>, event: &Event);
}

/// The run tree alone: depths, parents and counts, no spans.
impl Render for () {
    type Run = ();
    type Turn = ();
    type ModelCall = ();
    type ToolCall = ();

    fn open_run(&mut self, _: &RunHead, _: Option<Parent<'_, Self>>, _: &Event) -> Option<()> {
        Some(())
    }
    fn open_turn(&mut self, _: &mut Tracked<Self>, _: u32) {}
    fn close_turn(&mut self, _: &mut Tracked<Self>, _: ()) {}
    fn open_model_call(&mut self, _: &mut Tracked<Self>, _: &Event, _: Opening) {}
    fn close_model_call(&mut self, _: &mut Tracked<Self>, _: (), _: ModelEnd<'_>) {}
    fn open_tool_call(&mut self, _: &mut Tracked<Self>, _: &Event, _: Opening) {}
    fn close_tool_call(&mut self, _: &mut Tracked<Self>, _: (), _: ToolEnd<'_>) {}
    fn close_run(&mut self, _: Tracked<Self>, _: &RunEnd<'_>) {}
    fn on_event(&mut self, _: &mut Tracked<Self>, _: &Event) {}
}

/// An open run: what the tracker knows of it, and the renderer's own [`Tracked::data`].
pub struct Tracked<R: Render + ?Sized> {
    head: RunHead,
    turn: Option<(u32, R::Turn)>,
    calls_in_turn: u32,
    model_call: Option<R::ModelCall>,
    /// Open tool calls by call id, with the turn each opened in.
    tools: HashMap<String, (u32, R::ToolCall)>,
    model_calls: u32,
    tool_calls: u32,
    last_text: Option<String>,
    /// The run's subagent run that ended last, with its last text: a hand-off's answer is the
    /// text of the run it handed off to.
    last_child: Option<(String, Option<String>)>,
    /// What the renderer keeps of the run.
    pub data: R::Run,
}

impl<R: Render + ?Sized> Tracked<R> {
    /// Who the run is.
    pub fn head(&self) -> &RunHead {
        &self.head
    }

    /// The open turn's number.
    pub fn turn(&self) -> Option<u32> {
        self.turn.as_ref().map(|(n, _)| *n)
    }

    /// The open turn.
    pub fn turn_mut(&mut self) -> Option<&mut R::Turn> {
        self.turn.as_mut().map(|(_, t)| t)
    }

    /// Model calls opened in the open turn, this one included.
    pub fn calls_in_turn(&self) -> u32 {
        self.calls_in_turn
    }

    /// Model calls opened in the run (orphans included).
    pub fn model_calls(&self) -> u32 {
        self.model_calls
    }

    /// Tool calls opened in the run (orphans and rejected calls included).
    pub fn tool_calls(&self) -> u32 {
        self.tool_calls
    }

    /// The text of the run's last model response.
    pub fn last_text(&self) -> Option<&str> {
        self.last_text.as_deref()
    }

    /// The open tool call with this id.
    pub fn tool(&self, call_id: &str) -> Option<&R::ToolCall> {
        self.tools.get(call_id).map(|(_, c)| c)
    }

    /// The open tool call with this id, to change.
    pub fn tool_mut(&mut self, call_id: &str) -> Option<&mut R::ToolCall> {
        self.tools.get_mut(call_id).map(|(_, c)| c)
    }

    /// The open model call.
    pub fn model_call(&self) -> Option<&R::ModelCall> {
        self.model_call.as_ref()
    }
}

/// Every open run an observer has seen, fed one event at a time.
pub struct Tracker<R: Render> {
    runs: HashMap<String, Tracked<R>>,
}

impl<R: Render> Default for Tracker<R> {
    fn default() -> Self {
        Tracker {
            runs: HashMap::new(),
        }
    }
}

impl<R: Render> Tracker<R> {
    /// A tracker with no run open.
    pub fn new() -> Self {
        Self::default()
    }

    /// The open run with this id.
    pub fn run(&self, run_id: &str) -> Option<&Tracked<R>> {
        self.runs.get(run_id)
    }

    /// How many runs are open.
    pub fn open_runs(&self) -> usize {
        self.runs.len()
    }

    /// Takes in one event: opens and closes what it opens and closes, through `render`.
    pub fn on_event(&mut self, event: &Event, render: &mut R) {
        let run_id: &str = &event.run_id;
        if let EventKind::RunStarted {
            agent,
            model,
            parent_run_id,
            parent_call_id,
            ..
        } = &event.kind
        {
            let head = RunHead {
                run_id: run_id.to_owned(),
                agent: agent.clone(),
                model: model.clone(),
                parent_run_id: parent_run_id.clone(),
                parent_call_id: parent_call_id.clone(),
                depth: 0,
                joined: false,
            };
            self.open_run(head, event, render);
            return;
        }
        if !self.runs.contains_key(run_id) {
            let head = RunHead {
                run_id: run_id.to_owned(),
                joined: true,
                ..RunHead::default()
            };
            if !self.open_run(head, event, render) {
                return;
            }
        }
        if let EventKind::RunFinished {
            stop_reason,
            usage,
            cost_usd,
            turns,
            error,
        } = &event.kind
        {
            if let Some(run) = self.runs.remove(run_id) {
                if let Some(parent) = run
                    .head
                    .parent_run_id
                    .as_deref()
                    .and_then(|p| self.runs.get_mut(p))
                {
                    parent.last_child = Some((run_id.to_owned(), run.last_text.clone()));
                }
                let end = RunEnd::Finished {
                    stop_reason,
                    usage,
                    cost_usd: *cost_usd,
                    turns: *turns,
                    error: error.as_ref(),
                };
                close(run, &end, render);
            }
            return;
        }
        if let Some(run) = self.runs.get_mut(run_id) {
            step(run, event, render);
        }
    }

    /// Closes every open run as abandoned (the observer stops before they end), with what each
    /// left open.
    pub fn abandon_all(&mut self, render: &mut R) {
        let mut open: Vec<String> = self.runs.keys().cloned().collect();
        open.sort();
        for run_id in open {
            if let Some(run) = self.runs.remove(&run_id) {
                close(run, &RunEnd::Abandoned, render);
            }
        }
    }

    /// Opens a run unless the renderer declines it; true when it is open.
    fn open_run(&mut self, mut head: RunHead, event: &Event, render: &mut R) -> bool {
        let parent = head.parent_run_id.as_deref().and_then(|p| self.runs.get(p));
        if head.parent_run_id.is_some() {
            head.depth = parent.map_or(0, |p| p.head.depth) + 1;
        }
        let parent = parent.map(|run| Parent {
            run,
            call: head.parent_call_id.as_deref().and_then(|c| run.tool(c)),
        });
        let Some(data) = render.open_run(&head, parent, event) else {
            return false;
        };
        let run_id = head.run_id.clone();
        let run = Tracked {
            head,
            turn: None,
            calls_in_turn: 0,
            model_call: None,
            tools: HashMap::new(),
            model_calls: 0,
            tool_calls: 0,
            last_text: None,
            last_child: None,
            data,
        };
        self.runs.insert(run_id, run);
        true
    }
}

/// One event inside an open run.
fn step<R: Render>(run: &mut Tracked<R>, event: &Event, render: &mut R) {
    match &event.kind {
        // The run's answer is the one of the run it handed off to.
        EventKind::HandedOff { run_id, .. } => {
            if let Some((child, text)) = run.last_child.take()
                && child == *run_id
                && text.is_some()
            {
                run.last_text = text;
            }
            render.on_event(run, event);
        }
        EventKind::TurnStarted => {
            close_turn(run, render);
            open_turn(run, event.turn, render);
        }
        EventKind::ModelRequestStarted { .. } => {
            ensure_turn(run, event.turn, render);
            if let Some(old) = run.model_call.take() {
                render.close_model_call(run, old, ModelEnd::Superseded);
            }
            let call = open_model_call(run, event, Opening::Started, render);
            run.model_call = Some(call);
        }
        EventKind::ModelResponse { text, duration, .. } => {
            let ago = *duration;
            let call = take_model_call(run, event, ago, render);
            run.last_text = Some(text.clone());
            render.close_model_call(run, call, ModelEnd::Responded(event));
        }
        EventKind::ModelError { code, message } => {
            let call = take_model_call(run, event, Duration::ZERO, render);
            render.close_model_call(run, call, ModelEnd::Failed { code, message });
        }
        EventKind::ToolStarted { call_id, .. } => {
            ensure_turn(run, event.turn, render);
            let call = open_tool_call(run, event, Opening::Started, render);
            run.tools.insert(call_id.clone(), (event.turn, call));
        }
        EventKind::ToolFinished {
            call_id, outcome, ..
        } => {
            let call = match run.tools.remove(call_id.as_str()) {
                Some((_, call)) => call,
                None => {
                    let opening = Opening::Orphan {
                        ago: outcome.duration,
                    };
                    open_tool_call(run, event, opening, render)
                }
            };
            render.close_tool_call(run, call, ToolEnd::Finished(outcome));
        }
        EventKind::ToolRejected {
            code,
            reason,
            outcome,
            ..
        } => {
            ensure_turn(run, event.turn, render);
            let call = open_tool_call(run, event, Opening::Started, render);
            let end = ToolEnd::Rejected {
                code,
                reason,
                outcome,
            };
            render.close_tool_call(run, call, end);
        }
        EventKind::ToolsChanged { .. } | EventKind::Compacted { .. } => {
            ensure_turn(run, event.turn, render);
            render.on_event(run, event);
        }
        _ => render.on_event(run, event),
    }
}

fn open_turn<R: Render>(run: &mut Tracked<R>, turn: u32, render: &mut R) {
    let data = render.open_turn(run, turn);
    run.turn = Some((turn, data));
    run.calls_in_turn = 0;
}

fn close_turn<R: Render>(run: &mut Tracked<R>, render: &mut R) {
    if let Some((_, turn)) = run.turn.take() {
        render.close_turn(run, turn);
    }
}

/// Opens turn `turn` unless it is the open one (events of a turn never seen start).
fn ensure_turn<R: Render>(run: &mut Tracked<R>, turn: u32, render: &mut R) {
    if run.turn() != Some(turn) {
        close_turn(run, render);
        open_turn(run, turn, render);
    }
}

fn open_model_call<R: Render>(
    run: &mut Tracked<R>,
    event: &Event,
    opening: Opening,
    render: &mut R,
) -> R::ModelCall {
    run.calls_in_turn += 1;
    run.model_calls += 1;
    render.open_model_call(run, event, opening)
}

/// The open model call, or an orphan for an end whose start was never seen.
fn take_model_call<R: Render>(
    run: &mut Tracked<R>,
    event: &Event,
    ago: Duration,
    render: &mut R,
) -> R::ModelCall {
    match run.model_call.take() {
        Some(call) => call,
        None => open_model_call(run, event, Opening::Orphan { ago }, render),
    }
}

fn open_tool_call<R: Render>(
    run: &mut Tracked<R>,
    event: &Event,
    opening: Opening,
    render: &mut R,
) -> R::ToolCall {
    run.tool_calls += 1;
    render.open_tool_call(run, event, opening)
}

/// Closes what the run left open, then the run.
fn close<R: Render>(mut run: Tracked<R>, end: &RunEnd<'_>, render: &mut R) {
    if let Some(call) = run.model_call.take() {
        render.close_model_call(&mut run, call, ModelEnd::RunEnded(end));
    }
    let tools: BTreeMap<(u32, String), R::ToolCall> = run
        .tools
        .drain()
        .map(|(id, (turn, call))| ((turn, id), call))
        .collect();
    for call in tools.into_values() {
        render.close_tool_call(&mut run, call, ToolEnd::RunEnded(end));
    }
    close_turn(&mut run, render);
    render.close_run(run, end);
}
