//! A2A 1.0 as it travels in JSON: the protocol buffers' JSON mapping (camelCase names, enums by
//! their full names such as `TASK_STATE_WORKING`), for the messages this server reads and writes.
//! Fields this server neither reads nor sets are left out; unknown fields are ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version served (the official SDKs' current one).
pub const PROTOCOL_VERSION: &str = "1.0";

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Received, not started (behind another task of its context, or about to start).
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    /// Its run goes on.
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    /// The run finished with an answer.
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    /// The run stopped without an answer (a limit, an error).
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    /// The run was cancelled.
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    /// The agent would not take the task (a remote agent's answer; this server never sets it).
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
    /// The agent waits for more input (this server: an approval its caller gives).
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    /// The agent waits for authentication (a remote agent's answer; this server never sets it).
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = serde_json::to_value(self).unwrap_or_default();
        f.write_str(name.as_str().unwrap_or("TASK_STATE_UNSPECIFIED"))
    }
}

impl TaskState {
    /// True once the task can change no more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Role {
    #[serde(rename = "ROLE_USER")]
    User,
    #[serde(rename = "ROLE_AGENT")]
    Agent,
    #[serde(rename = "ROLE_UNSPECIFIED")]
    Unspecified,
}

/// One part of a message or an artifact: text, or structured data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Part {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) media_type: Option<String>,
}

impl Part {
    pub(crate) fn text(text: impl Into<String>) -> Part {
        Part {
            text: Some(text.into()),
            ..Part::default()
        }
    }
}

/// A message between a user and the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Message {
    #[serde(default)]
    pub(crate) message_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) task_id: Option<String>,
    pub(crate) role: Role,
    #[serde(default)]
    pub(crate) parts: Vec<Part>,
}

impl Message {
    /// The agent's words about a task.
    pub(crate) fn agent(task: &Task, text: impl Into<String>) -> Message {
        Message {
            message_id: uuid::Uuid::now_v7().to_string(),
            context_id: Some(task.context_id.clone()),
            task_id: Some(task.id.clone()),
            role: Role::Agent,
            parts: vec![Part::text(text)],
        }
    }

    /// The user's words on a task (a message read back from a journaled run).
    pub(crate) fn user(task_id: &str, context_id: &str, text: impl Into<String>) -> Message {
        Message {
            message_id: uuid::Uuid::now_v7().to_string(),
            context_id: Some(context_id.to_owned()),
            task_id: Some(task_id.to_owned()),
            role: Role::User,
            parts: vec![Part::text(text)],
        }
    }

    /// The text parts, joined by blank lines; data parts as their JSON.
    pub(crate) fn input_text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match (&p.text, &p.data) {
                (Some(t), _) => Some(t.clone()),
                (None, Some(d)) => Some(d.to_string()),
                (None, None) => None,
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    }
}

/// A task's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaskStatus {
    pub(crate) state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<Message>,
}

/// What a task produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Artifact {
    pub(crate) artifact_id: String,
    #[serde(default)]
    pub(crate) name: String,
    pub(crate) parts: Vec<Part>,
}

/// A task: one run of the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Task {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) context_id: String,
    pub(crate) status: TaskStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) history: Vec<Message>,
}

/// One event of a task's stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum StreamResponse {
    Task(Task),
    StatusUpdate {
        #[serde(rename = "taskId")]
        task_id: String,
        #[serde(rename = "contextId")]
        context_id: String,
        status: TaskStatus,
    },
    ArtifactUpdate {
        #[serde(rename = "taskId")]
        task_id: String,
        #[serde(rename = "contextId")]
        context_id: String,
        artifact: Artifact,
        #[serde(rename = "lastChunk")]
        last_chunk: bool,
    },
}

/// `SendMessage` and `SendStreamingMessage`'s parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SendMessageRequest {
    pub(crate) message: Message,
    #[serde(default)]
    pub(crate) configuration: Option<SendMessageConfiguration>,
}

/// How a message is answered.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SendMessageConfiguration {
    #[serde(default)]
    pub(crate) return_immediately: bool,
    #[serde(default)]
    pub(crate) history_length: Option<usize>,
}

/// `GetTask` and `CancelTask`'s parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaskIdRequest {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) history_length: Option<usize>,
}

/// A task as a reader asked for it: at most `history_length` of its latest messages.
pub(crate) fn with_history(mut task: Task, history_length: Option<usize>) -> Task {
    if let Some(n) = history_length {
        let keep = task.history.len().saturating_sub(n);
        task.history.drain(..keep);
    }
    task
}
