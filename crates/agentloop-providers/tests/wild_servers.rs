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

use std::time::{Duration, Instant};

use agentloop::model::{FinishReason, ModelErrorKind};
use agentloop_providers::http::HttpConfig;
use agentloop_providers::openai_responses::OpenAiResponses;
use agentloop_providers::{OpenAiChat, Retry};
use support::raw_http::serve_each;
use support::{ask, fast_retry, http_chunk, serve_in_order};
use tokio::io::AsyncWriteExt;

fn responses(uri: String) -> OpenAiResponses {
    OpenAiResponses::builder("gpt-test")
        .base_url(uri)
        .api_key("sk-wild-secret")
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
async fn an_overloaded_responses_model_is_overloaded_and_retried() {
    // OpenAI's Responses API reports a model at capacity inside a 200 stream, as a failed
    // response or an `error` event, with the codes `server_is_overloaded` and `slow_down`: a
    // transient failure, to be retried, never an error of no kind that ends the run.
    let failed = r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"server_is_overloaded","message":"Selected model is at capacity. Please try a different model."},"output":[]}}"#;
    let slow = r#"{"type":"error","code":"slow_down","message":"Please slow down.","param":null}"#;
    for (name, data) in [("response.failed", failed), ("error", slow)] {
        let stream = events(&[CREATED, (name, data)]);
        fails_as_then_retried(stream, ModelErrorKind::Overloaded, name).await;
    }
}

/// A Responses server whose answer is `stream` fails the call with an error of `kind`, and a
/// retry layer over it asks again and gets the next answer.
async fn fails_as_then_retried(stream: Vec<u8>, kind: ModelErrorKind, case: &str) {
    let server = serve_in_order("/responses", vec![(stream.clone(), "text/event-stream")]).await;
    let err = ask(&responses(server.uri())).await.unwrap_err();
    assert_eq!(err.kind, kind, "{case}: {err}");
    assert!(err.is_retryable(), "{case}");

    let server = serve_in_order(
        "/responses",
        vec![
            (stream, "text/event-stream"),
            (answer("back"), "text/event-stream"),
        ],
    )
    .await;
    let got = ask(&Retry::with_policy(responses(server.uri()), fast_retry()))
        .await
        .unwrap_or_else(|e| panic!("{case}: not retried: {e}"));
    assert_eq!(got.message.text, "back", "{case}");
}

/// A function call streamed as these argument deltas, then closed by these events.
fn call_stream(deltas: &[&str], closing: &[(&str, &str)]) -> Vec<u8> {
    let added = r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc","call_id":"c1","name":"weather","arguments":""}}"#;
    let deltas: Vec<String> = deltas
        .iter()
        .map(|d| {
            let d = serde_json::to_string(d).unwrap();
            format!(
                r#"{{"type":"response.function_call_arguments.delta","item_id":"fc","output_index":0,"delta":{d}}}"#
            )
        })
        .collect();
    let mut all = vec![CREATED, ("response.output_item.added", added)];
    all.extend(
        deltas
            .iter()
            .map(|d| ("response.function_call_arguments.delta", d.as_str())),
    );
    all.extend_from_slice(closing);
    all.push((
        "response.completed",
        r#"{"type":"response.completed","response":{"id":"r","status":"completed","output":[],"usage":{"input_tokens":3,"output_tokens":4}}}"#,
    ));
    events(&all)
}

const ARGS_DONE: (&str, &str) = (
    "response.function_call_arguments.done",
    r#"{"type":"response.function_call_arguments.done","item_id":"fc","output_index":0,"arguments":"{\"city\":\"Paris\"}"}"#,
);
const ITEM_DONE: (&str, &str) = (
    "response.output_item.done",
    r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","id":"fc","call_id":"c1","name":"weather","arguments":"{\"city\":\"Paris\"}","status":"completed"}}"#,
);

#[tokio::test]
async fn a_call_whose_deltas_stop_short_of_its_done_event_takes_the_whole_arguments() {
    // A gateway that loses the last argument delta still sends the whole arguments in the
    // call's `done` events: the call runs with them, not with the broken head the deltas
    // carried (which the run rejects as no JSON, a lost call).
    for closing in [vec![ARGS_DONE, ITEM_DONE], vec![ARGS_DONE], vec![ITEM_DONE]] {
        let server = serve_in_order(
            "/responses",
            vec![(
                call_stream(&["{\"city\"", ":\"Par"], &closing),
                "text/event-stream",
            )],
        )
        .await;
        let got = ask(&responses(server.uri())).await.unwrap();
        let calls: Vec<_> = got
            .message
            .tool_calls
            .iter()
            .map(|c| (&*c.call_id, c.arguments.as_str()))
            .collect();
        assert_eq!(calls, [("c1", r#"{"city":"Paris"}"#)], "{closing:?}");
        assert!(
            got.warnings.iter().any(|w| w.contains("c1")),
            "{closing:?}: {:?}",
            got.warnings
        );
    }
}

#[tokio::test]
async fn a_call_whose_deltas_match_its_done_event_is_read_once_without_a_warning() {
    let server = serve_in_order(
        "/responses",
        vec![(
            call_stream(&["{\"city\"", ":\"Paris\"}"], &[ARGS_DONE, ITEM_DONE]),
            "text/event-stream",
        )],
    )
    .await;
    let got = ask(&responses(server.uri())).await.unwrap();
    assert_eq!(got.message.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    assert!(got.warnings.is_empty(), "{:?}", got.warnings);
}

#[tokio::test]
async fn a_call_whose_done_event_contradicts_its_deltas_says_so() {
    // What streamed has reached the caller and cannot be taken back: the call keeps it, and
    // the response says the server's last word differed.
    let server = serve_in_order(
        "/responses",
        vec![(
            call_stream(&["{\"city\":\"Rome\"}"], &[ARGS_DONE, ITEM_DONE]),
            "text/event-stream",
        )],
    )
    .await;
    let got = ask(&responses(server.uri())).await.unwrap();
    assert_eq!(got.message.tool_calls[0].arguments, r#"{"city":"Rome"}"#);
    assert_eq!(
        got.warnings
            .iter()
            .filter(|w| w.contains("c1") && w.contains("differ"))
            .count(),
        1,
        "{:?}",
        got.warnings
    );
}

/// A server that sends this event stream as one chunk, then holds the connection open, silent.
async fn holding(body: &'static str) -> String {
    holding_bytes("", body.as_bytes().to_vec()).await
}

/// [`holding`] with these bytes, and these header lines added to the head.
async fn holding_bytes(extra_head: &'static str, body: Vec<u8>) -> String {
    let (uri, _) = serve_each(move |mut socket, _| {
        let body = body.clone();
        async move {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{extra_head}\
                 transfer-encoding: chunked\r\n\r\n"
            );
            if socket.write_all(head.as_bytes()).await.is_err()
                || socket.write_all(&http_chunk(&body)).await.is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    })
    .await;
    uri
}

/// A compatible server's chat model that waits 300 ms of silence.
fn quick_chat(uri: &str) -> OpenAiChat {
    let mut config = HttpConfig::new(uri);
    config.idle_timeout = Duration::from_millis(300);
    OpenAiChat::compatible("local", uri, "m")
        .http_config(config)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_chat_answer_whose_server_holds_the_stream_open_without_done_is_the_answer() {
    // A finish_reason came (and the usage chunk after it), then no `[DONE]` and no end of the
    // body: the answer is whole, as it is when the server closes the body there. It was a
    // timeout after the idle timeout, the answer lost, and a retry layer paid for it again.
    let finished = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Paris\"},\
                    \"finish_reason\":\"stop\"}]}\n\n\
                    data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n";
    let chat = quick_chat(&holding(finished).await);
    let started = Instant::now();
    let got = ask(&chat).await.unwrap();
    assert_eq!(got.message.text, "Paris");
    assert_eq!(got.finish_reason, FinishReason::Stop);
    assert_eq!((got.usage.input_tokens, got.usage.output_tokens), (7, 2));
    assert!(
        got.warnings.iter().any(|w| w.contains("[DONE]")),
        "{:?}",
        got.warnings
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // Without a finish_reason the answer is not whole: still the timeout.
    let unfinished = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}\n\n";
    let chat = quick_chat(&holding(unfinished).await);
    let err = ask(&chat).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Timeout, "{err}");
}

/// `body` compressed as gzip (`zlib: false`) or as zlib-wrapped deflate.
fn compressed(body: &[u8], zlib: bool) -> Vec<u8> {
    use std::io::Write;
    if zlib {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(body).unwrap();
        e.finish().unwrap()
    } else {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(body).unwrap();
        e.finish().unwrap()
    }
}

/// A server answering every POST with this status and body, labelled with this content type
/// and `content-encoding`.
async fn encoded_server(
    status: u16,
    body: Vec<u8>,
    content_type: &str,
    coding: &str,
) -> wiremock::MockServer {
    support::answering(
        wiremock::ResponseTemplate::new(status)
            .insert_header("content-encoding", coding)
            .set_body_raw(body, content_type),
    )
    .await
}

const CHAT_WHOLE: &str = r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#;
const CHAT_STREAM: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}\n\n\
                           data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"is\"},\"finish_reason\":\"stop\"}]}\n\n\
                           data: [DONE]\n\n";

fn chat_at(uri: &str, stream: bool) -> OpenAiChat {
    OpenAiChat::compatible("local", uri, "m")
        .stream(stream)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_body_compressed_though_not_asked_is_decoded_and_the_request_asks_for_none() {
    // A proxy that compresses whatever the client says (aiohttp's forced compression, a
    // gateway's blanket gzip): every call failed `model.decode` on the compressed bytes.
    for (coding, zlib) in [("gzip", false), ("x-gzip", false), ("deflate", true)] {
        for (stream, body, content_type) in [
            (false, CHAT_WHOLE, "application/json"),
            (true, CHAT_STREAM, "text/event-stream"),
        ] {
            let server =
                encoded_server(200, compressed(body.as_bytes(), zlib), content_type, coding).await;
            let got = ask(&chat_at(&server.uri(), stream))
                .await
                .unwrap_or_else(|e| panic!("{coding} stream={stream}: {e}"));
            assert_eq!(got.message.text, "Paris", "{coding} stream={stream}");
            let asked = &server.received_requests().await.unwrap()[0];
            assert_eq!(
                asked.headers.get("accept-encoding").unwrap(),
                "identity",
                "the request says it takes no coding"
            );
        }
    }
}

#[tokio::test]
async fn a_compressed_error_body_keeps_its_message() {
    let body = br#"{"error":{"message":"Rate limit reached for m","type":"requests","code":"rate_limit_exceeded"}}"#;
    let server = encoded_server(429, compressed(body, false), "application/json", "gzip").await;
    let err = ask(&chat_at(&server.uri(), true)).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::RateLimited, "{err}");
    assert!(err.message.contains("Rate limit reached"), "{err}");
}

#[tokio::test]
async fn a_compressed_body_that_inflates_past_the_budget_fails_at_it() {
    // 64 MiB of blanks inside a 64 KiB gzip body: the budget counts what it inflates to, and the
    // call fails as the budget is passed, not after holding the whole.
    let bomb = compressed(&vec![b' '; 64 << 20], false);
    assert!(bomb.len() < 256 << 10);
    let server = encoded_server(200, bomb, "application/json", "gzip").await;
    let mut config = HttpConfig::new(server.uri());
    config.max_response_bytes = 1 << 20;
    let chat = OpenAiChat::compatible("local", server.uri(), "m")
        .http_config(config)
        .stream(false)
        .build()
        .unwrap();
    let err = ask(&chat).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
    assert!(err.message.contains("budget"), "{err}");
}

#[tokio::test]
async fn a_compressed_body_cut_short_or_corrupt_is_a_decode_error() {
    let whole = compressed(CHAT_WHOLE.as_bytes(), false);
    let cut = whole[..whole.len() - 12].to_vec();
    let mut corrupt = whole.clone();
    corrupt[12] ^= 0xff;
    for body in [cut, corrupt] {
        let server = encoded_server(200, body, "application/json", "gzip").await;
        let err = ask(&chat_at(&server.uri(), false)).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
        assert!(!err.is_retryable(), "{err}");
    }
}

#[tokio::test]
async fn a_body_in_a_coding_not_decoded_is_named_unless_it_is_plain() {
    // zstd's magic number, then anything: the error names the coding, not serde's first column.
    let zstd = [0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58, 0x01, 0x00].to_vec();
    let server = encoded_server(200, zstd, "application/json", "zstd").await;
    let err = ask(&chat_at(&server.uri(), false)).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
    assert!(err.message.contains("`zstd`"), "{err}");
    // A plain body under the label (a proxy that decoded it and kept the header) is read.
    let server = encoded_server(200, CHAT_WHOLE.into(), "application/json", "br").await;
    let got = ask(&chat_at(&server.uri(), false)).await.unwrap();
    assert_eq!(got.message.text, "Paris");
}

const PORTAL: &str = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n<title>\n  Guest Wi-Fi:\n  sign in to continue\n</title></head><body><form>...</form></body></html>";

#[tokio::test]
async fn a_200_carrying_an_html_page_says_so_and_is_not_retried() {
    // A captive portal, a proxy's login page or a wrong base_url answers 200 with a page: the
    // error says what came, by its title, not serde's "expected value at line 1 column 1".
    for content_type in [
        "text/html; charset=utf-8",
        "application/json",
        "text/event-stream",
    ] {
        for stream in [false, true] {
            let server = support::answering(
                wiremock::ResponseTemplate::new(200).set_body_raw(PORTAL, content_type),
            )
            .await;
            let model = Retry::with_policy(chat_at(&server.uri(), stream), fast_retry());
            let err = ask(&model).await.unwrap_err();
            let case = format!("{content_type} stream={stream}: {err}");
            assert_eq!(err.kind, ModelErrorKind::Decode, "{case}");
            assert!(
                err.message
                    .contains("an HTML page, not JSON: Guest Wi-Fi: sign in to continue"),
                "{case}"
            );
            assert!(!err.is_retryable(), "{case}");
            assert_eq!(server.received_requests().await.unwrap().len(), 1, "{case}");
        }
    }
    // Without a title, its first bytes; a long page is cut.
    let page = format!("<html><body>{}</body></html>", "x".repeat(5000));
    let server =
        support::answering(wiremock::ResponseTemplate::new(200).set_body_raw(page, "text/html"))
            .await;
    let err = ask(&chat_at(&server.uri(), false)).await.unwrap_err();
    assert!(
        err.message
            .contains("an HTML page, not JSON: <html><body>xxx"),
        "{err}"
    );
    assert!(err.message.len() < 400, "{err}");
}

#[tokio::test]
async fn a_200_of_plain_text_quotes_its_first_bytes() {
    let server = support::answering(
        wiremock::ResponseTemplate::new(200).set_body_raw("404 page not found\n", "text/plain"),
    )
    .await;
    let err = ask(&chat_at(&server.uri(), false)).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Decode, "{err}");
    assert!(
        err.message.contains("not JSON: 404 page not found"),
        "{err}"
    );
}

#[tokio::test]
async fn a_json_body_opened_by_a_byte_order_mark_is_read() {
    // Some proxies and Windows-hosted gateways put a UTF-8 BOM before the document.
    let body = format!("\u{feff}{CHAT_WHOLE}");
    for stream in [false, true] {
        let server = support::answering(
            wiremock::ResponseTemplate::new(200).set_body_raw(body.clone(), "application/json"),
        )
        .await;
        let got = ask(&chat_at(&server.uri(), stream))
            .await
            .unwrap_or_else(|e| panic!("stream={stream}: {e}"));
        assert_eq!(got.message.text, "Paris");
    }
}

/// A chat stream of one call to `weather` whose arguments come in these fragments, then
/// `[DONE]`, with no `finish_reason` anywhere (a relay that lost its upstream's last chunks and
/// closed the stream itself).
fn call_then_done(fragments: &[&str]) -> Vec<u8> {
    let mut out = String::from(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\
         \"type\":\"function\",\"function\":{\"name\":\"weather\",\"arguments\":\"\"}}]}}]}\n\n",
    );
    for fragment in fragments {
        let fragment = serde_json::to_string(fragment).unwrap();
        out.push_str(&format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\
             \"function\":{{\"arguments\":{fragment}}}}}]}}}}]}}\n\n"
        ));
    }
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

#[tokio::test]
async fn done_without_a_finish_reason_inside_a_calls_arguments_is_a_cut_stream_and_retried() {
    // Nobody said the answer was whole (no finish_reason), and the call's JSON never closed:
    // it was cut, as a stream that ends mid-arguments without `[DONE]` is. Kept as a call, it
    // failed its validation and the model was told it wrote broken arguments it never wrote.
    for fragments in [
        &["{\"city\"", ":\"Par"][..],
        &["{\"city\":{\"name\":\"Paris\"}"][..],
        &["{\"city\":\"Paris\\"][..],
    ] {
        let cut = || (call_then_done(fragments), "text/event-stream");
        let server = serve_in_order("/chat/completions", vec![cut()]).await;
        let err = ask(&chat_at(&server.uri(), true)).await.unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Stream, "{fragments:?}: {err}");
        assert!(err.is_retryable(), "{fragments:?}: {err}");

        let whole = call_then_done(&["{\"city\":\"Paris\"}"]);
        let server = serve_in_order(
            "/chat/completions",
            vec![cut(), (whole, "text/event-stream")],
        )
        .await;
        let got = ask(&Retry::with_policy(
            chat_at(&server.uri(), true),
            fast_retry(),
        ))
        .await
        .unwrap_or_else(|e| panic!("{fragments:?}: not retried: {e}"));
        assert_eq!(got.message.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    }
}

#[tokio::test]
async fn done_without_a_finish_reason_after_closed_but_malformed_arguments_keeps_the_call() {
    // Closed JSON that does not parse is what the model wrote: the call is the answer, and the
    // run's validation tells the model. So is a call with no arguments at all.
    for (fragments, kept) in [
        (&["{\"city\":\"Paris\",}"][..], r#"{"city":"Paris",}"#),
        (&[][..], ""),
    ] {
        let server = serve_in_order(
            "/chat/completions",
            vec![(call_then_done(fragments), "text/event-stream")],
        )
        .await;
        let got = ask(&chat_at(&server.uri(), true)).await.unwrap();
        assert_eq!(got.finish_reason, FinishReason::ToolCalls);
        assert_eq!(got.message.tool_calls[0].arguments, kept);
        assert!(
            got.warnings.iter().any(|w| w.contains("no finish_reason")),
            "{:?}",
            got.warnings
        );
    }
}

#[tokio::test]
async fn a_failed_response_that_names_no_error_is_a_server_error_and_retried() {
    // `failed` with `error: null` (or none): the server failed the response and named nothing
    // about the request. Failures caused by the request carry a code (`invalid_prompt`,
    // `invalid_image`...); what comes without one is the server's own, as bridges and gateways
    // send when their upstream drops mid-generation: a 5xx without a body, retried as one.
    let failed = |error: &str| {
        format!(
            r#"{{"type":"response.failed","response":{{"id":"r","status":"failed","output":[]{error}}}}}"#
        )
    };
    for error in [r#","error":null"#, "", r#","error":{}"#] {
        let stream = events(&[CREATED, ("response.failed", &failed(error))]);
        fails_as_then_retried(stream, ModelErrorKind::Server, error).await;
    }
    // A whole body says the same.
    let body = r#"{"id":"r","status":"failed","error":null,"output":[]}"#;
    let server = serve_in_order("/responses", vec![(body.into(), "application/json")]).await;
    let model = OpenAiResponses::builder("gpt-test")
        .base_url(server.uri())
        .api_key("sk-wild-secret")
        .stream(false)
        .build()
        .unwrap();
    let err = ask(&model).await.unwrap_err();
    assert_eq!(err.kind, ModelErrorKind::Server, "{err}");
    // A failure that names its error keeps its kind: not retried when the request caused it.
    let named = failed(r#","error":{"code":"invalid_prompt","message":"flagged"}"#);
    let server = serve_in_order(
        "/responses",
        vec![(
            events(&[CREATED, ("response.failed", &named)]),
            "text/event-stream",
        )],
    )
    .await;
    let err = ask(&responses(server.uri())).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    assert_eq!(err.provider_code.as_deref(), Some("invalid_prompt"));
}

#[tokio::test]
async fn events_sent_without_blank_lines_between_them_are_each_read() {
    // Each `data:` line ended by one line end, no blank line (servers written against
    // line-by-line readers): the format joins them into one event of no JSON, and every call
    // failed `model.stream`. A document laid over several `data:` lines still joins (the
    // second case).
    let chat = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}\n\
                data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"is\"},\"finish_reason\":\"stop\"}]}\n\
                data: [DONE]\n";
    let split = "data: {\"choices\":[{\"index\":0,\n\
                 data: \"delta\":{\"content\":\"Paris\"},\"finish_reason\":\"stop\"}]}\n\n\
                 data: [DONE]\n\n";
    for body in [chat, split] {
        let server = serve_in_order(
            "/chat/completions",
            vec![(body.as_bytes().to_vec(), "text/event-stream")],
        )
        .await;
        let got = ask(&chat_at(&server.uri(), true))
            .await
            .unwrap_or_else(|e| panic!("{body:?}: {e}"));
        assert_eq!(got.message.text, "Paris");
    }
    // Anthropic's named events the same way.
    let messages = "event: message_start\n\
        data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\
        event: content_block_start\n\
        data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\
        event: content_block_delta\n\
        data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Paris\"}}\n\
        event: content_block_stop\n\
        data: {\"type\":\"content_block_stop\",\"index\":0}\n\
        event: message_delta\n\
        data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\
        event: message_stop\n\
        data: {\"type\":\"message_stop\"}\n";
    let server = serve_in_order(
        "/v1/messages",
        vec![(messages.as_bytes().to_vec(), "text/event-stream")],
    )
    .await;
    let got = ask(&support::anthropic_model(server.uri(), true))
        .await
        .unwrap();
    assert_eq!(got.message.text, "Paris");
}

#[tokio::test]
async fn a_fastapi_error_body_keeps_its_detail() {
    // Servers built on FastAPI (Xinference among them) answer `{"detail": ...}`: the message was
    // lost ("HTTP 400 Bad Request"), and with it the kind its words say.
    for (status, body, kind, said) in [
        (
            400,
            r#"{"detail":"Model not found in the model list, uid: m"}"#,
            ModelErrorKind::InvalidRequest,
            "Model not found in the model list, uid: m",
        ),
        (
            422,
            r#"{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{"model":"m"}}]}"#,
            ModelErrorKind::InvalidRequest,
            "body.messages: Field required",
        ),
        (
            400,
            r#"{"detail":"This model's maximum context length is 4096 tokens."}"#,
            ModelErrorKind::ContextLength,
            "maximum context length",
        ),
    ] {
        let err = error_answering(status, body, "application/json").await;
        assert_eq!(err.kind, kind, "{body}: {err}");
        assert!(err.message.contains(said), "{body}: {err}");
        assert!(!err.message.contains("input"), "{body}: {err}");
    }
}

#[tokio::test]
async fn an_error_status_with_a_page_names_it_by_its_title() {
    // A WAF's block page under 403 read "HTTP 403 Forbidden", an authentication error: the user
    // checks a key that is fine. A page is now named by its title; the kind stays the status's,
    // and the rest of the body still never reaches the message.
    for (status, body, kind, said) in [
        (
            403,
            "<html><head><title>Access Denied</title></head><body>blocked by WAF</body></html>",
            ModelErrorKind::Authentication,
            r#"HTTP 403 Forbidden: an HTML page titled "Access Denied""#,
        ),
        (
            522,
            "<!DOCTYPE html><html><head><title>api.example.com | 522: Connection timed out</title></head></html>",
            ModelErrorKind::Server,
            "522: Connection timed out",
        ),
    ] {
        let err = error_answering(status, body, "text/html").await;
        assert_eq!(err.kind, kind, "{body}: {err}");
        assert!(err.message.contains(said), "{body}: {err}");
        assert!(!err.message.contains("WAF"), "{body}: {err}");
    }
}

/// The error of a chat call whose server answers this status and body.
async fn error_answering(status: u16, body: &str, content_type: &str) -> agentloop::ModelError {
    let server = support::serve_replies(
        "/chat/completions",
        vec![(status, body.as_bytes().to_vec(), content_type)],
    )
    .await;
    ask(&chat_at(&server.uri(), true)).await.unwrap_err()
}

#[tokio::test]
async fn a_compressed_stream_gives_each_event_as_its_bytes_arrive() {
    // A compressing proxy flushes its compressor at each event: what has arrived decodes whole.
    // The decoder's last output waited for the next bytes, so a finished answer whose server
    // then held the stream open was never seen finished, and timed out.
    use std::io::Write;
    let finished = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Paris\"},\
                    \"finish_reason\":\"stop\"}]}\n\n";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(finished.as_bytes()).unwrap();
    gz.flush().unwrap();
    let sent = gz.get_ref().clone();
    let chat = quick_chat(&holding_bytes("content-encoding: gzip\r\n", sent).await);
    let got = ask(&chat).await.unwrap();
    assert_eq!(got.message.text, "Paris");
    assert_eq!(got.finish_reason, FinishReason::Stop);
}
