//! The model of a Python-built agent: a live provider from a `[model]` table (read by the CLI's
//! own agent-file loader, so a key means the same thing in both), a scripted model (the same
//! script format as an agent file's `script.json`), or a Python callable answering each request
//! (a function model, for users' own tests).

use std::path::Path;
use std::sync::{Arc, Mutex};

use agentloop::message::{AssistantMessage, ToolCall};
use agentloop::model::{
    FinishReason, ModelError, ModelErrorKind, ModelEvent, ModelRequest, ModelResponse, ModelStream,
    Usage,
};
use agentloop::testing::ScriptedModel;
use agentloop::tool::ToolSpec;
use agentloop::{Message, Model};
use agentloop_cli::agent_file::AgentFile;
use pyo3::prelude::*;
use serde::Serialize;
use tokio::sync::oneshot;

use crate::error;

/// The model a Python `Agent` names. `kind` is `"provider"` (`spec` is the TOML of an agent
/// file whose `[model]` is the one wanted, `base` the folder its paths are relative to),
/// `"scripted"` (`spec` is the script's JSON) or `"function"` (`callable` answers; `spec` is
/// its model id).
/// A provider's model comes with the `[model]` table it was read from: its other keys
/// (sampling, tool choice, compaction, price) go on the agent.
pub(crate) fn build(
    kind: &str,
    spec: &str,
    base: &str,
    callable: Option<Py<PyAny>>,
) -> PyResult<(Arc<dyn Model>, Option<AgentFile>)> {
    match (kind, callable) {
        ("provider", _) => {
            let file = AgentFile::parse(&Path::new(base).join("agent.toml"), spec)
                .map_err(|p| error("agent_file.invalid", p))?;
            let model = agentloop_cli::assemble::model(&file).map_err(|e| error(e.code(), e))?;
            Ok((model, Some(file)))
        }
        // Streamed, as an agent file's script is by default: its text arrives as deltas.
        ("scripted", _) => ScriptedModel::from_json(spec)
            .map(|m| (Arc::new(m.streaming(true)) as Arc<dyn Model>, None))
            .map_err(|e| error("model.script_invalid", e)),
        ("function", Some(f)) => Ok((
            Arc::new(PythonModel {
                id: spec.to_owned(),
                f,
            }),
            None,
        )),
        _ => Err(error(
            "model.unknown",
            format!("no model of kind {kind:?} (a function model needs its callable)"),
        )),
    }
}

/// A Python callable as a model. It gets the request as JSON (instructions, transcript, tool
/// specs) and the JSON of the tool results at the transcript's end, and answers with an
/// [`Answer`]: Python objects, read here with no JSON in between.
struct PythonModel {
    id: String,
    f: Py<PyAny>,
}

impl Model for PythonModel {
    fn id(&self) -> &str {
        &self.id
    }

    fn provider(&self) -> &str {
        "function"
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        Box::pin(futures::stream::once(async move {
            self.ask(&request)
                .await
                .map(|a| ModelEvent::Response(a.response()))
        }))
    }
}

impl PythonModel {
    async fn ask(&self, request: &ModelRequest<'_>) -> Result<Answer, ModelError> {
        // The tool results the model answers, apart: a function that reads only them (most do)
        // never parses the whole transcript, so a turn's cost does not grow with the history.
        let answered = request
            .messages
            .iter()
            .rev()
            .take_while(|m| matches!(m, Message::Tool(_)))
            .count();
        let tail = request
            .messages
            .get(request.messages.len().saturating_sub(answered)..)
            .unwrap_or_default();
        // Written straight to text: no `Value` tree of the whole transcript on the way.
        let request = serde_json::to_string(&RequestJson {
            instructions: request.instructions,
            messages: request.messages,
            tools: request.tools,
        })
        .map_err(|e| ModelError::new(ModelErrorKind::Other, format!("function model: {e}")))?;
        let tail = serde_json::to_string(tail).unwrap_or_else(|_| "[]".into());
        let later = Python::attach(|py| {
            let answer = self
                .f
                .call1(py, (request, tail))
                .map_err(|e| failed(py, &e))?;
            if let Ok(now) = answer.extract::<Answer>(py) {
                return Ok(Asked::Now(now));
            }
            // An async function's answer, asked from a loop's own thread (a run driven there):
            // a future its loop settles, awaited here without blocking the thread.
            let (tx, rx) = oneshot::channel();
            let settled = Py::new(py, Settled(Mutex::new(Some(tx)))).map_err(|e| failed(py, &e))?;
            answer
                .call_method1(py, "add_done_callback", (settled,))
                .map_err(|e| failed(py, &e))?;
            Ok(Asked::Later(rx))
        })?;
        match later {
            Asked::Now(now) => Ok(now),
            Asked::Later(rx) => rx.await.unwrap_or_else(|_| {
                Err(
                    ModelError::new(ModelErrorKind::Other, "the function model never answered")
                        .with_provider("function"),
                )
            }),
        }
    }
}

/// A function model's answer: given, or to come from its loop.
enum Asked {
    Now(Answer),
    Later(oneshot::Receiver<Result<Answer, ModelError>>),
}

/// A Python exception of a function model, as the model's error.
fn failed(py: Python<'_>, e: &PyErr) -> ModelError {
    ModelError::new(ModelErrorKind::Other, python_error_text(py, e)).with_provider("function")
}

/// The done callback of an async function model's answer (a `concurrent.futures.Future`).
#[pyclass(module = "agentloop._agentloop", frozen)]
pub(crate) struct Settled(Mutex<Option<oneshot::Sender<Result<Answer, ModelError>>>>);

#[pymethods]
impl Settled {
    fn __call__(&self, py: Python<'_>, future: Py<PyAny>) {
        let answer = future
            .call_method0(py, "result")
            .and_then(|r| r.extract::<Answer>(py))
            .map_err(|e| failed(py, &e));
        let tx = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            // The run may have stopped waiting: then nobody reads the answer.
            let _ = tx.send(answer);
        }
    }
}

/// What a function model is asked, as the Python side reads it (`ModelRequest`).
#[derive(Serialize)]
struct RequestJson<'a> {
    instructions: Option<&'a str>,
    messages: &'a [Message],
    tools: &'a [ToolSpec],
}

/// A function model's answer as the Python side hands it over (`FunctionModel._call`): its text
/// (`None` for none), its calls as `(id, name, raw JSON arguments)`, its input and output tokens.
#[derive(FromPyObject)]
struct Answer(Option<String>, Vec<(String, String, String)>, u64, u64);

impl Answer {
    /// The response, as the scripted model builds one from a script's step.
    fn response(self) -> ModelResponse {
        let Answer(text, calls, input_tokens, output_tokens) = self;
        let tool_calls: Vec<ToolCall> = calls
            .into_iter()
            .map(|(call_id, tool, arguments)| ToolCall {
                call_id,
                tool,
                arguments,
            })
            .collect();
        let finish_reason = if tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        };
        ModelResponse {
            message: AssistantMessage {
                reasoning: Vec::new(),
                text: text.unwrap_or_default(),
                tool_calls,
            },
            usage: Usage {
                input_tokens,
                output_tokens,
                ..Usage::default()
            },
            finish_reason,
            raw_finish_reason: None,
            id: None,
            model: Some("scripted".into()),
            truncated: false,
            cut_calls: Vec::new(),
            warnings: Vec::new(),
            cached: false,
        }
    }
}

/// `TypeName: message` of a Python exception.
pub(crate) fn python_error_text(py: Python<'_>, e: &PyErr) -> String {
    let name = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    format!("{name}: {}", e.value(py))
}
