//! Hostile event streams over raw loopback HTTP, on every provider: errors that quote the
//! request's key, final events whose response is not over, responses of very many tool calls,
//! escapes that split a character between two events, and lone halves of a character in what is
//! read whole (bodies, whole-text events, a plain-text dialect's JSON).
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::sync::Arc;
use std::time::Duration;

use agentloop::model::{FinishReason, ModelErrorKind};
use agentloop::{Model, ModelError, ModelResponse};
use agentloop_providers::OpenAiChat;
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::http::HttpConfig;
use agentloop_providers::openai_chat::{OpenAiChatBuilder, ToolDialect};
use agentloop_providers::openai_responses::OpenAiResponses;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

mod support;
use support::raw_http::read_request_with_head;

/// The key every model here sends (lowercase: the server reads the request's head lowercased).
const KEY: &str = "sk-stream-leak-0123456789abcdef";

async fn ask(model: &dyn Model) -> Result<ModelResponse, ModelError> {
    support::ask_within(model, Duration::from_secs(60)).await
}

/// A server answering each of `count` requests (one a connection) with a 200 whose content type
/// and body `reply` makes of the request's head.
async fn serve<F>(count: usize, reply: F) -> String
where
    F: Fn(&str) -> (&'static str, Vec<u8>) + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reply = Arc::new(reply);
    tokio::spawn(async move {
        for _ in 0..count {
            let (mut socket, _) = listener.accept().await.unwrap();
            let reply = reply.clone();
            tokio::spawn(async move {
                let Some((head, _)) = read_request_with_head(&mut socket).await else {
                    return;
                };
                let (content_type, body) = reply(&head);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                if socket.write_all(answer.as_bytes()).await.is_ok() {
                    let _ = socket.write_all(&body).await;
                    let _ = socket.flush().await;
                }
            });
        }
    });
    format!("http://{addr}")
}

/// An event stream of these data lines, as they are (their escapes untouched).
fn sse<S: AsRef<str>>(events: &[S]) -> Vec<u8> {
    events
        .iter()
        .map(|e| format!("data: {}\n\n", e.as_ref()))
        .collect::<String>()
        .into_bytes()
}

/// A server answering one request with this event stream.
async fn serve_sse<S: AsRef<str>>(events: &[S]) -> String {
    let body = sse(events);
    serve(1, move |_| ("text/event-stream", body.clone())).await
}

/// A server answering its requests, in order, with these whole JSON bodies, as they are (their
/// escapes untouched): the n-th request gets the n-th body.
async fn serve_json<S: AsRef<str>>(bodies: &[S]) -> String {
    let bodies: Vec<Vec<u8>> = bodies
        .iter()
        .map(|b| b.as_ref().as_bytes().to_vec())
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    serve(bodies.len(), move |_| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ("application/json", bodies[n].clone())
    })
    .await
}

fn config(uri: &str) -> HttpConfig {
    let mut config = HttpConfig::new(uri);
    config.idle_timeout = Duration::from_secs(30);
    config
}

fn chat(uri: &str, stream: bool) -> OpenAiChat {
    chat_builder(uri, stream).build().unwrap()
}

/// The builder of [`chat`], for a test that sets more (a tool dialect).
fn chat_builder(uri: &str, stream: bool) -> OpenAiChatBuilder {
    OpenAiChat::compatible("local", uri, "m")
        .http_config(config(uri))
        .api_key(KEY)
        .stream(stream)
}

fn anthropic(uri: &str, stream: bool) -> Anthropic {
    Anthropic::builder("claude-test")
        .http_config(config(uri))
        .api_key(KEY)
        .stream(stream)
        .build()
        .unwrap()
}

fn responses(uri: &str, stream: bool) -> OpenAiResponses {
    OpenAiResponses::builder("gpt-test")
        .http_config(config(uri))
        .api_key(KEY)
        .stream(stream)
        .build()
        .unwrap()
}

/// What a server that quotes the request's credentials puts in its error: the header lines that
/// carry the key (`authorization: bearer ...`, `x-api-key: ...`).
fn quoted_key(head: &str) -> String {
    let quoted: Vec<&str> = head
        .lines()
        .filter(|l| l.starts_with("authorization:") || l.starts_with("x-api-key:"))
        .collect();
    assert!(!quoted.is_empty(), "no key in {head}");
    quoted.join("; ")
}

#[tokio::test]
async fn an_error_streamed_or_sent_under_a_200_that_quotes_the_key_never_shows_it() {
    // The 401 path has always cut the key out of what the server says; an error event in the
    // stream, or an error body under a 200, is the server's text as much, and must be cut the
    // same: in every field of the error, on every provider.
    let chat_error = |q: &str| {
        json!({"error": {"message": format!("invalid key: {q}"), "type": "invalid_request_error",
            "code": q, "param": q}})
        .to_string()
    };
    let anthropic_error = |q: &str| {
        json!({"type": "error", "error": {"type": "authentication_error",
            "message": format!("invalid key: {q}")}, "request_id": q})
        .to_string()
    };
    let responses_error = |q: &str| {
        json!({"type": "error", "code": q, "message": format!("invalid key: {q}"), "param": q})
            .to_string()
    };
    let responses_failed = |q: &str| {
        json!({"type": "response.failed", "response": {"status": "failed",
            "error": {"code": q, "message": format!("invalid key: {q}")}}})
        .to_string()
    };
    let mut models: Vec<(&str, Box<dyn Model>)> = Vec::new();
    let uri = serve(1, move |head| {
        let first = r#"{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}"#;
        let error = chat_error(&quoted_key(head));
        ("text/event-stream", sse(&[first, &error]))
    })
    .await;
    models.push(("chat, streamed", Box::new(chat(&uri, true))));
    let uri = serve(1, move |head| {
        (
            "application/json",
            chat_error(&quoted_key(head)).into_bytes(),
        )
    })
    .await;
    models.push(("chat, whole", Box::new(chat(&uri, false))));
    let uri = serve(1, move |head| {
        let start = r#"{"type":"message_start","message":{"id":"m"}}"#;
        let error = anthropic_error(&quoted_key(head));
        ("text/event-stream", sse(&[start, &error]))
    })
    .await;
    models.push(("anthropic, streamed", Box::new(anthropic(&uri, true))));
    let uri = serve(1, move |head| {
        (
            "application/json",
            anthropic_error(&quoted_key(head)).into_bytes(),
        )
    })
    .await;
    models.push(("anthropic, whole", Box::new(anthropic(&uri, false))));
    let uri = serve(1, move |head| {
        let error = responses_error(&quoted_key(head));
        ("text/event-stream", sse(&[&error]))
    })
    .await;
    models.push(("responses, error event", Box::new(responses(&uri, true))));
    let uri = serve(1, move |head| {
        let failed = responses_failed(&quoted_key(head));
        ("text/event-stream", sse(&[&failed]))
    })
    .await;
    models.push(("responses, failed", Box::new(responses(&uri, true))));
    for (what, model) in &models {
        let err = ask(model.as_ref()).await.unwrap_err();
        let shown = format!("{err}\n{err:?}\n{}", serde_json::to_string(&err).unwrap());
        assert!(!shown.contains(KEY), "{what}: {shown}");
        // The server did quote it: the message says where, with the key cut out.
        assert!(err.message.contains("[redacted]"), "{what}: {shown}");
    }
}

#[tokio::test]
async fn a_final_event_whose_response_is_not_done_is_an_error_not_an_answer() {
    // `response.completed` carrying a response that failed, was cancelled, or is still queued or
    // in progress: none of them is an answer, so none may end as one (finish reason `Other`).
    let completed = |status: &str, error: Value| {
        json!({"type": "response.completed", "response": {"id": "r", "status": status,
            "error": error}})
        .to_string()
    };
    let text = r#"{"type":"response.output_text.delta","output_index":0,"delta":"partial"}"#;
    let failed = json!({"code": "server_error", "message": "the model crashed"});
    let cases = [
        (
            "failed",
            failed.clone(),
            ModelErrorKind::Server,
            "the model crashed",
        ),
        (
            "cancelled",
            Value::Null,
            ModelErrorKind::Other,
            "the response was cancelled",
        ),
        (
            "queued",
            Value::Null,
            ModelErrorKind::Stream,
            "\"queued\", which is not an end",
        ),
        (
            "in_progress",
            Value::Null,
            ModelErrorKind::Stream,
            "\"in_progress\", which is not an end",
        ),
    ];
    for (status, error, kind, message) in cases {
        let uri = serve_sse(&[text, &completed(status, error.clone())]).await;
        let err = ask(&responses(&uri, true)).await.unwrap_err();
        assert_eq!(err.kind, kind, "{status}: {err}");
        assert!(err.message.contains(message), "{status}: {err}");
        // A whole body with that status is no answer either.
        let body =
            json!({"id": "r", "status": status, "error": error, "output": [{"type": "message",
            "content": [{"type": "output_text", "text": "partial"}]}]})
            .to_string();
        let uri = serve(1, move |_| ("application/json", body.clone().into_bytes())).await;
        let err = ask(&responses(&uri, false)).await.unwrap_err();
        let whole_kind = if kind == ModelErrorKind::Stream {
            ModelErrorKind::Decode
        } else {
            kind
        };
        assert_eq!(err.kind, whole_kind, "{status}, whole: {err}");
        assert!(err.message.contains(message), "{status}, whole: {err}");
    }
    // The statuses that end a response still do.
    let uri = serve_sse(&[text, &completed("completed", Value::Null)]).await;
    let r = ask(&responses(&uri, true)).await.unwrap();
    assert_eq!(
        (r.message.text.as_str(), r.finish_reason),
        ("partial", FinishReason::Stop)
    );
}
/// As many calls as a response is tested with: enough that finding each delta's call by a scan
/// of every call (n² steps: 10¹⁰ here) holds the call past its hang guard (`ask`), while reading
/// them once takes seconds even in a debug build. Nothing is timed on the way.
const MANY: u32 = 100_000;

fn assert_many_calls(r: &ModelResponse, what: &str) {
    assert_eq!(r.message.tool_calls.len(), MANY as usize, "{what}");
    for (n, call) in (0..MANY).zip(&r.message.tool_calls) {
        assert_eq!(*call.call_id, format!("call_{n}"), "{what}");
        assert_eq!(call.arguments, format!(r#"{{"n":{n}}}"#), "{what}");
    }
    assert_eq!(r.finish_reason, FinishReason::ToolCalls, "{what}");
}

#[tokio::test]
async fn a_response_of_very_many_tool_calls_is_read_in_one_pass() {
    // A server streaming a hundred thousand calls, each opened by one event and continued by
    // another: each delta finds its call by its index or id, not by a scan of every call, in
    // the decoder and in the accumulator.
    let mut chat_events = Vec::new();
    let mut anthropic_events = vec![r#"{"type":"message_start","message":{"id":"m"}}"#.to_owned()];
    let mut responses_events = Vec::new();
    for n in 0..MANY {
        chat_events.extend([
            format!(
                r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":{n},"id":"call_{n}","type":"function","function":{{"name":"f","arguments":""}}}}]}}}}]}}"#
            ),
            format!(
                r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":{n},"function":{{"arguments":"{{\"n\":{n}}}"}}}}]}}}}]}}"#
            ),
        ]);
        anthropic_events.extend([
            format!(
                r#"{{"type":"content_block_start","index":{n},"content_block":{{"type":"tool_use","id":"call_{n}","name":"f","input":{{}}}}}}"#
            ),
            format!(
                r#"{{"type":"content_block_delta","index":{n},"delta":{{"type":"input_json_delta","partial_json":"{{\"n\":{n}}}"}}}}"#
            ),
            format!(r#"{{"type":"content_block_stop","index":{n}}}"#),
        ]);
        responses_events.extend([
            format!(
                r#"{{"type":"response.output_item.added","output_index":{n},"item":{{"type":"function_call","call_id":"call_{n}","name":"f","arguments":""}}}}"#
            ),
            format!(
                r#"{{"type":"response.function_call_arguments.delta","output_index":{n},"delta":"{{\"n\":{n}}}"}}"#
            ),
        ]);
    }
    chat_events.extend([
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.to_owned(),
        "[DONE]".to_owned(),
    ]);
    anthropic_events.extend([
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#.to_owned(),
        r#"{"type":"message_stop"}"#.to_owned(),
    ]);
    responses_events
        .push(r#"{"type":"response.completed","response":{"status":"completed"}}"#.to_owned());
    let r = ask(&chat(&serve_sse(&chat_events).await, true))
        .await
        .unwrap();
    assert_many_calls(&r, "chat");
    let r = ask(&anthropic(&serve_sse(&anthropic_events).await, true))
        .await
        .unwrap();
    assert_many_calls(&r, "anthropic");
    let r = ask(&responses(&serve_sse(&responses_events).await, true))
        .await
        .unwrap();
    assert_many_calls(&r, "responses");
}

/// The arguments the split escapes below spell: the character split between two events'
/// escapes (`raw`), and split between two events' text of the arguments' own escapes
/// (`escaped`).
fn smiles() -> Value {
    json!({"raw": "\u{1F600}", "escaped": "\u{1F600}"})
}

fn assert_smiles(r: &ModelResponse, what: &str) {
    assert_eq!(r.message.text, "smile \u{1F600}!", "{what}");
    assert_eq!(r.message.reasoning[0].text, "r\u{1F600}", "{what}");
    assert_eq!(r.message.tool_calls.len(), 1, "{what}");
    let arguments: Value = serde_json::from_str(&r.message.tool_calls[0].arguments)
        .unwrap_or_else(|e| panic!("{what}: {e}: {}", r.message.tool_calls[0].arguments));
    assert_eq!(arguments, smiles(), "{what}");
}

#[tokio::test]
async fn a_character_whose_escape_is_split_between_two_events_comes_out_whole() {
    // A gateway that cuts its deltas by UTF-16 code units ends one event with `\ud83d` and
    // begins the next with `\ude00`: neither event alone is a UTF-8 string, and the text, the
    // reasoning and a call's arguments must each come out with U+1F600, not fail or lose it.
    let chat_events = [
        r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"smile \ud83d","reasoning_content":"r\ud83d"}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"content":"\ude00!","reasoning_content":"\ude00"}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"raw\":\"\ud83d"}}]}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\ude00\",\"escaped\":\"\\ud83d"}}]}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\\ude00\"}"}}]},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ];
    let r = ask(&chat(&serve_sse(&chat_events).await, true))
        .await
        .unwrap();
    assert_smiles(&r, "chat");

    let anthropic_events = [
        r#"{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":1,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"r\ud83d"}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"\ude00"}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"smile \ud83d"}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"\ude00!"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}}}"#,
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"raw\":\"\ud83d"}}"#,
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\ude00\",\"escaped\":\"\\ud83d"}}"#,
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\\ude00\"}"}}"#,
        r#"{"type":"content_block_stop","index":2}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let r = ask(&anthropic(&serve_sse(&anthropic_events).await, true))
        .await
        .unwrap();
    assert_smiles(&r, "anthropic");

    let responses_events = [
        r#"{"type":"response.created","response":{"id":"r","model":"g"}}"#,
        r#"{"type":"response.reasoning_summary_text.delta","output_index":0,"delta":"r\ud83d"}"#,
        r#"{"type":"response.reasoning_summary_text.delta","output_index":0,"delta":"\ude00"}"#,
        r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","summary":[]}}"#,
        r#"{"type":"response.output_text.delta","output_index":1,"delta":"smile \ud83d"}"#,
        r#"{"type":"response.output_text.delta","output_index":1,"delta":"\ude00!"}"#,
        r#"{"type":"response.output_item.added","output_index":2,"item":{"type":"function_call","call_id":"c1","name":"f","arguments":""}}"#,
        r#"{"type":"response.function_call_arguments.delta","output_index":2,"delta":"{\"raw\":\"\ud83d"}"#,
        r#"{"type":"response.function_call_arguments.delta","output_index":2,"delta":"\ude00\",\"escaped\":\"\\ud83d"}"#,
        r#"{"type":"response.function_call_arguments.delta","output_index":2,"delta":"\\ude00\"}"}"#,
        r#"{"type":"response.completed","response":{"status":"completed"}}"#,
    ];
    let r = ask(&responses(&serve_sse(&responses_events).await, true))
        .await
        .unwrap();
    assert_smiles(&r, "responses");
}

#[tokio::test]
async fn a_split_character_comes_out_whole_when_its_event_holds_a_lone_half_elsewhere() {
    // The chunks that end a delta with `\ud83d` also hold a lone half in a field read whole
    // (the id and the model, which Chat servers repeat in every chunk; a call's name): that
    // half is U+FFFD, and the split one still joins the next chunk's `\ude00` into U+1F600.
    let chat_events = [
        r#"{"id":"c\ud800","model":"m\udc00","choices":[{"index":0,"delta":{"role":"assistant","content":"smile \ud83d","reasoning_content":"r\ud83d"}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"content":"\ude00!","reasoning_content":"\ude00"}}]}"#,
        r#"{"id":"c\ud800","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"raw\":\"\ud83d"}}]}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\ude00\",\"escaped\":\"\\ud83d"}}]}}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\\ude00\"}"}}]},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ];
    let r = ask(&chat(&serve_sse(&chat_events).await, true))
        .await
        .unwrap();
    assert_smiles(&r, "chat");
    assert_eq!(r.id.as_deref(), Some("c\u{fffd}"));
    assert_eq!(r.model.as_deref(), Some("m\u{fffd}"));
}

#[tokio::test]
async fn a_half_character_the_stream_never_completes_is_a_replacement_character() {
    // The stream ends (or the block does) with a high surrogate whose low half never comes, or
    // a delta opens with a low half no high one came before: each is U+FFFD, never an error.
    let cases: [(&str, Box<dyn Model>); 3] = [
        (
            "chat",
            Box::new(chat(
                &serve_sse(&[
                    r#"{"id":"c","choices":[{"index":0,"delta":{"content":"\ude00end \ud83d"}}]}"#,
                    r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                    "[DONE]",
                ])
                .await,
                true,
            )),
        ),
        (
            "anthropic",
            Box::new(anthropic(
                &serve_sse(&[
                    r#"{"type":"message_start","message":{"id":"m"}}"#,
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\ude00end \ud83d"}}"#,
                    r#"{"type":"content_block_stop","index":0}"#,
                    r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#,
                    r#"{"type":"message_stop"}"#,
                ])
                .await,
                true,
            )),
        ),
        (
            "responses",
            Box::new(responses(
                &serve_sse(&[
                    r#"{"type":"response.output_text.delta","output_index":0,"delta":"\ude00end \ud83d"}"#,
                    r#"{"type":"response.completed","response":{"status":"completed"}}"#,
                ])
                .await,
                true,
            )),
        ),
    ];
    for (what, model) in cases {
        let r = ask(model.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.message.text, "\u{fffd}end \u{fffd}", "{what}");
        assert_eq!(r.finish_reason, FinishReason::Stop, "{what}");
    }
}

/// The text every lone-half case below spells: a lone high half, an escaped backslash before
/// `ud83d` (text, no escape), and a pair.
const LONE_TEXT: &str = "smile \u{fffd}! \\ud83d \u{1F600}";

/// The arguments of the lone-half cases: a lone high half, a pair, a lone low half, and (where
/// the arguments are JSON text inside a string) a pair spelt by the arguments' own escapes.
fn lone_arguments(escaped: &str) -> Value {
    json!({"raw": "\u{fffd}", "pair": "\u{1F600}", "low": "\u{fffd}x", "escaped": escaped})
}

fn assert_lone(r: &ModelResponse, id: &str, escaped: &str, what: &str) {
    assert_eq!(r.message.text, LONE_TEXT, "{what}");
    assert_eq!(r.message.reasoning[0].text, "r\u{fffd}", "{what}");
    assert_eq!(r.id.as_deref(), Some(id), "{what}");
    assert_eq!(r.message.tool_calls.len(), 1, "{what}");
    let arguments: Value = serde_json::from_str(&r.message.tool_calls[0].arguments)
        .unwrap_or_else(|e| panic!("{what}: {e}: {}", r.message.tool_calls[0].arguments));
    assert_eq!(arguments, lone_arguments(escaped), "{what}");
    assert_eq!(r.finish_reason, FinishReason::ToolCalls, "{what}");
}

/// The arguments as JSON text inside a JSON string (Chat, Responses): the arguments' own escape
/// of a pair is `\\ud83d\\ude00` in the body.
const LONE_ARGUMENTS_TEXT: &str = r#""{\"raw\":\"\ud83d\",\"pair\":\"\ud83d\ude00\",\"low\":\"\ude00x\",\"escaped\":\"\\ud83d\\ude00\"}""#;

#[tokio::test]
async fn a_lone_surrogate_in_a_whole_body_is_a_replacement_character_on_every_api() {
    // A body whose text, reasoning, tool-call arguments and id each hold half a character (a
    // model cut at its limit, a server that slices UTF-16): serde_json refuses such a string,
    // and the whole answer failed for one character. Each half is U+FFFD; a pair, and an
    // escaped backslash before `ud83d`, are kept as they were.
    let text = r#""smile \ud83d! \\ud83d \ud83d\ude00""#;
    let chat_body = format!(
        r#"{{"id":"chat\ud83d","model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":{text},"reasoning_content":"r\ude00","tool_calls":[{{"id":"call_1","type":"function","function":{{"name":"f","arguments":{LONE_ARGUMENTS_TEXT}}}}}]}},"finish_reason":"tool_calls"}}]}}"#
    );
    let r = ask(&chat(&serve_json(&[chat_body]).await, false))
        .await
        .unwrap();
    assert_lone(&r, "chat\u{fffd}", "\u{1F600}", "chat");

    // Mistral's typed content parts are read through a JSON tree, not as a delta string.
    let parts_body = r#"{"id":"p","choices":[{"index":0,"message":{"role":"assistant","content":[{"type":"thinking","thinking":[{"type":"text","text":"r\ude00"}]},{"type":"text","text":"smile \ud83d! \\ud83d \ud83d\ude00"}]},"finish_reason":"stop"}]}"#;
    let r = ask(&chat(&serve_json(&[parts_body]).await, false))
        .await
        .unwrap();
    assert_eq!(r.message.text, LONE_TEXT, "chat parts");
    assert_eq!(r.message.reasoning[0].text, "r\u{fffd}", "chat parts");

    let responses_body = format!(
        r#"{{"id":"resp\ude00","model":"g","status":"completed","output":[{{"type":"reasoning","id":"rs","summary":[{{"type":"summary_text","text":"r\ude00"}}]}},{{"type":"message","id":"msg","role":"assistant","content":[{{"type":"output_text","text":{text}}}]}},{{"type":"function_call","id":"fc","call_id":"c1","name":"f","arguments":{LONE_ARGUMENTS_TEXT}}}]}}"#
    );
    let r = ask(&responses(&serve_json(&[responses_body]).await, false))
        .await
        .unwrap();
    assert_lone(&r, "resp\u{fffd}", "\u{1F600}", "responses");

    // Anthropic's input is an object: the body's `\\ud83d` in it is text, not an escape.
    let anthropic_body = format!(
        r#"{{"id":"msg\ud83d","type":"message","role":"assistant","model":"c","content":[{{"type":"thinking","thinking":"r\ude00","signature":"sig"}},{{"type":"text","text":{text}}},{{"type":"tool_use","id":"t1","name":"f","input":{{"raw":"\ud83d","pair":"\ud83d\ude00","low":"\ude00x","escaped":"\\ud83d\\ude00"}}}}],"stop_reason":"tool_use","usage":{{"input_tokens":1,"output_tokens":1}}}}"#
    );
    let r = ask(&anthropic(&serve_json(&[anthropic_body]).await, false))
        .await
        .unwrap();
    assert_lone(&r, "msg\u{fffd}", "\\ud83d\\ude00", "anthropic");
}

#[tokio::test]
async fn a_lone_surrogate_in_a_field_a_stream_carries_whole_is_a_replacement_character() {
    // The events that carry a whole string rather than a delta: the Responses stream's `*.done`
    // events and its final response, Anthropic's block starts with their text or input, a Chat
    // chunk's id and typed parts. A half in any of them fails the stream no more than a half
    // in a delta does.
    let chat_events = [
        r#"{"id":"c\ud83d","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":[{"type":"thinking","thinking":"r\ude00"},{"type":"text","text":"smile \ud83d! \\ud83d \ud83d\ude00"}]}}]}"#,
        &format!(
            r#"{{"id":"c\ud83d","choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"id":"call_1","type":"function","function":{{"name":"f","arguments":{LONE_ARGUMENTS_TEXT}}}}}]}},"finish_reason":"tool_calls"}}]}}"#
        ),
        "[DONE]",
    ];
    let r = ask(&chat(&serve_sse(&chat_events).await, true))
        .await
        .unwrap();
    assert_lone(&r, "c\u{fffd}", "\u{1F600}", "chat");

    let anthropic_events = [
        r#"{"type":"message_start","message":{"id":"msg\ud83d","model":"c","usage":{"input_tokens":1,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"r\ude00"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":"smile \ud83d! \\ud83d \ud83d\ude00"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{"raw":"\ud83d","pair":"\ud83d\ude00","low":"\ude00x","escaped":"\\ud83d\\ude00"}}}"#,
        r#"{"type":"content_block_stop","index":2}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let r = ask(&anthropic(&serve_sse(&anthropic_events).await, true))
        .await
        .unwrap();
    assert_lone(&r, "msg\u{fffd}", "\\ud83d\\ude00", "anthropic");

    let text = r#""smile \ud83d! \\ud83d \ud83d\ude00""#;
    let responses_events = [
        r#"{"type":"response.created","response":{"id":"resp\ude00","model":"g","status":"in_progress","output":[]}}"#,
        r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"r\ude00"}]}}"#,
        &format!(
            r#"{{"type":"response.output_text.done","output_index":1,"content_index":0,"text":{text}}}"#
        ),
        &format!(
            r#"{{"type":"response.output_item.done","output_index":1,"item":{{"type":"message","id":"msg","role":"assistant","content":[{{"type":"output_text","text":{text}}}]}}}}"#
        ),
        r#"{"type":"response.output_item.added","output_index":2,"item":{"type":"function_call","id":"fc","call_id":"c1","name":"f","arguments":""}}"#,
        &format!(
            r#"{{"type":"response.function_call_arguments.done","output_index":2,"arguments":{LONE_ARGUMENTS_TEXT}}}"#
        ),
        &format!(
            r#"{{"type":"response.output_item.done","output_index":2,"item":{{"type":"function_call","id":"fc","call_id":"c1","name":"f","arguments":{LONE_ARGUMENTS_TEXT}}}}}"#
        ),
        &format!(
            r#"{{"type":"response.completed","response":{{"id":"resp\ude00","status":"completed","output":[{{"type":"message","id":"msg","role":"assistant","content":[{{"type":"output_text","text":{text}}}]}}]}}}}"#
        ),
    ];
    let r = ask(&responses(&serve_sse(&responses_events).await, true))
        .await
        .unwrap();
    assert_lone(&r, "resp\u{fffd}", "\u{1F600}", "responses");
}

/// What [`echo`] was called with, by the runs below.
static ECHOED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Says the text back.
#[agentloop::tool]
async fn echo(
    /// The text.
    text: String,
) -> String {
    ECHOED.lock().unwrap().push(text.clone());
    text
}

#[tokio::test]
async fn a_call_whose_arguments_hold_a_lone_surrogate_still_runs_on_every_api() {
    // The model's call runs with U+FFFD where the half was (the character was lost before the
    // text reached the client), and the run goes on to its answer: on each API's whole body,
    // and in a plain-text dialect whose JSON the model wrote with the half as its own escape.
    let chat_call = r#"{"id":"c\ud83d","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"echo","arguments":"{\"text\":\"a\ud83db\ud83d\ude00\"}"}}]},"finish_reason":"tool_calls"}]}"#;
    let chat_done = r#"{"id":"c2","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}]}"#;
    let hermes_call = r#"{"id":"h","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"<tool_call>{\"name\": \"echo\", \"arguments\": {\"text\": \"a\\ud83db\\ud83d\\ude00\"}}</tool_call>"},"finish_reason":"stop"}]}"#;
    let responses_call = r#"{"id":"r","model":"g","status":"completed","output":[{"type":"function_call","id":"fc","call_id":"c1","name":"echo","arguments":"{\"text\":\"a\ud83db\ud83d\ude00\"}"}]}"#;
    let responses_done = r#"{"id":"r2","model":"g","status":"completed","output":[{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"done"}]}]}"#;
    let anthropic_call = r#"{"id":"m","type":"message","role":"assistant","model":"c","content":[{"type":"tool_use","id":"t1","name":"echo","input":{"text":"a\ud83db\ud83d\ude00"}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}"#;
    let anthropic_done = r#"{"id":"m2","type":"message","role":"assistant","model":"c","content":[{"type":"text","text":"done"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}"#;
    let models: [(&str, Box<dyn Model>); 4] = [
        (
            "chat",
            Box::new(chat(&serve_json(&[chat_call, chat_done]).await, false)),
        ),
        (
            "chat hermes",
            Box::new(
                chat_builder(&serve_json(&[hermes_call, chat_done]).await, false)
                    .tool_dialect(ToolDialect::Hermes)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "responses",
            Box::new(responses(
                &serve_json(&[responses_call, responses_done]).await,
                false,
            )),
        ),
        (
            "anthropic",
            Box::new(anthropic(
                &serve_json(&[anthropic_call, anthropic_done]).await,
                false,
            )),
        ),
    ];
    for (what, model) in models {
        let agent = agentloop::Agent::builder()
            .model(model)
            .tool(echo_tool())
            .build()
            .unwrap();
        let outcome = agent.run("say it").await;
        assert!(outcome.error.is_none(), "{what}: {:?}", outcome.error);
        assert_eq!(outcome.tool_calls_run, 1, "{what}");
        assert_eq!(outcome.output.as_deref(), Some("done"), "{what}");
        let echoed = ECHOED.lock().unwrap().pop();
        assert_eq!(
            echoed.as_deref(),
            Some("a\u{fffd}b\u{1F600}"),
            "{what}: the tool ran with what the model wrote, the half replaced"
        );
    }
}

#[tokio::test]
async fn an_answer_that_finishes_for_tool_calls_without_any_is_an_error_on_every_api() {
    // A gateway that relays a server whose parser read no call (vLLM's finish_reason
    // "tool_calls" beside `"tool_calls": []`) in Anthropic's shape says `stop_reason: tool_use`
    // with no tool_use block, after thinking alone. No call and no text: read as it is, it was an
    // empty final answer that ended the run as a success.
    let anthropic_events = [
        r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"c","usage":{"input_tokens":5,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"I should call get_weather."}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let chat_events = [
        r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"reasoning_content":"I should call get_weather."}}]}"#,
        r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"\n\n","tool_calls":[]},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ];
    let models: [(&str, Box<dyn Model>); 2] = [
        (
            "anthropic",
            Box::new(anthropic(&serve_sse(&anthropic_events).await, true)),
        ),
        ("chat", Box::new(chat(&serve_sse(&chat_events).await, true))),
    ];
    for (what, model) in models {
        let err = ask(model.as_ref()).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream, "{what}: {err}");
        assert!(err.message.contains("no tool call"), "{what}: {err}");
        assert!(!err.is_retryable(), "{what}: {err}");
    }
}

/// How many times [`clock`] ran.
static TICKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Says the time.
#[agentloop::tool]
async fn clock() -> String {
    TICKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    "noon".to_owned()
}

#[tokio::test]
async fn a_call_of_a_tool_without_parameters_whose_arguments_are_null_runs() {
    // Cohere's compatible API and some local servers write `"null"` as the arguments of a tool
    // that takes none (vercel/ai#4755, Kilo-Org/kilocode#4815): no object schema takes null,
    // so every call of such a tool was refused as invalid. Null arguments are no arguments.
    let call = |arguments: &str| {
        format!(
            r#"{{"id":"c","model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_1","type":"function","function":{{"name":"clock","arguments":{arguments}}}}}]}},"finish_reason":"tool_calls"}}]}}"#
        )
    };
    let done = r#"{"id":"c2","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}]}"#;
    for arguments in [r#""null""#, r#"" null ""#] {
        let uri = serve_json(&[call(arguments).as_str(), done]).await;
        let agent = agentloop::Agent::builder()
            .model(chat(&uri, false))
            .tool(clock_tool())
            .build()
            .unwrap();
        let before = TICKS.load(std::sync::atomic::Ordering::SeqCst);
        let outcome = agent.run("what time is it").await;
        assert!(outcome.error.is_none(), "{arguments}: {:?}", outcome.error);
        assert_eq!(outcome.tool_calls_run, 1, "{arguments}");
        assert_eq!(outcome.output.as_deref(), Some("done"), "{arguments}");
        assert_eq!(
            TICKS.load(std::sync::atomic::Ordering::SeqCst),
            before + 1,
            "{arguments}: the tool ran"
        );
    }
}

#[tokio::test]
async fn an_error_whose_message_holds_a_lone_surrogate_keeps_its_kind_and_message() {
    // An error object under a 200 (a gateway's envelope, an error event mid-stream) whose
    // message holds half a character: read strictly it is no error object at all, and the
    // rate limit became an unretried "malformed" failure without its message.
    let envelope =
        r#"{"error":{"message":"slow \ud83d down","type":"rate_limit_error","code":429}}"#;
    let error_event =
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow \ud83d down"}}"#;
    let models: [(&str, Box<dyn Model>); 4] = [
        (
            "chat",
            Box::new(chat(&serve_json(&[envelope]).await, false)),
        ),
        (
            "anthropic",
            Box::new(anthropic(&serve_json(&[envelope]).await, false)),
        ),
        (
            "anthropic stream",
            Box::new(anthropic(&serve_sse(&[error_event]).await, true)),
        ),
        (
            "responses",
            Box::new(responses(&serve_json(&[envelope]).await, false)),
        ),
    ];
    for (what, model) in models {
        let err = ask(model.as_ref()).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::RateLimited, "{what}: {err}");
        assert_eq!(err.message, "slow \u{fffd} down", "{what}");
    }
}
