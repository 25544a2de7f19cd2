//! Multi-turn runs of a real agent against the Anthropic adapter over loopback HTTP: the request
//! sent after the tool results is checked field by field against the Messages protocol.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentloop::{Agent, StopReason};
use agentloop_providers::anthropic::Anthropic;
use serde_json::{Value, json};
use support::{fixture, json_tool, request_bodies, serve_in_order};

/// Prompt caching is off here: these tests pin the bodies' other parts exactly.
fn model(uri: String, stream: bool) -> Anthropic {
    support::anthropic_model(uri, stream)
}

fn ab_schema() -> Value {
    json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})
}

#[tokio::test]
async fn parallel_tool_results_travel_in_one_user_message_with_matching_ids() {
    let server = serve_in_order(
        "/v1/messages",
        vec![
            (
                fixture("anthropic/anth_s_parallel2_async.sse"),
                "text/event-stream",
            ),
            (fixture("anthropic/anth_s_text.sse"), "text/event-stream"),
        ],
    )
    .await;
    let agent = Agent::builder()
        .model(model(server.uri(), true))
        .instructions("Do arithmetic with the tools.")
        .tool(json_tool("plus", ab_schema(), |a| {
            Ok((a["a"].as_i64().unwrap() + a["b"].as_i64().unwrap()).to_string())
        }))
        .tool(json_tool("minus", ab_schema(), |_| {
            Err("minus is broken today".to_owned())
        }))
        .build()
        .unwrap();
    let outcome = agent.run("What is 1+2 and 2-1?").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.stop_reason, StopReason::Finished);
    assert_eq!(outcome.output.as_deref(), Some("Hello there!"));
    // Usage of both calls: 469/104 then 11/6.
    assert_eq!(
        (outcome.usage.input_tokens, outcome.usage.output_tokens),
        (480, 110)
    );

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r.url.path(), "/v1/messages");
        assert_eq!(r.headers.get("x-api-key").unwrap(), "sk-ant-test-key");
        assert_eq!(r.headers.get("anthropic-version").unwrap(), "2023-06-01");
        assert!(r.headers.get("authorization").is_none());
    }
    let bodies = request_bodies(&server).await;
    let first = &bodies[0];
    assert_eq!(first["model"], "claude-test");
    assert_eq!(first["max_tokens"], 4096);
    assert_eq!(first["stream"], true);
    assert_eq!(first["system"], "Do arithmetic with the tools.");
    assert_eq!(
        first["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "What is 1+2 and 2-1?"}]}])
    );
    let tool_names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(tool_names, ["plus", "minus"]);
    assert_eq!(first["tools"][0]["input_schema"], ab_schema());

    let messages = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        3,
        "user, assistant, one user message with both results"
    );
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01Q54GZYYAzL3HVr4LQDbfXC", "name": "plus", "input": {"a": 1, "b": 2}},
            {"type": "tool_use", "id": "toolu_017NYD2BGVvRppZKAX98qedy", "name": "minus", "input": {"a": 2, "b": 1}},
        ]})
    );
    assert_eq!(messages[2]["role"], "user");
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(
        results[0],
        json!({"type": "tool_result", "tool_use_id": "toolu_01Q54GZYYAzL3HVr4LQDbfXC", "content": "3"})
    );
    assert_eq!(results[1]["type"], "tool_result");
    assert_eq!(results[1]["tool_use_id"], "toolu_017NYD2BGVvRppZKAX98qedy");
    assert_eq!(results[1]["is_error"], true);
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("minus is broken today")
    );
}

#[tokio::test]
async fn thinking_blocks_go_back_unchanged_before_text_and_tool_use() {
    let first_reply = fixture("anthropic/anth_ns_thinking_tool.json");
    let recorded: Value = serde_json::from_slice(&first_reply).unwrap();
    let server = serve_in_order(
        "/v1/messages",
        vec![
            (first_reply, "application/json"),
            (
                fixture("anthropic/anth_ns_final_text.json"),
                "application/json",
            ),
        ],
    )
    .await;
    let agent = Agent::builder()
        .model(model(server.uri(), false))
        .tool(json_tool(
            "get_user_country",
            json!({"type": "object", "properties": {}}),
            |_| Ok("Mexico".to_owned()),
        ))
        .build()
        .unwrap();
    let outcome = agent
        .run("What is the largest city in the user country?")
        .await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert!(
        outcome
            .output
            .as_deref()
            .unwrap()
            .starts_with("Based on the retrieved information")
    );

    let bodies = request_bodies(&server).await;
    assert_eq!(
        bodies[0].get("stream"),
        None,
        "a whole response is asked for without `stream`"
    );
    assert_eq!(bodies[0].get("system"), None, "no instructions, no system");
    let messages = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    let content = messages[1]["content"].as_array().unwrap();
    // The recorded assistant content, block for block: thinking (with its signature), text, tool_use.
    assert_eq!(content, recorded["content"].as_array().unwrap());
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(content[0]["signature"], recorded["content"][0]["signature"]);
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01YGzqpRE16Vricda3Aqcejo", "content": "Mexico"}
        ]})
    );
}

#[tokio::test]
async fn cut_off_tool_use_is_never_executed() {
    let server = serve_in_order(
        "/v1/messages",
        vec![
            (
                fixture("anthropic/anth_s_incomplete_json_max_tokens.sse"),
                "text/event-stream",
            ),
            (fixture("anthropic/anth_s_text.sse"), "text/event-stream"),
        ],
    )
    .await;
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    let tool = agentloop::Tool::dynamic(
        "make_file",
        "Writes a file.",
        json!({"type": "object"}),
        move |_, _| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            async { Ok(agentloop::ToolOutput::text("written")) }
        },
    );
    let agent = Agent::builder()
        .model(model(server.uri(), true))
        .tool(tool)
        .build()
        .unwrap();
    let outcome = agent.run("Write a tax guide to taxes.txt").await;
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the cut-off call ran"
    );
    assert_eq!(outcome.tool_calls_run, 0);
    // The model reads that its call was cut, in a tool_result the API accepts, and goes on.
    assert_eq!(
        outcome.stop_reason,
        StopReason::Finished,
        "{:?}",
        outcome.error
    );
    assert_eq!(
        outcome.tool_calls[0].outcome.code.as_deref(),
        Some("truncated")
    );
    let requests = server.received_requests().await.unwrap();
    let second: serde_json::Value = serde_json::from_slice(&requests[1].body).unwrap();
    let blocks = second["messages"][2]["content"].to_string();
    assert!(
        blocks.contains("tool_result") && blocks.contains("cut off"),
        "{blocks}"
    );
}

#[tokio::test]
async fn settings_and_tool_choice_reach_the_request() {
    let server = serve_in_order(
        "/v1/messages",
        vec![(
            fixture("anthropic/anth_ns_final_text.json"),
            "application/json",
        )],
    )
    .await;
    let model = Anthropic::builder("claude-test")
        .base_url(server.uri())
        .api_key("k")
        .stream(false)
        .thinking(2048)
        .header("anthropic-beta", "interleaved-thinking-2025-05-14")
        .prompt_caching(false)
        .build()
        .unwrap();
    let settings = agentloop::model::ModelSettings {
        max_tokens: Some(9000),
        temperature: Some(1.0),
        parallel_tool_calls: Some(false),
        tool_choice: Some(agentloop::model::ToolChoice::Tool("plus".into())),
        ..Default::default()
    };
    let tools = [json_tool("plus", ab_schema(), |_| Ok(String::new()))
        .spec()
        .clone()];
    let messages = [agentloop::Message::user("hi")];
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let request = agentloop::model::ModelRequest {
        instructions: Some("Be brief."),
        messages: &messages,
        tools: &tools,
        output_schema: Some(&schema),
        settings: &settings,
    };
    let response = agentloop::model::complete(&model, request).await.unwrap();
    assert_eq!(response.raw_finish_reason.as_deref(), Some("end_turn"));
    let requests = server.received_requests().await.unwrap();
    assert_eq!(
        requests[0].headers.get("anthropic-beta").unwrap(),
        "interleaved-thinking-2025-05-14"
    );
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(body["max_tokens"], 9000);
    assert_eq!(body["temperature"], 1.0);
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "plus", "disable_parallel_tool_use": true})
    );
    let system = body["system"].as_str().unwrap();
    assert!(system.starts_with("Be brief.\n\n"));
    assert!(
        system.contains(&schema.to_string()),
        "the output schema is stated in the system prompt"
    );
}
