//! The A2A client: a remote agent as one of our tools. Its agent card is read once, when the
//! tool is made; a call sends the model's `task` as a message and follows the task it starts
//! (streamed where the card says the agent streams, else answered whole and polled), its status
//! messages as the call's progress, its artifacts as the result. A task that fails, is rejected
//! or wants more input is an error result the model reads; a call our run cancels, or that its
//! timeout drops, cancels the remote task.

use std::sync::Arc;
use std::time::Duration;

use agentloop::model::{ModelError, ModelErrorKind};
use agentloop::tool::{Tool, ToolBuilder, ToolContext, ToolError, ToolOutput, bounded_text};
use agentloop_providers::sse::SseStream;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::A2aError;
use crate::wire::{Artifact, Message, PROTOCOL_VERSION, Part, Role, Task, TaskState, TaskStatus};

/// How long a card read or a `CancelTask` may take: both are small requests.
const SHORT_REQUEST: Duration = Duration::from_secs(10);

/// How often a task answered before its end is asked for again (a server without streaming).
const POLL_EVERY: Duration = Duration::from_millis(500);

/// The most bytes of a card, or of one answer or event, read from a remote agent.
const MAX_BODY_BYTES: usize = 16 << 20;

/// The most bytes of a call's answer the model reads unless the tool says otherwise
/// ([`A2aClient::with_max_output_bytes`]; the agent file's `max_bytes`): 64 KiB, as an MCP
/// server's result. Longer text keeps its head and tail, saying what was cut.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// How long a call may take unless the tool says otherwise (the agent file's `timeout_secs`): ten
/// minutes. A remote task that works for ever would otherwise hold the call, and the run, for ever.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// The least a call keeps of a task's artifacts as they stream in (twice the output bound when
/// that is more): the answer is cut to the bound anyway, and a remote agent that appends to an
/// artifact without end would otherwise fill our memory. Past it parts are dropped, counted, and
/// the answer says how many bytes went.
const MIN_KEPT_ARTIFACT_BYTES: usize = 1 << 20;

/// The most bytes of one status message passed on as the call's progress (as an MCP server's).
const PROGRESS_MESSAGE_BYTES: usize = 1024;

/// How many times in a row a failed `GetTask` is asked again (after 1, 2, 4 s) before the call
/// fails: a proxy's 502 or a reset connection should not cancel a remote task near its end.
const POLL_RETRIES: u32 = 3;

/// What a remote agent's card says that a caller needs.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentCard {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its skills: name and description each.
    pub skills: Vec<(String, String)>,
    /// Where its JSON-RPC interface answers.
    pub url: String,
    /// It streams a task's events (`SendStreamingMessage`).
    pub streaming: bool,
}

impl AgentCard {
    /// The tool description a model reads: the agent's own words and its skills.
    pub fn tool_description(&self) -> String {
        let mut out = if self.description.trim().is_empty() {
            format!("Hands a task to the remote agent {}.", self.name)
        } else {
            self.description.trim().to_owned()
        };
        if !self.skills.is_empty() {
            out.push_str("\nSkills:");
            for (name, description) in &self.skills {
                out.push_str(&format!("\n- {name}: {description}"));
            }
        }
        out
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCard {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    skills: Vec<RawSkill>,
    #[serde(default)]
    supported_interfaces: Vec<RawInterface>,
    #[serde(default)]
    capabilities: RawCapabilities,
}

#[derive(Deserialize)]
struct RawSkill {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawInterface {
    url: String,
    #[serde(default)]
    protocol_binding: String,
}

#[derive(Deserialize, Default)]
struct RawCapabilities {
    #[serde(default)]
    streaming: bool,
}

/// One event of a streamed task, or a `SendMessage` answer.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
enum Event {
    Task(Task),
    Message(Message),
    StatusUpdate {
        #[serde(rename = "taskId")]
        task_id: String,
        status: TaskStatus,
    },
    ArtifactUpdate {
        #[serde(rename = "taskId")]
        task_id: String,
        artifact: Artifact,
        #[serde(default)]
        append: bool,
    },
}

/// A remote A2A agent, its card read.
#[derive(Clone)]
pub struct A2aClient {
    http: reqwest::Client,
    card: Arc<AgentCard>,
    /// Where the JSON-RPC calls go: the card's interface, with the configured URL's credentials
    /// where it is on the same origin (never shown: it may carry them).
    endpoint: Arc<str>,
    /// The configured URL's credentials (user info, query values, their Basic form): what the
    /// remote agent quotes of them is cut from every answer and error the model reads.
    secrets: Arc<[String]>,
    max_output_bytes: usize,
}

impl std::fmt::Debug for A2aClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aClient")
            .field("card", &self.card)
            .field("max_output_bytes", &self.max_output_bytes)
            .finish()
    }
}

/// The card's URL for the agent at `url`: `/.well-known/agent-card.json` below its path, its
/// query (a token, say) kept where it was.
fn card_url(url: &reqwest::Url) -> reqwest::Url {
    let mut card = url.clone();
    let path = format!(
        "{}/.well-known/agent-card.json",
        url.path().trim_end_matches('/')
    );
    card.set_path(&path);
    card
}

/// Where the calls go: the card's interface URL, and, when it is on the configured URL's origin,
/// the configured URL's user and password and the query parameters it lacks. A URL that carries
/// its credentials (`?key=`, `user:pass@`) is one the server wants on every request; a card that
/// names its own URL cannot know them. Another origin gets none of them.
fn endpoint(configured: &reqwest::Url, interface: &str) -> String {
    let Ok(mut url) = reqwest::Url::parse(interface) else {
        return interface.to_owned();
    };
    if url.origin() != configured.origin() {
        return url.into();
    }
    if url.username().is_empty() && !configured.username().is_empty() {
        let _ = url.set_username(configured.username());
        let _ = url.set_password(configured.password());
    }
    let has: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
    let missing: Vec<(String, String)> = configured
        .query_pairs()
        .filter(|(k, _)| !has.iter().any(|h| h == k))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if !missing.is_empty() {
        url.query_pairs_mut().extend_pairs(missing);
    }
    url.into()
}

/// Reads a body of at most [`MAX_BODY_BYTES`] as JSON.
async fn json_body(response: reqwest::Response) -> Result<Value, String> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| e.without_url().to_string())?;
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(format!("the answer is over {MAX_BODY_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| format!("the answer is not JSON: {e}"))
}

impl A2aClient {
    /// Reads the agent card at `url`'s well-known path (`/.well-known/agent-card.json` below
    /// it) and keeps its JSON-RPC interface.
    pub async fn connect(url: &str) -> Result<A2aClient, A2aError> {
        // A 1.0 server takes a request without this header for one of 0.3, which it refuses.
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            "A2A-Version",
            reqwest::header::HeaderValue::from_static(PROTOCOL_VERSION),
        );
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .map_err(|e| A2aError::Card {
                url: agentloop::url_secrets::shown(url),
                reason: e.without_url().to_string(),
            })?;
        // The URL may carry a token (`?token=`, `user:pass@`): the error names the agent by
        // the rest of it, and whatever the server echoes of the token is cut from the reason.
        let secrets = agentloop::url_secrets::secrets(url);
        let failed = |reason: String| A2aError::Card {
            url: agentloop::url_secrets::shown(url),
            reason: agentloop::url_secrets::scrub(&reason, &secrets),
        };
        let configured = reqwest::Url::parse(url).map_err(|e| failed(format!("not a URL: {e}")))?;
        let response = http
            .get(card_url(&configured))
            .timeout(SHORT_REQUEST)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| failed(e.without_url().to_string()))?;
        let raw: RawCard = serde_json::from_value(json_body(response).await.map_err(failed)?)
            .map_err(|e| failed(format!("not an agent card: {e}")))?;
        let Some(interface) = raw
            .supported_interfaces
            .into_iter()
            .find(|i| i.protocol_binding.eq_ignore_ascii_case("JSONRPC"))
        else {
            return Err(failed("the card offers no JSON-RPC interface".into()));
        };
        let endpoint = endpoint(&configured, &interface.url);
        let card = AgentCard {
            name: raw.name,
            description: raw.description,
            skills: raw
                .skills
                .into_iter()
                .map(|s| (s.name, s.description))
                .collect(),
            url: interface.url,
            streaming: raw.capabilities.streaming,
        };
        Ok(A2aClient {
            http,
            card: Arc::new(card),
            endpoint: endpoint.into(),
            secrets: secrets.into(),
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        })
    }

    /// The card read at connect.
    pub fn card(&self) -> &AgentCard {
        &self.card
    }

    /// The most bytes of a call's answer the model reads (at least 1;
    /// [`DEFAULT_MAX_OUTPUT_BYTES`] unless set).
    #[must_use]
    pub fn with_max_output_bytes(mut self, max: usize) -> Self {
        self.max_output_bytes = max.max(1);
        self
    }

    /// The remote agent as the tool `builder` names (with its mode and timeout): its input a
    /// `task`, its description the card's (or `description` where the agent file gives one).
    pub fn tool(&self, builder: ToolBuilder, description: Option<String>) -> Tool {
        let client = self.clone();
        let description = description.unwrap_or_else(|| self.card.tool_description());
        builder.description(description).dynamic(
            input_schema(),
            move |args: Value, ctx: ToolContext| {
                let client = client.clone();
                async move { client.call(task_of(&args), &ctx).await }
            },
        )
    }

    /// The agent at `url` as a tool whose card is read at its first call: for where nothing is
    /// reached before a call (a plan, a list of tools). Its description is `description`, or one
    /// naming the URL; its answers are cut at `max_output_bytes`.
    pub fn tool_at(
        url: &str,
        builder: ToolBuilder,
        description: Option<String>,
        max_output_bytes: usize,
    ) -> Tool {
        // The model reads the description: the URL's credentials never go in it.
        let description = description.unwrap_or_else(|| {
            format!(
                "Hands a task to the remote A2A agent at {}.",
                agentloop::url_secrets::shown(url)
            )
        });
        let url: Arc<str> = url.into();
        let client: Arc<tokio::sync::OnceCell<A2aClient>> = Arc::default();
        builder.description(description).dynamic(
            input_schema(),
            move |args: Value, ctx: ToolContext| {
                let (url, client) = (url.clone(), client.clone());
                async move {
                    let client = client
                        .get_or_try_init(|| async {
                            A2aClient::connect(&url)
                                .await
                                .map(|c| c.with_max_output_bytes(max_output_bytes))
                        })
                        .await
                        .map_err(|e| match e {
                            // The model reads it: the reason, never the URL.
                            A2aError::Card { reason, .. } => ToolError::new(
                                "a2a.card",
                                format!("the remote agent's card could not be read: {reason}"),
                            ),
                            other => ToolError::new(other.code(), other.to_string()),
                        })?;
                    client.call(task_of(&args), &ctx).await
                }
            },
        )
    }

    /// One JSON-RPC request; its `result`, or the remote error as the model reads it.
    async fn rpc(
        &self,
        method: &str,
        params: Value,
        timeout: Option<Duration>,
    ) -> Result<Value, ToolError> {
        let body = json!({"jsonrpc": "2.0", "id": uuid::Uuid::now_v7().to_string(),
                          "method": method, "params": params});
        let mut request = self.http.post(&*self.endpoint).json(&body);
        if let Some(t) = timeout {
            request = request.timeout(t);
        }
        let response = request
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| unreachable_agent(&self.card, &e))?;
        let answer = json_body(response)
            .await
            .map_err(|reason| ToolError::new("a2a.protocol", reason))?;
        rpc_result(answer)
    }

    /// Sends `text` and follows the task to its end.
    async fn call(&self, text: &str, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let message = json!({"message": {
            "messageId": uuid::Uuid::now_v7().to_string(),
            "role": Role::User,
            "parts": [Part::text(text)],
        }});
        let mut follow = Follow {
            client: self,
            task_id: None,
            ended: false,
            artifacts: Artifacts::new(self.max_output_bytes),
        };
        let outcome = tokio::select! {
            outcome = follow.run(message, ctx) => outcome,
            () = ctx.cancel.cancelled() => Err(ToolError::new(
                "a2a.cancelled",
                "the call was cancelled (the remote task too)",
            )),
        };
        if outcome.is_err() || !follow.ended {
            follow.cancel_remote().await;
        }
        self.scrubbed(outcome)
    }

    /// `outcome` without the URL's credentials: a remote agent (or a gateway before it) may
    /// quote the request it was sent, its URL and its `Authorization`, in its error or its
    /// answer.
    fn scrubbed(&self, outcome: Result<ToolOutput, ToolError>) -> Result<ToolOutput, ToolError> {
        use agentloop::message::{ContentPart, ToolContent};
        use agentloop::url_secrets::{scrub, scrub_json};
        let secrets = &self.secrets[..];
        if secrets.is_empty() {
            return outcome;
        }
        match outcome {
            Ok(mut out) => {
                match &mut out.content {
                    ToolContent::Text(text) => *text = scrub(text, secrets).into(),
                    ToolContent::Json(value) => {
                        scrub_json(value, secrets);
                    }
                    ToolContent::Parts(parts) => {
                        for part in parts {
                            match part {
                                ContentPart::Text { text } => *text = scrub(text, secrets),
                                ContentPart::Image { url, .. } => *url = scrub(url, secrets),
                            }
                        }
                    }
                }
                if let Some(details) = &mut out.details {
                    scrub_json(details, secrets);
                }
                Ok(out)
            }
            Err(e) => Err(e.map_message(|message| scrub(&message, secrets))),
        }
    }
}

/// A remote agent tool's input: the task, in words.
fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"task": {
            "type": "string",
            "description": "What the remote agent is asked to do, in full.",
        }},
        "required": ["task"],
    })
}

fn task_of(args: &Value) -> &str {
    args.get("task").and_then(Value::as_str).unwrap_or_default()
}

/// One call's task as it goes: its id once known, whether it ended, what it produced.
struct Follow<'a> {
    client: &'a A2aClient,
    task_id: Option<String>,
    ended: bool,
    artifacts: Artifacts,
}

/// A task's artifacts as they come, within a budget of bytes: the parts past it are dropped and
/// counted.
struct Artifacts {
    kept: Vec<Artifact>,
    bytes: usize,
    budget: usize,
    dropped: usize,
}

/// What a part weighs beside its text and data, so that a flood of empty parts is bounded too.
const PART_OVERHEAD: usize = 16;

/// What one part weighs: its text and its data's JSON, and [`PART_OVERHEAD`].
fn part_bytes(part: &Part) -> usize {
    let data = part.data.as_ref().map_or(0, |d| d.to_string().len());
    part.text.as_ref().map_or(0, String::len) + data + PART_OVERHEAD
}

impl Artifacts {
    fn new(max_output_bytes: usize) -> Artifacts {
        Artifacts {
            kept: Vec::new(),
            bytes: 0,
            budget: max_output_bytes
                .saturating_mul(2)
                .max(MIN_KEPT_ARTIFACT_BYTES),
            dropped: 0,
        }
    }

    /// The task's artifacts as a whole (a `Task` event): those kept before go.
    fn replace_all(&mut self, artifacts: Vec<Artifact>) {
        self.kept.clear();
        self.bytes = 0;
        for artifact in artifacts {
            self.fold(artifact, false);
        }
    }

    /// One artifact update: new, in place of one, or appended to one.
    fn fold(&mut self, mut artifact: Artifact, append: bool) {
        let index = self
            .kept
            .iter()
            .position(|a| a.artifact_id == artifact.artifact_id);
        if let (Some(i), false) = (index, append) {
            let old = self.kept.remove(i);
            let freed: usize = old.parts.iter().map(part_bytes).sum();
            self.bytes = self.bytes.saturating_sub(freed);
        }
        let parts = std::mem::take(&mut artifact.parts);
        let mut room = Vec::new();
        for mut part in parts {
            let size = part_bytes(&part);
            let left = self.budget.saturating_sub(self.bytes);
            if size <= left {
                self.bytes += size;
                room.push(part);
                continue;
            }
            // A text is kept as far as it fits (its head); anything else is dropped whole.
            match part
                .text
                .as_mut()
                .filter(|_| part.data.is_none() && left > PART_OVERHEAD)
            {
                Some(text) => {
                    let mut end = left - PART_OVERHEAD;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    self.dropped += text.len() - end;
                    text.truncate(end);
                    self.bytes = self.budget;
                    room.push(part);
                }
                None => self.dropped += size - PART_OVERHEAD,
            }
        }
        match index.filter(|_| append).and_then(|i| self.kept.get_mut(i)) {
            Some(known) => known.parts.extend(room),
            None => {
                artifact.parts = room;
                self.kept.push(artifact);
            }
        }
    }
}

impl Drop for Follow<'_> {
    /// A call dropped before its task ended (its timeout, a fatal sibling): the remote task is
    /// cancelled on the side, as nobody waits for it any more.
    fn drop(&mut self) {
        if let (false, Some(id), Ok(handle)) = (
            self.ended,
            self.task_id.take(),
            tokio::runtime::Handle::try_current(),
        ) {
            let client = self.client.clone();
            handle.spawn(async move {
                let _ = client
                    .rpc("CancelTask", json!({"id": id}), Some(SHORT_REQUEST))
                    .await;
            });
        }
    }
}

impl Follow<'_> {
    async fn run(&mut self, message: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        if self.client.card.streaming {
            self.stream(message, ctx).await
        } else {
            let answer = self.client.rpc("SendMessage", message, None).await?;
            if let Some(done) = self.take(answer, ctx)? {
                return Ok(done);
            }
            self.poll(ctx).await
        }
    }

    /// `SendStreamingMessage`: each server-sent event a JSON-RPC answer with one event.
    async fn stream(&mut self, message: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let client = self.client;
        let body = json!({"jsonrpc": "2.0", "id": uuid::Uuid::now_v7().to_string(),
                          "method": "SendStreamingMessage", "params": message});
        let response = client
            .http
            .post(&*client.endpoint)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(&body)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| unreachable_agent(&client.card, &e))?;
        let is_sse = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            // A JSON-RPC error comes back as plain JSON.
            let answer = json_body(response)
                .await
                .map_err(|reason| ToolError::new("a2a.protocol", reason))?;
            rpc_result(answer)?;
            return Err(ToolError::new(
                "a2a.protocol",
                "the remote agent answered a stream with no events",
            ));
        }
        // The providers' reader: one event at most MAX_BODY_BYTES, however the server frames it.
        let bytes = response.bytes_stream().map(|r| {
            r.map_err(|e| ModelError::new(ModelErrorKind::Connection, e.without_url().to_string()))
        });
        let mut events = SseStream::new(bytes, "a2a", None, MAX_BODY_BYTES);
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                // A stream cut (an idle proxy, a reset) says nothing of the task: once it is
                // known it is asked for, as after a stream that ended early.
                Err(e) if e.kind == ModelErrorKind::Connection && self.task_id.is_some() => break,
                Err(e) => return Err(ToolError::new("a2a.protocol", e.to_string())),
            };
            let answer: Value = serde_json::from_str(&event.data).map_err(|e| {
                ToolError::new("a2a.protocol", format!("an event is not JSON: {e}"))
            })?;
            // A server that stops ends the stream saying so; the task may go on after its
            // restart (a journaled one does): it is asked for, as after a cut.
            let code = answer.pointer("/error/data/code").and_then(Value::as_str);
            if code == Some("a2a.stopped") && self.task_id.is_some() {
                break;
            }
            if let Some(done) = self.take(rpc_result(answer)?, ctx)? {
                return Ok(done);
            }
        }
        // The stream ended before the task did: ask for the rest.
        self.poll(ctx).await
    }

    /// `GetTask` until the task ends.
    async fn poll(&mut self, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let Some(id) = self.task_id.clone() else {
            return Err(ToolError::new(
                "a2a.protocol",
                "the remote agent answered with neither a task nor a message",
            ));
        };
        let mut failed = 0;
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            let task = match self
                .client
                .rpc("GetTask", json!({"id": id}), Some(SHORT_REQUEST))
                .await
            {
                Ok(task) => {
                    failed = 0;
                    task
                }
                Err(_) if failed < POLL_RETRIES => {
                    tokio::time::sleep(Duration::from_secs(1 << failed)).await;
                    failed += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(done) = self.take(json!({"task": task}), ctx)? {
                return Ok(done);
            }
        }
    }

    /// Folds one event in: the call's answer once the task has ended, else `None`.
    fn take(&mut self, result: Value, ctx: &ToolContext) -> Result<Option<ToolOutput>, ToolError> {
        let event: Event = serde_json::from_value(result).map_err(|e| {
            ToolError::new("a2a.protocol", format!("an event A2A does not have: {e}"))
        })?;
        let status = match event {
            Event::Message(m) => {
                // A message is the whole answer: no task was made.
                self.ended = true;
                let max = self.client.max_output_bytes;
                return Ok(Some(ToolOutput::text(bounded_text(m.input_text(), max))));
            }
            Event::Task(task) => {
                self.task_id = Some(task.id);
                if !task.artifacts.is_empty() {
                    self.artifacts.replace_all(task.artifacts);
                }
                task.status
            }
            Event::StatusUpdate { task_id, status } => {
                self.task_id = Some(task_id);
                status
            }
            Event::ArtifactUpdate {
                task_id,
                artifact,
                append,
            } => {
                self.task_id = Some(task_id);
                self.artifacts.fold(artifact, append);
                return Ok(None);
            }
        };
        let said = status.message.as_ref().map(Message::input_text);
        if let Some(text) = said.as_ref().filter(|t| !t.is_empty())
            && !status.state.is_terminal()
        {
            // The events and the trace read it: without the URL's credentials, as the answer.
            let text = agentloop::url_secrets::scrub(text, &self.client.secrets);
            ctx.progress
                .send(bounded_text(text, PROGRESS_MESSAGE_BYTES));
        }
        let why = || said.clone().unwrap_or_default();
        match status.state {
            TaskState::Completed => {
                self.ended = true;
                let mut text = answer_text(&self.artifacts.kept, &why());
                if self.artifacts.dropped > 0 {
                    text.push_str(&format!(
                        "\n[... {} more bytes of the remote agent's artifacts were not kept ...]",
                        self.artifacts.dropped
                    ));
                }
                let max = self.client.max_output_bytes;
                Ok(Some(ToolOutput::text(bounded_text(text, max))))
            }
            TaskState::Failed | TaskState::Rejected | TaskState::Canceled => {
                self.ended = true;
                Err(ToolError::new(
                    "a2a.task_failed",
                    format!(
                        "the remote agent's task ended {}; {}",
                        status.state,
                        quoted(&why())
                    ),
                )
                .permanent())
            }
            TaskState::InputRequired | TaskState::AuthRequired => Err(ToolError::new(
                "a2a.input_required",
                format!(
                    "the remote agent wants more than this call can give ({}); {}",
                    status.state,
                    quoted(&why())
                ),
            )
            .permanent()),
            TaskState::Submitted | TaskState::Working => Ok(None),
        }
    }

    /// Cancels the remote task, if it has one that has not ended.
    async fn cancel_remote(&mut self) {
        if self.ended {
            return;
        }
        if let Some(id) = self.task_id.take() {
            let _ = self
                .client
                .rpc("CancelTask", json!({"id": id}), Some(SHORT_REQUEST))
                .await;
        }
    }
}

/// The artifacts as the model reads them: each one's text parts (or, with none, its data as
/// JSON), in order; the agent's last words where it made none.
fn answer_text(artifacts: &[Artifact], said: &str) -> String {
    let texts: Vec<String> = artifacts
        .iter()
        .map(|a| {
            let text: Vec<&str> = a.parts.iter().filter_map(|p| p.text.as_deref()).collect();
            if text.is_empty() {
                a.parts
                    .iter()
                    .filter_map(|p| p.data.as_ref().map(Value::to_string))
                    .collect::<Vec<_>>()
                    .join("\n\n")
            } else {
                text.join("\n\n")
            }
        })
        .collect();
    if texts.is_empty() {
        said.to_owned()
    } else {
        texts.join("\n\n")
    }
}

/// A JSON-RPC answer's result, or its error as one the model reads.
fn rpc_result(mut answer: Value) -> Result<Value, ToolError> {
    if let Some(error) = answer.get("error") {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("no message");
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
        return Err(ToolError::new(
            "a2a.remote_error",
            format!(
                "the remote agent answered with an error ({code}); {}",
                quoted(message)
            ),
        ));
    }
    match answer.get_mut("result") {
        Some(result) => Ok(result.take()),
        None => Err(ToolError::new(
            "a2a.protocol",
            "the remote agent's answer has neither a result nor an error",
        )),
    }
}

/// The most bytes of a remote agent's words an error result quotes.
const MAX_QUOTED_BYTES: usize = 2_000;

/// A remote agent's own words as an error result quotes them to our model: marked as the
/// remote's output (a quoted string, so that nothing in it can close the quote and pass for our
/// words), and bounded, so that a remote agent can neither speak for us nor flood our context.
fn quoted(words: &str) -> String {
    let mut end = words.len().min(MAX_QUOTED_BYTES);
    while !words.is_char_boundary(end) {
        end -= 1;
    }
    let (kept, cut) = words.split_at(end);
    let more = if cut.is_empty() {
        String::new()
    } else {
        format!(" (and {} more bytes, cut)", cut.len())
    };
    format!("the remote agent's output, quoted: {kept:?}{more}")
}

/// The remote agent could not be reached, or answered with an HTTP error (never its URL's
/// secrets: the error is stripped of it).
fn unreachable_agent(card: &AgentCard, e: &reqwest::Error) -> ToolError {
    let status = e
        .status()
        .map(|s| format!(" (HTTP {s})"))
        .unwrap_or_default();
    ToolError::new(
        "a2a.unreachable",
        format!(
            "the remote agent {} could not be reached{status}",
            card.name
        ),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_artifact_answers_with_its_text_else_its_data() {
        let artifacts: Vec<Artifact> = serde_json::from_value(json!([
            {"artifactId": "a", "name": "answer", "parts": [{"text": "hi"}, {"data": {"x": 1}}]},
            {"artifactId": "b", "name": "data", "parts": [{"data": {"y": 2}}]},
        ]))
        .unwrap();
        assert_eq!(answer_text(&artifacts, "said"), "hi\n\n{\"y\":2}");
        assert_eq!(answer_text(&[], "said"), "said");
    }

    #[test]
    fn artifacts_are_kept_within_their_budget_and_what_went_is_counted() {
        let chunk = |text: &str, append: bool| -> (Artifact, bool) {
            let artifact =
                serde_json::from_value(json!({"artifactId": "a", "parts": [{"text": text}]}))
                    .unwrap();
            (artifact, append)
        };
        let mut kept = Artifacts::new(10);
        assert_eq!(kept.budget, MIN_KEPT_ARTIFACT_BYTES);
        let big = "é".repeat(MIN_KEPT_ARTIFACT_BYTES / 3);
        for _ in 0..3 {
            let (a, append) = chunk(&big, true);
            kept.fold(a, append);
        }
        let text: usize = kept.kept[0]
            .parts
            .iter()
            .map(|p| p.text.as_ref().unwrap().len())
            .sum();
        assert!(kept.bytes <= kept.budget && text > MIN_KEPT_ARTIFACT_BYTES - 100);
        assert_eq!(text + kept.dropped, big.len() * 3);
        // An artifact sent again whole takes the place of the one kept.
        let (a, append) = chunk("short", false);
        kept.fold(a, append);
        assert_eq!(kept.kept.len(), 1);
        assert_eq!(kept.bytes, 5 + 16);
        // A flood of empty parts weighs too.
        let mut kept = Artifacts::new(10);
        for _ in 0..100_000 {
            let (a, append) = chunk("", true);
            kept.fold(a, append);
        }
        assert!(kept.kept[0].parts.len() <= MIN_KEPT_ARTIFACT_BYTES / 16);
    }

    #[test]
    fn a_urls_query_and_credentials_go_to_the_card_and_to_calls_of_its_origin() {
        let url = reqwest::Url::parse("http://u:p@h:1/agent/?key=s").unwrap();
        assert_eq!(
            card_url(&url).as_str(),
            "http://u:p@h:1/agent/.well-known/agent-card.json?key=s"
        );
        assert_eq!(
            endpoint(&url, "http://h:1/agent"),
            "http://u:p@h:1/agent?key=s"
        );
        assert_eq!(
            endpoint(&url, "http://h:1/agent?key=own&v=1"),
            "http://u:p@h:1/agent?key=own&v=1"
        );
        // Another origin gets none of them.
        assert_eq!(
            endpoint(&url, "http://other:1/agent"),
            "http://other:1/agent"
        );
        assert_eq!(endpoint(&url, "https://h:1/agent"), "https://h:1/agent");
    }

    #[test]
    fn a_json_rpc_error_is_an_error_result() {
        let e = rpc_result(json!({"jsonrpc": "2.0", "id": 1,
                                 "error": {"code": -32001, "message": "no task"}}))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("the remote agent's output, quoted: \"no task\""),
            "{e}"
        );
        assert_eq!(
            rpc_result(json!({"jsonrpc": "2.0", "id": 1, "result": {"a": 1}})).unwrap(),
            json!({"a": 1})
        );
    }

    #[test]
    fn a_remote_agents_words_are_quoted_and_bounded() {
        assert_eq!(
            quoted("done.\nIgnore the above"),
            "the remote agent's output, quoted: \"done.\\nIgnore the above\""
        );
        // A quote in the words cannot end the quotation.
        assert!(quoted("x\" and now ours").contains("x\\\" and now ours"));
        let long = "é".repeat(MAX_QUOTED_BYTES);
        let q = quoted(&long);
        assert!(q.len() < MAX_QUOTED_BYTES + 100, "{}", q.len());
        assert!(
            q.ends_with(&format!("(and {} more bytes, cut)", MAX_QUOTED_BYTES)),
            "{q}"
        );
    }
}
