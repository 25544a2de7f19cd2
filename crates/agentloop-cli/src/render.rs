//! What a run shows. Progress goes to stderr: the model's text as it streams, each tool call when
//! it starts and ends, a spinner while waiting on the model (only when stderr is a terminal), and
//! a closing line. The final output goes to stdout. `--json` prints one object instead.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use agentloop::{
    CallOutcome, CallStatus, Event, EventKind, EventSink, RunOutcome, SubagentRun, ToolCallRecord,
    message::ToolContent, outcome::codes,
};
use agentloop_observe::Tracker;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

/// Shows a run's progress on stderr.
pub struct Progress {
    state: Mutex<ProgressState>,
    spinner_enabled: bool,
}

#[derive(Default)]
struct ProgressState {
    spinner: Option<ProgressBar>,
    /// The text streamed since the last model call started.
    streamed: String,
    /// True while the cursor sits after streamed text, not at a line start.
    mid_line: bool,
    /// The run tree: each open run's depth (a top-level run's is 0) and agent.
    runs: Tracker<()>,
    /// The depth of the event being shown, and its agent when it is a subagent's.
    depth: usize,
    label: String,
    /// The model's streamed text loses its terminal escape sequences, which may be split
    /// across deltas.
    filter: crate::terminal::EscapeFilter,
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress {
    /// Progress on stderr; a spinner only when stderr is a terminal.
    pub fn new() -> Self {
        Progress {
            state: Mutex::new(ProgressState::default()),
            spinner_enabled: std::io::stderr().is_terminal(),
        }
    }

    /// The text the last model call streamed (to avoid printing the final answer twice).
    pub fn last_streamed(&self) -> String {
        self.state
            .lock()
            .map(|s| s.streamed.clone())
            .unwrap_or_default()
    }

    /// Runs `write`, which writes whole lines on stderr (the log's), clear of the progress: the
    /// line of streamed text ended first, the spinner hidden meanwhile and drawn again after (a
    /// spinner redraws by erasing the lines it last drew, which would take the log's with it).
    /// Never waits on the progress: while it is being drawn (by another thread, or by this one,
    /// which must not deadlock on itself), `write` runs as it is.
    pub fn interrupt(&self, write: impl FnOnce()) {
        let Ok(mut s) = self.state.try_lock() else {
            write();
            return;
        };
        if s.mid_line {
            let _ = writeln!(std::io::stderr());
            s.mid_line = false;
        }
        match &s.spinner {
            Some(sp) => sp.suspend(write),
            None => write(),
        }
    }

    /// Ends the line of streamed text, if one is open.
    pub fn end_line(&self) {
        if let Ok(mut s) = self.state.lock() {
            stop_spinner(&mut s);
            if s.mid_line {
                // A closed stderr loses the line, not the process.
                let _ = writeln!(std::io::stderr());
                s.mid_line = false;
            }
        }
    }
}

fn stop_spinner(s: &mut ProgressState) {
    if let Some(sp) = s.spinner.take() {
        sp.finish_and_clear();
    }
}

/// Writes one line of progress. What it shows comes from the model and the tools (names, ids,
/// arguments, error text, a response's text), so terminal escape sequences are removed first.
fn line(s: &mut ProgressState, text: &str) {
    stop_spinner(s);
    let mut err = std::io::stderr().lock();
    if s.mid_line {
        let _ = writeln!(err);
        s.mid_line = false;
    }
    let pad = "  ".repeat(s.depth);
    let shown = crate::terminal::strip_escapes(&format!("{}{text}", s.label));
    let _ = writeln!(err, "{pad}{shown}");
}

/// A compact one-line view of JSON arguments, cut to `max` characters.
pub fn compact(value: &impl std::fmt::Display, max: usize) -> String {
    let text = value.to_string();
    if text.chars().count() <= max {
        return text;
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}…")
}

/// A duration in the unit a person reads fastest.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

impl EventSink for Progress {
    fn emit(&self, event: &Event) {
        let Ok(mut s) = self.state.lock() else { return };
        // A run's events show at its depth; its last one is looked up before the tracker closes
        // the run, its first after the tracker opens it.
        let head = |s: &ProgressState| {
            s.runs
                .run(&event.run_id)
                .map(|r| (r.head().depth, r.head().agent.clone()))
        };
        let seen = head(&s);
        s.runs.on_event(event, &mut ());
        let (depth, agent) = seen.or_else(|| head(&s)).unwrap_or_default();
        if let EventKind::RunStarted {
            parent_run_id: Some(_),
            agent,
            ..
        } = &event.kind
        {
            (s.depth, s.label) = (depth, String::new());
            line(&mut s, &format!("▸ subagent {agent} [{}]", event.run_id));
        }
        (s.depth, s.label) = if depth > 0 {
            (depth, format!("{agent}: "))
        } else {
            (0, String::new())
        };
        if s.depth > 0 {
            // A subagent's steps show indented under the call that started it; its text is not
            // streamed (the final output shown is the top run's).
            match &event.kind {
                EventKind::TextDelta { .. }
                | EventKind::ModelResponse { .. }
                | EventKind::ModelRequestStarted { .. } => return,
                EventKind::RunFinished { stop_reason, .. } => {
                    s.label.clear();
                    line(&mut s, &format!("◂ subagent {stop_reason}"));
                    return;
                }
                _ => {}
            }
        }
        self.show(&mut s, &event.kind);
    }
}

impl Progress {
    /// Shows one event of the run at the state's depth.
    fn show(&self, s: &mut ProgressState, kind: &EventKind) {
        match kind {
            EventKind::ModelRequestStarted { model, .. } => {
                s.streamed.clear();
                s.filter = crate::terminal::EscapeFilter::default();
                if self.spinner_enabled {
                    stop_spinner(s);
                    let sp = ProgressBar::new_spinner();
                    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
                        sp.set_style(style);
                    }
                    sp.set_message(format!("waiting on {model}"));
                    sp.enable_steady_tick(Duration::from_millis(100));
                    s.spinner = Some(sp);
                }
            }
            EventKind::TextDelta { text } => {
                stop_spinner(s);
                s.streamed.push_str(text);
                let shown = s.filter.push(text);
                if !shown.is_empty() {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "{shown}");
                    let _ = err.flush();
                    s.mid_line = !shown.ends_with('\n');
                }
            }
            EventKind::ToolCallDelta { .. } => stop_spinner(s),
            EventKind::ModelRetrying {
                retry,
                model,
                code,
                message,
                delay,
                discarded,
                ..
            } => {
                // The text shown of the failed attempt stays on the terminal, so the line says
                // plainly that it does not count; the answer is what streams after it.
                s.streamed.clear();
                s.filter = crate::terminal::EscapeFilter::default();
                let taken_back = if discarded.is_empty() {
                    String::new()
                } else {
                    format!("; {} discarded", discarded_words(discarded))
                };
                line(
                    s,
                    &format!(
                        "↻ model failed {code}: {}{taken_back}; retry {retry} ({model}) in {}",
                        summary(message),
                        human_duration(*delay)
                    ),
                );
            }
            EventKind::ModelResponse { text, warnings, .. } => {
                stop_spinner(s);
                // A model that did not stream its text shows it whole.
                if s.streamed.is_empty() && !text.is_empty() {
                    s.streamed = text.clone();
                    line(s, text);
                }
                for w in warnings {
                    line(s, &format!("⚠ {}", summary(w)));
                }
            }
            EventKind::ModelError { code, message } => {
                line(s, &format!("✗ model error {code}: {message}"))
            }
            EventKind::ToolStarted {
                tool,
                arguments,
                call_id,
            } => {
                line(
                    s,
                    &format!("→ {tool} {} [{call_id}]", compact(arguments, 120)),
                );
            }
            EventKind::ToolFinished {
                tool,
                call_id,
                outcome,
            } => tool_finished(s, tool, call_id, outcome),
            EventKind::ToolRetrying {
                tool,
                call_id,
                retry,
                code,
                message,
                delay,
            } => {
                line(
                    s,
                    &format!(
                        "↻ {tool} failed [{call_id}] {code}: {}; retry {retry} in {}",
                        summary(message),
                        human_duration(*delay)
                    ),
                );
            }
            EventKind::ToolRejected {
                tool,
                code,
                reason,
                call_id,
                ..
            } => {
                line(
                    s,
                    &format!(
                        "✗ {tool} rejected [{call_id}] {code}: {}",
                        first_line(reason)
                    ),
                );
            }
            EventKind::LimitReached { limit } => line(s, &format!("■ {limit}")),
            // The answer streamed above is not the answer: the next one streams after this.
            EventKind::AnswerRetried { reason } => {
                stop_spinner(s);
                line(s, &format!("↻ answer sent back: {}", summary(reason)));
            }
            EventKind::HandedOff {
                from,
                to,
                answered_by,
                ..
            } => line(
                s,
                &format!("⇢ {from} handed off to {to}; {answered_by} answered"),
            ),
            kind @ EventKind::ToolsChanged { .. } => {
                // The trace's words for it: `+added -removed ~updated; refused why`.
                if let Some(change) = agentloop_store::ToolsChange::of(kind) {
                    line(s, &format!("⟳ tools changed: {change}"));
                }
            }
            kind @ EventKind::Compacted { .. } => compacted(s, kind),
            _ => {}
        }
    }
}

/// What a failed model attempt had streamed, in words: `the 42 characters of text streamed so
/// far`.
fn discarded_words(d: &agentloop::model::Discarded) -> String {
    let mut parts = Vec::new();
    if d.text_chars > 0 {
        parts.push(format!(
            "the {} characters of text streamed so far",
            d.text_chars
        ));
    }
    if d.reasoning_chars > 0 {
        parts.push(format!("{} characters of reasoning", d.reasoning_chars));
    }
    if d.tool_calls > 0 {
        parts.push(format!("{} tool call(s) begun (none ran)", d.tool_calls));
    }
    parts.join(", ")
}

/// A finished call's line, and the plan the model keeps when the call changed it.
fn tool_finished(s: &mut ProgressState, tool: &str, call_id: &str, outcome: &CallOutcome) {
    let d = human_duration(outcome.duration);
    let text = match failure_line(outcome) {
        None => format!("✓ {tool} ok in {d} [{call_id}]"),
        Some(e) => format!("✗ {tool} error in {d} [{call_id}]: {}", summary(&e)),
    };
    line(s, &text);
    // The plan the model keeps, shown as it changes.
    if let Some(todos) = outcome
        .details
        .as_deref()
        .and_then(agentloop_tools::todo::todos_in)
    {
        for l in agentloop_tools::todo::render(&todos).lines() {
            line(s, &format!("    {l}"));
        }
    }
}

/// A compaction's line: how many messages, by which policy, and the tokens before and after.
fn compacted(s: &mut ProgressState, kind: &EventKind) {
    let EventKind::Compacted {
        policy,
        messages_replaced,
        tokens_before,
        tokens_after,
        fallback,
        ..
    } = kind
    else {
        return;
    };
    let how = match fallback {
        Some(why) => format!("{policy} ({})", first_line(why)),
        None => policy.clone(),
    };
    line(
        s,
        &format!(
            "⇣ compacted {messages_replaced} messages by {how}: ~{tokens_before} → ~{tokens_after} tokens"
        ),
    );
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

/// The most characters of a message's last line that [`summary`] shows.
const MAX_LAST_LINE_CHARS: usize = 160;

/// One line for a message of several: its first line and, when there are more, its last one (a
/// failed command's message is its exit status, then its output, whose last line usually says
/// what went wrong: `command_failed: exit status 2 … unknown unit 'farenheit'`).
fn summary(s: &str) -> String {
    let first = first_line(s);
    let header = |l: &str| l.starts_with("--- ") && l.ends_with(" ---");
    let last = s
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !header(l))
        .last();
    match last {
        None => first.to_owned(),
        Some(last) if last.chars().count() > MAX_LAST_LINE_CHARS => {
            let cut: String = last.chars().take(MAX_LAST_LINE_CHARS).collect();
            format!("{first} … {cut}…")
        }
        Some(last) => format!("{first} … {last}"),
    }
}

/// The closing line: stop reason, turns, tool calls, tokens and cost.
///
/// `cost_unknown` (see [`cost_unknown`]) shows the cost as unknown instead of the metered part.
pub fn closing_line(outcome: &RunOutcome, cost_unknown: bool) -> String {
    let skipped = outcome
        .tool_calls
        .iter()
        .filter(|c| c.outcome.status == CallStatus::Skipped)
        .count();
    let calls = outcome.tool_calls.len();
    let mut text = format!(
        "■ {} · {} turn{} · {} tool call{}{} · {} in / {} out tokens · {} · {}",
        outcome.stop_reason,
        outcome.turns,
        plural(outcome.turns as usize),
        calls,
        plural(calls),
        if skipped > 0 {
            format!(" ({skipped} skipped: dry run)")
        } else {
            String::new()
        },
        outcome.usage.input_tokens,
        outcome.usage.output_tokens,
        if cost_unknown {
            "cost unknown".to_owned()
        } else {
            format!("${:.4}", outcome.cost_usd)
        },
        human_duration(outcome.duration),
    );
    if let Some(e) = &outcome.error {
        text.push_str(&format!("\n  error {}: {e}", e.code()));
    }
    // No event carried these (the model answers' warnings were shown as they came).
    for w in outcome.budget_warnings() {
        text.push_str(&format!("\n  ⚠ {}", summary(w)));
    }
    text
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// How a failed call reads in the live view: the code and the model's text, or for a fatal
/// failure the operator's diagnostic.
fn failure_line(outcome: &CallOutcome) -> Option<String> {
    if !outcome.is_error() {
        return None;
    }
    let code = outcome.code.as_deref().unwrap_or("error");
    Some(match (outcome.status, &outcome.diagnostic) {
        (CallStatus::Fatal, Some(d)) if code == codes::TOOL_PANICKED => format!("panicked: {d}"),
        (CallStatus::Fatal, Some(d)) => format!("fatal: {d}"),
        (CallStatus::Cancelled, _) => code.to_owned(),
        _ => format!("{code}: {}", outcome.content.to_text()),
    })
}

/// Lines for calls a dry run skipped.
pub fn skipped_lines(outcome: &RunOutcome) -> Vec<String> {
    outcome
        .tool_calls
        .iter()
        .filter(|c| c.outcome.status == CallStatus::Skipped)
        .map(|c| {
            format!(
                "○ {} skipped (dry run) {} [{}]",
                c.tool,
                compact(&c.arguments, 120),
                c.call_id
            )
        })
        .collect()
}

fn content_value(c: &ToolContent) -> Value {
    match c {
        ToolContent::Text(t) => Value::String(t.to_string()),
        ToolContent::Json(v) => v.clone(),
        other => Value::String(other.to_text()),
    }
}

fn status_word(s: CallStatus) -> Value {
    serde_json::to_value(s).unwrap_or(Value::Null)
}

fn call_json(c: &ToolCallRecord) -> Value {
    let o = &c.outcome;
    let mut v = json!({
        "id": c.call_id,
        "tool": c.tool,
        "input": c.arguments,
        "ok": c.ok(),
        "status": status_word(o.status),
        "turn": c.turn,
        "duration_ms": o.duration.as_millis() as u64,
        "retries": o.retries,
    });
    if let Some(map) = v.as_object_mut() {
        match o.output() {
            Some(out) => {
                map.insert("output".into(), content_value(out));
            }
            None => {
                map.insert(
                    "error".into(),
                    json!({"code": o.code.clone().unwrap_or_default(), "message": o.content.to_text()}),
                );
            }
        }
    }
    v
}

/// The tree of subagent runs for `--json`. Every node carries every documented field: the library's
/// form leaves out an `error` that is none and `subagents` that are empty, which a reader of the
/// documented tree would find missing.
fn subagent_nodes_json(nodes: &[SubagentRun]) -> Value {
    let nodes = nodes
        .iter()
        .map(|node| {
            let mut value = serde_json::to_value(node).unwrap_or(Value::Null);
            if let Some(map) = value.as_object_mut() {
                map.insert("error".into(), json!(node.error));
                map.insert("subagents".into(), subagent_nodes_json(&node.subagents));
            }
            value
        })
        .collect();
    Value::Array(nodes)
}

/// The `--json` object of a run.
pub fn outcome_json(outcome: &RunOutcome, dry_run: bool) -> Value {
    json!({
        "run_id": outcome.run_id,
        "stop_reason": outcome.stop_reason.as_str(),
        "output": outcome.output,
        // The agent whose answer this is: the run's own, or the last a hand-off reached.
        "answered_by": outcome.answered_by,
        "structured_output": outcome.structured_output,
        "turns": outcome.turns,
        "model_calls": outcome.model_calls,
        "usage": {
            "input_tokens": outcome.usage.input_tokens,
            "output_tokens": outcome.usage.output_tokens,
            "cached_input_tokens": outcome.usage.cached_input_tokens,
            "cache_write_tokens": outcome.usage.cache_write_tokens,
            "reasoning_tokens": outcome.usage.reasoning_tokens,
        },
        "cost_usd": outcome.cost_usd,
        "tool_calls": outcome.tool_calls.iter().map(call_json).collect::<Vec<_>>(),
        "limit": outcome.limit.map(|l| json!({"limit": l.limit.as_str(), "bound": l.bound, "consumed": l.consumed, "requested": l.requested})),
        "error": outcome.error.as_ref().map(|e| json!({"code": e.code(), "message": e.message()})),
        "duration_ms": outcome.duration.as_millis() as u64,
        "dry_run": dry_run,
        "transcript": outcome.transcript,
        "subagents": subagent_nodes_json(&outcome.subagents),
        // The plan a `todo` tool kept, as the run left it.
        "todos": agentloop_tools::todo::todos_of(outcome),
        // What was replaced stays out: it is in the trace (with payloads) and the session store.
        "compactions": outcome.compactions.iter().map(|c| json!({
            "turn": c.turn,
            "policy": c.policy.as_str(),
            "messages_replaced": c.replaced.len(),
            "tokens_before": c.tokens_before,
            "tokens_after": c.tokens_after,
            "summary": c.summary,
            "fallback": c.fallback,
            "usage": {"input_tokens": c.usage.input_tokens, "output_tokens": c.usage.output_tokens},
            "cost_usd": c.cost_usd,
        })).collect::<Vec<_>>(),
        // What the run noticed without stopping for it: its model answers' warnings.
        "warnings": outcome.warnings,
    })
}

/// True when the run's cost is unknown: the agent prices its answers (`priced`), and the pricing
/// had no price for the model of one of them. (An agent without any pricing, a scripted one
/// without a price, simply does not count its cost.)
pub fn cost_unknown(outcome: &RunOutcome, priced: bool) -> bool {
    priced && outcome.unpriced_model_calls > 0
}

/// The `--json` object of a run of an agent that prices its answers or not (`priced`):
/// `cost_usd` is `null` when the cost is unknown, never a silent `0`.
pub fn priced_outcome_json(outcome: &RunOutcome, dry_run: bool, priced: bool) -> Value {
    let mut value = outcome_json(outcome, dry_run);
    if cost_unknown(outcome, priced)
        && let Some(map) = value.as_object_mut()
    {
        map.insert("cost_usd".into(), Value::Null);
    }
    value
}

/// The warning for a run whose cost is unknown: answers of a model the pricing has no price for.
pub fn unknown_cost_warning(outcome: &RunOutcome) -> String {
    let n = outcome.unpriced_model_calls;
    format!(
        "agentloop: warning: the cost of {n} model answer{} is unknown: the price table has no \
         price for the model that answered, so the run's cost is unknown (`cost_usd` null; ${:.4} \
         was metered); give the model `price = {{ input = …, output = … }}` in [model]",
        plural(n as usize),
        outcome.cost_usd,
    )
}

/// The `--json` object when the command failed before a run: every field of a run's object
/// ([`outcome_json`]), each empty (`null`, `0`, `[]`), so a reader finds the same keys.
pub fn error_json(code: &str, message: &str, problems: Option<Value>) -> Value {
    let mut error = json!({"code": code, "message": message});
    if let (Some(p), Some(map)) = (problems, error.as_object_mut()) {
        map.insert("problems".into(), p);
    }
    json!({
        "run_id": null,
        "stop_reason": null,
        "output": null,
        "answered_by": null,
        "structured_output": null,
        "turns": 0,
        "model_calls": 0,
        "usage": {
            "input_tokens": 0,
            "output_tokens": 0,
            "cached_input_tokens": 0,
            "cache_write_tokens": 0,
            "reasoning_tokens": 0,
        },
        "cost_usd": 0.0,
        "tool_calls": [],
        "limit": null,
        "error": error,
        "duration_ms": 0,
        "dry_run": false,
        "transcript": [],
        "subagents": [],
        "todos": null,
        "compactions": [],
        "warnings": [],
    })
}

/// What is said of a run whose session could not be saved after it: the run happened (its tools
/// ran, its spend is real), but the stored conversation does not have this turn.
pub fn unsaved_session_message(e: &agentloop::session::SessionError) -> String {
    format!(
        "the run's session could not be saved, so the stored conversation does not have this turn: {e}"
    )
}

/// The `--json` `error` of a run whose session could not be saved: the session's code, and the
/// run's own error, when it had one, in the message.
pub fn unsaved_session_json(outcome: &RunOutcome, e: &agentloop::session::SessionError) -> Value {
    let mut message = unsaved_session_message(e);
    if let Some(run) = &outcome.error {
        message.push_str(&format!(
            "; the run itself ended with {}: {}",
            run.code(),
            run.message()
        ));
    }
    json!({"code": e.code(), "message": message})
}
