//! Every Anthropic Messages case of the recorded fixture corpus, served over loopback HTTP to the
//! real [`Anthropic`] adapter (streamed and whole), compared with the case's `expected`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentloop::model::ModelErrorKind;
use agentloop_providers::anthropic::Anthropic;
use support::{call, cases, check, serve};

#[tokio::test]
async fn every_anthropic_fixture_case_matches_expected() {
    let cases = cases("anthropic_messages");
    assert_eq!(cases.len(), 14, "the corpus holds 14 Anthropic cases");
    for case in &cases {
        let server = serve(case, "/v1/messages").await;
        let model = Anthropic::builder("claude-test")
            .base_url(server.uri())
            .api_key("test-key")
            .stream(case["stream"].as_bool().unwrap())
            .build()
            .unwrap();
        let outcome = call(&model).await;
        check(case, &outcome);
    }
}

#[tokio::test]
async fn fixture_errors_are_classified_by_kind() {
    let expect = [
        ("anth_err_400", ModelErrorKind::InvalidRequest),
        ("anth_err_404_model", ModelErrorKind::ModelNotFound),
        ("anth_err_529_overloaded", ModelErrorKind::Overloaded),
        ("anth_s_midstream_overloaded", ModelErrorKind::Overloaded),
    ];
    let cases = cases("anthropic_messages");
    for (id, kind) in expect {
        let case = cases.iter().find(|c| c["id"] == id).unwrap();
        let server = serve(case, "/v1/messages").await;
        let model = Anthropic::builder("claude-test")
            .base_url(server.uri())
            .api_key("test-key")
            .stream(case["stream"].as_bool().unwrap())
            .build()
            .unwrap();
        let err = call(&model).await.result.unwrap_err();
        assert_eq!(err.kind, kind, "{id}");
        assert_eq!(err.provider.as_deref(), Some("anthropic"), "{id}");
        assert!(!err.message.contains("test-key"), "{id}: the key leaked");
    }
}

#[test]
fn fixture_streams_parse_the_same_in_memory() {
    support::check_in_memory(
        "anthropic_messages",
        agentloop_providers::anthropic::parse_stream_bytes,
    );
}

#[test]
fn every_cut_of_a_recorded_stream_before_message_stop_is_an_error() {
    support::check_every_cut(
        "anthropic_messages",
        agentloop_providers::anthropic::parse_stream_bytes,
        b"message_stop",
    );
}
