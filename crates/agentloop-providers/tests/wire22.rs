//! A red team of in-the-wild provider traffic, over loopback HTTP: what real servers and
//! gateways send that the recorded corpus and the other hostile tests do not, each case read
//! through the real adapter (and, where retrying is the point, its retry layer).
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod support;

use agentloop::model::ModelErrorKind;
use agentloop_providers::Retry;
use agentloop_providers::openai_responses::OpenAiResponses;
use support::{ask, fast_retry, serve_in_order};

fn responses(uri: String) -> OpenAiResponses {
    OpenAiResponses::builder("gpt-test")
        .base_url(uri)
        .api_key("sk-wire22-secret")
        .build()
        .unwrap()
}

/// An event stream of these `(event name, data)` pairs.
fn events(events: &[(&str, &str)]) -> Vec<u8> {
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect::<String>()
        .into_bytes()
}

const CREATED: (&str, &str) = (
    "response.created",
    r#"{"type":"response.created","response":{"id":"r","status":"in_progress","output":[]}}"#,
);

fn answer(text: &str) -> Vec<u8> {
    let delta = format!(
        r#"{{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"{text}"}}"#
    );
    events(&[
        CREATED,
        ("response.output_text.delta", &delta),
        (
            "response.completed",
            r#"{"type":"response.completed","response":{"id":"r","status":"completed","output":[],"usage":{"input_tokens":3,"output_tokens":4}}}"#,
        ),
    ])
}

#[tokio::test]
async fn wire22_an_overloaded_responses_model_is_overloaded_and_retried() {
    // OpenAI's Responses API reports a model at capacity inside a 200 stream, as a failed
    // response or an `error` event, with the codes `server_is_overloaded` and `slow_down`: a
    // transient failure, to be retried, never an error of no kind that ends the run.
    let failed = r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"server_is_overloaded","message":"Selected model is at capacity. Please try a different model."},"output":[]}}"#;
    let slow = r#"{"type":"error","code":"slow_down","message":"Please slow down.","param":null}"#;
    for (name, data) in [("response.failed", failed), ("error", slow)] {
        let stream = || events(&[CREATED, (name, data)]);
        let server = serve_in_order("/responses", vec![(stream(), "text/event-stream")]).await;
        let err = ask(&responses(server.uri())).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Overloaded, "{name}: {err}");
        assert!(err.is_retryable(), "{name}");

        let server = serve_in_order(
            "/responses",
            vec![
                (stream(), "text/event-stream"),
                (answer("back"), "text/event-stream"),
            ],
        )
        .await;
        let got = ask(&Retry::with_policy(responses(server.uri()), fast_retry()))
            .await
            .unwrap_or_else(|e| panic!("{name}: not retried: {e}"));
        assert_eq!(got.message.text, "back", "{name}");
    }
}
