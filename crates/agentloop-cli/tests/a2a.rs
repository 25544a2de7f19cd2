#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
//! `agentloop a2a serve`, driven by the official A2A SDK's client (`a2a-sdk` from PyPI, installed
//! at its pinned version by `scripts/a2a/install.sh`; `scripts/a2a/client.py` is a thin script
//! over it) on loopback, a scripted agent answering: the SDK reads the agent card, sends a message
//! and reads the task's answer, streams a second message of the same context (its status at
//! each turn and tool call, then the answer's artifact), gets a task, and cancels one whose tool
//! is running (the run stops, and the tool's process with it).

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// Runs the SDK's client through `steps` against the agent at `url`.
async fn sdk_client(url: &str, steps: Value) -> Vec<Value> {
    python_client_steps(
        a2a_installed().join("venv/bin/python"),
        "scripts/a2a/client.py",
        vec![url.to_owned(), steps.to_string()],
    )
    .await
}

fn text(message: &Value) -> &str {
    message["parts"][0]["text"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_reads_the_card_sends_and_streams_in_one_context() {
    let dir = forecaster("");
    let trace = dir.path("trace.ndjson");
    let agent = dir.agent();
    let server = HttpServer::start(
        "a2a",
        &[agent.to_str().unwrap(), "--trace", trace.to_str().unwrap()],
    );
    assert!(server.url.ends_with("/forecaster"), "{}", server.url);
    let seen = sdk_client(
        &server.url,
        json!([
            {"do": "card"},
            {"do": "send", "text": "The weather in Paris?", "context": "c"},
            {"do": "send", "text": "And again?", "context": "c", "streaming": true}
        ]),
    )
    .await;

    let card = &seen[0]["card"];
    assert_eq!(card["name"], "forecaster");
    assert_eq!(card["description"], "Forecasts the weather of a city.");
    assert_eq!(card["skills"][0]["id"], "forecaster");
    assert_eq!(card["capabilities"]["streaming"], true);
    let interface = &card["supportedInterfaces"][0];
    assert_eq!(interface["protocolBinding"], "JSONRPC");
    assert_eq!(interface["protocolVersion"], "1.0");
    assert_eq!(interface["url"], server.url.as_str());

    // Not streamed: one event, the finished task with its answer.
    let events = seen[1]["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    let task = &events[0]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let answer = &task["artifacts"][0];
    assert_eq!(answer["name"], "answer");
    assert_eq!(
        answer["parts"][1]["data"],
        json!({"forecast": "18 degrees and sunny"})
    );
    assert_eq!(text(&task["history"][0]), "The weather in Paris?");
    assert_eq!(task["history"][0]["role"], "ROLE_USER");
    assert_eq!(task["history"][1]["role"], "ROLE_AGENT");

    // Streamed: the task, its status through the run, the answer, the end.
    let events = seen[2]["events"].as_array().unwrap();
    let first = &events[0]["task"];
    assert_eq!(first["status"]["state"], "TASK_STATE_SUBMITTED");
    assert_eq!(first["contextId"], task["contextId"], "the same context");
    let said: Vec<&str> = events
        .iter()
        .filter_map(|e| e.get("statusUpdate"))
        .filter_map(|u| u["status"].get("message"))
        .map(text)
        .collect();
    assert!(
        said.starts_with(&["turn 1", "calling forecast", "forecast: ok", "turn 2"]),
        "{said:?}"
    );
    let artifact = events
        .iter()
        .find_map(|e| e.get("artifactUpdate"))
        .expect("no artifact update");
    assert_eq!(
        artifact["artifact"]["parts"][1]["data"]["forecast"],
        "18 degrees and sunny"
    );
    let last = &events.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_COMPLETED", "{events:?}");
    assert_eq!(dir.tool_inputs().len(), 2, "each message ran the agent");

    // The context is a conversation: the second run's first request held the first run's
    // messages (its user message, the call, its result, the answer) before its own.
    let model_calls: Vec<u64> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == "model_call" && r.get("ended_at_ms").is_some())
        .map(|r| r["messages"].as_u64().unwrap())
        .collect();
    assert_eq!(model_calls.len(), 4, "{model_calls:?}");
    assert!(model_calls[2] > model_calls[1], "{model_calls:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_gets_and_cancels_a_task_whose_tool_is_running() {
    let dir = forecaster("");
    slow_script(&dir);
    let agent = dir.agent();
    let server = HttpServer::start("a2a", &[agent.to_str().unwrap()]);
    let started = Instant::now();
    let seen = sdk_client(
        &server.url,
        json!([
            {"do": "start", "text": "Take your time.", "task": "t"},
            {"do": "cancel", "task": "t", "when_exists": dir.path("started")},
            {"do": "get", "task": "t"},
            {"do": "cancel", "task": "t"}
        ]),
    )
    .await;
    let working = &seen[0]["events"][0]["task"];
    assert!(
        ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"]
            .contains(&working["status"]["state"].as_str().unwrap()),
        "{working}"
    );
    let cancelled = &seen[1]["task"];
    assert_eq!(
        cancelled["status"]["state"], "TASK_STATE_CANCELED",
        "{cancelled}"
    );
    assert_eq!(seen[2]["task"]["status"]["state"], "TASK_STATE_CANCELED");
    // A task that ended cannot be cancelled again.
    assert_eq!(
        seen[3]["error"]["type"], "TaskNotCancelableError",
        "{}",
        seen[3]
    );
    // The tool's process went with its run.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(started.elapsed())).await;
    assert!(!dir.path("finished").exists(), "the slow tool ran on");
}
