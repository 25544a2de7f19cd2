//! The model side of the loop: one small streaming trait, the request it receives, the events it
//! yields, and one accumulator that turns those events into a [`ModelResponse`].
//!
//! Every provider implements [`Model::stream`]; a non-streaming provider call is a stream of one
//! [`ModelEvent::Response`]. Policies (retry, fallback, timeouts) are models that wrap a model.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{AssistantMessage, Message, Reasoning, ToolCall};
use crate::tool::ToolSpec;

/// The stream a model call yields.
pub type ModelStream<'a> = Pin<Box<dyn Stream<Item = Result<ModelEvent, ModelError>> + Send + 'a>>;

/// A language model that the loop can call. Keep it small: one streaming call.
///
/// The request borrows the run's transcript, so a call never copies the conversation; an
/// implementation that needs owned data (an HTTP body) encodes it before its first `.await`.
pub trait Model: Send + Sync {
    /// The model's identifier, as used for pricing and in events (`gpt-4.1-mini`).
    fn id(&self) -> &str;

    /// The provider's name, for events and telemetry (`openai`, `anthropic`, `scripted`).
    fn provider(&self) -> &str {
        "unknown"
    }

    /// Starts one call. The stream ends after a [`ModelEvent::Finish`] or a
    /// [`ModelEvent::Response`], or with an error.
    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a>;
}

impl<M: Model + ?Sized> Model for Arc<M> {
    fn id(&self) -> &str {
        (**self).id()
    }
    fn provider(&self) -> &str {
        (**self).provider()
    }
    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        (**self).stream(request)
    }
}

impl<M: Model + ?Sized> Model for Box<M> {
    fn id(&self) -> &str {
        (**self).id()
    }
    fn provider(&self) -> &str {
        (**self).provider()
    }
    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        (**self).stream(request)
    }
}

/// Calls a model and collects its stream into one response, without emitting deltas anywhere.
pub async fn complete(
    model: &dyn Model,
    request: ModelRequest<'_>,
) -> Result<ModelResponse, ModelError> {
    let mut stream = model.stream(request);
    let mut acc = ResponseAccumulator::new();
    while let Some(event) = stream.next().await {
        acc.push(event?)?;
    }
    acc.finish()
}

/// Everything a model call needs. It borrows from the run, so building one copies nothing.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The system instructions, if any.
    pub instructions: Option<&'a str>,
    /// The transcript so far, oldest first.
    pub messages: &'a [Message],
    /// The tools the model may call.
    pub tools: &'a [ToolSpec],
    /// The JSON Schema the final answer must match, if any.
    pub output_schema: Option<&'a Value>,
    /// Sampling and output settings.
    pub settings: &'a ModelSettings,
}

/// Settings sent with every model call. `None` leaves the provider's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Seed for providers that support reproducible sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// The most tokens one response may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Whether the model may call several tools in one response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// How the model must choose tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

/// How the model must choose tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must not call tools.
    None,
    /// The model must call this tool.
    Tool(String),
}

/// One event of a model's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    /// The provider's response id and the model that answered, when known.
    Start {
        /// The provider's id for the response.
        id: Option<String>,
        /// The model that answered.
        model: Option<String>,
    },
    /// A piece of visible text.
    TextDelta(String),
    /// A piece of reasoning text.
    ReasoningDelta(String),
    /// A complete reasoning block (with its signature or provider data). It replaces the
    /// reasoning text streamed since the last complete block.
    Reasoning(Reasoning),
    /// A tool call begins at `index` (the provider's own position key).
    ToolCallStart {
        /// The provider's position key for the call.
        index: u32,
        /// The call id (may be empty; one is generated then).
        id: String,
        /// The tool's name.
        name: String,
    },
    /// A piece of a tool call's raw argument string.
    ToolCallDelta {
        /// The provider's position key for the call.
        index: u32,
        /// The piece of the JSON argument string.
        arguments: String,
    },
    /// A whole tool call in one event.
    ToolCall(ToolCall),
    /// The usage so far: it replaces what an earlier usage event said.
    Usage(Usage),
    /// Something odd but recoverable the provider noticed.
    Warning(String),
    /// The response is complete.
    Finish {
        /// Why the model stopped.
        reason: FinishReason,
        /// The provider's own word for it.
        raw: Option<String>,
    },
    /// A whole response at once (the non-streaming path, and scripted models).
    Response(ModelResponse),
}

/// Why a model stopped generating, mapped from each provider's own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end of the answer (`stop`, `end_turn`, `completed`).
    Stop,
    /// The model asked for tool calls.
    ToolCalls,
    /// The output token limit cut the response off (`length`, `max_tokens`, `incomplete`).
    Length,
    /// A content filter stopped it.
    ContentFilter,
    /// The model refused.
    Refusal,
    /// The provider reported a failure inside a successful HTTP response.
    Error,
    /// Anything else.
    Other,
}

impl FinishReason {
    /// The stable word for this reason.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::Length => "length",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Refusal => "refusal",
            FinishReason::Error => "error",
            FinishReason::Other => "other",
        }
    }
}

/// Token usage of one call, or summed over a run, counted the same way on every provider (each
/// provider adapter converts its own counts at the wire):
///
/// - `input_tokens` is every prompt token, cache reads and cache writes included (OpenAI's
///   convention; an Anthropic adapter adds `cache_read_input_tokens` and
///   `cache_creation_input_tokens` to its `input_tokens`).
/// - `cached_input_tokens` and `cache_write_tokens` are the parts of `input_tokens` read from and
///   written to the provider's cache; `reasoning_tokens` is the part of `output_tokens` spent on
///   reasoning.
/// - [`Usage::total_tokens`] is `input_tokens + output_tokens`, so a token budget means the same
///   on every provider.
///
/// Sums saturate at `u64::MAX`: a count from a buggy or hostile server never wraps or panics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Every prompt token, cache reads and writes included.
    pub input_tokens: u64,
    /// Completion tokens, reasoning included.
    pub output_tokens: u64,
    /// The part of `input_tokens` read from the provider's cache.
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// The part of `input_tokens` written to the provider's cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// The part of `output_tokens` spent on reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Input plus output tokens (saturating).
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds another usage to this one (each count saturating).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(other.cached_input_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
    }

    /// True when nothing was counted.
    pub fn is_zero(&self) -> bool {
        *self == Usage::default()
    }
}

/// One complete model response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// What the model said.
    pub message: AssistantMessage,
    /// Tokens used by this call.
    #[serde(default)]
    pub usage: Usage,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// The provider's own word for why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_finish_reason: Option<String>,
    /// The provider's response id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The model that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// True when a tool call was cut off (its JSON incomplete): such calls were dropped and must
    /// never run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The calls that were cut off, with their arguments as far as they came. They never run:
    /// the model reads that they were cut and may make them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut_calls: Vec<ToolCall>,
    /// Recoverable oddities noticed while reading the response.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl ModelResponse {
    /// A final text answer.
    pub fn text(text: impl Into<String>) -> Self {
        ModelResponse {
            message: AssistantMessage {
                text: text.into(),
                ..Default::default()
            },
            usage: Usage::default(),
            finish_reason: FinishReason::Stop,
            raw_finish_reason: None,
            id: None,
            model: None,
            truncated: false,
            cut_calls: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// A response that calls tools: `(id, name, raw JSON arguments)` each.
    pub fn tool_calls<I, S1, S2, S3>(calls: I) -> Self
    where
        I: IntoIterator<Item = (S1, S2, S3)>,
        S1: Into<String>,
        S2: Into<String>,
        S3: Into<String>,
    {
        let tool_calls = calls
            .into_iter()
            .map(|(id, name, arguments)| ToolCall {
                id: id.into(),
                name: name.into(),
                arguments: arguments.into(),
            })
            .collect();
        ModelResponse {
            message: AssistantMessage {
                tool_calls,
                ..Default::default()
            },
            finish_reason: FinishReason::ToolCalls,
            ..ModelResponse::text("")
        }
    }

    /// Sets the usage.
    #[must_use]
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }
}

struct PartialCall {
    index: u32,
    id: String,
    name: String,
    arguments: String,
}

/// Turns a model's events into one [`ModelResponse`]. Every provider uses this one accumulator.
#[derive(Default)]
pub struct ResponseAccumulator {
    id: Option<String>,
    model: Option<String>,
    text: String,
    reasoning: Vec<Reasoning>,
    pending_reasoning: String,
    calls: Vec<PartialCall>,
    whole_calls: Vec<(usize, ToolCall)>,
    usage: Usage,
    finish: Option<(FinishReason, Option<String>)>,
    warnings: Vec<String>,
    whole: Option<ModelResponse>,
}

impl fmt::Debug for ResponseAccumulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseAccumulator")
            .field("text_len", &self.text.len())
            .field("calls", &(self.calls.len() + self.whole_calls.len()))
            .field("finished", &self.finish.is_some())
            .finish()
    }
}

impl ResponseAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// The text received so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// True once the response is complete.
    pub fn is_finished(&self) -> bool {
        self.finish.is_some() || self.whole.is_some()
    }

    /// Applies one event.
    pub fn push(&mut self, event: ModelEvent) -> Result<(), ModelError> {
        match event {
            ModelEvent::Start { id, model } => {
                if id.is_some() {
                    self.id = id;
                }
                if model.is_some() {
                    self.model = model;
                }
            }
            ModelEvent::TextDelta(t) => self.text.push_str(&t),
            ModelEvent::ReasoningDelta(t) => self.pending_reasoning.push_str(&t),
            ModelEvent::Reasoning(mut r) => {
                if r.text.is_empty() {
                    r.text = std::mem::take(&mut self.pending_reasoning);
                } else {
                    self.pending_reasoning.clear();
                }
                self.reasoning.push(r);
            }
            ModelEvent::ToolCallStart { index, id, name } => {
                match self.calls.iter_mut().find(|c| c.index == index) {
                    Some(call) => {
                        if !id.is_empty() {
                            call.id = id;
                        }
                        if !name.is_empty() {
                            call.name = name;
                        }
                    }
                    None => self.calls.push(PartialCall {
                        index,
                        id,
                        name,
                        arguments: String::new(),
                    }),
                }
            }
            ModelEvent::ToolCallDelta { index, arguments } => {
                match self.calls.iter_mut().find(|c| c.index == index) {
                    Some(call) => call.arguments.push_str(&arguments),
                    None => self.calls.push(PartialCall {
                        index,
                        id: String::new(),
                        name: String::new(),
                        arguments,
                    }),
                }
            }
            ModelEvent::ToolCall(call) => {
                let position = self.calls.len() + self.whole_calls.len();
                self.whole_calls.push((position, call));
            }
            ModelEvent::Usage(u) => self.usage = u,
            ModelEvent::Warning(w) => self.warnings.push(w),
            ModelEvent::Finish { reason, raw } => self.finish = Some((reason, raw)),
            ModelEvent::Response(r) => self.whole = Some(r),
        }
        Ok(())
    }

    /// Finishes the response. A stream that never said it was complete is an error, never a
    /// half-applied response.
    pub fn finish(mut self) -> Result<ModelResponse, ModelError> {
        if let Some(whole) = self.whole.take() {
            return Ok(whole);
        }
        let Some((finish_reason, raw_finish_reason)) = self.finish.take() else {
            return Err(ModelError::new(
                ModelErrorKind::Stream,
                "the model's stream ended before the response was complete",
            ));
        };
        if !self.pending_reasoning.is_empty() {
            self.reasoning.push(Reasoning {
                text: std::mem::take(&mut self.pending_reasoning),
                ..Default::default()
            });
        }
        self.calls.sort_by_key(|c| c.index);
        let mut tool_calls: Vec<ToolCall> =
            Vec::with_capacity(self.calls.len() + self.whole_calls.len());
        let mut truncated = false;
        let mut cut_calls = Vec::new();
        for call in self.calls {
            if call.name.is_empty() {
                return Err(ModelError::new(
                    ModelErrorKind::Stream,
                    format!("tool call at index {} has no name", call.index),
                ));
            }
            let complete = call.arguments.trim().is_empty()
                || serde_json::from_str::<serde::de::IgnoredAny>(&call.arguments).is_ok();
            if !complete && finish_reason == FinishReason::Length {
                truncated = true;
                self.warnings.push(format!(
                    "tool call {} ({}) was cut off and dropped",
                    call.id, call.name
                ));
                cut_calls.push(ToolCall {
                    id: call.id,
                    name: call.name,
                    arguments: call.arguments,
                });
                continue;
            }
            tool_calls.push(ToolCall {
                id: call.id,
                name: call.name,
                arguments: call.arguments,
            });
        }
        for (position, call) in self.whole_calls {
            let at = position.min(tool_calls.len());
            tool_calls.insert(at, call);
        }
        Ok(ModelResponse {
            message: AssistantMessage {
                reasoning: self.reasoning,
                text: self.text,
                tool_calls,
            },
            usage: self.usage,
            finish_reason,
            raw_finish_reason,
            id: self.id,
            model: self.model,
            truncated,
            cut_calls,
            warnings: self.warnings,
        })
    }
}

/// What kind of failure a model call met. Retry and fallback policies decide by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ModelErrorKind {
    /// HTTP 429: too many requests.
    RateLimited,
    /// The account's quota or credit is exhausted (not worth retrying).
    QuotaExceeded,
    /// HTTP 529 or an `overloaded_error`.
    Overloaded,
    /// HTTP 5xx.
    Server,
    /// The request or the stream timed out.
    Timeout,
    /// The connection failed or dropped.
    Connection,
    /// HTTP 401/403: bad or missing credentials.
    Authentication,
    /// The model does not exist or is not available to this key.
    ModelNotFound,
    /// The prompt is longer than the model's context window.
    ContextLength,
    /// Any other rejected request (HTTP 400/404/422), with the provider's code and message.
    InvalidRequest,
    /// The encoded request is larger than the configured byte budget; it was never sent.
    RequestTooLarge,
    /// The stream was malformed or ended early.
    Stream,
    /// The response could not be decoded.
    Decode,
    /// The response was cut off by the output token limit.
    Truncated,
    /// The model refused to answer.
    Refused,
    /// A content filter stopped the answer.
    ContentFiltered,
    /// The model (or a test model) has nothing more to say: a script ran out.
    Exhausted,
    /// Anything else.
    Other,
}

impl ModelErrorKind {
    /// The stable code of this kind (`model.rate_limited`).
    pub fn code(self) -> &'static str {
        match self {
            ModelErrorKind::RateLimited => "model.rate_limited",
            ModelErrorKind::QuotaExceeded => "model.quota_exceeded",
            ModelErrorKind::Overloaded => "model.overloaded",
            ModelErrorKind::Server => "model.server_error",
            ModelErrorKind::Timeout => "model.timeout",
            ModelErrorKind::Connection => "model.connection",
            ModelErrorKind::Authentication => "model.authentication",
            ModelErrorKind::ModelNotFound => "model.not_found",
            ModelErrorKind::ContextLength => "model.context_length_exceeded",
            ModelErrorKind::InvalidRequest => "model.invalid_request",
            ModelErrorKind::RequestTooLarge => "model.request_too_large",
            ModelErrorKind::Stream => "model.stream",
            ModelErrorKind::Decode => "model.decode",
            ModelErrorKind::Truncated => "model.truncated",
            ModelErrorKind::Refused => "model.refused",
            ModelErrorKind::ContentFiltered => "model.content_filter",
            ModelErrorKind::Exhausted => "model.exhausted",
            ModelErrorKind::Other => "model.other",
        }
    }
}

impl fmt::Display for ModelErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A failed model call. It carries the provider's own type, code and message and the request id,
/// never a credential, and never the raw body beyond the provider's message.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[error("{kind}: {message}")]
#[non_exhaustive]
pub struct ModelError {
    /// What kind of failure.
    pub kind: ModelErrorKind,
    /// The provider's message, or ours.
    pub message: String,
    /// The provider (`openai`, `anthropic`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The HTTP status, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's error type (`invalid_request_error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// The provider's error code (`model_not_found`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
    /// The request parameter the provider blamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// The provider's request id header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// How long the provider asked us to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<Duration>,
    /// True once part of the response reached the caller: such a call is never retried.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl ModelError {
    /// A new error of this kind.
    pub fn new(kind: ModelErrorKind, message: impl Into<String>) -> Self {
        ModelError {
            kind,
            message: message.into(),
            provider: None,
            status: None,
            error_type: None,
            provider_code: None,
            param: None,
            request_id: None,
            retry_after: None,
            partial: false,
        }
    }

    /// The stable code (`model.rate_limited`).
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// Worth retrying: rate limits, overload, server errors, timeouts and dropped connections,
    /// provided nothing of the response reached the caller yet.
    pub fn is_retryable(&self) -> bool {
        !self.partial
            && matches!(
                self.kind,
                ModelErrorKind::RateLimited
                    | ModelErrorKind::Overloaded
                    | ModelErrorKind::Server
                    | ModelErrorKind::Timeout
                    | ModelErrorKind::Connection
            )
    }

    /// HTTP 429.
    pub fn is_rate_limited(&self) -> bool {
        self.kind == ModelErrorKind::RateLimited
    }

    /// A timeout (connect, request or idle stream).
    pub fn is_timeout(&self) -> bool {
        self.kind == ModelErrorKind::Timeout
    }

    /// Credentials were refused.
    pub fn is_authentication(&self) -> bool {
        self.kind == ModelErrorKind::Authentication
    }

    /// The prompt did not fit the model's context.
    pub fn is_context_length(&self) -> bool {
        self.kind == ModelErrorKind::ContextLength
    }

    /// The provider is overloaded.
    pub fn is_overloaded(&self) -> bool {
        self.kind == ModelErrorKind::Overloaded
    }

    /// Sets the provider name.
    #[must_use]
    pub fn with_provider(mut self, provider: impl Into<String>) -> Self {
        self.provider = Some(provider.into());
        self
    }

    /// Sets the HTTP status.
    #[must_use]
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets the Retry-After delay.
    #[must_use]
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn finish(reason: FinishReason) -> ModelEvent {
        ModelEvent::Finish { reason, raw: None }
    }

    #[test]
    fn usage_sums_saturate_instead_of_wrapping_or_panicking() {
        // A hostile server's `"prompt_tokens": 18446744073709551615`.
        let hostile = Usage {
            input_tokens: u64::MAX,
            output_tokens: 5,
            cached_input_tokens: u64::MAX,
            ..Default::default()
        };
        assert_eq!(hostile.total_tokens(), u64::MAX);
        let mut run = Usage {
            input_tokens: 10,
            cached_input_tokens: 1,
            ..Default::default()
        };
        run.add(&hostile);
        run.add(&hostile);
        assert_eq!(run.input_tokens, u64::MAX);
        assert_eq!(run.cached_input_tokens, u64::MAX);
        assert_eq!(run.output_tokens, 10);
        assert_eq!(run.total_tokens(), u64::MAX);
    }

    #[test]
    fn deltas_keyed_by_index_assemble_calls_in_index_order() {
        let mut acc = ResponseAccumulator::new();
        for e in [
            ModelEvent::ToolCallStart {
                index: 2,
                id: "b".into(),
                name: "two".into(),
            },
            ModelEvent::ToolCallStart {
                index: 1,
                id: "a".into(),
                name: "one".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 1,
                arguments: "{\"x\":".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 2,
                arguments: "{}".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 1,
                arguments: "1}".into(),
            },
            ModelEvent::TextDelta("hi".into()),
            ModelEvent::Usage(Usage {
                input_tokens: 3,
                output_tokens: 4,
                ..Usage::default()
            }),
            finish(FinishReason::ToolCalls),
        ] {
            acc.push(e).unwrap();
        }
        let r = acc.finish().unwrap();
        assert_eq!(r.message.tool_calls[0].name, "one");
        assert_eq!(r.message.tool_calls[0].arguments, "{\"x\":1}");
        assert_eq!(r.message.tool_calls[1].id, "b");
        assert_eq!(r.message.text, "hi");
        assert_eq!(r.usage.output_tokens, 4);
    }

    #[test]
    fn a_stream_without_a_finish_is_an_error_not_a_half_response() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::TextDelta("partial".into())).unwrap();
        assert_eq!(acc.finish().unwrap_err().kind, ModelErrorKind::Stream);
    }

    #[test]
    fn a_call_cut_off_by_the_token_limit_is_dropped_and_flagged() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::ToolCallStart {
            index: 0,
            id: "ok".into(),
            name: "a".into(),
        })
        .unwrap();
        acc.push(ModelEvent::ToolCallDelta {
            index: 0,
            arguments: "{}".into(),
        })
        .unwrap();
        acc.push(ModelEvent::ToolCallStart {
            index: 1,
            id: "cut".into(),
            name: "b".into(),
        })
        .unwrap();
        acc.push(ModelEvent::ToolCallDelta {
            index: 1,
            arguments: "{\"text\": \"abc".into(),
        })
        .unwrap();
        acc.push(finish(FinishReason::Length)).unwrap();
        let r = acc.finish().unwrap();
        assert!(r.truncated);
        assert_eq!(r.message.tool_calls.len(), 1);
        assert!(!r.warnings.is_empty());
    }

    #[test]
    fn empty_ids_stay_empty_for_the_run_to_fill_and_reasoning_blocks_keep_streamed_text() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::ReasoningDelta("think".into()))
            .unwrap();
        acc.push(ModelEvent::Reasoning(Reasoning {
            signature: Some("sig".into()),
            ..Default::default()
        }))
        .unwrap();
        acc.push(ModelEvent::ToolCallStart {
            index: 0,
            id: String::new(),
            name: "a".into(),
        })
        .unwrap();
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        let r = acc.finish().unwrap();
        // The run fills blank ids from its injected id source, so that a replay is exact.
        assert_eq!(r.message.tool_calls[0].id, "");
        assert_eq!(r.message.reasoning[0].text, "think");
        assert_eq!(r.message.reasoning[0].signature.as_deref(), Some("sig"));
    }

    #[test]
    fn a_call_without_a_name_is_an_error() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelEvent::ToolCallDelta {
            index: 0,
            arguments: "{}".into(),
        })
        .unwrap();
        acc.push(finish(FinishReason::ToolCalls)).unwrap();
        assert!(acc.finish().is_err());
    }
}
