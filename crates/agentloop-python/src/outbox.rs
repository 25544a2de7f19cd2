//! Coroutine tool calls handed to their event loop a batch at a time. The runtime starts the
//! calls of a batch one after another on one of its threads; each is put in the run's
//! [`Outbox`], and only the first of a batch takes the GIL and wakes the loop (one
//! `call_soon_threadsafe`), whose [`Drain`] then starts every call waiting, on the loop's thread:
//! one hop and one wake-up per batch instead of one per call. The answers of the calls that
//! finish while the batch starts (eager tasks, Python 3.12+) go back together when it has
//! started, so the runtime's thread is woken once for them, not once each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, ThreadId};

use agentloop::{ToolError, ToolOutput};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::exit::attach_unless_exiting;

/// What a tool call's Python side answers with.
pub(crate) type Reply = Result<ToolOutput, ToolError>;

/// The calls of one run waiting for its event loop.
pub(crate) struct Outbox {
    /// The run's loop (`run_async`, `stream`); unset for a blocking `run` until a coroutine tool
    /// needs it, then the package's background loop.
    event_loop: OnceLock<Py<PyAny>>,
    waiting: Mutex<Vec<Waiting>>,
    /// Answers given while a batch starts, sent together once it has started.
    answered: Mutex<Vec<(oneshot::Sender<Reply>, Reply)>>,
    /// A batch is starting ([`Drain`]), on the loop's thread.
    starting: AtomicBool,
    /// The thread of a run driven on its loop ([`crate::drive`]): a call queued there is started
    /// by the poll that queued it, with no wake-up of the loop.
    driven_on: Option<ThreadId>,
}

/// One call not started yet.
pub(crate) struct Waiting {
    pub(crate) dispatcher: Arc<Py<PyAny>>,
    pub(crate) index: usize,
    /// Validated already; handed to Python as a dict.
    pub(crate) arguments: Value,
    pub(crate) run_id: Arc<str>,
    pub(crate) call_id: Arc<str>,
    /// The run's `RunScope` ([`crate::tool::RUN_SCOPE`]), handed to the dispatcher.
    pub(crate) scope: Option<Arc<Py<PyAny>>>,
    pub(crate) tx: oneshot::Sender<Reply>,
    pub(crate) state: Arc<CallState>,
}

impl Outbox {
    /// The outbox of a run on `event_loop` (`None`: the package's own loop).
    pub(crate) fn new(event_loop: Option<Py<PyAny>>) -> Outbox {
        let cell = OnceLock::new();
        if let Some(l) = event_loop {
            let _ = cell.set(l);
        }
        Outbox {
            event_loop: cell,
            waiting: Mutex::new(Vec::new()),
            answered: Mutex::new(Vec::new()),
            starting: AtomicBool::new(false),
            driven_on: None,
        }
    }

    /// The outbox of a run driven on `event_loop`'s thread, which is this one.
    pub(crate) fn driven(event_loop: Py<PyAny>) -> Outbox {
        Outbox {
            driven_on: Some(thread::current().id()),
            ..Outbox::new(Some(event_loop))
        }
    }

    fn waiting(&self) -> MutexGuard<'_, Vec<Waiting>> {
        lock(&self.waiting)
    }

    /// Queues a call; the first of a batch wakes the loop to start them all.
    pub(crate) fn send(self: &Arc<Self>, call: Waiting) {
        let first = {
            let mut waiting = self.waiting();
            waiting.push(call);
            waiting.len() == 1
        };
        if !first || self.driven_on == Some(thread::current().id()) {
            return;
        }
        let woken = attach_unless_exiting(|py| {
            let wake = || -> PyResult<Py<PyAny>> {
                let event_loop = self.event_loop(py)?;
                let drain = Py::new(py, Drain(Arc::clone(self)))?;
                event_loop.call_method1(py, "call_soon_threadsafe", (drain,))
            };
            wake().map_err(|e| crate::model::python_error_text(py, &e))
        });
        let failed = match woken {
            Some(Ok(_)) => return,
            // The loop is closed (or never was): no call of the batch can start.
            Some(Err(text)) => format!("the tool dispatcher failed: {text}"),
            // At the interpreter's exit no Python runs: the calls stay waiting, never started,
            // as a killed process leaves them (a journaled run resumes them).
            None => return,
        };
        for call in std::mem::take(&mut *self.waiting()) {
            let _ = call.tx.send(Err(ToolError::fatal(failed.clone())));
        }
    }

    /// A coroutine call's answer (on the loop's thread): kept while its batch starts, else
    /// sent at once.
    fn answer(&self, tx: oneshot::Sender<Reply>, reply: Reply) {
        if self.starting.load(Ordering::Relaxed) {
            lock(&self.answered).push((tx, reply));
        } else {
            // The run may have stopped waiting: then nobody reads the answer.
            let _ = tx.send(reply);
        }
    }

    fn flush(&self) {
        for (tx, reply) in std::mem::take(&mut *lock(&self.answered)) {
            // The run may have stopped waiting: then nobody reads the answer.
            let _ = tx.send(reply);
        }
    }

    /// The run's loop: the one it was given, else (first asked) the package's background loop.
    pub(crate) fn event_loop(&self, py: Python<'_>) -> PyResult<&Py<PyAny>> {
        if let Some(l) = self.event_loop.get() {
            return Ok(l);
        }
        let background = py
            .import("agentloop._tools")?
            .getattr("background_loop")?
            .call0()?
            .unbind();
        Ok(self.event_loop.get_or_init(|| background))
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the calls waiting in an outbox: called on the event loop's thread.
#[pyclass(module = "agentloop._agentloop", frozen)]
pub(crate) struct Drain(Arc<Outbox>);

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) {
        self.0.start_waiting(py);
    }
}

impl Outbox {
    /// Starts every call waiting, on the loop's thread; the answers of those that finish at once
    /// go back together.
    pub(crate) fn start_waiting(self: &Arc<Self>, py: Python<'_>) {
        let batch = std::mem::take(&mut *self.waiting());
        if batch.is_empty() {
            return;
        }
        self.starting.store(true, Ordering::Relaxed);
        for call in batch {
            start(py, self, call);
        }
        self.starting.store(false, Ordering::Relaxed);
        self.flush();
    }
}

/// Hands one call to the dispatcher's `start_async`, which starts its coroutine (eagerly where
/// Python can) and returns its task, or `None` when it already finished.
fn start(py: Python<'_>, outbox: &Arc<Outbox>, call: Waiting) {
    if call.state.is_cancelled() {
        return;
    }
    let reply = match Py::new(
        py,
        ToolReply {
            tx: Mutex::new(Some(call.tx)),
            outbox: Some(Arc::clone(outbox)),
        },
    ) {
        Ok(r) => r,
        Err(e) => {
            e.write_unraisable(py, None);
            return;
        }
    };
    let started = crate::value::to_python(py, &call.arguments).and_then(|arguments| {
        call.dispatcher.call_method1(
            py,
            "start_async",
            (
                call.index,
                arguments,
                &*call.run_id,
                &*call.call_id,
                reply.clone_ref(py),
                call.scope.as_deref(),
            ),
        )
    });
    match started {
        Ok(task) if task.is_none(py) => {}
        Ok(task) => call.state.started(py, task),
        Err(e) => {
            let text = crate::model::python_error_text(py, &e);
            reply.get().send(Err(ToolError::fatal(format!(
                "the tool dispatcher failed: {text}"
            ))));
        }
    }
}

/// Where a coroutine call is: waiting in the outbox, running as a task, or cancelled.
#[derive(Default)]
pub(crate) struct CallState(Mutex<Run>);

#[derive(Default)]
enum Run {
    #[default]
    Waiting,
    Started(Py<PyAny>),
    Cancelled,
}

impl CallState {
    fn lock(&self) -> MutexGuard<'_, Run> {
        lock(&self.0)
    }

    fn is_cancelled(&self) -> bool {
        matches!(*self.lock(), Run::Cancelled)
    }

    /// The call runs as `task` (on the loop's thread, now): cancelled at once if the run stopped
    /// waiting for it meanwhile.
    fn started(&self, py: Python<'_>, task: Py<PyAny>) {
        let mut run = self.lock();
        if matches!(*run, Run::Cancelled) {
            drop(run);
            if let Err(e) = task.call_method0(py, "cancel") {
                e.write_unraisable(py, None);
            }
        } else {
            *run = Run::Started(task);
        }
    }

    /// The run no longer waits for the call (from the runtime's thread): it never starts, or its
    /// task is cancelled on its loop.
    pub(crate) fn cancel(&self) {
        let was = std::mem::replace(&mut *self.lock(), Run::Cancelled);
        let Run::Started(task) = was else {
            return;
        };
        // At the interpreter's exit the task is left: its loop runs no more.
        attach_unless_exiting(|py| {
            let cancelled = task.call_method0(py, "get_loop").and_then(|l| {
                l.call_method1(py, "call_soon_threadsafe", (task.getattr(py, "cancel")?,))
            });
            match cancelled {
                // The loop is closed: nothing runs on it any more.
                Err(e) if e.is_instance_of::<PyRuntimeError>(py) => {}
                Err(e) => e.write_unraisable(py, None),
                Ok(_) => {}
            }
        });
    }
}

/// The answer slot of one call, handed to the Python dispatcher. The first answer counts.
#[pyclass(module = "agentloop._agentloop", frozen)]
pub(crate) struct ToolReply {
    pub(crate) tx: Mutex<Option<oneshot::Sender<Reply>>>,
    /// A coroutine call's: its answer is sent with the others of its turn of the loop. A sync
    /// call (`None`) answers from a thread of the pool, at once.
    pub(crate) outbox: Option<Arc<Outbox>>,
}

impl ToolReply {
    pub(crate) fn send(&self, reply: Reply) {
        let Some(tx) = lock(&self.tx).take() else {
            return;
        };
        match &self.outbox {
            Some(outbox) => outbox.answer(tx, reply),
            // The run may have stopped waiting: then nobody reads the answer.
            None => {
                let _ = tx.send(reply);
            }
        }
    }
}

/// Python text as Rust's, whatever it holds: a lone surrogate (how Python carries bytes that
/// are not UTF-8: a file name from `os.listdir`, output decoded with `surrogateescape`) becomes
/// U+FFFD, as would any other object's `str()`. Taking a `String` instead would raise
/// `UnicodeEncodeError` in the middle of answering, and the call would never be answered.
fn lossy(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let text = value.str()?;
    if let Ok(text) = text.to_cow() {
        return Ok(text.into_owned());
    }
    // UTF-16 keeps a lone surrogate as one unit, which Rust then replaces with one U+FFFD
    // (UTF-8's lossy decoding would give one for each of its three bytes).
    let utf16 = text.call_method1("encode", ("utf-16-le", "surrogatepass"))?;
    let bytes: &[u8] = utf16.extract()?;
    let units: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|pair| {
            u16::from_le_bytes([
                pair.first().copied().unwrap_or(0),
                pair.last().copied().unwrap_or(0),
            ])
        })
        .collect();
    Ok(String::from_utf16_lossy(&units))
}

#[pymethods]
impl ToolReply {
    /// A text result.
    fn text(&self, text: &Bound<'_, PyAny>) -> PyResult<()> {
        self.send(Ok(ToolOutput::text(lossy(text)?)));
        Ok(())
    }

    /// A JSON result (the JSON text of any other value the function returned).
    fn json(&self, json: &Bound<'_, PyAny>) -> PyResult<()> {
        self.send(
            serde_json::from_str::<Value>(&lossy(json)?)
                .map(ToolOutput::json)
                .map_err(|e| ToolError::new("tool.output_not_json", e.to_string())),
        );
        Ok(())
    }

    /// An error the model reads (`code` may be any object: its `str()` is the code).
    fn error(&self, code: &Bound<'_, PyAny>, message: &Bound<'_, PyAny>) -> PyResult<()> {
        self.send(Err(ToolError::new(lossy(code)?, lossy(message)?)));
        Ok(())
    }

    /// A failure that ends the run.
    fn fatal(&self, message: &Bound<'_, PyAny>) -> PyResult<()> {
        self.send(Err(ToolError::fatal(lossy(message)?)));
        Ok(())
    }
}
