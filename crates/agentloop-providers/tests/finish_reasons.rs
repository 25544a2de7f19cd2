//! How a run ends on the word an answer's stream ends with, over real loopback HTTP on each API:
//! the words servers use for a whole answer finish it, their words for a cut, filtered or failed
//! answer end the run as such, and a word no adapter knows never passes for a whole answer (the
//! run fails with `model.other`, the word kept as the error's provider code, the text as the
//! output).
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentloop::{Agent, Model, RetryPolicy, RunError, RunOutcome, StopReason};
use agentloop_providers::Retry;
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::openai_chat::OpenAiChat;
use agentloop_providers::openai_responses::OpenAiResponses;
use tokio::io::AsyncWriteExt;

mod support;
use support::raw_http::serve_each;

/// The text every answer here streams before its end.
const TEXT: &str = "Half an ans";

/// A server answering its requests in order with these event-stream bodies (the last again once
/// they run out): its address, and how many requests it read.
async fn serve(bodies: Vec<String>) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let bodies = Arc::new(bodies);
    serve_each(move |mut socket, n| {
        let body = bodies[n.min(bodies.len() - 1)].clone();
        async move {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
            let _ = socket.flush().await;
        }
    })
    .await
}

/// A Chat Completions stream of [`TEXT`] (or `text`) in two pieces, ending with `finish`.
fn chat_body(text: &str, finish: &str) -> String {
    let (a, b) = text.split_at(text.len() / 2);
    let chunk = |delta: String, finish: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    [
        chunk(
            format!("{{\"role\":\"assistant\",\"content\":\"{a}\"}}"),
            "null",
        ),
        chunk(format!("{{\"content\":\"{b}\"}}"), "null"),
        chunk("{}".to_owned(), &format!("\"{finish}\"")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
}

/// An Anthropic Messages stream of [`TEXT`] ending with `stop_reason`.
fn anthropic_body(stop_reason: &str) -> String {
    [
        ("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}"#.to_owned()),
        ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned()),
        ("content_block_delta", format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{TEXT}"}}}}"#)),
        ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.to_owned()),
        ("message_delta", format!(r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop_reason}","stop_sequence":null}},"usage":{{"output_tokens":5}}}}"#)),
        ("message_stop", r#"{"type":"message_stop"}"#.to_owned()),
    ]
    .iter()
    .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
    .collect()
}

/// A Responses stream of [`TEXT`] whose final event gives the response `status`.
fn responses_body(status: &str) -> String {
    [
        ("response.created", r#"{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","model":"m","output":[]}}"#.to_owned()),
        ("response.output_item.added", r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_1","status":"in_progress","role":"assistant","content":[]}}"#.to_owned()),
        ("response.content_part.added", r#"{"type":"response.content_part.added","item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#.to_owned()),
        ("response.output_text.delta", format!(r#"{{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"{TEXT}"}}"#)),
        ("response.completed", format!(r#"{{"type":"response.completed","response":{{"id":"resp_1","object":"response","status":"{status}","model":"m","output":[{{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{{"type":"output_text","text":"{TEXT}","annotations":[]}}]}}],"usage":{{"input_tokens":12,"output_tokens":5,"total_tokens":17}}}}}}"#)),
    ]
    .iter()
    .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
    .collect()
}

/// A model of one API at a server's address.
type ModelAt = fn(&str) -> Box<dyn Model>;

fn chat_model(uri: &str) -> Box<dyn Model> {
    Box::new(
        OpenAiChat::builder("m")
            .base_url(uri)
            .api_key("sk-test")
            .build()
            .unwrap(),
    )
}

/// A run of `model` on one input.
async fn run(model: impl Model + 'static) -> RunOutcome {
    let agent = Agent::builder().model(model).build().unwrap();
    tokio::time::timeout(Duration::from_secs(60), agent.run("hello"))
        .await
        .expect("the run hung")
}

/// The model error a run ended with: its code and the provider's code.
fn model_error(outcome: &RunOutcome) -> (String, Option<String>) {
    match &outcome.error {
        Some(RunError::Model(e)) => (e.kind.code().to_owned(), e.provider_code.clone()),
        other => panic!("not a model error: {other:?} ({:?})", outcome.stop_reason),
    }
}

#[tokio::test]
async fn an_unknown_finish_word_after_text_fails_the_run_on_every_api_its_text_kept() {
    let word = "a_word_of_tomorrow";
    let cases: [(&str, String, ModelAt); 3] = [
        ("chat", chat_body(TEXT, word), chat_model),
        ("anthropic", anthropic_body(word), |uri| {
            Box::new(
                Anthropic::builder("claude-sonnet-4-5")
                    .base_url(uri)
                    .api_key("sk-ant-test")
                    .build()
                    .unwrap(),
            )
        }),
        ("responses", responses_body(word), |uri| {
            Box::new(
                OpenAiResponses::builder("m")
                    .base_url(uri)
                    .api_key("sk-test")
                    .build()
                    .unwrap(),
            )
        }),
    ];
    for (api, body, model) in cases {
        let (uri, _) = serve(vec![body]).await;
        let outcome = run(model(&uri)).await;
        assert_eq!(outcome.stop_reason, StopReason::Failed, "{api}");
        let (code, provider_code) = model_error(&outcome);
        assert_eq!(code, "model.other", "{api}");
        assert_eq!(provider_code.as_deref(), Some(word), "{api}");
        let message = outcome.error.as_ref().unwrap().to_string();
        assert!(message.contains(word), "{api}: {message}");
        assert_eq!(outcome.output.as_deref(), Some(TEXT), "{api}");
        let last = outcome.transcript.last().unwrap();
        assert_eq!(
            last.text(),
            TEXT,
            "{api}: the answer stays in the transcript"
        );
    }
}

#[tokio::test]
async fn the_words_servers_end_a_whole_answer_with_finish_the_run() {
    // TGI's end of sequence, Baidu Qianfan's and UCloud's whole answer, Cohere's own word.
    for word in ["eos_token", "normal", "COMPLETE", "eos"] {
        let (uri, _) = serve(vec![chat_body(TEXT, word)]).await;
        let outcome = run(chat_model(&uri)).await;
        assert_eq!(outcome.stop_reason, StopReason::Finished, "{word}");
        assert_eq!(outcome.output.as_deref(), Some(TEXT), "{word}");
    }
}

#[tokio::test]
async fn a_context_window_filled_is_a_cut_answer() {
    for word in ["model_length", "model_context_window_exceeded"] {
        let (uri, _) = serve(vec![chat_body(TEXT, word)]).await;
        let outcome = run(chat_model(&uri)).await;
        assert_eq!(outcome.stop_reason, StopReason::Truncated, "{word}");
        assert_eq!(model_error(&outcome).0, "model.truncated", "{word}");
        assert_eq!(outcome.output.as_deref(), Some(TEXT), "{word}");
    }
}

#[tokio::test]
async fn a_call_gemini_could_not_make_fails_the_run_its_text_never_the_output() {
    let (uri, _) = serve(vec![chat_body(TEXT, "MALFORMED_FUNCTION_CALL")]).await;
    let outcome = run(chat_model(&uri)).await;
    assert_eq!(outcome.stop_reason, StopReason::Failed);
    let (code, provider_code) = model_error(&outcome);
    assert_eq!(code, "model.server_error");
    assert_eq!(provider_code.as_deref(), Some("MALFORMED_FUNCTION_CALL"));
    assert_eq!(outcome.output, None);
}

#[tokio::test]
async fn vllms_repetition_stop_is_asked_again_and_never_the_answer() {
    let (uri, count) = serve(vec![
        chat_body(TEXT, "repetition"),
        chat_body("The whole answer.", "stop"),
    ])
    .await;
    let policy = RetryPolicy::attempts(3)
        .with_base_delay(Duration::from_millis(10))
        .with_jitter(0.0);
    let outcome = run(Retry::with_policy(chat_model(&uri), policy)).await;
    assert_eq!(outcome.stop_reason, StopReason::Finished);
    assert_eq!(outcome.output.as_deref(), Some("The whole answer."));
    assert_eq!(count.load(Ordering::SeqCst), 2);

    // Without a retry, the run fails with the server's error, the looping text never its output.
    let (uri, _) = serve(vec![chat_body(TEXT, "repetition")]).await;
    let outcome = run(chat_model(&uri)).await;
    assert_eq!(outcome.stop_reason, StopReason::Failed);
    let (code, provider_code) = model_error(&outcome);
    assert_eq!(code, "model.server_error");
    assert_eq!(provider_code.as_deref(), Some("repetition"));
    assert_eq!(outcome.output, None);
}
