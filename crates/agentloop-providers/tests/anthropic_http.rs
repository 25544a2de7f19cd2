//! The Anthropic adapter's failure paths over real loopback HTTP: an idle stream, a dropped
//! connection, overload answered by one retry layer (as an HTTP 529 and as an in-stream `error`
//! event, before any content and after some, whose text is then discarded).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use agentloop_providers::Retry;
use agentloop_providers::anthropic::Anthropic;
use support::{ask, check_stall_and_drop, fast_retry, fixture, serve_replies};

const STARTED: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n";

fn model(uri: String) -> Anthropic {
    Anthropic::builder("claude-test")
        .base_url(uri)
        .api_key("sk-ant-secret")
        .idle_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_stalled_or_dropped_stream_is_an_error_not_a_half_response() {
    check_stall_and_drop(STARTED, model).await;
}

#[tokio::test]
async fn overloaded_529_is_retried_and_the_retry_succeeds() {
    let server = serve_replies(
        "/v1/messages",
        vec![
            (
                529,
                fixture("synthetic/anth_err_529_overloaded.json"),
                "application/json",
            ),
            (
                200,
                fixture("anthropic/anth_s_text.sse"),
                "text/event-stream",
            ),
        ],
    )
    .await;
    let response = ask(&Retry::with_policy(model(server.uri()), fast_retry()))
        .await
        .unwrap();
    assert_eq!(response.message.text, "Hello there!");
}

#[tokio::test]
async fn overloaded_event_before_any_content_is_retried() {
    let server = serve_replies(
        "/v1/messages",
        vec![
            (
                200,
                fixture("synthetic/anth_s_midstream_overloaded.sse"),
                "text/event-stream",
            ),
            (
                200,
                fixture("anthropic/anth_s_text.sse"),
                "text/event-stream",
            ),
        ],
    )
    .await;
    let response = ask(&Retry::with_policy(model(server.uri()), fast_retry()))
        .await
        .unwrap();
    assert_eq!(response.message.text, "Hello there!");
    assert_eq!(
        response.usage.input_tokens,
        11 + 10,
        "the answer's tokens, and those the overloaded attempt's message_start reported"
    );
}

#[tokio::test]
async fn overloaded_event_after_content_is_retried_and_its_text_discarded() {
    let mut body = STARTED.to_vec();
    body.extend_from_slice(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n");
    let server = serve_replies(
        "/v1/messages",
        vec![
            (200, body, "text/event-stream"),
            (
                200,
                fixture("anthropic/anth_s_text.sse"),
                "text/event-stream",
            ),
        ],
    )
    .await;
    let response = ask(&Retry::with_policy(model(server.uri()), fast_retry()))
        .await
        .unwrap();
    assert_eq!(
        response.message.text, "Hello there!",
        "the retry's answer alone, without the \"Hel\" of the overloaded attempt"
    );
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (11 + 3, 6 + 1),
        "both attempts' reported tokens, each once"
    );
}
