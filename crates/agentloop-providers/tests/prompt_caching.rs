//! Prompt caching, checked on the request bodies that reach a loopback server: Anthropic's
//! `cache_control` breakpoints (instructions, tools, latest turn; off with one switch) and the
//! cache reads and writes its usage reports, counted and priced; OpenAI's `prompt_cache_key` and
//! the fixed order that keeps the Chat Completions prefix stable.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use agentloop::message::{AssistantMessage, ToolCall, ToolContent, ToolResult};
use agentloop::model::{ModelRequest, ModelSettings, complete};
use agentloop::tool::ToolSpec;
use agentloop::{Message, Model};
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::openai_chat::{OpenAiCompat, PromptCacheKey};
use agentloop_providers::{OpenAiChat, default_prices};
use serde_json::{Value, json};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

const ANTHROPIC_REPLY: &str = r#"{"id":"msg_c1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Sunny."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":1800,"cache_read_input_tokens":9000,"output_tokens":5}}"#;

const CHAT_REPLY: &str = r#"{"id":"chatcmpl-c1","object":"chat.completion","created":1,"model":"gpt-4.1","choices":[{"index":0,"message":{"role":"assistant","content":"Sunny."},"finish_reason":"stop"}],"usage":{"prompt_tokens":2000,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":1920}}}"#;

async fn server(reply: &str) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(reply.to_owned(), "application/json"))
        .mount(&server)
        .await;
    server
}

async fn bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

fn tools() -> Vec<ToolSpec> {
    ["get_weather", "get_time"]
        .iter()
        .map(|name| {
            serde_json::from_value(
                json!({"name": name, "description": "d", "input_schema": {"type": "object"}}),
            )
            .unwrap()
        })
        .collect()
}

/// A conversation: a question, a call, its result.
fn transcript() -> Vec<Message> {
    vec![
        Message::user("Weather in Paris?"),
        Message::Assistant(AssistantMessage {
            reasoning: Vec::new(),
            text: "Let me look.".into(),
            tool_calls: vec![ToolCall {
                call_id: "toolu_1".into(),
                tool: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into(),
            }],
        }),
        Message::Tool(ToolResult {
            call_id: "toolu_1".into(),
            tool: "get_weather".into(),
            content: ToolContent::Text("22 C".into()),
            is_error: false,
        }),
    ]
}

async fn ask(
    model: &dyn Model,
    instructions: &str,
    messages: &[Message],
) -> agentloop::ModelResponse {
    let settings = ModelSettings::default();
    let tools = tools();
    complete(
        model,
        ModelRequest {
            instructions: Some(instructions),
            messages,
            tools: &tools,
            output_schema: None,
            settings: &settings,
        },
    )
    .await
    .unwrap()
}

/// Claude over loopback, whole answers, caching as it comes by default.
fn anthropic(server: &MockServer) -> Anthropic {
    Anthropic::builder("claude-sonnet-4-5")
        .base_url(server.uri())
        .no_api_key()
        .stream(false)
        .build()
        .unwrap()
}

fn breakpoints(body: &Value) -> usize {
    body.to_string().matches("\"cache_control\"").count()
}

#[tokio::test]
async fn anthropic_marks_the_instructions_the_tools_and_the_latest_turn_by_default() {
    let server = server(ANTHROPIC_REPLY).await;
    let model = anthropic(&server);
    let messages = transcript();
    ask(&model, "You answer weather questions.", &messages).await;
    let body = &bodies(&server).await[0];
    let ephemeral = json!({"type": "ephemeral"});
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "You answer weather questions.", "cache_control": ephemeral}])
    );
    assert!(body["tools"][0].get("cache_control").is_none());
    assert_eq!(
        body["tools"][1]["cache_control"], ephemeral,
        "the last tool"
    );
    let wire = body["messages"].as_array().unwrap();
    assert_eq!(wire.len(), 3);
    let last = wire[2]["content"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["type"], "tool_result");
    assert_eq!(last["cache_control"], ephemeral, "the latest turn");
    assert_eq!(breakpoints(body), 3, "no other breakpoint: {body}");
}

#[tokio::test]
async fn the_latest_turn_breakpoint_moves_with_the_conversation() {
    let server = server(ANTHROPIC_REPLY).await;
    let model = anthropic(&server);
    let mut messages = transcript();
    ask(&model, "i", &messages[..1]).await;
    messages.push(Message::Assistant(AssistantMessage {
        reasoning: Vec::new(),
        text: "Sunny.".into(),
        tool_calls: Vec::new(),
    }));
    messages.push(Message::user("And tomorrow?"));
    ask(&model, "i", &messages).await;
    let sent = bodies(&server).await;
    assert_eq!(
        sent[0]["messages"][0]["content"][0]["cache_control"]["type"],
        "ephemeral"
    );
    let second = sent[1]["messages"].as_array().unwrap();
    assert!(second[0]["content"][0].get("cache_control").is_none());
    assert_eq!(
        second.last().unwrap()["content"][0]["text"],
        "And tomorrow?"
    );
    assert_eq!(
        second.last().unwrap()["content"][0]["cache_control"]["type"],
        "ephemeral"
    );
    assert_eq!(breakpoints(&sent[1]), 3);
}

#[tokio::test]
async fn one_switch_turns_anthropic_caching_off() {
    let server = server(ANTHROPIC_REPLY).await;
    let model = Anthropic::builder("claude-sonnet-4-5")
        .base_url(server.uri())
        .no_api_key()
        .stream(false)
        .prompt_caching(false)
        .build()
        .unwrap();
    ask(&model, "You answer weather questions.", &transcript()).await;
    let body = &bodies(&server).await[0];
    assert_eq!(body["system"], "You answer weather questions.");
    assert_eq!(breakpoints(body), 0, "{body}");
}

#[tokio::test]
async fn anthropic_cache_reads_and_writes_are_counted_and_priced() {
    let server = server(ANTHROPIC_REPLY).await;
    let model = anthropic(&server);
    let response = ask(&model, "i", &transcript()).await;
    let u = response.usage;
    assert_eq!(
        u.input_tokens,
        12 + 1800 + 9000,
        "input counts cache reads and writes"
    );
    assert_eq!(u.cached_input_tokens, 9000);
    assert_eq!(u.cache_write_tokens, 1800);
    assert_eq!(u.output_tokens, 5);
    let price = *default_prices().get("claude-sonnet-4-5-20250929").unwrap();
    // USD per million: 12 input at 3, 9000 reads at 0.30, 1800 writes at 3.75, 5 output at 15.
    let expected = (12.0 * 3.0 + 9000.0 * 0.30 + 1800.0 * 3.75 + 5.0 * 15.0) / 1e6;
    assert!(
        (price.cost(&u) - expected).abs() < 1e-12,
        "{} != {expected}",
        price.cost(&u)
    );
}

#[tokio::test]
async fn openai_gets_a_stable_prompt_cache_key_and_the_same_prefix_every_turn() {
    let server = server(CHAT_REPLY).await;
    let model = OpenAiChat::builder("gpt-4.1")
        .base_url(server.uri())
        .no_api_key()
        .stream(false)
        .prompt_cache_key(PromptCacheKey::Derived)
        .build()
        .unwrap();
    let messages = transcript();
    let first = ask(&model, "You answer weather questions.", &messages[..1]).await;
    assert_eq!(first.usage.cached_input_tokens, 1920);
    ask(&model, "You answer weather questions.", &messages).await;
    ask(&model, "Other instructions.", &messages).await;
    let raw: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| String::from_utf8(r.body.clone()).unwrap())
        .collect();
    let sent: Vec<Value> = raw
        .iter()
        .map(|b| serde_json::from_str(b).unwrap())
        .collect();
    let key = sent[0]["prompt_cache_key"].as_str().unwrap();
    assert!(key.starts_with("agentloop-"), "{key}");
    assert_eq!(sent[1]["prompt_cache_key"], key, "one agent, one key");
    assert_ne!(
        sent[2]["prompt_cache_key"], key,
        "other instructions, another key"
    );
    // The unchanging part comes first, byte for byte: the model, the tools, the instructions.
    let prefix = |body: &str| body[..body.find("\"role\":\"user\"").unwrap()].to_owned();
    assert_eq!(prefix(&raw[0]), prefix(&raw[1]));
    assert!(raw[0].find("\"tools\"").unwrap() < raw[0].find("\"messages\"").unwrap());
}

#[tokio::test]
async fn compatible_servers_get_no_prompt_cache_key_unless_asked() {
    let server = server(CHAT_REPLY).await;
    let local = OpenAiChat::compatible("local", server.uri(), "qwen3")
        .stream(false)
        .build()
        .unwrap();
    ask(&local, "i", &transcript()[..1]).await;
    let fixed = OpenAiChat::compatible("local", server.uri(), "qwen3")
        .stream(false)
        .prompt_cache_key(PromptCacheKey::Fixed("tenant-7".into()))
        .build()
        .unwrap();
    ask(&fixed, "i", &transcript()[..1]).await;
    let sent = bodies(&server).await;
    assert!(sent[0].get("prompt_cache_key").is_none());
    assert_eq!(sent[1]["prompt_cache_key"], "tenant-7");
}

#[test]
fn the_options_are_picked_from_the_model_and_the_host() {
    let openai = OpenAiCompat::for_model("openai", "https://api.openai.com/v1", "gpt-4.1");
    assert_eq!(openai.prompt_cache_key, PromptCacheKey::Derived);
    assert!(!openai.reasoning_content);
    let deepseek = OpenAiCompat::for_model("deepseek", "https://api.deepseek.com", "deepseek-chat");
    assert!(deepseek.reasoning_content);
    assert_eq!(deepseek.prompt_cache_key, PromptCacheKey::Off);
    let routed = OpenAiCompat::for_model(
        "openrouter",
        "https://openrouter.ai/api/v1",
        "deepseek/deepseek-r1",
    );
    assert!(
        routed.reasoning_content,
        "a DeepSeek model behind a gateway"
    );
    let local = OpenAiCompat::for_model("local", "http://127.0.0.1:8080/v1", "qwen3");
    assert!(!local.reasoning_content);
    assert!(local.tool_call_extra);
}

/// A conversation whose latest turn made `calls` parallel calls, each answered.
fn parallel_turn(calls: usize) -> Vec<Message> {
    let mut messages = transcript();
    let ids: Vec<String> = (0..calls).map(|i| format!("toolu_p{i}")).collect();
    messages.push(Message::Assistant(AssistantMessage {
        reasoning: Vec::new(),
        text: "Checking them all.".into(),
        tool_calls: ids
            .iter()
            .map(|id| ToolCall {
                call_id: id.as_str().into(),
                tool: "get_weather".into(),
                arguments: r#"{"city":"Lyon"}"#.into(),
            })
            .collect(),
    }));
    for id in &ids {
        messages.push(Message::Tool(ToolResult {
            call_id: id.as_str().into(),
            tool: "get_weather".into(),
            content: ToolContent::Text("18 C".into()),
            is_error: false,
        }));
    }
    messages
}

#[tokio::test]
async fn a_turn_past_the_cache_lookback_also_marks_where_the_previous_request_ended() {
    let server = server(ANTHROPIC_REPLY).await;
    let model = anthropic(&server);
    // The previous request ended with the first result; ten parallel calls add 21 blocks after it.
    ask(&model, "i", &parallel_turn(10)).await;
    ask(&model, "i", &parallel_turn(2)).await;
    let sent = bodies(&server).await;
    let previous_end = |body: &Value| {
        body["messages"][2]["content"][0]
            .get("cache_control")
            .cloned()
    };
    assert_eq!(
        previous_end(&sent[0]),
        Some(json!({"type": "ephemeral"})),
        "the breakpoint the previous request wrote is bridged to"
    );
    assert_eq!(
        breakpoints(&sent[0]),
        4,
        "Anthropic allows four: {}",
        sent[0]
    );
    // A short turn is within reach of the previous breakpoint: no bridge.
    assert_eq!(previous_end(&sent[1]), None);
    assert_eq!(breakpoints(&sent[1]), 3);
}
