//! Cases of the providers' quirks corpus (`crates/agentloop-providers/tests/quirks/`) through
//! `agentloop run --json`: the agent file points at a loopback server that answers with the
//! case's recorded replies, and the run's JSON (and the requests that reached the server) must
//! show what a correct client makes of them, with the `[model]` keys that override the adapter's
//! options.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

#[path = "../../agentloop-providers/tests/quirks/server.rs"]
mod server;
mod support;

use std::path::PathBuf;

use serde_json::{Value, json};
use server::{QuirkServer, Reply};
use support::{AgentDir, TEST_KEY, agentloop, args, stderr, stdout, stdout_json};

fn case_dir(id: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../agentloop-providers/tests/quirks")
        .join(id)
}

/// The case's replies, then (for a run that goes on after the tools) a plain answer.
fn replies(id: &str, then_answer: bool) -> Vec<Reply> {
    let dir = case_dir(id);
    let case: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let mut replies: Vec<Reply> = serde_json::from_value::<Vec<Reply>>(case["replies"].clone())
        .unwrap()
        .into_iter()
        .map(|r| r.load(&dir))
        .collect();
    if then_answer {
        replies.push(Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: None,
            pause: None,
            bytes: concat!(
                "data: {\"id\":\"c-end\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Both sunny.\"},\"finish_reason\":null}]}\n\n",
                "data: {\"id\":\"c-end\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
                "data: [DONE]\n\n"
            )
            .as_bytes()
            .to_vec(),
        });
    }
    replies
}

/// An OpenAI-compatible agent with the logging `get_weather` tool; `extra` goes into `[model]`.
fn agent(uri: &str, model: &str, extra: &str) -> AgentDir {
    AgentDir::new(&format!(
        r#"name = "weather"
instructions = "You answer weather questions."

[model]
provider = "openai"
name = "{model}"
base_url = "{uri}/v1"
api_key_env = "AGENTLOOP_TEST_KEY"
{extra}
[[tools]]
name = "get_weather"
description = "The weather of a city."
command = ["python3", "tool.py"]
input_schema = {{ type = "object", properties = {{ city = {{ type = "string" }} }} }}
"#
    ))
}

/// The tool ran for Paris and for Tokyo; the two calls run in parallel, so in either order.
fn assert_paris_and_tokyo(dir: &AgentDir) {
    let mut inputs: Vec<String> = dir.tool_inputs().iter().map(Value::to_string).collect();
    inputs.sort();
    assert_eq!(
        inputs,
        [
            json!({"city": "Paris"}).to_string(),
            json!({"city": "Tokyo"}).to_string()
        ]
    );
}

async fn run(dir: &AgentDir) -> std::process::Output {
    agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "Weather in Paris and Tokyo?",
        "--json",
    ]))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn parallel_calls_all_at_index_0_each_run_as_their_own_call() {
    let server = QuirkServer::start(replies("chat-ollama-whole-calls-all-at-index-0", true)).await;
    let dir = agent(&server.uri, "qwen3:8b", "");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished");
    assert_eq!(v["output"], "Both sunny.");
    let ids: Vec<&str> = v["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_x1y2", "call_z3w4"]);
    assert_paris_and_tokyo(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn deepseek_reasoning_goes_back_unless_the_agent_file_turns_it_off() {
    let id = "chat-deepseek-reasoning-content-goes-back";
    let server = QuirkServer::start(replies(id, false)).await;
    let dir = agent(&server.uri, "deepseek-v4-flash", "");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let sent = server.requests();
    assert_eq!(
        sent[1]["messages"][2]["reasoning_content"],
        "The user wants Paris weather. Call get_weather."
    );

    let server = QuirkServer::start(replies(id, false)).await;
    let dir = agent(
        &server.uri,
        "deepseek-v4-flash",
        "reasoning_content = false",
    );
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(
        server.requests()[1]["messages"][2]
            .get("reasoning_content")
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gemini_thought_signatures_go_back_on_their_calls() {
    let server =
        QuirkServer::start(replies("chat-gemini-thought-signature-goes-back", false)).await;
    let dir = agent(&server.uri, "gemini-3-pro-preview", "");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout_json(&out)["output"], "Both sunny.");
    let calls = &server.requests()[1]["messages"][2]["tool_calls"];
    assert_eq!(
        calls[0]["extra_content"]["google"]["thought_signature"],
        "CiQBcsjafE2tK0yC4Vq0thoughtSignatureExample=="
    );
    assert!(calls[1].get("extra_content").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn content_as_typed_parts_is_the_runs_output() {
    let server = QuirkServer::start(replies("chat-mistral-content-as-typed-parts", false)).await;
    let dir = agent(&server.uri, "magistral-medium-latest", "stream = false");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout_json(&out)["output"], "They meet after 2 hours.");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_after_past_the_clients_wait_fails_the_run_at_once() {
    let server = QuirkServer::start(replies(
        "chat-retry-after-longer-than-the-client-waits",
        false,
    ))
    .await;
    let dir = agent(&server.uri, "gpt-4o-mini", "");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(4), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "failed");
    assert_eq!(v["error"]["code"], "model.rate_limited");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("asked to wait 3600.0 s"),
        "{v}"
    );
    assert_eq!(server.requests().len(), 1, "never hammered");
    assert!(!stdout(&out).contains(TEST_KEY));
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_timeout_secs_bounds_a_silent_server() {
    let server = QuirkServer::start(replies("chat-silence-past-the-idle-timeout", false)).await;
    let dir = agent(&server.uri, "deepseek-v4-pro", "idle_timeout_secs = 0.3");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(4), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["error"]["code"], "model.timeout", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn hermes_calls_in_plain_text_run_as_tools_with_tool_dialect() {
    let server = QuirkServer::start(replies("chat-hermes-calls-in-plain-text", false)).await;
    let dir = agent(
        &server.uri,
        "qwen2.5-7b-instruct",
        "tool_dialect = \"hermes\"",
    );
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["output"], "Both sunny.");
    assert_eq!(v["tool_calls"].as_array().unwrap().len(), 2);
    assert_paris_and_tokyo(&dir);
    let first = &server.requests()[0];
    assert!(first.get("tools").is_none(), "the tools are in the prompt");
    assert!(
        first["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("<tools>")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_options_of_another_provider_are_refused() {
    let dir = agent("http://127.0.0.1:9", "gpt-4o", "prompt_caching = false");
    let out = run(&dir).await;
    assert_ne!(out.status.code(), Some(0));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains("`prompt_caching` applies to the anthropic provider only"),
        "{said}"
    );
}
