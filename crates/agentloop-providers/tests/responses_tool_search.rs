//! OpenAI Responses' hosted tool search over real loopback HTTP: an agent whose tools are partly
//! deferred sends them all every turn, the deferred ones with `defer_loading`, and the
//! `tool_search` tool; an answer holding a `tool_search_call` and its `tool_search_output`, then
//! a call of the tool loaded, is read (streamed and whole) and the next request sends both items
//! back before the call, the tool list unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use agentloop::{Agent, StopReason};
use agentloop_providers::openai_responses::OpenAiResponses;
use serde_json::{Value, json};
use support::{city_schema, request_bodies, search_tools, serve_in_order};

fn model(uri: String, stream: bool) -> OpenAiResponses {
    OpenAiResponses::builder("gpt-5.4")
        .base_url(uri)
        .api_key("sk-test-key")
        .stream(stream)
        .encrypted_reasoning(false)
        .build()
        .unwrap()
}

fn search_call() -> Value {
    json!({"type": "tool_search_call", "id": "tsc_1", "execution": "server", "status": "completed", "arguments": {"query": "weather in a city"}})
}

fn search_output() -> Value {
    json!({"type": "tool_search_output", "id": "tso_1", "execution": "server", "status": "completed", "tools": [
        {"type": "function", "name": "get_weather", "description": "The get_weather tool.", "parameters": city_schema(), "strict": false, "defer_loading": true}
    ]})
}

fn function_call() -> Value {
    json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed"})
}

fn sse(events: &[Value]) -> Vec<u8> {
    support::sse_of(events)
}

fn completed(id: &str) -> Value {
    json!({"type": "response.completed", "response": {"id": id, "model": "gpt-5.4", "status": "completed", "usage": {"input_tokens": 50, "output_tokens": 10, "total_tokens": 60}}})
}

fn searched_stream() -> Vec<u8> {
    let mut call_added = search_call();
    call_added["status"] = json!("in_progress");
    call_added["arguments"] = json!({});
    let mut fc_added = function_call();
    fc_added["arguments"] = json!("");
    sse(&[
        json!({"type": "response.created", "response": {"id": "resp_1", "model": "gpt-5.4", "status": "in_progress"}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": call_added}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": search_call()}),
        json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "tool_search_output", "id": "tso_1", "execution": "server", "status": "in_progress", "tools": []}}),
        json!({"type": "response.output_item.done", "output_index": 1, "item": search_output()}),
        json!({"type": "response.output_item.added", "output_index": 2, "item": fc_added}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "{\"city\":\"Paris\"}"}),
        json!({"type": "response.output_item.done", "output_index": 2, "item": function_call()}),
        completed("resp_1"),
    ])
}

fn searched_whole() -> Vec<u8> {
    json!({"id": "resp_1", "object": "response", "model": "gpt-5.4", "status": "completed",
        "output": [search_call(), search_output(), function_call()],
        "usage": {"input_tokens": 50, "output_tokens": 10, "total_tokens": 60}})
    .to_string()
    .into_bytes()
}

fn answer() -> Value {
    json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "Sunny in Paris.", "annotations": []}]})
}

fn final_stream() -> Vec<u8> {
    sse(&[
        json!({"type": "response.created", "response": {"id": "resp_2", "model": "gpt-5.4", "status": "in_progress"}}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": answer()}),
        completed("resp_2"),
    ])
}

fn final_whole() -> Vec<u8> {
    json!({"id": "resp_2", "object": "response", "model": "gpt-5.4", "status": "completed", "output": [answer()],
        "usage": {"input_tokens": 50, "output_tokens": 10, "total_tokens": 60}})
    .to_string()
    .into_bytes()
}

async fn check_round_trip(stream: bool) {
    let (first, second, kind) = if stream {
        (searched_stream(), final_stream(), "text/event-stream")
    } else {
        (searched_whole(), final_whole(), "application/json")
    };
    let server = serve_in_order("/responses", vec![(first, kind), (second, kind)]).await;
    let agent = Agent::builder()
        .model(model(server.uri(), stream))
        .tools(search_tools())
        .build()
        .unwrap();
    let outcome = agent.run("What is the weather in Paris?").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.stop_reason, StopReason::Finished);
    assert_eq!(outcome.output.as_deref(), Some("Sunny in Paris."));
    let calls: Vec<&str> = outcome.tool_calls.iter().map(|c| &*c.tool).collect();
    assert_eq!(calls, ["get_weather"]);

    let bodies = request_bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        bodies[0]["tools"],
        json!([
            {"type": "function", "name": "get_weather", "description": "The get_weather tool.", "parameters": city_schema(), "strict": false, "defer_loading": true},
            {"type": "function", "name": "echo", "description": "The echo tool.", "parameters": {"type": "object", "properties": {}}, "strict": false},
            {"type": "function", "name": "get_time", "description": "The get_time tool.", "parameters": city_schema(), "strict": false, "defer_loading": true},
            {"type": "tool_search"},
        ]),
        "{}",
        bodies[0]
    );
    assert_eq!(
        bodies[1]["tools"], bodies[0]["tools"],
        "the same every turn"
    );
    assert_eq!(
        bodies[1]["input"],
        json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
            search_call(),
            search_output(),
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny in Paris"},
        ]),
        "{}",
        bodies[1]
    );
}

#[tokio::test]
async fn a_streamed_hosted_search_goes_back_with_the_next_request() {
    check_round_trip(true).await;
}

#[tokio::test]
async fn a_whole_hosted_search_goes_back_with_the_next_request() {
    check_round_trip(false).await;
}
