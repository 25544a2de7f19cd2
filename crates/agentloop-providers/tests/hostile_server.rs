//! Hostile server traffic over raw loopback TCP, on every provider: bodies that never end, error
//! bodies under a 200 with the wrong content type, and shapes of usage and tool-call deltas that
//! a server may send. Each test pins what a correct client does with bytes it cannot trust.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::time::Duration;

use agentloop::model::ModelErrorKind;
use agentloop::{Model, ModelError, ModelResponse};
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::http::HttpConfig;
use agentloop_providers::openai_responses::OpenAiResponses;
use agentloop_providers::{OpenAiChat, Retry, RetryPolicy};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

mod support;
use support::http_chunk;
use support::raw_http::read_request;

async fn ask(model: &dyn Model) -> Result<ModelResponse, ModelError> {
    support::ask_within(model, Duration::from_secs(20)).await
}

/// What the server sends after the request: a status 200 with this content type (none when
/// empty), then `body` whole, then (when `endless`) chunks of `filler` until the client leaves,
/// or (when `hold_open`) nothing more, the body never ended nor the connection closed. With
/// `every`, the filler goes once each time that passes rather than as fast as the client reads.
#[derive(Default)]
struct Reply {
    content_type: &'static str,
    body: Vec<u8>,
    endless: Option<&'static [u8]>,
    every: Option<Duration>,
    hold_open: bool,
    /// With `endless` and `every`: the filler stops after this long, and `then` is sent and the
    /// body ended.
    until: Option<Duration>,
    then: Vec<u8>,
}

impl Reply {
    fn whole(content_type: &'static str, body: &[u8]) -> Self {
        Reply {
            content_type,
            body: body.to_vec(),
            ..Reply::default()
        }
    }
}

/// A server answering each request (one a connection) with the next reply.
async fn serve(replies: Vec<Reply>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for reply in replies {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                read_request(&mut socket).await;
                let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
                if !reply.content_type.is_empty() {
                    head.extend_from_slice(
                        format!("content-type: {}\r\n", reply.content_type).as_bytes(),
                    );
                }
                head.extend_from_slice(b"connection: close\r\ntransfer-encoding: chunked\r\n\r\n");
                if socket.write_all(&head).await.is_err() {
                    return;
                }
                if !reply.body.is_empty()
                    && socket.write_all(&http_chunk(&reply.body)).await.is_err()
                {
                    return;
                }
                if let Some(filler) = reply.endless
                    && let Some(every) = reply.every
                {
                    let block = http_chunk(filler);
                    let started = tokio::time::Instant::now();
                    while socket.write_all(&block).await.is_ok() {
                        tokio::time::sleep(every).await;
                        if reply.until.is_some_and(|d| started.elapsed() >= d) {
                            let _ = socket.write_all(&http_chunk(&reply.then)).await;
                            let _ = socket.write_all(b"0\r\n\r\n").await;
                            let _ = socket.flush().await;
                            return;
                        }
                    }
                    return;
                }
                if let Some(filler) = reply.endless {
                    let block = http_chunk(&filler.repeat(64 * 1024 / filler.len().max(1)));
                    while socket.write_all(&block).await.is_ok() {}
                    return;
                }
                if reply.hold_open {
                    let _ = socket.flush().await;
                    // Until the client leaves: a read returns at its close.
                    let mut byte = [0u8; 1];
                    let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut byte).await;
                    return;
                }
                let _ = socket.write_all(b"0\r\n\r\n").await;
                let _ = socket.flush().await;
            });
        }
    });
    format!("http://{addr}")
}

fn small_config(uri: &str) -> HttpConfig {
    let mut config = HttpConfig::new(uri);
    config.idle_timeout = Duration::from_secs(5);
    config.max_event_bytes = 1024 * 1024;
    config.max_response_bytes = 1024 * 1024;
    config.max_stream_bytes = 2 * 1024 * 1024;
    config
}

/// [`small_config`] where keep-alives alone hold a call for half a second, for the keep-alive
/// tests (the idle timeout stays 5 s: the keep-alives come well inside it).
fn quick_keepalive(uri: &str) -> HttpConfig {
    let mut config = small_config(uri);
    config.keepalive_timeout = Duration::from_millis(500);
    config
}

/// Asserts that each model's call fails with the idle timeout, well before the test's guard.
async fn assert_each_times_out(models: &[Box<dyn Model>], what: &str) {
    for model in models {
        let err = tokio::time::timeout(Duration::from_secs(5), ask(model.as_ref()))
            .await
            .unwrap_or_else(|_| panic!("{}: {what} held the call", model.id()))
            .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Timeout, "{}: {err}", model.id());
        assert!(err.message.contains("keepalive_timeout"), "{err}");
        assert!(err.is_retryable(), "{err}");
    }
}

fn chat(uri: &str, stream: bool) -> OpenAiChat {
    OpenAiChat::compatible("local", uri, "m")
        .http_config(small_config(uri))
        .stream(stream)
        .build()
        .unwrap()
}

fn anthropic(uri: &str, stream: bool) -> Anthropic {
    Anthropic::builder("claude-test")
        .http_config(small_config(uri))
        .stream(stream)
        .build()
        .unwrap()
}

fn responses(uri: &str, stream: bool) -> OpenAiResponses {
    OpenAiResponses::builder("gpt-test")
        .http_config(small_config(uri))
        .stream(stream)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_whole_body_that_never_ends_fails_at_the_response_budget() {
    // A JSON body that keeps coming (fast, so the idle timeout never fires): it must fail once it
    // passes the budget, not be held in memory until the process dies. Asked for a stream or
    // not, on every provider.
    let endless = || Reply {
        content_type: "application/json",
        body: br#"{"id":"x","choices":[{"index":0,"message":{"content":""#.to_vec(),
        endless: Some(b"aaaaaaaa"),
        ..Reply::default()
    };
    let mut models: Vec<Box<dyn Model>> = Vec::new();
    for stream in [false, true] {
        models.push(Box::new(chat(&serve(vec![endless()]).await, stream)));
    }
    models.push(Box::new(anthropic(&serve(vec![endless()]).await, false)));
    models.push(Box::new(responses(&serve(vec![endless()]).await, false)));
    for model in &models {
        let err = ask(model.as_ref()).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
        assert!(err.message.contains("budget"), "{err}");
    }
}

#[tokio::test]
async fn an_event_stream_that_never_ends_fails_at_the_stream_budget() {
    // Well-formed text deltas, each event small and the next one at once (so neither the event
    // budget nor the idle timeout fires): the answer would grow in memory for as long as the
    // server likes. It fails once the stream passes its budget, on every provider.
    let chat_events = Reply {
        content_type: "text/event-stream",
        body: b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"
            .to_vec(),
        endless: Some(b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"aaaa\"}}]}\n\n"),
        ..Reply::default()
    };
    let anthropic_events = Reply {
        content_type: "text/event-stream",
        body: concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",",
            "\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"c\",",
            "\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,",
            "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        )
        .as_bytes()
        .to_vec(),
        endless: Some(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"aaaa\"}}\n\n",
        ),
        ..Reply::default()
    };
    let responses_events = Reply {
        content_type: "text/event-stream",
        body: concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":",
            "{\"id\":\"r\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
            "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",",
            "\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"m\",\"role\":\"assistant\",",
            "\"content\":[]}}\n\n",
        )
        .as_bytes()
        .to_vec(),
        endless: Some(
            b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"output_index\":0,\"content_index\":0,\"delta\":\"aaaa\"}\n\n",
        ),
        ..Reply::default()
    };
    let models: Vec<Box<dyn Model>> = vec![
        Box::new(chat(&serve(vec![chat_events]).await, true)),
        Box::new(anthropic(&serve(vec![anthropic_events]).await, true)),
        Box::new(responses(&serve(vec![responses_events]).await, true)),
    ];
    for model in &models {
        let err = ask(model.as_ref()).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
        assert!(err.message.contains("max_stream_bytes"), "{err}");
    }
}

#[tokio::test]
async fn an_error_object_under_a_200_labelled_neither_json_nor_events_keeps_its_kind() {
    // A gateway's error answered with status 200 to a stream request, labelled text/plain, HTML
    // or nothing: read as an event stream it has no event, and would end as a bare "stream ended
    // early" that is never retried; it is the rate limit it says it is.
    let body = br#"{"error":{"message":"slow down","code":429}}"#;
    for content_type in ["text/plain", "", "text/html; charset=utf-8"] {
        let uri = serve(vec![Reply::whole(content_type, body)]).await;
        let err = ask(&chat(&uri, true)).await.unwrap_err();
        assert_eq!(
            err.kind,
            ModelErrorKind::RateLimited,
            "{content_type}: {err}"
        );
        assert_eq!(err.message, "slow down");
        assert!(err.is_retryable());
    }
    // A proxy's HTML page under a 200 is no answer: a decode error, not an empty stream.
    let uri = serve(vec![Reply::whole(
        "text/html",
        b"\n<html><body>Sign in to continue</body></html>",
    )])
    .await;
    let err = ask(&chat(&uri, true)).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
    // An event stream under the wrong label is still read as one, as it arrives.
    let sse = b"\ndata: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    for content_type in ["text/plain", ""] {
        let uri = serve(vec![Reply::whole(content_type, sse)]).await;
        let response = ask(&chat(&uri, true)).await.unwrap();
        assert_eq!(response.message.text, "hi");
        assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    }
}

/// Asserts that a recorded stream of each API, labelled `content_type`, whose server keeps the
/// body open after its last event, is answered well inside the idle timeout, to a request that
/// asked for a stream or (`stream` false) for one JSON body.
async fn assert_answered_at_the_last_event(content_type: &'static str, stream: bool) {
    // A recorded stream, its last event closed by its blank line as a live server sends it.
    let fixture = |file: &str| {
        let text = std::fs::read_to_string(format!(
            "{}/tests/fixtures/{file}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        format!("{}\n\n", text.trim_end()).into_bytes()
    };
    let held = |body: Vec<u8>| Reply {
        content_type,
        body,
        hold_open: true,
        ..Reply::default()
    };
    let chat_uri = serve(vec![held(fixture("openai_chat/oai_chat_s_text.sse"))]).await;
    let anthropic_uri = serve(vec![held(fixture("anthropic/anth_s_text.sse"))]).await;
    let responses_uri = serve(vec![held(fixture("openai_responses/resp_s_text.sse"))]).await;
    let models: Vec<Box<dyn Model>> = vec![
        Box::new(chat(&chat_uri, stream)),
        Box::new(anthropic(&anthropic_uri, stream)),
        Box::new(responses(&responses_uri, stream)),
    ];
    for model in &models {
        // Well inside the idle timeout (5 s): the answer does not wait on the open body.
        let answer = tokio::time::timeout(Duration::from_secs(3), ask(model.as_ref()))
            .await
            .unwrap_or_else(|_| panic!("{}: the answer waited on the open body", model.id()));
        let response = answer.unwrap_or_else(|e| panic!("{}: {e}", model.id()));
        assert!(!response.message.text.is_empty(), "{}", model.id());
        if !stream {
            assert!(
                response
                    .warnings
                    .iter()
                    .any(|w| w.contains("answered with an event stream")),
                "{}: {:?}",
                model.id(),
                response.warnings
            );
        }
    }
}

#[tokio::test]
async fn an_answer_ends_at_its_last_event_though_the_server_keeps_the_body_open() {
    // A server or proxy that sends the stream's last event (`[DONE]`, `message_stop`,
    // `response.completed`) and then neither ends the body nor closes the connection
    // (agentscope-ai/agentscope-java#2073, earendil-works/pi#7954): the answer is whole at that
    // event. Read to the body's end, the call waited out the idle timeout and then failed with
    // it, the whole answer lost (and, under `Retry`, asked for again).
    assert_answered_at_the_last_event("text/event-stream", true).await;
}

#[tokio::test]
async fn an_event_stream_labelled_json_is_read_as_it_arrives_on_every_provider() {
    // A server that labels its event stream `application/json` (SEMOSS/Monolith#245 fixed one):
    // read whole before it was parsed, an answer whose server keeps the body open after its
    // last event waited out the idle timeout and failed, and one longer than the whole-body
    // budget failed though the stream's budget holds it. Read as events, as they arrive, it
    // ends at its last event within the stream's limits.
    assert_answered_at_the_last_event("application/json; charset=utf-8", true).await;
    // Past the whole-body budget (1 MiB), within the stream's (2 MiB).
    let piece = "a".repeat(1024);
    let mut body = Vec::new();
    for _ in 0..1536 {
        body.extend_from_slice(
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{piece}\"}}}}]}}\n\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    );
    let uri = serve(vec![Reply::whole("application/json", &body)]).await;
    let response = ask(&chat(&uri, true)).await.unwrap();
    assert_eq!(response.message.text.len(), 1536 * 1024);
}

#[tokio::test]
async fn an_event_stream_to_a_request_for_one_body_ends_at_its_last_event_on_every_provider() {
    // Gateways that stream whatever was asked (decolua/9router#3492, QuantumNous/new-api#5230)
    // keep the connection open after the last event as they do when a stream was asked for:
    // read whole, the answer waited out the idle timeout and failed. Whatever its label.
    assert_answered_at_the_last_event("text/event-stream", false).await;
    assert_answered_at_the_last_event("application/json", false).await;
}

#[tokio::test]
async fn a_json_body_to_a_streamed_request_is_the_answer_or_the_error_it_holds_on_every_provider() {
    // Servers that ignore `stream: true` answer one JSON body: a whole answer is the answer
    // (with a warning), an error object the classified error, on every API.
    let fixture = |file: &str| {
        std::fs::read(format!(
            "{}/tests/fixtures/{file}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let whole = [
        "openai_chat/oai_chat_ns_final_text.json",
        "anthropic/anth_ns_final_text.json",
        "openai_responses/resp_ns_final_text.json",
    ];
    let errors = [
        r#"{"error":{"message":"Rate limit reached","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}}"#,
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"Rate limit reached"}}"#,
        r#"{"type":"error","error":{"type":"rate_limit_error","code":"rate_limit_exceeded","message":"Rate limit reached"}}"#,
    ];
    for (n, (file, error)) in whole.iter().zip(errors).enumerate() {
        let model = |uri: &str| -> Box<dyn Model> {
            match n {
                0 => Box::new(chat(uri, true)),
                1 => Box::new(anthropic(uri, true)),
                _ => Box::new(responses(uri, true)),
            }
        };
        let uri = serve(vec![Reply::whole("application/json", &fixture(file))]).await;
        let response = ask(model(&uri).as_ref()).await.unwrap();
        assert!(!response.message.text.is_empty(), "{file}");
        assert!(
            response
                .warnings
                .iter()
                .any(|w| w.contains("asked for a stream")),
            "{file}: {:?}",
            response.warnings
        );
        let uri = serve(vec![Reply::whole("application/json", error.as_bytes())]).await;
        let err = ask(model(&uri).as_ref()).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::RateLimited, "{error}: {err}");
        assert!(err.message.contains("Rate limit reached"), "{err}");
    }
}

#[tokio::test]
async fn whitespace_sent_a_byte_a_chunk_before_the_body_ends_costs_no_more_than_its_length() {
    // A server that sends its keep-alive whitespace one byte to an HTTP chunk, fast: reading
    // what the body is, each chunk was weighed with all the bytes before it, so the time grew
    // with the square of their number (30 000 took seconds, a million would hold the call for
    // hours of CPU). Each chunk is read once now; the body (only whitespace) then fails at
    // once, labelled JSON or not labelled.
    const CHUNKS: usize = 30_000;
    for content_type in ["content-type: application/json\r\n", ""] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_request(&mut socket).await;
            let mut answer = format!(
                "HTTP/1.1 200 OK\r\n{content_type}connection: close\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            .into_bytes();
            answer.extend(b"1\r\n \r\n".repeat(CHUNKS));
            answer.extend_from_slice(b"0\r\n\r\n");
            let _ = socket.write_all(&answer).await;
            let _ = socket.flush().await;
        });
        // Well over ten times what reading 30 000 chunks once takes here; weighed each with
        // all before it, they took seconds.
        let err = tokio::time::timeout(Duration::from_secs(4), ask(&chat(&uri, true)))
            .await
            .unwrap_or_else(|_| panic!("{content_type:?}: the whitespace held the call"))
            .unwrap_err();
        assert!(
            matches!(err.kind, ModelErrorKind::Stream | ModelErrorKind::Decode),
            "{content_type:?}: {err}"
        );
    }
}

#[tokio::test]
async fn keep_alive_comments_without_an_event_end_at_the_keepalive_timeout() {
    // A relay whose upstream stalled holds the stream open with comment lines, one well inside
    // the idle timeout each (earendil-works/pi#5558, anomalyco/opencode#43519): they say
    // nothing, so the call fails once the keep-alive timeout passes without an event, before
    // its first event or after it, on every provider.
    let starts: [&[u8]; 3] = [
        b"data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"c\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n",
        b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
    ];
    let kept_alive = |start: &[u8]| Reply {
        content_type: "text/event-stream",
        body: start.to_vec(),
        endless: Some(b": keepalive\n\n"),
        every: Some(Duration::from_millis(50)),
        ..Reply::default()
    };
    // Vertex's partner models send their keep-alive as data (anomalyco/opencode#50871).
    let kept_alive_as_data = |start: &[u8]| Reply {
        endless: Some(b"data: : keepalive\n\n"),
        ..kept_alive(start)
    };
    let mut models: Vec<Box<dyn Model>> = Vec::new();
    for reply in [
        kept_alive(b""),
        kept_alive(starts[0]),
        kept_alive_as_data(starts[0]),
    ] {
        let uri = serve(vec![reply]).await;
        let model = OpenAiChat::compatible("local", &uri, "m").http_config(quick_keepalive(&uri));
        models.push(Box::new(model.build().unwrap()));
    }
    let uri = serve(vec![kept_alive(starts[1])]).await;
    let model = Anthropic::builder("claude-test").http_config(quick_keepalive(&uri));
    models.push(Box::new(model.build().unwrap()));
    let uri = serve(vec![kept_alive(starts[2])]).await;
    let model = OpenAiResponses::builder("gpt-test").http_config(quick_keepalive(&uri));
    models.push(Box::new(model.build().unwrap()));
    assert_each_times_out(&models, "the keep-alives").await;
}

#[tokio::test]
async fn keep_alives_hold_a_call_past_the_idle_timeout_until_the_answer_comes() {
    // A gateway sends keep-alives while its model thinks without a token for longer than the
    // idle timeout (o-series behind OpenRouter: `: OPENROUTER PROCESSING`), then the answer: the
    // connection is alive, and the call waits for it within the keep-alive timeout rather than
    // failing (and being paid again by a retry).
    let answer = b"data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"thought\"}}]}\n\ndata: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    let thinking = |body: &[u8]| Reply {
        content_type: "text/event-stream",
        body: body.to_vec(),
        endless: Some(b": OPENROUTER PROCESSING\n\n"),
        every: Some(Duration::from_millis(50)),
        until: Some(Duration::from_millis(1200)),
        then: answer.to_vec(),
        ..Reply::default()
    };
    let mut config = small_config("");
    config.idle_timeout = Duration::from_millis(400);
    config.keepalive_timeout = Duration::from_secs(10);
    for body in [&b""[..], b": OPENROUTER PROCESSING\n\n"] {
        let uri = serve(vec![thinking(body)]).await;
        let model = OpenAiChat::compatible("local", &uri, "m")
            .http_config(HttpConfig {
                base_url: uri.clone(),
                ..config.clone()
            })
            .build()
            .unwrap();
        let response = ask(&model).await.unwrap();
        assert_eq!(response.message.text, "thought");
    }
}

#[tokio::test]
async fn whitespace_kept_alive_before_a_whole_body_ends_at_the_keepalive_timeout() {
    // A server that keeps a slow JSON answer's connection open with spaces before the document
    // (omlx's keep-alive during a long prefill, jundot/omlx#2066) and then stalls: the spaces
    // say nothing, so the call fails once the keep-alive timeout passes without anything else,
    // asked for a stream or not, on every provider.
    let spaces = || Reply {
        content_type: "application/json",
        body: b" ".to_vec(),
        endless: Some(b" "),
        every: Some(Duration::from_millis(50)),
        ..Reply::default()
    };
    let mut models: Vec<Box<dyn Model>> = Vec::new();
    for stream in [false, true] {
        let uri = serve(vec![spaces()]).await;
        let model = OpenAiChat::compatible("local", &uri, "m")
            .http_config(quick_keepalive(&uri))
            .stream(stream);
        models.push(Box::new(model.build().unwrap()));
    }
    let uri = serve(vec![spaces()]).await;
    let model = Anthropic::builder("claude-test")
        .http_config(quick_keepalive(&uri))
        .stream(false);
    models.push(Box::new(model.build().unwrap()));
    let uri = serve(vec![spaces()]).await;
    let model = OpenAiResponses::builder("gpt-test")
        .http_config(quick_keepalive(&uri))
        .stream(false);
    models.push(Box::new(model.build().unwrap()));
    assert_each_times_out(&models, "the spaces").await;
    // A body that does come after its spaces is read whole.
    let uri = serve(vec![Reply::whole(
        "application/json",
        b"  \n {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}",
    )])
    .await;
    let model = OpenAiChat::compatible("local", &uri, "m")
        .http_config(quick_keepalive(&uri))
        .stream(false);
    assert_eq!(
        ask(&model.build().unwrap()).await.unwrap().message.text,
        "hi"
    );
}

#[tokio::test]
async fn one_line_past_the_event_budget_fails_naming_the_budget() {
    // A server that sends one gigantic line (a runaway delta, a proxy's dump): it fails once the
    // line passes the event budget, held no longer than that, with an error that names the
    // setting to raise, and is not retried (the same request would send the same line).
    let mut line = br#"data: {"id":"c","choices":[{"index":0,"delta":{"content":""#.to_vec();
    line.extend(std::iter::repeat_n(b'a', 1536 * 1024));
    let uri = serve(vec![Reply::whole("text/event-stream", &line)]).await;
    let err = ask(&chat(&uri, true)).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Stream, "{err}");
    assert!(err.message.contains("max_event_bytes"), "{err}");
    assert!(!err.is_retryable(), "{err}");
}

#[test]
fn a_token_count_of_the_wrong_shape_never_costs_the_answer() {
    // The usage rides on the chunk or body that ends the answer: a count that is negative, a
    // float, past u64, a string, or a usage of the wrong shape is read leniently (absent, cut,
    // saturated) rather than failing the whole response.
    let cases: [(&str, u64); 7] = [
        ("-1", 0),
        ("12.0", 12),
        ("12.7", 12),
        ("1e30", u64::MAX),
        ("99999999999999999999999", u64::MAX),
        (r#""12""#, 12),
        ("null", 0),
    ];
    for (count, read) in cases {
        let chat = format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":{count},\"completion_tokens\":3,\"prompt_tokens_details\":{{\"cached_tokens\":{count}}}}}}}\n\ndata: [DONE]\n\n"
        );
        let r = agentloop_providers::openai_chat::parse_stream_bytes(chat.as_bytes())
            .unwrap_or_else(|e| panic!("chat, {count}: {e}"));
        assert_eq!(r.message.text, "hi");
        assert_eq!(
            (r.usage.input_tokens, r.usage.output_tokens),
            (read, 3),
            "chat, {count}"
        );
        assert_eq!(r.usage.cached_input_tokens, read, "chat, {count}");

        let anthropic = format!(
            "data: {{\"type\":\"message_start\",\"message\":{{\"id\":\"m\",\"usage\":{{\"input_tokens\":{count},\"output_tokens\":1}}}}}}\n\n\
             data: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"hi\"}}}}\n\n\
             data: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
             data: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":{count}}}}}\n\n\
             data: {{\"type\":\"message_stop\"}}\n\n"
        );
        let r = agentloop_providers::anthropic::parse_stream_bytes(anthropic.as_bytes())
            .unwrap_or_else(|e| panic!("anthropic, {count}: {e}"));
        assert_eq!(r.message.text, "hi");
        assert_eq!(r.usage.input_tokens, read, "anthropic, {count}");
        // An unreadable later count keeps the earlier one.
        let output = if read == 0 { 1 } else { read };
        assert_eq!(r.usage.output_tokens, output, "anthropic, {count}");

        let responses = format!(
            "data: {{\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"hi\"}}\n\n\
             data: {{\"type\":\"response.completed\",\"response\":{{\"status\":\"completed\",\"usage\":{{\"input_tokens\":{count},\"output_tokens\":3,\"output_tokens_details\":{{\"reasoning_tokens\":{count}}}}}}}}}\n\n"
        );
        let r = agentloop_providers::openai_responses::parse_stream_bytes(responses.as_bytes())
            .unwrap_or_else(|e| panic!("responses, {count}: {e}"));
        assert_eq!(r.message.text, "hi");
        assert_eq!(
            (r.usage.input_tokens, r.usage.output_tokens),
            (read, 3),
            "responses, {count}"
        );
        assert_eq!(r.usage.reasoning_tokens, read, "responses, {count}");
    }
    // A usage of the wrong shape altogether reads as none.
    let chat = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}],\"usage\":\"n/a\"}\n\n";
    let r = agentloop_providers::openai_chat::parse_stream_bytes(chat.as_bytes()).unwrap();
    assert_eq!((r.message.text.as_str(), r.usage.input_tokens), ("hi", 0));
}

#[tokio::test]
async fn an_error_body_dripped_for_ever_is_classified_within_the_idle_timeout() {
    // A 503 whose body comes a byte at a time, each inside the idle timeout, never ending: the
    // body only names the error, so the call fails (retryably, by its status) once the idle
    // timeout has passed, instead of waiting on the drip.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await;
        let head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n{\"error\":{\"message\":\"busy";
        socket.write_all(head).await.unwrap();
        while socket.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let uri = format!("http://{addr}");
    let mut config = small_config(&uri);
    config.idle_timeout = Duration::from_secs(1);
    let model = OpenAiChat::compatible("local", &uri, "m")
        .http_config(config)
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let err = ask(&model).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.kind, ModelErrorKind::Server, "{err}");
    assert_eq!(err.status, Some(503));
    assert!(err.is_retryable());
}

#[tokio::test]
async fn a_json_error_labelled_as_an_event_stream_keeps_its_kind() {
    // A relay that labels everything text/event-stream, answering an error object with no
    // `data:` framing: read as events it has none. It opens as a JSON document, which no event
    // stream does, so it is read whole, on every provider.
    let body = br#"  {"error":{"message":"slow down","type":"rate_limit_error","code":429}}"#;
    let mut models: Vec<Box<dyn Model>> = Vec::new();
    for stream in [true, false] {
        let reply = || Reply::whole("text/event-stream", body);
        models.push(Box::new(chat(&serve(vec![reply()]).await, stream)));
        models.push(Box::new(anthropic(&serve(vec![reply()]).await, stream)));
        models.push(Box::new(responses(&serve(vec![reply()]).await, stream)));
    }
    for model in &models {
        let err = ask(model.as_ref()).await.unwrap_err();
        assert_eq!(
            err.kind,
            ModelErrorKind::RateLimited,
            "{}: {err}",
            model.provider()
        );
        assert_eq!(err.message, "slow down");
    }
}

#[tokio::test]
async fn silence_before_the_first_byte_of_a_stream_is_the_idle_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await;
        let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        socket.write_all(head).await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let uri = format!("http://{addr}");
    let mut config = small_config(&uri);
    config.idle_timeout = Duration::from_millis(300);
    let model = OpenAiChat::compatible("local", &uri, "m")
        .http_config(config)
        .build()
        .unwrap();
    let err = ask(&model).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Timeout, "{err}");
    assert!(err.message.contains("idle"), "{err}");
}

/// A server answering each connection's request with `raw`, as sent, then closing: what a
/// server that does not speak HTTP, or speaks it wrongly, puts on the wire. Answers the URL and
/// how many requests came.
async fn serve_raw(raw: Vec<u8>) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let raw = raw.clone();
            tokio::spawn(async move {
                read_request(&mut socket).await;
                let _ = socket.write_all(&raw).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

/// A server that does not speak HTTP at base_url (another service's banner), or answers with a
/// head no client reads (a status that is no number, more headers than a head may hold), gets
/// the same answer on every attempt: each provider, streamed or not, fails with
/// `model.decode` saying so, not a transient `model.connection`, and a retrying model asks once
/// rather than waiting out its attempts.
#[tokio::test]
async fn a_response_head_that_is_not_http_is_not_retried_as_a_dropped_connection() {
    let many: String = (0..200).map(|i| format!("x-h{i}: v\r\n")).collect();
    for raw in [
        "SSH-2.0-OpenSSH_9.6\r\n".to_owned(),
        "HTTP/1.1 9x9 OK\r\ncontent-length: 0\r\n\r\n".to_owned(),
        format!("HTTP/1.1 200 OK\r\n{many}content-length: 2\r\n\r\n{{}}"),
    ] {
        let (uri, seen) = serve_raw(raw.clone().into_bytes()).await;
        let models: Vec<Box<dyn Model>> = vec![
            Box::new(chat(&uri, false)),
            Box::new(chat(&uri, true)),
            Box::new(anthropic(&uri, false)),
            Box::new(anthropic(&uri, true)),
            Box::new(responses(&uri, false)),
            Box::new(responses(&uri, true)),
        ];
        for model in &models {
            let e = ask(model.as_ref()).await.unwrap_err();
            assert_eq!(e.kind, ModelErrorKind::Decode, "{raw:?}: {e}");
            assert!(!e.is_transient(), "{raw:?}: {e}");
            assert!(e.to_string().contains("not an HTTP response head"), "{e}");
        }
        let before = seen.load(std::sync::atomic::Ordering::SeqCst);
        let retrying = Retry::with_policy(chat(&uri, true), RetryPolicy::attempts(3));
        let e = ask(&retrying).await.unwrap_err();
        assert_eq!(e.kind, ModelErrorKind::Decode, "{raw:?}: {e}");
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::SeqCst) - before,
            1,
            "{raw:?}: asked again"
        );
    }
}
