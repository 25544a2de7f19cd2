//! Python functions as tools. The Rust side validates the arguments (the schema the Python side
//! derived from type hints), then hands each call to the Python dispatcher, which runs a sync
//! function on a thread pool and a coroutine on the run's event loop, and answers through a
//! [`ToolReply`]. The run waits for the reply without the GIL; when it stops waiting (cancel,
//! deadline, timeout) the dispatcher is told to cancel the call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::{Tool, ToolContext, ToolError, ToolOutput};
use pyo3::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

/// What a tool call's Python side answers with.
type Reply = Result<ToolOutput, ToolError>;

/// A tool as the Python side describes it.
#[derive(Debug, Clone, FromPyObject)]
pub(crate) struct ToolDef {
    /// Its name.
    #[pyo3(item)]
    name: String,
    /// What the model reads about it.
    #[pyo3(item)]
    description: String,
    /// The JSON Schema of its arguments, as JSON text.
    #[pyo3(item)]
    schema: String,
    /// Safe to run again after a crash.
    #[pyo3(item)]
    idempotent: bool,
    /// Never runs beside another call of its batch.
    #[pyo3(item)]
    sequential: bool,
    /// Seconds an attempt may take.
    #[pyo3(item)]
    timeout: Option<f64>,
    /// More attempts after a failure.
    #[pyo3(item)]
    retries: u32,
    /// Each call needs a person's approval.
    #[pyo3(item)]
    pub(crate) ask: bool,
}

impl ToolDef {
    /// Its name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

tokio::task_local! {
    /// The event loop of the run this task drives (`run_async`, `stream`), where its coroutine
    /// tools run; `None` for a blocking `run`, whose coroutines run on the package's own loop.
    pub(crate) static EVENT_LOOP: Option<Arc<Py<PyAny>>>;
}

/// The answer slot of one call, handed to the Python dispatcher. The first answer counts.
#[pyclass(module = "agentloop._agentloop")]
pub(crate) struct ToolReply {
    tx: Mutex<Option<oneshot::Sender<Reply>>>,
}

impl ToolReply {
    fn send(&self, reply: Reply) {
        let tx = match self.tx.lock() {
            Ok(mut slot) => slot.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(tx) = tx {
            // The run may have stopped waiting: then nobody reads the answer.
            let _ = tx.send(reply);
        }
    }
}

#[pymethods]
impl ToolReply {
    /// A text result.
    fn text(&self, text: String) {
        self.send(Ok(ToolOutput::text(text)));
    }

    /// A JSON result (the JSON text of any other value the function returned).
    fn json(&self, json: &str) {
        self.send(
            serde_json::from_str::<Value>(json)
                .map(ToolOutput::json)
                .map_err(|e| ToolError::new("tool.output_not_json", e.to_string())),
        );
    }

    /// An error the model reads.
    fn error(&self, code: String, message: String) {
        self.send(Err(ToolError::new(code, message)));
    }

    /// A failure that ends the run.
    fn fatal(&self, message: String) {
        self.send(Err(ToolError::fatal(message)));
    }
}

/// Tells the dispatcher to cancel a call the run no longer waits for.
struct CancelOnDrop(Option<Py<PyAny>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            Python::attach(|py| {
                if let Err(e) = handle.call_method0(py, "cancel") {
                    e.write_unraisable(py, None);
                }
            });
        }
    }
}

/// The tool, over the Python dispatcher: `dispatcher(index, arguments_json, run_id, call_id,
/// reply, event_loop)` starts call `index` of the agent's tools and returns something with a
/// `cancel()` method.
pub(crate) fn tool(def: ToolDef, index: usize, dispatcher: Arc<Py<PyAny>>) -> PyResult<Tool> {
    let schema: Value = serde_json::from_str(&def.schema)
        .map_err(|e| crate::error("tool.schema_invalid", format!("{}: {e}", def.name)))?;
    let mut builder = Tool::builder(def.name)
        .description(def.description)
        .idempotent(def.idempotent)
        .retries(def.retries);
    if def.sequential {
        builder = builder.sequential();
    }
    if let Some(secs) = def.timeout {
        let timeout = Duration::try_from_secs_f64(secs)
            .map_err(|e| crate::error("tool.timeout_invalid", e))?;
        builder = builder.timeout(timeout);
    }
    Ok(
        builder.dynamic(schema, move |args: Value, ctx: ToolContext| {
            let dispatcher = Arc::clone(&dispatcher);
            async move { call(&dispatcher, index, &args, &ctx).await }
        }),
    )
}

async fn call(dispatcher: &Py<PyAny>, index: usize, args: &Value, ctx: &ToolContext) -> Reply {
    let (tx, rx) = oneshot::channel();
    let event_loop = EVENT_LOOP.try_with(Clone::clone).ok().flatten();
    let started = Python::attach(|py| {
        let reply = Py::new(
            py,
            ToolReply {
                tx: Mutex::new(Some(tx)),
            },
        )?;
        let event_loop = event_loop.map(|l| l.clone_ref(py));
        dispatcher.call1(
            py,
            (
                index,
                args.to_string(),
                &*ctx.run_id,
                &*ctx.call_id,
                reply,
                event_loop,
            ),
        )
    });
    let handle = match started {
        Ok(handle) => handle,
        Err(e) => {
            let text = Python::attach(|py| crate::model::python_error_text(py, &e));
            return Err(ToolError::fatal(format!(
                "the tool dispatcher failed: {text}"
            )));
        }
    };
    let mut guard = CancelOnDrop(Some(handle));
    let reply = rx.await;
    // Answered: nothing to cancel.
    guard.0 = None;
    reply.unwrap_or_else(|_| Err(ToolError::fatal("the tool's Python side never answered")))
}
