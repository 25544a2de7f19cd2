//! OpenAI Chat Completions, and every server that speaks it (DeepSeek, Groq, xAI, OpenRouter,
//! Gemini's and Anthropic's compatible endpoints, Ollama, vLLM, llama.cpp's server).
//!
//! The wire types are our own serde structs. Requests borrow from the run's transcript; stream
//! chunks are read into borrowing structs (no `Value` tree per chunk). The stream parser is a
//! pure [`ChatStreamParser`] that the live path, [`parse_stream_bytes`] (fuzzing, benchmarks) and
//! the tests all share.
//!
//! Rules that are ours to pick, documented here:
//! - `max_tokens` is sent as `max_completion_tokens` when the provider name is `openai` (the
//!   reasoning models require it) and as `max_tokens` for every other provider name, which is what
//!   compatible servers understand. [`OpenAiChatBuilder::max_tokens_field`] overrides it.
//! - A stream that ends without a `finish_reason` and without `[DONE]` is an error, never a half
//!   response. `[DONE]` without a `finish_reason` finishes the response with a warning.
//! - The `Finish` event is held until the stream ends, so the trailing usage chunk
//!   (`stream_options.include_usage`, whose `choices` is empty) is read before it.
//!
//! The module's files: `request.rs` encodes the request, `strict.rs` adapts schemas to strict
//! mode, `stream.rs` reads answers (streamed or whole) into events.

mod request;
mod stream;
mod strict;

use agentloop::{
    Model, ModelError,
    model::{ModelRequest, ModelStream},
};

use crate::decode::post_and_decode;
use crate::http::{HttpClient, HttpConfig, KeySource};

pub use stream::{ChatStreamParser, map_finish_reason, parse_completion, parse_stream_bytes};
pub use strict::strict_schema;

/// The default base URL.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub use crate::http::OPENAI_API_KEY_ENV;

/// Which request field carries the output token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_completion_tokens` (OpenAI; required by its reasoning models).
    MaxCompletionTokens,
    /// `max_tokens` (compatible servers).
    MaxTokens,
}

/// An OpenAI Chat Completions model.
#[derive(Debug, Clone)]
pub struct OpenAiChat {
    model: String,
    provider: String,
    client: HttpClient,
    stream: bool,
    stream_usage: bool,
    strict: bool,
    max_tokens_field: MaxTokensField,
    reasoning_in_history: bool,
}

/// Builds an [`OpenAiChat`].
#[derive(Debug, Clone)]
#[must_use]
pub struct OpenAiChatBuilder {
    model: String,
    provider: String,
    config: HttpConfig,
    stream: bool,
    stream_usage: bool,
    strict: bool,
    max_tokens_field: Option<MaxTokensField>,
    reasoning_in_history: bool,
}

impl OpenAiChat {
    /// A builder for `model` on api.openai.com, with the key from `OPENAI_API_KEY`.
    pub fn builder(model: impl Into<String>) -> OpenAiChatBuilder {
        let mut config = HttpConfig::new(OPENAI_BASE_URL);
        config.key = KeySource::Env(OPENAI_API_KEY_ENV.to_owned());
        OpenAiChatBuilder {
            model: model.into(),
            provider: "openai".to_owned(),
            config,
            stream: true,
            stream_usage: true,
            strict: false,
            max_tokens_field: None,
            reasoning_in_history: false,
        }
    }

    /// A builder for a compatible server: its provider name (`deepseek`, `groq`, `local`), base URL
    /// and model. No key is sent until one is set.
    pub fn compatible(
        provider: impl Into<String>,
        base_url: impl Into<String>,
        model: impl Into<String>,
    ) -> OpenAiChatBuilder {
        OpenAiChat::builder(model)
            .provider_name(provider)
            .base_url(base_url)
            .no_api_key()
    }
}

impl OpenAiChatBuilder {
    crate::http::http_builder_methods!();

    /// Streams responses (the default) or asks for whole ones.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Asks for the trailing usage chunk when streaming (`stream_options.include_usage`, the
    /// default). Turn it off for a server that rejects `stream_options`.
    pub fn stream_usage(mut self, include: bool) -> Self {
        self.stream_usage = include;
        self
    }

    /// Strict mode: tool and output schemas are sent with `strict: true`, adapted to what strict
    /// mode accepts (every property required, optional ones nullable, `additionalProperties: false`).
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// The provider name reported in events, errors and pricing (`openai` by default).
    pub fn provider_name(mut self, name: impl Into<String>) -> Self {
        self.provider = name.into();
        self
    }

    /// Which field carries `max_tokens` (by default: `max_completion_tokens` for `openai`,
    /// `max_tokens` for any other provider name).
    pub fn max_tokens_field(mut self, field: MaxTokensField) -> Self {
        self.max_tokens_field = Some(field);
        self
    }

    /// Sends earlier reasoning back as `reasoning_content` on assistant messages (DeepSeek's
    /// thinking mode with tools asks for it; OpenAI does not accept it). Off by default.
    pub fn reasoning_in_history(mut self, send: bool) -> Self {
        self.reasoning_in_history = send;
        self
    }

    /// Builds the model.
    pub fn build(self) -> Result<OpenAiChat, ModelError> {
        let client = HttpClient::new(self.config, self.provider.clone())?;
        let max_tokens_field = self
            .max_tokens_field
            .unwrap_or(if self.provider == "openai" {
                MaxTokensField::MaxCompletionTokens
            } else {
                MaxTokensField::MaxTokens
            });
        Ok(OpenAiChat {
            model: self.model,
            provider: self.provider,
            client,
            stream: self.stream,
            stream_usage: self.stream_usage,
            strict: self.strict,
            max_tokens_field,
            reasoning_in_history: self.reasoning_in_history,
        })
    }
}

impl Model for OpenAiChat {
    fn id(&self) -> &str {
        &self.model
    }

    fn provider(&self) -> &str {
        &self.provider
    }

    fn stream<'a>(&'a self, request: ModelRequest<'a>) -> ModelStream<'a> {
        let body = self.encode_request(&request);
        let decoder = ChatStreamParser::new(&self.provider);
        post_and_decode(
            &self.client,
            "/chat/completions",
            body,
            decoder,
            self.stream,
        )
    }
}
