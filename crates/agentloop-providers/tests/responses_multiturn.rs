//! Multi-turn runs of a real agent against the OpenAI Responses adapter over loopback HTTP: the
//! request sent after the tool results is checked field by field against the Responses protocol.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentloop::{Agent, StopReason};
use agentloop_providers::openai_responses::OpenAiResponses;
use serde_json::{Value, json};
use support::{fixture, json_tool, request_bodies, serve_in_order};

fn model(name: &str, uri: String, stream: bool) -> OpenAiResponses {
    OpenAiResponses::builder(name)
        .base_url(uri)
        .api_key("sk-test-key")
        .stream(stream)
        .build()
        .unwrap()
}

/// The reasoning item of the recorded stream, as its `response.output_item.done` event carries it.
fn recorded_reasoning_item(sse: &[u8]) -> Value {
    let text = std::str::from_utf8(sse).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find(|e| e["type"] == "response.output_item.done" && e["item"]["type"] == "reasoning")
        .map(|e| e["item"].clone())
        .unwrap()
}

#[tokio::test]
async fn reasoning_item_and_function_call_output_go_back_by_call_id_without_storage() {
    let first_reply = fixture("openai_responses/resp_s_reasoning_then_call.sse");
    let reasoning = recorded_reasoning_item(&first_reply);
    let server = serve_in_order(
        "/responses",
        vec![
            (first_reply, "text/event-stream"),
            (
                fixture("openai_responses/resp_s_text.sse"),
                "text/event-stream",
            ),
        ],
    )
    .await;
    let schema = json!({"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]});
    let agent = Agent::builder()
        .model(model("gpt-5-test", server.uri(), true))
        .instructions("Answer with the tool.")
        .tool(json_tool("final_result", schema.clone(), |a| {
            Ok(format!("noted {}", a["result"]))
        }))
        .build()
        .unwrap();
    let outcome = agent.run("What is 6666?").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.stop_reason, StopReason::Finished);
    assert_eq!(
        outcome.output.as_deref(),
        Some("The capital of France is Paris.")
    );
    assert_eq!(
        (outcome.usage.input_tokens, outcome.usage.output_tokens),
        (53 + 278, 469 + 9)
    );

    let requests = server.received_requests().await.unwrap();
    for r in &requests {
        assert_eq!(r.url.path(), "/responses");
        assert_eq!(
            r.headers.get("authorization").unwrap(),
            "Bearer sk-test-key"
        );
    }
    let bodies = request_bodies(&server).await;
    let first = &bodies[0];
    assert_eq!(first["model"], "gpt-5-test");
    assert_eq!(first["store"], false);
    assert_eq!(first["stream"], true);
    assert_eq!(first["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(first["instructions"], "Answer with the tool.");
    assert_eq!(
        first["tools"],
        json!([{"type": "function", "name": "final_result", "description": "The final_result tool.", "parameters": schema, "strict": false}])
    );
    assert_eq!(
        first["input"],
        json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is 6666?"}]}])
    );

    let second = &bodies[1];
    assert_eq!(second["store"], false);
    let input = second["input"].as_array().unwrap();
    assert_eq!(
        input.len(),
        4,
        "user, reasoning, function_call, function_call_output: {input:#?}"
    );
    assert_eq!(input[0]["role"], "user");
    // The reasoning item goes back whole: same id, same encrypted content, its summary.
    assert_eq!(input[1]["type"], "reasoning");
    assert_eq!(input[1]["id"], reasoning["id"]);
    assert_eq!(
        input[1]["encrypted_content"],
        reasoning["encrypted_content"]
    );
    assert_eq!(input[1]["summary"], reasoning["summary"]);
    assert_eq!(
        input[2],
        json!({"type": "function_call", "call_id": "call_CWXgs68YprAjp6t0371hiPOI", "name": "final_result", "arguments": "{\"result\":6666}"})
    );
    assert_eq!(
        input[3],
        json!({"type": "function_call_output", "call_id": "call_CWXgs68YprAjp6t0371hiPOI", "output": "noted 6666"})
    );
}

#[tokio::test]
async fn parallel_calls_each_get_their_output_by_call_id() {
    let server = serve_in_order(
        "/responses",
        vec![
            (
                fixture("openai_responses/resp_ns_parallel2.json"),
                "application/json",
            ),
            (
                fixture("openai_responses/resp_ns_final_text.json"),
                "application/json",
            ),
        ],
    )
    .await;
    let schema = json!({"type": "object", "properties": {"loc_name": {"type": "string"}}, "required": ["loc_name"]});
    let agent = Agent::builder()
        .model(model("gpt-4.1-test", server.uri(), false))
        .tool(json_tool("get_location", schema, |a| {
            match a["loc_name"].as_str() {
                Some("London") => Ok("51.5, -0.1".to_owned()),
                _ => Err("unknown place".to_owned()),
            }
        }))
        .build()
        .unwrap();
    let outcome = agent.run("Where is London?").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(
        outcome.output.as_deref(),
        Some("The capital of PotatoLand is Potato City.")
    );

    let bodies = request_bodies(&server).await;
    assert_eq!(bodies[0].get("stream"), None);
    assert_eq!(
        bodies[0].get("include"),
        None,
        "a model without reasoning is not asked for encrypted reasoning"
    );
    let input = bodies[1]["input"].as_array().unwrap();
    let kinds: Vec<&str> = input.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message",
            "function_call",
            "function_call",
            "function_call_output",
            "function_call_output"
        ]
    );
    assert_eq!(input[1]["call_id"], "call_LWVp74L5HaH2KNvgVz9PJsrj");
    assert_eq!(input[2]["call_id"], "call_YnRAWeTyxI91m5uNa5bxXwVO");
    assert_eq!(input[3]["call_id"], "call_LWVp74L5HaH2KNvgVz9PJsrj");
    assert!(
        input[3]["output"]
            .as_str()
            .unwrap()
            .contains("unknown place")
    );
    assert_eq!(
        input[4],
        json!({"type": "function_call_output", "call_id": "call_YnRAWeTyxI91m5uNa5bxXwVO", "output": "51.5, -0.1"})
    );
}

#[tokio::test]
async fn assistant_text_goes_back_as_an_output_text_message() {
    let server = serve_in_order(
        "/responses",
        vec![(
            fixture("openai_responses/resp_ns_final_text.json"),
            "application/json",
        )],
    )
    .await;
    let model = OpenAiResponses::builder("o4-mini")
        .base_url(server.uri())
        .api_key("k")
        .stream(false)
        .store(true)
        .reasoning_effort("low")
        .build()
        .unwrap();
    let messages = [
        agentloop::Message::user("hi"),
        agentloop::Message::Assistant(agentloop::message::AssistantMessage {
            text: "Hello!".into(),
            ..Default::default()
        }),
        agentloop::Message::user("and now?"),
    ];
    let settings = agentloop::model::ModelSettings {
        max_tokens: Some(300),
        tool_choice: Some(agentloop::model::ToolChoice::Required),
        ..Default::default()
    };
    let tools = [
        json_tool("t", json!({"type": "object"}), |_| Ok(String::new()))
            .spec()
            .clone(),
    ];
    let schema = json!({"type": "object"});
    let request = agentloop::model::ModelRequest {
        instructions: None,
        messages: &messages,
        tools: &tools,
        output_schema: Some(&schema),
        settings: &settings,
    };
    agentloop::model::complete(&model, request).await.unwrap();
    let body = &request_bodies(&server).await[0];
    assert_eq!(body["store"], true);
    assert_eq!(
        body.get("include"),
        None,
        "stored responses need no encrypted reasoning"
    );
    assert_eq!(body["reasoning"], json!({"effort": "low"}));
    assert_eq!(body["max_output_tokens"], 300);
    assert_eq!(body["tool_choice"], "required");
    assert_eq!(body["text"]["format"]["type"], "json_schema");
    assert_eq!(body["text"]["format"]["schema"], schema);
    assert_eq!(
        body["input"][1],
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]})
    );
}

#[tokio::test]
async fn encrypted_reasoning_is_asked_of_reasoning_models_and_not_of_their_chat_snapshots() {
    let server = wiremock::MockServer::start().await;
    let names = [
        "gpt-5",
        "gpt-5.4-mini",
        "o3",
        "gpt-5-chat-latest",
        "gpt-4.1",
    ];
    for name in names {
        // Only the request matters here: the empty server's 404 ends each call.
        let _ = support::ask(&model(name, server.uri(), true)).await;
    }
    let bodies = request_bodies(&server).await;
    let include: Vec<Option<&Value>> = bodies.iter().map(|b| b.get("include")).collect();
    let encrypted = json!(["reasoning.encrypted_content"]);
    // No reasoning, and a 400 for the include (pydantic/pydantic-ai#3326): the chat snapshot.
    assert_eq!(
        include,
        [
            Some(&encrypted),
            Some(&encrypted),
            Some(&encrypted),
            None,
            None
        ]
    );
}
