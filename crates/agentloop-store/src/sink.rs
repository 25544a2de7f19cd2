//! [`TraceSink`]: an [`EventSink`] that turns a run's events into span records and writes them
//! through a [`TraceWriter`] as they happen. The lifecycle (which event opens and closes which
//! span) is the shared [`Tracker`]'s; this file makes the records.
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
use agentloop_observe::tracker::{
    ModelEnd, Opening, Parent, Render, RunEnd, RunHead, ToolEnd, Tracked, Tracker,
};
use serde_json::Value;

use crate::error::TraceError;
use crate::format::TraceWriter;
use crate::record::{
    CompactionSpan, ErrorInfo, ModelCallSpan, RunSpan, Span, Status, ToolCallSpan, ToolsChange,
    TraceRecord, TurnSpan,
};
use crate::redact::{error_text, redact, redact_text};
use crate::trace::open_writer;

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
    runs: Tracker<Records>,
    error: Option<TraceError>,
}

/// Makes the records of one event, at its time (unix microseconds).
struct Records {
    payloads: bool,
    now: i64,
    out: Vec<TraceRecord>,
}

/// What the sink keeps of a run in flight beyond what the tracker keeps.
struct RunState {
    run: RunSpan,
    reasoning: String,
    limit: Option<LimitHit>,
    /// Hook failures, kept for the run's end record.
    warnings: Vec<String>,
    /// The tool source's output (payload), kept for the run's end record.
    tool_output: Vec<String>,
    /// The hand-off that answered for the run, kept for its end record.
    handoff: Option<Box<crate::record::HandoffRecord>>,
    /// How many compactions the run had.
    compactions: u32,
    /// When each open span started, in unix microseconds.
    starts: HashMap<String, i64>,
}

/// An open run, as the sink's renderer sees it.
type Run = Tracked<Records>;

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
                runs: Tracker::new(),
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

    fn records(&self, now: i64) -> Records {
        Records {
            payloads: self.options.payloads,
            now,
            out: Vec::new(),
        }
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
        let mut records = self.records((self.clock)());
        let mut state = self.lock();
        state.runs.abandon_all(&mut records);
        state.write_all(records.out);
        drop(state);
        self.flush()
    }
}

impl EventSink for TraceSink {
    fn emit(&self, event: &Event) {
        let mut records = self.records((self.clock)());
        let mut state = self.lock();
        state.runs.on_event(event, &mut records);
        state.write_all(records.out);
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

impl Render for Records {
    type Run = RunState;
    type Turn = TurnSpan;
    type ModelCall = ModelCallSpan;
    type ToolCall = ToolCallSpan;

    /// A run's start record; a run joined mid-run is recorded with what is known.
    fn open_run(
        &mut self,
        head: &RunHead,
        _: Option<Parent<'_, Self>>,
        event: &Event,
    ) -> Option<RunState> {
        let input = match &event.kind {
            EventKind::RunStarted { input, .. } if self.payloads => Some(redact_text(input)),
            _ => None,
        };
        let mut run = RunState::new(head, input, self.now);
        run.run.parent_call_id = head.parent_call_id.clone();
        self.out.push(TraceRecord::Run(run.run.clone()));
        Some(run)
    }

    fn open_turn(&mut self, run: &mut Run, turn: u32) -> TurnSpan {
        let state = &mut run.data;
        let mut span = state.child(turn_id(&state.run.span.id, turn), turn, self.now);
        span.parent_id = Some(state.run.span.id.clone());
        let t = TurnSpan {
            span,
            turn,
            tools_changed: None,
        };
        self.out.push(TraceRecord::Turn(t.clone()));
        t
    }

    fn close_turn(&mut self, run: &mut Run, mut t: TurnSpan) {
        let status = if t.span.status == Status::Running {
            Status::Ok
        } else {
            t.span.status
        };
        let error = t.span.error.take();
        run.data
            .end_span(&mut t.span, self.now, None, status, error);
        self.out.push(TraceRecord::Turn(t));
    }

    /// A started call is recorded running; an orphan's only record is its end.
    fn open_model_call(&mut self, run: &mut Run, event: &Event, opening: Opening) -> ModelCallSpan {
        let seq = run.calls_in_turn();
        let state = &mut run.data;
        match (&event.kind, opening) {
            (
                EventKind::ModelRequestStarted {
                    model,
                    provider,
                    messages,
                },
                Opening::Started,
            ) => {
                state.reasoning.clear();
                let call = ModelCallSpan {
                    provider: provider.clone(),
                    messages: u64::try_from(*messages).unwrap_or(u64::MAX),
                    ..state.model_call(event.turn, seq, model, self.now)
                };
                self.out.push(TraceRecord::ModelCall(call.clone()));
                call
            }
            (_, opening) => {
                let model = run.head().model.clone();
                run.data
                    .model_call(event.turn, seq, &model, started(self.now, opening))
            }
        }
    }

    fn close_model_call(&mut self, run: &mut Run, mut call: ModelCallSpan, end: ModelEnd<'_>) {
        let now = self.now;
        match end {
            ModelEnd::Responded(event) => {
                let EventKind::ModelResponse {
                    usage,
                    cost_usd,
                    finish_reason,
                    tool_calls,
                    text,
                    duration,
                    cached,
                    warnings,
                } = &event.kind
                else {
                    return;
                };
                let state = &mut run.data;
                // Where a reader of the run looks for what went wrong without stopping it.
                state.warnings.extend(warnings.iter().map(|w| {
                    format!(
                        "model answer in turn {}: {}",
                        event.turn,
                        error_text(w, self.payloads)
                    )
                }));
                call.cached = *cached;
                state.end_span(&mut call.span, now, Some(*duration), Status::Ok, None);
                call.usage = Some(*usage);
                call.cost_usd = *cost_usd;
                call.finish_reason = Some(*finish_reason);
                call.tool_calls = Some(u64::try_from(*tool_calls).unwrap_or(u64::MAX));
                if self.payloads {
                    call.text = Some(redact_text(text));
                    call.reasoning = (!state.reasoning.is_empty())
                        .then(|| redact_text(&std::mem::take(&mut state.reasoning)));
                }
            }
            ModelEnd::Failed { code, message } => {
                let error = ErrorInfo {
                    code: code.to_owned(),
                    message: error_text(message, self.payloads),
                };
                run.data
                    .end_span(&mut call.span, now, None, Status::Error, Some(error));
                escalate_turn(run.turn_mut(), Status::Error);
            }
            // A new request took over before this one answered (OpenTelemetry ends the span the
            // same way, with the same code): interrupted, not failed.
            ModelEnd::Superseded => {
                let error = ErrorInfo {
                    code: SUPERSEDED.to_owned(),
                    message: "a new request to the model started before this one answered"
                        .to_owned(),
                };
                run.data
                    .end_span(&mut call.span, now, None, Status::Interrupted, Some(error));
            }
            ModelEnd::RunEnded(end) => {
                let (status, error) = left_open(end);
                run.data
                    .end_span(&mut call.span, now, None, status, Some(error));
            }
        }
        self.out.push(TraceRecord::ModelCall(call));
    }

    /// A started call is recorded running, with its arguments when payloads are kept; a
    /// rejected call and an orphan are recorded at their end only.
    fn open_tool_call(&mut self, run: &mut Run, event: &Event, opening: Opening) -> ToolCallSpan {
        let turn = event.turn;
        let started = started(self.now, opening);
        match &event.kind {
            EventKind::ToolStarted {
                call_id,
                tool,
                arguments,
            } => {
                let span = ToolCallSpan {
                    arguments: self.payloads.then(|| redact(arguments)),
                    ..run.data.tool_span(turn, call_id, tool, started)
                };
                self.out.push(TraceRecord::ToolCall(span.clone()));
                span
            }
            EventKind::ToolFinished { call_id, tool, .. }
            | EventKind::ToolRejected { call_id, tool, .. } => {
                run.data.tool_span(turn, call_id, tool, started)
            }
            _ => run.data.tool_span(turn, "", "", started),
        }
    }

    fn close_tool_call(&mut self, run: &mut Run, mut span: ToolCallSpan, end: ToolEnd<'_>) {
        let now = self.now;
        match end {
            ToolEnd::Finished(outcome) => {
                let (status, error) = tool_status(outcome, self.payloads);
                // A recoverable error is the model's to handle; the turn itself went fine.
                if status != Status::Error {
                    escalate_turn(run.turn_mut(), status);
                }
                run.data
                    .end_span(&mut span.span, now, Some(outcome.duration), status, error);
                if self.payloads {
                    span.output = outcome.output().map(output_value);
                    span.details = outcome.details.as_deref().map(redact);
                }
            }
            // A call that never started: its status is the core's (`decision.invalid` is
            // `refused`, `not_run` `cancelled`), the same word `--json` and the transcript use.
            ToolEnd::Rejected { outcome, .. } => {
                let (status, error) = tool_status(outcome, self.payloads);
                run.data
                    .end_span(&mut span.span, now, Some(Duration::ZERO), status, error);
            }
            ToolEnd::RunEnded(end) => {
                let (status, error) = left_open(end);
                run.data
                    .end_span(&mut span.span, now, None, status, Some(error));
                escalate_turn(run.turn_mut(), status);
            }
        }
        self.out.push(TraceRecord::ToolCall(span));
    }

    /// The run's end record: its status from the stop reason, its output when payloads are
    /// kept; a run the trace finished before it ended is interrupted.
    fn close_run(&mut self, mut run: Run, end: &RunEnd<'_>) {
        let (model_calls, tool_calls) = (run.model_calls(), run.tool_calls());
        let output = match end {
            RunEnd::Finished { stop_reason, .. }
                if self.payloads && **stop_reason == StopReason::Finished =>
            {
                run.last_text().map(redact_text)
            }
            _ => None,
        };
        let state = &mut run.data;
        let mut record = state.run.clone();
        let (status, error) = match end {
            RunEnd::Finished {
                stop_reason,
                usage,
                cost_usd,
                turns,
                error,
            } => {
                record.stop_reason = Some(stop_reason.as_str().to_owned());
                record.usage = Some(**usage);
                record.cost_usd = Some(*cost_usd);
                record.turns = Some(*turns);
                record.output = output;
                let status = match stop_reason {
                    s if s.is_success() => Status::Ok,
                    StopReason::Cancelled => Status::Cancelled,
                    _ => Status::Error,
                };
                // A refused or filtered answer's error quotes the model's words, a fatal tool's
                // what the tool read: the same rules as the tool spans' error text.
                let error = error.map(|e| ErrorInfo {
                    code: e.code.clone(),
                    message: error_text(&e.message, self.payloads),
                });
                (status, error)
            }
            RunEnd::Abandoned => {
                let error = ErrorInfo {
                    code: "trace.unfinished".into(),
                    message: "the trace was finished before the run ended".into(),
                };
                (Status::Interrupted, Some(error))
            }
        };
        state.end_span(&mut record.span, self.now, None, status, error);
        record.model_calls = Some(model_calls);
        record.tool_calls = Some(tool_calls);
        record.limit = state.limit;
        record.warnings = std::mem::take(&mut state.warnings);
        record.tool_output = std::mem::take(&mut state.tool_output);
        record.handoff = state.handoff.take();
        self.out.push(TraceRecord::Run(record));
    }

    fn on_event(&mut self, run: &mut Run, event: &Event) {
        let payloads = self.payloads;
        match &event.kind {
            EventKind::ReasoningDelta { text } if payloads => run.data.reasoning.push_str(text),
            EventKind::ToolRetrying {
                call_id,
                code,
                message,
                ..
            } => {
                if let Some(span) = run.tool_mut(call_id) {
                    // Error text can quote what a tool read (its stderr): redacted like payloads.
                    span.retries
                        .push(format!("{code}: {}", redact_text(message)));
                }
            }
            EventKind::ModelRetrying {
                retry,
                model,
                code,
                message,
                discarded,
                ..
            } => {
                // The reasoning of the abandoned attempt is not the answer's. The retry is a
                // run warning: a column of its own would be a schema version that older
                // readers refuse.
                run.data.reasoning.clear();
                let mut warning = format!(
                    "model call in turn {} failed and was retried ({retry}, {model}): {code}: {}",
                    event.turn,
                    redact_text(message)
                );
                if !discarded.is_empty() {
                    warning.push_str(&format!(
                        "; discarded what it streamed: {} characters of text, {} of reasoning, {} \
                         tool calls",
                        discarded.text_chars, discarded.reasoning_chars, discarded.tool_calls
                    ));
                }
                run.data.warnings.push(warning);
            }
            EventKind::LimitReached { limit } => run.data.limit = Some(*limit),
            EventKind::HandedOff {
                call_id,
                to,
                answered_by,
                run_id,
                ..
            } => {
                run.data.handoff = Some(Box::new(crate::record::HandoffRecord {
                    call_id: call_id.clone(),
                    to: to.clone(),
                    answered_by: answered_by.clone(),
                    run_id: run_id.clone(),
                }));
            }
            EventKind::HookFailed {
                hook,
                stage,
                message,
            } => run.data.warnings.push(format!(
                "hook {hook} failed at {stage}: {}",
                error_text(message, payloads)
            )),
            EventKind::AnswerRetried { reason } => {
                run.data.warnings.push(format!(
                    "answer sent back: {}",
                    error_text(reason, payloads)
                ));
            }
            kind @ EventKind::ToolsChanged { .. } => {
                if let Some(t) = run.turn_mut() {
                    t.tools_changed = ToolsChange::of(kind);
                }
            }
            // A server's stderr can quote anything it read: a payload, redacted like one.
            EventKind::ToolSourceOutput { origin, lines } if payloads => {
                run.data
                    .tool_output
                    // Each line alone: behind the origin, a `KEY=value` line would not read as one.
                    .extend(
                        lines
                            .iter()
                            .map(|l| format!("{origin}: {}", redact_text(l))),
                    );
            }
            EventKind::StopConditionMet { by } => {
                run.data
                    .warnings
                    .push(format!("stop condition {by} ended the run"));
            }
            EventKind::Compacted { .. } => {
                let record = run.data.compaction(event, self.now, payloads);
                self.out.extend(record);
            }
            _ => {}
        }
    }
}

/// When a span opened: now, or for an orphan as long before now as its end says it took.
fn started(now: i64, opening: Opening) -> i64 {
    match opening {
        Opening::Started => now,
        Opening::Orphan { ago } => now - i64::try_from(ago.as_micros()).unwrap_or(0),
    }
}

/// How a span the run left open ends: cancelled with a cancelled run, else interrupted, with an
/// error naming the stop.
/// The code of a model call a newer request of its run took over.
pub const SUPERSEDED: &str = "model.superseded";

fn left_open(end: &RunEnd<'_>) -> (Status, ErrorInfo) {
    let (stop, status) = match end {
        RunEnd::Finished { stop_reason, .. } => (
            stop_reason.as_str(),
            if **stop_reason == StopReason::Cancelled {
                Status::Cancelled
            } else {
                Status::Interrupted
            },
        ),
        RunEnd::Abandoned => ("unfinished", Status::Interrupted),
    };
    let error = ErrorInfo {
        code: format!("run.{stop}"),
        message: format!("the run stopped ({stop}) before this ended"),
    };
    (status, error)
}

/// Marks the open turn by the worst thing that happened in it: a failure, else a cancellation.
fn escalate_turn(turn: Option<&mut TurnSpan>, status: Status) {
    let Some(t) = turn else { return };
    let worse = match (t.span.status, status) {
        (_, Status::Error | Status::Fatal) => Status::Error,
        (Status::Running | Status::Ok, Status::Cancelled | Status::Interrupted) => status,
        (current, _) => current,
    };
    t.span.status = worse;
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
/// read (its stderr), or a subagent's answer, so it goes through [`error_text`].
fn tool_status(outcome: &CallOutcome, payloads: bool) -> (Status, Option<ErrorInfo>) {
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
        Some(d) => d.to_string(),
        None => outcome.content.to_text(),
    };
    let error = ErrorInfo {
        code: outcome.code.as_deref().unwrap_or("tool.error").to_owned(),
        message: error_text(&message, payloads),
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
    fn new(head: &RunHead, input: Option<String>, now: i64) -> RunState {
        let run_id = &head.run_id;
        RunState {
            run: RunSpan {
                span: Span {
                    id: run_id.clone(),
                    parent_id: head.parent_run_id.clone(),
                    run_id: run_id.clone(),
                    started_at_ms: ms(now),
                    ended_at_ms: None,
                    duration_ms: None,
                    status: Status::Running,
                    error: None,
                },
                parent_call_id: None,
                agent: head.agent.clone(),
                model: head.model.clone(),
                stop_reason: None,
                turns: None,
                model_calls: None,
                tool_calls: None,
                usage: None,
                cost_usd: None,
                limit: None,
                warnings: Vec::new(),
                tool_output: Vec::new(),
                handoff: None,
                input,
                output: None,
            },
            reasoning: String::new(),
            limit: None,
            warnings: Vec::new(),
            tool_output: Vec::new(),
            handoff: None,
            compactions: 0,
            starts: HashMap::from([(run_id.clone(), now)]),
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

    /// Model call `seq` of turn `turn`, running.
    fn model_call(&mut self, turn: u32, seq: u32, model: &str, started: i64) -> ModelCallSpan {
        let id = format!("{}:m{seq}", turn_id(&self.run.span.id, turn));
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

    /// A compaction's record: a span under its turn that opened as long ago as it took.
    fn compaction(&mut self, event: &Event, now: i64, payloads: bool) -> Option<TraceRecord> {
        let EventKind::Compacted {
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
        } = &event.kind
        else {
            return None;
        };
        self.compactions += 1;
        let id = format!(
            "{}:c{}",
            turn_id(&self.run.span.id, event.turn),
            self.compactions
        );
        let started = started(now, Opening::Orphan { ago: *duration });
        let mut span = self.child(id, event.turn, started);
        self.end_span(&mut span, now, Some(*duration), Status::Ok, None);
        let spent = !usage.is_zero();
        Some(TraceRecord::Compaction(CompactionSpan {
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
        }))
    }
}
