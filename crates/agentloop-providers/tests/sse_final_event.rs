//! Every provider reads its live stream through the one SSE entry point, so a recorded stream whose
//! last event is not followed by a blank line (a server that closes right after its final `data:`
//! line) is decoded whole over loopback HTTP, the same on all three APIs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentloop::Model;
use agentloop_providers::OpenAiChat;
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::openai_responses::OpenAiResponses;
use support::{ask, fixture, serve_replies};

/// A recorded stream cut right after its last event's data line, without `[DONE]` for Chat.
fn without_final_blank_line(file: &str) -> Vec<u8> {
    let text = String::from_utf8(fixture(file)).unwrap();
    let text = text.trim_end().trim_end_matches("data: [DONE]").trim_end();
    assert!(!text.ends_with('\n'));
    text.as_bytes().to_vec()
}

/// The response decoded from `file`, cut after its last event, served at `route` to the model
/// that `build` makes for the server's URL.
async fn decoded(
    route: &str,
    file: &str,
    build: impl Fn(String) -> Box<dyn Model>,
) -> agentloop::ModelResponse {
    let body = without_final_blank_line(file);
    let server = serve_replies(route, vec![(200, body, "text/event-stream")]).await;
    let model = build(server.uri());
    ask(model.as_ref()).await.unwrap()
}

#[tokio::test]
async fn a_final_event_without_its_blank_line_is_decoded_on_every_provider() {
    let chat = decoded(
        "/chat/completions",
        "openai_chat/oai_chat_s_text.sse",
        |uri| {
            Box::new(
                OpenAiChat::builder("gpt-test")
                    .base_url(uri)
                    .api_key("k")
                    .build()
                    .unwrap(),
            )
        },
    )
    .await;
    assert!(!chat.message.text.is_empty());
    // Chat's last event is the usage chunk: it is dispatched, not dropped.
    assert_eq!(
        (chat.usage.input_tokens, chat.usage.output_tokens),
        (14, 30)
    );

    let anthropic = decoded("/v1/messages", "anthropic/anth_s_text.sse", |uri| {
        Box::new(
            Anthropic::builder("claude-test")
                .base_url(uri)
                .api_key("k")
                .build()
                .unwrap(),
        )
    })
    .await;
    assert_eq!(anthropic.message.text, "Hello there!");

    let responses = decoded("/responses", "openai_responses/resp_s_text.sse", |uri| {
        Box::new(
            OpenAiResponses::builder("gpt-test")
                .base_url(uri)
                .api_key("k")
                .build()
                .unwrap(),
        )
    })
    .await;
    assert_eq!(responses.message.text, "The capital of France is Paris.");
}
