//! The corpus of tool calls as models really write them in text (`tests/corpus/*.json`): outputs
//! recorded from llama-server with the small Qwen models of `scripts/local-model/`, and shapes
//! from public reports of other models, each with its source. Every case is served over loopback
//! HTTP as a streamed answer, cut into pieces of several sizes, to a Chat Completions model with
//! its `tool_dialect`, in a request that offers the case's tools; the calls read and the text
//! left must be the expected ones, however the text was cut.
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
use std::time::Duration;

use agentloop::model::{ModelRequest, ModelSettings, complete};
use agentloop::tool::ToolSpec;
use agentloop::{Message, ModelResponse};
use agentloop_providers::OpenAiChat;
use agentloop_providers::http::HttpConfig;
use agentloop_providers::openai_chat::ToolDialect;
use serde::Deserialize;
use serde_json::{Value, json};
use server::{QuirkServer, Reply};

/// One file of the corpus.
#[derive(Debug, Deserialize)]
struct CorpusFile {
    /// Where its cases come from and how they were taken.
    #[allow(dead_code)]
    about: String,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    id: String,
    /// The model that wrote it.
    #[allow(dead_code)]
    model: String,
    /// Recorded here (how), or the public report it is copied from.
    source: String,
    /// The tools the request offered.
    tools: Vec<String>,
    /// The dialects that must read it so (default: `auto`).
    #[serde(default)]
    dialects: Vec<String>,
    /// The answer's text, as the server returned it in `content`.
    text: String,
    /// The calls read out of it, in order.
    calls: Vec<ExpectedCall>,
    /// The text left once the calls are read.
    rest: String,
}

#[derive(Debug, Deserialize)]
struct ExpectedCall {
    name: String,
    arguments: Value,
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn load() -> Vec<(String, Case)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let corpus: CorpusFile =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        cases.extend(corpus.cases.into_iter().map(|c| (name.clone(), c)));
    }
    cases
}

fn specs(names: &[String]) -> Vec<ToolSpec> {
    names
        .iter()
        .map(|name| {
            serde_json::from_value(json!({
                "name": name,
                "description": format!("the {name} tool"),
                "input_schema": {"type": "object"}
            }))
            .unwrap()
        })
        .collect()
}

async fn read(case: &Case, dialect: ToolDialect, size: usize) -> Result<ModelResponse, String> {
    read_text(&case.text, &case.tools, dialect, size, None).await
}

/// Serves `text` streamed in pieces of `size` chars, read in `dialect` by a model whose
/// events are at most `max_event_bytes` (the default: none given).
async fn read_text(
    text: &str,
    tools: &[String],
    dialect: ToolDialect,
    size: usize,
    max_event_bytes: Option<usize>,
) -> Result<ModelResponse, String> {
    let server = QuirkServer::start(vec![Reply::content_stream(text, size)]).await;
    let mut builder = OpenAiChat::compatible("local", &server.uri, "local").tool_dialect(dialect);
    if let Some(max) = max_event_bytes {
        let mut config = HttpConfig::new(&server.uri);
        config.max_event_bytes = max;
        builder = builder.http_config(config);
    }
    let model = builder.build().map_err(|e| e.to_string())?;
    let tools = specs(tools);
    // On a task of its own, so that the hang guard fires even when reading holds its worker.
    let call = tokio::spawn(async move {
        let settings = ModelSettings::default();
        let messages = [Message::user("the corpus question")];
        let request = ModelRequest {
            instructions: None,
            messages: &messages,
            tools: &tools,
            output_schema: None,
            settings: &settings,
        };
        complete(&model, request).await
    });
    let abort = call.abort_handle();
    let response = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .map_err(|_| {
            abort.abort();
            "the call hung".to_owned()
        })?
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    // What reached the server: no tools field, the tools described in the prompt.
    let sent = server.requests();
    let body = sent.first().ok_or("no request reached the server")?;
    if body.get("tools").is_some() {
        return Err("the tools field was sent with a dialect".into());
    }
    Ok(response)
}

fn check(case: &Case, response: &ModelResponse) -> Vec<String> {
    let mut problems = Vec::new();
    let got: Vec<(String, Value)> = response
        .message
        .tool_calls
        .iter()
        .map(|c| {
            (
                c.tool.to_string(),
                serde_json::from_str(&c.arguments).unwrap_or(Value::String(c.arguments.clone())),
            )
        })
        .collect();
    let want: Vec<(String, Value)> = case
        .calls
        .iter()
        .map(|c| (c.name.clone(), c.arguments.clone()))
        .collect();
    if got != want {
        problems.push(format!("calls {got:?}, expected {want:?}"));
    }
    if response.message.text != case.rest {
        problems.push(format!(
            "text {:?}, expected {:?}",
            response.message.text, case.rest
        ));
    }
    problems
}

#[tokio::test(flavor = "multi_thread")]
async fn every_corpus_case_is_read_to_its_calls_however_the_stream_is_cut() {
    let cases = load();
    assert!(cases.len() >= 10, "the corpus has {} cases", cases.len());
    let mut failures = Vec::new();
    for (file, case) in &cases {
        assert!(
            !case.source.trim().is_empty(),
            "{file} {}: a case names its source",
            case.id
        );
        let dialects = if case.dialects.is_empty() {
            vec!["auto".to_owned()]
        } else {
            case.dialects.clone()
        };
        for name in &dialects {
            let dialect = ToolDialect::from_name(name)
                .unwrap_or_else(|| panic!("{file} {}: no dialect {name}", case.id));
            for size in [1, 5, 17, usize::MAX] {
                let size = size.min(case.text.chars().count().max(1));
                match read(case, dialect, size).await {
                    Ok(response) => {
                        for p in check(case, &response) {
                            failures.push(format!(
                                "{file} {} ({name}, pieces of {size}): {p}",
                                case.id
                            ));
                        }
                    }
                    Err(e) => failures.push(format!("{file} {} ({name}): {e}", case.id)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A case written here rather than recorded: a shape small models are reported to write that
/// the recorded corpus does not hold.
fn written(id: &str, tools: &[&str], text: &str, calls: Vec<ExpectedCall>, rest: &str) -> Case {
    Case {
        id: id.to_owned(),
        model: "small models".to_owned(),
        source: "written here (review F, finding 5)".to_owned(),
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        dialects: Vec::new(),
        text: text.to_owned(),
        calls,
        rest: rest.to_owned(),
    }
}

fn call(name: &str, arguments: Value) -> ExpectedCall {
    ExpectedCall {
        name: name.to_owned(),
        arguments,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_line_breaks_a_call_after_text_and_a_fence_closed_on_the_calls_line_are_read() {
    let content = "Add:\n```python\ndef add(a, b):\n\treturn a + b\n```\n";
    let cases = [
        // A multi-line `content` written with its line breaks and tabs as they are, holding a
        // fence of its own.
        written(
            "raw-control-characters",
            &["write_file"],
            &format!(
                "```json\n{{\"name\": \"write_file\", \"arguments\": {{\"path\": \"README.md\", \"content\": \"{content}\"}}}}\n```"
            ),
            vec![call(
                "write_file",
                json!({"path": "README.md", "content": content}),
            )],
            "",
        ),
        // A bare call after text on the same line.
        written(
            "call-after-text",
            &["get_weather"],
            "I'll check: {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            vec![call("get_weather", json!({"city": "Paris"}))],
            "I'll check: ",
        ),
        // The closing fence right after the call, and text after it.
        written(
            "fence-closed-on-the-calls-line",
            &["get_weather"],
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}```\nDone.",
            vec![call("get_weather", json!({"city": "Paris"}))],
            "\nDone.",
        ),
    ];
    let mut failures = Vec::new();
    for case in &cases {
        for size in [1, 5, 17, usize::MAX] {
            let size = size.min(case.text.chars().count());
            match read(case, ToolDialect::Auto, size).await {
                Ok(response) => failures.extend(
                    check(case, &response)
                        .into_iter()
                        .map(|p| format!("{} (pieces of {size}): {p}", case.id)),
                ),
                Err(e) => failures.push(format!("{}: {e}", case.id)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How long the blocks below are: streamed sixteen characters an event, reading a held block
/// again from its start at each event takes some 10^10 steps (the call's hang guard ends it
/// long before), reading it once a fraction of a second. Nothing is timed.
const LONG: usize = 1 << 20;

/// The characters an event carries in those streams.
const PIECE: usize = 16;

#[tokio::test(flavor = "multi_thread")]
async fn a_megabyte_call_streamed_in_tiny_pieces_is_read_once() {
    let content = "x = 1\n".repeat(LONG / 6);
    let arguments = json!({"path": "big.py", "content": content});
    let body = json!({"name": "write_file", "arguments": arguments}).to_string();
    for (dialect, text) in [
        (ToolDialect::Auto, body.clone()),
        (
            ToolDialect::Hermes,
            format!("<tool_call>\n{body}\n</tool_call>"),
        ),
        (ToolDialect::Auto, format!("Here:\n```json\n{body}\n```")),
    ] {
        let response = read_text(&text, &["write_file".to_owned()], dialect, PIECE, None)
            .await
            .unwrap();
        let calls = &response.message.tool_calls;
        assert_eq!(calls.len(), 1, "{dialect:?}");
        let got: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(got, arguments, "{dialect:?}");
        assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_that_never_ends_is_text_once_past_the_largest_event() {
    // A model looping inside its call: the block is held up to the largest event the model
    // reads (here 64 KiB), then it and the rest of the answer are text, with a warning.
    let text = format!(
        "<tool_call>{{\"name\": \"write_file\", \"arguments\": {{\"content\": \"{}",
        "ab ".repeat(LONG / 3)
    );
    for dialect in [ToolDialect::Hermes, ToolDialect::Auto] {
        let response = read_text(
            &text,
            &["write_file".to_owned()],
            dialect,
            PIECE,
            Some(64 * 1024),
        )
        .await
        .unwrap();
        assert!(response.message.tool_calls.is_empty(), "{dialect:?}");
        assert_eq!(response.message.text, text, "{dialect:?}");
        assert!(
            response
                .warnings
                .iter()
                .any(|w| w.contains("did not end within 65536 bytes")),
            "{dialect:?}: {:?}",
            response.warnings
        );
    }
}
