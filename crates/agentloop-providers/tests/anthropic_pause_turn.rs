//! Anthropic's `pause_turn` over real loopback HTTP: a turn the server paused in its own loop of
//! server tools is continued (its blocks sent back unchanged as the last assistant message) and
//! the call answers with the whole turn, streamed and whole; a turn paused past the bound fails
//! with `model.paused`, never ending the run on its opening words.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use agentloop::model::{FinishReason, ModelErrorKind, Usage};
use agentloop::{Agent, StopReason};
use agentloop_providers::anthropic::{Anthropic, MAX_PAUSE_CONTINUATIONS};
use serde_json::{Value, json};
use support::{call, request_bodies, serve_in_order};

fn model(uri: String, stream: bool) -> Anthropic {
    support::anthropic_model(uri, stream)
}

/// The server's web search and its result, as a paused turn carries them: sent back, each must
/// be byte for byte what came (the citations, the encrypted content).
fn search_use() -> Value {
    json!({"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {"query": "weather paris"}})
}

fn search_result() -> Value {
    json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [
        {"type": "web_search_result", "url": "https://example.com/paris", "title": "Paris weather",
         "encrypted_content": "EqgfCioIARgBIiQ3", "page_age": "April 30, 2025"}
    ]})
}

/// The paused first part's blocks, as the server sent them.
fn paused_blocks() -> Value {
    json!([
        {"type": "text", "text": "Let me look that up. "},
        search_use(),
        search_result(),
    ])
}

fn sse(events: &[Value]) -> Vec<u8> {
    support::sse_of(events)
}

/// The first part, streamed: text, the search (its input in two pieces), its result, paused.
fn paused_stream(id: &str) -> Vec<u8> {
    sse(&[
        json!({"type": "message_start", "message": {"id": id, "model": "claude-test", "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me look "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "that up. "}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"query\": \"weather"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": " paris\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": search_result()}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "pause_turn"}, "usage": {"output_tokens": 10}}),
        json!({"type": "message_stop"}),
    ])
}

fn paused_whole(id: &str) -> Vec<u8> {
    json!({"id": id, "type": "message", "role": "assistant", "model": "claude-test",
        "content": paused_blocks(), "stop_reason": "pause_turn",
        "usage": {"input_tokens": 100, "output_tokens": 10}})
    .to_string()
    .into_bytes()
}

/// The part that finishes the turn.
fn final_stream() -> Vec<u8> {
    sse(&[
        json!({"type": "message_start", "message": {"id": "msg_2", "model": "claude-test", "usage": {"input_tokens": 150, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "It is sunny in Paris."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 20}}),
        json!({"type": "message_stop"}),
    ])
}

fn final_whole() -> Vec<u8> {
    json!({"id": "msg_2", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [{"type": "text", "text": "It is sunny in Paris."}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 150, "output_tokens": 20}})
    .to_string()
    .into_bytes()
}

fn replies(stream: bool, paused: usize) -> Vec<(Vec<u8>, &'static str)> {
    let kind = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut replies: Vec<(Vec<u8>, &str)> = (0..paused)
        .map(|i| {
            let id = format!("msg_p{i}");
            let body = if stream {
                paused_stream(&id)
            } else {
                paused_whole(&id)
            };
            (body, kind)
        })
        .collect();
    replies.push((
        if stream {
            final_stream()
        } else {
            final_whole()
        },
        kind,
    ));
    replies
}

async fn check_paused_once_then_finished(stream: bool) {
    let server = serve_in_order("/v1/messages", replies(stream, 1)).await;
    let answer = call(&model(server.uri(), stream)).await.result.unwrap();
    assert_eq!(
        answer.message.text,
        "Let me look that up. It is sunny in Paris."
    );
    assert_eq!(answer.finish_reason, FinishReason::Stop);
    assert_eq!(answer.raw_finish_reason.as_deref(), Some("end_turn"));
    assert_eq!(
        answer.usage,
        Usage {
            input_tokens: 250,
            output_tokens: 30,
            ..Usage::default()
        },
        "both parts' tokens"
    );
    assert_eq!(answer.id.as_deref(), Some("msg_p0"), "the turn's first id");
    let bodies = request_bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    let first = bodies[0]["messages"].as_array().unwrap();
    let second = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(second.len(), first.len() + 1, "{}", bodies[1]);
    assert_eq!(
        &second[..first.len()],
        &first[..],
        "the conversation as before"
    );
    assert_eq!(
        second.last().unwrap(),
        &json!({"role": "assistant", "content": paused_blocks()}),
        "the paused blocks go back unchanged as the last message"
    );
    assert_eq!(bodies[1]["tools"], bodies[0]["tools"]);
}

#[tokio::test]
async fn a_streamed_paused_turn_is_continued_and_answers_with_the_whole_turn() {
    check_paused_once_then_finished(true).await;
}

#[tokio::test]
async fn a_whole_paused_turn_is_continued_and_answers_with_the_whole_turn() {
    check_paused_once_then_finished(false).await;
}

#[tokio::test]
async fn a_paused_turn_is_no_run_answer_the_run_finishes_with_the_whole_turn() {
    let server = serve_in_order("/v1/messages", replies(true, 2)).await;
    let agent = Agent::builder()
        .model(model(server.uri(), true))
        .build()
        .unwrap();
    let outcome = agent.run("What is the weather in Paris?").await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.stop_reason, StopReason::Finished);
    assert_eq!(
        outcome.output.as_deref(),
        Some("Let me look that up. Let me look that up. It is sunny in Paris.")
    );
    assert_eq!(outcome.model_calls, 1, "one call, continued within");
    assert_eq!(outcome.usage.input_tokens, 350);
    assert_eq!(outcome.usage.output_tokens, 40);
    let bodies = request_bodies(&server).await;
    assert_eq!(bodies.len(), 3);
    // The second continuation sends both paused parts, in order, as one assistant message.
    let mut both = paused_blocks().as_array().unwrap().clone();
    both.extend(paused_blocks().as_array().unwrap().iter().cloned());
    assert_eq!(
        bodies[2]["messages"].as_array().unwrap().last().unwrap(),
        &json!({"role": "assistant", "content": both})
    );
}

async fn check_paused_past_the_bound(stream: bool) {
    let times = usize::try_from(MAX_PAUSE_CONTINUATIONS).unwrap() + 1;
    let mut replies = replies(stream, times);
    replies.pop(); // never asked for: the turn fails first
    let server = serve_in_order("/v1/messages", replies).await;
    let err = call(&model(server.uri(), stream)).await.result.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Paused, "{err}");
    assert_eq!(err.code(), "model.paused");
    assert!(err.message.contains("pause_turn"), "{err}");
    assert_eq!(request_bodies(&server).await.len(), times);
}

#[tokio::test]
async fn a_streamed_turn_paused_past_the_bound_fails_as_paused() {
    check_paused_past_the_bound(true).await;
}

#[tokio::test]
async fn a_whole_turn_paused_past_the_bound_fails_as_paused() {
    check_paused_past_the_bound(false).await;
}

#[tokio::test]
async fn a_run_whose_turn_stays_paused_fails_with_model_paused_and_no_answer() {
    let times = usize::try_from(MAX_PAUSE_CONTINUATIONS).unwrap() + 1;
    let mut replies = replies(true, times);
    replies.pop();
    let server = serve_in_order("/v1/messages", replies).await;
    let agent = Agent::builder()
        .model(model(server.uri(), true))
        .build()
        .unwrap();
    let outcome = agent.run("What is the weather in Paris?").await;
    assert_eq!(outcome.stop_reason, StopReason::Failed);
    assert_eq!(
        outcome.output, None,
        "the turn's opening words are no answer"
    );
    assert_eq!(outcome.error.unwrap().code(), "model.paused");
}

#[tokio::test]
async fn a_continued_stream_is_one_response_one_start_one_finish_its_usage_summed() {
    use agentloop::model::ModelEvent;
    let server = serve_in_order("/v1/messages", replies(true, 1)).await;
    let events: Vec<ModelEvent> = support::events(&model(server.uri(), true))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let starts = events
        .iter()
        .filter(|e| matches!(e, ModelEvent::Start { .. }))
        .count();
    let finishes: Vec<&ModelEvent> = events
        .iter()
        .filter(|e| matches!(e, ModelEvent::Finish { .. }))
        .collect();
    assert_eq!(starts, 1);
    assert_eq!(
        finishes,
        [&ModelEvent::Finish {
            reason: FinishReason::Stop,
            raw: Some("end_turn".into())
        }]
    );
    assert!(matches!(events.last(), Some(ModelEvent::Finish { .. })));
    let texts: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts,
        ["Let me look ", "that up. ", "It is sunny in Paris."]
    );
    // Each usage report is the turn's so far: never less than the one before.
    let inputs: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::Usage(u) => Some(u.input_tokens),
            _ => None,
        })
        .collect();
    assert!(inputs.windows(2).all(|w| w[0] <= w[1]), "{inputs:?}");
    assert_eq!(inputs.last(), Some(&250));
}
