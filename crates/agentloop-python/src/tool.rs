//! Python functions as tools. The Rust side validates the arguments (the schema the Python side
//! derived from type hints), then hands each call to the Python dispatcher, which runs a sync
//! function on a thread pool and a coroutine on the run's event loop (a batch's coroutines handed
//! over together: [`crate::outbox`]), and answers through a [`ToolReply`]. The run waits for the
//! reply without the GIL; when it stops waiting (cancel, deadline, timeout) the call is
//! cancelled.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::{Tool, ToolContext, ToolError};
use pyo3::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::exit::attach_unless_exiting;
use crate::outbox::{CallState, Outbox, Reply, ToolReply, Waiting};

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
    /// A coroutine function: its calls run on the run's event loop.
    #[pyo3(item)]
    is_async: bool,
}

impl ToolDef {
    /// Its name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The tool as an agent file's checks see it: its name and the top-level `properties` of
    /// its schema (`None` when the schema lists none, so no argument match is refused).
    pub(crate) fn host_tool(&self) -> agentloop_cli::agent_file::HostTool {
        let arguments = serde_json::from_str::<serde_json::Value>(&self.schema)
            .ok()
            .and_then(|schema| {
                let properties = schema.get("properties")?.as_object()?;
                Some(properties.keys().cloned().collect())
            });
        agentloop_cli::agent_file::HostTool {
            name: self.name.clone(),
            arguments,
        }
    }
}

tokio::task_local! {
    /// Where the coroutine tools of the run this task drives go: its event loop (`run_async`,
    /// `stream`; the package's own for a blocking `run`).
    pub(crate) static EVENT_LOOP: Arc<Outbox>;

    /// What the tool calls of the run this task drives hand the dispatcher: the Python side's
    /// `RunScope` of the run (where their tracebacks go, so that they end with the run), or
    /// `None` for a run started without one.
    pub(crate) static RUN_SCOPE: Option<Arc<Py<PyAny>>>;
}

/// The `RunScope` of the run this task drives, if it has one.
fn run_scope() -> Option<Arc<Py<PyAny>>> {
    RUN_SCOPE.try_with(Clone::clone).ok().flatten()
}

/// The code a coroutine call answers with when its task was cancelled (`_tools.py`), and a call
/// cancelled before it started: the run records such a call `cancelled` (the core's
/// `codes::CANCELLED`).
const CANCELLED: &str = "cancelled";

/// A call in flight, to cancel if the run stops waiting for it.
enum InFlight {
    /// A sync call: the dispatcher's handle (a `concurrent.futures.Future`).
    Sync(Py<PyAny>),
    /// A coroutine call.
    Async(Arc<CallState>),
}

/// Cancels the call it holds when the run stops waiting (cancel, deadline, timeout); emptied
/// once the call answered.
struct CancelOnDrop(Option<InFlight>);

impl CancelOnDrop {
    /// Cancels the call now: a task is cancelled on its loop, a sync call that has not started
    /// never starts (one running keeps its thread: Python cannot stop it).
    fn cancel(&mut self) {
        match self.0.take() {
            // At the interpreter's exit the call is left: its thread ends with the process.
            Some(InFlight::Sync(handle)) => {
                attach_unless_exiting(|py| {
                    if let Err(e) = handle.call_method0(py, "cancel") {
                        e.write_unraisable(py, None);
                    }
                });
            }
            Some(InFlight::Async(state)) => state.cancel(),
            None => {}
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Waits for a call's reply. When the run is cancelled or its deadline passes, the Python side
/// is told at once (its task cancelled), not when the run's grace period is over and drops the
/// call: its cleanup (`except CancelledError`, `finally`) runs within that period, before the
/// run ends. Whatever it answers then is reported as soon as it answers, so a run whose tools
/// all stopped when told ends without waiting out the period: a call cut short (its task
/// cancelled, or never started) answers `cancelled`, which the run records as any call it
/// stopped. The grace period stays the bound for a call that does not stop.
async fn reply_of(
    rx: &mut oneshot::Receiver<Reply>,
    guard: &mut CancelOnDrop,
    ctx: &ToolContext,
) -> Reply {
    tokio::select! {
        biased;
        reply = &mut *rx => {
            // Answered: nothing to cancel.
            guard.0 = None;
            reply.unwrap_or_else(|_| Err(ToolError::fatal("the tool's Python side never answered")))
        }
        () = ctx.cancel.cancelled() => {
            guard.cancel();
            // A call dropped unanswered (cancelled before it started) was cut short as well.
            rx.await.unwrap_or_else(|_| Err(ToolError::new(CANCELLED, "the call was cancelled before it started")))
        }
    }
}

/// The tool, over the Python dispatcher: `dispatcher(index, arguments, run_id, call_id, reply,
/// scope)` (the arguments as a dict, `scope` the run's [`RUN_SCOPE`]) starts sync call `index` of
/// the agent's tools on the thread pool and returns its future; `dispatcher.start_async(...)`,
/// with the same arguments, a coroutine call on the loop (see [`crate::outbox`]).
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
    let is_async = def.is_async;
    if let Some(secs) = def.timeout {
        let timeout = Duration::try_from_secs_f64(secs)
            .map_err(|e| crate::error("tool.timeout_invalid", e))?;
        builder = builder.timeout(timeout);
    }
    Ok(
        builder.dynamic(schema, move |args: Value, ctx: ToolContext| {
            let dispatcher = Arc::clone(&dispatcher);
            async move {
                if is_async {
                    call_async(dispatcher, index, &args, &ctx).await
                } else {
                    call(&dispatcher, index, &args, &ctx).await
                }
            }
        }),
    )
}

/// A coroutine call: queued for the run's loop; the run waits for its reply without the GIL.
async fn call_async(
    dispatcher: Arc<Py<PyAny>>,
    index: usize,
    args: &Value,
    ctx: &ToolContext,
) -> Reply {
    let (tx, mut rx) = oneshot::channel();
    let state = Arc::new(CallState::default());
    let outbox = EVENT_LOOP
        .try_with(Arc::clone)
        .unwrap_or_else(|_| Arc::new(Outbox::new(None)));
    outbox.send(Waiting {
        dispatcher,
        index,
        arguments: args.clone(),
        run_id: Arc::clone(&ctx.run_id),
        call_id: Arc::clone(&ctx.call_id),
        scope: run_scope(),
        tx,
        state: Arc::clone(&state),
    });
    let mut guard = CancelOnDrop(Some(InFlight::Async(state)));
    reply_of(&mut rx, &mut guard, ctx).await
}

/// A sync call: on the dispatcher's thread pool.
async fn call(dispatcher: &Py<PyAny>, index: usize, args: &Value, ctx: &ToolContext) -> Reply {
    let (tx, mut rx) = oneshot::channel();
    let scope = run_scope();
    let started = attach_unless_exiting(|py| {
        let reply = ToolReply {
            tx: Mutex::new(Some(tx)),
            outbox: None,
        };
        Py::new(py, reply)
            .and_then(|reply| {
                let arguments = crate::value::to_python(py, args)?;
                let (run_id, call_id) = (&*ctx.run_id, &*ctx.call_id);
                dispatcher.call1(
                    py,
                    (index, arguments, run_id, call_id, reply, scope.as_deref()),
                )
            })
            .map_err(|e| crate::model::python_error_text(py, &e))
    });
    let handle = match started {
        Some(Ok(handle)) => handle,
        Some(Err(text)) => {
            return Err(ToolError::fatal(format!(
                "the tool dispatcher failed: {text}"
            )));
        }
        // At the interpreter's exit no Python runs: the call never starts and is left as a
        // killed process leaves it (a journaled run resumes it).
        None => return std::future::pending().await,
    };
    let mut guard = CancelOnDrop(Some(InFlight::Sync(handle)));
    reply_of(&mut rx, &mut guard, ctx).await
}
