//! Agents that ask the user (the `ask_user` built-in), with scripted models: one question, a
//! batch of two questions and an approval, and a tree whose subagent asks.

use serde_json::{Value, json};

use super::AgentDir;
use super::crash::TOOL;

/// One question (a choice), then the answer.
pub(crate) const ONE_QUESTION: &str = r#"name = "asker"
version = "1"
[model]
provider = "scripted"
script = "script.json"
[[tools]]
builtin = "ask_user"
"#;

/// Two questions and an approval in one batch.
pub(crate) const BATCH: &str = r#"name = "asker"
version = "1"
[model]
provider = "scripted"
script = "script.json"
[limits]
max_concurrency = 3
[[tools]]
builtin = "ask_user"
[[tools]]
name = "write"
command = ["sh", "tool.sh", "write"]
input_schema = { type = "object", properties = { key = { type = "string" } }, required = ["key"] }
[permissions]
ask = ["write"]
"#;

pub(crate) fn question(id: &str, text: &str, schema: Value) -> Value {
    json!({"id": id, "name": "ask_user", "arguments": {"question": text, "schema": schema}})
}

pub(crate) fn one_question_dir() -> AgentDir {
    let dir = AgentDir::new(ONE_QUESTION);
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [question("q1", "Which colour?", json!({"enum": ["red", "green"]}))]},
            {"text": "Painting it."}
        ])
        .to_string(),
    );
    dir
}

pub(crate) fn batch_dir() -> AgentDir {
    let dir = AgentDir::new(BATCH);
    dir.write("tool.sh", TOOL);
    dir.write(
        "script.json",
        &json!([
            {"tool_calls": [
                question("q1", "Which colour?", json!({"enum": ["red", "green"]})),
                question("q2", "How many coats?", json!({"type": "integer", "minimum": 1})),
                {"id": "w1", "name": "write", "arguments": {"key": "x"}}
            ]},
            {"text": "All set."}
        ])
        .to_string(),
    );
    dir
}

/// A parent whose subagent asks: `lead` hands a task to `helper` (call `p1`), whose model asks
/// which colour (call `a1`), then answers with it; `lead` then answers.
pub(crate) fn tree_dir() -> AgentDir {
    let dir = AgentDir::new(
        r#"name = "lead"
version = "1"
[model]
provider = "scripted"
script = "lead.json"
[[tools]]
name = "helper"
agent = "helper.toml"
description = "Paints."
"#,
    );
    dir.write(
        "helper.toml",
        r#"name = "helper"
version = "1"
[model]
provider = "scripted"
script = "helper.json"
[[tools]]
builtin = "ask_user"
"#,
    );
    dir.write(
        "lead.json",
        &json!([
            {"tool_calls": [{"id": "p1", "name": "helper", "arguments": {"task": "paint"}}]},
            {"text": "The helper painted."}
        ])
        .to_string(),
    );
    dir.write(
        "helper.json",
        &json!([
            {"tool_calls": [question("a1", "Which colour?", json!({"enum": ["red", "green"]}))]},
            {"text": "Painted it."}
        ])
        .to_string(),
    );
    dir
}

/// The call's record in a `--json` outcome.
pub(crate) fn call<'a>(outcome: &'a Value, id: &str) -> &'a Value {
    outcome["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no call {id}: {outcome:#}"))
}
