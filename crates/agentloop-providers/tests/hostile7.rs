//! A red team of servers that misbehave at the byte level, over raw loopback TCP, on every
//! provider: streams cut a byte a write with every line end, heads that never come or come a byte
//! at a time, bodies cut short or reset, HTTP framing that lies, redirects in a loop, waits asked
//! for that no client should honour, and event streams whose content is semantically hostile.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::time::{Duration, Instant};

use agentloop::model::{FinishReason, ModelErrorKind};
use agentloop::{Model, ModelError, ModelResponse};
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::http::HttpConfig;
use agentloop_providers::openai_responses::OpenAiResponses;
use agentloop_providers::{OpenAiChat, Retry, RetryPolicy};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

mod support;
use support::ask_within;
use support::raw_http::serve_each;

/// What a server does, step by step, after it has read the request.
#[derive(Clone)]
enum Step {
    /// Writes these bytes in one write.
    Write(Vec<u8>),
    /// Writes these bytes one a write, waiting this long after each.
    Drip(Vec<u8>, Duration),
    /// Writes this byte, then waits, for ever (until the client leaves).
    DripForever(u8, Duration),
    /// Resets the connection (an RST, not a clean close).
    Reset,
    /// Keeps the connection open, saying nothing, until the client leaves.
    Hold,
}

async fn play(mut socket: TcpStream, steps: Vec<Step>) {
    let _ = socket.set_nodelay(true);
    for step in steps {
        match step {
            Step::Write(bytes) => {
                if socket.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Step::Drip(bytes, every) => {
                for b in bytes {
                    if socket.write_all(&[b]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            }
            Step::DripForever(b, every) => loop {
                if socket.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(every).await;
            },
            Step::Reset => {
                // A zero linger makes the close an RST.
                #[allow(deprecated)]
                let _ = socket.set_linger(Some(Duration::ZERO));
                drop(socket);
                return;
            }
            Step::Hold => {
                let mut byte = [0u8; 1];
                let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut byte).await;
                return;
            }
        }
    }
    let _ = socket.flush().await;
}

/// A server answering every request with these steps: its address, and how many it read.
async fn serve(steps: Vec<Step>) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    serve_each(move |socket, _| play(socket, steps.clone())).await
}

/// A 200 head of this content type, its body read to the connection's close.
fn head(content_type: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\nconnection: close\r\n\r\n")
        .into_bytes()
}

fn config(uri: &str) -> HttpConfig {
    let mut config = HttpConfig::new(uri);
    config.idle_timeout = Duration::from_secs(1);
    config.keepalive_timeout = Duration::from_secs(2);
    config.max_event_bytes = 64 * 1024;
    config.max_response_bytes = 1024 * 1024;
    config.max_stream_bytes = 64 * 1024 * 1024;
    config
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Api {
    Chat,
    Anthropic,
    Responses,
}

const APIS: [Api; 3] = [Api::Chat, Api::Anthropic, Api::Responses];

fn model(api: Api, uri: &str, stream: bool) -> Box<dyn Model> {
    model_of(api, config(uri), stream)
}

fn model_of(api: Api, config: HttpConfig, stream: bool) -> Box<dyn Model> {
    let uri = config.base_url.clone();
    let uri = uri.as_str();
    match api {
        Api::Chat => Box::new(
            OpenAiChat::compatible("local", uri, "m")
                .http_config(config)
                .api_key("sk-hostile7-secret")
                .stream(stream)
                .build()
                .unwrap(),
        ),
        Api::Anthropic => Box::new(
            Anthropic::builder("claude-test")
                .http_config(config)
                .api_key("sk-hostile7-secret")
                .stream(stream)
                .build()
                .unwrap(),
        ),
        Api::Responses => Box::new(
            OpenAiResponses::builder("gpt-test")
                .http_config(config)
                .api_key("sk-hostile7-secret")
                .stream(stream)
                .build()
                .unwrap(),
        ),
    }
}

async fn ask(model: &dyn Model) -> Result<ModelResponse, ModelError> {
    ask_within(model, Duration::from_secs(30)).await
}

fn fixture(file: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{file}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// The data of each event of a recorded stream, in order.
fn data_of(recorded: &str) -> Vec<String> {
    recorded
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim_start().to_owned())
        .collect()
}

fn recorded(api: Api) -> Vec<String> {
    match api {
        Api::Chat => {
            let mut data = data_of(&fixture("openai_chat/oai_chat_s_single_tool.sse"));
            // Text of multi-byte characters, for cuts inside a character.
            data.insert(
                1,
                r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"héllo ☃ 😀 ✓"}}]}"#.to_owned(),
            );
            data
        }
        Api::Anthropic => data_of(&fixture("anthropic/anth_s_tool_use.sse")),
        Api::Responses => data_of(&fixture("openai_responses/resp_s_function_call.sse")),
    }
}

fn parse(api: Api, bytes: &[u8]) -> Result<ModelResponse, ModelError> {
    match api {
        Api::Chat => agentloop_providers::openai_chat::parse_stream_bytes(bytes),
        Api::Anthropic => agentloop_providers::anthropic::parse_stream_bytes(bytes),
        Api::Responses => agentloop_providers::openai_responses::parse_stream_bytes(bytes),
    }
}

/// The events as a server that uses every corner of the format sends them: a byte-order mark,
/// these line ends, comments, `id:` and `retry:` fields, an unknown field, `data:` with and
/// without its space, and each JSON document split over two `data:` lines.
fn dressed(data: &[String], eol: &str) -> Vec<u8> {
    let mut out = String::from("\u{feff}");
    for (n, d) in data.iter().enumerate() {
        out.push_str(&format!(
            ": keepalive {n}{eol}id: {n}{eol}retry: 10{eol}x-unknown: y{eol}"
        ));
        let space = if n % 2 == 0 { " " } else { "" };
        // `[DONE]` is one line: split, it would be two words.
        match d.strip_prefix('{') {
            Some(rest) => out.push_str(&format!("data:{space}{{{eol}data:{space}{rest}{eol}{eol}")),
            None => out.push_str(&format!("data:{space}{d}{eol}{eol}")),
        }
    }
    out.into_bytes()
}

#[tokio::test]
async fn hostile7_a_stream_cut_a_byte_a_write_in_every_line_end_reads_as_the_recording() {
    let mut checks = Vec::new();
    for api in APIS {
        let data = recorded(api);
        let plain: String = data.iter().map(|d| format!("data: {d}\n\n")).collect();
        let expected = parse(api, plain.as_bytes()).unwrap();
        assert!(expected.message.text.len() + expected.message.tool_calls.len() > 0);
        for eol in ["\r\n", "\r", "\n"] {
            let body = dressed(&data, eol);
            let expected = expected.clone();
            checks.push(async move {
                let (uri, _) = serve(vec![
                    Step::Write(head("text/event-stream")),
                    Step::Drip(body, Duration::from_micros(300)),
                ])
                .await;
                // A byte a millisecond or so: an event of a kilobyte takes a second or more
                // on a busy machine, which the quick timeouts of the other tests do not allow.
                let mut config = config(&uri);
                config.idle_timeout = Duration::from_secs(10);
                config.keepalive_timeout = Duration::from_secs(30);
                let got = ask(model_of(api, config, true).as_ref())
                    .await
                    .unwrap_or_else(|e| panic!("{api:?} {eol:?}: {e}"));
                assert_eq!(got.message, expected.message, "{api:?} {eol:?}");
                assert_eq!(got.finish_reason, expected.finish_reason, "{api:?} {eol:?}");
            });
        }
    }
    futures::future::join_all(checks).await;
}

/// The events of a stream that says nothing a hundred thousand times before its answer.
fn empty_deltas(api: Api, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut push = |s: &str| out.extend_from_slice(format!("data: {s}\n\n").as_bytes());
    match api {
        Api::Chat => {
            push(r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#);
            for _ in 0..n {
                push(r#"{"id":"c","choices":[{"index":0,"delta":{"content":""}}]}"#);
            }
            push(
                r#"{"id":"c","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}"#,
            );
            push("[DONE]");
        }
        Api::Anthropic => {
            push(
                r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"c","usage":{"input_tokens":1,"output_tokens":1}}}"#,
            );
            push(
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            );
            for i in 0..n {
                if i % 2 == 0 {
                    push(r#"{"type":"ping"}"#);
                } else {
                    push(
                        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}"#,
                    );
                }
            }
            push(
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ok"}}"#,
            );
            push(r#"{"type":"content_block_stop","index":0}"#);
            push(
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#,
            );
            push(r#"{"type":"message_stop"}"#);
        }
        Api::Responses => {
            push(
                r#"{"type":"response.created","response":{"id":"r","status":"in_progress","output":[]}}"#,
            );
            push(
                r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m","role":"assistant","content":[]}}"#,
            );
            for _ in 0..n {
                push(
                    r#"{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":""}"#,
                );
            }
            push(
                r#"{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"ok"}"#,
            );
            push(
                r#"{"type":"response.completed","response":{"id":"r","status":"completed","output":[{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"ok"}]}]}}"#,
            );
        }
    }
    out
}

#[tokio::test]
async fn hostile7_a_hundred_thousand_empty_deltas_cost_time_in_their_number_not_its_square() {
    for api in APIS {
        let (uri, _) = serve(vec![
            Step::Write(head("text/event-stream")),
            Step::Write(empty_deltas(api, 100_000)),
        ])
        .await;
        let started = Instant::now();
        let got = ask(model(api, &uri, true).as_ref())
            .await
            .unwrap_or_else(|e| panic!("{api:?}: {e}"));
        assert_eq!(got.message.text, "ok", "{api:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{api:?}: {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn hostile7_a_head_that_never_comes_or_comes_a_byte_at_a_time_ends_in_a_timeout() {
    for api in APIS {
        // Nothing at all after the request.
        let (uri, _) = serve(vec![Step::Hold]).await;
        let started = Instant::now();
        let err = ask(model(api, &uri, true).as_ref()).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Timeout, "{api:?}: {err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{api:?}");
        // A head dripped a byte a write, each well inside the idle timeout, never ending.
        let (uri, _) = serve(vec![
            Step::Write(b"HTTP/1.1 200 OK\r\nx-slow: ".to_vec()),
            Step::DripForever(b'a', Duration::from_millis(100)),
        ])
        .await;
        for stream in [true, false] {
            let started = Instant::now();
            let err = ask(model(api, &uri, stream).as_ref()).await.unwrap_err();
            assert_eq!(err.kind, ModelErrorKind::Timeout, "{api:?}: {err}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{api:?} {stream}: {:?}",
                started.elapsed()
            );
        }
        // A head that grows without end, fast: bounded by the client's head buffer, and not
        // retried (a server that sends it sends it again).
        let (uri, _) = serve(vec![
            Step::Write(b"HTTP/1.1 200 OK\r\n".to_vec()),
            Step::Write(b"x-many: a\r\n".repeat(100_000)),
            Step::Hold,
        ])
        .await;
        let err = ask(model(api, &uri, true).as_ref()).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Decode, "{api:?}: {err}");
        assert!(!err.is_transient(), "{api:?}: {err}");
        assert!(err.message.contains("too large"), "{api:?}: {err}");
    }
}

#[tokio::test]
async fn hostile7_a_stream_or_body_reset_or_cut_mid_answer_is_an_error_never_an_answer() {
    for api in APIS {
        let data = recorded(api);
        let upto = data.len() - 2; // the tool call begun, not finished
        let partial: String = data[..upto]
            .iter()
            .map(|d| format!("data: {d}\n\n"))
            .collect();
        for end in [Step::Reset, Step::Write(Vec::new())] {
            let reset = matches!(end, Step::Reset);
            let (uri, _) = serve(vec![
                Step::Write(head("text/event-stream")),
                Step::Write(partial.clone().into_bytes()),
                // Mid-event and mid-JSON.
                Step::Write(b"data: {\"type\":\"con".to_vec()),
                end,
            ])
            .await;
            let err = ask(model(api, &uri, true).as_ref()).await.unwrap_err();
            assert!(
                matches!(
                    err.kind,
                    ModelErrorKind::Stream | ModelErrorKind::Connection | ModelErrorKind::Decode
                ),
                "{api:?} reset={reset}: {err}"
            );
        }
    }
    // A whole body whose content-length promises more than comes.
    let body = fixture("openai_chat/oai_chat_ns_final_text.json");
    let reply = json_reply("", body.len() + 100, &body);
    let err = ask_chat(reply, false).await.unwrap_err();
    assert_broken(&err);
    // A chunked body whose chunk size is no number.
    let reply = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\nzz\r\ndata: x\r\n";
    let err = ask_chat(reply.to_vec(), true).await.unwrap_err();
    assert_broken(&err);
}

/// A 200 of a JSON body whose head says it is `length` bytes long, with `extra` header lines.
fn json_reply(extra: &str, length: usize, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra}content-length: {length}\r\nconnection: close\r\n\r\n{body}"
    )
    .into_bytes()
}

/// Asks a Chat Completions model whose server answers with `reply`, as it is.
async fn ask_chat(reply: Vec<u8>, stream: bool) -> Result<ModelResponse, ModelError> {
    let (uri, _) = serve(vec![Step::Write(reply)]).await;
    ask(model(Api::Chat, &uri, stream).as_ref()).await
}

fn assert_broken(err: &ModelError) {
    assert!(
        matches!(
            err.kind,
            ModelErrorKind::Connection | ModelErrorKind::Stream
        ),
        "{err}"
    );
}

#[tokio::test]
async fn hostile7_a_plain_body_declared_gzip_is_read_as_it_is() {
    // This client asks for no encoding and decodes none: a server that labels a plain body
    // gzip is read as the plain body it is.
    let body = fixture("openai_chat/oai_chat_ns_final_text.json");
    let reply = json_reply("content-encoding: gzip\r\n", body.len(), &body);
    let got = ask_chat(reply, false).await.unwrap();
    assert_eq!(got.message.text, "The capital of England is London.");
}

fn fast_retry(model: Box<dyn Model>) -> Retry<Box<dyn Model>> {
    let mut policy = RetryPolicy::attempts(3);
    policy.base_delay = Duration::from_millis(10);
    policy.max_delay = Duration::from_millis(50);
    policy.max_retry_after = Duration::from_secs(5);
    Retry::with_policy(model, policy)
}

#[tokio::test]
async fn hostile7_a_wait_asked_for_that_is_huge_negative_or_a_date_never_holds_the_call() {
    let far = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(86_400));
    for value in [
        "99999999999".to_owned(),
        "1e300".to_owned(),
        "-5".to_owned(),
        "NaN".to_owned(),
        far,
    ] {
        let (uri, count) = serve(vec![Step::Write(
            format!(
                "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: {value}\r\ncontent-length: 39\r\nconnection: close\r\n\r\n{{\"error\":{{\"message\":\"slow down\"}}}}   "
            )
            .into_bytes(),
        )])
        .await;
        let started = Instant::now();
        let retry = fast_retry(model(Api::Chat, &uri, true));
        let err = ask_within(&retry, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::RateLimited, "{value}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{value}: {:?}",
            started.elapsed()
        );
        let asked = count.load(std::sync::atomic::Ordering::SeqCst);
        if value.starts_with('-') || value == "NaN" {
            // No wait at all: the backoff's own, within the attempts.
            assert_eq!((err.retry_after, asked), (None, 3), "{value}");
        } else {
            // Longer than the client waits: given back to the caller at once, capped.
            assert_eq!(asked, 1, "{value}");
            let wait = err.retry_after.unwrap();
            assert!(wait >= Duration::from_secs(86_000), "{value}: {wait:?}");
            assert!(err.message.contains("longer than"), "{value}: {err}");
        }
    }
}

#[tokio::test]
async fn hostile7_a_redirect_loop_ends_at_once_in_a_clear_error() {
    // Each answer sends the client back to where it asked.
    let (uri, count) = serve_each(|socket, _| async move {
        let addr = socket.local_addr().unwrap();
        play(
            socket,
            vec![Step::Write(
                format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{addr}/chat/completions\r\ncontent-length: 0\r\n\r\n"
                )
                .into_bytes(),
            )],
        )
        .await;
    })
    .await;
    let retry = fast_retry(model(Api::Chat, &uri, true));
    let err = ask_within(&retry, Duration::from_secs(10))
        .await
        .unwrap_err();
    // Read as a dropped connection (`model.connection`), it was retried, walking the loop again
    // each time. It is the base URL's fault, named as such, and asked once.
    assert_eq!(err.kind, ModelErrorKind::Other, "{err}");
    assert!(err.message.contains("redirects"), "{err}");
    assert!(!err.is_retryable(), "{err}");
    let asked = count.load(std::sync::atomic::Ordering::SeqCst);
    assert!(asked <= 7, "{asked} requests");
}

/// What each API sends for an answer "hi" whose usage counts `count` tokens: as one event
/// stream and as one whole body.
fn counted(api: Api, count: &str) -> (String, String) {
    match api {
        Api::Chat => (
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":{count},\"completion_tokens\":3,\"completion_tokens_details\":{{\"reasoning_tokens\":{count}}}}}}}\n\ndata: [DONE]\n\n"
            ),
            format!(
                "{{\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"hi\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":{count},\"completion_tokens\":3}}}}"
            ),
        ),
        Api::Anthropic => (
            format!(
                "data: {{\"type\":\"message_start\",\"message\":{{\"id\":\"m\",\"usage\":{{\"input_tokens\":{count},\"output_tokens\":1}}}}}}\n\n\
                 data: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"hi\"}}}}\n\n\
                 data: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
                 data: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":3}}}}\n\n\
                 data: {{\"type\":\"message_stop\"}}\n\n"
            ),
            format!(
                "{{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{{\"type\":\"text\",\"text\":\"hi\"}}],\"stop_reason\":\"end_turn\",\"usage\":{{\"input_tokens\":{count},\"output_tokens\":3}}}}"
            ),
        ),
        Api::Responses => (
            format!(
                "data: {{\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"hi\"}}\n\n\
                 data: {{\"type\":\"response.completed\",\"response\":{{\"status\":\"completed\",\"usage\":{{\"input_tokens\":{count},\"output_tokens\":3,\"output_tokens_details\":{{\"reasoning_tokens\":{count}}}}}}}}}\n\n"
            ),
            format!(
                "{{\"id\":\"r\",\"status\":\"completed\",\"output\":[{{\"type\":\"message\",\"id\":\"m\",\"role\":\"assistant\",\"content\":[{{\"type\":\"output_text\",\"text\":\"hi\"}}]}}],\"usage\":{{\"input_tokens\":{count},\"output_tokens\":3}}}}"
            ),
        ),
    }
}

#[tokio::test]
async fn hostile7_a_token_count_past_any_number_keeps_the_answer_on_every_api() {
    // A count past f64's range (`1e400`, or 400 digits) is no number serde_json reads: read as
    // one, it failed the chunk or body that ends the answer, and the answer with it
    // (`model.stream`, `model.decode`). It saturates, as a count past u64 does; a negative one
    // is none.
    let digits = "9".repeat(400);
    for (count, read) in [
        ("1e400", u64::MAX),
        (digits.as_str(), u64::MAX),
        ("-1e400", 0),
        ("1e-400", 0),
    ] {
        for api in APIS {
            let (stream, whole) = counted(api, count);
            for (streamed, body, content_type) in [
                (true, stream, "text/event-stream"),
                (false, whole, "application/json"),
            ] {
                let (uri, _) = serve(vec![
                    Step::Write(head(content_type)),
                    Step::Write(body.into_bytes()),
                ])
                .await;
                let got = ask(model(api, &uri, streamed).as_ref())
                    .await
                    .unwrap_or_else(|e| panic!("{api:?} {streamed} {count}: {e}"));
                assert_eq!(got.message.text, "hi", "{api:?} {streamed} {count}");
                assert_eq!(got.usage.input_tokens, read, "{api:?} {streamed} {count}");
                assert_eq!(got.usage.output_tokens, 3, "{api:?} {streamed} {count}");
            }
        }
    }
}

fn sse_of(events: &[&str]) -> Vec<u8> {
    events
        .iter()
        .map(|e| format!("data: {e}\n\n"))
        .collect::<String>()
        .into_bytes()
}

fn chat_stream(events: &[&str]) -> Result<ModelResponse, ModelError> {
    agentloop_providers::openai_chat::parse_stream_bytes(&sse_of(events))
}

const CHAT_TOOLS_END: &str = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#;

#[test]
fn hostile7_semantically_hostile_chat_deltas_are_read_or_refused_clearly() {
    // One id on two calls of other names: two calls, the second's id left blank (the run draws
    // it), never one id for two calls.
    let r = chat_stream(&[
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"x","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"a","function":{"name":"y","arguments":"{}"}}]}}]}"#,
        CHAT_TOOLS_END,
    ])
    .unwrap();
    let calls: Vec<(&str, &str)> = r
        .message
        .tool_calls
        .iter()
        .map(|c| (&*c.call_id, &*c.tool))
        .collect();
    assert_eq!(calls, [("a", "x"), ("", "y")]);
    // Indexes that jump (0, 5, 2): three calls, in the order they came; an index past u32 is a
    // malformed chunk, not a table of that size.
    let r = chat_stream(&[
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"x","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":5,"id":"b","function":{"name":"y","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":2,"id":"c","function":{"name":"z","arguments":"{}"}}]}}]}"#,
        CHAT_TOOLS_END,
    ])
    .unwrap();
    let tools: Vec<&str> = r.message.tool_calls.iter().map(|c| &*c.tool).collect();
    assert_eq!(tools, ["x", "y", "z"]);
    let err = chat_stream(&[
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":18446744073709551615,"id":"a","function":{"name":"x","arguments":"{}"}}]}}]}"#,
        CHAT_TOOLS_END,
    ])
    .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Stream, "{err}");
    // Arguments sent as an object rather than its text: the same arguments.
    let r = chat_stream(&[
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"x","arguments":{"city":"Paris"}}}]}}]}"#,
        CHAT_TOOLS_END,
    ])
    .unwrap();
    assert_eq!(r.message.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    // Null in every field: absent, so a call without a name is an error, not a nameless call.
    let err = chat_stream(&[
        r#"{"id":null,"model":null,"choices":[{"index":null,"delta":{"role":null,"content":null,"tool_calls":null},"finish_reason":null}],"usage":null}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":null,"id":null,"type":null,"function":{"name":null,"arguments":null}}]}}]}"#,
        CHAT_TOOLS_END,
    ])
    .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Stream, "{err}");
    // A number where the id's text goes: a malformed chunk.
    let err = chat_stream(&[
        r#"{"id":7,"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#,
    ])
    .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Stream, "{err}");
    // Anything after `[DONE]` is not the answer's.
    let r = chat_stream(&[
        r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#,
        "[DONE]",
        r#"{"choices":[{"index":0,"delta":{"content":" more"},"finish_reason":"length"}]}"#,
    ])
    .unwrap();
    assert_eq!(
        (r.message.text.as_str(), r.finish_reason),
        ("hi", FinishReason::Stop)
    );
    // Two finish reasons: the later one stands (a cut answer is never taken for a whole one).
    let r = chat_stream(&[
        r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":" more"},"finish_reason":"length"}]}"#,
        "[DONE]",
    ])
    .unwrap();
    assert_eq!(r.finish_reason, FinishReason::Length);
}

#[test]
fn hostile7_semantically_hostile_anthropic_and_responses_events_are_read_or_refused_clearly() {
    let anthropic =
        |events: &[&str]| agentloop_providers::anthropic::parse_stream_bytes(&sse_of(events));
    let responses = |events: &[&str]| {
        agentloop_providers::openai_responses::parse_stream_bytes(&sse_of(events))
    };
    // A delta to a block that never started, and arguments as an object: clear errors.
    let err = anthropic(&[
        r#"{"type":"message_start","message":{"id":"m"}}"#,
        r#"{"type":"content_block_delta","index":7,"delta":{"type":"text_delta","text":"x"}}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#,
        r#"{"type":"message_stop"}"#,
    ])
    .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Stream, "{err}");
    let err = anthropic(&[
        r#"{"type":"message_start","message":{"id":"m"}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"x","input":{}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":{"a":1}}}"#,
    ])
    .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
    // Blocks whose indexes jump, and content after `message_stop`: the calls in the order they
    // came, nothing after the stop.
    let r = anthropic(&[
        r#"{"type":"message_start","message":{"id":"m"}}"#,
        r#"{"type":"content_block_start","index":5,"content_block":{"type":"tool_use","id":"t1","name":"x","input":{}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t2","name":"y","input":{}}}"#,
        r#"{"type":"content_block_delta","index":5,"delta":{"type":"input_json_delta","partial_json":"{\"a\":1}"}}"#,
        r#"{"type":"content_block_stop","index":5}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#,
        r#"{"type":"message_stop"}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"after"}}"#,
    ])
    .unwrap();
    let calls: Vec<(&str, &str)> = r
        .message
        .tool_calls
        .iter()
        .map(|c| (&*c.tool, c.arguments.as_str()))
        .collect();
    assert_eq!(calls, [("y", ""), ("x", r#"{"a":1}"#)]);
    assert!(r.message.text.is_empty());
    // Responses: arguments for an item that never started; a second `response.completed` and
    // text after the first are not the answer's.
    let err = responses(&[
        r#"{"type":"response.function_call_arguments.delta","item_id":"q","output_index":4,"delta":"{"}"#,
        r#"{"type":"response.completed","response":{"status":"completed"}}"#,
    ])
    .unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Stream, "{err}");
    let r = responses(&[
        r#"{"type":"response.output_text.delta","output_index":0,"delta":"x"}"#,
        r#"{"type":"response.completed","response":{"status":"completed"}}"#,
        r#"{"type":"response.completed","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#,
        r#"{"type":"response.output_text.delta","output_index":0,"delta":"after"}"#,
    ])
    .unwrap();
    assert_eq!(
        (r.message.text.as_str(), r.finish_reason),
        ("x", FinishReason::Stop)
    );
}
