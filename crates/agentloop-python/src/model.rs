//! The model of a Python-built agent: a live provider from a `[model]` table (read by the CLI's
//! own agent-file loader, so a key means the same thing in both), a scripted model (the same
//! script format as an agent file's `script.json`), or a Python callable answering each request
//! (a function model, for users' own tests).

use std::path::Path;
use std::sync::Arc;

use agentloop::model::{
    ModelError, ModelErrorKind, ModelEvent, ModelRequest, ModelStream, complete,
};
use agentloop::testing::ScriptedModel;
use agentloop::{Message, Model};
use agentloop_cli::agent_file::AgentFile;
use pyo3::prelude::*;

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
/// specs) and the JSON of the tool results at the transcript's end, and answers with the JSON of one step of a script (`{"text": ..., "tool_calls":
/// [...]}`), which the scripted model's own reader turns into the response.
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
            let step = self.ask(&request)?;
            let model = ScriptedModel::from_json(&format!("[{step}]")).map_err(|e| {
                ModelError::new(ModelErrorKind::Decode, format!("function model: {e}"))
            })?;
            complete(&model, request).await.map(ModelEvent::Response)
        }))
    }
}

impl PythonModel {
    fn ask(&self, request: &ModelRequest<'_>) -> Result<String, ModelError> {
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
        let request = serde_json::json!({
            "instructions": request.instructions,
            "messages": request.messages,
            "tools": request.tools,
        })
        .to_string();
        let tail = serde_json::to_string(tail).unwrap_or_else(|_| "[]".into());
        Python::attach(|py| {
            self.f
                .call1(py, (request, tail))
                .and_then(|r| r.extract::<String>(py))
                .map_err(|e| {
                    ModelError::new(ModelErrorKind::Other, python_error_text(py, &e))
                        .with_provider("function")
                })
        })
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
