//! Every OpenAI Responses case of the recorded fixture corpus, served over loopback HTTP to the real
//! [`OpenAiResponses`] adapter (streamed and whole), compared with the case's `expected`.
//!
//! `expected.tool_calls[].item_id` (the `fc_...` output item id) is not compared: the transcript's
//! [`agentloop::message::ToolCall`] keeps the `call_id` that results answer, and the item id is not needed
//! to send the call back (`store: false`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentloop::model::ModelErrorKind;
use agentloop_providers::openai_responses::OpenAiResponses;
use support::{call, cases, check, serve};

fn model(uri: String, stream: bool) -> OpenAiResponses {
    OpenAiResponses::builder("gpt-test")
        .base_url(uri)
        .api_key("test-key")
        .stream(stream)
        .build()
        .unwrap()
}

#[tokio::test]
async fn every_responses_fixture_case_matches_expected() {
    let cases = cases("openai_responses");
    assert_eq!(cases.len(), 11, "the corpus holds 11 Responses cases");
    for case in &cases {
        let server = serve(case, "/responses").await;
        let outcome = call(&model(server.uri(), case["stream"].as_bool().unwrap())).await;
        check(case, &outcome);
    }
}

#[tokio::test]
async fn fixture_errors_are_classified_by_kind() {
    let expect = [
        ("resp_err_400", ModelErrorKind::InvalidRequest, Some(400)),
        (
            "resp_err_insufficient_quota",
            ModelErrorKind::QuotaExceeded,
            Some(429),
        ),
        (
            "resp_s_err_insufficient_quota",
            ModelErrorKind::QuotaExceeded,
            None,
        ),
    ];
    let cases = cases("openai_responses");
    for (id, kind, status) in expect {
        let case = cases.iter().find(|c| c["id"] == id).unwrap();
        let server = serve(case, "/responses").await;
        let err = call(&model(server.uri(), case["stream"].as_bool().unwrap()))
            .await
            .result
            .unwrap_err();
        assert_eq!(err.kind, kind, "{id}");
        assert_eq!(err.status, status, "{id}");
        assert!(
            !err.is_retryable(),
            "{id}: quota and bad requests are not retried"
        );
    }
}

#[tokio::test]
async fn reasoning_items_are_kept_whole_for_the_next_request() {
    let cases = cases("openai_responses");
    for id in ["resp_s_reasoning_then_call", "resp_ns_reasoning_then_call"] {
        let case = cases.iter().find(|c| c["id"] == id).unwrap();
        let server = serve(case, "/responses").await;
        let response = call(&model(server.uri(), case["stream"].as_bool().unwrap()))
            .await
            .result
            .unwrap();
        let item = response.message.reasoning[0]
            .provider_data
            .as_ref()
            .unwrap();
        assert_eq!(item["type"], "reasoning", "{id}");
        assert!(item["id"].as_str().unwrap().starts_with("rs_"), "{id}");
        assert!(
            item["encrypted_content"]
                .as_str()
                .unwrap()
                .starts_with("gAAAAA"),
            "{id}"
        );
        assert!(item["summary"].is_array(), "{id}");
    }
}

#[test]
fn fixture_streams_parse_the_same_in_memory() {
    support::check_in_memory(
        "openai_responses",
        agentloop_providers::openai_responses::parse_stream_bytes,
    );
}

#[test]
fn every_cut_of_a_recorded_stream_before_completion_is_an_error() {
    support::check_every_cut(
        "openai_responses",
        agentloop_providers::openai_responses::parse_stream_bytes,
        b"response.completed",
    );
}
