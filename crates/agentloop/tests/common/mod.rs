//! Helpers shared by the core's integration tests.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::type_complexity,
    clippy::panic,
    clippy::indexing_slicing
)]

pub(crate) mod journal;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use agentloop::{
    Agent, Event, Limits, Message, ModelResponse, Tool, ToolError, ToolOutput,
    testing::ScriptedModel,
};
use serde_json::{Value, json};
use tokio::time::Instant;

/// A log of what handlers did: (tool, call id, start, end).
#[derive(Clone, Default)]
pub(crate) struct CallLog(pub Arc<Mutex<Vec<(String, String, Instant, Instant)>>>);

impl CallLog {
    pub(crate) fn names(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().map(|e| e.0.clone()).collect()
    }
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A tool that sleeps `ms` from its arguments (default 0) and echoes them, logging its times.
pub(crate) fn sleeper(name: &str, log: &CallLog) -> Tool {
    let log = log.clone();
    let tool_name = name.to_owned();
    Tool::dynamic(
        name,
        "Sleeps for ms milliseconds and echoes its arguments.",
        json!({"type": "object", "properties": {"ms": {"type": "integer", "minimum": 0}, "tag": {"type": "string"}}}),
        move |args: Value, ctx| {
            let log = log.clone();
            let tool_name = tool_name.clone();
            async move {
                let start = Instant::now();
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    _ = ctx.cancel.cancelled() => return Err(ToolError::new("cancelled", "cancelled")),
                }
                log.0.lock().unwrap().push((
                    tool_name,
                    ctx.call_id.to_string(),
                    start,
                    Instant::now(),
                ));
                Ok(ToolOutput::json(args))
            }
        },
    )
}

/// A scripted tool-call response: (id, name, raw args) each.
pub(crate) fn calls(list: &[(&str, &str, &str)]) -> ModelResponse {
    ModelResponse::tool_calls(
        list.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())),
    )
}

/// Collects events.
#[derive(Clone, Default)]
pub(crate) struct Events(pub Arc<Mutex<Vec<Event>>>);

impl Events {
    pub(crate) fn sink(&self) -> impl Fn(&Event) + Send + Sync + 'static {
        let inner = self.0.clone();
        move |e: &Event| inner.lock().unwrap().push(e.clone())
    }
    pub(crate) fn all(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }
}

pub(crate) fn counting_tool(name: &str, counter: &Arc<AtomicUsize>) -> Tool {
    let counter = counter.clone();
    Tool::dynamic(
        name,
        "Counts its calls.",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        move |args: Value, _ctx| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::json(args))
            }
        },
    )
}

pub(crate) fn agent(model: ScriptedModel, tools: Vec<Tool>, limits: Limits) -> Agent {
    Agent::builder()
        .model(model)
        .tools(tools)
        .limits(limits)
        .build()
        .unwrap()
}

/// Every assistant tool call is answered exactly once, right after its message, ids matching.
pub(crate) fn assert_tool_cycle(transcript: &[Message]) {
    let mut i = 0;
    while i < transcript.len() {
        if let Message::Assistant(a) = &transcript[i] {
            for (k, call) in a.tool_calls.iter().enumerate() {
                let r = transcript.get(i + 1 + k).and_then(Message::as_tool_result);
                let r = r.unwrap_or_else(|| {
                    panic!(
                        "call {} has no result right after its message",
                        call.call_id
                    )
                });
                assert_eq!(r.call_id, call.call_id, "results follow decision order");
            }
            i += 1 + a.tool_calls.len();
        } else {
            assert!(
                transcript[i].as_tool_result().is_none(),
                "a tool result without its call at {i}"
            );
            i += 1;
        }
    }
}
