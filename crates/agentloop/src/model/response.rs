//! A whole model response: what the model said, its usage and why it stopped.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::message::{AssistantMessage, SmolStr, ToolCall};

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
    /// A word no adapter knows: the run does not take such an answer for a whole one (it fails
    /// with `model.other`, its text kept as the output); the word is in `raw_finish_reason`.
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
    /// True when the answer came from a response cache, not from the model this time: it costs
    /// nothing ([`crate::model::cache`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
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
            cached: false,
        }
    }

    /// A response that calls tools: `(id, name, raw JSON arguments)` each.
    pub fn tool_calls<I, S1, S2, S3>(calls: I) -> Self
    where
        I: IntoIterator<Item = (S1, S2, S3)>,
        S1: Into<Arc<str>>,
        S2: Into<SmolStr>,
        S3: Into<String>,
    {
        let tool_calls = calls
            .into_iter()
            .map(|(id, name, arguments)| ToolCall {
                call_id: id.into(),
                tool: name.into(),
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
