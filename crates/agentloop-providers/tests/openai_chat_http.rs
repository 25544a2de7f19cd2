//! The Chat Completions adapter over loopback HTTP: the request sent after tool results, retries
//! and fallback, timeouts and dropped connections, the request byte budget, and secrets kept out of
//! errors. Stalls and drops use a raw `TcpListener` on 127.0.0.1.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentloop::model::complete;
use agentloop::{
    Message, Model, ModelError, ModelResponse,
    message::{AssistantMessage, Reasoning, ToolCall, ToolContent, ToolResult},
    model::{ModelErrorKind, ModelRequest, ModelSettings, ToolChoice},
    tool::ToolSpec,
};
use agentloop_providers::{Fallback, OpenAiChat, Retry, RetryPolicy};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

mod support;
use support::raw_http::read_request;
use support::{answering, fixture, http_chunk};

const API_KEY: &str = "sk-test-secret-abcdefghijklmnop";

fn model(uri: &str) -> OpenAiChat {
    OpenAiChat::builder("gpt-4.1-mini")
        .base_url(uri)
        .api_key(API_KEY)
        .build()
        .unwrap()
}

fn fast_retry(attempts: u32) -> RetryPolicy {
    RetryPolicy::attempts(attempts)
        .with_base_delay(Duration::from_millis(5))
        .with_jitter(0.0)
}

async fn ask(model: &dyn Model) -> Result<ModelResponse, ModelError> {
    support::ask_unbounded(model).await
}

fn text_sse() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(
        fixture("openai_chat/oai_chat_s_text.sse"),
        "text/event-stream",
    )
}

fn error_json(status: u16, rel: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_raw(fixture(rel), "application/json")
}

fn tool_spec(name: &str, schema: Value) -> ToolSpec {
    serde_json::from_value(
        json!({"name": name, "description": format!("{name} things"), "input_schema": schema}),
    )
    .unwrap()
}

#[tokio::test]
async fn request_after_tool_results_carries_the_calls_and_one_tool_message_per_result() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(
            fixture("openai_chat/oai_chat_ns_final_text.json"),
            "application/json",
        ))
        .mount(&server)
        .await;
    let model = OpenAiChat::builder("gpt-4.1-mini")
        .base_url(server.uri())
        .api_key(API_KEY)
        .stream(false)
        .build()
        .unwrap();

    let schema =
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
    let tools = [
        tool_spec("delete_file", schema.clone()),
        tool_spec("create_file", schema),
    ];
    let transcript = vec![
        Message::user("tidy up"),
        Message::Assistant(AssistantMessage {
            reasoning: vec![Reasoning {
                text: "thinking".into(),
                ..Default::default()
            }],
            text: String::new(),
            tool_calls: vec![
                ToolCall {
                    call_id: "call_a".into(),
                    tool: "delete_file".into(),
                    arguments: r#"{"path": ".env"}"#.into(),
                },
                ToolCall {
                    call_id: "call_b".into(),
                    tool: "create_file".into(),
                    arguments: String::new(),
                },
            ],
        }),
        Message::Tool(ToolResult {
            call_id: "call_a".into(),
            tool: "delete_file".into(),
            content: ToolContent::Text("deleted".into()),
            is_error: false,
        }),
        Message::Tool(ToolResult {
            call_id: "call_b".into(),
            tool: "create_file".into(),
            content: ToolContent::Json(json!({"ok": true})),
            is_error: false,
        }),
        Message::Assistant(AssistantMessage {
            text: "Done.".into(),
            ..Default::default()
        }),
    ];
    let settings = ModelSettings {
        temperature: Some(0.5),
        top_p: Some(0.9),
        seed: Some(7),
        max_tokens: Some(256),
        parallel_tool_calls: Some(true),
        tool_choice: Some(ToolChoice::Tool("create_file".into())),
    };
    let request = ModelRequest {
        instructions: Some("You tidy files."),
        messages: &transcript,
        tools: &tools,
        output_schema: None,
        settings: &settings,
    };
    let response = complete(&model, request).await.unwrap();
    assert_eq!(response.message.text, "The capital of England is London.");

    let requests = server.received_requests().await.unwrap();
    let sent: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(sent["model"], "gpt-4.1-mini");
    let msgs = sent["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 6);
    assert_eq!(
        msgs[0],
        json!({"role": "system", "content": "You tidy files."})
    );
    assert_eq!(msgs[1], json!({"role": "user", "content": "tidy up"}));
    // The assistant turn that only called tools: content null, both calls, ids kept, no reasoning.
    assert_eq!(msgs[2]["role"], "assistant");
    assert!(msgs[2].as_object().unwrap().contains_key("content"));
    assert_eq!(msgs[2]["content"], Value::Null);
    assert!(msgs[2].get("reasoning_content").is_none());
    assert_eq!(
        msgs[2]["tool_calls"],
        json!([
            {"id": "call_a", "type": "function", "function": {"name": "delete_file", "arguments": "{\"path\": \".env\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "create_file", "arguments": "{}"}}
        ])
    );
    // One tool message per result, answering its call by id.
    assert_eq!(
        msgs[3],
        json!({"role": "tool", "tool_call_id": "call_a", "content": "deleted"})
    );
    assert_eq!(
        msgs[4],
        json!({"role": "tool", "tool_call_id": "call_b", "content": "{\"ok\":true}"})
    );
    assert_eq!(msgs[5], json!({"role": "assistant", "content": "Done."}));
    // Tools and settings.
    assert_eq!(sent["tools"][0]["type"], "function");
    assert_eq!(sent["tools"][0]["function"]["name"], "delete_file");
    assert_eq!(
        sent["tools"][0]["function"]["description"],
        "delete_file things"
    );
    assert_eq!(
        sent["tools"][0]["function"]["parameters"]["required"],
        json!(["path"])
    );
    assert!(sent["tools"][0]["function"].get("strict").is_none());
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "function", "function": {"name": "create_file"}})
    );
    assert_eq!(sent["parallel_tool_calls"], true);
    assert_eq!(sent["temperature"], 0.5);
    assert_eq!(sent["top_p"], 0.9);
    assert_eq!(sent["seed"], 7);
    assert_eq!(sent["max_completion_tokens"], 256);
    assert!(sent.get("max_tokens").is_none());
    assert!(sent.get("stream").is_none());
    assert!(sent.get("stream_options").is_none());
    assert_eq!(
        requests[0]
            .headers
            .get("authorization")
            .unwrap()
            .to_str()
            .unwrap(),
        format!("Bearer {API_KEY}")
    );
}

/// A `get_weather` call with these arguments, as a transcript holds it.
fn weather_call(id: &str, arguments: &str) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        tool: "get_weather".into(),
        arguments: arguments.into(),
    }
}

/// The result of the `get_weather` call `id`.
fn weather_result(id: &str, text: &str, is_error: bool) -> Message {
    Message::Tool(ToolResult {
        call_id: id.into(),
        tool: "get_weather".into(),
        content: ToolContent::Text(text.into()),
        is_error,
    })
}

/// A request of `transcript` alone: no instructions, tools or schema.
fn bare_request<'a>(transcript: &'a [Message], settings: &'a ModelSettings) -> ModelRequest<'a> {
    ModelRequest {
        instructions: None,
        messages: transcript,
        tools: &[],
        output_schema: None,
        settings,
    }
}

/// The field `key` of each call the `n`th message of a sent body holds (`id`, or a field of
/// `function`).
fn sent_calls(sent: &Value, n: usize, key: &str) -> Vec<String> {
    sent["messages"][n]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let field = if key == "id" {
                &c["id"]
            } else {
                &c["function"][key]
            };
            field.as_str().unwrap().to_owned()
        })
        .collect()
}

/// A server that parses each call's arguments as llama-server does when it lays the conversation
/// out through its chat template, and answers its 500 for arguments that are no JSON.
struct ParsesArguments;

impl wiremock::Respond for ParsesArguments {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        for m in body["messages"].as_array().unwrap() {
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                let arguments = c["function"]["arguments"].as_str().unwrap();
                if serde_json::from_str::<Value>(arguments).is_err() {
                    return ResponseTemplate::new(500).set_body_json(json!({"error": {
                        "code": 500, "type": "server_error",
                        "message": "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error"}}));
                }
            }
        }
        text_sse()
    }
}

#[tokio::test]
async fn a_call_whose_arguments_are_no_json_goes_back_with_none_and_the_run_goes_on() {
    // A small local model's call cut mid-arguments (the server refused the rest of its output),
    // which the run rejected: sent back as the model wrote it, llama-server refuses every later
    // request of the run.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ParsesArguments)
        .mount(&server)
        .await;
    let cut = r#"{"city": "Tokyo", "unit": "celsius"#;
    let transcript = vec![
        Message::user("weather?"),
        Message::Assistant(AssistantMessage {
            tool_calls: vec![
                weather_call("c1", cut),
                weather_call("c2", r#"{"city":"Oslo"}"#),
                weather_call("c3", ""),
            ],
            ..Default::default()
        }),
        weather_result(
            "c1",
            "invalid arguments for get_weather: not valid JSON",
            true,
        ),
        weather_result("c2", "sunny", false),
        weather_result("c3", "invalid arguments for get_weather", true),
    ];
    let settings = ModelSettings::default();
    let local = OpenAiChat::compatible("local", server.uri(), "qwen2.5-coder")
        .build()
        .unwrap();
    let response = complete(&local, bare_request(&transcript, &settings)).await;
    assert!(response.is_ok(), "{response:?}");
    let requests = server.received_requests().await.unwrap();
    let sent: Value = serde_json::from_slice(&requests[0].body).unwrap();
    let arguments = sent_calls(&sent, 1, "arguments");
    assert_eq!(arguments, ["{}", r#"{"city":"Oslo"}"#, "{}"]);
}

/// A server that checks call ids as Mistral's API does (nine letters or digits, on each call
/// and each result) and answers with text, or with Mistral's 400 for the first id it refuses.
struct MistralIds;

impl wiremock::Respond for MistralIds {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        let mut ids = Vec::new();
        for m in body["messages"].as_array().unwrap() {
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                ids.push(c["id"].as_str().unwrap().to_owned());
            }
            if let Some(id) = m["tool_call_id"].as_str() {
                ids.push(id.to_owned());
            }
        }
        let bad = ids
            .iter()
            .find(|id| id.len() != 9 || !id.bytes().all(|b| b.is_ascii_alphanumeric()));
        match bad {
            Some(id) => ResponseTemplate::new(400).set_body_json(json!({
                "object": "error",
                "message": format!("Tool call id was {id} but must be a-z, A-Z, 0-9, with a length of 9."),
                "type": "invalid_function_call", "param": null, "code": "3280"})),
            None => text_sse(),
        }
    }
}

#[tokio::test]
async fn call_ids_of_another_shape_go_to_mistral_as_nine_letters_or_digits_the_same_on_call_and_result()
 {
    // A conversation whose calls another provider made (`call_...`), or the run named (a call
    // that came without an id: a UUID), sent on to a Mistral model: its API, and the chat
    // templates of its models on other servers, refuse any id but nine letters or digits
    // (anomalyco/opencode#1680, nearai/ironclaw#1241, ml-explore/mlx-lm#1375).
    let server = answering(MistralIds).await;
    let call = |id: &str| weather_call(id, r#"{"city":"Paris"}"#);
    let result = |id: &str| weather_result(id, "sunny", false);
    let ids = [
        "call_PTLP8xhu3uwZk4l3nlnrrJha",
        "0193a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b",
        "D681PevKs",
    ];
    let transcript = vec![
        Message::user("weather?"),
        Message::Assistant(AssistantMessage {
            tool_calls: ids.iter().map(|id| call(id)).collect(),
            ..Default::default()
        }),
        result(ids[0]),
        result(ids[1]),
        result(ids[2]),
    ];
    let settings = ModelSettings::default();
    let request = bare_request(&transcript, &settings);
    for (name, base) in [
        ("mistral-large-latest", server.uri()),
        ("devstral-small-2507", server.uri()),
    ] {
        let mistral = OpenAiChat::compatible("local", &base, name)
            .build()
            .unwrap();
        let response = complete(&mistral, request).await;
        assert!(response.is_ok(), "{name}: {response:?}");
    }
    let requests = server.received_requests().await.unwrap();
    let sent: Value = serde_json::from_slice(&requests[0].body).unwrap();
    let calls = sent_calls(&sent, 1, "id");
    let results: Vec<String> = (2..5)
        .map(|i| {
            sent["messages"][i]["tool_call_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    // Each result pairs with its call; an id of the right shape goes as it is; the digests of
    // the others differ.
    assert_eq!(calls, results);
    assert_eq!(calls[2], "D681PevKs");
    assert_ne!(calls[0], calls[1]);
    // The same on the next request (a prompt cache's prefix stays the same).
    let again: Value = serde_json::from_slice(&requests[1].body).unwrap();
    assert_eq!(again["messages"], sent["messages"]);
    // Any other model's server gets the ids as they are.
    let other = OpenAiChat::compatible("local", server.uri(), "qwen3")
        .build()
        .unwrap();
    let err = complete(&other, request).await.unwrap_err();
    assert!(
        err.message.contains("call_PTLP8xhu3uwZk4l3nlnrrJha"),
        "{err}"
    );
}

#[tokio::test]
async fn streaming_request_asks_for_usage_and_compatible_servers_get_max_tokens() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(text_sse())
        .mount(&server)
        .await;
    let model = OpenAiChat::compatible("local", server.uri(), "llama3")
        .strict(true)
        .header("x-extra", "yes")
        .build()
        .unwrap();
    let messages = [Message::user("hi")];
    let tools = [tool_spec(
        "look",
        json!({"type": "object", "properties": {"q": {"type": "string"}}}),
    )];
    let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}}});
    let settings = ModelSettings {
        max_tokens: Some(99),
        parallel_tool_calls: Some(false),
        tool_choice: Some(ToolChoice::Required),
        ..Default::default()
    };
    let request = ModelRequest {
        instructions: None,
        messages: &messages,
        tools: &tools,
        output_schema: Some(&schema),
        settings: &settings,
    };
    let response = complete(&model, request).await.unwrap();
    assert!(response.message.text.starts_with("I'm unable"));
    assert_eq!(model.provider(), "local");

    let requests = server.received_requests().await.unwrap();
    let sent: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent["max_tokens"], 99);
    assert!(sent.get("max_completion_tokens").is_none());
    assert_eq!(sent["parallel_tool_calls"], false);
    assert_eq!(sent["tool_choice"], "required");
    let function = &sent["tools"][0]["function"];
    assert_eq!(function["strict"], true);
    assert_eq!(function["parameters"]["required"], json!(["q"]));
    assert_eq!(function["parameters"]["additionalProperties"], false);
    assert_eq!(
        function["parameters"]["properties"]["q"]["type"],
        json!(["string", "null"])
    );
    let format = &sent["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["strict"], true);
    assert_eq!(
        format["json_schema"]["schema"]["additionalProperties"],
        false
    );
    // No key configured for a local server: no auth header at all.
    assert!(requests[0].headers.get("authorization").is_none());
    assert_eq!(requests[0].headers.get("x-extra").unwrap(), "yes");
}

#[tokio::test]
async fn strict_mode_answers_with_nulls_for_left_out_optional_arguments_are_read_as_absent() {
    // Strict mode made `limit` and `detail` required and nullable; the model writes null for
    // them, which the tool's own schema does not accept. The call streams in fragments.
    let call = concat!(
        "data: {\"id\":\"c\",\"model\":\"gpt-4.1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"search\",\"arguments\":\"{\\\"q\\\":\\\"x\\\",\"}}]}}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"limit\\\":null,\\\"detail\\\":{\\\"level\\\":null}}\"}}]}}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let answer = concat!(
        "data: {\"id\":\"d\",\"model\":\"gpt-4.1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{\\\"city\\\":\\\"Paris\\\",\"}}]}\n\n",
        "data: {\"id\":\"d\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\\"country\\\":null}\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(call, "text/event-stream"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(answer, "text/event-stream"))
        .mount(&server)
        .await;
    let got = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = got.clone();
    let tool = agentloop::Tool::dynamic(
        "search",
        "Searches.",
        json!({
            "type": "object",
            "properties": {
                "q": {"type": "string"},
                "limit": {"type": "integer"},
                "detail": {"type": "object", "properties": {"level": {"type": "string"}}}
            },
            "required": ["q"]
        }),
        move |args, _| {
            *seen.lock().unwrap() = Some(args);
            async { Ok(agentloop::ToolOutput::text("found")) }
        },
    );
    let model = OpenAiChat::builder("gpt-4.1")
        .base_url(server.uri())
        .api_key(API_KEY)
        .strict(true)
        .build()
        .unwrap();
    let agent = agentloop::Agent::builder()
        .model(model)
        .tool(tool)
        .output_schema(json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city"]
        }))
        .build()
        .unwrap();
    let outcome = agent.run("Find x").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.tool_calls_run, 1);
    assert_eq!(
        got.lock().unwrap().clone(),
        Some(json!({"q": "x", "detail": {}}))
    );
    assert_eq!(outcome.structured_output, Some(json!({"city": "Paris"})));
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

#[tokio::test]
async fn rate_limited_call_waits_for_retry_after_then_succeeds() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            error_json(429, "synthetic/oai_chat_err_429_rate_limit.json")
                .insert_header("retry-after", "1"),
        )
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(text_sse())
        .mount(&server)
        .await;
    let retry = Retry::with_policy(model(&server.uri()), fast_retry(3));
    let started = Instant::now();
    let response = ask(&retry).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was not honoured: {:?}",
        started.elapsed()
    );
    assert_eq!(response.raw_finish_reason.as_deref(), Some("stop"));
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

#[tokio::test]
async fn retry_after_ms_is_read_and_classified_on_the_error() {
    let server = answering(
        error_json(429, "synthetic/oai_chat_err_429_rate_limit.json")
            .insert_header("retry-after-ms", "1500"),
    )
    .await;
    let err = ask(&model(&server.uri())).await.unwrap_err();
    assert!(err.is_rate_limited() && err.is_retryable());
    assert_eq!(err.retry_after, Some(Duration::from_millis(1500)));
    assert_eq!(err.provider_code.as_deref(), Some("rate_limit_exceeded"));
}

#[tokio::test]
async fn server_error_twice_then_success() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(error_json(
            500,
            "synthetic/oai_chat_err_500_server_error.json",
        ))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(text_sse())
        .mount(&server)
        .await;
    let retry = Retry::with_policy(model(&server.uri()), fast_retry(3));
    let response = ask(&retry).await.unwrap();
    assert!(response.message.text.contains("San Francisco"));
    assert_eq!(server.received_requests().await.unwrap().len(), 3);
}

#[tokio::test]
async fn retries_stop_after_max_attempts_with_the_last_error() {
    let server = answering(error_json(
        500,
        "synthetic/oai_chat_err_500_server_error.json",
    ))
    .await;
    let retry = Retry::with_policy(model(&server.uri()), fast_retry(2));
    let err = ask(&retry).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Server);
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

#[tokio::test]
async fn bad_request_fails_at_once_without_retry() {
    let server = answering(error_json(400, "openai_chat/oai_chat_err_400.json")).await;
    let retry = Retry::with_policy(model(&server.uri()), fast_retry(5));
    let err = ask(&retry).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::InvalidRequest);
    assert_eq!(err.param.as_deref(), Some("web_search_options"));
    assert!(!err.is_retryable());
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn overloaded_primary_falls_back_to_the_next_model_after_its_retries() {
    let primary = answering(ResponseTemplate::new(529).set_body_raw(
        fixture("synthetic/anth_err_529_overloaded.json"),
        "application/json",
    ))
    .await;
    let backup = answering(text_sse()).await;
    let fallback = Fallback::new(vec![
        Box::new(Retry::with_policy(model(&primary.uri()), fast_retry(2))),
        Box::new(Retry::with_policy(
            OpenAiChat::builder("gpt-4o")
                .base_url(backup.uri())
                .api_key(API_KEY)
                .build()
                .unwrap(),
            fast_retry(2),
        )),
    ]);
    let response = ask(&fallback).await.unwrap();
    assert!(response.message.text.contains("San Francisco"));
    // The backup answered: the response names its model, so pricing follows it.
    assert_eq!(response.model.as_deref(), Some("gpt-4o-2024-08-06"));
    assert_eq!(primary.received_requests().await.unwrap().len(), 2);
    assert_eq!(backup.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_fallback_to_another_provider_is_priced_by_the_model_that_answered() {
    let primary = answering(error_json(
        500,
        "synthetic/oai_chat_err_500_server_error.json",
    ))
    .await;
    let backup = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_raw(fixture("anthropic/anth_s_text.sse"), "text/event-stream"),
        )
        .mount(&backup)
        .await;
    let fallback = || {
        Fallback::new(vec![
            Box::new(model(&primary.uri())),
            Box::new(
                agentloop_providers::anthropic::Anthropic::builder("claude-sonnet-4-5")
                    .base_url(backup.uri())
                    .api_key(API_KEY)
                    .build()
                    .unwrap(),
            ),
        ])
    };
    let response = ask(&fallback()).await.unwrap();
    assert!(!response.message.text.is_empty());
    assert_eq!(response.model.as_deref(), Some("claude-3-opus-latest"));

    // Usage means the same on every provider, so the answer is priced by the model that gave it,
    // whichever provider name the run reports.
    let agent = agentloop::Agent::builder()
        .model(fallback())
        .pricing(agentloop_providers::default_prices())
        .build()
        .unwrap();
    let out = agent.run("hello").await;
    assert_eq!(
        out.stop_reason,
        agentloop::StopReason::Finished,
        "{:?}",
        out.error
    );
    assert_eq!((out.usage.input_tokens, out.usage.output_tokens), (11, 6));
    // claude-3-opus: $15 in, $75 out per million.
    let expected = (11.0 * 15.0 + 6.0 * 75.0) / 1e6;
    assert!((out.cost_usd - expected).abs() < 1e-12, "{}", out.cost_usd);
}

#[tokio::test]
async fn fallback_does_not_move_on_for_a_bad_request() {
    let primary = answering(error_json(400, "openai_chat/oai_chat_err_400.json")).await;
    let backup = answering(text_sse()).await;
    let fallback = Fallback::new(vec![
        Box::new(model(&primary.uri())),
        Box::new(model(&backup.uri())),
    ]);
    assert_eq!(
        ask(&fallback).await.unwrap_err().kind,
        ModelErrorKind::InvalidRequest
    );
    assert!(backup.received_requests().await.unwrap().is_empty());
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

const FIRST_EVENT: &[u8] =
    b"data: {\"id\":\"c1\",\"model\":\"gpt-4.1-mini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n";

/// A server that answers each request with the stream head and one event, then does `then`;
/// the count says how many requests it read.
async fn one_event_server_counted(then: &'static str) -> (String, Arc<AtomicUsize>) {
    support::raw_http::serve_each(move |mut socket, _| async move {
        socket.write_all(SSE_HEAD).await.unwrap();
        socket.write_all(&http_chunk(FIRST_EVENT)).await.unwrap();
        socket.flush().await.unwrap();
        match then {
            "stall" => tokio::time::sleep(Duration::from_secs(30)).await,
            "drop" => drop(socket),
            "end" => {
                socket.write_all(b"0\r\n\r\n").await.unwrap();
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            _ => unreachable!(),
        }
    })
    .await
}

/// [`one_event_server_counted`], uncounted.
async fn one_event_server(then: &'static str) -> String {
    one_event_server_counted(then).await.0
}

#[tokio::test]
async fn a_stalled_stream_fails_with_a_timeout_after_the_idle_limit() {
    let uri = one_event_server("stall").await;
    let model = OpenAiChat::builder("gpt-4.1-mini")
        .base_url(uri)
        .api_key(API_KEY)
        .idle_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), ask(&model))
        .await
        .expect("the call hung")
        .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Timeout, "{err}");
    assert!(err.message.contains("idle"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_stall_after_content_is_retried_and_the_last_one_is_marked_partial() {
    let (uri, requests) = one_event_server_counted("stall").await;
    let model = OpenAiChat::builder("gpt-4.1-mini")
        .base_url(uri)
        .api_key(API_KEY)
        .idle_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let retry = Retry::with_policy(model, fast_retry(3));
    let err = tokio::time::timeout(Duration::from_secs(10), ask(&retry))
        .await
        .expect("the call hung")
        .unwrap_err();
    assert_eq!(
        requests.load(Ordering::SeqCst),
        3,
        "a stall part-way is retried like one before the first byte"
    );
    assert_eq!(err.kind, ModelErrorKind::Timeout);
    assert!(
        err.partial,
        "the last attempt's text had reached the caller and no retry took it back: the error \
         must say so"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_connection_dropped_mid_stream_is_a_clear_error() {
    let uri = one_event_server("drop").await;
    let err = tokio::time::timeout(Duration::from_secs(10), ask(&model(&uri)))
        .await
        .expect("the call hung")
        .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Connection, "{err}");
    assert!(err.message.contains("connection"), "{err}");
}

#[tokio::test]
async fn a_stream_that_ends_cleanly_without_finish_is_an_error_not_a_half_response() {
    let uri = one_event_server("end").await;
    let err = tokio::time::timeout(Duration::from_secs(10), ask(&model(&uri)))
        .await
        .expect("the call hung")
        .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Stream, "{err}");
}

#[tokio::test]
async fn a_fixture_delivered_in_tiny_pieces_parses_like_one_piece() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await;
        socket.write_all(SSE_HEAD).await.unwrap();
        let body = fixture("openai_compatible/compat_deepseek_s_tool.sse");
        for piece in body.chunks(7) {
            socket.write_all(&http_chunk(piece)).await.unwrap();
            socket.flush().await.unwrap();
        }
        socket.write_all(b"0\r\n\r\n").await.unwrap();
    });
    let response = ask(&model(&format!("http://{addr}"))).await.unwrap();
    let whole = agentloop_providers::openai_chat::parse_stream_bytes(&fixture(
        "openai_compatible/compat_deepseek_s_tool.sse",
    ))
    .unwrap();
    assert_eq!(response.message.tool_calls, whole.message.tool_calls);
    assert_eq!(response.message.reasoning, whole.message.reasoning);
    assert_eq!(response.usage, whole.usage);
    assert_eq!(response.usage.cached_input_tokens, 320);
    assert_eq!(response.usage.reasoning_tokens, 39);
}

#[tokio::test]
async fn an_oversized_request_fails_before_anything_is_sent() {
    let server = answering(text_sse()).await;
    let model = OpenAiChat::builder("gpt-4.1-mini")
        .base_url(server.uri())
        .api_key(API_KEY)
        .max_request_bytes(1024)
        .build()
        .unwrap();
    let messages = [Message::user("x".repeat(2000))];
    let settings = ModelSettings::default();
    let request = ModelRequest {
        instructions: None,
        messages: &messages,
        tools: &[],
        output_schema: None,
        settings: &settings,
    };
    let retry = Retry::with_policy(model, fast_retry(3));
    let err = complete(&retry, request).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::RequestTooLarge);
    assert!(
        server.received_requests().await.unwrap().is_empty(),
        "the server saw a request"
    );
}

#[tokio::test]
async fn the_api_key_never_appears_in_an_error() {
    // A server that echoes the key back in its message.
    let server = MockServer::start().await;
    let body = json!({"error": {"message": format!("Incorrect API key provided: {API_KEY}"), "type": "invalid_request_error", "code": "invalid_api_key"}});
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(401).set_body_json(body))
        .mount(&server)
        .await;
    let err = ask(&model(&server.uri())).await.unwrap_err();
    assert!(err.is_authentication());
    assert_eq!(err.provider_code.as_deref(), Some("invalid_api_key"));

    // A connection refused, a timeout, and a missing environment variable.
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        ask(&model(&format!("http://{addr}"))).await.unwrap_err()
    };
    assert_eq!(refused.kind, ModelErrorKind::Connection);
    let stalled = one_event_server("stall").await;
    let timed_out = ask(&OpenAiChat::builder("m")
        .base_url(stalled)
        .api_key(API_KEY)
        .idle_timeout(Duration::from_millis(100))
        .build()
        .unwrap())
    .await
    .unwrap_err();
    let missing_env = ask(&OpenAiChat::builder("m")
        .base_url(server.uri())
        .api_key_env("AGENTLOOP_TEST_UNSET_KEY_VAR")
        .build()
        .unwrap())
    .await
    .unwrap_err();
    assert!(missing_env.is_authentication());
    assert!(missing_env.message.contains("AGENTLOOP_TEST_UNSET_KEY_VAR"));

    let model_debug = format!("{:?}", model(&server.uri()));
    for shown in [
        format!("{err}"),
        format!("{err:?}"),
        format!("{refused} {refused:?}"),
        format!("{timed_out} {timed_out:?}"),
        model_debug,
    ] {
        assert!(!shown.contains(API_KEY), "the key leaked: {shown}");
        assert!(
            !shown.contains("abcdefghijklmnop"),
            "part of the key leaked: {shown}"
        );
    }
}

#[tokio::test]
async fn a_custom_headers_credential_never_appears_in_an_error() {
    // A gateway's own key in a header of its name, and a proxy's credentials: the server
    // quotes both back, with the header that carries none.
    const GATEWAY_KEY: &str = "pk-gateway-7421-qwertyuiop";
    const PROXY_TOKEN: &str = "proxy-token-9087-asdfghjkl";
    let server = MockServer::start().await;
    // It refuses with 401, quoting the headers, as a gateway's "bad credentials" answer may.
    let quoting = |request: &wiremock::Request| {
        let quoted = [
            "x-portkey-api-key",
            "proxy-authorization",
            "x-portkey-provider",
        ]
        .map(|h| {
            let value = request.headers.get(h).and_then(|v| v.to_str().ok());
            format!("{h}: {}", value.unwrap_or("(none)"))
        });
        let message = format!("refused: {}", quoted.join("; "));
        ResponseTemplate::new(401)
            .set_body_json(json!({"error": {"message": message, "type": "invalid_request_error"}}))
    };
    Mock::given(method("POST"))
        .respond_with(quoting)
        .mount(&server)
        .await;
    let model = OpenAiChat::compatible("gateway", server.uri(), "m")
        .header("x-portkey-api-key", GATEWAY_KEY)
        .header("Proxy-Authorization", format!("Bearer {PROXY_TOKEN}"))
        .header("x-portkey-provider", "openai")
        .build()
        .unwrap();
    let err = ask(&model).await.unwrap_err();
    assert!(err.is_authentication(), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("x-portkey-provider: openai"), "{shown}");
    assert!(shown.contains("x-portkey-api-key: [redacted]"), "{shown}");
    for secret in [GATEWAY_KEY, PROXY_TOKEN] {
        assert!(!shown.contains(secret), "{secret} leaked: {shown}");
    }
}

/// Gets the weather for a city.
#[agentloop::tool]
async fn get_weather(
    /// The city.
    city: String,
) -> String {
    format!("sunny in {city}")
}

/// A server whose first answer is `first` (a streamed tool call) and every later one a text answer.
async fn tool_turn_then_text(first: Vec<u8>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(first, "text/event-stream"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(text_sse())
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn an_agent_runs_a_streamed_tool_call_and_answers_with_the_result() {
    let server = tool_turn_then_text(fixture("openai_chat/oai_chat_s_single_tool_usage.sse")).await;
    let agent = agentloop::Agent::builder()
        .model(model(&server.uri()))
        .instructions("Use tools.")
        .tool(get_weather_tool())
        .pricing(agentloop_providers::default_prices())
        .build()
        .unwrap();
    let outcome = agent.run("Weather in Mexico City?").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.tool_calls_run, 1);
    assert!(outcome.output.unwrap().starts_with("I'm unable"));
    assert_eq!(outcome.usage.input_tokens, 423 + 14);
    assert!(
        outcome.cost_usd > 0.0,
        "gpt-4o responses are priced by the default table"
    );

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    let second: Value = serde_json::from_slice(&requests[1].body).unwrap();
    let msgs = second["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    assert_eq!(msgs[2]["content"], Value::Null);
    assert_eq!(
        msgs[2]["tool_calls"][0]["id"],
        "call_LwxJUB9KppVyogRRLQsamRJv"
    );
    assert_eq!(msgs[2]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(
        msgs[2]["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Mexico City\"}"
    );
    assert_eq!(msgs[3]["tool_call_id"], "call_LwxJUB9KppVyogRRLQsamRJv");
    assert_eq!(msgs[3]["content"], "sunny in Mexico City");
    assert_eq!(second["tools"][0]["function"]["name"], "get_weather");
}

#[tokio::test]
async fn a_text_tool_call_cut_by_the_output_limit_never_runs_and_the_limit_is_raised() {
    // A Hermes block cut between two keys of its arguments: closing its brackets would make a
    // whole-looking call of what the model had written so far.
    let cut = concat!(
        "data: {\"id\":\"c\",\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"content\":",
        "\"<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": {\\\"city\\\": \\\"Paris\\\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let server = tool_turn_then_text(cut.as_bytes().to_vec()).await;
    let model = OpenAiChat::compatible("local", server.uri(), "qwen")
        .tool_dialect(agentloop_providers::openai_chat::ToolDialect::Hermes)
        .build()
        .unwrap();
    let agent = agentloop::Agent::builder()
        .model(model)
        .tool(get_weather_tool())
        .settings(ModelSettings {
            max_tokens: Some(256),
            ..Default::default()
        })
        .build()
        .unwrap();
    let outcome = agent.run("Weather in Paris?").await;
    assert_eq!(outcome.tool_calls_run, 0, "{outcome:?}");
    assert!(!format!("{outcome:?}").contains("sunny in Paris"));
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    let second: Value = serde_json::from_slice(&requests[1].body).unwrap();
    // Cut as a native call is cut: asked again with the output limit raised.
    assert_eq!(second["max_tokens"], 512, "{second}");
}

#[tokio::test]
async fn a_hostile_token_count_saturates_and_trips_the_token_budget_without_a_panic() {
    // A compatible server that reports `"prompt_tokens": u64::MAX` on a tool-calling turn.
    let hostile = String::from_utf8(fixture("openai_chat/oai_chat_s_single_tool_usage.sse"))
        .unwrap()
        .replace(
            "\"prompt_tokens\":423",
            "\"prompt_tokens\":18446744073709551615",
        );
    assert!(hostile.contains("18446744073709551615"));
    let server = tool_turn_then_text(hostile.into_bytes()).await;
    let agent = agentloop::Agent::builder()
        .model(model(&server.uri()))
        .tool(get_weather_tool())
        .limits(agentloop::Limits {
            max_tokens: Some(1_000_000),
            ..Default::default()
        })
        .build()
        .unwrap();
    let outcome = agent.run("Weather in Mexico City?").await;
    assert_eq!(outcome.stop_reason, agentloop::StopReason::Budget);
    assert_eq!(outcome.usage.input_tokens, u64::MAX);
    assert_eq!(outcome.usage.total_tokens(), u64::MAX);
}

#[tokio::test]
async fn a_base_url_with_a_query_keeps_it_after_the_api_path() {
    // A gateway that wants a key or a version on every request (`?key=...`, `?api-version=...`).
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(wiremock::matchers::query_param("api-version", "2024-10-21"))
        .respond_with(text_sse())
        .expect(1)
        .mount(&server)
        .await;
    let model = model(&format!("{}/v1/?api-version=2024-10-21", server.uri()));
    let response = ask(&model).await.unwrap();
    assert!(!response.message.text.is_empty());
}

// ---- a local server's refusal of the model's tool call: retried only when the request samples ----

/// llama-server's refusal of its own parse of the model's tool call (recorded verbatim).
const LLAMA_PARSE_ERROR: &str = r#"{"error":{"code":500,"message":"The model produced output that does not match the expected peg-native format","type":"server_error"}}"#;

/// That refusal as llama-server sends it: an HTTP 500 to a whole-body request; a 200, the role
/// chunk, then the error as an event to a streamed one.
fn llama_parse_error(stream: bool) -> ResponseTemplate {
    if stream {
        let body = format!(
            "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":null}}}}],\"created\":1795962666,\"id\":\"chatcmpl-1\",\"model\":\"local\",\"object\":\"chat.completion.chunk\"}}\n\ndata: {LLAMA_PARSE_ERROR}\n\n"
        );
        ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
    } else {
        ResponseTemplate::new(500)
            .set_body_raw(LLAMA_PARSE_ERROR, "application/json; charset=utf-8")
    }
}

/// Groq's refusal of the model's tool call: an HTTP 400 (recorded) to a whole-body request; a
/// 200, the role chunk, then the error as an `error` event to a streamed one.
fn groq_tool_use_failed(stream: bool) -> ResponseTemplate {
    if stream {
        let body = concat!(
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"llama-3.3-70b-versatile\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
            "event: error\n",
            "data: {\"error\":{\"message\":\"Failed to call a function. Please adjust your prompt. See 'failed_generation' for more details.\",\"type\":\"invalid_request_error\",\"code\":\"tool_use_failed\",\"failed_generation\":\"<function=get_weather{\\\"city\\\": \\\"Paris\\\"}</function>\"}}\n\n",
        );
        ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
    } else {
        ResponseTemplate::new(400).set_body_raw(
            fixture("openai_compatible/compat_groq_err_400_tool_use_failed.json"),
            "application/json",
        )
    }
}

/// A server's refusal of a tool call, streamed or not.
type Refusal = fn(bool) -> ResponseTemplate;

/// How each server refuses a tool call, the kind of error its refusal is, and whether its
/// message names `tool_dialect` (a parse error does; Groq's may be a schema check, which no
/// dialect mends).
const REFUSALS: [(&str, Refusal, ModelErrorKind, bool); 2] = [
    (
        "llama-server",
        llama_parse_error,
        ModelErrorKind::Server,
        true,
    ),
    (
        "groq",
        groq_tool_use_failed,
        ModelErrorKind::InvalidRequest,
        false,
    ),
];

fn tool_call_answer(stream: bool) -> ResponseTemplate {
    if stream {
        ResponseTemplate::new(200).set_body_raw(
            fixture("openai_chat/oai_chat_s_single_tool.sse"),
            "text/event-stream",
        )
    } else {
        ResponseTemplate::new(200).set_body_raw(
            fixture("openai_chat/oai_chat_ns_single_tool.json"),
            "application/json",
        )
    }
}

/// A server that refuses the first request's tool call (as `refusal` makes it), then answers
/// with one.
async fn refuses_once_then_calls(
    stream: bool,
    refusal: fn(bool) -> ResponseTemplate,
) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(refusal(stream))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(tool_call_answer(stream))
        .mount(&server)
        .await;
    server
}

/// The events logged while it is installed on this thread, one line each: the message and its
/// fields. The `Retry` layer reports each retry there ("model call failed; retrying").
#[derive(Clone, Default)]
struct Logged(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Logged {
    fn retries(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("retrying"))
            .cloned()
            .collect()
    }
}

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl tracing::Subscriber for Logged {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Asks with `settings` through a retry layer of 3 attempts, the retries logged on this thread.
async fn ask_logged(
    server: &MockServer,
    stream: bool,
    settings: &ModelSettings,
) -> (Result<ModelResponse, ModelError>, Vec<String>) {
    let logged = Logged::default();
    let _installed = tracing::subscriber::set_default(logged.clone());
    let chat = OpenAiChat::builder("local")
        .base_url(server.uri())
        .no_api_key()
        .stream(stream)
        .build()
        .unwrap();
    let retry = Retry::with_policy(chat, fast_retry(3));
    let messages = [Message::user("What is the weather in Paris?")];
    let tools = [tool_spec("get_weather", json!({"type": "object"}))];
    let request = ModelRequest {
        instructions: None,
        messages: &messages,
        tools: &tools,
        output_schema: None,
        settings,
    };
    let result = complete(&retry, request).await;
    (result, logged.retries())
}

fn settings(temperature: Option<f64>, seed: Option<i64>) -> ModelSettings {
    ModelSettings {
        temperature,
        seed,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_refused_tool_call_of_a_sampled_request_is_drawn_again_and_the_retry_is_logged() {
    // No seed, and a temperature above 0 or none (llama-server's default is 0.8): each
    // attempt is a new draw.
    for ((server_name, refusal, kind, _), stream) in
        REFUSALS.into_iter().flat_map(|r| [(r, true), (r, false)])
    {
        for (temperature, seed) in [(Some(0.7), None), (None, None)] {
            let case = format!(
                "{server_name}, stream {stream}, temperature {temperature:?}, seed {seed:?}"
            );
            let server = refuses_once_then_calls(stream, refusal).await;
            let (result, retries) = ask_logged(&server, stream, &settings(temperature, seed)).await;
            let response = result.unwrap_or_else(|e| panic!("{case}: {e:?}"));
            assert_eq!(response.message.tool_calls.len(), 1, "{case}");
            let requests = server.received_requests().await.unwrap();
            assert_eq!(requests.len(), 2, "{case}");
            let sent: Value = serde_json::from_slice(&requests[0].body).unwrap();
            assert_eq!(sent.get("seed"), None, "{case}");
            assert_eq!(sent.get("temperature").and_then(Value::as_f64), temperature);
            assert_eq!(retries.len(), 1, "{case}: {retries:?}");
            let code = format!("code=\"{}\"", agentloop::ModelError::new(kind, "").code());
            assert!(
                retries[0].contains("attempt=1 ") && retries[0].contains(&code),
                "{case}: {retries:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_refused_tool_call_of_a_greedy_or_seeded_request_fails_at_once_naming_the_way_out() {
    // At temperature 0, or with a seed, a retry gets the same output and the same refusal.
    for ((server_name, refusal, kind, hint), stream) in
        REFUSALS.into_iter().flat_map(|r| [(r, true), (r, false)])
    {
        for (temperature, seed) in [
            (Some(0.0), Some(42)),
            (Some(0.0), None),
            (Some(0.7), Some(42)),
        ] {
            let case = format!(
                "{server_name}, stream {stream}, temperature {temperature:?}, seed {seed:?}"
            );
            let server = refuses_once_then_calls(stream, refusal).await;
            let (result, retries) = ask_logged(&server, stream, &settings(temperature, seed)).await;
            let err = result.err().unwrap_or_else(|| panic!("{case}: answered"));
            assert_eq!(err.kind, kind, "{case}");
            assert!(!err.is_retryable(), "{case}");
            assert_eq!(
                err.message.contains("tool_dialect = \"auto\""),
                hint,
                "{case}: {}",
                err.message
            );
            assert_eq!(server.received_requests().await.unwrap().len(), 1, "{case}");
            assert!(retries.is_empty(), "{case}: {retries:?}");
        }
    }
}
