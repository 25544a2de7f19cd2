//! A chatty agent for the tests of a reader that lags (this crate's `served_backlog`, and
//! `agentloop-a2a`'s `stream_backlog` through a `#[path]`): one tool call a turn, each its own
//! arguments so that no turn repeats another, then an answer; its calls counted.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentloop::testing::ScriptedModel;
use agentloop::{Agent, Limits, ModelResponse, Tool, ToolContext, ToolOutput};
use serde_json::{Value, json};

/// An agent that calls `count` once a turn for `turns` turns, then answers "done"; `done`
/// counts the calls.
pub(crate) fn chatty(turns: usize, done: Arc<AtomicUsize>) -> Result<Agent, String> {
    let count = Tool::dynamic(
        "count",
        "Counts.",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        move |args: Value, _ctx: ToolContext| {
            let done = Arc::clone(&done);
            async move {
                done.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::json(args))
            }
        },
    );
    let script = (0..turns)
        .map(|n| {
            ModelResponse::tool_calls([(format!("c{n}"), "count", format!(r#"{{"n": {n}}}"#))])
        })
        .chain([ModelResponse::text("done")]);
    let most = Some(u32::try_from(turns).unwrap() + 10);
    Agent::builder()
        .model(ScriptedModel::new(script))
        .tool(count)
        .limits(Limits {
            max_turns: most,
            max_tool_calls: most,
            max_model_calls: most,
            ..Limits::default()
        })
        .build()
        .map_err(|e| e.to_string())
}
