//! The A2A client: a remote agent as one of our tools. Its agent card is read once, when the
//! tool is made; a call sends the model's `task` as a message and follows the task it starts
//! (streamed where the card says the agent streams, else answered whole and polled), its status
//! messages as the call's progress, its artifacts as the result. A task that fails, is rejected
//! or wants more input is an error result the model reads; a call our run cancels, or that its
//! timeout drops, cancels the remote task.

use std::sync::Arc;
use std::time::Duration;

use agentloop::model::{ModelError, ModelErrorKind};
use agentloop::tool::{Tool, ToolBuilder, ToolContext, ToolError, ToolOutput};
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
}

impl std::fmt::Debug for A2aClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aClient")
            .field("card", &self.card)
            .finish()
    }
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
        let card_url = format!("{}/.well-known/agent-card.json", url.trim_end_matches('/'));
        // The URL may carry a token (`?token=`, `user:pass@`): the error names the agent by
        // the rest of it, and whatever the server echoes of the token is cut from the reason.
        let secrets = agentloop::url_secrets::secrets(url);
        let failed = |reason: String| A2aError::Card {
            url: agentloop::url_secrets::shown(url),
            reason: agentloop::url_secrets::scrub(&reason, &secrets),
        };
        let response = http
            .get(&card_url)
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
        })
    }

    /// The card read at connect.
    pub fn card(&self) -> &AgentCard {
        &self.card
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
    /// naming the URL.
    pub fn tool_at(url: &str, builder: ToolBuilder, description: Option<String>) -> Tool {
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
                        .get_or_try_init(|| A2aClient::connect(&url))
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
        let mut request = self.http.post(&self.card.url).json(&body);
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
            artifacts: Vec::new(),
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
        outcome
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
    artifacts: Vec<Artifact>,
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
            .post(&client.card.url)
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
            let event = event.map_err(|e| ToolError::new("a2a.protocol", e.to_string()))?;
            let answer: Value = serde_json::from_str(&event.data).map_err(|e| {
                ToolError::new("a2a.protocol", format!("an event is not JSON: {e}"))
            })?;
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
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            let task = self
                .client
                .rpc("GetTask", json!({"id": id}), Some(SHORT_REQUEST))
                .await?;
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
                return Ok(Some(ToolOutput::text(m.input_text())));
            }
            Event::Task(task) => {
                self.task_id = Some(task.id);
                if !task.artifacts.is_empty() {
                    self.artifacts = task.artifacts;
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
                match self
                    .artifacts
                    .iter_mut()
                    .find(|a| a.artifact_id == artifact.artifact_id)
                {
                    Some(known) if append => known.parts.extend(artifact.parts),
                    Some(known) => *known = artifact,
                    None => self.artifacts.push(artifact),
                }
                return Ok(None);
            }
        };
        let said = status.message.as_ref().map(Message::input_text);
        if let Some(text) = said.as_ref().filter(|t| !t.is_empty())
            && !status.state.is_terminal()
        {
            ctx.progress.send(text.clone());
        }
        let why = || said.clone().unwrap_or_default();
        match status.state {
            TaskState::Completed => {
                self.ended = true;
                Ok(Some(ToolOutput::text(answer_text(&self.artifacts, &why()))))
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
