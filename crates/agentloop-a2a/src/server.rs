//! The A2A server: each agent at its own path (`/NAME`, and the first also at `/`), its card on
//! GET, JSON-RPC on POST. A task is a run of the agent, started by a message and driven on a
//! task of its own; its events become the task's status updates, its answer the task's
//! artifact. The tasks are kept in memory while the server runs (the latest `MAX_TASKS` that
//! ended, and every running one); a context's transcript too.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentloop::{Agent, CancellationToken, Event, EventKind, EventSink, RunOptions, StopReason};
use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio::sync::watch;

use crate::A2aError;
use crate::wire::{
    Artifact, Message, PROTOCOL_VERSION, Part, SendMessageRequest, StreamResponse, Task,
    TaskIdRequest, TaskState, TaskStatus, with_history,
};

/// Builds the agent a task runs.
pub type BuildAgent = Arc<dyn Fn() -> Result<Agent, String> + Send + Sync + 'static>;

/// The options of each run (its journal, its trace): all but the cancellation and the event
/// sink of the task, which the server adds.
pub type RunOptionsFor = Arc<dyn Fn() -> RunOptions + Send + Sync + 'static>;

/// An agent served over A2A.
#[derive(Clone)]
pub struct ServedAgent {
    /// Its name: the card's, and the path it is served at.
    pub name: String,
    /// What a caller reads about it.
    pub description: String,
    /// Its version, as the card shows it.
    pub version: String,
    /// The agent each task runs.
    pub build: BuildAgent,
    /// The options of each run.
    pub options: RunOptionsFor,
}

/// The agents of one server.
#[derive(Clone)]
pub struct A2aServer {
    agents: Vec<Arc<Served>>,
}

struct Served {
    agent: ServedAgent,
    tasks: Mutex<HashMap<String, TaskEntry>>,
    created: std::sync::atomic::AtomicU64,
    /// Each context's transcript; its lock keeps the runs of one context one at a time.
    contexts: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Vec<agentloop::Message>>>>>,
}

struct TaskEntry {
    task: Task,
    cancel: CancellationToken,
    done: watch::Receiver<bool>,
    /// The order it was created in, for forgetting the oldest ended tasks first.
    created: u64,
}

/// The most tasks a served agent keeps: past it, the oldest that ended are forgotten (a
/// `GetTask` of one then answers that no such task exists). Running tasks are always kept.
const MAX_TASKS: usize = 10_000;

/// Forgets the oldest ended tasks past [`MAX_TASKS`].
fn forget_oldest(tasks: &mut HashMap<String, TaskEntry>) {
    let Some(excess) = tasks.len().checked_sub(MAX_TASKS).filter(|n| *n > 0) else {
        return;
    };
    let mut ended: Vec<(u64, String)> = tasks
        .iter()
        .filter(|(_, e)| e.task.status.state.is_terminal())
        .map(|(id, e)| (e.created, id.clone()))
        .collect();
    ended.sort_unstable();
    for (_, id) in ended.into_iter().take(excess) {
        tasks.remove(&id);
    }
}

impl A2aServer {
    /// A server of these agents (the first is also served at `/`).
    pub fn new(agents: Vec<ServedAgent>) -> Self {
        A2aServer {
            agents: agents
                .into_iter()
                .map(|agent| {
                    Arc::new(Served {
                        agent,
                        tasks: Mutex::default(),
                        created: std::sync::atomic::AtomicU64::new(0),
                        contexts: Mutex::default(),
                    })
                })
                .collect(),
        }
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
                        post(move |body: Bytes| rpc(rpc_served.clone(), body)),
                    );
            }
        }
        router
    }
}

/// Serves `server` on `listener` until `shutdown` completes.
pub async fn serve(
    server: &A2aServer,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), A2aError> {
    axum::serve(listener, server.router())
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| A2aError::Serve {
            reason: e.to_string(),
        })
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

fn rpc_error(id: &Value, e: &A2aError) -> Response {
    Json(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": e.rpc_code(), "message": e.to_string(), "data": {"code": e.code()}},
    }))
    .into_response()
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

async fn rpc(served: Arc<Served>, body: Bytes) -> Response {
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
    let answer = match method.as_str() {
        "SendMessage" => send(&served, &request)
            .await
            .map(|t| Json(rpc_result(&id, StreamResponse::Task(t))).into_response()),
        "SendStreamingMessage" => stream(&served, &request, id.clone()),
        "GetTask" => params::<TaskIdRequest>(&request).and_then(|p| {
            let task = served.task(&p.id)?;
            Ok(Json(rpc_result(&id, with_history(task, p.history_length))).into_response())
        }),
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

impl Served {
    fn task(&self, id: &str) -> Result<Task, A2aError> {
        let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks
            .get(id)
            .map(|e| e.task.clone())
            .ok_or_else(|| A2aError::TaskNotFound { id: id.to_owned() })
    }

    fn update(&self, id: &str, change: impl FnOnce(&mut Task)) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = tasks.get_mut(id) {
            change(&mut e.task);
        }
    }

    fn context(&self, id: &str) -> Arc<tokio::sync::Mutex<Vec<agentloop::Message>>> {
        let mut contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        contexts.entry(id.to_owned()).or_default().clone()
    }
}

/// How a message is answered: at once (the task working) or at its end, with how much of its
/// history.
struct Answering {
    immediately: bool,
    history_length: Option<usize>,
}

/// A task started by a message: the task as submitted, the run's input, and what tells when
/// it ended.
struct Started {
    task: Task,
    input: String,
    cancel: CancellationToken,
    done: watch::Sender<bool>,
}

fn start(served: &Served, request: &Value) -> Result<(Started, Answering), A2aError> {
    let p: SendMessageRequest = params(request)?;
    if p.message.task_id.is_some() {
        // A task here is one run, over when it answered: a follow-up is a new message in
        // the same context.
        return Err(A2aError::InvalidParams {
            reason: "this agent's tasks take one message; send the next one in the same \
                     contextId, without a taskId"
                .into(),
        });
    }
    let input = p.message.input_text();
    if input.trim().is_empty() {
        return Err(A2aError::InvalidParams {
            reason: "the message has no text".into(),
        });
    }
    let context_id = p
        .message
        .context_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let id = uuid::Uuid::now_v7().to_string();
    let mut message = p.message;
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
    let cancel = CancellationToken::new();
    let (done, watched) = watch::channel(false);
    let created = served
        .created
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tasks = served.tasks.lock().unwrap_or_else(|p| p.into_inner());
    tasks.insert(
        id,
        TaskEntry {
            task: task.clone(),
            cancel: cancel.clone(),
            done: watched,
            created,
        },
    );
    forget_oldest(&mut tasks);
    drop(tasks);
    let configuration = p.configuration.unwrap_or_default();
    Ok((
        Started {
            task,
            input,
            cancel,
            done,
        },
        Answering {
            immediately: configuration.return_immediately,
            history_length: configuration.history_length,
        },
    ))
}

async fn send(served: &Arc<Served>, request: &Value) -> Result<Task, A2aError> {
    let (started, answering) = start(served, request)?;
    let id = started.task.id.clone();
    let mut done = started.done.subscribe();
    tokio::spawn(drive(served.clone(), started, None));
    if !answering.immediately {
        let _ = done.wait_for(|d| *d).await;
    }
    Ok(with_history(served.task(&id)?, answering.history_length))
}

fn stream(served: &Arc<Served>, request: &Value, id: Value) -> Result<Response, A2aError> {
    let (started, _) = start(served, request)?;
    let (tx, rx) = unbounded_channel::<StreamResponse>();
    let _ = tx.send(StreamResponse::Task(started.task.clone()));
    tokio::spawn(drive(served.clone(), started, Some(tx)));
    let events = futures::stream::unfold((rx, id), |(mut rx, id)| async move {
        let item = rx.recv().await?;
        let data = rpc_result(&id, item).to_string();
        Some((
            Ok::<_, Infallible>(SseEvent::default().data(data)),
            (rx, id),
        ))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

async fn cancel(served: &Served, id: &str) -> Result<Task, A2aError> {
    let (cancel, mut done, state) = {
        let tasks = served.tasks.lock().unwrap_or_else(|p| p.into_inner());
        let e = tasks
            .get(id)
            .ok_or_else(|| A2aError::TaskNotFound { id: id.to_owned() })?;
        (e.cancel.clone(), e.done.clone(), e.task.status.state)
    };
    if state.is_terminal() {
        return Err(A2aError::TaskNotCancelable {
            id: id.to_owned(),
            state,
        });
    }
    cancel.cancel();
    // The run drains (its tools are stopped) and ends cancelled; the caller gets the task then.
    let _ = tokio::time::timeout(Duration::from_secs(30), done.wait_for(|d| *d)).await;
    served.task(id)
}

/// The run's events as the task's status updates.
struct StatusSink {
    tx: UnboundedSender<StreamResponse>,
    task: Task,
}

impl EventSink for StatusSink {
    fn emit(&self, event: &Event) {
        let text = match &event.kind {
            EventKind::TurnStarted => format!("turn {}", event.turn),
            EventKind::ToolStarted { tool, .. } => format!("calling {tool}"),
            EventKind::ToolFinished { tool, outcome, .. } => {
                let status = serde_json::to_value(outcome.status).unwrap_or_default();
                format!("{tool}: {}", status.as_str().unwrap_or("ended"))
            }
            EventKind::ToolRejected { tool, code, .. } => format!("{tool}: {code}"),
            // A tool's progress (a remote agent's status, a subagent's): its words as they are.
            EventKind::ToolProgress { tool, progress, .. } => match progress.as_str() {
                Some(words) => format!("{tool}: {words}"),
                None => format!("{tool}: {progress}"),
            },
            _ => return,
        };
        let _ = self.tx.send(StreamResponse::StatusUpdate {
            task_id: self.task.id.clone(),
            context_id: self.task.context_id.clone(),
            status: TaskStatus {
                state: TaskState::Working,
                message: Some(Message::agent(&self.task, text)),
            },
        });
    }
}

/// Runs the task: the agent on the context's transcript and the message, then the task's end.
async fn drive(served: Arc<Served>, started: Started, tx: Option<UnboundedSender<StreamResponse>>) {
    let Started {
        task,
        input,
        cancel,
        done,
    } = started;
    let context = served.context(&task.context_id);
    // One run of a context at a time, each on the transcript the last one left.
    let mut transcript = context.lock().await;
    let working = TaskStatus {
        state: TaskState::Working,
        message: None,
    };
    served.update(&task.id, |t| t.status = working.clone());
    let status_update = |status: TaskStatus| StreamResponse::StatusUpdate {
        task_id: task.id.clone(),
        context_id: task.context_id.clone(),
        status,
    };
    if let Some(tx) = &tx {
        let _ = tx.send(status_update(working));
    }
    let (state, text, artifact) = match (served.agent.build)() {
        Err(e) => (
            TaskState::Failed,
            format!("the agent could not be started: {e}"),
            None,
        ),
        Ok(agent) => {
            let mut options = (served.agent.options)();
            options.cancel = Some(cancel);
            if let Some(tx) = &tx {
                options.sinks.push(Arc::new(StatusSink {
                    tx: tx.clone(),
                    task: task.clone(),
                }));
            }
            let outcome = agent
                .run_with(
                    transcript.clone(),
                    Some(agentloop::Message::user(input)),
                    options,
                )
                .await;
            *transcript = outcome.transcript.clone();
            ended(&task, &outcome)
        }
    };
    drop(transcript);
    let status = TaskStatus {
        state,
        message: Some(Message::agent(&task, text)),
    };
    served.update(&task.id, |t| {
        t.status = status.clone();
        t.artifacts.extend(artifact.clone());
        t.history.extend(status.message.clone());
    });
    if let Some(tx) = &tx {
        if let Some(artifact) = artifact {
            let _ = tx.send(StreamResponse::ArtifactUpdate {
                task_id: task.id.clone(),
                context_id: task.context_id.clone(),
                artifact,
                last_chunk: true,
            });
        }
        let _ = tx.send(status_update(status));
    }
    let _ = done.send(true);
}

/// The task's end for a run's outcome: its state, the agent's last words, and the answer as an
/// artifact (text, and the structured answer as data).
fn ended(task: &Task, outcome: &agentloop::RunOutcome) -> (TaskState, String, Option<Artifact>) {
    match outcome.stop_reason {
        StopReason::Finished => {
            let text = outcome.output.clone().unwrap_or_default();
            let mut parts = vec![Part::text(text.clone())];
            if let Some(data) = &outcome.structured_output {
                parts.push(Part {
                    data: Some(data.clone()),
                    media_type: Some("application/json".into()),
                    ..Part::default()
                });
            }
            let artifact = Artifact {
                artifact_id: format!("{}-answer", task.id),
                name: "answer".into(),
                parts,
            };
            (TaskState::Completed, text, Some(artifact))
        }
        StopReason::Cancelled => (TaskState::Canceled, "the run was cancelled".into(), None),
        ref other => {
            let mut text = format!("the run stopped: {}", other.as_str());
            if let Some(e) = &outcome.error {
                text.push_str(&format!(" ({}: {e})", e.code()));
            }
            (TaskState::Failed, text, None)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn entry(created: u64, state: TaskState) -> (String, TaskEntry) {
        let id = format!("t{created}");
        let task = Task {
            id: id.clone(),
            context_id: "c".into(),
            status: TaskStatus {
                state,
                message: None,
            },
            artifacts: Vec::new(),
            history: Vec::new(),
        };
        let (_, done) = watch::channel(true);
        let entry = TaskEntry {
            task,
            cancel: CancellationToken::new(),
            done,
            created,
        };
        (id, entry)
    }

    #[test]
    fn past_the_cap_the_oldest_ended_tasks_are_forgotten_and_running_ones_kept() {
        let mut tasks: HashMap<String, TaskEntry> = HashMap::new();
        // The oldest is still running; the next two ended.
        tasks.extend([entry(0, TaskState::Working)]);
        tasks.extend([
            entry(1, TaskState::Completed),
            entry(2, TaskState::Canceled),
        ]);
        for n in 3..(MAX_TASKS as u64 + 2) {
            tasks.extend([entry(n, TaskState::Completed)]);
        }
        assert_eq!(tasks.len(), MAX_TASKS + 2);
        forget_oldest(&mut tasks);
        assert_eq!(tasks.len(), MAX_TASKS);
        assert!(tasks.contains_key("t0"), "a running task is kept");
        assert!(!tasks.contains_key("t1") && !tasks.contains_key("t2"));
        assert!(tasks.contains_key("t3"));
        forget_oldest(&mut tasks);
        assert_eq!(
            tasks.len(),
            MAX_TASKS,
            "nothing past the cap: nothing forgotten"
        );
    }
}
