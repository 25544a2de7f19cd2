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
use support::{AgentDir, TEST_KEY, agentloop, args, run_agent_json, stderr, stdout, stdout_json};

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
    run_agent_json(&dir.agent(), "Weather in Paris and Tokyo?").await
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
async fn a_legacy_function_call_runs_as_a_tool_under_an_id_the_run_gives_it() {
    let server = QuirkServer::start(replies("chat-legacy-function-call-streamed", true)).await;
    let dir = agent(&server.uri, "functionary-small-v2.5", "");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished");
    assert_eq!(v["output"], "Both sunny.");
    assert_eq!(dir.tool_inputs(), [json!({"city": "Paris"})]);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    let id = calls[0]["id"].as_str().unwrap();
    assert!(!id.is_empty(), "{v}");
    // The call goes back under that id, with its result under the same one.
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1]["messages"].as_array().unwrap();
    let call = messages
        .iter()
        .find_map(|m| m["tool_calls"].get(0))
        .unwrap();
    assert_eq!(call["id"], id);
    assert_eq!(call["function"]["name"], "get_weather");
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["tool_call_id"], id);
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

/// A server whose every answer is a stream of keep-alive comments and nothing else, until the
/// client leaves (a relay whose upstream stalled): its address.
async fn kept_alive_for_ever() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The request is not read whole: nothing in it changes the answer.
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = b"d\r\n: keepalive\n\n\r\n";
                while socket.write_all(chunk).await.is_ok() {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            });
        }
    });
    uri
}

#[tokio::test(flavor = "multi_thread")]
async fn keepalive_timeout_secs_bounds_a_stream_of_keep_alives_alone() {
    let uri = kept_alive_for_ever().await;
    let dir = agent(&uri, "gpt-4o-mini", "keepalive_timeout_secs = 0.3");
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), run(&dir))
        .await
        .expect("the keep-alives held the run");
    assert_eq!(out.status.code(), Some(4), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["error"]["code"], "model.timeout", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("keepalive_timeout"),
        "{v}"
    );

    let dir = agent(&uri, "gpt-4o-mini", "keepalive_timeout_secs = -1");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(
        v["error"]["problems"][0]["path"], "model.keepalive_timeout_secs",
        "{v}"
    );
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

/// A recorded answer of the 1.5B model (`tests/corpus/` of the providers), streamed as its
/// content in small pieces.
fn recorded_answer(case_id: &str) -> Reply {
    let corpus: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../agentloop-providers/tests/corpus/qwen2.5-coder-1.5b.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let case = corpus["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == case_id)
        .unwrap_or_else(|| panic!("no corpus case {case_id}"));
    Reply::content_stream(case["text"].as_str().unwrap(), 3)
}

/// What Qwen2.5-Coder-1.5B wrote for a weather question (a fenced JSON call, no tags): with
/// `tool_dialect = "auto"` it is a call, the tool runs, and the next answer finishes the run.
#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_call_of_a_small_model_runs_as_a_tool_with_tool_dialect_auto() {
    let mut answers = replies("chat-hermes-calls-in-plain-text", true);
    let end = answers.pop().unwrap();
    let server = QuirkServer::start(vec![
        recorded_answer("hermes-prompt-what-is-the-weather-in-paris"),
        end,
    ])
    .await;
    let dir = agent(&server.uri, "local", "tool_dialect = \"auto\"");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert_eq!(v["output"], "Both sunny.");
    assert_eq!(
        dir.tool_inputs(),
        [json!({"city": "Paris", "unit": "celsius"})]
    );
    let first = &server.requests()[0];
    assert!(first.get("tools").is_none(), "the tools are in the prompt");
}

/// `plan` of an agent on a server of this machine with no dialect names the setting to try.
#[tokio::test(flavor = "multi_thread")]
async fn plan_names_tool_dialect_auto_for_a_local_server() {
    let dir = agent("http://127.0.0.1:9", "local", "");
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap(), "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    let said = v["model"]["tool_calls"].as_str().unwrap_or_default();
    assert!(said.contains("tool_dialect = \"auto\""), "{v}");
    let dir = agent("http://127.0.0.1:9", "local", "tool_dialect = \"auto\"");
    let out = agentloop(args(&["plan", dir.agent().to_str().unwrap()])).await;
    assert!(
        stdout(&out).contains("tool_dialect: auto"),
        "{}",
        stdout(&out)
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

/// One case served (then a plain answer, when `then_answer`) to `dir`'s agent, run with
/// `--json`: the server, the exit code and the JSON object.
async fn served(
    id: &str,
    then_answer: bool,
    dir: impl FnOnce(&str) -> AgentDir,
) -> (QuirkServer, AgentDir, Option<i32>, Value) {
    let server = QuirkServer::start(replies(id, then_answer)).await;
    let dir = dir(&server.uri);
    let out = run(&dir).await;
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(4),
        "stderr: {}",
        stderr(&out)
    );
    let v = stdout_json(&out);
    (server, dir, out.status.code(), v)
}

/// The run failed with the model's error `code`: exit 4, `failed`, no output.
fn assert_model_failure(exit: Option<i32>, v: &Value, code: &str) {
    assert_eq!(exit, Some(4), "{v}");
    assert_eq!(v["stop_reason"], "failed", "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["output"], Value::Null, "a partial text is no answer: {v}");
}

/// The run finished with `output` after `requests` requests reached the server.
fn assert_finished(
    exit: Option<i32>,
    v: &Value,
    output: &str,
    server: &QuirkServer,
    requests: usize,
) {
    assert_eq!(exit, Some(0), "{v}");
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert_eq!(v["output"], output, "{v}");
    assert_eq!(server.requests().len(), requests);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_chunk_after_text_on_every_attempt_fails_the_run_never_with_the_partial_text() {
    let (server, _dir, exit, v) = served("chat-openrouter-error-chunk-mid-stream", false, |uri| {
        agent(uri, "openai/gpt-4o-mini", "")
    })
    .await;
    assert_model_failure(exit, &v, "model.server_error");
    assert_eq!(
        server.requests().len(),
        3,
        "a transient error part-way is retried, up to the policy's three attempts"
    );
}

/// The error chunk after text, then a whole answer: the call is retried, the run's answer is the
/// second attempt's alone, the terminal that showed the first attempt's text says it was
/// discarded, and the trace keeps the retry.
#[tokio::test(flavor = "multi_thread")]
async fn an_error_chunk_after_text_is_retried_and_the_text_shown_is_said_discarded() {
    let server = QuirkServer::start(replies("chat-openrouter-error-chunk-mid-stream", true)).await;
    let dir = agent(&server.uri, "openai/gpt-4o-mini", "");
    let trace = dir.path("trace.ndjson");
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "Weather in Paris?",
        "--trace",
        trace.to_str().unwrap(),
    ]))
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {err}");
    assert_eq!(server.requests().len(), 2);
    assert_eq!(stdout(&out).trim(), "Both sunny.", "stderr: {err}");
    // The partial text streamed, then the line that takes it back, then the answer.
    let partial = err.find("The weather in Paris").expect(&err);
    let retry = err
        .find(
            "↻ model failed model.server_error: Provider disconnected unexpectedly; the 20 \
               characters of text streamed so far discarded; retry 1 (openai/gpt-4o-mini) in ",
        )
        .expect(&err);
    let answer = err.rfind("Both sunny.").expect(&err);
    assert!(partial < retry && retry < answer, "{err}");
    let records: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let run = records
        .iter()
        .rfind(|r| r["kind"] == "run")
        .expect("a run record");
    let warnings = run["warnings"].to_string();
    assert!(
        warnings.contains(
            "model call in turn 1 failed and was retried (1, openai/gpt-4o-mini): \
                           model.server_error: Provider disconnected unexpectedly; discarded what \
                           it streamed: 20 characters of text, 0 of reasoning, 0 tool calls"
        ),
        "{run}"
    );
    assert_eq!(run["stop_reason"], "finished", "{run}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_chunk_before_any_text_is_retried_and_the_next_answer_finishes() {
    let (server, _dir, exit, v) =
        served("chat-openrouter-error-chunk-before-any-text", true, |uri| {
            agent(uri, "nvidia/nemotron-3-ultra-550b-a55b:free", "")
        })
        .await;
    assert_finished(exit, &v, "Sunny in Paris.", &server, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_event_then_done_is_a_model_error_never_an_empty_finished() {
    let (_server, _dir, exit, v) = served("chat-error-event-then-done", false, |uri| {
        agent(uri, "qwen3-32b", "")
    })
    .await;
    assert_model_failure(exit, &v, "model.other");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("quota exceeded"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn finish_reason_error_is_a_model_failure_never_a_final_answer() {
    let (_server, _dir, exit, v) = served(
        "chat-finish-reason-error-without-an-error-object",
        false,
        |uri| agent(uri, "openai/gpt-4o-mini", ""),
    )
    .await;
    assert_model_failure(exit, &v, "model.server_error");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_200_error_body_to_a_stream_request_is_retried() {
    let (server, _dir, exit, v) = served(
        "chat-openrouter-200-error-body-to-a-stream-request",
        true,
        |uri| agent(uri, "meta-llama/llama-3.3-70b-instruct", ""),
    )
    .await;
    assert_finished(exit, &v, "Both sunny.", &server, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_cut_before_its_arguments_never_runs_though_no_argument_is_required() {
    let (server, dir, exit, v) = served("chat-call-cut-before-its-arguments", true, |uri| {
        agent(uri, "gpt-4o-mini", "")
    })
    .await;
    assert_finished(exit, &v, "Both sunny.", &server, 2);
    assert!(dir.tool_inputs().is_empty(), "the cut call ran");
    let call = &v["tool_calls"][0];
    assert_eq!(call["ok"], false, "{v}");
    assert_eq!(call["error"]["code"], "truncated", "{v}");
    let told = &server.requests()[1]["messages"];
    let result = told
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("cut off by the output token limit"),
        "{result}"
    );
}

/// An agent of another provider at the quirk server, with the logging `get_weather` tool.
fn agent_of(provider: &str, uri: &str, model: &str, extra: &str) -> AgentDir {
    AgentDir::new(&format!(
        r#"name = "weather"
instructions = "You answer weather questions."

[model]
provider = "{provider}"
name = "{model}"
base_url = "{uri}"
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

#[tokio::test(flavor = "multi_thread")]
async fn a_responses_end_named_completed_with_status_incomplete_is_a_cut_answer() {
    let (_server, _dir, exit, v) = served(
        "responses-completed-event-with-status-incomplete",
        false,
        |uri| agent_of("openai-responses", &format!("{uri}/v1"), "gpt-4o-mini", ""),
    )
    .await;
    assert_eq!(exit, Some(4), "{v}");
    assert_eq!(v["stop_reason"], "truncated", "{v}");
    assert_eq!(v["error"]["code"], "model.truncated", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_responses_200_error_body_fails_the_run_never_an_empty_finished() {
    let (server, _dir, exit, v) = served("responses-200-with-error-body", false, |uri| {
        agent_of(
            "openai-responses",
            &format!("{uri}/v1"),
            "openai/gpt-5",
            "stream = false",
        )
    })
    .await;
    assert_model_failure(exit, &v, "model.server_error");
    // A 502 is transient: retried, and the same answer every time fails the run.
    assert!(server.requests().len() > 1, "retried");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_text_of_whitespace_only_is_never_sent_back() {
    let (server, _dir, exit, v) = served(
        "anthropic-whitespace-text-block-not-sent-back",
        false,
        |uri| agent_of("anthropic", uri, "claude-sonnet-4-5", ""),
    )
    .await;
    assert_finished(exit, &v, "Sunny in Paris.", &server, 2);
    let assistant = &server.requests()[1]["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    let blocks = assistant["content"].as_array().unwrap();
    assert!(
        blocks
            .iter()
            .all(|b| b["type"] != "text" || !b["text"].as_str().unwrap().trim().is_empty()),
        "{assistant}"
    );
    assert_eq!(blocks[0]["type"], "tool_use", "{assistant}");
}

/// An answer whose finish reason no adapter knows is not `finished`: the run fails with
/// `model.other` (exit 4) naming the word, its text kept as the output for a caller who judges
/// it whole.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_finish_reason_fails_the_run_naming_it_its_text_kept_as_the_output() {
    let body = concat!(
        "data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Paris is sun\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"a_word_of_tomorrow\"}]}\n\n",
        "data: [DONE]\n\n"
    );
    let server = QuirkServer::start(vec![event_stream(body)]).await;
    let dir = agent(&server.uri, "gpt-4o-mini", "");
    let out = run(&dir).await;
    assert_eq!(out.status.code(), Some(4), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "failed", "{v}");
    assert_eq!(v["error"]["code"], "model.other", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("a_word_of_tomorrow"), "{message}");
    assert_eq!(v["output"], "Paris is sun", "{v}");
    assert_eq!(server.requests().len(), 1, "not asked again");
}

/// What a provider's adapter noticed about an answer without failing it (here a stream that
/// ended with `[DONE]` and no finish reason) is said: in `--json`'s `warnings`, naming the turn,
/// and in the trace's run warnings; the run still finishes with the answer.
#[tokio::test(flavor = "multi_thread")]
async fn an_answers_warning_reaches_the_json_and_the_trace() {
    let body = concat!(
        "data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Sunny in Paris.\"},\"finish_reason\":null}]}\n\n",
        "data: [DONE]\n\n"
    );
    let server = QuirkServer::start(vec![event_stream(body)]).await;
    let dir = agent(&server.uri, "gpt-4o-mini", "");
    let trace = dir.path("trace.ndjson");
    let out = agentloop(args(&[
        "run",
        dir.agent().to_str().unwrap(),
        "--input",
        "Weather in Paris?",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["stop_reason"], "finished", "{v}");
    assert_eq!(v["output"], "Sunny in Paris.", "{v}");
    let warnings = v["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{v}");
    let warning = warnings[0].as_str().unwrap();
    assert!(
        warning.starts_with("model answer in turn 1: ") && warning.contains("no finish_reason"),
        "{warning}"
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let run = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .rfind(|r| r["kind"] == "run")
        .unwrap();
    let traced: Vec<&str> = run["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(traced, [warning], "{run}");
}

/// A 200 answer of `body` as a server-sent event stream.
fn event_stream(body: &str) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: None,
        pause: None,
        bytes: body.as_bytes().to_vec(),
    }
}
