//! Views of a trace for people: `list` (one line per run) and `show` (one run as a tree of turns
//! and calls), each as terminal text and as JSON. They work on a trace cut short by a crash too:
//! spans that never ended show as `running`, and run totals fall back to the sums of their calls.

use std::fmt::Write as _;

use agentloop::model::Usage;
use serde::Serialize;
use serde_json::Value;

use crate::error::TraceError;
use crate::record::{
    CompactionSpan, ErrorInfo, ModelCallSpan, RunSpan, Span, Status, ToolCallSpan, TraceRecord,
    TurnSpan, format_rfc3339,
};

/// How wide a payload may be in `show` before it is cut (in characters).
pub const PAYLOAD_WIDTH: usize = 100;

/// One run, in a line of `list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    /// The run id.
    pub id: String,
    /// The parent run, for a subagent.
    pub parent_id: Option<String>,
    /// The agent's name.
    pub agent: String,
    /// The model's id.
    pub model: String,
    /// When it started, RFC 3339 UTC.
    pub started_at: String,
    /// When it started, unix milliseconds.
    pub started_at_ms: i64,
    /// Where it stands (`running` when the trace holds no end for it).
    pub status: Status,
    /// Why it stopped, once it did.
    pub stop_reason: Option<String>,
    /// Turns taken.
    pub turns: u32,
    /// Tool calls made.
    pub tool_calls: u32,
    /// Tokens used.
    pub usage: Usage,
    /// USD spent.
    pub cost_usd: f64,
    /// How long it took, in milliseconds, once it ended.
    pub duration_ms: Option<f64>,
    /// Its error, if it failed.
    pub error: Option<ErrorInfo>,
}

/// One run as a tree: its turns, each with its model calls and tool calls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunTree {
    /// The run.
    pub run: RunSpan,
    /// Its totals (as in `list`).
    pub summary: RunSummary,
    /// Its turns, in order.
    pub turns: Vec<TurnNode>,
    /// Runs whose parent is this run.
    pub subagents: Vec<String>,
}

/// A turn and its calls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnNode {
    /// The turn.
    pub turn: TurnSpan,
    /// Its model calls, in order.
    pub model_calls: Vec<ModelCallSpan>,
    /// Its tool calls, in the order they started.
    pub tool_calls: Vec<ToolCallSpan>,
    /// The compactions before its model call.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compactions: Vec<CompactionSpan>,
}

fn runs(records: &[TraceRecord]) -> impl Iterator<Item = &RunSpan> {
    records.iter().filter_map(|r| match r {
        TraceRecord::Run(run) => Some(run),
        _ => None,
    })
}

/// The runs of a trace, in the order they started in the file.
pub fn summarize_runs(records: &[TraceRecord]) -> Vec<RunSummary> {
    runs(records).map(|run| summarize(records, run)).collect()
}

fn summarize(records: &[TraceRecord], run: &RunSpan) -> RunSummary {
    let id = &run.span.id;
    let mut turns = 0u32;
    let mut tool_calls = 0u32;
    let mut usage = Usage::default();
    let mut cost = 0.0;
    for r in records.iter().filter(|r| &r.span().run_id == id) {
        match r {
            TraceRecord::Turn(_) => turns += 1,
            TraceRecord::ToolCall(_) => tool_calls += 1,
            TraceRecord::ModelCall(m) => {
                usage.add(&m.usage.unwrap_or_default());
                cost += m.cost_usd.unwrap_or(0.0);
            }
            TraceRecord::Compaction(c) => {
                usage.add(&c.usage.unwrap_or_default());
                cost += c.cost_usd.unwrap_or(0.0);
            }
            TraceRecord::Run(_) => {}
        }
    }
    RunSummary {
        id: id.clone(),
        parent_id: run.span.parent_id.clone(),
        agent: run.agent.clone(),
        model: run.model.clone(),
        started_at: format_rfc3339(run.span.started_at_ms),
        started_at_ms: run.span.started_at_ms,
        status: run.span.status,
        stop_reason: run.stop_reason.clone(),
        turns: run.turns.unwrap_or(turns),
        tool_calls: run.tool_calls.unwrap_or(tool_calls),
        usage: run.usage.unwrap_or(usage),
        cost_usd: run.cost_usd.unwrap_or(cost),
        duration_ms: run.span.duration_ms,
        error: run.span.error.clone(),
    }
}

/// Finds a run by its id or a unique prefix of it; `None` finds the run started last.
pub fn find_run<'a>(
    records: &'a [TraceRecord],
    id: Option<&str>,
) -> Result<&'a RunSpan, TraceError> {
    let Some(id) = id else {
        // The last top-level run: a subagent's run ends before its parent's.
        return runs(records)
            .filter(|r| r.span.parent_id.is_none())
            .last()
            .or_else(|| runs(records).last())
            .ok_or_else(|| TraceError::RunNotFound { id: "(any)".into() });
    };
    if let Some(run) = runs(records).find(|r| r.span.id == id) {
        return Ok(run);
    }
    let matches: Vec<&RunSpan> = runs(records)
        .filter(|r| r.span.id.starts_with(id))
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(TraceError::RunNotFound { id: id.to_owned() }),
        many => Err(TraceError::AmbiguousRun {
            id: id.to_owned(),
            matches: many.iter().map(|r| r.span.id.clone()).collect(),
        }),
    }
}

/// One run as a tree (see [`find_run`] for how `id` is matched).
pub fn run_tree(records: &[TraceRecord], id: Option<&str>) -> Result<RunTree, TraceError> {
    let run = find_run(records, id)?;
    let run_id = &run.span.id;
    let mut turns: Vec<TurnNode> = Vec::new();
    let mut orphans: Vec<&TraceRecord> = Vec::new();
    for r in records.iter().filter(|r| &r.span().run_id == run_id) {
        if let TraceRecord::Turn(t) = r {
            turns.push(TurnNode {
                turn: t.clone(),
                model_calls: Vec::new(),
                tool_calls: Vec::new(),
                compactions: Vec::new(),
            });
        } else if !matches!(r, TraceRecord::Run(_)) {
            orphans.push(r);
        }
    }
    for r in orphans {
        let parent = r.span().parent_id.as_deref();
        let Some(node) = turns
            .iter_mut()
            .find(|t| Some(t.turn.span.id.as_str()) == parent)
        else {
            continue;
        };
        match r {
            TraceRecord::ModelCall(m) => node.model_calls.push(m.clone()),
            TraceRecord::ToolCall(t) => node.tool_calls.push(t.clone()),
            TraceRecord::Compaction(c) => node.compactions.push(c.clone()),
            _ => {}
        }
    }
    let subagents = runs(records)
        .filter(|r| r.span.parent_id.as_deref() == Some(run_id))
        .map(|r| r.span.id.clone())
        .collect();
    Ok(RunTree {
        run: run.clone(),
        summary: summarize(records, run),
        turns,
        subagents,
    })
}

/// A duration for people: `850.0 ms`, `2.31 s`, `3m05s`.
pub fn format_duration(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else if ms < 60_000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        let secs = (ms / 1000.0).round() as u64;
        format!("{}m{:02}s", secs / 60, secs % 60)
    }
}

/// A cost in USD: `$0.00042`, `$1.50`, `$0`.
pub fn format_cost(usd: f64) -> String {
    if usd == 0.0 {
        return "$0".into();
    }
    let s = format!("{usd:.6}");
    let trimmed = s.trim_end_matches('0');
    let decimals = trimmed.split_once('.').map_or(0, |(_, d)| d.len());
    if decimals < 2 {
        format!("${usd:.2}")
    } else {
        format!("${trimmed}")
    }
}

fn format_tokens(u: &Usage) -> String {
    let mut s = format!("{} in / {} out", u.input_tokens, u.output_tokens);
    if u.cached_input_tokens > 0 || u.reasoning_tokens > 0 {
        let _ = write!(
            s,
            " (cached {}, reasoning {})",
            u.cached_input_tokens, u.reasoning_tokens
        );
    }
    s
}

/// `list`: one line per run (id, agent, start, stop reason, turns, tool calls, tokens, cost,
/// duration) under a header.
pub fn render_list(records: &[TraceRecord]) -> String {
    let summaries = summarize_runs(records);
    if summaries.is_empty() {
        return "no runs in this trace\n".into();
    }
    let header = [
        "RUN",
        "AGENT",
        "STARTED",
        "STOP",
        "TURNS",
        "TOOLS",
        "TOKENS IN/OUT",
        "COST",
        "DURATION",
    ];
    let rows: Vec<[String; 9]> = summaries
        .iter()
        .map(|s| {
            [
                s.id.clone(),
                s.agent.clone(),
                s.started_at.clone(),
                s.stop_reason
                    .clone()
                    .unwrap_or_else(|| s.status.as_str().to_owned()),
                s.turns.to_string(),
                s.tool_calls.to_string(),
                format!("{}/{}", s.usage.input_tokens, s.usage.output_tokens),
                format_cost(s.cost_usd),
                s.duration_ms.map_or_else(|| "-".into(), format_duration),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            // Counts are right-aligned, text left-aligned.
            let numeric = matches!(i, 4 | 5);
            let cell = if numeric {
                format!("{cell:>w$}")
            } else {
                format!("{cell:<w$}")
            };
            l.push_str(&cell);
            l.push_str("  ");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
}

/// `list --json`: the run summaries as a JSON array.
pub fn render_list_json(records: &[TraceRecord]) -> Result<String, TraceError> {
    serde_json::to_string_pretty(&summarize_runs(records)).map_err(TraceError::Render)
}

/// `show --json`: one run's tree as JSON (see [`find_run`] for how `id` is matched).
pub fn render_run_json(records: &[TraceRecord], id: Option<&str>) -> Result<String, TraceError> {
    serde_json::to_string_pretty(&run_tree(records, id)?).map_err(TraceError::Render)
}

/// Cuts a payload to one line of at most `width` characters.
pub fn one_line(text: &str, width: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= width {
        return flat;
    }
    let cut: String = flat.chars().take(width.saturating_sub(1)).collect();
    format!("{cut}…")
}

fn payload(value: &Value) -> String {
    match value {
        Value::String(s) => one_line(&format!("{s:?}"), PAYLOAD_WIDTH),
        other => one_line(&other.to_string(), PAYLOAD_WIDTH),
    }
}

/// ` ok 1.2 ms` or ` error code: message`: a span's state for a tree line.
fn span_state(span: &Span) -> String {
    let mut s = format!("  {}", span.status.as_str());
    if let Some(d) = span.duration_ms {
        let _ = write!(s, "  {}", format_duration(d));
    }
    if let Some(e) = &span.error {
        let _ = write!(s, "  {}: {}", e.code, one_line(&e.message, PAYLOAD_WIDTH));
    }
    s
}

/// `show`: one run as a tree (see [`find_run`] for how `id` is matched), with durations, usage,
/// costs, statuses and errors, and payloads when the trace recorded them.
pub fn render_run(records: &[TraceRecord], id: Option<&str>) -> Result<String, TraceError> {
    let tree = run_tree(records, id)?;
    let mut out = run_header(&tree);
    let last_turn = tree.turns.len().saturating_sub(1);
    for (i, node) in tree.turns.iter().enumerate() {
        let (branch, stem) = if i == last_turn {
            ("└─", "   ")
        } else {
            ("├─", "│  ")
        };
        let _ = writeln!(
            out,
            "{branch} turn {}{}",
            node.turn.turn,
            span_state(&node.turn.span)
        );
        let mut lines: Vec<(String, Vec<String>)> = Vec::new();
        if let Some(change) = &node.turn.tools_changed {
            lines.push((format!("tools changed: {change}"), Vec::new()));
        }
        lines.extend(node.compactions.iter().map(compaction_lines));
        lines.extend(node.model_calls.iter().map(model_call_lines));
        lines.extend(node.tool_calls.iter().map(tool_call_lines));
        let last = lines.len().saturating_sub(1);
        for (j, (head, details)) in lines.iter().enumerate() {
            let (branch, inner) = if j == last {
                ("└─", "   ")
            } else {
                ("├─", "│  ")
            };
            let _ = writeln!(out, "{stem}{branch} {head}");
            for d in details {
                let _ = writeln!(out, "{stem}{inner}   {d}");
            }
        }
    }
    if !tree.subagents.is_empty() {
        let _ = writeln!(out, "subagents: {}", tree.subagents.join(", "));
    }
    Ok(out)
}

/// The lines above a run's turns: its identity, counts, spend, and the run-wide notes.
fn run_header(tree: &RunTree) -> String {
    let (run, sum) = (&tree.run, &tree.summary);
    let mut out = String::new();
    let stop = sum.stop_reason.as_deref().unwrap_or("running");
    let _ = writeln!(
        out,
        "run {}  agent {}  model {}  {stop}{}",
        run.span.id,
        run.agent,
        run.model,
        span_state(&run.span)
    );
    if let Some(parent) = &run.span.parent_id {
        let _ = writeln!(out, "  parent run {parent}");
    }
    let _ = writeln!(
        out,
        "  started {}  turns {}  model calls {}  tool calls {}",
        sum.started_at,
        sum.turns,
        run.model_calls.map_or_else(
            || tree
                .turns
                .iter()
                .map(|t| t.model_calls.len())
                .sum::<usize>()
                .to_string(),
            |n| n.to_string()
        ),
        sum.tool_calls
    );
    let _ = writeln!(
        out,
        "  tokens {}  cost {}",
        format_tokens(&sum.usage),
        format_cost(sum.cost_usd)
    );
    if let Some(limit) = &run.limit {
        let _ = writeln!(out, "  limit {limit}");
    }
    for w in &run.warnings {
        let _ = writeln!(out, "  warning: {}", one_line(w, PAYLOAD_WIDTH));
    }
    for l in &run.tool_output {
        let _ = writeln!(out, "  tool output: {}", one_line(l, PAYLOAD_WIDTH));
    }
    if let Some(h) = &run.handoff {
        let _ = writeln!(
            out,
            "  handed off to {} [{}]; {} answered",
            h.to, h.call_id, h.answered_by
        );
    }
    if let Some(input) = &run.input {
        let _ = writeln!(out, "  input: {}", payload(&Value::String(input.clone())));
    }
    if let Some(output) = &run.output {
        let _ = writeln!(out, "  output: {}", payload(&Value::String(output.clone())));
    }
    out
}

/// A compaction's line in its turn, and the lines under it.
fn compaction_lines(c: &CompactionSpan) -> (String, Vec<String>) {
    let mut head = format!(
        "compaction {}: {} messages, ~{} -> ~{} tokens{}",
        c.policy,
        c.messages_replaced,
        c.tokens_before,
        c.tokens_after,
        span_state(&c.span)
    );
    if let Some(u) = &c.usage {
        let _ = write!(head, "  {}", format_tokens(u));
    }
    let mut details = Vec::new();
    if let Some(f) = &c.fallback {
        details.push(format!("fallback: {f}"));
    }
    if let Some(s) = &c.summary {
        details.push(format!("summary: {}", payload(&Value::String(s.clone()))));
    }
    (head, details)
}

/// A model call's line in its turn, and the lines under it.
fn model_call_lines(m: &ModelCallSpan) -> (String, Vec<String>) {
    let mut head = format!("model {} ({}){}", m.model, m.provider, span_state(&m.span));
    if let Some(f) = m.finish_reason {
        let _ = write!(head, "  {}", f.as_str());
    }
    if let Some(u) = &m.usage {
        let _ = write!(head, "  {}", format_tokens(u));
    }
    if let Some(c) = m.cost_usd {
        let _ = write!(head, "  {}", format_cost(c));
    }
    let mut details = Vec::new();
    if let Some(r) = m.reasoning.as_ref().filter(|r| !r.is_empty()) {
        details.push(format!("reasoning: {}", payload(&Value::String(r.clone()))));
    }
    if let Some(t) = m.text.as_ref().filter(|t| !t.is_empty()) {
        details.push(format!("text: {}", payload(&Value::String(t.clone()))));
    }
    (head, details)
}

/// A tool call's line in its turn, and the lines under it.
fn tool_call_lines(t: &ToolCallSpan) -> (String, Vec<String>) {
    let head = format!("tool {} [{}]{}", t.tool, t.call_id, span_state(&t.span));
    let mut details = Vec::new();
    if let Some(a) = &t.arguments {
        details.push(format!("arguments: {}", payload(a)));
    }
    for (n, failed) in t.retries.iter().enumerate() {
        details.push(format!(
            "attempt {} failed, retried: {}",
            n + 1,
            payload(&Value::String(failed.clone()))
        ));
    }
    if let Some(o) = &t.output {
        details.push(format!("output: {}", payload(o)));
    }
    if let Some(d) = &t.details {
        details.push(format!("details: {}", payload(d)));
    }
    (head, details)
}

/// [`render_run`], then each subagent's run drawn under it, indented by depth, all the way down
/// (a trace whose runs name each other as parents is drawn to a bounded depth).
pub fn render_run_tree(records: &[TraceRecord], id: Option<&str>) -> Result<String, TraceError> {
    let tree = run_tree(records, id)?;
    let mut out = String::new();
    draw(records, &tree.run.span.id, 0, &mut out)?;
    Ok(out)
}

const MAX_DRAWN_DEPTH: usize = 16;

fn draw(
    records: &[TraceRecord],
    id: &str,
    depth: usize,
    out: &mut String,
) -> Result<(), TraceError> {
    let text = render_run(records, Some(id))?;
    let pad = "    ".repeat(depth);
    for line in text.lines() {
        let _ = writeln!(out, "{pad}{line}");
    }
    if depth >= MAX_DRAWN_DEPTH {
        return Ok(());
    }
    for child in runs(records).filter(|r| r.span.parent_id.as_deref() == Some(id)) {
        let call = child.parent_call_id.as_deref().unwrap_or("?");
        let _ = writeln!(out, "{pad}    ↳ subagent started by call {call}:");
        draw(records, &child.span.id, depth + 1, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_costs_read_well() {
        assert_eq!(format_duration(0.25), "0.2 ms");
        assert_eq!(format_duration(2310.0), "2.31 s");
        assert_eq!(format_duration(185_000.0), "3m05s");
        assert_eq!(format_cost(0.0), "$0");
        assert_eq!(format_cost(0.00042), "$0.00042");
        assert_eq!(format_cost(1.5), "$1.50");
    }

    #[test]
    fn long_payloads_are_cut_to_one_line() {
        let s = one_line(&format!("a\nb{}", "x".repeat(200)), 20);
        assert_eq!(s.chars().count(), 20);
        assert!(s.starts_with("a b") && s.ends_with('…'));
    }
}
