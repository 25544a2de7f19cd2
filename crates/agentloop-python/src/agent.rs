//! An agent as Python holds it ([`NativeAgent`]): built from Python's parts or from an agent file
//! by the CLI's own assembler, and its runs ([`RunHandle`]), each a task on the shared runtime.
//! A run ends with the CLI's `--json` object as text, or with an error's code and message.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use agentloop::event::Event;
use agentloop::gate::{Answer, ApprovalRequest};
use agentloop::journal::Journal;
use agentloop::permissions::{ApprovalPrompter, Permission, PermissionGate, PermissionStore};
use agentloop::session::SessionTurn;
use agentloop::{
    Agent, Backlog, CancellationToken, EventSink, Limits, Message, RunOptions, RunOutcome,
};
use agentloop_cli::agent_file::AgentFile;
use agentloop_cli::assemble::{self, Approval, StartedMcp};
use agentloop_store::{JournalReader, SqliteJournal, SqliteSessions, TraceOptions, TraceSink};
use agentloop_tools::Builtin;
use futures::future::BoxFuture;
use pyo3::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::drive::Driven;
use crate::exit::attach_unless_exiting;
use crate::model::{CancelPending, RUN_MODELS, RunModels};
use crate::otel::Otel;
use crate::outbox::Outbox;
use crate::tool::{EVENT_LOOP, RUN_SCOPE, ToolDef};
use crate::{error, runtime};

/// An error's stable code and message, as Python's `AgentloopError` takes them.
type Failure = (String, String);

/// How a run ended: the outcome's `--json` object, with the error of its session's save when the
/// session could not be written after it ([`SessionTurn::unsaved`]); or, when nothing ran, an
/// error's code and message.
type Ended = Result<(Value, Option<Failure>), Failure>;

/// [`Ended`] as Python reads it: `(outcome, None, None)`, `(outcome, code, message)` (the run
/// ran, its session was not saved) or `(None, code, message)` (nothing ran); the outcome its JSON
/// text or, asked for with `objects`, the object as Python's dicts and lists.
type EndedParts = (Option<Py<PyAny>>, Option<String>, Option<String>);

/// An agent: the Rust [`Agent`], and the MCP servers an agent file started for it.
#[pyclass(module = "agentloop._agentloop", frozen)]
pub(crate) struct NativeAgent {
    agent: Agent,
    /// Shared with the task that stops them ([`shut_down`]).
    mcp: Option<Arc<StartedMcp>>,
    /// Its answers are priced: an unknown price is then an unknown cost (`cost_usd` null).
    priced: bool,
    /// Its runs' OpenTelemetry export, when asked for.
    otel: Option<Arc<Otel>>,
    /// The stores named at `from_file`: what its runs write when they name none.
    named: NamedStores,
    /// Those stores, open from before its servers started until [`NativeAgent::close`] stopped
    /// them (`None` after).
    held: Mutex<Option<HeldStores>>,
    /// Where its tools and the processes they start may write (canonical): a store a run names
    /// there that was not named at `from_file` is warned about ([`NativeAgent::warn_unnamed`]).
    writable: Vec<PathBuf>,
}

#[pymethods]
impl NativeAgent {
    /// An agent from Python's parts. `limits` is the JSON of the limits set (over the core's
    /// defaults); `tools` are dicts the Python side derived from its functions; `dispatcher`
    /// runs their calls.
    #[new]
    /// A tool that asks goes through a permission gate: `approve` answers (as for
    /// [`NativeAgent::from_file`]), or without it the call is denied, or a journaled run
    /// suspends until [`answer`] records the answer.
    /// With `otel`, its runs are exported as OpenTelemetry spans (as the CLI's `--otel`).
    #[pyo3(signature = (*, name, instructions, model_kind, model_spec, model_base, model_callable, tools, dispatcher, limits, approve=None, otel=false, otel_payloads=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        instructions: Option<String>,
        model_kind: &str,
        model_spec: &str,
        model_base: &str,
        model_callable: Option<Py<PyAny>>,
        tools: Vec<ToolDef>,
        dispatcher: Py<PyAny>,
        limits: &str,
        approve: Option<Py<PyAny>>,
        otel: bool,
        otel_payloads: bool,
    ) -> PyResult<Self> {
        let priced = model_kind == "provider";
        let asking: Vec<String> = tools
            .iter()
            .filter(|t| t.ask)
            .map(|t| t.name().to_owned())
            .collect();
        let (model, model_file) =
            crate::model::build(model_kind, model_spec, model_base, model_callable)?;
        let dispatcher = Arc::new(dispatcher);
        let tools = tools
            .into_iter()
            .enumerate()
            .map(|(i, def)| crate::tool::tool(def, i, Arc::clone(&dispatcher)))
            .collect::<PyResult<Vec<_>>>()?;
        let mut builder = Agent::builder()
            .name(name)
            .model(model)
            .tools(tools)
            .limits(limits_over_defaults(limits)?);
        if let Some(file) = &model_file {
            builder = assemble::with_model_keys(builder, file);
        }
        if let Some(text) = instructions {
            builder = builder.instructions(text);
        }
        if !asking.is_empty() {
            let mut store = PermissionStore::new(Permission::Allow);
            for tool in asking {
                store.tool_default(tool, Permission::Ask);
            }
            let gate = PermissionGate::new(store);
            builder = builder.gate(match approve {
                Some(f) => gate.with_prompter(Arc::new(PythonPrompter(Arc::new(f)))),
                None => gate.unattended_reason("no approval callback was given"),
            });
        }
        let agent = builder.build().map_err(|e| error(e.code(), e))?;
        Ok(NativeAgent {
            agent,
            mcp: None,
            priced,
            otel: (otel || otel_payloads)
                .then(|| Otel::start(otel_payloads))
                .transpose()?,
            named: NamedStores::default(),
            held: Mutex::new(None),
            writable: Vec::new(),
        })
    }

    /// The agent an agent file describes, as `agentloop run` would build it (its MCP servers
    /// started), with `tools` (Python's, run by `dispatcher`) beside the file's: the file's
    /// permissions hold for them. A call that needs approval asks `approve` (a callable given
    /// the requests' JSON, answering one word per request), or, with none, is denied, or
    /// suspends a journaled run. Its runs are exported as OpenTelemetry spans when the file
    /// says `otel = true`, or as `otel` says when given. When its tools can start processes,
    /// this process is first made non-dumpable ([`crate::protect`]).
    ///
    /// `journal`, `sessions` and `trace` name the stores its runs write (a run that names none
    /// writes these), as `agentloop run`'s flags do: they are kept from its tools (its file
    /// tools refuse them, its processes see them read-only), opened before its stdio MCP
    /// servers start, and held open until [`NativeAgent::close`] has stopped them.
    #[staticmethod]
    #[pyo3(signature = (path, approve=None, tools=Vec::new(), dispatcher=None, otel=None, otel_payloads=false, journal=None, sessions=None, trace=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_file(
        py: Python<'_>,
        path: PathBuf,
        approve: Option<Py<PyAny>>,
        tools: Vec<ToolDef>,
        dispatcher: Option<Py<PyAny>>,
        otel: Option<bool>,
        otel_payloads: bool,
        journal: Option<PathBuf>,
        sessions: Option<PathBuf>,
        trace: Option<PathBuf>,
    ) -> PyResult<Self> {
        let named = NamedStores {
            journal: journal.map(absolute),
            sessions: sessions.map(absolute),
            trace: trace.map(absolute),
        };
        if let Some(t) = tools.iter().find(|t| t.ask) {
            return Err(error(
                "agent_file.invalid",
                format!(
                    "the tool {} asks (ask=True), but an agent file's tools are asked about by \
                     its [permissions]: name it in their `ask` list instead",
                    t.name()
                ),
            ));
        }
        // The file's `[permissions]` may name the Python tools as they name its own.
        let host: Vec<_> = tools.iter().map(ToolDef::host_tool).collect();
        let tools = match dispatcher {
            Some(d) => {
                let dispatcher = Arc::new(d);
                tools
                    .into_iter()
                    .enumerate()
                    .map(|(i, def)| crate::tool::tool(def, i, Arc::clone(&dispatcher)))
                    .collect::<PyResult<Vec<_>>>()?
            }
            None if tools.is_empty() => Vec::new(),
            None => return Err(error("agent.invalid", "Python tools need their dispatcher")),
        };
        let mut file = AgentFile::load_beside(&path, &host).map_err(|e| match e {
            agentloop_cli::agent_file::LoadError::Read { .. } => error("agent_file.unreadable", e),
            agentloop_cli::agent_file::LoadError::Invalid(_) => error("agent_file.invalid", e),
        })?;
        // Before its tools are built: they take what is protected as they are made.
        file.protect(&named.paths());
        // Before its MCP servers start and before any of its tools can run (what `agentloop`
        // does first thing in `main`), and only for files whose tools start processes: see
        // crate::protect.
        crate::protect::protect_for(&file)?;
        let writable = writable_roots(&file);
        // Before any server starts, as `agentloop run` opens them: a server's view binds
        // read-only only what exists as it starts, so a store made after (or its SQLite side
        // files, its lock folders) would be a plain file in the server's folder to rewrite.
        let held = named.open()?;
        let approval = match approve {
            Some(f) => Approval::Prompter(Arc::new(PythonPrompter(Arc::new(f)))),
            None => Approval::Nobody("no approval callback was given"),
        };
        let exported = otel.unwrap_or(file.spec.otel == Some(true)) || otel_payloads;
        let priced = assemble::has_pricing(file.model());
        let built = wait_interruptibly(py, OnInterrupt::Drop, async move {
            let fail = |e: agentloop_cli::error::CliError| (e.code().to_owned(), e.to_string());
            let model = crate::model::per_run(assemble::model(&file).map_err(fail)?);
            let mcp = StartedMcp::start(&file).await.map_err(fail)?;
            match assemble::agent_with(&file, model, &approval, &mcp, tools) {
                Ok(agent) => Ok((agent, mcp)),
                Err(e) => {
                    mcp.shutdown().await;
                    Err(fail(e))
                }
            }
        })?;
        let (agent, mcp) = built.map_err(|(code, message)| error(&code, message))?;
        let mcp = Arc::new(mcp);
        let otel = match exported.then(|| Otel::start(otel_payloads)).transpose() {
            Ok(otel) => otel,
            Err(e) => {
                shut_down(py, &mcp)?;
                return Err(e);
            }
        };
        Ok(NativeAgent {
            agent,
            mcp: Some(mcp),
            priced,
            otel,
            named,
            held: Mutex::new(Some(held)),
            writable,
        })
    }

    /// The agent's name.
    #[getter]
    fn name(&self) -> String {
        self.agent.config().name().to_owned()
    }

    /// The fingerprint of the agent's definition, which a journaled run keeps.
    #[getter]
    fn fingerprint(&self) -> String {
        self.agent.definition().fingerprint()
    }

    /// Starts a run of `input`. With `journal`, the run is durable there; with `session`, it
    /// goes on with that stored conversation in `sessions`, and a turn that ran but could not be
    /// saved keeps its outcome beside the save's error. A store it does not name is the one
    /// named at `from_file`, if any (`sessions.db` for the session store). `on_event` gets each
    /// event's JSON;
    /// `on_done` gets the end (see [`RunHandle::wait`]); `event_loop` is where coroutine tools
    /// run; `scope` (the Python side's `RunScope`) goes with each of the run's tool calls to the
    /// dispatcher.
    /// With `objects`, the outcome reaches Python as its objects (dicts and lists), not JSON text.
    /// With `stream_backlog`, `on_event` queues the events for a reader that tells the handle
    /// of each it took ([`RunHandle::taken`]): past `STREAM_BACKLOG` untaken the run waits.
    #[pyo3(signature = (input, *, on_done=None, on_event=None, event_loop=None, journal=None, sessions=None, session=None, trace=None, trace_payloads=false, objects=false, scope=None, stream_backlog=false))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        input: String,
        on_done: Option<Py<PyAny>>,
        on_event: Option<Py<PyAny>>,
        event_loop: Option<Py<PyAny>>,
        journal: Option<PathBuf>,
        sessions: Option<PathBuf>,
        session: Option<String>,
        trace: Option<PathBuf>,
        trace_payloads: bool,
        objects: bool,
        scope: Option<Py<PyAny>>,
        stream_backlog: bool,
    ) -> PyResult<RunHandle> {
        // A path given is kept as given: the outcome names the journal so.
        let journal = journal.or_else(|| self.named.journal.clone());
        let sessions = session.as_ref().map(|_| {
            sessions
                .or_else(|| self.named.sessions.clone())
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SESSIONS))
        });
        let trace = trace.or_else(|| self.named.trace.clone());
        // 3: the line that called `Agent.run` (through `Agent._start`).
        self.warn_unnamed(py, [&journal, &sessions, &trace], 3)?;
        let journal = journal.map(|p| self.journal_at(p)).transpose()?;
        let store = sessions.map(|p| self.sessions_at(p)).transpose()?;
        let agent = self.agent.clone();
        let backlog = (stream_backlog && on_event.is_some())
            .then(|| Arc::new(Backlog::new(agentloop::STREAM_BACKLOG)));
        let sinks = Sinks {
            on_event,
            trace: open_trace(trace, trace_payloads)?,
            backlog,
        };
        // Nothing of such a run blocks: it can be driven on its loop's thread.
        let drive = journal.is_none()
            && store.is_none()
            && sinks.trace.is_none()
            && self.otel.is_none()
            && self.mcp.is_none();
        self.launch(
            py,
            Launch {
                on_done,
                sinks,
                event_loop,
                journal,
                drive,
                objects,
                scope,
            },
            move |options| -> BoxFuture<'static, Result<SessionTurn, Failure>> {
                Box::pin(async move {
                    match (store, session) {
                        // An error here means nothing ran (the session was busy, damaged or
                        // unreadable); a failed save after the run is the turn's `unsaved`.
                        (Some(store), Some(name)) => agent
                            .run_session_turn(&store, &name, input, options)
                            .await
                            .map_err(|e| (e.code().to_owned(), e.to_string())),
                        _ => Ok(SessionTurn {
                            outcome: agent
                                .run_with(Vec::new(), Some(Message::user(input)), options)
                                .await,
                            unsaved: None,
                        }),
                    }
                })
            },
        )
    }

    /// Goes on with the journaled run `run_id` (an id or a unique prefix) in this process: a
    /// finished call never runs again, one in flight at the crash re-runs only if its tool is
    /// idempotent. Without `journal`, in the journal named at `from_file`.
    #[pyo3(signature = (run_id, journal=None, *, on_done=None, on_event=None, event_loop=None, force=false, trace=None, trace_payloads=false, objects=false, scope=None))]
    #[allow(clippy::too_many_arguments)]
    fn resume(
        &self,
        py: Python<'_>,
        run_id: String,
        journal: Option<PathBuf>,
        on_done: Option<Py<PyAny>>,
        on_event: Option<Py<PyAny>>,
        event_loop: Option<Py<PyAny>>,
        force: bool,
        trace: Option<PathBuf>,
        trace_payloads: bool,
        objects: bool,
        scope: Option<Py<PyAny>>,
    ) -> PyResult<RunHandle> {
        let journal = journal
            .or_else(|| self.named.journal.clone())
            .ok_or_else(|| {
                error(
                    "agent.invalid",
                    "resume needs the run's journal: journal=..., or Agent.from_file(..., \
                     journal=...)",
                )
            })?;
        let trace = trace.or_else(|| self.named.trace.clone());
        // 2: the line that called `Agent.resume`.
        self.warn_unnamed(py, [&Some(journal.clone()), &None, &trace], 2)?;
        let writer = self.journal_at(journal.clone())?;
        // Owned before its steps are read for good (as the CLI's `resume`): a process still
        // driving it refuses this one (journal.busy) rather than leaving it a stale state.
        // A suspended run's wait counts toward its deadline, as in the CLI.
        let (run, waited) = JournalReader::open(&journal)
            .and_then(|r| {
                let run_id = r.find(&run_id)?;
                writer.own(&run_id)?;
                let run = r.load(&run_id)?;
                let waited = r.waited(&run);
                Ok((run, waited))
            })
            .map_err(|e| error(e.code(), e))?;
        let agent = self.agent.clone();
        let sinks = Sinks {
            on_event,
            trace: open_trace(trace, trace_payloads)?,
            backlog: None,
        };
        let launch = Launch {
            on_done,
            sinks,
            event_loop,
            journal: Some(writer),
            drive: false,
            objects,
            scope,
        };
        self.launch(py, launch, move |options| {
            Box::pin(async move {
                let resumed = match waited {
                    Some(waited) => agent.resume_at(run, options, force, waited).await,
                    None => agent.resume(run, options, force).await,
                };
                resumed
                    .map(|outcome| SessionTurn {
                        outcome,
                        unsaved: None,
                    })
                    .map_err(|e| (e.code().to_owned(), e.to_string()))
            })
        })
    }

    /// Whether its runs are exported as OpenTelemetry spans.
    #[getter]
    fn otel(&self) -> bool {
        self.otel.is_some()
    }

    /// Stops the agent file's MCP servers and the OpenTelemetry exporter (sending what waits),
    /// then closes the stores named at `from_file` (later runs open them for themselves).
    /// Ctrl-C stops the wait for the servers, which go on being stopped on the runtime (see
    /// [`shut_down`]), and the stores stay open.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(mcp) = &self.mcp {
            shut_down(py, mcp)?;
        }
        // Only now: closing a SQLite store deletes its `-wal` and `-shm`, which drops a live
        // server's read-only binds of them (a `-wal` it then writes is replayed at the next
        // open). A run still going keeps its own handles.
        let held = crate::outbox::lock(&self.held).take();
        py.detach(|| drop(held));
        if let Some(otel) = &self.otel {
            py.detach(|| otel.shutdown());
        }
        Ok(())
    }
}

impl NativeAgent {
    /// The journal at `path`: the one held open since `from_file` when it is that one (one
    /// handle, as `agentloop run` has), else opened for the run.
    fn journal_at(&self, path: PathBuf) -> PyResult<Arc<SqliteJournal>> {
        let held = crate::outbox::lock(&self.held)
            .as_ref()
            .and_then(|h| h.journal.clone())
            .filter(|j| same_file(j.path(), &path));
        match held {
            Some(journal) => Ok(journal),
            None => open_journal(path),
        }
    }

    /// The session store at `path`: the one held open since `from_file` when it is that one,
    /// else opened for the run.
    fn sessions_at(&self, path: PathBuf) -> PyResult<SqliteSessions> {
        let held = crate::outbox::lock(&self.held)
            .as_ref()
            .and_then(|h| h.sessions.clone())
            .filter(|s| same_file(s.path(), &path));
        match held {
            Some(store) => Ok(store),
            None => SqliteSessions::open(path).map_err(|e| error(e.code(), e)),
        }
    }

    /// Warns (Python's `UserWarning`) of each store of a run that lies where the agent's tools
    /// or their processes may write but was not named at `from_file`: nothing keeps them from
    /// rewriting it. A warning, not an error: code written before `from_file` took the stores
    /// keeps running. `stores` are the run's journal, session store and trace; `stacklevel` is
    /// Python's, for the warning to name the caller's line.
    fn warn_unnamed(
        &self,
        py: Python<'_>,
        stores: [&Option<PathBuf>; 3],
        stacklevel: i32,
    ) -> PyResult<()> {
        let [journal, sessions, trace] = stores;
        let stores = [
            ("journal", journal, &self.named.journal),
            ("sessions", sessions, &self.named.sessions),
            ("trace", trace, &self.named.trace),
        ];
        for (key, given, named) in stores {
            let Some(given) = given else { continue };
            if named.as_ref().is_some_and(|n| same_file(n, given)) {
                continue;
            }
            let Some(root) = writable_holding(&self.writable, given) else {
                continue;
            };
            let message = format!(
                "agentloop: the {key} {} lies in {}, where the agent's tools may write, and was \
                 not named at Agent.from_file: its tools and MCP servers could rewrite it. Name it \
                 there (Agent.from_file(..., {key}=...)), or keep it outside the agent's folder \
                 and its tools' roots",
                given.display(),
                root.display()
            );
            let message = std::ffi::CString::new(message.replace('\0', ""))
                .map_err(|e| error("agent.invalid", e))?;
            let category = py.get_type::<pyo3::exceptions::PyUserWarning>();
            PyErr::warn(py, category.as_any(), &message, stacklevel)?;
        }
        Ok(())
    }

    /// Starts a run: driven on its event loop's thread when it may be ([`crate::drive`]), else
    /// spawned on the shared runtime; its end reaches `on_done` and the handle.
    fn launch(
        &self,
        py: Python<'_>,
        launch: Launch,
        run: impl FnOnce(RunOptions) -> BoxFuture<'static, Result<SessionTurn, Failure>>,
    ) -> PyResult<RunHandle> {
        // Its Python calls would wait for ever, the exit guard refusing them.
        if crate::exit::exiting() {
            return Err(error(
                "python.exiting",
                "the Python interpreter is exiting: a run cannot start any more",
            ));
        }
        let (on_done, sinks, journal, objects) =
            (launch.on_done, launch.sinks, launch.journal, launch.objects);
        let backlog = sinks.backlog.clone();
        let cancel = CancellationToken::new();
        let mut options = RunOptions {
            cancel: Some(cancel.clone()),
            journal: journal.as_ref().map(|j| Arc::clone(j) as Arc<dyn Journal>),
            ..RunOptions::default()
        };
        if let Some(f) = sinks.on_event {
            options.sinks.push(Arc::new(PythonSink {
                f,
                backlog: sinks.backlog,
            }) as Arc<dyn EventSink>);
        }
        let trace = sinks.trace;
        if let Some(t) = &trace {
            options.sinks.push(Arc::clone(t) as Arc<dyn EventSink>);
        }
        let otel = self.otel.clone();
        options.sinks.extend(otel.as_ref().map(|o| o.sink()));
        let journal_path = journal.map(|j| j.path().to_path_buf());
        let priced = self.priced;
        let (tx, rx) = mpsc::channel();
        let running = run(options);
        let task = async move {
            let ended: Ended = running.await.map(|SessionTurn { outcome, unsaved }| {
                // The save's error as the CLI gives it, naming the run's own error if any.
                let unsaved = unsaved.map(|e| {
                    let said = agentloop_cli::render::unsaved_session_json(&outcome, &e);
                    let message = said.get("message").and_then(Value::as_str);
                    (e.code().to_owned(), message.unwrap_or_default().to_owned())
                });
                (
                    outcome_json(&outcome, priced, journal_path.as_deref()),
                    unsaved,
                )
            });
            // As the CLI does: a trace that could not be written is said, never the run's failure.
            if let Some(Err(e)) = trace.as_ref().map(|t| t.finish()) {
                eprintln!(
                    "agentloop: warning: {}: the trace was not written: {e}",
                    e.code()
                );
            }
            // The run's spans reach the collector before its outcome reaches Python.
            if let Some(o) = otel {
                let _ = tokio::task::spawn_blocking(move || o.flush()).await;
            }
            // At the interpreter's exit nobody is told: the process ends with the run.
            if let Some(f) = on_done {
                attach_unless_exiting(|py| {
                    if let Err(e) = f.call1(py, split(py, &ended, objects)) {
                        e.write_unraisable(py, None);
                    }
                });
            }
            let _ = tx.send(ended);
        };
        // Each run starts its own script (crate::model::per_run), and knows its loop.
        let run_models = RunModels::new(launch.event_loop.as_ref().map(|l| l.clone_ref(py)));
        let task = RUN_MODELS.scope(run_models, task);
        let task = RUN_SCOPE.scope(launch.scope.map(Arc::new), task);
        match launch.event_loop {
            Some(event_loop) if launch.drive && running_here(py, &event_loop)? => {
                let outbox = Arc::new(Outbox::driven(event_loop.clone_ref(py)));
                let task = EVENT_LOOP.scope(Arc::clone(&outbox), task);
                Driven::start(py, &event_loop, outbox, Box::pin(task))?;
            }
            event_loop => {
                let outbox = Arc::new(Outbox::new(event_loop));
                runtime()?.spawn(EVENT_LOOP.scope(outbox, task));
            }
        }
        Ok(RunHandle {
            cancel,
            ended: Mutex::new(rx),
            objects,
            backlog,
        })
    }
}

/// How often a wait for the runtime ([`wait_interruptibly`]) lets Python's signal handlers run:
/// as often as `Agent.run` polls its run's end.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// How long an interrupted wait ([`OnInterrupt::Drop`]) waits for its work to be dropped. The
/// work is async, so it is dropped at once; the bound only keeps Ctrl-C from ever hanging.
const DROP_WAIT: Duration = Duration::from_secs(5);

/// What an interrupted [`wait_interruptibly`] does with its work.
#[derive(Clone, Copy)]
enum OnInterrupt {
    /// Drops it before `KeyboardInterrupt` is raised, and with it what it started: a server half
    /// started is killed as its handle drops (`Agent.from_file`).
    Drop,
    /// Lets it finish on the runtime while Python handles the interrupt: servers being stopped
    /// go on being stopped (stdin closed, then SIGTERM, then SIGKILL), none left running
    /// (`agent.close()`).
    Finish,
}

/// Runs `work` on the shared runtime and waits for it without the GIL, in slices of
/// [`SIGNAL_POLL`] between which Python's signal handlers run. A blocked `block_on` would read
/// Ctrl-C only once it returns: an MCP server that hangs in its handshake would hold
/// `Agent.from_file` for the server's timeout (60 s by default). Here `KeyboardInterrupt` is
/// raised within a slice, `work` dropped or left to finish as `on_interrupt` says.
///
/// Ctrl-C reaches this wait only where Python handles SIGINT: a process started with SIGINT
/// ignored (a background job of a non-interactive shell, and every process it starts) keeps
/// ignoring it, as Python leaves an inherited `SIG_IGN` alone.
fn wait_interruptibly<T: Send + 'static>(
    py: Python<'_>,
    on_interrupt: OnInterrupt,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> PyResult<T> {
    let rt = runtime()?;
    let mut task = rt.spawn(work);
    loop {
        // The timer is made inside `block_on`: made outside, it would find no runtime.
        let slice =
            py.detach(|| rt.block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut task).await }));
        match slice {
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(e)) => return Err(error("runtime.panicked", e)),
            Err(_) => {
                let Err(interrupted) = py.check_signals() else {
                    continue;
                };
                if let OnInterrupt::Drop = on_interrupt {
                    task.abort();
                    // Dropped before Python hears of it, so that what it started is stopped by
                    // the time the caller handles the interrupt (and not by a later poll).
                    py.detach(|| {
                        rt.block_on(async {
                            let _ = tokio::time::timeout(DROP_WAIT, &mut task).await;
                        })
                    });
                }
                return Err(interrupted);
            }
        }
    }
}

/// Stops an agent file's MCP servers; Ctrl-C stops the wait, not the stopping
/// ([`OnInterrupt::Finish`]).
fn shut_down(py: Python<'_>, mcp: &Arc<StartedMcp>) -> PyResult<()> {
    let mcp = Arc::clone(mcp);
    wait_interruptibly(py, OnInterrupt::Finish, async move { mcp.shutdown().await })
}

/// How a run is started: where its end and events go, where its coroutine tools run, its
/// journal, and whether it may be driven on its loop's thread (nothing of it blocks).
struct Launch {
    on_done: Option<Py<PyAny>>,
    sinks: Sinks,
    event_loop: Option<Py<PyAny>>,
    journal: Option<Arc<SqliteJournal>>,
    drive: bool,
    /// The outcome reaches Python as objects, not JSON text.
    objects: bool,
    /// What its tool calls hand the dispatcher (the Python side's `RunScope`).
    scope: Option<Py<PyAny>>,
}

/// Whether `event_loop` is the loop running on this thread (`run_async` and `stream` start their
/// runs from it).
fn running_here(py: Python<'_>, event_loop: &Py<PyAny>) -> PyResult<bool> {
    let running = py
        .import("asyncio")?
        .getattr("_get_running_loop")?
        .call0()?;
    Ok(running.is(event_loop.bind(py)))
}

/// Where a run's events go besides the run: a Python callable, a trace file.
struct Sinks {
    on_event: Option<Py<PyAny>>,
    trace: Option<Arc<TraceSink>>,
    /// What `on_event` queued for a reader that has not taken it (`start`'s `stream_backlog`).
    backlog: Option<Arc<Backlog>>,
}

/// The trace file of a run (NDJSON or SQLite by its extension), as `--trace` opens it.
fn open_trace(path: Option<PathBuf>, payloads: bool) -> PyResult<Option<Arc<TraceSink>>> {
    path.map(|p| {
        TraceSink::open(&p, TraceOptions { payloads })
            .map(Arc::new)
            .map_err(|e| error(e.code(), e))
    })
    .transpose()
}

/// The session store a run of a stored conversation writes when neither it nor `from_file`
/// names one (in the working folder), as the Python API has always defaulted.
const DEFAULT_SESSIONS: &str = "sessions.db";

/// The stores named at `Agent.from_file` (absolute paths): protected, and written by its runs
/// that name none.
#[derive(Default)]
struct NamedStores {
    journal: Option<PathBuf>,
    sessions: Option<PathBuf>,
    trace: Option<PathBuf>,
}

impl NamedStores {
    fn paths(&self) -> Vec<PathBuf> {
        [&self.journal, &self.sessions, &self.trace]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Opens each (creating it, its SQLite side files and its lock folder), as the first run
    /// writing it would.
    fn open(&self) -> PyResult<HeldStores> {
        Ok(HeldStores {
            journal: self.journal.clone().map(open_journal).transpose()?,
            sessions: self
                .sessions
                .as_ref()
                .map(|p| SqliteSessions::open(p).map_err(|e| error(e.code(), e)))
                .transpose()?,
            trace: self
                .trace
                .as_ref()
                .map(|p| {
                    TraceSink::open(p, TraceOptions { payloads: false })
                        .map_err(|e| error(e.code(), e))
                })
                .transpose()?,
        })
    }
}

/// The stores named at `Agent.from_file`, open. The journal and the session store are the
/// handles its runs write through; the trace is never written here (each run opens its own, to
/// finish it at its end): it is held so that the file, and a SQLite trace's side files, stay.
struct HeldStores {
    journal: Option<Arc<SqliteJournal>>,
    sessions: Option<SqliteSessions>,
    /// Held only to keep its files in place.
    #[allow(dead_code)]
    trace: Option<TraceSink>,
}

/// `path` made absolute against the working folder (never through links: a store's path is
/// the one it is written at).
fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// Whether `a` and `b` are one file: the same canonical path, or the same absolute path where
/// either does not exist yet.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => absolute(a.to_path_buf()) == absolute(b.to_path_buf()),
    }
}

/// The folders (canonical) where the tools of `file`, of its subagents and of its hand-offs, and
/// the processes they start, may write: each file's folder (where its command tools and stdio
/// MCP servers run by default), the roots of its processes (`/` for a sandbox that is `off`),
/// and the roots of its built-in tools that write files.
fn writable_roots(file: &AgentFile) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::fs::canonicalize(&file.dir).into_iter().collect();
    roots.extend(file.process_roots());
    for t in file.tools() {
        let writes = t
            .builtin
            .as_ref()
            .and_then(|b| Builtin::from_name(b.get_ref()))
            .is_some_and(|b| matches!(b, Builtin::WriteFile | Builtin::EditFile));
        if writes {
            let root = assemble::builtin_options(file, t).root;
            roots.extend(std::fs::canonicalize(root));
        }
    }
    let handed = file.handoff_files.iter().map(|(_, f)| f);
    for child in file.subagents.iter().map(|(_, f)| f).chain(handed) {
        roots.extend(writable_roots(child));
    }
    roots.sort();
    roots.dedup();
    roots
}

/// The first of `roots` that holds `path` (whose folder is resolved, the file itself may not
/// exist yet).
fn writable_holding<'a>(roots: &'a [PathBuf], path: &Path) -> Option<&'a PathBuf> {
    let path = absolute(path.to_path_buf());
    let resolved = std::fs::canonicalize(&path).ok().or_else(|| {
        let folder = std::fs::canonicalize(path.parent()?).ok()?;
        Some(folder.join(path.file_name()?))
    })?;
    roots.iter().find(|r| resolved.starts_with(r))
}

/// A running (or ended) run.
#[pyclass(module = "agentloop._agentloop", frozen)]
pub(crate) struct RunHandle {
    cancel: CancellationToken,
    ended: Mutex<mpsc::Receiver<Ended>>,
    /// The outcome is given as objects, not JSON text.
    objects: bool,
    /// The events its reader has not taken, when it was started with `stream_backlog`.
    backlog: Option<Arc<Backlog>>,
}

#[pymethods]
impl RunHandle {
    /// Cancels the run: nothing new starts, running calls are cancelled, and it ends
    /// `cancelled` with what it did so far. It waits for its reader no more.
    fn cancel(&self) {
        self.cancel.cancel();
        if let Some(b) = &self.backlog {
            b.close();
        }
    }

    /// The reader took one event (a run started with `stream_backlog`): the run, held while
    /// `STREAM_BACKLOG` wait, goes on once there is room.
    fn taken(&self) {
        if let Some(b) = &self.backlog {
            b.taken();
        }
    }

    /// Waits up to `timeout` seconds (without the GIL) for the end: `None` while it runs, else
    /// `(outcome, None, None)` or `(None, code, message)`. The end is given once.
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<EndedParts>> {
        let wait = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::ZERO);
        let got = py.detach(|| {
            let rx = self.ended.lock().map_err(|_| ())?;
            match rx.recv_timeout(wait) {
                Ok(ended) => Ok(Some(ended)),
                Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
            }
        });
        match got {
            Ok(Some(ended)) => Ok(Some(split(py, &ended, self.objects))),
            Ok(None) => Ok(None),
            Err(()) => Err(error("run.gone", "the run's end was already taken or lost")),
        }
    }
}

/// Records a person's answer (`allow`, `allow_always`, `deny`, `deny_always`) to a call a
/// suspended run waits on; resuming the run then goes on with it. A question of the model's
/// (`ask_user`) is refused, as `agentloop approve` refuses it: a word is no reply to it, and the
/// resumed run would only ask it again. Its reply goes through [`reply`].
#[pyfunction]
pub(crate) fn answer(journal: PathBuf, run_id: &str, call_id: &str, word: &str) -> PyResult<()> {
    let answer = answer_of(word).map_err(|m| error("approval.invalid", m))?;
    let (reader, run_id, request) = waiting_call(journal, run_id, call_id)?;
    if request.is_some_and(|r| r.question.is_some()) {
        return Err(error(
            "approval.invalid",
            format!(
                "call {call_id} of run {run_id} is a question: reply to it with \
                 Agent.reply(run_id, call_id, value, journal=...)"
            ),
        ));
    }
    reader
        .answer(&run_id, call_id, answer)
        .map_err(|e| error(e.code(), e))
}

/// Records the user's reply (`json`, JSON text) to a question of the model's (`ask_user`) a
/// suspended run waits on, checked against the question's schema first, as `agentloop answer`
/// does; resuming the run then hands it to the model.
#[pyfunction]
pub(crate) fn reply(journal: PathBuf, run_id: &str, call_id: &str, json: &str) -> PyResult<()> {
    let value: Value = serde_json::from_str(json).map_err(|e| error("answer.invalid", e))?;
    let (reader, run_id, request) = waiting_call(journal, run_id, call_id)?;
    if let Some(request) = request {
        let Some(question) = &request.question else {
            return Err(error(
                "answer.not_a_question",
                format!(
                    "call {call_id} of run {run_id} waits for approval, not a reply: answer it \
                     with Agent.answer(run_id, call_id, True or False, journal=...)"
                ),
            ));
        };
        agentloop::ask::check_answer(question, &value).map_err(|e| error(e.code(), e))?;
    }
    // A call the run does not wait on is refused by the journal, with its reason.
    reader
        .reply(&run_id, call_id, &value)
        .map_err(|e| error(e.code(), e))
}

/// The journal's reader, the run's full id (from an id or a unique prefix), and what call
/// `call_id` of the run asked for, if the run asked it.
fn waiting_call(
    journal: PathBuf,
    run_id: &str,
    call_id: &str,
) -> PyResult<(JournalReader, String, Option<ApprovalRequest>)> {
    let journal_error = |e: agentloop::journal::JournalError| error(e.code(), e);
    let reader = JournalReader::open(journal).map_err(journal_error)?;
    let run_id = reader.find(run_id).map_err(journal_error)?;
    let run = reader.load(&run_id).map_err(journal_error)?;
    let request = run
        .approvals
        .into_iter()
        .map(|a| a.request)
        .find(|r| r.call_id == call_id);
    Ok((reader, run_id, request))
}

fn answer_of(word: &str) -> Result<Answer, String> {
    match word {
        "allow" => Ok(Answer::AllowOnce),
        "allow_always" => Ok(Answer::AllowAlways),
        "deny" => Ok(Answer::DenyOnce),
        "deny_always" => Ok(Answer::DenyAlways),
        other => Err(format!(
            "no answer {other:?}: allow, allow_always, deny or deny_always"
        )),
    }
}

fn split(py: Python<'_>, ended: &Ended, objects: bool) -> EndedParts {
    let (value, unsaved) = match ended {
        Ok(ran) => ran,
        Err((code, message)) => return (None, Some(code.clone()), Some(message.clone())),
    };
    let outcome = if objects {
        crate::value::to_python(py, value)
    } else {
        value
            .to_string()
            .into_pyobject(py)
            .map(|s| s.into_any().unbind())
            .map_err(PyErr::from)
    };
    match outcome {
        Ok(outcome) => match unsaved {
            Some((code, message)) => (Some(outcome), Some(code.clone()), Some(message.clone())),
            None => (Some(outcome), None, None),
        },
        // Only Python out of memory gets here: the run's end is still said.
        Err(e) => (None, Some("run.failed".into()), Some(e.to_string())),
    }
}

/// The CLI's `--json` object of the run; a journaled run's names the journal and the calls it
/// waits on, as `agentloop run --journal --json` does.
fn outcome_json(outcome: &RunOutcome, priced: bool, journal: Option<&std::path::Path>) -> Value {
    let mut value = agentloop_cli::render::priced_outcome_json(outcome, false, priced);
    if let (Some(path), Some(map)) = (journal, value.as_object_mut()) {
        let waiting: Vec<ApprovalRequest> = JournalReader::open(path)
            .and_then(|r| r.load(&outcome.run_id))
            .map(|run| run.unanswered().cloned().collect())
            .unwrap_or_default();
        map.insert("journal".into(), path.display().to_string().into());
        map.insert(
            "pending_approvals".into(),
            serde_json::to_value(&waiting).unwrap_or_default(),
        );
    }
    value
}

fn open_journal(path: PathBuf) -> PyResult<Arc<SqliteJournal>> {
    SqliteJournal::open(path)
        .map(Arc::new)
        .map_err(|e| error(e.code(), e))
}

/// The limits Python set (JSON, in the core's own field names), over the core's defaults.
fn limits_over_defaults(json: &str) -> PyResult<Limits> {
    let bad = |e: serde_json::Error| error("limits.invalid", e);
    let mut merged = serde_json::to_value(Limits::default()).map_err(bad)?;
    let set: Value = serde_json::from_str(json).map_err(bad)?;
    if let (Some(base), Value::Object(set)) = (merged.as_object_mut(), set) {
        base.extend(set);
    }
    serde_json::from_value(merged).map_err(bad)
}

/// Each event, as JSON, to a Python callable; counted in `backlog` when the callable queues
/// it for a reader (a stream).
struct PythonSink {
    f: Py<PyAny>,
    backlog: Option<Arc<Backlog>>,
}

impl EventSink for PythonSink {
    fn emit(&self, event: &Event) {
        let Ok(json) = serde_json::to_string(event) else {
            return;
        };
        // At the interpreter's exit the event is dropped, uncounted: nobody reads it any more.
        attach_unless_exiting(|py| {
            if let Some(b) = &self.backlog {
                b.pushed();
            }
            if let Err(e) = self.f.call1(py, (json,)) {
                e.write_unraisable(py, None);
            }
        });
    }

    fn backlog(&self) -> Option<&Backlog> {
        self.backlog.as_deref()
    }
}

/// Approvals from a Python callable: given the requests' JSON and the run's event loop, it
/// answers one of `allow`, `allow_always`, `deny`, `deny_always` per request, or a
/// `concurrent.futures.Future` of those words (an `async def` callback, awaited on that loop);
/// anything else, or an exception, denies, with the exception's text as the reason.
struct PythonPrompter(Arc<Py<PyAny>>);

impl ApprovalPrompter for PythonPrompter {
    fn ask<'a>(
        &'a self,
        requests: &'a [ApprovalRequest],
    ) -> BoxFuture<'a, Result<Vec<Answer>, String>> {
        let f = Arc::clone(&self.0);
        let json = serde_json::to_string(requests).unwrap_or_default();
        let n = requests.len();
        // The run's loop (the caller's for `run_async` and `stream`, the package's for `run`):
        // where an async callback is awaited, as the run's coroutine tools are.
        let outbox = EVENT_LOOP
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(Outbox::new(None)));
        Box::pin(async move {
            // The callable may block (a person at a prompt): off the runtime's workers.
            let asked = tokio::task::spawn_blocking(move || {
                attach_unless_exiting(|py| -> Result<Asked, String> {
                    let asked = outbox
                        .event_loop(py)
                        .and_then(|event_loop| f.call1(py, (json, event_loop.clone_ref(py))))
                        .map_err(|e| crate::model::python_error_text(py, &e))?;
                    if let Ok(words) = asked.extract::<Vec<String>>(py) {
                        return Ok(Asked::Now(words));
                    }
                    // An async callback's answer, to come: the run waits for it without a thread.
                    let (tx, rx) = oneshot::channel();
                    Py::new(py, Answered(Mutex::new(Some(tx))))
                        .and_then(|a| asked.call_method1(py, "add_done_callback", (a,)))
                        .map_err(|e| crate::model::python_error_text(py, &e))?;
                    Ok(Asked::Later(rx, CancelPending(Some(asked))))
                })
            })
            .await
            .map_err(|e| e.to_string())?;
            // At the interpreter's exit nobody can answer, and a denial would be remembered:
            // the calls are left waiting, as a killed process leaves them (a journaled run asks
            // again when it resumes).
            let Some(asked) = asked else {
                return std::future::pending().await;
            };
            let asked = asked?;
            let words = match asked {
                Asked::Now(words) => words,
                Asked::Later(rx, mut pending) => {
                    let words = rx
                        .await
                        .unwrap_or_else(|_| Err("the approval callback never answered".into()));
                    // Answered: nothing to cancel.
                    pending.0 = None;
                    words?
                }
            };
            if words.len() != n {
                return Err(format!(
                    "the approval callback answered {} of {n} requests",
                    words.len()
                ));
            }
            words.iter().map(|w| answer_of(w)).collect()
        })
    }
}

/// An approval callback's words, or why it gave none.
type Words = Result<Vec<String>, String>;

/// An approval callback's words: given, or to come from an async callback's future.
enum Asked {
    Now(Vec<String>),
    Later(oneshot::Receiver<Words>, CancelPending),
}

/// The done callback of an async approval callback's future (a `concurrent.futures.Future` of
/// its words).
#[pyclass(module = "agentloop._agentloop", frozen)]
pub(crate) struct Answered(Mutex<Option<oneshot::Sender<Words>>>);

#[pymethods]
impl Answered {
    fn __call__(&self, py: Python<'_>, future: Py<PyAny>) {
        let words = future
            .call_method0(py, "result")
            .and_then(|r| r.extract::<Vec<String>>(py))
            .map_err(|e| crate::model::python_error_text(py, &e));
        let tx = crate::outbox::lock(&self.0).take();
        if let Some(tx) = tx {
            // The run may have stopped waiting: then nobody reads the answer.
            let _ = tx.send(words);
        }
    }
}
