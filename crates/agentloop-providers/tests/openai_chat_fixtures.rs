//! Every recorded Chat Completions case of the recorded corpus (`tests/fixtures/`), served over loopback HTTP by wiremock to the real adapter, streamed or whole,
//! and compared with the case's `expected`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use agentloop::model::complete;
use agentloop::{
    Message, ModelResponse,
    model::{ModelErrorKind, ModelRequest, ModelSettings},
};
use agentloop_providers::OpenAiChat;
use serde_json::Value;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const API_KEY: &str = "sk-test-fixture-key-0123456789";

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn chat_cases() -> Vec<Value> {
    let text = std::fs::read_to_string(corpus_dir().join("cases.json"))
        .expect("the recorded fixture corpus is in tests/fixtures");
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    cases
        .into_iter()
        .filter(|c| c["api"] == "openai_chat_completions")
        .collect()
}

/// What kind an error case must be classified as, from its status and provider code: a table
/// written from the providers' documentation, independent of the adapter's classifier.
fn expected_kind(status: u64, error: &Value) -> ModelErrorKind {
    let code = &error["code"];
    if code == "insufficient_quota" {
        return ModelErrorKind::QuotaExceeded;
    }
    if code == "model_not_found" {
        return ModelErrorKind::ModelNotFound;
    }
    match status {
        401 | 403 => ModelErrorKind::Authentication,
        429 => ModelErrorKind::RateLimited,
        529 => ModelErrorKind::Overloaded,
        500..=599 => ModelErrorKind::Server,
        _ => ModelErrorKind::InvalidRequest,
    }
}

fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Compares one successful response with `expected`; returns the differences.
fn compare_response(id: &str, expected: &Value, got: &ModelResponse) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut diff = |what: String| diffs.push(format!("{id}: {what}"));

    let want_calls = expected["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let calls = &got.message.tool_calls;
    if want_calls.len() != calls.len() {
        diff(format!(
            "{} tool calls, expected {}",
            calls.len(),
            want_calls.len()
        ));
    }
    for (want, call) in want_calls.iter().zip(calls) {
        let want_id = want["id"].as_str().unwrap_or_default();
        if want_id.is_empty() {
            // The server sent an empty id: the adapter keeps it empty, and the run fills it from
            // its injected id source, so that a replay of the run draws the same ids.
            if !call.call_id.is_empty() {
                diff(format!(
                    "an empty tool call id became {:?} in the adapter",
                    call.call_id
                ));
            }
        } else if &*call.call_id != want_id {
            diff(format!(
                "tool call id {:?}, expected {want_id:?}",
                call.call_id
            ));
        }
        if call.tool != want["name"].as_str().unwrap_or_default() {
            diff(format!(
                "tool name {:?}, expected {}",
                call.tool, want["name"]
            ));
        }
        if call.arguments != want["arguments_raw"].as_str().unwrap_or_default() {
            diff(format!(
                "raw arguments {:?}, expected {}",
                call.arguments, want["arguments_raw"]
            ));
        }
        let parsed: Option<Value> = serde_json::from_str(&call.arguments).ok();
        let want_parsed = if want["arguments"].is_null() {
            None
        } else {
            Some(want["arguments"].clone())
        };
        if parsed != want_parsed {
            diff(format!(
                "parsed arguments {parsed:?}, expected {want_parsed:?}"
            ));
        }
    }

    // `null` and "" both mean "no text" (the whole xAI answer has `content: ""`).
    let want_text = expected["text"].as_str().unwrap_or_default();
    if got.message.text != want_text {
        diff(format!(
            "text {:?}, expected {want_text:?}",
            got.message.text
        ));
    }

    match expected["usage"].as_object() {
        Some(u) => {
            let (i, o) = (
                u["input_tokens"].as_u64().unwrap(),
                u["output_tokens"].as_u64().unwrap(),
            );
            if (got.usage.input_tokens, got.usage.output_tokens) != (i, o) {
                diff(format!(
                    "usage {}/{}, expected {i}/{o}",
                    got.usage.input_tokens, got.usage.output_tokens
                ));
            }
        }
        None => {
            if !got.usage.is_zero() {
                diff(format!("usage {:?} where the case has none", got.usage));
            }
        }
    }

    let want_stop = expected["stop_reason"].as_str();
    if got.raw_finish_reason.as_deref() != want_stop {
        diff(format!(
            "stop reason {:?}, expected {want_stop:?}",
            got.raw_finish_reason
        ));
    }

    if let Some(chars) = expected["reasoning_chars"].as_u64() {
        let ours: usize = got
            .message
            .reasoning
            .iter()
            .map(|r| r.text.chars().count())
            .sum();
        if ours as u64 != chars {
            diff(format!("{ours} reasoning chars, expected {chars}"));
        }
    }

    let want_warnings = expected["warnings"].as_array().map_or(0, Vec::len);
    if want_warnings == 0 && !got.warnings.is_empty() {
        diff(format!("unexpected warnings {:?}", got.warnings));
    }
    if got.truncated {
        diff("marked truncated".to_owned());
    }
    diffs
}

#[tokio::test]
async fn every_chat_completions_fixture_parses_to_its_expected_result() {
    let cases = chat_cases();
    assert!(
        cases.len() >= 24,
        "expected the whole chat corpus, found {} cases",
        cases.len()
    );
    let mut failures = Vec::new();
    for case in &cases {
        let id = case["id"].as_str().unwrap();
        let status = case["http_status"].as_u64().unwrap();
        let stream = case["stream"].as_bool().unwrap();
        let body = std::fs::read(corpus_dir().join(case["file"].as_str().unwrap())).unwrap();
        let content_type = if stream && status == 200 {
            "text/event-stream"
        } else {
            "application/json"
        };

        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/chat/completions"))
            .and(header(
                "authorization",
                format!("Bearer {API_KEY}").as_str(),
            ))
            .respond_with(
                ResponseTemplate::new(status as u16)
                    .set_body_raw(body, content_type)
                    .insert_header("x-request-id", format!("req_{id}").as_str()),
            )
            .expect(1)
            .mount(&server)
            .await;
        let model = OpenAiChat::builder("gpt-4.1-mini")
            .base_url(server.uri())
            .api_key(API_KEY)
            .stream(stream)
            .build()
            .unwrap();
        let messages = [Message::user("What's the weather?")];
        let settings = ModelSettings::default();
        let request = ModelRequest {
            instructions: Some("Be brief."),
            messages: &messages,
            tools: &[],
            output_schema: None,
            settings: &settings,
        };
        let result = complete(&model, request).await;
        let expected = &case["expected"];

        // The request we sent asked for what the case serves.
        let sent = &server.received_requests().await.unwrap()[0];
        let sent: Value = serde_json::from_slice(&sent.body).unwrap();
        if sent["stream"].as_bool().unwrap_or(false) != stream {
            failures.push(format!(
                "{id}: request stream flag {}, case stream {stream}",
                sent["stream"]
            ));
        }

        match (&expected["error"], result) {
            (Value::Null, Ok(response)) => {
                failures.extend(compare_response(id, expected, &response))
            }
            (Value::Null, Err(e)) => failures.push(format!("{id}: unexpected error {e}")),
            (want, Ok(response)) => failures.push(format!(
                "{id}: expected error {want}, got response {response:?}"
            )),
            (want, Err(e)) => {
                let kind = expected_kind(status, want);
                if e.kind != kind {
                    failures.push(format!("{id}: error kind {:?}, expected {kind:?}", e.kind));
                }
                if Some(e.message.as_str()) != want["message"].as_str() {
                    failures.push(format!(
                        "{id}: error message {:?}, expected {}",
                        e.message, want["message"]
                    ));
                }
                if e.provider_code != as_text(&want["code"]) {
                    failures.push(format!(
                        "{id}: provider code {:?}, expected {}",
                        e.provider_code, want["code"]
                    ));
                }
                if e.error_type != as_text(&want["type"]) {
                    failures.push(format!(
                        "{id}: error type {:?}, expected {}",
                        e.error_type, want["type"]
                    ));
                }
                if e.param != as_text(&want["param"]) {
                    failures.push(format!(
                        "{id}: param {:?}, expected {}",
                        e.param, want["param"]
                    ));
                }
                if e.status != Some(status as u16) {
                    failures.push(format!("{id}: status {:?}, expected {status}", e.status));
                }
                if e.request_id.as_deref() != Some(format!("req_{id}").as_str()) {
                    failures.push(format!(
                        "{id}: request id {:?} not taken from the header",
                        e.request_id
                    ));
                }
                let shown = format!("{e} {e:?}");
                if shown.contains(API_KEY) {
                    failures.push(format!("{id}: the API key leaked into the error"));
                }
                // Only the provider's message: no other part of the body (Groq's
                // `failed_generation`, OpenRouter's `metadata.raw`) reaches the error.
                for extra in ["failed_generation", "metadata"] {
                    if let Some(v) = want.get(extra) {
                        let needle = as_text(v).unwrap_or_default();
                        let needle = needle.get(..needle.len().min(24)).unwrap_or_default();
                        if !needle.is_empty() && shown.contains(needle) {
                            failures
                                .push(format!("{id}: `{extra}` of the body leaked into the error"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn every_streamed_chat_fixture_parses_the_same_without_http() {
    // The pure parser the fuzz target drives gives what the HTTP path gives.
    for case in chat_cases() {
        if case["stream"] != true || case["http_status"] != 200 {
            continue;
        }
        let id = case["id"].as_str().unwrap();
        let bytes = std::fs::read(corpus_dir().join(case["file"].as_str().unwrap())).unwrap();
        let response = agentloop_providers::openai_chat::parse_stream_bytes(&bytes).unwrap();
        let diffs = compare_response(id, &case["expected"], &response);
        assert!(diffs.is_empty(), "{diffs:?}");
    }
}
