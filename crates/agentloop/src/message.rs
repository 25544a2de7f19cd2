//! The transcript: what the user said, what the model answered, and what each tool returned.
//!
//! These types are provider-neutral. Each provider adapter renders them into its own wire format
//! (and back), so a session recorded with one provider can be continued with another.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
/// A shared text that holds a short one inline (no allocation) and a long one in an `Arc<str>`
/// (a clone is a count): tools' text answers and the names of the tools a model calls.
pub use smol_str::SmolStr;

/// One entry of a conversation transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// Input from the user (or the application speaking for them).
    User {
        /// The content parts, in order.
        content: Vec<ContentPart>,
    },
    /// A response of the model.
    Assistant(AssistantMessage),
    /// The result of one tool call, answering the call with the same id.
    Tool(ToolResult),
}

impl Message {
    /// A user message with one text part.
    pub fn user(text: impl Into<String>) -> Self {
        Message::User {
            content: vec![ContentPart::Text { text: text.into() }],
        }
    }

    /// The text parts of a user message (or a tool result's text), joined by newlines; empty for
    /// an assistant message without text.
    pub fn text(&self) -> String {
        match self {
            Message::User { content } => content
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    ContentPart::Image { .. } => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Message::Assistant(a) => a.text.clone(),
            Message::Tool(t) => t.content.to_text(),
        }
    }

    /// The assistant message, if this is one.
    pub fn as_assistant(&self) -> Option<&AssistantMessage> {
        match self {
            Message::Assistant(a) => Some(a),
            _ => None,
        }
    }

    /// The tool result, if this is one.
    pub fn as_tool_result(&self) -> Option<&ToolResult> {
        match self {
            Message::Tool(t) => Some(t),
            _ => None,
        }
    }
}

/// One part of a user message or of a tool result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, by URL (which may be a `data:` URL).
    Image {
        /// The image's URL.
        url: String,
        /// Its media type, when known (`image/png`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
    },
}

/// What the model said in one response: its reasoning, its text and the tool calls it made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Reasoning blocks, in the order the model produced them. Providers that require them back
    /// (Anthropic thinking signatures, OpenAI Responses reasoning items) carry what they need in
    /// [`Reasoning::signature`] and [`Reasoning::provider_data`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasoning: Vec<Reasoning>,
    /// The visible text of the response (empty when the model only called tools).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    /// The tool calls, in decision order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A reasoning ("thinking") block.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reasoning {
    /// The readable reasoning text (may be a summary, or empty when the provider hides it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    /// An opaque signature that must be sent back unchanged (Anthropic thinking blocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Provider-specific data needed to send the block back (for example an OpenAI Responses
    /// reasoning item with its id and encrypted content, or Anthropic's redacted thinking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_data: Option<Value>,
}

/// One tool call as the model made it: the arguments are the raw string the provider sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id, unique within the response; the result answers it. Shared: the run's set of
    /// call ids, the call's record and its result hold this one copy.
    #[serde(alias = "id", deserialize_with = "shared_str")]
    pub call_id: Arc<str>,
    /// The name of the tool the model asked for: inline when 23 bytes or fewer, as tools' names
    /// nearly always are, so a decoder reads it without an allocation.
    #[serde(alias = "name")]
    pub tool: SmolStr,
    /// The raw JSON argument string (possibly empty, which means `{}`).
    pub arguments: String,
}

/// A text read straight into an `Arc<str>`: one allocation, where serde's own `Arc<str>` reads a
/// `String` and then copies it into the `Arc`.
fn shared_str<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Arc<str>, D::Error> {
    struct Shared;
    impl serde::de::Visitor<'_> for Shared {
        type Value = Arc<str>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Arc<str>, E> {
            Ok(Arc::from(v))
        }
    }
    deserializer.deserialize_str(Shared)
}

/// The result of one tool call, as the model will read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call this answers (shared with the run's record of the call).
    pub call_id: Arc<str>,
    /// The tool's name (some providers want it back).
    #[serde(alias = "name")]
    pub tool: Arc<str>,
    /// What the model reads.
    pub content: ToolContent,
    /// True when this is an error the model should read as such.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

/// Content a tool hands back to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum ToolContent {
    /// Plain text, shared: the transcript, the call's record and its events hold one copy; a
    /// short text (23 bytes or fewer, a tool's `"ok"`) is held inline and allocates nothing.
    Text(SmolStr),
    /// A JSON value, rendered as JSON text for providers that take strings.
    Json(Value),
    /// Several parts (text and images).
    Parts(Vec<ContentPart>),
}

impl ToolContent {
    /// The content as the text a string-only provider sends, borrowed when it is text: a request
    /// renders every result of the transcript, every turn.
    pub fn as_text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ToolContent::Text(t) => std::borrow::Cow::Borrowed(t),
            other => std::borrow::Cow::Owned(other.to_text()),
        }
    }

    /// The content as the text a string-only provider sends: JSON is serialized, parts joined.
    pub fn to_text(&self) -> String {
        match self {
            ToolContent::Text(t) => t.to_string(),
            ToolContent::Json(v) => v.to_string(),
            ToolContent::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    if let ContentPart::Text { text } = p {
                        if !out.is_empty() {
                            out.push('\n');
                        }
                        out.push_str(text);
                    }
                }
                out
            }
        }
    }
}

impl From<String> for ToolContent {
    fn from(s: String) -> Self {
        ToolContent::Text(s.into())
    }
}

impl From<&str> for ToolContent {
    fn from(s: &str) -> Self {
        ToolContent::Text(s.into())
    }
}

impl From<Arc<str>> for ToolContent {
    fn from(s: Arc<str>) -> Self {
        ToolContent::Text(s.into())
    }
}

impl From<SmolStr> for ToolContent {
    fn from(s: SmolStr) -> Self {
        ToolContent::Text(s)
    }
}

impl From<Value> for ToolContent {
    fn from(v: Value) -> Self {
        ToolContent::Json(v)
    }
}

/// For unit tests: an assistant message with one call `id` of tool `t`, no arguments.
#[cfg(test)]
pub(crate) fn call_of_tool_t(id: &str) -> Message {
    Message::Assistant(AssistantMessage {
        tool_calls: vec![ToolCall {
            call_id: id.into(),
            tool: "t".into(),
            arguments: "{}".into(),
        }],
        ..Default::default()
    })
}
