//! The model of a Python-built agent: a live provider from a `[model]` table (read by the CLI's
//! own agent-file loader, so a key means the same thing in both), a scripted model (the same
//! script format as an agent file's `script.json`), or a Python callable answering each request
//! (a function model, for users' own tests).
//!
//! A model whose answers depend on the calls made before (a script) starts over with each run of
//! the agent ([`PerRun`]), as each `agentloop run` of an agent file does: runs of one agent, one
//! after the other or at once, each get the whole script, and a resumed run goes on where its
//! journal left it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
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
use futures::StreamExt;
use pyo3::prelude::*;
use serde::Serialize;
use tokio::sync::oneshot;

use crate::error;
use crate::exit::attach_unless_exiting;

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
            Ok((per_run(model), Some(file)))
        }
        // Streamed, as an agent file's script is by default: its text arrives as deltas.
        ("scripted", _) => ScriptedModel::from_json(spec)
            .map(|m| (per_run(Arc::new(m.streaming(true))), None))
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

/// `model`, started over by each run when its answers depend on the calls made before (it has a
/// [`Model::resumed`] form: a script), else as it is.
pub(crate) fn per_run(model: Arc<dyn Model>) -> Arc<dyn Model> {
    if model.resumed(0).is_none() {
        return model;
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    Arc::new(PerRun {
        id: NEXT.fetch_add(1, Ordering::Relaxed),
        model,
    })
}

tokio::task_local! {
    /// What the models of the run this task drives keep for it: set by `NativeAgent::launch`
    /// around each run.
    pub(crate) static RUN_MODELS: RunModels;
}

/// What the models of one run keep for it.
pub(crate) struct RunModels {
    /// The loop the run was given (`run_async`'s and `stream`'s, the caller's; for a blocking
    /// `run`, the package's loop for it when it is not the first one): an async function model
    /// answers on it (`FunctionModel._call`), else on the package's first loop.
    event_loop: Option<Py<PyAny>>,
    /// The models the run started for itself ([`PerRun`]), by their [`PerRun`]'s id.
    started: Mutex<Vec<(u64, Arc<dyn Model>)>>,
}

impl RunModels {
    /// A run's, on `event_loop` when it was given one.
    pub(crate) fn new(event_loop: Option<Py<PyAny>>) -> RunModels {
        RunModels {
            event_loop,
            started: Mutex::new(Vec::new()),
        }
    }
}

/// A model each run starts over ([`per_run`]): the first call of a run takes the model's
/// `resumed(0)`, which the run's later calls go on with. Outside a run's task (nothing of the
/// package calls it there) the model itself answers.
struct PerRun {
    /// Which model a run started ([`RunModels`]) is this one's.
    id: u64,
    model: Arc<dyn Model>,
}

impl PerRun {
    /// This run's own model, made at its first call.
    fn this_run(&self) -> Option<Arc<dyn Model>> {
        RUN_MODELS
            .try_with(|run| {
                let mut models = run.started.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((_, m)) = models.iter().find(|(id, _)| *id == self.id) {
                    return Arc::clone(m);
                }
                let fresh = self
                    .model
                    .resumed(0)
                    .unwrap_or_else(|| Arc::clone(&self.model));
                models.push((self.id, Arc::clone(&fresh)));
                fresh
            })
            .ok()
    }
}

impl Model for PerRun {
    fn id(&self) -> &str {
        self.model.id()
    }

    fn provider(&self) -> &str {
        self.model.provider()
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let Some(model) = self.this_run() else {
            return self.model.stream(request);
        };
        // The run's model is owned here, not by `self`: its answer is read whole, then given
        // (a script's answer is ready at once, or after its delay, in one piece anyway).
        Box::pin(
            futures::stream::once(async move {
                let events: Vec<_> = model.stream(request).collect().await;
                futures::stream::iter(events)
            })
            .flatten(),
        )
    }

    fn resumed(&self, model_calls: usize) -> Option<Arc<dyn Model>> {
        self.model.resumed(model_calls)
    }

    fn cache_identity(
        &self,
        request: &ModelRequest<'_>,
    ) -> Option<agentloop::model::CacheIdentity> {
        self.model.cache_identity(request)
    }

    fn keeps_answers(&self) -> bool {
        self.model.keeps_answers()
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
        let Some(later) = attach_unless_exiting(|py| {
            let run_loop = RUN_MODELS
                .try_with(|run| run.event_loop.as_ref().map(|l| l.clone_ref(py)))
                .ok()
                .flatten();
            let answer = self
                .f
                .call1(py, (request, tail, run_loop))
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
            Ok(Asked::Later(rx, CancelPending(Some(answer))))
        }) else {
            // At the interpreter's exit no Python runs: the call is left unanswered, as a killed
            // process leaves it, and a journaled run resumes from here.
            return std::future::pending().await;
        };
        match later? {
            Asked::Now(now) => Ok(now),
            Asked::Later(rx, mut pending) => {
                let answer = rx.await.unwrap_or_else(|_| {
                    Err(
                        ModelError::new(ModelErrorKind::Other, "the function model never answered")
                            .with_provider("function"),
                    )
                });
                // Answered: nothing to cancel.
                pending.0 = None;
                answer
            }
        }
    }
}

/// A function model's answer: given, or to come from its loop.
enum Asked {
    Now(Answer),
    Later(oneshot::Receiver<Result<Answer, ModelError>>, CancelPending),
}

/// The `concurrent.futures.Future` of a Python coroutine the run waits for (an async function
/// model's answer, an async approval callback's), cancelled when the run stops waiting (it was
/// cancelled, or its deadline passed): the coroutine is told (`CancelledError`) instead of going
/// on for nobody, a model's request with it.
pub(crate) struct CancelPending(pub(crate) Option<Py<PyAny>>);

impl Drop for CancelPending {
    fn drop(&mut self) {
        // At the interpreter's exit it is left: its loop runs no more.
        if let Some(future) = self.0.take() {
            attach_unless_exiting(|py| {
                if let Err(e) = future.call_method0(py, "cancel") {
                    e.write_unraisable(py, None);
                }
            });
        }
    }
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
                call_id: call_id.into(),
                tool: tool.into(),
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
