//! [`TraceSink`]: an [`EventSink`] that turns a run's events into span records and writes them
//! through a [`TraceWriter`] as they happen.
//!
//! Writes are synchronous and small (one line, or one SQLite row committed in WAL mode), made under
//! a mutex on the loop's task; nothing is queued, so nothing is lost when a run ends. A write error
//! does not disturb the run: the sink stops writing and [`TraceSink::flush`] or
//! [`TraceSink::finish`] returns the error.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentloop::{
    CallOutcome, CallStatus, Event, EventKind, EventSink, StopReason, limits::LimitHit,
    message::ToolContent,
};
use serde_json::Value;

use crate::error::TraceError;
use crate::format::TraceWriter;
use crate::trace::open_writer;
use crate::record::{
    CompactionSpan, ErrorInfo, ModelCallSpan, RunSpan, Span, Status, ToolCallSpan, ToolsChange,
    TraceRecord, TurnSpan,
};
use crate::redact::{redact, redact_text};

/// What a trace records beyond the lifecycle of spans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceOptions {
    /// Record payloads: the input, the model's text and reasoning, tool arguments, outputs and
    /// details, redacted defensively (see [`mod@crate::redact`]). Off by default.
    pub payloads: bool,
}

/// A source of the current time in unix **microseconds** (injectable for deterministic traces).
/// Records keep milliseconds; the finer clock keeps short turns' durations exact.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

fn system_clock() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Unix milliseconds of a unix microsecond instant.
fn ms(us: i64) -> i64 {
    us.div_euclid(1000)
}

/// Records runs into a trace. Attach it to an agent (`AgentBuilder::sink_arc`) or to one run
/// (`RunOptions::sinks`), then call [`TraceSink::finish`] when done.
pub struct TraceSink {
    options: TraceOptions,
    clock: Clock,
    state: Mutex<State>,
}

impl std::fmt::Debug for TraceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceSink")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

struct State {
    writer: Box<dyn TraceWriter>,
    runs: HashMap<String, RunState>,
    error: Option<TraceError>,
}

/// What the sink tracks of a run in flight.
struct RunState {
    run: RunSpan,
    turn: Option<TurnSpan>,
    calls_in_turn: u32,
    model_call: Option<ModelCallSpan>,
    reasoning: String,
    tools: HashMap<String, ToolCallSpan>,
    model_calls: u32,
    tool_calls: u32,
    limit: Option<LimitHit>,
    last_text: Option<String>,
    /// Hook failures, kept for the run's end record.
    warnings: Vec<String>,
    /// The tool source's output (payload), kept for the run's end record.
    tool_output: Vec<String>,
    /// How many compactions the run had.
    compactions: u32,
    /// When each open span started, in unix microseconds.
    starts: HashMap<String, i64>,
}

impl TraceSink {
    /// Opens a trace file (creating it, or appending to it); the extension picks the format:
    /// `.ndjson`, or `.sqlite`/`.db`.
    pub fn open(path: impl AsRef<Path>, options: TraceOptions) -> Result<TraceSink, TraceError> {
        Ok(TraceSink::new(open_writer(path.as_ref())?, options))
    }

    /// A sink over any writer.
    pub fn new(writer: Box<dyn TraceWriter>, options: TraceOptions) -> TraceSink {
        TraceSink {
            options,
            clock: Arc::new(system_clock),
            state: Mutex::new(State {
                writer,
                runs: HashMap::new(),
                error: None,
            }),
        }
    }

    /// Uses this clock (unix microseconds) instead of the system's.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> TraceSink {
        self.clock = clock;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves the state usable: records are whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Pushes what was written to the disk; returns the first write error since the last call.
    pub fn flush(&self) -> Result<(), TraceError> {
        let mut state = self.lock();
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        state.writer.flush()
    }

    /// Ends the trace: runs still open are recorded as interrupted (error `trace.unfinished`),
    /// then everything is flushed. Returns the first write error.
    pub fn finish(&self) -> Result<(), TraceError> {
        let now = (self.clock)();
        let mut state = self.lock();
        let open: Vec<String> = state.runs.keys().cloned().collect();
        for run_id in open {
            if let Some(run) = state.runs.remove(&run_id) {
                let error = ErrorInfo {
                    code: "trace.unfinished".into(),
                    message: "the trace was finished before the run ended".into(),
                };
                let records = run.close(now, Status::Interrupted, Some(error), None);
                state.write_all(records);
            }
        }
        drop(state);
        self.flush()
    }

    /// The records an event writes: a run's start and end are handled here, everything else by
    /// its run's state.
    fn records_for(&self, state: &mut State, event: &Event, now: i64) -> Vec<TraceRecord> {
        let payloads = self.options.payloads;
        let run_id: &str = &event.run_id;
        if let EventKind::RunStarted {
            agent,
            model,
            parent_run_id,
            parent_call_id,
            input,
        } = &event.kind
        {
            let mut run = RunState::new(
                run_id,
                agent,
                model,
                parent_run_id.clone(),
                payloads.then(|| redact_text(input)),
                now,
            );
            run.run.parent_call_id = parent_call_id.clone();
            let record = TraceRecord::Run(run.run.clone());
            state.runs.insert(run_id.to_owned(), run);
            return vec![record];
        }
        let mut out = Vec::new();
        if !state.runs.contains_key(run_id) {
            // Joined mid-run: record the run with what is known.
            let run = RunState::new(run_id, "", "", None, None, now);
            out.push(TraceRecord::Run(run.run.clone()));
            state.runs.insert(run_id.to_owned(), run);
        }
        if let EventKind::RunFinished {
            stop_reason,
            usage,
            cost_usd,
            turns,
            error,
        } = &event.kind
        {
            if let Some(run) = state.runs.remove(run_id) {
                let end = RunEnd {
                    stop_reason: stop_reason.as_str().to_owned(),
                    usage: *usage,
                    cost_usd: *cost_usd,
                    turns: *turns,
                    output: None,
                };
                out.extend(run.finish(now, stop_reason, error.as_ref(), end, payloads));
            }
            return out;
        }
        if let Some(run) = state.runs.get_mut(run_id) {
            run.on_event(event, now, payloads, &mut out);
        }
        out
    }
}

impl RunState {
    /// The run's end: its status from the stop reason, its output when payloads are kept.
    fn finish(
        self,
        now: i64,
        stop_reason: &StopReason,
        error: Option<&agentloop::event::ErrorSummary>,
        mut end: RunEnd,
        payloads: bool,
    ) -> Vec<TraceRecord> {
        let status = match stop_reason {
            s if s.is_success() => Status::Ok,
            StopReason::Cancelled => Status::Cancelled,
            _ => Status::Error,
        };
        let error = error.map(|e| ErrorInfo {
            code: e.code.clone(),
            message: e.message.clone(),
        });
        if payloads && *stop_reason == StopReason::Finished {
            end.output = self.last_text.as_deref().map(redact_text);
        }
        self.close(now, status, error, Some(end))
    }

    /// The records of one event inside a run.
    fn on_event(&mut self, event: &Event, now: i64, payloads: bool, out: &mut Vec<TraceRecord>) {
        let run = self;
        match &event.kind {
            EventKind::TurnStarted => {
                out.extend(run.close_turn(now));
                out.push(run.open_turn(event.turn, now));
            }
            EventKind::ModelRequestStarted {
                model,
                provider,
                messages,
            } => {
                out.extend(run.ensure_turn(event.turn, now));
                run.reasoning.clear();
                let call = ModelCallSpan {
                    provider: provider.clone(),
                    messages: u64::try_from(*messages).unwrap_or(u64::MAX),
                    ..run.new_model_call(event.turn, model, now)
                };
                out.push(TraceRecord::ModelCall(call.clone()));
                run.model_call = Some(call);
            }
            EventKind::ReasoningDelta { text } if payloads => run.reasoning.push_str(text),
            EventKind::ModelResponse {
                usage,
                cost_usd,
                finish_reason,
                tool_calls,
                text,
                duration,
                cached,
            } => {
                let mut call = run.take_model_call(event.turn, now, *duration);
                call.cached = *cached;
                run.end_span(&mut call.span, now, Some(*duration), Status::Ok, None);
                call.usage = Some(*usage);
                call.cost_usd = *cost_usd;
                call.finish_reason = Some(*finish_reason);
                call.tool_calls = Some(u64::try_from(*tool_calls).unwrap_or(u64::MAX));
                if payloads {
                    call.text = Some(redact_text(text));
                    call.reasoning = (!run.reasoning.is_empty())
                        .then(|| redact_text(&std::mem::take(&mut run.reasoning)));
                }
                run.last_text = Some(text.clone());
                out.push(TraceRecord::ModelCall(call));
            }
            EventKind::ModelError { code, message } => {
                let mut call = run.take_model_call(event.turn, now, Duration::ZERO);
                let error = ErrorInfo {
                    code: code.clone(),
                    message: message.clone(),
                };
                run.end_span(&mut call.span, now, None, Status::Error, Some(error));
                run.escalate_turn(Status::Error);
                out.push(TraceRecord::ModelCall(call));
            }
            EventKind::ToolStarted {
                call_id,
                tool,
                arguments,
            } => {
                out.extend(run.ensure_turn(event.turn, now));
                run.tool_calls += 1;
                let span = ToolCallSpan {
                    arguments: payloads.then(|| redact(arguments)),
                    ..run.tool_span(event.turn, call_id, tool, now)
                };
                out.push(TraceRecord::ToolCall(span.clone()));
                run.tools.insert(call_id.clone(), span);
            }
            EventKind::ToolRetrying {
                call_id,
                code,
                message,
                ..
            } => {
                if let Some(span) = run.tools.get_mut(call_id) {
                    // Error text can quote what a tool read (its stderr): redacted like payloads.
                    span.retries
                        .push(format!("{code}: {}", redact_text(message)));
                }
            }
            EventKind::ToolFinished {
                call_id,
                tool,
                outcome,
            } => out.push(run.tool_finished(event.turn, call_id, tool, outcome, now, payloads)),
            EventKind::ToolRejected {
                call_id,
                tool,
                outcome,
                ..
            } => {
                out.extend(run.ensure_turn(event.turn, now));
                out.push(run.tool_rejected(event.turn, call_id, tool, outcome, now));
            }
            EventKind::LimitReached { limit } => run.limit = Some(*limit),
            EventKind::HookFailed {
                hook,
                stage,
                message,
            } => run
                .warnings
                .push(format!("hook {hook} failed at {stage}: {message}")),
            EventKind::AnswerRetried { reason } => {
                run.warnings.push(format!("answer sent back: {reason}"));
            }
            kind @ EventKind::ToolsChanged { .. } => {
                out.extend(run.ensure_turn(event.turn, now));
                if let Some(t) = run.turn.as_mut() {
                    t.tools_changed = ToolsChange::of(kind);
                }
            }
            // A server's stderr can quote anything it read: a payload, redacted like one.
            EventKind::ToolSourceOutput { origin, lines } if payloads => {
                run.tool_output
                    // Each line alone: behind the origin, a `KEY=value` line would not read as one.
                    .extend(
                        lines
                            .iter()
                            .map(|l| format!("{origin}: {}", redact_text(l))),
                    );
            }
            EventKind::StopConditionMet { by } => {
                run.warnings
                    .push(format!("stop condition {by} ended the run"));
            }
            EventKind::Compacted {
                policy,
                messages_replaced,
                tokens_before,
                tokens_after,
                summary,
                replaced,
                usage,
                cost_usd,
                fallback,
                duration,
            } => {
                out.extend(run.ensure_turn(event.turn, now));
                run.compactions += 1;
                let id = format!(
                    "{}:c{}",
                    turn_id(&run.run.span.id, event.turn),
                    run.compactions
                );
                let started = now - i64::try_from(duration.as_micros()).unwrap_or(0);
                let mut span = run.child(id, event.turn, started);
                run.end_span(&mut span, now, Some(*duration), Status::Ok, None);
                let spent = !usage.is_zero();
                out.push(TraceRecord::Compaction(CompactionSpan {
                    span,
                    policy: policy.clone(),
                    messages_replaced: u64::try_from(*messages_replaced).unwrap_or(u64::MAX),
                    tokens_before: *tokens_before,
                    tokens_after: *tokens_after,
                    usage: spent.then_some(*usage),
                    cost_usd: spent.then_some(*cost_usd),
                    fallback: fallback.clone(),
                    summary: summary.as_deref().filter(|_| payloads).map(redact_text),
                    replaced: payloads
                        .then(|| serde_json::to_value(replaced).ok())
                        .flatten()
                        .map(|v| redact(&v)),
                }));
            }
            _ => {}
        }
    }

    /// A started call's end.
    fn tool_finished(
        &mut self,
        turn: u32,
        call_id: &str,
        tool: &str,
        outcome: &CallOutcome,
        now: i64,
        payloads: bool,
    ) -> TraceRecord {
        let duration = &outcome.duration;
        let mut span = match self.tools.remove(call_id) {
            Some(span) => span,
            None => {
                self.tool_calls += 1;
                let started = now - i64::try_from(duration.as_micros()).unwrap_or(0);
                self.tool_span(turn, call_id, tool, started)
            }
        };
        let (status, error) = tool_status(outcome);
        // A recoverable error is the model's to handle; the turn itself went fine.
        if status != Status::Error {
            self.escalate_turn(status);
        }
        self.end_span(&mut span.span, now, Some(*duration), status, error);
        if payloads {
            span.output = outcome.output().map(output_value);
            span.details = outcome.details.as_ref().map(redact);
        }
        TraceRecord::ToolCall(span)
    }

    /// A call that never started: its span opens and closes at once.
    /// A call that never started: its status is the core's (`decision.invalid` is `refused`,
    /// `not_run` `cancelled`), the same word `--json` and the transcript use.
    fn tool_rejected(
        &mut self,
        turn: u32,
        call_id: &str,
        tool: &str,
        outcome: &CallOutcome,
        now: i64,
    ) -> TraceRecord {
        self.tool_calls += 1;
        let (status, error) = tool_status(outcome);
        let mut span = self.tool_span(turn, call_id, tool, now);
        self.end_span(&mut span.span, now, Some(Duration::ZERO), status, error);
        TraceRecord::ToolCall(span)
    }
}

impl EventSink for TraceSink {
    fn emit(&self, event: &Event) {
        let now = (self.clock)();
        let mut state = self.lock();
        let records = self.records_for(&mut state, event, now);
        state.write_all(records);
    }
}

impl State {
    fn write_all(&mut self, records: Vec<TraceRecord>) {
        if self.error.is_some() {
            return;
        }
        for r in &records {
            if let Err(e) = self.writer.write(r) {
                self.error = Some(e);
                return;
            }
        }
    }
}

/// What a finished run reports.
struct RunEnd {
    stop_reason: String,
    usage: agentloop::model::Usage,
    cost_usd: f64,
    turns: u32,
    output: Option<String>,
}

fn turn_id(run_id: &str, turn: u32) -> String {
    format!("{run_id}:t{turn}")
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Ends a span at `now` (unix microseconds) after `duration_ms`.
fn end(span: &mut Span, now: i64, duration_ms: f64, status: Status, error: Option<ErrorInfo>) {
    span.ended_at_ms = Some(ms(now));
    span.duration_ms = Some(duration_ms);
    span.status = status;
    span.error = error;
}

/// A tool call's status and error, from the core's typed outcome. The operator's diagnostic (a
/// fatal error's or a panic's message) is what a trace keeps; error text can quote what a tool
/// read (its stderr), so it is redacted like payloads.
fn tool_status(outcome: &CallOutcome) -> (Status, Option<ErrorInfo>) {
    let status = match outcome.status {
        CallStatus::Ok => return (Status::Ok, None),
        CallStatus::Skipped => Status::Skipped,
        CallStatus::Error => Status::Error,
        CallStatus::Rejected => Status::Rejected,
        CallStatus::Denied => Status::Denied,
        CallStatus::Refused => Status::Refused,
        CallStatus::Cancelled => Status::Cancelled,
        CallStatus::Fatal => Status::Fatal,
    };
    let message = match &outcome.diagnostic {
        Some(d) => d.clone(),
        None => outcome.content.to_text(),
    };
    let error = ErrorInfo {
        code: outcome.code.clone().unwrap_or_else(|| "tool.error".into()),
        message: redact_text(&message),
    };
    (status, Some(error))
}

/// A tool output as a JSON payload: text as a string, JSON redacted, parts as they serialize.
fn output_value(content: &ToolContent) -> Value {
    match content {
        ToolContent::Text(t) => Value::String(redact_text(t)),
        ToolContent::Json(v) => redact(v),
        ToolContent::Parts(parts) => redact(&serde_json::to_value(parts).unwrap_or(Value::Null)),
    }
}

impl RunState {
    fn new(
        run_id: &str,
        agent: &str,
        model: &str,
        parent_run_id: Option<String>,
        input: Option<String>,
        now: i64,
    ) -> RunState {
        RunState {
            run: RunSpan {
                span: Span {
                    id: run_id.to_owned(),
                    parent_id: parent_run_id,
                    run_id: run_id.to_owned(),
                    started_at_ms: ms(now),
                    ended_at_ms: None,
                    duration_ms: None,
                    status: Status::Running,
                    error: None,
                },
                parent_call_id: None,
                agent: agent.to_owned(),
                model: model.to_owned(),
                stop_reason: None,
                turns: None,
                model_calls: None,
                tool_calls: None,
                usage: None,
                cost_usd: None,
                limit: None,
                warnings: Vec::new(),
                tool_output: Vec::new(),
                input,
                output: None,
            },
            turn: None,
            calls_in_turn: 0,
            model_call: None,
            reasoning: String::new(),
            tools: HashMap::new(),
            model_calls: 0,
            tool_calls: 0,
            limit: None,
            last_text: None,
            warnings: Vec::new(),
            tool_output: Vec::new(),
            compactions: 0,
            starts: HashMap::from([(run_id.to_owned(), now)]),
        }
    }

    /// A new running tool call span under turn `turn`, without payloads.
    fn tool_span(&mut self, turn: u32, call_id: &str, tool: &str, started: i64) -> ToolCallSpan {
        ToolCallSpan {
            span: self.child(
                format!("{}:{call_id}", turn_id(&self.run.span.id, turn)),
                turn,
                started,
            ),
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            arguments: None,
            output: None,
            details: None,
            retries: Vec::new(),
        }
    }

    /// Ends a span at `now`: its duration is the one measured, or the time since it started.
    fn end_span(
        &mut self,
        span: &mut Span,
        now: i64,
        measured: Option<Duration>,
        status: Status,
        error: Option<ErrorInfo>,
    ) {
        let started = self
            .starts
            .remove(&span.id)
            .unwrap_or(span.started_at_ms * 1000);
        let elapsed = (now - started).max(0) as f64 / 1000.0;
        end(span, now, measured.map_or(elapsed, millis), status, error);
    }

    /// A new running span under turn `turn` of this run.
    fn child(&mut self, id: String, turn: u32, now: i64) -> Span {
        self.starts.insert(id.clone(), now);
        Span {
            id,
            parent_id: Some(turn_id(&self.run.span.id, turn)),
            run_id: self.run.span.id.clone(),
            started_at_ms: ms(now),
            ended_at_ms: None,
            duration_ms: None,
            status: Status::Running,
            error: None,
        }
    }

    fn open_turn(&mut self, turn: u32, now: i64) -> TraceRecord {
        let mut span = self.child(turn_id(&self.run.span.id, turn), turn, now);
        span.parent_id = Some(self.run.span.id.clone());
        let t = TurnSpan {
            span,
            turn,
            tools_changed: None,
        };
        self.turn = Some(t.clone());
        self.calls_in_turn = 0;
        TraceRecord::Turn(t)
    }

    /// Opens turn `turn` unless it is the open one (events for a turn the sink never saw start).
    fn ensure_turn(&mut self, turn: u32, now: i64) -> Vec<TraceRecord> {
        if self.turn.as_ref().is_some_and(|t| t.turn == turn) {
            return Vec::new();
        }
        let mut out: Vec<TraceRecord> = self.close_turn(now).into_iter().collect();
        out.push(self.open_turn(turn, now));
        out
    }

    fn close_turn(&mut self, now: i64) -> Option<TraceRecord> {
        let mut t = self.turn.take()?;
        let status = if t.span.status == Status::Running {
            Status::Ok
        } else {
            t.span.status
        };
        let error = t.span.error.take();
        self.end_span(&mut t.span, now, None, status, error);
        Some(TraceRecord::Turn(t))
    }

    /// Marks the open turn by the worst thing that happened in it: a failure, else a cancellation.
    fn escalate_turn(&mut self, status: Status) {
        let Some(t) = self.turn.as_mut() else { return };
        let worse = match (t.span.status, status) {
            (_, Status::Error | Status::Fatal) => Status::Error,
            (Status::Running | Status::Ok, Status::Cancelled | Status::Interrupted) => status,
            (current, _) => current,
        };
        t.span.status = worse;
    }

    /// The open model call, or one made up for a response the sink never saw start.
    fn take_model_call(&mut self, turn: u32, now: i64, duration: Duration) -> ModelCallSpan {
        if let Some(call) = self.model_call.take() {
            return call;
        }
        let started = now - i64::try_from(duration.as_micros()).unwrap_or(0);
        let model = self.run.model.clone();
        self.new_model_call(turn, &model, started)
    }

    /// The next model call of turn `turn`, running, counted.
    fn new_model_call(&mut self, turn: u32, model: &str, started: i64) -> ModelCallSpan {
        self.calls_in_turn += 1;
        self.model_calls += 1;
        let id = format!(
            "{}:m{}",
            turn_id(&self.run.span.id, turn),
            self.calls_in_turn
        );
        ModelCallSpan {
            span: self.child(id, turn, started),
            model: model.to_owned(),
            provider: String::new(),
            messages: 0,
            usage: None,
            cost_usd: None,
            finish_reason: None,
            tool_calls: None,
            text: None,
            reasoning: None,
            cached: false,
        }
    }

    /// Ends the run and every span still open in it.
    fn close(
        mut self,
        now: i64,
        status: Status,
        error: Option<ErrorInfo>,
        end_info: Option<RunEnd>,
    ) -> Vec<TraceRecord> {
        let mut out = Vec::new();
        let stop = end_info
            .as_ref()
            .map_or("unfinished", |e| e.stop_reason.as_str())
            .to_owned();
        let open_status = if status == Status::Cancelled {
            Status::Cancelled
        } else {
            Status::Interrupted
        };
        let open_error = || ErrorInfo {
            code: format!("run.{stop}"),
            message: format!("the run stopped ({stop}) before this ended"),
        };
        if let Some(mut call) = self.model_call.take() {
            self.end_span(&mut call.span, now, None, open_status, Some(open_error()));
            out.push(TraceRecord::ModelCall(call));
        }
        let mut tools: Vec<ToolCallSpan> = self.tools.drain().map(|(_, t)| t).collect();
        tools.sort_by(|a, b| a.span.id.cmp(&b.span.id));
        for mut tool in tools {
            self.end_span(&mut tool.span, now, None, open_status, Some(open_error()));
            self.escalate_turn(open_status);
            out.push(TraceRecord::ToolCall(tool));
        }
        out.extend(self.close_turn(now));
        let mut run = self.run.clone();
        self.end_span(&mut run.span, now, None, status, error);
        run.model_calls = Some(self.model_calls);
        run.tool_calls = Some(self.tool_calls);
        run.limit = self.limit;
        run.warnings = std::mem::take(&mut self.warnings);
        run.tool_output = std::mem::take(&mut self.tool_output);
        if let Some(e) = end_info {
            run.stop_reason = Some(e.stop_reason);
            run.usage = Some(e.usage);
            run.cost_usd = Some(e.cost_usd);
            run.turns = Some(e.turns);
            run.output = e.output;
        }
        out.push(TraceRecord::Run(run));
        out
    }
}
