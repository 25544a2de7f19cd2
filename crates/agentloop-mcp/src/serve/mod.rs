//! The other side of MCP: agents, and an agent's own tools, served to MCP clients. Each served
//! thing is one MCP tool, and each call of it is a run of an agent, so the run's limits,
//! validation, permission gate, sandbox and journal hold for a client's call as for the model's.
//! The transports (stdio, streamable HTTP) are in `transport`; the progress a run reports and the
//! approvals nobody at the server can give are in `progress`.

mod progress;
mod sessions;
mod transport;

use std::sync::Arc;
use std::time::Duration;

use agentloop::message::{ContentPart, ToolContent};
use agentloop::model::ModelResponse;
use agentloop::permissions::ApprovalPrompter;
use agentloop::testing::ScriptedModel;
use agentloop::tool::ToolSpec;
use agentloop::{Agent, CallStatus, Limits, Message, Model, RunOptions, StopReason};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

pub use sessions::DEFAULT_SESSION_IDLE;
pub use transport::{serve_http, serve_stdio};

use progress::{CallProgress, Detail, Unattended};

/// Builds the agent one call runs, with the prompter that answers its `ask` calls.
pub type BuildAgent =
    Arc<dyn Fn(Arc<dyn ApprovalPrompter>) -> Result<Agent, String> + Send + Sync + 'static>;

/// Builds the agent a call of one of its tools runs, over the model given (it calls exactly
/// that tool, once), with the prompter that answers its `ask` calls.
pub type BuildToolAgent = Arc<
    dyn Fn(Arc<dyn Model>, Arc<dyn ApprovalPrompter>) -> Result<Agent, String>
        + Send
        + Sync
        + 'static,
>;

/// The options of each run a call starts (its journal, its trace, where it is resumed from):
/// everything but the cancellation and the progress sink, which the server adds.
pub type RunOptionsFor = Arc<dyn Fn() -> RunOptions + Send + Sync + 'static>;

/// An agent served as one MCP tool: it is called with a `task`, runs on it, and answers with its
/// final output.
#[derive(Clone)]
pub struct ServedAgent {
    /// The tool's name (the agent's).
    pub name: String,
    /// What the client's model reads about it.
    pub description: String,
    /// The JSON Schema of the agent's final answer, when it has one: the tool's output schema,
    /// and its answer is the call's structured content.
    pub output_schema: Option<Value>,
    /// The agent each call runs.
    pub build: BuildAgent,
    /// The options of each run.
    pub options: RunOptionsFor,
}

/// The tools of an agent, each served as an MCP tool of the same name and schemas. A call is a
/// one-turn run of the agent whose model calls exactly that tool with the client's arguments: the
/// arguments are checked against the tool's schema, the permission gate admits the call, and the
/// tool runs in its sandbox with its timeout and retries, as when the agent's model calls it.
#[derive(Clone)]
pub struct ServedTools {
    /// The tools, as the agent's model sees them.
    pub specs: Vec<ToolSpec>,
    /// The agent each call runs.
    pub build: BuildToolAgent,
    /// The options of each run.
    pub options: RunOptionsFor,
}

/// What the server offers: its MCP tools, each backed by an agent or by one of an agent's tools.
#[derive(Clone, Default)]
pub struct Offer {
    entries: Vec<Entry>,
}

#[derive(Clone)]
struct Entry {
    tool: rmcp::model::Tool,
    backing: Backing,
}

#[derive(Clone)]
enum Backing {
    Agent(ServedAgent),
    Tool(ServedTools),
}

/// Why agents or tools cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Two served tools share a name (two agents, or two files' tools).
    #[error("two served MCP tools are named {name:?}")]
    DuplicateTool {
        /// The name.
        name: String,
    },
    /// The transport failed: the address could not be served, or the client's handshake
    /// failed.
    #[error("the MCP server: {reason}")]
    Transport {
        /// Why.
        reason: String,
    },
}

impl ServeError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ServeError::DuplicateTool { .. } => "mcp.duplicate_tool",
            ServeError::Transport { .. } => "mcp.serve",
        }
    }
}

/// The input schema of an agent served as a tool: the task, as a subagent is given it.
pub fn task_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "task": {
                "type": "string",
                "description": "The task, with everything the agent needs to know: it sees nothing of your conversation."
            }
        },
        "required": ["task"],
        "additionalProperties": false
    })
}

fn object(schema: &Value) -> JsonObject {
    schema.as_object().cloned().unwrap_or_default()
}

/// MCP wants an output schema (and the structured content it describes) to be an object.
fn object_schema(schema: Option<&Value>) -> Option<Arc<JsonObject>> {
    let schema = schema?;
    (schema.get("type") == Some(&json!("object"))).then(|| Arc::new(object(schema)))
}

impl Offer {
    /// Nothing offered yet.
    pub fn new() -> Self {
        Offer::default()
    }

    /// Offers an agent as one tool.
    pub fn agent(&mut self, agent: ServedAgent) -> Result<(), ServeError> {
        let mut tool = rmcp::model::Tool::new(
            agent.name.clone(),
            agent.description.clone(),
            object(&task_schema()),
        );
        tool.output_schema = object_schema(agent.output_schema.as_ref());
        self.push(Entry {
            tool,
            backing: Backing::Agent(agent),
        })
    }

    /// Offers every tool of an agent.
    pub fn tools(&mut self, tools: ServedTools) -> Result<(), ServeError> {
        for spec in &tools.specs {
            let mut tool = rmcp::model::Tool::new(
                spec.name.clone(),
                spec.description.clone(),
                object(&spec.input_schema),
            );
            tool.output_schema = object_schema(spec.output_schema.as_ref());
            self.push(Entry {
                tool,
                backing: Backing::Tool(tools.clone()),
            })?;
        }
        Ok(())
    }

    fn push(&mut self, entry: Entry) -> Result<(), ServeError> {
        if self.entries.iter().any(|e| e.tool.name == entry.tool.name) {
            return Err(ServeError::DuplicateTool {
                name: entry.tool.name.to_string(),
            });
        }
        self.entries.push(entry);
        Ok(())
    }

    /// The names of the tools offered, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.tool.name.as_ref())
    }

    /// True when nothing is offered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The MCP server handler over an [`Offer`]: cheap to clone (a streamable HTTP server makes one
/// per session).
#[derive(Clone)]
pub struct AgentServer {
    offer: Arc<Offer>,
    /// The places of the calls that run at once, shared by every session's handler.
    runs: Arc<tokio::sync::Semaphore>,
    most: usize,
    session_idle: Option<Duration>,
    /// The HTTP sessions' activity, once served over HTTP: a call holds its session busy.
    sessions: Option<Arc<sessions::Activity>>,
    /// Cancelled when the server stops: a journaled run is then left to resume, not cancelled.
    stopping: agentloop::CancellationToken,
}

impl AgentServer {
    /// A server of this offer, running at most [`DEFAULT_MAX_RUNS`] calls at once.
    pub fn new(offer: Offer) -> Self {
        AgentServer {
            offer: Arc::new(offer),
            runs: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_RUNS)),
            most: DEFAULT_MAX_RUNS,
            session_idle: Some(DEFAULT_SESSION_IDLE),
            sessions: None,
            stopping: agentloop::CancellationToken::new(),
        }
    }

    /// How long a streamable HTTP session (a client of MCP before 2026-07-28) lives with no
    /// call of it running and no stream of it open: past it the session is closed, and its
    /// client's next request is answered 404 (it starts a session again). `None` keeps a
    /// session until its client ends it or the server stops. A call in progress never ends
    /// with its session, however long and quiet its run. Default [`DEFAULT_SESSION_IDLE`].
    pub fn with_session_idle(mut self, idle: Option<Duration>) -> Self {
        self.session_idle = idle;
        self
    }

    /// The server runs at most `most` calls at once, whichever sessions they come from (at
    /// least one): each is a run of an agent, or of one of its tools, so a client that calls a
    /// thousand times at once gets an error result past the bound rather than a thousand paid
    /// runs. Set it as the server is built: the handlers cloned before keep the old bound.
    pub fn with_max_runs(mut self, most: usize) -> Self {
        let most = most.max(1);
        self.runs = Arc::new(tokio::sync::Semaphore::new(most));
        self.most = most;
        self
    }
}

/// The most calls a server runs at once unless told otherwise ([`AgentServer::with_max_runs`]).
pub const DEFAULT_MAX_RUNS: usize = agentloop_serve::DEFAULT_MAX_RUNS;

impl ServerHandler for AgentServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("agentloop", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool runs an agentloop agent (or one of an agent's tools) under the \
                 agent file's limits and permissions; progress is reported while it runs.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.offer.entries.iter().map(|e| e.tool.clone()).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        self.offer
            .entries
            .iter()
            .find(|e| e.tool.name == name)
            .map(|e| e.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(entry) = self
            .offer
            .entries
            .iter()
            .find(|e| e.tool.name == request.name)
        else {
            return Err(ErrorData::invalid_params(
                format!("no tool named {:?}", request.name),
                None,
            ));
        };
        // Its session lives while it runs, its stream gone or not.
        let _session = self.sessions.as_ref().and_then(|a| a.call(&context));
        let Ok(_slot) = Arc::clone(&self.runs).try_acquire_owned() else {
            return Ok(CallToolResponse::Complete(error_result(format!(
                "the server is running its most calls at once ({}); call again when one ends",
                self.most
            ))));
        };
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        let token = request
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.meta.get_progress_token());
        // `notifications/cancelled` for this request cancels this token: a tool's run's, and
        // what an elicitation waits on (an agent's run takes its own, `CallStop`). The server's
        // stop does too: over HTTP the sessions, and with them the requests' tokens, end only
        // once the calls have answered.
        let cancel = context.ct.child_token();
        let _stop = cancel_at_stop(&self.stopping, &cancel);
        // A tool's call reports the call alone: its run is only the way the call is admitted.
        let detail = match &entry.backing {
            Backing::Agent(_) => Detail::Run,
            Backing::Tool(_) => Detail::Calls,
        };
        let progress = CallProgress::start(context.peer.clone(), token, detail);
        let unattended = Arc::new(Unattended::new(cancel.clone(), &context.peer));
        let result = match &entry.backing {
            Backing::Agent(served) => {
                let stop = CallStop {
                    client: context.ct.clone(),
                    server: self.stopping.clone(),
                };
                run_agent(served, arguments, &entry.tool, &progress, &unattended, stop).await
            }
            Backing::Tool(tools) => {
                run_tool(
                    tools,
                    &entry.tool.name,
                    arguments,
                    &progress,
                    &unattended,
                    cancel,
                )
                .await
            }
        };
        progress.finish().await;
        Ok(CallToolResponse::Complete(result))
    }
}

/// Cancels `cancel` when `stopping` is, until the guard it gives back is dropped.
fn cancel_at_stop(
    stopping: &agentloop::CancellationToken,
    cancel: &agentloop::CancellationToken,
) -> tokio_util::sync::DropGuard {
    let (stopping, cancel, done) = (
        stopping.clone(),
        cancel.clone(),
        agentloop::CancellationToken::new(),
    );
    let ended = done.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = stopping.cancelled() => cancel.cancel(),
            () = ended.cancelled() => {}
        }
    });
    done.drop_guard()
}

fn error_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text.into())])
}

/// The options of a call's run: the served options, with the call's cancellation and progress.
fn call_options(
    options: &RunOptionsFor,
    progress: &CallProgress,
    cancel: agentloop::CancellationToken,
) -> RunOptions {
    let mut o = options();
    o.cancel = Some(cancel);
    o.sinks.push(progress.sink());
    o
}

/// What stops a call's run: its client's cancel (`notifications/cancelled`), and the server's
/// stop, which the client's token also sees.
struct CallStop {
    client: agentloop::CancellationToken,
    server: agentloop::CancellationToken,
}

impl CallStop {
    /// `run`'s outcome, `cancel` (the run's) cancelled when the client cancels the call. The
    /// server's stop cancels it too, unless the run is `journaled`: a stop is not the client's
    /// cancel, and a journaled run it ended would be journaled over (`cancelled`), never to go
    /// on. Such a run is dropped where its journal has it (its tools' processes killed with
    /// their groups), resumable, and the answer is `None`.
    async fn until_stopped(
        &self,
        run: impl Future<Output = agentloop::RunOutcome>,
        cancel: &agentloop::CancellationToken,
        journaled: bool,
    ) -> Option<agentloop::RunOutcome> {
        use std::task::Poll;
        let mut run = std::pin::pin!(run);
        let mut stopped = std::pin::pin!(self.server.cancelled());
        let mut cancelled = std::pin::pin!(self.client.cancelled());
        std::future::poll_fn(|cx| {
            // The stop first: over stdio the client's token is cancelled with it (over HTTP it
            // is not until the calls have answered, so the stop cancels the run itself).
            if stopped.as_mut().poll(cx).is_ready() {
                if journaled {
                    return Poll::Ready(None);
                }
                if !cancel.is_cancelled() {
                    cancel.cancel();
                }
            }
            if !cancel.is_cancelled() && cancelled.as_mut().poll(cx).is_ready() {
                cancel.cancel();
            }
            run.as_mut().poll(cx).map(Some)
        })
        .await
    }
}

async fn run_agent(
    served: &ServedAgent,
    arguments: Value,
    tool: &rmcp::model::Tool,
    progress: &CallProgress,
    unattended: &Arc<Unattended>,
    stop: CallStop,
) -> CallToolResult {
    let Some(task) = arguments.get("task").and_then(Value::as_str) else {
        return error_result("the call needs a `task`: a string");
    };
    let agent = match (served.build)(unattended.clone()) {
        Ok(a) => a,
        Err(e) => return error_result(format!("the agent could not be built: {e}")),
    };
    let cancel = agentloop::CancellationToken::new();
    let mut options = call_options(&served.options, progress, cancel.clone());
    // A journaled run is named here, so that the answer to a stop can say which run to resume.
    let journaled = options.journal.is_some().then(agentloop::ids::run_id);
    options.run_id.clone_from(&journaled);
    let run = agent.run_with(Vec::new(), Some(Message::user(task)), options);
    let Some(outcome) = stop.until_stopped(run, &cancel, journaled.is_some()).await else {
        let id = journaled.unwrap_or_default();
        return error_result(format!(
            "the server stopped during the agent's run: the run is left unfinished in the \
             server's journal, and `agentloop resume {id}` goes on with it"
        ));
    };
    if let Some(text) = unattended.report() {
        return error_result(text);
    }
    if outcome.stop_reason != StopReason::Finished {
        let mut text = format!("the agent's run stopped: {}", outcome.stop_reason.as_str());
        if let Some(e) = &outcome.error {
            text.push_str(&format!(" ({}: {e})", e.code()));
        }
        if let Some(o) = outcome.output.as_deref().filter(|o| !o.is_empty()) {
            text.push_str(&format!("; its last words: {o}"));
        }
        return error_result(text);
    }
    let text = outcome.output.unwrap_or_default();
    match (&tool.output_schema, outcome.structured_output) {
        (Some(_), Some(structured)) => {
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = Some(structured);
            r
        }
        _ => CallToolResult::success(vec![ContentBlock::text(text)]),
    }
}

/// The id of the one call a tool's run makes.
const CALL_ID: &str = "mcp-client-call";

async fn run_tool(
    tools: &ServedTools,
    name: &str,
    arguments: Value,
    progress: &CallProgress,
    unattended: &Arc<Unattended>,
    cancel: agentloop::CancellationToken,
) -> CallToolResult {
    // The second answer is never anyone's: the run ends at its second turn, after the call's
    // result was read (a result no model call would read is never run).
    let model = Arc::new(ScriptedModel::new([
        ModelResponse::tool_calls([(CALL_ID, name, arguments.to_string())]),
        ModelResponse::text(""),
    ]));
    let agent = match (tools.build)(model, unattended.clone()) {
        Ok(a) => a,
        Err(e) => return error_result(format!("the agent could not be built: {e}")),
    };
    let mut options = call_options(&tools.options, progress, cancel);
    options.limits = Some(Limits {
        max_turns: Some(2),
        output_retries: 0,
        on_limit: agentloop::OnLimit::Stop,
        ..agent.config().limits().clone()
    });
    let input = Message::user(format!("Call the tool {name}."));
    let outcome = agent.run_with(Vec::new(), Some(input), options).await;
    if let Some(text) = unattended.report() {
        return error_result(text);
    }
    let Some(record) = outcome.tool_calls.iter().find(|c| &*c.tool == name) else {
        let why = outcome.error.as_ref().map_or_else(
            || outcome.stop_reason.as_str().to_owned(),
            |e| e.to_string(),
        );
        return error_result(format!("the call did not run: {why}"));
    };
    let call = &record.outcome;
    if call.status != CallStatus::Ok {
        let code = call.code.as_deref().unwrap_or("tool.error");
        let text = call.content.to_text();
        // A denial's text already opens with its code (`denied: the user denied this call`).
        if text
            .strip_prefix(code)
            .is_some_and(|rest| rest.starts_with(':'))
        {
            return error_result(text);
        }
        return error_result(format!("{code}: {text}"));
    }
    match &call.content {
        ToolContent::Json(v) => {
            let mut r = CallToolResult::success(vec![ContentBlock::text(v.to_string())]);
            if v.is_object() {
                r.structured_content = Some(v.clone());
            }
            r
        }
        other => CallToolResult::success(content_blocks(other)),
    }
}

/// A call's content as MCP content blocks: its images stay images (an MCP server's screenshot
/// served again reaches the client as one), the rest is text.
fn content_blocks(content: &ToolContent) -> Vec<ContentBlock> {
    let ToolContent::Parts(parts) = content else {
        return vec![ContentBlock::text(content.to_text())];
    };
    parts
        .iter()
        .map(|part| match part {
            ContentPart::Text { text } => ContentBlock::text(text.clone()),
            ContentPart::Image { url, media_type } => match base64_data(url) {
                Some((mime, data)) => {
                    ContentBlock::image(data, media_type.as_deref().unwrap_or(mime))
                }
                // An image by address is not MCP image content (that is base64): it is named.
                None => ContentBlock::text(format!("[image: {url}]")),
            },
        })
        .collect()
}

/// The media type and the base64 data of a `data:MEDIA;base64,DATA` URL.
fn base64_data(url: &str) -> Option<(&str, &str)> {
    url.strip_prefix("data:")?.split_once(";base64,")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_results_images_are_served_as_mcp_images_and_its_text_as_text() {
        let content = ToolContent::Parts(vec![
            ContentPart::Text {
                text: "a screenshot".into(),
            },
            ContentPart::Image {
                url: "data:image/png;base64,iVBORw0KGgo=".into(),
                media_type: Some("image/png".into()),
            },
            ContentPart::Image {
                url: "https://example.com/cat.jpg".into(),
                media_type: None,
            },
        ]);
        let blocks = serde_json::to_value(content_blocks(&content)).unwrap_or_default();
        assert_eq!(
            blocks,
            json!([
                {"type": "text", "text": "a screenshot"},
                {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                {"type": "text", "text": "[image: https://example.com/cat.jpg]"}
            ])
        );
    }

    #[test]
    fn text_and_json_content_is_one_text_block() {
        let blocks = serde_json::to_value(content_blocks(&ToolContent::Text("hi".into())))
            .unwrap_or_default();
        assert_eq!(blocks, json!([{"type": "text", "text": "hi"}]));
    }
}
