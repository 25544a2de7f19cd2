//! The quirks corpus (`tests/quirks/<case>/`): what compatible servers, gateways and new models
//! actually send, each case with its source, served over loopback HTTP through the adapter for
//! its API and checked against what a correct client extracts (text, reasoning, tool calls,
//! finish reason, usage) or the typed error it fails with, whether that error is retried, and,
//! for the cases about what must go back, the next request's body.
//!
//! Every case runs; the test fails once at the end, naming every case that failed and why.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

#[path = "quirks/server.rs"]
mod server;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentloop::message::{AssistantMessage, ToolContent, ToolResult};
use agentloop::model::{ModelRequest, ModelSettings, complete};
use agentloop::tool::ToolSpec;
use agentloop::{Message, Model, ModelError, ModelResponse};
use agentloop_providers::anthropic::Anthropic;
use agentloop_providers::openai_chat::ToolDialect;
use agentloop_providers::openai_responses::OpenAiResponses;
use agentloop_providers::{OpenAiChat, Retry, RetryPolicy};
use serde::Deserialize;
use serde_json::{Value, json};
use server::{QuirkServer, Reply};

/// One case's `case.json`.
#[derive(Debug, Deserialize)]
struct Case {
    id: String,
    api: String,
    server: String,
    what: String,
    sources: Vec<String>,
    /// How the bytes relate to the reports: copied as a report shows them, or written from a
    /// report that shows only the shape.
    #[serde(default)]
    provenance: Option<String>,
    correct_client: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    options: Options,
    #[serde(default)]
    retry: Option<RetrySpec>,
    replies: Vec<Reply>,
    expect: Expect,
    #[serde(default)]
    next: Option<NextRequest>,
}

#[derive(Debug, Default, Deserialize)]
struct Options {
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    idle_timeout_ms: Option<u64>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    tool_dialect: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RetrySpec {
    max_attempts: u32,
    #[serde(default)]
    max_retry_after_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct Expect {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ExpectedCall>>,
    /// The names of the calls the output limit cut (never run).
    #[serde(default)]
    cut_calls: Option<Vec<String>>,
    #[serde(default)]
    truncated: Option<bool>,
    #[serde(default)]
    finish: Option<String>,
    #[serde(default)]
    usage: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    warning_contains: Option<String>,
    #[serde(default)]
    error: Option<ExpectedError>,
    #[serde(default)]
    requests: Option<usize>,
}

#[derive(Debug, Deserialize)]
struct ExpectedCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    arguments: Value,
}

#[derive(Debug, Deserialize)]
struct ExpectedError {
    kind: String,
    retryable: bool,
    #[serde(default)]
    message_contains: Option<String>,
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

/// What the request after this answer (and a result for each of its calls) must carry.
#[derive(Debug, Deserialize)]
struct NextRequest {
    /// JSON pointers into the next request's body, and the value each must hold.
    #[serde(default)]
    equals: serde_json::Map<String, Value>,
    /// JSON pointers that must not be in it.
    #[serde(default)]
    absent: Vec<String>,
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/quirks")
}

fn load_cases() -> Vec<(PathBuf, Case)> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").is_file())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|dir| {
            let text = std::fs::read_to_string(dir.join("case.json")).unwrap();
            let mut case: Case =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            case.replies = std::mem::take(&mut case.replies)
                .into_iter()
                .map(|r| r.load(&dir))
                .collect();
            (dir, case)
        })
        .collect()
}

fn model_for(case: &Case, uri: &str) -> Arc<dyn Model> {
    let stream = case.options.stream.unwrap_or(true);
    let idle = Duration::from_millis(case.options.idle_timeout_ms.unwrap_or(10_000));
    let name = case.model.clone().unwrap_or_else(|| "test-model".into());
    let model: Arc<dyn Model> = match case.api.as_str() {
        "chat" => {
            let mut builder = OpenAiChat::compatible(
                case.provider.clone().unwrap_or_else(|| "local".into()),
                uri,
                name,
            )
            .stream(stream)
            .idle_timeout(idle);
            if let Some(dialect) = &case.options.tool_dialect {
                builder = builder.tool_dialect(ToolDialect::from_name(dialect).unwrap());
            }
            Arc::new(builder.build().unwrap())
        }
        "responses" => Arc::new(
            OpenAiResponses::builder(name)
                .base_url(uri)
                .no_api_key()
                .stream(stream)
                .store(case.options.store.unwrap_or(false))
                .idle_timeout(idle)
                .build()
                .unwrap(),
        ),
        "anthropic" => Arc::new(
            Anthropic::builder(name)
                .base_url(uri)
                .no_api_key()
                .stream(stream)
                .idle_timeout(idle)
                .build()
                .unwrap(),
        ),
        other => panic!("{}: unknown api {other}", case.id),
    };
    match &case.retry {
        None => model,
        Some(r) => {
            let mut policy = RetryPolicy::attempts(r.max_attempts)
                .with_base_delay(Duration::from_millis(10))
                .with_jitter(0.0);
            if let Some(ms) = r.max_retry_after_ms {
                policy = policy.with_max_retry_after(Duration::from_millis(ms));
            }
            Arc::new(Retry::with_policy(model, policy))
        }
    }
}

fn tools() -> Vec<ToolSpec> {
    ["get_weather", "get_time", "search"]
        .iter()
        .map(|name| {
            serde_json::from_value(json!({
                "name": name,
                "description": format!("{name} for a place"),
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}
            }))
            .unwrap()
        })
        .collect()
}

async fn call(
    model: &dyn Model,
    messages: &[Message],
    tools: &[ToolSpec],
) -> Result<ModelResponse, ModelError> {
    let settings = ModelSettings::default();
    let request = ModelRequest {
        instructions: Some("Answer with the tools."),
        messages,
        tools,
        output_schema: None,
        settings: &settings,
    };
    tokio::time::timeout(Duration::from_secs(60), complete(model, request))
        .await
        .expect("the call hung")
}

/// Runs one case; every mismatch is a line of the returned list.
async fn run(case: &Case) -> Vec<String> {
    let mut problems = Vec::new();
    let server = QuirkServer::start(case.replies.clone()).await;
    let model = model_for(case, &server.uri);
    let tools = tools();
    let first = [Message::user("What is the weather in Paris and Tokyo?")];
    let result = call(&*model, &first, &tools).await;
    let e = &case.expect;
    if let Some(n) = e.requests
        && server.requests().len() != n
    {
        problems.push(format!(
            "{} requests were made, not {n}",
            server.requests().len()
        ));
    }
    let response = match (result, &e.error) {
        (Err(err), Some(want)) => {
            check_error(&err, want, &mut problems);
            return problems;
        }
        (Err(err), None) => {
            problems.push(format!("failed: {err}"));
            return problems;
        }
        (Ok(r), Some(want)) => {
            problems.push(format!(
                "answered {:?}, expected the error {want:?}",
                r.message
            ));
            return problems;
        }
        (Ok(r), None) => r,
    };
    check_response(&response, e, &mut problems);
    if let Some(next) = &case.next {
        let mut transcript = first.to_vec();
        transcript.push(Message::Assistant(response.message.clone()));
        for c in &response.message.tool_calls {
            transcript.push(Message::Tool(ToolResult {
                call_id: c.call_id.clone(),
                tool: c.tool.as_str().into(),
                content: ToolContent::Text("22 C, sunny".into()),
                is_error: false,
            }));
        }
        if let Err(err) = call(&*model, &transcript, &tools).await {
            problems.push(format!("the next request failed: {err}"));
        }
        let requests = server.requests();
        match requests.last() {
            Some(body) if requests.len() >= 2 => {
                for (pointer, want) in &next.equals {
                    match body.pointer(pointer) {
                        Some(got) if got == want => {}
                        got => problems
                            .push(format!("next request {pointer}: {got:?}, expected {want}")),
                    }
                }
                for pointer in &next.absent {
                    if let Some(got) = body.pointer(pointer) {
                        problems.push(format!("next request {pointer} should be absent: {got}"));
                    }
                }
            }
            _ => problems.push("no next request reached the server".into()),
        }
    }
    problems
}

fn check_error(err: &ModelError, want: &ExpectedError, problems: &mut Vec<String>) {
    let kind = serde_json::to_value(err.kind).unwrap();
    if kind != want.kind.as_str() {
        problems.push(format!("error kind {kind}, expected {} ({err})", want.kind));
    }
    if err.is_retryable() != want.retryable {
        problems.push(format!(
            "retryable {}, expected {} ({err})",
            err.is_retryable(),
            want.retryable
        ));
    }
    if let Some(part) = &want.message_contains
        && !err.message.contains(part.as_str())
    {
        problems.push(format!("message {:?} lacks {part:?}", err.message));
    }
    if let Some(ms) = want.retry_after_ms
        && err.retry_after != Some(Duration::from_millis(ms))
    {
        problems.push(format!(
            "retry_after {:?}, expected {ms} ms",
            err.retry_after
        ));
    }
}

fn check_response(r: &ModelResponse, e: &Expect, problems: &mut Vec<String>) {
    let m: &AssistantMessage = &r.message;
    if let Some(text) = &e.text
        && &m.text != text
    {
        problems.push(format!("text {:?}, expected {text:?}", m.text));
    }
    if let Some(reasoning) = &e.reasoning {
        let got: String = m.reasoning.iter().map(|r| r.text.as_str()).collect();
        if &got != reasoning {
            problems.push(format!("reasoning {got:?}, expected {reasoning:?}"));
        }
    }
    if let Some(calls) = &e.tool_calls {
        if calls.len() != m.tool_calls.len() {
            problems.push(format!(
                "{} tool calls {:?}, expected {}",
                m.tool_calls.len(),
                m.tool_calls,
                calls.len()
            ));
        }
        for (got, want) in m.tool_calls.iter().zip(calls) {
            if let Some(id) = &want.id
                && *got.call_id != **id
            {
                problems.push(format!("call id {:?}, expected {id:?}", got.call_id));
            }
            if got.tool != want.name {
                problems.push(format!(
                    "call name {:?}, expected {:?}",
                    got.tool, want.name
                ));
            }
            let args: Value = if got.arguments.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(&got.arguments).unwrap_or(Value::String(got.arguments.clone()))
            };
            if args != want.arguments {
                problems.push(format!(
                    "call {} arguments {args}, expected {}",
                    want.name, want.arguments
                ));
            }
        }
    }
    if let Some(cut) = &e.cut_calls {
        let got: Vec<&str> = r.cut_calls.iter().map(|c| c.tool.as_str()).collect();
        if got != *cut {
            problems.push(format!("cut calls {got:?}, expected {cut:?}"));
        }
    }
    if let Some(truncated) = e.truncated
        && r.truncated != truncated
    {
        problems.push(format!("truncated {}, expected {truncated}", r.truncated));
    }
    if let Some(finish) = &e.finish
        && r.finish_reason.as_str() != finish
    {
        problems.push(format!(
            "finish {}, expected {finish}",
            r.finish_reason.as_str()
        ));
    }
    if let Some(usage) = &e.usage {
        let got = serde_json::to_value(r.usage).unwrap();
        for (field, want) in usage {
            if got.get(field) != Some(want) {
                problems.push(format!(
                    "usage.{field} {:?}, expected {want}",
                    got.get(field)
                ));
            }
        }
    }
    if let Some(part) = &e.warning_contains
        && !r.warnings.iter().any(|w| w.contains(part.as_str()))
    {
        problems.push(format!("no warning holds {part:?}: {:?}", r.warnings));
    }
}

#[tokio::test]
async fn every_case_of_the_quirks_corpus_is_read_as_a_correct_client_reads_it() {
    let cases = load_cases();
    let mut failures = Vec::new();
    for (dir, case) in &cases {
        let problems = run(case).await;
        if !problems.is_empty() {
            failures.push(format!(
                "{} ({}):\n    {}",
                case.id,
                dir.display(),
                problems.join("\n    ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn the_corpus_holds_at_least_25_cases_each_citing_its_source() {
    let cases = load_cases();
    assert!(cases.len() >= 25, "{} cases", cases.len());
    for (dir, case) in &cases {
        let name = dir.file_name().unwrap().to_string_lossy();
        assert_eq!(
            name,
            case.id.as_str(),
            "the directory is named by the case id"
        );
        assert!(!case.sources.is_empty(), "{}: no source", case.id);
        for source in &case.sources {
            assert!(
                source.starts_with("https://github.com/"),
                "{}: a source is a repository's issue, pull request or file: {source}",
                case.id
            );
        }
        for text in [&case.server, &case.what, &case.correct_client]
            .into_iter()
            .chain(&case.provenance)
        {
            assert!(
                !text.trim().is_empty(),
                "{}: a description is empty",
                case.id
            );
        }
        assert!(!case.replies.is_empty(), "{}: no reply", case.id);
    }
}
