//! A run's events as GenAI spans. Which event opens a span and which ends it is the shared
//! [`Tracker`]'s; this file says what each span carries.

use std::time::{Duration, SystemTime};

use agentloop::message::ToolContent;
use agentloop::model::{FinishReason, Usage};
use agentloop::{CallOutcome, CallStatus, Event, EventKind};
use agentloop_observe::redact::{error_text, redact, redact_text};
use agentloop_observe::tracker::{
    ModelEnd, Opening, Parent, Render, RunEnd, RunHead, ToolEnd, Tracked, Tracker,
};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks};

/// The attribute names of the conventions (semantic-conventions 1.41.0, `docs/gen-ai`).
mod attr {
    pub(crate) const OPERATION: &str = "gen_ai.operation.name";
    pub(crate) const PROVIDER: &str = "gen_ai.provider.name";
    pub(crate) const REQUEST_MODEL: &str = "gen_ai.request.model";
    pub(crate) const AGENT_NAME: &str = "gen_ai.agent.name";
    pub(crate) const AGENT_ID: &str = "gen_ai.agent.id";
    pub(crate) const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    pub(crate) const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub(crate) const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    pub(crate) const CACHE_READ: &str = "gen_ai.usage.cache_read.input_tokens";
    pub(crate) const CACHE_CREATION: &str = "gen_ai.usage.cache_creation.input_tokens";
    pub(crate) const REASONING: &str = "gen_ai.usage.reasoning.output_tokens";
    pub(crate) const TOOL_NAME: &str = "gen_ai.tool.name";
    pub(crate) const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
    pub(crate) const TOOL_TYPE: &str = "gen_ai.tool.type";
    pub(crate) const TOOL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
    pub(crate) const TOOL_RESULT: &str = "gen_ai.tool.call.result";
    pub(crate) const INPUT_MESSAGES: &str = "gen_ai.input.messages";
    pub(crate) const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
    pub(crate) const ERROR_TYPE: &str = "error.type";
}

/// A span under way.
struct Open {
    span_id: SpanId,
    start: SystemTime,
    attributes: Vec<KeyValue>,
}

/// What a run's spans need beyond what the tracker keeps.
struct RunSpan {
    trace_id: TraceId,
    span: Open,
    parent: SpanId,
    provider: Option<String>,
    /// What happened to the run as a whole (its tools changed, a tool source wrote): events of
    /// its `invoke_agent` span.
    events: Vec<opentelemetry::trace::Event>,
}

/// An open run, as the spans see it.
type Run = Tracked<Otel>;

/// Every run a sink sees, and the spans it has open.
pub(crate) struct Spans {
    tracker: Tracker<Otel>,
    otel: Otel,
}

/// Makes spans of the tracker's steps; `now` is the time of the event at hand.
struct Otel {
    payloads: bool,
    ids: RandomIdGenerator,
    scope: InstrumentationScope,
    now: SystemTime,
    out: Vec<SpanData>,
}

impl Spans {
    pub(crate) fn new(payloads: bool) -> Spans {
        Spans {
            tracker: Tracker::new(),
            otel: Otel {
                payloads,
                ids: RandomIdGenerator::default(),
                scope: InstrumentationScope::builder("agentloop")
                    .with_version(env!("CARGO_PKG_VERSION"))
                    .with_schema_url(format!(
                        "https://opentelemetry.io/schemas/{}",
                        crate::SEMCONV_VERSION
                    ))
                    .build(),
                now: SystemTime::now(),
                out: Vec::new(),
            },
        }
    }

    /// Takes in one event; returns the spans it ended.
    pub(crate) fn on_event(&mut self, event: &Event) -> Vec<SpanData> {
        self.otel.now = SystemTime::now();
        self.tracker.on_event(event, &mut self.otel);
        std::mem::take(&mut self.otel.out)
    }
}

impl Render for Otel {
    type Run = RunSpan;
    type Turn = ();
    type ModelCall = Open;
    type ToolCall = Open;

    /// A run seen start; a run joined mid-run has no span (its agent, parent and trace are
    /// unknown), and its events are ignored.
    fn open_run(
        &mut self,
        head: &RunHead,
        parent: Option<Parent<'_, Self>>,
        event: &Event,
    ) -> Option<RunSpan> {
        let EventKind::RunStarted { input, .. } = &event.kind else {
            return None;
        };
        // A subagent's run belongs to the tool call that started it, in its parent's trace.
        let parent = parent.map(|p| {
            let call = p.call.map_or(p.run.data.span.span_id, |t| t.span_id);
            (p.run.data.trace_id, call)
        });
        let (trace_id, parent) = parent.unwrap_or((self.ids.new_trace_id(), SpanId::INVALID));
        let mut attributes = vec![
            KeyValue::new(attr::OPERATION, "invoke_agent"),
            KeyValue::new(attr::AGENT_NAME, head.agent.clone()),
            KeyValue::new(attr::AGENT_ID, head.run_id.clone()),
            KeyValue::new(attr::REQUEST_MODEL, head.model.clone()),
            KeyValue::new("agentloop.run_id", head.run_id.clone()),
        ];
        if self.payloads {
            attributes.push(KeyValue::new(
                attr::INPUT_MESSAGES,
                serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": redact_text(input)}]}])
                    .to_string(),
            ));
        }
        Some(RunSpan {
            trace_id,
            span: self.open(attributes),
            parent,
            provider: None,
            events: Vec::new(),
        })
    }

    fn open_turn(&mut self, _: &mut Run, _: u32) {}

    fn close_turn(&mut self, _: &mut Run, _: ()) {}

    fn open_model_call(&mut self, run: &mut Run, event: &Event, opening: Opening) -> Open {
        match (&event.kind, opening) {
            (
                EventKind::ModelRequestStarted {
                    model, provider, ..
                },
                Opening::Started,
            ) => {
                let provider = provider_name(provider);
                run.data.provider.get_or_insert_with(|| provider.clone());
                self.open(vec![
                    KeyValue::new(attr::OPERATION, "chat"),
                    KeyValue::new(attr::PROVIDER, provider),
                    KeyValue::new(attr::REQUEST_MODEL, model.clone()),
                ])
            }
            (_, opening) => Open {
                span_id: self.ids.new_span_id(),
                start: self.started(opening),
                attributes: chat_attributes(run),
            },
        }
    }

    fn close_model_call(&mut self, run: &mut Run, mut open: Open, end: ModelEnd<'_>) {
        let status = match end {
            ModelEnd::Responded(event) => {
                let EventKind::ModelResponse {
                    usage,
                    cost_usd,
                    finish_reason,
                    text,
                    cached,
                    warnings,
                    ..
                } = &event.kind
                else {
                    return;
                };
                open.attributes.extend(usage_attributes(usage));
                open.attributes.push(KeyValue::new(
                    attr::FINISH_REASONS,
                    strings([finish_reason.as_str()]),
                ));
                if let Some(c) = cost_usd {
                    open.attributes
                        .push(KeyValue::new("agentloop.cost_usd", *c));
                }
                if *cached {
                    open.attributes
                        .push(KeyValue::new("agentloop.cached", true));
                }
                if !warnings.is_empty() {
                    let said = warnings
                        .iter()
                        .map(|w| StringValue::from(error_text(w, self.payloads)))
                        .collect();
                    open.attributes.push(KeyValue::new(
                        "agentloop.warnings",
                        Value::Array(Array::String(said)),
                    ));
                }
                if self.payloads {
                    open.attributes.push(KeyValue::new(
                        attr::OUTPUT_MESSAGES,
                        output_messages(text, Some(*finish_reason)),
                    ));
                }
                Status::Unset
            }
            ModelEnd::Failed { code, message } => {
                open.attributes
                    .push(KeyValue::new(attr::ERROR_TYPE, code.to_owned()));
                Status::error(error_text(message, self.payloads))
            }
            ModelEnd::Superseded => {
                // The trace file's code for it too.
                open.attributes
                    .push(KeyValue::new(attr::ERROR_TYPE, "model.superseded"));
                Status::error("superseded")
            }
            ModelEnd::RunEnded(_) => Status::error("unfinished"),
        };
        let span = self.chat_span(run, open, status);
        self.out.push(span);
    }

    fn open_tool_call(&mut self, _: &mut Run, event: &Event, opening: Opening) -> Open {
        let start = self.started(opening);
        let attributes = match &event.kind {
            EventKind::ToolStarted {
                call_id,
                tool,
                arguments,
            } => {
                let mut attributes = tool_attributes(tool, call_id);
                if self.payloads {
                    attributes.push(KeyValue::new(
                        attr::TOOL_ARGUMENTS,
                        redact(arguments).to_string(),
                    ));
                }
                attributes
            }
            EventKind::ToolFinished { call_id, tool, .. }
            | EventKind::ToolRejected { call_id, tool, .. } => tool_attributes(tool, call_id),
            _ => Vec::new(),
        };
        Open {
            span_id: self.ids.new_span_id(),
            start,
            attributes,
        }
    }

    fn close_tool_call(&mut self, run: &mut Run, mut open: Open, end: ToolEnd<'_>) {
        let tool = open
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == attr::TOOL_NAME)
            .map(|kv| kv.value.to_string())
            .unwrap_or_default();
        // However the call ended (a call its run left running too), the conventions' name.
        let name = if tool.is_empty() {
            "execute_tool".to_owned()
        } else {
            format!("execute_tool {tool}")
        };
        let status = match end {
            ToolEnd::Finished(outcome) => self.tool_status(&mut open, outcome),
            ToolEnd::Rejected { code, reason, .. } => {
                open.attributes
                    .push(KeyValue::new(attr::ERROR_TYPE, code.to_owned()));
                Status::error(first_line(reason))
            }
            // A drained batch's calls end with their run.
            ToolEnd::RunEnded(_) => Status::error("unfinished"),
        };
        let span = self.data(run, name.into(), SpanKind::Internal, open, status);
        self.out.push(span);
    }

    fn close_run(&mut self, mut run: Run, end: &RunEnd<'_>) {
        let mut open = std::mem::replace(
            &mut run.data.span,
            Open {
                span_id: SpanId::INVALID,
                start: self.now,
                attributes: Vec::new(),
            },
        );
        if let Some(p) = &run.data.provider {
            open.attributes
                .push(KeyValue::new(attr::PROVIDER, p.clone()));
        }
        let status = match end {
            RunEnd::Finished {
                stop_reason,
                usage,
                cost_usd,
                turns,
                error,
            } => {
                open.attributes.extend(usage_attributes(usage));
                open.attributes.extend([
                    KeyValue::new("agentloop.stop_reason", stop_reason.as_str()),
                    KeyValue::new("agentloop.turns", i64::from(*turns)),
                    KeyValue::new("agentloop.cost_usd", *cost_usd),
                ]);
                match error {
                    Some(e) => {
                        open.attributes
                            .push(KeyValue::new(attr::ERROR_TYPE, e.code.clone()));
                        // A refused or filtered answer's error quotes the model's words: a
                        // payload.
                        Status::error(first_line(&error_text(&e.message, self.payloads)))
                    }
                    None => Status::Ok,
                }
            }
            RunEnd::Abandoned => Status::error("unfinished"),
        };
        if self.payloads
            && let Some(text) = run.last_text()
        {
            open.attributes.push(KeyValue::new(
                attr::OUTPUT_MESSAGES,
                output_messages(text, None),
            ));
        }
        let name = format!("invoke_agent {}", run.head().agent);
        let at = (run.data.trace_id, run.data.parent);
        let mut span = self.build(at, name.into(), SpanKind::Internal, open, status);
        span.events.events = std::mem::take(&mut run.data.events);
        self.out.push(span);
    }

    fn on_event(&mut self, run: &mut Run, event: &Event) {
        let now = self.now;
        match &event.kind {
            // A model call started over: the code, not the message (which can quote what the
            // provider read), and how much of the abandoned attempt was discarded.
            EventKind::ModelRetrying {
                retry,
                model,
                code,
                delay,
                discarded,
                ..
            } => {
                let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
                run.data.events.push(opentelemetry::trace::Event::new(
                    "agentloop.model_retrying",
                    now,
                    vec![
                        KeyValue::new("agentloop.turn", i64::from(event.turn)),
                        KeyValue::new("agentloop.retry", i64::from(*retry)),
                        KeyValue::new("gen_ai.request.model", model.clone()),
                        KeyValue::new("error.type", code.clone()),
                        KeyValue::new("agentloop.retry.delay_ms", delay.as_secs_f64() * 1000.0),
                        KeyValue::new(
                            "agentloop.discarded.text_chars",
                            count(discarded.text_chars),
                        ),
                        KeyValue::new(
                            "agentloop.discarded.reasoning_chars",
                            count(discarded.reasoning_chars),
                        ),
                        KeyValue::new(
                            "agentloop.discarded.tool_calls",
                            count(discarded.tool_calls),
                        ),
                    ],
                    0,
                ));
            }
            EventKind::Compacted { .. } => {
                let span = self.compaction(run, event);
                self.out.extend(span);
            }
            EventKind::ToolsChanged {
                added,
                removed,
                updated,
                refused,
            } => {
                let list = |names: &[String]| -> Value {
                    Value::Array(Array::String(
                        names.iter().map(|n| StringValue::from(n.clone())).collect(),
                    ))
                };
                run.data.events.push(opentelemetry::trace::Event::new(
                    "agentloop.tools_changed",
                    now,
                    vec![
                        KeyValue::new("agentloop.turn", i64::from(event.turn)),
                        KeyValue::new("agentloop.tools.added", list(added)),
                        KeyValue::new("agentloop.tools.removed", list(removed)),
                        KeyValue::new("agentloop.tools.updated", list(updated)),
                        KeyValue::new("agentloop.tools.refused", list(refused)),
                    ],
                    0,
                ));
            }
            // A server's stderr can quote anything it read: a payload, redacted like one.
            EventKind::ToolSourceOutput { origin, lines } if self.payloads => {
                let text: Vec<String> = lines.iter().map(|l| redact_text(l)).collect();
                run.data.events.push(opentelemetry::trace::Event::new(
                    "agentloop.tool_source.output",
                    now,
                    vec![
                        KeyValue::new("agentloop.tool_source", origin.clone()),
                        KeyValue::new("agentloop.tool_source.lines", text.join("\n")),
                    ],
                    0,
                ));
            }
            // The conversation went to another agent, whose run (a child span) answered.
            EventKind::HandedOff {
                call_id,
                tool,
                from,
                to,
                answered_by,
                run_id,
            } => {
                run.data.events.push(opentelemetry::trace::Event::new(
                    "agentloop.handoff",
                    now,
                    vec![
                        KeyValue::new("gen_ai.tool.call.id", call_id.clone()),
                        KeyValue::new("gen_ai.tool.name", tool.clone()),
                        KeyValue::new("agentloop.handoff.from", from.clone()),
                        KeyValue::new("agentloop.handoff.to", to.clone()),
                        KeyValue::new("agentloop.handoff.answered_by", answered_by.clone()),
                        KeyValue::new("agentloop.handoff.run_id", run_id.clone()),
                    ],
                    0,
                ));
            }
            _ => {}
        }
    }
}

impl Otel {
    /// A span opening now.
    fn open(&self, attributes: Vec<KeyValue>) -> Open {
        Open {
            span_id: self.ids.new_span_id(),
            start: self.now,
            attributes,
        }
    }

    /// When a span opened: now, or for an orphan as long before now as its end says it took.
    fn started(&self, opening: Opening) -> SystemTime {
        match opening {
            Opening::Started => self.now,
            Opening::Orphan { ago } => before(self.now, ago),
        }
    }

    /// A compaction's summary call: a `chat` span marked `agentloop.compaction`.
    fn compaction(&self, run: &Run, event: &Event) -> Option<SpanData> {
        let EventKind::Compacted {
            policy,
            messages_replaced,
            tokens_before,
            tokens_after,
            summary,
            usage,
            cost_usd,
            fallback,
            duration,
            ..
        } = &event.kind
        else {
            return None;
        };
        let mut attributes = chat_attributes(run);
        attributes.extend([
            KeyValue::new("agentloop.compaction", true),
            KeyValue::new("agentloop.compaction.policy", policy.clone()),
            KeyValue::new(
                "agentloop.compaction.messages_replaced",
                i64::try_from(*messages_replaced).unwrap_or(i64::MAX),
            ),
            KeyValue::new("agentloop.compaction.tokens_before", int(*tokens_before)),
            KeyValue::new("agentloop.compaction.tokens_after", int(*tokens_after)),
            KeyValue::new("agentloop.cost_usd", *cost_usd),
        ]);
        attributes.extend(usage_attributes(usage));
        if let Some(f) = fallback {
            attributes.push(KeyValue::new("agentloop.compaction.fallback", f.clone()));
        }
        if let (true, Some(s)) = (self.payloads, summary) {
            attributes.push(KeyValue::new(
                attr::OUTPUT_MESSAGES,
                output_messages(s, None),
            ));
        }
        let open = Open {
            span_id: self.ids.new_span_id(),
            start: before(self.now, *duration),
            attributes,
        };
        Some(self.chat_span(run, open, Status::Unset))
    }

    /// A finished call's status, with its retries, its error type, and its result when payloads
    /// are kept.
    fn tool_status(&self, open: &mut Open, outcome: &CallOutcome) -> Status {
        if outcome.retries > 0 {
            open.attributes.push(KeyValue::new(
                "agentloop.retries",
                i64::from(outcome.retries),
            ));
        }
        if outcome.status == CallStatus::Ok {
            if self.payloads {
                open.attributes.push(KeyValue::new(
                    attr::TOOL_RESULT,
                    match &outcome.content {
                        ToolContent::Json(v) => redact(v).to_string(),
                        other => redact_text(&other.to_text()),
                    },
                ));
            }
            return Status::Unset;
        }
        let code = match &outcome.code {
            Some(code) => code.to_string(),
            None => format!("{:?}", outcome.status).to_lowercase(),
        };
        open.attributes.push(KeyValue::new(attr::ERROR_TYPE, code));
        // What the model read may quote the tool's own output: payload rules apply.
        let message = if self.payloads {
            first_line(&redact_text(&outcome.content.to_text()))
        } else {
            format!("{:?}", outcome.status).to_lowercase()
        };
        Status::error(message)
    }

    fn chat_span(&self, run: &Run, open: Open, status: Status) -> SpanData {
        let name = format!("chat {}", run.head().model);
        self.data(run, name.into(), SpanKind::Client, open, status)
    }

    /// A span of `run`, its parent the run's span.
    fn data(
        &self,
        run: &Run,
        name: std::borrow::Cow<'static, str>,
        kind: SpanKind,
        open: Open,
        status: Status,
    ) -> SpanData {
        let at = (run.data.trace_id, run.data.span.span_id);
        self.build(at, name, kind, open, status)
    }

    /// A span finished now, in trace `at.0`, under span `at.1`.
    fn build(
        &self,
        at: (TraceId, SpanId),
        name: std::borrow::Cow<'static, str>,
        kind: SpanKind,
        open: Open,
        status: Status,
    ) -> SpanData {
        SpanData {
            span_context: context(at.0, open.span_id),
            parent_span_id: at.1,
            parent_span_is_remote: false,
            span_kind: kind,
            name,
            start_time: open.start,
            end_time: self.now.max(open.start),
            attributes: open.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        }
    }
}

fn context(trace_id: TraceId, span_id: SpanId) -> SpanContext {
    SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    )
}

fn chat_attributes(run: &Run) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new(attr::OPERATION, "chat"),
        KeyValue::new(attr::REQUEST_MODEL, run.head().model.clone()),
    ];
    if let Some(p) = &run.data.provider {
        a.push(KeyValue::new(attr::PROVIDER, p.clone()));
    }
    a
}

fn tool_attributes(tool: &str, call_id: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new(attr::OPERATION, "execute_tool"),
        KeyValue::new(attr::TOOL_NAME, tool.to_owned()),
        KeyValue::new(attr::TOOL_CALL_ID, call_id.to_owned()),
        KeyValue::new(attr::TOOL_TYPE, "function"),
    ]
}

fn usage_attributes(u: &Usage) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new(attr::INPUT_TOKENS, int(u.input_tokens)),
        KeyValue::new(attr::OUTPUT_TOKENS, int(u.output_tokens)),
    ];
    for (key, n) in [
        (attr::CACHE_READ, u.cached_input_tokens),
        (attr::CACHE_CREATION, u.cache_write_tokens),
        (attr::REASONING, u.reasoning_tokens),
    ] {
        if n > 0 {
            a.push(KeyValue::new(key, int(n)));
        }
    }
    a
}

/// `gen_ai.output.messages`: the conventions' JSON shape, as a string.
fn output_messages(text: &str, finish: Option<FinishReason>) -> String {
    let mut message = serde_json::json!({
        "role": "assistant",
        "parts": [{"type": "text", "content": redact_text(text)}],
    });
    if let (Some(f), Some(map)) = (finish, message.as_object_mut()) {
        map.insert("finish_reason".into(), f.as_str().into());
    }
    serde_json::Value::Array(vec![message]).to_string()
}

/// The conventions' provider names for ours.
fn provider_name(provider: &str) -> String {
    match provider {
        "openai-responses" => "openai".into(),
        other => other.to_owned(),
    }
}

fn strings<const N: usize>(items: [&str; N]) -> Value {
    Value::Array(Array::String(
        items
            .iter()
            .map(|s| StringValue::from((*s).to_owned()))
            .collect(),
    ))
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn before(now: SystemTime, d: Duration) -> SystemTime {
    now.checked_sub(d).unwrap_or(now)
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
    use std::sync::Arc;

    use agentloop::model::Usage;
    use agentloop::{Event, EventKind, StopReason};
    use opentelemetry::Value;
    use opentelemetry::trace::Status;

    use super::Spans;

    fn event(turn: u32, kind: EventKind) -> Event {
        Event {
            run_id: Arc::from("r1"),
            turn,
            kind,
        }
    }

    fn run_events() -> Vec<Event> {
        vec![
            event(
                0,
                EventKind::RunStarted {
                    agent: "a".into(),
                    model: "m".into(),
                    parent_run_id: None,
                    parent_call_id: None,
                    input: "go".into(),
                },
            ),
            event(
                1,
                EventKind::ToolSourceOutput {
                    origin: "notes".into(),
                    lines: vec!["OPENAI_API_KEY=sk-test-secret-4711".into()],
                },
            ),
            event(
                2,
                EventKind::ToolsChanged {
                    added: vec!["notes__grow".into()],
                    removed: Vec::new(),
                    updated: Vec::new(),
                    refused: Vec::new(),
                },
            ),
            event(
                2,
                EventKind::RunFinished {
                    stop_reason: StopReason::Finished,
                    usage: Usage::default(),
                    cost_usd: 0.0,
                    turns: 2,
                    error: None,
                },
            ),
        ]
    }

    #[test]
    fn a_tool_change_and_a_sources_output_are_events_of_the_agent_span() {
        for payloads in [false, true] {
            let mut spans = Spans::new(payloads);
            let ended: Vec<_> = run_events()
                .iter()
                .flat_map(|e| spans.on_event(e))
                .collect();
            assert_eq!(ended.len(), 1);
            let agent = &ended[0];
            assert_eq!(agent.name, "invoke_agent a");
            let names: Vec<&str> = agent.events.iter().map(|e| e.name.as_ref()).collect();
            if payloads {
                assert_eq!(
                    names,
                    ["agentloop.tool_source.output", "agentloop.tools_changed"]
                );
                let lines = agent.events.events[0]
                    .attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == "agentloop.tool_source.lines")
                    .unwrap();
                assert!(!lines.value.as_str().contains("sk-test-secret-4711"));
            } else {
                // A source's output is a payload: without them, only the change.
                assert_eq!(names, ["agentloop.tools_changed"]);
            }
            let change = agent.events.events.last().unwrap();
            let added = change
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == "agentloop.tools.added")
                .unwrap();
            assert!(matches!(&added.value, Value::Array(_)));
            assert!(added.value.as_str().contains("notes__grow"));
        }
    }

    #[test]
    fn a_retried_model_call_is_an_event_of_the_agent_span_without_its_message() {
        let mut events = run_events();
        events.insert(
            1,
            event(
                1,
                EventKind::ModelRetrying {
                    retry: 1,
                    model: "m".into(),
                    code: "model.overloaded".into(),
                    message: "busy: OPENAI_API_KEY=sk-test-secret-4711".into(),
                    delay: std::time::Duration::from_millis(500),
                    discarded: agentloop::model::Discarded {
                        text_chars: 11,
                        ..Default::default()
                    },
                    usage: None,
                },
            ),
        );
        let mut spans = Spans::new(true);
        let ended: Vec<_> = events.iter().flat_map(|e| spans.on_event(e)).collect();
        let agent = &ended[0];
        let retry = agent
            .events
            .iter()
            .find(|e| e.name == "agentloop.model_retrying")
            .unwrap();
        let attr = |key: &str| {
            retry
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(attr("error.type"), Some(Value::from("model.overloaded")));
        assert_eq!(attr("agentloop.discarded.text_chars"), Some(Value::I64(11)));
        assert_eq!(attr("agentloop.retry"), Some(Value::I64(1)));
        let all = format!("{:?}", agent.events);
        assert!(!all.contains("sk-test-secret-4711"), "{all}");
    }

    fn event_of(run: &str, turn: u32, kind: EventKind) -> Event {
        Event {
            run_id: Arc::from(run),
            turn,
            kind,
        }
    }

    fn run_started(run: &str, parent: Option<(&str, &str)>) -> Event {
        event_of(
            run,
            0,
            EventKind::RunStarted {
                agent: run.into(),
                model: "m".into(),
                parent_run_id: parent.map(|p| p.0.to_owned()),
                parent_call_id: parent.map(|p| p.1.to_owned()),
                input: "go".into(),
            },
        )
    }

    fn run_finished(run: &str) -> Event {
        event_of(
            run,
            1,
            EventKind::RunFinished {
                stop_reason: StopReason::Finished,
                usage: Usage::default(),
                cost_usd: 0.0,
                turns: 1,
                error: None,
            },
        )
    }

    #[test]
    fn a_subagent_run_is_a_child_of_the_tool_call_that_started_it() {
        let mut spans = Spans::new(false);
        let events = [
            run_started("top", None),
            event_of(
                "top",
                1,
                EventKind::ToolStarted {
                    call_id: "c1".into(),
                    tool: "helper".into(),
                    arguments: serde_json::json!({"task": "t"}),
                },
            ),
            run_started("sub", Some(("top", "c1"))),
            run_finished("sub"),
            event_of(
                "top",
                1,
                EventKind::ToolFinished {
                    call_id: "c1".into(),
                    tool: "helper".into(),
                    outcome: agentloop::CallOutcome::ok(agentloop::ToolOutput::text("done")),
                },
            ),
            run_finished("top"),
        ];
        let ended: Vec<_> = events.iter().flat_map(|e| spans.on_event(e)).collect();
        let names: Vec<&str> = ended.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "invoke_agent sub",
                "execute_tool helper",
                "invoke_agent top"
            ]
        );
        let (sub, call, top) = (&ended[0], &ended[1], &ended[2]);
        assert_eq!(sub.parent_span_id, call.span_context.span_id());
        assert_eq!(call.parent_span_id, top.span_context.span_id());
        let trace = top.span_context.trace_id();
        assert_eq!(sub.span_context.trace_id(), trace);
        assert_eq!(call.span_context.trace_id(), trace);
    }

    #[test]
    fn a_call_its_run_left_running_keeps_its_tool_in_the_span_name() {
        let mut spans = Spans::new(false);
        let events = [
            run_started("r", None),
            event_of(
                "r",
                1,
                EventKind::ToolStarted {
                    call_id: "a".into(),
                    tool: "stubborn".into(),
                    arguments: serde_json::json!({}),
                },
            ),
            run_finished("r"),
        ];
        let ended: Vec<_> = events.iter().flat_map(|e| spans.on_event(e)).collect();
        let names: Vec<&str> = ended.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["execute_tool stubborn", "invoke_agent r"]);
        assert_eq!(ended[0].status, Status::error("unfinished"));
    }

    #[test]
    fn a_refused_answers_words_reach_the_agent_span_only_with_payloads() {
        let words = "I will not help with that, sk-abcdefghijklmnopqrstuvwx";
        for payloads in [false, true] {
            let mut spans = Spans::new(payloads);
            let refused = event_of(
                "r",
                1,
                EventKind::RunFinished {
                    stop_reason: StopReason::Refused,
                    usage: Usage::default(),
                    cost_usd: 0.0,
                    turns: 1,
                    error: Some(agentloop::event::ErrorSummary {
                        code: "model.refused".into(),
                        message: format!(
                            "model error: the model refused to answer (refusal): {words}"
                        ),
                    }),
                },
            );
            let ended: Vec<_> = [run_started("r", None), refused]
                .iter()
                .flat_map(|e| spans.on_event(e))
                .collect();
            let Status::Error { description } = &ended[0].status else {
                panic!("{:?}", ended[0].status);
            };
            assert!(description.contains("refused to answer (refusal)"));
            assert_eq!(
                description.contains("I will not help"),
                payloads,
                "{description}"
            );
            assert!(
                !description.contains("sk-abcdefghijklmnopqrstuvwx"),
                "{description}"
            );
        }
    }

    #[test]
    fn a_second_request_supersedes_the_open_chat_and_a_run_never_seen_start_has_no_spans() {
        let mut spans = Spans::new(false);
        let request = || {
            event_of(
                "r",
                1,
                EventKind::ModelRequestStarted {
                    model: "m".into(),
                    provider: "openai".into(),
                    messages: 1,
                },
            )
        };
        let events = [
            run_started("r", None),
            request(),
            request(),
            event_of(
                "r",
                1,
                EventKind::ModelError {
                    code: "model.server".into(),
                    message: "down".into(),
                },
            ),
            run_finished("stray"),
        ];
        let ended: Vec<_> = events.iter().flat_map(|e| spans.on_event(e)).collect();
        let statuses: Vec<(&str, Status)> = ended
            .iter()
            .map(|s| (s.name.as_ref(), s.status.clone()))
            .collect();
        assert_eq!(
            statuses,
            [
                ("chat m", Status::error("superseded")),
                ("chat m", Status::error("down")),
            ]
        );
    }
}
