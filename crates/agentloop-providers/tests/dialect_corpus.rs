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
    let server = QuirkServer::start(vec![Reply::content_stream(&case.text, size)]).await;
    let model = OpenAiChat::compatible("local", &server.uri, "local")
        .tool_dialect(dialect)
        .build()
        .map_err(|e| e.to_string())?;
    let tools = specs(&case.tools);
    let settings = ModelSettings::default();
    let messages = [Message::user("the corpus question")];
    let request = ModelRequest {
        instructions: None,
        messages: &messages,
        tools: &tools,
        output_schema: None,
        settings: &settings,
    };
    let response = tokio::time::timeout(Duration::from_secs(30), complete(&model, request))
        .await
        .map_err(|_| "the call hung".to_owned())?
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
