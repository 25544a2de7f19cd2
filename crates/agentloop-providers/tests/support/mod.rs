//! Shared by the providers' tests (each test file takes it with `mod support;`): reads
//! `cases.json` from the recorded fixture corpus (`tests/fixtures/`) at run time, serves a case's
//! recorded body over loopback HTTP, drives the real adapter, and compares what it extracted with
//! the case's `expected`; the one-message "hello" call every test asks; the failure paths every
//! streamed adapter must meet; (in `raw_http`) a raw loopback server for the tests that control
//! every byte; and (in `props`) the property harness of the in-memory stream paths.
#![allow(
    clippy::indexing_slicing,
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub(crate) mod props;
pub(crate) mod raw_http;

use agentloop::{
    Model, ModelError, ModelResponse,
    model::{ModelEvent, ModelRequest, ModelSettings, ResponseAccumulator, Usage},
};
use futures::StreamExt;
use serde_json::Value;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Respond, ResponseTemplate};

/// The recorded fixture corpus.
pub(crate) const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// The cases of `cases.json` whose `api` is this one.
pub(crate) fn cases(api: &str) -> Vec<Value> {
    let text =
        std::fs::read_to_string(format!("{FIXTURES}/cases.json")).expect("cases.json is readable");
    let all: Vec<Value> = serde_json::from_str(&text).expect("cases.json is JSON");
    all.into_iter().filter(|c| c["api"] == api).collect()
}

/// The recorded body of a case.
pub(crate) fn body(case: &Value) -> Vec<u8> {
    let file = case["file"].as_str().expect("case has a file");
    std::fs::read(format!("{FIXTURES}/{file}")).expect("fixture file is readable")
}

/// A loopback server answering POST `route` with the case's status and body.
pub(crate) async fn serve(case: &Value, route: &str) -> MockServer {
    let server = MockServer::start().await;
    let status = u16::try_from(case["http_status"].as_u64().expect("status")).expect("status fits");
    let content_type = if case["stream"].as_bool() == Some(true) {
        "text/event-stream"
    } else {
        "application/json"
    };
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(ResponseTemplate::new(status).set_body_raw(body(case), content_type))
        .mount(&server)
        .await;
    server
}

/// A loopback server answering every POST, whatever its path, with `reply` (a template, or a
/// responder that answers by the request).
pub(crate) async fn answering(reply: impl Respond + 'static) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(reply)
        .mount(&server)
        .await;
    server
}

/// What one call produced: the response (or error) and the last usage event seen on the way.
pub(crate) struct Outcome {
    pub result: Result<ModelResponse, ModelError>,
    pub last_usage: Option<Usage>,
}

/// Calls the model once with a one-message transcript: its stream's items, as they came.
pub(crate) async fn events(model: &dyn Model) -> Vec<Result<ModelEvent, ModelError>> {
    let hello = Hello::default();
    model.stream(hello.request()).collect().await
}

/// Calls the model once with a one-message transcript and collects its stream.
pub(crate) async fn call(model: &dyn Model) -> Outcome {
    let mut acc = ResponseAccumulator::new();
    let mut last_usage = None;
    for item in events(model).await {
        match item {
            Ok(event) => {
                if let ModelEvent::Usage(u) = &event {
                    last_usage = Some(*u);
                }
                if let ModelEvent::Response(r) = &event {
                    last_usage = Some(r.usage);
                }
                acc.push(event).unwrap();
            }
            Err(e) => {
                return Outcome {
                    result: Err(e),
                    last_usage,
                };
            }
        }
    }
    Outcome {
        result: acc.finish(),
        last_usage,
    }
}

fn parsed_args(raw: &str) -> Value {
    if raw.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(raw).unwrap()
    }
}

/// Compares an outcome with the case's `expected`; panics with the case id on a difference.
/// `stop_reason` is compared with our raw finish word.
pub(crate) fn check(case: &Value, outcome: &Outcome) {
    let id = case["id"].as_str().unwrap();
    let expected = &case["expected"];
    if let Some(usage) = expected["usage"].as_object() {
        let seen = match &outcome.result {
            Ok(r) => Some(r.usage),
            Err(_) => outcome.last_usage,
        };
        let seen = seen.unwrap_or_else(|| panic!("{id}: no usage seen"));
        // The corpus's reader kept each API's own `input_tokens`. Anthropic's leaves out cache
        // reads and writes, which our `Usage` counts inside the input (the same on every
        // provider), so for Anthropic the comparable number is the input less both.
        let input = if case["api"] == "anthropic_messages" {
            seen.input_tokens
                .saturating_sub(seen.cached_input_tokens)
                .saturating_sub(seen.cache_write_tokens)
        } else {
            seen.input_tokens
        };
        assert_eq!(
            Some(input),
            usage["input_tokens"].as_u64(),
            "{id}: input tokens"
        );
        assert_eq!(
            Some(seen.output_tokens),
            usage["output_tokens"].as_u64(),
            "{id}: output tokens"
        );
    }
    if !expected["error"].is_null() {
        let err = outcome
            .result
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("{id}: expected an error, got a response"));
        let e = &expected["error"];
        assert_eq!(
            err.error_type.as_deref(),
            e["type"].as_str(),
            "{id}: error type"
        );
        assert_eq!(
            err.provider_code.as_deref(),
            e["code"].as_str(),
            "{id}: error code"
        );
        assert_eq!(
            Some(err.message.as_str()),
            e["message"].as_str(),
            "{id}: error message"
        );
        assert_eq!(
            err.param.as_deref(),
            e["param"].as_str(),
            "{id}: error param"
        );
        // `stop_reason: "failed"` is the Responses status of a failed stream: our error is that.
        assert!(
            matches!(expected["stop_reason"].as_str(), None | Some("failed")),
            "{id}: stop reason with an error"
        );
        return;
    }
    let response = match &outcome.result {
        Ok(r) => r,
        Err(e) => panic!("{id}: unexpected error {e:?}"),
    };
    assert_eq!(
        response.raw_finish_reason.as_deref(),
        expected["stop_reason"].as_str(),
        "{id}: stop reason"
    );
    assert_eq!(
        response.message.text,
        expected["text"].as_str().unwrap_or_default(),
        "{id}: text"
    );
    // Calls whose expected arguments are null were cut off: they must be absent (never executed),
    // the response marked truncated, and a warning must name them.
    let expected_calls = expected["tool_calls"].as_array().unwrap();
    let (complete, cut): (Vec<&Value>, Vec<&Value>) = expected_calls
        .iter()
        .partition(|c| !c["arguments"].is_null());
    assert_eq!(
        response.message.tool_calls.len(),
        complete.len(),
        "{id}: number of calls"
    );
    for (got, want) in response.message.tool_calls.iter().zip(&complete) {
        assert_eq!(&*got.call_id, want["id"].as_str().unwrap(), "{id}: call id");
        assert_eq!(got.tool, want["name"].as_str().unwrap(), "{id}: call name");
        if let Some(raw) = want["arguments_raw"].as_str() {
            assert_eq!(got.arguments, raw, "{id}: raw arguments");
        }
        assert_eq!(
            parsed_args(&got.arguments),
            want["arguments"],
            "{id}: parsed arguments"
        );
    }
    assert_eq!(response.truncated, !cut.is_empty(), "{id}: truncated");
    for c in &cut {
        let call_id = c["id"].as_str().unwrap();
        assert!(
            response.warnings.iter().any(|w| w.contains(call_id)),
            "{id}: no warning names the cut call {call_id}"
        );
    }
    let expected_warnings = expected["warnings"].as_array().map_or(0, Vec::len);
    assert!(
        response.warnings.len() >= expected_warnings,
        "{id}: warnings {:?}",
        response.warnings
    );
    if let Some(n) = expected["thinking_blocks"].as_u64() {
        let signed = response
            .message
            .reasoning
            .iter()
            .filter(|r| r.signature.is_some())
            .count();
        assert_eq!(signed as u64, n, "{id}: thinking blocks");
    }
    if let Some(n) = expected["reasoning_items"].as_u64() {
        let items = response
            .message
            .reasoning
            .iter()
            .filter(|r| r.provider_data.is_some())
            .count();
        assert_eq!(items as u64, n, "{id}: reasoning items");
    }
}

/// A fixture file's bytes, by its path under the corpus.
pub(crate) fn fixture(file: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}/{file}")).expect("fixture file is readable")
}

/// Server-sent events of these JSON events, each named by its `type`, as the Messages and
/// Responses APIs send them.
pub(crate) fn sse_of(events: &[Value]) -> Vec<u8> {
    let mut out = String::new();
    for e in events {
        out.push_str(&format!(
            "event: {}\ndata: {e}\n\n",
            e["type"].as_str().unwrap()
        ));
    }
    out.into_bytes()
}

/// An Anthropic model at `uri`, prompt caching off: a test then pins the bodies' other parts
/// exactly (the breakpoints have tests of their own, `prompt_caching.rs`).
pub(crate) fn anthropic_model(
    uri: String,
    stream: bool,
) -> agentloop_providers::anthropic::Anthropic {
    agentloop_providers::anthropic::Anthropic::builder("claude-test")
        .base_url(uri)
        .api_key("sk-ant-test-key")
        .stream(stream)
        .prompt_caching(false)
        .build()
        .unwrap()
}

/// A loopback server answering successive POSTs to `route` with these `(body, content type)`
/// replies, in order, each once, all with status 200.
pub(crate) async fn serve_in_order(route: &str, replies: Vec<(Vec<u8>, &str)>) -> MockServer {
    serve_replies(
        route,
        replies.into_iter().map(|(b, t)| (200, b, t)).collect(),
    )
    .await
}

/// A loopback server answering successive POSTs to `route` with these `(status, body, content
/// type)` replies, in order, each exactly once.
pub(crate) async fn serve_replies(route: &str, replies: Vec<(u16, Vec<u8>, &str)>) -> MockServer {
    let server = MockServer::start().await;
    let n = replies.len();
    for (i, (status, body, content_type)) in replies.into_iter().enumerate() {
        Mock::given(method("POST"))
            .and(path(route))
            .respond_with(ResponseTemplate::new(status).set_body_raw(body, content_type))
            .up_to_n_times(1)
            .with_priority(u8::try_from(i + 1).unwrap())
            .expect(1)
            .named(format!("reply {} of {n}", i + 1))
            .mount(&server)
            .await;
    }
    server
}

/// A raw loopback server that answers one request with a 200 event-stream head and `first`
/// (one HTTP chunk), then stalls (`drop_after: false`) or drops the connection.
pub(crate) async fn stalling_server(first: &'static [u8], drop_after: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        // Read the request head and body (small: one read loop until the body is in).
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let n = socket.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            if n == 0 || buf.ends_with(b"}") {
                break;
            }
        }
        let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        socket.write_all(head).await.unwrap();
        socket
            .write_all(format!("{:x}\r\n", first.len()).as_bytes())
            .await
            .unwrap();
        socket.write_all(first).await.unwrap();
        socket.write_all(b"\r\n").await.unwrap();
        socket.flush().await.unwrap();
        if drop_after {
            drop(socket);
        } else {
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        }
    });
    format!("http://{addr}")
}

/// A stream that stalls after `started` fails with a timeout, and one whose connection drops after
/// it is an error, never a half response: checked on the model `build` makes for a server's URL
/// (with a short idle timeout).
pub(crate) async fn check_stall_and_drop<M: Model>(
    started: &'static [u8],
    build: impl Fn(String) -> M,
) {
    let err = ask(&build(stalling_server(started, false).await))
        .await
        .unwrap_err();
    assert_eq!(err.kind, agentloop::model::ModelErrorKind::Timeout, "{err}");
    let err = ask(&build(stalling_server(started, true).await))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind,
            agentloop::model::ModelErrorKind::Connection | agentloop::model::ModelErrorKind::Stream
        ),
        "{err}"
    );
}

/// The JSON bodies the server received, in order.
pub(crate) async fn request_bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .expect("recording is on")
        .iter()
        .map(|r| serde_json::from_slice(&r.body).expect("request body is JSON"))
        .collect()
}

/// A tool over JSON arguments that answers with `answer(args)`, or with a recoverable error
/// when `answer` gives `Err`.
pub(crate) fn json_tool(
    name: &str,
    schema: Value,
    answer: fn(&Value) -> Result<String, String>,
) -> agentloop::Tool {
    agentloop::Tool::dynamic(
        name,
        format!("The {name} tool."),
        schema,
        move |args, _ctx| {
            let result = answer(&args);
            async move {
                result
                    .map(agentloop::ToolOutput::text)
                    .map_err(|m| agentloop::ToolError::new("failed", m))
            }
        },
    )
}

/// A stream parser's in-memory entry point (`parse_stream_bytes`).
pub(crate) type ParseStream = fn(&[u8]) -> Result<ModelResponse, ModelError>;

/// The in-memory path (fuzzing, benchmarks) must agree with the HTTP path on every streamed case.
pub(crate) fn check_in_memory(api: &str, parse: ParseStream) {
    for case in cases(api).iter().filter(|c| c["stream"] == true) {
        let outcome = Outcome {
            result: parse(&body(case)),
            last_usage: None,
        };
        if case["expected"]["error"].is_null() {
            check(case, &outcome);
        } else {
            assert!(outcome.result.is_err(), "{}", case["id"]);
        }
    }
}

/// Every cut of a successful recorded stream before the first mention of `end_marker` (the event
/// that completes it) is an error, never a half response; the whole stream is a response.
pub(crate) fn check_every_cut(api: &str, parse: ParseStream, end_marker: &[u8]) {
    for case in cases(api)
        .iter()
        .filter(|c| c["stream"] == true && c["expected"]["error"].is_null())
    {
        let bytes = body(case);
        let end = bytes
            .windows(end_marker.len())
            .position(|w| w == end_marker)
            .unwrap();
        for cut in 0..end {
            assert!(
                parse(&bytes[..cut]).is_err(),
                "{} cut at {cut} gave a response",
                case["id"]
            );
        }
        assert!(parse(&bytes).is_ok(), "{}", case["id"]);
    }
}

/// A retry policy without real waiting, for failure-path tests.
pub(crate) fn fast_retry() -> agentloop_providers::RetryPolicy {
    agentloop_providers::RetryPolicy::attempts(3)
        .with_base_delay(std::time::Duration::from_millis(5))
        .with_jitter(0.0)
}

/// The transcript of one user message, "hello", with default settings: what a test asks when
/// only the server's answer matters.
pub(crate) struct Hello {
    messages: [agentloop::Message; 1],
    settings: ModelSettings,
}

impl Default for Hello {
    fn default() -> Self {
        Hello {
            messages: [agentloop::Message::user("hello")],
            settings: ModelSettings::default(),
        }
    }
}

impl Hello {
    /// The request: no instructions, no tools, no output schema.
    pub(crate) fn request(&self) -> ModelRequest<'_> {
        ModelRequest {
            instructions: None,
            messages: &self.messages,
            tools: &[],
            output_schema: None,
            settings: &self.settings,
        }
    }
}

/// One "hello" call collected into a response, however long it takes.
pub(crate) async fn ask_unbounded(model: &dyn Model) -> Result<ModelResponse, ModelError> {
    let hello = Hello::default();
    agentloop::model::complete(model, hello.request()).await
}

/// One "hello" call collected into a response; a hang fails the test after `within`.
pub(crate) async fn ask_within(
    model: &dyn Model,
    within: std::time::Duration,
) -> Result<ModelResponse, ModelError> {
    tokio::time::timeout(within, ask_unbounded(model))
        .await
        .unwrap_or_else(|_| panic!("{}: the call hung past {within:?}", model.provider()))
}

/// One "hello" call collected into a response; a hang fails the test after 10 s.
pub(crate) async fn ask(model: &dyn Model) -> Result<ModelResponse, ModelError> {
    ask_within(model, std::time::Duration::from_secs(10)).await
}

/// `data` as one chunk of a chunked HTTP body.
pub(crate) fn http_chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The schema of a tool over one city.
pub(crate) fn city_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
}

/// The tools of the tool-search tests: `get_weather` (deferred; answers "Sunny in CITY"),
/// `echo`, and `get_time` (deferred).
pub(crate) fn search_tools() -> Vec<agentloop::Tool> {
    vec![
        json_tool("get_weather", city_schema(), |a| {
            Ok(format!(
                "Sunny in {}",
                a["city"].as_str().unwrap_or_default()
            ))
        })
        .deferred(),
        json_tool(
            "echo",
            serde_json::json!({"type": "object", "properties": {}}),
            |_| Ok("echo".to_owned()),
        ),
        json_tool("get_time", city_schema(), |_| Ok("noon".to_owned())).deferred(),
    ]
}
