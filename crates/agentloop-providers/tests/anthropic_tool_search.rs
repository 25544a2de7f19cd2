//! Anthropic's server-side tool search over real loopback HTTP: an agent whose tools are partly
//! deferred sends them all every turn, the deferred ones with `defer_loading`, beside the
//! search tool and with its beta header; an answer holding a server tool search, then a call to
//! the tool it found, is read (streamed and whole) and the next request sends the search's
//! blocks back unchanged, the tool list byte for byte the same.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use agentloop::{Agent, StopReason};
use agentloop_providers::anthropic::{Anthropic, TOOL_SEARCH_BETA, ToolSearchVariant};
use serde_json::{Value, json};
use support::{city_schema, json_tool, request_bodies, search_tools, serve_in_order};

fn model(uri: String, stream: bool, caching: bool) -> Anthropic {
    Anthropic::builder("claude-test")
        .base_url(uri)
        .api_key("sk-ant-test-key")
        .stream(stream)
        .prompt_caching(caching)
        .build()
        .unwrap()
}

const SEARCH_USE: &str = r#"{"type":"server_tool_use","id":"srvtoolu_01","name":"tool_search_tool_bm25","input":{"query":"weather in a city"}}"#;
const SEARCH_RESULT: &str = r#"{"type":"tool_search_tool_result","tool_use_id":"srvtoolu_01","content":{"type":"tool_search_tool_search_result","tool_references":[{"type":"tool_reference","tool_name":"get_weather"}]}}"#;

/// The first answer, streamed: a line of text, the server's search (its input streamed in two
/// pieces), its result, then the call of the tool found.
fn searched_stream() -> Vec<u8> {
    let events = [
        r#"{"type":"message_start","message":{"id":"msg_1","model":"claude-test","usage":{"input_tokens":120,"output_tokens":1}}}"#.to_owned(),
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned(),
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me find a tool."}}"#.to_owned(),
        r#"{"type":"content_block_stop","index":0}"#.to_owned(),
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"server_tool_use","id":"srvtoolu_01","name":"tool_search_tool_bm25","input":{}}}"#.to_owned(),
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"weather"}}"#.to_owned(),
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" in a city\"}"}}"#.to_owned(),
        r#"{"type":"content_block_stop","index":1}"#.to_owned(),
        format!(r#"{{"type":"content_block_start","index":2,"content_block":{SEARCH_RESULT}}}"#),
        r#"{"type":"content_block_stop","index":2}"#.to_owned(),
        r#"{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{}}}"#.to_owned(),
        r#"{"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Paris\"}"}}"#.to_owned(),
        r#"{"type":"content_block_stop","index":3}"#.to_owned(),
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":40}}"#.to_owned(),
        r#"{"type":"message_stop"}"#.to_owned(),
    ];
    sse(&events)
}

fn sse(events: &[String]) -> Vec<u8> {
    let mut out = String::new();
    for e in events {
        let kind: Value = serde_json::from_str(e).unwrap();
        out.push_str(&format!(
            "event: {}\ndata: {e}\n\n",
            kind["type"].as_str().unwrap()
        ));
    }
    out.into_bytes()
}

/// The same answer as one JSON body.
fn searched_whole() -> Vec<u8> {
    format!(
        r#"{{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{{"type":"text","text":"Let me find a tool."}},{SEARCH_USE},{SEARCH_RESULT},{{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{{"city":"Paris"}}}}],"stop_reason":"tool_use","usage":{{"input_tokens":120,"output_tokens":40}}}}"#
    )
    .into_bytes()
}

fn final_stream() -> Vec<u8> {
    sse(&[
        r#"{"type":"message_start","message":{"id":"msg_2","model":"claude-test","usage":{"input_tokens":200,"output_tokens":1}}}"#.to_owned(),
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned(),
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Sunny in Paris."}}"#.to_owned(),
        r#"{"type":"content_block_stop","index":0}"#.to_owned(),
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#.to_owned(),
        r#"{"type":"message_stop"}"#.to_owned(),
    ])
}

fn final_whole() -> Vec<u8> {
    br#"{"id":"msg_2","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"Sunny in Paris."}],"stop_reason":"end_turn","usage":{"input_tokens":200,"output_tokens":5}}"#.to_vec()
}

async fn run_search(stream: bool) -> (Vec<Value>, Vec<Option<String>>) {
    let (first, second, kind) = if stream {
        (searched_stream(), final_stream(), "text/event-stream")
    } else {
        (searched_whole(), final_whole(), "application/json")
    };
    let server = serve_in_order("/v1/messages", vec![(first, kind), (second, kind)]).await;
    let agent = Agent::builder()
        .model(model(server.uri(), stream, false))
        .tools(search_tools())
        .build()
        .unwrap();
    let outcome = agent.run("What is the weather in Paris?").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.stop_reason, StopReason::Finished);
    assert_eq!(outcome.output.as_deref(), Some("Sunny in Paris."));
    let calls: Vec<&str> = outcome.tool_calls.iter().map(|c| &*c.tool).collect();
    assert_eq!(
        calls,
        ["get_weather"],
        "the server's search is no call of ours"
    );
    let betas = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            r.headers
                .get("anthropic-beta")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    (request_bodies(&server).await, betas)
}

fn expected_tools() -> Value {
    json!([
        {"name": "echo", "description": "The echo tool.", "input_schema": {"type": "object", "properties": {}}},
        {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"},
        {"name": "get_weather", "description": "The get_weather tool.", "input_schema": city_schema(), "defer_loading": true},
        {"name": "get_time", "description": "The get_time tool.", "input_schema": city_schema(), "defer_loading": true},
    ])
}

async fn check_round_trip(stream: bool) {
    let (bodies, betas) = run_search(stream).await;
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        betas,
        [
            Some(TOOL_SEARCH_BETA.to_owned()),
            Some(TOOL_SEARCH_BETA.to_owned())
        ]
    );
    assert_eq!(bodies[0]["tools"], expected_tools(), "{}", bodies[0]);
    assert_eq!(
        bodies[1]["tools"], bodies[0]["tools"],
        "the tools are the same every turn: the cached prefix holds"
    );
    let search_use: Value = serde_json::from_str(SEARCH_USE).unwrap();
    let search_result: Value = serde_json::from_str(SEARCH_RESULT).unwrap();
    assert_eq!(
        bodies[1]["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]},
            {"role": "assistant", "content": [
                search_use,
                search_result,
                {"type": "text", "text": "Let me find a tool."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny in Paris"},
            ]},
        ]),
        "{}",
        bodies[1]
    );
}

#[tokio::test]
async fn a_streamed_server_search_goes_back_with_the_next_request() {
    check_round_trip(true).await;
}

#[tokio::test]
async fn a_whole_server_search_goes_back_with_the_next_request() {
    check_round_trip(false).await;
}

#[tokio::test]
async fn the_cache_breakpoint_is_on_the_last_tool_the_model_sees_and_regex_can_be_chosen() {
    let server = serve_in_order("/v1/messages", vec![(final_whole(), "application/json")]).await;
    let model = Anthropic::builder("claude-test")
        .base_url(server.uri())
        .api_key("sk-ant-test-key")
        .stream(false)
        .tool_search(ToolSearchVariant::Regex)
        .header("anthropic-beta", "other-beta-2025-01-01")
        .build()
        .unwrap();
    let agent = Agent::builder()
        .model(model)
        .tools(search_tools())
        .build()
        .unwrap();
    let outcome = agent.run("hi").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(
        requests[0].headers.get("anthropic-beta").unwrap(),
        &format!("other-beta-2025-01-01,{TOOL_SEARCH_BETA}"),
        "a beta of the user's own is kept"
    );
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    let tools = body["tools"].as_array().unwrap();
    assert_eq!(
        tools[1],
        json!({"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex", "cache_control": {"type": "ephemeral"}})
    );
    let marked: Vec<usize> = (0..tools.len())
        .filter(|&i| !tools[i]["cache_control"].is_null())
        .collect();
    assert_eq!(marked, [1], "deferred tools are not in the cached prefix");
}

#[tokio::test]
async fn without_a_deferred_tool_there_is_no_search_and_no_beta() {
    let server = serve_in_order("/v1/messages", vec![(final_whole(), "application/json")]).await;
    let agent = Agent::builder()
        .model(model(server.uri(), false, false))
        .tool(json_tool("get_weather", city_schema(), |_| {
            Ok(String::new())
        }))
        .build()
        .unwrap();
    let outcome = agent.run("hi").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    let requests = server.received_requests().await.unwrap();
    assert!(requests[0].headers.get("anthropic-beta").is_none());
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(
        body["tools"],
        json!([{"name": "get_weather", "description": "The get_weather tool.", "input_schema": city_schema()}])
    );
}
