//! The Responses adapter's failure paths over real loopback HTTP: an idle stream, a dropped
//! connection, a rate limit answered by one retry layer, and quota errors (HTTP and in-stream) that
//! are never retried.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use agentloop::model::ModelErrorKind;
use agentloop_providers::Retry;
use agentloop_providers::openai_responses::OpenAiResponses;
use support::{ask, check_stall_and_drop, fast_retry, fixture, serve_replies};

const STARTED: &[u8] = b"data: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"model\":\"m\",\"status\":\"in_progress\"}}\n\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"Hel\"}\n\n";

fn model(uri: String) -> OpenAiResponses {
    OpenAiResponses::builder("gpt-test")
        .base_url(uri)
        .api_key("sk-secret")
        .idle_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_stalled_or_dropped_stream_is_an_error_not_a_half_response() {
    check_stall_and_drop(STARTED, model).await;
}

#[tokio::test]
async fn rate_limit_is_retried_and_the_retry_succeeds() {
    let limited = br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    let server = serve_replies(
        "/responses",
        vec![
            (429, limited.to_vec(), "application/json"),
            (
                200,
                fixture("openai_responses/resp_s_text.sse"),
                "text/event-stream",
            ),
        ],
    )
    .await;
    let response = ask(&Retry::with_policy(model(server.uri()), fast_retry()))
        .await
        .unwrap();
    assert_eq!(response.message.text, "The capital of France is Paris.");
}

#[tokio::test]
async fn quota_errors_are_not_retried() {
    for (status, file, content_type) in [
        (
            429,
            "openai_responses/resp_err_insufficient_quota.json",
            "application/json",
        ),
        (
            200,
            "openai_responses/resp_s_err_insufficient_quota.sse",
            "text/event-stream",
        ),
    ] {
        // One reply only: a second attempt would find no mock and fail the `expect(1)` check.
        let server = serve_replies("/responses", vec![(status, fixture(file), content_type)]).await;
        let err = ask(&Retry::with_policy(model(server.uri()), fast_retry()))
            .await
            .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::QuotaExceeded, "{file}");
        assert_eq!(
            server.received_requests().await.unwrap().len(),
            1,
            "{file}: retried"
        );
        assert!(!err.message.contains("sk-secret"));
    }
}
