//! The A2A server: each agent at its own path (`/NAME`, and the first also at `/`), its card on
//! GET, JSON-RPC on POST. A task is a run of the agent under the task's id, started by a message
//! and driven on a task of its own (`task.rs`); its events become the task's status updates, its
//! answer the task's artifact. The tasks are kept in memory while the server runs (the latest
//! that ended, within `MAX_TASKS` and `MAX_KEPT_BYTES`, and every running one), and found in the
//! journal after a restart where the agent's runs are journaled; a context's transcript is kept in
//! memory until the last of its tasks is forgotten (with sessions, in the store only).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentloop::{Backlog, CancellationToken, STREAM_BACKLOG};
use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::A2aError;
use crate::task::{
    DEFAULT_ANSWER_TIMEOUT, DEFAULT_MAX_RUNS, MAX_CONTEXT_ID_BYTES, RunSlots, Served, ServedAgent,
    Work, settled,
};
use crate::wire::{
    PROTOCOL_VERSION, SendMessageRequest, StreamResponse, Task, TaskIdRequest, TaskState,
    TaskStatus, with_history,
};

/// The agents of one server.
#[derive(Clone)]
pub struct A2aServer {
    agents: Vec<Arc<Served>>,
    runs: Arc<RunSlots>,
    answer_within_ms: Arc<AtomicU64>,
    /// Cancelled when [`serve`]'s shutdown completes.
    stopping: CancellationToken,
}

impl A2aServer {
    /// A server of these agents (the first is also served at `/`), their contexts kept in
    /// memory.
    pub fn new(agents: Vec<ServedAgent>) -> Self {
        Self::with_sessions(agents, None)
    }

    /// A server of these agents whose contexts are sessions in `sessions` (a context's id is its
    /// session's): a context goes on after a restart, and `agentloop sessions` shows it.
    pub fn with_sessions(
        agents: Vec<ServedAgent>,
        sessions: Option<Arc<dyn agentloop::session::SessionStore>>,
    ) -> Self {
        let runs = Arc::new(RunSlots::new(DEFAULT_MAX_RUNS));
        let answer_within_ms = Arc::new(AtomicU64::new(millis(DEFAULT_ANSWER_TIMEOUT)));
        let stopping = CancellationToken::new();
        A2aServer {
            agents: agents
                .into_iter()
                .map(|agent| {
                    Arc::new(Served::new(
                        agent,
                        sessions.clone(),
                        runs.clone(),
                        answer_within_ms.clone(),
                        stopping.clone(),
                    ))
                })
                .collect(),
            runs,
            answer_within_ms,
            stopping,
        }
    }

    /// A task waits at most `within` in `input-required` for its caller's answer
    /// ([`DEFAULT_ANSWER_TIMEOUT`] unless set): then it fails, its calls not run, and its context
    /// goes on with the next message. A question nobody answers would otherwise hold its run
    /// (its agent, the MCP servers it started) and its context for as long as the server runs.
    pub fn with_answer_timeout(self, within: Duration) -> Self {
        self.answer_within_ms
            .store(millis(within).max(1), Ordering::Relaxed);
        self
    }

    /// The server drives at most `most` runs at once, all its agents' together (at least one;
    /// [`DEFAULT_MAX_RUNS`] unless set): a message that would start one more is answered
    /// [`A2aError::Busy`] (HTTP 429), and starts nothing. A task waiting for its caller's
    /// approval, or behind another task of its context, holds no place.
    pub fn with_max_runs(self, most: usize) -> Self {
        self.runs.set_most(most);
        self
    }

    /// The router: for each agent its card and its JSON-RPC endpoint.
    pub fn router(&self) -> Router {
        let mut router = Router::new();
        for (i, served) in self.agents.iter().enumerate() {
            let mut paths = vec![format!("/{}", served.agent.name)];
            if i == 0 {
                paths.push(String::new());
            }
            for path in paths {
                let (card_served, rpc_served) = (served.clone(), served.clone());
                let base = path.clone();
                router = router
                    .route(
                        &format!("{path}/.well-known/agent-card.json"),
                        get(move |headers: HeaderMap| {
                            let served = card_served.clone();
                            let base = base.clone();
                            async move { Json(card(&served.agent, &headers, &base)) }
                        }),
                    )
                    .route(
                        if path.is_empty() { "/" } else { &path },
                        post(move |headers: HeaderMap, body: Bytes| {
                            rpc(rpc_served.clone(), headers, body)
                        }),
                    );
            }
        }
        router
    }
}

/// Serves `server` on `listener` until `shutdown` completes, within `agentloop-serve`'s bounds
/// (request heads in bounded time, a bound on connections, a bounded stop). A request must name
/// the server by a loopback name or the address it listens on ([`crate::guard`]): a web page
/// cannot reach it through a name of its own.
pub async fn serve(
    server: &A2aServer,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), A2aError> {
    let failed = |e: std::io::Error| A2aError::Serve {
        reason: e.to_string(),
    };
    let allowed = listener
        .local_addr()
        .map(agentloop_serve::allowed_hosts)
        .map_err(failed)?;
    let router = agentloop_serve::host_checked(server.router(), allowed);
    // A caller waiting for its task to settle is answered at the stop, before its connection
    // is closed: with no answer it read an empty reply.
    let stopping = server.stopping.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.cancel();
    };
    agentloop_serve::serve(
        listener,
        router,
        shutdown,
        agentloop_serve::Limits::default(),
    )
    .await
    .map_err(failed)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The protocol version a request says it speaks (`A2A-Version`), or why this server does not
/// speak it: 1.x only. A request without the header is one of 0.3, as the protocol has it.
fn version_spoken(headers: &HeaderMap) -> Result<(), A2aError> {
    let version = headers
        .get("A2A-Version")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .unwrap_or("0.3");
    if version.split('.').next() == Some("1") {
        Ok(())
    } else {
        Err(A2aError::VersionNotSupported {
            version: version.chars().take(40).collect(),
        })
    }
}

/// The agent card: its interface at the URL the caller reached it by.
fn card(agent: &ServedAgent, headers: &HeaderMap, base: &str) -> Value {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    json!({
        "name": agent.name,
        "description": agent.description,
        "version": agent.version,
        "supportedInterfaces": [{
            "url": format!("http://{host}{base}"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": PROTOCOL_VERSION,
        }],
        "capabilities": {"streaming": true, "pushNotifications": false},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [{
            "id": agent.name,
            "name": agent.name,
            "description": agent.description,
            "tags": ["agentloop"],
        }],
    })
}

/// True when the request says its body is JSON (`application/json`, parameters aside).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

fn rpc_error(id: &Value, e: &A2aError) -> Response {
    let mut response = Json(rpc_error_value(id, e)).into_response();
    if matches!(e, A2aError::Busy { .. }) {
        // What HTTP says of a client that asks too much at once, so that a client or proxy that
        // knows nothing of JSON-RPC waits before it asks again.
        *response.status_mut() = axum::http::StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
    }
    response
}

/// The JSON-RPC error answer to request `id`: its code, message and stable code.
fn rpc_error_value(id: &Value, e: &A2aError) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": e.rpc_code(), "message": e.to_string(), "data": {"code": e.code()}},
    })
}

fn rpc_result(id: &Value, result: impl serde::Serialize) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn params<T: serde::de::DeserializeOwned>(request: &Value) -> Result<T, A2aError> {
    serde_json::from_value(request.get("params").cloned().unwrap_or(Value::Null)).map_err(|e| {
        A2aError::InvalidParams {
            reason: e.to_string(),
        }
    })
}

async fn rpc(served: Arc<Served>, headers: HeaderMap, body: Bytes) -> Response {
    // A page may send a cross-site form or `text/plain` POST without asking first; one of JSON
    // it must ask about (a preflight), which this server never grants.
    if !is_json(&headers) {
        let e = A2aError::InvalidRequest {
            reason: "the request's Content-Type must be application/json".into(),
        };
        let mut response = rpc_error(&Value::Null, &e);
        *response.status_mut() = axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return response;
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let e = A2aError::Parse {
                reason: e.to_string(),
            };
            return rpc_error(&Value::Null, &e);
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let method = match (request.get("jsonrpc"), request.get("method")) {
        (Some(v), Some(Value::String(m))) if v == "2.0" => m.clone(),
        _ => {
            let e = A2aError::InvalidRequest {
                reason: "it needs \"jsonrpc\": \"2.0\" and a method".into(),
            };
            return rpc_error(&id, &e);
        }
    };
    // A 0.3 client (no header, `message/send`) is told which version this is, rather than that
    // the method does not exist.
    if let Err(e) = version_spoken(&headers) {
        return rpc_error(&id, &e);
    }
    let answer = match method.as_str() {
        "SendMessage" => send(&served, &request)
            .await
            .map(|t| Json(rpc_result(&id, StreamResponse::Task(t))).into_response()),
        "SendStreamingMessage" => stream(&served, &request, id.clone()).await,
        "GetTask" => match params::<TaskIdRequest>(&request) {
            Ok(p) => found(&served, &p.id).await.and_then(|()| {
                let task = served.task(&p.id)?;
                Ok(Json(rpc_result(&id, with_history(task, p.history_length))).into_response())
            }),
            Err(e) => Err(e),
        },
        "CancelTask" => match params::<TaskIdRequest>(&request) {
            Ok(p) => cancel(&served, &p.id)
                .await
                .map(|t| Json(rpc_result(&id, t)).into_response()),
            Err(e) => Err(e),
        },
        _ => Err(A2aError::MethodNotFound { method }),
    };
    answer.unwrap_or_else(|e| rpc_error(&id, &e))
}

/// Task `id` is here (read from the journal if need be), or the error that it is not.
async fn found(served: &Arc<Served>, id: &str) -> Result<(), A2aError> {
    if served.find(id).await? {
        Ok(())
    } else {
        Err(A2aError::TaskNotFound { id: id.to_owned() })
    }
}

/// How a message is answered: at once (the task working) or when it settles, with how much of
/// its history.
struct Answering {
    immediately: bool,
    history_length: Option<usize>,
}

/// Takes a message: a new task (a run of the agent), or on a task that waits for its caller,
/// the answer it waits for. `watcher` follows the task from here. Answers the task's id.
async fn take(
    served: &Arc<Served>,
    request: &Value,
    watcher: Option<UnboundedSender<StreamResponse>>,
) -> Result<(String, Answering), A2aError> {
    let p: SendMessageRequest = params(request)?;
    let configuration = p.configuration.unwrap_or_default();
    let answering = Answering {
        immediately: configuration.return_immediately,
        history_length: configuration.history_length,
    };
    let mut message = p.message;
    if let Some(id) = message.task_id.clone() {
        found(served, &id).await?;
        let task = served.task(&id)?;
        message.context_id = Some(task.context_id);
        served.answer(&id, message, watcher)?;
        return Ok((id, answering));
    }
    if let Some(context) = &message.context_id
        && context.len() > MAX_CONTEXT_ID_BYTES
    {
        return Err(A2aError::InvalidParams {
            reason: format!(
                "the contextId is {} bytes long; at most {MAX_CONTEXT_ID_BYTES}",
                context.len()
            ),
        });
    }
    let input = message.input_text();
    if input.trim().is_empty() {
        return Err(A2aError::InvalidParams {
            reason: "the message has no text".into(),
        });
    }
    let context_id = message
        .context_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    // Behind a task that holds its context, a message waits without a place: one taken here
    // would be given back only once its task reached the wait, and a message that came meanwhile
    // would be answered busy though nothing more runs.
    let slot = if served.context_held(&context_id) {
        None
    } else {
        Some(served.runs.take()?)
    };
    // The task's id is its run's: a journaled task is found under it after a restart.
    let id = uuid::Uuid::now_v7().to_string();
    message.task_id = Some(id.clone());
    message.context_id = Some(context_id.clone());
    let task = Task {
        id: id.clone(),
        context_id,
        status: TaskStatus {
            state: TaskState::Submitted,
            message: None,
        },
        artifacts: Vec::new(),
        history: vec![message],
    };
    served.add(task, watcher);
    served.start(id.clone(), Work::Fresh(input), slot);
    Ok((id, answering))
}

async fn send(served: &Arc<Served>, request: &Value) -> Result<Task, A2aError> {
    let (id, answering) = take(served, request, None).await?;
    let (mut state, _) = served.watch(&id)?;
    if !answering.immediately {
        tokio::select! {
            biased;
            _ = state.wait_for(|s| settled(*s)) => {}
            () = served.stopping.cancelled() => {
                return Err(A2aError::Stopped {
                    id,
                    journaled: served.journaled(),
                });
            }
        }
    }
    Ok(with_history(served.task(&id)?, answering.history_length))
}

async fn stream(served: &Arc<Served>, request: &Value, id: Value) -> Result<Response, A2aError> {
    let (tx, rx) = unbounded_channel::<StreamResponse>();
    let (task, _) = take(served, request, Some(tx)).await?;
    let following = Following {
        rx,
        backlog: served
            .backlog(&task)
            .unwrap_or_else(|| Arc::new(Backlog::new(STREAM_BACKLOG))),
    };
    // At the server's stop the stream ends with the error that says so (`a2a.stopped`), once,
    // after the updates sent before it: cut by the stop's grace instead, it ended with none.
    let stopped = A2aError::Stopped {
        id: task,
        journaled: served.journaled(),
    };
    let stopping = served.stopping.clone();
    let state = (following, id, Some(stopped));
    let events = futures::stream::unfold(state, move |(mut f, id, mut stopped)| {
        let stopping = stopping.clone();
        async move {
            let data = tokio::select! {
                biased;
                item = f.rx.recv() => {
                    let item = item?;
                    f.backlog.taken();
                    rpc_result(&id, item)
                }
                () = stopping.cancelled() => rpc_error_value(&id, &stopped.take()?),
            };
            let event = SseEvent::default().data(data.to_string());
            Some((Ok::<_, Infallible>(event), (f, id, stopped)))
        }
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// A stream's end of its task's updates. What it has not read when it goes (its caller gone)
/// leaves the task's backlog with it, so that the run never waits on a stream nobody reads.
struct Following {
    rx: UnboundedReceiver<StreamResponse>,
    backlog: Arc<Backlog>,
}

impl Drop for Following {
    fn drop(&mut self) {
        // Closed first: nothing more is counted in after the last is taken out.
        self.rx.close();
        while self.rx.try_recv().is_ok() {
            self.backlog.taken();
        }
    }
}

async fn cancel(served: &Arc<Served>, id: &str) -> Result<Task, A2aError> {
    found(served, id).await?;
    let (mut state, cancel) = served.watch(id)?;
    let now = *state.borrow();
    if now.is_terminal() {
        return Err(A2aError::TaskNotCancelable {
            id: id.to_owned(),
            state: now,
        });
    }
    cancel.cancel();
    // The run drains (its tools are stopped) and ends cancelled; the caller gets the task then.
    let _ =
        tokio::time::timeout(Duration::from_secs(30), state.wait_for(|s| s.is_terminal())).await;
    served.task(id)
}
